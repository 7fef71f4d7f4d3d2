//! What metrics cost on the hot path: lock-and-release round trips per second on an
//! ephemeral redis-server.
//!
//! `make bench` runs it twice. Without the `metrics` feature it measures the build that
//! records nothing (the macros are compiled out) and leaves its figure in
//! the temporary directory. With `--features metrics` it measures, batch by batch
//! interleaved in one run, the same calls with no recorder installed and with a Prometheus
//! recorder, and prints their ratio (and the ratio to the figure the build without the feature
//! left, which came from a separate process a moment earlier).

use std::time::{Duration, Instant};

use leasehold_redis::leasehold::ReleaseOutcome;
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings};
use test_support::RedisServer;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Calls per batch, and batches per way of recording.
const CALLS: u32 = 2_000;
const BATCHES: usize = 7;
/// Where the run without the feature leaves its figure for the run with it.
fn off_file() -> std::path::PathBuf {
    std::env::temp_dir().join("leasehold_metrics_bench_off.txt")
}

/// One batch: `CALLS` times take a free lock and release it. Returns calls per second.
async fn batch(client: &RedisLeases) -> Res<f64> {
    let started = Instant::now();
    for _ in 0..CALLS {
        let guard = client
            .lock("bench/metrics")
            .ttl(Duration::from_secs(10))
            .await?;
        if !matches!(guard.release().await, ReleaseOutcome::Released) {
            return Err("a release was not applied".into());
        }
    }
    Ok(f64::from(CALLS) / started.elapsed().as_secs_f64())
}

fn median(mut figures: Vec<f64>) -> f64 {
    figures.sort_by(f64::total_cmp);
    figures[figures.len() / 2]
}

fn runtime() -> tokio::runtime::Runtime {
    // One thread, so a recorder set for the thread covers every task the calls spawn.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

fn open(rt: &tokio::runtime::Runtime, server: &RedisServer) -> Res<RedisLeases> {
    let _entered = rt.enter();
    Ok(RedisBackend::open(&server.url(), RedisSettings::default())?.into_client())
}

#[cfg(not(feature = "metrics"))]
fn main() -> Res<()> {
    let server = RedisServer::start();
    let rt = runtime();
    let client = open(&rt, &server)?;
    rt.block_on(batch(&client))?; // warm-up: connection, scripts loaded
    let figures = (0..BATCHES)
        .map(|_| rt.block_on(batch(&client)))
        .collect::<Res<Vec<f64>>>()?;
    let off = median(figures);
    println!(
        "metrics_bench: built without the metrics feature: {off:.0} lock+release/s \
         (median of {BATCHES} batches of {CALLS}, one connection, loopback)"
    );
    std::fs::write(off_file(), format!("{off}\n"))?;
    Ok(())
}

#[cfg(feature = "metrics")]
fn main() -> Res<()> {
    use metrics_exporter_prometheus::PrometheusBuilder;

    let server = RedisServer::start();
    let rt = runtime();
    let client = open(&rt, &server)?;
    let prometheus = PrometheusBuilder::new().build_recorder();
    rt.block_on(batch(&client))?; // warm-up: connection, scripts loaded
    let (mut none, mut recorded) = (Vec::new(), Vec::new());
    for _ in 0..BATCHES {
        none.push(rt.block_on(batch(&client))?);
        recorded.push(metrics::with_local_recorder(&prometheus, || {
            rt.block_on(batch(&client))
        })?);
    }
    let (none, recorded) = (median(none), median(recorded));
    let rendered = prometheus.handle().render();
    if !rendered.contains("leasehold_acquires_total") {
        return Err("the Prometheus recorder recorded nothing".into());
    }
    println!(
        "metrics_bench: with the metrics feature, no recorder: {none:.0} lock+release/s; \
         Prometheus recorder: {recorded:.0}/s ({:.3}x; median of {BATCHES} interleaved batches \
         of {CALLS})",
        recorded / none
    );
    match std::fs::read_to_string(off_file())
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
    {
        Some(off) => println!(
            "metrics_bench: against the build without the feature ({off:.0}/s, the run just \
             before): no recorder {:.3}x, Prometheus {:.3}x",
            none / off,
            recorded / off
        ),
        None => println!(
            "metrics_bench: no {}: run it without the feature first",
            off_file().display()
        ),
    }
    Ok(())
}
