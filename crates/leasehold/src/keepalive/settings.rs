//! How a watchdog renews: its settings, and their validation.
//!
//! The settings hold divisors of a lease's TTL and the watchdog's limits; what the divisors
//! mean for one lease is computed by [`Schedule`](super::schedule::Schedule), which the
//! checks here use.

use std::time::Duration;

use super::schedule::{Schedule, has_room};
use crate::error::{Error, ErrorKind};

/// How a [`Watchdog`] renews.
///
/// [`Watchdog`]: super::Watchdog
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeepAliveSettings {
    cadence_divisor: u32,
    margin_divisor: u32,
    max_leases: usize,
    max_in_flight: usize,
    assumed_capacity: u32,
}

impl Default for KeepAliveSettings {
    fn default() -> Self {
        Self {
            cadence_divisor: 3,
            margin_divisor: 5,
            max_leases: 100_000,
            max_in_flight: 256,
            assumed_capacity: 20_000,
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
    pub(crate) fn check_lease(&self, ttl: Duration, drift: Duration) -> Result<(), Error> {
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

    /// Sets the renewals per second the watchdog assumes it can confirm until it has measured
    /// it (1 to 10,000,000; default 20,000). Like the measured capacity, it admits leases up to
    /// three quarters of it: by default, leases needing 15,000 renewals a second (15,000 leases
    /// of TTL 3 s, 150,000 of 30 s) before the first measurement.
    ///
    /// The watchdog measures its capacity from its own renewals, over a second with at least
    /// 64 of them; until then it cannot know it, and starts from the lesser of this and its
    /// send slots over the mean round trip of the acquires that granted its leases (which
    /// catches a slow server, but not a slow process). The default is
    /// a fifth of what one watchdog measured on a 2-core machine (94,000–122,000 a second,
    /// docs/DECISIONS.md D51); set it higher only with a measurement of your own.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if out of range.
    pub fn with_assumed_capacity(mut self, renewals_per_second: u32) -> Result<Self, Error> {
        if !(1..=10_000_000).contains(&renewals_per_second) {
            return Err(Error::new(
                ErrorKind::InvalidSetting,
                "assumed capacity must be 1 to 10000000 renewals per second",
            ));
        }
        self.assumed_capacity = renewals_per_second;
        Ok(self)
    }

    /// The schedule of a lease of `ttl` under these settings.
    pub(super) fn schedule(&self, ttl: Duration) -> Schedule {
        Schedule::new(ttl, self.cadence_divisor, self.margin_divisor)
    }

    /// How many leases the watchdog keeps at most.
    pub(super) fn max_leases(&self) -> usize {
        self.max_leases
    }

    /// How many renewals the watchdog sends at once.
    pub(super) fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// The renewals per second the watchdog assumes it can confirm until it has measured.
    pub(super) fn assumed_capacity(&self) -> u32 {
        self.assumed_capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: Duration = Duration::from_nanos(1);

    #[test]
    fn the_setters_accept_exactly_the_divisors_with_room_for_a_retry() {
        for c in 2..=100 {
            for m in 2..=100 {
                let defaults = KeepAliveSettings::default();
                // Either order: the first setter alone always leaves room with the other's
                // default, so the second one decides.
                let cadence_first = defaults
                    .with_cadence_divisor(c)
                    .and_then(|s| s.with_margin_divisor(m));
                let margin_first = defaults
                    .with_margin_divisor(m)
                    .and_then(|s| s.with_cadence_divisor(c));
                for settings in [cadence_first, margin_first] {
                    match settings {
                        Ok(settings) => {
                            assert!(has_room(c, m), "c = {c}, m = {m}");
                            assert_eq!((settings.cadence_divisor, settings.margin_divisor), (c, m));
                        }
                        Err(error) => {
                            assert!(!has_room(c, m), "c = {c}, m = {m}: {error}");
                            assert_eq!(error.kind(), ErrorKind::InvalidSetting);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        let defaults = KeepAliveSettings::default();
        for divisor in [0, 1, 101, u32::MAX] {
            assert!(defaults.with_cadence_divisor(divisor).is_err(), "{divisor}");
            assert!(defaults.with_margin_divisor(divisor).is_err(), "{divisor}");
        }
        for max in [0, 10_000_001] {
            assert!(defaults.with_max_leases(max).is_err(), "{max}");
        }
        for max in [1, 10_000_000] {
            assert_eq!(defaults.with_max_leases(max).unwrap().max_leases(), max);
        }
        for max in [0, 100_001] {
            assert!(defaults.with_max_in_flight(max).is_err(), "{max}");
        }
        for max in [1, 100_000] {
            assert_eq!(
                defaults.with_max_in_flight(max).unwrap().max_in_flight(),
                max
            );
        }
        for capacity in [0, 10_000_001] {
            assert!(
                defaults.with_assumed_capacity(capacity).is_err(),
                "{capacity}"
            );
        }
        for capacity in [1, 10_000_000] {
            let settings = defaults.with_assumed_capacity(capacity).unwrap();
            assert_eq!(settings.assumed_capacity(), capacity);
        }
        assert_eq!(
            (
                defaults.max_leases(),
                defaults.max_in_flight(),
                defaults.assumed_capacity()
            ),
            (100_000, 256, 20_000)
        );
    }

    #[test]
    fn a_lease_is_kept_only_with_validity_beyond_a_cadence_a_retry_and_the_margin() {
        let settings = KeepAliveSettings::default();
        let ttl = Duration::from_secs(3);
        // A cadence of 1 s, a retry of 250 ms and a margin of 600 ms: 1.85 s of the 3 s.
        let drift = Duration::from_millis(1_150);
        let error = settings.check_lease(ttl, drift).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidSetting);
        settings.check_lease(ttl, drift - NS).unwrap();
        settings.check_lease(ttl, Duration::ZERO).unwrap();
        // A drift budget beyond the TTL leaves no validity at all.
        assert!(settings.check_lease(ttl, ttl + NS).is_err());
    }
}
