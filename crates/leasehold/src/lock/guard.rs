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

/// Why [`LeaseGuard::downgrade`] gave no reader's guard.
#[non_exhaustive]
pub enum DowngradeError<B: LeaseBackend> {
    /// The guard is not the writer's of a read/write lease: it is given back, and nothing
    /// was sent.
    NotAWriter(Box<LeaseGuard<B>>),
    /// The writer's grant was gone before the downgrade: nothing is held.
    Lost(crate::outcome::LossCause),
    /// Not known whether the downgrade was applied; whatever the attempt holds is being
    /// released in the background.
    Indeterminate(crate::outcome::Indeterminate),
    /// The downgrade was not applied (the server could not be reached, or the in-flight
    /// limit), and the writer's lease was released: this is how that release went.
    NotApplied {
        /// The release's outcome.
        release: ReleaseOutcome,
    },
    /// The watchdog could not keep the reader's lease, which was then released.
    Refused(crate::lock::LockError),
}

impl<B: LeaseBackend> fmt::Debug for DowngradeError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DowngradeError::NotAWriter(g) => f.debug_tuple("NotAWriter").field(g).finish(),
            DowngradeError::Lost(c) => f.debug_tuple("Lost").field(c).finish(),
            DowngradeError::Indeterminate(i) => f.debug_tuple("Indeterminate").field(i).finish(),
            DowngradeError::NotApplied { release } => f
                .debug_struct("NotApplied")
                .field("release", release)
                .finish(),
            DowngradeError::Refused(e) => f.debug_tuple("Refused").field(e).finish(),
        }
    }
}

impl<B: LeaseBackend> fmt::Display for DowngradeError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DowngradeError::NotAWriter(_) => {
                f.write_str("not downgraded: the guard is not a read/write lease's writer")
            }
            DowngradeError::Lost(c) => write!(f, "not downgraded: the writer's lease was {c}"),
            DowngradeError::Indeterminate(i) => write!(f, "not known whether downgraded: {i}"),
            DowngradeError::NotApplied { release } => {
                write!(
                    f,
                    "not downgraded; the writer's lease was released: {release}"
                )
            }
            DowngradeError::Refused(e) => write!(f, "downgraded, but not kept: {e}"),
        }
    }
}

impl<B: LeaseBackend> std::error::Error for DowngradeError<B> {}

/// What [`LeaseGuard::upgrade`] answers: a reader never becomes the writer in place. Two
/// readers that both tried would each wait for the other to leave: release the read lease
/// and take the write lease, then read again under it.
pub struct UpgradeRefused<B: LeaseBackend>(pub Box<LeaseGuard<B>>);

impl<B: LeaseBackend> fmt::Debug for UpgradeRefused<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("UpgradeRefused").field(&self.0).finish()
    }
}

impl<B: LeaseBackend> fmt::Display for UpgradeRefused<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a read lease is never upgraded in place (two upgraders would wait for each other \
             forever): release it, then take the write lease",
        )
    }
}

impl<B: LeaseBackend> std::error::Error for UpgradeRefused<B> {}

impl<B: LeaseBackend> LeaseGuard<B> {
    /// Turns the writer's side of a read/write lease into a reader's without a gap: no other
    /// writer can come in between, readers waiting come in at once, and the reader's fence is
    /// this writer's (so the reader is known to see what it wrote). Renewals of the writer's
    /// lease stop; the reader's guard is kept alive instead, and this guard's signal fires
    /// [`LossReason::Released`].
    ///
    /// # Errors
    ///
    /// A [`DowngradeError`] that says what is held: nothing, except for `NotAWriter`, which
    /// gives the guard back untouched.
    ///
    /// # Cancel safety
    ///
    /// A downgrade cut short may have been applied; the lease is then left to its TTL.
    pub async fn downgrade(mut self) -> Result<LeaseGuard<B>, DowngradeError<B>> {
        use crate::handle::DowngradeOutcome;
        if self.handle().grant().rw() != Some(crate::request::RwMode::Write) {
            return Err(DowngradeError::NotAWriter(Box::new(self)));
        }
        let Some(kept) = self.kept.take() else {
            unreachable!("a guard's lease is taken only by `release` or `downgrade`")
        };
        let reader = kept.handle().reader_request();
        let (outcome, writer) = kept.downgrade().await;
        match outcome {
            DowngradeOutcome::Downgraded(handle) => self
                .client
                .guard(handle)
                .await
                .map_err(DowngradeError::Refused),
            DowngradeOutcome::Lost(cause) => Err(DowngradeError::Lost(cause)),
            DowngradeOutcome::Indeterminate(why) => {
                if let Ok(reader) = reader {
                    // Either side may be this attempt's now: whichever it is goes.
                    self.client.abandon_in_background(reader);
                }
                Err(DowngradeError::Indeterminate(why))
            }
            DowngradeOutcome::NotAWriter | DowngradeOutcome::Refused { .. } => {
                Err(DowngradeError::NotApplied {
                    release: writer.release().await,
                })
            }
            DowngradeOutcome::Unavailable(_) | DowngradeOutcome::Overloaded => {
                // Not applied: the writer's grant is held, unrenewed. Released, as the only
                // way to leave nothing behind.
                let release = writer.release().await;
                Err(DowngradeError::NotApplied { release })
            }
        }
    }

    /// Refuses, always: a read lease is never upgraded to the write lease in place (see
    /// [`UpgradeRefused`]). The guard is given back in the error, untouched.
    ///
    /// # Errors
    ///
    /// Always [`UpgradeRefused`].
    pub fn upgrade(self) -> Result<LeaseGuard<B>, UpgradeRefused<B>> {
        Err(UpgradeRefused(Box::new(self)))
    }
}
