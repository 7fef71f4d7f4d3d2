//! Conversions between durations and the whole milliseconds and microseconds a server counts in.
//!
//! The server's clock and every expiry are signed integers, as Redis keeps them: a clock
//! stepped back can read below zero, and arithmetic on them must not wrap. Durations beyond
//! the range saturate; negative millisecond counts read as zero (an expired PTTL).

use std::time::Duration;

/// `d` in whole milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `d` in whole microseconds, saturating.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// `ms` milliseconds as a duration; zero if `ms` is negative.
pub(crate) fn duration_ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}
