//! The lease handle: conservative local validity and a coherent state machine.
//!
//! # Validity
//!
//! A grant's validity is counted from the clock reading taken *before* its command was sent,
//! never from when the reply arrived: the round trip, and any time the reply sat in a buffer,
//! is deducted from the lease instead of being added to it. It is also capped by the server's
//! reply, because a replay does not extend the key (defect 3 of the original):
//!
//! ```text
//! granted     = min(request TTL, reply PTTL) − (fixed drift + rate × TTL)
//! valid until = sent_at + granted
//! ```
//!
//! so a handle never believes it holds a lease longer than the server keeps the key (as long as
//! the server's clock does not run faster than the drift budget allows).
//!
//! # States and transitions
//!
//! `Lost` and `Released` are terminal: nothing leaves them and no command is sent from them.
//! Time passing is an event too: an `Active` handle whose validity ran out becomes `Expired`,
//! and that is recorded, not only computed.
//!
//! | from ↓ / event → | validity runs out | renew `Renewed` | renew `Lost` | renew `Indeterminate` | renew `Unavailable`, `Overloaded` | release `Released`, `AlreadyGone` | release `NotOwner` | release `Indeterminate` | release `Unavailable`, `Overloaded` |
//! |---|---|---|---|---|---|---|---|---|---|
//! | `Active`   | `Expired` | `Active` | `Lost` | `Unknown` | `Active`  | `Released` | `Lost` | `Unknown`¹ | `Active` |
//! | `Expired`  | —         | `Active` | `Lost` | `Unknown` | `Expired` | `Released` | `Lost` | `Unknown`¹ | `Expired` |
//! | `Unknown`  | —         | `Active` | `Lost` | `Unknown` | `Unknown` | `Released` | `Lost` | `Unknown`¹ | `Unknown` |
//! | `Lost`     | —         | refused² | refused² | refused² | refused² | refused² | refused² | refused² | refused² |
//! | `Released` | —         | refused² | refused² | refused² | refused² | refused² | refused² | refused² | refused² |
//!
//! ¹ An indeterminate release may have deleted the key, so it also revokes all remaining
//! validity. ² `Refused { state }`, returned without sending anything.
//!
//! `Renewed` restores `Active` only because the backend renews *only* when the stored grant is
//! exactly this one — same owner token, operation id and fence — which proves the key never
//! lapsed (every new grant has a new fence). Once `release` has been called, `renew` is refused
//! too: a delayed release could otherwise land after a renewal that had re-activated the handle.
//! A release also waits for renewals already being sent, so that no renewal is ever sent after
//! a release.
//!
//! In `Unknown` after an indeterminate renew, [`LeaseHandle::remaining_validity`] still reports
//! what the last confirmed grant or renewal proved (a renewal can only extend the key, never
//! shorten it), but [`LeaseHandle::is_valid`] is false: the handle cannot vouch for more.

use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tracing::Instrument;

use crate::backend::{DowngradeReply, Grant, GrantReply, LeaseBackend, ReleaseReply, RenewReply};
use crate::clock::{Clock, MonotonicInstant};
use crate::fence::{FenceToken, Guarantee};
use crate::id::{Attempt, Purpose, ResourceDigest};
use crate::outcome::{
    Failure, Indeterminate, LossCause, ReleaseOutcome, RenewOutcome, Unavailable,
};
use crate::request::{LeaseRequest, RwMode};
pub use crate::state::LeaseState;
use crate::telemetry::{self, Short, lease_span};

/// A lease this process was granted: renew it, release it, and ask how long it is valid.
///
/// Dropping a handle does not release the lease: the key stays on the server until its TTL
/// runs out. Release certainty needs an explicit [`release`](Self::release) and a look at its
/// outcome.
#[must_use = "dropping a lease handle leaves the lease held on the server until its TTL runs out; call `release().await` and check its outcome"]
pub struct LeaseHandle<B: LeaseBackend> {
    shared: Arc<Shared<B>>,
}

