//! Why a kept lease's work must stop, and the signal that says so.
//!
//! A [`LossSignal`] is one allocation per kept lease, shared by its clones: the first
//! [`LossReason`] it is given, and the waiters to wake then. Only the watchdog and the kept
//! lease fire it; the work only waits on it.

use std::fmt;
use std::sync::{Arc, OnceLock};

use tokio::sync::Notify;

use crate::fence::FenceToken;
use crate::id::{Purpose, ResourceDigest};
use crate::telemetry::{self, ShortDigest};

/// Why a kept lease's work must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The server said another grant holds the key, or that it is gone (the handle is
    /// `Lost`, perhaps already when it was kept).
    LostToAnother,
    /// The lease was released: by [`KeptLease::release`], or through its handle or a replayed
    /// handle on the same state, which the watchdog sees when the lease's next renewal comes
    /// due (no renewal is sent then).
    ///
    /// [`KeptLease::release`]: super::KeptLease::release
    Released,
    /// The local validity ran out before a renewal could be confirmed (e.g. a starved runtime).
    Expired,
    /// Renewals kept failing or going unanswered until only the safety margin was left (or
    /// the lease was kept with no more than that left); or the release by
    /// [`KeptLease::release`] was not applied or went unanswered, so the lease is neither
    /// renewed nor known to be released.
    ///
    /// [`KeptLease::release`]: super::KeptLease::release
    Unreachable,
    /// The watchdog stopped renewing the lease: the runtime its task ran on shut down, or the
    /// backend panicked while renewing it.
    WatchdogStopped,
    /// The master that granted the lease was replaced (a Sentinel failover) and the lease
    /// could not be proven on the new one: the new master does not hold it
    /// ([`LossCause::MasterReplaced`](crate::LossCause::MasterReplaced)), or a renewal ran on
    /// the replaced master and could not be confirmed on the new one. Another holder may have
    /// been granted on either.
    MasterReplaced,
    /// The [`KeptLease`] was dropped without being released (or while its release was under
    /// way): nothing renews the lease any more, though the server keeps it until its TTL
    /// runs out.
    ///
    /// [`KeptLease`]: super::KeptLease
    Dropped,
}

/// Fires once, with a reason, when a kept lease's work must stop. Clones share the signal.
#[derive(Debug, Clone, Default)]
pub struct LossSignal {
    // One allocation per kept lease: the reason, and the waiters to wake when it is set.
    state: Arc<SignalState>,
}

#[derive(Debug, Default)]
struct SignalState {
    reason: OnceLock<LossReason>,
    fired: Notify,
    /// The lease it speaks for, told to logs and metrics when it fires.
    subject: Option<Subject>,
}

/// What a signal tells logs and metrics about its lease (no token: it has none).
#[derive(Debug)]
struct Subject {
    purpose: Purpose,
    /// As logs show it: all they need, and 59 bytes less for every kept lease than the digest.
    resource: ShortDigest,
    fence: FenceToken,
}

impl LossSignal {
    /// A signal for the lease `fence` on `resource` for `purpose`, which it names in the log
    /// event and the metric it records when it fires.
    pub(super) fn for_lease(
        purpose: &Purpose,
        resource: &ResourceDigest,
        fence: FenceToken,
    ) -> Self {
        Self {
            state: Arc::new(SignalState {
                subject: Some(Subject {
                    purpose: purpose.clone(),
                    resource: ShortDigest::of(resource),
                    fence,
                }),
                ..SignalState::default()
            }),
        }
    }

    /// Fires the signal with `reason`, unless it has fired already.
    pub(super) fn fire(&self, reason: LossReason) {
        // The first reason wins; later ones are consequences of it.
        if self.state.reason.set(reason).is_ok() {
            self.state.fired.notify_waiters();
            if let Some(lease) = &self.state.subject {
                told(lease, reason);
            }
        }
    }

    /// Returns the reason, if the signal has fired.
    pub fn reason(&self) -> Option<LossReason> {
        self.state.reason.get().copied()
    }

    /// Returns true if and only if the signal has fired.
    pub fn is_lost(&self) -> bool {
        self.reason().is_some()
    }

    /// Waits until the signal fires and returns why.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lost(&self) -> LossReason {
        loop {
            // Made before the reason is read: a `Notified` is woken by every
            // `notify_waiters` after it was made, polled yet or not, so a signal fired
            // between the two is not missed.
            let fired = self.state.fired.notified();
            if let Some(reason) = self.reason() {
                return reason;
            }
            fired.await;
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::LostToAnother => "the server no longer holds this grant",
            LossReason::Released => "the lease was released",
            LossReason::Expired => "the local validity ran out before a renewal was confirmed",
            LossReason::Unreachable => "renewals failed or went unanswered until the margin",
            LossReason::WatchdogStopped => "the watchdog stopped",
            LossReason::Dropped => "the kept lease was dropped",
            LossReason::MasterReplaced => {
                "the master that granted it was replaced, and the new one does not hold it"
            }
        })
    }
}

/// Tells logs and metrics that `lease`'s signal fired for `reason`: a warning when the lease
/// was lost, a debug event when the program let it go (released or dropped).
fn told(lease: &Subject, reason: LossReason) {
    telemetry::lost(&lease.purpose, reason);
    let (purpose, resource, fence) = (&lease.purpose, lease.resource, lease.fence);
    let why = telemetry::loss_kind(reason);
    match reason {
        LossReason::Released | LossReason::Dropped => {
            tracing::debug!(%purpose, %resource, %fence, reason = why, "lease let go: {reason}");
        }
        _ => tracing::warn!(%purpose, %resource, %fence, reason = why, "lease lost: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_signal_wakes_every_waiter_once_with_the_first_reason() {
        for _ in 0..100 {
            let signal = LossSignal::default();
            let waiters: Vec<_> = (0..8)
                .map(|_| {
                    let signal = signal.clone();
                    tokio::spawn(async move { signal.lost().await })
                })
                .collect();
            tokio::task::yield_now().await;
            signal.fire(LossReason::Unreachable);
            signal.fire(LossReason::Released);
            for waiter in waiters {
                assert_eq!(waiter.await.unwrap(), LossReason::Unreachable);
            }
            assert!(signal.is_lost());
            // After it fired, at once.
            assert_eq!(signal.lost().await, LossReason::Unreachable);
        }
    }
}
