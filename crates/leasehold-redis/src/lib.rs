//! Redis backend for [`leasehold`]: leases with fencing tokens, in four Lua scripts.
//!
//! [`RedisBackend`] implements the [`leasehold::LeaseBackend`] port on one Redis deployment: a
//! standalone server ([`RedisBackend::open`]), a master found through Sentinel
//! ([`RedisBackend::open_sentinel`]) or a Cluster ([`RedisBackend::open_cluster`]), over TCP or
//! TLS (feature `tls`), optionally gating grants on replication
//! ([`RedisSettings::with_replication`]).
//! Each operation is one script run by EVALSHA (one round trip once the scripts are cached),
//! atomic on the server. Acquire increments a per-resource fence counter on every new grant and
//! stores the fence with the lease; renew and release act only on the exact grant.
//!
//! Every Redis error is mapped into the port's vocabulary: refused before running (READONLY,
//! LOADING, BUSY, MASTERDOWN, NOPERM, OOM, …) or never sent (no connection) is `Unavailable`;
//! anything that may have run (a response timeout, a connection dropped after sending, an
//! error inside a script, an unreadable reply) is `Indeterminate`.
//!
//! This is not a quorum lock (Redlock): it runs on one Redis lineage, and a failover that loses
//! writes can grant a lease twice and reissue a fence. See the README for what each guarantee
//! covers.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use leasehold_redis::leasehold::{AcquireOutcome, OperationId, Purpose, ResourceDigest};
//! use leasehold_redis::{RedisBackend, RedisSettings};
//!
//! let client = RedisBackend::open("redis://127.0.0.1:6379", RedisSettings::default())?.into_client();
//! let attempt = client.new_attempt(OperationId::new("job-1")?)?;
//! let request = client.request(
//!     Purpose::new("reports")?,
//!     ResourceDigest::of("monthly-report"),
//!     attempt,
//!     Duration::from_secs(10),
//! )?;
//! if let AcquireOutcome::Acquired(lease) = client.try_acquire(&request).await {
//!     println!("fence {}", lease.fence());
//!     let _ = lease.release().await;
//! }
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - `lua/`: the scripts, each opening with its contract (KEYS, ARGV, replies);
//! - [`keys`]: the key layout;
//! - [`fenced`]: fenced writes, the effect point that rejects a stale holder's data;
//! - [`settings`]: timeouts, limits, namespace;
//! - internal: the connection and EVALSHA path (standalone, Sentinel, Cluster), release
//!   notices (one subscriber per backend), error classification, reply decoding.

#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]

use std::fmt;

pub use leasehold;
pub use redis;

use leasehold::{
    AcquireReply, Attempt, Failure, Grant, Indeterminate, IndeterminateCause, InspectOutcome,
    LeaseBackend, LeaseClient, LeaseRequest, Purpose, ReleaseReply, RenewReply, ResourceDigest,
};

mod classify;
mod decode;
mod error;
mod eviction;
pub mod fenced;
pub mod keys;
mod link;
mod notices;
mod scripts;
pub mod settings;

pub use error::{Error, ErrorKind};
pub use fenced::{FencedWrite, RecordName};
pub use keys::KeyLayout;

/// The README's examples compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}
pub use settings::{RedisSettings, ReplicationGate};

use link::Link;

/// A lease client over Redis.
pub type RedisLeases = LeaseClient<RedisBackend>;

