//! `make demo`: the lease story on an ephemeral local redis-server.
//!
//! Starts its own redis-server (from PATH or `LEASEHOLD_REDIS_SERVER`), then shows: acquire,
//! contention, a lost reply resolved by replaying the same attempt, renew, release, and a
//! fencing token rejecting a stale holder's write.

use std::time::Duration;

use leasehold_redis::leasehold::{
    AcquireOutcome, FenceGate, LeaseRequest, OperationId, Purpose, ReleaseOutcome, RenewOutcome,
    ResourceDigest,
};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings};
use test_support::RedisServer;

type Demo = Result<(), Box<dyn std::error::Error>>;

fn request(
    client: &RedisLeases,
    op: &str,
    ttl: Duration,
) -> Result<LeaseRequest, leasehold_redis::leasehold::Error> {
    let attempt = client.new_attempt(OperationId::new(op)?)?;
    client.request(
        Purpose::new("demo")?,
        ResourceDigest::of("orders/2026-12-02"),
        attempt,
        ttl,
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Demo {
    let server = RedisServer::start();
    println!(
        "redis-server started on {} (ephemeral, no persistence)\n",
        server.url()
    );
    let client = RedisBackend::open(&server.url(), RedisSettings::default())?.into_client();
    let ttl = Duration::from_millis(800);

    println!("1. Worker A acquires the lease on orders/2026-12-02.");
    let a_req = request(&client, "worker-a", ttl)?;
    let a = client
        .try_acquire(&a_req)
        .await
        .into_handle()
        .ok_or("A was not granted")?;
    println!(
        "   Acquired: fence {}, valid for {:?}",
        a.fence(),
        a.remaining_validity()
    );

    println!("2. Worker B tries while A holds it.");
    let b_req = request(&client, "worker-b", ttl)?;
    match client.try_acquire(&b_req).await {
        AcquireOutcome::Contended(c) => println!(
            "   Contended: held by {}, retry after {:?}",
            c.holder.map(|h| h.to_string()).unwrap_or_default(),
            c.retry_after
        ),
        other => return Err(format!("expected Contended, got {}", other.name()).into()),
    }

    println!("3. Worker C's reply is lost: the server is frozen (SIGSTOP) while C acquires.");
    println!("   A releases: {:?}", a.release().await);
    let c_req = request(&client, "worker-c", ttl)?;
    {
        let _frozen = server.pause();
        match client.try_acquire(&c_req).await {
            AcquireOutcome::Indeterminate { operation, cause } => {
                println!("   Indeterminate for {operation}: {cause}")
            }
            other => return Err(format!("expected Indeterminate, got {}", other.name()).into()),
        }
    }
    println!("   The server wakes up; C replays the same attempt to find out:");
    let c = loop {
        match client.try_acquire(&c_req).await {
            AcquireOutcome::Replayed(h) => break h,
            AcquireOutcome::Indeterminate { .. } => continue,
            other => return Err(format!("expected Replayed, got {}", other.name()).into()),
        }
    };
    println!(
        "   Replayed: fence {}, validity {:?} (capped by the server's remaining TTL)",
        c.fence(),
        c.remaining_validity()
    );

    println!("4. C renews; the server confirms its exact grant.");
    match c.renew().await {
        RenewOutcome::Renewed { remaining } => println!("   Renewed: valid for {remaining:?}"),
        other => return Err(format!("expected Renewed, got {other:?}").into()),
    }

    println!("5. C releases.");
    match c.release().await {
        ReleaseOutcome::Released => println!("   Released: state {:?}", c.state()),
        other => return Err(format!("expected Released, got {other:?}").into()),
    }

    println!("6. Fencing: D acquires, stalls past its expiry; E acquires; D wakes and writes.");
    let mut orders_table = FenceGate::new();
    let d_req = request(&client, "worker-d", ttl)?;
    let d = client
        .try_acquire(&d_req)
        .await
        .into_handle()
        .ok_or("D was not granted")?;
    println!(
        "   D holds fence {}; D stalls for {:?}...",
        d.fence(),
        ttl * 2
    );
    tokio::time::sleep(ttl * 2).await;
    println!(
        "   D's handle now says {:?}; the server let the key expire.",
        d.state()
    );
    let e_req = request(&client, "worker-e", ttl)?;
    let e = client
        .try_acquire(&e_req)
        .await
        .into_handle()
        .ok_or("E was not granted")?;
    orders_table.admit(e.fence(), &e.attempt().fingerprint())?;
    println!("   E acquires fence {} and writes: accepted", e.fence());
    match orders_table.admit(d.fence(), &d.attempt().fingerprint()) {
        Err(stale) => println!(
            "   D wakes and writes with fence {}: rejected ({stale})",
            d.fence()
        ),
        Ok(()) => return Err("the stale write was accepted".into()),
    }
    println!("   E releases: {:?}", e.release().await);
    println!("\nDone: every outcome above was typed, and the stale write never landed.");
    Ok(())
}
