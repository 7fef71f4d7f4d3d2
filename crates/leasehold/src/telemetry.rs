//! What the library tells an operator: tracing spans and events, and lease-level metrics.
//!
//! # Tracing
//!
//! Every call that talks to the server runs in a span — `acquire` (with its waiting inside),
//! `try_acquire`, `renew`, `release`, `release_attempt`, `inspect`, `resolve` (the replay of an
//! unknown acquire) and `abandon` (the cleanup behind one) — whose fields are the purpose and
//! the first 12 hex digits of the resource digest. Each ends with a `debug` event naming the
//! outcome, the latency and, for a grant, its fence and remaining validity; `inspect` uses
//! `trace`. Every change of a handle's state is a `debug` event (`lease state changed`), and
//! every loss signal a `warn` event (`lease lost`) with the reason.
//!
//! What no field shows, at any level: an owner token (its `Debug` and `Display` are
//! redacted), a credential (the backend never logs a URL), or a resource's name (only its
//! digest exists here, and only a prefix of it is shown).
//!
//! # Metrics
//!
//! With the `metrics` feature, the calls above record through the [`metrics`] facade, under
//! the names in [`names`] (Prometheus conventions: `_total` counters, `_seconds`
//! histograms). Labels are bounded: `purpose` (a name the program chose; keep them few),
//! `outcome` and `reason` (fixed sets, in [`names`]). No digest, fence, holder or token is
//! ever a label. Without the feature none of this code is compiled.
//!
//! [`metrics`]: https://docs.rs/metrics

use std::fmt;
use std::time::Duration;

use crate::id::{Purpose, ResourceDigest};
use crate::keepalive::LossReason;
use crate::outcome::{InspectOutcome, RenewOutcome};

/// The metrics' names, and the values their labels take.
pub mod names {
    /// Counter: acquire tries by `purpose` and `outcome` (`acquired`, `replayed`,
    /// `contended`, `owner_operation_conflict`, `indeterminate`, `unavailable`,
    /// `overloaded`). A waiting acquire counts once, by its final outcome.
    pub const ACQUIRES: &str = "leasehold_acquires_total";
    /// Histogram: how long an acquire took, waiting included, by `purpose` and `outcome`.
    pub const ACQUIRE_SECONDS: &str = "leasehold_acquire_duration_seconds";
    /// Histogram: how long acquires that found the lease held waited, by `purpose`
    /// (whether they got it or not).
    pub const WAIT_SECONDS: &str = "leasehold_acquire_wait_seconds";
    /// Gauge: acquires waiting now, by `purpose` and `kind` (`lease`, `permit`, `read`,
    /// `write`: see [`kind_of`](super::kind_of)).
    pub const WAITERS: &str = "leasehold_waiters";
    /// Gauge: grants kept alive by a watchdog now, by `purpose` and `kind`: a semaphore's
    /// permits held, a read/write lease's readers and writer, and leases.
    pub const HELD: &str = "leasehold_held";
    /// Counter: renewals by `purpose` and `outcome` (`renewed`, `lost`, `indeterminate`,
    /// `unavailable`, `overloaded`, `refused`).
    pub const RENEWALS: &str = "leasehold_renewals_total";
    /// Histogram: a renewal's round trip, by `purpose`.
    pub const RENEW_SECONDS: &str = "leasehold_renew_duration_seconds";
    /// Histogram: the validity the lease still had when a renewal was confirmed, by
    /// `purpose` — the early warning: near the watchdog's margin, the next slow renewal
    /// loses the lease.
    pub const RENEW_VALIDITY_LEFT_SECONDS: &str = "leasehold_renew_validity_left_seconds";
    /// Counter: releases by `purpose` and `outcome` (`released`, `already_gone`,
    /// `not_owner`, `indeterminate`, `unavailable`, `overloaded`, `refused`).
    pub const RELEASES: &str = "leasehold_releases_total";
    /// Histogram: how long a lease was held, from its grant to a confirmed release, by
    /// `purpose`.
    pub const HOLD_SECONDS: &str = "leasehold_hold_duration_seconds";
    /// Counter: loss signals fired, by `purpose` and `reason` (`lost_to_another`,
    /// `released`, `expired`, `unreachable`, `watchdog_stopped`, `dropped`,
    /// `master_replaced`). `released`
    /// and `dropped` are the program's own doing; the others are the ones to alert on.
    pub const LOSSES: &str = "leasehold_losses_total";
    /// Gauge: leases the process's watchdogs keep alive now.
    pub const LEASES_KEPT: &str = "leasehold_leases_kept";
    /// Gauge: renewals per second the leases the process's watchdogs keep need (one per
    /// cadence each).
    pub const KEEPALIVE_DEMAND: &str = "leasehold_keepalive_renewals_needed_per_second";
    /// Gauge: renewals per second a watchdog measured it can confirm (the last to measure,
    /// with several): the lesser of its send slots over the time a renewal takes and its
    /// task's own rate. Alert before the demand gauge comes near it.
    pub const KEEPALIVE_CAPACITY: &str = "leasehold_keepalive_renewal_capacity_per_second";
    /// Gauge: the renewals per second a watchdog admits leases up to (the last to measure):
    /// three quarters of its measured capacity. Leases beyond it are refused up front.
    pub const KEEPALIVE_ADMISSION_LIMIT: &str =
        "leasehold_keepalive_admission_limit_renewals_per_second";
    /// Counter: leases a watchdog refused to keep because their renewals would pass its
    /// admission limit (`WatchdogOverloaded`).
    pub const KEEPALIVE_REFUSED: &str = "leasehold_keepalive_refused_total";
    /// Gauge: elections this process leads now, by `purpose` (client-go's leader gauge).
    pub const LEADING: &str = "leasehold_election_leading";
    /// Gauge: Redis commands this process has in flight (the backend's in-flight limit
    /// refuses more as `Overloaded`).
    pub const REQUESTS_IN_FLIGHT: &str = "leasehold_redis_requests_in_flight";
    /// Counter: reconnects of the release-notice subscriber (waiters fall back to the
    /// holder's TTL while it is away).
    pub const NOTICE_RECONNECTS: &str = "leasehold_redis_notice_reconnects_total";
}

