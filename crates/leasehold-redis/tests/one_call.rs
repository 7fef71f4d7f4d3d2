//! The one-call layer on real redis-server: `client.lock(..)` guards and `client.run(..)`,
//! kept alive by the client's own watchdog, with every guarantee of the explicit API.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::client;
use leasehold_redis::leasehold::{
    BootClock, Clock, ErrorKind, LockError, LossReason, Purpose, ReleaseOutcome, ResourceDigest,
    RunError,
};
use leasehold_redis::{RedisBackend, RedisLeases};
use test_support::{FaultProxy, ProxyFault, RedisServer};

/// The key a `lock(name)` with the default purpose lands on.
fn lock_key(client: &RedisLeases, name: &str) -> String {
    client.backend().keys().lease_key(
        &Purpose::new(leasehold_redis::leasehold::lock::DEFAULT_PURPOSE).unwrap(),
        &ResourceDigest::of(name),
    )
}

fn stored(server: &RedisServer, key: &str) -> Option<String> {
    server.cmd(&["GET", key]).as_string()
}

#[tokio::test]
async fn a_guard_is_renewed_by_the_client_past_several_ttls() {
    let server = RedisServer::start();
    let client = client(&server);
    let ttl = Duration::from_millis(800);
    let guard = client.lock("orders/42").ttl(ttl).await.expect("free");
    let fence = guard.fence();
    tokio::time::sleep(ttl * 4).await;
    assert!(!guard.is_lost(), "{:?}", guard.signal().reason());
    assert!(guard.remaining_validity() > Duration::ZERO);
    let value = stored(&server, &lock_key(&client, "orders/42")).unwrap_or_default();
    assert!(
        value.starts_with(&format!("{fence}:")),
        "not ours: {value:?}"
    );
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
    assert_eq!(stored(&server, &lock_key(&client, "orders/42")), None);
}

#[tokio::test]
async fn a_frozen_server_fires_the_guard_signal_before_its_validity_ends() {
    let server = RedisServer::start();
    let client = client(&server);
    let guard = client
        .lock("frozen")
        .ttl(Duration::from_secs(1))
        .await
        .expect("free");
    let _paused = server.pause();
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the signal never fired");
    let fired_at = BootClock.now();
    assert_eq!(reason, LossReason::Unreachable);
    assert!(
        fired_at < guard.handle().valid_until(),
        "fired after validity ended"
    );
}

