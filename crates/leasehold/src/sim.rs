//! A simulated lease server and backend, for deterministic tests (feature `test-util`).
//!
//! [`SimServer`] keeps leases and fence counters in memory with exactly the semantics of the
//! Redis scripts (`leasehold-redis/lua/*.lua`): the same replies, the same fence rule, PTTLs in
//! whole milliseconds and Redis's expiry rule (a key is gone once the server's clock is *past*
//! its expiry). Time is virtual: one world clock, which clients read for validity; the
//! server's own clock is the world's plus an offset that tests can step.
//!
//! A new grant's fence is `max(counter + 1, server clock in microseconds)`, and the counter
//! becomes that fence (an absent counter counts as 0); a replay returns the stored fence. A
//! counter at [`FenceToken::MAX`] makes an acquire fail, definitely and with nothing written
//! ([`UnusableKey::FenceRangeExhausted`]). So fences grow by the server's clock even when the
//! counter is lost, as long as that clock does not go back by more than the loss took.
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
//!
//! [`SimBackend`] is one client's connection to the server, with faults injected into its next
//! calls: a request lost before it is applied, a reply lost after, a request or reply delayed,
//! or a request that arrives *after* the client gave up on it. Server-wide faults — clock steps,
//! a restart without persistence, a failover that loses the last writes — are methods of
//! [`SimServer`]. Every request a backend sends is logged ([`SimBackend::sent`]).
//!
//! The world clock is one of two kinds:
//!
//! - a [`ManualClock`] ([`SimServer::new`]), moved only by [`SimServer::advance`] and by the
//!   faults themselves. Every future here then completes on its first poll ([`run_now`]):
//!   nothing waits, and a whole scenario runs in one synchronous step function.
//! - a clock that moves by itself ([`SimServer::with_clock`]), meant to be
//!   [`TokioClock`](crate::TokioClock) under `#[tokio::test(start_paused = true)]`. Time then
//!   passes as tokio's does: a lost request or reply makes the call wait out its command
//!   timeout with `tokio::time::sleep`, a delay sleeps, and a late request lands when the clock
//!   gets there. This is what lets the keep-alive watchdog, which sleeps on tokio timers, run
//!   against the simulated server.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::backend::{AcquireReply, Grant, GrantReply, LeaseBackend, ReleaseReply, RenewReply};
use crate::clock::{Clock, ManualClock, MonotonicInstant};
use crate::fence::FenceToken;
use crate::id::{Attempt, HolderFingerprint, Purpose, ResourceDigest};
use crate::outcome::{
    Contention, Failure, Indeterminate, IndeterminateCause, InspectOutcome, LeaseView, LossCause,
    Unavailable, UnavailableCause, UnusableKey,
};
use crate::request::LeaseRequest;

/// How many pre-write snapshots a server keeps for lossy failovers.
const HISTORY: usize = 32;

/// What the server stores for a lease: `"<fence>:<token>:<operation>"` and its expiry.
/// No `Debug`: it holds an owner token.
#[derive(Clone, PartialEq, Eq)]
struct Stored {
    fence: u64,
    token: String,
    operation: String,
    expires_at_ms: i64,
}

#[derive(Clone, Default, PartialEq, Eq)]
struct Data {
    leases: BTreeMap<String, Stored>,
    fences: BTreeMap<String, u64>,
}

/// One write that was sent but will be applied later (a late request).
#[derive(Clone)]
struct Pending {
    apply_at_ms: i64,
    op: WireOp,
}

/// A request as the server receives it.
#[derive(Clone)]
enum WireOp {
    Acquire {
        key: String,
        token: String,
        operation: String,
        ttl_ms: i64,
    },
    Renew {
        key: String,
        exact: (u64, String, String),
        ttl_ms: i64,
    },
    Release {
        key: String,
        exact: (u64, String, String),
    },
}

