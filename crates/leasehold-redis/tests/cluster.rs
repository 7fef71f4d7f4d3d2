//! Leases on a real Redis Cluster (3 masters on loopback): scripts routed to the slot's node,
//! releases announced by sharded pub/sub on that node only, redirects typed as not applied.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::request;
use leasehold_redis::leasehold::{
    AcquireOutcome, InspectOutcome, LeaseHandle, LeaseRequest, ReleaseOutcome, UnavailableCause,
};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings};
use test_support::{RedisCluster, RedisServer, Reply};

fn cluster_client(cluster: &RedisCluster) -> RedisLeases {
    RedisBackend::open_cluster(&cluster.urls(), RedisSettings::default())
        .expect("valid seeds")
        .into_client()
}

/// The first resource name (`{prefix}0`, `{prefix}1`, …) whose lease lands on node `index`.
fn resource_on(cluster: &RedisCluster, client: &RedisLeases, prefix: &str, index: usize) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}{i}"))
        .find(|name| {
            let probe = request(client, name, "probe", Duration::from_secs(1));
            cluster.index_for_key(&common::lease_key(client, &probe)) == index
        })
        .expect("some resource hashes to every node")
}

fn release_channel(client: &RedisLeases, req: &LeaseRequest) -> String {
    client
        .backend()
        .keys()
        .release_channel(req.purpose(), req.resource())
}

#[tokio::test]
async fn leases_live_on_the_node_that_owns_their_slot() {
    let cluster = RedisCluster::start(3);
    let client = cluster_client(&cluster);
    client.backend().warm_up().await.expect("warm-up");
    for index in 0..3 {
        let resource = resource_on(&cluster, &client, "orders/", index);
        let holder = request(&client, &resource, "op-a", Duration::from_secs(10));
        let lease = match client.try_acquire(&holder).await {
            AcquireOutcome::Acquired(lease) => lease,
            other => panic!("node {index}: expected Acquired, got {other:?}"),
        };
        let key = common::lease_key(&client, &holder);
        for (j, node) in cluster.nodes().iter().enumerate() {
            let keys = node.keys();
            let here = keys.contains(&key) && keys.contains(&format!("{key}:fence"));
            assert_eq!(here, j == index, "node {j} keys {keys:?}");
            assert!(keys.iter().all(|k| !k.contains("orders/")), "{keys:?}");
        }
        let other = request(&client, &resource, "op-b", Duration::from_secs(10));
        match client.try_acquire(&other).await {
            AcquireOutcome::Contended(c) => {
                assert!(c.retry_after > Duration::from_secs(5), "{c:?}");
                assert_eq!(c.fence, Some(lease.fence()));
            }
            other => panic!("node {index}: expected Contended, got {other:?}"),
        }
        assert!(lease.renew().await.is_renewed());
        assert!(matches!(
            client
                .inspect(holder.purpose(), holder.resource(), Some(holder.attempt()))
                .await,
            InspectOutcome::HeldByThisAttempt(_)
        ));
        // A fenced record shares the lease's slot: the script may touch it on that node.
        let record = leasehold_redis::RecordName::new("state").unwrap();
        let written = client
            .backend()
            .fenced_write(
                holder.purpose(),
                holder.resource(),
                &record,
                lease.fence(),
                b"x",
            )
            .await;
        assert_eq!(written, leasehold_redis::FencedWrite::Written);
        let record_key =
            client
                .backend()
                .keys()
                .record_key(holder.purpose(), holder.resource(), &record);
        assert!(cluster.nodes()[index].keys().contains(&record_key));
        assert_eq!(lease.release().await, ReleaseOutcome::Released);
        assert_eq!(
            client
                .inspect(holder.purpose(), holder.resource(), None)
                .await,
            InspectOutcome::Free
        );
    }
}

/// A holder with a 10 s lease on node `index`, and a waiter (8 s wait) parked behind it,
/// shard-subscribed on that node, and refused once (so the release is announced).
async fn hold_and_wait(
    cluster: &RedisCluster,
    client: &RedisLeases,
    index: usize,
) -> (String, LeaseHandle<RedisBackend>, common::Waiting) {
    let resource = resource_on(cluster, client, "jobs/", index);
    let holder = request(client, &resource, "op-a", Duration::from_secs(10));
    let first = client.acquire(&holder).await.into_handle().expect("free");
    let waiter = request(client, &resource, "op-b", Duration::from_secs(10))
        .with_wait_timeout(Duration::from_secs(8))
        .unwrap();
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { (client.acquire(&waiter).await, Instant::now()) })
    };
    let channel = release_channel(client, &holder);
    common::until_shard_subscribed(&cluster.nodes()[index], &channel).await;
    common::until_marked(&cluster.nodes()[index], &common::lease_key(client, &holder)).await;
    (channel, first, waiting)
}