/// Sets its flag when dropped: shows that `run` cancelled (dropped) the work.
struct Dropped(Arc<AtomicBool>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn run_cancels_the_work_on_loss_and_says_why() {
    let server = RedisServer::start();
    let client = client(&server);
    let cancelled = Arc::new(AtomicBool::new(false));
    let flag = Dropped(Arc::clone(&cancelled));
    let paused = std::sync::Mutex::new(None);
    let result = client
        .run("report", Duration::from_secs(1), |lease| {
            let _ = lease.fence();
            // The server freezes while the work runs; the work itself never ends.
            *paused.lock().unwrap() = Some(server.pause());
            async move {
                let _flag = flag;
                std::future::pending::<()>().await
            }
        })
        .await;
    match result {
        Err(RunError::Lost { reason, .. }) => assert_eq!(reason, LossReason::Unreachable),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(cancelled.load(Ordering::SeqCst), "the work was not dropped");
    drop(paused.lock().unwrap().take());
}

#[tokio::test]
async fn run_returns_the_output_of_covered_work_and_releases() {
    let server = RedisServer::start();
    let client = client(&server);
    let key = lock_key(&client, "nightly-report");
    let output = client
        .run("nightly-report", Duration::from_secs(5), |lease| {
            let held = stored(&server, &key).unwrap_or_default();
            async move { (lease.fence(), held) }
        })
        .await
        .expect("covered");
    let (fence, held) = output;
    assert!(held.starts_with(&format!("{fence}:")), "{held:?}");
    assert_eq!(stored(&server, &key), None, "not released");
}

#[tokio::test]
async fn a_second_lock_is_contended_then_waits_for_the_release_notice() {
    let server = RedisServer::start();
    let client = client(&server);
    let ttl = Duration::from_secs(30);
    let first = client.lock("jobs").ttl(ttl).await.expect("free");
    match client.lock("jobs").ttl(ttl).await {
        Err(LockError::Contended(c)) => assert_eq!(c.fence, Some(first.fence())),
        other => panic!("expected Contended, got {other:?}"),
    }
    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock("jobs")
                .ttl(ttl)
                .wait(Duration::from_secs(10))
                .await
        })
    };
    let first_fence = first.fence();
    // Far below the holder's 30 s TTL: only the release notice explains a hand-off in time.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(first.release().await, ReleaseOutcome::Released);
    let second = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("no hand-off within 5 s of the release")
        .unwrap()
        .expect("granted");
    assert!(second.fence() > first_fence);
    assert_eq!(second.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn an_unknown_acquire_inside_the_wait_is_resolved_by_a_replay_with_one_grant() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let client = RedisBackend::open(&proxy.url(), common::settings())
        .expect("valid URL")
        .into_client();
    client.backend().warm_up().await.expect("warm-up");
    let key = lock_key(&client, "lost-reply");
    // Every reply is lost until the grant is on the server; then replies pass again.
    proxy.to_client(ProxyFault::Reset);
    let lock = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock("lost-reply")
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(20))
                .await
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !server.keys().contains(&key) {
        assert!(
            std::time::Instant::now() < deadline,
            "the acquire never landed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.to_client(ProxyFault::Pass);
    let guard = lock.await.unwrap().expect("resolved by a replay");
    // One grant: the counter stands at the guard's fence, and the key holds it.
    assert_eq!(
        server.cmd(&["GET", &format!("{key}:fence")]).as_string(),
        Some(guard.fence().to_string()),
        "a second grant was made"
    );
    let value = stored(&server, &key).unwrap_or_default();
    assert!(
        value.starts_with(&format!("{}:", guard.fence())),
        "{value:?}"
    );
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_server_that_is_down_is_retried_within_the_wait() {
    let mut server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.expect("warm-up");
    server.kill();
    let lock = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock("comes-back")
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(20))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!lock.is_finished(), "gave up while the wait had time left");
    server.restart();
    let guard = lock
        .await
        .unwrap()
        .expect("granted once the server was back");
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn an_unreachable_server_is_unavailable_at_the_deadline() {
    let mut server = RedisServer::start();
    let client = client(&server);
    server.kill();
    match client.lock("gone").wait(Duration::from_millis(300)).await {
        Err(e @ LockError::Unavailable(_)) => assert!(e.is_definite(), "{e}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn dropping_a_guard_releases_it_in_the_background() {
    let server = RedisServer::start();
    let client = client(&server);
    let key = lock_key(&client, "dropped");
    let guard = client.lock("dropped").await.expect("free");
    let signal = guard.signal().clone();
    assert!(stored(&server, &key).is_some());
    drop(guard);
    tokio::time::timeout(Duration::from_secs(5), client.settle())
        .await
        .expect("the background release never ended");
    assert_eq!(
        stored(&server, &key),
        None,
        "the dropped guard was not released"
    );
    assert_eq!(signal.reason(), Some(LossReason::Released));
    // And the next caller gets it at once.
    let next = client.lock("dropped").await.expect("free again");
    assert_eq!(next.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_ttl_the_watchdog_cannot_keep_is_refused_before_any_io() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.expect("warm-up");
    let before = server.commandstats();
    match client.lock("short").ttl(Duration::from_millis(12)).await {
        Err(LockError::Refused(e)) => assert_eq!(e.kind(), ErrorKind::InvalidSetting, "{e}"),
        other => panic!("expected Refused, got {other:?}"),
    }
    match client
        .lock("long-wait")
        .wait(Duration::from_secs(2 * 60 * 60))
        .await
    {
        Err(LockError::Refused(e)) => assert_eq!(e.kind(), ErrorKind::InvalidWaitTimeout),
        other => panic!("expected Refused, got {other:?}"),
    }
    let sent = common::client_commands(&common::delta(&before, &server.commandstats()));
    assert!(sent.is_empty(), "sent {sent:?}");
    assert!(server.keys().is_empty());
}

#[tokio::test]
async fn the_guard_debug_output_never_shows_the_owner_token() {
    let server = RedisServer::start();
    let client = client(&server);
    let guard = client.lock("secret").await.expect("free");
    let token = guard
        .handle()
        .attempt()
        .owner_token()
        .expose_secret()
        .to_owned();
    let text = format!("{guard:?} {:?}", client.lock("other"));
    assert!(!text.contains(&token), "{text}");
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_minimum_hold_keeps_a_second_caller_out_after_release_then_lets_it_in() {
    let server = RedisServer::start();
    let client = client(&server);
    let hold = Duration::from_millis(1500);
    let first = client
        .lock("nightly")
        .ttl(Duration::from_secs(30))
        .min_hold(hold)
        .await
        .expect("free");
    let fence = first.fence();
    assert_eq!(first.release().await, ReleaseOutcome::Released);
    let started = std::time::Instant::now();
    match client.lock("nightly").await {
        Err(LockError::Contended(c)) => {
            assert_eq!(c.fence, Some(fence));
            assert!(c.retry_after <= hold, "{c}");
        }
        other => panic!("expected Contended after an early release, got {other:?}"),
    }
    // A waiter gets it once the hold has passed: no notice comes, the retry-after does it.
    let second = client
        .lock("nightly")
        .wait(Duration::from_secs(10))
        .await
        .expect("granted after the hold");
    assert!(started.elapsed() < hold + Duration::from_secs(5));
    assert!(second.fence() > fence);
    assert_eq!(second.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_holder_name_given_to_lock_is_what_inspect_shows() {
    let server = RedisServer::start();
    let client = client(&server);
    let name = leasehold_redis::leasehold::HolderName::new("worker-7 (pid 42)").unwrap();
    let guard = client
        .lock("named")
        .holder_name(name.clone())
        .await
        .expect("free");
    let purpose = Purpose::new(leasehold_redis::leasehold::lock::DEFAULT_PURPOSE).unwrap();
    match client
        .inspect(&purpose, &ResourceDigest::of("named"), None)
        .await
    {
        leasehold_redis::leasehold::InspectOutcome::HeldByOther(view) => {
            assert_eq!(view.holder_name, Some(name));
            assert_eq!(view.fence, Some(guard.fence()));
        }
        other => panic!("expected HeldByOther, got {other:?}"),
    }
    assert_eq!(guard.release().await, ReleaseOutcome::Released);
}
