//! `make bench`: the hot path side by side, in one process on one redis-server.
//!
//! Six locks, each acquired and released in a loop over one multiplexed connection:
//!
//! - **leasehold**: `try_acquire` + `release` (one EVALSHA each, fenced, every guarantee on);
//! - **over redis-rs**: the same through redis-rs's multiplexed connection
//!   (`Transport::RedisRs`) instead of leasehold's own (D49), which decides the default;
//! - **fenced floor**: the least a fenced lease can do — one script that refuses a held key,
//!   `INCR`s the fence counter and `SET`s the key with `PX`, and a compare-and-delete release;
//! - **SET NX floor**: an unfenced lock, `SET NX PX` and the same compare-and-delete;
//! - **rslock**: the `rslock` crate (Redlock on one server), which does no fencing;
//! - **its scripts**: leasehold's own `acquire.lua` and `release.lua`, run through plain
//!   redis-rs `Script`s with keys and values of leasehold's shape, one call per operation
//!   (never batched): it splits leasehold's distance from the floor into what the server's
//!   scripts cost and what the library adds on the client.
//!
//! One task (latency p50 / p99, µs, over 8,000 cycles each, in blocks of 100 that take turns)
//! and 64 tasks on distinct resources (cycles per second, in rounds that rotate the order of
//! the six), so that drift on a loaded machine hits all of them alike; ratios to the fenced
//! floor and to rslock. Prints figures; asserts nothing about them.
//!
//! `HOTPATH_PROFILE=leasehold` (or another lock's name) runs only that lock's 64-task load for
//! 10 s instead, to profile it (`perf record -g`); `HOTPATH_ONE=leasehold` runs only that
//! lock's one-task loop for 10 s and prints its p50. Runs of either are not comparable with
//! each other (drift between runs is as large as the gaps): the side-by-side run is.
//! `HOTPATH_ONE_TASK=1` runs only the side-by-side one-task half (about 10 s), for a quick
//! comparison of two builds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use leasehold_redis::leasehold::{OperationId, Purpose, ResourceDigest};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings, Transport};
use redis::aio::MultiplexedConnection;
use test_support::{RedisServer, cpu_time};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const ROUNDS: usize = 3;
/// One task's cycles per lock: [`ONE_TASK_BLOCKS`] blocks of [`ONE_TASK_BLOCK`], the six
/// locks' blocks taking turns, so that drift over the run (a p50 of about 200 µs on an idle
/// machine is mostly wake-ups, and they vary) hits all six alike.
const ONE_TASK_BLOCKS: usize = 80;
const ONE_TASK_BLOCK: usize = 100;
const TASKS: usize = 64;
const WINDOW: Duration = Duration::from_secs(2);
const TTL_MS: u64 = 10_000;

/// The fenced floor's scripts (`benches/floor/`), shared by hotpath_bench and script_instructions.
const FLOOR_ACQUIRE: &str = include_str!("floor/acquire.lua");
const FLOOR_RELEASE: &str = include_str!("floor/release.lua");

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lock {
    Leasehold,
    OverRedisRs,
    FencedFloor,
    SetNxFloor,
    Rslock,
    ItsScripts,
}

/// The indices in [`LOCKS`] of the two the others are compared with.
const FLOOR: usize = 2;
const RSLOCK: usize = 4;

const LOCKS: [Lock; 6] = [
    Lock::Leasehold,
    Lock::OverRedisRs,
    Lock::FencedFloor,
    Lock::SetNxFloor,
    Lock::Rslock,
    Lock::ItsScripts,
];

impl Lock {
    fn name(self) -> &'static str {
        match self {
            Lock::Leasehold => "leasehold",
            Lock::OverRedisRs => "over redis-rs",
            Lock::FencedFloor => "fenced floor",
            Lock::SetNxFloor => "SET NX floor",
            Lock::Rslock => "rslock",
            Lock::ItsScripts => "its scripts",
        }
    }

    /// The lock that `variable` names, for the modes that run one lock alone.
    fn named(variable: &str) -> Res<Option<Lock>> {
        let Ok(name) = std::env::var(variable) else {
            return Ok(None);
        };
        match LOCKS.into_iter().find(|l| l.name() == name) {
            Some(lock) => Ok(Some(lock)),
            None => Err(format!("{variable} names no lock").into()),
        }
    }
}

/// Leasehold's own scripts, for the "its scripts" row, with each resource's keys built once.
struct OwnScripts {
    acquire: redis::Script,
    release: redis::Script,
    /// Each resource's lease key and fence counter key.
    keys: Vec<(String, String)>,
    /// The counter idle expiry in milliseconds, the scripts' first argument, as the library
    /// sends it by default.
    counter_idle_ms: u64,
}

