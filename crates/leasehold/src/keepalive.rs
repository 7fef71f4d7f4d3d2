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
//!
//! # How it runs
//!
//! One task per watchdog keeps all of its leases; a kept lease is an entry in a map and one
//! slot in a timer wheel ([`DelayQueue`]), not a task. The slot holds the next instant that
//! matters to the lease:
//!
//! - while it waits, its next renewal: a cadence after the last confirmation, or a retry
//!   interval (cadence / 4) after a failed renewal — but never later than a retry interval
//!   before its *margin point*, the instant its remaining validity falls to the margin, so
//!   that every renewal has at least that long to be answered before the signal would fire;
//! - while a renewal is due (queued for a send slot, or being sent), the margin point, set
//!   once when the renewal comes due.
//!
//! So the signal fires at the margin point when the last renewal failed, and also when a
//! renewal is still queued or unanswered then, without waiting for the backend to give up. A
//! task that wakes past the margin point (a starved runtime) fires the signal at once, and so
//! does a lease kept with no more than the margin left: nothing sent then could be confirmed
//! in time. After a failure, a retry follows a retry interval later, as long as it can still
//! be sent a retry interval before the margin point; after that the signal waits for the
//! margin point. A lease found with no validity left at all fires [`LossReason::Expired`].
//!
//! Due renewals are sent concurrently, at most [`KeepAliveSettings::with_max_in_flight`] at
//! once and the rest in the order they came due, so that they pipeline over the backend's
//! multiplexed connection. A renewal's future is allocated when it is sent and freed when it
//! completes: between renewals a lease costs the watchdog a map entry, a wheel slot and its
//! [`LossSignal`] (about 350 bytes with its [`KeptLease`], as measured by the bench).
//!
//! Dropping a [`KeptLease`] stops its renewals and fires its signal
//! ([`LossReason::Dropped`]); [`KeptLease::release`] stops them and releases, and the signal
//! then says how the release went.
//!
//! The timer wheel runs on tokio's clock, which stops while the system is suspended, while
//! validity is counted on the handle's clock ([`BootClock`](crate::BootClock) counts through
//! a suspend): after a suspend the signal can come late, by up to a cadence after the resume,
//! but validity is never overstated.
//!
//! The watchdog is not generic: leases of any backend share its task, each seen through a
//! type-erased view of its handle. A backend that panics while renewing stops only its own
//! lease (its signal fires, [`LossReason::WatchdogStopped`]).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::backend::LeaseBackend;
use crate::error::{Error, ErrorKind};
use crate::handle::{LeaseHandle, LeaseState, RenewFuture, Renewable};
use crate::outcome::{ReleaseOutcome, RenewOutcome};

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
    Released,
    /// The local validity ran out before a renewal could be confirmed (e.g. a starved runtime).
    Expired,
    /// Renewals kept failing or going unanswered until only the safety margin was left (or
    /// the lease was kept with no more than that left); or the release by
    /// [`KeptLease::release`] was not applied or went unanswered, so the lease is neither
    /// renewed nor known to be released.
    Unreachable,
    /// The watchdog stopped renewing the lease: the runtime its task ran on shut down, or the
    /// backend panicked while renewing it.
    WatchdogStopped,
    /// The [`KeptLease`] was dropped without being released (or while its release was under
    /// way): nothing renews the lease any more, though the server keeps it until its TTL
    /// runs out.
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
}