/// Leases on one Redis deployment: a standalone server ([`open`](Self::open)), a Cluster
/// ([`open_cluster`](Self::open_cluster)) or a master found through Sentinel
/// ([`open_sentinel`](Self::open_sentinel)).
pub struct RedisBackend {
    link: Link,
    notices: notices::Notices,
    keys: KeyLayout,
    settings: RedisSettings,
    endpoint: String,
    /// Releases are announced with `SPUBLISH` (cluster) rather than `PUBLISH`.
    sharded: bool,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only host and port: the connection info may hold credentials.
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.endpoint)
            .field("keys", &self.keys)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Makes a backend for the server at `url` (`redis://`, `rediss://` or `unix://`). No I/O:
    /// the connection is made by the first command, or by [`warm_up`](Self::warm_up).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] if `url` cannot be parsed; [`Error::Unsupported`] for `rediss://`
    /// without the `tls` feature.
    pub fn open(url: &str, settings: RedisSettings) -> Result<Self, Error> {
        let client = standalone_client(url, &settings)?;
        let endpoint = client.get_connection_info().addr().to_string();
        let notices = notices::Notices::new(
            notices::Source::Single(Box::new(client.clone())),
            settings.connect_timeout(),
        );
        let connector = link::Connector::Single {
            client,
            config: connection_config(&settings),
        };
        Ok(Self::with(connector, notices, settings, endpoint))
    }

    /// Makes a backend for the Redis Cluster reachable through `seeds` (one or more nodes'
    /// `redis://` or `rediss://` URLs; the rest of the cluster is discovered). No I/O.
    ///
    /// Each script runs on the node that owns the lease's slot; the lease, its fence counter
    /// and its release channel share that slot (the digest is a hash tag). Releases are
    /// announced with sharded pub/sub (`SPUBLISH`, Redis 7 or later), so a release is one
    /// message on one node, not a broadcast over the cluster bus. Commands are not retried by
    /// the cluster client: a redirect (`MOVED`, `ASK`) during resharding is `Unavailable`
    /// (`Redirected`) and the next try goes to the new owner.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] if there is no seed or one cannot be parsed;
    /// [`Error::Unsupported`] if `settings` has a replication gate.
    pub fn open_cluster<S: AsRef<str>>(
        seeds: &[S],
        settings: RedisSettings,
    ) -> Result<Self, Error> {
        let seeds = seeds
            .iter()
            .map(|url| redis::IntoConnectionInfo::into_connection_info(url.as_ref()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid_url(&e))?;
        if seeds.is_empty() {
            return Err(Error::InvalidUrl(
                "a cluster needs at least one seed".into(),
            ));
        }
        if settings.replication().is_some() {
            // WAIT has no key, so the cluster client would not send it to the script's node.
            return Err(Error::Unsupported(
                "a replication gate (WAIT) on a cluster backend".into(),
            ));
        }
        let endpoint = seeds
            .iter()
            .map(|s| s.addr().to_string())
            .collect::<Vec<_>>()
            .join(",");
        let client = redis::cluster::ClusterClientBuilder::new(seeds.clone())
            .retries(0)
            .response_timeout(settings.command_timeout())
            .connection_timeout(settings.connect_timeout())
            .build()
            .map_err(|e| invalid_url(&e))?;
        let notices =
            notices::Notices::new(notices::Source::Cluster(seeds), settings.connect_timeout());
        let connector = link::Connector::Cluster(client);
        Ok(Self::with(connector, notices, settings, endpoint))
    }

    /// Makes a backend for the master that the Sentinels at `sentinels` (their `redis://`
    /// URLs) name for `service`. No I/O.
    ///
    /// Every new connection asks the Sentinels for the current master (and checks with `ROLE`
    /// that it agrees). A connection is dropped after it is lost, after a `READONLY` reply (a
    /// demoted master) or after a response timeout (a stalled one), so the command after a
    /// failover reaches the new master. `node` carries the master's credentials or TLS
    /// settings when they differ from none; the Sentinels' own go in their URLs.
    ///
    /// A failover can lose the writes the old master had not yet replicated: a lease may then
    /// be granted twice and a fence issued twice. See the README.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] if there is no Sentinel or a URL cannot be parsed.
    pub fn open_sentinel<S: AsRef<str>>(
        sentinels: &[S],
        service: &str,
        node: Option<redis::sentinel::SentinelNodeConnectionInfo>,
        settings: RedisSettings,
    ) -> Result<Self, Error> {
        let infos = sentinels
            .iter()
            .map(|url| redis::IntoConnectionInfo::into_connection_info(url.as_ref()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid_url(&e))?;
        if infos.is_empty() {
            return Err(Error::InvalidUrl(
                "Sentinel needs at least one address".into(),
            ));
        }
        let endpoint = format!(
            "sentinel:{}@{}",
            service,
            infos
                .iter()
                .map(|s| s.addr().to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        // `build` takes a `String` without redis's `tls-rustls` feature and `impl AsRef<str>`
        // with it; an owned `String` suits both.
        #[allow(clippy::unnecessary_to_owned)]
        let client = redis::sentinel::SentinelClient::build(
            infos,
            service.to_owned(),
            node,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(|e| invalid_url(&e))?;
        let sentinel = std::sync::Arc::new(tokio::sync::Mutex::new(client));
        let notices = notices::Notices::new(
            notices::Source::Sentinel(std::sync::Arc::clone(&sentinel)),
            settings.connect_timeout(),
        );
        let connector = link::Connector::Sentinel {
            sentinel,
            config: connection_config(&settings),
        };
        Ok(Self::with(connector, notices, settings, endpoint))
    }

    fn with(
        connector: link::Connector,
        notices: notices::Notices,
        settings: RedisSettings,
        endpoint: String,
    ) -> Self {
        Self {
            sharded: matches!(connector, link::Connector::Cluster(_)),
            link: Link::new(
                connector,
                endpoint.clone(),
                settings.connect_timeout(),
                settings.max_in_flight(),
            ),
            notices,
            keys: KeyLayout::new(&settings),
            settings,
            endpoint,
        }
    }

    /// Returns a [`LeaseClient`] over this backend, with the boot-time clock.
    pub fn into_client(self) -> RedisLeases {
        LeaseClient::new(self)
    }

    /// Connects and loads the scripts (the four lease scripts and the fenced write), so that
    /// every later operation is one round trip.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] or [`Error::Indeterminate`] if the server cannot be reached or
    /// does not answer in time. Loading a script changes no lease, so either is harmless.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn warm_up(&self) -> Result<(), Error> {
        self.link.load(&scripts::all()).await.map_err(Error::from)
    }

    /// Returns the settings.
    pub fn settings(&self) -> &RedisSettings {
        &self.settings
    }

    /// Returns the key layout.
    pub fn keys(&self) -> &KeyLayout {
        &self.keys
    }
}

/// Makes the redis-rs client for `url`, with the settings' TLS roots when it is `rediss://`.
fn standalone_client(url: &str, settings: &RedisSettings) -> Result<redis::Client, Error> {
    let info = redis::IntoConnectionInfo::into_connection_info(url).map_err(|e| invalid_url(&e))?;
    let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
    if !tls {
        return redis::Client::open(info).map_err(|e| invalid_url(&e));
    }
    tls_client(info, settings)
}

#[cfg(feature = "tls")]
fn tls_client(
    info: redis::ConnectionInfo,
    settings: &RedisSettings,
) -> Result<redis::Client, Error> {
    // rustls needs a process-wide crypto provider; ring is the one compiled in. An error only
    // means one was installed already, which serves as well.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match settings.tls_root_certificates() {
        None => redis::Client::open(info),
        Some(pem) => redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.to_vec()),
            },
        ),
    }
    .map_err(|e| invalid_url(&e))
}

