//! The simulated server's fences and downtimes: `max(counter + 1, server clock in µs)`, a
//! refusal while a restart or failover takes its time, and a definite failure at the top of the
//! fence range, as the Redis scripts reply.

use std::time::Duration;

use leasehold::backend::AcquireReply;
use leasehold::{
    AcquireOutcome, Attempt, DriftBudget, Failure, FenceToken, InspectOutcome, LeaseBackend,
    LeaseClient, LeaseRequest, ManualClock, OperationId, Purpose, ReleaseOutcome, ResourceDigest,
    UnavailableCause, UnusableKey,
};
use leasehold_sim::{Fault, SimBackend, SimServer, run_now};

const TIMEOUT: Duration = Duration::from_millis(200);

fn world() -> (SimServer, LeaseClient<SimBackend>) {
    let clock = ManualClock::new();
    let server = SimServer::new(clock.clone());
    let client = LeaseClient::new(server.connect(TIMEOUT)).with_clock(clock);
    (server, client)
}

fn purpose() -> Purpose {
    Purpose::new("sim").expect("valid")
}

fn resource() -> ResourceDigest {
    ResourceDigest::of("resource")
}

fn request(operation: &str) -> LeaseRequest {
    let attempt = Attempt::new(OperationId::new(operation).expect("valid")).expect("an attempt");
    LeaseRequest::new(
        purpose(),
        resource(),
        attempt,
        Duration::from_secs(10),
        DriftBudget::default(),
    )
    .expect("a request")
}

/// Acquires with a new attempt and releases again; returns the fence.
fn grant_and_release(client: &LeaseClient<SimBackend>, operation: &str) -> u64 {
    let AcquireOutcome::Acquired(handle) = run_now(client.try_acquire(&request(operation))) else {
        panic!("not granted");
    };
    assert!(matches!(
        run_now(handle.release()),
        ReleaseOutcome::Released
    ));
    handle.fence().get()
}

