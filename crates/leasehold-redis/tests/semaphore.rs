//! Counting semaphores on real redis-server: at most N holders, a fence per slot, waiters
//! served in arrival order, dead waiters dropped within the heartbeat, a capacity that is
//! recorded and never silently changed, and no key left behind.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{client, settings};
use leasehold_redis::leasehold::{
    AcquireOutcome, ErrorKind, LockError, LossReason, OperationId, Purpose, ReleaseOutcome,
    ResourceDigest,
};
use leasehold_redis::{FencedWrite, RecordName, RedisLeases, SemaphoreKeys};
use test_support::{FaultProxy, ProxyFault, RedisServer};

fn purpose() -> Purpose {
    Purpose::new(leasehold_redis::leasehold::lock::DEFAULT_PURPOSE).unwrap()
}

fn keys(client: &RedisLeases, name: &str) -> SemaphoreKeys {
    client
        .backend()
        .keys()
        .semaphore(&purpose(), &ResourceDigest::of(name))
}

/// Polls `check` every 5 ms until it holds, for at most `within`.
async fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn queued(server: &RedisServer, keys: &SemaphoreKeys) -> i64 {
    server.cmd(&["ZCARD", &keys.queue]).as_int().unwrap_or(-1)
}

#[tokio::test]
async fn never_more_than_capacity_holders_at_once_and_more_than_one() {
    let server = RedisServer::start();
    let clients: Vec<RedisLeases> = (0..3).map(|_| client(&server)).collect();
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for worker in 0..12 {
        let client = clients[worker % clients.len()].clone();
        let (holding, most) = (Arc::clone(&holding), Arc::clone(&most));
        tasks.push(tokio::spawn(async move {
            for _ in 0..8 {
                let permit = client
                    .semaphore("exports", 3)
                    .ttl(Duration::from_secs(5))
                    .wait(Duration::from_secs(30))
                    .await
                    .expect("a permit within the wait");
                // Counted from after the grant to before the release is sent: inside the
                // time the server held the slot.
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(permit.slot().is_some_and(|slot| slot < 3));
                tokio::time::sleep(Duration::from_millis(3)).await;
                holding.fetch_sub(1, Ordering::SeqCst);
                assert_eq!(permit.release().await, ReleaseOutcome::Released);
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} holders at once");
    assert!(
        most >= 2,
        "never more than one holder: a mutex, not a semaphore"
    );
}

#[tokio::test]
async fn each_slot_has_its_own_fence_and_fences_grow_across_the_semaphore() {
    let server = RedisServer::start();
    let client = client(&server);
    let a = client.semaphore("pool", 2).await.expect("free");
    let b = client.semaphore("pool", 2).await.expect("free");
    let (sa, sb) = (a.slot().unwrap(), b.slot().unwrap());
    assert_ne!(sa, sb);
    assert!(b.fence() > a.fence());
    let full = client.semaphore("pool", 2).await;
    assert!(matches!(full, Err(LockError::Contended(_))), "{full:?}");
    // The slot's key holds the permit exactly as a lease key holds a lease.
    let stored = server
        .cmd(&["GET", &keys(&client, "pool").slot(sa)])
        .as_string()
        .unwrap_or_default();
    assert!(stored.starts_with(&format!("{}:", a.fence())), "{stored:?}");
    assert_eq!(a.release().await, ReleaseOutcome::Released);
    let c = client.semaphore("pool", 2).await.expect("a slot came free");
    assert_eq!(c.slot(), Some(sa));
    assert!(c.fence() > b.fence());
    assert_eq!(b.release().await, ReleaseOutcome::Released);
    assert_eq!(c.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_stale_holder_of_a_slot_is_refused_at_the_fenced_target_once_the_slot_was_granted_again()
{
    let server = RedisServer::start();
    let client = client(&server);
    let backend = client.backend();
    let (purpose, resource) = (purpose(), ResourceDigest::of("gpu"));
    let record = RecordName::new("job").unwrap();
    // A holder of one slot that stops renewing (paused, say): the explicit API, no watchdog.
    let request = |op: &str| {
        client
            .request(
                purpose.clone(),
                resource.clone(),
                client.new_attempt(OperationId::new(op).unwrap()).unwrap(),
                Duration::from_millis(300),
            )
            .unwrap()
            .with_capacity(2)
            .unwrap()
    };
    let stale = client
        .try_acquire(&request("stale"))
        .await
        .into_handle()
        .expect("free");
    let other = client.semaphore("gpu", 2).await.expect("the other slot");
    let stale_slot = stale.slot().unwrap();
    assert_ne!(other.slot(), Some(stale_slot));
    let write = |slot: u32, fence, value: &'static str| {
        backend.fenced_write_permit(&purpose, &resource, slot, &record, fence, value.as_bytes())
    };
    assert!(matches!(
        write(stale_slot, stale.fence(), "stale-1").await,
        FencedWrite::Written
    ));
    // The other slot's holder writes at once, with its own (higher) fence, in its own slot.
    assert!(matches!(
        write(other.slot().unwrap(), other.fence(), "other").await,
        FencedWrite::Written
    ));
    // The stale permit lapses; its slot is granted again.
    let slot_key = keys(&client, "gpu").slot(stale_slot);
    eventually(Duration::from_secs(3), "the stale permit expires", || {
        server.cmd(&["EXISTS", &slot_key]).as_int() == Some(0)
    })
    .await;
    let next = client
        .try_acquire(&request("next"))
        .await
        .into_handle()
        .expect("the lapsed slot");
    assert_eq!(next.slot(), Some(stale_slot));
    assert!(next.fence() > stale.fence());
    assert!(matches!(
        write(stale_slot, next.fence(), "next").await,
        FencedWrite::Written
    ));
    // The stale holder wakes and writes: refused, and the slot's record is the new holder's.
    match write(stale_slot, stale.fence(), "stale-2").await {
        FencedWrite::Stale { current } => assert_eq!(current, next.fence()),
        other => panic!("a stale write was not refused: {other:?}"),
    }
    let stored = server
        .cmd(&[
            "HGET",
            &keys(&client, "gpu").record(stale_slot, &record),
            "value",
        ])
        .as_string();
    assert_eq!(stored.as_deref(), Some("next"));
    let _ = next.release().await;
    let _ = other.release().await;
}

#[tokio::test]
async fn sixteen_waiters_are_served_in_the_order_they_began_to_wait() {
    let server = RedisServer::start();
    let clients: Vec<RedisLeases> = (0..4).map(|_| client(&server)).collect();
    let keys = keys(&clients[0], "turns");
    let holder = clients[0].semaphore("turns", 1).await.expect("free");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..16 {
        let client = clients[i % clients.len()].clone();
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(async move {
            let permit = client
                .semaphore("turns", 1)
                .wait(Duration::from_secs(60))
                .await
                .expect("served within the wait");
            order.lock().unwrap().push(i);
            assert_eq!(permit.release().await, ReleaseOutcome::Released);
        }));
        // The next one begins to wait only once this one has its place.
        eventually(Duration::from_secs(5), "the waiter takes its place", || {
            queued(&server, &keys) == i as i64 + 1
        })
        .await;
    }
    assert_eq!(holder.release().await, ReleaseOutcome::Released);
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("every waiter is served")
            .expect("waiter");
    }
    assert_eq!(*order.lock().unwrap(), (0..16).collect::<Vec<_>>());
    assert_eq!(queued(&server, &keys), 0);
}

#[tokio::test]
async fn a_try_that_does_not_wait_never_overtakes_a_waiter() {
    let server = RedisServer::start();
    let client = client(&server);
    let keys = keys(&client, "fair");
    let holder = client.semaphore("fair", 1).await.expect("free");
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .semaphore("fair", 1)
                .wait(Duration::from_secs(30))
                .await
        })
    };
    eventually(Duration::from_secs(5), "the waiter takes its place", || {
        queued(&server, &keys) == 1
    })
    .await;
    // Released without a notice reaching the waiter yet: a try now finds a free slot and a
    // waiter ahead of it, and is refused.
    let _ = server.cmd(&["DEL", &keys.slot(holder.slot().unwrap())]);
    let overtaking = client.semaphore("fair", 1).await;
    assert!(
        matches!(overtaking, Err(LockError::Contended(_))),
        "{overtaking:?}"
    );
    let served = waiter.await.expect("task").expect("the waiter is served");
    assert_eq!(served.slot(), Some(0));
    let _ = served.release().await;
    let _ = holder.release().await;
}

