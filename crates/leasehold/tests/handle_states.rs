//! Every edge of the handle's transition table, against a scripted backend and a manual clock.

use std::time::Duration;

use leasehold::backend::{AcquireReply, GrantReply, ReleaseReply, RenewReply};
use leasehold::{
    AcquireOutcome, Clock, Failure, FenceToken, Guarantee, Indeterminate, IndeterminateCause,
    LeaseClient, LeaseHandle, LeaseRequest, LeaseState, LossCause, ManualClock, OperationId,
    Purpose, ReleaseOutcome, RenewOutcome, ResourceDigest, Unavailable, UnavailableCause,
};
use leasehold_sim::Scripted;

const TTL: Duration = Duration::from_secs(2);
// Default drift for a 2 s TTL: 10 ms + 1 % = 30 ms.
const DRIFT: Duration = Duration::from_millis(30);
const RTT: Duration = Duration::from_millis(4);

fn fence(n: u64) -> FenceToken {
    FenceToken::new(n).unwrap()
}

fn indeterminate() -> Failure {
    Failure::Indeterminate(Indeterminate::new(IndeterminateCause::ResponseTimeout, "t"))
}

fn unavailable() -> Failure {
    Failure::Unavailable(Unavailable::new(UnavailableCause::ConnectionRefused, "r"))
}

/// A client over a backend that answers only what each test scripts, and moves the clock by a
/// round-trip time on each call.
fn client() -> (LeaseClient<Scripted>, ManualClock) {
    let clock = ManualClock::new();
    let backend = Scripted::new().round_trip(clock.clone(), RTT);
    (LeaseClient::new(backend).with_clock(clock.clone()), clock)
}

fn request(client: &LeaseClient<Scripted>) -> LeaseRequest {
    let attempt = client.new_attempt(OperationId::new("op").unwrap()).unwrap();
    client
        .request(
            Purpose::new("test").unwrap(),
            ResourceDigest::of("r"),
            attempt,
            TTL,
        )
        .unwrap()
}

async fn acquired(client: &LeaseClient<Scripted>, reply: AcquireReply) -> AcquireOutcome<Scripted> {
    client.backend().acquire_once(reply);
    client.try_acquire(&request(client)).await
}

async fn handle(client: &LeaseClient<Scripted>) -> LeaseHandle<Scripted> {
    let granted = AcquireReply::Granted(GrantReply::new(fence(1), TTL));
    acquired(client, granted).await.into_handle().unwrap()
}

fn script_renew(client: &LeaseClient<Scripted>, reply: RenewReply) {
    client.backend().renew_once(reply);
}

fn script_release(client: &LeaseClient<Scripted>, reply: ReleaseReply) {
    client.backend().release_once(reply);
}

/// Brings a fresh handle into `state` through the events the table names.
async fn handle_in(
    state: LeaseState,
) -> (LeaseClient<Scripted>, ManualClock, LeaseHandle<Scripted>) {
    let (client, clock) = client();
    let h = handle(&client).await;
    match state {
        LeaseState::Active => {}
        LeaseState::Expired => clock.advance(TTL),
        LeaseState::Unknown => {
            script_renew(&client, RenewReply::Failed(indeterminate()));
            assert!(matches!(h.renew().await, RenewOutcome::Indeterminate(_)));
        }
        LeaseState::Lost => {
            script_renew(&client, RenewReply::Lost(LossCause::Absent));
            assert_eq!(h.renew().await, RenewOutcome::Lost(LossCause::Absent));
        }
        LeaseState::Released => {
            script_release(&client, ReleaseReply::Released);
            assert_eq!(h.release().await, ReleaseOutcome::Released);
        }
        other => panic!("no path to {other:?}"),
    }
    assert_eq!(h.state(), state);
    (client, clock, h)
}

#[derive(Debug, Clone, Copy)]
enum Event {
    RenewRenewed,
    RenewLost,
    RenewIndeterminate,
    RenewUnavailable,
    RenewOverloaded,
    ReleaseReleased,
    ReleaseAlreadyGone,
    ReleaseNotOwner,
    ReleaseIndeterminate,
    ReleaseUnavailable,
    ReleaseOverloaded,
}

const EVENTS: [Event; 11] = [
    Event::RenewRenewed,
    Event::RenewLost,
    Event::RenewIndeterminate,
    Event::RenewUnavailable,
    Event::RenewOverloaded,
    Event::ReleaseReleased,
    Event::ReleaseAlreadyGone,
    Event::ReleaseNotOwner,
    Event::ReleaseIndeterminate,
    Event::ReleaseUnavailable,
    Event::ReleaseOverloaded,
];