struct ServerState {
    offset_ms: i64,
    data: Data,
    history: VecDeque<Data>,
    pending: Vec<Pending>,
    lineage: u64,
    /// Until when, by the world clock, the server refuses every request, and why (a restart or
    /// failover in progress).
    down: Option<(Duration, &'static str)>,
    /// Renewals and releases that succeeded for a requester other than the stored holder.
    non_owner_successes: Vec<String>,
}

impl std::fmt::Debug for ServerState {
    // Counts only: the stored values hold owner tokens.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerState")
            .field("offset_ms", &self.offset_ms)
            .field("leases", &self.data.leases.len())
            .field("pending", &self.pending.len())
            .field("lineage", &self.lineage)
            .field("down", &self.down)
            .finish_non_exhaustive()
    }
}

/// The grant a simulated server holds for a resource right now, for test oracles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredGrant {
    /// The grant's fence.
    pub fence: FenceToken,
    /// The holder's fingerprint.
    pub holder: HolderFingerprint,
    /// The holder's operation id.
    pub operation: String,
    /// The key's remaining time to live, by the server's clock.
    pub server_ttl: Duration,
}

/// The world's clock.
#[derive(Debug, Clone)]
enum World {
    /// Moves only when told to.
    Manual(ManualClock),
    /// Moves by itself, with tokio's time.
    Running(Arc<dyn Clock>),
}

impl World {
    fn clock(&self) -> &dyn Clock {
        match self {
            World::Manual(clock) => clock,
            World::Running(clock) => clock.as_ref(),
        }
    }
}

/// An in-memory lease server with a virtual clock. Clones share the server.
#[derive(Debug, Clone)]
pub struct SimServer {
    world: World,
    state: Arc<Mutex<ServerState>>,
    retry_after_fallback: Duration,
}

