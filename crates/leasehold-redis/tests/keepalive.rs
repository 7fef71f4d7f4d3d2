//! Keep-alive on real redis-server: renewals hold a lease, and the loss signal fires in time.

mod common;

use std::time::Duration;

use common::{client, lease_key, request};
use leasehold_redis::leasehold::{
    BootClock, Clock, ErrorKind, KeepAliveSettings, LeaseState, LossReason, ReleaseOutcome,
    Watchdog,
};
use test_support::RedisServer;

#[tokio::test]
async fn renewals_alone_hold_a_lease_across_five_ttls() {
    let server = RedisServer::start();
    let client = client(&server);
    // Long enough that a renewal delayed by a loaded machine still lands before the margin.
    let ttl = Duration::from_millis(800);
    let req = request(&client, "k1", "op-a", ttl);
    let handle = client.try_acquire(&req).await.into_handle().expect("free");
    let fence = handle.fence();
    let watchdog = Watchdog::default();
    let kept = watchdog.keep(handle).unwrap();
    tokio::time::sleep(ttl * 5).await;
    assert!(!kept.signal().is_lost(), "{:?}", kept.signal().reason());
    assert_eq!(kept.handle().state(), LeaseState::Active);
    let stored = server
        .cmd(&["GET", &lease_key(&client, &req)])
        .as_string()
        .unwrap_or_default();
    assert!(
        stored.starts_with(&format!("{fence}:")),
        "the key is not ours: {stored:?}"
    );
    assert_eq!(kept.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_stopped_server_fires_the_signal_before_validity_ends() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "k2", "op-a", Duration::from_secs(1));
    let handle = client.try_acquire(&req).await.into_handle().expect("free");
    let kept = Watchdog::default().keep(handle).unwrap();
    let _paused = server.pause();
    let reason = tokio::time::timeout(Duration::from_secs(5), kept.signal().lost())
        .await
        .expect("the signal never fired");
    let fired_at = BootClock.now();
    assert_eq!(reason, LossReason::Unreachable);
    // The work is told to stop while the handle could still vouch for the lease, so before
    // the server's key could expire and be granted to anyone else.
    assert!(
        fired_at < kept.handle().valid_until(),
        "fired after validity ended"
    );
    assert!(fired_at < kept.handle().observed_server_expiry());
}

#[tokio::test]
async fn a_killed_server_is_unreachable() {
    let mut server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "k3", "op-a", Duration::from_secs(1));
    let handle = client.try_acquire(&req).await.into_handle().expect("free");
    let kept = Watchdog::default().keep(handle).unwrap();
    server.kill();
    let reason = tokio::time::timeout(Duration::from_secs(5), kept.signal().lost())
        .await
        .expect("the signal never fired");
    let fired_at = BootClock.now();
    assert_eq!(reason, LossReason::Unreachable);
    // Refused connections are retried until only the margin is left, and not beyond it.
    assert!(
        fired_at < kept.handle().valid_until(),
        "fired after validity ended"
    );
}

#[tokio::test]
async fn a_key_deleted_by_hand_is_lost_on_the_next_renewal() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "k4", "op-a", Duration::from_millis(600));
    let handle = client.try_acquire(&req).await.into_handle().expect("free");
    let kept = Watchdog::default().keep(handle).unwrap();
    server.cmd(&["DEL", &lease_key(&client, &req)]);
    let reason = tokio::time::timeout(Duration::from_secs(5), kept.signal().lost())
        .await
        .expect("the signal never fired");
    assert_eq!(reason, LossReason::LostToAnother);
    assert_eq!(kept.handle().state(), LeaseState::Lost);
}

#[tokio::test]
async fn no_renewal_follows_the_release_of_a_kept_lease() {
    let server = RedisServer::start();
    let client = client(&server);
    let ttl = Duration::from_millis(150);
    let req = request(&client, "k5", "op-a", ttl);
    let handle = client.try_acquire(&req).await.into_handle().expect("free");
    let kept = Watchdog::default().keep(handle).unwrap();
    tokio::time::sleep(ttl).await;
    assert_eq!(kept.release().await, ReleaseOutcome::Released);
    let after = server.commandstats();
    // Several cadences pass: a renewal, had one been sent, would show as an EVALSHA.
    tokio::time::sleep(ttl * 2).await;
    let sent = common::client_commands(&common::delta(&after, &server.commandstats()));
    assert!(sent.is_empty(), "sent after release: {sent:?}");
}

