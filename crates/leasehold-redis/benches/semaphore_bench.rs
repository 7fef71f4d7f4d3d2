//! `make bench`: counting semaphores (issue 36), side by side in one run on one redis-server.
//!
//! Three measurements, each beside the floor and a limit:
//!
//! 1. **One task**, acquire + release of a semaphore of capacity 8, latency p50 / p99:
//!    - **leasehold**: the one-call layer, `client.semaphore(name, 8).await` then
//!      `guard.release().await` (fenced slots, fair queue, keep-alive: every guarantee on);
//!    - **explicit API**: the same permit through `try_acquire` and the handle's `release`,
//!      with no guard and no watchdog: splits what the one-call layer adds;
//!    - **its scripts**: leasehold's `semaphore_acquire.lua` and `semaphore_release.lua`
//!      through plain redis-rs `Script`s, one call each: splits leasehold's distance from the
//!      floor into what its scripts cost the server and what the library adds on the client;
//!    - **floor**: the usual sorted-set semaphore (`benches/floor/semaphore_*.lua`, npm
//!      redis-semaphore's: `ZREMRANGEBYSCORE` the expired, `ZCARD` < N then `ZADD` +
//!      `PEXPIRE`; release `ZREM`), unfenced and unfair, sent by EVALSHA on one redis-rs
//!      multiplexed connection, as leasehold sends its scripts;
//!    - **limit**: the floor's scripts written by the caller to its own TCP socket and its
//!      reply read back there (no client library, no hand-off to a connection task).
//!
//!    The five take turns in blocks of 100 cycles, so that drift hits all of them alike.
//! 2. **64 tasks** on one semaphore of capacity 8, each looping acquire-with-wait → release
//!    with no work in between, cycles completed in fixed windows (median of rotated rounds).
//!    leasehold waits as it does (a place in the queue, woken by the release notice); the
//!    floor has no queue and no notice, so its tasks poll: retry after 1 ms, a tight poll
//!    (npm redis-semaphore's default `retryInterval` is 10 ms, also measured), on one
//!    multiplexed connection. The bound is the floor's scripts run by only 8 tasks, one per
//!    permit, on that connection: no try is ever refused, so none is wasted. (A socket per
//!    task was tried as the limit here and came out below the multiplexed floor — 64 polling
//!    sockets made 3,067 cycles/s against its 7,550, 8 never refused 7,390 — since each
//!    socket costs the server a read and a write per command, which one pipelined connection
//!    shares among many.)
//! 3. **Hand-off**, capacity 1: one holder releases while one waiter waits (leasehold's in
//!    the queue); time from the release call (and from its return) to the waiter's grant:
//!    leasehold (notified), the floor polling every 1 ms and every 10 ms, and the limit: the
//!    floor's scripts on raw sockets, the release announced by `PUBLISH` to a waiter that
//!    reads it on its own subscribed socket and tries at once.
//!
//! Prints figures and ratios; asserts nothing about them. About a minute.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use leasehold_redis::leasehold::lock::DEFAULT_PURPOSE;
use leasehold_redis::leasehold::{OperationId, Purpose, ReleaseOutcome, ResourceDigest};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings, SemaphoreKeys};
use redis::aio::MultiplexedConnection;
use test_support::{RedisServer, cpu_time};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const CAPACITY: u32 = 8;
const TTL: Duration = Duration::from_secs(10);
const TTL_MS: u64 = 10_000;
/// What leasehold passes as the idle expiry of a semaphore's record and counter (7 days).
const IDLE_MS: u64 = 7 * 86_400_000;

/// One task's cycles per contender: blocks of [`ONE_TASK_BLOCK`], the contenders' blocks
/// taking turns.
const ONE_TASK_BLOCKS: usize = 60;
const ONE_TASK_BLOCK: usize = 100;

const TASKS: usize = 64;
const WINDOW: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;

/// The floor's retry interval: a tight poll (tokio's timer makes it 1–2 ms).
const POLL: Duration = Duration::from_millis(1);
/// npm redis-semaphore's default `retryInterval`.
const SLOW_POLL: Duration = Duration::from_millis(10);

const HANDOFF_ROUNDS: usize = 200;
/// How long the holder keeps the permit once the waiter waits: time for leasehold's waiter
/// to subscribe to the release notice (as handoff.rs gives it).
const HANDOFF_SETTLE: Duration = Duration::from_millis(5);
/// Where the limit's hand-off announces a release.
const LIMIT_CHANNEL: &str = "limit-handoff:released";