#[tokio::test]
async fn a_waiter_that_stops_trying_leaves_the_queue_within_its_heartbeat() {
    let server = RedisServer::start();
    let client = client(&server);
    let keys = keys(&client, "beats");
    let heartbeat = Duration::from_millis(600);
    let holder = client.semaphore("beats", 1).await.expect("free");
    // A waiter whose every command is held from now on: alive to itself, dead to the server.
    let proxy = FaultProxy::start(server.addr());
    let cut_off = leasehold_redis::RedisBackend::open(&proxy.url(), settings())
        .expect("url")
        .into_client();
    let dead = {
        let cut_off = cut_off.clone();
        tokio::spawn(async move {
            cut_off
                .semaphore("beats", 1)
                .queue_heartbeat(heartbeat)
                .wait(Duration::from_secs(60))
                .await
        })
    };
    eventually(Duration::from_secs(5), "the waiter takes its place", || {
        queued(&server, &keys) == 1
    })
    .await;
    proxy.to_server(ProxyFault::Hold);
    let later = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .semaphore("beats", 1)
                .queue_heartbeat(heartbeat)
                .wait(Duration::from_secs(60))
                .await
        })
    };
    eventually(
        Duration::from_secs(5),
        "the later waiter takes its place",
        || queued(&server, &keys) == 2,
    )
    .await;
    let released_at = Instant::now();
    assert_eq!(holder.release().await, ReleaseOutcome::Released);
    let served = tokio::time::timeout(Duration::from_secs(10), later)
        .await
        .expect("the later waiter is served")
        .expect("task")
        .expect("a permit");
    let waited = released_at.elapsed();
    // Its place lapses one heartbeat after its last try; the later waiter retries at least
    // three times per heartbeat. (Behind a place that never lapsed it would wait the whole
    // 60 s; the margin is for a loaded 2-core machine.)
    assert!(
        waited < heartbeat * 4 + Duration::from_secs(1),
        "waited {waited:?} behind a dead waiter"
    );
    let _ = served.release().await;
    dead.abort();
}

