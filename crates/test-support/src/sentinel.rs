//! A Sentinel deployment of real redis-server processes on loopback, one per test.
//!
//! [`RedisSentinel::start`] runs a master, one replica and one Sentinel (quorum 1) that
//! monitors the master under [`SERVICE`], and returns once the replica is in sync and the
//! Sentinel knows it, so that [`RedisSentinel::failover`] can promote it. Dropping it kills
//! every process.

use std::time::{Duration, Instant};

use crate::{RedisServer, Reply};

/// The service (master) name the Sentinel monitors.
pub const SERVICE: &str = "leasehold-test";

/// A master, a replica and a Sentinel.
#[derive(Debug)]
pub struct RedisSentinel {
    nodes: [RedisServer; 2],
    sentinel: RedisServer,
}

impl RedisSentinel {
    /// Starts the three processes and waits (bounded) until a failover could succeed.
    ///
    /// # Panics
    ///
    /// If redis-server is missing (with an install hint), a process does not start, or the
    /// deployment is not ready within 30 s.
    pub fn start() -> Self {
        let master = RedisServer::start();
        let replica =
            RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &master.port().to_string()]);
        let config = format!(
            "sentinel monitor {SERVICE} 127.0.0.1 {} 1\n\
             sentinel down-after-milliseconds {SERVICE} 1000\n\
             sentinel failover-timeout {SERVICE} 5000\n\
             sentinel parallel-syncs {SERVICE} 1\n",
            master.port()
        );
        let sentinel = RedisServer::try_start_with_config(Some(&config), &["--sentinel"])
            .unwrap_or_else(|e| panic!("the sentinel did not start: {e}"));
        let deployment = Self {
            nodes: [master, replica],
            sentinel,
        };
        deployment.wait_until(Duration::from_secs(30), "replica in sync and known", |d| {
            let synced = field(&d.nodes[1], "replication", "master_link_status") == "up";
            let known = match d.sentinel.cmd(&["SENTINEL", "REPLICAS", SERVICE]) {
                Reply::Array(Some(replicas)) => replicas.len() == 1,
                _ => false,
            };
            synced && known
        });
        deployment
    }

    fn wait_until(&self, limit: Duration, what: &str, ready: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if ready(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("sentinel deployment: not {what} within {limit:?}");
    }

    /// Returns the Sentinel's URL, the seed a Sentinel client takes.
    pub fn sentinel_urls(&self) -> Vec<String> {
        vec![self.sentinel.url()]
    }

    /// Returns the Sentinel process.
    pub fn sentinel(&self) -> &RedisServer {
        &self.sentinel
    }

    /// Returns the data node the Sentinel currently names as master.
    ///
    /// # Panics
    ///
    /// If the Sentinel names neither node.
    pub fn master(&self) -> &RedisServer {
        let port = self.master_port();
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .expect("the sentinel names one of our nodes")
    }

    /// Returns the data node that is not the master.
    pub fn replica(&self) -> &RedisServer {
        let port = self.master_port();
        self.nodes
            .iter()
            .find(|n| n.port() != port)
            .expect("two nodes")
    }

    fn master_port(&self) -> u16 {
        match self
            .sentinel
            .cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE])
        {
            Reply::Array(Some(parts)) => parts
                .get(1)
                .and_then(Reply::as_string)
                .and_then(|p| p.parse().ok())
                .expect("a port"),
            other => panic!("SENTINEL GET-MASTER-ADDR-BY-NAME replied {other:?}"),
        }
    }

    /// Forces a failover (`SENTINEL FAILOVER`) and waits (bounded) until the Sentinel names
    /// the former replica as master and that node says it is one. Returns the new master.
    ///
    /// The old master may still believe it is one for a while (the Sentinel turns it into a
    /// replica a little later, or when it comes back): writes sent to it meanwhile are lost.
    /// [`wait_until_demoted`](Self::wait_until_demoted) waits for that step.
    ///
    /// # Panics
    ///
    /// If the Sentinel refuses or the failover does not finish within 30 s.
    pub fn failover(&self) -> &RedisServer {
        let old = self.master().port();
        assert_eq!(
            self.sentinel.cmd(&["SENTINEL", "FAILOVER", SERVICE]),
            Reply::Status("OK".into()),
            "SENTINEL FAILOVER"
        );
        self.wait_until(Duration::from_secs(30), "failed over", |d| {
            let port = d.master_port();
            port != old && field(d.master(), "replication", "role") == "master"
        });
        self.master()
    }
}

impl RedisSentinel {
    /// Waits (bounded) until `node` reports itself a replica.
    ///
    /// # Panics
    ///
    /// If it does not within 30 s.
    pub fn wait_until_demoted(&self, node: &RedisServer) {
        self.wait_until(Duration::from_secs(30), "demoted", |_| {
            field(node, "replication", "role") == "slave"
        });
    }
}

/// Returns `name`'s value in `INFO section` of `server`, or "" if absent.
fn field(server: &RedisServer, section: &str, name: &str) -> String {
    let info = server
        .cmd(&["INFO", section])
        .as_string()
        .unwrap_or_default();
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_default()
        .trim()
        .to_owned()
}
