//! Lease requests and the drift budget, validated before any I/O.

use std::time::Duration;

use crate::error::{Error, ErrorKind};
use crate::id::{Attempt, Purpose, ResourceDigest};

/// The shortest TTL a request may ask for.
pub const MIN_TTL: Duration = Duration::from_millis(1);
/// The longest TTL a request may ask for.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest wait timeout a request may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(60 * 60);

/// How much a handle takes off every granted validity to allow for clock drift between this
/// process and the server: `fixed + rate × TTL`.
///
/// Defaults: 10 ms and 1 %. The fixed part covers timer granularity and scheduling; the rate
/// covers the two clocks running at slightly different speeds over the TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriftBudget {
    fixed: Duration,
    rate_ppm: u32,
}

impl DriftBudget {
    /// The largest fixed part accepted.
    pub const MAX_FIXED: Duration = Duration::from_secs(60);
    /// The largest rate accepted, in parts per million (10 %).
    pub const MAX_RATE_PPM: u32 = 100_000;

    /// Makes a budget of `fixed` plus `rate_ppm` parts per million of the TTL.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidDriftBudget`] if `fixed` is above [`Self::MAX_FIXED`] or
    /// `rate_ppm` above [`Self::MAX_RATE_PPM`].
    pub fn new(fixed: Duration, rate_ppm: u32) -> Result<Self, Error> {
        if fixed > Self::MAX_FIXED || rate_ppm > Self::MAX_RATE_PPM {
            return Err(Error::new(
                ErrorKind::InvalidDriftBudget,
                format!(
                    "fixed part must be at most {:?} and rate at most {} ppm",
                    Self::MAX_FIXED,
                    Self::MAX_RATE_PPM
                ),
            ));
        }
        Ok(Self { fixed, rate_ppm })
    }

    /// Returns the fixed part.
    pub fn fixed(&self) -> Duration {
        self.fixed
    }

    /// Returns the rate, in parts per million of the TTL.
    pub fn rate_ppm(&self) -> u32 {
        self.rate_ppm
    }

    /// Returns the drift taken off a lease of `ttl`, rounded up to whole microseconds.
    pub fn for_ttl(&self, ttl: Duration) -> Duration {
        let rate_part_us = (ttl.as_micros() * u128::from(self.rate_ppm)).div_ceil(1_000_000);
        let rate_part = Duration::from_micros(u64::try_from(rate_part_us).unwrap_or(u64::MAX));
        self.fixed.saturating_add(rate_part)
    }
}

impl Default for DriftBudget {
    fn default() -> Self {
        Self {
            fixed: Duration::from_millis(10),
            rate_ppm: 10_000,
        }
    }
}

/// A validated request for a lease.
///
/// Bounds, all checked here, before anything is sent (defect 9 of the original was to check
/// the TTL only after the script had already changed Redis):
///
/// - the TTL is a whole number of milliseconds from [`MIN_TTL`] to [`MAX_TTL`], and strictly
///   above the drift it will be reduced by (`DriftBudget::for_ttl`), so every grant leaves a
///   positive validity;
/// - the wait timeout is at most [`MAX_WAIT`]; zero means "try once".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest {
    purpose: Purpose,
    resource: ResourceDigest,
    attempt: Attempt,
    ttl: Duration,
    wait_timeout: Duration,
    drift: DriftBudget,
}

impl LeaseRequest {
    /// Makes a request for `resource`, held for `ttl`, by `attempt`, with no waiting.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidTtl`] if `ttl` is out of bounds, has a sub-millisecond part or is
    /// not above `drift.for_ttl(ttl)`.
    pub fn new(
        purpose: Purpose,
        resource: ResourceDigest,
        attempt: Attempt,
        ttl: Duration,
        drift: DriftBudget,
    ) -> Result<Self, Error> {
        validate_ttl(ttl, drift)?;
        Ok(Self {
            purpose,
            resource,
            attempt,
            ttl,
            wait_timeout: Duration::ZERO,
            drift,
        })
    }

    /// Returns this request with a wait timeout.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidWaitTimeout`] if `wait` is above [`MAX_WAIT`].
    pub fn with_wait_timeout(mut self, wait: Duration) -> Result<Self, Error> {
        if wait > MAX_WAIT {
            return Err(Error::new(
                ErrorKind::InvalidWaitTimeout,
                format!("must be at most {MAX_WAIT:?}, got {wait:?}"),
            ));
        }
        self.wait_timeout = wait;
        Ok(self)
    }

    /// Returns a copy of this request for another attempt (same resource, TTL and wait).
    pub fn for_attempt(&self, attempt: Attempt) -> Self {
        Self {
            attempt,
            ..self.clone()
        }
    }

