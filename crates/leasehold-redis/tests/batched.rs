//! Acquires and releases that start while other commands are in flight go to the server
//! together, one script run for many (`batch.rs`), on real redis-server: each still gets the
//! answer a call of its own would have had, and a caller's cancellation neither sends what it
//! withdrew nor takes another caller's answer away.
//!
//! The tests make the batches by the order in which they poll futures, not by timing: a
//! command whose future has not been polled to its end holds its in-flight permit, so whatever
//! starts after it is batched.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use common::{client, delta, lease_key, request};
use leasehold_redis::leasehold::backend::AcquireReply;
use leasehold_redis::leasehold::{
    AcquireOutcome, LeaseBackend, LeaseRequest, OperationId, Purpose, ReleaseOutcome,
    ResourceDigest, UnavailableCause, UnusableKey,
};
use leasehold_redis::{RedisBackend, RedisLeases};
use test_support::RedisServer;

const TTL: Duration = Duration::from_secs(30);
/// A bound for a hang, never a timing goal: each wait here is one round trip.
const HANG: Duration = Duration::from_secs(10);

type Acquiring<'a> = Pin<Box<dyn Future<Output = AcquireReply> + Send + 'a>>;

/// Polls `future` once; returns true if and only if it is still pending.
async fn poll_once(future: &mut Acquiring<'_>) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_pending())).await
}

#[tokio::test]
async fn acquires_and_releases_started_together_go_as_one_command_each_answered_alone() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    // One resource whose lease key is a hash: its acquire is refused, the others' are not.
    let broken = request(&client, "batched-broken", "op-a", TTL);
    server.cmd(&["HSET", &lease_key(&client, &broken), "f", "v"]);
    let first = request(&client, "batched-first", "op-a", TTL);
    let mut requests: Vec<LeaseRequest> = (0..6)
        .map(|i| request(&client, &format!("batched-{i}"), "op-a", TTL))
        .collect();
    // The same resource as the first of the batch, another attempt: contended by it.
    requests.push(request(&client, "batched-0", "op-b", TTL));
    requests.push(broken);

    let before = server.commandstats();
    // The first goes alone; the others start while it is in flight and go as one command.
    let (alone, outcomes) = tokio::join!(
        client.try_acquire(&first),
        futures_util::future::join_all(requests.iter().map(|r| client.try_acquire(r)))
    );
    let calls = delta(&before, &server.commandstats());
    assert_eq!(calls.get("evalsha"), Some(&2), "{calls:?}");

    let mut handles = vec![alone.into_handle().expect("free")];
    let mut outcomes = outcomes.into_iter();
    for _ in 0..6 {
        let outcome = outcomes.next().expect("an outcome each");
        assert!(matches!(outcome, AcquireOutcome::Acquired(_)), "{outcome}");
        handles.extend(outcome.into_handle());
    }
    let twin = outcomes.next().expect("an outcome each");
    assert!(matches!(twin, AcquireOutcome::Contended(_)), "{twin}");
    match outcomes.next().expect("an outcome each") {
        AcquireOutcome::Unavailable(u) => assert_eq!(
            u.cause,
            UnavailableCause::UnusableKey(UnusableKey::LeaseWrongType)
        ),
        other => panic!("expected the hash to be refused, got {other}"),
    }
    // Each grant's fence is its own resource's counter (one TIME serves a whole batch, so
    // grants on different resources may share a fence, as they may in one microsecond).
    for handle in &handles {
        let key = client
            .backend()
            .keys()
            .lease_key(handle.purpose(), handle.resource());
        let counter = server.cmd(&["GET", &format!("{key}:fence")]).as_string();
        assert_eq!(counter, Some(handle.fence().get().to_string()), "{key}");
    }

    let before = server.commandstats();
    let (first, rest) = handles.split_first().expect("seven handles");
    let (alone, released) = tokio::join!(
        first.release(),
        futures_util::future::join_all(rest.iter().map(|h| h.release()))
    );
    let calls = delta(&before, &server.commandstats());
    assert_eq!(calls.get("evalsha"), Some(&2), "{calls:?}");
    assert_eq!(alone, ReleaseOutcome::Released);
    assert!(
        released.iter().all(|r| *r == ReleaseOutcome::Released),
        "{released:?}"
    );
    for handle in &handles {
        let key = client
            .backend()
            .keys()
            .lease_key(handle.purpose(), handle.resource());
        assert_eq!(server.cmd(&["EXISTS", &key]).as_int(), Some(0), "{key}");
    }
}

/// Three acquires on one backend: the first sent alone and left in flight, the second leading
/// a batch (polled once, it yields), the third queued behind it.
struct Three<'a> {
    first: Acquiring<'a>,
    leader: Acquiring<'a>,
    queued: Acquiring<'a>,
}

async fn three<'a>(backend: &'a RedisBackend, requests: &'a [LeaseRequest; 3]) -> Three<'a> {
    let mut three = Three {
        first: Box::pin(backend.acquire(&requests[0])),
        leader: Box::pin(backend.acquire(&requests[1])),
        queued: Box::pin(backend.acquire(&requests[2])),
    };
    assert!(poll_once(&mut three.first).await, "sent and in flight");
    assert!(poll_once(&mut three.leader).await, "leads, and yields");
    assert!(
        poll_once(&mut three.queued).await,
        "queued behind the leader"
    );
    three
}

fn requests(client: &RedisLeases, name: &str) -> [LeaseRequest; 3] {
    [0, 1, 2].map(|i| request(client, &format!("{name}-{i}"), "op-a", TTL))
}

