//! Test harness for leasehold: real `redis-server` processes, one per test.
//!
//! [`RedisServer::start`] runs a fresh server on a free loopback port in its own temporary
//! directory, with persistence off, and kills it on drop. A missing binary fails the test with
//! an install hint: suites never skip silently. `LEASEHOLD_REDIS_SERVER` names another binary.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod scenario;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The message a test fails with when no redis-server can be found.
pub const INSTALL_HINT: &str = "redis-server not found (looked for $LEASEHOLD_REDIS_SERVER, \
    then `redis-server` on PATH). Install it: sudo apt-get install -y redis-server  \
    (or set LEASEHOLD_REDIS_SERVER=/path/to/redis-server)";

/// Where redis-server is looked for when it is not on `PATH`.
pub const FALLBACK_LOCATIONS: &[&str] = &["/usr/bin/redis-server", "/usr/local/bin/redis-server"];

/// Finds the binary from an explicit override, a `PATH` value, then `fallbacks`.
///
/// # Errors
///
/// A message with [`INSTALL_HINT`] if the override does not exist or nothing is found.
pub fn resolve_binary(
    override_path: Option<OsString>,
    path_var: Option<OsString>,
    fallbacks: &[&str],
) -> Result<PathBuf, String> {
    if let Some(path) = override_path {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "LEASEHOLD_REDIS_SERVER={} does not exist. {INSTALL_HINT}",
                path.display()
            ))
        };
    }
    let from_path = path_var
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("redis-server"));
    from_path
        .chain(fallbacks.iter().map(PathBuf::from))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| INSTALL_HINT.to_owned())
}

/// Returns the redis-server binary to run.
///
/// # Panics
///
/// With [`INSTALL_HINT`] if none is found: a test without its server must fail, not skip.
pub fn redis_server_binary() -> PathBuf {
    resolve_binary(
        std::env::var_os("LEASEHOLD_REDIS_SERVER"),
        std::env::var_os("PATH"),
        FALLBACK_LOCATIONS,
    )
    .unwrap_or_else(|message| panic!("{message}"))
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .expect("a valid pid");
    // The process may have exited already; that is not the test's failure.
    let _ = rustix::process::kill_process(pid, sig);
}

/// Sends SIGSTOP to `pid`.
pub fn stop_process(pid: u32) {
    signal(pid, rustix::process::Signal::STOP);
}

/// Sends SIGCONT to `pid`.
pub fn continue_process(pid: u32) {
    signal(pid, rustix::process::Signal::CONT);
}

/// A minimal RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`
    Status(String),
    /// `-ERR …`
    Error(String),
    /// `:42`
    Int(i64),
    /// `$…`; `None` for nil.
    Bulk(Option<Vec<u8>>),
    /// `*…`; `None` for a nil array.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// Returns the integer, if this is one.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// Returns a bulk or status reply as text.
    pub fn as_string(&self) -> Option<String> {
        match self {
            Reply::Bulk(Some(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            Reply::Status(s) => Some(s.clone()),
            _ => None,
        }
    }
}

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn read_reply(reader: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end_matches(['\r', '\n']);
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad reply {line:?}"),
        )
    };
    let (kind, rest) = line.split_at_checked(1).ok_or_else(bad)?;
    let number = || rest.parse::<i64>().map_err(|_| bad());
    Ok(match kind {
        "+" => Reply::Status(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Int(number()?),
        "$" => match usize::try_from(number()?) {
            Err(_) => Reply::Bulk(None),
            Ok(len) => {
                let mut buf = vec![0; len + 2];
                reader.read_exact(&mut buf)?;
                buf.truncate(len);
                Reply::Bulk(Some(buf))
            }
        },
        "*" => match usize::try_from(number()?) {
            Err(_) => Reply::Array(None),
            Ok(len) => Reply::Array(Some(
                (0..len)
                    .map(|_| read_reply(reader))
                    .collect::<std::io::Result<_>>()?,
            )),
        },
        _ => return Err(bad()),
    })
}

fn query(addr: SocketAddr, args: &[&str], timeout: Duration) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(&encode(args))?;
    read_reply(&mut BufReader::new(stream))
}

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A redis-server process on 127.0.0.1, killed (and its directory removed) on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
}

