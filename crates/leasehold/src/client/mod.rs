//! The lease client: attempts, requests, acquire, inspect and recovery over any backend.
//!
//! - [`LeaseClient`] and [`AcquireOutcome`]: one try, inspect, release of an attempt;
//! - waiting acquires (`acquire`): per-resource queues woken by release notices;
//! - the one-call layer on top ([`LeaseClient::lock`], [`LeaseClient::run`]) lives in
//!   [`crate::lock`];
//! - recovery ([`LeaseClient::resolve`], [`LeaseClient::abandon`]): replaying an unknown
//!   acquire until it is known, and cleaning up behind one given up on.

mod live;
mod outcome;
mod recovery;
pub(crate) mod wait;

pub use outcome::AcquireOutcome;
pub use recovery::Abandoned;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tracing::Instrument;

use crate::backend::{AcquireReply, GrantReply, LeaseBackend, ReleaseReply};
use crate::clock::{BootClock, Clock};
use crate::error::Error;
use crate::handle::LeaseHandle;
use crate::id::{Attempt, OperationId, Purpose, ResourceDigest};
use crate::keepalive::{KeepAliveSettings, Watchdog};
use crate::outcome::{Failure, InspectOutcome, ReleaseOutcome};
use crate::request::{DriftBudget, LeaseRequest};
use crate::telemetry::{self, lease_span};

use live::LiveGrants;

/// Leases over one backend: makes attempts and requests, acquires and inspects.
///
/// Cheap to clone; clones share the backend and the clock.
pub struct LeaseClient<B: LeaseBackend> {
    backend: Arc<B>,
    clock: Arc<dyn Clock>,
    drift: DriftBudget,
    live: Arc<Mutex<LiveGrants<B>>>,
    pub(crate) queues: wait::Queues,
    watchdog: Watchdog,
}

impl<B: LeaseBackend> Clone for LeaseClient<B> {
    fn clone(&self) -> Self {
        Self {
            backend: Arc::clone(&self.backend),
            clock: Arc::clone(&self.clock),
            drift: self.drift,
            live: Arc::clone(&self.live),
            queues: self.queues.clone(),
            watchdog: self.watchdog.clone(),
        }
    }
}

impl<B: LeaseBackend> fmt::Debug for LeaseClient<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseClient")
            .field("clock", &self.clock)
            .field("drift", &self.drift)
            .finish_non_exhaustive()
    }
}

impl<B: LeaseBackend> LeaseClient<B> {
    /// Makes a client over `backend` with the boot-time clock and the default drift budget.
    pub fn new(backend: B) -> Self {
        Self {
            backend: Arc::new(backend),
            clock: Arc::new(BootClock),
            drift: DriftBudget::default(),
            live: Arc::new(Mutex::new(LiveGrants::new())),
            queues: wait::Queues::default(),
            watchdog: Watchdog::default(),
        }
    }

    /// Returns this client with another clock (virtual time in tests).
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Returns this client with another drift budget for the requests it makes.
    pub fn with_drift_budget(mut self, drift: DriftBudget) -> Self {
        self.drift = drift;
        self
    }

    /// Returns this client with a watchdog of these settings for the leases it keeps alive
    /// ([`lock`](Self::lock), [`run`](Self::run)).
    pub fn with_keep_alive(mut self, settings: KeepAliveSettings) -> Self {
        self.watchdog = Watchdog::new(settings);
        self
    }

