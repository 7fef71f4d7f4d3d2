//! A watchdog's load: the renewals its leases need, and how many it can confirm, measured.
//!
//! Every kept lease needs a renewal every cadence: its *demand* is 1 / cadence renewals per
//! second, and the watchdog's demand is the sum. Its *capacity* is measured by its task
//! ([`Meter`]), over windows of about a second of renewals, as the lesser of two bounds:
//!
//! - what its send slots allow: `max_in_flight` renewals at once, each taking the mean time a
//!   renewal took from send to answer (Little's law), which grows when the server, the
//!   connection or the process's CPU is the limit;
//! - what the task itself can do: renewals per second of its own polling time, the limit
//!   when the one task that keeps every lease is the bottleneck (issue 34: 400,000 leases of
//!   3 s lost up to 120,287 with the machine 20 % idle).
//!
//! A watchdog *admits* a lease only if the demand with it stays within three quarters of the
//! capacity. Before the first measurement the capacity is estimated as the lesser of what its
//! settings assume and its send slots over the mean round trip of the acquires that granted
//! the leases it was given (the same server, over the same connection): a process
//! asked to keep more than it can renew in time refuses the extra leases up front
//! ([`ErrorKind::WatchdogOverloaded`](crate::ErrorKind::WatchdogOverloaded)) instead of losing
//! leases it already keeps. A watchdog that keeps nothing admits any one lease, so that an old
//! measurement never locks it out: its renewals measure again.
//!
//! Demand, capacity and the admission limit show in metrics and on the
//! [`Watchdog`](super::Watchdog).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Renewals per second, in thousandths: integers for atomics, exact for every cadence in
/// whole milliseconds.
type MilliHz = u64;

/// A window ends after this long, if it saw [`MIN_RENEWALS`] renewals.
const WINDOW: Duration = Duration::from_secs(1);
/// Fewer renewals than this in a window say too little to measure by.
const MIN_RENEWALS: u64 = 64;
/// The share of the capacity admitted, as a fraction: three quarters, so that renewals that
/// come due together, and a window that measured high, still leave room.
const ADMITTED: (u64, u64) = (3, 4);

/// The renewals a lease needs per second: one every `cadence`.
pub(super) fn demand_of(cadence: Duration) -> MilliHz {
    let micros = u64::try_from(cadence.as_micros())
        .unwrap_or(u64::MAX)
        .max(1);
    // 10^9 thousandths of a renewal per second, over the cadence in microseconds; at least 1,
    // so that every lease counts.
    (1_000_000_000 / micros).max(1)
}

/// A watchdog's demand and measured capacity, shared by its `keep` and its task.
#[derive(Debug)]
pub(super) struct Load {
    demand: AtomicU64,
    /// 0 until the task has measured a window.
    capacity: AtomicU64,
    /// The capacity assumed until one is measured.
    assumed: MilliHz,
    max_in_flight: u64,
    /// The acquire round trips of the leases offered so far, in nanoseconds, and how many:
    /// what a renewal will take, until renewals are measured.
    acquired_in: AtomicU64,
    acquires: AtomicU64,
}

/// Why a lease was not admitted: the demand and the limit it would have passed, in renewals
/// per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Overload {
    pub(super) demand: f64,
    pub(super) need: f64,
    pub(super) limit: f64,
    /// Whether the limit comes from a measurement (or from the assumed capacity).
    pub(super) measured: bool,
}

impl Load {
    /// A load with nothing kept, for a watchdog with `max_in_flight` send slots, assuming
    /// `assumed` renewals per second at most until it measures.
    pub(super) fn new(assumed: u32, max_in_flight: usize) -> Self {
        Self {
            demand: AtomicU64::new(0),
            capacity: AtomicU64::new(0),
            assumed: u64::from(assumed) * 1000,
            max_in_flight: u64::try_from(max_in_flight).unwrap_or(u64::MAX),
            acquired_in: AtomicU64::new(0),
            acquires: AtomicU64::new(0),
        }
    }