impl RedisServer {
    /// Starts a standalone server on a free port with persistence off.
    ///
    /// # Panics
    ///
    /// If redis-server is missing (with an install hint) or does not answer within 10 s.
    pub fn start() -> Self {
        Self::start_with_args(&[])
    }

    /// Starts a server with extra command-line arguments appended.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with_args(args: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-redis-")
            .tempdir()
            .expect("a temporary directory");
        let mut server = Self {
            child: None,
            port: 0,
            dir,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        // A port found free can be taken before the server binds it: try a few.
        let mut last_error = String::new();
        for _ in 0..5 {
            server.port = free_port();
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => last_error = e,
            }
        }
        panic!("redis-server did not start: {last_error}");
    }

    fn spawn(&mut self) -> Result<(), String> {
        let binary = redis_server_binary();
        let log = self.dir.path().join("redis.log");
        let mut command = Command::new(&binary);
        command
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", binary.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                return Err(format!("exited with {status}; log:\n{log}"));
            }
            if let Ok(Reply::Status(s)) = query(self.addr(), &["PING"], Duration::from_millis(200))
                && s == "PONG"
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Err("no PONG within 10 s".to_owned())
    }

    /// Returns the port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Returns the address, on 127.0.0.1.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// Returns `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Returns the process id.
    ///
    /// # Panics
    ///
    /// If the server was killed.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server is running").id()
    }

    /// Returns the server's directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the process with SIGSTOP until the guard is dropped or resumed: it keeps its
    /// socket, so connections hang and commands get no reply.
    pub fn pause(&self) -> PauseGuard<'_> {
        stop_process(self.pid());
        PauseGuard {
            server: self,
            resumed: false,
        }
    }

    /// Kills the process (SIGKILL) and waits for it; the port then refuses connections.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            continue_process(child.id());
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server if it runs and starts it again on the same port, with no data.
    ///
    /// # Panics
    ///
    /// If it does not start again.
    pub fn restart(&mut self) {
        self.kill();
        // The port was just released by a dead process; binding it again may take a moment.
        let mut last_error = String::new();
        for _ in 0..50 {
            match self.spawn() {
                Ok(()) => return,
                Err(e) => last_error = e,
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server did not restart on port {}: {last_error}",
            self.port
        );
    }

    /// Runs one command on a fresh connection (5 s timeout).
    ///
    /// # Panics
    ///
    /// On I/O failure.
    pub fn cmd(&self, args: &[&str]) -> Reply {
        query(self.addr(), args, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{args:?} on port {}: {e}", self.port))
    }

    /// Returns calls per command from `INFO commandstats` (names as `evalsha`, `script|load`).
    pub fn commandstats(&self) -> BTreeMap<String, u64> {
        let info = self
            .cmd(&["INFO", "commandstats"])
            .as_string()
            .unwrap_or_default();
        info.lines()
            .filter_map(|line| {
                let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest
                    .strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }

    /// Returns every key (by SCAN).
    pub fn keys(&self) -> Vec<String> {
        let mut keys = Vec::new();
        let mut cursor = "0".to_owned();
        loop {
            let reply = self.cmd(&["SCAN", &cursor, "MATCH", "*", "COUNT", "1000"]);
            let Reply::Array(Some(parts)) = reply else {
                panic!("SCAN replied {reply:?}");
            };
            cursor = parts.first().and_then(Reply::as_string).expect("a cursor");
            if let Some(Reply::Array(Some(batch))) = parts.get(1) {
                keys.extend(batch.iter().filter_map(Reply::as_string));
            }
            if cursor == "0" {
                break;
            }
        }
        keys.sort();
        keys
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Resumes a paused server (SIGCONT) when dropped.
#[derive(Debug)]
pub struct PauseGuard<'a> {
    server: &'a RedisServer,
    resumed: bool,
}

impl PauseGuard<'_> {
    /// Resumes the server now.
    pub fn resume(mut self) {
        self.resume_once();
    }

    fn resume_once(&mut self) {
        if !self.resumed {
            self.resumed = true;
            if let Some(child) = self.server.child.as_ref() {
                continue_process(child.id());
            }
        }
    }
}

impl Drop for PauseGuard<'_> {
    fn drop(&mut self) {
        self.resume_once();
    }
}
