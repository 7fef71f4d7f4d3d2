//! Exclusive workers: one at a time works on the queue, kept alive while it works, and stops
//! the moment its lease is lost.
//!
//! `cargo run -p leasehold-redis --example exclusive_worker` against `$LEASEHOLD_REDIS_URL`
//! (default `redis://127.0.0.1:6379`). Three workers in one process take turns.

use std::time::Duration;

use leasehold_redis::leasehold::FenceToken;
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings};

/// A batch of work that outlasts the lease's TTL: only the keep-alive keeps it covered.
async fn work(worker: u32, fence: FenceToken) {
    println!("worker {worker} works with fence {fence}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    println!("worker {worker} finished its batch");
}

async fn worker(
    client: RedisLeases,
    worker: u32,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // The lease code: 9 lines.
    let guard = client
        .lock("queue/orders")
        .ttl(Duration::from_millis(600))
        .wait(Duration::from_secs(30))
        .await?;
    tokio::select! {
        () = work(worker, guard.fence()) => println!("worker {worker} done: {}", guard.release().await),
        reason = guard.lost() => println!("worker {worker} stopped: {reason}"),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("LEASEHOLD_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
    let client = RedisBackend::open(&url, RedisSettings::default())?.into_client();
    let workers: Vec<_> = (1..=3)
        .map(|n| tokio::spawn(worker(client.clone(), n)))
        .collect();
    for w in workers {
        w.await??;
    }
    Ok(())
}