/// Everything the six need, shared by the tasks.
struct Bench {
    client: RedisLeases,
    /// The same, on redis-rs's connection.
    over_redis_rs: RedisLeases,
    purpose: Purpose,
    digests: Vec<ResourceDigest>,
    raw: MultiplexedConnection,
    acquire: redis::Script,
    release: redis::Script,
    rslock: rslock::LockManager,
    serial: AtomicU64,
    server_pid: String,
    own: OwnScripts,
}

impl Bench {
    /// One acquire and release of resource `r` by `lock`.
    async fn cycle(&self, lock: Lock, r: usize) -> Res<()> {
        let n = self.serial.fetch_add(1, Ordering::Relaxed);
        match lock {
            Lock::Leasehold | Lock::OverRedisRs => {
                let client = if lock == Lock::Leasehold {
                    &self.client
                } else {
                    &self.over_redis_rs
                };
                let attempt = client.new_attempt(OperationId::new("bench")?)?;
                let request = client.request(
                    self.purpose.clone(),
                    self.digests[r].clone(),
                    attempt,
                    Duration::from_millis(TTL_MS),
                )?;
                let lease = client
                    .try_acquire(&request)
                    .await
                    .into_handle()
                    .ok_or("leasehold: not granted")?;
                if lease.release().await != leasehold_redis::leasehold::ReleaseOutcome::Released {
                    return Err("leasehold: not released".into());
                }
            }
            Lock::FencedFloor => {
                let key = format!("floor:{{r{r}}}");
                let token = format!("t{n}");
                let mut raw = self.raw.clone();
                let fence: i64 = self
                    .acquire
                    .key(&key)
                    .key(format!("{key}:fence"))
                    .arg(&token)
                    .arg(TTL_MS)
                    .invoke_async(&mut raw)
                    .await?;
                if fence == 0 {
                    return Err("fenced floor: not granted".into());
                }
                let value = format!("{token}:{fence}");
                let deleted: i64 = self
                    .release
                    .key(&key)
                    .arg(value)
                    .invoke_async(&mut raw)
                    .await?;
                if deleted != 1 {
                    return Err("fenced floor: not released".into());
                }
            }
            Lock::SetNxFloor => {
                let key = format!("setnx:{{r{r}}}");
                let token = format!("t{n}");
                let mut raw = self.raw.clone();
                let set: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL_MS)
                    .query_async(&mut raw)
                    .await?;
                if set.is_none() {
                    return Err("SET NX: not granted".into());
                }
                let deleted: i64 = self
                    .release
                    .key(&key)
                    .arg(token)
                    .invoke_async(&mut raw)
                    .await?;
                if deleted != 1 {
                    return Err("SET NX: not released".into());
                }
            }
            Lock::Rslock => {
                let resource = format!("rslock:r{r}");
                let lock = self
                    .rslock
                    .lock(resource.as_bytes(), Duration::from_millis(TTL_MS))
                    .await
                    .map_err(|e| format!("rslock: {e:?}"))?;
                self.rslock.unlock(&lock).await;
            }
            Lock::ItsScripts => {
                let (key, fence_key) = &self.own.keys[r];
                let attempt = format!("{n:022}:bench");
                let mut raw = self.raw.clone();
                let granted: redis::Value = self
                    .own
                    .acquire
                    .key(key)
                    .key(fence_key)
                    .arg(self.own.counter_idle_ms)
                    .arg(&attempt)
                    .arg(TTL_MS)
                    .invoke_async(&mut raw)
                    .await?;
                let redis::Value::BulkString(fence) = granted else {
                    return Err("its scripts: not granted".into());
                };
                let grant = format!("{}:{attempt}", String::from_utf8(fence)?);
                let released: i64 = self
                    .own
                    .release
                    .key(key)
                    .arg(grant)
                    .invoke_async(&mut raw)
                    .await?;
                if released != 1 {
                    return Err("its scripts: not released".into());
                }
            }
        }
        Ok(())
    }
}

/// CPU time the calling thread has used, in ns (Linux's schedstat; 0 where there is none):
/// the one-task loop runs on the main thread, so this is the client's work on the critical
/// path of each cycle, parking and waking included; the time spent waiting for the reply,
/// which is most of the latency, is not in it.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// What one task measured of one lock.
struct OneTask {
    /// Latency per cycle, µs.
    latency: Histogram<u64>,
    /// The calling thread's CPU per cycle, µs ([`thread_cpu_ns`]).
    caller_us: f64,
}

