//! One URL for every topology: which deployment a URL names, checked before any I/O.
//!
//! - `redis://[user:password@]host[:port][/db]`, `rediss://…` (TLS), `unix:///path[?db=N]`: a
//!   standalone server, handed to redis-rs as written;
//! - `redis+sentinel://[user:password@]host[:port][,host[:port]…]/service[/db]` (and
//!   `rediss+sentinel://`): the master the Sentinels name for `service`; the credentials are
//!   the master's, `?sentinel_username=…&sentinel_password=…` the Sentinels' own;
//! - `redis+cluster://[user:password@]host[:port][,host[:port]…]` (and `rediss+cluster://`): a
//!   Cluster reached through those seeds, the credentials used on every node.
//!
//! Every refusal says what is wrong (the scheme, a host, a port, the service, the database
//! index) and never repeats the URL or its credentials, which may hold a password.

use crate::Error;

/// The ports Sentinel and Redis listen on unless told otherwise.
const SENTINEL_PORT: &str = "26379";
const REDIS_PORT: &str = "6379";

/// The deployment a URL names, as the URLs and settings each constructor takes.
pub(crate) enum Topology {
    /// A standalone server: the URL as written.
    Standalone(String),
    /// A master found through Sentinel.
    Sentinel {
        sentinels: Vec<String>,
        service: String,
        node: redis::sentinel::SentinelNodeConnectionInfo,
    },
    /// A Cluster, through its seeds.
    Cluster { seeds: Vec<String> },
}

/// The schemes accepted, for the message that refuses another.
const SCHEMES: &str = "redis://, rediss://, unix://, redis+sentinel://, rediss+sentinel://, \
                       redis+cluster:// or rediss+cluster://";

/// Parses `url` into the topology it names.
///
/// # Errors
///
/// [`Error::InvalidUrl`], saying which part is wrong and never repeating the URL.
pub(crate) fn parse(url: &str) -> Result<Topology, Error> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(invalid(format!(
            "it does not start with a scheme: use {SCHEMES}"
        )));
    };
    let scheme = scheme.to_ascii_lowercase();
    let (tls, kind) = match scheme.as_str() {
        "redis" | "valkey" => (false, Kind::Standalone),
        "rediss" | "valkeys" => (true, Kind::Standalone),
        "unix" | "redis+unix" | "valkey+unix" => return Ok(Topology::Standalone(url.to_owned())),
        "redis+sentinel" | "valkey+sentinel" => (false, Kind::Sentinel),
        "rediss+sentinel" | "valkeys+sentinel" => (true, Kind::Sentinel),
        "redis+cluster" | "valkey+cluster" => (false, Kind::Cluster),
        "rediss+cluster" | "valkeys+cluster" => (true, Kind::Cluster),
        _ => {
            // A scheme never holds a secret; shown so that a typo is plain to see. Bounded,
            // and only if it is a plausible scheme.
            let shown = if scheme.len() <= 32
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
            {
                format!("the scheme {scheme}:// is not one leasehold speaks")
            } else {
                "the scheme is not one leasehold speaks".to_owned()
            };
            return Err(invalid(format!("{shown}: use {SCHEMES}")));
        }
    };
    let parts = Parts::split(rest);
    let hosts = parts.hosts()?;
    match kind {
        Kind::Standalone => {
            if hosts.len() > 1 {
                return Err(invalid(
                    "it names several hosts: use redis+cluster:// for a Cluster or \
                     redis+sentinel://…/service for Sentinel",
                ));
            }
            database(parts.path.trim_start_matches('/'))?;
            Ok(Topology::Standalone(url.to_owned()))
        }
        Kind::Cluster => {
            let db = parts.path.trim_start_matches('/');
            if !db.is_empty() && database(db)? != 0 {
                return Err(invalid("a Cluster has database 0 only"));
            }
            let seeds = hosts
                .iter()
                .map(|host| parts.node_url(tls, host, REDIS_PORT, "", &parts.query))
                .collect();
            Ok(Topology::Cluster { seeds })
        }
        Kind::Sentinel => sentinel(tls, &parts, &hosts),
    }
}