impl LossSignal {
    fn fire(&self, reason: LossReason) {
        // The first reason wins; later ones are consequences of it.
        if self.state.reason.set(reason).is_ok() {
            self.state.fired.notify_waiters();
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

/// How a [`Watchdog`] renews.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAliveSettings {
    cadence_divisor: u32,
    margin_divisor: u32,
    max_leases: usize,
    max_in_flight: usize,
}

impl Default for KeepAliveSettings {
    fn default() -> Self {
        Self {
            cadence_divisor: 3,
            margin_divisor: 5,
            max_leases: 100_000,
            max_in_flight: 256,
        }
    }
}

impl KeepAliveSettings {
    /// Sets the cadence: a renewal every TTL / `divisor` (2 to 100; default 3).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if out of range, or if with the margin divisor already
    /// set there is no room for a retry (see [`with_margin_divisor`](Self::with_margin_divisor)).
    pub fn with_cadence_divisor(mut self, divisor: u32) -> Result<Self, Error> {
        if !(2..=100).contains(&divisor) {
            return Err(Error::new(
                ErrorKind::InvalidSetting,
                "cadence divisor must be 2 to 100",
            ));
        }
        self.cadence_divisor = divisor;
        self.check_room()
    }

    /// Sets the safety margin: the signal fires when renewals keep failing and TTL / `divisor`
    /// of validity is left (2 to 100; default 5).
    ///
    /// The cadence, a retry interval (cadence / 4) and the margin must add up to less than
    /// the TTL, so that a renewal at the cadence that fails leaves room for a retry, answered
    /// before the margin point: only a cadence and a margin of TTL / 2 each are refused.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if out of range, or if with the cadence divisor already
    /// set there is no room for a retry.
    pub fn with_margin_divisor(mut self, divisor: u32) -> Result<Self, Error> {
        if !(2..=100).contains(&divisor) {
            return Err(Error::new(
                ErrorKind::InvalidSetting,
                "margin divisor must be 2 to 100",
            ));
        }
        self.margin_divisor = divisor;
        self.check_room()
    }

    /// Returns the settings if the cadence, a retry interval and the margin add up to less
    /// than the TTL (see [`has_room`]).
    fn check_room(self) -> Result<Self, Error> {
        let (c, m) = (self.cadence_divisor, self.margin_divisor);
        if has_room(c, m) {
            Ok(self)
        } else {
            Err(Error::new(
                ErrorKind::InvalidSetting,
                format!(
                    "a cadence of TTL / {c} and a margin of TTL / {m} leave no room for a retry \
                     before the margin point"
                ),
            ))
        }
    }

    /// Checks that a lease of `ttl`, whose validity after each renewal is `ttl - drift`, can
    /// be kept (see [`Schedule::fits`]).
    fn check_lease(&self, ttl: Duration, drift: Duration) -> Result<(), Error> {
        let validity = ttl.saturating_sub(drift);
        let schedule = self.schedule(ttl);
        if schedule.fits(validity) {
            return Ok(());
        }
        let Schedule {
            cadence,
            retry,
            margin,
        } = schedule;
        Err(Error::new(
            ErrorKind::InvalidSetting,
            format!(
                "a lease with TTL {ttl:?} and drift budget {drift:?} is valid for {validity:?} \
                 after a renewal, not more than the cadence ({cadence:?}), a retry interval \
                 ({retry:?}) and the margin ({margin:?}): a longer TTL or other watchdog \
                 settings are needed"
            ),
        ))
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

    /// Sets how many renewals the watchdog sends at once (1 to 100,000; default 256); due
    /// renewals beyond it wait, in the order they came due, for one to complete.
    ///
    /// It bounds the memory of renewals in flight (each holds the backend's send future), and
    /// with a pipelining backend a few hundred at once are plenty: at 1 ms per round trip, 256
    /// in flight renew 256,000 leases a second. Keep it at or below the backend's own in-flight
    /// limit, or the excess comes back `Overloaded` (and is retried).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if out of range.
    pub fn with_max_in_flight(mut self, max: usize) -> Result<Self, Error> {
        if !(1..=100_000).contains(&max) {
            return Err(Error::new(
                ErrorKind::InvalidSetting,
                "max in flight must be 1 to 100000",
            ));
        }
        self.max_in_flight = max;
        Ok(self)
    }

    /// The schedule of a lease of `ttl` under these settings.
    fn schedule(&self, ttl: Duration) -> Schedule {
        Schedule::new(ttl, self.cadence_divisor, self.margin_divisor)
    }
}

/// Returns true if and only if a cadence of TTL / `cadence_divisor`, a retry interval and a
/// margin of TTL / `margin_divisor` add up to less than the TTL: TTL / c + TTL / 4c + TTL / m
/// < TTL, that is 5m + 4c < 4cm (in integers, so that it holds for every TTL alike).
fn has_room(cadence_divisor: u32, margin_divisor: u32) -> bool {
    let (c, m) = (u64::from(cadence_divisor), u64::from(margin_divisor));
    5 * m + 4 * c < 4 * c * m
}

/// The shortest retry interval: a cadence / 4 that rounds to nothing would retry a failing
/// backend in a tight loop.
const MIN_RETRY: Duration = Duration::from_millis(1);

/// The intervals that pace one kept lease, fractions of its TTL, and the decisions taken
/// from them.
///
/// Pure arithmetic: nothing here reads a clock. The lease's remaining validity is read by the
/// caller and passed in, so that one reading serves one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Schedule {
    /// How long after a confirmation the next renewal is due: TTL / the cadence divisor.
    cadence: Duration,
    /// The wait before retrying a failed renewal: a quarter of the cadence, so that with the
    /// defaults at least two retries happen between the first failure and the signal (and at
    /// least [`MIN_RETRY`]).
    retry: Duration,
    /// The validity left at which the signal fires unless a renewal was confirmed: TTL / the
    /// margin divisor.
    margin: Duration,
}

impl Schedule {
    fn new(ttl: Duration, cadence_divisor: u32, margin_divisor: u32) -> Self {
        let cadence = ttl / cadence_divisor;
        Self {
            cadence,
            retry: (cadence / 4).max(MIN_RETRY),
            margin: ttl / margin_divisor,
        }
    }

    /// Returns true if and only if a lease valid for `validity` after each renewal can be
    /// kept: that validity must be more than the cadence, a retry interval and the margin
    /// together, or a failed renewal could not be retried in time (and with less than the
    /// margin and a retry interval, every renewal would be due at once, for ever).
    fn fits(&self, validity: Duration) -> bool {
        validity > self.cadence + self.retry + self.margin
    }

    /// How long from now, with `remaining` validity, until the margin point: the instant the
    /// remaining validity falls to the margin.
    fn until_margin(&self, remaining: Duration) -> Duration {
        remaining.saturating_sub(self.margin)
    }

    /// Returns true if and only if, with `remaining` validity and no confirmation to extend
    /// it, the signal must fire now: the remaining validity is down to the margin.
    fn must_fire(&self, remaining: Duration) -> bool {
        remaining <= self.margin
    }

    /// How long from now, with `remaining` validity, the next renewal is due: a cadence
    /// after a confirmation, a retry interval after a failure, but never later than a retry
    /// interval before the margin point, so that the reply is due before the signal would
    /// fire. After a failure with no retry interval left before the margin point, no retry
    /// could be answered in time: the wait is then to the margin point, where the signal fires.
    fn next_renewal(&self, remaining: Duration, failing: bool) -> Duration {
        let to_margin = self.until_margin(remaining);
        let latest = to_margin.saturating_sub(self.retry);
        if !failing {
            self.cadence.min(latest)
        } else if to_margin > self.retry {
            self.retry.min(latest)
        } else {
            // Also what keeps a backend that fails at once from being retried in a tight loop.
            to_margin
        }
    }
}

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
}

impl Default for Watchdog {
    fn default() -> Self {
        Self::new(KeepAliveSettings::default())
    }
}

/// The watchdog's task and the way to talk to it. Held by the watchdog and by every lease it
/// keeps; the task is aborted when the last of them lets go.
struct Runner {
    commands: mpsc::UnboundedSender<Command>,
    next_id: AtomicU64,
    _task: AbortOnDropHandle<()>,
}

impl fmt::Debug for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("running", &!self.commands.is_closed())
            .finish_non_exhaustive()
    }
}

