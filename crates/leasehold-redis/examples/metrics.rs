//! Metrics for Prometheus: three workers take turns on one lock (they wait, renew, release,
//! and one gives up), and `GET /metrics` on 127.0.0.1:9898 answers in Prometheus text format.
//!
//! `cargo run -p leasehold-redis --features metrics --example metrics` against
//! `$LEASEHOLD_REDIS_URL` (default `redis://127.0.0.1:6379`); then
//! `curl -s 127.0.0.1:9898/metrics | grep leasehold_`. `$LEASEHOLD_METRICS_ADDR` moves the
//! listener; `--once` runs one round, prints what `/metrics` would answer, and exits.
//!
//! Any `metrics` recorder works: leasehold records through the `metrics` facade and never
//! installs one itself. This one renders with `metrics-exporter-prometheus`.

use std::time::Duration;

use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// How long each turn works: past the TTL, so the keep-alive renews.
const TURN: Duration = Duration::from_millis(700);

fn lock(client: &RedisLeases) -> leasehold_redis::leasehold::LockBuilder<'_, RedisBackend> {
    client.lock("report/daily").ttl(Duration::from_millis(600))
}

/// A worker's turn: wait for the lock, work, release.
async fn worker(client: RedisLeases, worker: u32) -> Res<()> {
    let guard = lock(&client).wait(Duration::from_secs(10)).await?;
    tokio::time::sleep(TURN).await;
    println!("worker {worker}: {}", guard.release().await);
    Ok(())
}

/// A round: worker 1 takes the lock, workers 2 and 3 wait for it, and one try finds it held
/// and gives up.
async fn round(client: &RedisLeases) -> Res<()> {
    let first = lock(client).await?;
    let workers: Vec<_> = (2..=3)
        .map(|n| tokio::spawn(worker(client.clone(), n)))
        .collect();
    match lock(client).await {
        Ok(guard) => println!("the try got it: {}", guard.release().await),
        Err(error) => println!("the try gave up: {error}"),
    }
    tokio::time::sleep(TURN).await;
    println!("worker 1: {}", first.release().await);
    for w in workers {
        w.await??;
    }
    Ok(())
}

/// Answers every connection with the rendered metrics (enough for a scraper or `curl`).
async fn serve(listener: TcpListener, metrics: PrometheusHandle) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let body = metrics.render();
        tokio::spawn(async move {
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
        });
    }
}

#[tokio::main]
async fn main() -> Res<()> {
    let metrics = PrometheusBuilder::new().install_recorder()?;
    let url = std::env::var("LEASEHOLD_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
    let client = RedisBackend::open(&url, RedisSettings::default())?.into_client();
    if std::env::args().any(|arg| arg == "--once") {
        round(&client).await?;
        print!("{}", metrics.render());
        return Ok(());
    }
    let addr = std::env::var("LEASEHOLD_METRICS_ADDR").unwrap_or("127.0.0.1:9898".into());
    let listener = TcpListener::bind(&addr).await?;
    println!("serving http://{addr}/metrics; Ctrl-C stops");
    tokio::spawn(serve(listener, metrics));
    loop {
        tokio::select! {
            done = round(&client) => done?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
