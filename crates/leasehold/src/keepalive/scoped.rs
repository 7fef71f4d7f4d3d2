//! What work run under a lease comes back with.

use std::fmt;

use super::signal::LossReason;
use crate::outcome::ReleaseOutcome;

/// The result of work run under a lease.
#[derive(Debug)]
#[non_exhaustive]
pub struct Scoped<T> {
    /// The work's output if the lease covered it to its end; otherwise why it did not.
    pub result: Result<T, Uncovered<T>>,
    /// What the release at the end said.
    pub release: ReleaseOutcome,
}

/// Work the lease did not cover to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Uncovered<T> {
    /// Why: the loss signal's reason when it fired, or [`LossReason::LostToAnother`] when the
    /// release at the end found the grant gone or replaced.
    pub reason: LossReason,
    /// The work's output, if it finished: the release then proved the lease had ended before
    /// it (see [`ReleaseOutcome::ended_early`]), so part of it may have run while another
    /// holder had the lease. `None` if the work was cancelled (dropped) on the signal.
    pub output: Option<T>,
}

impl<T> fmt::Display for Uncovered<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.output {
            None => write!(f, "the work was cancelled: {}", self.reason),
            Some(_) => write!(
                f,
                "the work finished, but the lease had ended before it ({})",
                self.reason
            ),
        }
    }
}

impl<T: fmt::Debug> std::error::Error for Uncovered<T> {}