/// What the watchdog's task is told. Registrations cost no memory beyond the message while it
/// waits to be read: the channel is unbounded, but the semaphore bounds how many leases exist.
enum Command {
    Keep {
        id: u64,
        lease: Arc<dyn Renewable>,
        signal: LossSignal,
    },
    Stop(u64),
}

/// A kept lease's place in the watchdog: dropping it tells the task to forget the lease (if
/// `stop` did not already), fires the signal, then frees the slot. In that order, so that a
/// registration made with the freed slot always reaches the task after the forgetting.
struct Registration {
    id: u64,
    /// The task was told to forget the lease, or never knew it.
    stopped: bool,
    signal: LossSignal,
    runner: Arc<Runner>,
    _slot: OwnedSemaphorePermit,
}

impl Registration {
    /// Tells the task to forget the lease: it starts no renewal of it after reading this.
    fn stop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            // Fails only if the task has ended, and then there is nothing to stop.
            let _ = self.runner.commands.send(Command::Stop(self.id));
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

/// A lease kept alive by a [`Watchdog`].
///
/// Dropping it stops its renewals and fires its signal ([`LossReason::Dropped`]); the lease
/// stays held on the server until its TTL runs out.
#[must_use = "dropping a kept lease stops its renewals and leaves it held until its TTL \
              runs out; call `release().await`"]
pub struct KeptLease<B: LeaseBackend> {
    handle: LeaseHandle<B>,
    registration: Registration,
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

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossReason::LostToAnother => "the server no longer holds this grant",
            LossReason::Released => "the lease was released",
            LossReason::Expired => "the local validity ran out before a renewal was confirmed",
            LossReason::Unreachable => "renewals failed or went unanswered until the margin",
            LossReason::WatchdogStopped => "the watchdog stopped",
            LossReason::Dropped => "the kept lease was dropped",
        })
    }
}

