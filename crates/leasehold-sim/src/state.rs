//! What a simulated server holds between requests: its keyspace, the snapshots a lossy failover
//! goes back to, late requests still on their way, downtime, and the record of renewals and
//! releases that should never have succeeded.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use leasehold::{Failure, Unavailable, UnavailableCause};

use crate::RequestKind;
use crate::keyspace::{Keyspace, Stored};
use crate::oracle::NonOwnerSuccess;
use crate::script::{Exact, WireOp};
use crate::units::duration_ms;

/// How many pre-write snapshots a server keeps for lossy failovers.
const HISTORY: usize = 32;

/// One write that was sent but will be applied later (a late request).
#[derive(Clone)]
pub(crate) struct Pending {
    /// When it arrives, by the server's clock in milliseconds.
    pub(crate) apply_at_ms: i64,
    pub(crate) op: WireOp,
}

/// A server's state; [`crate::SimServer`] keeps it behind a mutex.
pub(crate) struct ServerState {
    /// The server's clock minus the world's, in milliseconds (stepped by tests).
    pub(crate) offset_ms: i64,
    pub(crate) keyspace: Keyspace,
    /// The keyspace before each of the last [`HISTORY`] writes, oldest first.
    pub(crate) history: VecDeque<Keyspace>,
    pub(crate) pending: Vec<Pending>,
    /// How many restarts and lossy failovers the server went through.
    pub(crate) lineage: u64,
    /// How many failovers replaced the master: the term a grant is made in, as the Redis
    /// backend counts it on Sentinel (a restart keeps the term, as a restarted standalone
    /// server does).
    pub(crate) term: u64,
    /// Until when, by the world clock, the server refuses every request, and why (a restart or
    /// failover in progress).
    pub(crate) down: Option<(Duration, &'static str)>,
    /// Renewals and releases that succeeded for a requester other than the stored holder.
    pub(crate) non_owner_successes: Vec<NonOwnerSuccess>,
    /// Release notices by key: what `release.lua` publishes when it deletes a marked grant.
    pub(crate) notices: HashMap<String, Arc<tokio::sync::Notify>>,
    /// How many releases were announced, watched or not (what `PUBLISH` counts on Redis).
    pub(crate) announced: u64,
}

impl std::fmt::Debug for ServerState {
    // Counts only: the stored values hold owner tokens.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerState")
            .field("offset_ms", &self.offset_ms)
            .field("leases", &self.keyspace.leases.len())
            .field("pending", &self.pending.len())
            .field("lineage", &self.lineage)
            .field("down", &self.down)
            .finish_non_exhaustive()
    }
}

impl ServerState {
    /// An empty server, up, with its clock on the world's.
    pub(crate) fn new() -> Self {
        Self {
            offset_ms: 0,
            keyspace: Keyspace::default(),
            history: VecDeque::new(),
            pending: Vec::new(),
            lineage: 0,
            term: 0,
            down: None,
            non_owner_successes: Vec::new(),
            notices: HashMap::new(),
            announced: 0,
        }
    }

    /// Announces the release of `key` to its watchers, as `release.lua`'s `PUBLISH` does.
    pub(crate) fn announce(&mut self, key: &str) {
        self.announced += 1;
        if let Some(notify) = self.notices.get(key) {
            notify.notify_waiters();
        }
    }

    /// Marks the grant at `key`, if it is an unmarked grant (not a record kept after
    /// release), so that its release is announced: the `APPEND` of `acquire.lua` and of
    /// `inspect.lua`'s watch form. A write like any other, so a lossy failover can lose the mark and keep the
    /// grant; its watchers are woken by the failover and mark the grant again as they retry.
    pub(crate) fn mark(&mut self, key: &str) {
        let unmarked = self
            .keyspace
            .leases
            .get(key)
            .is_some_and(|stored| !stored.marked && !stored.is_released());
        if unmarked {
            self.before_write();
            if let Some(stored) = self.keyspace.leases.get_mut(key) {
                stored.marked = true;
            }
        }
    }

    /// Wakes every watcher, as the Redis backend does when its notice connection comes back
    /// (a notice may have been missed while it was away).
    pub(crate) fn announce_all(&self) {
        for notify in self.notices.values() {
            notify.notify_waiters();
        }
    }

    /// Records a success for anyone but the exact stored grant (invariant I1's oracle).
    pub(crate) fn audit(&mut self, request: RequestKind, stored: &Stored, requester: &Exact) {
        if (stored.fence, &stored.token, &stored.operation)
            != (requester.0, &requester.1, &requester.2)
        {
            self.non_owner_successes.push(NonOwnerSuccess {
                request,
                fence: requester.0,
                stored_fence: stored.fence,
            });
        }
    }

    /// Returns the refusal for a request that reaches the server at `world` (by the world
    /// clock), if the server is down then.
    pub(crate) fn refusal(&self, world: Duration) -> Option<Failure> {
        let (until, why) = self.down?;
        (world < until).then(|| {
            Failure::Unavailable(Unavailable::new(
                UnavailableCause::ConnectionRefused,
                format!("simulated server down: {why}"),
            ))
        })
    }

    /// Refuses every request until `until` (by the world clock), or longer if it is already
    /// down for longer.
    pub(crate) fn go_down(&mut self, until: Duration, why: &'static str) {
        let until = self.down.map_or(until, |(already, _)| already.max(until));
        self.down = Some((until, why));
    }

    /// Applies a late request that arrives at `at_ms` by the server's clock, unless the server
    /// is down then. Nobody reads the reply of a request the client gave up on.
    pub(crate) fn land(&mut self, op: &WireOp, at_ms: i64, fallback: Duration) {
        let world = duration_ms(at_ms - self.offset_ms);
        if self.refusal(world).is_none() {
            let _ = self.apply(op, at_ms.saturating_mul(1000), fallback);
        }
    }

    /// Applies the late requests that have arrived by `now`, in arrival order, each at its
    /// arrival time (for a running world clock).
    pub(crate) fn catch_up(&mut self, now: i64, fallback: Duration) {
        if self.pending.iter().all(|p| p.apply_at_ms > now) {
            return;
        }
        let (mut due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.apply_at_ms <= now);
        self.pending = later;
        due.sort_by_key(|p| p.apply_at_ms);
        for p in due {
            self.land(&p.op, p.apply_at_ms, fallback);
        }
    }

    /// Snapshots the keyspace before a write, so that a lossy failover can go back to it.
    pub(crate) fn before_write(&mut self) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(self.keyspace.clone());
    }
}