fn stats(cluster: &RedisCluster) -> Vec<BTreeMap<String, u64>> {
    cluster
        .nodes()
        .iter()
        .map(RedisServer::commandstats)
        .collect()
}

#[tokio::test]
async fn a_release_is_announced_by_spublish_on_the_slot_owner_only() {
    let cluster = RedisCluster::start(3);
    let client = cluster_client(&cluster);
    let owner = 1;
    let (channel, first, waiting) = hold_and_wait(&cluster, &client, owner).await;
    for (j, node) in cluster.nodes().iter().enumerate() {
        if j != owner {
            assert_eq!(common::shard_subscribers(node, &channel), 0, "node {j}");
        }
    }
    let before = stats(&cluster);
    // The holder's TTL was 10 s.
    common::release_and_expect_hand_off(first, waiting, Duration::from_secs(2)).await;
    let after = stats(&cluster);
    for (j, (before, after)) in before.iter().zip(&after).enumerate() {
        let delta = common::delta(before, after);
        let count = |name: &str| delta.get(name).copied().unwrap_or(0);
        assert_eq!(
            count("publish"),
            0,
            "node {j}: classic PUBLISH used {delta:?}"
        );
        if j == owner {
            assert_eq!(count("spublish"), 1, "node {j}: {delta:?}");
            assert!(count("evalsha") >= 2, "node {j}: {delta:?}");
        } else {
            assert_eq!(count("spublish"), 0, "node {j}: {delta:?}");
            assert_eq!(count("evalsha"), 0, "node {j}: {delta:?}");
        }
    }
}

#[tokio::test]
async fn a_killed_shard_subscriber_resubscribes_and_still_hands_off() {
    let cluster = RedisCluster::start(3);
    let client = cluster_client(&cluster);
    let owner = 2;
    let (channel, first, waiting) = hold_and_wait(&cluster, &client, owner).await;
    let node = &cluster.nodes()[owner];
    let killed = node.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]).as_int();
    assert_eq!(killed, Some(1));
    // The subscriber's link to that node comes back on its own and subscribes again.
    common::until_shard_subscribed(node, &channel).await;
    // The holder's TTL was 10 s.
    common::release_and_expect_hand_off(first, waiting, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_redirect_is_not_applied_and_a_later_try_reaches_the_new_owner() {
    let cluster = RedisCluster::start(3);
    let client = cluster_client(&cluster);
    client.backend().warm_up().await.expect("warm-up");
    let resource = resource_on(&cluster, &client, "moved/", 0);
    let req = request(&client, &resource, "op-a", Duration::from_secs(10));
    let key = common::lease_key(&client, &req);
    let slot = cluster.slot(&key).to_string();
    // Move the (empty) slot from node 0 to node 1 behind the client's back: its slot map is
    // now stale, and its next command for this key meets MOVED.
    let target = cluster.nodes()[1]
        .cmd(&["CLUSTER", "MYID"])
        .as_string()
        .expect("a node id");
    for node in [
        &cluster.nodes()[1],
        &cluster.nodes()[0],
        &cluster.nodes()[2],
    ] {
        assert_eq!(
            node.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &target]),
            Reply::Status("OK".into())
        );
    }
    let mut redirects = 0;
    let lease = loop {
        match client.try_acquire(&req).await {
            AcquireOutcome::Acquired(lease) => break lease,
            AcquireOutcome::Unavailable(u) => {
                assert_eq!(u.cause, UnavailableCause::Redirected, "{u}");
                // Not applied means not applied: no node has the key.
                for node in cluster.nodes() {
                    assert!(!node.keys().contains(&key));
                }
                redirects += 1;
                assert!(redirects < 100, "still redirected after 100 tries");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("expected Acquired or a redirect, got {other:?}"),
        }
    };
    assert!(redirects >= 1, "the stale slot map was never used");
    assert!(cluster.nodes()[1].keys().contains(&key));
    assert!(!cluster.nodes()[0].keys().contains(&key));
    assert_eq!(
        cluster.nodes()[1]
            .cmd(&["GET", &format!("{key}:fence")])
            .as_string(),
        Some(lease.fence().to_string())
    );
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
}

#[test]
fn a_cluster_needs_a_seed_and_parsable_urls() {
    let none: [&str; 0] = [];
    assert!(RedisBackend::open_cluster(&none, RedisSettings::default()).is_err());
    let err = RedisBackend::open_cluster(&["redis://:secret@[bad"], RedisSettings::default())
        .expect_err("bad URL");
    assert!(!err.to_string().contains("secret"), "{err}");
    // WAIT has no key: the cluster client could not send it to the script's node.
    let gated = RedisSettings::default()
        .with_replication(1, Duration::from_millis(50))
        .unwrap();
    let err = RedisBackend::open_cluster(&["redis://127.0.0.1:7000"], gated).expect_err("gated");
    assert_eq!(err.kind(), leasehold_redis::ErrorKind::Unsupported);
}