impl Watchdog {
    /// Makes a watchdog. No task is started until the first [`keep`](Self::keep).
    pub fn new(settings: KeepAliveSettings) -> Self {
        Self {
            settings,
            slots: Arc::new(Semaphore::new(settings.max_leases)),
            runner: Arc::new(Mutex::new(None)),
        }
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
    /// The handle is given back with the error, still held:
    ///
    /// - [`ErrorKind::InvalidSetting`] if the handle's validity after a renewal (its TTL less
    ///   its drift budget) is not more than the cadence, a retry interval and the margin
    ///   together: a failed renewal could not be retried before the signal fires;
    /// - [`ErrorKind::WatchdogFull`] if it keeps as many leases as it may.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (with the `time` driver), when the watchdog's task has to be
    /// started: at the first call, or after the runtime it ran on shut down.
    pub fn keep<B: LeaseBackend>(
        &self,
        handle: LeaseHandle<B>,
    ) -> Result<KeptLease<B>, (Error, LeaseHandle<B>)> {
        if let Err(error) = self.settings.check_lease(handle.ttl(), handle.drift()) {
            return Err((error, handle));
        }
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            let error = Error::new(
                ErrorKind::WatchdogFull,
                format!(
                    "the watchdog keeps {} leases already",
                    self.settings.max_leases
                ),
            );
            return Err((error, handle));
        };
        let runner = self.runner();
        let id = runner.next_id.fetch_add(1, Ordering::Relaxed);
        let signal = LossSignal::default();
        let lease = handle.renewable();
        // A handle already lost or released, or with no more than the margin left, cannot be
        // kept: its work is told before `keep` returns, and the task never sees it.
        let stopped = match loss_at_margin(&self.settings, lease.as_ref()) {
            Some(reason) => {
                signal.fire(reason);
                true
            }
            None => {
                let keep = Command::Keep {
                    id,
                    lease,
                    signal: signal.clone(),
                };
                if runner.commands.send(keep).is_err() {
                    // The task ended since `runner()` looked (its runtime is shutting down):
                    // nothing will renew this lease, and its work must know.
                    signal.fire(LossReason::WatchdogStopped);
                }
                false
            }
        };
        Ok(KeptLease {
            handle,
            registration: Registration {
                id,
                stopped,
                signal,
                runner,
                _slot: slot,
            },
        })
    }