fn refused_cause(reply: AcquireReply) -> UnavailableCause {
    match reply {
        AcquireReply::Failed(Failure::Unavailable(u)) => u.cause,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn fences_follow_the_server_clock_in_microseconds_and_never_go_back() {
    let (server, client) = world();
    // At the clock's origin the counter leads: 1, 2.
    assert_eq!(grant_and_release(&client, "a"), 1);
    assert_eq!(grant_and_release(&client, "b"), 2);
    server.advance(Duration::from_millis(5));
    assert_eq!(grant_and_release(&client, "c"), 5_000);
    // A clock stepped back: the counter carries on.
    server.step_clock(-3);
    assert_eq!(grant_and_release(&client, "d"), 5_001);
    assert_eq!(server.fence_counter(&purpose(), &resource()), Some(5_001));
}

#[test]
fn a_replay_returns_the_stored_fence_after_the_clock_moved() {
    let (server, client) = world();
    let backend = client.backend();
    server.advance(Duration::from_millis(7));
    let request = request("a");
    let AcquireReply::Granted(first) = run_now(backend.acquire(&request)) else {
        panic!("not granted");
    };
    server.advance(Duration::from_millis(3));
    let AcquireReply::Replayed(again) = run_now(backend.acquire(&request)) else {
        panic!("not replayed");
    };
    assert_eq!(first.fence, again.fence);
    assert_eq!(first.fence.get(), 7_000);
}

#[test]
fn a_restart_refuses_requests_for_its_downtime_and_fences_start_above() {
    let (server, client) = world();
    let backend = client.backend();
    server.advance(Duration::from_millis(100));
    let before = grant_and_release(&client, "a");
    server.restart(Duration::from_millis(10));
    assert_eq!(server.fence_counter(&purpose(), &resource()), None);
    assert!(server.is_down());
    assert_eq!(
        refused_cause(run_now(backend.acquire(&request("b")))),
        UnavailableCause::ConnectionRefused
    );
    assert!(matches!(
        run_now(backend.inspect(&purpose(), &resource(), None)),
        InspectOutcome::Unavailable(_)
    ));
    server.advance(Duration::from_millis(9));
    assert!(server.is_down());
    server.advance(Duration::from_millis(1));
    assert!(!server.is_down());
    let after = grant_and_release(&client, "c");
    assert_eq!((before, after), (100_000, 110_000));
}

#[test]
fn a_restart_takes_at_least_a_millisecond() {
    let (server, client) = world();
    assert_eq!(grant_and_release(&client, "a"), 1);
    server.restart(Duration::ZERO);
    assert!(server.is_down());
    server.advance(SimServer::MIN_DOWNTIME);
    assert_eq!(grant_and_release(&client, "b"), 1_000);
}

#[test]
fn a_failover_takes_its_downtime_even_when_it_loses_nothing() {
    let (server, client) = world();
    let backend = client.backend();
    assert_eq!(server.failover(3, Duration::from_millis(20)), 0);
    assert_eq!(server.lineage(), 0);
    assert!(matches!(
        refused_cause(run_now(backend.acquire(&request("a")))),
        UnavailableCause::ConnectionRefused
    ));
    server.advance(Duration::from_millis(20));
    let before = grant_and_release(&client, "b");
    // Loses the release and the grant: the counter goes back to none.
    assert_eq!(server.failover(2, Duration::from_millis(5)), 2);
    assert_eq!(server.lineage(), 1);
    assert_eq!(server.fence_counter(&purpose(), &resource()), None);
    server.advance(Duration::from_millis(5));
    let after = grant_and_release(&client, "c");
    assert_eq!((before, after), (20_000, 25_000));
}

#[test]
fn a_late_request_that_lands_while_the_server_is_down_is_dropped() {
    let (server, client) = world();
    let backend = client.backend();
    backend.inject(Fault::LateRequest(Duration::from_millis(300)));
    assert!(matches!(
        run_now(backend.acquire(&request("a"))),
        AcquireReply::Failed(Failure::Indeterminate(_))
    ));
    // Sent at 0, lands at 300; the server fails over at 200 ms and is down until 400.
    assert_eq!(server.failover(1, Duration::from_millis(200)), 0);
    server.advance(Duration::from_millis(200));
    assert!(server.stored(&purpose(), &resource()).is_none());
    assert_eq!(server.fence_counter(&purpose(), &resource()), None);
    // One that lands once the server is back reaches it.
    backend.inject(Fault::LateRequest(Duration::from_millis(300)));
    let _ = run_now(backend.acquire(&request("b")));
    server.advance(Duration::from_millis(100));
    let stored = server.stored(&purpose(), &resource()).expect("landed");
    assert_eq!(stored.fence.get(), 700_000);
}

#[test]
fn a_counter_at_the_top_of_the_fence_range_fails_definitely_and_writes_nothing() {
    let (server, client) = world();
    let backend = client.backend();
    let max = FenceToken::MAX.get();
    server.set_fence_counter(&purpose(), &resource(), max - 1);
    assert_eq!(grant_and_release(&client, "a"), max);
    for (operation, counter, unusable) in [
        ("b", max, UnusableKey::FenceRangeExhausted),
        ("c", max + 1, UnusableKey::CounterNotAFence),
    ] {
        server.set_fence_counter(&purpose(), &resource(), counter);
        assert_eq!(
            refused_cause(run_now(backend.acquire(&request(operation)))),
            UnavailableCause::UnusableKey(unusable)
        );
        assert!(server.stored(&purpose(), &resource()).is_none());
        assert_eq!(server.fence_counter(&purpose(), &resource()), Some(counter));
    }
}

#[test]
fn an_idle_counter_expires_and_the_next_fence_still_rises() {
    let (server, client) = world();
    let idle = SimBackend::DEFAULT_COUNTER_IDLE_EXPIRY;
    assert_eq!(client.backend().counter_idle_expiry(), idle);
    server.advance(Duration::from_millis(5));
    let first = grant_and_release(&client, "a");
    assert_eq!(first, 5_000);
    assert_eq!(
        server.fence_counter_ttl(&purpose(), &resource()),
        Some(Some(idle))
    );
    // As in Redis, a key is gone once the clock is past its expiry: at PTTL 0 it is there.
    server.advance(idle);
    assert_eq!(server.fence_counter(&purpose(), &resource()), Some(first));
    server.advance(Duration::from_millis(1));
    assert_eq!(server.fence_counter(&purpose(), &resource()), None);
    assert_eq!(server.fence_counter_ttl(&purpose(), &resource()), None);
    // The clock alone keeps the next fence above.
    let second = grant_and_release(&client, "b");
    assert_eq!(
        second,
        first + 1_000 * (1 + u64::try_from(idle.as_millis()).unwrap())
    );
}

#[test]
fn a_counter_ahead_of_the_clock_is_kept_until_the_clock_has_passed_it_for_the_idle_expiry() {
    let clock = ManualClock::new();
    let server = SimServer::new(clock.clone());
    let idle = Duration::from_secs(1);
    let backend = server
        .connect(TIMEOUT)
        .with_counter_idle_expiry(idle)
        .expect("a valid idle expiry");
    let client = LeaseClient::new(backend).with_clock(clock);
    server.advance(Duration::from_secs(1));
    // Three seconds ahead of the clock, set by hand: no TTL until a grant writes it.
    server.set_fence_counter(&purpose(), &resource(), 4_000_000);
    assert_eq!(
        server.fence_counter_ttl(&purpose(), &resource()),
        Some(None)
    );
    assert_eq!(grant_and_release(&client, "a"), 4_000_001);
    // The idle expiry plus the lead, 3,000,001 µs, rounded up to 3,001 ms.
    let kept = Duration::from_millis(1_000 + 3_001);
    assert_eq!(
        server.fence_counter_ttl(&purpose(), &resource()),
        Some(Some(kept))
    );
    server.advance(kept);
    assert_eq!(
        server.fence_counter(&purpose(), &resource()),
        Some(4_000_001)
    );
    server.advance(Duration::from_millis(1));
    assert_eq!(server.fence_counter(&purpose(), &resource()), None);
    // By then the clock is past the counter by the idle expiry.
    assert_eq!(grant_and_release(&client, "b"), 5_002_000);
    // A grant taken from the clock gives the counter the idle expiry alone.
    assert_eq!(
        server.fence_counter_ttl(&purpose(), &resource()),
        Some(Some(idle))
    );
}

#[test]
fn the_counter_idle_expiry_is_bounded_as_redis_settings_bound_it() {
    let server = SimServer::new(ManualClock::new());
    let day = Duration::from_secs(24 * 3600);
    for refused in [
        Duration::ZERO,
        Duration::from_millis(999),
        365 * day + Duration::from_millis(1),
        Duration::from_micros(1_500_500),
    ] {
        let err = server
            .connect(TIMEOUT)
            .with_counter_idle_expiry(refused)
            .unwrap_err();
        assert_eq!(
            err.kind(),
            leasehold::ErrorKind::InvalidSetting,
            "{refused:?}"
        );
    }
    for taken in [Duration::from_secs(1), day, 365 * day] {
        let backend = server.connect(TIMEOUT).with_counter_idle_expiry(taken);
        assert_eq!(backend.expect("taken").counter_idle_expiry(), taken);
    }
}
