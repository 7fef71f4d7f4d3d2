//! Shared helpers for the real-Redis tests: each test starts its own redis-server.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use leasehold_redis::leasehold::{
    AcquireOutcome, LeaseHandle, LeaseRequest, OperationId, Purpose, ReleaseOutcome, ResourceDigest,
};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings, Transport};

/// A parked waiter: its outcome and the instant it returned.
pub type Waiting = tokio::task::JoinHandle<(AcquireOutcome<RedisBackend>, Instant)>;

/// Releases `first` and requires the parked waiter to be granted within `within` of the
/// release. With a holder TTL far above `within`, only the release notice explains it.
pub async fn release_and_expect_hand_off(
    first: LeaseHandle<RedisBackend>,
    waiting: Waiting,
    within: Duration,
) {
    let released_at = Instant::now();
    assert_eq!(first.release().await, ReleaseOutcome::Released);
    let (outcome, acquired_at) = waiting.await.unwrap();
    assert!(matches!(outcome, AcquireOutcome::Acquired(_)), "{outcome}");
    assert!(
        acquired_at - released_at < within,
        "{:?}",
        acquired_at - released_at
    );
}
use test_support::{RedisServer, Reply};

/// The transport the suites run on (D49): `LEASEHOLD_TEST_TRANSPORT`, `direct` (the default)
/// or `redis-rs`. `make test` runs the fault, regression, cancellation and Sentinel suites on
/// both.
pub fn transport() -> Transport {
    match std::env::var("LEASEHOLD_TEST_TRANSPORT") {
        Err(_) => Transport::Direct,
        Ok(name) => Transport::parse(&name)
            .unwrap_or_else(|_| panic!("LEASEHOLD_TEST_TRANSPORT={name:?}: direct or redis-rs")),
    }
}

/// The default settings, on the suite's transport.
pub fn settings() -> RedisSettings {
    RedisSettings::default().with_transport(transport())
}

/// A client of `server` with `settings`, on the suite's transport.
pub fn client_with(server: &RedisServer, settings: RedisSettings) -> RedisLeases {
    RedisBackend::open(&server.url(), settings.with_transport(transport()))
        .expect("valid URL")
        .into_client()
}

pub fn client(server: &RedisServer) -> RedisLeases {
    client_with(server, RedisSettings::default())
}

/// A request with a fresh attempt for operation `op` on the raw resource `resource`.
pub fn request(client: &RedisLeases, resource: &str, op: &str, ttl: Duration) -> LeaseRequest {
    let attempt = client
        .new_attempt(OperationId::new(op).expect("valid op id"))
        .expect("entropy");
    client
        .request(
            Purpose::new("test").expect("valid purpose"),
            ResourceDigest::of(resource),
            attempt,
            ttl,
        )
        .expect("valid request")
}

/// The lease key of `request` on the server, as the default settings lay it out.
pub fn lease_key(client: &RedisLeases, request: &LeaseRequest) -> String {
    client
        .backend()
        .keys()
        .lease_key(request.purpose(), request.resource())
}

/// Commands the lease scripts run *inside* EVALSHA; INFO commandstats counts them too.
pub const SCRIPT_INTERNAL: &[&str] = &[
    "get", "getrange", "strlen", "exists", "set", "incr", "time", "pttl", "pexpire", "del",
    "publish", "spublish", "hget", "hset", "append",
];

/// Calls per command between two commandstats snapshots, leaving out INFO itself.
pub fn delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .filter_map(|(name, &calls)| {
            let d = calls - before.get(name).copied().unwrap_or(0);
            (d > 0).then(|| (name.clone(), d))
        })
        .collect()
}

/// The client-issued commands of a delta: everything but what scripts ran inside.
pub fn client_commands(delta: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    delta
        .iter()
        .filter(|(name, _)| !SCRIPT_INTERNAL.contains(&name.as_str()))
        .map(|(n, c)| (n.clone(), *c))
        .collect()
}

pub fn pttl(server: &RedisServer, key: &str) -> i64 {
    server
        .cmd(&["PTTL", key])
        .as_int()
        .expect("PTTL returns an integer")
}

/// The server's clock in microseconds (`TIME`): a new grant's fence is never below it.
pub fn server_micros(server: &RedisServer) -> u64 {
    let test_support::Reply::Array(Some(parts)) = server.cmd(&["TIME"]) else {
        panic!("TIME did not answer an array");
    };
    let part = |i: usize| -> u64 {
        parts[i]
            .as_string()
            .and_then(|s| s.parse().ok())
            .expect("TIME's parts are decimals")
    };
    part(0) * 1_000_000 + part(1)
}

/// The fence counter of `request`'s lease, as stored.
pub fn fence_counter(
    server: &RedisServer,
    client: &RedisLeases,
    request: &LeaseRequest,
) -> Option<String> {
    server
        .cmd(&["GET", &format!("{}:fence", lease_key(client, request))])
        .as_string()
}

/// Every key with its serialized value (`DUMP`), to show that a command changed nothing.
pub fn snapshot(server: &RedisServer) -> Vec<(String, test_support::Reply)> {
    let mut keys = server.keys();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let value = server.cmd(&["DUMP", &key]);
            (key, value)
        })
        .collect()
}

/// Shard-channel subscribers of `channel` on `node` (`PUBSUB SHARDNUMSUB`).
pub fn shard_subscribers(node: &RedisServer, channel: &str) -> i64 {
    match node.cmd(&["PUBSUB", "SHARDNUMSUB", channel]) {
        Reply::Array(Some(items)) => items.get(1).and_then(Reply::as_int).unwrap_or(0),
        other => panic!("PUBSUB SHARDNUMSUB replied {other:?}"),
    }
}

/// Returns true if and only if the lease key `key` on `node` holds a marked grant: one that
/// someone was refused, whose release is announced (D48; `acquire.lua` describes the mark).
pub fn is_marked(node: &RedisServer, key: &str) -> bool {
    node.cmd(&["GET", key])
        .as_string()
        .is_some_and(|value| value.matches('\n').count() == 3 && value.ends_with('\n'))
}

/// Looks every 10 ms until `done`, and panics naming `what` if it is not within `within`.
pub async fn eventually(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (bounded) until the grant at `key` on `node` is marked: a waiter has tried and been
/// refused, so the release is announced. A release before that would be heard by no one, and
/// the waiter's first try would find the key free.
pub async fn until_marked(node: &RedisServer, key: &str) {
    eventually(&format!("a mark on {key}"), Duration::from_secs(5), || {
        is_marked(node, key)
    })
    .await;
}

/// Waits (bounded) until `node` has a shard subscriber on `channel`.
pub async fn until_shard_subscribed(node: &RedisServer, channel: &str) {
    eventually(
        &format!("a shard subscriber on {channel}"),
        Duration::from_secs(5),
        || shard_subscribers(node, channel) >= 1,
    )
    .await;
}