const FLOOR_ACQUIRE: &str = include_str!("floor/semaphore_acquire.lua");
const FLOOR_RELEASE: &str = include_str!("floor/semaphore_release.lua");

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn micros(from: Instant, to: Instant) -> u64 {
    // The waiter can be granted before the releaser has read its own reply: count that as 1 µs.
    u64::try_from(to.saturating_duration_since(from).as_micros())
        .unwrap_or(u64::MAX)
        .max(1)
}

fn histogram() -> Res<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A reply read off a raw socket: what the floor's scripts and pub/sub send.
#[derive(Debug)]
enum RawReply {
    Int(i64),
    Text(Vec<u8>),
    Nil,
    Array(Vec<RawReply>),
}

/// The physical limit's connection: RESP written by the calling task to its own socket and
/// the reply read back there, nothing in between.
struct RawSocket {
    stream: BufReader<TcpStream>,
    out: Vec<u8>,
    line: String,
}

impl RawSocket {
    async fn connect(addr: SocketAddr) -> Res<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: BufReader::new(stream),
            out: Vec::with_capacity(256),
            line: String::with_capacity(64),
        })
    }

    async fn call(&mut self, args: &[&[u8]]) -> Res<RawReply> {
        self.out.clear();
        self.out
            .extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in args {
            self.out
                .extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            self.out.extend_from_slice(arg);
            self.out.extend_from_slice(b"\r\n");
        }
        self.stream.get_mut().write_all(&self.out).await?;
        self.read().await
    }

    async fn read_line(&mut self) -> Res<()> {
        self.line.clear();
        if self.stream.read_line(&mut self.line).await? == 0 {
            return Err("raw socket: closed".into());
        }
        self.line.truncate(self.line.trim_end().len());
        Ok(())
    }

    /// One reply; an array's elements are scalars (all that is read here).
    async fn read(&mut self) -> Res<RawReply> {
        self.read_line().await?;
        if let Some(n) = self.line.strip_prefix('*') {
            let n: i64 = n.parse()?;
            let mut items = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
            for _ in 0..n {
                self.read_line().await?;
                items.push(self.scalar().await?);
            }
            return Ok(RawReply::Array(items));
        }
        self.scalar().await
    }

    /// The scalar whose first line is in `self.line`.
    async fn scalar(&mut self) -> Res<RawReply> {
        let (kind, rest) = self.line.split_at(1.min(self.line.len()));
        match kind {
            ":" => Ok(RawReply::Int(rest.parse()?)),
            "+" => Ok(RawReply::Text(rest.as_bytes().to_vec())),
            "-" => Err(format!("raw socket: {rest}").into()),
            "$" => {
                let len: i64 = rest.parse()?;
                let Ok(len) = usize::try_from(len) else {
                    return Ok(RawReply::Nil);
                };
                let mut body = vec![0; len + 2];
                self.stream.read_exact(&mut body).await?;
                body.truncate(len);
                Ok(RawReply::Text(body))
            }
            _ => Err(format!("raw socket: unexpected {:?}", self.line).into()),
        }
    }

    async fn load(&mut self, script: &str) -> Res<String> {
        match self.call(&[b"SCRIPT", b"LOAD", script.as_bytes()]).await? {
            RawReply::Text(sha) => Ok(String::from_utf8(sha)?),
            other => Err(format!("SCRIPT LOAD: {other:?}").into()),
        }
    }
}

/// The floor's two scripts, by SHA for the raw sockets and as redis-rs `Script`s.
struct Floor {
    acquire: redis::Script,
    release: redis::Script,
    acquire_sha: String,
    release_sha: String,
}

impl Floor {
    /// One try on the multiplexed connection: true if a place was taken.
    async fn try_acquire(
        &self,
        conn: &mut MultiplexedConnection,
        key: &str,
        member: &str,
        limit: u32,
    ) -> Res<bool> {
        let taken: i64 = self
            .acquire
            .key(key)
            .arg(limit)
            .arg(member)
            .arg(TTL_MS)
            .arg(now_ms())
            .invoke_async(conn)
            .await?;
        Ok(taken == 1)
    }

    async fn release(&self, conn: &mut MultiplexedConnection, key: &str, member: &str) -> Res<()> {
        let removed: i64 = self.release.key(key).arg(member).invoke_async(conn).await?;
        if removed != 1 {
            return Err("floor: not released".into());
        }
        Ok(())
    }

