//! The `leasehold` binary, driven as a script would drive it, against a real redis-server per
//! test.
//!
//! Commands run under the lease are `sh -c '…'` scripts that write what they see to files in a
//! per-test directory; the tests wait for those files (or for process states) with deadlines,
//! never for a fixed time.

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
use test_support::{Fault, FaultProxy, RedisServer, Reply};

const BIN: &str = env!("CARGO_BIN_EXE_leasehold");
const TIMEOUT: Duration = Duration::from_secs(30);
/// A shell loop that keeps a command busy, bounded so that nothing outlives a failed test.
const SPIN: &str = "i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done";

// ---------------------------------------------------------------------------------------------
// Harness

/// A `leasehold` command with a clean environment for its own variables.
fn leasehold(url: &str) -> Command {
    let mut command = Command::new(BIN);
    command
        .env_remove("LEASEHOLD_REDIS_URL")
        .env_remove("LEASEHOLD_NAMESPACE")
        .env_remove("LEASEHOLD_REDIS_SERVER")
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
                Purpose::new("cli").unwrap(),
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

// ---------------------------------------------------------------------------------------------
// run: the command, its environment and its exit code

#[test]
fn the_command_sees_the_lease_and_its_exit_code_is_passed_on() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command
        .args(["run", "orders/42", "--ttl", "1500ms", "--"])
        .args(scratch.sh(
            r#"printf '%s\n%s\n%s\n' "$LEASEHOLD_FENCE" "$LEASEHOLD_RESOURCE_DIGEST" \
               "$LEASEHOLD_TTL_MS" > "$D/env"; exit 7"#,
        ));
    run_to_end(command).assert_code(7);
    let env = read(&scratch.path("env"));
    let lines: Vec<&str> = env.lines().collect();
    let fence = fence_counter(&server, "orders/42").expect("a grant moved the counter");
    assert_eq!(
        lines,
        [
            fence.as_str(),
            ResourceDigest::of("orders/42").as_str(),
            "1500"
        ],
        "{env:?}"
    );
}

#[test]
fn the_fence_grows_across_runs() {
    let server = RedisServer::start();
    let fences: Vec<String> = (0..3)
        .map(|_| {
            let mut command = leasehold(&server.url());
            command.args([
                "run",
                "jobs/nightly",
                "--",
                "sh",
                "-c",
                "echo $LEASEHOLD_FENCE",
            ]);
            let done = run_to_end(command);
            done.assert_code(0);
            done.stdout.trim().to_owned()
        })
        .collect();
    let fences: Vec<u64> = fences
        .iter()
        .map(|f| f.parse().expect("a decimal"))
        .collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    // No longer a small counter: the server's clock in microseconds, beyond 32 bits.
    assert!(fences[0] > u64::from(u32::MAX), "{fences:?}");
    assert_eq!(
        fence_counter(&server, "jobs/nightly"),
        Some(fences[2].to_string())
    );
}

#[test]
fn a_command_ended_by_signal_n_gives_128_plus_n() {
    let server = RedisServer::start();
    for (signal, code) in [("TERM", 143), ("KILL", 137), ("INT", 130)] {
        let mut command = leasehold(&server.url());
        command.args(["run", "r", "--", "sh", "-c", &format!("kill -{signal} $$")]);
        run_to_end(command).assert_code(code);
    }
}

#[test]
fn a_command_that_cannot_be_found_is_127_and_the_lease_is_released() {
    let server = RedisServer::start();
    let mut command = leasehold(&server.url());
    command.args(["run", "r", "--", "/nonexistent/command"]);
    let done = run_to_end(command);
    done.assert_code(127);
    assert!(done.stderr.contains("/nonexistent/command"), "{done:#?}");
    assert_eq!(inspect_json(&server, "r")["state"], "free");
}

