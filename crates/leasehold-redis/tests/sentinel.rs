//! Leases through Sentinel (a master, a replica and a Sentinel on loopback): the master is
//! found through the Sentinel, and after a failover the next command reaches the new master,
//! with every outcome in between typed as not applied or unknown — never as a loss or a grant.

mod common;

use std::time::Duration;

use common::request;
use leasehold_redis::leasehold::{
    AcquireOutcome, IndeterminateCause, LeaseHandle, LeaseRequest, LeaseState, LossCause,
    LossReason, ReleaseOutcome, RenewOutcome,
};
use leasehold_redis::{RedisBackend, RedisLeases};
use test_support::{RedisSentinel, Reply, sentinel::SERVICE};

/// Long enough to outlive a failover on a loaded machine: these tests are about routing, and a
/// lease that expired meanwhile would be (rightly) reported lost.
const LEASE_TTL: Duration = Duration::from_secs(60);

fn sentinel_client(deployment: &RedisSentinel) -> RedisLeases {
    RedisBackend::open_sentinel(
        &deployment.sentinel_urls(),
        SERVICE,
        None,
        common::settings(),
    )
    .expect("valid sentinel URLs")
    .into_client()
}

/// Acquires `resource` for operation "op-a", which must be free.
async fn hold(client: &RedisLeases, resource: &str) -> (LeaseRequest, LeaseHandle<RedisBackend>) {
    let holder = request(client, resource, "op-a", LEASE_TTL);
    let lease = client
        .try_acquire(&holder)
        .await
        .into_handle()
        .expect("free");
    (holder, lease)
}

