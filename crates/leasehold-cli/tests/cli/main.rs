//! The `leasehold` binary, driven as a script would drive it, against a real redis-server per
//! test.
//!
//! Commands run under the lease are `sh -c '…'` scripts that write what they see to files in a
//! per-test directory; the tests wait for those files (or for process states) with deadlines,
//! never for a fixed time.
//!
//! This file is the harness (the `leasehold` command, finished and running processes, scratch
//! directories, a lease held by the test, paused writes); each subject has its own module.

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_redis::leasehold::{
    DriftBudget, LeaseHandle, OperationId, Purpose, ReleaseOutcome, ResourceDigest,
};
use leasehold_redis::{RedisBackend, RedisSettings};
use test_support::{FaultProxy, ProxyFault, RedisServer, Reply};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
const TIMEOUT: Duration = Duration::from_secs(30);
/// A shell loop that keeps a command busy, bounded so that nothing outlives a failed test.
const SPIN: &str = "i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done";

mod conventions;
mod demo;
mod failover_holders;
mod inspect;
mod logs;
mod messages;
mod min_hold;
mod operators;
mod privacy;
mod run_command;
mod run_faults;
mod run_loss_and_signals;
mod run_not_acquired;
mod semaphores;
mod topologies;
mod usage;

// ---------------------------------------------------------------------------------------------
// Harness

/// A `leasehold` command with a clean environment for its own variables.
fn leasehold(url: &str) -> Command {
    leasehold_under(&[], url)
}

/// [`leasehold`] run by another program: `wrapper` is that program and its arguments
/// (`valgrind --tool=none`), followed by the binary; none runs it directly.
fn leasehold_under(wrapper: &[&str], url: &str) -> Command {
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(BIN);
            command
        }
        None => Command::new(BIN),
    };
    // Every LEASEHOLD_* variable sets a flag: none of the test runner's may leak in.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("LEASEHOLD_") {
            command.env_remove(name);
        }
    }
    command
        .env_remove("RUST_LOG")
        .arg("--redis")
        .arg(url)
        .stdin(Stdio::null());
    command
}

/// What a finished `leasehold` left behind.
#[derive(Debug)]
struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    /// When the test saw it exit.
    at: Instant,
}

impl Finished {
    fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("leasehold was killed by a signal: {self:#?}"))
    }

    fn assert_code(&self, expected: i32) -> &Self {
        assert_eq!(self.code(), expected, "{self:#?}");
        self
    }
}

/// A running `leasehold` whose output is collected in the background.
struct Running {
    child: Child,
    finished: bool,
    stdout: Option<std::thread::JoinHandle<String>>,
    stderr_lines: std::sync::mpsc::Receiver<String>,
    stderr_seen: Vec<String>,
}

impl Running {
    fn start(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("leasehold starts");
        let mut out = child.stdout.take().expect("piped");
        let stdout = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = out.read_to_string(&mut text);
            text
        });
        let err = child.stderr.take().expect("piped");
        let (tx, stderr_lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            finished: false,
            stdout: Some(stdout),
            stderr_lines,
            stderr_seen: Vec::new(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until a line of stderr contains `needle`.
    fn wait_for_stderr(&mut self, needle: &str) {
        let deadline = Instant::now() + TIMEOUT;
        while !self.stderr_seen.iter().any(|l| l.contains(needle)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr_lines.recv_timeout(left) {
                Ok(line) => self.stderr_seen.push(line),
                Err(_) => panic!("no {needle:?} on stderr; saw {:#?}", self.stderr_seen),
            }
        }
    }

    fn finish(mut self) -> Finished {
        let deadline = Instant::now() + TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("leasehold did not exit within {TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let at = Instant::now();
        self.finished = true;
        let stdout = self
            .stdout
            .take()
            .map(|reader| reader.join().expect("stdout reader"))
            .unwrap_or_default();
        self.stderr_seen.extend(self.stderr_lines.iter());
        Finished {
            status,
            stdout,
            stderr: self.stderr_seen.join("\n"),
            at,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // A failed test must not leave leasehold running (its command's loops are bounded).
        if !self.finished {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn run_to_end(command: Command) -> Finished {
    Running::start(command).finish()
}

/// A port nothing listens on.
fn dead_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn dead_url() -> String {
    format!("redis://127.0.0.1:{}", dead_port())
}

/// Polls `check` until it returns `Some`, failing the test after `TIMEOUT`.
fn wait_until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn wait_for_file(path: &Path) -> String {
    wait_until(&format!("{}", path.display()), || {
        let text = read(path);
        text.ends_with('\n').then_some(text)
    })
}

/// A scratch directory and the shell snippets that use it.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("a temp dir"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn sh(&self, script: &str) -> [String; 3] {
        // Scripts refer to the directory as $D.
        let script = format!("D='{}'; {script}", self.dir.path().display());
        ["sh".into(), "-c".into(), script]
    }
}

/// Returns true if and only if `pid` is gone or a zombie.
fn is_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => matches!(
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next()),
            Some("Z" | "X" | "x")
        ),
    }
}

/// Returns true if and only if `pid` is stopped (by SIGSTOP).
fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            == Some("T")
    })
}

/// Counts the server's EVALSHA calls (every lease operation is one, NOSCRIPT refusals too), so
/// that a test can wait until leasehold has tried once.
struct EvalshaCounter<'s> {
    server: &'s RedisServer,
    before: u64,
}

fn evalsha_counter(server: &RedisServer) -> EvalshaCounter<'_> {
    let before = evalsha_calls(server);
    EvalshaCounter { server, before }
}

