//! The watchdog: the public face of the keep-alive task, which keeps leases and runs work
//! under them.

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Semaphore;

use super::keeper::{Runner, loss_at_margin};
use super::kept_lease::{KeptLease, Registration};
use super::load::{self, Load, Overload};
use super::not_kept::NotKept;
use super::scoped::{Scoped, Uncovered};
use super::settings::KeepAliveSettings;
use super::signal::{LossReason, LossSignal};
use crate::backend::LeaseBackend;
use crate::error::{Error, ErrorKind};
use crate::handle::LeaseHandle;

/// Renews every lease registered with it, from one task; one per client. Clones share the task.
///
/// The task starts on the current tokio runtime at the first [`keep`](Self::keep), and stops
/// once this watchdog, its clones and every lease it keeps are dropped. A kept lease therefore
/// keeps being renewed even if the watchdog it came from is dropped first; drop (or release)
/// the [`KeptLease`] to stop its renewals.
#[derive(Debug, Clone)]
pub struct Watchdog {
    settings: KeepAliveSettings,
    slots: Arc<Semaphore>,
    runner: Arc<Mutex<Option<Arc<Runner>>>>,
    /// The renewals its leases need, and how many it measured it can confirm.
    load: Arc<Load>,
    /// Its task's polling time, in nanoseconds, which the task measures its rate by.
    busy: Arc<AtomicU64>,
}

impl Default for Watchdog {
    fn default() -> Self {
        Self::new(KeepAliveSettings::default())
    }
}

impl Watchdog {
    /// Makes a watchdog. No task is started until the first [`keep`](Self::keep).
    pub fn new(settings: KeepAliveSettings) -> Self {
        Self {
            settings,
            slots: Arc::new(Semaphore::new(settings.max_leases())),
            runner: Arc::new(Mutex::new(None)),
            load: Arc::new(Load::new(
                settings.assumed_capacity(),
                settings.max_in_flight(),
            )),
            busy: Arc::default(),
        }
    }

    /// Returns the renewals per second the leases it keeps need (one per cadence each).
    pub fn renewals_needed(&self) -> f64 {
        self.load.demand()
    }

    /// Returns the renewals per second it has measured it can confirm, once it has renewed
    /// enough to measure (a second with at least 64 renewals): the lesser of its send slots
    /// over the time a renewal takes, and its task's own rate, smoothed over windows. A
    /// [`renewals_needed`](Self::renewals_needed) near it means renewals will start to come
    /// late.
    pub fn renewal_capacity(&self) -> Option<f64> {
        self.load.capacity()
    }

    /// Returns the renewals per second it admits leases up to: three quarters of its
    /// [`renewal_capacity`](Self::renewal_capacity). Until it has measured, of an estimate:
    /// the lesser of the capacity its settings assume
    /// ([`KeepAliveSettings::with_assumed_capacity`]) and its send slots over the mean round
    /// trip of the acquires that granted the leases it was given. A
    /// [`keep`](Self::keep) that would take [`renewals_needed`](Self::renewals_needed) past it
    /// is refused.
    pub fn admission_limit(&self) -> f64 {
        self.load.admission_limit()
    }

    /// Returns the settings.
    pub fn settings(&self) -> &KeepAliveSettings {
        &self.settings
    }

