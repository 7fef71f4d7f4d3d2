//! A term of leadership: the lease a candidate leads with.

use std::fmt;
use std::time::Duration;

use crate::backend::LeaseBackend;
use crate::fence::FenceToken;
use crate::handle::LeaseHandle;
use crate::keepalive::{LossReason, LossSignal};
use crate::lock::{HeldLease, LeaseGuard};
use crate::outcome::ReleaseOutcome;
use crate::telemetry::{self, Short};

/// A candidate's term as leader, returned by [`Candidate::campaign`].
///
/// The term is the grant's fence: strictly increasing across leaders, so every write the
/// leader fences with it is rejected once a later leader has written. The lease is kept alive
/// by the client's watchdog; [`lost`](Self::lost) fires, with the reason, when leadership
/// ends — before the lease could be granted to another candidate. Stop leading then.
///
/// [`resign`](Self::resign) steps down at once; dropping the leadership resigns in the
/// background.
///
/// [`Candidate::campaign`]: super::Candidate::campaign
#[must_use = "dropping a leadership resigns at once; hold it while leading"]
pub struct Leadership<B: LeaseBackend> {
    guard: LeaseGuard<B>,
}

impl<B: LeaseBackend> fmt::Debug for Leadership<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("term", &self.term())
            .field("lost", &self.signal().reason())
            .finish_non_exhaustive()
    }
}

impl<B: LeaseBackend> Leadership<B> {
    pub(super) fn new(guard: LeaseGuard<B>) -> Self {
        let handle = guard.handle();
        tracing::info!(
            purpose = %handle.purpose(),
            resource = %Short(handle.resource()),
            term = %guard.fence(),
            "leading"
        );
        telemetry::leading_until(handle.purpose(), guard.signal());
        Self { guard }
    }

    /// Returns the term: the grant's fencing token. Pass it to every write made as leader.
    pub fn term(&self) -> FenceToken {
        self.guard.fence()
    }

    /// Returns true while the leadership's signal has not fired.
    pub fn is_leading(&self) -> bool {
        !self.guard.is_lost()
    }

    /// Returns the leadership signal: it fires once, with the reason, when leading must stop.
    pub fn signal(&self) -> &LossSignal {
        self.guard.signal()
    }

    /// Waits until leadership ends and returns why.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lost(&self) -> LossReason {
        self.guard.lost().await
    }

    /// Returns how long the lease is still known to be valid (zero once it is not).
    pub fn remaining_validity(&self) -> Duration {
        self.guard.remaining_validity()
    }

    /// Returns the explicit handle underneath.
    pub fn handle(&self) -> &LeaseHandle<B> {
        self.guard.handle()
    }

    /// What work run for this term sees of it (the fence is the term).
    pub(super) fn held(&self) -> HeldLease<B> {
        HeldLease::new(&self.guard)
    }

    /// Steps down at once: stops the renewals and releases the lease, which wakes the
    /// waiting candidates through the release notice. `Released` says the term ended here;
    /// see [`LeaseGuard::release`] for the others.
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseGuard::release`].
    pub async fn resign(self) -> ReleaseOutcome {
        self.guard.release().await
    }
}
