//! `make bench-instructions`: what the scripts cost the server, counted in instructions.
//!
//! Wall-clock figures of a script (`INFO commandstats`, `hotpath_bench`) move by 10–30 %
//! between rounds on a small shared machine, more than a change to a script is worth.
//! Instructions do not: this runs `redis-server` under `valgrind --tool=callgrind`, and for
//! each lock below does a warm-up, zeroes the count, runs a fixed number of one-task
//! acquire+release cycles and dumps the count. Every instruction of the server is in it
//! (reading the command, the script, the reply), and the same build gives the same figure to
//! well under 1 % on every run.
//!
//! - **fenced floor**: the script pair `hotpath_bench` calls the floor;
//! - **its scripts**: leasehold's `acquire.lua` and `release.lua`, called directly;
//! - **leasehold**: `try_acquire` + `release` through the library, one task (so unbatched):
//!   what the server does for leasehold's own calls, which should be its scripts' figure.
//!
//! Needs `valgrind` (Debian's package of that name); says so and fails without it.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_redis::leasehold::{OperationId, Purpose, ReleaseOutcome, ResourceDigest};
use leasehold_redis::{KeyLayout, RedisBackend, RedisSettings};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Cycles counted per lock, after [`WARM_UP`] uncounted ones.
const CYCLES: u64 = 2_000;
const WARM_UP: u64 = 200;
const TTL_MS: u64 = 10_000;

/// The fenced floor's scripts (`benches/floor/`), shared by hotpath_bench and script_instructions.
const FLOOR_ACQUIRE: &str = include_str!("floor/acquire.lua");
const FLOOR_RELEASE: &str = include_str!("floor/release.lua");