/// What every handle of one grant shares: a replay of a grant this client already holds a
/// handle for returns a handle on the *same* state, so that releasing either is seen by both.
pub(crate) struct Shared<B: LeaseBackend> {
    backend: Arc<B>,
    clock: Arc<dyn Clock>,
    grant: Grant,
    drift: Duration,
    /// The request's drift budget, for the reader's request a downgrade makes.
    drift_budget: crate::request::DriftBudget,
    /// When the grant's acquire was sent: where its hold time starts.
    granted_at: MonotonicInstant,
    /// How long the grant's acquire took from send to answer (a watchdog's first estimate of
    /// how long a renewal will take).
    granted_in: Duration,
    core: Mutex<Core>,
    /// Renewals hold it shared across their send; a release takes it exclusively before it
    /// sends, so no renewal is ever sent after a release was (see `release`).
    sends: tokio::sync::RwLock<()>,
}

#[derive(Debug)]
struct Core {
    state: LeaseState,
    valid_until: MonotonicInstant,
    server_expiry: MonotonicInstant,
    release_started: bool,
}

impl Core {
    /// Records the passage of time: `Active` past its deadline is `Expired`.
    fn observe(&mut self, now: MonotonicInstant) {
        if self.state == LeaseState::Active && now >= self.valid_until {
            self.state = LeaseState::Expired;
        }
    }

    fn remaining(&self, now: MonotonicInstant) -> Duration {
        match self.state {
            LeaseState::Active | LeaseState::Unknown => {
                self.valid_until.saturating_duration_since(now)
            }
            LeaseState::Expired | LeaseState::Lost | LeaseState::Released => Duration::ZERO,
        }
    }

    /// Moves to `to` unless the handle already reached a terminal state.
    fn enter(&mut self, to: LeaseState) {
        if !self.state.is_terminal() {
            self.state = to;
        }
    }
}

/// The handle's state, locked; a change of state made under it is logged when it unlocks.
struct Locked<'a, B: LeaseBackend> {
    shared: &'a Shared<B>,
    core: MutexGuard<'a, Core>,
    before: LeaseState,
}

impl<B: LeaseBackend> Deref for Locked<'_, B> {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.core
    }
}

impl<B: LeaseBackend> DerefMut for Locked<'_, B> {
    fn deref_mut(&mut self) -> &mut Core {
        &mut self.core
    }
}

impl<B: LeaseBackend> Drop for Locked<'_, B> {
    fn drop(&mut self) {
        let (from, to) = (self.before, self.core.state);
        if from != to {
            let grant = &self.shared.grant;
            tracing::debug!(
                purpose = %grant.purpose(),
                resource = %Short(grant.resource()),
                fence = %grant.fence(),
                %from,
                %to,
                "lease state changed"
            );
        }
    }
}

impl<B: LeaseBackend> Shared<B> {
    fn lock(&self) -> Locked<'_, B> {
        // The critical sections never panic, but a poisoned lock must not take the handle
        // down with it: the state inside is always consistent between statements.
        let core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        let before = core.state;
        Locked {
            shared: self,
            core,
            before,
        }
    }

    /// The span of one command this handle sends.
    fn span(&self, release: bool) -> tracing::Span {
        let grant = &self.grant;
        let (purpose, resource, fence) = (grant.purpose(), grant.resource(), grant.fence());
        if release {
            lease_span!(DEBUG, "release", purpose, resource, fence = %fence)
        } else {
            lease_span!(DEBUG, "renew", purpose, resource, fence = %fence)
        }
    }

    /// Merges a replay's confirmation: the server holds exactly this grant, with `server_ttl`
    /// left, as of before `sent_at`.
    pub(crate) fn confirm(&self, server_ttl: Duration, sent_at: MonotonicInstant) {
        let (valid_until, server_expiry) =
            validity_window(self.grant.ttl(), self.drift, sent_at, server_ttl);
        let now = self.clock.now();
        let mut core = self.lock();
        core.observe(now);
        if !core.state.is_terminal() && !core.release_started {
            core.valid_until = core.valid_until.max(valid_until);
            core.server_expiry = core.server_expiry.max(server_expiry);
            core.state = LeaseState::Active;
            core.observe(now);
        }
    }
}