#[cfg(not(feature = "tls"))]
fn tls_client(_: redis::ConnectionInfo, _: &RedisSettings) -> Result<redis::Client, Error> {
    Err(Error::Unsupported(
        "rediss:// needs leasehold-redis's `tls` feature".into(),
    ))
}

/// The timeouts of a standalone or Sentinel-found connection.
fn connection_config(settings: &RedisSettings) -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(settings.command_timeout()))
        .set_connection_timeout(Some(settings.connect_timeout()))
}

/// Describes a URL error without the URL, which may hold a password.
fn invalid_url(err: &redis::RedisError) -> Error {
    Error::InvalidUrl(format!("{} (URL not shown)", err.category()))
}

/// Returns true if and only if no gate is set, or enough replicas confirmed.
fn replicated(gate: Option<settings::ReplicationGate>, confirmed: Option<u32>) -> bool {
    gate.is_none_or(|g| confirmed.unwrap_or(0) >= g.replicas())
}

/// A grant or renewal the primary applied that too few replicas confirmed: unknown, since a
/// failover could still undo it.
fn not_replicated(gate: Option<settings::ReplicationGate>, confirmed: Option<u32>) -> Failure {
    let (wanted, within) = gate.map_or((0, std::time::Duration::ZERO), |g| {
        (g.replicas(), g.timeout())
    });
    Failure::Indeterminate(Indeterminate::new(
        IndeterminateCause::NotReplicated,
        format!(
            "{} of {wanted} replicas confirmed within {within:?}",
            confirmed.unwrap_or(0)
        ),
    ))
}

/// Turns an undecodable reply into `Indeterminate`: the script may have run.
fn unreadable(err: decode::UnexpectedReply) -> Failure {
    Failure::Indeterminate(Indeterminate::new(
        IndeterminateCause::UnexpectedReply,
        err.to_string(),
    ))
}

impl RedisBackend {
    /// Runs `release.lua` for `attempt`'s grant with `fence`, or with whatever fence it
    /// carries (`None`).
    ///
    /// The release of a grant goes by EVALSHA. The release of an attempt's grant whatever its
    /// fence is the cleanup behind an unanswered acquire, and goes by EVAL with the script's
    /// source: a stalled server may run it only after this client has gone, when a NOSCRIPT
    /// would have nobody to load the script and send it again.
    async fn release_script(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        attempt: &Attempt,
        fence: Option<leasehold::FenceToken>,
    ) -> ReleaseReply {
        let lease_key = self.keys.lease_key(purpose, resource);
        let channel = self.keys.release_channel(purpose, resource);
        let args = |cmd: &mut redis::Cmd| {
            cmd.arg(2)
                .arg(&lease_key)
                .arg(&channel)
                .arg(attempt.owner_token().expose_secret())
                .arg(attempt.operation().as_str());
            match fence {
                Some(fence) => cmd.arg(fence.get()),
                None => cmd.arg(""),
            };
            cmd.arg(if self.sharded { "1" } else { "0" });
        };
        let reply = match fence {
            Some(_) => self.link.eval(&scripts::RELEASE, None, args).await,
            None => self
                .link
                .eval_source(&scripts::RELEASE, args)
                .await
                .map(|value| (value, None)),
        };
        match reply {
            Ok((value, _)) => {
                decode::release(&value).unwrap_or_else(|e| ReleaseReply::Failed(unreadable(e)))
            }
            Err(failure) => ReleaseReply::Failed(failure),
        }
    }
}

