//! The original's whole test list, and the safety properties, against real redis-server.

mod common;

use std::time::Duration;

use common::{client, lease_key, pttl, request};
use leasehold_redis::leasehold::{
    AcquireOutcome, Guarantee, InspectOutcome, LeaseState, LossCause, ReleaseOutcome, RenewOutcome,
    UnavailableCause,
};
use test_support::RedisServer;

const TTL: Duration = Duration::from_secs(5);

#[tokio::test]
async fn uncontended_acquire_grants_a_fence_from_the_server_clock() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "orders/1", "op-a", TTL);
    let before = common::server_micros(&server);
    let lease = match client.try_acquire(&req).await {
        AcquireOutcome::Acquired(lease) => lease,
        other => panic!("expected Acquired, got {other:?}"),
    };
    let after = common::server_micros(&server);
    // No counter yet: the fence is the server's clock in microseconds when the script ran.
    assert!(
        (before..=after).contains(&lease.fence().get()),
        "{} not within {before}..={after}",
        lease.fence()
    );
    assert_eq!(lease.guarantee(), Guarantee::Fenced(lease.fence()));
    assert_eq!(lease.state(), LeaseState::Active);
    assert!(lease.remaining_validity() <= TTL - req.drift());
    assert!(lease.remaining_validity() > Duration::ZERO);
    let key = lease_key(&client, &req);
    let server_ttl = pttl(&server, &key);
    assert!(server_ttl > 0 && server_ttl <= 5000, "PTTL {server_ttl}");
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_second_owner_is_contended_with_the_holders_pttl() {
    let server = RedisServer::start();
    let client = client(&server);
    let first = request(&client, "orders/2", "op-a", TTL);
    let lease = client
        .try_acquire(&first)
        .await
        .into_handle()
        .expect("held");
    let second = request(&client, "orders/2", "op-b", TTL);
    match client.try_acquire(&second).await {
        AcquireOutcome::Contended(c) => {
            assert!(
                c.retry_after > Duration::ZERO && c.retry_after <= TTL,
                "{c:?}"
            );
            assert_eq!(c.holder, Some(first.attempt().fingerprint()));
            assert_eq!(c.fence, Some(lease.fence()));
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    assert!(client.try_acquire(&second).await.is_held());
}

#[tokio::test]
async fn the_same_attempt_replays_with_the_same_fence() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "orders/3", "op-a", TTL);
    let first = client.try_acquire(&req).await.into_handle().expect("held");
    match client.try_acquire(&req).await {
        AcquireOutcome::Replayed(replay) => {
            assert_eq!(replay.fence(), first.fence());
            assert!(replay.remaining_validity() <= TTL - req.drift());
            assert_eq!(replay.state(), LeaseState::Active);
        }
        other => panic!("expected Replayed, got {other:?}"),
    }
    let _ = first.release().await;
}

#[tokio::test]
async fn the_same_owner_with_another_operation_does_not_inherit() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "orders/4", "op-a", TTL);
    let lease = client.try_acquire(&req).await.into_handle().expect("held");
    let other_op = req.for_attempt(
        req.attempt()
            .with_operation(leasehold_redis::leasehold::OperationId::new("op-b").unwrap()),
    );
    match client.try_acquire(&other_op).await {
        AcquireOutcome::OwnerOperationConflict(c) => {
            assert_eq!(c.fence, Some(lease.fence()));
            assert!(c.retry_after > Duration::ZERO);
        }
        other => panic!("expected OwnerOperationConflict, got {other:?}"),
    }
    let _ = lease.release().await;
}

