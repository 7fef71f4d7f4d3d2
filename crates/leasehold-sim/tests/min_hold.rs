//! The simulated server's minimum hold and holder names, on the virtual clock: the same rules
//! as the scripts, to the millisecond (the differential test in leasehold-redis compares the
//! two).

mod common;

use std::time::Duration;

use common::{request, world};
use leasehold::{
    AcquireOutcome, HolderName, InspectOutcome, LeaseClient, LeaseRequest, LossCause, ManualClock,
    ReleaseOutcome, RenewOutcome,
};
use leasehold_sim::{Fault, SimServer, run_now};

fn hold(request: LeaseRequest, ms: u64) -> LeaseRequest {
    request.with_min_hold(Duration::from_millis(ms)).unwrap()
}

#[test]
fn a_grant_lives_for_the_longer_of_ttl_and_hold() {
    let (server, client, _) = world();
    let first = hold(request(&client, "a", 300), 1500);
    let lease = run_now(client.try_acquire(&first)).into_handle().unwrap();
    let stored = server.stored(first.purpose(), first.resource()).unwrap();
    assert_eq!(stored.server_ttl, Duration::from_millis(1500));
    // The handle's validity is still the TTL's.
    assert!(lease.remaining_validity() <= Duration::from_millis(300) - first.drift());
    server.advance(Duration::from_millis(1000));
    let second = request(&client, "b", 5000);
    match run_now(client.try_acquire(&second)) {
        AcquireOutcome::Contended(c) => {
            assert_eq!(c.retry_after, Duration::from_millis(500));
            assert!(!c.released);
        }
        other => panic!("{other:?}"),
    }
    // A renewal sets the hold left when it is above the TTL.
    assert!(run_now(lease.renew()).is_renewed());
    assert_eq!(
        server
            .stored(first.purpose(), first.resource())
            .unwrap()
            .server_ttl,
        Duration::from_millis(500)
    );
    server.advance(Duration::from_millis(501));
    let next = run_now(client.try_acquire(&second)).into_handle().unwrap();
    assert!(next.fence() > lease.fence());
}

#[test]
fn a_release_before_the_hold_keeps_a_record_that_nobody_can_take() {
    let (server, client, _) = world();
    let name = HolderName::new("host-3:4711").unwrap();
    let first = hold(request(&client, "a", 5000), 2000).with_holder_name(name.clone());
    let lease = run_now(client.try_acquire(&first)).into_handle().unwrap();
    server.advance(Duration::from_millis(500));
    assert_eq!(run_now(lease.release()), ReleaseOutcome::Released);
    assert!(server.stored(first.purpose(), first.resource()).is_none());
    assert!(server.is_held_after_release(first.purpose(), first.resource()));

    // A second handle of the grant (another client's replay, made before) cannot renew it.
    match run_now(client.try_acquire(&first)) {
        AcquireOutcome::Contended(c) => {
            assert!(c.released);
            assert_eq!(c.retry_after, Duration::from_millis(1500));
            assert_eq!(c.holder, Some(first.attempt().fingerprint()));
            assert_eq!(c.holder_name.as_ref(), Some(&name));
            assert_eq!(c.fence, Some(lease.fence()));
        }
        other => panic!("a replay must be contended: {other:?}"),
    }
    match run_now(client.inspect(first.purpose(), first.resource(), Some(first.attempt()))) {
        InspectOutcome::HeldByOther(view) => {
            assert!(view.released);
            assert_eq!(view.holder_name.as_ref(), Some(&name));
            assert_eq!(view.server_ttl, Some(Duration::from_millis(1500)));
        }
        other => panic!("{other:?}"),
    }
    // The attempt's cleanup release finds its record: answered Released, nothing changed.
    assert_eq!(
        run_now(client.release_attempt(&first)),
        ReleaseOutcome::Released
    );
    assert!(server.is_held_after_release(first.purpose(), first.resource()));

    let second = request(&client, "b", 5000);
    server.advance(Duration::from_millis(1500));
    assert!(matches!(
        run_now(client.try_acquire(&second)),
        AcquireOutcome::Contended(c) if c.released
    ));
    server.advance(Duration::from_millis(1));
    let next = run_now(client.try_acquire(&second)).into_handle().unwrap();
    assert!(next.fence() > lease.fence());
}

