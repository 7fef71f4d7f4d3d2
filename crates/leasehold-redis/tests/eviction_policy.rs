//! The backend looks at the server's `maxmemory-policy` once and warns, through `tracing`,
//! when the policy can evict leases; a server that will not say is not an error.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{client, request};
use leasehold_redis::leasehold::ReleaseOutcome;
use leasehold_redis::{RedisBackend, RedisSettings};
use test_support::RedisServer;

/// Every line logged at WARN and above while `run` runs, on this thread.
async fn warnings_during<F: Future<Output = ()>>(run: F) -> Vec<String> {
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    {
        // The test runs on a current-thread runtime: every task it starts logs here.
        let _default = tracing::subscriber::set_default(subscriber);
        run.await;
    }
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    text.lines().map(str::to_owned).collect()
}

/// Acquires, releases, drops the connection and does it again: two connections, one check.
async fn use_twice(server: &RedisServer, client: &leasehold_redis::RedisLeases) {
    for round in 0..2 {
        let req = request(
            client,
            "evict",
            &format!("op-{round}"),
            Duration::from_secs(5),
        );
        // After the kill the first try meets the dead connection (unknown); a replay of the
        // same attempt connects again.
        let mut tries = 0;
        let lease = loop {
            tries += 1;
            match client.try_acquire(&req).await.into_handle() {
                Some(lease) => break lease,
                None => assert!(tries < 3, "round {round}: not held after {tries} tries"),
            }
        };
        assert_eq!(lease.release().await, ReleaseOutcome::Released);
        server.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    }
}

#[tokio::test]
async fn a_policy_that_can_evict_leases_is_warned_of_once() {
    for (policy, said) in [
        (
            "volatile-lru",
            "can evict live leases (every lease has a TTL)",
        ),
        ("allkeys-lfu", "can evict live leases and fence counters"),
    ] {
        let server =
            RedisServer::start_with_args(&["--maxmemory", "64mb", "--maxmemory-policy", policy]);
        let client = client(&server);
        let warnings = warnings_during(use_twice(&server, &client)).await;
        assert_eq!(warnings.len(), 1, "{policy}: {warnings:#?}");
        assert!(warnings[0].contains(policy), "{warnings:#?}");
        assert!(warnings[0].contains(said), "{warnings:#?}");
    }
}

#[tokio::test]
async fn noeviction_or_no_limit_is_not_warned_of() {
    for args in [
        &["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"][..],
        &["--maxmemory-policy", "allkeys-lru"][..],
    ] {
        let server = RedisServer::start_with_args(args);
        let client = client(&server);
        let warnings = warnings_during(use_twice(&server, &client)).await;
        assert!(warnings.is_empty(), "{args:?}: {warnings:#?}");
    }
}

#[tokio::test]
async fn a_user_denied_config_still_gets_leases() {
    let server = RedisServer::start_with_args(&[
        "--maxmemory",
        "64mb",
        "--maxmemory-policy",
        "volatile-lru",
        "--user",
        "app",
        "on",
        ">app-pass",
        "~leasehold:*",
        "&leasehold:*",
        "+@all",
        "-config",
    ]);
    let client = RedisBackend::open(
        &format!("redis://app:app-pass@127.0.0.1:{}", server.port()),
        RedisSettings::default(),
    )
    .expect("valid URL")
    .into_client();
    let warnings = warnings_during(use_twice(&server, &client)).await;
    // Not checked, not an error, and nothing at WARN.
    assert!(warnings.is_empty(), "{warnings:#?}");
}
