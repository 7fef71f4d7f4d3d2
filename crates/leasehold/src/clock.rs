//! The one seam through which lease validity reads time.
//!
//! Validity is decided by a monotonic clock that keeps counting while the machine is
//! suspended (Linux `CLOCK_BOOTTIME`): a laptop lid closed for an hour must not leave a handle
//! believing its 30-second lease is still good. The wall clock never decides validity.

use std::fmt;
use std::ops::Add;
use std::time::Duration;

/// A reading of a [`Clock`]: time since that clock's arbitrary origin.
///
/// Readings are only comparable with readings of the same clock. Kept in whole nanoseconds
/// (8 bytes, not a `Duration`'s 16: every lease handle holds three), which reach 584 years
/// past the origin; later readings, and sums beyond that, saturate there: as good as never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MonotonicInstant(u64);

impl MonotonicInstant {
    /// Makes a reading `since_origin` after the clock's origin.
    pub const fn from_origin(since_origin: Duration) -> Self {
        let nanos = since_origin.as_nanos();
        Self(if nanos > u64::MAX as u128 {
            u64::MAX
        } else {
            nanos as u64
        })
    }

    /// Returns the time since the clock's origin.
    pub const fn since_origin(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// Returns how long after `earlier` this reading is, or zero if it is not after it.
    pub fn saturating_duration_since(self, earlier: Self) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for MonotonicInstant {
    type Output = Self;

    /// Saturates instead of overflowing: an instant centuries away is as good as never.
    fn add(self, rhs: Duration) -> Self {
        Self(self.0.saturating_add(Self::from_origin(rhs).0))
    }
}

/// A monotonic clock.
///
/// Implementations must never go backwards. [`BootClock`] is the production clock; tests use
/// [`ManualClock`].
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Reads the clock.
    fn now(&self) -> MonotonicInstant;
}

/// The system's monotonic clock that counts through suspend: `CLOCK_BOOTTIME` on Linux,
/// `std::time::Instant` elsewhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct BootClock;

#[cfg(target_os = "linux")]
impl Clock for BootClock {
    fn now(&self) -> MonotonicInstant {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        // CLOCK_BOOTTIME never reports a negative time; clamp rather than trust that.
        let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
        let nanos = u32::try_from(ts.tv_nsec).unwrap_or(0);
        MonotonicInstant::from_origin(Duration::new(secs, nanos))
    }
}

#[cfg(not(target_os = "linux"))]
impl Clock for BootClock {
    fn now(&self) -> MonotonicInstant {
        use std::sync::LazyLock;
        use std::time::Instant;
        static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);
        MonotonicInstant::from_origin(ORIGIN.elapsed())
    }
}

pub use manual::ManualClock;

/// A clock that reads tokio's time, so that `#[tokio::test(start_paused = true)]` tests move
/// lease validity with `tokio::time::advance` and auto-advancing sleeps.
///
/// Tokio's clock does not count through suspend; use [`BootClock`] in production.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// Makes a clock whose origin is tokio's now. Call it inside a runtime.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> MonotonicInstant {
        MonotonicInstant::from_origin(
            tokio::time::Instant::now().saturating_duration_since(self.origin),
        )
    }
}

mod manual {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::{Clock, MonotonicInstant};

    /// A clock that moves only when told to; clones share one reading.
    #[derive(Debug, Clone, Default)]
    pub struct ManualClock {
        nanos: Arc<AtomicU64>,
    }

    impl ManualClock {
        /// Makes a clock reading zero.
        pub fn new() -> Self {
            Self::default()
        }

        /// Moves the clock forward by `by`.
        pub fn advance(&self, by: Duration) {
            let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
            // fetch_update never fails with a closure that always returns Some.
            let _ = self
                .nanos
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    Some(n.saturating_add(by))
                });
        }
    }

    impl Clock for ManualClock {
        fn now(&self) -> MonotonicInstant {
            MonotonicInstant::from_origin(Duration::from_nanos(self.nanos.load(Ordering::SeqCst)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_is_monotonic() {
        let a = BootClock.now();
        let b = BootClock.now();
        assert!(b >= a);
        assert!(a.since_origin() > Duration::ZERO);
    }

    #[test]
    fn an_instant_is_eight_bytes_and_saturates_in_order() {
        assert_eq!(std::mem::size_of::<MonotonicInstant>(), 8);
        let start = MonotonicInstant::from_origin(Duration::from_secs(100));
        let later = start + Duration::from_nanos(1);
        assert_eq!(
            later.saturating_duration_since(start),
            Duration::from_nanos(1)
        );
        assert_eq!(start.saturating_duration_since(later), Duration::ZERO);
        // Beyond 584 years: saturated, never wrapped to an instant before the others.
        let never = start + Duration::MAX;
        assert!(never > later);
        assert_eq!(never, MonotonicInstant::from_origin(Duration::MAX));
        assert_eq!(never + Duration::from_secs(1), never);
        assert_eq!(never.since_origin(), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new();
        let start = clock.now();
        assert_eq!(clock.now(), start);
        clock.advance(Duration::from_millis(5));
        assert_eq!(
            clock.now().saturating_duration_since(start),
            Duration::from_millis(5)
        );
        assert_eq!(start.saturating_duration_since(clock.now()), Duration::ZERO);
    }
}
