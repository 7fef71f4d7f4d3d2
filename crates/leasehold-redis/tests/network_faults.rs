//! Lost requests and lost replies on a real network path (a fault-injecting TCP proxy in front
//! of redis-server): every outcome says exactly what is known, and replaying the same attempt
//! recovers what the lost reply would have said.

mod common;

use std::time::Duration;

use common::request;
use leasehold_redis::leasehold::{
    Abandoned, AcquireOutcome, Failure, IndeterminateCause, LeaseState, RenewOutcome,
};
use leasehold_redis::{RedisBackend, RedisLeases};
use test_support::{FaultProxy, ProxyFault, RedisServer};

const TTL: Duration = Duration::from_secs(30);

fn through(proxy: &FaultProxy) -> RedisLeases {
    RedisBackend::open(&proxy.url(), common::settings())
        .expect("valid URL")
        .into_client()
}

#[tokio::test]
async fn a_reply_lost_after_the_grant_is_indeterminate_and_a_replay_finds_it() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let client = through(&proxy);
    client.backend().warm_up().await.expect("warm-up");
    let req = request(&client, "f1", "op-a", TTL);
    let key = common::lease_key(&client, &req);
    proxy.to_client(ProxyFault::Reset);
    match client.try_acquire(&req).await {
        AcquireOutcome::Indeterminate { cause, .. } => {
            assert_eq!(cause.cause, IndeterminateCause::ConnectionLost, "{cause}");
        }
        other => panic!("expected Indeterminate, got {other:?}"),
    }
    // It was applied: only the reply was lost.
    assert!(server.keys().contains(&key));
    proxy.to_client(ProxyFault::Pass);
    let lease = match client.try_acquire(&req).await {
        AcquireOutcome::Replayed(lease) => lease,
        other => panic!("expected Replayed, got {other:?}"),
    };
    assert!(lease.remaining_validity() <= TTL);
    // The replay's fence is the counter's: had it made a second grant, the counter would have
    // moved past the fence it returned.
    assert_eq!(
        server.cmd(&["GET", &format!("{key}:fence")]).as_string(),
        Some(lease.fence().to_string()),
        "the replay made a second grant"
    );
}

#[tokio::test]
async fn a_request_lost_on_the_way_is_indeterminate_and_a_replay_grants_it_once() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let client = through(&proxy);
    client.backend().warm_up().await.expect("warm-up");
    let req = request(&client, "f2", "op-a", TTL);
    let key = common::lease_key(&client, &req);
    proxy.to_server(ProxyFault::Reset);
    // The client cannot tell a lost request from a lost reply: both are unknown.
    assert!(matches!(
        client.try_acquire(&req).await,
        AcquireOutcome::Indeterminate { .. }
    ));
    assert!(server.keys().is_empty(), "{:?}", server.keys());
    proxy.to_server(ProxyFault::Pass);
    let lease = match client.try_acquire(&req).await {
        AcquireOutcome::Acquired(lease) => lease,
        other => panic!("expected Acquired, got {other:?}"),
    };
    assert_eq!(
        common::fence_counter(&server, &client, &req),
        Some(lease.fence().to_string())
    );
    assert!(server.keys().contains(&key));
}

#[tokio::test]
async fn a_reply_held_past_the_timeout_is_indeterminate_and_not_misread_later() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let client = through(&proxy);
    client.backend().warm_up().await.expect("warm-up");
    let req = request(&client, "f3", "op-a", TTL);
    proxy.to_client(ProxyFault::Hold);
    match client.try_acquire(&req).await {
        AcquireOutcome::Indeterminate { cause, .. } => {
            assert_eq!(cause.cause, IndeterminateCause::ResponseTimeout, "{cause}");
        }
        other => panic!("expected Indeterminate, got {other:?}"),
    }
    // The late reply arrives on the same connection now; it must not be taken as the answer
    // to the next command.
    proxy.to_client(ProxyFault::Pass);
    let other = request(&client, "f3", "op-b", TTL);
    let held = match client.try_acquire(&other).await {
        AcquireOutcome::Contended(c) => c.fence.expect("the holder's fence"),
        other => panic!("expected Contended, got {other:?}"),
    };
    let lease = match client.try_acquire(&req).await {
        AcquireOutcome::Replayed(lease) => lease,
        other => panic!("expected Replayed, got {other:?}"),
    };
    assert_eq!(lease.fence(), held);
    assert_eq!(
        common::fence_counter(&server, &client, &req),
        Some(held.to_string())
    );
}

#[tokio::test]
async fn a_renewal_whose_reply_is_lost_leaves_the_handle_unknown_until_confirmed() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let client = through(&proxy);
    let req = request(&client, "f4", "op-a", TTL);
    let lease = client.try_acquire(&req).await.into_handle().expect("free");
    proxy.to_client(ProxyFault::Reset);
    assert!(matches!(
        lease.renew().await,
        RenewOutcome::Indeterminate(_)
    ));
    assert_eq!(lease.state(), LeaseState::Unknown);
    assert!(!lease.is_valid());
    proxy.to_client(ProxyFault::Pass);
    assert!(lease.renew().await.is_renewed());
    assert_eq!(lease.state(), LeaseState::Active);
    assert!(lease.is_valid());
}

