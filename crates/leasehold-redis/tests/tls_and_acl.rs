//! TLS and ACL on real redis-server: leases over `rediss://` with a private CA, refusals
//! typed as not applied, and credentials that never show.

mod common;

use std::time::{Duration, Instant};

use common::request;
use leasehold_redis::leasehold::{AcquireOutcome, ReleaseOutcome, UnavailableCause};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings};
use test_support::{RedisCluster, RedisServer, TlsRedisServer};

const TTL: Duration = Duration::from_secs(10);

fn open(url: &str, settings: RedisSettings) -> RedisLeases {
    RedisBackend::open(url, settings)
        .expect("valid URL")
        .into_client()
}

#[tokio::test]
async fn leases_work_over_tls_with_a_private_ca() {
    let tls = TlsRedisServer::start();
    let settings = RedisSettings::default()
        .with_tls_root_certificates(tls.ca_pem().as_bytes().to_vec())
        .unwrap();
    let client = open(&tls.url(), settings);
    let req = request(&client, "t1", "op-a", TTL);
    let lease = match client.try_acquire(&req).await {
        AcquireOutcome::Acquired(lease) => lease,
        other => panic!("expected Acquired over TLS, got {other:?}"),
    };
    assert!(
        tls.server()
            .keys()
            .contains(&common::lease_key(&client, &req))
    );
    assert!(lease.renew().await.is_renewed());
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn an_untrusted_certificate_is_unavailable() {
    let tls = TlsRedisServer::start();
    // The system's trust store does not know the test CA: the handshake fails before any
    // command is sent, so nothing was applied.
    let client = open(&tls.url(), RedisSettings::default());
    let req = request(&client, "t2", "op-a", TTL);
    match client.try_acquire(&req).await {
        AcquireOutcome::Unavailable(u) => assert_ne!(u.cause, UnavailableCause::Redirected),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(tls.server().keys().is_empty());
}

fn server_with_users() -> RedisServer {
    RedisServer::start_with_args(&[
        "--user",
        "app",
        "on",
        ">s3cret-pass",
        "~leasehold:*",
        "&leasehold:*",
        "+@all",
        "--user",
        "elsewhere",
        "on",
        ">other-pass",
        "~other:*",
        "+@all",
    ])
}

#[tokio::test]
async fn acl_credentials_work_and_never_show() {
    let server = server_with_users();
    let port = server.port();
    let client = open(
        &format!("redis://app:s3cret-pass@127.0.0.1:{port}"),
        RedisSettings::default(),
    );
    let req = request(&client, "t3", "op-a", TTL);
    let lease = client.try_acquire(&req).await.into_handle().expect("free");
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    assert!(!format!("{:?}", client.backend()).contains("s3cret"));

    // A wrong password: refused before anything runs, and not repeated anywhere.
    let wrong = open(
        &format!("redis://app:wrong-pass@127.0.0.1:{port}"),
        RedisSettings::default(),
    );
    let req = request(&wrong, "t3", "op-b", TTL);
    match wrong.try_acquire(&req).await {
        AcquireOutcome::Unavailable(u) => {
            assert_eq!(u.cause, UnavailableCause::NoPermission, "{u}");
            assert!(!u.to_string().contains("wrong-pass"), "{u}");
        }
        other => panic!("expected Unavailable(NoPermission), got {other:?}"),
    }
    assert!(!format!("{:?}", wrong.backend()).contains("wrong-pass"));
}

#[tokio::test]
async fn a_user_without_access_to_the_keys_is_refused_not_unknown() {
    let server = server_with_users();
    let client = open(
        &format!("redis://elsewhere:other-pass@127.0.0.1:{}", server.port()),
        RedisSettings::default(),
    );
    let req = request(&client, "t4", "op-a", TTL);
    match client.try_acquire(&req).await {
        AcquireOutcome::Unavailable(u) => assert_eq!(u.cause, UnavailableCause::NoPermission),
        other => panic!("expected Unavailable(NoPermission), got {other:?}"),
    }
    assert!(server.keys().is_empty());
}

/// A user allowed the lease keys but no pub/sub channel (Redis 7's default for a new user):
/// the release deletes the key and then may not announce it. The announcement is a hint, so
/// the release is `Released`, never "not applied" for a key that is gone.
#[tokio::test]
async fn a_release_the_acl_forbids_announcing_is_still_released() {
    let server = RedisServer::start_with_args(&[
        "--user",
        "quiet",
        "on",
        ">quiet-pass",
        "~leasehold:*",
        "resetchannels",
        "+@all",
    ]);
    let client = open(
        &format!("redis://quiet:quiet-pass@127.0.0.1:{}", server.port()),
        RedisSettings::default(),
    );
    let req = request(&client, "t5", "op-a", TTL);
    let lease = client.try_acquire(&req).await.into_handle().expect("free");
    // Refused once, so that the release goes on to announce itself (D48), which the ACL
    // forbids.
    let waiter = request(&client, "t5", "op-b", TTL);
    assert!(matches!(
        client.try_acquire(&waiter).await,
        AcquireOutcome::Contended(_)
    ));
    let key = common::lease_key(&client, &req);
    assert!(common::is_marked(&server, &key));
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    // The announcement was tried, and refused: the ACL log names the channel.
    let channel = client
        .backend()
        .keys()
        .release_channel(req.purpose(), req.resource());
    let log = server.cmd(&["ACL", "LOG"]);
    let test_support::Reply::Array(Some(entries)) = &log else {
        panic!("ACL LOG replied {log:?}");
    };
    assert!(
        entries.iter().any(|entry| matches!(
            entry,
            test_support::Reply::Array(Some(fields))
                if fields.iter().any(|f| f.as_string().as_deref() == Some(channel.as_str()))
        )),
        "{log:?}"
    );
    assert!(
        server.keys().iter().all(|k| k.ends_with(":fence")),
        "{:?}",
        server.keys()
    );
}

/// A Cluster over TLS (client ports and bus), its certificates from a private CA: with the CA
/// trusted, a lease is granted on the node that owns its slot, and its release reaches a
/// waiter through the sharded subscriber, which connects over TLS too; without it, nothing is
/// written anywhere.
#[tokio::test]
async fn a_cluster_over_tls_trusts_the_private_ca() {
    let cluster = RedisCluster::start_tls(3);
    let hosts: Vec<String> = cluster
        .tls_urls()
        .iter()
        .map(|url| url.trim_start_matches("rediss://").to_owned())
        .collect();
    let url = format!("rediss+cluster://{}", hosts.join(","));
    let ca = cluster.ca_pem().expect("a TLS cluster").as_bytes().to_vec();
    let settings = RedisSettings::default()
        .with_tls_root_certificates(ca)
        .unwrap();
    let client = open(&url, settings);
    let holder = request(&client, "tls-cluster/1", "op-a", TTL);
    let first = match client.try_acquire(&holder).await {
        AcquireOutcome::Acquired(lease) => lease,
        other => panic!("expected Acquired on a TLS cluster, got {other:?}"),
    };
    let key = common::lease_key(&client, &holder);
    assert!(cluster.node_for_key(&key).keys().contains(&key));
    assert!(first.renew().await.is_renewed());

    let waiter = request(&client, "tls-cluster/1", "op-b", TTL)
        .with_wait_timeout(Duration::from_secs(8))
        .unwrap();
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { (client.acquire(&waiter).await, Instant::now()) })
    };
    let channel = client
        .backend()
        .keys()
        .release_channel(holder.purpose(), holder.resource());
    common::until_shard_subscribed(cluster.node_for_key(&key), &channel).await;
    common::until_marked(cluster.node_for_key(&key), &key).await;
    // The holder's TTL is 10 s: a hand-off well within it came from the release notice.
    common::release_and_expect_hand_off(first, waiting, Duration::from_secs(2)).await;

    let untrusted = open(&url, RedisSettings::default());
    let other = request(&untrusted, "tls-cluster/2", "op-a", TTL);
    match untrusted.try_acquire(&other).await {
        AcquireOutcome::Unavailable(_) => {}
        other => panic!("expected Unavailable without the CA, got {other:?}"),
    }
    let other_key = common::lease_key(&untrusted, &other);
    assert!(
        cluster
            .nodes()
            .iter()
            .all(|n| !n.keys().contains(&other_key))
    );
}
