//! The master the Sentinels name now: asked beside every lease command on a Sentinel
//! deployment, so that an answer counts only if it came from that master.
//!
//! A forced or automatic failover promotes a replica while the old master keeps running: until
//! a Sentinel demotes it (a second or more later), it still grants and renews for the clients
//! connected to it, while clients that connect afresh are sent to the new one. A holder whose
//! renewals succeed on the old master never learns that a newer holder was granted the lease on
//! the new one (issue 34: 35 overlapping pairs in six failovers, both told "covered"). So the
//! link asks the Sentinels, concurrently with each command, which master they name; a command
//! that ran on another is sent again to the one they name, whose answer stands (`link.rs`).
//!
//! `SENTINEL GET-MASTER-ADDR-BY-NAME` is asked rather than `SENTINEL MASTERS` (which redis-rs
//! reads to connect): it names the promoted replica as soon as the failover has promoted it,
//! before the failover ends and before any client reading `SENTINEL MASTERS` of the same
//! Sentinel can be sent there. The Sentinels are asked in the order given, all at once, and
//! the first that answers is taken, as redis-rs takes them when it connects.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt as _;
use leasehold::{Unavailable, UnavailableCause};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, Value};

/// A master's address as a Sentinel names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MasterAddr {
    host: String,
    port: u16,
}

impl MasterAddr {
    /// The master at `host`:`port`.
    #[cfg(test)]
    pub(crate) fn at(host: &str, port: u16) -> Self {
        Self {
            host: host.to_owned(),
            port,
        }
    }

    /// The address `info` connects to, if it is a TCP one (a Sentinel names no Unix socket).
    pub(crate) fn of(info: &ConnectionInfo) -> Option<Self> {
        match info.addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                Some(Self {
                    host: host.clone(),
                    port: *port,
                })
            }
            _ => None,
        }
    }

    /// `info` (its credentials, database and TLS) pointed at this address instead.
    pub(crate) fn applied_to(&self, info: &ConnectionInfo) -> ConnectionInfo {
        let addr = match info.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: self.host.clone(),
                port: self.port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(self.host.clone(), self.port),
        };
        info.clone().set_addr(addr)
    }
}

impl std::fmt::Display for MasterAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// One Sentinel and the connection to it, made when first needed and again after it fails.
struct Sentinel {
    client: redis::Client,
    connection: Mutex<Option<MultiplexedConnection>>,
}

/// The Sentinels of one deployment, and the service whose master they are asked for.
pub(crate) struct Sentinels {
    service: String,
    sentinels: Vec<Sentinel>,
    config: AsyncConnectionConfig,
    /// How long a Sentinel may take to answer, and to connect first when it must: the same
    /// bounds as a lease command's, so that asking beside one never makes it wait longer.
    command_timeout: Duration,
    connect_timeout: Duration,
}

impl std::fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Addresses only: the connection info may hold the Sentinels' credentials.
        f.debug_struct("Sentinels")
            .field("service", &self.service)
            .field("sentinels", &self.sentinels.len())
            .finish_non_exhaustive()
    }
}

impl Sentinels {
    /// The Sentinels at `infos`, for `service`. No I/O.
    pub(crate) fn new(
        infos: &[ConnectionInfo],
        service: &str,
        connect_timeout: Duration,
        command_timeout: Duration,
    ) -> redis::RedisResult<Self> {
        let sentinels = infos
            .iter()
            .map(|info| {
                Ok(Sentinel {
                    client: redis::Client::open(info.clone())?,
                    connection: Mutex::new(None),
                })
            })
            .collect::<redis::RedisResult<_>>()?;
        Ok(Self {
            service: service.to_owned(),
            sentinels,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                .set_response_timeout(Some(command_timeout)),
            command_timeout,
            connect_timeout,
        })
    }