    /// Returns the watchdog that keeps the leases of [`lock`](Self::lock) and
    /// [`run`](Self::run) alive: one task for the client and its clones, started at the first
    /// lease it keeps. Leases from the explicit API can be kept by it too.
    pub fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }

    /// Returns the backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Returns the clock validity is read from.
    pub fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    /// Returns the drift budget requests made by [`request`](Self::request) use.
    pub fn drift_budget(&self) -> DriftBudget {
        self.drift
    }

    /// Makes a new attempt for `operation`. Keep it for every retry of the operation.
    ///
    /// # Errors
    ///
    /// [`crate::ErrorKind::Entropy`] if the OS random number generator fails.
    pub fn new_attempt(&self, operation: OperationId) -> Result<Attempt, Error> {
        Attempt::new(operation)
    }

    /// Makes a request with this client's drift budget and no waiting.
    ///
    /// # Errors
    ///
    /// As [`LeaseRequest::new`].
    pub fn request(
        &self,
        purpose: Purpose,
        resource: ResourceDigest,
        attempt: Attempt,
        ttl: Duration,
    ) -> Result<LeaseRequest, Error> {
        LeaseRequest::new(purpose, resource, attempt, ttl, self.drift)
    }

    /// Tries once to acquire the lease, without waiting (the request's wait timeout is for
    /// waiting acquires).
    ///
    /// Calling it again with the same request after an `Indeterminate` is the way to resolve
    /// it: the server recognises the attempt and answers `Replayed` if the first call had been
    /// applied.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the lease granted to this attempt, exactly as an
    /// `Indeterminate` outcome would; replay the request to recover the handle.
    pub async fn try_acquire(&self, request: &LeaseRequest) -> AcquireOutcome<B> {
        let span = lease_span!(
            DEBUG,
            "try_acquire",
            request.purpose(),
            request.resource(),
            kind = telemetry::kind_of(request)
        );
        async {
            let started = tokio::time::Instant::now();
            let outcome = self.try_once(request).await;
            self.acquire_finished(request, &outcome, started.elapsed(), None);
            outcome
        }
        .instrument(span)
        .await
    }

    /// Tells logs and metrics an acquire's final outcome: how long it took, and how long of
    /// that it `waited` behind another holder.
    pub(crate) fn acquire_finished(
        &self,
        request: &LeaseRequest,
        outcome: &AcquireOutcome<B>,
        took: Duration,
        waited: Option<Duration>,
    ) {
        let kind = outcome.kind();
        telemetry::acquired(request.purpose(), kind, took);
        if let Some(waited) = waited {
            telemetry::waited(request.purpose(), waited);
        }
        let latency_us = telemetry::us(took);
        match outcome {
            AcquireOutcome::Acquired(lease) | AcquireOutcome::Replayed(lease) => tracing::debug!(
                outcome = kind,
                fence = %lease.fence(),
                remaining_ms = telemetry::ms(lease.remaining_validity()),
                latency_us,
                "acquired"
            ),
            other => tracing::debug!(outcome = kind, latency_us, "not acquired: {other}"),
        }
    }

    /// One try, told to nobody: what `try_acquire` and the waiting loops send.
    pub(crate) async fn try_once(&self, request: &LeaseRequest) -> AcquireOutcome<B> {
        // Read the clock before sending: validity is counted from here, so the round trip and
        // any local queueing are deducted from the lease, never added to it.
        let sent_at = self.clock.now();
        let reply = self.backend.acquire(request).await;
        let handle = |reply: GrantReply| {
            let fence = reply.fence;
            let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            let (found, key) = live.find(request, fence, reply.slot);
            if let Some(existing) = found {
                // The same grant again (a replay): one state for every handle of it.
                existing.confirm(reply.server_ttl, sent_at);
                return existing;
            }
            let handle = LeaseHandle::new(
                Arc::clone(&self.backend),
                Arc::clone(&self.clock),
                request,
                reply,
                sent_at,
            );
            live.register(key, &handle);
            handle
        };
        match reply {
            AcquireReply::Granted(grant) => AcquireOutcome::Acquired(handle(grant)),
            AcquireReply::Replayed(grant) => AcquireOutcome::Replayed(handle(grant)),
            AcquireReply::Contended(c) => AcquireOutcome::Contended(c),
            AcquireReply::OwnerOperationConflict(c) => AcquireOutcome::OwnerOperationConflict(c),
            AcquireReply::CapacityMismatch { recorded } => {
                AcquireOutcome::CapacityMismatch { recorded }
            }
            AcquireReply::Failed(Failure::Indeterminate(cause)) => AcquireOutcome::Indeterminate {
                operation: request.attempt().operation().clone(),
                cause,
            },
            AcquireReply::Failed(Failure::Unavailable(u)) => AcquireOutcome::Unavailable(u),
            AcquireReply::Failed(Failure::Overloaded) => AcquireOutcome::Overloaded,
        }
    }

    /// Releases whatever grant `request`'s attempt holds, whatever its fence, without ever
    /// making one: the cleanup after an acquire whose outcome stayed unknown, when there is no
    /// handle to release.
    ///
    /// `Released` means this attempt held a grant and it is gone now; `AlreadyGone` and
    /// `NotOwner` that it held none when the release ran. On the Redis backend the release
    /// goes on the connection the acquires went on, behind them: if the server applies an
    /// unanswered acquire later, this release (sent after it) undoes its grant at once. Only
    /// a connection lost in between, or a new one to another node (a failover), breaks that
    /// order. A handle this client holds for the attempt does not learn of the release: use
    /// [`LeaseHandle::release`] when there is one.
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseHandle::release`]: a dropped release may have been applied.
    pub async fn release_attempt(&self, request: &LeaseRequest) -> ReleaseOutcome {
        let span = lease_span!(
            DEBUG,
            "release_attempt",
            request.purpose(),
            request.resource()
        );
        async {
            let outcome = match self.backend.release_attempt(request).await {
                ReleaseReply::Released => ReleaseOutcome::Released,
                ReleaseReply::AlreadyGone => ReleaseOutcome::AlreadyGone,
                ReleaseReply::NotOwner => ReleaseOutcome::NotOwner,
                ReleaseReply::Failed(Failure::Indeterminate(why)) => {
                    ReleaseOutcome::Indeterminate(why)
                }
                ReleaseReply::Failed(Failure::Unavailable(why)) => ReleaseOutcome::Unavailable(why),
                ReleaseReply::Failed(Failure::Overloaded) => ReleaseOutcome::Overloaded,
            };
            tracing::debug!(outcome = outcome.kind(), "attempt's grant released");
            outcome
        }
        .instrument(span)
        .await
    }

    /// Reads who holds the lease on `resource`; with `attempt`, whether that attempt does.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: inspection changes nothing.
    pub async fn inspect(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        attempt: Option<&Attempt>,
    ) -> InspectOutcome {
        traced_inspection(
            purpose,
            resource,
            self.backend.inspect(purpose, resource, attempt),
        )
        .await
    }

    /// [`inspect`](Self::inspect) without an attempt, by a reader that then waits for the
    /// holder's release notice ([`LeaseBackend::inspect_watched`]).
    pub(crate) async fn inspect_watched(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
    ) -> InspectOutcome {
        traced_inspection(
            purpose,
            resource,
            self.backend.inspect_watched(purpose, resource),
        )
        .await
    }
}

/// Runs `read`, an inspection of `resource`, in its span, and logs what it found.
async fn traced_inspection(
    purpose: &Purpose,
    resource: &ResourceDigest,
    read: impl Future<Output = InspectOutcome>,
) -> InspectOutcome {
    let span = lease_span!(TRACE, "inspect", purpose, resource);
    async {
        let outcome = read.await;
        tracing::trace!(outcome = telemetry::inspect_kind(&outcome), "inspected");
        outcome
    }
    .instrument(span)
    .await
}
