//! Settings of the Redis backend, validated before any I/O.

use std::time::Duration;

use leasehold::{Error, ErrorKind, Failure, Indeterminate, IndeterminateCause};

/// Settings of a [`crate::RedisBackend`].
///
/// Defaults are those of the original design: command timeout 200 ms, contention retry-after
/// fallback 50 ms; namespace `leasehold`, key version `v1`, at most 1024 commands in flight;
/// and fence counters that expire after 7 days idle
/// ([`with_counter_idle_expiry`](Self::with_counter_idle_expiry)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    namespace: String,
    key_version: String,
    command_timeout: Duration,
    connect_timeout: Duration,
    retry_after_fallback: Duration,
    max_in_flight: usize,
    counter_idle_expiry: Duration,
    replication: Option<ReplicationGate>,
    tls_root: Option<RootCertificates>,
    transport: Transport,
}

/// How commands reach a standalone server or a Sentinel-named master (D49).
///
/// Both give the same outcomes for the same events, with one difference that only the direct
/// connection can know: a command it refuses before writing a byte (the connection had closed,
/// or too many commands wait for a stalled server) is not applied (`Unavailable`,
/// `NotConnected`), where redis-rs reports the same refusal as a dropped connection and so as
/// unknown. TLS, RESP3 and Clusters always go through redis-rs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Transport {
    /// leasehold's own connection: each command is written by the task that sends it, one
    /// reader task hands out the replies (plain TCP or a Unix socket, RESP2). The default.
    #[default]
    Direct,
    /// redis-rs's multiplexed connection, whose own task writes every command.
    RedisRs,
}

impl Transport {
    /// The name a URL's `?transport=` takes: `direct` or `redis-rs`.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Direct => "direct",
            Transport::RedisRs => "redis-rs",
        }
    }

    /// Reads a name [`as_str`](Self::as_str) gives.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] for any other text.
    pub fn parse(name: &str) -> Result<Self, Error> {
        match name {
            "direct" => Ok(Transport::Direct),
            "redis-rs" => Ok(Transport::RedisRs),
            _ => Err(invalid("transport must be direct or redis-rs".to_owned())),
        }
    }
}

/// PEM certificates a `rediss://` server's certificate must chain to, instead of the system's.
#[derive(Clone, PartialEq, Eq)]
struct RootCertificates(Vec<u8>);

impl std::fmt::Debug for RootCertificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RootCertificates({} bytes of PEM)", self.0.len())
    }
}

/// How many replicas must confirm a grant or renewal (`WAIT`) before it counts as applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicationGate {
    replicas: u32,
    timeout: Duration,
}

impl ReplicationGate {
    /// Returns how many replicas must confirm.
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// Returns how long the primary waits for them.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl Default for RedisSettings {
    fn default() -> Self {
        Self {
            namespace: "leasehold".to_owned(),
            key_version: "v1".to_owned(),
            command_timeout: Duration::from_millis(200),
            connect_timeout: Duration::from_millis(1000),
            retry_after_fallback: Duration::from_millis(50),
            max_in_flight: 1024,
            counter_idle_expiry: DEFAULT_COUNTER_IDLE_EXPIRY,
            replication: None,
            tls_root: None,
            transport: Transport::Direct,
        }
    }
}

/// How long a fence counter is kept after its last grant, by default: a week.
const DEFAULT_COUNTER_IDLE_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);

/// The shortest counter idle expiry. The TTL counts from the script's start and the fence is
/// the clock read a little later, so the idle time must dwarf a script's run (microseconds to
/// a few milliseconds); a second does, and nothing needs a counter to go sooner.
const MIN_COUNTER_IDLE_EXPIRY: Duration = Duration::from_secs(1);

/// The longest counter idle expiry: a year, longer than any reason to keep an idle counter.
const MAX_COUNTER_IDLE_EXPIRY: Duration = Duration::from_secs(365 * 24 * 3600);

fn invalid(message: String) -> Error {
    Error::new(ErrorKind::InvalidSetting, message)
}

fn check_duration(name: &str, value: Duration, max: Duration) -> Result<(), Error> {
    if value.is_zero() || value > max {
        return Err(invalid(format!(
            "{name} must be above zero and at most {max:?}, got {value:?}"
        )));
    }
    Ok(())
}