/// A renewal being sent, owning everything it needs.
pub(crate) type RenewFuture = Pin<Box<dyn Future<Output = RenewOutcome> + Send>>;

/// A lease as the keep-alive watchdog sees it. Object safe, so that one watchdog task can keep
/// leases of any backend type.
pub(crate) trait Renewable: Send + Sync + 'static {
    /// The TTL every renewal asks for.
    fn ttl(&self) -> Duration;
    /// As [`LeaseHandle::state`].
    fn state(&self) -> LeaseState;
    /// As [`LeaseHandle::remaining_validity`].
    fn remaining_validity(&self) -> Duration;
    /// Starts [`LeaseHandle::renew`]. The future is allocated here and lives only while the
    /// renewal is being sent, so a lease waiting for its next renewal costs no future at all.
    fn renew(self: Arc<Self>) -> RenewFuture;
}

impl<B: LeaseBackend> Renewable for Shared<B> {
    fn ttl(&self) -> Duration {
        self.grant.ttl()
    }

    fn state(&self) -> LeaseState {
        let now = self.clock.now();
        let mut core = self.lock();
        core.observe(now);
        core.state
    }

    fn remaining_validity(&self) -> Duration {
        let now = self.clock.now();
        let mut core = self.lock();
        core.observe(now);
        core.remaining(now)
    }

    fn renew(self: Arc<Self>) -> RenewFuture {
        Box::pin(async move { LeaseHandle { shared: self }.renew().await })
    }
}

impl<B: LeaseBackend> LeaseHandle<B> {
    pub(crate) fn new(
        backend: Arc<B>,
        clock: Arc<dyn Clock>,
        request: &LeaseRequest,
        reply: GrantReply,
        sent_at: MonotonicInstant,
    ) -> Self {
        let grant = Grant::new(request, &reply);
        let drift = request.drift();
        let (valid_until, server_expiry) =
            validity_window(grant.ttl(), drift, sent_at, reply.server_ttl);
        let mut core = Core {
            state: LeaseState::Active,
            valid_until,
            server_expiry,
            release_started: false,
        };
        let now = clock.now();
        core.observe(now);
        Self {
            shared: Arc::new(Shared {
                backend,
                clock,
                grant,
                drift,
                drift_budget: request.drift_budget(),
                granted_at: sent_at,
                granted_in: now.saturating_duration_since(sent_at),
                core: Mutex::new(core),
                sends: tokio::sync::RwLock::new(()),
            }),
        }
    }

    /// How long the grant's acquire took from send to answer.
    pub(crate) fn granted_in(&self) -> Duration {
        self.shared.granted_in
    }

    /// Returns another handle on the same grant's state. Crate-private: a handle given out
    /// twice would let two owners release one lease.
    pub(crate) fn share(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }

    pub(crate) fn downgrade(&self) -> std::sync::Weak<Shared<B>> {
        Arc::downgrade(&self.shared)
    }

    pub(crate) fn upgrade(weak: &std::sync::Weak<Shared<B>>) -> Option<Self> {
        weak.upgrade().map(|shared| Self { shared })
    }

    pub(crate) fn confirm(&self, server_ttl: Duration, sent_at: MonotonicInstant) {
        self.shared.confirm(server_ttl, sent_at);
    }

    /// Returns a type-erased view of the shared state, for the keep-alive watchdog.
    pub(crate) fn renewable(&self) -> Arc<dyn Renewable> {
        // No allocation: the `Arc<Shared<B>>` itself is coerced to a trait object.
        Arc::clone(&self.shared) as Arc<dyn Renewable>
    }

