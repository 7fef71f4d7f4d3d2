//! Lease requests and the drift budget, validated before any I/O.
//!
//! A request names the resource, the attempt and the TTL, and may carry two options that
//! travel with the grant: a [`HolderName`] for operators, and a minimum hold (ShedLock's
//! `lockAtLeastFor`) that keeps the key on the server for a while after the grant whatever the
//! holder does, for run-once jobs on hosts whose clocks differ.

use std::time::Duration;

use crate::error::{Error, ErrorKind};
use crate::id::{Attempt, HolderName, Purpose, ResourceDigest};

/// The shortest TTL a request may ask for.
pub const MIN_TTL: Duration = Duration::from_millis(1);
/// The longest TTL a request may ask for.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest wait timeout a request may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(60 * 60);
/// The largest capacity a semaphore may have: an acquire looks at every slot, so its cost
/// grows with the capacity.
pub const MAX_CAPACITY: u32 = 1024;
/// How long a semaphore's waiter stays in the queue after its last try unless
/// [`LeaseRequest::with_queue_heartbeat`] says otherwise: a waiter that dies stops blocking
/// the queue at most this long after its last try.
pub const DEFAULT_QUEUE_HEARTBEAT: Duration = Duration::from_secs(3);
/// How many readers a read/write lease lets in at once: each holds one of this many reader
/// slots, and an acquire looks at every one.
pub const MAX_READERS: u32 = 64;
/// The shortest queue heartbeat a request may ask for.
pub const MIN_QUEUE_HEARTBEAT: Duration = Duration::from_millis(100);
/// The longest queue heartbeat a request may ask for.
pub const MAX_QUEUE_HEARTBEAT: Duration = Duration::from_secs(60);

