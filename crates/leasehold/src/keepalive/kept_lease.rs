//! A lease kept alive by a watchdog, and its place there.

use std::fmt;
use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use super::keeper::Runner;
use super::load::Demand;
use super::schedule::release_reason;
use super::signal::{LossReason, LossSignal};
use crate::backend::LeaseBackend;
use crate::handle::LeaseHandle;
use crate::outcome::ReleaseOutcome;
use crate::telemetry::Gauged;

/// A kept lease's place in the watchdog: dropping it tells the task to forget the lease (if
/// `stop` did not already), fires the signal, then frees the slot. In that order, so that a
/// registration made with the freed slot always reaches the task after the forgetting.
pub(super) struct Registration {
    id: u64,
    /// The task was told to forget the lease, or never knew it.
    stopped: bool,
    signal: LossSignal,
    runner: Arc<Runner>,
    _slot: OwnedSemaphorePermit,
    _demand: Demand,
    _kept: Gauged,
}

impl Registration {
    /// Makes the registration of lease `id`, which holds `slot` of the watchdog's leases and
    /// its share of their `demand`; `stopped` if the task never heard of it (its signal fired
    /// before it could be kept).
    pub(super) fn new(
        id: u64,
        stopped: bool,
        signal: LossSignal,
        runner: Arc<Runner>,
        (slot, demand): (OwnedSemaphorePermit, Demand),
    ) -> Self {
        Self {
            id,
            stopped,
            signal,
            runner,
            _slot: slot,
            _demand: demand,
            _kept: Gauged::kept(),
        }
    }

    /// Tells the task to forget the lease: it starts no renewal of it after reading this.
    fn stop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            self.runner.stop(self.id);
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.stop();
        // Nothing renews the lease from here on: work still holding a clone of the signal
        // must be told. After a completed release the signal has fired already, with the
        // release's reason, and the first reason stays.
        self.signal.fire(LossReason::Dropped);
    }
}

/// A lease kept alive by a [`Watchdog`](super::Watchdog).
///
/// Dropping it stops its renewals and fires its signal ([`LossReason::Dropped`]); the lease
/// stays held on the server until its TTL runs out.
#[must_use = "dropping a kept lease stops its renewals and leaves it held until its TTL \
              runs out; call `release().await`"]
pub struct KeptLease<B: LeaseBackend> {
    handle: LeaseHandle<B>,
    registration: Registration,
    _held: Gauged,
}

impl<B: LeaseBackend> fmt::Debug for KeptLease<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeptLease")
            .field("handle", &self.handle)
            .field("lost", &self.registration.signal.reason())
            .finish()
    }
}

impl<B: LeaseBackend> KeptLease<B> {
    /// Makes a kept lease of `handle`, registered with the watchdog.
    pub(super) fn new(handle: LeaseHandle<B>, registration: Registration) -> Self {
        let held = Gauged::held(
            handle.purpose(),
            crate::telemetry::grant_kind(handle.grant()),
        );
        Self {
            handle,
            registration,
            _held: held,
        }
    }

    /// Returns the handle.
    pub fn handle(&self) -> &LeaseHandle<B> {
        &self.handle
    }

    /// Returns the loss signal.
    pub fn signal(&self) -> &LossSignal {
        &self.registration.signal
    }

    /// Stops renewing and releases the lease. No renewal is sent after the release.
    ///
    /// The signal then fires with the outcome's reason: [`LossReason::Released`] for
    /// `Released`, [`LossReason::LostToAnother`] for `AlreadyGone` and `NotOwner` (the grant
    /// was gone before the release: see [`ReleaseOutcome::ended_early`]), and
    /// [`LossReason::Unreachable`] for `Indeterminate`, `Unavailable` and `Overloaded` (the
    /// lease is then neither renewed nor known to be released). The handle is dropped: to try
    /// a release that was not applied again, use
    /// [`release_returning_handle`](Self::release_returning_handle).
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseHandle::release`]; renewals are stopped either way, and a release cut short
    /// fires the signal with [`LossReason::Dropped`].
    pub async fn release(self) -> ReleaseOutcome {
        self.release_returning_handle().await.0
    }

    /// Stops renewing and downgrades the writer's grant to a reader's
    /// ([`LeaseHandle::downgrade_to_read`]); the reader's handle, if any, is in the outcome,
    /// to be kept anew. The signal fires [`LossReason::Released`] if the downgrade was
    /// applied, and as after a release otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release).
    pub async fn downgrade(self) -> (crate::handle::DowngradeOutcome<B>, LeaseHandle<B>) {
        use crate::handle::DowngradeOutcome;
        let KeptLease {
            handle,
            mut registration,
            ..
        } = self;
        registration.stop();
        let outcome = handle.downgrade_to_read().await;
        let reason = match &outcome {
            DowngradeOutcome::Downgraded(_) => LossReason::Released,
            DowngradeOutcome::Lost(_) => LossReason::LostToAnother,
            _ => LossReason::Unreachable,
        };
        registration.signal.fire(reason);
        drop(registration);
        (outcome, handle)
    }

    /// As [`release`](Self::release), and gives the handle back: after `Unavailable` or
    /// `Overloaded` (not applied) the lease is still held, and
    /// [`LeaseHandle::release`] can be called again. Renewals stay stopped (the handle
    /// refuses them once a release has started).
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release).
    pub async fn release_returning_handle(self) -> (ReleaseOutcome, LeaseHandle<B>) {
        let KeptLease {
            handle,
            mut registration,
            ..
        } = self;
        // Stop first, so the watchdog starts no renewal of it after this. A renewal already
        // being sent is left to finish (the watchdog ignores its outcome), and the release
        // below waits for it: the release is the last command this lease sends. The
        // registration keeps the task running until then, even if it is the last one.
        registration.stop();
        let outcome = handle.release().await;
        registration.signal.fire(release_reason(&outcome));
        drop(registration);
        (outcome, handle)
    }
}
