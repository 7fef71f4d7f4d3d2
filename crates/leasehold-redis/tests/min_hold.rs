//! A minimum hold on real redis-server: the key stays at least the hold after the grant,
//! whatever the holder does (releases early, renews with a short TTL, dies), on a standalone
//! server and on a Cluster, and the stored value keeps its old form when no option is used.

mod common;

use std::time::{Duration, Instant};

use common::{client, lease_key, pttl, request};
use leasehold_redis::leasehold::{
    AcquireOutcome, InspectOutcome, LeaseRequest, LeaseState, LossCause, ReleaseOutcome,
    RenewOutcome,
};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings};
use test_support::{RedisCluster, RedisServer};

const TTL: Duration = Duration::from_secs(5);
const HOLD: Duration = Duration::from_millis(1500);

fn held(client: &RedisLeases, resource: &str, op: &str, ttl: Duration) -> LeaseRequest {
    request(client, resource, op, ttl)
        .with_min_hold(HOLD)
        .expect("a valid hold")
}

/// Tries `request` until it is granted, within `bound`; returns when it was granted.
async fn acquired_within(
    client: &RedisLeases,
    request: &LeaseRequest,
    bound: Duration,
) -> (
    leasehold_redis::leasehold::LeaseHandle<RedisBackend>,
    Instant,
) {
    let deadline = Instant::now() + bound;
    loop {
        match client.try_acquire(request).await {
            AcquireOutcome::Acquired(lease) => return (lease, Instant::now()),
            AcquireOutcome::Contended(c) => {
                assert!(Instant::now() < deadline, "still contended: {c}");
                tokio::time::sleep(c.retry_after.min(Duration::from_millis(50))).await;
            }
            other => panic!("expected Acquired or Contended, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_min_hold_keeps_a_second_caller_out_then_lets_it_in_with_a_higher_fence() {
    let server = RedisServer::start();
    let client = client(&server);
    let first = held(&client, "cron/nightly", "run-a", Duration::from_millis(300));
    let granted_at = Instant::now();
    let lease = client
        .try_acquire(&first)
        .await
        .into_handle()
        .expect("free");
    // The key lives for the hold, not the short TTL; the handle's validity is still the TTL's.
    let key = lease_key(&client, &first);
    let left = pttl(&server, &key);
    assert!(left > 300 && left <= 1500, "PTTL {left}");
    assert!(lease.remaining_validity() <= first.ttl() - first.drift());
    let fence = lease.fence();

    let second = request(&client, "cron/nightly", "run-b", TTL);
    match client.try_acquire(&second).await {
        AcquireOutcome::Contended(c) => {
            assert_eq!(c.fence, Some(fence));
            assert!(!c.released, "{c}");
            assert!(
                c.retry_after > Duration::from_millis(300) && c.retry_after <= HOLD,
                "{c}"
            );
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    // Past the short TTL the holder, which never renewed, is gone; the hold is not.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        client.try_acquire(&second).await,
        AcquireOutcome::Contended(_)
    ));
    let (next, at) = acquired_within(&client, &second, HOLD + Duration::from_secs(2)).await;
    assert!(
        at - granted_at >= HOLD - Duration::from_millis(5),
        "{:?}",
        at - granted_at
    );
    assert!(next.fence() > fence);
    assert_eq!(next.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_release_before_the_hold_ends_answers_released_and_keeps_the_key() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.expect("warm up");
    let first = held(&client, "cron/once", "run-a", TTL);
    let lease = client
        .try_acquire(&first)
        .await
        .into_handle()
        .expect("free");
    let key = lease_key(&client, &first);
    let fence = lease.fence();
    // Another client holds a handle of the same grant, found by replaying the attempt.
    let other_client = common::client(&server);
    let replayed = match other_client.try_acquire(&first).await {
        AcquireOutcome::Replayed(handle) => handle,
        other => panic!("expected Replayed, got {other:?}"),
    };
    // Someone is refused the grant, so its release would be announced if it deleted the key.
    let waiter = request(&client, "cron/once", "run-w", TTL);
    assert!(matches!(
        client.try_acquire(&waiter).await,
        AcquireOutcome::Contended(_)
    ));
    assert!(common::is_marked(&server, &key));

    let before = server.commandstats();
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    assert_eq!(lease.state(), LeaseState::Released);
    let sent = common::delta(&before, &server.commandstats());
    // No release notice, though someone waits: a waiter woken now would only be contended.
    assert!(!sent.contains_key("publish"), "{sent:?}");
    assert!(!sent.contains_key("del"), "{sent:?}");
    // The key stays for what is left of the hold (below the TTL it was granted with).
    let left = pttl(&server, &key);
    assert!(left > 0 && left <= 1500, "PTTL {left}");
    let value = server.cmd(&["GET", &key]).as_string().expect("kept");
    let token = first.attempt().owner_token().expose_secret();
    assert!(!value.contains(token), "the record still names the token");
    // Nor the mark: nothing is announced when the hold ends, by expiry.
    assert!(!common::is_marked(&server, &key), "{value:?}");
    let grant_part = value.split('\n').next().expect("a grant part");
    assert_eq!(
        grant_part,
        format!("{fence}:~{}:run-a", first.attempt().fingerprint())
    );

    // The grant is gone: its other handle cannot renew it, and the attempt cannot replay it.
    assert_eq!(
        replayed.renew().await,
        RenewOutcome::Lost(LossCause::OtherHolder)
    );
    match client.try_acquire(&first).await {
        AcquireOutcome::Contended(c) => {
            assert!(c.released, "{c}");
            assert_eq!(c.fence, Some(fence));
            assert_eq!(c.holder, Some(first.attempt().fingerprint()));
            assert!(c.retry_after <= HOLD, "{c}");
        }
        other => panic!("a replay of the released attempt must be contended: {other:?}"),
    }
    let second = request(&client, "cron/once", "run-b", TTL);
    match client.try_acquire(&second).await {
        AcquireOutcome::Contended(c) => assert!(c.released, "{c}"),
        other => panic!("expected Contended, got {other:?}"),
    }
    match client
        .inspect(first.purpose(), first.resource(), Some(first.attempt()))
        .await
    {
        InspectOutcome::HeldByOther(view) => {
            assert!(view.released, "{view}");
            assert_eq!(view.fence, Some(fence));
        }
        other => panic!("expected HeldByOther, got {other:?}"),
    }

    // The release sent again (as after a lost reply) is answered the same, changing nothing;
    // so is the cleanup release of the attempt.
    let kept = common::snapshot(&server);
    assert_eq!(
        other_client.release_attempt(&first).await,
        ReleaseOutcome::Released
    );
    assert_eq!(common::snapshot(&server), kept);

    let (next, _) = acquired_within(&client, &second, HOLD + Duration::from_secs(2)).await;
    assert!(next.fence() > fence);
    assert_eq!(next.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_release_after_the_hold_deletes_and_announces_to_a_waiter() {
    let server = RedisServer::start();
    let client = client(&server);
    let first = request(&client, "cron/late", "run-a", TTL)
        .with_min_hold(Duration::from_millis(200))
        .unwrap();
    let lease = client
        .try_acquire(&first)
        .await
        .into_handle()
        .expect("free");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Someone is refused the grant, and may wait for its release: it is announced.
    let waiter = request(&client, "cron/late", "run-b", TTL);
    assert!(matches!(
        client.try_acquire(&waiter).await,
        AcquireOutcome::Contended(_)
    ));
    let before = server.commandstats();
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    let sent = common::delta(&before, &server.commandstats());
    assert_eq!(sent.get("del"), Some(&1), "{sent:?}");
    assert_eq!(sent.get("publish"), Some(&1), "{sent:?}");
    assert_eq!(
        client
            .inspect(first.purpose(), first.resource(), None)
            .await,
        InspectOutcome::Free
    );
}

#[tokio::test]
async fn a_renewal_never_sets_less_than_the_hold_left() {
    let server = RedisServer::start();
    let client = client(&server);
    let long = request(&client, "cron/renew", "run-a", Duration::from_millis(500))
        .with_min_hold(Duration::from_secs(4))
        .unwrap();
    let lease = client.try_acquire(&long).await.into_handle().expect("free");
    let key = lease_key(&client, &long);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let renewed_at = Instant::now();
    match lease.renew().await {
        // The validity is still the request's TTL's, whatever the server's TTL.
        RenewOutcome::Renewed { remaining } => assert!(remaining <= long.ttl(), "{remaining:?}"),
        other => panic!("expected Renewed, got {other:?}"),
    }
    let left = pttl(&server, &key);
    // About 3.8 s of hold are left: far above the 500 ms TTL a plain renewal would set.
    let bound = 4000 - i64::try_from(renewed_at.elapsed().as_millis()).unwrap();
    assert!(left > 3000 && left <= 4000, "PTTL {left} (bound {bound})");
    assert!(lease.observed_server_expiry() > lease.valid_until());

    // A hold shorter than the TTL: renewals set the TTL, as without a hold.
    let short = request(&client, "cron/renew2", "run-a", TTL)
        .with_min_hold(Duration::from_millis(100))
        .unwrap();
    let lease2 = client
        .try_acquire(&short)
        .await
        .into_handle()
        .expect("free");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(lease2.renew().await.is_renewed());
    let left = pttl(&server, &lease_key(&client, &short));
    assert!(left > 4000 && left <= 5000, "PTTL {left}");
    assert_eq!(lease2.release().await, ReleaseOutcome::Released);
    let _ = lease.release().await;
}

#[tokio::test]
async fn a_holder_that_dies_leaves_the_key_until_the_later_of_ttl_and_hold() {
    let server = RedisServer::start();
    let client = client(&server);
    let first = held(&client, "cron/crash", "run-a", Duration::from_millis(200));
    let lease = client
        .try_acquire(&first)
        .await
        .into_handle()
        .expect("free");
    let key = lease_key(&client, &first);
    // The holder "dies": its handle is dropped without a release.
    drop(lease);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let left = pttl(&server, &key);
    assert!(left > 0 && left < 1200, "PTTL {left}");
    assert!(matches!(
        client
            .try_acquire(&request(&client, "cron/crash", "run-b", TTL))
            .await,
        AcquireOutcome::Contended(_)
    ));
}

#[tokio::test]
async fn a_waiter_is_granted_when_the_hold_of_a_released_grant_ends() {
    let server = RedisServer::start();
    let client = client(&server);
    let first = held(&client, "cron/wait", "run-a", TTL);
    let lease = client
        .try_acquire(&first)
        .await
        .into_handle()
        .expect("free");
    let granted_at = Instant::now();
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    let waiter = request(&client, "cron/wait", "run-b", TTL)
        .with_wait_timeout(Duration::from_secs(10))
        .unwrap();
    let next = client
        .acquire(&waiter)
        .await
        .into_handle()
        .expect("granted");
    let waited = granted_at.elapsed();
    // Not before the hold ended, and woken by its retry-after, not by the 10 s wait.
    assert!(waited >= HOLD - Duration::from_millis(5), "{waited:?}");
    assert!(waited < HOLD + Duration::from_secs(3), "{waited:?}");
    assert!(next.fence() > lease.fence());
    assert_eq!(next.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn without_options_the_stored_value_is_byte_for_byte_the_old_one() {
    let server = RedisServer::start();
    let client = client(&server);
    let plain = request(&client, "wire/plain", "op:with:colons", TTL);
    let lease = client
        .try_acquire(&plain)
        .await
        .into_handle()
        .expect("free");
    let key = lease_key(&client, &plain);
    let token = plain.attempt().owner_token().expose_secret();
    assert_eq!(
        server.cmd(&["GET", &key]).as_string(),
        Some(format!("{}:{token}:op:with:colons", lease.fence()))
    );
    assert_eq!(lease.release().await, ReleaseOutcome::Released);

    let before = common::server_micros(&server);
    let hold = request(&client, "wire/hold", "op-1", TTL)
        .with_min_hold(Duration::from_secs(2))
        .unwrap();
    let lease = client.try_acquire(&hold).await.into_handle().expect("free");
    let after = common::server_micros(&server);
    let value = server
        .cmd(&["GET", &lease_key(&client, &hold)])
        .as_string()
        .expect("stored");
    let token = hold.attempt().owner_token().expose_secret();
    let parts: Vec<&str> = value.split('\n').collect();
    assert_eq!(parts.len(), 3, "{value:?}");
    assert_eq!(parts[0], format!("{}:{token}:op-1", lease.fence()));
    let until: u64 = parts[1].parse().expect("hold-until in microseconds");
    assert!(
        (before + 2_000_000..=after + 2_000_000).contains(&until),
        "{until} not within the hold from {before}..={after}"
    );
    assert_eq!(parts[2], "");
    let _ = lease.release().await;
}

/// A value an older client left (the plain form, planted by hand) is renewed, released and
/// inspected as before by the new scripts.
#[tokio::test]
async fn values_left_by_an_older_client_keep_working() {
    let server = RedisServer::start();
    let client = client(&server);
    let old = request(&client, "wire/old", "op-old", TTL);
    let lease = client.try_acquire(&old).await.into_handle().expect("free");
    let key = lease_key(&client, &old);
    let token = old.attempt().owner_token().expose_secret();
    // Rewrite it exactly as an older client would have written it.
    let plain = format!("{}:{token}:op-old", lease.fence());
    server.cmd(&["SET", &key, &plain, "PX", "5000"]);
    assert!(lease.renew().await.is_renewed());
    match client.inspect(old.purpose(), old.resource(), None).await {
        InspectOutcome::HeldByOther(view) => {
            assert_eq!(view.holder, Some(old.attempt().fingerprint()));
            assert_eq!(view.holder_name, None);
            assert!(!view.released);
        }
        other => panic!("{other:?}"),
    }
    let other = request(&client, "wire/old", "op-new", TTL)
        .with_min_hold(HOLD)
        .unwrap();
    match client.try_acquire(&other).await {
        AcquireOutcome::Contended(c) => {
            assert_eq!(c.holder, Some(old.attempt().fingerprint()));
            assert!(!c.released);
        }
        other => panic!("{other:?}"),
    }
    // The refusal marked the grant (D48), which changes nothing that anyone reads of it.
    assert_eq!(
        server.cmd(&["GET", &key]).as_string(),
        Some(format!("{plain}\n\n\n"))
    );
    assert!(lease.renew().await.is_renewed());
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    assert!(server.keys().iter().all(|k| k != &key));
}

#[tokio::test]
async fn on_a_cluster_a_min_hold_keeps_a_released_key_until_it_ends() {
    let cluster = RedisCluster::start(3);
    let client = RedisBackend::open_cluster(&cluster.urls(), RedisSettings::default())
        .expect("valid seeds")
        .into_client();
    let first = held(&client, "cron/cluster", "run-a", TTL);
    let lease = client
        .try_acquire(&first)
        .await
        .into_handle()
        .expect("free");
    let key = lease_key(&client, &first);
    let node = cluster.node_for_key(&key);
    // Refused once, so that the release would be announced if it deleted the key.
    let waiter = request(&client, "cron/cluster", "run-w", TTL);
    assert!(matches!(
        client.try_acquire(&waiter).await,
        AcquireOutcome::Contended(_)
    ));
    assert!(common::is_marked(node, &key));
    let before = node.commandstats();
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    let sent = common::delta(&before, &node.commandstats());
    assert!(!sent.contains_key("spublish"), "{sent:?}");
    assert!(node.keys().contains(&key));
    let second = request(&client, "cron/cluster", "run-b", TTL);
    match client.try_acquire(&second).await {
        AcquireOutcome::Contended(c) => {
            assert!(c.released, "{c}");
            assert_eq!(c.fence, Some(lease.fence()));
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    match client.try_acquire(&first).await {
        AcquireOutcome::Contended(c) => assert!(c.released, "{c}"),
        other => panic!("a replay must be contended: {other:?}"),
    }
    let (next, _) = acquired_within(&client, &second, HOLD + Duration::from_secs(2)).await;
    assert!(next.fence() > lease.fence());
    assert_eq!(next.release().await, ReleaseOutcome::Released);
    assert!(!node.keys().contains(&key));
}
