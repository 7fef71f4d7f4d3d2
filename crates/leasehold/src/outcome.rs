//! Outcomes are values: what is known after a call, applied, not applied or unknown.
//!
//! Three kinds of certainty run through every outcome here:
//!
//! - **applied** (`Acquired`, `Renewed`, `Released`, …): the server answered and did it;
//! - **not applied** (`Contended`, `Unavailable`, `Overloaded`, `Refused`, …): the server
//!   answered that it did not, or the command was definitely never sent;
//! - **unknown** (`Indeterminate`): the command may have been applied; only the server knows.
//!   Resolve it by inspecting or replaying with the *same* attempt, never by guessing.

use std::fmt;
use std::time::Duration;

use crate::fence::FenceToken;
use crate::id::{HolderFingerprint, HolderName};
use crate::state::LeaseState;

/// Why a command was definitely not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnavailableCause {
    /// The server refused the connection.
    ConnectionRefused,
    /// No connection could be made within the connect timeout; nothing was sent.
    ConnectTimeout,
    /// There was no usable connection and the command was not sent.
    NotConnected,
    /// The node is a read-only replica (`READONLY`).
    ReadOnly,
    /// The server is loading its dataset (`LOADING`).
    Loading,
    /// The server is busy running a script (`BUSY`).
    Busy,
    /// The master is down or the replica link is broken (`MASTERDOWN`).
    MasterDown,
    /// The credentials lack permission for the command (`NOPERM`, `NOAUTH`, `WRONGPASS`).
    NoPermission,
    /// The server is out of memory for writes (`OOM`).
    OutOfMemory,
    /// The server refuses writes: failed persistence (`MISCONF`) or too few replicas
    /// (`NOREPLICAS`).
    WritesRefused,
    /// The cluster cannot serve the key's slot now (`CLUSTERDOWN`, `TRYAGAIN`).
    ClusterDown,
    /// The key's slot is served by another cluster node (`MOVED`, `ASK`). The client refreshes
    /// its slot map, so trying again reaches the right node.
    Redirected,
    /// The script was missing even after it was loaded again (`NOSCRIPT` twice).
    ScriptMissing,
    /// The server has no database of the index the connection asked for (Redis refused
    /// `SELECT`): trying again does not help until the URL or the server's configuration
    /// changes.
    NoSuchDatabase,
    /// A key the lease needs holds something the scripts cannot use, so they wrote nothing:
    /// trying again does not help until an operator removes or repairs the key.
    UnusableKey(UnusableKey),
    /// The backend does not implement the operation (a read/write downgrade on one without
    /// read/write leases); nothing was sent.
    Unsupported,
}

/// What is wrong with a key a lease needs. The scripts check before they write, so nothing
/// already stored is changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnusableKey {
    /// The lease key holds a value of another type (a hash, a list, a set, …).
    LeaseWrongType,
    /// The lease key holds a string that leasehold did not write: longer than any value a
    /// lease stores, or not of its form. Refused whatever its length, without reading more of
    /// it than the longest lease value.
    LeaseForeignValue,
    /// The fence counter holds a value of another type.
    CounterWrongType,
    /// The fence counter holds a string that is not a fence: negative, not a plain decimal,
    /// or above [`FenceToken::MAX`].
    CounterNotAFence,
    /// The fence counter has reached [`FenceToken::MAX`]: no larger fence can be issued.
    FenceRangeExhausted,
    /// A fenced record (data kept next to the lease) holds a value of another type.
    RecordWrongType,
    /// A semaphore's capacity record or queue holds a value leasehold did not write.
    SemaphoreForeignValue,
}

impl fmt::Display for UnusableKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnusableKey::LeaseWrongType => "the lease key holds a value of another type",
            UnusableKey::LeaseForeignValue => {
                "the lease key holds a string that leasehold did not write"
            }
            UnusableKey::CounterWrongType => "the fence counter holds a value of another type",
            UnusableKey::CounterNotAFence => {
                "the fence counter holds something that is not a fence (not a decimal in the \
                 fence range)"
            }
            UnusableKey::FenceRangeExhausted => {
                "the fence counter is at the top of the fence range (2^63 - 1)"
            }
            UnusableKey::RecordWrongType => "the fenced record holds a value of another type",
            UnusableKey::SemaphoreForeignValue => {
                "the semaphore's capacity record or queue holds a value leasehold did not write"
            }
        })
    }
}