#[test]
fn the_lease_is_renewed_while_the_command_runs() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    // Four TTLs long: the command completes only if the lease is kept alive throughout.
    command.args(["run", "r", "--ttl", "300ms", "--"]).args(
        scratch.sh(r#"echo $LEASEHOLD_FENCE > "$D/fence"; sleep 1.2; touch "$D/done"; exit 5"#),
    );
    let running = Running::start(command);
    let fence = wait_for_file(&scratch.path("fence")).trim().to_owned();
    // Until the command is done, the key is there, held by the one grant (the stored value
    // is `fence:token:operation`).
    let mut samples = 0;
    loop {
        let done_before = scratch.path("done").exists();
        let stored = server.cmd(&["GET", &lease_key("r")]).as_string();
        if done_before {
            break;
        }
        match stored {
            Some(value) => {
                assert_eq!(value.split(':').next(), Some(fence.as_str()), "{value}");
                samples += 1;
            }
            // Released, which happens only once the command is done.
            None => assert!(scratch.path("done").exists(), "the lease lapsed"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let done = running.finish();
    done.assert_code(5);
    assert!(samples >= 10, "{samples} samples: {done:#?}");
    // Renewed, not re-acquired: the fence counter saw one grant.
    assert_eq!(fence_counter(&server, "r"), Some(fence));
}

#[test]
fn a_command_that_cannot_be_executed_is_126_and_the_lease_is_released() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let script = scratch.path("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let mut command = leasehold(&server.url());
    command.args(["run", "r", "--"]).arg(&script);
    let done = run_to_end(command);
    done.assert_code(126);
    assert!(done.stderr.contains("not-executable.sh"), "{done:#?}");
    assert_eq!(inspect_json(&server, "r")["state"], "free");
}

#[test]
fn after_the_command_exits_the_lease_is_free() {
    let server = RedisServer::start();
    let mut command = leasehold(&server.url());
    command.args(["run", "r", "--", "sh", "-c", "exit 0"]);
    run_to_end(command).assert_code(0);
    assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(0));
    let json = inspect_json(&server, "r");
    assert_eq!(json["state"], "free", "{json}");
}

#[test]
fn nothing_the_command_leaves_behind_outlives_the_lease() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    // A worker that ignores SIGTERM and writes with the fence until it is killed, started in
    // the background by a command that exits at once.
    std::fs::write(
        scratch.path("worker.sh"),
        r#"trap 'echo TERM >> "$D/signals"' TERM
           echo $$ > "$D/worker"
           i=0; while [ $i -lt 600 ]; do echo "$LEASEHOLD_FENCE" >> "$D/writes"; sleep 0.05; i=$((i+1)); done"#,
    )
    .unwrap();
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--grace", "300ms", "--"])
        .args(scratch.sh(r#"D="$D" sh "$D/worker.sh" &
               while [ ! -s "$D/writes" ]; do sleep 0.01; done
               exit 0"#));
    let done = run_to_end(command);
    // The command's own code: it ran to completion, and the lease was kept meanwhile.
    done.assert_code(0);
    let worker: u32 = read(&scratch.path("worker")).trim().parse().unwrap();
    // Gone before leasehold released the lease and exited: asked first, then killed.
    assert!(is_dead(worker), "the worker outlived leasehold: {done:#?}");
    assert_eq!(read(&scratch.path("signals")), "TERM\n", "{done:#?}");
    assert!(done.stderr.contains("left processes"), "{done:#?}");
    assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(0));
}

// ---------------------------------------------------------------------------------------------
// run: not acquired, unavailable, unknown

#[test]
fn a_held_lease_is_not_acquired_within_the_wait_75() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let _held = Held::new(&server, "r", Duration::from_secs(30));
    for wait in ["0s", "300ms"] {
        let mut command = leasehold(&server.url());
        command
            .args(["run", "r", "--wait", wait, "--"])
            .args(scratch.sh("touch \"$D/ran\""));
        let started = Instant::now();
        let done = run_to_end(command);
        done.assert_code(75);
        assert!(done.stderr.contains("not acquired"), "{done:#?}");
        if wait == "300ms" {
            assert!(done.at - started >= Duration::from_millis(300), "{done:#?}");
            assert!(done.stderr.contains("within 300ms"), "{done:#?}");
        }
        assert!(!scratch.path("ran").exists(), "the command ran");
    }
}

#[test]
fn a_waiting_run_starts_when_the_holder_releases() {
    let server = RedisServer::start();
    let mut held = Held::new(&server, "r", Duration::from_secs(30));
    let holder_fence = fence_counter(&server, "r").expect("held");
    let first_try = evalsha_counter(&server);
    let mut command = leasehold(&server.url());
    command.args([
        "run",
        "r",
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    let running = Running::start(command);
    first_try.wait_for_more();
    let released_at = Instant::now();
    held.release();
    let done = running.finish();
    done.assert_code(0);
    assert!(
        done.stdout.trim().parse::<u64>().expect("a fence") > holder_fence.parse().unwrap(),
        "{done:#?}"
    );
    // Woken by the release notice: the holder's TTL (its retry-after) and the deadline are
    // 20 s and more away.
    assert!(done.at - released_at < Duration::from_secs(10), "{done:#?}");
}

#[test]
fn nothing_listening_is_69_and_the_command_never_starts() {
    let scratch = Scratch::new();
    let url = format!("redis://:hunter2@127.0.0.1:{}", dead_port());
    let mut command = leasehold(&url);
    command
        .args(["run", "r", "--"])
        .args(scratch.sh("touch \"$D/ran\""));
    let done = run_to_end(command);
    done.assert_code(69);
    assert!(!scratch.path("ran").exists(), "the command ran");
    assert!(done.stderr.contains("unavailable"), "{done:#?}");
    // The URL is named, its password masked.
    assert!(done.stderr.contains("redis://:***@127.0.0.1:"), "{done:#?}");
    assert!(!done.stderr.contains("hunter2"), "{done:#?}");

    let mut command = leasehold(&url);
    command.args(["inspect", "r", "--json"]);
    let done = run_to_end(command);
    done.assert_code(69);
    assert!(done.stdout.is_empty(), "{done:#?}");
    assert!(!done.stderr.contains("hunter2"), "{done:#?}");
}

#[test]
fn rediss_urls_are_understood() {
    // TLS is compiled in: the URL is accepted (not a usage error) and the dead port is 69.
    let mut command = leasehold(&format!("rediss://127.0.0.1:{}", dead_port()));
    command.args(["inspect", "r"]);
    run_to_end(command).assert_code(69);
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

#[test]
fn an_outcome_that_stays_unknown_is_69_and_the_command_never_starts() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let paused = WritesPaused::start(&server);
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--ttl", "1s", "--"])
        .args(scratch.sh(r#"echo $LEASEHOLD_FENCE > "$D/ran""#));
    let running = Running::start(command);
    paused.wait_for_a_parked_command();
    let done = running.finish();
    done.assert_code(69);
    assert!(
        done.stderr.contains("replaying the same attempt"),
        "{done:#?}"
    );
    assert!(done.stderr.contains("still unknown"), "{done:#?}");
    assert!(!scratch.path("ran").exists(), "the command ran");
}

#[test]
fn an_unknown_outcome_resolved_by_replay_starts_the_command_with_the_one_grant() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let paused = WritesPaused::start(&server);
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--ttl", "2s", "--"])
        .args(scratch.sh(r#"echo $LEASEHOLD_FENCE > "$D/ran""#));
    let mut running = Running::start(command);
    running.wait_for_stderr("replaying the same attempt");
    // The parked first try now runs and grants; the replays behind it find that grant.
    paused.resume();
    let done = running.finish();
    done.assert_code(0);
    // Had leasehold made a new attempt instead of replaying, the first try's grant would have
    // made it contended; the fence counter says the command ran under the one grant.
    let ran = read(&scratch.path("ran"));
    assert_eq!(
        fence_counter(&server, "r"),
        Some(ran.trim().to_owned()),
        "{done:#?}"
    );
}

#[test]
fn unknown_outcomes_are_replayed_at_a_pace() {
    // A server whose TIME command is renamed away makes the acquire script fail at the
    // server: an error after the script started is `Indeterminate` (it may have written), and
    // it comes back at once, every time.
    let server = RedisServer::start_with_args(&["--rename-command", "TIME", "TIME-RENAMED"]);
    let scratch = Scratch::new();
    let tries = evalsha_counter(&server);
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--ttl", "1s", "--"])
        .args(scratch.sh("touch \"$D/ran\""));
    let done = run_to_end(command);
    done.assert_code(69);
    assert!(done.stderr.contains("still unknown"), "{done:#?}");
    assert!(!scratch.path("ran").exists(), "the command ran");
    // One try, then replays for at most 1 s with a 50 ms pause after each: about 21. Without
    // the pause there are thousands.
    let made = tries.count();
    assert!((2..=30).contains(&made), "{made} tries: {done:#?}");
}

// ---------------------------------------------------------------------------------------------
// run: what the tool says is what happened (faults from outside)

/// Starts `run r` with a long TTL and a command that waits for `$D/go`, and waits until its
/// grant is on the server.
fn run_until_go(server: &RedisServer, scratch: &Scratch) -> Running {
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--ttl", "30s", "--"])
        .args(scratch.sh(r#"while [ ! -e "$D/go" ]; do sleep 0.01; done; exit 3"#));
    let running = Running::start(command);
    wait_until("the grant", || {
        (server.cmd(&["EXISTS", &lease_key("r")]) == Reply::Int(1)).then_some(())
    });
    running
}

#[test]
fn a_lease_deleted_before_the_command_exits_is_70_not_its_code() {
    for wipe in [&["DEL", "<key>"][..], &["FLUSHALL"][..]] {
        let server = RedisServer::start();
        let scratch = Scratch::new();
        let running = run_until_go(&server, &scratch);
        // Gone behind the holder's back, and the command exits before the next renewal (a
        // third of 30 s away): only the release can tell.
        let key = lease_key("r");
        let args: Vec<&str> = wipe
            .iter()
            .map(|a| if *a == "<key>" { key.as_str() } else { a })
            .collect();
        server.cmd(&args);
        std::fs::write(scratch.path("go"), "").unwrap();
        let done = running.finish();
        done.assert_code(70);
        assert!(
            done.stderr
                .contains("the lease ended before the command did"),
            "{wipe:?}: {done:#?}"
        );
        assert!(done.stderr.contains("no grant"), "{wipe:?}: {done:#?}");
        assert!(done.stderr.contains("status 3"), "{wipe:?}: {done:#?}");
    }
}

#[test]
fn a_lease_granted_to_another_before_the_command_exits_is_70() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let running = run_until_go(&server, &scratch);
    assert_eq!(server.cmd(&["DEL", &lease_key("r")]), Reply::Int(1));
    // Someone else is granted the lease and works while our command still runs.
    let mut other = Held::new(&server, "r", Duration::from_secs(30));
    std::fs::write(scratch.path("go"), "").unwrap();
    let done = running.finish();
    done.assert_code(70);
    assert!(done.stderr.contains("another grant"), "{done:#?}");
    // The other grant was left alone.
    assert_eq!(inspect_json(&server, "r")["state"], "held");
    other.release();
}

#[test]
fn keys_of_another_type_are_named_and_nothing_is_written() {
    let fence_key = format!("{}:fence", lease_key("r"));
    let cases: [(&[&str], &str); 5] = [
        (
            &["HSET", &lease_key("r"), "f", "v"],
            "the lease key holds a value of another type",
        ),
        (
            &["RPUSH", &fence_key, "x"],
            "the fence counter holds a value of another type",
        ),
        (
            &["SET", &fence_key, "-5"],
            "the fence counter holds something that is not a fence",
        ),
        (
            &["SET", &fence_key, "garbage"],
            "the fence counter holds something that is not a fence",
        ),
        (
            &["SET", &fence_key, "9223372036854775807"],
            "the fence counter is at the top of the fence range",
        ),
    ];
    for (setup, said) in cases {
        let server = RedisServer::start();
        let scratch = Scratch::new();
        server.cmd(setup);
        let before = snapshot(&server);
        assert!(!before.is_empty());
        let mut command = leasehold(&server.url());
        command
            .args(["run", "r", "--"])
            .args(scratch.sh(r#"touch "$D/ran""#));
        let done = run_to_end(command);
        done.assert_code(65);
        assert!(done.stderr.contains(said), "{setup:?}: {done:#?}");
        assert!(
            done.stderr.contains("nothing was written"),
            "{setup:?}: {done:#?}"
        );
        // Not another owner, not an unknown outcome.
        for wrong in ["held by", "may exist", "unknown", "no answer"] {
            assert!(!done.stderr.contains(wrong), "{setup:?}: {done:#?}");
        }
        assert!(!scratch.path("ran").exists(), "{setup:?}: the command ran");
        assert_eq!(snapshot(&server), before, "{setup:?}: a key changed");
        let mut command = leasehold(&server.url());
        command.args(["inspect", "r"]);
        let done = run_to_end(command);
        done.assert_code(65);
        assert!(done.stderr.contains(said), "{setup:?}: {done:#?}");
    }
}

#[test]
fn fences_are_exact_to_the_top_of_the_range() {
    let server = RedisServer::start();
    let fence_key = format!("{}:fence", lease_key("r"));
    let clock = {
        let Reply::Array(Some(time)) = server.cmd(&["TIME"]) else {
            panic!("TIME");
        };
        time[0].as_string().unwrap().parse::<u64>().unwrap() * 1_000_000
    };
    let top = i64::MAX.unsigned_abs();
    for counter in [
        99_999_999_999_999,
        100_000_000_000_000,
        (1 << 53) - 1,
        1 << 53,
        top - 1,
    ] {
        server.cmd(&["SET", &fence_key, &counter.to_string()]);
        let mut command = leasehold(&server.url());
        // Longer than the TTL: renewed at this fence before it ends.
        command.args([
            "run",
            "r",
            "--ttl",
            "300ms",
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_FENCE; sleep 0.5",
        ]);
        let done = run_to_end(command);
        done.assert_code(0);
        let fence: u64 = done.stdout.trim().parse().expect("a decimal fence");
        if counter + 1 > clock {
            assert_eq!(fence, counter + 1, "{done:#?}");
        } else {
            // Below the server's clock: the clock in microseconds wins.
            assert!(fence > clock && fence > counter, "{counter}: {done:#?}");
        }
        assert_eq!(fence_counter(&server, "r"), Some(fence.to_string()));
    }
    // At the top: refused, nothing written, no fence reused.
    let mut command = leasehold(&server.url());
    command.args(["run", "r", "--", "true"]);
    run_to_end(command).assert_code(65);
    assert_eq!(fence_counter(&server, "r"), Some(top.to_string()));
    assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(0));
}

#[test]
fn an_acquire_applied_after_run_gave_up_leaves_no_grant() {
    let server = RedisServer::start();
    // Held for a second by someone else: leasehold connects, tries, and waits to try again.
    let _holder = Held::new(&server, "r", Duration::from_secs(1));
    let counter = fence_counter(&server, "r");
    let clients = || {
        server
            .cmd(&["CLIENT", "LIST"])
            .as_string()
            .map(|c| c.lines().count())
    };
    let before = clients();
    let first_try = evalsha_counter(&server);
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--wait", "2s", "--ttl", "5s", "--"])
        .args(scratch.sh(r#"touch "$D/ran""#));
    let running = Running::start(command);
    first_try.wait_for_more();
    // Frozen with leasehold's connection open: its next try, its replays and whatever follows
    // wait on the server's socket, unanswered.
    let paused = server.pause();
    let done = running.finish();
    done.assert_code(69);
    assert!(done.stderr.contains("still unknown"), "{done:#?}");
    assert!(
        done.stderr
            .contains("sent behind the acquire on the same connection"),
        "{done:#?}"
    );
    // leasehold has exited. The server resumes, runs what the closed connection left in
    // order (the holder's key has expired by now, so the acquire grants), then frees it.
    paused.resume();
    wait_until("leasehold's connections to be served and closed", || {
        (clients() == before).then_some(())
    });
    assert_ne!(
        fence_counter(&server, "r"),
        counter,
        "the stalled acquire never granted"
    );
    assert_eq!(
        server.cmd(&["EXISTS", &lease_key("r")]),
        Reply::Int(0),
        "the late grant outlived the run that gave up on it: {done:#?}"
    );
    assert!(!scratch.path("ran").exists(), "the command ran");
}

// ---------------------------------------------------------------------------------------------
// run: losing the lease, signals

#[test]
fn a_lease_lost_to_another_stops_the_command_70() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    // A command that outlives SIGTERM, and a grace of a minute: a lease found lost outright has
    // no validity left, so SIGKILL must follow SIGTERM at once (D17), not after the grace.
    command
        .args(["run", "r", "--ttl", "1s", "--grace", "1m", "--"])
        .args(scratch.sh(&format!(
            r#"trap 'echo TERM >> "$D/signals"' TERM
               echo $$ > "$D/pid"
               {SPIN}"#
        )));
    let running = Running::start(command);
    let pid: u32 = wait_for_file(&scratch.path("pid")).trim().parse().unwrap();
    // Someone deletes the key: the next renewal (a third of the TTL away) finds it gone.
    let deleted_at = Instant::now();
    assert_eq!(server.cmd(&["DEL", &lease_key("r")]), Reply::Int(1));
    let died_at = wait_until("the command to die", || is_dead(pid).then(Instant::now));
    let done = running.finish();
    done.assert_code(70);
    assert!(done.stderr.contains("LostToAnother"), "{done:#?}");
    assert!(
        died_at - deleted_at < Duration::from_secs(5),
        "the command lived {:?} after the loss",
        died_at - deleted_at
    );
}

#[test]
fn a_stopped_server_stops_the_command_before_validity_ends_70() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let ttl = Duration::from_secs(4);
    let mut command = leasehold(&server.url());
    // A long grace and a command that ignores SIGTERM: only the cap can stop it in time.
    command
        .args(["run", "r", "--ttl", "4s", "--grace", "1m", "--"])
        .args(scratch.sh(&format!(
            r#"trap 'echo TERM >> "$D/signals"' TERM
               echo $$ > "$D/pid"
               {SPIN}"#
        )));
    let running = Running::start(command);
    let pid: u32 = wait_for_file(&scratch.path("pid")).trim().parse().unwrap();
    // The server's own deadline, read just before it stops: the key expires `pttl` after the
    // read, which is after `before_pttl`, so the bound below is stricter than the truth. (A
    // renewal that lands in between only moves the real expiry later.)
    let before_pttl = Instant::now();
    let pttl = server
        .cmd(&["PTTL", &lease_key("r")])
        .as_int()
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis)
        .expect("the lease is held");
    let paused = server.pause();
    let paused_at = Instant::now();
    let died_at = wait_until("the command to die", || is_dead(pid).then(Instant::now));
    let done = running.finish();
    drop(paused);

    done.assert_code(70);
    assert!(
        read(&scratch.path("signals")).contains("TERM"),
        "SIGTERM came first: {done:#?}"
    );
    // Dead before anyone else could be granted the lease, with the drift budget to spare.
    let expiry = before_pttl + pttl - DriftBudget::default().for_ttl(ttl);
    assert!(died_at > paused_at);
    assert!(
        died_at < expiry,
        "the command died {:?} after the lease could have been granted again",
        died_at - expiry
    );
    assert!(done.stderr.contains("Unreachable"), "{done:#?}");
}

#[test]
fn a_command_that_exits_while_leasehold_stalls_past_the_lease_is_70() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--ttl", "300ms", "--"])
        .args(scratch.sh(r#"echo $$ > "$D/pid"
               i=0; while [ ! -e "$D/go" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done
               exit 0"#));
    let running = Running::start(command);
    let pid: u32 = wait_for_file(&scratch.path("pid")).trim().parse().unwrap();
    // leasehold stalls (a long GC pause, a starved VM); meanwhile the command finishes and the
    // lease runs out at the server.
    send(running.pid(), rustix::process::Signal::STOP);
    wait_until("leasehold to stop", || {
        is_stopped(running.pid()).then_some(())
    });
    std::fs::write(scratch.path("go"), "").unwrap();
    wait_until("the command to exit", || is_dead(pid).then_some(()));
    wait_until("the lease to expire at the server", || {
        (server.cmd(&["EXISTS", &lease_key("r")]) == Reply::Int(0)).then_some(())
    });
    send(running.pid(), rustix::process::Signal::CONT);
    // When leasehold looks again, the exit and the end of the lease are both there: the work
    // may have outlived the lease.
    running.finish().assert_code(70);
}

#[test]
fn sigint_and_sigterm_are_passed_on_to_the_command() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command.args(["run", "r", "--"]).args(scratch.sh(&format!(
        r#"trap 'echo INT >> "$D/signals"' INT
           trap 'echo TERM >> "$D/signals"; exit 9' TERM
           echo started > "$D/started"
           {SPIN}"#
    )));
    let running = Running::start(command);
    wait_for_file(&scratch.path("started"));
    send(running.pid(), rustix::process::Signal::INT);
    wait_until("the command to report SIGINT", || {
        read(&scratch.path("signals")).contains("INT").then_some(())
    });
    send(running.pid(), rustix::process::Signal::TERM);
    let done = running.finish();
    done.assert_code(9);
    assert_eq!(read(&scratch.path("signals")), "INT\nTERM\n");
    assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(0));
}

#[test]
fn sighup_and_sigquit_are_passed_on_to_the_command() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command.args(["run", "r", "--"]).args(scratch.sh(&format!(
        r#"trap 'echo HUP >> "$D/signals"' HUP
           trap 'echo QUIT >> "$D/signals"; exit 9' QUIT
           echo started > "$D/started"
           {SPIN}"#
    )));
    let running = Running::start(command);
    wait_for_file(&scratch.path("started"));
    // A closed terminal: leasehold must neither die of it nor leave the command running
    // without a lease.
    send(running.pid(), rustix::process::Signal::HUP);
    wait_until("the command to report SIGHUP", || {
        read(&scratch.path("signals")).contains("HUP").then_some(())
    });
    send(running.pid(), rustix::process::Signal::QUIT);
    let done = running.finish();
    done.assert_code(9);
    assert_eq!(read(&scratch.path("signals")), "HUP\nQUIT\n");
    assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(0));
}

#[test]
fn a_signal_while_waiting_gives_128_plus_n_and_leaves_no_grant() {
    use rustix::process::Signal;
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let held = Held::new(&server, "r", Duration::from_secs(30));
    for (signal, code, name) in [
        (Signal::INT, 130, "SIGINT"),
        (Signal::TERM, 143, "SIGTERM"),
        (Signal::HUP, 129, "SIGHUP"),
        (Signal::QUIT, 131, "SIGQUIT"),
    ] {
        let first_try = evalsha_counter(&server);
        let mut command = leasehold(&server.url());
        command
            .args(["run", "r", "--wait", "20s", "--"])
            .args(scratch.sh("touch \"$D/ran\""));
        let running = Running::start(command);
        // Waiting: tried once, contended, and asleep until the holder's TTL or a release notice.
        first_try.wait_for_more();
        send(running.pid(), signal);
        let done = running.finish();
        done.assert_code(code);
        assert!(
            done.stderr
                .contains(&format!("{name} before the command started")),
            "{done:#?}"
        );
        assert!(!scratch.path("ran").exists(), "the command ran");
        // The test's lease is untouched.
        let json = inspect_json(&server, "r");
        assert_eq!(json["fence"], held.lease().fence().get(), "{json}");
    }
}

/// Starts `run --wait` through a proxy and interrupts it while its acquire's outcome is unknown
/// to it but a grant exists: the try reaches the server, which grants it, and the reply is held
/// back. Returns the running leasehold once it has said it is giving up.
fn interrupt_while_a_grant_is_unknown(
    server: &RedisServer,
    proxy: &FaultProxy,
    scratch: &Scratch,
) -> Running {
    let paused = WritesPaused::start(server);
    let mut command = leasehold(&proxy.url());
    command
        .args(["run", "r", "--wait", "20s", "--ttl", "5s", "--"])
        .args(scratch.sh("touch \"$D/ran\""));
    let mut running = Running::start(command);
    // Connected, and its try waits at the server; from now on no reply gets through.
    paused.wait_for_a_parked_command();
    proxy.to_client(Fault::Hold);
    paused.resume();
    wait_until("the grant leasehold does not know of", || {
        (server.cmd(&["EXISTS", &lease_key("r")]) == Reply::Int(1)).then_some(())
    });
    send(running.pid(), rustix::process::Signal::INT);
    running.wait_for_stderr("SIGINT before the command started");
    running
}

#[test]
fn interrupted_while_the_outcome_is_unknown_releases_the_grant() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let scratch = Scratch::new();
    let running = interrupt_while_a_grant_is_unknown(&server, &proxy, &scratch);
    // Replies come back after longer than two command timeouts (200 ms each at this TTL),
    // well inside the cleanup budget.
    std::thread::sleep(Duration::from_millis(600));
    proxy.to_client(Fault::Pass);
    let done = running.finish();
    done.assert_code(130);
    assert!(!scratch.path("ran").exists(), "the command ran");
    assert_eq!(
        server.cmd(&["EXISTS", &lease_key("r")]),
        Reply::Int(0),
        "the grant was left behind: {done:#?}"
    );
    assert!(!done.stderr.contains("may live"), "{done:#?}");
}

#[test]
fn interrupted_while_the_outcome_stays_unknown_says_what_may_be_left() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let scratch = Scratch::new();
    let running = interrupt_while_a_grant_is_unknown(&server, &proxy, &scratch);
    // No reply gets through before leasehold gives up.
    let done = running.finish();
    done.assert_code(130);
    assert!(!scratch.path("ran").exists(), "the command ran");
    assert!(
        done.stderr
            .contains("could not confirm that no grant is left"),
        "{done:#?}"
    );
    assert!(
        done.stderr
            .contains("sent behind the acquire on the same connection"),
        "{done:#?}"
    );
    // Only the replies were held: the release reached the server behind the acquire, and
    // removed its grant.
    assert_eq!(
        server.cmd(&["EXISTS", &lease_key("r")]),
        Reply::Int(0),
        "the grant was left behind: {done:#?}"
    );
}

// ---------------------------------------------------------------------------------------------
// inspect

#[test]
fn inspect_reports_held_and_free_in_one_json_shape() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let mut held = Held::new(&server, "orders/7", ttl);
    let json = inspect_json(&server, "orders/7");
    let keys: Vec<&String> = json.as_object().expect("an object").keys().collect();
    assert_eq!(keys.len(), 4, "{json}");
    assert_eq!(json["state"], "held");
    assert_eq!(json["fence"], held.lease().fence().get());
    assert_eq!(
        json["holder"],
        held.lease().attempt().fingerprint().as_str()
    );
    let remaining = json["remaining_ms"].as_u64().expect("a number");
    assert!(remaining > 0 && remaining <= 30_000, "{json}");

    let mut command = leasehold(&server.url());
    command.args(["inspect", "orders/7"]);
    let done = run_to_end(command);
    done.assert_code(0);
    let fingerprint = held.lease().attempt().fingerprint();
    assert!(
        done.stdout
            .contains(&format!("held by {fingerprint}, fence 1")),
        "{done:#?}"
    );

    held.release();
    let json = inspect_json(&server, "orders/7");
    assert_eq!(
        json,
        serde_json::json!({"state": "free", "fence": null, "remaining_ms": null, "holder": null})
    );
}

// ---------------------------------------------------------------------------------------------
// privacy

/// Every command the server runs, in order, as `MONITOR` reports it on a raw connection:
/// keys, arguments, channels, and the commands the scripts run.
struct Monitor {
    stream: TcpStream,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Monitor {
    fn start(server: &RedisServer) -> Self {
        let stream = TcpStream::connect(server.addr()).expect("connects");
        (&stream).write_all(b"MONITOR\r\n").expect("sent");
        let mut reader = BufReader::new(stream.try_clone().expect("a second handle"));
        let mut ok = String::new();
        reader.read_line(&mut ok).expect("a reply");
        assert_eq!(ok, "+OK\r\n");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Self {
            stream,
            lines,
            reader: Some(reader),
        }
    }

    /// Returns every command the server has run so far: a marker sent now comes after them.
    fn seen(&self, server: &RedisServer) -> Vec<String> {
        let marker = format!("end-of-test-{}", std::process::id());
        server.cmd(&["ECHO", &marker]);
        wait_until("the marker in MONITOR", || {
            let lines = self.lines.lock().unwrap();
            lines
                .iter()
                .any(|l| l.contains(&marker))
                .then(|| lines.clone())
        })
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// The owner tokens in MONITOR lines: quoted arguments of 32 Base64URL characters (24 bytes).
fn tokens_in(lines: &[String]) -> BTreeSet<String> {
    lines
        .iter()
        .flat_map(|line| line.split('"').skip(1).step_by(2))
        // Inside scripts the stored value `fence:token:operation` goes by too.
        .flat_map(|arg| arg.split(':'))
        .filter(|part| {
            part.len() == 32
                && part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_raw_resource_name_never_reaches_redis_and_no_token_is_printed() {
    let server = RedisServer::start();
    let monitor = Monitor::start(&server);
    let scratch = Scratch::new();
    let name = "customer-8812-private-name";
    let mut outputs: Vec<Finished> = Vec::new();

    // A holder, and while it holds: inspect both ways, and a run that waits on it (it watches
    // the release channel) and gives up, printing the holder it met.
    let mut command = leasehold(&server.url());
    command
        .args(["run", name, "--"])
        .args(scratch.sh(r#"echo started > "$D/started"
           i=0; while [ ! -e "$D/go" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done"#));
    let holder = Running::start(command);
    wait_for_file(&scratch.path("started"));
    for argv in [&["inspect", name][..], &["inspect", name, "--json"]] {
        let mut command = leasehold(&server.url());
        command.args(argv);
        outputs.push(run_to_end(command));
    }
    let mut command = leasehold(&server.url());
    command.args(["run", name, "--wait", "300ms", "--", "true"]);
    outputs.push(run_to_end(command));
    std::fs::write(scratch.path("go"), "").unwrap();
    outputs.push(holder.finish());
    // Free again: a run of its own, and the demo on this server.
    let mut command = leasehold(&server.url());
    command.args(["run", name, "--", "true"]);
    outputs.push(run_to_end(command));
    let mut command = leasehold(&server.url());
    command.arg("demo");
    outputs.push(run_to_end(command));

    let codes: Vec<i32> = outputs.iter().map(Finished::code).collect();
    assert_eq!(codes, [0, 0, 75, 0, 0, 0], "{outputs:#?}");
    // What the outputs say about the holder is its fingerprint.
    assert!(outputs[0].stdout.contains("held by "), "{outputs:#?}");
    assert!(outputs[2].stderr.contains("held by "), "{outputs:#?}");

    let seen = monitor.seen(&server);
    let digest = ResourceDigest::of(name);
    let digest_hex = &digest.as_str()["sha256:".len()..];
    assert!(
        seen.iter().any(|l| l.contains(digest_hex)),
        "nothing about the resource was seen: {seen:#?}"
    );
    assert!(
        seen.iter()
            .any(|l| l.to_ascii_uppercase().contains("SUBSCRIBE")),
        "the waiting run's channel was not seen: {seen:#?}"
    );
    for line in &seen {
        assert!(!line.contains(name), "{line}");
    }
    // Four runs' attempts and the demo's two workers.
    let tokens = tokens_in(&seen);
    assert!(tokens.len() >= 5, "{tokens:?}");
    for done in &outputs {
        for token in &tokens {
            assert!(
                !done.stdout.contains(token.as_str()) && !done.stderr.contains(token.as_str()),
                "a token was printed: {done:#?}"
            );
        }
    }
    for key in server.keys() {
        assert!(!key.contains(name), "{key}");
    }
}

// ---------------------------------------------------------------------------------------------
// usage errors

#[test]
fn bad_flags_and_durations_are_usage_errors_2_before_any_io() {
    // Nothing listens there: any attempt to connect would be 69, not 2.
    let url = dead_url();
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "r", "--ttl", "5x", "--", "true"],
            "unknown time unit",
        ),
        (&["run", "r", "--ttl", "soon", "--", "true"], "--ttl"),
        (&["run", "r", "--wait=-1s", "--", "true"], "--wait"),
        (&["run", "r", "--grace", "", "--", "true"], "--grace"),
        (&["run", "r", "--ttl", "10ms", "--", "true"], "drift budget"),
        (
            &["run", "r", "--ttl", "1500us", "--", "true"],
            "whole number",
        ),
        (&["run", "r", "--wait", "2h", "--", "true"], "--wait 2h"),
        (
            &["run", "r", "--purpose", "Not Valid", "--", "true"],
            "--purpose",
        ),
        (&["run", "r"], "<CMD>"),
        (&["run", "r", "true"], "unexpected argument"),
        (&["run", "--", "true"], "<RESOURCE>"),
        (&["run", "r", "--frobnicate", "--", "true"], "--frobnicate"),
        (&["inspect"], "<RESOURCE>"),
        (&["inspect", "r", "--purpose", "a:b"], "--purpose"),
        (&["--namespace", "a:b", "inspect", "r"], "--namespace"),
        (&["frobnicate"], "frobnicate"),
        (&[], "Usage"),
    ];
    for (argv, needle) in cases {
        let mut command = leasehold(&url);
        command.args(*argv);
        let done = run_to_end(command);
        assert_eq!(done.code(), 2, "{argv:?}: {done:#?}");
        assert!(
            done.stderr.contains("error") || done.stderr.contains("Usage"),
            "{argv:?}: {done:#?}"
        );
        assert!(done.stderr.contains(needle), "{argv:?}: {done:#?}");
    }

    // A bad URL is a usage error too, and its password is not echoed, whatever it holds.
    for url in [
        "redis://:hunter2@127.0.0.1:notaport",
        "redis://:hun?ter2@127.0.0.1:notaport",
        "redis://:hun#ter2@127.0.0.1:notaport",
        "redis://:hun?ter2@127.0.0.1:6379",
        "redis://:hun#ter2@127.0.0.1:6379",
    ] {
        for argv in [
            &["inspect", "r"][..],
            &["run", "r", "--", "true"],
            &["demo"],
        ] {
            let mut command = leasehold(url);
            command.args(argv);
            let done = run_to_end(command);
            done.assert_code(2);
            // Reported before anything is done: the demo has not begun its story.
            assert!(done.stdout.is_empty(), "{url} {argv:?}: {done:#?}");
            assert!(done.stderr.contains("--redis"), "{url} {argv:?}: {done:#?}");
            for secret in ["hunter2", "hun?ter2", "hun#ter2", "ter2"] {
                assert!(
                    !done.stderr.contains(secret) && !done.stdout.contains(secret),
                    "{url} {argv:?}: {done:#?}"
                );
            }
        }
    }
}

#[test]
fn help_documents_the_exit_codes_and_never_shows_the_url_variable() {
    let help = |argv: &[&str]| {
        let mut command = leasehold(&dead_url());
        command
            .env(
                "LEASEHOLD_REDIS_URL",
                "redis://:hunter2@example.invalid:6379",
            )
            .args(argv);
        let done = run_to_end(command);
        done.assert_code(0);
        assert!(!done.stdout.contains("hunter2"), "{argv:?}: {done:#?}");
        done
    };
    let top = help(&["--help"]);
    for needle in [
        "75",
        "69",
        "70",
        "128+N",
        "LEASEHOLD_REDIS_URL",
        "LEASEHOLD_NAMESPACE",
        "run",
        "inspect",
        "demo",
    ] {
        assert!(top.stdout.contains(needle), "--help: {needle}: {top:#?}");
    }
    let run = help(&["run", "--help"]);
    for needle in [
        "75",
        "69",
        "70",
        "128+N",
        "LEASEHOLD_FENCE",
        "LEASEHOLD_RESOURCE_DIGEST",
        "LEASEHOLD_TTL_MS",
    ] {
        assert!(
            run.stdout.contains(needle),
            "run --help: {needle}: {run:#?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// demo

#[test]
fn the_demo_tells_the_story_and_rejects_the_stale_write() {
    // The environment's URL is ignored: the demo starts its own server.
    let mut command = Command::new(BIN);
    command
        .env("LEASEHOLD_REDIS_URL", dead_url())
        .env_remove("LEASEHOLD_NAMESPACE")
        .arg("demo");
    let done = run_to_end(command);
    done.assert_code(0);
    let (a, b) = demo_fences(&done);
    for needle in [
        "ephemeral",
        "store it as BIGINT",
        "contended",
        "1 row changed: accepted",
        "0 rows changed: the stale write was REJECTED",
        &format!("(fence {a} is older than {b})"),
        &format!("status 'packed by B' | fence {b}"),
    ] {
        assert!(done.stdout.contains(needle), "{needle}: {done:#?}");
    }
}

#[test]
fn the_demo_runs_on_a_server_named_with_redis() {
    let server = RedisServer::start();
    let mut command = leasehold(&server.url());
    // Would be used instead of starting one, were --redis not typed.
    command
        .env("LEASEHOLD_REDIS_SERVER", "/nonexistent/redis-server")
        .arg("demo");
    let done = run_to_end(command);
    done.assert_code(0);
    let (_, b) = demo_fences(&done);
    for needle in [
        "(named with --redis)",
        "0 rows changed: the stale write was REJECTED",
    ] {
        assert!(done.stdout.contains(needle), "{needle}: {done:#?}");
    }
    assert!(!done.stdout.contains("ephemeral"), "{done:#?}");
    // The story ran on this server: its fence counter is the demo's.
    let digest = ResourceDigest::of("orders/42");
    let fence_key = format!("leasehold:lease:v1:demo:{{{}}}:fence", digest.as_str());
    assert_eq!(
        server.cmd(&["GET", &fence_key]).as_string(),
        Some(b.to_string())
    );
}

#[test]
fn the_demo_against_an_unreachable_server_is_69() {
    let url = format!("redis://:hunter2@127.0.0.1:{}", dead_port());
    let mut command = leasehold(&url);
    command.arg("demo");
    let done = run_to_end(command);
    done.assert_code(69);
    assert!(done.stderr.contains("unavailable"), "{done:#?}");
    assert!(done.stderr.contains("redis://:***@127.0.0.1:"), "{done:#?}");
    assert!(!done.stderr.contains("hunter2"), "{done:#?}");
    assert!(!done.stderr.contains("the demo failed"), "{done:#?}");
}

#[test]
fn the_demo_without_redis_server_gives_the_install_hint() {
    let mut command = Command::new(BIN);
    command
        .env_remove("LEASEHOLD_REDIS_URL")
        .env("LEASEHOLD_REDIS_SERVER", "/nonexistent/redis-server")
        .arg("demo");
    let done = run_to_end(command);
    done.assert_code(69);
    assert!(
        done.stderr.contains("sudo apt-get install -y redis-server"),
        "{done:#?}"
    );
}