#[test]
fn a_replayed_handle_of_a_released_grant_is_lost() {
    let clock = ManualClock::new();
    let server = SimServer::new(clock.clone());
    let connect =
        || LeaseClient::new(server.connect(Duration::from_millis(200))).with_clock(clock.clone());
    let (one, two) = (connect(), connect());
    let first = hold(request(&one, "a", 5000), 2000);
    let lease = run_now(one.try_acquire(&first)).into_handle().unwrap();
    let replayed = match run_now(two.try_acquire(&first)) {
        AcquireOutcome::Replayed(handle) => handle,
        other => panic!("{other:?}"),
    };
    assert_eq!(run_now(lease.release()), ReleaseOutcome::Released);
    assert_eq!(
        run_now(replayed.renew()),
        RenewOutcome::Lost(LossCause::OtherHolder)
    );
}

#[test]
fn a_release_whose_reply_was_lost_is_released_when_sent_again() {
    let (server, client, _) = world();
    let first = hold(request(&client, "a", 5000), 2000);
    let lease = run_now(client.try_acquire(&first)).into_handle().unwrap();
    client.backend().inject(Fault::LoseReply);
    assert!(matches!(
        run_now(lease.release()),
        ReleaseOutcome::Indeterminate(_)
    ));
    assert_eq!(run_now(lease.release()), ReleaseOutcome::Released);
    assert!(server.is_held_after_release(first.purpose(), first.resource()));
}

#[test]
fn a_release_after_the_hold_deletes_the_key() {
    let (server, client, _) = world();
    let first = hold(request(&client, "a", 5000), 200);
    let lease = run_now(client.try_acquire(&first)).into_handle().unwrap();
    server.advance(Duration::from_millis(200));
    assert_eq!(run_now(lease.release()), ReleaseOutcome::Released);
    assert!(!server.is_held_after_release(first.purpose(), first.resource()));
    assert_eq!(
        run_now(client.inspect(first.purpose(), first.resource(), None)),
        InspectOutcome::Free
    );
}

#[test]
fn holder_names_show_in_inspection_and_contention() {
    let (_, client, _) = world();
    let name = HolderName::new("worker 7").unwrap();
    let first = request(&client, "a", 5000).with_holder_name(name.clone());
    let lease = run_now(client.try_acquire(&first)).into_handle().unwrap();
    match run_now(client.inspect(first.purpose(), first.resource(), Some(first.attempt()))) {
        InspectOutcome::HeldByThisAttempt(view) => {
            assert_eq!(view.holder_name.as_ref(), Some(&name));
            assert!(!view.released);
        }
        other => panic!("{other:?}"),
    }
    match run_now(client.try_acquire(&request(&client, "b", 5000))) {
        AcquireOutcome::Contended(c) => assert_eq!(c.holder_name.as_ref(), Some(&name)),
        other => panic!("{other:?}"),
    }
    // Without a hold, a release deletes at once, name or not.
    assert_eq!(run_now(lease.release()), ReleaseOutcome::Released);
    assert_eq!(
        run_now(client.inspect(first.purpose(), first.resource(), None)),
        InspectOutcome::Free
    );
}

#[test]
fn a_clock_stepped_back_never_holds_longer_than_the_max_ttl() {
    let (server, client, _) = world();
    let first = hold(request(&client, "a", 1000), 2000);
    let lease = run_now(client.try_acquire(&first)).into_handle().unwrap();
    server.step_clock(-3 * 24 * 60 * 60 * 1000);
    assert!(run_now(lease.renew()).is_renewed());
    let stored = server.stored(first.purpose(), first.resource()).unwrap();
    assert_eq!(stored.server_ttl, leasehold::MAX_TTL);
}