#[tokio::test]
async fn a_capacity_mismatch_is_typed_and_writes_nothing() {
    let server = RedisServer::start();
    let client = client(&server);
    let first = client.semaphore("api", 3).await.expect("free");
    let dump = |server: &RedisServer| {
        let mut keys = server.keys();
        keys.sort();
        keys.iter()
            .map(|k| {
                let kind = server.cmd(&["TYPE", k]).as_string().unwrap_or_default();
                let value = match kind.as_str() {
                    "string" => server.cmd(&["GET", k]).as_string(),
                    "zset" => Some(format!(
                        "{:?}",
                        server.cmd(&["ZRANGE", k, "0", "-1", "WITHSCORES"])
                    )),
                    _ => None,
                };
                (k.clone(), kind, value)
            })
            .collect::<Vec<_>>()
    };
    let before = dump(&server);
    for (capacity, wait) in [(4, Duration::ZERO), (2, Duration::from_secs(1))] {
        match client.semaphore("api", capacity).wait(wait).await {
            Err(LockError::CapacityMismatch { recorded }) => assert_eq!(recorded, 3),
            other => panic!("{capacity}: {other:?}"),
        }
    }
    assert_eq!(dump(&server), before);
    for bad in [0, leasehold_redis::leasehold::request::MAX_CAPACITY + 1] {
        match client.semaphore("api", bad).await {
            Err(LockError::Refused(e)) => assert_eq!(e.kind(), ErrorKind::InvalidCapacity),
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert_eq!(dump(&server), before);
    let _ = first.release().await;
}

#[tokio::test]
async fn a_replayed_permit_request_returns_the_same_slot_and_fence() {
    let server = RedisServer::start();
    let client = client(&server);
    let request = client
        .request(
            purpose(),
            ResourceDigest::of("replay"),
            client
                .new_attempt(OperationId::new("once").unwrap())
                .unwrap(),
            Duration::from_secs(5),
        )
        .unwrap()
        .with_capacity(4)
        .unwrap();
    let _other = client.semaphore("replay", 4).await.expect("free");
    let first = client.try_acquire(&request).await;
    let AcquireOutcome::Acquired(first) = first else {
        panic!("{first}");
    };
    let again = client.try_acquire(&request).await;
    let AcquireOutcome::Replayed(again) = again else {
        panic!("{again}");
    };
    assert_eq!(again.slot(), first.slot());
    assert_eq!(again.fence(), first.fence());
    // The cleanup behind an unknown acquire finds the slot by the attempt.
    assert_eq!(
        client.release_attempt(&request).await,
        ReleaseOutcome::Released
    );
    assert_eq!(
        client.release_attempt(&request).await,
        ReleaseOutcome::AlreadyGone
    );
}

#[tokio::test]
async fn a_permit_is_kept_alive_past_its_ttl_and_its_loss_is_signalled() {
    let server = RedisServer::start();
    let client = client(&server);
    let ttl = Duration::from_millis(600);
    let permit = client.semaphore("kept", 2).ttl(ttl).await.expect("free");
    tokio::time::sleep(ttl * 3).await;
    assert!(!permit.is_lost(), "{:?}", permit.signal().reason());
    let slot_key = keys(&client, "kept").slot(permit.slot().unwrap());
    let _ = server.cmd(&["DEL", &slot_key]);
    let reason = tokio::time::timeout(Duration::from_secs(3), permit.lost())
        .await
        .expect("the loss is signalled");
    assert_eq!(reason, LossReason::LostToAnother);
}

#[tokio::test]
async fn a_released_permit_wakes_a_waiter_at_once() {
    let server = RedisServer::start();
    let client = client(&server);
    let holder = client
        .semaphore("wake", 1)
        .ttl(Duration::from_secs(30))
        .await
        .expect("free");
    let keys = keys(&client, "wake");
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let permit = client
                .semaphore("wake", 1)
                .queue_heartbeat(Duration::from_secs(30))
                .wait(Duration::from_secs(20))
                .await;
            (permit, Instant::now())
        })
    };
    eventually(Duration::from_secs(5), "the waiter takes its place", || {
        queued(&server, &keys) == 1
    })
    .await;
    let released_at = Instant::now();
    assert_eq!(holder.release().await, ReleaseOutcome::Released);
    let (permit, at) = waiter.await.expect("task");
    let permit = permit.expect("handed on");
    // Its next try would be 10 s away (a third of its heartbeat, the holder's TTL 30 s): only
    // the release notice explains a hand-off this quick.
    assert!(
        at - released_at < Duration::from_secs(2),
        "{:?}",
        at - released_at
    );
    let _ = permit.release().await;
}

