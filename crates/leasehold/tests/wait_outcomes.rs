//! What a waiting acquire returns when tries fail, against a scripted backend in paused time.

use std::time::Duration;

use leasehold::backend::{AcquireReply, GrantReply, ReleaseReply, RenewReply};
use leasehold::{
    AcquireOutcome, Failure, FenceToken, Indeterminate, IndeterminateCause, LeaseClient,
    OperationId, Purpose, ResourceDigest, TokioClock, Unavailable, UnavailableCause,
};
use leasehold_sim::{Op, Scripted};

fn unknown() -> AcquireReply {
    AcquireReply::Failed(Failure::Indeterminate(Indeterminate::new(
        IndeterminateCause::ResponseTimeout,
        "no reply",
    )))
}

fn refused() -> AcquireReply {
    AcquireReply::Failed(Failure::Unavailable(Unavailable::new(
        UnavailableCause::ConnectionRefused,
        "refused",
    )))
}

async fn acquire_with(
    replies: Vec<AcquireReply>,
    wait: Duration,
) -> (AcquireOutcome<Scripted>, usize) {
    // Acquires answer from the script, then with its last entry for ever.
    let backend = Scripted::new();
    let (last, first) = replies.split_last().expect("a script");
    for reply in first {
        backend.acquire_once(reply.clone());
    }
    backend
        .acquire_always(last.clone())
        .renew_always(RenewReply::Failed(Failure::Overloaded))
        .release_always(ReleaseReply::Released);
    let client = LeaseClient::new(backend).with_clock(TokioClock::new());
    let attempt = client.new_attempt(OperationId::new("op").unwrap()).unwrap();
    let request = client
        .request(
            Purpose::new("p").unwrap(),
            ResourceDigest::of("r"),
            attempt,
            Duration::from_secs(10),
        )
        .unwrap()
        .with_wait_timeout(wait)
        .unwrap();
    let outcome = client.acquire(&request).await;
    let tries = client.backend().calls_of(Op::Acquire);
    (outcome, tries)
}

#[tokio::test(start_paused = true)]
async fn a_refusal_after_an_unknown_try_is_still_unknown_at_the_deadline() {
    let (outcome, tries) = acquire_with(vec![unknown(), refused()], Duration::from_secs(1)).await;
    match outcome {
        AcquireOutcome::Indeterminate { cause, .. } => {
            assert_eq!(cause.cause, IndeterminateCause::ResponseTimeout);
        }
        other => panic!("a grant may exist, but the outcome was: {other}"),
    }
    // Retried while time remained, with a pause between tries rather than a tight loop.
    assert!((2..=60).contains(&tries), "{tries} tries");
}

#[tokio::test(start_paused = true)]
async fn a_replay_after_an_unknown_and_a_refused_try_finds_the_grant() {
    let replayed = AcquireReply::Replayed(GrantReply::new(FenceToken::MIN, Duration::from_secs(9)));
    let (outcome, tries) =
        acquire_with(vec![unknown(), refused(), replayed], Duration::from_secs(1)).await;
    assert!(matches!(outcome, AcquireOutcome::Replayed(_)), "{outcome}");
    assert_eq!(tries, 3);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_without_an_unknown_try_returns_at_once() {
    let (outcome, tries) = acquire_with(vec![refused()], Duration::from_secs(1)).await;
    assert!(matches!(outcome, AcquireOutcome::Unavailable(_)));
    assert_eq!(tries, 1);
}

#[tokio::test(start_paused = true)]
async fn contention_after_an_unknown_try_is_a_definite_answer() {
    let contended = AcquireReply::Contended(leasehold::Contention::new(
        Duration::from_secs(30),
        None,
        None,
    ));
    let (outcome, _) = acquire_with(vec![unknown(), contended], Duration::from_secs(1)).await;
    assert!(matches!(outcome, AcquireOutcome::Contended(_)), "{outcome}");
}