fn key_of(purpose: &Purpose, resource: &ResourceDigest) -> String {
    format!("{purpose}:{{{resource}}}")
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn duration_ms(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn fingerprint(token: &str) -> HolderFingerprint {
    HolderFingerprint::of_token_text(token)
}

impl ServerState {
    /// Removes `key` if it expired: Redis treats a key as gone once `now > expiry`.
    fn live(&mut self, key: &str, now: i64) -> Option<Stored> {
        match self.data.leases.get(key) {
            Some(stored) if now > stored.expires_at_ms => {
                self.data.leases.remove(key);
                None
            }
            other => other.cloned(),
        }
    }

    /// Records a success for anyone but the exact stored grant (invariant I1's oracle).
    fn audit(&mut self, what: &str, stored: &Stored, requester: &(u64, String, String)) {
        if (stored.fence, &stored.token, &stored.operation)
            != (requester.0, &requester.1, &requester.2)
        {
            self.non_owner_successes.push(format!(
                "{what} succeeded for fence {} while fence {} was stored",
                requester.0, stored.fence
            ));
        }
    }

    /// Returns the refusal for a request that reaches the server at `world` (by the world
    /// clock), if the server is down then.
    fn refusal(&self, world: Duration) -> Option<Failure> {
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
    fn go_down(&mut self, until: Duration, why: &'static str) {
        let until = self.down.map_or(until, |(already, _)| already.max(until));
        self.down = Some((until, why));
    }

    /// Applies a late request that arrives at `at_ms` by the server's clock, unless the server
    /// is down then. Nobody reads the reply of a request the client gave up on.
    fn land(&mut self, op: &WireOp, at_ms: i64, fallback: Duration) {
        let world = duration_ms(at_ms - self.offset_ms);
        if self.refusal(world).is_none() {
            let _ = self.apply(op, at_ms.saturating_mul(1000), fallback);
        }
    }

    /// Applies the late requests that have arrived by `now`, in arrival order, each at its
    /// arrival time (for a running world clock).
    fn catch_up(&mut self, now: i64, fallback: Duration) {
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

    fn before_write(&mut self) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(self.data.clone());
    }

    /// Applies `op` at `now_us`, the server's clock in microseconds (its milliseconds, for
    /// expiry, are the same reading rounded down).
    fn apply(&mut self, op: &WireOp, now_us: i64, fallback: Duration) -> Applied {
        let now = now_us.div_euclid(1000);
        match op {
            WireOp::Acquire {
                key,
                token,
                operation,
                ttl_ms,
            } => match self.live(key, now) {
                None => {
                    let counter_key = format!("{key}:fence");
                    let counter = self.data.fences.get(&counter_key).copied().unwrap_or(0);
                    if let Some(unusable) = unusable_counter(counter) {
                        return Applied::Acquire(AcquireReply::Failed(Failure::Unavailable(
                            Unavailable::new(
                                UnavailableCause::UnusableKey(unusable),
                                format!("simulated: {unusable}"),
                            ),
                        )));
                    }
                    // A clock beyond the fence range (or before its origin) adds nothing.
                    let clock = u64::try_from(now_us)
                        .unwrap_or(0)
                        .min(FenceToken::MAX.get());
                    let fence = (counter + 1).max(clock);
                    self.before_write();
                    self.data.fences.insert(counter_key, fence);
                    self.data.leases.insert(
                        key.clone(),
                        Stored {
                            fence,
                            token: token.clone(),
                            operation: operation.clone(),
                            expires_at_ms: now + ttl_ms,
                        },
                    );
                    Applied::Acquire(AcquireReply::Granted(GrantReply::new(
                        FenceToken::new(fence).unwrap_or(FenceToken::MIN),
                        duration_ms(*ttl_ms),
                    )))
                }
                Some(stored) => {
                    let pttl = stored.expires_at_ms - now;
                    let fence = FenceToken::new(stored.fence).unwrap_or(FenceToken::MIN);
                    let contention = Contention::new(
                        if pttl > 0 {
                            duration_ms(pttl)
                        } else {
                            fallback
                        },
                        Some(fingerprint(&stored.token)),
                        Some(fence),
                    );
                    Applied::Acquire(if stored.token == *token {
                        if stored.operation == *operation {
                            AcquireReply::Replayed(GrantReply::new(fence, duration_ms(pttl)))
                        } else {
                            AcquireReply::OwnerOperationConflict(contention)
                        }
                    } else {
                        AcquireReply::Contended(contention)
                    })
                }
            },
            WireOp::Renew { key, exact, ttl_ms } => match self.live(key, now) {
                None => Applied::Renew(RenewReply::Lost(LossCause::Absent)),
                Some(stored) if !matches_exact(&stored, exact) => {
                    Applied::Renew(RenewReply::Lost(LossCause::OtherHolder))
                }
                Some(stored) => {
                    self.audit("renew", &stored, exact);
                    self.before_write();
                    if let Some(stored) = self.data.leases.get_mut(key) {
                        stored.expires_at_ms = now + ttl_ms;
                    }
                    Applied::Renew(RenewReply::Renewed {
                        server_ttl: duration_ms(*ttl_ms),
                    })
                }
            },
            WireOp::Release { key, exact } => match self.live(key, now) {
                None => Applied::Release(ReleaseReply::AlreadyGone),
                Some(stored) if !matches_exact(&stored, exact) => {
                    Applied::Release(ReleaseReply::NotOwner)
                }
                Some(stored) => {
                    self.audit("release", &stored, exact);
                    self.before_write();
                    self.data.leases.remove(key);
                    Applied::Release(ReleaseReply::Released)
                }
            },
        }
    }
}

/// Returns what is wrong with a fence counter that no new grant can follow, if anything.
fn unusable_counter(counter: u64) -> Option<UnusableKey> {
    let max = FenceToken::MAX.get();
    match counter {
        c if c > max => Some(UnusableKey::CounterNotAFence),
        c if c == max => Some(UnusableKey::FenceRangeExhausted),
        _ => None,
    }
}

fn matches_exact(stored: &Stored, exact: &(u64, String, String)) -> bool {
    stored.fence == exact.0 && stored.token == exact.1 && stored.operation == exact.2
}

enum Applied {
    Acquire(AcquireReply),
    Renew(RenewReply),
    Release(ReleaseReply),
}

impl SimServer {
    /// Makes an empty server on the world clock `clock`, which moves only when told to (by
    /// [`advance`](Self::advance), or by a fault that takes time).
    pub fn new(clock: ManualClock) -> Self {
        Self::on(World::Manual(clock))
    }

    /// Makes an empty server on a world clock that moves by itself, such as
    /// [`TokioClock`](crate::TokioClock) under tokio's paused time. Faults that take time
    /// wait for it with `tokio::time::sleep`, so the clock must move with tokio's time; give
    /// the clients the same clock.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::on(World::Running(Arc::new(clock)))
    }

    fn on(world: World) -> Self {
        Self {
            world,
            state: Arc::new(Mutex::new(ServerState {
                offset_ms: 0,
                data: Data::default(),
                history: VecDeque::new(),
                pending: Vec::new(),
                lineage: 0,
                down: None,
                non_owner_successes: Vec::new(),
            })),
            retry_after_fallback: Duration::from_millis(50),
        }
    }

    fn lock(&self) -> MutexGuard<'_, ServerState> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let World::Running(_) = self.world {
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
    fn server_now(&self, state: &ServerState) -> i64 {
        self.server_now_us(state).div_euclid(1000)
    }

    /// The server's clock in microseconds (what the scripts read with `TIME`).
    fn server_now_us(&self, state: &ServerState) -> i64 {
        micros(self.world_now()).saturating_add(state.offset_ms.saturating_mul(1000))
    }

    fn world_now(&self) -> Duration {
        self.world.clock().now().since_origin()
    }

    /// Lets `by` pass on the world clock: moves a manual clock (at once), or sleeps while a
    /// running one moves.
    async fn pass(&self, by: Duration) {
        match &self.world {
            World::Manual(_) => self.advance(by),
            World::Running(_) => tokio::time::sleep(by).await,
        }
    }

    /// Moves the world clock forward by `by`, applying late requests as their time comes.
    ///
    /// # Panics
    ///
    /// If the world clock moves by itself ([`with_clock`](Self::with_clock)): sleep instead.
    pub fn advance(&self, by: Duration) {
        let World::Manual(clock) = &self.world else {
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
        state.data = Data::default();
        state.history.clear();
        state.pending.clear();
        state.lineage += 1;
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
            state.data = state.history[keep].clone();
            state.history.truncate(keep);
            state.lineage += 1;
        }
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
    pub fn non_owner_successes(&self) -> Vec<String> {
        self.lock().non_owner_successes.clone()
    }

    /// Returns how many restarts and lossy failovers the server went through.
    pub fn lineage(&self) -> u64 {
        self.lock().lineage
    }

    /// Deletes a lease by hand (as `DEL` would), leaving its fence counter.
    pub fn delete(&self, purpose: &Purpose, resource: &ResourceDigest) {
        let mut state = self.lock();
        state.before_write();
        state.data.leases.remove(&key_of(purpose, resource));
    }

    /// Sets a fence counter by hand (as `SET` would), for example to [`FenceToken::MAX`].
    /// A value above it is not a fence: acquires then fail as the scripts do
    /// ([`UnusableKey::CounterNotAFence`]).
    pub fn set_fence_counter(&self, purpose: &Purpose, resource: &ResourceDigest, value: u64) {
        let mut state = self.lock();
        state.before_write();
        let key = format!("{}:fence", key_of(purpose, resource));
        state.data.fences.insert(key, value);
    }

    /// Returns the fence counter of the resource, if it has one.
    pub fn fence_counter(&self, purpose: &Purpose, resource: &ResourceDigest) -> Option<u64> {
        let key = format!("{}:fence", key_of(purpose, resource));
        self.lock().data.fences.get(&key).copied()
    }

    /// Returns the grant the server holds for the resource now, if any.
    pub fn stored(&self, purpose: &Purpose, resource: &ResourceDigest) -> Option<StoredGrant> {
        let mut state = self.lock();
        let now = self.server_now(&state);
        let stored = state.live(&key_of(purpose, resource), now)?;
        Some(StoredGrant {
            fence: FenceToken::new(stored.fence)?,
            holder: fingerprint(&stored.token),
            operation: stored.operation,
            server_ttl: duration_ms(stored.expires_at_ms - now),
        })
    }

    /// Makes a client connection with `command_timeout` for lost requests and replies.
    pub fn connect(&self, command_timeout: Duration) -> SimBackend {
        SimBackend {
            server: self.clone(),
            command_timeout,
            faults: Mutex::new(VecDeque::new()),
            sent: Mutex::new(Vec::new()),
        }
    }

    fn inspect_now(&self, key: &str, attempt: Option<&Attempt>) -> InspectOutcome {
        let mut state = self.lock();
        if let Some(refused) = state.refusal(self.world_now()) {
            return refused.into();
        }
        let now = self.server_now(&state);
        let Some(stored) = state.live(key, now) else {
            return InspectOutcome::Free;
        };
        let pttl = stored.expires_at_ms - now;
        let view = LeaseView::new(
            FenceToken::new(stored.fence),
            (pttl > 0).then(|| duration_ms(pttl)),
            Some(fingerprint(&stored.token)),
        );
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

/// A fault injected into a client's next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The request is lost before the server applies it; the client times out.
    LoseRequest,
    /// The server applies the request and the reply is lost; the client times out.
    LoseReply,
    /// The request reaches the server after this delay (shorter than the command timeout).
    DelayRequest(Duration),
    /// The reply reaches the client after this delay (shorter than the command timeout).
    DelayReply(Duration),
    /// The client times out, and the request reaches the server this long after it was sent
    /// (longer than the command timeout): applied when the world clock gets there.
    LateRequest(Duration),
}

/// What a request sent by a [`SimBackend`] asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RequestKind {
    /// An acquire.
    Acquire,
    /// A renewal.
    Renew,
    /// A release.
    Release,
    /// An inspection.
    Inspect,
}

/// A request a [`SimBackend`] sent, for test oracles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SentRequest {
    /// The world clock's reading when the request left the client (before any fault delayed
    /// or lost it).
    pub at: MonotonicInstant,
    /// What it asked for.
    pub kind: RequestKind,
}

/// One client's connection to a [`SimServer`], with injectable faults.
#[derive(Debug)]
pub struct SimBackend {
    server: SimServer,
    command_timeout: Duration,
    faults: Mutex<VecDeque<Fault>>,
    sent: Mutex<Vec<SentRequest>>,
}

impl SimBackend {
    /// Queues a fault for the next call.
    pub fn inject(&self, fault: Fault) {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(fault);
    }

    /// Queues `fault` for each of the next `calls` calls.
    pub fn inject_many(&self, fault: Fault, calls: usize) {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(std::iter::repeat_n(fault, calls));
    }

    /// Drops every queued fault that no call has taken yet.
    pub fn clear_faults(&self) {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Returns every request this backend sent, oldest first, whatever became of it.
    pub fn sent(&self) -> Vec<SentRequest> {
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Returns the server.
    pub fn server(&self) -> &SimServer {
        &self.server
    }

    fn timed_out(&self) -> Failure {
        Failure::Indeterminate(Indeterminate::new(
            IndeterminateCause::ResponseTimeout,
            "simulated timeout",
        ))
    }

    /// Logs a request leaving the client and takes the fault for it, if one is queued.
    fn depart(&self, kind: RequestKind) -> Option<Fault> {
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(SentRequest {
                at: self.server.clock().now(),
                kind,
            });
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
    }

    /// Sends `op` through the next fault, if any. On a manual world clock it never waits.
    async fn send(&self, kind: RequestKind, op: WireOp) -> Result<Applied, Failure> {
        let fault = self.depart(kind);
        let server = &self.server;
        let apply = || {
            let mut state = server.lock();
            if let Some(refused) = state.refusal(server.world_now()) {
                return Err(refused);
            }
            let now_us = server.server_now_us(&state);
            Ok(state.apply(&op, now_us, server.retry_after_fallback))
        };
        match fault {
            None => apply(),
            Some(Fault::LoseRequest) => {
                server.pass(self.command_timeout).await;
                Err(self.timed_out())
            }
            Some(Fault::LoseReply) => {
                let _ = apply();
                server.pass(self.command_timeout).await;
                Err(self.timed_out())
            }
            Some(Fault::DelayRequest(d)) => {
                server.pass(d.min(self.command_timeout)).await;
                apply()
            }
            Some(Fault::DelayReply(d)) => {
                let applied = apply();
                server.pass(d.min(self.command_timeout)).await;
                applied
            }
            Some(Fault::LateRequest(d)) => {
                {
                    let mut state = server.lock();
                    let at = server.server_now(&state) + millis(d.max(self.command_timeout));
                    state.pending.push(Pending {
                        apply_at_ms: at,
                        op: op.clone(),
                    });
                }
                server.pass(self.command_timeout).await;
                Err(self.timed_out())
            }
        }
    }
}

fn exact(grant: &Grant) -> (u64, String, String) {
    (
        grant.fence().get(),
        grant.attempt().owner_token().expose_secret().to_owned(),
        grant.attempt().operation().as_str().to_owned(),
    )
}

impl LeaseBackend for SimBackend {
    async fn acquire(&self, request: &LeaseRequest) -> AcquireReply {
        let op = WireOp::Acquire {
            key: key_of(request.purpose(), request.resource()),
            token: request.attempt().owner_token().expose_secret().to_owned(),
            operation: request.attempt().operation().as_str().to_owned(),
            ttl_ms: millis(request.ttl()),
        };
        match self.send(RequestKind::Acquire, op).await {
            Ok(Applied::Acquire(reply)) => reply,
            Ok(_) => AcquireReply::Failed(self.timed_out()),
            Err(failure) => AcquireReply::Failed(failure),
        }
    }

    async fn renew(&self, grant: &Grant) -> RenewReply {
        let op = WireOp::Renew {
            key: key_of(grant.purpose(), grant.resource()),
            exact: exact(grant),
            ttl_ms: millis(grant.ttl()),
        };
        match self.send(RequestKind::Renew, op).await {
            Ok(Applied::Renew(reply)) => reply,
            Ok(_) => RenewReply::Failed(self.timed_out()),
            Err(failure) => RenewReply::Failed(failure),
        }
    }

    async fn release(&self, grant: &Grant) -> ReleaseReply {
        let op = WireOp::Release {
            key: key_of(grant.purpose(), grant.resource()),
            exact: exact(grant),
        };
        match self.send(RequestKind::Release, op).await {
            Ok(Applied::Release(reply)) => reply,
            Ok(_) => ReleaseReply::Failed(self.timed_out()),
            Err(failure) => ReleaseReply::Failed(failure),
        }
    }

    async fn inspect(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        attempt: Option<&Attempt>,
    ) -> InspectOutcome {
        // Inspection changes nothing, so a lost reply is only an unknown answer.
        match self.depart(RequestKind::Inspect) {
            Some(Fault::LoseRequest | Fault::LoseReply | Fault::LateRequest(_)) => {
                self.server.pass(self.command_timeout).await;
                self.timed_out().into()
            }
            Some(Fault::DelayRequest(d) | Fault::DelayReply(d)) => {
                self.server.pass(d.min(self.command_timeout)).await;
                self.server.inspect_now(&key_of(purpose, resource), attempt)
            }
            None => self.server.inspect_now(&key_of(purpose, resource), attempt),
        }
    }
}

/// Polls a future that must complete at once (every simulated call on a manual world clock
/// does).
///
/// # Panics
///
/// If the future is not ready on its first poll.
pub fn run_now<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("a simulated call waited; simulated calls never wait"),
    }
}
