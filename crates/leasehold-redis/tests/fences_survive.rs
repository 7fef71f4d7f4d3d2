//! Fences survive the loss of their counter: after a restart without persistence, a
//! `FLUSHALL`, or a Sentinel failover that loses the writes the old master took in its last
//! moments, every new grant's fence is still above every fence handed out before.
//!
//! The acquire script grants `max(counter + 1, server TIME in µs)`, so a counter that went
//! back (to nothing, or to what the promoted replica had) is overtaken by the clock. With a
//! plain `INCR` the counter starts again from what survived: the restart, `FLUSHALL` and
//! failover-window tests then fail every time, the plain failover test in most runs.
//!
//! A counter also goes by design: every grant gives it a TTL of the counter idle expiry
//! (`RedisSettings::with_counter_idle_expiry`), and the fences after it has expired rise all
//! the same; one that was ahead of the clock is kept until the clock has passed it.
//!
//! Every test prints its figures (`--no-capture`). `LEASEHOLD_SOAK_FAILOVERS` sets the number
//! of forced failovers of each Sentinel test (default 20); `make soak` runs 100.

mod common;

use std::time::{Duration, Instant};

use common::{client, request};
use leasehold_redis::leasehold::{
    AcquireOutcome, FenceToken, HolderName, LeaseHandle, ReleaseOutcome,
};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings};
use test_support::{RedisSentinel, RedisServer, Reply, sentinel::SERVICE};

/// Long enough to outlive a retry loop; a grant whose release was not confirmed blocks the
/// next one for at most this long.
const LEASE_TTL: Duration = Duration::from_secs(5);

/// How long one grant or release may take to get through while a failover or restart settles.
const SETTLE: Duration = Duration::from_secs(20);

/// Failovers per Sentinel test: `LEASEHOLD_SOAK_FAILOVERS`, or 20.
fn failovers() -> usize {
    match std::env::var("LEASEHOLD_SOAK_FAILOVERS") {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("LEASEHOLD_SOAK_FAILOVERS={value:?} is not a count")),
        Err(_) => 20,
    }
}

/// Every fence the caller received, in order, and those that were not above all before.
#[derive(Default)]
struct Fences {
    received: Vec<(String, FenceToken)>,
    reissued: Vec<String>,
}

impl Fences {
    fn record(&mut self, what: String, fence: FenceToken) {
        if let Some((before, highest)) = self.received.iter().max_by_key(|(_, f)| *f)
            && fence <= *highest
        {
            self.reissued.push(format!(
                "{what}: fence {fence}, not above {highest} ({before})"
            ));
        }
        self.received.push((what, fence));
    }

    fn largest(&self) -> Option<FenceToken> {
        self.received.iter().map(|(_, f)| *f).max()
    }

    /// Prints the figures and fails if any fence was re-issued.
    fn check(&self, test: &str, started: Instant) {
        eprintln!(
            "{test}: {} fences received, {} re-issued, largest {}, {:.1?}",
            self.received.len(),
            self.reissued.len(),
            self.largest()
                .map_or_else(|| "none".into(), |f| f.to_string()),
            started.elapsed()
        );
        assert!(
            self.reissued.is_empty(),
            "{} of {} fences were not above every fence before them:\n{}",
            self.reissued.len(),
            self.received.len(),
            self.reissued.join("\n")
        );
    }
}

