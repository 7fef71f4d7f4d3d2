//! An operator's commands on real servers: listing the leases of a namespace (SCAN, on every
//! master of a Cluster) and breaking a stuck one, whose fence counter stays so that the old
//! holder's late fenced writes are still rejected.

mod common;

use std::time::Duration;

use common::{client, request};
use leasehold_redis::leasehold::{
    AcquireOutcome, HolderName, LeaseRequest, Purpose, RenewOutcome, ResourceDigest,
};
use leasehold_redis::{
    FencedWrite, ListedState, RecordName, RedisBackend, RedisLeases, RedisSettings,
};
use test_support::{RedisCluster, RedisServer};

const TTL: Duration = Duration::from_secs(30);

fn named(client: &RedisLeases, purpose: &str, resource: &str, name: &str) -> LeaseRequest {
    let attempt = client
        .new_attempt(leasehold_redis::leasehold::OperationId::new("op").unwrap())
        .unwrap();
    client
        .request(
            Purpose::new(purpose).unwrap(),
            ResourceDigest::of(resource),
            attempt,
            TTL,
        )
        .unwrap()
        .with_holder_name(HolderName::new(name).unwrap())
}

#[tokio::test]
async fn list_shows_every_lease_of_the_namespace_and_nothing_else() {
    let server = RedisServer::start();
    let client = client(&server);
    let mut _held = Vec::new();
    for (purpose, resource, name) in [
        ("billing", "orders/1", "host-1:11"),
        ("billing", "orders/2", "host-2:22"),
        ("reports", "monthly", "host-3:33"),
    ] {
        let req = named(&client, purpose, resource, name);
        _held.push(client.try_acquire(&req).await.into_handle().expect("free"));
    }
    // A released lease leaves its fence counter: neither it nor another namespace is listed.
    let gone = client
        .try_acquire(&request(&client, "released", "op", TTL))
        .await
        .into_handle()
        .expect("free");
    let _ = gone.release().await;
    let other_ns = common::client_with(
        &server,
        RedisSettings::default().with_namespace("other").unwrap(),
    );
    let _elsewhere = other_ns
        .try_acquire(&request(&other_ns, "orders/1", "op", TTL))
        .await
        .into_handle()
        .expect("free");

    let all = client.backend().list(None).await.expect("listed");
    let mut shown: Vec<(String, String, Option<String>)> = all
        .iter()
        .map(|lease| {
            let ListedState::Held(view) = &lease.state else {
                panic!("{lease:?}");
            };
            (
                lease.purpose.to_string(),
                lease.resource.to_string(),
                view.holder_name.as_ref().map(|n| n.as_str().to_owned()),
            )
        })
        .collect();
    let mut expected = vec![
        ("billing", "orders/1", "host-1:11"),
        ("billing", "orders/2", "host-2:22"),
        ("reports", "monthly", "host-3:33"),
    ]
    .into_iter()
    .map(|(p, r, n)| {
        (
            p.to_owned(),
            ResourceDigest::of(r).to_string(),
            Some(n.to_owned()),
        )
    })
    .collect::<Vec<_>>();
    expected.sort();
    shown.sort();
    assert_eq!(shown, expected);
    // Sorted by purpose, then digest; each with its fence and time left.
    assert!(
        all.windows(2)
            .all(|w| (w[0].purpose.as_str(), w[0].resource.as_str())
                <= (w[1].purpose.as_str(), w[1].resource.as_str()))
    );
    for lease in &all {
        let ListedState::Held(view) = &lease.state else {
            unreachable!("checked above")
        };
        assert!(view.server_ttl.is_some_and(|t| t > Duration::from_secs(20)));
        assert!(view.fence.is_some());
    }
    let billing = client
        .backend()
        .list(Some(&Purpose::new("billing").unwrap()))
        .await
        .expect("listed");
    assert_eq!(billing.len(), 2);
    assert!(billing.iter().all(|l| l.purpose.as_str() == "billing"));
    // A key of another type where a lease would be is no lease: SCAN ... TYPE string leaves
    // it out (inspect would call it unusable).
    let broken = named(&client, "billing", "orders/3", "x");
    let key = common::lease_key(&client, &broken);
    server.cmd(&["HSET", &key, "f", "v"]);
    let billing = client
        .backend()
        .list(Some(&Purpose::new("billing").unwrap()))
        .await
        .expect("listed");
    assert_eq!(billing.len(), 2, "{billing:?}");
}

