//! The documented limits and the drift budget, pinned: a change to any of them must fail a
//! test (mutation testing found that none did).

use std::time::Duration;

use leasehold::{
    Attempt, DriftBudget, ErrorKind, LeaseRequest, MAX_TTL, MAX_WAIT, MIN_TTL, OperationId,
    Purpose, ResourceDigest,
};

fn request(ttl: Duration, drift: DriftBudget) -> Result<LeaseRequest, leasehold::Error> {
    LeaseRequest::new(
        Purpose::new("limits").unwrap(),
        ResourceDigest::of("r"),
        Attempt::new(OperationId::new("op").unwrap()).unwrap(),
        ttl,
        drift,
    )
}

#[test]
fn the_limits_are_the_documented_ones() {
    assert_eq!(MIN_TTL, Duration::from_millis(1));
    assert_eq!(MAX_TTL, Duration::from_secs(24 * 60 * 60));
    assert_eq!(MAX_WAIT, Duration::from_secs(60 * 60));
    assert_eq!(DriftBudget::MAX_FIXED, Duration::from_secs(60));
    assert_eq!(DriftBudget::MAX_RATE_PPM, 100_000);
}

#[test]
fn the_ttl_and_wait_bounds_are_inclusive() {
    let none = DriftBudget::new(Duration::ZERO, 0).unwrap();
    assert!(request(MAX_TTL, none).is_ok());
    let kind = |r: Result<LeaseRequest, leasehold::Error>| r.map(|_| ()).unwrap_err().kind();
    assert_eq!(
        kind(request(MAX_TTL + Duration::from_millis(1), none)),
        ErrorKind::InvalidTtl
    );
    let req = request(Duration::from_secs(5), DriftBudget::default()).unwrap();
    assert_eq!(
        req.clone()
            .with_wait_timeout(MAX_WAIT)
            .unwrap()
            .wait_timeout(),
        MAX_WAIT
    );
    assert_eq!(
        kind(req.with_wait_timeout(MAX_WAIT + Duration::from_millis(1))),
        ErrorKind::InvalidWaitTimeout
    );
}

#[test]
fn the_drift_budget_is_fixed_plus_rate_times_ttl() {
    let default = DriftBudget::default();
    assert_eq!(default.fixed(), Duration::from_millis(10));
    assert_eq!(default.rate_ppm(), 10_000);
    // 10 ms + 1 % of 10 s.
    assert_eq!(
        default.for_ttl(Duration::from_secs(10)),
        Duration::from_millis(110)
    );
    let custom = DriftBudget::new(Duration::from_millis(5), 500).unwrap();
    assert_eq!(custom.fixed(), Duration::from_millis(5));
    assert_eq!(custom.rate_ppm(), 500);
    // 5 ms + 0.05 % of 2 s = 6 ms; 0.05 % of 1 ms is 0.5 µs, rounded up to 1 µs.
    assert_eq!(
        custom.for_ttl(Duration::from_secs(2)),
        Duration::from_millis(6)
    );
    assert_eq!(
        custom.for_ttl(Duration::from_millis(1)),
        Duration::from_micros(5_001)
    );
    // The request keeps the budget it was made with, and its drift follows it.
    let req = request(Duration::from_secs(10), custom).unwrap();
    assert_eq!(req.drift_budget(), custom);
    assert_eq!(req.drift(), Duration::from_millis(10));
    // At the bounds: accepted; beyond them: refused.
    assert!(DriftBudget::new(DriftBudget::MAX_FIXED, DriftBudget::MAX_RATE_PPM).is_ok());
    assert_eq!(
        DriftBudget::new(DriftBudget::MAX_FIXED + Duration::from_nanos(1), 0)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidDriftBudget
    );
    assert_eq!(
        DriftBudget::new(Duration::ZERO, DriftBudget::MAX_RATE_PPM + 1)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidDriftBudget
    );
}
