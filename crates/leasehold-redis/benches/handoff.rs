//! `make bench` (part 2): hand-off latency — release returned → the waiter's Acquired — for
//! leasehold's notified waiting, a 50 ms polling loop, and the `rslock` crate's acquire loop,
//! in one run on one ephemeral redis-server; and leasehold's notified waiting on an ephemeral
//! 3-node Cluster (sharded pub/sub). Prints p50 / p99 in microseconds.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use leasehold_redis::leasehold::{AcquireOutcome, OperationId, Purpose, ResourceDigest};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings};
use test_support::{RedisCluster, RedisServer};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn micros(from: Instant, to: Instant) -> u64 {
    // The waiter can be granted before the releaser has read its own reply: count that as 1 µs.
    u64::try_from(to.saturating_duration_since(from).as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn request(
    client: &RedisLeases,
    resource: &str,
    op: &str,
    wait: Duration,
) -> Res<leasehold_redis::leasehold::LeaseRequest> {
    let attempt = client.new_attempt(OperationId::new(op)?)?;
    Ok(client
        .request(
            Purpose::new("bench")?,
            ResourceDigest::of(resource),
            attempt,
            Duration::from_secs(10),
        )?
        .with_wait_timeout(wait)?)
}

/// The holder takes `resource` for round `i`.
async fn hold(
    holder: &RedisLeases,
    resource: &str,
    i: usize,
) -> Res<leasehold_redis::leasehold::LeaseHandle<RedisBackend>> {
    let req = request(holder, resource, &format!("h{i}"), Duration::ZERO)?;
    Ok(holder
        .try_acquire(&req)
        .await
        .into_handle()
        .ok_or("holder not granted")?)
}

async fn leasehold_round(holder: &RedisLeases, waiter: &RedisLeases, i: usize) -> Res<u64> {
    let resource = format!("handoff-{i}");
    let held = hold(holder, &resource, i).await?;
    let req = request(waiter, &resource, &format!("w{i}"), Duration::from_secs(5))?;
    let client = waiter.clone();
    let task = tokio::spawn(async move {
        match client.acquire(&req).await {
            AcquireOutcome::Acquired(lease) => {
                let at = Instant::now();
                let _ = lease.release().await;
                Ok(at)
            }
            other => Err(format!("waiter: {other}")),
        }
    });
    // Let the waiter subscribe and park behind its first try.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let _ = held.release().await;
    let released = Instant::now();
    let acquired = task.await??;
    Ok(micros(released, acquired))
}

async fn polling_round(holder: &RedisLeases, waiter: &RedisLeases, i: usize) -> Res<u64> {
    let resource = format!("poll-{i}");
    let held = hold(holder, &resource, i).await?;
    let req = request(waiter, &resource, &format!("w{i}"), Duration::ZERO)?;
    let client = waiter.clone();
    let task = tokio::spawn(async move {
        loop {
            if let Some(lease) = client.try_acquire(&req).await.into_handle() {
                let at = Instant::now();
                let _ = lease.release().await;
                return at;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    // A random phase against the 50 ms poll, as in real life.
    tokio::time::sleep(Duration::from_millis(5 + (i as u64 * 7) % 50)).await;
    let _ = held.release().await;
    let released = Instant::now();
    Ok(micros(released, task.await?))
}

async fn rslock_round(manager: &std::sync::Arc<rslock::LockManager>, i: usize) -> Res<u64> {
    let resource = format!("rslock-{i}");
    let ttl = Duration::from_secs(10);
    let held = manager
        .lock(resource.as_bytes(), ttl)
        .await
        .map_err(|e| format!("{e:?}"))?;
    let m = std::sync::Arc::clone(manager);
    let r = resource.clone();
    let task = tokio::spawn(async move {
        let lock = m
            .acquire_no_guard(r.as_bytes(), ttl)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let at = Instant::now();
        m.unlock(&lock).await;
        Ok::<_, String>(at)
    });
    tokio::time::sleep(Duration::from_millis(5 + (i as u64 * 7) % 50)).await;
    manager.unlock(&held).await;
    let released = Instant::now();
    Ok(micros(released, task.await??))
}

fn row(name: &str, h: &Histogram<u64>) {
    println!(
        "{name:<34} {:>7} {:>10} {:>10}",
        h.len(),
        h.value_at_quantile(0.50),
        h.value_at_quantile(0.99)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let server = RedisServer::start();
    let open = || {
        RedisBackend::open(&server.url(), RedisSettings::default()).map(RedisBackend::into_client)
    };
    let (holder, waiter) = (open()?, open()?);
    holder.backend().warm_up().await?;
    waiter.backend().warm_up().await?;
    let new_hist = || Histogram::<u64>::new_with_bounds(1, 60_000_000, 3);
    let (mut ours, mut polling, mut rs) = (new_hist()?, new_hist()?, new_hist()?);
    for i in 0..300 {
        ours.record(leasehold_round(&holder, &waiter, i).await?)?;
    }
    for i in 0..60 {
        polling.record(polling_round(&holder, &waiter, i).await?)?;
    }
    let manager = std::sync::Arc::new(rslock::LockManager::new(vec![server.url()]));
    for i in 0..60 {
        rs.record(rslock_round(&manager, i).await?)?;
    }
    let cluster = RedisCluster::start(3);
    let open_cluster = || {
        RedisBackend::open_cluster(&cluster.urls(), RedisSettings::default())
            .map(RedisBackend::into_client)
    };
    let (holder, waiter) = (open_cluster()?, open_cluster()?);
    holder.backend().warm_up().await?;
    waiter.backend().warm_up().await?;
    let mut sharded = new_hist()?;
    for i in 0..300 {
        sharded.record(leasehold_round(&holder, &waiter, i).await?)?;
    }
    println!("hand-off latency on loopback: release returned -> waiter's Acquired, in µs");
    println!(
        "{:<34} {:>7} {:>10} {:>10}",
        "waiter", "rounds", "p50", "p99"
    );
    row("leasehold acquire (notified)", &ours);
    row("50 ms polling loop (try_acquire)", &polling);
    row("rslock 0.10 acquire loop", &rs);
    row("leasehold on a 3-node Cluster", &sharded);
    let p50 = ours.value_at_quantile(0.5).max(1);
    println!(
        "leasehold p50 is {:.0}x faster than polling and {:.0}x faster than rslock",
        polling.value_at_quantile(0.5) as f64 / p50 as f64,
        rs.value_at_quantile(0.5) as f64 / p50 as f64
    );
    Ok(())
}
