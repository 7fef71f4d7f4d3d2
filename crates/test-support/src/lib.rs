//! Test harness for leasehold: real `redis-server` processes, one per test.
//!
//! [`RedisServer::start`] runs a fresh server on a free loopback port in its own temporary
//! directory, with persistence off, and kills it on drop. A missing binary fails the test with
//! an install hint: suites never skip silently. `LEASEHOLD_REDIS_SERVER` names another binary.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod cluster;
pub mod overlap;
pub mod proxy;
pub mod sentinel;
pub mod tls;

pub use cluster::RedisCluster;
pub use proxy::{FaultProxy, ProxyFault};
pub use sentinel::RedisSentinel;
pub use tls::TlsRedisServer;

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
    // Pid 0 or a negative value would address a process group: refuse them.
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        panic!("not a process id: {pid}");
    };
    // The process may have exited already; that is not the test's failure.
    let _ = rustix::process::kill_process(pid, sig);
}

/// Sends SIGSTOP to `pid`. A process that no longer exists is ignored.
///
/// # Panics
///
/// If `pid` is 0 or above `i32::MAX` (those would signal a process group).
pub fn stop_process(pid: u32) {
    signal(pid, rustix::process::Signal::STOP);
}

/// Sends SIGCONT to `pid`. A process that no longer exists is ignored.
///
/// # Panics
///
/// As [`stop_process`].
pub fn continue_process(pid: u32) {
    signal(pid, rustix::process::Signal::CONT);
}