/// Renews until the server confirms (bounded). Until then every outcome must say "not
/// applied" or "unknown": the key was replicated before the failover, so it is never lost.
async fn renew_until_confirmed(lease: &LeaseHandle<RedisBackend>) -> usize {
    for tries in 1..=100 {
        match lease.renew().await {
            RenewOutcome::Renewed { .. } => return tries,
            RenewOutcome::Indeterminate(_) | RenewOutcome::Unavailable(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("try {tries}: {other:?}"),
        }
    }
    panic!("no confirmed renewal after 100 tries");
}

#[tokio::test]
async fn leases_go_to_the_master_the_sentinel_names() {
    let deployment = RedisSentinel::start();
    let client = sentinel_client(&deployment);
    let (holder, lease) = hold(&client, "s1").await;
    let key = common::lease_key(&client, &holder);
    assert!(deployment.master().keys().contains(&key));
    let other = request(&client, "s1", "op-b", LEASE_TTL);
    assert!(matches!(
        client.try_acquire(&other).await,
        AcquireOutcome::Contended(_)
    ));
    assert!(lease.renew().await.is_renewed());
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    assert!(!deployment.master().keys().contains(&key));
}

#[tokio::test]
async fn after_a_failover_the_lease_is_renewed_on_the_promoted_replica() {
    let deployment = RedisSentinel::start();
    let client = sentinel_client(&deployment);
    let (holder, lease) = hold(&client, "s2").await;
    // Replicated before the failover: this test is about routing, not about lost writes.
    assert_eq!(
        deployment.master().cmd(&["WAIT", "1", "5000"]),
        Reply::Int(1)
    );
    let old_port = deployment.master().port();
    let promoted = deployment.failover();
    assert_ne!(promoted.port(), old_port);
    // Until the old master is demoted it still takes writes (which the failover then loses):
    // wait, so that this test is about reaching the new master.
    deployment.wait_until_demoted(deployment.replica());

    let renewals_before = promoted.commandstats().get("evalsha").copied().unwrap_or(0);
    renew_until_confirmed(&lease).await;
    let renewals_after = promoted.commandstats().get("evalsha").copied().unwrap_or(0);
    assert!(
        renewals_after > renewals_before,
        "the renewal did not reach the new master"
    );
    assert_eq!(lease.state(), LeaseState::Active);
    let key = common::lease_key(&client, &holder);
    assert!(common::pttl(promoted, &key) > 30_000);
    // The fence counter came across too: the next grant continues it.
    assert_eq!(
        promoted.cmd(&["GET", &format!("{key}:fence")]).as_string(),
        Some(lease.fence().to_string())
    );
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    let next = request(&client, "s2", "op-b", LEASE_TTL);
    let second = client.try_acquire(&next).await.into_handle().expect("free");
    assert!(second.fence() > lease.fence());
    assert!(promoted.keys().contains(&key));
    let _ = second.release().await;
}

/// Renews until the server answers (bounded), and returns that answer: every outcome before
/// it must say "not applied" or "unknown".
async fn renew_until_answered(lease: &LeaseHandle<RedisBackend>) -> RenewOutcome {
    for _ in 0..100 {
        match lease.renew().await {
            RenewOutcome::Indeterminate(i) if i.cause != IndeterminateCause::MasterReplaced => {}
            RenewOutcome::Unavailable(_) => {}
            answered => return answered,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no answer after 100 tries");
}

#[tokio::test]
async fn a_grant_the_new_master_does_not_hold_is_lost_to_the_replacement_with_its_own_reason() {
    let deployment = RedisSentinel::start();
    let client = sentinel_client(&deployment);
    // One lease through the explicit API, one kept by the one-call guard.
    let (holder, lease) = hold(&client, "s-replaced").await;
    let guard = client
        .lock("s-replaced-guard")
        .ttl(Duration::from_secs(30))
        .await
        .expect("free");
    assert_eq!(
        deployment.master().cmd(&["WAIT", "1", "5000"]),
        Reply::Int(1)
    );
    let promoted = deployment.failover();
    deployment.wait_until_demoted(deployment.replica());
    // The writes the failover lost: the new master has neither grant (as when they were made
    // on the old master after the replica stopped following it).
    let key = common::lease_key(&client, &holder);
    let guard_key = promoted
        .keys()
        .into_iter()
        .find(|k| k != &key && !k.ends_with(":fence"))
        .expect("the guard's key came across");
    assert_eq!(promoted.cmd(&["DEL", &key, &guard_key]), Reply::Int(2));
    // A renewal of a grant made before the failover that finds it gone on the new master says
    // why, where a grant made on the same master says "absent".
    assert_eq!(
        renew_until_answered(&lease).await,
        RenewOutcome::Lost(LossCause::MasterReplaced)
    );
    assert_eq!(lease.state(), LeaseState::Lost);
    // Told at its next renewal (a cadence, 10 s), if not already by one that ran on the
    // replaced master during the failover and could not be confirmed on the new one.
    let reason = tokio::time::timeout(Duration::from_secs(25), guard.lost())
        .await
        .expect("the guard was told before its margin point");
    assert_eq!(reason, LossReason::MasterReplaced);
    // A grant made on the new master is of its term: lost there, it is merely absent.
    let (again, after) = hold(&client, "s-replaced-after").await;
    let _ = promoted.cmd(&["DEL", &common::lease_key(&client, &again)]);
    assert_eq!(after.renew().await, RenewOutcome::Lost(LossCause::Absent));
}

#[tokio::test]
async fn a_stalled_master_is_left_for_the_promoted_one() {
    let deployment = RedisSentinel::start();
    let client = sentinel_client(&deployment);
    let (_, lease) = hold(&client, "s3").await;
    assert_eq!(
        deployment.master().cmd(&["WAIT", "1", "5000"]),
        Reply::Int(1)
    );
    let old = deployment.master();
    let _paused = old.pause();
    // The client's connection still points at the stalled master: the renewal times out.
    assert!(matches!(
        lease.renew().await,
        RenewOutcome::Indeterminate(_)
    ));
    let promoted = deployment.failover();
    assert_ne!(promoted.port(), old.port());
    // The timeout dropped that connection; the next one is made to the master the
    // Sentinel names now.
    renew_until_confirmed(&lease).await;
    assert_eq!(lease.state(), LeaseState::Active);
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
}

#[test]
fn sentinel_needs_an_address_and_parsable_urls() {
    let none: [&str; 0] = [];
    assert!(RedisBackend::open_sentinel(&none, SERVICE, None, common::settings()).is_err());
    let err =
        RedisBackend::open_sentinel(&["redis://:secret@[bad"], SERVICE, None, common::settings())
            .expect_err("bad URL");
    assert!(!err.to_string().contains("secret"), "{err}");
}

#[tokio::test]
async fn release_notices_still_hand_off_after_a_failover() {
    let deployment = RedisSentinel::start();
    let client = sentinel_client(&deployment);
    // A first wait makes the subscriber connect (to the first master) before the failover.
    let warm = request(&client, "s4", "op-warm", LEASE_TTL)
        .with_wait_timeout(Duration::from_secs(1))
        .unwrap();
    let warm = client.acquire(&warm).await.into_handle().expect("free");
    assert_eq!(warm.release().await, ReleaseOutcome::Released);
    let promoted = deployment.failover();
    deployment.wait_until_demoted(deployment.replica());
    let holder = request(&client, "s4", "op-a", LEASE_TTL);
    let lease = loop {
        match client.try_acquire(&holder).await {
            AcquireOutcome::Acquired(lease) => break lease,
            AcquireOutcome::Indeterminate { .. } | AcquireOutcome::Unavailable(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("{other:?}"),
        }
    };
    let evalsha = || promoted.commandstats().get("evalsha").copied().unwrap_or(0);
    let before = evalsha();
    let waiter = request(&client, "s4", "op-b", LEASE_TTL)
        .with_wait_timeout(Duration::from_secs(8))
        .unwrap();
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            let outcome = client.acquire(&waiter).await;
            (outcome, std::time::Instant::now())
        })
    };
    // Release only once the waiter's first try has run (and met the holder), so that the
    // hand-off must come from the notice and not from a first try after the release.
    for _ in 0..500 {
        if evalsha() > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(evalsha() > before, "the waiter never tried");
    // The holder's TTL was 60 s.
    common::release_and_expect_hand_off(lease, waiting, Duration::from_secs(2)).await;
}

/// A client whose grants and renewals wait for one replica (up to 200 ms of a 1 s command).
fn gated_client(deployment: &RedisSentinel) -> RedisLeases {
    let settings = common::settings()
        .with_command_timeout(Duration::from_secs(1))
        .unwrap()
        .with_replication(1, Duration::from_millis(200))
        .unwrap();
    RedisBackend::open_sentinel(&deployment.sentinel_urls(), SERVICE, None, settings)
        .expect("valid sentinel URLs")
        .into_client()
}

#[tokio::test]
async fn a_gated_grant_is_on_the_replica_when_it_is_acquired() {
    let deployment = RedisSentinel::start();
    let client = gated_client(&deployment);
    // Scripts loaded first: a NOSCRIPT retry would send its pipeline, WAIT included, twice.
    client.backend().warm_up().await.expect("warm-up");
    let (holder, lease) = hold(&client, "s5").await;
    // WAIT returned after the replica acknowledged: no polling needed.
    let key = common::lease_key(&client, &holder);
    assert!(deployment.replica().keys().contains(&key));
    assert_eq!(
        deployment
            .replica()
            .cmd(&["GET", &format!("{key}:fence")])
            .as_string(),
        Some(lease.fence().to_string())
    );
    assert!(lease.renew().await.is_renewed());
    let waits = deployment.master().commandstats().get("wait").copied();
    assert_eq!(waits, Some(2), "one WAIT per grant and per renewal");
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_grant_no_replica_confirmed_is_unknown_until_a_replay_confirms_it() {
    let deployment = RedisSentinel::start();
    let client = gated_client(&deployment);
    client.backend().warm_up().await.expect("warm-up");
    let holder = request(&client, "s6", "op-a", LEASE_TTL);
    let key = common::lease_key(&client, &holder);
    let paused = deployment.replica().pause();
    match client.try_acquire(&holder).await {
        AcquireOutcome::Indeterminate { cause, .. } => {
            assert_eq!(cause.cause, IndeterminateCause::NotReplicated, "{cause}");
        }
        other => panic!("expected Indeterminate(NotReplicated), got {other:?}"),
    }
    // The primary applied it; only its durability is unknown.
    assert!(deployment.master().keys().contains(&key));
    paused.resume();
    let lease = match client.try_acquire(&holder).await {
        AcquireOutcome::Replayed(lease) => lease,
        other => panic!("expected Replayed once the replica is back, got {other:?}"),
    };
    assert_eq!(
        deployment
            .master()
            .cmd(&["GET", &format!("{key}:fence")])
            .as_string(),
        Some(lease.fence().to_string()),
        "the replay made a second grant"
    );
    // A renewal no replica confirms leaves the handle Unknown, never Active.
    let paused = deployment.replica().pause();
    match lease.renew().await {
        RenewOutcome::Indeterminate(i) => assert_eq!(i.cause, IndeterminateCause::NotReplicated),
        other => panic!("expected Indeterminate(NotReplicated), got {other:?}"),
    }
    assert_eq!(lease.state(), LeaseState::Unknown);
    paused.resume();
    assert!(lease.renew().await.is_renewed());
    assert_eq!(lease.state(), LeaseState::Active);
}

#[tokio::test]
async fn one_url_names_the_sentinels_and_the_service() {
    let deployment = RedisSentinel::start();
    let hosts: Vec<String> = deployment
        .sentinel_urls()
        .iter()
        .map(|url| url.trim_start_matches("redis://").to_owned())
        .collect();
    // A second, unreachable Sentinel first: the next one on the list is asked.
    let url = format!("redis+sentinel://127.0.0.1:1,{}/{SERVICE}", hosts.join(","));
    let client = RedisBackend::open(&url, common::settings())
        .expect("a Sentinel URL")
        .into_client();
    let (holder, lease) = hold(&client, "one-url").await;
    let key = common::lease_key(&client, &holder);
    assert!(deployment.master().keys().contains(&key));
    assert!(lease.renew().await.is_renewed());
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    // A service the Sentinels do not know is not a master: nothing is granted.
    let unknown = RedisBackend::open(
        &format!("redis+sentinel://{}/no-such-service", hosts.join(",")),
        common::settings(),
    )
    .expect("parses")
    .into_client();
    let outcome = unknown
        .try_acquire(&request(&unknown, "one-url", "op-b", LEASE_TTL))
        .await;
    assert!(
        matches!(outcome, AcquireOutcome::Unavailable(_)),
        "{outcome:?}"
    );
}

/// A permit and a writer's grant made on a master that a failover replaced, and that the new
/// master does not hold, are lost to the replacement with its own reason, as a lease is;
/// permits and writers granted after the failover come from the new master.
#[tokio::test]
async fn a_permit_the_new_master_does_not_hold_is_lost_to_the_replacement() {
    let deployment = RedisSentinel::start();
    let client = sentinel_client(&deployment);
    let permit = client
        .semaphore("s-pool", 2)
        .ttl(Duration::from_secs(30))
        .await
        .expect("free");
    let writer = client
        .write_lock("s-doc")
        .ttl(Duration::from_secs(30))
        .await
        .expect("free");
    assert_eq!(
        deployment.master().cmd(&["WAIT", "1", "5000"]),
        Reply::Int(1)
    );
    let promoted = deployment.failover();
    deployment.wait_until_demoted(deployment.replica());
    let purpose = leasehold_redis::leasehold::Purpose::new("lock").unwrap();
    let keys = client.backend().keys();
    let slot_key = keys
        .semaphore(
            &purpose,
            &leasehold_redis::leasehold::ResourceDigest::of("s-pool"),
        )
        .slot(permit.slot().unwrap());
    let writer_key = keys
        .read_write(
            &purpose,
            &leasehold_redis::leasehold::ResourceDigest::of("s-doc"),
        )
        .writer();
    // The writes the failover lost.
    assert_eq!(
        promoted.cmd(&["DEL", &slot_key, &writer_key]),
        Reply::Int(2)
    );
    for guard in [&permit, &writer] {
        let reason = tokio::time::timeout(Duration::from_secs(25), guard.lost())
            .await
            .expect("told before its margin point");
        assert_eq!(reason, LossReason::MasterReplaced);
    }
    let again = client
        .semaphore("s-pool", 2)
        .await
        .expect("the new master's");
    assert!(again.fence() > permit.fence());
    let _ = again.release().await;
}
