//! An operator's side of counting semaphores on real redis-server: inspecting and listing
//! who holds which permit (never a token), breaking one stuck permit with the fence counter
//! kept, and changing a capacity without evicting anyone.

mod common;

use std::time::{Duration, Instant};

use common::client;
use leasehold_redis::leasehold::{
    AcquireOutcome, HolderName, LockError, OperationId, Purpose, ReleaseOutcome, ResourceDigest,
    UnavailableCause, UnusableKey,
};
use leasehold_redis::{
    Error, ListedSemaphoreState, RedisLeases, RedisSettings, SemaphoreKeys, SemaphoreView,
};
use test_support::RedisServer;

/// The purpose `client.semaphore` takes its permits under.
fn purpose() -> Purpose {
    Purpose::new(leasehold_redis::leasehold::lock::DEFAULT_PURPOSE).unwrap()
}

fn keys(client: &RedisLeases, name: &str) -> SemaphoreKeys {
    client
        .backend()
        .keys()
        .semaphore(&purpose(), &ResourceDigest::of(name))
}

async fn inspect(client: &RedisLeases, name: &str) -> Option<SemaphoreView> {
    client
        .backend()
        .inspect_semaphore(&purpose(), &ResourceDigest::of(name))
        .await
        .expect("inspected")
}

fn queued(server: &RedisServer, keys: &SemaphoreKeys) -> i64 {
    server.cmd(&["ZCARD", &keys.queue]).as_int().unwrap_or(-1)
}

/// Polls `check` every 5 ms until it holds, for at most `within`.
async fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn inspect_shows_capacity_width_each_held_slot_and_the_live_waiters() {
    let server = RedisServer::start();
    let client = client(&server);
    assert_eq!(inspect(&client, "pool").await, None, "no semaphore yet");
    let a = client
        .semaphore("pool", 2)
        .holder_name(HolderName::new("host-1:11").unwrap())
        .await
        .expect("free");
    let b = client.semaphore("pool", 2).await.expect("free");
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .semaphore("pool", 2)
                .wait(Duration::from_secs(20))
                .await
        })
    };
    let keys = keys(&client, "pool");
    eventually(Duration::from_secs(5), "the waiter takes its place", || {
        queued(&server, &keys) == 1
    })
    .await;
    let view = inspect(&client, "pool").await.expect("a semaphore");
    assert_eq!((view.capacity, view.width, view.waiting), (Some(2), 2, 1));
    let slots: Vec<(u32, u64)> = view
        .permits
        .iter()
        .map(|p| (p.slot, p.view.fence.unwrap().get()))
        .collect();
    assert_eq!(
        slots,
        [
            (a.slot().unwrap(), a.fence().get()),
            (b.slot().unwrap(), b.fence().get())
        ]
    );
    let first = &view.permits[0].view;
    assert_eq!(
        first.holder_name.as_ref().map(HolderName::as_str),
        Some("host-1:11")
    );
    assert!(first.holder.is_some() && !first.released);
    assert!(
        first
            .server_ttl
            .is_some_and(|ttl| ttl <= Duration::from_secs(30))
    );
    // A fingerprint, never the token the slot's key holds.
    let stored = server
        .cmd(&["GET", &keys.slot(a.slot().unwrap())])
        .as_string()
        .unwrap();
    let token = stored.split(':').nth(1).unwrap();
    assert!(!format!("{view:?}").contains(token), "{view:?}");

    assert_eq!(a.release().await, ReleaseOutcome::Released);
    let served = waiter.await.expect("task").expect("handed on");
    let view = inspect(&client, "pool").await.expect("a semaphore");
    assert_eq!(view.waiting, 0);
    assert_eq!(view.permits.len(), 2);
    let _ = served.release().await;
    let _ = b.release().await;
    // Released: the record stays (its capacity is still the semaphore's), nothing is held.
    let view = inspect(&client, "pool").await.expect("the record");
    assert_eq!((view.capacity, view.permits.len()), (Some(2), 0));
}