    /// Returns the running task, starting one on the current runtime if there is none or the
    /// last one ended with its runtime.
    fn runner(&self) -> Arc<Runner> {
        let mut current = self.runner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(runner) = current.as_ref().filter(|r| !r.commands.is_closed()) {
            return Arc::clone(runner);
        }
        let (commands, received) = mpsc::unbounded_channel();
        let task = tokio::spawn(Keeper::new(self.settings, received).run());
        let runner = Arc::new(Runner {
            commands,
            next_id: AtomicU64::new(0),
            _task: AbortOnDropHandle::new(task),
        });
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
    /// As [`keep`](Self::keep) ([`ErrorKind::InvalidSetting`], [`ErrorKind::WatchdogFull`]),
    /// before the work starts; the lease is released then.
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

/// Where a kept lease stands in the watchdog, and so what its timer-wheel slot means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Between renewals. The slot holds the next renewal.
    Waiting,
    /// A renewal is due: queued for a send slot, or `sending`. The slot holds the margin
    /// point, set once when the renewal came due: the signal fires then unless a
    /// confirmation comes first.
    Due { sending: bool },
    /// The signal fired; nothing more is sent. The entry stays until the lease is dropped.
    Done,
}

/// One kept lease, as the watchdog's task holds it.
struct Entry {
    lease: Arc<dyn Renewable>,
    signal: LossSignal,
    /// The lease's one slot in the timer wheel, while it has one.
    timer: Option<delay_queue::Key>,
    phase: Phase,
}

impl Entry {
    fn new(lease: Arc<dyn Renewable>, signal: LossSignal) -> Self {
        Self {
            lease,
            signal,
            timer: None,
            phase: Phase::Waiting,
        }
    }
}

/// A renewal being sent, tagged with its lease.
struct Sending {
    id: u64,
    renewal: RenewFuture,
}

impl Future for Sending {
    /// `None` if the backend panicked.
    type Output = (u64, Option<RenewOutcome>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // One task renews every lease, possibly of several backends: a backend that panics
        // must not stop the renewals of all the others. The panicked future is dropped
        // without being polled again.
        match std::panic::catch_unwind(AssertUnwindSafe(|| this.renewal.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(outcome)) => Poll::Ready((this.id, Some(outcome))),
            Err(_) => Poll::Ready((this.id, None)),
        }
    }
}

enum Event {
    Command(Option<Command>),
    Timer(u64),
    Sent(u64, Option<RenewOutcome>),
}

/// The watchdog's task: every kept lease, one timer wheel, the renewals in flight.
struct Keeper {
    settings: KeepAliveSettings,
    commands: mpsc::UnboundedReceiver<Command>,
    leases: HashMap<u64, Entry>,
    timers: DelayQueue<u64>,
    /// Leases whose renewal is due and waits for a send slot, in the order they came due.
    ready: VecDeque<u64>,
    sending: FuturesUnordered<Sending>,
}

impl Keeper {
    fn new(settings: KeepAliveSettings, commands: mpsc::UnboundedReceiver<Command>) -> Self {
        Self {
            settings,
            commands,
            leases: HashMap::new(),
            timers: DelayQueue::new(),
            ready: VecDeque::new(),
            sending: FuturesUnordered::new(),
        }
    }

    async fn run(mut self) {
        while self.step().await {}
    }

