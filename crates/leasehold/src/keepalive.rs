//! Keep-alive: leases renewed automatically, and work told to stop *before* a lease can be lost.
//!
//! A [`Watchdog`] renews every lease registered with it at a cadence (TTL / 3 by default).
//! Each kept lease has a [`LossSignal`], modelled on `CancellationToken::cancelled()`, that
//! fires once with a [`LossReason`]: at once on a definite loss (the server says another grant
//! holds the key or it is gone, or the lease was released), and — while renewals fail or are
//! indeterminate — as soon as the remaining validity falls to a safety margin, which is before
//! the server's key could expire and be granted to anyone else. Validity only ever comes from
//! confirmed renewals, counted from before they were sent, so a starved runtime can make the
//! signal fire late but can never extend a lease.

use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::backend::LeaseBackend;
use crate::error::{Error, ErrorKind};
use crate::handle::{LeaseHandle, LeaseState};
use crate::outcome::{ReleaseOutcome, RenewOutcome};

/// Why a kept lease's work must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossReason {
    /// The server said another grant holds the key, or that it is gone.
    LostToAnother,
    /// The lease was released.
    Released,
    /// The local validity ran out before a renewal could be confirmed (e.g. a starved runtime).
    Expired,
    /// Renewals kept failing or going unanswered until only the safety margin was left.
    Unreachable,
}

/// Fires once, with a reason, when a kept lease's work must stop. Clones share the signal.
#[derive(Debug, Clone, Default)]
pub struct LossSignal {
    token: CancellationToken,
    reason: Arc<OnceLock<LossReason>>,
}

impl LossSignal {
    fn fire(&self, reason: LossReason) {
        // The first reason wins; later ones are consequences of it.
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    /// Returns the reason, if the signal has fired.
    pub fn reason(&self) -> Option<LossReason> {
        self.reason.get().copied()
    }

    /// Returns true if and only if the signal has fired.
    pub fn is_lost(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Waits until the signal fires and returns why.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lost(&self) -> LossReason {
        self.token.cancelled().await;
        self.reason().unwrap_or(LossReason::Unreachable)
    }
}

/// How a [`Watchdog`] renews.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAliveSettings {
    cadence_divisor: u32,
    margin_divisor: u32,
    max_leases: usize,
}

impl Default for KeepAliveSettings {
    fn default() -> Self {
        Self {
            cadence_divisor: 3,
            margin_divisor: 5,
            max_leases: 100_000,
        }
    }
}

impl KeepAliveSettings {
    /// Sets the cadence: a renewal every TTL / `divisor` (2 to 100; default 3).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if out of range.
    pub fn with_cadence_divisor(mut self, divisor: u32) -> Result<Self, Error> {
        if !(2..=100).contains(&divisor) {
            return Err(Error::new(
                ErrorKind::InvalidSetting,
                "cadence divisor must be 2 to 100",
            ));
        }
        self.cadence_divisor = divisor;
        Ok(self)
    }

    /// Sets the safety margin: the signal fires when renewals keep failing and TTL / `divisor`
    /// of validity is left (2 to 100; default 5).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if out of range.
    pub fn with_margin_divisor(mut self, divisor: u32) -> Result<Self, Error> {
        if !(2..=100).contains(&divisor) {
            return Err(Error::new(
                ErrorKind::InvalidSetting,
                "margin divisor must be 2 to 100",
            ));
        }
        self.margin_divisor = divisor;
        Ok(self)
    }

    /// Sets how many leases the watchdog keeps at most (1 to 10,000,000; default 100,000).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if out of range.
    pub fn with_max_leases(mut self, max: usize) -> Result<Self, Error> {
        if !(1..=10_000_000).contains(&max) {
            return Err(Error::new(
                ErrorKind::InvalidSetting,
                "max leases must be 1 to 10000000",
            ));
        }
        self.max_leases = max;
        Ok(self)
    }
}

/// Renews every lease registered with it; one per client. Dropping it stops every renewal.
#[derive(Debug, Clone)]
pub struct Watchdog {
    settings: KeepAliveSettings,
    slots: Arc<Semaphore>,
}

impl Default for Watchdog {
    fn default() -> Self {
        Self::new(KeepAliveSettings::default())
    }
}

/// A lease kept alive by a [`Watchdog`].
#[must_use = "dropping a kept lease stops its renewals and leaves it held until its TTL runs out; call `release().await`"]
pub struct KeptLease<B: LeaseBackend> {
    handle: LeaseHandle<B>,
    signal: LossSignal,
    stop: CancellationToken,
    _task: AbortOnDropHandle<()>,
}

impl<B: LeaseBackend> std::fmt::Debug for KeptLease<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeptLease")
            .field("handle", &self.handle)
            .field("lost", &self.signal.reason())
            .finish()
    }
}