    /// Returns the master the first Sentinel that answers (in the order given) names.
    ///
    /// # Errors
    ///
    /// `Unavailable` (`NotConnected`) if no Sentinel answered with an address.
    pub(crate) async fn named(&self) -> Result<MasterAddr, Unavailable> {
        // Collected before the stream is built: with the closure inside the stream, rustc
        // cannot prove the future `Send` (as redis-rs found for its own lookups).
        let asked: Vec<_> = self
            .sentinels
            .iter()
            .map(|sentinel| self.ask(sentinel))
            .collect();
        let mut answers = futures_util::stream::iter(asked).buffered(self.sentinels.len());
        let mut last = None;
        while let Some(answer) = answers.next().await {
            match answer {
                Ok(named) => return Ok(named),
                Err(why) => last = Some(why),
            }
        }
        Err(Unavailable::new(
            UnavailableCause::NotConnected,
            format!(
                "no Sentinel named the master: {}",
                last.unwrap_or("no Sentinel")
            ),
        ))
    }

    /// Asks one Sentinel, within the command timeout (and the connect timeout before it, if
    /// there is no connection to it yet).
    async fn ask(&self, sentinel: &Sentinel) -> Result<MasterAddr, &'static str> {
        let connected = sentinel
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        let within = if connected {
            self.command_timeout
        } else {
            self.connect_timeout + self.command_timeout
        };
        match tokio::time::timeout(within, self.query(sentinel)).await {
            Ok(answer) => answer,
            Err(_) => {
                Self::drop_connection(sentinel);
                Err("no answer in time")
            }
        }
    }

    async fn query(&self, sentinel: &Sentinel) -> Result<MasterAddr, &'static str> {
        let cached = sentinel
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut connection = match cached {
            Some(connection) => connection,
            None => {
                let made = sentinel
                    .client
                    .get_multiplexed_async_connection_with_config(&self.config)
                    .await
                    .map_err(|_| "cannot connect")?;
                *sentinel
                    .connection
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(made.clone());
                made
            }
        };
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(&self.service);
        let reply = cmd.query_async::<Value>(&mut connection).await;
        let reply = reply.map_err(|_| {
            Self::drop_connection(sentinel);
            "the query failed"
        })?;
        master_addr(&reply).ok_or("it does not know the service")
    }

    fn drop_connection(sentinel: &Sentinel) {
        *sentinel
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// Reads `[ip, port]`, as `GET-MASTER-ADDR-BY-NAME` answers (nil for an unknown service).
fn master_addr(reply: &Value) -> Option<MasterAddr> {
    let Value::Array(parts) = reply else {
        return None;
    };
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    match parts.as_slice() {
        [host, port] => Some(MasterAddr {
            host: text(host)?,
            port: text(port)?.parse().ok()?,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinels_answer_is_read_or_refused() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            master_addr(&Value::Array(vec![bulk("127.0.0.1"), bulk("6380")])),
            Some(MasterAddr {
                host: "127.0.0.1".into(),
                port: 6380
            })
        );
        assert_eq!(master_addr(&Value::Nil), None);
        assert_eq!(
            master_addr(&Value::Array(vec![bulk("h"), bulk("port")])),
            None
        );
        assert_eq!(master_addr(&Value::Array(vec![bulk("h")])), None);
    }

    #[test]
    fn an_address_keeps_the_connections_tls_and_credentials() {
        let info: ConnectionInfo =
            redis::IntoConnectionInfo::into_connection_info("redis://user:secret@10.0.0.1:6379/3")
                .unwrap();
        let moved = MasterAddr {
            host: "10.0.0.2".into(),
            port: 6380,
        }
        .applied_to(&info);
        assert_eq!(
            MasterAddr::of(&moved),
            Some(MasterAddr {
                host: "10.0.0.2".into(),
                port: 6380
            })
        );
        let (was, now) = (info.redis_settings(), moved.redis_settings());
        assert_eq!(
            (now.db(), now.username(), now.password()),
            (was.db(), was.username(), was.password())
        );
    }
}