#[tokio::test]
async fn renew_sets_the_ttl_again() {
    let server = RedisServer::start();
    let client = client(&server);
    let ttl = Duration::from_secs(2);
    let req = request(&client, "orders/5", "op-a", ttl);
    let lease = client.try_acquire(&req).await.into_handle().expect("held");
    let key = lease_key(&client, &req);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = pttl(&server, &key);
    assert!(before <= 1700, "PTTL {before} after 300 ms");
    match lease.renew().await {
        RenewOutcome::Renewed { remaining } => {
            assert!(remaining <= ttl - req.drift());
            // Counted from this renewal, not the grant: more than the 1.7 s left before it
            // minus a generous allowance for a slow round trip on a loaded machine.
            assert!(remaining > Duration::from_millis(1000), "{remaining:?}");
        }
        other => panic!("expected Renewed, got {other:?}"),
    }
    assert!(pttl(&server, &key) > before);
    assert_eq!(lease.state(), LeaseState::Active);
    let _ = lease.release().await;
}

#[tokio::test]
async fn local_expiry_comes_no_later_than_the_servers() {
    let server = RedisServer::start();
    let client = client(&server);
    let ttl = Duration::from_millis(150);
    let req = request(&client, "orders/6", "op-a", ttl);
    let lease = client.try_acquire(&req).await.into_handle().expect("held");
    let key = lease_key(&client, &req);
    // Bounded: the key is gone within 150 ms plus Redis's expiry granularity.
    let mut server_gone = false;
    for _ in 0..200 {
        let exists = server.cmd(&["EXISTS", &key]).as_int() == Some(1);
        if !exists {
            server_gone = true;
            // The key is gone: the handle must already have stopped vouching for it.
            assert_eq!(lease.state(), LeaseState::Expired);
            assert_eq!(lease.remaining_validity(), Duration::ZERO);
            break;
        }
        if lease.state() == LeaseState::Active {
            assert!(lease.remaining_validity() > Duration::ZERO);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(server_gone, "the key did not expire within a second");
    assert_eq!(lease.renew().await, RenewOutcome::Lost(LossCause::Absent));
    assert_eq!(lease.state(), LeaseState::Lost);
}

#[tokio::test]
async fn release_deletes_only_the_lease_and_is_final() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "orders/7", "op-a", TTL);
    let lease = client.try_acquire(&req).await.into_handle().expect("held");
    let key = lease_key(&client, &req);
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    assert_eq!(lease.state(), LeaseState::Released);
    assert_eq!(server.cmd(&["EXISTS", &key]).as_int(), Some(0));
    // The fence counter outlives the lease, so the next grant gets a larger fence.
    assert_eq!(
        server.cmd(&["GET", &format!("{key}:fence")]).as_string(),
        Some(lease.fence().to_string())
    );
    assert_eq!(
        lease.release().await,
        ReleaseOutcome::Refused {
            state: LeaseState::Released
        }
    );
    assert_eq!(
        lease.renew().await,
        RenewOutcome::Refused {
            state: LeaseState::Released
        }
    );
    let again = client
        .try_acquire(&request(&client, "orders/7", "op-b", TTL))
        .await
        .into_handle()
        .expect("free after release");
    assert!(
        again.fence() > lease.fence(),
        "{} after {}",
        again.fence(),
        lease.fence()
    );
    let _ = again.release().await;
}

#[tokio::test]
async fn release_after_expiry_is_already_gone() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "orders/7b", "op-a", Duration::from_millis(100));
    let lease = client.try_acquire(&req).await.into_handle().expect("held");
    server.cmd(&["DEL", &lease_key(&client, &req)]);
    assert_eq!(lease.release().await, ReleaseOutcome::AlreadyGone);
    assert_eq!(lease.state(), LeaseState::Released);
}