impl<B: LeaseBackend> KeptLease<B> {
    /// Returns the handle.
    pub fn handle(&self) -> &LeaseHandle<B> {
        &self.handle
    }

    /// Returns the loss signal.
    pub fn signal(&self) -> &LossSignal {
        &self.signal
    }

    /// Stops renewing and releases the lease. No renewal is sent after the release.
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseHandle::release`].
    pub async fn release(self) -> ReleaseOutcome {
        self.stop.cancel();
        let outcome = self.handle.release().await;
        self.signal.fire(LossReason::Released);
        outcome
    }
}

/// The result of work run under a lease.
#[derive(Debug)]
#[non_exhaustive]
pub struct Scoped<T> {
    /// The work's output, or why it was cancelled.
    pub result: Result<T, LossReason>,
    /// What the release at the end said.
    pub release: ReleaseOutcome,
}

impl Watchdog {
    /// Makes a watchdog.
    pub fn new(settings: KeepAliveSettings) -> Self {
        Self {
            settings,
            slots: Arc::new(Semaphore::new(settings.max_leases)),
        }
    }

    /// Starts keeping `handle` alive on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::WatchdogFull`] if it keeps as many leases as it may; the handle is given
    /// back with the error, still held.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn keep<B: LeaseBackend>(
        &self,
        handle: LeaseHandle<B>,
    ) -> Result<KeptLease<B>, (Error, LeaseHandle<B>)> {
        let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() else {
            let error = Error::new(
                ErrorKind::WatchdogFull,
                format!(
                    "the watchdog keeps {} leases already",
                    self.settings.max_leases
                ),
            );
            return Err((error, handle));
        };
        let signal = LossSignal::default();
        let stop = CancellationToken::new();
        let task = tokio::spawn(keep_alive(
            handle.share(),
            self.settings,
            signal.clone(),
            stop.clone(),
            permit,
        ));
        Ok(KeptLease {
            handle,
            signal,
            stop,
            _task: AbortOnDropHandle::new(task),
        })
    }

    /// Runs `work` under `handle`: renews while it runs, cancels it (drops it) on loss, and
    /// releases the lease at the end either way.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::WatchdogFull`], before the work starts; the lease is released then.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the work and stops renewals without releasing: the lease
    /// then lives until its TTL.
    pub async fn run<B: LeaseBackend, T>(
        &self,
        handle: LeaseHandle<B>,
        work: impl Future<Output = T>,
    ) -> Result<Scoped<T>, Error> {
        let kept = match self.keep(handle) {
            Ok(kept) => kept,
            Err((error, handle)) => {
                let _ = handle.release().await;
                return Err(error);
            }
        };
        let signal = kept.signal.clone();
        let result = tokio::select! {
            output = work => Ok(output),
            reason = signal.lost() => Err(reason),
        };
        let release = kept.release().await;
        Ok(Scoped { result, release })
    }
}

async fn keep_alive<B: LeaseBackend>(
    handle: LeaseHandle<B>,
    settings: KeepAliveSettings,
    signal: LossSignal,
    stop: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let ttl = handle.ttl();
    let cadence = ttl / settings.cadence_divisor;
    let margin = ttl / settings.margin_divisor;
    let mut due = cadence;
    loop {
        // Never sleep past the margin: the signal must be able to fire in time.
        let wait = due.min(handle.remaining_validity().saturating_sub(margin));
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        // Boxed: the renewal's future (the backend's whole send path) is large, and it lives
        // only while renewing; the sleeping task then stays small.
        let renewal = Box::pin(handle.renew());
        let outcome = tokio::select! {
            () = stop.cancelled() => return,
            outcome = renewal => outcome,
        };
        match outcome {
            RenewOutcome::Renewed { .. } => {
                due = cadence;
                continue;
            }
            RenewOutcome::Lost(_) => {
                signal.fire(LossReason::LostToAnother);
                return;
            }
            RenewOutcome::Refused { state } => {
                // Refused from Lost, or because a release is under way (any other state).
                signal.fire(if state == LeaseState::Lost {
                    LossReason::LostToAnother
                } else {
                    LossReason::Released
                });
                return;
            }
            _ => {}
        }
        // Failed, indeterminate or overloaded: retry soon while validity above the margin
        // remains; once it is down to the margin, stop the work.
        let remaining = handle.remaining_validity();
        if remaining <= margin {
            signal.fire(if handle.state() == LeaseState::Expired {
                LossReason::Expired
            } else {
                LossReason::Unreachable
            });
            return;
        }
        due = (cadence / 4).max(Duration::from_millis(1));
    }
}