/// `redis-server` under callgrind, killed when dropped.
struct Counted {
    child: Child,
    url: String,
    /// Where callgrind writes its dumps; removed when dropped.
    dir: std::path::PathBuf,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Counted {
    fn start() -> Res<Self> {
        let dir = std::env::temp_dir().join(format!("leasehold-callgrind-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let out = dir.join("callgrind.out");
        let child = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .args([
                "redis-server",
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("valgrind: {e} (apt-get install valgrind)"))?;
        let counted = Self {
            child,
            url: format!("redis://127.0.0.1:{port}"),
            dir,
        };
        let client = redis::Client::open(counted.url.as_str())?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while client.get_connection().is_err() {
            if Instant::now() > deadline {
                return Err("redis-server under valgrind did not answer within 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(counted)
    }

    fn control(&self, what: &str) -> Res<()> {
        let status = Command::new("callgrind_control")
            .arg(what)
            .arg(self.child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        if !status.success() {
            return Err(format!("callgrind_control {what} failed: {status}").into());
        }
        Ok(())
    }

    /// Instructions since the last zeroing, from the dump this writes.
    fn dump(&self) -> Res<u64> {
        let before = dumps(&self.dir)?;
        self.control("-d")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let now = dumps(&self.dir)?;
            if let Some(newest) = now.iter().find(|p| !before.contains(p)) {
                // callgrind_control returns once callgrind reports the dump done, so a file
                // that has appeared is whole; the loop only waits for it to appear.
                let text = std::fs::read_to_string(newest)?;
                let total = text
                    .lines()
                    .find_map(|l| l.strip_prefix("summary: ").or(l.strip_prefix("totals: ")))
                    .and_then(|n| n.trim().parse().ok())
                    .ok_or("a callgrind dump without a summary")?;
                return Ok(total);
            }
            if Instant::now() > deadline {
                return Err("callgrind wrote no dump within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn dumps(dir: &Path) -> Res<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("callgrind.out."))
        {
            found.push(path);
        }
    }
    Ok(found)
}

/// One lock's cycle, `n` numbering it.
enum Lock {
    Scripts {
        acquire: redis::Script,
        release: redis::Script,
        lease_key: String,
        fence_key: String,
        /// The floor stores `<attempt>:<fence>`, leasehold `<fence>:<attempt>`.
        fence_first: bool,
        /// Leasehold's acquire takes the counter idle expiry (milliseconds) first; the
        /// floor's takes none.
        counter_idle_ms: Option<u64>,
    },
    Leasehold(Box<leasehold_redis::RedisLeases>),
}

impl Lock {
    async fn cycle(&self, raw: &mut redis::aio::MultiplexedConnection, n: u64) -> Res<()> {
        match self {
            Lock::Scripts {
                acquire,
                release,
                lease_key,
                fence_key,
                fence_first,
                counter_idle_ms,
            } => {
                let attempt = format!("{n:032}:bench");
                let mut invocation = acquire.key(lease_key);
                invocation.key(fence_key);
                if let Some(idle) = *counter_idle_ms {
                    invocation.arg(idle);
                }
                let fence: redis::Value = invocation
                    .arg(&attempt)
                    .arg(TTL_MS)
                    .invoke_async(raw)
                    .await?;
                let fence = match fence {
                    redis::Value::BulkString(b) => String::from_utf8(b)?,
                    redis::Value::Int(i) if i > 0 => i.to_string(),
                    other => return Err(format!("not granted: {other:?}").into()),
                };
                let grant = if *fence_first {
                    format!("{fence}:{attempt}")
                } else {
                    format!("{attempt}:{fence}")
                };
                let released: i64 = release.key(lease_key).arg(grant).invoke_async(raw).await?;
                if released != 1 {
                    return Err("not released".into());
                }
            }
            Lock::Leasehold(client) => {
                let request = client.request(
                    Purpose::new("bench")?,
                    ResourceDigest::of("r0"),
                    client.new_attempt(OperationId::new("bench")?)?,
                    Duration::from_millis(TTL_MS),
                )?;
                let lease = client
                    .try_acquire(&request)
                    .await
                    .into_handle()
                    .ok_or("leasehold: not granted")?;
                if lease.release().await != ReleaseOutcome::Released {
                    return Err("leasehold: not released".into());
                }
            }
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Res<()> {
    let server = Counted::start()?;
    let mut raw = redis::Client::open(server.url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let layout = KeyLayout::new(&RedisSettings::default());
    let (purpose, digest) = (Purpose::new("barebench")?, ResourceDigest::of("r0"));
    let locks = [
        (
            "fenced floor",
            Lock::Scripts {
                acquire: redis::Script::new(FLOOR_ACQUIRE),
                release: redis::Script::new(FLOOR_RELEASE),
                lease_key: "floor:{r0}".to_owned(),
                fence_key: "floor:{r0}:fence".to_owned(),
                fence_first: false,
                counter_idle_ms: None,
            },
        ),
        (
            "its scripts",
            Lock::Scripts {
                acquire: redis::Script::new(include_str!("../lua/acquire.lua")),
                release: redis::Script::new(include_str!("../lua/release.lua")),
                lease_key: layout.lease_key(&purpose, &digest),
                fence_key: layout.fence_key(&purpose, &digest),
                fence_first: true,
                counter_idle_ms: Some(u64::try_from(
                    RedisSettings::default().counter_idle_expiry().as_millis(),
                )?),
            },
        ),
        (
            "leasehold",
            Lock::Leasehold(Box::new(
                RedisBackend::open(&server.url, RedisSettings::default())?.into_client(),
            )),
        ),
    ];
    println!(
        "redis-server's instructions per acquire+release cycle (callgrind, one task, {CYCLES} \
         cycles after {WARM_UP})"
    );
    let mut floor = None;
    for (name, lock) in &locks {
        for n in 0..WARM_UP {
            lock.cycle(&mut raw, n).await?;
        }
        server.control("-z")?;
        for n in 0..CYCLES {
            lock.cycle(&mut raw, WARM_UP + n).await?;
        }
        let per_cycle = server.dump()? / CYCLES;
        let floor = *floor.get_or_insert(per_cycle);
        println!(
            "{name:<14} {per_cycle:>9}   {:.2}x the floor",
            per_cycle as f64 / floor as f64
        );
    }
    Ok(())
}