    /// One try on a raw socket.
    async fn raw_try_acquire(
        &self,
        sock: &mut RawSocket,
        key: &str,
        member: &str,
        limit: u32,
    ) -> Res<bool> {
        let (limit, ttl, now) = (limit.to_string(), TTL_MS.to_string(), now_ms().to_string());
        let reply = sock
            .call(&[
                b"EVALSHA",
                self.acquire_sha.as_bytes(),
                b"1",
                key.as_bytes(),
                limit.as_bytes(),
                member.as_bytes(),
                ttl.as_bytes(),
                now.as_bytes(),
            ])
            .await?;
        match reply {
            RawReply::Int(n) => Ok(n == 1),
            other => Err(format!("limit acquire: {other:?}").into()),
        }
    }

    /// A release on a raw socket, announced on `channel` if one is given.
    async fn raw_release(
        &self,
        sock: &mut RawSocket,
        key: &str,
        member: &str,
        channel: Option<&str>,
    ) -> Res<()> {
        let mut args: Vec<&[u8]> = vec![
            b"EVALSHA",
            self.release_sha.as_bytes(),
            b"1",
            key.as_bytes(),
            member.as_bytes(),
        ];
        if let Some(channel) = channel {
            args.push(channel.as_bytes());
        }
        match sock.call(&args).await? {
            RawReply::Int(1) => Ok(()),
            other => Err(format!("limit release: {other:?}").into()),
        }
    }
}

/// Script calls and the server's time in them, and PUBLISHes, from `INFO commandstats`.
#[derive(Debug, Default, Clone, Copy)]
struct ScriptStats {
    calls: u64,
    usec: u64,
    publishes: u64,
}

impl ScriptStats {
    async fn read(conn: &mut MultiplexedConnection) -> Res<Self> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await?;
        let mut stats = Self::default();
        for line in info.lines() {
            let Some((name, rest)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            let field = |f: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('=')?.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            match name {
                "evalsha" | "eval" => {
                    stats.calls += field("calls");
                    stats.usec += field("usec");
                }
                "publish" => stats.publishes += field("calls"),
                _ => {}
            }
        }
        Ok(stats)
    }

    fn since(self, before: Self) -> Self {
        Self {
            calls: self.calls.saturating_sub(before.calls),
            usec: self.usec.saturating_sub(before.usec),
            publishes: self.publishes.saturating_sub(before.publishes),
        }
    }
}

/// Everything the measurements share.
struct Bench {
    client: RedisLeases,
    /// The floor's connection (and the one `INFO` is read on, between measurements).
    conn: MultiplexedConnection,
    floor: Arc<Floor>,
    own_acquire: redis::Script,
    own_release: redis::Script,
    own_keys: SemaphoreKeys,
    serial: AtomicU64,
    server_pid: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum One {
    Leasehold,
    Explicit,
    ItsScripts,
    Floor,
    Limit,
}

const ONE: [One; 5] = [
    One::Leasehold,
    One::Explicit,
    One::ItsScripts,
    One::Floor,
    One::Limit,
];
/// Indices in [`ONE`] of what the others are compared with.
const ONE_FLOOR: usize = 3;
const ONE_LIMIT: usize = 4;

impl One {
    fn name(self) -> &'static str {
        match self {
            One::Leasehold => "leasehold (one-call)",
            One::Explicit => "leasehold (explicit API)",
            One::ItsScripts => "its scripts (redis-rs)",
            One::Floor => "floor (EVALSHA, redis-rs)",
            One::Limit => "limit (own socket)",
        }
    }
}

