//! What the one-call layer returns when it could not hold a lease, or could not cover the work.

use std::fmt;

use crate::error::Error;
use crate::keepalive::LossReason;
use crate::outcome::{Contention, Indeterminate, ReleaseOutcome, Unavailable};

/// Why [`LockBuilder`](super::LockBuilder) returned no guard.
///
/// Each variant says what is known. Only `Indeterminate` leaves a doubt behind, and the
/// client has already started to clean it up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another holder kept the lease through the whole wait.
    #[error("not acquired: {0}")]
    Contended(Contention),
    /// At the deadline it was still unknown whether the last try was applied. A grant to
    /// this call's attempt may exist; a background release of it was started at once (see
    /// [`LeaseClient::settle`](crate::LeaseClient::settle) to wait for it before exiting).
    #[error("not known whether the lease was granted: {0}")]
    Indeterminate(Indeterminate),
    /// The backend could not be reached until the deadline; nothing was granted.
    #[error("not acquired: {0}")]
    Unavailable(Unavailable),
    /// Every try until the deadline was refused locally (the in-flight limit); nothing was
    /// sent by the last one.
    #[error("not acquired: too many commands in flight")]
    Overloaded,
    /// Refused before any I/O (bad input, or a TTL the keep-alive cannot keep), or the
    /// watchdog could not take the lease on when it was granted: full, or its leases already
    /// need as many renewals as it admits ([`ErrorKind::WatchdogOverloaded`]). The lease was
    /// then released.
    ///
    /// [`ErrorKind::WatchdogOverloaded`]: crate::ErrorKind::WatchdogOverloaded
    #[error("refused: {0}")]
    Refused(#[from] Error),
    /// A semaphore's permit was asked for with another capacity than the one the semaphore
    /// recorded; nothing was written.
    #[error("refused: the semaphore's capacity is {recorded}, not the one asked for")]
    CapacityMismatch {
        /// The capacity the semaphore has.
        recorded: u32,
    },
}

impl LockError {
    /// Returns true if and only if the lease is known not to have been granted to this call:
    /// every variant but `Indeterminate`.
    pub fn is_definite(&self) -> bool {
        !matches!(self, LockError::Indeterminate(_))
    }

    /// Returns true if and only if another holder had the lease.
    pub fn is_contended(&self) -> bool {
        matches!(self, LockError::Contended(_))
    }
}

/// Why work run under a lease by [`LockBuilder::run`](super::LockBuilder::run) has no
/// covered result.
///
/// `Ok` from `run` means the lease covered the work from its start to its end and was
/// released. Everything else is one of these, and none of them is success: even when the
/// work finished, an `Uncovered` or `NotReleased` says the lease did not do everything it
/// was asked to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunError<T> {
    /// The lease was not acquired; the work never started.
    NotAcquired(LockError),
    /// The loss signal fired while the work ran, so the work was cancelled (dropped) before
    /// the lease could be granted to anyone else.
    Lost {
        /// Why the signal fired.
        reason: LossReason,
        /// What the release after the cancellation said.
        release: ReleaseOutcome,
    },
    /// The work finished, but the release found the grant gone or replaced: the lease had
    /// ended before the work did (deleted, evicted, lost in a restart between two renewals),
    /// so part of the work may have run uncovered.
    Uncovered {
        /// The work's output.
        output: T,
        /// What the release said (see [`ReleaseOutcome::ended_early`]).
        release: ReleaseOutcome,
    },
    /// The work finished under the lease, but the release was not confirmed (unknown, or not
    /// applied): the lease may stay held until its TTL runs out.
    NotReleased {
        /// The work's output.
        output: T,
        /// What the release said.
        release: ReleaseOutcome,
    },
}

impl<T> RunError<T> {
    /// Returns the work's output, if the work finished.
    pub fn into_output(self) -> Option<T> {
        match self {
            RunError::Uncovered { output, .. } | RunError::NotReleased { output, .. } => {
                Some(output)
            }
            RunError::NotAcquired(_) | RunError::Lost { .. } => None,
        }
    }

    /// Returns true if and only if the work never started because another holder had the
    /// lease: the expected skip of a run-once job.
    pub fn is_contended(&self) -> bool {
        matches!(self, RunError::NotAcquired(e) if e.is_contended())
    }
}

impl<T> fmt::Display for RunError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::NotAcquired(why) => why.fmt(f),
            RunError::Lost { reason, .. } => {
                write!(f, "the work was cancelled: {reason}")
            }
            RunError::Uncovered { .. } => f.write_str(
                "the work finished, but the lease had ended before it (the release found \
                 the grant gone)",
            ),
            RunError::NotReleased { release, .. } => {
                write!(
                    f,
                    "the work finished, but the release was not confirmed: {release}"
                )
            }
        }
    }
}

impl<T: fmt::Debug> std::error::Error for RunError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RunError::NotAcquired(why) => Some(why),
            _ => None,
        }
    }
}