/// A command that was definitely not applied, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unavailable {
    /// Why it was not applied.
    pub cause: UnavailableCause,
    /// What the client library or server said, for diagnostics. Never holds a token.
    pub detail: String,
}

impl Unavailable {
    /// Makes an `Unavailable`.
    pub fn new(cause: UnavailableCause, detail: impl Into<String>) -> Self {
        Self {
            cause,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not applied ({:?}): {}", self.cause, self.detail)
    }
}

/// Why the outcome of a command is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IndeterminateCause {
    /// The command was sent and no reply came within the command timeout.
    ResponseTimeout,
    /// The connection broke after the command may have been sent.
    ConnectionLost,
    /// The server replied with something this client cannot read.
    UnexpectedReply,
    /// The server replied with an error raised while the command may have run.
    ServerError,
    /// The primary applied the write, but fewer replicas than required confirmed it in time:
    /// a failover could still lose it. Replay (or renew again) to wait for them once more.
    NotReplicated,
    /// The command ran on a server the Sentinels no longer name as master (one a failover
    /// replaced, which answers until it is demoted), and the master they name could not be
    /// asked in its place. What the replaced one applied does not count.
    MasterReplaced,
    /// No Sentinel answered while the command ran, so whether the server that answered was
    /// still the master is not known.
    MasterUnconfirmed,
}

/// A command whose outcome is unknown: it may or may not have been applied.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Indeterminate {
    /// Why the outcome is unknown.
    pub cause: IndeterminateCause,
    /// What the client library or server said, for diagnostics. Never holds a token.
    pub detail: String,
}

impl Indeterminate {
    /// Makes an `Indeterminate`.
    pub fn new(cause: IndeterminateCause, detail: impl Into<String>) -> Self {
        Self {
            cause,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Indeterminate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "outcome unknown ({:?}): {}", self.cause, self.detail)
    }
}

/// How a command failed to give a definite answer of its own; shared by every operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// Sent, outcome unknown.
    Indeterminate(Indeterminate),
    /// Definitely not applied.
    Unavailable(Unavailable),
    /// Refused locally: the provider's in-flight limit was reached; nothing was sent.
    Overloaded,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Indeterminate(i) => i.fmt(f),
            Failure::Unavailable(u) => u.fmt(f),
            Failure::Overloaded => f.write_str("not sent: too many commands in flight"),
        }
    }
}

/// Someone else holds the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Contention {
    /// When to try again: the holder's remaining PTTL, or the configured fallback when the
    /// server reported none.
    pub retry_after: Duration,
    /// The holder's fingerprint, when the server could tell.
    pub holder: Option<HolderFingerprint>,
    /// The holder's fencing token, when the server could tell.
    pub fence: Option<FenceToken>,
    /// The name the holder gave its grant, if it gave one
    /// ([`LeaseRequest::with_holder_name`](crate::LeaseRequest::with_holder_name)).
    pub holder_name: Option<HolderName>,
    /// True if and only if the holder has already released its grant, and the key is kept
    /// only until the grant's minimum hold ends; `retry_after` is then what is left of it.
    pub released: bool,
    /// For a queued request (a semaphore's permit, a side of a read/write lease): how many
    /// waiters are before it in the queue, when the server said.
    pub ahead: Option<u32>,
}

impl Contention {
    /// Makes a `Contention`, with no holder name and not released.
    pub fn new(
        retry_after: Duration,
        holder: Option<HolderFingerprint>,
        fence: Option<FenceToken>,
    ) -> Self {
        Self {
            retry_after,
            holder,
            fence,
            holder_name: None,
            released: false,
            ahead: None,
        }
    }

    /// Returns this contention with how many waiters are before the request in its queue.
    pub fn with_ahead(mut self, ahead: u32) -> Self {
        self.ahead = Some(ahead);
        self
    }

    /// Returns this contention with the holder's name.
    pub fn with_holder_name(mut self, name: impl Into<Option<HolderName>>) -> Self {
        self.holder_name = name.into();
        self
    }

    /// Returns this contention marked as met by a key kept after release for its minimum
    /// hold (`true`), or by a live grant (`false`).
    pub fn with_released(mut self, released: bool) -> Self {
        self.released = released;
        self
    }
}

/// Why a lease is no longer held, according to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LossCause {
    /// The key was absent: the lease expired or was deleted.
    Absent,
    /// Another owner, operation or grant holds the key.
    OtherHolder,
    /// The grant was made on a master that has since been replaced (a Sentinel failover, seen
    /// by the backend as a new term), and the master now named does not hold it: the key did
    /// not reach it, or another holder was granted there since.
    MasterReplaced,
}

