//! Bounded waiting on real redis-server: deadlines, hand-off on expiry, FIFO, cancellation.

mod common;

use std::time::{Duration, Instant};

use common::{client, request};
use leasehold_redis::leasehold::{AcquireOutcome, InspectOutcome, ReleaseOutcome};
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
    // nobody holds. The background cleanup must find and release it.
    let key = common::lease_key(&client, &req);
    let mut freed = false;
    for _ in 0..100 {
        let fence = server.cmd(&["GET", &format!("{key}:fence")]).as_string();
        let free =
            client.inspect(req.purpose(), req.resource(), None).await == InspectOutcome::Free;
        if fence.as_deref() == Some("1") && free {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(freed, "the grant of the dropped acquire was not released");
}
