//! `make bench` (part 3): one process keeps 10,000 leases (TTL 3 s) alive for 60 s.
//!
//! Reports losses, renew commands per second, client CPU (user + system, from /proc) and
//! resident memory per lease. `LEASEHOLD_BENCH_SECS` and `LEASEHOLD_BENCH_LEASES` shorten or
//! grow the run.

use std::time::{Duration, Instant};

use leasehold_redis::leasehold::{
    KeepAliveSettings, OperationId, Purpose, ResourceDigest, Watchdog,
};
use leasehold_redis::{RedisBackend, RedisSettings};
use test_support::RedisServer;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// User + system CPU time of this process, from /proc/self/stat (clock ticks of 10 ms).
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit(')').next().unwrap_or("");
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // After the name: state is field 0, utime 11, stime 12.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let leases = env("LEASEHOLD_BENCH_LEASES", 10_000) as usize;
    let secs = env("LEASEHOLD_BENCH_SECS", 60);
    let server = RedisServer::start();
    let settings = RedisSettings::default().with_max_in_flight(100_000)?;
    let client = RedisBackend::open(&server.url(), settings)?.into_client();
    client.backend().warm_up().await?;
    let watchdog = Watchdog::new(KeepAliveSettings::default().with_max_leases(leases)?);
    let purpose = Purpose::new("bench")?;
    let mut handles = Vec::with_capacity(leases);
    for i in 0..leases {
        let attempt = client.new_attempt(OperationId::new(format!("op-{i}"))?)?;
        let req = client.request(
            purpose.clone(),
            ResourceDigest::of(format!("lease-{i}")),
            attempt,
            Duration::from_secs(3),
        )?;
        handles.push(
            client
                .try_acquire(&req)
                .await
                .into_handle()
                .ok_or("not granted")?,
        );
    }
    let rss_before = rss_kib();
    let kept: Vec<_> = handles
        .into_iter()
        .map(|h| watchdog.keep(h).map_err(|(e, _)| e))
        .collect::<Result<_, _>>()?;
    let evalsha = |s: &RedisServer| s.commandstats().get("evalsha").copied().unwrap_or(0);
    let (cpu0, calls0, t0) = (cpu(), evalsha(&server), Instant::now());
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let (cpu1, calls1, elapsed) = (cpu(), evalsha(&server), t0.elapsed());
    let rss_after = rss_kib();
    let lost = kept.iter().filter(|k| k.signal().is_lost()).count();
    let cpu_share = (cpu1 - cpu0).as_secs_f64() / elapsed.as_secs_f64();
    println!(
        "{leases} leases, TTL 3 s, kept for {:.1} s",
        elapsed.as_secs_f64()
    );
    println!("losses:                 {lost}");
    println!(
        "renew commands / s:     {:.0}",
        (calls1 - calls0) as f64 / elapsed.as_secs_f64()
    );
    println!(
        "client CPU:             {:.1} % of one core",
        cpu_share * 100.0
    );
    println!(
        "memory per kept lease:  {:.0} bytes (RSS {} KiB -> {} KiB)",
        (rss_after.saturating_sub(rss_before) * 1024) as f64 / leases as f64,
        rss_before,
        rss_after
    );
    for k in kept {
        let _ = k.release().await;
    }
    Ok(())
}