    /// Returns the handle's state, recording `Expired` if the validity ran out.
    pub fn state(&self) -> LeaseState {
        self.shared.state()
    }

    /// Returns how much longer the handle can vouch for the lease; zero once it is expired,
    /// lost or released.
    pub fn remaining_validity(&self) -> Duration {
        self.shared.remaining_validity()
    }

    /// Returns true if and only if the handle is `Active` with validity left.
    pub fn is_valid(&self) -> bool {
        self.state() == LeaseState::Active
    }

    /// Returns the instant at which the local validity ends.
    pub fn valid_until(&self) -> MonotonicInstant {
        self.shared.lock().valid_until
    }

    /// Returns the earliest instant at which the server's key may expire, from the PTTL in the
    /// last confirming reply (grant, replay or renewal), counted from before that command was
    /// sent. Drift is not deducted; see [`valid_until`](Self::valid_until) for that.
    pub fn observed_server_expiry(&self) -> MonotonicInstant {
        self.shared.lock().server_expiry
    }

    /// Returns the grant's fencing token.
    pub fn fence(&self) -> FenceToken {
        self.shared.grant.fence()
    }

    /// Returns the semaphore slot this handle holds a permit for, `None` for a lease. A
    /// fence orders the grants of one slot: a target keeps the highest fence per slot.
    pub fn slot(&self) -> Option<u32> {
        self.shared.grant.slot()
    }

    /// Returns what this lease promises; see [`Guarantee`].
    pub fn guarantee(&self) -> Guarantee {
        Guarantee::Fenced(self.shared.grant.fence())
    }

    /// Returns the TTL every renewal asks for.
    pub fn ttl(&self) -> Duration {
        self.shared.grant.ttl()
    }

    /// Returns the drift deducted from every validity this handle is granted.
    pub fn drift(&self) -> Duration {
        self.shared.drift
    }

    /// Returns the purpose.
    pub fn purpose(&self) -> &Purpose {
        self.shared.grant.purpose()
    }

    /// Returns the resource digest.
    pub fn resource(&self) -> &ResourceDigest {
        self.shared.grant.resource()
    }

    /// Returns the attempt holding the lease.
    pub fn attempt(&self) -> &Attempt {
        self.shared.grant.attempt()
    }

    /// Returns the grant as the backend sees it.
    pub(crate) fn grant(&self) -> &Grant {
        &self.shared.grant
    }

    /// Renews the lease for its TTL, if the server still holds exactly this grant.
    ///
    /// Sent only from `Active`, `Expired` or `Unknown`, and only while no release has been
    /// started; otherwise returns [`RenewOutcome::Refused`] without sending anything.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes may leave the renewal applied on the server;
    /// the handle then keeps its earlier (shorter) validity, which is safe.
    pub async fn renew(&self) -> RenewOutcome {
        let span = self.shared.span(false);
        self.renew_once().instrument(span).await
    }