#[tokio::test]
async fn work_under_a_lease_is_cancelled_on_loss_and_the_lease_released_after() {
    let server = RedisServer::start();
    let client = client(&server);
    let watchdog = Watchdog::default();
    // Completes: the output and a release.
    // The work outlasts the TTL: only renewals keep it going.
    let req = request(&client, "k6", "op-a", Duration::from_millis(900));
    let handle = client.try_acquire(&req).await.into_handle().expect("free");
    let done = watchdog
        .run(handle, async {
            tokio::time::sleep(Duration::from_millis(1200)).await;
            42
        })
        .await
        .unwrap();
    assert_eq!(done.result, Ok(42));
    assert_eq!(done.release, ReleaseOutcome::Released);
    // Lost mid-work: the work is dropped and the reason reported.
    let req = request(&client, "k7", "op-a", Duration::from_millis(300));
    let handle = client.try_acquire(&req).await.into_handle().expect("free");
    let key = lease_key(&client, &req);
    let deleting = {
        let port = server.port();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            let cmd = format!("*2\r\n$3\r\nDEL\r\n${}\r\n{key}\r\n", key.len());
            std::io::Write::write_all(&mut s, cmd.as_bytes()).unwrap();
        })
    };
    let lost = watchdog
        .run(handle, std::future::pending::<()>())
        .await
        .unwrap();
    deleting.await.unwrap();
    let uncovered = lost.result.expect_err("cancelled");
    assert_eq!(uncovered.reason, LossReason::LostToAnother);
    assert_eq!(uncovered.output, None);
}

