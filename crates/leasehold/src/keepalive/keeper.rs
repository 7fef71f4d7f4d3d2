//! The watchdog's task: every kept lease, one timer wheel, the renewals in flight.
//!
//! The task owns its leases and talks to the rest of the module only through [`Runner`]: a
//! [`Command`] to keep or stop a lease, and each lease's [`LossSignal`] to fire. When to renew
//! and when to fire is decided by the [`Schedule`](super::schedule::Schedule); this is where
//! the leases' clocks are read, the wheel is set and the renewals are sent.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;
use tokio_util::time::{DelayQueue, delay_queue};

use super::load::{Load, Meter, Timed};
use super::schedule::{RenewalVerdict, margin_reason, renewal_verdict};
use super::settings::KeepAliveSettings;
use super::signal::{LossReason, LossSignal};
use crate::handle::{RenewFuture, Renewable};
use crate::outcome::RenewOutcome;

/// The watchdog's task and the way to talk to it. Held by the watchdog and by every lease it
/// keeps; the task is aborted when the last of them lets go.
pub(super) struct Runner {
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

impl Runner {
    /// Starts a task keeping leases under `settings` on the current runtime, measuring its
    /// capacity into `load` (its polling time into `busy`).
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime with the `time` driver.
    pub(super) fn start(
        settings: KeepAliveSettings,
        load: &Arc<Load>,
        busy: &Arc<AtomicU64>,
    ) -> Self {
        let (commands, received) = mpsc::unbounded_channel();
        let meter = Meter::new(Arc::clone(load), settings.max_in_flight(), Arc::clone(busy));
        let keeper = Keeper::new(settings, received, meter);
        let task = tokio::spawn(Timed::new(keeper.run(), Arc::clone(busy)));
        Self {
            commands,
            next_id: AtomicU64::new(0),
            _task: AbortOnDropHandle::new(task),
        }
    }

    /// Returns true if and only if the task is still running: it ends with its runtime.
    pub(super) fn is_running(&self) -> bool {
        !self.commands.is_closed()
    }

    /// Returns a lease id this task has not given out before.
    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Tells the task to keep `lease` as `id`, firing `signal` when its work must stop.
    /// Returns false if the task has ended, and then nothing will renew the lease.
    pub(super) fn keep(&self, id: u64, lease: Arc<dyn Renewable>, signal: LossSignal) -> bool {
        self.commands
            .send(Command::Keep { id, lease, signal })
            .is_ok()
    }

    /// Tells the task to forget lease `id`: it starts no renewal of it after reading this.
    pub(super) fn stop(&self, id: u64) {
        // Fails only if the task has ended, and then there is nothing to stop.
        let _ = self.commands.send(Command::Stop(id));
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

/// A renewal being sent, tagged with its lease and when it was sent.
struct Sending {
    id: u64,
    renewal: RenewFuture,
    sent_at: Instant,
}

impl Future for Sending {
    /// The lease, the outcome (`None` if the backend panicked) and when it was sent.
    type Output = (u64, Option<RenewOutcome>, Instant);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // One task renews every lease, possibly of several backends: a backend that panics
        // must not stop the renewals of all the others. The panicked future is dropped
        // without being polled again.
        match std::panic::catch_unwind(AssertUnwindSafe(|| this.renewal.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(outcome)) => Poll::Ready((this.id, Some(outcome), this.sent_at)),
            Err(_) => Poll::Ready((this.id, None, this.sent_at)),
        }
    }
}

enum Event {
    Command(Option<Command>),
    Timer(u64),
    Sent(u64, Option<RenewOutcome>, Instant),
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
    /// How long renewals take, and how busy the task is: its capacity, for admission.
    meter: Meter,
}

impl Keeper {
    fn new(
        settings: KeepAliveSettings,
        commands: mpsc::UnboundedReceiver<Command>,
        meter: Meter,
    ) -> Self {
        Self {
            settings,
            commands,
            leases: HashMap::new(),
            timers: DelayQueue::new(),
            ready: VecDeque::new(),
            sending: FuturesUnordered::new(),
            meter,
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
            Event::Sent(id, outcome, sent_at) => {
                let now = Instant::now();
                self.meter.answered(now.duration_since(sent_at), now);
                self.sent(id, outcome);
            }
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
        if let Poll::Ready(Some((id, outcome, sent_at))) = self.sending.poll_next_unpin(cx) {
            return Poll::Ready(Event::Sent(id, outcome, sent_at));
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
        while self.sending.len() < self.settings.max_in_flight() {
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
                sent_at: Instant::now(),
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
/// This is where the lease's clock is read; the decision is
/// [`Schedule::must_fire`](super::schedule::Schedule::must_fire)'s. The state is read only
/// when the signal fires, as only then is it needed.
pub(super) fn loss_at_margin(
    settings: &KeepAliveSettings,
    lease: &dyn Renewable,
) -> Option<LossReason> {
    let schedule = settings.schedule(lease.ttl());
    schedule
        .must_fire(lease.remaining_validity())
        .then(|| margin_reason(lease.state()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handle::LeaseState;

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

    #[tokio::test(start_paused = true)]
    async fn the_ids_of_leases_stopped_while_queued_do_not_pile_up() {
        let settings = KeepAliveSettings::default().with_max_in_flight(1).unwrap();
        let (commands, received) = mpsc::unbounded_channel();
        let meter = Meter::new(Arc::new(Load::new(1, 1)), 1, Arc::default());
        let mut keeper = Keeper::new(settings, received, meter);
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