    /// Waits for the next event and handles it; false once nothing is left to keep.
    async fn step(&mut self) -> bool {
        match poll_fn(|cx| self.poll_event(cx)).await {
            Event::Command(Some(command)) => self.command(command),
            // Every sender is gone, so every lease was stopped: nothing is left to keep.
            Event::Command(None) => return false,
            Event::Timer(id) => self.timer_fired(id),
            Event::Sent(id, outcome) => self.sent(id, outcome),
        }
        self.send_due();
        true
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Event> {
        // Commands first, so a stop is seen before that lease's next timer; completed
        // renewals before timers, so that their send slots are free for the due ones.
        if let Poll::Ready(command) = self.commands.poll_recv(cx) {
            return Poll::Ready(Event::Command(command));
        }
        if let Poll::Ready(Some((id, outcome))) = self.sending.poll_next_unpin(cx) {
            return Poll::Ready(Event::Sent(id, outcome));
        }
        if let Poll::Ready(Some(expired)) = self.timers.poll_expired(cx) {
            return Poll::Ready(Event::Timer(expired.into_inner()));
        }
        // Each source that is not ready has registered the task's waker (an empty
        // `FuturesUnordered` or `DelayQueue` has nothing to wait for, and is polled again
        // after the next event, which is the only way it can fill).
        Poll::Pending
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Keep { id, lease, signal } => {
                self.leases.insert(id, Entry::new(lease, signal));
                self.wait(id, false);
            }
            Command::Stop(id) => {
                if let Some(Entry {
                    timer: Some(key), ..
                }) = self.leases.remove(&id)
                {
                    self.timers.remove(&key);
                }
                // Its id may still be in `ready` (skipped there), and a renewal of it may be
                // in flight: that one finishes — a release waits for it — and is ignored.
                self.prune_ready();
            }
        }
    }

    /// Drops from `ready` the ids of leases no longer queued, once they could be most of it.
    ///
    /// A lease stopped or fired while queued leaves its id there, skipped when it is popped;
    /// but while every send slot is taken (renewals that hang), nothing is popped, and with
    /// leases kept and dropped meanwhile the ids would pile up without bound. Each lease in
    /// the map has at most one id in `ready`, so past twice their number at least half are
    /// stale: pruning then costs O(1) amortized per stop.
    fn prune_ready(&mut self) {
        if self.ready.len() > 2 * self.leases.len() + 64 {
            let leases = &self.leases;
            self.ready.retain(|id| {
                leases
                    .get(id)
                    .is_some_and(|e| e.phase == Phase::Due { sending: false })
            });
        }
    }

    /// Puts the lease between renewals; see `Schedule::next_renewal`.
    fn wait(&mut self, id: u64, failing: bool) {
        let Some(entry) = self.leases.get_mut(&id) else {
            return;
        };
        let schedule = self.settings.schedule(entry.lease.ttl());
        let after = schedule.next_renewal(entry.lease.remaining_validity(), failing);
        entry.phase = Phase::Waiting;
        set_timer(&mut self.timers, id, entry, after);
    }

    fn timer_fired(&mut self, id: u64) {
        let Some(entry) = self.leases.get_mut(&id) else {
            return;
        };
        // The wheel has let go of the expired slot.
        entry.timer = None;
        if entry.phase == Phase::Done {
            return;
        }
        if let Some(reason) = loss_at_margin(&self.settings, entry.lease.as_ref()) {
            // At the margin point, or woken past it (a starved runtime): stop the work now,
            // whether a renewal is still queued, being sent, or not yet due. It may yet
            // succeed; the signal cannot wait.
            return self.fire(id, reason);
        }
        let Some(entry) = self.leases.get_mut(&id) else {
            return;
        };
        let schedule = self.settings.schedule(entry.lease.ttl());
        // Until the margin point (set once here, never pushed back when the renewal is sent):
        // for a renewal coming due, its time to be answered; for one already due and woken
        // before the lease's own clock got there (the wheel runs on tokio's clock, validity
        // on the handle's), the rest of that time.
        let to_margin = schedule.until_margin(entry.lease.remaining_validity());
        if entry.phase == Phase::Waiting {
            entry.phase = Phase::Due { sending: false };
            self.ready.push_back(id);
        }
        set_timer(&mut self.timers, id, entry, to_margin);
    }