/// A span for a call on a lease, at `$level`: the purpose and the short resource digest,
/// and any further fields.
macro_rules! lease_span {
    ($level:ident, $name:literal, $purpose:expr, $resource:expr $(, $($field:tt)+)?) => {
        tracing::span!(
            tracing::Level::$level,
            $name,
            purpose = %$purpose,
            resource = %$crate::telemetry::Short($resource)
            $(, $($field)+)?
        )
    };
}
pub(crate) use lease_span;

/// A resource digest as logs show it: its first 12 hex digits, enough to tell leases apart
/// in one deployment and to find the key (`KEYS *<prefix>*`), never the resource's name.
pub(crate) struct Short<'a>(pub(crate) &'a ResourceDigest);

impl fmt::Display for Short<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&ShortDigest::of(self.0), f)
    }
}

/// [`Short`], kept: the 12 hex digits alone, for what names a lease in logs long after it was
/// made (a kept lease's signal), without holding the whole 71-byte digest for it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct ShortDigest([u8; SHORT_LEN]);

const SHORT_LEN: usize = 12;

impl ShortDigest {
    /// The short form of `digest`.
    pub(crate) fn of(digest: &ResourceDigest) -> Self {
        let digest = digest.as_str().as_bytes();
        let hex = digest.strip_prefix(b"sha256:").unwrap_or(digest);
        let mut short = [b'0'; SHORT_LEN];
        for (to, from) in short.iter_mut().zip(hex) {
            *to = *from;
        }
        Self(short)
    }
}

impl fmt::Display for ShortDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Hex digits from a digest's text: always ASCII.
        f.write_str(std::str::from_utf8(&self.0).unwrap_or("?"))
    }
}

impl fmt::Debug for ShortDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Whole milliseconds, for log fields.
pub(crate) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Microseconds, for latency fields.
pub(crate) fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The `outcome` label of a renewal.
pub(crate) fn renew_kind(outcome: &RenewOutcome) -> &'static str {
    match outcome {
        RenewOutcome::Renewed { .. } => "renewed",
        RenewOutcome::Lost(_) => "lost",
        RenewOutcome::Indeterminate(_) => "indeterminate",
        RenewOutcome::Unavailable(_) => "unavailable",
        RenewOutcome::Overloaded => "overloaded",
        RenewOutcome::Refused { .. } => "refused",
    }
}

