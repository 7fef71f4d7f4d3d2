//! `make bench` (part 4): leader take-over latency on one ephemeral redis-server, with three
//! candidates on their own connections, and the commands each change of leader costs.
//!
//! - **After a resignation**: the leader resigns; the time from `resign` returning to the
//!   next candidate's `campaign` returning (the release notice's hand-off).
//! - **After a crash**: the leader's connection goes dead (its process is gone: nothing is
//!   released, the lease runs out); the time from the crash to the next candidate's
//!   `campaign` returning, and from the lease's expiry (the crash plus the server's remaining
//!   TTL, read at once) to it — how late the waiting candidates notice.
//!
//! Commands per change are `INFO commandstats` deltas over each phase (scripts' own
//! `PUBLISH`es included, the bench's `INFO` and inspections excluded), divided by the
//! changes. Prints p50 / p99 in microseconds. About a minute.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use leasehold_redis::leasehold::{HolderName, Leadership};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings};
use test_support::{FaultProxy, ProxyFault, RedisServer};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const CANDIDATES: usize = 3;
const CHANGES: usize = 200;
const ELECTION: &str = "bench/scheduler";
/// The resign phase's TTL: long, so that only the notice can explain a fast take-over.
const RESIGN_TTL: Duration = Duration::from_secs(10);
/// The crash phase's TTL: short, so that 200 crashes take about a minute.
const CRASH_TTL: Duration = Duration::from_millis(300);

/// A new leader: which candidate, its leadership, and when `campaign` returned.
type Elected = (usize, Leadership<RedisBackend>, Instant);

fn micros(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

async fn open(url: &str) -> Res<RedisLeases> {
    let client = RedisBackend::open(url, RedisSettings::default())?.into_client();
    client.backend().warm_up().await?;
    Ok(client)
}

/// Candidate `i` campaigns on `client` over and over, reporting each term it wins.
fn campaigner(
    client: &RedisLeases,
    i: usize,
    ttl: Duration,
    elected: &mpsc::UnboundedSender<Elected>,
) -> Res<JoinHandle<()>> {
    let candidate = client
        .election(ELECTION)
        .with_ttl(ttl)
        .candidate(HolderName::new(&format!("candidate-{i}"))?);
    let elected = elected.clone();
    Ok(tokio::spawn(async move {
        while let Ok(leadership) = candidate.campaign().await {
            if elected.send((i, leadership, Instant::now())).is_err() {
                return;
            }
        }
    }))
}

/// Calls per command (`INFO commandstats`), without the bench's own reads.
fn commands(server: &RedisServer) -> BTreeMap<String, u64> {
    let mut stats = server.commandstats();
    stats.remove("info");
    stats
}

/// What `after` adds to `before`, per change.
fn per_change(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    changes: usize,
) -> String {
    let mut total = 0.0;
    let mut parts = Vec::new();
    for (name, calls) in after {
        let added = calls.saturating_sub(before.get(name).copied().unwrap_or(0));
        if added > 0 {
            let each = added as f64 / changes as f64;
            total += each;
            parts.push(format!("{name} {each:.2}"));
        }
    }
    format!("{total:.2} ({})", parts.join(", "))
}

async fn resign_phase(server: &RedisServer) -> Res<(Histogram<u64>, String)> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..CANDIDATES {
        tasks.push(campaigner(&open(&server.url()).await?, i, RESIGN_TTL, &tx)?);
    }
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (_, mut leader, _) = rx.recv().await.ok_or("no first leader")?;
    let before = commands(server);
    for _ in 0..CHANGES {
        // Let the other candidates park behind their tries.
        tokio::time::sleep(Duration::from_millis(3)).await;
        let term = leader.term();
        let _ = leader.resign().await;
        let resigned = Instant::now();
        let (_, next, led) = rx.recv().await.ok_or("no next leader")?;
        if next.term() <= term {
            return Err(format!("term {} after {term}", next.term()).into());
        }
        latency.record(micros(resigned, led))?;
        leader = next;
    }
    let cost = per_change(&before, &commands(server), CHANGES);
    let _ = leader.resign().await;
    for task in tasks {
        task.abort();
    }
    Ok((latency, cost))
}