impl Bench {
    /// One acquire + release by one task, on a semaphore of capacity [`CAPACITY`].
    async fn one_cycle(&self, who: One, sock: &mut RawSocket) -> Res<()> {
        let n = self.serial.fetch_add(1, Ordering::Relaxed);
        match who {
            One::Leasehold => {
                let permit = self.client.semaphore("one-task", CAPACITY).ttl(TTL).await?;
                if permit.release().await != ReleaseOutcome::Released {
                    return Err("leasehold: not released".into());
                }
            }
            One::Explicit => {
                let attempt = self.client.new_attempt(OperationId::new("bench")?)?;
                let request = self
                    .client
                    .request(
                        Purpose::new(DEFAULT_PURPOSE)?,
                        ResourceDigest::of("one-task-explicit"),
                        attempt,
                        TTL,
                    )?
                    .with_capacity(CAPACITY)?;
                let permit = self
                    .client
                    .try_acquire(&request)
                    .await
                    .into_handle()
                    .ok_or("leasehold explicit: not granted")?;
                if permit.release().await != ReleaseOutcome::Released {
                    return Err("leasehold explicit: not released".into());
                }
            }
            One::ItsScripts => {
                let keys = &self.own_keys;
                let attempt = format!("{n:022}:bench");
                let mut conn = self.conn.clone();
                let granted: redis::Value = self
                    .own_acquire
                    .key(&keys.capacity)
                    .key(&keys.fence_counter)
                    .key(&keys.queue)
                    .key(&keys.heartbeats)
                    .key(&keys.slot_prefix)
                    .arg(&attempt)
                    .arg(TTL_MS)
                    .arg(CAPACITY)
                    .arg(0)
                    .arg(IDLE_MS)
                    .invoke_async(&mut conn)
                    .await?;
                let redis::Value::Array(reply) = granted else {
                    return Err("its scripts: not an array".into());
                };
                let (Some(redis::Value::BulkString(fence)), Some(redis::Value::Int(slot))) =
                    (reply.get(1), reply.get(2))
                else {
                    return Err(format!("its scripts: not granted: {reply:?}").into());
                };
                let grant = format!("{}:{attempt}", String::from_utf8_lossy(fence));
                let released: i64 = self
                    .own_release
                    .key(&keys.capacity)
                    .key(&keys.queue)
                    .key(&keys.heartbeats)
                    .key(&keys.slot_prefix)
                    .key(&keys.writers)
                    .arg(grant)
                    .arg(slot.to_string())
                    .arg(CAPACITY)
                    .arg(&keys.channel)
                    .arg("0")
                    .arg("0")
                    .invoke_async(&mut conn)
                    .await?;
                if released != 1 {
                    return Err("its scripts: not released".into());
                }
            }
            One::Floor => {
                let member = format!("m{n}");
                let mut conn = self.conn.clone();
                if !self
                    .floor
                    .try_acquire(&mut conn, "floor:one", &member, CAPACITY)
                    .await?
                {
                    return Err("floor: not granted".into());
                }
                self.floor.release(&mut conn, "floor:one", &member).await?;
            }
            One::Limit => {
                let member = format!("m{n}");
                if !self
                    .floor
                    .raw_try_acquire(sock, "limit:one", &member, CAPACITY)
                    .await?
                {
                    return Err("limit: not granted".into());
                }
                self.floor
                    .raw_release(sock, "limit:one", &member, None)
                    .await?;
            }
        }
        Ok(())
    }
}

/// What one task measured of one contender.
struct OneTask {
    latency: Histogram<u64>,
    /// The server's time in scripts per cycle, µs (`INFO commandstats`).
    script_us: f64,
}

async fn one_task(bench: &Bench, sock: &mut RawSocket) -> Res<Vec<OneTask>> {
    let mut measured = Vec::with_capacity(ONE.len());
    for _ in ONE {
        measured.push(OneTask {
            latency: histogram()?,
            script_us: 0.0,
        });
    }
    let mut conn = bench.conn.clone();
    for block in 0..ONE_TASK_BLOCKS {
        for k in 0..ONE.len() {
            let i = (k + block) % ONE.len();
            let before = ScriptStats::read(&mut conn).await?;
            for _ in 0..ONE_TASK_BLOCK {
                let t = Instant::now();
                bench.one_cycle(ONE[i], sock).await?;
                measured[i].latency.record(micros(t, Instant::now()))?;
            }
            measured[i].script_us += ScriptStats::read(&mut conn).await?.since(before).usec as f64;
        }
    }
    for m in &mut measured {
        m.script_us /= (ONE_TASK_BLOCKS * ONE_TASK_BLOCK) as f64;
    }
    Ok(measured)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Many {
    Leasehold,
    Floor,
    FloorSlow,
    Bound,
}

const MANY: [Many; 4] = [Many::Leasehold, Many::Floor, Many::FloorSlow, Many::Bound];
const MANY_FLOOR: usize = 1;
const MANY_BOUND: usize = 3;

impl Many {
    fn name(self) -> &'static str {
        match self {
            Many::Leasehold => "leasehold (queued, notified)",
            Many::Floor => "floor, polls every 1 ms",
            Many::FloorSlow => "floor, polls every 10 ms",
            Many::Bound => "bound: 8 tasks, never refused",
        }
    }

    /// How many tasks: 64, but for the bound only as many as there are permits, so that no
    /// try is ever refused and no poll is wasted.
    fn tasks(self) -> usize {
        match self {
            Many::Bound => CAPACITY as usize,
            _ => TASKS,
        }
    }
}