/// The `WAIT` must answer within the command timeout, with room for the round trip.
fn check_gate_fits(gate: Duration, command_timeout: Duration) -> Result<(), Error> {
    if gate >= command_timeout {
        return Err(invalid(format!(
            "replication timeout ({gate:?}) must be below the command timeout \
             ({command_timeout:?})"
        )));
    }
    Ok(())
}

impl RedisSettings {
    /// Returns the default settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the namespace every key starts with: `[A-Za-z0-9._-]{1,64}` (no `:`, no braces,
    /// so that it can neither fake a key segment nor a hash tag).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if `namespace` is outside that charset or length.
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Result<Self, Error> {
        let namespace = namespace.into();
        let ok = !namespace.is_empty()
            && namespace.len() <= 64
            && namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !ok {
            return Err(invalid(format!(
                "namespace must match [A-Za-z0-9._-]{{1,64}}, got {namespace:?}"
            )));
        }
        self.namespace = namespace;
        Ok(self)
    }

    /// Sets the key version segment: `[a-z0-9]{1,16}`. Changing it starts a fresh key space.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if `version` is outside that charset or length.
    pub fn with_key_version(mut self, version: impl Into<String>) -> Result<Self, Error> {
        let version = version.into();
        let ok = !version.is_empty()
            && version.len() <= 16
            && version
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if !ok {
            return Err(invalid(format!(
                "key version must match [a-z0-9]{{1,16}}, got {version:?}"
            )));
        }
        self.key_version = version;
        Ok(self)
    }

    /// Sets how long a sent command may wait for its reply before its outcome is
    /// `Indeterminate` (at most 60 s).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if zero or above 60 s, or not above the replication
    /// gate's timeout when one is set.
    pub fn with_command_timeout(mut self, timeout: Duration) -> Result<Self, Error> {
        check_duration("command timeout", timeout, Duration::from_secs(60))?;
        if let Some(gate) = self.replication {
            check_gate_fits(gate.timeout, timeout)?;
        }
        self.command_timeout = timeout;
        Ok(self)
    }

