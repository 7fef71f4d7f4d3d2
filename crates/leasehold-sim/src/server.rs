//! The simulated server: its world clock, the passing of time, the faults that hit the whole
//! server, and what it shows test oracles.
//!
//! Time is virtual: one world clock, which clients read for validity; the server's own clock is
//! the world's plus an offset that [`SimServer::step_clock`] moves. A key is gone once the
//! server's clock is *past* its expiry, as in Redis.
//!
//! Losses take time. A restart or a failover takes a downtime (at least
//! [`SimServer::MIN_DOWNTIME`]) by the world clock, during which the server refuses every
//! request, definitely without applying it (`Unavailable`, `ConnectionRefused`), and a late
//! request that arrives then is dropped. Once the server is back, its clock has moved on by
//! the downtime, so with a clock that behaves, a lost counter starts again above every fence
//! issued before the loss. The failover's new primary reads the same clock as the old one;
//! [`SimServer::step_clock`] around a failover models a replica whose clock is behind or ahead.
//! (The counter runs ahead of the clock only by the grants made within one microsecond of
//! server time, which a millisecond of downtime covers unless a test makes a thousand grants
//! of one resource without letting time pass.)

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use leasehold::backend::ReleaseWatch;
use leasehold::{
    Attempt, Clock, FenceToken, HolderFingerprint, InspectOutcome, LeaseView, ManualClock, Purpose,
    ResourceDigest,
};

use crate::backend::SimBackend;
use crate::keyspace::{Counter, ForeignValue, Keyspace, fence_key, key_of};
use crate::oracle::{NonOwnerSuccess, StoredGrant};
use crate::script::{refused, unusable_counter_of, unusable_lease};
use crate::state::ServerState;
use crate::units::{duration_ms, micros, millis};

/// The world's clock.
#[derive(Debug, Clone)]
enum WorldClock {
    /// Moves only when told to.
    Manual(ManualClock),
    /// Moves by itself, with tokio's time.
    Running(Arc<dyn Clock>),
}

impl WorldClock {
    fn clock(&self) -> &dyn Clock {
        match self {
            WorldClock::Manual(clock) => clock,
            WorldClock::Running(clock) => clock.as_ref(),
        }
    }
}

/// An in-memory lease server with a virtual clock. Clones share the server.
#[derive(Debug, Clone)]
pub struct SimServer {
    world: WorldClock,
    state: Arc<Mutex<ServerState>>,
    pub(crate) retry_after_fallback: Duration,
}

impl SimServer {
    /// Makes an empty server on the world clock `clock`, which moves only when told to (by
    /// [`advance`](Self::advance), or by a fault that takes time).
    pub fn new(clock: ManualClock) -> Self {
        Self::on(WorldClock::Manual(clock))
    }

