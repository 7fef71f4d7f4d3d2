//! A fenced write to SQLite: the row takes a write only from a fence at least as new as the
//! last one that wrote it, so a holder that stalled past its lease changes nothing.
//!
//! `cargo run -p leasehold-redis --example fenced_sqlite` against `$LEASEHOLD_REDIS_URL`
//! (default `redis://127.0.0.1:6379`).

use std::time::Duration;

use leasehold_redis::{RedisBackend, RedisSettings};
use rusqlite::{Connection, named_params};

const FENCED_UPDATE: &str =
    "UPDATE orders SET status = :status, fence = :fence WHERE id = 42 AND fence <= :fence";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("LEASEHOLD_REDIS_URL").unwrap_or("redis://127.0.0.1:6379".into());
    let db = Connection::open_in_memory()?;
    db.execute_batch(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT, fence INTEGER NOT NULL);
         INSERT INTO orders VALUES (42, 'new', 0);",
    )?;
    // The lease code: 6 lines, besides the SQL that carries the fence.
    let client = RedisBackend::open(&url, RedisSettings::default())?.into_client();
    let old = client.lock("orders/42").ttl(Duration::from_secs(5)).await?;
    let stale = i64::from(old.fence());
    let _ = old.release().await; // (as if it had stalled past its TTL and another took over)
    let new = client.lock("orders/42").ttl(Duration::from_secs(5)).await?;
    let rows = db.execute(
        FENCED_UPDATE,
        named_params! {":status": "shipped", ":fence": i64::from(new.fence())},
    )?;
    println!(
        "the holder with fence {} wrote: {rows} row changed",
        new.fence()
    );
    let _ = new.release().await;
    let rows = db.execute(
        FENCED_UPDATE,
        named_params! {":status": "cancelled", ":fence": stale},
    )?;
    println!("the stale holder with fence {stale} wrote: {rows} rows changed");
    Ok(())
}
