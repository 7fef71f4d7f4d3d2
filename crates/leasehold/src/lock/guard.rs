//! A held lease that the client keeps alive, released on `release` or in the background on
//! drop.

use std::fmt;
use std::time::Duration;

use crate::backend::LeaseBackend;
use crate::client::LeaseClient;
use crate::fence::FenceToken;
use crate::handle::LeaseHandle;
use crate::keepalive::{KeptLease, LossReason, LossSignal};
use crate::outcome::ReleaseOutcome;

/// A lease held by [`LeaseClient::lock`], kept alive by the client's watchdog.
///
/// It carries the grant's [`FenceToken`] (pass it to every write the work makes), the loss
/// signal (stop working when it fires: it fires before the lease could be granted to anyone
/// else) and the remaining validity. [`release`](Self::release) ends it with a typed
/// outcome; dropping the guard releases it in the background instead.
#[must_use = "dropping a guard releases the lease at once; hold it while the work runs"]
pub struct LeaseGuard<B: LeaseBackend> {
    // `None` only once `release` has taken it, so that `Drop` does nothing then.
    kept: Option<KeptLease<B>>,
    client: LeaseClient<B>,
}

impl<B: LeaseBackend> fmt::Debug for LeaseGuard<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("kept", &self.kept)
            .finish_non_exhaustive()
    }
}

impl<B: LeaseBackend> LeaseGuard<B> {
    pub(super) fn new(kept: KeptLease<B>, client: LeaseClient<B>) -> Self {
        Self {
            kept: Some(kept),
            client,
        }
    }

    fn kept(&self) -> &KeptLease<B> {
        // Set from `new` until `release` consumes the guard: never `None` behind `&self`.
        self.kept
            .as_ref()
            .unwrap_or_else(|| unreachable!("a guard's lease is taken only by `release`"))
    }

    /// Returns the grant's fencing token.
    pub fn fence(&self) -> FenceToken {
        self.handle().fence()
    }

    /// Returns the slot of a semaphore's permit, from 0 to its capacity − 1; `None` for a
    /// lease. Pass it with the fence: a target that N holders write at once keeps the
    /// highest fence *per slot* (`WHERE slot = $slot AND fence <= $fence`).
    pub fn slot(&self) -> Option<u32> {
        self.handle().slot()
    }

    /// Returns how long the lease is still known to be valid (zero once it is not).
    pub fn remaining_validity(&self) -> Duration {
        self.handle().remaining_validity()
    }

    /// Returns the loss signal: it fires once, with the reason, when the work must stop.
    pub fn signal(&self) -> &LossSignal {
        self.kept().signal()
    }

    /// Returns true if and only if the loss signal has fired.
    pub fn is_lost(&self) -> bool {
        self.signal().is_lost()
    }

    /// Waits until the loss signal fires and returns why.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lost(&self) -> LossReason {
        self.signal().lost().await
    }

    /// Returns the explicit handle underneath, for its state and validity details.
    pub fn handle(&self) -> &LeaseHandle<B> {
        self.kept().handle()
    }

    /// Stops the renewals and releases the lease; no renewal is sent after the release.
    ///
    /// `Released` is the only outcome that says the lease ended here and covered everything
    /// up to now; see [`ReleaseOutcome::ended_early`] for the ones that prove it had ended
    /// before.
    ///
    /// # Cancel safety
    ///
    /// As [`KeptLease::release`]: a release cut short may have been applied, and the lease
    /// is then left to its TTL.
    pub async fn release(mut self) -> ReleaseOutcome {
        match self.kept.take() {
            Some(kept) => kept.release().await,
            None => unreachable!("a guard's lease is taken only by `release`"),
        }
    }
}

impl<B: LeaseBackend> Drop for LeaseGuard<B> {
    fn drop(&mut self) {
        let Some(kept) = self.kept.take() else {
            return;
        };
        // Renewals stop the moment the release starts; the release itself runs as a task,
        // counted by `LeaseClient::settle`. Outside a runtime nothing can send it, and the
        // kept lease's own drop stops the renewals: the key then lives until its TTL.
        self.client.spawn_cleanup(async move {
            let outcome = kept.release().await;
            tracing::debug!(%outcome, "released a dropped guard");
        });
    }
}
