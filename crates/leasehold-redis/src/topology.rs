//! Making a [`RedisBackend`] for each topology: a standalone server (TCP, TLS or a Unix
//! socket), a master found through Sentinel, or a Cluster.
//!
//! No constructor does I/O: each checks its URLs, builds the redis-rs client, the connector the
//! scripts will run through and the release-notice subscriber for that topology, and leaves
//! the first connection to the first command (or to [`RedisBackend::warm_up`]). A URL is never
//! repeated in an error, since it may hold a password.

use crate::notices;
use crate::{Error, RedisBackend, RedisSettings};
use crate::{clients, link};

impl RedisBackend {
    /// Makes a backend for the deployment `url` names, whichever its topology. No I/O: the
    /// connection is made by the first command, or by [`warm_up`](Self::warm_up).
    ///
    /// - `redis://[user:password@]host[:port][/db]`, `rediss://…` (TLS), `unix:///path`: a
    ///   standalone server;
    /// - `redis+sentinel://[user:password@]host[:port][,host[:port]…]/service[/db]` (and
    ///   `rediss+sentinel://`): the master the Sentinels name for `service`, as
    ///   [`open_sentinel`](Self::open_sentinel) finds it. The credentials are the master's;
    ///   `?sentinel_username=…&sentinel_password=…` are the Sentinels' own;
    /// - `redis+cluster://[user:password@]host[:port][,host[:port]…]` (and
    ///   `rediss+cluster://`): a Cluster through those seeds, as
    ///   [`open_cluster`](Self::open_cluster) reaches it, the credentials used on every node.
    ///
    /// A port left out is 6379 (26379 for a Sentinel). `valkey` may stand for `redis` in each
    /// scheme. `?transport=direct` or `?transport=redis-rs` in any of them sets
    /// [`RedisSettings::with_transport`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] if `url` cannot be parsed, saying which part is wrong (scheme,
    /// host, port, service, database index) without repeating the URL;
    /// [`Error::Unsupported`] for TLS without the `tls` feature, or what
    /// [`open_cluster`](Self::open_cluster) refuses.
    pub fn open(url: &str, settings: RedisSettings) -> Result<Self, Error> {
        let settings = match crate::url::transport(url)? {
            Some(transport) => settings.with_transport(transport),
            None => settings,
        };
        match crate::url::parse(url)? {
            crate::url::Topology::Standalone(url) => Self::open_standalone(&url, settings),
            crate::url::Topology::Cluster { seeds } => Self::open_cluster(&seeds, settings),
            crate::url::Topology::Sentinel {
                sentinels,
                service,
                node,
            } => {
                tls_available(&sentinels)?;
                if settings.tls_root_certificates().is_some() && any_tls(&sentinels) {
                    // Refused rather than ignored: the handshake would fail later, with the
                    // private CA the caller set seemingly unused.
                    return Err(Error::Unsupported(
                        "TLS root certificates (a private CA) with Sentinel: only standalone \
                         servers and Clusters apply them"
                            .into(),
                    ));
                }
                Self::open_sentinel(&sentinels, &service, Some(node), settings)
            }
        }
    }

    /// A standalone server (TCP, TLS or a Unix socket).
    fn open_standalone(url: &str, settings: RedisSettings) -> Result<Self, Error> {
        let client = standalone_client(url, &settings)?;
        let endpoint = client.get_connection_info().addr().to_string();
        let notices = notices::Notices::new(
            notices::Source::Single(Box::new(client.clone())),
            settings.connect_timeout(),
        );
        let connector = link::Connector::Single {
            client,
            config: connection_config(&settings),
            response_timeout: settings.command_timeout(),
            transport: settings.transport(),
        };
        Ok(Self::from_parts(connector, notices, settings, endpoint))
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
        let seeds = connection_infos(seeds, "a cluster needs at least one seed")?;
        tls_available(&seeds)?;
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
        let roots = settings.tls_root_certificates().map(<[u8]>::to_vec);
        let client = clients::cluster_builder(seeds.clone(), roots.as_deref())
            .retries(0)
            .response_timeout(settings.command_timeout())
            .connection_timeout(settings.connect_timeout())
            .build()
            .map_err(|e| invalid_url(&e))?;
        let notices = notices::Notices::new(
            notices::Source::Cluster { seeds, roots },
            settings.connect_timeout(),
        );
        let connector = link::Connector::Cluster(client);
        Ok(Self::from_parts(connector, notices, settings, endpoint))
    }