/// The `outcome` of an inspection, for logs.
pub(crate) fn inspect_kind(outcome: &InspectOutcome) -> &'static str {
    match outcome {
        InspectOutcome::Free => "free",
        InspectOutcome::HeldByThisAttempt(_) => "held_by_this_attempt",
        InspectOutcome::HeldByOther(_) => "held_by_other",
        InspectOutcome::Indeterminate(_) => "indeterminate",
        InspectOutcome::Unavailable(_) => "unavailable",
        InspectOutcome::Overloaded => "overloaded",
    }
}

/// The `reason` label of a loss signal.
pub(crate) fn loss_kind(reason: LossReason) -> &'static str {
    match reason {
        LossReason::LostToAnother => "lost_to_another",
        LossReason::Released => "released",
        LossReason::Expired => "expired",
        LossReason::Unreachable => "unreachable",
        LossReason::WatchdogStopped => "watchdog_stopped",
        LossReason::Dropped => "dropped",
        LossReason::MasterReplaced => "master_replaced",
    }
}

/// What a request asks for, as the `kind` label says it: `lease`, `permit` (of a
/// semaphore), `read` or `write` (a side of a read/write lease).
pub fn kind_of(request: &crate::LeaseRequest) -> &'static str {
    match (request.rw(), request.capacity()) {
        (Some(crate::RwMode::Read), _) => "read",
        (Some(_), _) => "write",
        (None, Some(_)) => "permit",
        (None, None) => "lease",
    }
}

/// [`kind_of`] for a grant.
pub(crate) fn grant_kind(grant: &crate::backend::Grant) -> &'static str {
    match (grant.rw(), grant.slot()) {
        (Some(crate::RwMode::Read), _) => "read",
        (Some(_), _) => "write",
        (None, Some(_)) => "permit",
        (None, None) => "lease",
    }
}

