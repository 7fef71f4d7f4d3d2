//! Every log line at trace level, through a library run on a real redis-server with a
//! password: acquires (contended, waiting, granted), renewals, an unknown acquire replayed
//! and cleaned up behind, a loss, releases, inspections and a refused password. The lines
//! name what happened and never show an owner token, the password or the resource's name.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold_redis::leasehold::{AcquireOutcome, OperationId, Purpose, ResourceDigest};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings};
use test_support::{FaultProxy, ProxyFault, RedisServer};

const PASSWORD: &str = "pw-7f3a-never-logged";
const RESOURCE: &str = "orders/secret-42";

/// Log lines, shared with the subscriber that writes them.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn open(url: &str) -> RedisLeases {
    RedisBackend::open(url, RedisSettings::default())
        .unwrap()
        .into_client()
}

/// The run whose logs are read; returns the owner tokens it used.
async fn library_run(server: &RedisServer) -> Vec<String> {
    let port = server.port();
    let url = format!("redis://app:{PASSWORD}@127.0.0.1:{port}");
    let (a, b) = (open(&url), open(&url));
    let mut tokens = Vec::new();

    // A holds with renewals; B waits for it and is granted on A's release.
    let first = a
        .lock(RESOURCE)
        .ttl(Duration::from_millis(600))
        .await
        .unwrap();
    tokens.push(
        first
            .handle()
            .attempt()
            .owner_token()
            .expose_secret()
            .to_owned(),
    );
    let waiting = tokio::spawn(async move {
        b.lock(RESOURCE)
            .ttl(Duration::from_millis(600))
            .wait(Duration::from_secs(10))
            .await
            .map(|guard| (b, guard))
    });
    tokio::time::sleep(Duration::from_millis(900)).await;
    let _ = first.release().await;
    let (b, second) = waiting.await.unwrap().unwrap();
    tokens.push(
        second
            .handle()
            .attempt()
            .owner_token()
            .expose_secret()
            .to_owned(),
    );

    // B's key is deleted behind its back: its next renewal finds it lost.
    server.cmd(&["FLUSHALL"]);
    let _ = tokio::time::timeout(Duration::from_secs(2), second.lost()).await;
    drop(second);
    b.settle().await;

    // An acquire whose reply never comes: unknown, replayed, and cleaned up behind.
    let proxy = FaultProxy::start(server.addr());
    let through = open(&format!(
        "redis://app:{PASSWORD}@127.0.0.1:{}",
        proxy.addr().port()
    ));
    through.backend().warm_up().await.unwrap();
    let attempt = through
        .new_attempt(OperationId::new("op-unknown").unwrap())
        .unwrap();
    tokens.push(attempt.owner_token().expose_secret().to_owned());
    let request = through
        .request(
            Purpose::new("lock").unwrap(),
            ResourceDigest::of(RESOURCE),
            attempt,
            Duration::from_secs(5),
        )
        .unwrap();
    proxy.to_client(ProxyFault::Hold);
    let outcome = through.try_acquire(&request).await;
    let AcquireOutcome::Indeterminate { cause, .. } = outcome else {
        panic!("expected an unknown outcome, got {outcome:?}");
    };
    proxy.to_client(ProxyFault::Pass);
    let _ = through
        .resolve(&request, cause, Duration::from_secs(2))
        .await;
    let _ = through.abandon(&request, Duration::from_secs(2)).await;
    let _ = through
        .inspect(request.purpose(), request.resource(), None)
        .await;

    // A wrong password is refused; the attempt is refused, the password never repeated.
    let wrong = open(&format!("redis://app:wrong-{PASSWORD}@127.0.0.1:{port}"));
    let _ = wrong.lock(RESOURCE).ttl(Duration::from_secs(1)).await;
    tokens
}

#[tokio::test]
async fn trace_logs_name_what_happened_and_never_show_a_token_or_password() {
    let server = RedisServer::start_with_args(&[
        "--user",
        "app",
        "on",
        &format!(">{PASSWORD}"),
        "~leasehold:*",
        "&leasehold:*",
        "+@all",
    ]);
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let tokens = {
        let _default = tracing::subscriber::set_default(subscriber);
        library_run(&server).await
    };
    let logs = captured.text();
    if std::env::var("SHOW_LOGS").is_ok() {
        eprintln!("{logs}");
    }
    for expected in [
        "acquire",
        "renewed",
        "release",
        "lease state changed",
        "lease lost",
        "lost_to_another",
        "unknown acquire replayed",
        "cleaned up behind an unknown acquire",
        "inspected",
        "purpose=lock",
        // The backend's own events: one per command, with its script and latency, never its
        // arguments.
        "command=\"EVALSHA\" script=\"acquire\" us=",
        "command=\"EVAL\" script=\"release\" us=",
    ] {
        assert!(logs.contains(expected), "no {expected:?} in:\n{logs}");
    }
    assert_eq!(tokens.len(), 3);
    for token in &tokens {
        assert!(
            !logs.contains(token.as_str()),
            "an owner token was logged:\n{logs}"
        );
    }
    assert!(!logs.contains(PASSWORD), "the password was logged:\n{logs}");
    assert!(
        !logs.contains("secret-42"),
        "the resource's name was logged:\n{logs}"
    );
    // The digest shows as a prefix only.
    let digest = ResourceDigest::of(RESOURCE).to_string();
    assert!(logs.contains(&digest["sha256:".len()..][..12]), "{logs}");
    assert!(!logs.contains(&digest["sha256:".len()..]), "{logs}");
}