    /// Counts a lease that needs `need`, granted by an acquire that took `acquired_in`, in the
    /// demand, until the returned share is dropped, if the demand with it stays within the
    /// admission limit, or nothing else is kept.
    pub(super) fn admit(
        self: &Arc<Self>,
        need: MilliHz,
        acquired_in: Duration,
    ) -> Result<Demand, Overload> {
        if self.capacity.load(Ordering::Relaxed) == 0 {
            // Only the estimate before the first measurement uses them: no work after it, and
            // no sum that grows for as long as the process lives.
            let nanos = u64::try_from(acquired_in.as_nanos()).unwrap_or(u64::MAX);
            self.acquired_in.fetch_add(nanos, Ordering::Relaxed);
            self.acquires.fetch_add(1, Ordering::Relaxed);
        }
        let limit = self.limit();
        let admitted = self
            .demand
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |demand| {
                let with = demand.saturating_add(need);
                (demand == 0 || with <= limit).then_some(with)
            });
        match admitted {
            Ok(_) => {
                crate::telemetry::keepalive_demand(need as f64 / 1000.0);
                Ok(Demand {
                    load: Arc::clone(self),
                    need,
                })
            }
            Err(demand) => {
                crate::telemetry::keepalive_refused();
                Err(Overload {
                    demand: demand as f64 / 1000.0,
                    need: need as f64 / 1000.0,
                    limit: limit as f64 / 1000.0,
                    measured: self.capacity().is_some(),
                })
            }
        }
    }

    /// The demand admitted at most: three quarters of the capacity measured, or estimated.
    fn limit(&self) -> MilliHz {
        let capacity = match self.capacity.load(Ordering::Relaxed) {
            0 => self.assumed.min(self.by_acquires()),
            measured => measured,
        };
        capacity / ADMITTED.1 * ADMITTED.0
    }

    /// The send slots over the mean acquire round trip (Little's law, as for renewals).
    fn by_acquires(&self) -> MilliHz {
        let (nanos, acquires) = (
            self.acquired_in.load(Ordering::Relaxed),
            self.acquires.load(Ordering::Relaxed),
        );
        if nanos == 0 || acquires == 0 {
            return MilliHz::MAX;
        }
        // slots / (nanos / acquires / 1e9) per second, in thousandths.
        let millihz = self.max_in_flight as f64 * acquires as f64 * 1e12 / nanos as f64;
        millihz.min(u64::MAX as f64) as u64
    }

    /// Returns the admission limit, in renewals per second.
    pub(super) fn admission_limit(&self) -> f64 {
        self.limit() as f64 / 1000.0
    }

    /// Records a measured capacity: half the last measurement and half this one, so that one
    /// odd window moves the limit only halfway.
    fn measured(&self, capacity: MilliHz) {
        let last = self.capacity.load(Ordering::Relaxed);
        let smoothed = if last == 0 {
            capacity
        } else {
            last / 2 + capacity / 2
        };
        self.capacity.store(smoothed.max(1), Ordering::Relaxed);
        crate::telemetry::keepalive_capacity(smoothed as f64 / 1000.0, self.admission_limit());
    }

    /// Returns the capacity last measured, in renewals per second (`None` until measured).
    pub(super) fn capacity(&self) -> Option<f64> {
        let capacity = self.capacity.load(Ordering::Relaxed);
        (capacity > 0).then(|| capacity as f64 / 1000.0)
    }

    /// Returns the demand, in renewals per second.
    pub(super) fn demand(&self) -> f64 {
        self.demand.load(Ordering::Relaxed) as f64 / 1000.0
    }
}

/// One kept lease's share of the demand, given back when the lease is let go.
#[derive(Debug)]
pub(super) struct Demand {
    load: Arc<Load>,
    need: MilliHz,
}

