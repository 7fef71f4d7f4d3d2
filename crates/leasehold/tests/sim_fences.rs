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
