//! The server's keys: lease keys with their values and expiries, fence counters with theirs,
//! and Redis's rule for when a key is gone.
//!
//! Keys are named as the adapter names them, without its namespace and key version:
//! `<purpose>:{<digest>}` for the lease and the same with `:fence` for its counter. A lease's
//! value is what the scripts store, `"<fence>:<token>:<operation>"`, followed by
//! `"\n<hold until>\n<holder name>"` when the grant has a minimum hold or a holder name, kept
//! here as its parts. A grant released before its hold ended is kept as a record whose token
//! is `"~"` and the released token's fingerprint, as `release.lua` writes it. A grant someone
//! was refused is marked, as `acquire.lua` marks it, and only a marked grant's release is
//! announced.
//!
//! A test may plant at a lease key or a fence counter a value leasehold did not write
//! ([`ForeignValue`]): the scripts refuse it, whatever its length, and change nothing.

use std::collections::BTreeMap;

use leasehold::{HolderFingerprint, HolderName, Purpose, ResourceDigest};

/// What the server stores for a lease: its fence, owner token and operation, its minimum hold
/// and holder name, and its expiry by the server's clock. No `Debug`: it holds an owner token.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) fence: u64,
    /// The owner token, or for a record kept after release, [`RELEASED`] and the released
    /// token's fingerprint.
    pub(crate) token: String,
    pub(crate) operation: String,
    pub(crate) expires_at_ms: i64,
    /// When the minimum hold ends, by the server's clock in microseconds.
    pub(crate) hold_until_us: Option<i64>,
    pub(crate) holder_name: Option<HolderName>,
    /// Someone was refused this grant (an acquire, or a watch's read): its release is
    /// announced. Never set on a record kept after release.
    pub(crate) marked: bool,
}

/// What a released record's token opens with: not Base64URL, so no owner token is ever equal
/// to a released record's.
pub(crate) const RELEASED: char = '~';

impl Stored {
    /// Returns true if and only if this is a grant released before its hold ended.
    pub(crate) fn is_released(&self) -> bool {
        self.token.starts_with(RELEASED)
    }

    /// Returns the holder's fingerprint: of its token, or the one a released record keeps.
    pub(crate) fn holder(&self) -> Option<HolderFingerprint> {
        match self.token.strip_prefix(RELEASED) {
            Some(kept) => HolderFingerprint::parse(kept),
            None => Some(HolderFingerprint::of_token_text(&self.token)),
        }
    }
}

/// A value that something other than leasehold wrote at a lease key or a fence counter, as a
/// test plants it ([`SimServer::plant_at_lease_key`](crate::SimServer::plant_at_lease_key),
/// [`SimServer::plant_at_fence_counter`](crate::SimServer::plant_at_fence_counter)).
///
/// The scripts refuse such a key with [`UnusableKey`](leasehold::UnusableKey) and change
/// nothing, as they do on a real server: a value of another type at the lease key is
/// `LeaseWrongType`, a string `LeaseForeignValue`; at the counter, `CounterWrongType` and
/// `CounterNotAFence`. The string's length does not change the answer (on a real server, a
/// string longer than any lease value is refused without being read): the simulation keeps
/// none of it. A planted value has no TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ForeignValue {
    /// A value of another type: a hash, a list, a set, as `HSET` or `RPUSH` leaves it.
    OtherType,
    /// A string that is not of a form the scripts write (at a lease key: not a grant nor a
    /// record kept after release; at a counter: not a fence), of any length.
    String,
}

/// A fence counter: the last fence it gave, and when it expires by the server's clock in
/// milliseconds. Every grant sets its TTL (the counter idle expiry, as `acquire.lua` does); one
/// set by hand ([`SimServer::set_fence_counter`](crate::SimServer::set_fence_counter), as
/// `SET` would) has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counter {
    pub(crate) value: u64,
    pub(crate) expires_at_ms: Option<i64>,
}

/// Every key on the server: lease keys and fence counters, and values leasehold did not
/// write. Cloned whole for the snapshots a lossy failover goes back to.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Keyspace {
    pub(crate) leases: BTreeMap<String, Stored>,
    pub(crate) fences: BTreeMap<String, Counter>,
    /// Values planted at lease keys or fence counters, by key: a key is in at most one of the
    /// three maps.
    pub(crate) foreign: BTreeMap<String, ForeignValue>,
    /// Semaphores by their base key: capacity records and queues (their slots are lease
    /// keys, their counters fence counters).
    pub(crate) semaphores: BTreeMap<String, crate::semaphore::SemaphoreRecord>,
}

/// The lease key of a resource.
pub(crate) fn key_of(purpose: &Purpose, resource: &ResourceDigest) -> String {
    format!("{purpose}:{{{resource}}}")
}

/// The fence counter's key beside `lease_key` (same hash tag, so same slot).
pub(crate) fn fence_key(lease_key: &str) -> String {
    format!("{lease_key}:fence")
}

impl Keyspace {
    /// Returns the lease stored at `key` at `now` (server milliseconds), removing it if it
    /// expired: Redis treats a key as gone once `now > expiry`, so a key whose PTTL reads 0
    /// still exists for that millisecond.
    pub(crate) fn live(&mut self, key: &str, now: i64) -> Option<Stored> {
        match self.leases.get(key) {
            Some(stored) if now > stored.expires_at_ms => {
                self.leases.remove(key);
                None
            }
            other => other.cloned(),
        }
    }

    /// Returns the fence counter at `key` at `now` (server milliseconds), unless it has
    /// expired, by the same rule as a lease. An expired one is left in the map: no reader can
    /// see it, and the next grant writes over it.
    pub(crate) fn counter(&self, key: &str, now: i64) -> Option<u64> {
        self.fences
            .get(key)
            .filter(|counter| counter.expires_at_ms.is_none_or(|at| now <= at))
            .map(|counter| counter.value)
    }
}