/// Which side of a read/write lease a request asks for ([`LeaseRequest::with_rw`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RwMode {
    /// One of many readers: held while no writer holds the lease or waits for it.
    Read,
    /// The one writer: held while nobody else holds the lease.
    Write,
}

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
/// - the wait timeout is at most [`MAX_WAIT`]; zero means "try once";
/// - a minimum hold, if any, is a whole number of milliseconds up to [`MAX_TTL`].
///
/// # Minimum hold
///
/// With [`with_min_hold`](Self::with_min_hold), a grant keeps the key on the server for at
/// least that long after it was made (by the server's clock), whatever the holder does:
///
/// - the grant is made with a server TTL of `max(ttl, min_hold)`, and every renewal sets
///   `max(ttl, what is left of the hold)`;
/// - a release before the hold ends answers `Released` (this grant is gone: it can no longer
///   be renewed, released again or replayed), but leaves the key in place, marked as released,
///   until the hold ends, and sends no release notice. Until then, every acquire, a replay of
///   the released attempt included, is contended, with `retry_after` the hold's remaining time.
///   After the hold, a release deletes the key as it would without one;
/// - a holder that dies leaves the key until the later of its TTL and its hold.
///
/// A run-once job that takes a lease with a hold longer than the clock skew between its hosts
/// therefore cannot run twice for one schedule tick, even if the first run finished at once.
/// The handle's validity is not changed by a hold: it is still `min(ttl, reply PTTL) − drift`,
/// so a hold never makes work look covered for longer than the TTL it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRequest {
    purpose: Purpose,
    resource: ResourceDigest,
    attempt: Attempt,
    ttl: Duration,
    wait_timeout: Duration,
    drift: DriftBudget,
    /// Zero for none.
    min_hold: Duration,
    holder_name: Option<HolderName>,
    /// For a permit of a semaphore: its capacity. `None` for a lease.
    capacity: Option<u32>,
    queue_heartbeat: Duration,
    /// For a side of a read/write lease: which.
    rw: Option<RwMode>,
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
            min_hold: Duration::ZERO,
            holder_name: None,
            capacity: None,
            queue_heartbeat: DEFAULT_QUEUE_HEARTBEAT,
            rw: None,
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

    /// Returns this request with a minimum hold: the key stays on the server at least `hold`
    /// after the grant, even if it is released earlier or its holder dies (see
    /// [the type's docs](Self#minimum-hold)). Zero means no minimum hold.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidMinHold`] if `hold` has a sub-millisecond part or is above
    /// [`MAX_TTL`].
    pub fn with_min_hold(mut self, hold: Duration) -> Result<Self, Error> {
        if self.rw.is_some() && !hold.is_zero() {
            return Err(Error::new(
                ErrorKind::InvalidMinHold,
                "a read/write lease takes no minimum hold",
            ));
        }
        if hold > MAX_TTL {
            return Err(Error::new(
                ErrorKind::InvalidMinHold,
                format!("must be at most {MAX_TTL:?}, got {hold:?}"),
            ));
        }
        if !hold.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(Error::new(
                ErrorKind::InvalidMinHold,
                format!("must be a whole number of milliseconds, got {hold:?}"),
            ));
        }
        self.min_hold = hold;
        Ok(self)
    }

    /// Returns this request with a holder name, stored with the grant and shown to whoever
    /// inspects the lease or is contended by it.
    pub fn with_holder_name(mut self, name: HolderName) -> Self {
        self.holder_name = Some(name);
        self
    }

    /// Returns this request made a request for one *permit* of the semaphore of `capacity`
    /// on the resource: one of `capacity` slots, each a lease of its own with its own fence
    /// (see [the semaphore guide](crate::lock#semaphores)). The capacity is recorded on the
    /// server by the first request; one asking for another capacity is answered
    /// [`AcquireReply::CapacityMismatch`](crate::backend::AcquireReply::CapacityMismatch) and
    /// changes nothing.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidCapacity`] if `capacity` is 0 or above [`MAX_CAPACITY`].
    pub fn with_capacity(mut self, capacity: u32) -> Result<Self, Error> {
        if self.rw.is_some() {
            return Err(one_kind());
        }
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(Error::new(
                ErrorKind::InvalidCapacity,
                format!("must be from 1 to {MAX_CAPACITY}, got {capacity}"),
            ));
        }
        self.capacity = Some(capacity);
        Ok(self)
    }

    /// Returns this request with a queue heartbeat (default [`DEFAULT_QUEUE_HEARTBEAT`]): a
    /// permit request that waits keeps its place in the semaphore's queue by trying again
    /// at least three times per heartbeat, and a place not refreshed for a heartbeat is
    /// dropped, so a waiter that dies never stalls the queue for longer.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidWaitTimeout`] if `heartbeat` is below [`MIN_QUEUE_HEARTBEAT`],
    /// above [`MAX_QUEUE_HEARTBEAT`] or not a whole number of milliseconds.
    pub fn with_queue_heartbeat(mut self, heartbeat: Duration) -> Result<Self, Error> {
        if !(MIN_QUEUE_HEARTBEAT..=MAX_QUEUE_HEARTBEAT).contains(&heartbeat)
            || !heartbeat.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err(Error::new(
                ErrorKind::InvalidWaitTimeout,
                format!(
                    "a queue heartbeat must be whole milliseconds from {MIN_QUEUE_HEARTBEAT:?} \
                     to {MAX_QUEUE_HEARTBEAT:?}, got {heartbeat:?}"
                ),
            ));
        }
        self.queue_heartbeat = heartbeat;
        Ok(self)
    }

    /// Returns this request made a request for one side of the read/write lease on the
    /// resource: many readers ([`RwMode::Read`], at most [`MAX_READERS`]) or one writer
    /// ([`RwMode::Write`]), kept apart from the lease and the semaphore of the same name.
    /// Writers are preferred: while a writer waits, no new reader is let in. The writer's
    /// grant has a new fence; a reader's fence is the fence of the last writer before it, so
    /// that a target can refuse a reader whose view a newer writer replaced. Waiting works as
    /// for a semaphore's permit (a place in a queue, kept by the heartbeat).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if the request is already a permit of a semaphore;
    /// [`ErrorKind::InvalidMinHold`] if it has a minimum hold, which read/write leases do not
    /// take.
    pub fn with_rw(mut self, mode: RwMode) -> Result<Self, Error> {
        if self.capacity.is_some() {
            return Err(one_kind());
        }
        if !self.min_hold.is_zero() {
            return Err(Error::new(
                ErrorKind::InvalidMinHold,
                "a read/write lease takes no minimum hold",
            ));
        }
        self.rw = Some(mode);
        Ok(self)
    }

    /// Returns the side of a read/write lease this request asks for, `None` for a lease or
    /// a permit.
    pub fn rw(&self) -> Option<RwMode> {
        self.rw
    }

    /// Returns true if and only if the request waits in a server-side queue when refused:
    /// a permit's or a read/write lease's, not a lease's.
    pub fn is_queued(&self) -> bool {
        self.capacity.is_some() || self.rw.is_some()
    }

    /// Returns the semaphore's capacity for a permit request, `None` for a lease.
    pub fn capacity(&self) -> Option<u32> {
        self.capacity
    }

    /// Returns the queue heartbeat (see [`with_queue_heartbeat`](Self::with_queue_heartbeat)).
    pub fn queue_heartbeat(&self) -> Duration {
        self.queue_heartbeat
    }

    /// Returns the queue heartbeat in milliseconds, as sent to the server.
    pub fn queue_heartbeat_millis(&self) -> u64 {
        u64::try_from(self.queue_heartbeat.as_millis()).unwrap_or(u64::MAX)
    }

    /// Returns a copy of this request for another attempt (same resource, TTL, wait, minimum
    /// hold and holder name).
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

    /// Returns the minimum hold, if the request has one.
    pub fn min_hold(&self) -> Option<Duration> {
        (!self.min_hold.is_zero()).then_some(self.min_hold)
    }

    /// Returns the minimum hold in milliseconds, as sent to the server: 0 for none.
    pub fn min_hold_millis(&self) -> u64 {
        // Bounded by MAX_TTL, so this never truncates.
        u64::try_from(self.min_hold.as_millis()).unwrap_or(u64::MAX)
    }

    /// Returns the holder name, if the request has one.
    pub fn holder_name(&self) -> Option<&HolderName> {
        self.holder_name.as_ref()
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

/// A request is a lease, a semaphore's permit or a side of a read/write lease: one of them.
fn one_kind() -> Error {
    Error::new(
        ErrorKind::InvalidSetting,
        "a request is for a lease, a semaphore's permit or a side of a read/write lease, not two",
    )
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
    fn the_ttl_goes_to_the_server_in_whole_milliseconds() {
        let r = request(Duration::from_millis(2_500)).unwrap();
        assert_eq!(r.ttl_millis(), 2_500);
        assert_eq!(request(MAX_TTL).unwrap().ttl_millis(), 86_400_000);
    }

    #[test]
    fn for_attempt_changes_the_attempt_and_nothing_else() {
        let r = request(Duration::from_secs(3))
            .unwrap()
            .with_wait_timeout(Duration::from_secs(1))
            .unwrap();
        let next = Attempt::new(OperationId::new("op").unwrap()).unwrap();
        let moved = r.for_attempt(next.clone());
        assert_eq!(moved.attempt(), &next);
        assert_ne!(moved.attempt(), r.attempt());
        assert_eq!(moved.ttl(), r.ttl());
        assert_eq!(moved.wait_timeout(), r.wait_timeout());
        assert_eq!(moved.purpose(), r.purpose());
        assert_eq!(moved.resource(), r.resource());
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
    fn min_hold_is_whole_milliseconds_up_to_the_max_ttl() {
        let r = request(Duration::from_secs(1)).unwrap();
        assert_eq!(r.min_hold(), None);
        assert_eq!(r.min_hold_millis(), 0);
        let held = r.clone().with_min_hold(Duration::from_secs(3)).unwrap();
        assert_eq!(held.min_hold(), Some(Duration::from_secs(3)));
        assert_eq!(held.min_hold_millis(), 3000);
        assert_eq!(held.ttl(), Duration::from_secs(1));
        assert_eq!(
            r.clone().with_min_hold(MAX_TTL).unwrap().min_hold(),
            Some(MAX_TTL)
        );
        // Zero is no hold; a hold shorter than the TTL is allowed (the TTL then rules).
        assert_eq!(
            r.clone().with_min_hold(Duration::ZERO).unwrap().min_hold(),
            None
        );
        assert!(r.clone().with_min_hold(Duration::from_millis(1)).is_ok());
        for bad in [
            MAX_TTL + Duration::from_millis(1),
            Duration::from_micros(1_500),
            Duration::from_nanos(1),
        ] {
            assert_eq!(
                r.clone().with_min_hold(bad).unwrap_err().kind(),
                ErrorKind::InvalidMinHold,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn holder_names_and_holds_carry_over_to_another_attempt() {
        let name = HolderName::new("host-3:4711").unwrap();
        let r = request(Duration::from_secs(1))
            .unwrap()
            .with_holder_name(name.clone())
            .with_min_hold(Duration::from_secs(2))
            .unwrap();
        assert_eq!(r.holder_name(), Some(&name));
        let other = r.for_attempt(Attempt::new(OperationId::new("op-2").unwrap()).unwrap());
        assert_eq!(other.holder_name(), Some(&name));
        assert_eq!(other.min_hold(), Some(Duration::from_secs(2)));
        assert!(
            request(Duration::from_secs(1))
                .unwrap()
                .holder_name()
                .is_none()
        );
    }

    #[test]
    fn request_debug_hides_the_token() {
        let r = request(Duration::from_secs(1)).unwrap();
        let token = r.attempt().owner_token().expose_secret().to_owned();
        assert!(!format!("{r:?}").contains(&token));
        let named = r.with_holder_name(HolderName::new("host-3").unwrap());
        let text = format!("{named:?}");
        assert!(text.contains("host-3"), "{text}");
        assert!(!text.contains(&token), "{text}");
    }
}