/// The transition table of the `handle` module docs, for the non-terminal states.
fn expected(from: LeaseState, event: Event) -> LeaseState {
    use LeaseState::*;
    match event {
        Event::RenewRenewed => Active,
        Event::RenewLost | Event::ReleaseNotOwner => Lost,
        Event::RenewIndeterminate | Event::ReleaseIndeterminate => Unknown,
        Event::RenewUnavailable
        | Event::RenewOverloaded
        | Event::ReleaseUnavailable
        | Event::ReleaseOverloaded => from,
        Event::ReleaseReleased | Event::ReleaseAlreadyGone => Released,
    }
}

/// Applies `event` and checks that the outcome names the event (no contradiction).
async fn apply(client: &LeaseClient<Scripted>, h: &LeaseHandle<Scripted>, event: Event) {
    match event {
        Event::RenewRenewed => {
            script_renew(client, RenewReply::Renewed { server_ttl: TTL });
            assert!(h.renew().await.is_renewed());
        }
        Event::RenewLost => {
            script_renew(client, RenewReply::Lost(LossCause::OtherHolder));
            assert_eq!(h.renew().await, RenewOutcome::Lost(LossCause::OtherHolder));
        }
        Event::RenewIndeterminate => {
            script_renew(client, RenewReply::Failed(indeterminate()));
            assert!(matches!(h.renew().await, RenewOutcome::Indeterminate(_)));
        }
        Event::RenewUnavailable => {
            script_renew(client, RenewReply::Failed(unavailable()));
            assert!(matches!(h.renew().await, RenewOutcome::Unavailable(_)));
        }
        Event::RenewOverloaded => {
            script_renew(client, RenewReply::Failed(Failure::Overloaded));
            assert_eq!(h.renew().await, RenewOutcome::Overloaded);
        }
        Event::ReleaseReleased => {
            script_release(client, ReleaseReply::Released);
            assert_eq!(h.release().await, ReleaseOutcome::Released);
        }
        Event::ReleaseAlreadyGone => {
            script_release(client, ReleaseReply::AlreadyGone);
            assert_eq!(h.release().await, ReleaseOutcome::AlreadyGone);
        }
        Event::ReleaseNotOwner => {
            script_release(client, ReleaseReply::NotOwner);
            assert_eq!(h.release().await, ReleaseOutcome::NotOwner);
        }
        Event::ReleaseIndeterminate => {
            script_release(client, ReleaseReply::Failed(indeterminate()));
            assert!(matches!(
                h.release().await,
                ReleaseOutcome::Indeterminate(_)
            ));
        }
        Event::ReleaseUnavailable => {
            script_release(client, ReleaseReply::Failed(unavailable()));
            assert!(matches!(h.release().await, ReleaseOutcome::Unavailable(_)));
        }
        Event::ReleaseOverloaded => {
            script_release(client, ReleaseReply::Failed(Failure::Overloaded));
            assert_eq!(h.release().await, ReleaseOutcome::Overloaded);
        }
    }
}

#[tokio::test]
async fn every_edge_from_a_live_state_follows_the_table() {
    for from in [LeaseState::Active, LeaseState::Expired, LeaseState::Unknown] {
        for event in EVENTS {
            let (client, _clock, h) = handle_in(from).await;
            let calls = client.backend().calls();
            apply(&client, &h, event).await;
            assert_eq!(client.backend().calls(), calls + 1, "{from:?} {event:?}");
            assert_eq!(h.state(), expected(from, event), "{from:?} --{event:?}-->");
            // Validity agrees with the state: only Active and Unknown may have some left.
            if matches!(
                h.state(),
                LeaseState::Expired | LeaseState::Lost | LeaseState::Released
            ) {
                assert_eq!(h.remaining_validity(), Duration::ZERO, "{from:?} {event:?}");
            }
        }
    }
}

#[tokio::test]
async fn terminal_states_refuse_everything_without_sending() {
    for from in [LeaseState::Lost, LeaseState::Released] {
        let (client, clock, h) = handle_in(from).await;
        let calls = client.backend().calls();
        assert_eq!(h.renew().await, RenewOutcome::Refused { state: from });
        assert_eq!(h.release().await, ReleaseOutcome::Refused { state: from });
        clock.advance(TTL * 2);
        assert_eq!(h.state(), from);
        assert_eq!(h.remaining_validity(), Duration::ZERO);
        assert_eq!(client.backend().calls(), calls, "{from:?} sent a command");
    }
}