#[tokio::test]
async fn inspection_tells_this_attempt_from_others() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "orders/8", "op-a", TTL);
    let (purpose, resource) = (req.purpose().clone(), req.resource().clone());
    assert_eq!(
        client
            .inspect(&purpose, &resource, Some(req.attempt()))
            .await,
        InspectOutcome::Free
    );
    let lease = client.try_acquire(&req).await.into_handle().expect("held");
    match client
        .inspect(&purpose, &resource, Some(req.attempt()))
        .await
    {
        InspectOutcome::HeldByThisAttempt(view) => {
            assert_eq!(view.fence, Some(lease.fence()));
            assert!(view.server_ttl.is_some_and(|t| t <= TTL));
            assert_eq!(view.holder, Some(req.attempt().fingerprint()));
        }
        other => panic!("expected HeldByThisAttempt, got {other:?}"),
    }
    let stranger = request(&client, "orders/8", "op-b", TTL);
    for attempt in [Some(stranger.attempt()), None] {
        match client.inspect(&purpose, &resource, attempt).await {
            InspectOutcome::HeldByOther(view) => {
                assert_eq!(view.holder, Some(req.attempt().fingerprint()));
                assert_eq!(view.fence, Some(lease.fence()));
            }
            other => panic!("expected HeldByOther, got {other:?}"),
        }
    }
    let _ = lease.release().await;
    assert_eq!(
        client.inspect(&purpose, &resource, None).await,
        InspectOutcome::Free
    );
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable() {
    let mut server = RedisServer::start();
    server.kill();
    let client = client(&server);
    let req = request(&client, "orders/9", "op-a", TTL);
    match client.try_acquire(&req).await {
        AcquireOutcome::Unavailable(u) => assert_eq!(u.cause, UnavailableCause::ConnectionRefused),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(matches!(
        client.inspect(req.purpose(), req.resource(), None).await,
        InspectOutcome::Unavailable(_)
    ));
}

#[tokio::test]
async fn a_lease_deleted_by_hand_is_lost_on_renew() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "orders/10", "op-a", TTL);
    let lease = client.try_acquire(&req).await.into_handle().expect("held");
    server.cmd(&["DEL", &lease_key(&client, &req)]);
    assert_eq!(lease.renew().await, RenewOutcome::Lost(LossCause::Absent));
    assert_eq!(lease.state(), LeaseState::Lost);
    // Terminal: renew from Lost is refused and sends nothing.
    assert_eq!(
        lease.renew().await,
        RenewOutcome::Refused {
            state: LeaseState::Lost
        }
    );
    assert_eq!(lease.state(), LeaseState::Lost);
}