/// The outcome of renewing a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a renewal may have failed or be indeterminate; check the outcome"]
pub enum RenewOutcome {
    /// The server confirmed this exact grant and extended it; `remaining` is the handle's
    /// validity now.
    Renewed {
        /// The handle's remaining validity after the renewal.
        remaining: Duration,
    },
    /// The server no longer holds this grant; the handle is [`LeaseState::Lost`].
    Lost(LossCause),
    /// Sent, outcome unknown; the handle is [`LeaseState::Unknown`] and keeps only the
    /// validity proven before.
    Indeterminate(Indeterminate),
    /// Definitely not applied; the handle's state is unchanged.
    Unavailable(Unavailable),
    /// Refused locally (in-flight limit); nothing was sent; the state is unchanged.
    Overloaded,
    /// Not sent: the handle is in a terminal state (`Lost` or `Released`).
    Refused {
        /// The state that refused it.
        state: LeaseState,
    },
}

impl RenewOutcome {
    /// Returns true if and only if the server confirmed the renewal.
    pub fn is_renewed(&self) -> bool {
        matches!(self, RenewOutcome::Renewed { .. })
    }
}

/// The outcome of releasing a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a release may not have been applied; check the outcome"]
pub enum ReleaseOutcome {
    /// This grant held the key and the server deleted it.
    Released,
    /// The key was already gone: the lease expired, or was deleted, evicted or lost in a
    /// restart, before this release. Nothing was deleted. The lease ended before the release:
    /// work done up to it may not have been covered ([`ended_early`](Self::ended_early)).
    AlreadyGone,
    /// Another holder has the key; it was left alone and the handle is `Lost`. The lease
    /// ended before the release, and may have been granted to another while the work ran.
    NotOwner,
    /// Sent, outcome unknown: the key may or may not have been deleted. The handle is
    /// `Unknown` with no remaining validity.
    Indeterminate(Indeterminate),
    /// Definitely not applied; the handle's state is unchanged.
    Unavailable(Unavailable),
    /// Refused locally (in-flight limit); nothing was sent; the state is unchanged.
    Overloaded,
    /// Not sent: the handle is in a terminal state (`Lost` or `Released`).
    Refused {
        /// The state that refused it.
        state: LeaseState,
    },
}

impl ReleaseOutcome {
    /// The outcome's name in snake case (`released`, `already_gone`, `not_owner`,
    /// `indeterminate`, `unavailable`, `overloaded`, `refused`): the `outcome` label of
    /// `leasehold_releases_total`, and what machine-readable reports print.
    pub fn kind(&self) -> &'static str {
        match self {
            ReleaseOutcome::Released => "released",
            ReleaseOutcome::AlreadyGone => "already_gone",
            ReleaseOutcome::NotOwner => "not_owner",
            ReleaseOutcome::Indeterminate(_) => "indeterminate",
            ReleaseOutcome::Unavailable(_) => "unavailable",
            ReleaseOutcome::Overloaded => "overloaded",
            ReleaseOutcome::Refused { .. } => "refused",
        }
    }

    /// Returns true if and only if the release proves the lease had ended before it: the
    /// server held no grant (`AlreadyGone`) or another one (`NotOwner`), or the handle had
    /// already been found lost (`Refused` in [`LeaseState::Lost`]).
    ///
    /// Work that finished while the lease still looked valid was then not covered to its
    /// end: the grant was gone (deleted, evicted, flushed, lost in a restart) before the work
    /// did, and another holder may have been granted the lease meanwhile. A release retried
    /// after an `Indeterminate` one cannot tell its own earlier deletion from an early end,
    /// so it is no proof then.
    pub fn ended_early(&self) -> bool {
        matches!(
            self,
            ReleaseOutcome::AlreadyGone
                | ReleaseOutcome::NotOwner
                | ReleaseOutcome::Refused {
                    state: LeaseState::Lost
                }
        )
    }
}