/// A grant deleted (or evicted, flushed, lost in a restart) between two renewals, by work
/// that then finishes before the next one: only the release can tell, and it must not be
/// reported as covered.
#[tokio::test]
async fn work_that_finishes_after_its_grant_vanished_is_not_covered() {
    let server = RedisServer::start();
    let client = client(&server);
    let watchdog = Watchdog::default();
    for wipe in [["DEL", "<key>"], ["FLUSHALL", ""]] {
        let req = request(&client, "k10", "op-a", Duration::from_secs(30));
        let key = lease_key(&client, &req);
        let wipe: Vec<&str> = wipe
            .iter()
            .filter(|a| !a.is_empty())
            .map(|a| if *a == "<key>" { key.as_str() } else { a })
            .collect();
        let handle = client.try_acquire(&req).await.into_handle().expect("free");
        let scoped = watchdog
            .run(handle, async {
                server.cmd(&wipe);
                "done"
            })
            .await
            .unwrap();
        assert_eq!(scoped.release, ReleaseOutcome::AlreadyGone, "{wipe:?}");
        assert!(scoped.release.ended_early());
        let uncovered = scoped.result.expect_err("reported as covered");
        assert_eq!(uncovered.reason, LossReason::LostToAnother, "{wipe:?}");
        assert_eq!(uncovered.output, Some("done"));
    }
    // A kept lease whose grant vanished: its release says so, and so does its signal.
    let req = request(&client, "k12", "op-a", Duration::from_secs(30));
    let handle = client.try_acquire(&req).await.into_handle().expect("free");
    let kept = watchdog.keep(handle).unwrap();
    let signal = kept.signal().clone();
    server.cmd(&["DEL", &lease_key(&client, &req)]);
    assert_eq!(kept.release().await, ReleaseOutcome::AlreadyGone);
    assert_eq!(signal.reason(), Some(LossReason::LostToAnother));
    // A kept lease released after another was granted the key: NotOwner, and the signal says
    // the lease was lost, not released.
    let req = request(&client, "k11", "op-a", Duration::from_secs(30));
    let handle = client.try_acquire(&req).await.into_handle().expect("free");
    let kept = watchdog.keep(handle).unwrap();
    let signal = kept.signal().clone();
    server.cmd(&["DEL", &lease_key(&client, &req)]);
    let other = client
        .try_acquire(&request(&client, "k11", "op-b", Duration::from_secs(30)))
        .await
        .into_handle()
        .expect("free again");
    assert_eq!(kept.release().await, ReleaseOutcome::NotOwner);
    assert_eq!(signal.reason(), Some(LossReason::LostToAnother));
    assert_eq!(other.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_full_watchdog_refuses_with_a_typed_error() {
    let server = RedisServer::start();
    let client = client(&server);
    let watchdog = Watchdog::new(KeepAliveSettings::default().with_max_leases(1).unwrap());
    let a = client
        .try_acquire(&request(&client, "k8", "op-a", Duration::from_secs(5)))
        .await
        .into_handle()
        .unwrap();
    let b = client
        .try_acquire(&request(&client, "k9", "op-b", Duration::from_secs(5)))
        .await
        .into_handle()
        .unwrap();
    let kept = watchdog.keep(a).unwrap();
    let (error, b) = watchdog.keep(b).unwrap_err().into_parts();
    assert_eq!(error.kind(), ErrorKind::WatchdogFull);
    assert_eq!(b.release().await, ReleaseOutcome::Released);
    assert_eq!(kept.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn one_watchdog_keeps_many_leases_alive_with_few_renewals_in_flight() {
    let server = RedisServer::start();
    let client = client(&server);
    // 500 leases past two TTLs, at most 16 renewals in flight: the rest queue and still
    // come round well inside the margin (a round of 500 takes milliseconds on loopback).
    let ttl = Duration::from_secs(3);
    let watchdog = Watchdog::new(KeepAliveSettings::default().with_max_in_flight(16).unwrap());
    let mut kept = Vec::new();
    let mut keys = Vec::new();
    for i in 0..500 {
        let req = request(&client, &format!("many-{i}"), "op-a", ttl);
        let handle = client.try_acquire(&req).await.into_handle().expect("free");
        keys.push((lease_key(&client, &req), handle.fence()));
        kept.push(watchdog.keep(handle).unwrap());
    }
    let before = server.commandstats();
    tokio::time::sleep(ttl * 2 + Duration::from_millis(500)).await;
    let sent = common::delta(&before, &server.commandstats());
    // Each renewed grant is one PEXPIRE inside renew.lua; renewals that come due together
    // share one EVALSHA.
    let renewals = sent.get("pexpire").copied().unwrap_or(0);
    let calls = sent.get("evalsha").copied().unwrap_or(0);
    assert!(
        calls >= 1 && calls <= renewals,
        "{calls} calls for {renewals} renewals"
    );
    let lost: Vec<_> = kept.iter().filter_map(|k| k.signal().reason()).collect();
    assert!(lost.is_empty(), "lost: {lost:?}");
    // What the watchdog knows of its load: 500 leases needing one renewal a second each, and
    // a capacity measured from its renewals (16 slots over a renewal's time on loopback, or
    // its task's own rate), which kept them all and so is above that.
    assert_eq!(watchdog.renewals_needed(), 500.0);
    let capacity = watchdog
        .renewal_capacity()
        .expect("measured after 6 s of renewals");
    eprintln!("500 leases of 3 s, 16 renewals in flight: capacity measured {capacity:.0}/s");
    assert!(capacity > 500.0, "{capacity}");
    // 6.5 cadences passed: each lease was renewed six or seven times (five if a loaded
    // machine delayed every round), never more.
    assert!((2_500..=3_500).contains(&renewals), "{renewals} renewals");
    for (key, fence) in &keys {
        let stored = server.cmd(&["GET", key]).as_string().unwrap_or_default();
        assert!(
            stored.starts_with(&format!("{fence}:")),
            "{key} is not ours"
        );
    }
    for k in kept {
        assert_eq!(k.release().await, ReleaseOutcome::Released);
    }
    assert_eq!(watchdog.renewals_needed(), 0.0);
}