#[tokio::test]
async fn a_regranted_lease_is_not_renewed_or_released_by_its_old_holder() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "orders/11", "op-a", TTL);
    let old = client.try_acquire(&req).await.into_handle().expect("held");
    // The key lapses and the same attempt is granted again: a new fence.
    server.cmd(&["DEL", &lease_key(&client, &req)]);
    let new = client.try_acquire(&req).await.into_handle().expect("held");
    assert!(new.fence() > old.fence());
    assert_eq!(
        old.renew().await,
        RenewOutcome::Lost(LossCause::OtherHolder)
    );
    assert_eq!(
        old.release().await,
        ReleaseOutcome::Refused {
            state: LeaseState::Lost
        }
    );
    assert!(new.renew().await.is_renewed());
    assert_eq!(new.release().await, ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_acquires_grant_exactly_one() {
    let server = RedisServer::start();
    let clients: Vec<_> = (0..4).map(|_| client(&server)).collect();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let client = clients[i % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            let req = request(&client, "orders/contended", &format!("op-{i}"), TTL);
            let outcome = client.try_acquire(&req).await;
            let kind = match &outcome {
                AcquireOutcome::Acquired(_) => "Acquired",
                AcquireOutcome::Contended(_) => "Contended",
                _ => "another outcome",
            };
            (kind, outcome.into_handle().map(|h| h.fence()))
        }));
    }
    let mut acquired = Vec::new();
    let mut contended = 0;
    for task in tasks {
        match task.await.expect("task") {
            ("Acquired", Some(fence)) => acquired.push(fence),
            ("Contended", None) => contended += 1,
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!(acquired.len(), 1, "{acquired:?}");
    assert_eq!(contended, 199);
}

#[tokio::test]
async fn fences_strictly_increase_over_a_thousand_grants() {
    let server = RedisServer::start();
    let clients = [client(&server), client(&server)];
    let mut last = 0;
    let start = common::server_micros(&server);
    for i in 0..1000 {
        let client = &clients[i % 2];
        let req = request(client, "orders/fenced", &format!("op-{i}"), TTL);
        let lease = client.try_acquire(&req).await.into_handle().expect("free");
        assert!(
            lease.fence().get() > last,
            "grant {i}: {} after {last}",
            lease.fence()
        );
        last = lease.fence().get();
        assert_eq!(lease.release().await, ReleaseOutcome::Released);
    }
    // Never below the clock, and ahead of it by at most one per grant made within the same
    // microsecond.
    let end = common::server_micros(&server);
    assert!(last <= end + 1000, "{last} after the clock read {end}");
    assert!(
        last >= start + 999,
        "{last}: the fences did not move from {start}"
    );
}

#[tokio::test]
async fn no_raw_resource_id_reaches_any_key() {
    let server = RedisServer::start();
    let client = client(&server);
    let raw = [
        "customer:alice@example.com",
        "orders/{hashtag}/9",
        "plain-name-42",
    ];
    let mut held = Vec::new();
    for (i, resource) in raw.iter().enumerate() {
        let req = request(&client, resource, &format!("op-{i}"), TTL);
        held.push(client.try_acquire(&req).await.into_handle().expect("held"));
    }
    let keys = server.keys();
    assert_eq!(keys.len(), 6, "{keys:?}");
    for key in &keys {
        for resource in raw {
            assert!(!key.contains(resource), "{key} holds {resource}");
        }
        assert!(key.starts_with("leasehold:lease:v1:test:{sha256:"), "{key}");
    }
    for lease in held {
        let _ = lease.release().await;
    }
}

/// Found by the simulation: every handle of one grant shares one state.
#[tokio::test]
async fn a_replayed_handle_shares_state_with_the_first() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "orders/shared", "op-a", TTL);
    let first = client.try_acquire(&req).await.into_handle().expect("held");
    let replay = match client.try_acquire(&req).await {
        AcquireOutcome::Replayed(h) => h,
        other => panic!("expected Replayed, got {other:?}"),
    };
    assert_eq!(replay.release().await, ReleaseOutcome::Released);
    assert_eq!(first.state(), LeaseState::Released);
    assert_eq!(first.remaining_validity(), Duration::ZERO);
    assert_eq!(
        first.renew().await,
        RenewOutcome::Refused {
            state: LeaseState::Released
        }
    );
}

/// No renewal is sent after a release: renewals racing a release either land before it
/// (`Renewed`) or are refused without I/O — none reaches the server after the key is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_renew_is_sent_after_a_concurrent_release() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    for round in 0..100 {
        let req = request(&client, "orders/race", &format!("op-{round}"), TTL);
        let lease =
            std::sync::Arc::new(client.try_acquire(&req).await.into_handle().expect("free"));
        let before = server.commandstats();
        let renewals: Vec<_> = (0..20)
            .map(|_| {
                let lease = std::sync::Arc::clone(&lease);
                tokio::spawn(async move { lease.renew().await })
            })
            .collect();
        let release = {
            let lease = std::sync::Arc::clone(&lease);
            tokio::spawn(async move { lease.release().await })
        };
        assert_eq!(release.await.unwrap(), ReleaseOutcome::Released);
        let mut sent = 1;
        for renewal in renewals {
            match renewal.await.unwrap() {
                RenewOutcome::Renewed { .. } => sent += 1,
                RenewOutcome::Refused { .. } => {}
                other => panic!(
                    "round {round}: a renewal reached the server after the release: {other:?}"
                ),
            }
        }
        let delta = common::delta(&before, &server.commandstats());
        // Every renewal the server applied was answered Renewed: one PEXPIRE each (renewals
        // started together share a call), and the release's call.
        assert_eq!(
            delta.get("pexpire").copied().unwrap_or(0),
            sent - 1,
            "round {round}: {delta:?}"
        );
        let calls = common::client_commands(&delta);
        let evalsha = calls.get("evalsha").copied().unwrap_or(0);
        assert!(
            (2..=sent).contains(&evalsha) || (sent == 1 && evalsha == 1),
            "round {round}: {calls:?}"
        );
        assert_eq!(lease.state(), LeaseState::Released);
    }
}

