//! At most two exports at once, across every process: a counting semaphore of capacity 2,
//! then a read/write lease whose writer downgrades to a reader.
//!
//! `cargo run -p leasehold-redis --example semaphore` against `$LEASEHOLD_REDIS_URL` (default
//! `redis://127.0.0.1:6379`). Five workers ask for a permit at once; two run at a time, the
//! others wait their turn in the order they asked. Each permit is a slot with its own fence.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_redis::{RedisBackend, RedisSettings};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("LEASEHOLD_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
    let client = RedisBackend::open(&url, RedisSettings::default())?.into_client();
    let running = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for n in 1..=5 {
        let (client, running) = (client.clone(), Arc::clone(&running));
        workers.push(tokio::spawn(async move {
            // The semaphore code: one call, then the work under the permit.
            let permit = client
                .semaphore("exports", 2)
                .wait(Duration::from_secs(30))
                .await?;
            let slot = permit.slot().unwrap_or_default();
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            println!(
                "worker {n} exports in slot {slot} with fence {} ({now} running)",
                permit.fence()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            running.fetch_sub(1, Ordering::SeqCst);
            let outcome = permit.release().await;
            println!("worker {n} done: {outcome}");
            Ok::<_, leasehold_redis::leasehold::LockError>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }

    // A read/write lease: one writer, then many readers; the writer becomes a reader without
    // letting another writer in between, and readers carry the fence of the writer they follow.
    let writer = client
        .write_lock("catalog")
        .wait(Duration::from_secs(10))
        .await?;
    let written = writer.fence();
    println!("writer rewrote the catalog with fence {written}");
    let reader = writer.downgrade().await?;
    let other = client.read_lock("catalog").await?;
    println!(
        "two readers follow fence {} and {}",
        reader.fence(),
        other.fence()
    );
    println!(
        "readers done: {} and {}",
        reader.release().await,
        other.release().await
    );
    Ok(())
}