fn evalsha_calls(server: &RedisServer) -> u64 {
    server.commandstats().get("evalsha").copied().unwrap_or(0)
}

impl EvalshaCounter<'_> {
    /// Returns how many EVALSHA calls the server has seen since the counter was made.
    fn count(&self) -> u64 {
        evalsha_calls(self.server) - self.before
    }

    fn wait_for_more(&self) {
        wait_until("leasehold's first try", || {
            (evalsha_calls(self.server) > self.before).then_some(())
        });
    }
}

fn send(pid: u32, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    rustix::process::kill_process(pid, signal).expect("signal sent");
}

fn lease_key(name: &str) -> String {
    format!(
        "leasehold:lease:v1:cli:{{{}}}",
        ResourceDigest::of(name).as_str()
    )
}

/// Every key with its serialized value (`DUMP`), to show that a command changed nothing.
fn snapshot(server: &RedisServer) -> Vec<(String, Reply)> {
    let mut keys = server.keys();
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let value = server.cmd(&["DUMP", &key]);
            (key, value)
        })
        .collect()
}

/// The stored fence counter of the CLI's lease on `name`.
fn fence_counter(server: &RedisServer, name: &str) -> Option<String> {
    server
        .cmd(&["GET", &format!("{}:fence", lease_key(name))])
        .as_string()
}

/// The demo's two fences, A's and B's, as it printed them; B's must be the larger.
fn demo_fences(done: &Finished) -> (u64, u64) {
    let after = |prefix: &str| -> u64 {
        let at = done
            .stdout
            .find(prefix)
            .unwrap_or_else(|| panic!("{prefix}: {done:#?}"));
        done.stdout[at + prefix.len()..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|digits| digits.parse().ok())
            .unwrap_or_else(|| panic!("no fence after {prefix}: {done:#?}"))
    };
    let (a, b) = (after("A holds fence "), after("B acquires: fence "));
    assert!(a < b, "{done:#?}");
    (a, b)
}

/// A lease held by the test itself, through the library, as another process would hold it.
struct Held {
    runtime: tokio::runtime::Runtime,
    lease: Option<LeaseHandle<RedisBackend>>,
}

impl Held {
    fn new(server: &RedisServer, name: &str, ttl: Duration) -> Self {
        Self::for_purpose(server, name, ttl, "cli")
    }

    /// A lease on `name` taken for `purpose`, as a library user's program takes it.
    fn for_purpose(server: &RedisServer, name: &str, ttl: Duration, purpose: &str) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = RedisBackend::open(&server.url(), RedisSettings::default())
            .unwrap()
            .into_client();
        let attempt = client
            .new_attempt(OperationId::new("test-holder").unwrap())
            .unwrap();
        let request = client
            .request(
                Purpose::new(purpose).unwrap(),
                ResourceDigest::of(name),
                attempt,
                ttl,
            )
            .unwrap();
        let lease = runtime
            .block_on(client.try_acquire(&request))
            .into_handle()
            .expect("the test acquires");
        Self {
            runtime,
            lease: Some(lease),
        }
    }

    fn lease(&self) -> &LeaseHandle<RedisBackend> {
        self.lease.as_ref().expect("held")
    }

    fn release(&mut self) {
        let lease = self.lease.take().expect("held");
        assert_eq!(
            self.runtime.block_on(lease.release()),
            ReleaseOutcome::Released
        );
    }
}

fn inspect_json(server: &RedisServer, name: &str) -> serde_json::Value {
    let mut command = leasehold(&server.url());
    command.args(["inspect", name, "--json"]);
    let done = run_to_end(command);
    done.assert_code(0);
    let lines: Vec<&str> = done.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line of JSON: {done:#?}");
    serde_json::from_str(lines[0]).expect("valid JSON")
}

/// Holds back every write on the server (`CLIENT PAUSE … WRITE`) until resumed or dropped.
///
/// An acquire (a script that may write) reaches the server and waits there unanswered, so its
/// outcome is unknown to leasehold, while connecting and reads (`inspect`, this harness's own
/// queries) still work. When writes resume, the parked commands run in the order they came.
/// Unlike stopping the server, nothing depends on when leasehold connects or tries.
struct WritesPaused<'s> {
    server: &'s RedisServer,
    resumed: bool,
}

impl<'s> WritesPaused<'s> {
    fn start(server: &'s RedisServer) -> Self {
        // Scripts loaded before the pause, so that a parked try runs (and grants) when writes
        // resume instead of coming back NOSCRIPT.
        Held::new(server, "warm-up", Duration::from_secs(30)).release();
        assert_eq!(
            server.cmd(&["CLIENT", "PAUSE", "600000", "WRITE"]),
            Reply::Status("OK".into())
        );
        Self {
            server,
            resumed: false,
        }
    }

    /// Waits until a client's command is parked at the server.
    fn wait_for_a_parked_command(&self) {
        wait_until("a command parked by the pause", || {
            let info = self
                .server
                .cmd(&["INFO", "clients"])
                .as_string()
                .unwrap_or_default();
            info.lines()
                .find_map(|l| l.strip_prefix("blocked_clients:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .is_some_and(|n| n > 0)
                .then_some(())
        });
    }

    fn resume(mut self) {
        self.resume_once();
    }

    fn resume_once(&mut self) {
        if !self.resumed {
            self.resumed = true;
            self.server.cmd(&["CLIENT", "UNPAUSE"]);
        }
    }
}

impl Drop for WritesPaused<'_> {
    fn drop(&mut self) {
        self.resume_once();
    }
}
