//! TLS and ACL on real redis-server: leases over `rediss://` with a private CA, refusals
//! typed as not applied, and credentials that never show.

mod common;

use std::time::Duration;

use common::request;
use leasehold_redis::leasehold::{AcquireOutcome, ReleaseOutcome, UnavailableCause};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings};
use test_support::{RedisServer, TlsRedisServer};

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
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    assert!(
        server.keys().iter().all(|k| k.ends_with(":fence")),
        "{:?}",
        server.keys()
    );
}