    async fn renew_once(&self) -> RenewOutcome {
        // Read before sending: validity from this renewal is counted from here.
        let sent_at = self.shared.clock.now();
        let _sending = self.shared.sends.read().await;
        {
            let mut core = self.shared.lock();
            core.observe(self.shared.clock.now());
            if core.state.is_terminal() || core.release_started {
                telemetry::renewed(self.purpose(), "refused", Duration::ZERO, None);
                tracing::debug!(state = %core.state, "renewal refused: nothing sent");
                return RenewOutcome::Refused { state: core.state };
            }
        }
        let reply = self.shared.backend.renew(&self.shared.grant).await;
        let now = self.shared.clock.now();
        let mut core = self.shared.lock();
        core.observe(now);
        // What the lease had left when this renewal confirmed: the early warning.
        let left = core.remaining(now);
        let outcome = match reply {
            RenewReply::Renewed { server_ttl } => {
                let (valid_until, server_expiry) = validity_window(
                    self.shared.grant.ttl(),
                    self.shared.drift,
                    sent_at,
                    server_ttl,
                );
                if !core.state.is_terminal() {
                    // Concurrent renewals may confirm out of order; each one proves its own
                    // window, so the latest window wins.
                    core.valid_until = core.valid_until.max(valid_until);
                    core.server_expiry = core.server_expiry.max(server_expiry);
                    core.state = LeaseState::Active;
                    core.observe(now);
                }
                RenewOutcome::Renewed {
                    remaining: core.remaining(now),
                }
            }
            RenewReply::Lost(cause) => {
                core.enter(LeaseState::Lost);
                RenewOutcome::Lost(cause)
            }
            RenewReply::Failed(Failure::Indeterminate(why)) => {
                // No validity is added: only confirmed renewals extend it.
                core.enter(LeaseState::Unknown);
                RenewOutcome::Indeterminate(why)
            }
            RenewReply::Failed(Failure::Unavailable(why)) => RenewOutcome::Unavailable(why),
            RenewReply::Failed(Failure::Overloaded) => RenewOutcome::Overloaded,
        };
        drop(core);
        let took = now.saturating_duration_since(sent_at);
        let kind = telemetry::renew_kind(&outcome);
        let renewed = matches!(outcome, RenewOutcome::Renewed { .. });
        telemetry::renewed(self.purpose(), kind, took, renewed.then_some(left));
        if let RenewOutcome::Renewed { remaining } = &outcome {
            tracing::debug!(
                outcome = kind,
                latency_us = telemetry::us(took),
                validity_left_ms = telemetry::ms(left),
                remaining_ms = telemetry::ms(*remaining),
                "renewed"
            );
        } else {
            tracing::debug!(outcome = %outcome, latency_us = telemetry::us(took), "renewal not confirmed");
        }
        outcome
    }

    /// Releases the lease if the server still holds exactly this grant.
    ///
    /// Sent only from `Active`, `Expired` or `Unknown`; otherwise returns
    /// [`ReleaseOutcome::Refused`] without sending anything. After this is called, `renew` is
    /// refused whatever the outcome. An `Unavailable` or `Overloaded` outcome leaves the lease
    /// held: call `release` again.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the key deleted or not; the handle then refuses renewals
    /// but keeps its state, and the key expires with its TTL at the latest.
    pub async fn release(&self) -> ReleaseOutcome {
        let span = self.shared.span(true);
        self.release_once().instrument(span).await
    }

    async fn release_once(&self) -> ReleaseOutcome {
        let sent_at = self.shared.clock.now();
        {
            let mut core = self.shared.lock();
            core.observe(sent_at);
            if core.state.is_terminal() {
                telemetry::released(self.purpose(), "refused", None);
                tracing::debug!(state = %core.state, "release refused: nothing sent");
                return ReleaseOutcome::Refused { state: core.state };
            }
            core.release_started = true;
        }
        // Renewals that passed their check before the flag was set are still sending: wait for
        // them, so that the release is the last command this handle sends.
        let _exclusive = self.shared.sends.write().await;
        let reply = self.shared.backend.release(&self.shared.grant).await;
        let now = self.shared.clock.now();
        let mut core = self.shared.lock();
        core.observe(now);
        let outcome = match reply {
            ReleaseReply::Released => {
                core.enter(LeaseState::Released);
                ReleaseOutcome::Released
            }
            ReleaseReply::AlreadyGone => {
                core.enter(LeaseState::Released);
                ReleaseOutcome::AlreadyGone
            }
            ReleaseReply::NotOwner => {
                core.enter(LeaseState::Lost);
                ReleaseOutcome::NotOwner
            }
            ReleaseReply::Failed(Failure::Indeterminate(why)) => {
                // The key may be gone already: nothing about it is proven any more.
                core.enter(LeaseState::Unknown);
                core.valid_until = core.valid_until.min(sent_at);
                ReleaseOutcome::Indeterminate(why)
            }
            ReleaseReply::Failed(Failure::Unavailable(why)) => ReleaseOutcome::Unavailable(why),
            ReleaseReply::Failed(Failure::Overloaded) => ReleaseOutcome::Overloaded,
        };
        drop(core);
        let kind = outcome.kind();
        let confirmed = matches!(outcome, ReleaseOutcome::Released);
        let held = now.saturating_duration_since(self.shared.granted_at);
        telemetry::released(self.purpose(), kind, confirmed.then_some(held));
        tracing::debug!(
            outcome = kind,
            latency_us = telemetry::us(now.saturating_duration_since(sent_at)),
            held_ms = telemetry::ms(held),
            "release"
        );
        outcome
    }
}

