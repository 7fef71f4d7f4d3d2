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
        panic!(
            "sentinel deployment: not {what} within {limit:?}; {}",
            self.log_tail()
        );
    }

    /// The end of the Sentinel's log, for a failure message.
    fn log_tail(&self) -> String {
        let log =
            std::fs::read_to_string(self.sentinel.dir().join("redis.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(40)..];
        format!("the Sentinel's log ends with:\n{}", tail.join("\n"))
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
    /// A `NOGOODSLAVE` refusal, and a failover the Sentinel aborted (it checks the replica
    /// again once the failover has started, and gives up with `-failover-abort-no-good-slave`
    /// if its view is stale by then), are retried within the same bound: the Sentinel judges
    /// the replica by its last INFO and ping replies, which can lag behind a replica that has
    /// just come (back) into sync, all the more with [`with_fast_timers`](Self::with_fast_timers).
    ///
    /// # Panics
    ///
    /// If the Sentinel refuses otherwise, or the failover does not finish within 30 s.
    pub fn failover(&self) -> &RedisServer {
        let old = self.master().port();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.sentinel.cmd(&["SENTINEL", "FAILOVER", SERVICE]) {
                Reply::Status(s) if s == "OK" => {}
                Reply::Error(e) if e.starts_with("NOGOODSLAVE") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                other => panic!("SENTINEL FAILOVER replied {other:?}"),
            }
            while Instant::now() < deadline {
                // The flags first: the switch clears "failover_in_progress" and changes the
                // address together, so a failover seen ended before the address is read, with
                // the address unchanged, was aborted (and not merely finished meanwhile).
                let flags = pairs_get(
                    &self.sentinel.cmd(&["SENTINEL", "MASTER", SERVICE]),
                    "flags",
                )
                .unwrap_or_default();
                let port = self.master_port();
                if port != old {
                    if field(self.master(), "replication", "role") == "master" {
                        return self.master();
                    }
                } else if !flags.contains("failover_in_progress") {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(
                Instant::now() < deadline,
                "sentinel deployment: not failed over within 30 s; {}",
                self.log_tail()
            );
        }
    }
}

impl RedisSentinel {
    /// Shortens the timers a forced failover waits on, so that it settles (the former master
    /// demoted and back in sync) in about two seconds rather than ten or more: the Sentinel's
    /// INFO every 100 ms instead of every 10 s and its hellos every 100 ms instead of 2 s
    /// (`SENTINEL DEBUG`, Redis 7.0+; the Sentinel turns a former master back into a replica
    /// only once it has reported being a master for four hello periods), and no 5 s
    /// `repl-diskless-sync-delay` before the full resynchronisation the former master needs
    /// (the Sentinel's own hellos have moved its replication offset past the promoted one's).
    ///
    /// # Panics
    ///
    /// If the Sentinel refuses (a redis-server older than 7.0).
    pub fn with_fast_timers(self) -> Self {
        assert_eq!(
            self.sentinel.cmd(&[
                "SENTINEL",
                "DEBUG",
                "info-period",
                "100",
                "publish-period",
                "100",
            ]),
            Reply::Status("OK".into()),
            "SENTINEL DEBUG (needs redis-server 7.0 or later)"
        );
        for node in &self.nodes {
            assert_eq!(
                node.cmd(&["CONFIG", "SET", "repl-diskless-sync-delay", "0"]),
                Reply::Status("OK".into()),
                "CONFIG SET repl-diskless-sync-delay"
            );
        }
        self
    }

    /// Waits (bounded) until another failover could succeed: the node that is not the master
    /// replicates the master with its link up, and the Sentinel lists it as a reachable
    /// replica of that master that reports the role itself.
    ///
    /// After [`failover`](Self::failover) this is the moment the former master has been
    /// demoted and has resynchronised from the promoted one, so whatever it accepted in
    /// between is gone.
    ///
    /// # Panics
    ///
    /// If that does not happen within 30 s.
    pub fn wait_until_settled(&self) {
        self.wait_until(Duration::from_secs(30), "settled", |d| {
            let master = d.master_port().to_string();
            let replica = d.replica();
            let replicating = field(replica, "replication", "role") == "slave"
                && field(replica, "replication", "master_port") == master
                && field(replica, "replication", "master_link_status") == "up";
            let port = replica.port().to_string();
            let known = match d.sentinel.cmd(&["SENTINEL", "REPLICAS", SERVICE]) {
                Reply::Array(Some(replicas)) => replicas.iter().any(|entry| {
                    let get = |name: &str| pairs_get(entry, name);
                    get("port").as_deref() == Some(port.as_str())
                        && get("flags").as_deref() == Some("slave")
                        && get("role-reported").as_deref() == Some("slave")
                        && get("master-link-status").as_deref() == Some("ok")
                        && get("master-port").as_deref() == Some(master.as_str())
                }),
                _ => false,
            };
            replicating && known
        });
    }

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

/// Returns `name`'s value in `INFO section` of `server`, or "" if absent or if the server
/// dropped the connection (a Sentinel reconfiguring a node kills its clients): callers poll.
fn field(server: &RedisServer, section: &str, name: &str) -> String {
    let info = server
        .try_cmd(&["INFO", section])
        .ok()
        .and_then(|reply| reply.as_string())
        .unwrap_or_default();
    info.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Returns `name`'s value in a flat `[name, value, …]` array reply (as `SENTINEL REPLICAS`
/// gives for each replica).
fn pairs_get(entry: &Reply, name: &str) -> Option<String> {
    let Reply::Array(Some(items)) = entry else {
        return None;
    };
    items
        .chunks(2)
        .find(|pair| pair[0].as_string().as_deref() == Some(name))
        .and_then(|pair| pair.get(1)?.as_string())
}