/// A replay of a grant the client already holds a handle for confirms that handle: the one
/// state the two share is `Active` again, with the replay's validity (the merge in `confirm`,
/// which no test pinned before).
#[tokio::test]
async fn a_replay_confirms_the_handle_the_client_already_holds() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let client = through(&proxy);
    let req = request(&client, "f7", "op-a", TTL);
    let lease = client.try_acquire(&req).await.into_handle().expect("free");
    proxy.to_client(ProxyFault::Reset);
    assert!(matches!(
        lease.renew().await,
        RenewOutcome::Indeterminate(_)
    ));
    assert_eq!(lease.state(), LeaseState::Unknown);
    assert!(!lease.is_valid());
    proxy.to_client(ProxyFault::Pass);
    let replayed = match client.try_acquire(&req).await {
        AcquireOutcome::Replayed(handle) => handle,
        other => panic!("expected Replayed, got {other:?}"),
    };
    // The first handle learnt it: the server holds this exact grant.
    assert_eq!(lease.state(), LeaseState::Active);
    assert!(lease.is_valid());
    assert!(
        lease.remaining_validity() > TTL / 2,
        "{:?}",
        lease.remaining_validity()
    );
    assert!(lease.remaining_validity() <= TTL);
    assert_eq!(replayed.fence(), lease.fence());
    assert_eq!(
        lease.release().await,
        leasehold_redis::leasehold::ReleaseOutcome::Released
    );
    assert_eq!(replayed.state(), LeaseState::Released);
}

/// Sends one acquire whose reply is lost (`to_client` as given) and returns its unknown cause.
async fn unknown_acquire(
    client: &RedisLeases,
    proxy: &FaultProxy,
    req: &leasehold_redis::leasehold::LeaseRequest,
    fault: ProxyFault,
) -> leasehold_redis::leasehold::Indeterminate {
    proxy.to_client(fault);
    match client.try_acquire(req).await {
        AcquireOutcome::Indeterminate { cause, .. } => cause,
        other => panic!("expected Indeterminate, got {other:?}"),
    }
}

#[tokio::test]
async fn resolve_finds_the_grant_a_lost_reply_made_or_stays_unknown() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let client = through(&proxy);
    client.backend().warm_up().await.expect("warm-up");
    let req = request(&client, "f5", "op-a", TTL);
    let cause = unknown_acquire(&client, &proxy, &req, ProxyFault::Reset).await;
    // Still no reply: the budget runs out and the outcome stays unknown, never "not applied".
    proxy.to_client(ProxyFault::Reset);
    match client
        .resolve(&req, cause.clone(), Duration::from_millis(300))
        .await
    {
        AcquireOutcome::Indeterminate { .. } => {}
        other => panic!("expected Indeterminate, got {other:?}"),
    }
    proxy.to_client(ProxyFault::Pass);
    let lease = match client.resolve(&req, cause, Duration::from_secs(5)).await {
        AcquireOutcome::Replayed(lease) => lease,
        other => panic!("expected Replayed, got {other:?}"),
    };
    assert_eq!(
        common::fence_counter(&server, &client, &req),
        Some(lease.fence().to_string()),
        "resolving made a second grant"
    );
    assert_eq!(
        lease.release().await,
        leasehold_redis::leasehold::ReleaseOutcome::Released
    );
}

#[tokio::test]
async fn abandon_releases_the_grant_a_lost_reply_made_without_making_one() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let client = through(&proxy);
    client.backend().warm_up().await.expect("warm-up");
    let req = request(&client, "f6", "op-a", TTL);
    let key = common::lease_key(&client, &req);
    // The acquire was applied, its reply lost: the grant is nobody's.
    unknown_acquire(&client, &proxy, &req, ProxyFault::Reset).await;
    assert!(server.keys().contains(&key));
    proxy.to_client(ProxyFault::Pass);
    assert_eq!(client.abandon(&req, TTL).await, Abandoned::Released);
    assert!(!server.keys().contains(&key));
    // Nothing held now, and abandoning again makes no grant to drop.
    let counter = common::fence_counter(&server, &client, &req);
    assert_eq!(client.abandon(&req, TTL).await, Abandoned::NothingHeld);
    assert_eq!(common::fence_counter(&server, &client, &req), counter);
    // Replies held: no answer within the budget, but the release went behind the acquire on
    // the same connection and removed the grant all the same.
    unknown_acquire(&client, &proxy, &req, ProxyFault::Hold).await;
    match client.abandon(&req, Duration::from_millis(300)).await {
        Abandoned::Unknown(Failure::Indeterminate(_)) => {}
        other => panic!("expected Unknown, got {other:?}"),
    }
    assert!(!server.keys().contains(&key), "{:?}", server.keys());
    proxy.to_client(ProxyFault::Pass);
}
