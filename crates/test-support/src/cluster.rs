//! A Redis Cluster of real redis-server processes on loopback, one per test.
//!
//! [`RedisCluster::start`] runs `masters` cluster-enabled servers (no replicas), gives each an
//! equal contiguous range of the 16,384 slots with `CLUSTER ADDSLOTSRANGE`, introduces them
//! with `CLUSTER MEET`, and returns once every node reports `cluster_state:ok` and knows every
//! other node by its loopback address. Dropping it kills every node.
//!
//! [`RedisCluster::start_tls`] does the same with TLS on each node's client port and on the
//! cluster bus (`tls-cluster`), the certificates signed by a private CA made for the test
//! ([`TestCertificates`]); the harness keeps talking to each node's plain port.

use std::time::{Duration, Instant};

use crate::tls::TestCertificates;
use crate::{RedisServer, Reply, free_port};

/// The number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16_384;

/// A running cluster: its nodes and the slot range each one serves.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    ranges: Vec<(u16, u16)>,
    /// For a TLS cluster: the certificates and each node's TLS port, in node order.
    tls: Option<(TestCertificates, Vec<u16>)>,
}

impl RedisCluster {
    /// Starts a cluster of `masters` nodes (at least 1) and waits until it serves every slot.
    ///
    /// # Panics
    ///
    /// If redis-server is missing (with an install hint), a node does not start, or the
    /// cluster does not converge within 20 s.
    pub fn start(masters: usize) -> Self {
        Self::start_with(masters, None)
    }

    /// [`start`](Self::start), with TLS on every node's client port and on the cluster bus;
    /// clients reach it through [`tls_urls`](Self::tls_urls) trusting [`ca_pem`](Self::ca_pem).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start), and if redis-server was built without TLS.
    pub fn start_tls(masters: usize) -> Self {
        Self::start_with(masters, Some(TestCertificates::make()))
    }

    fn start_with(masters: usize, tls: Option<TestCertificates>) -> Self {
        assert!(
            (1..=usize::from(SLOTS)).contains(&masters),
            "1..=16384 masters"
        );
        let mut nodes = Vec::new();
        let mut buses = Vec::new();
        let mut tls_ports = Vec::new();
        for _ in 0..masters {
            let (node, bus, tls_port) = start_node(tls.as_ref());
            nodes.push(node);
            buses.push(bus);
            tls_ports.push(tls_port);
        }
        let count = u16::try_from(masters).expect("at most 16384 masters");
        let ranges: Vec<(u16, u16)> = (0..count)
            .map(|i| {
                let first = i * (SLOTS / count);
                let last = if i + 1 == count {
                    SLOTS - 1
                } else {
                    (i + 1) * (SLOTS / count) - 1
                };
                (first, last)
            })
            .collect();
        for (node, (first, last)) in nodes.iter().zip(&ranges) {
            expect_ok(node.cmd(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &first.to_string(),
                &last.to_string(),
            ]));
        }
        let (head, rest) = nodes.split_first().expect("at least one node");
        for (other, bus) in rest.iter().zip(&buses[1..]) {
            expect_ok(head.cmd(&[
                "CLUSTER",
                "MEET",
                "127.0.0.1",
                &other.port().to_string(),
                bus,
            ]));
        }
        let cluster = Self {
            nodes,
            ranges,
            tls: tls.map(|certificates| (certificates, tls_ports)),
        };
        cluster.wait_until_converged();
        cluster
    }

    fn wait_until_converged(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = String::new();
        while Instant::now() < deadline {
            let converged = self.nodes.iter().all(|node| {
                let info = node
                    .cmd(&["CLUSTER", "INFO"])
                    .as_string()
                    .unwrap_or_default();
                let listing = node
                    .cmd(&["CLUSTER", "NODES"])
                    .as_string()
                    .unwrap_or_default();
                // Every node, itself included, known by its loopback address: a node that has
                // not yet learnt its own address would hand clients an empty host.
                let known = listing
                    .lines()
                    .filter(|line| line.contains(" 127.0.0.1:"))
                    .count();
                last = format!("port {}: {info}\n{listing}", node.port());
                info.contains("cluster_state:ok") && known == self.nodes.len()
            });
            if converged {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the cluster did not converge within 20 s; last seen:\n{last}");
    }

    /// Returns the nodes, in slot order: node `i` serves the `i`-th range.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Returns the nodes' URLs (`redis://127.0.0.1:PORT`), the seeds a cluster client takes.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Returns a TLS cluster's nodes' URLs (`rediss://127.0.0.1:TLS_PORT`), or none for a
    /// cluster without TLS.
    pub fn tls_urls(&self) -> Vec<String> {
        self.tls
            .iter()
            .flat_map(|(_, ports)| ports)
            .map(|port| format!("rediss://127.0.0.1:{port}"))
            .collect()
    }

    /// Returns the CA certificate (PEM) a TLS cluster's nodes chain to.
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls
            .as_ref()
            .map(|(certificates, _)| certificates.ca_pem())
    }

    /// Returns the slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`).
    ///
    /// # Panics
    ///
    /// If the first node does not answer with an integer.
    pub fn slot(&self, key: &str) -> u16 {
        let slot = self.nodes[0]
            .cmd(&["CLUSTER", "KEYSLOT", key])
            .as_int()
            .expect("CLUSTER KEYSLOT answers an integer");
        u16::try_from(slot).expect("a slot below 16384")
    }

    /// Returns the index of the node that serves `key`.
    pub fn index_for_key(&self, key: &str) -> usize {
        let slot = self.slot(key);
        self.ranges
            .iter()
            .position(|(first, last)| (*first..=*last).contains(&slot))
            .expect("every slot is assigned")
    }

    /// Returns the node that serves `key`.
    pub fn node_for_key(&self, key: &str) -> &RedisServer {
        &self.nodes[self.index_for_key(key)]
    }
}

/// Starts one cluster-enabled node. The cluster bus port is chosen free too (rather than
/// port + 10000, which may be taken or out of range); if it was taken in the meantime the
/// node fails to start and another pair of ports is tried. Returns the node and its bus port,
/// which `CLUSTER MEET` must be told, and its TLS port (0 without `tls`).
fn start_node(tls: Option<&TestCertificates>) -> (RedisServer, String, u16) {
    let mut last_error = String::new();
    for _ in 0..5 {
        let bus = free_port().to_string();
        let mut args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "5000",
            "--cluster-port",
            &bus,
        ]
        .map(str::to_owned)
        .to_vec();
        let tls_port = match tls {
            Some(certificates) => {
                let port = free_port();
                args.extend(certificates.server_args(port));
                args.extend(["--tls-cluster", "yes"].map(str::to_owned));
                port
            }
            None => 0,
        };
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match RedisServer::try_start_with_args(&args) {
            Ok(node) => return (node, bus, tls_port),
            Err(e) => last_error = e,
        }
    }
    panic!("a cluster node did not start: {last_error}");
}

fn expect_ok(reply: Reply) {
    assert_eq!(reply, Reply::Status("OK".into()), "cluster setup");
}