/// What the server holds for a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseView {
    /// The holder's fencing token, if the stored value carries one.
    pub fence: Option<FenceToken>,
    /// The key's remaining time to live on the server (`PTTL`), if it has one.
    pub server_ttl: Option<Duration>,
    /// The holder's fingerprint, if the stored value carries one.
    pub holder: Option<HolderFingerprint>,
    /// The name the holder gave its grant, if it gave one.
    pub holder_name: Option<HolderName>,
    /// True if and only if the holder released its grant and the key is kept only until the
    /// grant's minimum hold ends (`server_ttl` is then what is left of it). No one holds a
    /// grant on it, and no one can be granted the lease before it goes.
    pub released: bool,
}

impl LeaseView {
    /// Makes a `LeaseView`, with no holder name and not released.
    pub fn new(
        fence: Option<FenceToken>,
        server_ttl: Option<Duration>,
        holder: Option<HolderFingerprint>,
    ) -> Self {
        Self {
            fence,
            server_ttl,
            holder,
            holder_name: None,
            released: false,
        }
    }

    /// Returns this view with the holder's name.
    pub fn with_holder_name(mut self, name: impl Into<Option<HolderName>>) -> Self {
        self.holder_name = name.into();
        self
    }

    /// Returns this view marked as a key kept after release for its minimum hold (`true`),
    /// or as a live grant (`false`).
    pub fn with_released(mut self, released: bool) -> Self {
        self.released = released;
        self
    }
}

/// The outcome of inspecting a lease. Inspection is read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use]
pub enum InspectOutcome {
    /// No one holds the lease.
    Free,
    /// The inspecting attempt (same owner token and operation) holds the lease: a replay of
    /// its acquire will return its handle.
    HeldByThisAttempt(LeaseView),
    /// Someone else holds the lease (or the inspection named no attempt).
    HeldByOther(LeaseView),
    /// Sent, reply unknown.
    Indeterminate(Indeterminate),
    /// Definitely not done.
    Unavailable(Unavailable),
    /// Refused locally (in-flight limit).
    Overloaded,
}

impl From<Failure> for InspectOutcome {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Indeterminate(i) => InspectOutcome::Indeterminate(i),
            Failure::Unavailable(u) => InspectOutcome::Unavailable(u),
            Failure::Overloaded => InspectOutcome::Overloaded,
        }
    }
}

impl fmt::Display for Contention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("held by another")?;
        match (&self.holder, &self.holder_name) {
            (Some(holder), Some(name)) => {
                write!(f, " (holder {holder}, named {:?})", name.as_str())?
            }
            (Some(holder), None) => write!(f, " (holder {holder})")?,
            (None, Some(name)) => write!(f, " (named {:?})", name.as_str())?,
            (None, None) => {}
        }
        if let Some(fence) = self.fence {
            write!(f, " with fence {fence}")?;
        }
        if self.released {
            f.write_str(", released and kept until its minimum hold ends")?;
        }
        write!(f, "; retry after {:?}", self.retry_after)
    }
}

impl fmt::Display for LossCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossCause::Absent => "the key is gone (expired or deleted)",
            LossCause::OtherHolder => "another grant holds the key",
            LossCause::MasterReplaced => {
                "granted on a master since replaced, and the new master does not hold it"
            }
        })
    }
}

impl fmt::Display for RenewOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RenewOutcome::Renewed { remaining } => write!(f, "renewed: valid for {remaining:?}"),
            RenewOutcome::Lost(cause) => write!(f, "lost: {cause}"),
            RenewOutcome::Indeterminate(i) => i.fmt(f),
            RenewOutcome::Unavailable(u) => u.fmt(f),
            RenewOutcome::Overloaded => Failure::Overloaded.fmt(f),
            RenewOutcome::Refused { state } => write!(f, "not sent: the lease is {state}"),
        }
    }
}

impl fmt::Display for ReleaseOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReleaseOutcome::Released => f.write_str("released"),
            ReleaseOutcome::AlreadyGone => {
                f.write_str("already gone: the lease had ended before the release")
            }
            ReleaseOutcome::NotOwner => {
                f.write_str("not the owner: another grant holds the key, left alone")
            }
            ReleaseOutcome::Indeterminate(i) => i.fmt(f),
            ReleaseOutcome::Unavailable(u) => u.fmt(f),
            ReleaseOutcome::Overloaded => Failure::Overloaded.fmt(f),
            ReleaseOutcome::Refused { state } => write!(f, "not sent: the lease is {state}"),
        }
    }
}