/// After the last permit and waiter, and the idle expiry, the namespace holds no key of the
/// semaphore (nor of a read/write lease), and fences still only grow across it.
#[tokio::test]
async fn an_idle_semaphore_leaves_no_key_behind_and_its_fences_still_grow() {
    let server = RedisServer::start();
    let idle = Duration::from_secs(1);
    let client = common::client_with(&server, settings().with_counter_idle_expiry(idle).unwrap());
    let ttl = Duration::from_millis(300);
    let mut last = None;
    for round in 0..2 {
        let holder = client.semaphore("idle", 2).ttl(ttl).await.expect("free");
        let other = client.semaphore("idle", 2).ttl(ttl).await.expect("free");
        // A waiter that gives up (its place is given back), and one whose place lapses.
        let gave_up = client
            .semaphore("idle", 2)
            .ttl(ttl)
            .queue_heartbeat(Duration::from_millis(200))
            .wait(Duration::from_millis(100))
            .await;
        assert!(
            matches!(gave_up, Err(LockError::Contended(_))),
            "{gave_up:?}"
        );
        let fence = other.fence();
        assert!(
            last.is_none_or(|l| fence > l),
            "round {round}: fences went back"
        );
        last = Some(fence);
        let _ = holder.release().await;
        let _ = other.release().await;
        let writer = client.write_lock("idle").ttl(ttl).await.expect("free");
        let reader = writer.downgrade().await.expect("downgraded");
        let _ = reader.release().await;
        // Everything of both expires: slots with their grants, the queue with its latest
        // place, the capacity record and the counters after the idle expiry.
        eventually(Duration::from_secs(5), "every key expires", || {
            server
                .keys()
                .iter()
                .all(|k| !k.contains(":sem:") && !k.contains(":rw:"))
        })
        .await;
    }
    assert!(server.keys().is_empty(), "{:?}", server.keys());
}

/// A wait that ends without a permit for another reason than its deadline (here the operator
/// changed the capacity, so the waiter's next try is a mismatch) gives its place in the queue
/// back at once, rather than keeping the waiters behind it out for its heartbeat.
#[tokio::test]
async fn a_wait_that_ends_on_a_mismatch_gives_its_place_back() {
    let server = RedisServer::start();
    let client = client(&server);
    let keys = keys(&client, "resized");
    let a = client.semaphore("resized", 1).await.expect("free");
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .semaphore("resized", 1)
                .queue_heartbeat(Duration::from_secs(60))
                .wait(Duration::from_secs(30))
                .await
        })
    };
    eventually(Duration::from_secs(5), "the waiter takes its place", || {
        queued(&server, &keys) == 1
    })
    .await;
    client
        .backend()
        .set_semaphore_capacity(&purpose(), &ResourceDigest::of("resized"), 2)
        .await
        .expect("resized");
    match tokio::time::timeout(Duration::from_secs(10), waiter).await {
        Ok(Ok(Err(LockError::CapacityMismatch { recorded }))) => assert_eq!(recorded, 2),
        other => panic!("{other:?}"),
    }
    client.settle().await;
    assert_eq!(queued(&server, &keys), 0, "the place outlived the wait");
    let _ = a.release().await;
}
