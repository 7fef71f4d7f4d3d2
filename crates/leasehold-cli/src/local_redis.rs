//! An ephemeral redis-server for the demo: a free loopback port, a temporary directory, no
//! persistence, killed when dropped.
//!
//! Self-contained on purpose: the `test-support` harness is not published, and a binary cannot
//! depend on it.

use std::ffi::OsString;
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use tokio::time::Instant;

/// The message shown when no redis-server can be found.
pub(crate) const INSTALL_HINT: &str = "redis-server not found (looked for \
    $LEASEHOLD_REDIS_SERVER, then `redis-server` on PATH). Install it with\n\n    \
    sudo apt-get install -y redis-server\n\nor run the demo against a server you have: \
    leasehold demo --redis redis://HOST:PORT";

/// Why no server could be had.
#[derive(Debug)]
pub(crate) enum StartError {
    /// No binary: the install hint says what to do.
    Missing(String),
    /// The binary is there but did not come up.
    Failed(anyhow::Error),
}

/// A running redis-server, killed (and its directory removed) on drop.
#[derive(Debug)]
pub(crate) struct LocalRedis {
    child: Child,
    port: u16,
    version: String,
    // Dropped after the child is killed (fields drop in order after `Drop::drop`).
    _dir: tempfile::TempDir,
}

/// Finds the binary: an explicit override, then `PATH`.
fn find_binary(
    override_path: Option<OsString>,
    path_var: Option<OsString>,
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
    path_var
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| INSTALL_HINT.to_owned())
}

impl LocalRedis {
    /// Starts a server and waits until it answers (at most 10 s).
    pub(crate) async fn start() -> Result<Self, StartError> {
        let binary = find_binary(
            std::env::var_os("LEASEHOLD_REDIS_SERVER"),
            std::env::var_os("PATH"),
        )
        .map_err(StartError::Missing)?;
        let mut last_error = anyhow!("no attempt made");
        // A port found free can be taken before the server binds it: try a few.
        for _ in 0..5 {
            match Self::spawn(&binary).await {
                Ok(server) => return Ok(server),
                Err(e) => last_error = e,
            }
        }
        Err(StartError::Failed(last_error))
    }

    async fn spawn(binary: &PathBuf) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("leasehold-demo-")
            .tempdir()
            .context("creating a temporary directory")?;
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .context("finding a free port")?
            .port();
        let child = Command::new(binary)
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(dir.path().join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut server = Self {
            child,
            port,
            version: String::new(),
            _dir: dir,
        };
        server.version = server.wait_until_ready().await?;
        Ok(server)
    }

    /// Waits for a PING from *our* process (another one may have won the port) and returns
    /// its version.
    async fn wait_until_ready(&mut self) -> anyhow::Result<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = redis::Client::open(self.url())?;
        let pid = self.child.id();
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bail!("redis-server on port {} exited with {status}", self.port);
            }
            let probe = async {
                let mut conn = client.get_multiplexed_async_connection().await.ok()?;
                let info: String = redis::cmd("INFO")
                    .arg("server")
                    .query_async(&mut conn)
                    .await
                    .ok()?;
                let field = |name: &str| {
                    info.lines()
                        .find_map(|line| line.strip_prefix(name))
                        .map(|v| v.trim().to_owned())
                };
                Some((field("process_id:")?, field("redis_version:")?))
            };
            if let Ok(Some((answering, version))) =
                tokio::time::timeout(Duration::from_millis(500), probe).await
            {
                if answering == pid.to_string() {
                    return Ok(version);
                }
                bail!("another server answers on port {}", self.port);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        bail!(
            "redis-server did not answer on port {} within 10 s",
            self.port
        )
    }

    /// Returns `redis://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Returns the port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Returns the server's version.
    pub(crate) fn version(&self) -> &str {
        &self.version
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_the_install_command() {
        let empty = tempfile::tempdir().unwrap();
        let message = find_binary(None, Some(empty.path().as_os_str().to_owned())).unwrap_err();
        assert!(
            message.contains("sudo apt-get install -y redis-server"),
            "{message}"
        );
        let message = find_binary(Some("/nonexistent/redis-server".into()), None).unwrap_err();
        assert!(message.contains("/nonexistent/redis-server"), "{message}");
        assert!(
            message.contains("sudo apt-get install -y redis-server"),
            "{message}"
        );
    }

    #[test]
    fn the_binary_is_found_on_path() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("redis-server");
        std::fs::write(&fake, "").unwrap();
        let path = std::env::join_paths(["/nonexistent".into(), dir.path().to_owned()]).unwrap();
        assert_eq!(find_binary(None, Some(path)).unwrap(), fake);
        assert_eq!(find_binary(Some(fake.clone().into()), None).unwrap(), fake);
    }
}