/// One task's latencies per cycle, per lock: the locks take turns, a block of cycles each,
/// the first lock of each turn rotating.
async fn one_task(bench: &Bench) -> Res<Vec<OneTask>> {
    let mut measured = Vec::with_capacity(LOCKS.len());
    for _ in LOCKS {
        measured.push(OneTask {
            latency: latency_histogram()?,
            caller_us: 0.0,
        });
    }
    for block in 0..ONE_TASK_BLOCKS {
        for k in 0..LOCKS.len() {
            let i = (k + block) % LOCKS.len();
            let cpu_before = thread_cpu_ns();
            for _ in 0..ONE_TASK_BLOCK {
                let t = Instant::now();
                bench.cycle(LOCKS[i], 0).await?;
                measured[i].latency.record(micros(t.elapsed()))?;
            }
            measured[i].caller_us += thread_cpu_ns().saturating_sub(cpu_before) as f64 / 1e3;
        }
    }
    for m in &mut measured {
        m.caller_us /= (ONE_TASK_BLOCKS * ONE_TASK_BLOCK) as f64;
    }
    Ok(measured)
}

/// A histogram of latencies in µs, up to 10 s.
fn latency_histogram() -> Res<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 10_000_000, 3)?)
}

/// What one round of 64 tasks measured.
struct Load {
    cycles_per_second: f64,
    /// CPU per cycle, µs: the server's and this process's.
    server_us: f64,
    client_us: f64,
}