#[tokio::test]
async fn one_url_names_the_cluster_by_its_seeds() {
    let cluster = RedisCluster::start(3);
    let hosts: Vec<String> = cluster
        .urls()
        .iter()
        .map(|url| url.trim_start_matches("redis://").to_owned())
        .collect();
    let url = format!("redis+cluster://{}", hosts.join(","));
    let client = RedisBackend::open(&url, RedisSettings::default())
        .expect("a cluster URL")
        .into_client();
    // One lease on each node: the URL reached the whole cluster, not one seed.
    for index in 0..3 {
        let resource = resource_on(&cluster, &client, "url/", index);
        let holder = request(&client, &resource, "op-a", Duration::from_secs(10));
        let lease = match client.try_acquire(&holder).await {
            AcquireOutcome::Acquired(lease) => lease,
            other => panic!("node {index}: expected Acquired, got {other:?}"),
        };
        let key = common::lease_key(&client, &holder);
        assert!(cluster.nodes()[index].keys().contains(&key));
        assert_eq!(lease.release().await, ReleaseOutcome::Released);
    }
}

/// A semaphore's and a read/write lease's keys all live on the node of their hash tag: the
/// scripts build slot keys from the prefix they are given, and the Cluster routes them all to
/// that one node; a release with a waiter is announced by SPUBLISH there.
#[tokio::test]
async fn a_semaphore_and_a_read_write_lease_keep_every_key_on_one_node() {
    let cluster = RedisCluster::start(3);
    let client = cluster_client(&cluster);
    client.backend().warm_up().await.expect("warm-up");
    let purpose = leasehold_redis::leasehold::Purpose::new("lock").unwrap();
    for name in ["exports", "gpu", "catalog"] {
        let digest = leasehold_redis::leasehold::ResourceDigest::of(name);
        let keys = client.backend().keys().semaphore(&purpose, &digest);
        let home = cluster.index_for_key(&keys.capacity);
        let a = client.semaphore(name, 2).await.expect("free");
        let b = client.semaphore(name, 2).await.expect("free");
        assert_ne!(a.slot(), b.slot());
        let waiting = {
            let client = client.clone();
            let name = name.to_owned();
            tokio::spawn(async move {
                let permit = client
                    .semaphore(&name, 2)
                    .queue_heartbeat(Duration::from_secs(30))
                    .wait(Duration::from_secs(10))
                    .await;
                (permit, Instant::now())
            })
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while cluster.nodes()[home].cmd(&["ZCARD", &keys.queue]).as_int() != Some(1) {
            assert!(Instant::now() < deadline, "the waiter never took its place");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for (j, node) in cluster.nodes().iter().enumerate() {
            let here: Vec<String> = node
                .keys()
                .into_iter()
                .filter(|k| k.contains(":sem:") && k.contains(digest.as_str()))
                .collect();
            if j == home {
                for key in [
                    &keys.capacity,
                    &keys.fence_counter,
                    &keys.queue,
                    &keys.heartbeats,
                ] {
                    assert!(here.contains(key), "node {j}: {key} not in {here:?}");
                }
                assert!(here.contains(&keys.slot(a.slot().unwrap())), "{here:?}");
            } else {
                assert!(here.is_empty(), "node {j}: {here:?}");
            }
        }
        let released_at = Instant::now();
        assert_eq!(a.release().await, ReleaseOutcome::Released);
        let (permit, at) = waiting.await.expect("task");
        let permit = permit.expect("handed on");
        // Its next try was 10 s away: the SPUBLISH on the home node woke it.
        assert!(
            at - released_at < Duration::from_secs(3),
            "{:?}",
            at - released_at
        );
        // A renewal on a Cluster goes by itself, to the slot key's node.
        assert!(permit.handle().renew().await.is_renewed());
        let _ = permit.release().await;
        let _ = b.release().await;

        let rw = client.backend().keys().read_write(&purpose, &digest);
        let writer = client.write_lock(name).await.expect("free");
        let rw_home = cluster.index_for_key(&rw.writer());
        assert!(cluster.nodes()[rw_home].keys().contains(&rw.writer()));
        let reader = writer.downgrade().await.expect("downgraded");
        assert!(
            cluster.nodes()[rw_home]
                .keys()
                .contains(&rw.slot(reader.slot().unwrap()))
        );
        assert_eq!(reader.release().await, ReleaseOutcome::Released);
    }
}