/// Acquires `resource` for a fresh attempt of `op`, replaying that attempt through
/// `Unavailable` and `Indeterminate` (a restarted server, a failover settling) and waiting out
/// a holder whose release was never confirmed, for at most [`SETTLE`].
async fn grant(client: &RedisLeases, resource: &str, op: &str) -> LeaseHandle<RedisBackend> {
    let req = request(client, resource, op, LEASE_TTL);
    let deadline = Instant::now() + SETTLE;
    for tries in 1.. {
        let last = match client.try_acquire(&req).await {
            AcquireOutcome::Acquired(lease) | AcquireOutcome::Replayed(lease) => return lease,
            outcome @ (AcquireOutcome::Unavailable(_)
            | AcquireOutcome::Indeterminate { .. }
            | AcquireOutcome::Contended(_)) => format!("{outcome:?}"),
            other => panic!("{op}: unexpected {other:?}"),
        };
        assert!(
            Instant::now() < deadline,
            "{op}: no grant within {SETTLE:?} ({tries} tries); last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    unreachable!()
}

/// Releases `lease` until the server answers (released, or already gone with the writes a
/// failover lost), for at most [`SETTLE`].
async fn release(lease: LeaseHandle<RedisBackend>) {
    let deadline = Instant::now() + SETTLE;
    loop {
        match lease.release().await {
            ReleaseOutcome::Released | ReleaseOutcome::AlreadyGone => return,
            outcome @ (ReleaseOutcome::Unavailable(_) | ReleaseOutcome::Indeterminate(_)) => {
                assert!(
                    Instant::now() < deadline,
                    "no release within {SETTLE:?}; last: {outcome:?}"
                );
            }
            other => panic!("release: unexpected {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three grants (so the lost counter was above 1), then `lose` wipes the server, then three
/// more: each fence must be above every one before it.
async fn fences_rise_across(
    server: &mut RedisServer,
    resource: &str,
    lose: impl FnOnce(&mut RedisServer),
) -> Fences {
    let client = client(server);
    let mut fences = Fences::default();
    for i in 0..3 {
        let lease = grant(&client, resource, &format!("before-{i}")).await;
        fences.record(format!("grant {i} before"), lease.fence());
        release(lease).await;
    }
    lose(server);
    // The counter is gone too: only the clock can keep the fences rising.
    assert_eq!(server.keys(), Vec::<String>::new());
    for i in 0..3 {
        let lease = grant(&client, resource, &format!("after-{i}")).await;
        fences.record(format!("grant {i} after"), lease.fence());
        release(lease).await;
    }
    fences
}

#[tokio::test]
async fn fences_rise_across_a_restart_without_persistence() {
    let started = Instant::now();
    let mut server = RedisServer::start();
    let port = server.port();
    let fences = fences_rise_across(&mut server, "survive/restart", |server| {
        server.restart();
    })
    .await;
    assert_eq!(server.port(), port, "restarted on the same port");
    fences.check("restart", started);
}

#[tokio::test]
async fn fences_rise_across_a_flushall() {
    let started = Instant::now();
    let mut server = RedisServer::start();
    let fences = fences_rise_across(&mut server, "survive/flushall", |server| {
        assert_eq!(server.cmd(&["FLUSHALL"]), Reply::Status("OK".into()));
    })
    .await;
    fences.check("flushall", started);
}

/// A Sentinel client with no replication gate: a grant is acknowledged as soon as the master
/// applied it, so a failover can lose it.
fn ungated_sentinel_client(deployment: &RedisSentinel) -> RedisLeases {
    let settings = common::settings()
        .with_command_timeout(Duration::from_secs(1))
        .expect("valid timeout");
    RedisBackend::open_sentinel(&deployment.sentinel_urls(), SERVICE, None, settings)
        .expect("valid sentinel URLs")
        .into_client()
}

/// The fence counter's key for `resource`.
fn fence_key(client: &RedisLeases, resource: &str) -> String {
    let req = request(client, resource, "probe", LEASE_TTL);
    client
        .backend()
        .keys()
        .fence_key(req.purpose(), req.resource())
}

/// The fence counter on `server`; `None` if it dropped the connection. A missing counter is 0.
fn counter_on(server: &RedisServer, counter: &str) -> Option<u64> {
    match server.try_cmd(&["GET", counter]).ok()? {
        Reply::Bulk(None) => Some(0),
        reply => Some(
            reply
                .as_string()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("GET {counter} replied {reply:?}")),
        ),
    }
}

/// Whether `server` has `key`; `None` if it dropped the connection (a Sentinel reconfiguring
/// a node kills its clients).
fn holds(server: &RedisServer, key: &str) -> Option<bool> {
    match server.try_cmd(&["EXISTS", key]).ok()? {
        Reply::Int(n) => Some(n == 1),
        other => panic!("EXISTS replied {other:?}"),
    }
}

/// Grants on the master, then forced failovers, each waited out until the former master is a
/// replica of the promoted one again. Nothing waits for the replica to have every write before
/// a failover, and `SENTINEL FAILOVER` does not either: a replica whose link is up can still be
/// behind, so now and then the promoted one lacks the last grant (with a plain counter this
/// re-issued a fence in most runs of 20 failovers). Such failovers are counted.
#[tokio::test]
async fn fences_rise_across_forced_failovers() {
    let started = Instant::now();
    let deployment = RedisSentinel::start().with_fast_timers();
    let client = ungated_sentinel_client(&deployment);
    let resource = "survive/failover";
    let counter = fence_key(&client, resource);
    let mut fences = Fences::default();
    let mut lost = 0;
    let n = failovers();
    for round in 0..n {
        let lease = grant(&client, resource, &format!("op-{round}")).await;
        let fence = lease.fence();
        fences.record(format!("round {round}"), fence);
        release(lease).await;
        let old = deployment.master().port();
        let promoted = deployment.failover();
        assert_ne!(promoted.port(), old, "round {round}: the master changed");
        if counter_on(promoted, &counter).is_some_and(|c| c < fence.get()) {
            lost += 1;
        }
        deployment.wait_until_settled();
    }
    let lease = grant(&client, resource, "op-last").await;
    fences.record(format!("after round {}", n - 1), lease.fence());
    release(lease).await;
    eprintln!("forced failovers: the promoted replica lacked the last grant in {lost} of {n}");
    fences.check(&format!("{n} forced failovers"), started);
}

/// As above, but after each promotion and before the former master is demoted, one more grant
/// is taken through the client's connection, which still reaches the former master. That
/// master accepts it and hands out a fence; its demotion then throws the write away, counter
/// included. With a plain counter the next grant, on the promoted master, gets that same fence
/// again. Since issue 34 the client does not take that master's answer: the Sentinels name
/// another, so the acquire is sent again to the promoted one, and the grant it holds is there.
#[tokio::test]
async fn fences_rise_when_grants_land_on_a_master_being_replaced() {
    let started = Instant::now();
    let deployment = RedisSentinel::start().with_fast_timers();
    let client = ungated_sentinel_client(&deployment);
    let resource = "survive/window";
    let key = common::lease_key(&client, &request(&client, resource, "probe", LEASE_TTL));
    let mut fences = Fences::default();
    let mut in_window = 0;
    let n = failovers();
    for round in 0..n {
        let lease = grant(&client, resource, &format!("op-{round}")).await;
        fences.record(format!("round {round}"), lease.fence());
        release(lease).await;
        let promoted = deployment.failover();
        let old = deployment.replica();
        let lease = grant(&client, resource, &format!("window-{round}")).await;
        // The former master may have granted it too (lost at its demotion), if the client's
        // connection still reached it; the grant the client took is the promoted one's.
        if holds(old, &key) == Some(true) {
            in_window += 1;
        }
        assert_eq!(
            holds(promoted, &key),
            Some(true),
            "round {round}: the grant the client holds is not on the promoted master"
        );
        fences.record(
            format!("round {round}, in the failover window"),
            lease.fence(),
        );
        release(lease).await;
        assert_eq!(deployment.master().port(), promoted.port(), "round {round}");
        deployment.wait_until_settled();
    }
    let lease = grant(&client, resource, "op-last").await;
    fences.record(format!("after round {}", n - 1), lease.fence());
    release(lease).await;
    eprintln!("failover window: the former master granted {in_window} of {n} acquires too");
    fences.check(&format!("{n} failovers, grants in the window"), started);
    // Otherwise this test would be the one above again.
    assert!(
        in_window > 0,
        "no grant reached the former master while it was being replaced"
    );
}

/// A client of `server` whose grants give counters a TTL of `idle`.
fn idle_client(server: &RedisServer, idle: Duration) -> RedisLeases {
    let settings = RedisSettings::default()
        .with_counter_idle_expiry(idle)
        .expect("a valid idle expiry");
    common::client_with(server, settings)
}

/// The counter's PTTL in milliseconds; panics unless it is there with a TTL from `above` to
/// `at_most`.
fn counter_pttl_within(server: &RedisServer, counter: &str, above: u128, at_most: u128) -> i64 {
    let pttl = common::pttl(server, counter);
    assert!(
        pttl > 0 && (above..=at_most).contains(&u128::try_from(pttl).unwrap()),
        "{counter}: PTTL {pttl} ms, wanted from {above} to {at_most}"
    );
    pttl
}

/// Waits (bounded, looking every 10 ms) until `key` is gone from `server`: a key with a TTL
/// goes within it, as Redis checks the expiry on every access.
async fn until_gone(server: &RedisServer, key: &str, within: Duration) {
    common::eventually(&format!("{key} gone"), within, || {
        holds(server, key) == Some(false)
    })
    .await;
}

/// Every form of the acquire sends the idle expiry, and the grant leaves the counter a TTL of
/// it: the single call with and without its optional arguments, and a batch. The release
/// leaves the counter alone.
#[tokio::test]
async fn every_grant_gives_its_counter_a_ttl_of_the_idle_expiry() {
    let server = RedisServer::start();
    let default = client(&server);
    let idle = Duration::from_secs(90);
    let short = idle_client(&server, idle);
    default.backend().warm_up().await.unwrap();
    short.backend().warm_up().await.unwrap();
    // A test's grant takes milliseconds: a TTL more than 5 s short of the idle expiry is not it.
    let slack = 5_000;
    for (client, idle, name) in [
        (
            &default,
            RedisSettings::default().counter_idle_expiry(),
            "default",
        ),
        (&short, idle, "short"),
    ] {
        let idle_ms = idle.as_millis();
        // The single call, alone.
        let resource = format!("idle/{name}/single");
        let lease = grant(client, &resource, "op").await;
        let counter = fence_key(client, &resource);
        let pttl = counter_pttl_within(&server, &counter, idle_ms - slack, idle_ms);
        release(lease).await;
        assert!(
            common::pttl(&server, &counter) <= pttl,
            "the release moved the TTL"
        );
        counter_pttl_within(&server, &counter, idle_ms - slack, idle_ms);

        // The single call with a minimum hold and a holder name (its optional arguments).
        let resource = format!("idle/{name}/named");
        let req = request(client, &resource, "op", LEASE_TTL)
            .with_min_hold(Duration::from_millis(10))
            .unwrap()
            .with_holder_name(HolderName::new("web-1").unwrap());
        let lease = client.try_acquire(&req).await.into_handle().expect("free");
        counter_pttl_within(
            &server,
            &fence_key(client, &resource),
            idle_ms - slack,
            idle_ms,
        );
        release(lease).await;

        // A batch: the first goes alone, the three that start while it is in flight together.
        let resources: Vec<String> = (0..4).map(|i| format!("idle/{name}/batch-{i}")).collect();
        let requests: Vec<_> = resources
            .iter()
            .map(|r| request(client, r, "op", LEASE_TTL))
            .collect();
        let before = server.commandstats();
        let (alone, together) = tokio::join!(
            client.try_acquire(&requests[0]),
            futures_util::future::join_all(requests[1..].iter().map(|r| client.try_acquire(r)))
        );
        let calls = common::delta(&before, &server.commandstats());
        assert_eq!(calls.get("evalsha"), Some(&2), "one batch: {calls:?}");
        let leases: Vec<_> = std::iter::once(alone)
            .chain(together)
            .map(|outcome| outcome.into_handle().expect("free"))
            .collect();
        for resource in &resources {
            counter_pttl_within(
                &server,
                &fence_key(client, resource),
                idle_ms - slack,
                idle_ms,
            );
        }
        for lease in leases {
            release(lease).await;
        }
    }
}

/// With an idle expiry of a second, each cycle grants, releases and waits until the counter is
/// gone: every new fence is above all before it, taken from the clock. A counter set ahead of
/// the clock is continued, and kept until the clock has passed it (by the idle expiry), not for
/// the idle expiry from the grant: the fence after it is above it too. A script that forgot the
/// counter's value, took no floor from the clock or let a counter ahead of the clock go after
/// the idle expiry fails here.
#[tokio::test]
async fn fences_rise_across_counters_that_expired_idle() {
    let started = Instant::now();
    let server = RedisServer::start();
    let idle = Duration::from_secs(1);
    let client = idle_client(&server, idle);
    let resource = "idle/expired";
    let counter = fence_key(&client, resource);
    let mut fences = Fences::default();
    for cycle in 0..3 {
        let lease = grant(&client, resource, &format!("op-{cycle}")).await;
        fences.record(format!("cycle {cycle}"), lease.fence());
        release(lease).await;
        assert_eq!(holds(&server, &counter), Some(true), "cycle {cycle}");
        until_gone(&server, &counter, idle + Duration::from_secs(5)).await;
    }

    fences.check("idle counters, taken from the clock", started);

    // Three seconds ahead of the clock: only the counter knows the fence it gives now.
    let lead = Duration::from_secs(3);
    let ahead = common::server_micros(&server) + u64::try_from(lead.as_micros()).unwrap();
    server.cmd(&["SET", &counter, &ahead.to_string()]);
    let lease = grant(&client, resource, "op-ahead").await;
    assert_eq!(
        lease.fence().get(),
        ahead + 1,
        "the counter was not continued"
    );
    fences.record("ahead of the clock".into(), lease.fence());
    release(lease).await;
    // The idle expiry plus the fence's lead over the clock, which the grant took a little of.
    let (idle_ms, lead_ms) = (idle.as_millis(), lead.as_millis());
    counter_pttl_within(
        &server,
        &counter,
        idle_ms + lead_ms - 1_000,
        idle_ms + lead_ms + 1,
    );
    until_gone(&server, &counter, idle + lead + Duration::from_secs(5)).await;
    // Gone only once the clock had been past its fence for the idle expiry (less the
    // moment between the script's start, which its TTL counts from, and its read of the clock).
    let clock = common::server_micros(&server);
    let idle_us = u64::try_from(idle.as_micros()).unwrap();
    assert!(
        clock + 5_000 >= ahead + 1 + idle_us,
        "the counter went at {clock} µs, before the clock had been past its fence {} for {idle:?}",
        ahead + 1
    );
    for cycle in 0..2 {
        let lease = grant(&client, resource, &format!("op-after-{cycle}")).await;
        fences.record(
            format!("after the counter ahead, cycle {cycle}"),
            lease.fence(),
        );
        release(lease).await;
        until_gone(&server, &counter, idle + Duration::from_secs(5)).await;
    }
    fences.check("idle counters", started);
}