impl<B: LeaseBackend> LeaseHandle<B> {
    /// Turns this writer's grant of a read/write lease into a reader's, in one step on the
    /// server: no other writer can come in between, and the reader's fence is this writer's.
    /// Returns the reader's handle; this one ends `Released` (its grant is gone).
    ///
    /// Sent only from `Active`, `Expired` or `Unknown` and before any release, like a release
    /// (renewals of this handle stop for good once it is sent). An outcome other than
    /// `Downgraded` leaves no reader's handle: after `Indeterminate` the writer's grant may be
    /// either side now, and the caller should release the attempt
    /// ([`LeaseClient::release_attempt`](crate::LeaseClient::release_attempt) with
    /// [`reader_request`](Self::reader_request)); after `Unavailable` or `Overloaded` nothing
    /// was applied and the writer's grant is held, unrenewed.
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release): a downgrade cut short may have been applied.
    pub async fn downgrade_to_read(&self) -> DowngradeOutcome<B> {
        if self.shared.grant.rw() != Some(RwMode::Write) {
            return DowngradeOutcome::NotAWriter;
        }
        let Ok(reader) = self.reader_request() else {
            return DowngradeOutcome::NotAWriter;
        };
        let sent_at = self.shared.clock.now();
        {
            let mut core = self.shared.lock();
            core.observe(sent_at);
            if core.state.is_terminal() || core.release_started {
                return DowngradeOutcome::Refused { state: core.state };
            }
            core.release_started = true;
        }
        // As a release: the last command this handle sends.
        let _exclusive = self.shared.sends.write().await;
        let reply = self.shared.backend.downgrade(&self.shared.grant).await;
        let now = self.shared.clock.now();
        let mut core = self.shared.lock();
        core.observe(now);
        match reply {
            DowngradeReply::Downgraded(granted) => {
                core.enter(LeaseState::Released);
                drop(core);
                DowngradeOutcome::Downgraded(LeaseHandle::new(
                    Arc::clone(&self.shared.backend),
                    Arc::clone(&self.shared.clock),
                    &reader,
                    granted,
                    sent_at,
                ))
            }
            DowngradeReply::Lost(cause) => {
                core.enter(LeaseState::Lost);
                DowngradeOutcome::Lost(cause)
            }
            DowngradeReply::Failed(Failure::Indeterminate(why)) => {
                core.enter(LeaseState::Unknown);
                core.valid_until = core.valid_until.min(sent_at);
                DowngradeOutcome::Indeterminate(why)
            }
            DowngradeReply::Failed(Failure::Unavailable(why)) => DowngradeOutcome::Unavailable(why),
            DowngradeReply::Failed(Failure::Overloaded) => DowngradeOutcome::Overloaded,
        }
    }

    /// Returns the request of the reader this writer's grant becomes on
    /// [`downgrade_to_read`](Self::downgrade_to_read): the same attempt, TTL and drift
    /// budget, for the read side.
    ///
    /// # Errors
    ///
    /// As [`LeaseRequest::new`], which the grant's own request already passed.
    pub fn reader_request(&self) -> Result<LeaseRequest, crate::Error> {
        let grant = &self.shared.grant;
        let request = LeaseRequest::new(
            grant.purpose().clone(),
            grant.resource().clone(),
            grant.attempt().clone(),
            grant.ttl(),
            self.shared.drift_budget,
        )?;
        request.with_rw(RwMode::Read)
    }
}