#[tokio::test]
async fn a_database_the_server_does_not_have_is_named_as_such() {
    let server = RedisServer::start();
    // Redis has 16 databases unless configured otherwise.
    let url = format!("{}/99", server.url().trim_end_matches('/'));
    let client = leasehold_redis::RedisBackend::open(&url, common::settings())
        .expect("parses: only the server knows how many databases it has")
        .into_client();
    match client
        .try_acquire(&request(&client, "orders/1", "op-a", TTL))
        .await
    {
        AcquireOutcome::Unavailable(u) => {
            assert_eq!(u.cause, UnavailableCause::NoSuchDatabase, "{u:?}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(server.keys().is_empty());
}

/// Renewals started together go to the server as one call of renew.lua, each with its own
/// outcome: a grant that is gone is reported lost without keeping the others from renewing.
#[tokio::test]
async fn renewals_started_together_share_one_call_and_keep_their_own_outcomes() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    let mut leases = Vec::new();
    for i in 0..50 {
        let req = request(&client, &format!("batch-{i}"), "op-a", TTL);
        leases.push(client.try_acquire(&req).await.into_handle().expect("free"));
    }
    // One of them is deleted behind its holder's back.
    let gone = lease_key(&client, &request(&client, "batch-7", "op-a", TTL));
    server.cmd(&["DEL", &gone]);
    let before = server.commandstats();
    let outcomes = futures_util::future::join_all(leases.iter().map(|l| l.renew())).await;
    let delta = common::delta(&before, &server.commandstats());
    let calls = common::client_commands(&delta);
    assert_eq!(calls.get("evalsha"), Some(&1), "{calls:?}");
    assert_eq!(delta.get("pexpire"), Some(&49), "{delta:?}");
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == 7 {
            assert!(
                matches!(outcome, RenewOutcome::Lost(LossCause::Absent)),
                "{outcome:?}"
            );
        } else {
            assert!(outcome.is_renewed(), "{i}: {outcome:?}");
        }
    }
    assert_eq!(leases[7].state(), LeaseState::Lost);
    assert_eq!(leases[8].state(), LeaseState::Active);
}

/// A renewal dropped while it waits to be batched (the one that would hand the batch to a
/// sender) still leaves the batch sent: every renewal after it is answered, none waits for a
/// sender that will never come.
#[tokio::test]
async fn a_renewal_dropped_while_it_waits_to_be_batched_leaves_the_others_answered() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    let first = client
        .try_acquire(&request(&client, "dropped-renewal", "op-a", TTL))
        .await
        .into_handle()
        .expect("free");
    let second = client
        .try_acquire(&request(&client, "later-renewal", "op-a", TTL))
        .await
        .into_handle()
        .expect("free");
    {
        // Polled once, the first renewal joins the queue and yields, to let others join; it
        // is dropped there, at the end of this block.
        let mut renewal = std::pin::pin!(first.renew());
        let once = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(renewal.as_mut().poll(cx).is_pending())
        })
        .await;
        assert!(once, "the renewal should wait to be batched");
    }
    // A bound for a hang, not a timing goal: the renewal takes one round trip.
    let later = tokio::time::timeout(Duration::from_secs(10), second.renew()).await;
    assert!(
        matches!(later, Ok(ref outcome) if outcome.is_renewed()),
        "{later:?}"
    );
    // The dropped renewal was still sent: it may be applied, as its cancel safety says.
    assert!(first.renew().await.is_renewed());
}