#[tokio::test]
async fn a_permit_held_after_its_record_was_lost_is_still_shown_and_counted() {
    let server = RedisServer::start();
    let client = client(&server);
    let _low = client.semaphore("lost", 5).await.expect("free");
    let _mid = client.semaphore("lost", 5).await.expect("free");
    let high = client.semaphore("lost", 5).await.expect("free");
    assert_eq!(high.slot(), Some(2));
    let keys = keys(&client, "lost");
    let _ = server.cmd(&["DEL", &keys.capacity]);
    let view = inspect(&client, "lost").await.expect("permits are held");
    assert_eq!((view.capacity, view.width), (None, 3));
    // Set again, the capacity's width covers the highest held slot, record or not.
    let change = client
        .backend()
        .set_semaphore_capacity(&purpose(), &ResourceDigest::of("lost"), 1)
        .await
        .expect("set");
    assert_eq!(
        (change.previous, change.capacity, change.width, change.held),
        (None, 1, 3, 3)
    );
}

#[tokio::test]
async fn break_permit_removes_one_slot_keeps_the_fence_counter_and_wakes_a_waiter() {
    let server = RedisServer::start();
    let client = client(&server);
    let backend = client.backend();
    let resource = ResourceDigest::of("stuck");
    // A holder that stopped renewing long ago, as far as anyone knows: a long TTL, no
    // watchdog needed to keep it.
    let stuck = client
        .semaphore("stuck", 1)
        .ttl(Duration::from_secs(60))
        .await
        .expect("free");
    let keys = keys(&client, "stuck");
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            let permit = client
                .semaphore("stuck", 1)
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
    let counter = || -> u64 {
        server
            .cmd(&["GET", &keys.fence_counter])
            .as_string()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    };
    let before = counter();
    assert!(before >= stuck.fence().get());
    // A free slot: nothing to remove.
    assert_eq!(
        backend
            .break_permit(&purpose(), &resource, 3)
            .await
            .unwrap(),
        None
    );
    let broken_at = Instant::now();
    let removed = backend
        .break_permit(&purpose(), &resource, 0)
        .await
        .expect("broken")
        .expect("a permit was there");
    assert_eq!(removed.fence, Some(stuck.fence()));
    // The fence counter stays (the waiter, woken, may already have moved it on): never back.
    assert!(counter() >= before, "the fence counter stays");
    // Woken by the announcement: its next timer is 10 s away (a third of its heartbeat).
    let (next, at) = waiter.await.expect("task");
    let next = next.expect("the freed slot");
    assert!(
        at - broken_at < Duration::from_secs(2),
        "{:?}",
        at - broken_at
    );
    assert_eq!(next.slot(), Some(0));
    assert!(next.fence() > stuck.fence());
    // The old holder learns at its next renewal; its release finds another grant.
    assert_eq!(stuck.release().await, ReleaseOutcome::NotOwner);
    let _ = next.release().await;

    // A slot's key that leasehold did not write is left alone.
    let _ = server.cmd(&["HSET", &keys.slot(5), "f", "v"]);
    match backend.break_permit(&purpose(), &resource, 5).await {
        Err(Error::Unavailable(u)) => assert_eq!(
            u.cause,
            UnavailableCause::UnusableKey(UnusableKey::LeaseWrongType)
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        server.cmd(&["TYPE", &keys.slot(5)]).as_string().as_deref(),
        Some("hash")
    );
}

#[tokio::test]
async fn lowering_the_capacity_keeps_every_holder_and_admits_nobody_until_fewer_hold() {
    let server = RedisServer::start();
    let client = client(&server);
    let backend = client.backend();
    let resource = ResourceDigest::of("narrow");
    let a = client.semaphore("narrow", 3).await.expect("free");
    let b = client.semaphore("narrow", 3).await.expect("free");
    let c = client.semaphore("narrow", 3).await.expect("free");
    assert_eq!(c.slot(), Some(2));
    let change = backend
        .set_semaphore_capacity(&purpose(), &resource, 1)
        .await
        .expect("set");
    assert_eq!(
        (
            change.previous,
            change.capacity,
            change.width,
            change.held,
            change.woke_waiters
        ),
        (Some(3), 1, 3, 3, false)
    );
    let keys = keys(&client, "narrow");
    assert_eq!(
        server.cmd(&["GET", &keys.capacity]).as_string().as_deref(),
        Some("1 3")
    );
    // The record lives the counter idle expiry (7 days by default) from now, as after an
    // acquire.
    let pttl = server.cmd(&["PTTL", &keys.capacity]).as_int().unwrap();
    assert!(
        pttl > 7 * 86_400_000 - 60_000 && pttl <= 7 * 86_400_000,
        "{pttl}"
    );
    // Every holder keeps its slot: renewals act on the slot's key alone.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!a.is_lost() && !b.is_lost() && !c.is_lost());
    // The old capacity is refused now; the new one is not admitted while 3 (then 1) hold.
    match client.semaphore("narrow", 3).await {
        Err(LockError::CapacityMismatch { recorded }) => assert_eq!(recorded, 1),
        other => panic!("{other:?}"),
    }
    let full = |client: &RedisLeases| {
        let client = client.clone();
        async move { client.semaphore("narrow", 1).await }
    };
    assert!(matches!(full(&client).await, Err(LockError::Contended(_))));
    assert_eq!(a.release().await, ReleaseOutcome::Released);
    assert_eq!(b.release().await, ReleaseOutcome::Released);
    // Slot 0 is free, but one holder (above the capacity) is left: still full.
    assert!(matches!(full(&client).await, Err(LockError::Contended(_))));
    assert_eq!(c.release().await, ReleaseOutcome::Released);
    let admitted = full(&client).await.expect("fewer than the capacity hold");
    assert_eq!(admitted.slot(), Some(0));
    // No slot above the capacity is held any more: the width is back to the capacity.
    assert_eq!(
        server.cmd(&["GET", &keys.capacity]).as_string().as_deref(),
        Some("1 1")
    );
    let _ = admitted.release().await;
}

#[tokio::test]
async fn the_record_set_lives_the_counter_idle_expiry_of_the_settings() {
    let server = RedisServer::start();
    let idle = Duration::from_secs(90);
    let client = common::client_with(
        &server,
        RedisSettings::default()
            .with_counter_idle_expiry(idle)
            .unwrap(),
    );
    client
        .backend()
        .set_semaphore_capacity(&purpose(), &ResourceDigest::of("short"), 2)
        .await
        .expect("set");
    let pttl = server
        .cmd(&["PTTL", &keys(&client, "short").capacity])
        .as_int()
        .unwrap();
    assert!(pttl > 80_000 && pttl <= 90_000, "{pttl}");
}

#[tokio::test]
async fn raising_the_capacity_wakes_a_waiter_at_once_and_admits_the_new_capacity() {
    let server = RedisServer::start();
    let client = client(&server);
    let backend = client.backend();
    let resource = ResourceDigest::of("wide");
    let holder = client
        .semaphore("wide", 1)
        .ttl(Duration::from_secs(30))
        .await
        .expect("free");
    let keys = keys(&client, "wide");
    // No one waits: nothing to announce.
    let same = backend
        .set_semaphore_capacity(&purpose(), &resource, 1)
        .await
        .expect("set");
    assert_eq!((same.previous, same.woke_waiters), (Some(1), false));
    // A waiter through the explicit API, as `leasehold run --capacity 1 --wait` waits.
    let request = client
        .request(
            purpose(),
            resource.clone(),
            client
                .new_attempt(OperationId::new("waiter").unwrap())
                .unwrap(),
            Duration::from_secs(30),
        )
        .unwrap()
        .with_capacity(1)
        .unwrap()
        .with_queue_heartbeat(Duration::from_secs(30))
        .unwrap()
        .with_wait_timeout(Duration::from_secs(20))
        .unwrap();
    let waiter = {
        let (client, request) = (client.clone(), request.clone());
        tokio::spawn(async move {
            let outcome = client.acquire(&request).await;
            (outcome, Instant::now())
        })
    };
    eventually(Duration::from_secs(5), "the waiter takes its place", || {
        queued(&server, &keys) == 1
    })
    .await;
    let raised_at = Instant::now();
    let change = backend
        .set_semaphore_capacity(&purpose(), &resource, 2)
        .await
        .expect("set");
    assert_eq!(
        (
            change.previous,
            change.capacity,
            change.width,
            change.woke_waiters
        ),
        (Some(1), 2, 2, true)
    );
    // Its next timer is 10 s away: only the announcement explains a try this soon. It asked
    // for the old capacity, and learns the new one.
    let (outcome, at) = waiter.await.expect("task");
    assert!(
        at - raised_at < Duration::from_secs(2),
        "{:?}",
        at - raised_at
    );
    match outcome {
        AcquireOutcome::CapacityMismatch { recorded } => assert_eq!(recorded, 2),
        other => panic!("{other}"),
    }
    // Its place in the queue is given back (the wait does not, on a mismatch: it would keep
    // later waiters out until its heartbeat lapsed), as `leasehold run` gives it back.
    let _ = client.release_attempt(&request).await;
    assert_eq!(queued(&server, &keys), 0);
    // Asked for with the new capacity, the second slot is granted beside the holder.
    let second = client.semaphore("wide", 2).await.expect("room for two");
    assert_eq!(second.slot(), Some(1));
    assert!(!holder.is_lost());
    let _ = second.release().await;
    let _ = holder.release().await;
}

#[tokio::test]
async fn a_capacity_out_of_range_or_a_foreign_record_writes_nothing() {
    let server = RedisServer::start();
    let client = client(&server);
    let backend = client.backend();
    let resource = ResourceDigest::of("odd");
    for bad in [0, leasehold_redis::leasehold::request::MAX_CAPACITY + 1] {
        let refused = backend
            .set_semaphore_capacity(&purpose(), &resource, bad)
            .await;
        assert!(
            matches!(refused, Err(Error::InvalidSetting(_))),
            "{refused:?}"
        );
    }
    assert!(server.keys().is_empty(), "nothing was sent");
    let keys = keys(&client, "odd");
    for foreign in ["three", "5 9999"] {
        let _ = server.cmd(&["SET", &keys.capacity, foreign]);
        let refused = backend
            .set_semaphore_capacity(&purpose(), &resource, 2)
            .await;
        match refused {
            Err(Error::Unavailable(u)) => assert_eq!(
                u.cause,
                UnavailableCause::UnusableKey(UnusableKey::SemaphoreForeignValue)
            ),
            other => panic!("{foreign}: {other:?}"),
        }
        assert_eq!(
            server.cmd(&["GET", &keys.capacity]).as_string().as_deref(),
            Some(foreign)
        );
        let inspected = backend.inspect_semaphore(&purpose(), &resource).await;
        assert!(
            matches!(inspected, Err(Error::Unavailable(_))),
            "{inspected:?}"
        );
    }
    // With no semaphore there, the record is made: the first permits ask for it.
    let _ = server.cmd(&["DEL", &keys.capacity]);
    let made = backend
        .set_semaphore_capacity(&purpose(), &resource, 4)
        .await
        .expect("set");
    assert_eq!((made.previous, made.width, made.held), (None, 4, 0));
    match client.semaphore("odd", 2).await {
        Err(LockError::CapacityMismatch { recorded }) => assert_eq!(recorded, 4),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn list_semaphores_finds_every_semaphore_of_the_namespace_and_nothing_else() {
    let server = RedisServer::start();
    let client = client(&server);
    let backend = client.backend();
    let _a = client.semaphore("exports", 2).await.expect("free");
    let _b = client.semaphore("exports", 2).await.expect("free");
    let _c = client
        .semaphore("imports", 3)
        .purpose(Purpose::new("batch").unwrap())
        .await
        .expect("free");
    // A lease of the same name, a released semaphore's record and another namespace are
    // not listed as held permits.
    let _lease = client.lock("exports").await.expect("free");
    let done = client.semaphore("done", 1).await.expect("free");
    let _ = done.release().await;
    let other = common::client_with(
        &server,
        RedisSettings::default().with_namespace("other").unwrap(),
    );
    let _elsewhere = other.semaphore("exports", 2).await.expect("free");
    let foreign = keys(&client, "foreign");
    let _ = server.cmd(&["SET", &foreign.capacity, "not a record"]);

    let listed = backend.list_semaphores(None).await.expect("listed");
    let summary: Vec<(String, String, Option<usize>)> = listed
        .iter()
        .map(|s| {
            let held = match &s.state {
                ListedSemaphoreState::Found(view) => Some(view.permits.len()),
                _ => None,
            };
            (s.purpose.to_string(), s.resource.to_string(), held)
        })
        .collect();
    let digest = |name: &str| ResourceDigest::of(name).to_string();
    let mut expected = vec![
        ("batch".to_owned(), digest("imports"), Some(1)),
        ("lock".to_owned(), digest("done"), Some(0)),
        ("lock".to_owned(), digest("exports"), Some(2)),
        ("lock".to_owned(), digest("foreign"), None),
    ];
    expected.sort();
    assert_eq!(summary, expected);
    let foreign = listed
        .iter()
        .find(|s| s.resource == ResourceDigest::of("foreign"))
        .unwrap();
    assert_eq!(
        foreign.state,
        ListedSemaphoreState::Unusable(UnusableKey::SemaphoreForeignValue)
    );
    let batch = backend
        .list_semaphores(Some(&Purpose::new("batch").unwrap()))
        .await
        .expect("listed");
    assert_eq!(batch.len(), 1);
    assert_eq!(batch[0].resource, ResourceDigest::of("imports"));
}

#[tokio::test]
async fn on_a_cluster_every_master_is_listed_and_a_growth_is_announced_sharded() {
    let cluster = test_support::RedisCluster::start(3);
    let client = leasehold_redis::RedisBackend::open_cluster(&cluster.urls(), common::settings())
        .unwrap()
        .into_client();
    let backend = client.backend();
    let mut held = Vec::new();
    let mut on_nodes = std::collections::BTreeSet::new();
    for i in 0..12 {
        let name = format!("s{i}");
        on_nodes.insert(cluster.index_for_key(&keys(&client, &name).capacity));
        held.push(client.semaphore(&name, 1).await.expect("free"));
    }
    assert_eq!(on_nodes.len(), 3, "12 semaphores spread over every node");
    let listed = backend.list_semaphores(None).await.expect("listed");
    assert_eq!(listed.len(), 12, "{listed:?}");
    // A waiter on one of them, woken by a growth announced with SPUBLISH on its node.
    let request = client
        .request(
            purpose(),
            ResourceDigest::of("s0"),
            client
                .new_attempt(OperationId::new("waiter").unwrap())
                .unwrap(),
            Duration::from_secs(30),
        )
        .unwrap()
        .with_capacity(1)
        .unwrap()
        .with_queue_heartbeat(Duration::from_secs(30))
        .unwrap()
        .with_wait_timeout(Duration::from_secs(20))
        .unwrap();
    let waiter = {
        let (client, request) = (client.clone(), request.clone());
        tokio::spawn(async move {
            let outcome = client.acquire(&request).await;
            (outcome, Instant::now())
        })
    };
    let queue = keys(&client, "s0").queue;
    eventually(Duration::from_secs(5), "the waiter takes its place", || {
        cluster
            .node_for_key(&queue)
            .cmd(&["ZCARD", &queue])
            .as_int()
            == Some(1)
    })
    .await;
    let raised_at = Instant::now();
    let change = backend
        .set_semaphore_capacity(&purpose(), &ResourceDigest::of("s0"), 2)
        .await
        .expect("set");
    assert!(change.woke_waiters);
    let (outcome, at) = waiter.await.expect("task");
    assert!(
        matches!(outcome, AcquireOutcome::CapacityMismatch { recorded: 2 }),
        "{outcome}"
    );
    assert!(
        at - raised_at < Duration::from_secs(2),
        "{:?}",
        at - raised_at
    );
    let _ = client.release_attempt(&request).await;
    let removed = backend
        .break_permit(&purpose(), &ResourceDigest::of("s1"), 0)
        .await
        .expect("broken")
        .expect("a permit");
    assert_eq!(removed.fence, Some(held[1].fence()));
}