    /// Makes an empty server on a world clock that moves by itself, such as
    /// [`TokioClock`](leasehold::TokioClock) under tokio's paused time. Faults that take time
    /// wait for it with `tokio::time::sleep`, so the clock must move with tokio's time; give
    /// the clients the same clock.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::on(WorldClock::Running(Arc::new(clock)))
    }

    fn on(world: WorldClock) -> Self {
        Self {
            world,
            state: Arc::new(Mutex::new(ServerState::new())),
            retry_after_fallback: Duration::from_millis(50),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, ServerState> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let WorldClock::Running(_) = self.world {
            // Nobody moves a running clock step by step, so late requests are applied when
            // the server is next looked at, each at its own arrival time: no request or
            // inspection can observe the server between those times and now.
            let now = self.server_now(&state);
            state.catch_up(now, self.retry_after_fallback);
        }
        state
    }

    /// Returns the world clock.
    pub fn clock(&self) -> &dyn Clock {
        self.world.clock()
    }

    /// The server's clock in milliseconds.
    pub(crate) fn server_now(&self, state: &ServerState) -> i64 {
        self.server_now_us(state).div_euclid(1000)
    }

    /// The server's clock in microseconds (what the scripts read with `TIME`).
    pub(crate) fn server_now_us(&self, state: &ServerState) -> i64 {
        micros(self.world_now()).saturating_add(state.offset_ms.saturating_mul(1000))
    }

    pub(crate) fn world_now(&self) -> Duration {
        self.world.clock().now().since_origin()
    }

    /// Lets `by` pass on the world clock: moves a manual clock (at once), or sleeps while a
    /// running one moves.
    pub(crate) async fn pass(&self, by: Duration) {
        match &self.world {
            WorldClock::Manual(_) => self.advance(by),
            WorldClock::Running(_) => tokio::time::sleep(by).await,
        }
    }

    /// Moves the world clock forward by `by`, applying late requests as their time comes.
    ///
    /// # Panics
    ///
    /// If the world clock moves by itself ([`with_clock`](Self::with_clock)): sleep instead.
    pub fn advance(&self, by: Duration) {
        let WorldClock::Manual(clock) = &self.world else {
            panic!("SimServer::advance needs a manual world clock; with a running one, sleep");
        };
        let target = clock.now().since_origin() + by;
        loop {
            let next = {
                let state = self.lock();
                let now = self.server_now(&state);
                state
                    .pending
                    .iter()
                    .map(|p| p.apply_at_ms)
                    .filter(|&at| at - state.offset_ms <= millis(target))
                    .min()
                    .map(|at| (at, at - now))
            };
            let Some((_, wait)) = next else { break };
            clock.advance(duration_ms(wait));
            self.apply_due();
        }
        let now = clock.now().since_origin();
        clock.advance(target.saturating_sub(now));
        self.apply_due();
    }

    fn apply_due(&self) {
        let mut state = self.lock();
        let now = self.server_now(&state);
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut state.pending)
            .into_iter()
            .partition(|p| p.apply_at_ms <= now);
        state.pending = later;
        for p in due {
            state.land(&p.op, now, self.retry_after_fallback);
        }
    }

    /// Steps the server's clock (not the world's) by `ms`, forward or back.
    pub fn step_clock(&self, ms: i64) {
        self.lock().offset_ms += ms;
    }

    /// The shortest downtime of a restart or failover: a real one takes milliseconds at
    /// least. Shorter downtimes are taken as this.
    pub const MIN_DOWNTIME: Duration = Duration::from_millis(1);

    /// Restarts the server without persistence: every lease and fence counter is gone, and
    /// requests in flight are lost. The server is down for `downtime` (at least
    /// [`MIN_DOWNTIME`](Self::MIN_DOWNTIME)) by the world clock, from now: it refuses every
    /// request until then (`Unavailable`, definitely not applied).
    pub fn restart(&self, downtime: Duration) {
        let mut state = self.lock();
        state.keyspace = Keyspace::default();
        state.history.clear();
        state.pending.clear();
        state.lineage += 1;
        // The notice connection breaks with the server: its watchers look again.
        state.announce_all();
        state.go_down(
            self.world_now() + downtime.max(Self::MIN_DOWNTIME),
            "restarting",
        );
    }

    /// Fails over to a replica that missed the last `k` writes (lease keys and fence
    /// increments alike). Returns how many writes were actually lost. Whatever it loses, the
    /// failover takes `downtime` (at least [`MIN_DOWNTIME`](Self::MIN_DOWNTIME)) by the world
    /// clock, from now, during which every request is refused (`Unavailable`, definitely not
    /// applied) and late requests that arrive are dropped; later ones reach the new primary.
    pub fn failover(&self, k: usize, downtime: Duration) -> usize {
        let mut state = self.lock();
        let lost = k.min(state.history.len());
        if lost > 0 {
            let keep = state.history.len() - lost;
            state.keyspace = state.history[keep].clone();
            state.history.truncate(keep);
            state.lineage += 1;
        }
        // Another master answers from now on, whatever it lost.
        state.term += 1;
        state.announce_all();
        state.go_down(
            self.world_now() + downtime.max(Self::MIN_DOWNTIME),
            "failing over",
        );
        lost
    }

    /// Returns true if and only if the server refuses requests now (a restart or failover is
    /// in progress).
    pub fn is_down(&self) -> bool {
        let state = self.lock();
        state.refusal(self.world_now()).is_some()
    }

    /// Returns every renewal or release that succeeded for someone who was not the stored
    /// holder (empty unless the server's semantics are broken).
    pub fn non_owner_successes(&self) -> Vec<NonOwnerSuccess> {
        self.lock().non_owner_successes.clone()
    }

    /// Returns how many restarts and lossy failovers the server went through.
    pub fn lineage(&self) -> u64 {
        self.lock().lineage
    }

    /// Deletes a lease by hand (as `DEL` would), leaving its fence counter; a value planted
    /// at the lease key goes too.
    pub fn delete(&self, purpose: &Purpose, resource: &ResourceDigest) {
        let mut state = self.lock();
        state.before_write();
        let key = key_of(purpose, resource);
        state.keyspace.leases.remove(&key);
        state.keyspace.foreign.remove(&key);
    }

    /// Sets a fence counter by hand (as `SET` would, with no TTL), for example to
    /// [`FenceToken::MAX`]. A value above it is not a fence: acquires then fail as the scripts
    /// do ([`UnusableKey::CounterNotAFence`](leasehold::UnusableKey::CounterNotAFence)).
    pub fn set_fence_counter(&self, purpose: &Purpose, resource: &ResourceDigest, value: u64) {
        let mut state = self.lock();
        state.before_write();
        let key = fence_key(&key_of(purpose, resource));
        state.keyspace.foreign.remove(&key);
        state.keyspace.fences.insert(
            key,
            Counter {
                value,
                expires_at_ms: None,
            },
        );
    }

    /// Puts at the resource's lease key a value leasehold did not write, in place of whatever
    /// it held (as `DEL` and then `SET` or `HSET` would), with no TTL. Every lease call then
    /// refuses it and leaves it as it is: acquire and inspect with
    /// [`UnusableKey`](leasehold::UnusableKey) (see [`ForeignValue`]), renew with
    /// `Lost(OtherHolder)`, release with `NotOwner`. [`delete`](Self::delete) removes it.
    pub fn plant_at_lease_key(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        value: ForeignValue,
    ) {
        let mut state = self.lock();
        state.before_write();
        let key = key_of(purpose, resource);
        state.keyspace.leases.remove(&key);
        state.keyspace.foreign.insert(key, value);
    }

    /// Puts at the resource's fence counter a value that is not a fence, in place of the
    /// counter (as `DEL` and then `SET` or `RPUSH` would): an acquire of the free lease, and
    /// its inspection, are refused with [`UnusableKey`](leasehold::UnusableKey) (see
    /// [`ForeignValue`]), and nothing is written. [`set_fence_counter`](Self::set_fence_counter)
    /// replaces it.
    pub fn plant_at_fence_counter(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        value: ForeignValue,
    ) {
        let mut state = self.lock();
        state.before_write();
        let key = fence_key(&key_of(purpose, resource));
        state.keyspace.fences.remove(&key);
        state.keyspace.foreign.insert(key, value);
    }

    /// Returns the fence counter of the resource, if it has one: none once it has expired,
    /// idle for its connection's
    /// [`counter_idle_expiry`](crate::SimBackend::counter_idle_expiry).
    pub fn fence_counter(&self, purpose: &Purpose, resource: &ResourceDigest) -> Option<u64> {
        let key = fence_key(&key_of(purpose, resource));
        let state = self.lock();
        state.keyspace.counter(&key, self.server_now(&state))
    }

    /// Returns how long the fence counter of the resource has left by the server's clock, in
    /// whole milliseconds as `PTTL` counts them: `None` if it has no counter (or it expired),
    /// `Some(None)` if its counter has no TTL (set by hand).
    pub fn fence_counter_ttl(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
    ) -> Option<Option<Duration>> {
        let key = fence_key(&key_of(purpose, resource));
        let state = self.lock();
        let now = self.server_now(&state);
        state.keyspace.counter(&key, now)?;
        let counter = state.keyspace.fences.get(&key)?;
        Some(counter.expires_at_ms.map(|at| duration_ms(at - now)))
    }

    /// Returns the grant the server holds for the resource now, if any. A key kept after
    /// release until its minimum hold ends holds no grant: `None` (see
    /// [`is_held_after_release`](Self::is_held_after_release)).
    pub fn stored(&self, purpose: &Purpose, resource: &ResourceDigest) -> Option<StoredGrant> {
        let mut state = self.lock();
        let now = self.server_now(&state);
        let stored = state.keyspace.live(&key_of(purpose, resource), now)?;
        if stored.is_released() {
            return None;
        }
        Some(StoredGrant {
            fence: FenceToken::new(stored.fence)?,
            holder: HolderFingerprint::of_token_text(&stored.token),
            operation: stored.operation,
            server_ttl: duration_ms(stored.expires_at_ms - now),
        })
    }

    /// Returns true if and only if the resource's key is kept now after its grant was
    /// released, until the grant's minimum hold ends.
    pub fn is_held_after_release(&self, purpose: &Purpose, resource: &ResourceDigest) -> bool {
        let mut state = self.lock();
        let now = self.server_now(&state);
        state
            .keyspace
            .live(&key_of(purpose, resource), now)
            .is_some_and(|stored| stored.is_released())
    }

    /// Makes a client connection with `command_timeout` for lost requests and replies.
    pub fn connect(&self, command_timeout: Duration) -> SimBackend {
        SimBackend::new(self.clone(), command_timeout)
    }

    /// Subscribes to release notices for `key` (shared by every connection).
    pub(crate) fn watch(&self, key: String) -> ReleaseWatch {
        let mut state = self.lock();
        let notify = state.notices.entry(key).or_default();
        ReleaseWatch::new(Arc::clone(notify))
    }

    /// Returns how many releases the server has announced, whether anyone heard them or not:
    /// what `INFO commandstats` counts as `PUBLISH` calls on Redis.
    pub fn notices_published(&self) -> u64 {
        self.lock().announced
    }

    /// Inspects `key`, and with `mark`, marks the grant found, as the watch form of
    /// `inspect.lua` does.
    pub(crate) fn inspect_now(
        &self,
        key: &str,
        attempt: Option<&Attempt>,
        mark: bool,
    ) -> InspectOutcome {
        let mut state = self.lock();
        if let Some(refused) = state.refusal(self.world_now()) {
            return refused.into();
        }
        let now = self.server_now(&state);
        // As `inspect.lua`: a value leasehold did not write is refused (and never marked),
        // and a free lease's counter is read, to tell whether it can be granted.
        if let Some(what) = unusable_lease(&state.keyspace, key) {
            return refused(what).into();
        }
        let Some(stored) = state.keyspace.live(key, now) else {
            return match unusable_counter_of(&state.keyspace, key, now) {
                Some(what) => refused(what).into(),
                None => InspectOutcome::Free,
            };
        };
        if mark {
            state.mark(key);
        }
        let pttl = stored.expires_at_ms - now;
        let view = LeaseView::new(
            FenceToken::new(stored.fence),
            (pttl > 0).then(|| duration_ms(pttl)),
            stored.holder(),
        )
        .with_holder_name(stored.holder_name.clone())
        .with_released(stored.is_released());
        let mine = attempt.is_some_and(|a| {
            a.owner_token().expose_secret() == stored.token
                && a.operation().as_str() == stored.operation
        });
        if mine {
            InspectOutcome::HeldByThisAttempt(view)
        } else {
            InspectOutcome::HeldByOther(view)
        }
    }
}
