//! Bounded waiting on real redis-server: deadlines, hand-off on expiry, FIFO, cancellation.

mod common;

use std::time::{Duration, Instant};

use common::{client, request};
use leasehold_redis::leasehold::{AcquireOutcome, ReleaseOutcome};
use test_support::RedisServer;

const COMMAND_TIMEOUT: Duration = Duration::from_millis(200);

#[tokio::test]
async fn a_zero_wait_tries_once() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    let holder = request(&client, "w0", "op-a", Duration::from_secs(5));
    let _lease = client.acquire(&holder).await.into_handle().expect("free");
    let before = server.commandstats();
    let waiter = request(&client, "w0", "op-b", Duration::from_secs(5));
    assert!(matches!(
        client.acquire(&waiter).await,
        AcquireOutcome::Contended(_)
    ));
    let sent = common::client_commands(&common::delta(&before, &server.commandstats()));
    assert_eq!(sent.get("evalsha"), Some(&1), "{sent:?}");
}

#[tokio::test]
async fn the_deadline_is_respected() {
    let server = RedisServer::start();
    let client = client(&server);
    let holder = request(&client, "w1", "op-a", Duration::from_secs(10));
    let _lease = client.acquire(&holder).await.into_handle().expect("free");
    let wait = Duration::from_millis(300);
    let waiter = request(&client, "w1", "op-b", Duration::from_secs(5))
        .with_wait_timeout(wait)
        .unwrap();
    let started = Instant::now();
    let outcome = client.acquire(&waiter).await;
    let took = started.elapsed();
    match outcome {
        AcquireOutcome::Contended(c) => {
            assert!(c.retry_after > Duration::from_secs(8), "{c:?}");
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    assert!(took >= wait, "returned before the deadline: {took:?}");
    // One command may run past the deadline; the rest is scheduling margin.
    assert!(
        took <= wait + COMMAND_TIMEOUT + Duration::from_millis(500),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_waiter_takes_over_when_the_lease_expires() {
    let server = RedisServer::start();
    let client = client(&server);
    let ttl = Duration::from_millis(300);
    let holder = request(&client, "w2", "op-a", ttl);
    let started = Instant::now();
    let first = client.acquire(&holder).await.into_handle().expect("free");
    let waiter = request(&client, "w2", "op-b", Duration::from_secs(5))
        .with_wait_timeout(Duration::from_secs(3))
        .unwrap();
    let second = match client.acquire(&waiter).await {
        AcquireOutcome::Acquired(h) => h,
        other => panic!("expected Acquired after expiry, got {other:?}"),
    };
    // No release was sent: the hand-off came from the expiry timer, after the TTL.
    assert!(
        started.elapsed() >= ttl - Duration::from_millis(50),
        "{:?}",
        started.elapsed()
    );
    assert!(second.fence() > first.fence());
    let _ = second.release().await;
}

#[tokio::test(flavor = "current_thread")]
async fn waiters_in_one_process_are_served_in_fifo_order() {
    let server = RedisServer::start();
    let client = client(&server);
    let holder = request(&client, "w3", "op-holder", Duration::from_millis(200));
    let _first = client.acquire(&holder).await.into_handle().expect("free");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..4 {
        let client = client.clone();
        let tx = tx.clone();
        let req = request(
            &client,
            "w3",
            &format!("op-{i}"),
            Duration::from_millis(150),
        )
        .with_wait_timeout(Duration::from_secs(10))
        .unwrap();
        tasks.push(tokio::spawn(async move {
            match client.acquire(&req).await {
                AcquireOutcome::Acquired(lease) => {
                    tx.send(i).unwrap();
                    // Hold briefly, then hand over by release.
                    assert_eq!(lease.release().await, ReleaseOutcome::Released);
                }
                other => panic!("waiter {i}: {other:?}"),
            }
        }));
        // Let waiter i reach the queue before waiter i+1 is started.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
    drop(tx);
    for task in tasks {
        task.await.unwrap();
    }
    let mut order = Vec::new();
    while let Some(i) = rx.recv().await {
        order.push(i);
    }
    assert_eq!(order, vec![0, 1, 2, 3]);
}

#[tokio::test]
async fn a_cancelled_wait_leaves_nothing_held() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    let req = request(&client, "w4", "op-a", Duration::from_secs(30))
        .with_wait_timeout(Duration::from_secs(10))
        .unwrap();
    {
        // The try is in flight to a stopped server when the future is dropped.
        let _paused = server.pause();
        let dropped = tokio::time::timeout(Duration::from_millis(50), client.acquire(&req)).await;
        assert!(
            dropped.is_err(),
            "acquire finished against a stopped server"
        );
    }
    // The stalled command ran when the server resumed: it granted the lease to an attempt
    // nobody holds. The background cleanup finds and releases it, and `settle` waits for
    // exactly that, so no polling is needed.
    tokio::time::timeout(Duration::from_secs(5), client.settle())
        .await
        .expect("the cleanup finished");
    let key = common::lease_key(&client, &req);
    assert!(
        server
            .cmd(&["GET", &format!("{key}:fence")])
            .as_string()
            .is_some(),
        "the stalled acquire never ran"
    );
    assert!(!server.keys().contains(&key), "{:?}", server.keys());
    // Nothing is running: settle returns at once.
    tokio::time::timeout(Duration::from_millis(100), client.settle())
        .await
        .expect("idle settle");
}

#[tokio::test]
async fn a_release_before_the_subscription_is_confirmed_still_hands_off() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    // A fresh resource each round, so each waiter's SUBSCRIBE is new and still in flight when
    // the release lands right after the waiter starts. The subscriber wakes the channel's
    // waiters once it is subscribed, so the release heard by nobody is not slept through.
    for round in 0..20 {
        let resource = format!("w9-{round}");
        let holder = request(&client, &resource, "op-a", Duration::from_secs(30));
        let first = client.acquire(&holder).await.into_handle().expect("free");
        let waiter = request(&client, &resource, "op-b", Duration::from_secs(30))
            .with_wait_timeout(Duration::from_secs(10))
            .unwrap();
        let waiting = {
            let client = client.clone();
            tokio::spawn(async move { (client.acquire(&waiter).await, Instant::now()) })
        };
        tokio::task::yield_now().await;
        common::release_and_expect_hand_off(first, waiting, Duration::from_secs(5)).await;
    }
}

/// Waits (bounded) until `n` connections are subscribed to the resource's release channel.
async fn until_subscribed(
    server: &RedisServer,
    client: &leasehold_redis::RedisLeases,
    req: &leasehold_redis::leasehold::LeaseRequest,
    n: i64,
) {
    let channel = client
        .backend()
        .keys()
        .release_channel(req.purpose(), req.resource());
    for _ in 0..250 {
        let reply = server.cmd(&["PUBSUB", "NUMSUB", &channel]);
        let count = match reply {
            test_support::Reply::Array(Some(items)) => items.get(1).and_then(|r| r.as_int()),
            _ => None,
        };
        if count.unwrap_or(0) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no subscriber on {channel}");
}

use common::Waiting;

/// A holder with a 10 s lease, and a waiter (8 s wait) parked behind it, subscribed, and
/// refused once (so the release is announced).
async fn hold_and_wait(
    server: &RedisServer,
    resource: &str,
) -> (
    leasehold_redis::RedisLeases,
    leasehold_redis::leasehold::LeaseRequest,
    leasehold_redis::leasehold::LeaseHandle<leasehold_redis::RedisBackend>,
    Waiting,
) {
    let client = client(server);
    let holder = request(&client, resource, "op-a", Duration::from_secs(10));
    let first = client.acquire(&holder).await.into_handle().expect("free");
    let waiter = request(&client, resource, "op-b", Duration::from_secs(10))
        .with_wait_timeout(Duration::from_secs(8))
        .unwrap();
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { (client.acquire(&waiter).await, Instant::now()) })
    };
    until_subscribed(server, &client, &holder, 1).await;
    common::until_marked(server, &common::lease_key(&client, &holder)).await;
    (client, holder, first, waiting)
}

#[tokio::test]
async fn a_release_hands_off_at_once() {
    let server = RedisServer::start();
    let (_client, _holder, first, waiting) = hold_and_wait(&server, "w5").await;
    // The holder's TTL was 10 s: only the notice explains a hand-off this quick.
    common::release_and_expect_hand_off(first, waiting, Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_waiters_cost_at_most_three_commands_per_release() {
    let server = RedisServer::start();
    let client = client(&server);
    let holder = request(&client, "w6", "op-holder", Duration::from_secs(30));
    let first = client.acquire(&holder).await.into_handle().expect("free");
    let mut tasks = Vec::new();
    for i in 0..100 {
        let client = client.clone();
        let req = request(&client, "w6", &format!("op-{i}"), Duration::from_secs(30))
            .with_wait_timeout(Duration::from_secs(25))
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let lease = client
                .acquire(&req)
                .await
                .into_handle()
                .expect("handed over");
            assert_eq!(lease.release().await, ReleaseOutcome::Released);
        }));
    }
    until_subscribed(&server, &client, &holder, 1).await;
    // Let the head's first try land before counting.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = server.commandstats();
    assert_eq!(first.release().await, ReleaseOutcome::Released);
    for task in tasks {
        task.await.unwrap();
    }
    let sent = common::client_commands(&common::delta(&before, &server.commandstats()));
    let releases = 101;
    let evalsha = sent.get("evalsha").copied().unwrap_or(0);
    assert!(
        evalsha <= 3 * releases,
        "{evalsha} EVALSHA for {releases} releases: {sent:?}"
    );
    println!("{evalsha} commands for {releases} releases");
}

#[tokio::test]
async fn a_killed_subscriber_reconnects_and_still_hands_off() {
    let server = RedisServer::start();
    let (client, holder, first, waiting) = hold_and_wait(&server, "w7").await;
    let killed = server.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).as_int();
    assert_eq!(killed, Some(1));
    // The subscriber comes back on its own and subscribes again.
    until_subscribed(&server, &client, &holder, 1).await;
    common::release_and_expect_hand_off(first, waiting, Duration::from_secs(2)).await;
}