#[tokio::test]
async fn local_expiry_is_recorded_and_counted_from_before_send() {
    let (client, clock) = client();
    let h = handle(&client).await;
    // The round trip is deducted: validity started before the send, RTT ago.
    assert_eq!(h.remaining_validity(), TTL - DRIFT - RTT);
    assert_eq!(h.state(), LeaseState::Active);
    clock.advance(TTL - DRIFT - RTT - Duration::from_millis(1));
    assert!(h.is_valid());
    clock.advance(Duration::from_millis(1));
    assert_eq!(h.state(), LeaseState::Expired);
    assert!(!h.is_valid());
    assert_eq!(h.remaining_validity(), Duration::ZERO);
    // A renewal confirmed by the server restores Active, counted from its own send.
    script_renew(&client, RenewReply::Renewed { server_ttl: TTL });
    assert_eq!(
        h.renew().await,
        RenewOutcome::Renewed {
            remaining: TTL - DRIFT - RTT
        }
    );
    assert_eq!(h.state(), LeaseState::Active);
}

#[tokio::test]
async fn a_replay_is_capped_by_the_servers_remaining_ttl() {
    let (client, _clock) = client();
    let left = Duration::from_millis(500);
    let replayed = acquired(
        &client,
        AcquireReply::Replayed(GrantReply::new(fence(3), left)),
    )
    .await;
    let h = match replayed {
        AcquireOutcome::Replayed(h) => h,
        other => panic!("{other:?}"),
    };
    assert_eq!(h.remaining_validity(), left - DRIFT - RTT);
    assert!(h.remaining_validity() < left);
    assert_eq!(h.fence(), fence(3));
    assert_eq!(h.guarantee(), Guarantee::Fenced(fence(3)));
}

#[tokio::test]
async fn a_replay_with_less_than_the_drift_left_is_expired_at_once() {
    let (client, _clock) = client();
    let reply = AcquireReply::Replayed(GrantReply::new(fence(3), Duration::from_millis(20)));
    let h = acquired(&client, reply).await.into_handle().unwrap();
    assert_eq!(h.state(), LeaseState::Expired);
    assert_eq!(h.remaining_validity(), Duration::ZERO);
}

#[tokio::test]
async fn observed_server_expiry_comes_from_the_reply_pttl() {
    let (client, clock) = client();
    let before = clock.now();
    let left = Duration::from_millis(700);
    let h = acquired(
        &client,
        AcquireReply::Replayed(GrantReply::new(fence(2), left)),
    )
    .await
    .into_handle()
    .unwrap();
    assert_eq!(h.observed_server_expiry(), before + left);
    assert!(h.valid_until() < h.observed_server_expiry());
}

#[tokio::test]
async fn an_indeterminate_renew_keeps_only_proven_validity() {
    let (client, clock) = client();
    let h = handle(&client).await;
    let proven = h.valid_until();
    clock.advance(Duration::from_millis(100));
    script_renew(&client, RenewReply::Failed(indeterminate()));
    assert!(matches!(h.renew().await, RenewOutcome::Indeterminate(_)));
    assert_eq!(h.state(), LeaseState::Unknown);
    assert!(!h.is_valid());
    assert_eq!(
        h.valid_until(),
        proven,
        "an unconfirmed renew added validity"
    );
}

#[tokio::test]
async fn an_indeterminate_release_revokes_validity() {
    let (client, _clock) = client();
    let h = handle(&client).await;
    script_release(&client, ReleaseReply::Failed(indeterminate()));
    assert!(matches!(
        h.release().await,
        ReleaseOutcome::Indeterminate(_)
    ));
    assert_eq!(h.state(), LeaseState::Unknown);
    assert_eq!(h.remaining_validity(), Duration::ZERO);
}