    /// Sets how long making a connection may take before a command is `Unavailable` without
    /// being sent (at most 60 s).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if zero or above 60 s.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Result<Self, Error> {
        check_duration("connect timeout", timeout, Duration::from_secs(60))?;
        self.connect_timeout = timeout;
        Ok(self)
    }

    /// Sets the retry-after reported on contention when the holder's key has no positive
    /// PTTL (at most 60 s).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if zero or above 60 s.
    pub fn with_retry_after_fallback(mut self, fallback: Duration) -> Result<Self, Error> {
        check_duration("retry-after fallback", fallback, Duration::from_secs(60))?;
        self.retry_after_fallback = fallback;
        Ok(self)
    }

    /// Sets how many commands may be in flight at once; beyond it, calls return `Overloaded`
    /// without sending (1 to 1,000,000). Operations sent together as one command (acquires,
    /// releases or renewals that start at once) count once.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if out of range.
    pub fn with_max_in_flight(mut self, limit: usize) -> Result<Self, Error> {
        if !(1..=1_000_000).contains(&limit) {
            return Err(invalid(format!(
                "max in flight must be from 1 to 1000000, got {limit}"
            )));
        }
        self.max_in_flight = limit;
        Ok(self)
    }

    /// Sets how long a lease's fence counter is kept once nothing has been granted on it:
    /// from 1 s to 365 days, in whole milliseconds; 7 days by default.
    ///
    /// Every grant writes its resource's counter (the lease key with `:fence`) with this TTL,
    /// so a resource granted once and never again does not keep a key for ever. Letting it
    /// expire is safe because of the clock floor: a new grant's fence is
    /// `max(counter + 1, the server's clock in microseconds)`, so the counter holds the
    /// server's clock at the last grant (or just above it), and once it has been idle this
    /// long the clock is past it by as much: the next fence is above every one before it
    /// without the counter. A counter found ahead of the clock (two grants in one
    /// microsecond, one set far ahead by hand) is kept this long past the moment the clock
    /// reaches it, not past now.
    ///
    /// It assumes what the floor assumes after any lost counter: that the server's clock is
    /// not stepped back by more than the idle time, nor a server that takes over after a
    /// failover behind the old one by more. NTP-kept clocks are within milliseconds. Clients
    /// with different values are safe together: each grant sets the TTL its own client asks
    /// for.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if below 1 s, above 365 days, or with a sub-millisecond
    /// part (the script sets the TTL with `PX`).
    pub fn with_counter_idle_expiry(mut self, idle: Duration) -> Result<Self, Error> {
        if !(MIN_COUNTER_IDLE_EXPIRY..=MAX_COUNTER_IDLE_EXPIRY).contains(&idle) {
            return Err(invalid(format!(
                "counter idle expiry must be from {MIN_COUNTER_IDLE_EXPIRY:?} to \
                 {MAX_COUNTER_IDLE_EXPIRY:?}, got {idle:?}"
            )));
        }
        if !idle.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(invalid(format!(
                "counter idle expiry must be a whole number of milliseconds, got {idle:?}"
            )));
        }
        self.counter_idle_expiry = idle;
        Ok(self)
    }

    /// Gates grants and renewals on replication: after the script, on the same connection,
    /// `WAIT replicas timeout` runs, and a grant or renewal that fewer than `replicas` replicas
    /// confirmed within `timeout` is `Indeterminate` (`NotReplicated`) rather than applied.
    /// Replaying the acquire (or renewing again) waits for the replicas once more.
    ///
    /// This narrows what a failover can lose — a grant, a renewal's extension, the fence
    /// counter's increment — to what fewer than `replicas` replicas had. It does not make
    /// Redis strongly consistent: a failover may still promote a replica that did not confirm,
    /// and writes are not rolled back when the gate is not met. Standalone and Sentinel
    /// deployments only: a cluster backend refuses it.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if `replicas` is zero, or `timeout` is zero or not below
    /// the command timeout (the `WAIT` must answer before the command times out).
    pub fn with_replication(mut self, replicas: u32, timeout: Duration) -> Result<Self, Error> {
        if replicas == 0 {
            return Err(invalid(
                "replication gate needs at least one replica".to_owned(),
            ));
        }
        check_duration("replication timeout", timeout, Duration::from_secs(60))?;
        check_gate_fits(timeout, self.command_timeout)?;
        self.replication = Some(ReplicationGate { replicas, timeout });
        Ok(self)
    }

    /// Sets the PEM certificate(s) a `rediss://` server must present a chain to, in place of
    /// the system's trust store (a private CA, say): a standalone server, or every node of a
    /// Cluster. A `rediss+sentinel://` URL with them is refused (`Unsupported`): Sentinel
    /// deployments use the system's store. Needs the `tls` feature to connect.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`] if `pem` holds no `-----BEGIN CERTIFICATE-----` block.
    pub fn with_tls_root_certificates(mut self, pem: impl Into<Vec<u8>>) -> Result<Self, Error> {
        let pem = pem.into();
        let marker = b"-----BEGIN CERTIFICATE-----";
        if !pem.windows(marker.len()).any(|w| w == marker) {
            return Err(invalid(
                "TLS root certificates must be PEM with at least one CERTIFICATE block".to_owned(),
            ));
        }
        self.tls_root = Some(RootCertificates(pem));
        Ok(self)
    }

    /// Sets how commands reach a standalone server or a Sentinel-named master: leasehold's
    /// own connection ([`Transport::Direct`], the default) or redis-rs's multiplexed one. A
    /// URL's `?transport=direct` or `?transport=redis-rs` sets it too.
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// Returns the transport.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Returns the PEM root certificates set for TLS, if any.
    pub fn tls_root_certificates(&self) -> Option<&[u8]> {
        self.tls_root.as_ref().map(|r| r.0.as_slice())
    }

    /// Returns the replication gate, if one is set.
    pub fn replication(&self) -> Option<ReplicationGate> {
        self.replication
    }

    /// Returns the namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Returns the key version.
    pub fn key_version(&self) -> &str {
        &self.key_version
    }

    /// Returns the command timeout.
    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// Returns the connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Returns the contention retry-after fallback.
    pub fn retry_after_fallback(&self) -> Duration {
        self.retry_after_fallback
    }

    /// Returns the in-flight limit.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Returns how long a fence counter is kept once idle.
    pub fn counter_idle_expiry(&self) -> Duration {
        self.counter_idle_expiry
    }

    /// The counter idle expiry as `acquire.lua` takes it: whole milliseconds, which the setter
    /// checked, and at most a year's, far inside `u64`.
    pub(crate) fn counter_idle_expiry_millis(&self) -> u64 {
        u64::try_from(self.counter_idle_expiry.as_millis()).unwrap_or(u64::MAX)
    }
}