/// What one window of tasks measured.
struct Load {
    cycles: u64,
    /// Cycles per task.
    per_task: Vec<u64>,
    scripts: ScriptStats,
    server_cpu: Duration,
    client_cpu: Duration,
}

/// One task's loop: acquire (waiting) → release until `deadline`; counts the cycles whose
/// release returned by then.
async fn many_task(
    bench: &Bench,
    who: Many,
    name: &str,
    task: usize,
    deadline: Instant,
) -> Res<u64> {
    let mut cycles = 0;
    let mut conn = bench.conn.clone();
    let mut n = 0u64;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(cycles);
        }
        n += 1;
        match who {
            Many::Leasehold => {
                match bench
                    .client
                    .semaphore(name, CAPACITY)
                    .ttl(TTL)
                    .wait(left)
                    .await
                {
                    Ok(permit) => {
                        if permit.release().await != ReleaseOutcome::Released {
                            return Err("leasehold: not released".into());
                        }
                    }
                    Err(e) if e.is_contended() => return Ok(cycles),
                    Err(e) => return Err(e.into()),
                }
            }
            Many::Floor | Many::FloorSlow | Many::Bound => {
                let member = format!("t{task}:{n}");
                let poll = if who == Many::FloorSlow {
                    SLOW_POLL
                } else {
                    POLL
                };
                loop {
                    let taken = bench
                        .floor
                        .try_acquire(&mut conn, name, &member, CAPACITY)
                        .await?;
                    if taken {
                        break;
                    }
                    if Instant::now() >= deadline {
                        return Ok(cycles);
                    }
                    tokio::time::sleep(poll).await;
                }
                bench.floor.release(&mut conn, name, &member).await?;
            }
        }
        if Instant::now() <= deadline {
            cycles += 1;
        }
    }
}

/// One window of `who`'s tasks on a fresh semaphore.
async fn many_tasks(bench: &Arc<Bench>, who: Many, round: usize, window: Duration) -> Res<Load> {
    let name = format!("many-{round}-{who:?}");
    let mut conn = bench.conn.clone();
    let scripts_before = ScriptStats::read(&mut conn).await?;
    let (server_before, client_before) = (cpu_time(&bench.server_pid), cpu_time("self"));
    let deadline = Instant::now() + window;
    let mut tasks = Vec::with_capacity(who.tasks());
    for task in 0..who.tasks() {
        let bench = Arc::clone(bench);
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            many_task(&bench, who, &name, task, deadline).await
        }));
    }
    let mut per_task = Vec::with_capacity(who.tasks());
    for task in tasks {
        per_task.push(task.await??);
    }
    let (server_cpu, client_cpu) = (
        cpu_time(&bench.server_pid).saturating_sub(server_before),
        cpu_time("self").saturating_sub(client_before),
    );
    // Waits given up at the deadline give their places back in the background.
    bench.client.settle().await;
    Ok(Load {
        cycles: per_task.iter().sum(),
        per_task,
        scripts: ScriptStats::read(&mut conn).await?.since(scripts_before),
        server_cpu,
        client_cpu,
    })
}

/// Release call → grant and release returned → grant, µs.
type HandOff = (u64, u64);