/// Waits (up to 1 s) until `/proc/<pid>/stat` shows the process stopped; returns at once
/// where `/proc` is unavailable.
fn wait_until_stopped(pid: u32) {
    let stat = format!("/proc/{pid}/stat");
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let Ok(text) = std::fs::read_to_string(&stat) else {
            return;
        };
        // The state follows the parenthesised command name, which may itself hold spaces.
        match text
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
        {
            Some("T" | "t") | None => return,
            Some(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// CPU time (user + system) process `pid` has used, from `/proc/<pid>/stat` ("self" for this
/// process, "thread-self" for the calling thread), in clock ticks of 10 ms; zero where `/proc`
/// is unavailable. For the benches.
pub fn cpu_time(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; in clock
    // ticks, 100 a second on Linux.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
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
    let mut raw = Vec::new();
    if reader.read_until(b'\n', &mut raw)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed before a reply",
        ));
    }
    let line = String::from_utf8_lossy(&raw);
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

pub(crate) fn free_port() -> u16 {
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
    config_file: Option<PathBuf>,
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
        Self::try_start_with_args(args)
            .unwrap_or_else(|e| panic!("redis-server did not start: {e}"))
    }

    /// Starts a server with extra arguments, returning why it did not start instead of
    /// panicking (a missing binary still panics with the install hint).
    ///
    /// # Errors
    ///
    /// The server's stderr and log if it exited, or a timeout, after five ports were tried.
    pub fn try_start_with_args(args: &[&str]) -> Result<Self, String> {
        Self::try_start_with_config(None, args)
    }

    /// Starts a server whose configuration file (written into its directory, and passed first,
    /// as redis-server requires) holds `config`, with extra arguments after it. A Sentinel
    /// needs this: it rewrites its configuration file as it learns the topology.
    ///
    /// # Errors
    ///
    /// As [`try_start_with_args`](Self::try_start_with_args).
    pub fn try_start_with_config(config: Option<&str>, args: &[&str]) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-redis-")
            .tempdir()
            .expect("a temporary directory");
        let config_file = match config {
            Some(text) => {
                let path = dir.path().join("redis.conf");
                std::fs::write(&path, text)
                    .map_err(|e| format!("writing {}: {e}", path.display()))?;
                Some(path)
            }
            None => None,
        };
        let mut server = Self {
            child: None,
            port: 0,
            dir,
            config_file,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
        };
        // A port found free can be taken before the server binds it: try a few.
        let mut last_error = String::new();
        for _ in 0..5 {
            server.port = free_port();
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let binary = redis_server_binary();
        let log = self.dir.path().join("redis.log");
        // Config errors go to stderr before the log file is opened: keep them for the message.
        let stderr_path = self.dir.path().join("redis.stderr");
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(|e| format!("creating {}: {e}", stderr_path.display()))?;
        let mut command = Command::new(&binary);
        command.args(&self.config_file);
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
            .stderr(stderr);
        let child = command
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", binary.display()))?;
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                return Err(format!(
                    "redis-server on port {} exited with {status}; stderr:\n{stderr}\nlog:\n{log}",
                    self.port
                ));
            }
            // Another test's server may have won the race for this port: only a PONG from
            // our own process counts.
            if let Ok(Reply::Status(s)) = query(self.addr(), &["PING"], Duration::from_millis(200))
                && s == "PONG"
                && self.answering_pid() == Some(pid)
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Err(format!("no PONG on port {} within 10 s", self.port))
    }

    /// The `process_id` of whatever server answers on our port.
    fn answering_pid(&self) -> Option<u32> {
        let info = query(self.addr(), &["INFO", "server"], Duration::from_secs(1))
            .ok()?
            .as_string()?;
        info.lines()
            .find_map(|line| line.strip_prefix("process_id:"))?
            .trim()
            .parse()
            .ok()
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
    ///
    /// Returns once the kernel reports the process stopped (on Linux, via `/proc`), so a
    /// command sent afterwards cannot slip through.
    ///
    /// # Panics
    ///
    /// If the server was killed.
    pub fn pause(&self) -> PauseGuard<'_> {
        let pid = self.pid();
        stop_process(pid);
        wait_until_stopped(pid);
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
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last_error;
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) => last_error = e,
            }
            if Instant::now() >= deadline {
                break;
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
        self.try_cmd(args)
            .unwrap_or_else(|e| panic!("{args:?} on port {}: {e}", self.port))
    }

    /// Runs one command on a fresh connection (5 s timeout), returning an I/O failure instead
    /// of panicking: for polling a server that may drop its clients meanwhile (a Sentinel
    /// reconfiguring a node kills its normal clients).
    ///
    /// # Errors
    ///
    /// If the connection fails or the reply cannot be read.
    pub fn try_cmd(&self, args: &[&str]) -> std::io::Result<Reply> {
        query(self.addr(), args, Duration::from_secs(5))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> std::io::Result<Reply> {
        read_reply(&mut BufReader::new(bytes))
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        assert_eq!(
            encode(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n".to_vec()
        );
        // Lengths count bytes, not chars.
        assert_eq!(encode(&["é"]), b"*1\r\n$2\r\n\xc3\xa9\r\n".to_vec());
    }

    #[test]
    fn every_reply_kind_parses() {
        assert_eq!(parse(b"+OK\r\n").unwrap(), Reply::Status("OK".into()));
        assert_eq!(
            parse(b"-ERR no\r\n").unwrap(),
            Reply::Error("ERR no".into())
        );
        assert_eq!(parse(b":-42\r\n").unwrap(), Reply::Int(-42));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Reply::Bulk(None));
        assert_eq!(parse(b"*-1\r\n").unwrap(), Reply::Array(None));
        assert_eq!(parse(b"$0\r\n\r\n").unwrap(), Reply::Bulk(Some(vec![])));
        // A bulk string is length-delimited: CR LF and non-UTF-8 inside are data.
        assert_eq!(
            parse(b"$4\r\n\r\n\xff\x00\r\n").unwrap(),
            Reply::Bulk(Some(b"\r\n\xff\x00".to_vec()))
        );
        assert_eq!(
            parse(b"*3\r\n:1\r\n*1\r\n$1\r\nx\r\n*0\r\n").unwrap(),
            Reply::Array(Some(vec![
                Reply::Int(1),
                Reply::Array(Some(vec![Reply::Bulk(Some(b"x".to_vec()))])),
                Reply::Array(Some(vec![])),
            ]))
        );
    }

    #[test]
    fn truncated_or_garbled_replies_are_errors() {
        let eof = parse(b"").unwrap_err();
        assert_eq!(eof.kind(), std::io::ErrorKind::UnexpectedEof);
        assert!(parse(b"$5\r\nab").is_err());
        assert!(parse(b"*2\r\n:1\r\n").is_err());
        assert_eq!(
            parse(b"?what\r\n").unwrap_err().kind(),
            std::io::ErrorKind::InvalidData
        );
        assert!(parse(b":x\r\n").is_err());
    }

    #[test]
    fn reply_accessors() {
        assert_eq!(Reply::Int(3).as_int(), Some(3));
        assert_eq!(Reply::Status("OK".into()).as_int(), None);
        assert_eq!(Reply::Status("OK".into()).as_string(), Some("OK".into()));
        assert_eq!(
            Reply::Bulk(Some(b"a\xffb".to_vec())).as_string(),
            Some("a\u{fffd}b".into())
        );
        assert_eq!(Reply::Bulk(None).as_string(), None);
        assert_eq!(Reply::Error("ERR".into()).as_string(), None);
        assert_eq!(Reply::Int(1).as_string(), None);
    }
}