impl Drop for Demand {
    fn drop(&mut self) {
        self.load.demand.fetch_sub(self.need, Ordering::Relaxed);
        crate::telemetry::keepalive_demand(-(self.need as f64) / 1000.0);
    }
}

/// What the watchdog's task measures of its renewals, window by window.
#[derive(Debug)]
pub(super) struct Meter {
    load: Arc<Load>,
    max_in_flight: u64,
    /// The task's polling time so far, in nanoseconds ([`Timed`]).
    busy: Arc<AtomicU64>,
    started: tokio::time::Instant,
    busy_at_start: u64,
    renewals: u64,
    /// The sum of the window's renewals' times from send to answer.
    answered_in: Duration,
}

impl Meter {
    pub(super) fn new(load: Arc<Load>, max_in_flight: usize, busy: Arc<AtomicU64>) -> Self {
        Self {
            load,
            max_in_flight: u64::try_from(max_in_flight).unwrap_or(u64::MAX),
            busy_at_start: busy.load(Ordering::Relaxed),
            busy,
            started: tokio::time::Instant::now(),
            renewals: 0,
            answered_in: Duration::ZERO,
        }
    }

    /// Counts a renewal answered `took` after it was sent, at `now`; closes the window when it
    /// is due.
    pub(super) fn answered(&mut self, took: Duration, now: tokio::time::Instant) {
        self.renewals += 1;
        self.answered_in += took;
        if self.renewals < MIN_RENEWALS || now.duration_since(self.started) < WINDOW {
            return;
        }
        let busy = self.busy.load(Ordering::Relaxed);
        let busy_ns = busy.saturating_sub(self.busy_at_start);
        let to_millihz = |per_second: f64| (per_second * 1000.0).min(u64::MAX as f64) as u64;
        // Little's law: slots over the mean time a renewal holds one.
        let mean = self.answered_in.as_secs_f64() / self.renewals as f64;
        let slots = if mean > 0.0 {
            to_millihz(self.max_in_flight as f64 / mean)
        } else {
            u64::MAX
        };
        // The task's own rate: renewals per second of its polling.
        let task = if busy_ns > 0 {
            to_millihz(self.renewals as f64 * 1e9 / busy_ns as f64)
        } else {
            u64::MAX
        };
        let capacity = slots.min(task);
        if capacity < u64::MAX {
            self.load.measured(capacity);
        }
        self.started = now;
        self.busy_at_start = busy;
        self.renewals = 0;
        self.answered_in = Duration::ZERO;
    }
}

/// A future whose polls are timed into `busy` (nanoseconds): the watchdog's task, whose own
/// rate bounds its capacity. Two clock reads per poll, and a poll handles every event ready.
pub(super) struct Timed<F> {
    inner: std::pin::Pin<Box<F>>,
    busy: Arc<AtomicU64>,
}

impl<F: std::future::Future> Timed<F> {
    pub(super) fn new(inner: F, busy: Arc<AtomicU64>) -> Self {
        Self {
            inner: Box::pin(inner),
            busy,
        }
    }
}