impl fmt::Display for LeaseView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(holder) = &self.holder {
            parts.push(format!("holder {holder}"));
        }
        if let Some(name) = &self.holder_name {
            parts.push(format!("named {:?}", name.as_str()));
        }
        if let Some(fence) = self.fence {
            parts.push(format!("fence {fence}"));
        }
        if self.released {
            parts.push("released, kept until its minimum hold ends".to_owned());
        }
        match self.server_ttl {
            Some(ttl) => parts.push(format!("expires in {ttl:?}")),
            None => parts.push("no expiry".to_owned()),
        }
        f.write_str(&parts.join(", "))
    }
}

impl fmt::Display for InspectOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InspectOutcome::Free => f.write_str("free"),
            InspectOutcome::HeldByThisAttempt(view) => write!(f, "held by this attempt: {view}"),
            InspectOutcome::HeldByOther(view) => write!(f, "held by another: {view}"),
            InspectOutcome::Indeterminate(i) => i.fmt(f),
            InspectOutcome::Unavailable(u) => u.fmt(f),
            InspectOutcome::Overloaded => Failure::Overloaded.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn distinct(texts: &[String]) {
        let unique: HashSet<_> = texts.iter().collect();
        assert_eq!(unique.len(), texts.len(), "{texts:#?}");
        assert!(texts.iter().all(|t| !t.is_empty()), "{texts:#?}");
    }

    #[test]
    fn every_outcome_says_which_it_is() {
        let unknown = Indeterminate::new(IndeterminateCause::ResponseTimeout, "timed out");
        let refused = Unavailable::new(UnavailableCause::ConnectionRefused, "refused");
        distinct(
            &[
                RenewOutcome::Renewed {
                    remaining: Duration::from_secs(2),
                },
                RenewOutcome::Lost(LossCause::Absent),
                RenewOutcome::Lost(LossCause::OtherHolder),
                RenewOutcome::Indeterminate(unknown.clone()),
                RenewOutcome::Unavailable(refused.clone()),
                RenewOutcome::Overloaded,
                RenewOutcome::Refused {
                    state: LeaseState::Released,
                },
            ]
            .map(|o| o.to_string()),
        );
        distinct(
            &[
                ReleaseOutcome::Released,
                ReleaseOutcome::AlreadyGone,
                ReleaseOutcome::NotOwner,
                ReleaseOutcome::Indeterminate(unknown.clone()),
                ReleaseOutcome::Unavailable(refused.clone()),
                ReleaseOutcome::Overloaded,
                ReleaseOutcome::Refused {
                    state: LeaseState::Lost,
                },
            ]
            .map(|o| o.to_string()),
        );
        let view = LeaseView::new(FenceToken::new(7), Some(Duration::from_secs(1)), None);
        distinct(
            &[
                InspectOutcome::Free,
                InspectOutcome::HeldByThisAttempt(view.clone()),
                InspectOutcome::HeldByOther(view),
                InspectOutcome::Indeterminate(unknown),
                InspectOutcome::Unavailable(refused),
                InspectOutcome::Overloaded,
            ]
            .map(|o| o.to_string()),
        );
        let contention = Contention::new(Duration::from_millis(120), None, FenceToken::new(9));
        assert_eq!(
            contention.to_string(),
            "held by another with fence 9; retry after 120ms"
        );
    }

    #[test]
    fn holder_names_and_held_after_release_are_shown() {
        let name = HolderName::new("host-3:4711").unwrap();
        let holder = HolderFingerprint::parse("a9993e364706816a");
        let contention = Contention::new(Duration::from_millis(120), holder, FenceToken::new(9))
            .with_holder_name(name.clone());
        assert_eq!(contention.holder_name.as_ref(), Some(&name));
        assert!(!contention.released);
        assert_eq!(
            contention.to_string(),
            "held by another (holder a9993e364706816a, named \"host-3:4711\") with fence 9; \
             retry after 120ms"
        );
        let kept = contention.with_released(true);
        assert_eq!(
            kept.to_string(),
            "held by another (holder a9993e364706816a, named \"host-3:4711\") with fence 9, \
             released and kept until its minimum hold ends; retry after 120ms"
        );
        let view = LeaseView::new(FenceToken::new(9), Some(Duration::from_secs(1)), None)
            .with_holder_name(name)
            .with_released(true);
        assert_eq!(
            view.to_string(),
            "named \"host-3:4711\", fence 9, released, kept until its minimum hold ends, \
             expires in 1s"
        );
        assert_eq!(
            LeaseView::new(None, None, None).with_holder_name(None),
            LeaseView::new(None, None, None)
        );
    }
}