#[tokio::test]
async fn no_renew_is_sent_once_release_was_called() {
    let (client, _clock) = client();
    let h = handle(&client).await;
    script_release(&client, ReleaseReply::Failed(unavailable()));
    assert!(matches!(h.release().await, ReleaseOutcome::Unavailable(_)));
    assert_eq!(h.state(), LeaseState::Active);
    let calls = client.backend().calls();
    assert_eq!(
        h.renew().await,
        RenewOutcome::Refused {
            state: LeaseState::Active
        }
    );
    assert_eq!(client.backend().calls(), calls);
    // Release can be tried again.
    script_release(&client, ReleaseReply::Released);
    assert_eq!(h.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn acquire_failures_keep_their_certainty() {
    let (client, _clock) = client();
    match acquired(&client, AcquireReply::Failed(indeterminate())).await {
        AcquireOutcome::Indeterminate { operation, cause } => {
            assert_eq!(operation.as_str(), "op");
            assert_eq!(cause.cause, IndeterminateCause::ResponseTimeout);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        acquired(&client, AcquireReply::Failed(unavailable())).await,
        AcquireOutcome::Unavailable(_)
    ));
    assert!(matches!(
        acquired(&client, AcquireReply::Failed(Failure::Overloaded)).await,
        AcquireOutcome::Overloaded
    ));
}

#[tokio::test]
async fn debug_of_handles_and_outcomes_hides_the_token() {
    let (client, _clock) = client();
    let h = handle(&client).await;
    let token = h.attempt().owner_token().expose_secret().to_owned();
    let texts = [
        format!("{h:?}"),
        format!("{client:?}"),
        format!("{:?}", h.attempt()),
    ];
    for text in &texts {
        assert!(!text.contains(&token), "{text}");
    }
    // It still says what an operator needs: which lease, which fence, in which state.
    let handle = &texts[0];
    for shown in ["LeaseHandle", "purpose", "fence", "Active", "valid_until"] {
        assert!(handle.contains(shown), "{shown} missing from {handle}");
    }
}

/// A replay's confirmation joins the handle the client already holds for the grant: an
/// `Unknown` handle is `Active` again, with the validity the replay proved.
#[tokio::test]
async fn a_replay_confirms_the_existing_handle_of_its_grant() {
    let (client, clock) = client();
    let req = request(&client);
    client
        .backend()
        .acquire_once(AcquireReply::Granted(GrantReply::new(fence(1), TTL)));
    let h = client.try_acquire(&req).await.into_handle().unwrap();
    clock.advance(Duration::from_millis(500));
    script_renew(&client, RenewReply::Failed(indeterminate()));
    assert!(matches!(h.renew().await, RenewOutcome::Indeterminate(_)));
    assert_eq!(h.state(), LeaseState::Unknown);
    let left = TTL - Duration::from_millis(100);
    client
        .backend()
        .acquire_once(AcquireReply::Replayed(GrantReply::new(fence(1), left)));
    let sent_at = clock.now();
    let replayed = client.try_acquire(&req).await.into_handle().unwrap();
    assert_eq!(h.state(), LeaseState::Active, "the replay was not merged");
    assert_eq!(h.valid_until(), sent_at + (left - DRIFT));
    assert_eq!(h.observed_server_expiry(), sent_at + left);
    // One state: the replayed handle's release is the existing one's.
    script_release(&client, ReleaseReply::Released);
    assert_eq!(replayed.release().await, ReleaseOutcome::Released);
    assert_eq!(h.state(), LeaseState::Released);
}

/// A confirmation never revives a handle the server already said was lost, nor extends one
/// whose release has started.
#[tokio::test]
async fn a_replay_neither_revives_a_lost_handle_nor_extends_a_released_one() {
    let (client, clock) = client();
    let req = request(&client);
    let granted = AcquireReply::Granted(GrantReply::new(fence(1), TTL));
    let replayed = AcquireReply::Replayed(GrantReply::new(fence(1), TTL));
    client.backend().acquire_once(granted);
    let lost = client.try_acquire(&req).await.into_handle().unwrap();
    script_renew(&client, RenewReply::Lost(LossCause::OtherHolder));
    assert!(matches!(lost.renew().await, RenewOutcome::Lost(_)));
    client.backend().acquire_once(replayed.clone());
    let _again = client.try_acquire(&req).await.into_handle().unwrap();
    assert_eq!(lost.state(), LeaseState::Lost, "a lost handle was revived");

    let (client, clock2) = (client, clock);
    let req = request(&client);
    let granted = AcquireReply::Granted(GrantReply::new(fence(2), TTL));
    client.backend().acquire_once(granted);
    let h = client.try_acquire(&req).await.into_handle().unwrap();
    script_release(&client, ReleaseReply::Failed(unavailable()));
    assert!(matches!(h.release().await, ReleaseOutcome::Unavailable(_)));
    let until = h.valid_until();
    clock2.advance(Duration::from_millis(500));
    client
        .backend()
        .acquire_once(AcquireReply::Replayed(GrantReply::new(fence(2), TTL)));
    let _again = client.try_acquire(&req).await.into_handle().unwrap();
    assert_eq!(h.valid_until(), until, "a release under way was extended");
}