impl LeaseBackend for RedisBackend {
    async fn acquire(&self, request: &LeaseRequest) -> AcquireReply {
        let lease_key = self.keys.lease_key(request.purpose(), request.resource());
        let fence_key = self.keys.fence_key(request.purpose(), request.resource());
        let attempt = request.attempt();
        let gate = self.settings.replication();
        let reply = self
            .link
            .eval(&scripts::ACQUIRE, gate, |cmd| {
                cmd.arg(2)
                    .arg(&lease_key)
                    .arg(&fence_key)
                    .arg(attempt.owner_token().expose_secret())
                    .arg(attempt.operation().as_str())
                    .arg(request.ttl_millis());
            })
            .await;
        match reply {
            Ok((value, confirmed)) => {
                match decode::acquire(&value, self.settings.retry_after_fallback()) {
                    Ok(AcquireReply::Granted(_) | AcquireReply::Replayed(_))
                        if !replicated(gate, confirmed) =>
                    {
                        AcquireReply::Failed(not_replicated(gate, confirmed))
                    }
                    Ok(reply) => reply,
                    Err(e) => AcquireReply::Failed(unreadable(e)),
                }
            }
            Err(failure) => AcquireReply::Failed(failure),
        }
    }

    async fn renew(&self, grant: &Grant) -> RenewReply {
        let lease_key = self.keys.lease_key(grant.purpose(), grant.resource());
        let attempt = grant.attempt();
        let gate = self.settings.replication();
        let reply = self
            .link
            .eval(&scripts::RENEW, gate, |cmd| {
                cmd.arg(1)
                    .arg(&lease_key)
                    .arg(attempt.owner_token().expose_secret())
                    .arg(attempt.operation().as_str())
                    .arg(grant.fence().get())
                    .arg(grant.ttl_millis());
            })
            .await;
        match reply {
            Ok((value, confirmed)) => match decode::renew(&value) {
                // The key's TTL was extended on the primary only: a failover now could bring
                // back the old, shorter TTL, so the extension is not proven.
                Ok(RenewReply::Renewed { .. }) if !replicated(gate, confirmed) => {
                    RenewReply::Failed(not_replicated(gate, confirmed))
                }
                Ok(reply) => reply,
                Err(e) => RenewReply::Failed(unreadable(e)),
            },
            Err(failure) => RenewReply::Failed(failure),
        }
    }

    async fn release(&self, grant: &Grant) -> ReleaseReply {
        self.release_script(
            grant.purpose(),
            grant.resource(),
            grant.attempt(),
            Some(grant.fence()),
        )
        .await
    }

    async fn release_attempt(&self, request: &LeaseRequest) -> ReleaseReply {
        // One script on the connection the acquires went on, behind them: a late grant is
        // undone the moment it is made.
        self.release_script(
            request.purpose(),
            request.resource(),
            request.attempt(),
            None,
        )
        .await
    }

    fn watch(&self, purpose: &Purpose, resource: &ResourceDigest) -> leasehold::ReleaseWatch {
        self.notices
            .watch(self.keys.release_channel(purpose, resource))
    }

    async fn inspect(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        attempt: Option<&Attempt>,
    ) -> InspectOutcome {
        let lease_key = self.keys.lease_key(purpose, resource);
        let fence_key = self.keys.fence_key(purpose, resource);
        let (token, operation) = attempt.map_or(("", ""), |a| {
            (a.owner_token().expose_secret(), a.operation().as_str())
        });
        let reply = self
            .link
            .eval(&scripts::INSPECT, None, |cmd| {
                cmd.arg(2)
                    .arg(&lease_key)
                    .arg(&fence_key)
                    .arg(token)
                    .arg(operation);
            })
            .await;
        match reply {
            Ok((value, _)) => decode::inspect(&value).unwrap_or_else(|e| unreadable(e).into()),
            Err(failure) => failure.into(),
        }
    }
}