/// The transport a URL's `?transport=direct` or `?transport=redis-rs` asks for, if it asks.
///
/// # Errors
///
/// [`Error::InvalidUrl`] for another value (not repeated: it is short, but could be a
/// mistyped secret).
pub(crate) fn transport(url: &str) -> Result<Option<crate::Transport>, Error> {
    let Some((_, rest)) = url.split_once("://") else {
        return Ok(None);
    };
    let parts = Parts::split(rest);
    let Some(value) = parts
        .query
        .iter()
        .find_map(|p| p.strip_prefix("transport="))
    else {
        return Ok(None);
    };
    crate::Transport::parse(value)
        .map(Some)
        .map_err(|_| invalid("its transport is neither direct nor redis-rs"))
}

#[derive(Clone, Copy)]
enum Kind {
    Standalone,
    Sentinel,
    Cluster,
}

/// A URL after its scheme, cut into its parts (nothing decoded).
struct Parts<'a> {
    /// Up to the last `@`, without it: everything before it is taken as credentials, so a
    /// password with an unescaped `/`, `?` or `#` stays whole (as the CLI's masking does).
    credentials: Option<&'a str>,
    location: &'a str,
    path: &'a str,
    /// The query's parameters, without the `?`.
    query: Vec<&'a str>,
    /// With its `#`, or empty.
    fragment: &'a str,
}

impl<'a> Parts<'a> {
    fn split(rest: &'a str) -> Self {
        let (credentials, after) = match rest.rsplit_once('@') {
            Some((credentials, after)) => (Some(credentials), after),
            None => (None, rest),
        };
        let (before_fragment, fragment) = match after.find('#') {
            Some(at) => after.split_at(at),
            None => (after, ""),
        };
        let (before_query, query) = before_fragment
            .split_once('?')
            .unwrap_or((before_fragment, ""));
        let (location, path) = match before_query.find('/') {
            Some(at) => before_query.split_at(at),
            None => (before_query, ""),
        };
        Self {
            credentials,
            location,
            path,
            query: query.split('&').filter(|p| !p.is_empty()).collect(),
            fragment,
        }
    }

    /// The hosts, each checked: not empty, a port from 1 to 65535 if one is given.
    fn hosts(&self) -> Result<Vec<&'a str>, Error> {
        let hosts: Vec<&str> = self.location.split(',').collect();
        for (i, host) in hosts.iter().enumerate() {
            let which = if hosts.len() == 1 {
                "the host".to_owned()
            } else {
                format!("host {} of {}", i + 1, hosts.len())
            };
            let (name, port) = split_port(host);
            if name.is_empty() || name == "[]" {
                return Err(invalid(format!("{which} is empty")));
            }
            if let Some(port) = port
                && !matches!(port.parse::<u16>(), Ok(1..))
            {
                // Not repeated: text in the port's place may be a mistyped password.
                return Err(invalid(format!(
                    "the port of {which} is not a number from 1 to 65535"
                )));
            }
        }
        Ok(hosts)
    }

    /// The URL of one node: this URL's scheme (without its topology), credentials, query and
    /// fragment, `host` with `default_port` unless it names one, and `path`.
    fn node_url(
        &self,
        tls: bool,
        host: &str,
        default_port: &str,
        path: &str,
        query: &[&str],
    ) -> String {
        let scheme = if tls { "rediss" } else { "redis" };
        let credentials = self
            .credentials
            .map(|c| format!("{c}@"))
            .unwrap_or_default();
        let port = match split_port(host).1 {
            Some(_) => String::new(),
            None => format!(":{default_port}"),
        };
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        format!(
            "{scheme}://{credentials}{host}{port}{path}{query}{}",
            self.fragment
        )
    }
}