impl<F: std::future::Future> std::future::Future for Timed<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let started = std::time::Instant::now();
        let polled = self.inner.as_mut().poll(cx);
        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.busy.fetch_add(took, Ordering::Relaxed);
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_needs_one_renewal_a_cadence() {
        assert_eq!(demand_of(Duration::from_secs(1)), 1_000);
        assert_eq!(demand_of(Duration::from_millis(100)), 10_000);
        assert_eq!(demand_of(Duration::from_secs(3600)), 1);
        assert_eq!(demand_of(Duration::ZERO), 1_000_000_000);
    }

    #[test]
    fn the_demand_counts_kept_leases_and_the_capacity_is_smoothed() {
        let load = Arc::new(Load::new(20_000, 256));
        let kept: Vec<_> = (0..4)
            .map(|_| load.admit(1_500, Duration::ZERO).unwrap())
            .collect();
        assert_eq!(load.demand(), 6.0);
        drop(kept);
        assert_eq!(load.demand(), 0.0);
        assert_eq!(load.capacity(), None);
        load.measured(1_000_000);
        assert_eq!(load.capacity(), Some(1_000.0));
        // The next window moves it halfway.
        load.measured(3_000_000);
        assert_eq!(load.capacity(), Some(2_000.0));
    }

    #[test]
    fn leases_are_admitted_up_to_three_quarters_of_the_capacity_assumed_then_measured() {
        // Assumed 8 renewals a second: 6 admitted, of one a second each.
        let load = Arc::new(Load::new(8, 256));
        let admit = |need| load.admit(need, Duration::ZERO);
        assert_eq!(load.admission_limit(), 6.0);
        let mut kept: Vec<_> = (0..6).map(|_| admit(1_000).unwrap()).collect();
        let refused = admit(1_000).unwrap_err();
        assert_eq!(
            refused,
            Overload {
                demand: 6.0,
                need: 1.0,
                limit: 6.0,
                measured: false
            }
        );
        assert_eq!(load.demand(), 6.0, "a refusal counts nothing");
        // A measurement of 40 a second admits up to 30.
        load.measured(40_000);
        kept.extend((0..24).map(|_| admit(1_000).unwrap()));
        let refused = admit(500).unwrap_err();
        assert!(refused.measured);
        assert_eq!((refused.demand, refused.limit), (30.0, 30.0));
        // Letting one go makes room for it again.
        kept.pop();
        kept.push(admit(1_000).unwrap());
        // A watchdog that keeps nothing admits any one lease, however much it needs.
        drop(kept);
        let alone = admit(1_000_000).unwrap();
        assert!(admit(1).is_err());
        drop(alone);
        assert_eq!(load.demand(), 0.0);
    }

    #[test]
    fn before_it_measures_a_slow_server_is_seen_in_the_acquires_round_trips() {
        // 256 slots; acquires answered in 50 ms: 5,120 renewals a second at most, below the
        // 20,000 assumed, so 3,840 admitted.
        let load = Arc::new(Load::new(20_000, 256));
        let first = load.admit(1_000, Duration::from_millis(50)).unwrap();
        assert_eq!(load.admission_limit(), 3_840.0);
        // On a fast server the assumed capacity binds: 256 slots over 100 µs is 2,560,000.
        let fast = Arc::new(Load::new(20_000, 256));
        let _kept = fast.admit(1_000, Duration::from_micros(100)).unwrap();
        assert_eq!(fast.admission_limit(), 15_000.0);
        // A measurement replaces the estimate.
        load.measured(100_000_000);
        assert_eq!(load.admission_limit(), 75_000.0);
        drop(first);
    }

    #[tokio::test(start_paused = true)]
    async fn the_slots_bound_the_capacity_by_how_long_a_renewal_takes() {
        let load = Arc::new(Load::new(20_000, 256));
        let busy = Arc::new(AtomicU64::new(0));
        let mut meter = Meter::new(Arc::clone(&load), 100, Arc::clone(&busy));
        // 200 renewals of 10 ms each over a second: 100 slots / 10 ms = 10,000 per second.
        let start = tokio::time::Instant::now();
        for i in 0..200u32 {
            let now = start + WINDOW * i / 199;
            meter.answered(Duration::from_millis(10), now);
        }
        assert_eq!(load.capacity(), Some(10_000.0));
        // The task's own rate binds when it is lower: 64 renewals in 64 ms of polling.
        busy.fetch_add(64_000_000, Ordering::Relaxed);
        for i in 0..64u32 {
            meter.answered(
                Duration::from_millis(1),
                start + WINDOW * 2 + WINDOW * i / 63,
            );
        }
        // min(100 / 1 ms, 64 / 64 ms) = 1,000, smoothed with the 10,000 before.
        assert_eq!(load.capacity(), Some(5_500.0));
    }
}