    /// Returns the purpose.
    pub fn purpose(&self) -> &Purpose {
        &self.purpose
    }

    /// Returns the resource digest.
    pub fn resource(&self) -> &ResourceDigest {
        &self.resource
    }

    /// Returns the attempt.
    pub fn attempt(&self) -> &Attempt {
        &self.attempt
    }

    /// Returns the requested TTL (whole milliseconds).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Returns the TTL in milliseconds, as sent to the server.
    pub fn ttl_millis(&self) -> u64 {
        // Bounded by MAX_TTL, so this never truncates.
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// Returns the wait timeout.
    pub fn wait_timeout(&self) -> Duration {
        self.wait_timeout
    }

    /// Returns the drift budget this request's validity will be reduced by.
    pub fn drift_budget(&self) -> DriftBudget {
        self.drift
    }

    /// Returns the drift taken off every validity granted for this request.
    pub fn drift(&self) -> Duration {
        self.drift.for_ttl(self.ttl)
    }
}

fn validate_ttl(ttl: Duration, drift: DriftBudget) -> Result<(), Error> {
    let invalid = |message: String| Err(Error::new(ErrorKind::InvalidTtl, message));
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return invalid(format!(
            "must be from {MIN_TTL:?} to {MAX_TTL:?}, got {ttl:?}"
        ));
    }
    if !ttl.subsec_nanos().is_multiple_of(1_000_000) {
        return invalid(format!(
            "must be a whole number of milliseconds, got {ttl:?}"
        ));
    }
    let reduced_by = drift.for_ttl(ttl);
    if ttl <= reduced_by {
        return invalid(format!(
            "{ttl:?} is not above the drift budget of {reduced_by:?}; no validity would remain"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::OperationId;

    fn parts() -> (Purpose, ResourceDigest, Attempt) {
        (
            Purpose::new("test").unwrap(),
            ResourceDigest::of("r"),
            Attempt::new(OperationId::new("op").unwrap()).unwrap(),
        )
    }

    fn request(ttl: Duration) -> Result<LeaseRequest, Error> {
        let (p, d, a) = parts();
        LeaseRequest::new(p, d, a, ttl, DriftBudget::default())
    }

    #[test]
    fn default_drift_is_10ms_plus_one_percent() {
        let drift = DriftBudget::default();
        assert_eq!(
            drift.for_ttl(Duration::from_secs(1)),
            Duration::from_millis(20)
        );
        assert_eq!(
            drift.for_ttl(Duration::from_secs(30)),
            Duration::from_millis(310)
        );
        assert_eq!(drift.for_ttl(Duration::ZERO), Duration::from_millis(10));
    }

    #[test]
    fn drift_budget_is_bounded() {
        assert!(DriftBudget::new(Duration::from_secs(61), 0).is_err());
        assert!(DriftBudget::new(Duration::ZERO, 100_001).is_err());
        assert!(DriftBudget::new(Duration::ZERO, 0).is_ok());
    }

    #[test]
    fn ttl_must_exceed_the_drift_budget() {
        // 10 ms fixed + 1% of 10 ms: exactly at the budget and below it are refused.
        for ms in [0, 1, 5, 10] {
            let err = request(Duration::from_millis(ms)).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidTtl, "{ms} ms");
        }
        assert!(request(Duration::from_millis(11)).is_ok());
        assert_eq!(
            request(Duration::from_micros(1_500)).unwrap_err().kind(),
            ErrorKind::InvalidTtl
        );
        assert_eq!(
            request(MAX_TTL + Duration::from_millis(1))
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidTtl
        );
        assert!(request(MAX_TTL).is_ok());
    }

    #[test]
    fn a_zero_drift_budget_allows_a_one_millisecond_ttl() {
        let (p, d, a) = parts();
        let zero = DriftBudget::new(Duration::ZERO, 0).unwrap();
        assert!(LeaseRequest::new(p, d, a, MIN_TTL, zero).is_ok());
    }

    #[test]
    fn wait_timeout_is_bounded_and_defaults_to_zero() {
        let r = request(Duration::from_secs(1)).unwrap();
        assert_eq!(r.wait_timeout(), Duration::ZERO);
        let r = r.with_wait_timeout(MAX_WAIT).unwrap();
        assert_eq!(r.wait_timeout(), MAX_WAIT);
        assert_eq!(
            r.with_wait_timeout(MAX_WAIT + Duration::from_nanos(1))
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidWaitTimeout
        );
    }

    #[test]
    fn request_debug_hides_the_token() {
        let r = request(Duration::from_secs(1)).unwrap();
        let token = r.attempt().owner_token().expose_secret().to_owned();
        assert!(!format!("{r:?}").contains(&token));
    }
}