/// `host:port` → (`host`, `Some(port)`); an IPv6 address in brackets keeps its colons.
fn split_port(host: &str) -> (&str, Option<&str>) {
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => match host[end + 1..].strip_prefix(':') {
                Some(port) => (&host[..=end], Some(port)),
                None => (host, None),
            },
            None => (host, None),
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    }
}

/// A database index: empty (0) or a whole number Redis can select (it takes a 32-bit
/// signed index; whether this server has that many databases only it can say).
fn database(text: &str) -> Result<i64, Error> {
    if text.is_empty() {
        return Ok(0);
    }
    match text.parse::<i32>() {
        Ok(db) if db >= 0 && text.bytes().all(|b| b.is_ascii_digit()) => Ok(i64::from(db)),
        _ => Err(invalid(
            "the database index is not a whole number from 0 to 2147483647",
        )),
    }
}

fn sentinel(tls: bool, parts: &Parts<'_>, hosts: &[&str]) -> Result<Topology, Error> {
    let path = parts.path.trim_start_matches('/');
    let (service, db) = path.split_once('/').unwrap_or((path, ""));
    if service.is_empty() {
        return Err(invalid(
            "it names no service: redis+sentinel://host:26379[,host:26379…]/SERVICE[/db]",
        ));
    }
    let db = database(db.trim_end_matches('/'))?;
    // The Sentinels' own credentials come from the query; the rest of it is the master's.
    let (sentinel_params, node_params): (Vec<&str>, Vec<&str>) = parts
        .query
        .iter()
        .partition(|p| p.starts_with("sentinel_username=") || p.starts_with("sentinel_password="));
    let sentinel_credentials = {
        let value = |key: &str| {
            sentinel_params
                .iter()
                .find_map(|p| p.strip_prefix(key))
                .unwrap_or("")
        };
        let (user, password) = (value("sentinel_username="), value("sentinel_password="));
        match (user, password) {
            ("", "") => None,
            (user, "") => Some(user.to_owned()),
            (user, password) => Some(format!("{user}:{password}")),
        }
    };
    let sentinel_parts = Parts {
        credentials: sentinel_credentials.as_deref(),
        location: parts.location,
        path: "",
        query: Vec::new(),
        fragment: parts.fragment,
    };
    let sentinels = hosts
        .iter()
        .map(|host| sentinel_parts.node_url(tls, host, SENTINEL_PORT, "", &[]))
        .collect();
    // The master's settings, parsed by redis-rs from a URL of the same credentials, database
    // and query (so that percent-escapes are decoded as for any URL); its host is a stand-in.
    let master = parts.node_url(
        false,
        "localhost",
        REDIS_PORT,
        &format!("/{db}"),
        &node_params,
    );
    let info = redis::IntoConnectionInfo::into_connection_info(master.as_str())
        .map_err(|e| invalid(format!("{} in the master's settings", e.category())))?;
    let mut node = redis::sentinel::SentinelNodeConnectionInfo::default()
        .set_redis_connection_info(info.redis_settings().clone());
    if tls {
        let mode = if parts.fragment == "#insecure" {
            redis::TlsMode::Insecure
        } else {
            redis::TlsMode::Secure
        };
        node = node.set_tls_mode(mode);
    }
    Ok(Topology::Sentinel {
        sentinels,
        service: service.to_owned(),
        node,
    })
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidUrl(reason.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(url: &str) -> String {
        match parse(url) {
            Err(Error::InvalidUrl(reason)) => reason,
            Err(other) => panic!("{url}: {other:?}"),
            Ok(_) => panic!("{url}: accepted"),
        }
    }

    #[test]
    fn each_refusal_says_what_is_wrong_without_the_password() {
        let cases = [
            ("127.0.0.1:6379", "does not start with a scheme"),
            ("http://h:1", "the scheme http:// is not one"),
            (
                "redis://:hunter2@h:notaport",
                "port of the host is not a number",
            ),
            ("redis://:hunter2@h:0", "port of the host is not a number"),
            (
                "redis://:hunter2@h:70000",
                "port of the host is not a number",
            ),
            ("redis://:hunter2@:6379", "the host is empty"),
            (
                "redis://:hunter2@h/x",
                "database index is not a whole number",
            ),
            (
                "redis://:hunter2@h/-1",
                "database index is not a whole number",
            ),
            (
                "redis://:hunter2@h/99999999999",
                "database index is not a whole",
            ),
            (
                "redis://:hunter2@a,b",
                "several hosts: use redis+cluster://",
            ),
            ("redis+sentinel://:hunter2@a,b", "names no service"),
            (
                "redis+sentinel://a:1,b:x/m",
                "port of host 2 of 2 is not a number",
            ),
            ("redis+sentinel://a,,b/m", "host 2 of 3 is empty"),
            ("redis+sentinel://a/m/x", "database index"),
            ("redis+cluster://:hunter2@a:1,b:2/3", "database 0 only"),
        ];
        for (url, needle) in cases {
            let reason = reason(url);
            assert!(reason.contains(needle), "{url}: {reason}");
            assert!(!reason.contains("hunter2"), "{url}: {reason}");
            assert!(!reason.contains(url), "{url}: {reason}");
        }
    }

    #[test]
    fn a_transport_is_read_from_any_url() {
        use crate::Transport;
        assert_eq!(transport("redis://h:1").unwrap(), None);
        assert_eq!(
            transport("redis://h:1/2?transport=redis-rs").unwrap(),
            Some(Transport::RedisRs)
        );
        assert_eq!(
            transport("unix:///tmp/r.sock?db=1&transport=direct").unwrap(),
            Some(Transport::Direct)
        );
        assert_eq!(
            transport("redis+sentinel://u:p?w@h:1/svc?transport=redis-rs").unwrap(),
            Some(Transport::RedisRs)
        );
        let refused = transport("redis://h:1?transport=tcp").unwrap_err();
        assert!(!refused.to_string().contains("tcp"), "{refused}");
    }

    #[test]
    fn standalone_urls_pass_through_as_written() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis://:p%40ss@h:6379/3",
            "rediss://alice:pw@h#insecure",
            "unix:///run/redis.sock?db=2",
            "redis://[::1]:6379/0",
            "valkey://h",
        ] {
            assert!(
                matches!(parse(url), Ok(Topology::Standalone(u)) if u == url),
                "{url}"
            );
        }
    }

    #[test]
    fn a_cluster_url_becomes_one_seed_per_host_with_the_credentials() {
        let Ok(Topology::Cluster { seeds }) =
            parse("rediss+cluster://u:p@h1:7000,h2,[::1]:7002?protocol=resp3#insecure")
        else {
            panic!("not a cluster");
        };
        assert_eq!(
            seeds,
            [
                "rediss://u:p@h1:7000?protocol=resp3#insecure",
                "rediss://u:p@h2:6379?protocol=resp3#insecure",
                "rediss://u:p@[::1]:7002?protocol=resp3#insecure",
            ]
        );
    }

    #[test]
    fn a_sentinel_url_names_the_sentinels_the_service_and_the_master_settings() {
        let Ok(Topology::Sentinel {
            sentinels,
            service,
            node,
        }) = parse("redis+sentinel://u:p%40w@h1:26380,h2/mymaster/2?sentinel_password=s")
        else {
            panic!("not sentinel");
        };
        assert_eq!(sentinels, ["redis://:s@h1:26380", "redis://:s@h2:26379"]);
        assert_eq!(service, "mymaster");
        let settings = format!("{node:?}");
        // The master's settings carry its credentials, decoded, and its database.
        assert!(settings.contains("db: 2"), "{settings}");
        let Ok(Topology::Sentinel { sentinels, .. }) = parse("rediss+sentinel://h/m#insecure")
        else {
            panic!("not sentinel");
        };
        assert_eq!(sentinels, ["rediss://h:26379#insecure"]);
    }
}