/// A candidate whose connection can be cut: its own proxy, client and campaign.
struct Process {
    proxy: FaultProxy,
    task: JoinHandle<()>,
}

async fn spawn_process(
    server: &RedisServer,
    i: usize,
    elected: &mpsc::UnboundedSender<Elected>,
) -> Res<Process> {
    let proxy = FaultProxy::start(server.addr());
    let client = open(&proxy.url()).await?;
    let task = campaigner(&client, i, CRASH_TTL, elected)?;
    Ok(Process { proxy, task })
}

async fn crash_phase(server: &RedisServer) -> Res<(Histogram<u64>, Histogram<u64>, String)> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut processes = Vec::new();
    for i in 0..CANDIDATES {
        processes.push(spawn_process(server, i, &tx).await?);
    }
    // Reads the lease's remaining TTL right after a crash, on a connection of its own.
    let reader = open(&server.url()).await?;
    let election = reader.election(ELECTION).with_ttl(CRASH_TTL);
    let new_hist = || Histogram::<u64>::new_with_bounds(1, 60_000_000, 3);
    let (mut from_crash, mut from_expiry) = (new_hist()?, new_hist()?);
    let (mut who, mut leader, _) = rx.recv().await.ok_or("no first leader")?;
    let before = commands(server);
    let mut inspections = 0;
    for _ in 0..CHANGES {
        // Lead for a while, renewing, then die at a point of the renewal cycle that varies.
        tokio::time::sleep(Duration::from_millis(20 + (who as u64 * 37) % 150)).await;
        let term = leader.term();
        processes[who].proxy.to_server(ProxyFault::Hold);
        let crashed = Instant::now();
        drop(leader);
        let remaining = election.leader().await?.and_then(|l| l.remaining);
        inspections += 1;
        let expiry = crashed + remaining.unwrap_or_default();
        let (next, next_leader, led) = rx.recv().await.ok_or("no next leader")?;
        if next_leader.term() <= term {
            return Err(format!("term {} after {term}", next_leader.term()).into());
        }
        from_crash.record(micros(crashed, led))?;
        from_expiry.record(micros(expiry, led))?;
        // The dead process is gone; a new one takes its place and campaigns.
        let dead = std::mem::replace(&mut processes[who], spawn_process(server, who, &tx).await?);
        dead.task.abort();
        drop(dead.proxy);
        (who, leader) = (next, next_leader);
    }
    let mut after = commands(server);
    if let Some(evalsha) = after.get_mut("evalsha") {
        *evalsha = evalsha.saturating_sub(inspections);
    }
    let cost = per_change(&before, &after, CHANGES);
    let _ = leader.resign().await;
    for process in processes {
        process.task.abort();
    }
    Ok((from_crash, from_expiry, cost))
}

fn row(name: &str, h: &Histogram<u64>) {
    println!(
        "{name:<44} {:>7} {:>10} {:>10}",
        h.len(),
        h.value_at_quantile(0.50),
        h.value_at_quantile(0.99)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let server = RedisServer::start();
    let (resigned, resign_cost) = resign_phase(&server).await?;
    let (crashed, expired, crash_cost) = crash_phase(&server).await?;
    println!(
        "leader take-over on loopback, {CANDIDATES} candidates, {CHANGES} changes each, in µs"
    );
    println!(
        "{:<44} {:>7} {:>10} {:>10}",
        "take-over", "changes", "p50", "p99"
    );
    row("after resign (TTL 10 s): resign -> campaign", &resigned);
    row("after crash (TTL 300 ms): crash -> campaign", &crashed);
    row("after crash: lease expiry -> campaign", &expired);
    println!("commands per change after resign: {resign_cost}");
    println!("commands per change after crash: {crash_cost}");
    println!(
        "  (after crash: the leader's renewals and the replacement process's start-up, \
         script|load, config|get and subscribe, included)"
    );
    println!(
        "  (expiry -> campaign is mostly the waiters' retry jitter, below the holder's PTTL / 8 \
         and 25 ms, which keeps processes from retrying in step)"
    );
    Ok(())
}