/// One round of 64 tasks, each on its own resource, for [`WINDOW`].
async fn many_tasks(bench: &Arc<Bench>, lock: Lock) -> Res<Load> {
    let (server_before, client_before) = (cpu_time(&bench.server_pid), cpu_time("self"));
    let started = Instant::now();
    let deadline = started + WINDOW;
    let mut tasks = Vec::with_capacity(TASKS);
    for r in 0..TASKS {
        let bench = Arc::clone(bench);
        tasks.push(tokio::spawn(async move {
            let mut cycles = 0u64;
            while Instant::now() < deadline {
                bench.cycle(lock, r).await?;
                cycles += 1;
            }
            Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(cycles)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    let elapsed = started.elapsed();
    let per_cycle = |d: Duration| d.as_secs_f64() * 1e6 / total.max(1) as f64;
    Ok(Load {
        cycles_per_second: total as f64 / elapsed.as_secs_f64(),
        server_us: per_cycle(cpu_time(&bench.server_pid).saturating_sub(server_before)),
        client_us: per_cycle(cpu_time("self").saturating_sub(client_before)),
    })
}

#[tokio::main]
async fn main() -> Res<()> {
    let server = RedisServer::start();
    let client = RedisBackend::open(&server.url(), RedisSettings::default())?.into_client();
    client.backend().warm_up().await?;
    let over_redis_rs = RedisBackend::open(
        &server.url(),
        RedisSettings::default().with_transport(Transport::RedisRs),
    )?
    .into_client();
    over_redis_rs.backend().warm_up().await?;
    let raw = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let bench = Arc::new(Bench {
        client,
        over_redis_rs,
        purpose: Purpose::new("bench")?,
        digests: (0..TASKS)
            .map(|r| ResourceDigest::of(format!("r{r}")))
            .collect(),
        raw,
        acquire: redis::Script::new(FLOOR_ACQUIRE),
        release: redis::Script::new(FLOOR_RELEASE),
        rslock: rslock::LockManager::new(vec![server.url()]),
        serial: AtomicU64::new(0),
        server_pid: server.pid().to_string(),
        own: OwnScripts {
            acquire: redis::Script::new(include_str!("../lua/acquire.lua")),
            release: redis::Script::new(include_str!("../lua/release.lua")),
            keys: {
                let layout = leasehold_redis::KeyLayout::new(&RedisSettings::default());
                let purpose = Purpose::new("barebench")?;
                (0..TASKS)
                    .map(|r| {
                        let d = ResourceDigest::of(format!("r{r}"));
                        (
                            layout.lease_key(&purpose, &d),
                            layout.fence_key(&purpose, &d),
                        )
                    })
                    .collect()
            },
            counter_idle_ms: u64::try_from(
                RedisSettings::default().counter_idle_expiry().as_millis(),
            )?,
        },
    });
    // Warm every path (scripts cached, connections made) before measuring.
    for lock in LOCKS {
        for _ in 0..200 {
            bench.cycle(lock, 0).await?;
        }
    }

    if let Some(lock) = Lock::named("HOTPATH_ONE")? {
        let mut h = latency_histogram()?;
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            let t = Instant::now();
            bench.cycle(lock, 0).await?;
            h.record(micros(t.elapsed()))?;
        }
        println!(
            "{}: p50 {} µs over {}",
            lock.name(),
            h.value_at_quantile(0.5),
            h.len()
        );
        return Ok(());
    }
    if let Some(lock) = Lock::named("HOTPATH_PROFILE")? {
        let mut total = 0.0;
        for _ in 0..5 {
            total += many_tasks(&bench, lock).await?.cycles_per_second;
        }
        println!("{}: {:.0} cycles/s", lock.name(), total / 5.0);
        let mut raw = bench.raw.clone();
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut raw)
            .await?;
        println!("{stats}");
        return Ok(());
    }
    let one = one_task(&bench).await?;
    let p50: Vec<f64> = one
        .iter()
        .map(|m| m.latency.value_at_quantile(0.50) as f64)
        .collect();
    let p99: Vec<f64> = one
        .iter()
        .map(|m| m.latency.value_at_quantile(0.99) as f64)
        .collect();
    if std::env::var_os("HOTPATH_ONE_TASK").is_some() {
        for (i, lock) in LOCKS.iter().enumerate() {
            println!(
                "{:<14} p50 {:>4.0} µs  p99 {:>4.0} µs  p50 / floor {:.2}x  caller CPU {:.2} µs",
                lock.name(),
                p50[i],
                p99[i],
                p50[i] / p50[FLOOR],
                one[i].caller_us
            );
        }
        return Ok(());
    }
    let mut rate = vec![Vec::new(); LOCKS.len()];
    let mut server_us = vec![Vec::new(); LOCKS.len()];
    let mut client_us = vec![Vec::new(); LOCKS.len()];
    for round in 0..ROUNDS {
        for k in 0..LOCKS.len() {
            let i = (k + round) % LOCKS.len();
            let load = many_tasks(&bench, LOCKS[i]).await?;
            rate[i].push(load.cycles_per_second);
            server_us[i].push(load.server_us);
            client_us[i].push(load.client_us);
        }
    }
    let rate: Vec<f64> = rate.into_iter().map(median).collect();
    let server_us: Vec<f64> = server_us.into_iter().map(median).collect();
    let client_us: Vec<f64> = client_us.into_iter().map(median).collect();

    println!(
        "hot path: acquire + release, one redis-server on loopback; 1 task: {} cycles each in \
         blocks of {ONE_TASK_BLOCK} taking turns; 64 tasks: medians of {ROUNDS} rotated rounds",
        ONE_TASK_BLOCKS * ONE_TASK_BLOCK
    );
    println!(
        "{:<14} {:>8} {:>8} {:>9} {:>9}   {:>10} {:>9} {:>9}",
        "", "1 task", "", "p50 /", "p50 /", "64 tasks", "rate /", "rate /"
    );
    println!(
        "{:<14} {:>8} {:>8} {:>9} {:>9}   {:>10} {:>9} {:>9}",
        "", "p50 µs", "p99 µs", "floor", "rslock", "cycles/s", "floor", "rslock"
    );
    for (i, lock) in LOCKS.iter().enumerate() {
        println!(
            "{:<14} {:>8.0} {:>8.0} {:>8.2}x {:>8.2}x   {:>10.0} {:>8.2}x {:>8.2}x",
            lock.name(),
            p50[i],
            p99[i],
            p50[i] / p50[FLOOR],
            p50[i] / p50[RSLOCK],
            rate[i],
            rate[i] / rate[FLOOR],
            rate[i] / rate[RSLOCK],
        );
    }
    println!(
        "CPU per cycle, µs: under the 64-task load (from /proc, 10 ms ticks), and one task's \
         calling thread (its work on the critical path, not its waiting)"
    );
    for (i, lock) in LOCKS.iter().enumerate() {
        println!(
            "{:<14} server {:>5.1}  client {:>5.1}  total {:>5.1}   1 task: caller {:>5.1}",
            lock.name(),
            server_us[i],
            client_us[i],
            server_us[i] + client_us[i],
            one[i].caller_us
        );
    }
    println!(
        "(the fenced floor: one script that refuses a held key, INCRs the fence and SETs PX, \
         and a compare-and-delete; SET NX floor: unfenced; rslock: no fencing; its scripts: \
         leasehold's acquire.lua and release.lua through plain redis-rs, one call each)"
    );
    Ok(())
}
