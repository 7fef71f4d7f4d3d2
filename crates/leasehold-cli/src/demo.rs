//! `leasehold demo`: why a lease needs a fencing token, told in the terminal.
//!
//! Worker A acquires and stalls past its lease; worker B acquires the next fence and writes to
//! an `orders` table in SQLite through the fenced-update pattern; A wakes and its stale write
//! changes no row. Both workers live in this process and share one client, as two processes
//! would share one Redis.

use std::io::Write as _;
use std::time::Duration;

use anyhow::{Context as _, bail};
use leasehold_redis::leasehold::{
    AcquireOutcome, FenceToken, InspectOutcome, LeaseRequest, OperationId, Purpose, ResourceDigest,
    Unavailable, Watchdog,
};
use leasehold_redis::{RedisBackend, RedisLeases};
use rusqlite::{Connection, named_params};
use tokio::signal::unix::{SignalKind, signal};

use crate::config::DemoConfig;
use crate::duration::format_duration;
use crate::exit;
use crate::local_redis::{LocalRedis, StartError};
use crate::remedy;

/// Prints a line to stdout, returning early with the error if stdout is gone.
macro_rules! say {
    ($($arg:tt)*) => {
        writeln!(std::io::stdout(), $($arg)*)?
    };
}

/// The resource both workers want.
const RESOURCE: &str = "orders/42";
const ORDER_ID: i64 = 42;
/// A's lease: short, so that the story does not drag.
const A_TTL: Duration = Duration::from_secs(1);
/// How long A stalls: well past its TTL.
const A_STALL: Duration = Duration::from_millis(1500);
const B_TTL: Duration = Duration::from_secs(5);

/// The fenced-update pattern: a write lands only if no newer fence has written already.
const FENCED_UPDATE: &str =
    "UPDATE orders SET status = :status, fence = :fence WHERE id = :id AND fence <= :fence";

/// Runs `leasehold demo` and returns its exit code.
pub(crate) async fn demo(config: DemoConfig) -> u8 {
    let (mut interrupt, mut terminate) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (i, t),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("leasehold: cannot catch signals: {e}");
            return exit::FAILURE;
        }
    };
    // The story runs inside the select, so that Ctrl-C drops it and with it the local
    // redis-server it started.
    tokio::select! {
        code = start_and_tell(config) => code,
        _ = interrupt.recv() => { eprintln!("\ninterrupted"); 130 }
        _ = terminate.recv() => { eprintln!("\nterminated"); 143 }
    }
}

async fn start_and_tell(config: DemoConfig) -> u8 {
    let (backend, shown, origin, _server) = match config.target {
        Some(target) => {
            let origin = format!("{} (named with --redis)", target.shown);
            (target.backend, target.shown, origin, None)
        }
        None => match LocalRedis::start().await {
            Ok(server) => {
                let origin = format!(
                    "redis-server {} on 127.0.0.1:{}, ephemeral\n       (temporary directory, no \
                     persistence, stopped at the end)",
                    server.version(),
                    server.port()
                );
                let backend = match RedisBackend::open(&server.url(), config.settings) {
                    Ok(backend) => backend,
                    Err(e) => {
                        eprintln!("leasehold: cannot use the local redis-server: {e}");
                        return exit::FAILURE;
                    }
                };
                (backend, server.url(), origin, Some(server))
            }
            Err(StartError::Missing(hint)) => {
                eprintln!("leasehold: {hint}");
                return exit::UNAVAILABLE;
            }
            Err(StartError::Failed(e)) => {
                eprintln!("leasehold: could not start redis-server: {e:#}");
                return exit::UNAVAILABLE;
            }
        },
    };
    match tell(backend, &origin, &shown).await {
        Ok(()) => 0,
        // Piped into `head`, say: stop quietly, as a killed-by-SIGPIPE tool would.
        Err(e) if exit::is_broken_pipe(&e) => exit::BROKEN_PIPE,
        Err(e) => {
            if let Some(Refused(code)) = e.downcast_ref::<Refused>() {
                return *code;
            }
            match e.downcast_ref::<Unreachable>() {
                Some(unreachable) => {
                    eprintln!("leasehold: Redis at {shown} {unreachable}");
                    if let Some(refused) = &unreachable.1 {
                        remedy::tell_for(refused, &shown);
                    }
                    exit::UNAVAILABLE
                }
                None => {
                    eprintln!("leasehold: the demo failed: {e:#}");
                    exit::FAILURE
                }
            }
        }
    }
}

/// The server gave no definite answer to the demo's first request: it cannot be reached (exit
/// 69, as the help promises), which is not the story breaking (exit 1).
/// With the refusal, when there was one, for the tip that follows the error.
#[derive(Debug)]
struct Unreachable(String, Option<Unavailable>);

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unreachable {}

/// The server refused the demo's first request for a reason that trying again cannot fix
/// (credentials, a database it lacks, a key it holds): already said, with this exit code.
#[derive(Debug)]
struct Refused(u8);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refused (exit {})", self.0)
    }
}

impl std::error::Error for Refused {}

fn request(client: &RedisLeases, worker: &str, ttl: Duration) -> anyhow::Result<LeaseRequest> {
    let attempt = client.new_attempt(OperationId::new(format!("demo-worker-{worker}"))?)?;
    Ok(client.request(
        Purpose::new("demo")?,
        ResourceDigest::of(RESOURCE),
        attempt,
        ttl,
    )?)
}

