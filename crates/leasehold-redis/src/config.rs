//! [`RedisConfig`]: a backend from configuration (a file, the environment), whichever its
//! topology, with serde (feature `serde`).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::{Error, RedisBackend, RedisSettings};

/// Where the leases live and how to reach them, as configuration: the URL picks the topology
/// (standalone, Sentinel or Cluster, as [`RedisBackend::open`] reads it), and the other fields
/// are the [`RedisSettings`] most deployments set. Durations are written as humantime text
/// (`"200ms"`, `"1s"`). Unknown fields are refused, so that a misspelt setting is an error
/// rather than a default.
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use leasehold_redis::RedisConfig;
///
/// let config: RedisConfig = serde_json::from_str(r#"{
///     "url": "redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster",
///     "namespace": "billing",
///     "command_timeout": "150ms"
/// }"#)?;
/// let backend = config.open()?; // no I/O yet
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// The deployment, in any form [`RedisBackend::open`] takes.
    pub url: String,
    /// [`RedisSettings::with_namespace`]; `leasehold` if unset.
    #[serde(default)]
    pub namespace: Option<String>,
    /// [`RedisSettings::with_command_timeout`].
    #[serde(default, deserialize_with = "duration")]
    pub command_timeout: Option<Duration>,
    /// [`RedisSettings::with_connect_timeout`].
    #[serde(default, deserialize_with = "duration")]
    pub connect_timeout: Option<Duration>,
    /// [`RedisSettings::with_max_in_flight`].
    #[serde(default)]
    pub max_in_flight: Option<usize>,
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may hold a password: only its scheme is shown.
        let scheme = self.url.split_once("://").map_or("?", |(scheme, _)| scheme);
        f.debug_struct("RedisConfig")
            .field("url", &format_args!("{scheme}://…"))
            .field("namespace", &self.namespace)
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_in_flight", &self.max_in_flight)
            .finish()
    }
}

impl RedisConfig {
    /// A configuration of `url` and default settings.
    pub fn from_url(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            namespace: None,
            command_timeout: None,
            connect_timeout: None,
            max_in_flight: None,
        }
    }

    /// The settings this configuration sets, over the defaults.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`]: what the [`RedisSettings`] setter of a field refuses.
    pub fn settings(&self) -> Result<RedisSettings, Error> {
        self.settings_over(RedisSettings::default())
            .map_err(|e| Error::InvalidSetting(e.to_string()))
    }

    fn settings_over(
        &self,
        mut settings: RedisSettings,
    ) -> Result<RedisSettings, leasehold::Error> {
        if let Some(namespace) = &self.namespace {
            settings = settings.with_namespace(namespace)?;
        }
        if let Some(timeout) = self.command_timeout {
            settings = settings.with_command_timeout(timeout)?;
        }
        if let Some(timeout) = self.connect_timeout {
            settings = settings.with_connect_timeout(timeout)?;
        }
        if let Some(limit) = self.max_in_flight {
            settings = settings.with_max_in_flight(limit)?;
        }
        Ok(settings)
    }

    /// Makes the backend: [`RedisBackend::open`] of the URL with [`settings`](Self::settings).
    /// No I/O.
    ///
    /// # Errors
    ///
    /// What [`settings`](Self::settings) or [`RedisBackend::open`] refuses.
    pub fn open(&self) -> Result<RedisBackend, Error> {
        RedisBackend::open(&self.url, self.settings()?)
    }
}

/// An optional duration written as humantime text.
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("{text:?} is not a duration: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_picks_the_topology_from_its_url_and_sets_the_settings() {
        let config: RedisConfig = serde_json::from_str(
            r#"{"url":"redis+cluster://:hunter2@127.0.0.1:7000,127.0.0.1:7001",
                "namespace":"billing","command_timeout":"150ms","connect_timeout":"2s",
                "max_in_flight":64}"#,
        )
        .unwrap();
        let backend = config.open().unwrap();
        let settings = backend.settings();
        assert_eq!(settings.namespace(), "billing");
        assert_eq!(settings.command_timeout(), Duration::from_millis(150));
        assert_eq!(settings.connect_timeout(), Duration::from_secs(2));
        assert_eq!(settings.max_in_flight(), 64);
        // The cluster's seeds, and never the password.
        let shown = format!("{backend:?} {config:?}");
        assert!(shown.contains("127.0.0.1:7000,127.0.0.1:7001"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn a_bad_field_is_refused() {
        for (json, needle) in [
            (r#"{"url":"redis://h","namespce":"x"}"#, "unknown field"),
            (
                r#"{"url":"redis://h","command_timeout":"soon"}"#,
                "not a duration",
            ),
            (r#"{"namespace":"x"}"#, "missing field `url`"),
        ] {
            let err = serde_json::from_str::<RedisConfig>(json).unwrap_err();
            assert!(err.to_string().contains(needle), "{json}: {err}");
        }
        let bad = RedisConfig {
            namespace: Some("a:b".into()),
            ..RedisConfig::from_url("redis://h")
        };
        let err = bad.open().unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidSetting);
        assert!(err.to_string().contains("namespace"), "{err}");
    }
}