/// The release channels the server has subscribers on.
fn subscribed_channels(server: &RedisServer) -> usize {
    match server.cmd(&["PUBSUB", "CHANNELS", "*:released"]) {
        test_support::Reply::Array(Some(items)) => items.len(),
        other => panic!("PUBSUB CHANNELS replied {other:?}"),
    }
}

#[tokio::test]
async fn subscriptions_are_kept_only_for_resources_with_waiters_now() {
    let server = RedisServer::start();
    let holders = client(&server);
    let waiters = client(&server);
    // 300 resources, each held, each waited on briefly by the same process.
    let mut held = Vec::new();
    for i in 0..300 {
        let req = request(
            &holders,
            &format!("many-{i}"),
            "op-a",
            Duration::from_secs(30),
        );
        held.push(holders.acquire(&req).await.into_handle().expect("free"));
    }
    let mut brief = Vec::new();
    for i in 0..300 {
        let waiters = waiters.clone();
        brief.push(tokio::spawn(async move {
            let req = request(
                &waiters,
                &format!("many-{i}"),
                "op-b",
                Duration::from_secs(30),
            )
            .with_wait_timeout(Duration::from_millis(300))
            .unwrap();
            waiters.acquire(&req).await
        }));
    }
    // One waiter that is still waiting, on another resource.
    let (_client, _holder, first, waiting) = hold_and_wait(&server, "still-waited").await;
    for task in brief {
        assert!(matches!(task.await.unwrap(), AcquireOutcome::Contended(_)));
    }
    // Every brief waiter is gone: its channel is dropped and unsubscribed, bounded by the
    // sweep; the one still waiting keeps its own (two clients: the brief ones' and its own).
    let deadline = Instant::now() + Duration::from_secs(20);
    while subscribed_channels(&server) > 1 {
        assert!(
            Instant::now() < deadline,
            "{} channels still subscribed",
            subscribed_channels(&server)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(subscribed_channels(&server), 1);
    // And it still hears the release at once.
    common::release_and_expect_hand_off(first, waiting, Duration::from_secs(2)).await;
    drop(held);
}

/// Announces (`PUBLISH`) and marks (`APPEND`) the server ran since `before`.
fn announced_and_marked(
    server: &RedisServer,
    before: &std::collections::BTreeMap<String, u64>,
) -> (u64, u64) {
    let sent = common::delta(before, &server.commandstats());
    let count = |name: &str| sent.get(name).copied().unwrap_or(0);
    (count("publish"), count("append"))
}

/// Acquires `req` (free), lets `refuse` be refused by it, then releases it and returns how
/// many announcements and marks the server made meanwhile.
async fn cycle_with(
    server: &RedisServer,
    client: &leasehold_redis::RedisLeases,
    req: &leasehold_redis::leasehold::LeaseRequest,
    refuse: impl AsyncFnOnce(&leasehold_redis::leasehold::LeaseHandle<leasehold_redis::RedisBackend>),
) -> (u64, u64) {
    let before = server.commandstats();
    let lease = client.try_acquire(req).await.into_handle().expect("free");
    refuse(&lease).await;
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    announced_and_marked(server, &before)
}

/// A release is announced only when someone was refused the grant and may wait for it: an
/// uncontended acquire and release runs no `PUBLISH` (D48). A refused acquire (contended, or
/// the same owner's other operation) and an observer's watch mark the grant once, renewals
/// keep the mark, and its release is announced exactly once. An inspection marks nothing.
#[tokio::test]
async fn a_release_is_announced_only_when_someone_waited_for_it() {
    use leasehold_redis::leasehold::{HolderName, InspectOutcome, LeaseBackend, OperationId};
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    let ttl = Duration::from_secs(10);

    // Nobody waited: no announcement, no mark, even after an inspection.
    let alone = request(&client, "an/1", "op-a", ttl);
    assert_eq!(
        cycle_with(&server, &client, &alone, async |_| {}).await,
        (0, 0)
    );
    let inspected = request(&client, "an/1", "op-b", ttl);
    let counts = cycle_with(&server, &client, &inspected, async |_| {
        let found = client
            .inspect(inspected.purpose(), inspected.resource(), None)
            .await;
        assert!(matches!(found, InspectOutcome::HeldByOther(_)), "{found:?}");
    })
    .await;
    assert_eq!(counts, (0, 0));

    // Refused twice and renewed: one mark, one announcement, and the value ends in exactly
    // one mark.
    let held = request(&client, "an/2", "op-a", ttl);
    let key = common::lease_key(&client, &held);
    let counts = cycle_with(&server, &client, &held, async |lease| {
        for op in ["op-b", "op-c"] {
            let other = request(&client, "an/2", op, ttl);
            assert!(matches!(
                client.try_acquire(&other).await,
                AcquireOutcome::Contended(_)
            ));
        }
        assert!(lease.renew().await.is_renewed());
        let value = server.cmd(&["GET", &key]).as_string().unwrap();
        assert!(value.ends_with(":op-a\n\n\n"), "{value:?}");
        assert!(common::is_marked(&server, &key));
    })
    .await;
    assert_eq!(counts, (1, 1));

    // With a holder name, the mark follows it, and the name still reads as it was.
    let name = HolderName::new("host-7").unwrap();
    let named = request(&client, "an/3", "op-a", ttl).with_holder_name(name.clone());
    let key = common::lease_key(&client, &named);
    let counts = cycle_with(&server, &client, &named, async |_| {
        let other = request(&client, "an/3", "op-b", ttl);
        match client.try_acquire(&other).await {
            AcquireOutcome::Contended(c) => assert_eq!(c.holder_name.as_ref(), Some(&name)),
            refused => panic!("expected Contended, got {refused:?}"),
        }
        let value = server.cmd(&["GET", &key]).as_string().unwrap();
        assert!(value.ends_with("\n\nhost-7\n"), "{value:?}");
        match client
            .inspect(named.purpose(), named.resource(), None)
            .await
        {
            InspectOutcome::HeldByOther(view) => assert_eq!(view.holder_name, Some(name.clone())),
            found => panic!("{found:?}"),
        }
    })
    .await;
    assert_eq!(counts, (1, 1));

    // The same owner's other operation is refused too, and may wait as well.
    let owner = request(&client, "an/4", "op-a", ttl);
    let counts = cycle_with(&server, &client, &owner, async |_| {
        let conflict = owner.for_attempt(
            owner
                .attempt()
                .with_operation(OperationId::new("op-b").unwrap()),
        );
        assert!(matches!(
            client.try_acquire(&conflict).await,
            AcquireOutcome::OwnerOperationConflict(_)
        ));
    })
    .await;
    assert_eq!(counts, (1, 1));

    // An observer's watch marks the grant it reads, so that a resignation is announced.
    let watched = request(&client, "an/5", "op-a", ttl);
    let counts = cycle_with(&server, &client, &watched, async |_| {
        let found = client
            .backend()
            .inspect_watched(watched.purpose(), watched.resource())
            .await;
        assert!(matches!(found, InspectOutcome::HeldByOther(_)), "{found:?}");
    })
    .await;
    assert_eq!(counts, (1, 1));
}