/// leasehold: the holder's permit, a waiter queued behind it on another client.
async fn leasehold_handoff(
    holder: &RedisLeases,
    waiter: &RedisLeases,
    conn: &mut MultiplexedConnection,
    i: usize,
) -> Res<HandOff> {
    let name = format!("handoff-{i}");
    let held = holder.semaphore(&name, 1).ttl(TTL).await?;
    let queue = holder
        .backend()
        .keys()
        .semaphore(&Purpose::new(DEFAULT_PURPOSE)?, &ResourceDigest::of(&name))
        .queue;
    let (waiter, waited) = (waiter.clone(), name.clone());
    let task = tokio::spawn(async move {
        let permit = waiter
            .semaphore(&waited, 1)
            .ttl(TTL)
            .wait(Duration::from_secs(5))
            .await?;
        let at = Instant::now();
        let _ = permit.release().await;
        Ok::<Instant, leasehold_redis::leasehold::LockError>(at)
    });
    // Queued, then time to subscribe to the notice.
    let start = Instant::now();
    loop {
        let queued: i64 = redis::cmd("ZCARD")
            .arg(&queue)
            .query_async(&mut *conn)
            .await?;
        if queued >= 1 {
            break;
        }
        if start.elapsed() > Duration::from_secs(2) {
            return Err("leasehold hand-off: the waiter never queued".into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(HANDOFF_SETTLE).await;
    let called = Instant::now();
    if held.release().await != ReleaseOutcome::Released {
        return Err("leasehold hand-off: not released".into());
    }
    let returned = Instant::now();
    let at = task.await??;
    Ok((micros(called, at), micros(returned, at)))
}

/// The floor: the holder on one connection, a waiter polling every `poll` on another.
async fn floor_handoff(
    floor: &Arc<Floor>,
    holder: &mut MultiplexedConnection,
    waiter: &MultiplexedConnection,
    poll: Duration,
    i: usize,
) -> Res<HandOff> {
    let key = format!("floor-handoff-{}-{i}", poll.as_millis());
    if !floor.try_acquire(holder, &key, "holder", 1).await? {
        return Err("floor hand-off: holder not granted".into());
    }
    let tries = Arc::new(AtomicU64::new(0));
    let task = {
        let (floor, mut conn, key, tries) = (
            Arc::clone(floor),
            waiter.clone(),
            key.clone(),
            Arc::clone(&tries),
        );
        tokio::spawn(async move {
            loop {
                let taken = floor.try_acquire(&mut conn, &key, "waiter", 1).await?;
                tries.fetch_add(1, Ordering::Relaxed);
                if taken {
                    let at = Instant::now();
                    floor.release(&mut conn, &key, "waiter").await?;
                    return Ok::<Instant, Box<dyn std::error::Error + Send + Sync>>(at);
                }
                tokio::time::sleep(poll).await;
            }
        })
    };
    while tries.load(Ordering::Relaxed) == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // A phase against the poll that changes from round to round, as in real life.
    let period = u64::try_from(poll.as_millis()).unwrap_or(1).max(1);
    tokio::time::sleep(HANDOFF_SETTLE + Duration::from_millis((i as u64 * 7) % period)).await;
    let called = Instant::now();
    floor.release(holder, &key, "holder").await?;
    let returned = Instant::now();
    let at = task.await??;
    Ok((micros(called, at), micros(returned, at)))
}

/// The limit: the floor's scripts on raw sockets, the release announced to a waiter that
/// reads the notice on its own subscribed socket and tries at once.
async fn limit_handoff(
    floor: &Arc<Floor>,
    holder: &mut RawSocket,
    waiter: &mut Option<(RawSocket, RawSocket)>,
    i: usize,
) -> Res<HandOff> {
    let key = format!("limit-handoff-{i}");
    if !floor.raw_try_acquire(holder, &key, "holder", 1).await? {
        return Err("limit hand-off: holder not granted".into());
    }
    let (mut sock, mut notices) = waiter.take().ok_or("limit hand-off: no waiter")?;
    let (tried, refused) = tokio::sync::oneshot::channel();
    let task = {
        let (floor, key) = (Arc::clone(floor), key.clone());
        tokio::spawn(async move {
            let mut tried = Some(tried);
            let at = loop {
                if floor.raw_try_acquire(&mut sock, &key, "waiter", 1).await? {
                    break Instant::now();
                }
                if let Some(tried) = tried.take() {
                    let _ = tried.send(());
                }
                // The notice: ["message", channel, payload].
                match notices.read().await? {
                    RawReply::Array(notice) if matches!(notice.first(), Some(RawReply::Text(kind)) if kind == b"message") =>
                        {}
                    other => return Err(format!("limit hand-off: {other:?}").into()),
                }
            };
            floor.raw_release(&mut sock, &key, "waiter", None).await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((sock, notices, at))
        })
    };
    refused.await?;
    tokio::time::sleep(HANDOFF_SETTLE).await;
    let called = Instant::now();
    floor
        .raw_release(holder, &key, "holder", Some(LIMIT_CHANNEL))
        .await?;
    let returned = Instant::now();
    let (sock, notices, at) = task.await??;
    *waiter = Some((sock, notices));
    Ok((micros(called, at), micros(returned, at)))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let started = Instant::now();
    let server = RedisServer::start();
    let open = || {
        RedisBackend::open(&server.url(), RedisSettings::default()).map(RedisBackend::into_client)
    };
    let client = open()?;
    client.backend().warm_up().await?;
    let conn = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let mut sock = RawSocket::connect(server.addr()).await?;
    let floor = Arc::new(Floor {
        acquire: redis::Script::new(FLOOR_ACQUIRE),
        release: redis::Script::new(FLOOR_RELEASE),
        acquire_sha: sock.load(FLOOR_ACQUIRE).await?,
        release_sha: sock.load(FLOOR_RELEASE).await?,
    });
    let own_keys = client
        .backend()
        .keys()
        .semaphore(&Purpose::new("barebench")?, &ResourceDigest::of("one-task"));
    let bench = Arc::new(Bench {
        client: client.clone(),
        conn: conn.clone(),
        floor: Arc::clone(&floor),
        own_acquire: redis::Script::new(include_str!("../lua/semaphore_acquire.lua")),
        own_release: redis::Script::new(include_str!("../lua/semaphore_release.lua")),
        own_keys,
        serial: AtomicU64::new(0),
        server_pid: server.pid().to_string(),
    });
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "semaphores, one redis-server on loopback, 2 cores shared with the client; load \
         average before: {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );

    // Warm every path (scripts cached, connections made) before measuring.
    for who in ONE {
        for _ in 0..200 {
            bench.one_cycle(who, &mut sock).await?;
        }
    }

    // 1. One task.
    let one = one_task(&bench, &mut sock).await?;
    let p50: Vec<f64> = one
        .iter()
        .map(|m| m.latency.value_at_quantile(0.50) as f64)
        .collect();
    println!();
    println!(
        "1. one task, acquire + release, capacity {CAPACITY}: {} cycles each, in blocks of \
         {ONE_TASK_BLOCK} taking turns; latency in µs",
        ONE_TASK_BLOCKS * ONE_TASK_BLOCK
    );
    println!(
        "{:<28} {:>7} {:>7} {:>8} {:>8} {:>18}",
        "", "p50", "p99", "p50 /", "p50 /", "server µs / cycle"
    );
    println!(
        "{:<28} {:>7} {:>7} {:>8} {:>8} {:>18}",
        "", "", "", "floor", "limit", "in scripts"
    );
    for (i, who) in ONE.iter().enumerate() {
        println!(
            "{:<28} {:>7.0} {:>7} {:>7.2}x {:>7.2}x {:>18.1}",
            who.name(),
            p50[i],
            one[i].latency.value_at_quantile(0.99),
            p50[i] / p50[ONE_FLOOR],
            p50[i] / p50[ONE_LIMIT],
            one[i].script_us
        );
    }
    let ratio = p50[0] / p50[ONE_FLOOR];
    println!(
        "goal: leasehold p50 / floor p50 <= 1.05x: {:.2}x, {}",
        ratio,
        if ratio <= 1.05 { "met" } else { "missed" }
    );

    // 2. 64 tasks.
    for who in MANY {
        many_tasks(&bench, who, usize::MAX, Duration::from_millis(300)).await?;
    }
    let mut loads: Vec<Vec<Load>> = MANY.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        for k in 0..MANY.len() {
            let i = (k + round) % MANY.len();
            loads[i].push(many_tasks(&bench, MANY[i], round, WINDOW).await?);
        }
    }
    let rate: Vec<f64> = loads
        .iter()
        .map(|l| {
            median(
                l.iter()
                    .map(|l| l.cycles as f64 / WINDOW.as_secs_f64())
                    .collect(),
            )
        })
        .collect();
    println!();
    println!(
        "2. {TASKS} tasks, one semaphore of capacity {CAPACITY}, each acquire-with-wait -> \
         release in a loop, no work held: cycles completed in {} s windows, median of {ROUNDS} \
         rotated rounds. The floor has no queue and no notice: its tasks retry after a sleep \
         (1 ms, tokio's timer makes it 1-2 ms; 10 ms is npm redis-semaphore's default), all on \
         one multiplexed connection. The bound: the floor's scripts run by only {CAPACITY} \
         tasks, one per permit, on the same connection: nobody is ever refused, no try is \
         wasted",
        WINDOW.as_secs()
    );
    println!(
        "{:<28} {:>9} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>13}",
        "",
        "cycles/s",
        "/floor",
        "/bound",
        "scripts",
        "script",
        "PUBLISH",
        "server",
        "client",
        "per task"
    );
    println!(
        "{:<28} {:>9} {:>7} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>13}",
        "", "", "", "", "/ cycle", "µs/cyc", "/ cycle", "CPU µs", "CPU µs", "fewest-most"
    );
    for (i, who) in MANY.iter().enumerate() {
        let ls = &loads[i];
        let cycles: u64 = ls.iter().map(|l| l.cycles).sum::<u64>().max(1);
        let per = |x: f64| x / cycles as f64;
        let scripts: u64 = ls.iter().map(|l| l.scripts.calls).sum();
        let usec: u64 = ls.iter().map(|l| l.scripts.usec).sum();
        let publishes: u64 = ls.iter().map(|l| l.scripts.publishes).sum();
        let server: f64 = ls.iter().map(|l| l.server_cpu.as_secs_f64() * 1e6).sum();
        let client: f64 = ls.iter().map(|l| l.client_cpu.as_secs_f64() * 1e6).sum();
        // Each task's cycles over the rounds, per round: how evenly the permits went round.
        let per_task: Vec<u64> = (0..who.tasks())
            .map(|t| ls.iter().map(|l| l.per_task[t]).sum::<u64>() / ROUNDS as u64)
            .collect();
        println!(
            "{:<28} {:>9.0} {:>6.2}x {:>6.2}x {:>8.1} {:>8.1} {:>8.2} {:>8.1} {:>8.1} {:>13}",
            who.name(),
            rate[i],
            rate[i] / rate[MANY_FLOOR],
            rate[i] / rate[MANY_BOUND],
            per(scripts as f64),
            per(usec as f64),
            per(publishes as f64),
            per(server),
            per(client),
            format!(
                "{}-{}",
                per_task.iter().min().unwrap_or(&0),
                per_task.iter().max().unwrap_or(&0)
            ),
        );
    }
    let ratio = rate[0] / rate[MANY_FLOOR];
    println!(
        "goal: leasehold cycles/s / floor (1 ms poll) >= 1.0x: {:.2}x, {}",
        ratio,
        if ratio >= 1.0 { "met" } else { "missed" }
    );
    println!(
        "(per task: each task's cycles in one window, fewest and most of its tasks; CPU from \
         /proc in 10 ms ticks; client CPU is this whole process)"
    );

    // 3. Hand-off.
    let (holder, waiter) = (client.clone(), open()?);
    waiter.backend().warm_up().await?;
    let mut holder_conn = conn.clone();
    let waiter_conn = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;
    let mut limit_waiter = {
        let sock = RawSocket::connect(server.addr()).await?;
        let mut notices = RawSocket::connect(server.addr()).await?;
        notices
            .call(&[b"SUBSCRIBE", LIMIT_CHANNEL.as_bytes()])
            .await?;
        Some((sock, notices))
    };
    let names = [
        "leasehold (queued, notified)",
        "floor, polls every 1 ms",
        "floor, polls every 10 ms",
        "limit (PUBLISH, own sockets)",
    ];
    let mut from_call: Vec<Histogram<u64>> = Vec::new();
    let mut from_return: Vec<Histogram<u64>> = Vec::new();
    for _ in names {
        from_call.push(histogram()?);
        from_return.push(histogram()?);
    }
    for i in 0..HANDOFF_ROUNDS {
        let rounds = [
            leasehold_handoff(&holder, &waiter, &mut holder_conn, i).await?,
            floor_handoff(&floor, &mut holder_conn, &waiter_conn, POLL, i).await?,
            floor_handoff(&floor, &mut holder_conn, &waiter_conn, SLOW_POLL, i).await?,
            limit_handoff(&floor, &mut sock, &mut limit_waiter, i).await?,
        ];
        for (k, (call, ret)) in rounds.into_iter().enumerate() {
            from_call[k].record(call)?;
            from_return[k].record(ret)?;
        }
    }
    println!();
    println!(
        "3. hand-off, capacity 1: one holder releases while one waiter waits; {HANDOFF_ROUNDS} \
         rounds each, taking turns; µs from the release call (and from its return) to the \
         waiter's grant"
    );
    println!(
        "{:<30} {:>9} {:>9} {:>10} {:>12}",
        "waiter", "p50", "p99", "p50 / limit", "from return"
    );
    let limit_p50 = from_call[3].value_at_quantile(0.5).max(1) as f64;
    for (k, name) in names.iter().enumerate() {
        println!(
            "{:<30} {:>9} {:>9} {:>9.2}x {:>12}",
            name,
            from_call[k].value_at_quantile(0.5),
            from_call[k].value_at_quantile(0.99),
            from_call[k].value_at_quantile(0.5) as f64 / limit_p50,
            from_return[k].value_at_quantile(0.5),
        );
    }
    let ours = from_call[0].value_at_quantile(0.5).max(1) as f64;
    println!(
        "leasehold's p50 hand-off is {:.1}x faster than the floor polling every 1 ms, {:.1}x \
         than every 10 ms",
        from_call[1].value_at_quantile(0.5) as f64 / ours,
        from_call[2].value_at_quantile(0.5) as f64 / ours
    );
    println!("(whole bench: {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}