fn open_store() -> rusqlite::Result<Connection> {
    let db = Connection::open_in_memory()?;
    db.execute_batch(
        "CREATE TABLE orders (
             id     INTEGER PRIMARY KEY,
             status TEXT    NOT NULL,
             fence  INTEGER NOT NULL DEFAULT 0
         );
         INSERT INTO orders (id, status) VALUES (42, 'new');",
    )?;
    Ok(db)
}

/// Writes through the fenced-update pattern and prints the statement and the rows changed.
fn fenced_write(
    db: &Connection,
    who: &str,
    status: &str,
    fence: FenceToken,
) -> anyhow::Result<usize> {
    // Every fence fits a signed 64-bit integer, SQLite's INTEGER and SQL's BIGINT.
    let fence_value = fence.to_i64();
    say!(
        "   {who}: UPDATE orders SET status = '{status}', fence = {fence} WHERE id = {ORDER_ID} \
         AND fence <= {fence}"
    );
    let changed = db.execute(
        FENCED_UPDATE,
        named_params! {":status": status, ":fence": fence_value, ":id": ORDER_ID},
    )?;
    Ok(changed)
}

fn show_order(db: &Connection) -> anyhow::Result<()> {
    let (status, fence): (String, i64) = db.query_row(
        "SELECT status, fence FROM orders WHERE id = ?1",
        [ORDER_ID],
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    say!("orders: id {ORDER_ID} | status '{status}' | fence {fence}");
    Ok(())
}

async fn tell(backend: RedisBackend, origin: &str, shown: &str) -> anyhow::Result<()> {
    say!("leasehold demo: a fencing token stops a stale writer\n");
    say!("Redis: {origin}");
    let client = backend.into_client();
    let db = open_store()?;
    say!(
        "Store: SQLite in memory, table orders(id, status, fence); order {ORDER_ID} is 'new' \
         with fence 0\n"
    );

    say!(
        "1. Worker A acquires the lease on \"{RESOURCE}\" for {}.",
        format_duration(A_TTL)
    );
    let a = match client.try_acquire(&request(&client, "a", A_TTL)?).await {
        AcquireOutcome::Acquired(lease) => lease,
        // The first request to the server: no definite answer means it cannot be reached.
        AcquireOutcome::Unavailable(u) => {
            if let Some(code) = exit::lasting_refusal(&u, shown) {
                return Err(Refused(code).into());
            }
            return Err(Unreachable(format!("is unavailable: {u}"), Some(u)).into());
        }
        AcquireOutcome::Indeterminate { cause, .. } => {
            return Err(Unreachable(
                format!(
                    "did not answer ({cause}); a grant to worker A may live for {}",
                    format_duration(A_TTL)
                ),
                None,
            )
            .into());
        }
        other => bail!("A was not granted the lease: {other}"),
    };
    say!("   A holds fence {}.", a.fence());
    say!(
        "   (A fence is a 64-bit integer, 1 to 2^63-1: store it as BIGINT, not INTEGER. It is\n\
         \x20   never below the Redis server's clock in microseconds, so it keeps growing even\n\
         \x20   when Redis loses its counter: a restart without persistence, FLUSHALL, a failover.)"
    );

    let b_request = request(&client, "b", B_TTL)?;
    match client.try_acquire(&b_request).await {
        AcquireOutcome::Contended(c) => say!(
            "2. Worker B tries at the same time: contended, held by {} (fence {}); B may retry \
             in {}.",
            c.holder.map_or_else(|| "?".to_owned(), |h| h.to_string()),
            c.fence.map_or_else(|| "?".to_owned(), |f| f.to_string()),
            format_duration(c.retry_after),
        ),
        other => bail!("B should have been contended, got: {other}"),
    }

    say!(
        "3. Worker A stalls for {} (a GC pause, a swapped-out VM, a SIGSTOP) and cannot renew.",
        format_duration(A_STALL)
    );
    tokio::time::sleep(A_STALL).await;
    let view = client
        .inspect(&Purpose::new("demo")?, &ResourceDigest::of(RESOURCE), None)
        .await;
    if view != InspectOutcome::Free {
        bail!("the lease should have expired, inspect says {view:?}");
    }
    say!(
        "   A's handle now says {:?}, and Redis has let the key expire: inspect says free.",
        a.state()
    );

    let b = match client.try_acquire(&b_request).await {
        AcquireOutcome::Acquired(lease) => lease,
        other => bail!("B was not granted the lease after A's expiry: {other}"),
    };
    say!(
        "4. Worker B acquires: fence {}. A watchdog renews B's lease while it works.",
        b.fence()
    );
    let watchdog = Watchdog::default();
    let b = watchdog.keep(b).context("keeping B's lease alive")?;
    let changed = fenced_write(&db, "B", "packed by B", b.handle().fence())?;
    say!("      {changed} row changed: accepted.");
    if changed != 1 {
        bail!("B's write should have landed");
    }

    say!("5. Worker A wakes up, unaware, and finishes its work with its old fence:");
    let changed = fenced_write(&db, "A", "shipped by A", a.fence())?;
    if changed != 0 {
        bail!("A's stale write landed: {changed} rows changed");
    }
    say!(
        "      0 rows changed: the stale write was REJECTED (fence {} is older than {}).",
        a.fence(),
        b.handle().fence()
    );

    say!("6. Worker B releases the lease: {:?}.\n", b.release().await);
    show_order(&db)?;
    say!(
        "\nThe lease kept A and B apart only while A ran on time. The fencing token, checked\n\
         where the write lands, is what kept A's late write out."
    );
    Ok(())
}