/// Records an acquire's final outcome and how long it took.
pub(crate) fn acquired(purpose: &Purpose, outcome: &'static str, took: Duration) {
    #[cfg(feature = "metrics")]
    {
        let labels = [
            ("purpose", purpose.as_str().to_owned()),
            ("outcome", outcome.to_owned()),
        ];
        metrics::counter!(names::ACQUIRES, &labels).increment(1);
        metrics::histogram!(names::ACQUIRE_SECONDS, &labels).record(took.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (purpose, outcome, took);
}

/// Records how long an acquire that found the lease held waited.
pub(crate) fn waited(purpose: &Purpose, took: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!(names::WAIT_SECONDS, "purpose" => purpose.as_str().to_owned())
        .record(took.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (purpose, took);
}

/// Records a renewal's outcome, its round trip, and the validity left when it confirmed.
pub(crate) fn renewed(
    purpose: &Purpose,
    outcome: &'static str,
    took: Duration,
    validity_left: Option<Duration>,
) {
    #[cfg(feature = "metrics")]
    {
        let purpose = purpose.as_str().to_owned();
        metrics::counter!(names::RENEWALS, "purpose" => purpose.clone(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!(names::RENEW_SECONDS, "purpose" => purpose.clone())
            .record(took.as_secs_f64());
        if let Some(left) = validity_left {
            metrics::histogram!(names::RENEW_VALIDITY_LEFT_SECONDS, "purpose" => purpose)
                .record(left.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (purpose, outcome, took, validity_left);
}

/// Records a release's outcome, and for a confirmed one how long the lease was held.
pub(crate) fn released(purpose: &Purpose, outcome: &'static str, held: Option<Duration>) {
    #[cfg(feature = "metrics")]
    {
        let purpose = purpose.as_str().to_owned();
        metrics::counter!(names::RELEASES, "purpose" => purpose.clone(), "outcome" => outcome)
            .increment(1);
        if let Some(held) = held {
            metrics::histogram!(names::HOLD_SECONDS, "purpose" => purpose)
                .record(held.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (purpose, outcome, held);
}

/// Records a loss signal that fired.
pub(crate) fn lost(purpose: &Purpose, reason: LossReason) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        names::LOSSES,
        "purpose" => purpose.as_str().to_owned(),
        "reason" => loss_kind(reason)
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (purpose, reason);
}

/// Moves the watchdogs' demand gauge by `renewals_per_second` (negative when a lease goes).
pub(crate) fn keepalive_demand(renewals_per_second: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(names::KEEPALIVE_DEMAND).increment(renewals_per_second);
    #[cfg(not(feature = "metrics"))]
    let _ = renewals_per_second;
}

/// Sets the capacity and admission-limit gauges to what a watchdog measured.
pub(crate) fn keepalive_capacity(renewals_per_second: f64, admission_limit: f64) {
    #[cfg(feature = "metrics")]
    {
        metrics::gauge!(names::KEEPALIVE_CAPACITY).set(renewals_per_second);
        metrics::gauge!(names::KEEPALIVE_ADMISSION_LIMIT).set(admission_limit);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (renewals_per_second, admission_limit);
}

/// Counts a lease a watchdog refused for its load.
pub(crate) fn keepalive_refused() {
    #[cfg(feature = "metrics")]
    metrics::counter!(names::KEEPALIVE_REFUSED).increment(1);
}

/// Counts itself in a gauge while it lives: a waiting acquire, a kept lease, a term led.
pub(crate) struct Gauged {
    #[cfg(feature = "metrics")]
    gauge: metrics::Gauge,
}

impl Gauged {
    /// One more waiter for `purpose` of `kind`, until dropped.
    pub(crate) fn waiter(purpose: &Purpose, kind: &'static str) -> Self {
        #[cfg(feature = "metrics")]
        return Self::up(metrics::gauge!(
            names::WAITERS,
            "purpose" => purpose.as_str().to_owned(),
            "kind" => kind
        ));
        #[cfg(not(feature = "metrics"))]
        {
            let _ = (purpose, kind);
            Self {}
        }
    }

    /// One more grant of `kind` for `purpose` kept alive, until dropped.
    pub(crate) fn held(purpose: &Purpose, kind: &'static str) -> Self {
        #[cfg(feature = "metrics")]
        return Self::up(metrics::gauge!(
            names::HELD,
            "purpose" => purpose.as_str().to_owned(),
            "kind" => kind
        ));
        #[cfg(not(feature = "metrics"))]
        {
            let _ = (purpose, kind);
            Self {}
        }
    }

    /// One more lease kept alive, until dropped.
    pub(crate) fn kept() -> Self {
        #[cfg(feature = "metrics")]
        return Self::up(metrics::gauge!(names::LEASES_KEPT));
        #[cfg(not(feature = "metrics"))]
        Self {}
    }

    #[cfg(feature = "metrics")]
    fn up(gauge: metrics::Gauge) -> Self {
        gauge.increment(1.0);
        Self { gauge }
    }
}

/// Counts one more election led for `purpose` until `signal` fires (the term was lost,
/// resigned or dropped): a task waits for it, with the `metrics` feature only.
pub(crate) fn leading_until(purpose: &Purpose, signal: &crate::keepalive::LossSignal) {
    #[cfg(feature = "metrics")]
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let gauged = Gauged::up(metrics::gauge!(
            names::LEADING,
            "purpose" => purpose.as_str().to_owned()
        ));
        let signal = signal.clone();
        runtime.spawn(async move {
            let _gauged = gauged;
            signal.lost().await;
        });
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (purpose, signal);
}

impl Drop for Gauged {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        self.gauge.decrement(1.0);
    }
}

impl fmt::Debug for Gauged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Gauged")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_digest_is_a_prefix_of_twelve_hex_digits() {
        let digest = ResourceDigest::of("orders/42");
        let short = Short(&digest).to_string();
        assert_eq!(short.len(), 12);
        assert!(digest.as_str()["sha256:".len()..].starts_with(&short));
        assert!(!short.contains("orders"));
        assert_eq!(ShortDigest::of(&digest).to_string(), short);
    }
}