#[tokio::test]
async fn a_broken_lease_is_free_and_its_old_holders_writes_are_still_rejected() {
    let server = RedisServer::start();
    let client = client(&server);
    let old = named(&client, "jobs", "nightly", "host-1:11");
    let stuck = client.try_acquire(&old).await.into_handle().expect("free");
    let record = RecordName::new("state").unwrap();
    let write = |fence, data: &'static [u8]| {
        let backend = client.backend();
        let (purpose, resource) = (old.purpose().clone(), old.resource().clone());
        let record = record.clone();
        async move {
            backend
                .fenced_write(&purpose, &resource, &record, fence, data)
                .await
        }
    };
    assert_eq!(write(stuck.fence(), b"old").await, FencedWrite::Written);

    let removed = client
        .backend()
        .break_lease(old.purpose(), old.resource())
        .await
        .expect("broken")
        .expect("there was a lease");
    assert_eq!(removed.fence, Some(stuck.fence()));
    assert_eq!(
        removed.holder_name.as_ref().map(HolderName::as_str),
        Some("host-1:11")
    );
    assert_eq!(removed.holder, Some(old.attempt().fingerprint()));
    // Free now, the fence counter kept: the next grant's fence is higher.
    let next = named(&client, "jobs", "nightly", "host-2:22");
    let newer = match client.try_acquire(&next).await {
        AcquireOutcome::Acquired(lease) => lease,
        other => panic!("expected Acquired after the break, got {other:?}"),
    };
    assert!(newer.fence() > stuck.fence());
    assert_eq!(write(newer.fence(), b"new").await, FencedWrite::Written);
    // The old holder, still running, writes late: rejected.
    assert_eq!(
        write(stuck.fence(), b"late").await,
        FencedWrite::Stale {
            current: newer.fence()
        }
    );
    // And its next renewal tells it the lease is gone.
    assert!(matches!(stuck.renew().await, RenewOutcome::Lost(_)));
    // Breaking a free lease removes nothing and says so.
    let _ = newer.release().await;
    assert_eq!(
        client
            .backend()
            .break_lease(old.purpose(), old.resource())
            .await
            .expect("answered"),
        None
    );
}

#[tokio::test]
async fn a_cluster_lists_the_leases_of_every_master_and_breaks_on_the_right_one() {
    let cluster = RedisCluster::start(3);
    let client = RedisBackend::open_cluster(&cluster.urls(), RedisSettings::default())
        .unwrap()
        .into_client();
    let mut handles = Vec::new();
    let mut on_nodes = std::collections::BTreeSet::new();
    for i in 0..24 {
        let req = named(&client, "jobs", &format!("r{i}"), &format!("h{i}"));
        on_nodes.insert(cluster.index_for_key(&common::lease_key(&client, &req)));
        handles.push((
            req.clone(),
            client.try_acquire(&req).await.into_handle().expect("free"),
        ));
    }
    assert_eq!(on_nodes.len(), 3, "24 leases spread over every node");
    let listed = client.backend().list(None).await.expect("listed");
    assert_eq!(listed.len(), 24, "{listed:?}");
    let (req, lease) = &handles[0];
    let removed = client
        .backend()
        .break_lease(req.purpose(), req.resource())
        .await
        .expect("broken")
        .expect("a lease");
    assert_eq!(removed.fence, Some(lease.fence()));
    assert_eq!(client.backend().list(None).await.expect("listed").len(), 23);
}