fn held(server: &RedisServer, client: &RedisLeases, r: &LeaseRequest) -> bool {
    server.cmd(&["EXISTS", &lease_key(client, r)]).as_int() == Some(1)
}

#[tokio::test]
async fn a_queued_acquire_whose_caller_is_dropped_is_never_sent() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    let requests = requests(&client, "withdrawn");
    let before = server.commandstats();
    let three = three(client.backend(), &requests).await;
    drop(three.queued);
    let (first, leader) =
        tokio::time::timeout(HANG, async { tokio::join!(three.first, three.leader) })
            .await
            .expect("no hang");
    assert!(matches!(first, AcquireReply::Granted(_)), "{first:?}");
    assert!(matches!(leader, AcquireReply::Granted(_)), "{leader:?}");
    assert!(
        !held(&server, &client, &requests[2]),
        "the dropped acquire was sent"
    );
    let calls = delta(&before, &server.commandstats());
    assert_eq!(calls.get("evalsha"), Some(&2), "{calls:?}");
}

#[tokio::test]
async fn a_leader_dropped_before_it_sends_hands_the_batch_over() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    let requests = requests(&client, "handed-over");
    let three = three(client.backend(), &requests).await;
    drop(three.leader);
    let (first, queued) =
        tokio::time::timeout(HANG, async { tokio::join!(three.first, three.queued) })
            .await
            .expect("the queued acquire is sent by someone");
    assert!(matches!(first, AcquireReply::Granted(_)), "{first:?}");
    assert!(matches!(queued, AcquireReply::Granted(_)), "{queued:?}");
    assert!(
        !held(&server, &client, &requests[1]),
        "the dropped leader's acquire was sent"
    );
}

#[tokio::test]
async fn a_leader_dropped_with_its_command_in_flight_leaves_the_others_answered() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    let requests = requests(&client, "in-flight");
    let mut three = three(client.backend(), &requests).await;
    let paused = server.pause();
    // Polled again, the leader takes the queue and sends it; the server cannot answer yet.
    assert!(
        poll_once(&mut three.leader).await,
        "sent, waiting for the reply"
    );
    drop(three.leader);
    paused.resume();
    let (first, queued) =
        tokio::time::timeout(HANG, async { tokio::join!(three.first, three.queued) })
            .await
            .expect("the batch is answered without its leader");
    assert!(matches!(first, AcquireReply::Granted(_)), "{first:?}");
    assert!(matches!(queued, AcquireReply::Granted(_)), "{queued:?}");
    // The leader's acquire was on the wire: it may be applied, as its cancel safety says.
    assert!(held(&server, &client, &requests[1]));
}

#[tokio::test]
async fn the_cleanup_behind_an_acquire_takes_it_out_of_the_queue_first() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    let requests = requests(&client, "cleaned-up");
    let three = three(client.backend(), &requests).await;
    // What a dropped acquire's cleanup sends: it must not be overtaken by the acquire.
    let cleanup = client.backend().release_attempt(&requests[2]).await;
    assert_eq!(
        cleanup,
        leasehold_redis::leasehold::backend::ReleaseReply::AlreadyGone
    );
    let (first, leader, queued) = tokio::time::timeout(HANG, async {
        tokio::join!(three.first, three.leader, three.queued)
    })
    .await
    .expect("no hang");
    assert!(matches!(first, AcquireReply::Granted(_)), "{first:?}");
    assert!(matches!(leader, AcquireReply::Granted(_)), "{leader:?}");
    // Withdrawn, never sent: not granted, and never reported as granted.
    assert!(!matches!(queued, AcquireReply::Granted(_)), "{queued:?}");
    assert!(!held(&server, &client, &requests[2]));
}

/// A request on `purpose` with a fresh attempt.
fn request_on(client: &RedisLeases, purpose: &str, resource: &str) -> LeaseRequest {
    let attempt = client
        .new_attempt(OperationId::new("op-a").expect("valid op id"))
        .expect("entropy");
    client
        .request(
            Purpose::new(purpose).expect("valid purpose"),
            ResourceDigest::of(resource),
            attempt,
            TTL,
        )
        .expect("valid request")
}

#[tokio::test]
async fn a_batch_refused_for_one_entrys_keys_is_sent_again_entry_by_entry() {
    let server = RedisServer::start_with_args(&[
        "--user",
        "narrow",
        "on",
        ">narrow-pass",
        "~leasehold:lease:v1:allowed:*",
        "&*",
        "+@all",
    ]);
    let url = format!("redis://narrow:narrow-pass@127.0.0.1:{}", server.port());
    let client = RedisBackend::open(&url, common::settings())
        .expect("valid URL")
        .into_client();
    client.backend().warm_up().await.unwrap();
    let first = request_on(&client, "allowed", "first");
    let allowed = request_on(&client, "allowed", "second");
    let denied = request_on(&client, "denied", "third");
    // The first goes alone; the other two start while it is in flight, as one command that
    // the server refuses for the denied purpose's keys.
    let (first, allowed, denied) = tokio::join!(
        client.try_acquire(&first),
        client.try_acquire(&allowed),
        client.try_acquire(&denied)
    );
    assert!(matches!(first, AcquireOutcome::Acquired(_)), "{first}");
    assert!(matches!(allowed, AcquireOutcome::Acquired(_)), "{allowed}");
    match denied {
        AcquireOutcome::Unavailable(u) => assert_eq!(u.cause, UnavailableCause::NoPermission),
        other => panic!("expected Unavailable(NoPermission), got {other}"),
    }
}