    fn sent(&mut self, id: u64, outcome: Option<RenewOutcome>) {
        let Some(entry) = self.leases.get(&id) else {
            // Stopped while sending.
            return;
        };
        if entry.phase == Phase::Done {
            // The signal fired while this was being sent; it cannot be undone.
            return;
        }
        let reason = match renewal_verdict(outcome.as_ref()) {
            RenewalVerdict::Confirmed => return self.wait(id, false),
            RenewalVerdict::Ended(reason) => reason,
            // Retry while validity above the margin remains; once it is down to the margin,
            // stop.
            RenewalVerdict::Unproven => {
                match loss_at_margin(&self.settings, entry.lease.as_ref()) {
                    Some(reason) => reason,
                    None => return self.wait(id, true),
                }
            }
        };
        self.fire(id, reason);
    }

    /// Starts due renewals while send slots are free.
    fn send_due(&mut self) {
        while self.sending.len() < self.settings.max_in_flight {
            let Some(id) = self.ready.pop_front() else {
                return;
            };
            // Stopped, or fired while it waited: skip it.
            let Some(entry) = self.leases.get(&id) else {
                continue;
            };
            if entry.phase != (Phase::Due { sending: false }) {
                continue;
            }
            if let Some(reason) = loss_at_margin(&self.settings, entry.lease.as_ref()) {
                // Its time ran out while it queued (its timer would say so next).
                self.fire(id, reason);
                continue;
            }
            let Some(entry) = self.leases.get_mut(&id) else {
                continue;
            };
            // The slot keeps the margin point it was given when the renewal came due.
            entry.phase = Phase::Due { sending: true };
            self.sending.push(Sending {
                id,
                renewal: Arc::clone(&entry.lease).renew(),
            });
        }
    }

    fn fire(&mut self, id: u64, reason: LossReason) {
        if let Some(entry) = self.leases.get_mut(&id) {
            if let Some(key) = entry.timer.take() {
                self.timers.remove(&key);
            }
            entry.phase = Phase::Done;
            entry.signal.fire(reason);
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // Catch up on what the task was told but had not read: leases dropped just before it
        // was aborted were let go, not lost; leases kept just before it ended were never
        // renewed, and must be told.
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Keep { id, lease, signal } => {
                    self.leases.insert(id, Entry::new(lease, signal));
                }
                Command::Stop(id) => {
                    self.leases.remove(&id);
                }
            }
        }
        // The task is ending (its runtime shut down, or it was aborted): nothing will renew
        // the leases left any more, so their work must be told.
        for entry in self.leases.values() {
            if entry.phase != Phase::Done {
                entry.signal.fire(LossReason::WatchdogStopped);
            }
        }
    }
}

/// Points the lease's one timer-wheel slot at `after` from now.
fn set_timer(timers: &mut DelayQueue<u64>, id: u64, entry: &mut Entry, after: Duration) {
    let at = Instant::now() + after;
    match &entry.timer {
        Some(key) => timers.reset_at(key, at),
        None => entry.timer = Some(timers.insert_at(id, at)),
    }
}

/// Returns why the signal must fire now, if it must: the lease's remaining validity is down
/// to the margin without a confirmation to extend it.
///
/// This is where the lease's clock is read; the decision is [`Schedule::must_fire`]'s. The
/// state is read only when the signal fires, as only then is it needed.
fn loss_at_margin(settings: &KeepAliveSettings, lease: &dyn Renewable) -> Option<LossReason> {
    let schedule = settings.schedule(lease.ttl());
    schedule
        .must_fire(lease.remaining_validity())
        .then(|| margin_reason(lease.state()))
}

/// What a renewal's outcome (`None` if the backend panicked) means for its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RenewalVerdict {
    /// The renewal was confirmed: the next one is due a cadence on.
    Confirmed,
    /// Failed, indeterminate or overloaded: nothing is proven either way, and the lease is
    /// retried while validity above the margin remains.
    Unproven,
    /// The lease has ended, or nothing will renew it any more: the signal fires.
    Ended(LossReason),
}