    /// Starts keeping `handle` alive. The first renewal is due a cadence from now, or sooner
    /// if that is needed for it to be sent a retry interval before the margin point; if the
    /// handle's remaining validity is already down to the margin, the signal fires at once.
    ///
    /// # Errors
    ///
    /// The handle is given back inside [`NotKept`], still held:
    ///
    /// - [`ErrorKind::InvalidSetting`] if the handle's validity after a renewal (its TTL less
    ///   its drift budget) is not more than the cadence, a retry interval and the margin
    ///   together: a failed renewal could not be retried before the signal fires;
    /// - [`ErrorKind::WatchdogFull`] if it keeps as many leases as it may;
    /// - [`ErrorKind::WatchdogOverloaded`] if the renewals its leases need, with this one's,
    ///   would pass its [`admission_limit`](Self::admission_limit): keeping it would risk the
    ///   leases it keeps already. (A watchdog that keeps nothing admits any one lease.)
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (with the `time` driver), when the watchdog's task has to be
    /// started: at the first call, or after the runtime it ran on shut down.
    pub fn keep<B: LeaseBackend>(
        &self,
        handle: LeaseHandle<B>,
    ) -> Result<KeptLease<B>, NotKept<B>> {
        if let Err(error) = self.settings.check_lease(handle.ttl(), handle.drift()) {
            return Err(NotKept::new(error, handle));
        }
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            let error = Error::new(
                ErrorKind::WatchdogFull,
                format!(
                    "the watchdog keeps {} leases already",
                    self.settings.max_leases()
                ),
            );
            return Err(NotKept::new(error, handle));
        };
        let need = load::demand_of(self.settings.schedule(handle.ttl()).cadence);
        let demand = match self.load.admit(need, handle.granted_in()) {
            Ok(demand) => demand,
            Err(overload) => return Err(NotKept::new(overloaded(overload), handle)),
        };
        let runner = self.runner();
        let id = runner.next_id();
        let signal = LossSignal::for_lease(handle.purpose(), handle.resource(), handle.fence());
        let lease = handle.renewable();
        // A handle already lost or released, or with no more than the margin left, cannot be
        // kept: its work is told before `keep` returns, and the task never sees it.
        let stopped = match loss_at_margin(&self.settings, lease.as_ref()) {
            Some(reason) => {
                signal.fire(reason);
                true
            }
            None => {
                if !runner.keep(id, lease, signal.clone()) {
                    // The task ended since `runner()` looked (its runtime is shutting down):
                    // nothing will renew this lease, and its work must know.
                    signal.fire(LossReason::WatchdogStopped);
                }
                false
            }
        };
        Ok(KeptLease::new(
            handle,
            Registration::new(id, stopped, signal, runner, (slot, demand)),
        ))
    }

    /// Returns the running task, starting one on the current runtime if there is none or the
    /// last one ended with its runtime.
    fn runner(&self) -> Arc<Runner> {
        let mut current = self.runner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(runner) = current.as_ref().filter(|r| r.is_running()) {
            return Arc::clone(runner);
        }
        let runner = Arc::new(Runner::start(self.settings, &self.load, &self.busy));
        *current = Some(Arc::clone(&runner));
        runner
    }

    /// Runs `work` under `handle`: renews while it runs, cancels it (drops it) on loss, and
    /// releases the lease at the end either way.
    ///
    /// The result is `Ok` only if the lease covered the work to its end: the signal did not
    /// fire first, and the release did not find the grant gone or replaced. A release that
    /// finds it so proves the lease ended before the work did (deleted, evicted, flushed, lost
    /// in a restart between two renewals): the output comes back inside [`Uncovered`].
    ///
    /// # Errors
    ///
    /// As [`keep`](Self::keep) ([`ErrorKind::InvalidSetting`], [`ErrorKind::WatchdogFull`],
    /// [`ErrorKind::WatchdogOverloaded`]), before the work starts; the lease is released then.
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
            Err(not_kept) => {
                let (error, handle) = not_kept.into_parts();
                let _ = handle.release().await;
                return Err(error);
            }
        };
        let signal = kept.signal().clone();
        let finished = tokio::select! {
            // A loss seen together with the work's end wins: it cannot be ruled out.
            biased;
            reason = signal.lost() => Err(reason),
            output = work => Ok(output),
        };
        let release = kept.release().await;
        let result = match finished {
            Ok(output) if release.ended_early() => Err(Uncovered {
                reason: LossReason::LostToAnother,
                output: Some(output),
            }),
            Ok(output) => Ok(output),
            Err(reason) => Err(Uncovered {
                reason,
                output: None,
            }),
        };
        Ok(Scoped { result, release })
    }
}

/// The error for a lease refused for the watchdog's load.
fn overloaded(overload: Overload) -> Error {
    let Overload {
        demand,
        need,
        limit,
        measured,
    } = overload;
    let whence = if measured {
        "measured"
    } else {
        "estimated until it has measured"
    };
    Error::new(
        ErrorKind::WatchdogOverloaded,
        format!(
            "the watchdog's leases need {demand:.1} renewals per second and this one \
             {need:.3} more, past its admission limit of {limit:.1} (three quarters of the \
             capacity {whence})"
        ),
    )
}