/// What [`LeaseHandle::downgrade_to_read`] did.
#[non_exhaustive]
#[must_use = "a downgrade may hold a reader's lease that must be released, or be indeterminate"]
pub enum DowngradeOutcome<B: LeaseBackend> {
    /// The writer's grant is a reader's now: its handle, with the writer's fence.
    Downgraded(LeaseHandle<B>),
    /// The handle is not a writer's of a read/write lease; nothing was sent.
    NotAWriter,
    /// The handle is terminal or being released; nothing was sent.
    Refused {
        /// Its state.
        state: LeaseState,
    },
    /// The writer's grant was no longer held.
    Lost(LossCause),
    /// Sent, outcome unknown: the grant may be the writer's or a reader's now.
    Indeterminate(Indeterminate),
    /// Not applied: the writer's grant is still held (and no longer renewed).
    Unavailable(Unavailable),
    /// Refused locally; nothing was sent.
    Overloaded,
}

impl<B: LeaseBackend> fmt::Debug for DowngradeOutcome<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DowngradeOutcome::Downgraded(h) => f.debug_tuple("Downgraded").field(h).finish(),
            DowngradeOutcome::NotAWriter => f.write_str("NotAWriter"),
            DowngradeOutcome::Refused { state } => {
                f.debug_struct("Refused").field("state", state).finish()
            }
            DowngradeOutcome::Lost(c) => f.debug_tuple("Lost").field(c).finish(),
            DowngradeOutcome::Indeterminate(i) => f.debug_tuple("Indeterminate").field(i).finish(),
            DowngradeOutcome::Unavailable(u) => f.debug_tuple("Unavailable").field(u).finish(),
            DowngradeOutcome::Overloaded => f.write_str("Overloaded"),
        }
    }
}

/// Computes `(valid until, observed server expiry)` for a confirming reply.
fn validity_window(
    ttl: Duration,
    drift: Duration,
    sent_at: MonotonicInstant,
    server_ttl: Duration,
) -> (MonotonicInstant, MonotonicInstant) {
    // Capped by the reply's PTTL: a replay, or a key that another client shortened, must not
    // earn more validity than the server will keep the key for.
    let granted = ttl.min(server_ttl).saturating_sub(drift);
    (sent_at + granted, sent_at + server_ttl)
}

impl<B: LeaseBackend> fmt::Debug for LeaseHandle<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let core = self.shared.lock();
        f.debug_struct("LeaseHandle")
            .field("purpose", self.shared.grant.purpose())
            .field("resource", self.shared.grant.resource())
            .field("attempt", self.shared.grant.attempt())
            .field("fence", &self.shared.grant.fence())
            .field("state", &core.state)
            .field("valid_until", &core.valid_until)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_is_capped_by_the_reply_pttl() {
        let at = MonotonicInstant::from_origin(Duration::from_secs(100));
        let ttl = Duration::from_secs(2);
        let drift = Duration::from_millis(30);
        // A replay 1.5 s into a 2 s lease: the server has 500 ms left.
        let (valid, server) = validity_window(ttl, drift, at, Duration::from_millis(500));
        assert_eq!(valid, at + Duration::from_millis(470));
        assert_eq!(server, at + Duration::from_millis(500));
        // A fresh grant: the reply PTTL equals the TTL.
        let (valid, _) = validity_window(ttl, drift, at, ttl);
        assert_eq!(valid, at + Duration::from_millis(1970));
        // A reply PTTL below the drift leaves nothing, never a negative window.
        let (valid, _) = validity_window(ttl, drift, at, Duration::from_millis(5));
        assert_eq!(valid, at);
    }
}