/// Judges a renewal by its outcome alone.
fn renewal_verdict(outcome: Option<&RenewOutcome>) -> RenewalVerdict {
    match outcome {
        Some(RenewOutcome::Renewed { .. }) => RenewalVerdict::Confirmed,
        Some(RenewOutcome::Lost(_)) => RenewalVerdict::Ended(LossReason::LostToAnother),
        // Refused from Lost, or because a release is under way (any other state).
        Some(RenewOutcome::Refused {
            state: LeaseState::Lost,
        }) => RenewalVerdict::Ended(LossReason::LostToAnother),
        Some(RenewOutcome::Refused { .. }) => RenewalVerdict::Ended(LossReason::Released),
        None => RenewalVerdict::Ended(LossReason::WatchdogStopped),
        Some(
            RenewOutcome::Indeterminate(_)
            | RenewOutcome::Unavailable(_)
            | RenewOutcome::Overloaded,
        ) => RenewalVerdict::Unproven,
    }
}

/// Why the signal fires after [`KeptLease::release`] returned `outcome`.
fn release_reason(outcome: &ReleaseOutcome) -> LossReason {
    match outcome {
        ReleaseOutcome::Released
        | ReleaseOutcome::Refused {
            state: LeaseState::Released,
        } => LossReason::Released,
        // The grant was gone before the release came: the lease ended under the work.
        ReleaseOutcome::AlreadyGone | ReleaseOutcome::NotOwner | ReleaseOutcome::Refused { .. } => {
            LossReason::LostToAnother
        }
        // Not applied, or not known to be: neither renewed any more nor known to be released.
        ReleaseOutcome::Indeterminate(_)
        | ReleaseOutcome::Unavailable(_)
        | ReleaseOutcome::Overloaded => LossReason::Unreachable,
    }
}

/// Why the signal fires for a lease whose remaining validity is down to the margin (or to
/// nothing), from what its handle has recorded: a lease released or lost through its handle
/// (or through a replayed handle, which shares its state) is not merely unconfirmed.
fn margin_reason(state: LeaseState) -> LossReason {
    match state {
        LeaseState::Lost => LossReason::LostToAnother,
        LeaseState::Released => LossReason::Released,
        LeaseState::Expired => LossReason::Expired,
        _ => LossReason::Unreachable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease whose renewals never complete, valid for 2.96 s from when it was made.
    struct Hanging {
        valid_until: Instant,
    }

    impl Renewable for Hanging {
        fn ttl(&self) -> Duration {
            Duration::from_secs(3)
        }
        fn state(&self) -> LeaseState {
            LeaseState::Active
        }
        fn remaining_validity(&self) -> Duration {
            self.valid_until.saturating_duration_since(Instant::now())
        }
        fn renew(self: Arc<Self>) -> RenewFuture {
            Box::pin(std::future::pending())
        }
    }

    fn hanging() -> Arc<dyn Renewable> {
        Arc::new(Hanging {
            valid_until: Instant::now() + Duration::from_millis(2_960),
        })
    }

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

    #[tokio::test(start_paused = true)]
    async fn the_ids_of_leases_stopped_while_queued_do_not_pile_up() {
        let settings = KeepAliveSettings::default().with_max_in_flight(1).unwrap();
        let (commands, received) = mpsc::unbounded_channel();
        let mut keeper = Keeper::new(settings, received);
        let keep = |id| Command::Keep {
            id,
            lease: hanging(),
            signal: LossSignal::default(),
        };
        // Lease 0's renewal is sent at 1 s and never completes: the one send slot stays busy.
        commands.send(keep(0)).unwrap();
        while keeper.sending.is_empty() {
            assert!(keeper.step().await);
        }
        // Then 1,000 leases are kept, come due, queue behind it, and are dropped.
        for id in 1..=1_000 {
            commands.send(keep(id)).unwrap();
            while keeper.leases.get(&id).map(|e| e.phase) != Some(Phase::Due { sending: false }) {
                assert!(keeper.step().await);
            }
            commands.send(Command::Stop(id)).unwrap();
            while keeper.leases.contains_key(&id) {
                assert!(keeper.step().await);
            }
        }
        assert!(
            keeper.ready.len() <= 100,
            "{} ids queued",
            keeper.ready.len()
        );
    }
}
