//! A run-once job: every host fires it (from cron, say), one of them runs it.
//!
//! `cargo run -p leasehold-redis --example run_once` against `$LEASEHOLD_REDIS_URL` (default
//! `redis://127.0.0.1:6379`). Run it twice: the second run skips, for the minimum hold.

use std::time::Duration;

use leasehold_redis::leasehold::FenceToken;
use leasehold_redis::{RedisBackend, RedisSettings};

/// The job itself: writes carry the fence.
async fn nightly_report(fence: FenceToken) -> u64 {
    fence.get() % 1000
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("LEASEHOLD_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
    // The lease code: 7 lines, then 5 that report the outcome.
    let client = RedisBackend::open(&url, RedisSettings::default())?.into_client();
    let outcome = client
        .lock("nightly-report")
        .ttl(Duration::from_secs(60))
        .min_hold(Duration::from_secs(10 * 60)) // a host whose cron fires late still skips
        .run(|lease| nightly_report(lease.fence()))
        .await;
    match outcome {
        Ok(rows) => println!("ran the nightly report: {rows} rows"),
        Err(e) if e.is_contended() => println!("skipped: another host ran it"),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