/// Returns true if and only if no gate is set, or enough replicas confirmed.
pub(crate) fn replicated(gate: Option<ReplicationGate>, confirmed: Option<u32>) -> bool {
    gate.is_none_or(|g| confirmed.unwrap_or(0) >= g.replicas())
}

/// A grant or renewal the primary applied that too few replicas confirmed: unknown, since a
/// failover could still undo it.
pub(crate) fn not_replicated(gate: Option<ReplicationGate>, confirmed: Option<u32>) -> Failure {
    let (wanted, within) = gate.map_or((0, Duration::ZERO), |g| (g.replicas(), g.timeout()));
    Failure::Indeterminate(Indeterminate::new(
        IndeterminateCause::NotReplicated,
        format!(
            "{} of {wanted} replicas confirmed within {within:?}",
            confirmed.unwrap_or(0)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_originals() {
        let s = RedisSettings::default();
        assert_eq!(s.command_timeout(), Duration::from_millis(200));
        assert_eq!(s.retry_after_fallback(), Duration::from_millis(50));
        assert_eq!(s.namespace(), "leasehold");
        assert_eq!(s.key_version(), "v1");
        assert_eq!(s.counter_idle_expiry(), Duration::from_secs(7 * 24 * 3600));
    }

    #[test]
    fn the_counter_idle_expiry_is_bounded_and_whole_milliseconds() {
        let s = RedisSettings::default();
        let day = Duration::from_secs(24 * 3600);
        for refused in [
            Duration::ZERO,
            Duration::from_millis(999),
            365 * day + Duration::from_millis(1),
            Duration::MAX,
            Duration::from_micros(1_500_500),
        ] {
            let err = s.clone().with_counter_idle_expiry(refused).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidSetting, "{refused:?}");
            assert!(err.to_string().contains("counter idle expiry"), "{err}");
        }
        for taken in [
            Duration::from_secs(1),
            Duration::from_millis(1_500),
            day,
            365 * day,
        ] {
            let set = s.clone().with_counter_idle_expiry(taken).unwrap();
            assert_eq!(set.counter_idle_expiry(), taken);
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        let s = RedisSettings::default();
        for ns in ["", "a:b", "{x}", "a b", &"n".repeat(65)] {
            assert_eq!(
                s.clone().with_namespace(ns).unwrap_err().kind(),
                ErrorKind::InvalidSetting
            );
        }
        for v in ["", "V1", "v-1", &"1".repeat(17)] {
            assert!(s.clone().with_key_version(v).is_err(), "{v:?}");
        }
        assert!(s.clone().with_command_timeout(Duration::ZERO).is_err());
        assert!(
            s.clone()
                .with_command_timeout(Duration::from_secs(61))
                .is_err()
        );
        assert!(s.clone().with_max_in_flight(0).is_err());
        assert!(
            s.clone()
                .with_replication(0, Duration::from_millis(50))
                .is_err()
        );
        assert!(s.clone().with_replication(1, Duration::ZERO).is_err());
        // The WAIT must answer before the command times out, whichever is set first.
        assert!(
            s.clone()
                .with_replication(1, Duration::from_millis(200))
                .is_err()
        );
        let gated = s
            .clone()
            .with_replication(1, Duration::from_millis(50))
            .unwrap();
        assert!(
            gated
                .clone()
                .with_command_timeout(Duration::from_millis(50))
                .is_err()
        );
        assert!(gated.with_command_timeout(Duration::from_secs(1)).is_ok());
        assert!(
            s.clone()
                .with_tls_root_certificates(b"not pem".to_vec())
                .is_err()
        );
        let pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec();
        let with_root = s.clone().with_tls_root_certificates(pem).unwrap();
        assert!(format!("{with_root:?}").contains("bytes of PEM"));
        assert!(s.with_namespace("my-app.prod_1").is_ok());
    }
}
