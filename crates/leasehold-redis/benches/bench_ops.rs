//! `make bench`: latency of each lease operation against raw redis-rs, in one run.
//!
//! Starts an ephemeral redis-server and measures, over the same multiplexed connection kind:
//! leasehold try-acquire, renew and release (one EVALSHA each) next to a raw `SET NX PX` and
//! `DEL` — the floor any Redis lease pays. Prints p50 / p99 / max in microseconds.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use leasehold_redis::leasehold::{OperationId, Purpose, ResourceDigest};
use leasehold_redis::{RedisBackend, RedisSettings};
use test_support::RedisServer;

const ROUNDS: usize = 20_000;

fn row(name: &str, h: &Histogram<u64>) {
    println!(
        "{name:<28} {:>8} {:>8} {:>8}",
        h.value_at_quantile(0.50),
        h.value_at_quantile(0.99),
        h.max()
    );
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = RedisServer::start();
    let client = RedisBackend::open(&server.url(), RedisSettings::default())?.into_client();
    client.backend().warm_up().await?;
    let mut raw = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let new_hist = || Histogram::<u64>::new_with_bounds(1, 10_000_000, 3);
    let (mut acquire, mut renew, mut release) = (new_hist()?, new_hist()?, new_hist()?);
    let (mut set_nx, mut del) = (new_hist()?, new_hist()?);
    let purpose = Purpose::new("bench")?;
    for i in 0..ROUNDS {
        let attempt = client.new_attempt(OperationId::new(format!("op-{i}"))?)?;
        let req = client.request(
            purpose.clone(),
            ResourceDigest::of("bench"),
            attempt,
            Duration::from_secs(10),
        )?;
        let t = Instant::now();
        let lease = client
            .try_acquire(&req)
            .await
            .into_handle()
            .ok_or("not granted")?;
        acquire.record(micros(t.elapsed()))?;
        let t = Instant::now();
        if !lease.renew().await.is_renewed() {
            return Err("renew failed".into());
        }
        renew.record(micros(t.elapsed()))?;
        let t = Instant::now();
        let _ = lease.release().await;
        release.record(micros(t.elapsed()))?;

        let t = Instant::now();
        let _: Option<String> = redis::cmd("SET")
            .arg("raw-bench")
            .arg("x")
            .arg("NX")
            .arg("PX")
            .arg(10_000)
            .query_async(&mut raw)
            .await?;
        set_nx.record(micros(t.elapsed()))?;
        let t = Instant::now();
        let _: i64 = redis::cmd("DEL")
            .arg("raw-bench")
            .query_async(&mut raw)
            .await?;
        del.record(micros(t.elapsed()))?;
    }
    println!("{ROUNDS} rounds on loopback, one connection, latency in µs");
    println!("{:<28} {:>8} {:>8} {:>8}", "operation", "p50", "p99", "max");
    row("leasehold try_acquire", &acquire);
    row("leasehold renew", &renew);
    row("leasehold release", &release);
    row("raw redis-rs SET NX PX", &set_nx);
    row("raw redis-rs DEL", &del);
    Ok(())
}