    /// Makes a backend for the master that the Sentinels at `sentinels` (their `redis://`
    /// URLs) name for `service`. No I/O.
    ///
    /// Every new connection asks the Sentinels for the current master (and checks with `ROLE`
    /// that it agrees). A connection is dropped after it is lost, after a `READONLY` reply (a
    /// demoted master) or after a response timeout (a stalled one), so the command after a
    /// failover reaches the new master. Beside every lease command the Sentinels are asked
    /// which master they name (`SENTINEL GET-MASTER-ADDR-BY-NAME`, the first that answers in
    /// the order given): an answer from another master — a replaced one, which keeps answering
    /// until it is demoted — does not count, and the command is sent again to the named one,
    /// whose answer stands. With no Sentinel answering, the outcome is `Indeterminate`
    /// (`MasterUnconfirmed`). `node` carries the master's credentials or TLS
    /// settings when they differ from none; the Sentinels' own go in their URLs.
    ///
    /// A failover can lose the writes the old master had not yet replicated: a lease may then
    /// be granted twice and a fence issued twice. See docs/operating-redis.md.
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
        let infos = connection_infos(sentinels, "Sentinel needs at least one address")?;
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
        let sentinels = crate::sentinels::Sentinels::new(
            &infos,
            service,
            settings.connect_timeout(),
            settings.command_timeout(),
        )
        .map_err(|e| invalid_url(&e))?;
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
            sentinels: std::sync::Arc::new(sentinels),
            config: connection_config(&settings),
            response_timeout: settings.command_timeout(),
            transport: settings.transport(),
        };
        Ok(Self::from_parts(connector, notices, settings, endpoint))
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
    clients::install_crypto_provider();
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

/// Refuses TLS addresses when the `tls` feature is not compiled in (redis-rs would only fail
/// at the first connection).
fn tls_available<T: redis::IntoConnectionInfo + Clone>(urls: &[T]) -> Result<(), Error> {
    if any_tls(urls) && !cfg!(feature = "tls") {
        return Err(Error::Unsupported(
            "TLS (rediss) needs leasehold-redis's `tls` feature".into(),
        ));
    }
    Ok(())
}

/// Whether any of `urls` is a TLS address.
fn any_tls<T: redis::IntoConnectionInfo + Clone>(urls: &[T]) -> bool {
    urls.iter().any(|url| {
        url.clone()
            .into_connection_info()
            .is_ok_and(|info| matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }))
    })
}

/// The timeouts of a standalone or Sentinel-found connection.
fn connection_config(settings: &RedisSettings) -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(settings.command_timeout()))
        .set_connection_timeout(Some(settings.connect_timeout()))
}

/// Describes a URL error without the URL, which may hold a password.
/// Parses `urls`, refusing an empty list with `none`.
fn connection_infos<S: AsRef<str>>(
    urls: &[S],
    none: &str,
) -> Result<Vec<redis::ConnectionInfo>, Error> {
    let infos = urls
        .iter()
        .map(|url| redis::IntoConnectionInfo::into_connection_info(url.as_ref()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid_url(&e))?;
    if infos.is_empty() {
        return Err(Error::InvalidUrl(none.into()));
    }
    Ok(infos)
}

fn invalid_url(err: &redis::RedisError) -> Error {
    Error::InvalidUrl(format!("{} (URL not shown)", err.category()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn an_empty_seed_or_sentinel_list_is_refused_before_any_io() {
        let none: &[&str] = &[];
        let cluster = RedisBackend::open_cluster(none, RedisSettings::default()).unwrap_err();
        assert!(
            matches!(&cluster, Error::InvalidUrl(m) if m.contains("at least one seed")),
            "{cluster:?}"
        );
        let sentinel =
            RedisBackend::open_sentinel(none, "mymaster", None, RedisSettings::default())
                .unwrap_err();
        assert!(
            matches!(&sentinel, Error::InvalidUrl(m) if m.contains("at least one address")),
            "{sentinel:?}"
        );
        let unparsable = RedisBackend::open_cluster(&["not a url"], RedisSettings::default());
        assert_eq!(unparsable.unwrap_err().kind(), ErrorKind::InvalidUrl);
    }

    #[cfg(feature = "tls")]
    #[test]
    fn a_private_ca_with_a_tls_sentinel_is_refused_before_any_io() {
        let pem = b"-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n".to_vec();
        let settings = RedisSettings::default()
            .with_tls_root_certificates(pem)
            .unwrap();
        let tls = RedisBackend::open("rediss+sentinel://127.0.0.1:1/mymaster", settings.clone());
        let refused = tls.expect_err("refused");
        assert_eq!(refused.kind(), ErrorKind::Unsupported, "{refused:?}");
        assert!(refused.to_string().contains("Sentinel"), "{refused}");
        // Without TLS the roots do not matter, as for a standalone server.
        assert!(RedisBackend::open("redis+sentinel://127.0.0.1:1/mymaster", settings).is_ok());
    }
}
