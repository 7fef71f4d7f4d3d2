//! The lease client: attempts, requests, acquire and inspect over any backend.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use crate::backend::{AcquireReply, LeaseBackend, ReleaseReply};
use crate::clock::{BootClock, Clock};
use crate::error::Error;
use crate::handle::{LeaseHandle, Shared};
use crate::id::{Attempt, OperationId, Purpose, ResourceDigest};
use crate::outcome::{
    Contention, Failure, Indeterminate, InspectOutcome, ReleaseOutcome, Unavailable,
};
use crate::request::{DriftBudget, LeaseRequest};

/// The outcome of an acquire.
#[non_exhaustive]
#[must_use = "an acquire outcome may hold a lease that must be released, or be indeterminate"]
pub enum AcquireOutcome<B: LeaseBackend> {
    /// A new grant: the handle is `Active` with a new fence.
    Acquired(LeaseHandle<B>),
    /// This attempt already held the lease (a lost reply was replayed): the same fence, and a
    /// validity capped by the key's *remaining* TTL, which the replay did not extend.
    Replayed(LeaseHandle<B>),
    /// Another owner holds the lease.
    Contended(Contention),
    /// The same owner token holds the lease for another operation id; the new operation does
    /// not inherit it.
    OwnerOperationConflict(Contention),
    /// Sent, outcome unknown: the lease may have been granted to this attempt. Replay the same
    /// request (same attempt) or inspect with it to find out.
    Indeterminate {
        /// The operation whose attempt may hold the lease.
        operation: OperationId,
        /// Why the outcome is unknown.
        cause: Indeterminate,
    },
    /// Definitely not applied; nothing is held.
    Unavailable(Unavailable),
    /// Refused locally by the backend's in-flight limit; nothing was sent.
    Overloaded,
}

impl<B: LeaseBackend> AcquireOutcome<B> {
    /// Returns true if and only if the outcome carries a handle (`Acquired` or `Replayed`).
    pub fn is_held(&self) -> bool {
        matches!(
            self,
            AcquireOutcome::Acquired(_) | AcquireOutcome::Replayed(_)
        )
    }

    /// Returns the handle, if the outcome carries one.
    pub fn into_handle(self) -> Option<LeaseHandle<B>> {
        match self {
            AcquireOutcome::Acquired(h) | AcquireOutcome::Replayed(h) => Some(h),
            _ => None,
        }
    }

    /// Returns the outcome's name, for logs and test messages.
    pub fn name(&self) -> &'static str {
        match self {
            AcquireOutcome::Acquired(_) => "Acquired",
            AcquireOutcome::Replayed(_) => "Replayed",
            AcquireOutcome::Contended(_) => "Contended",
            AcquireOutcome::OwnerOperationConflict(_) => "OwnerOperationConflict",
            AcquireOutcome::Indeterminate { .. } => "Indeterminate",
            AcquireOutcome::Unavailable(_) => "Unavailable",
            AcquireOutcome::Overloaded => "Overloaded",
        }
    }
}

impl<B: LeaseBackend> fmt::Debug for AcquireOutcome<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireOutcome::Acquired(h) => f.debug_tuple("Acquired").field(h).finish(),
            AcquireOutcome::Replayed(h) => f.debug_tuple("Replayed").field(h).finish(),
            AcquireOutcome::Contended(c) => f.debug_tuple("Contended").field(c).finish(),
            AcquireOutcome::OwnerOperationConflict(c) => {
                f.debug_tuple("OwnerOperationConflict").field(c).finish()
            }
            AcquireOutcome::Indeterminate { operation, cause } => f
                .debug_struct("Indeterminate")
                .field("operation", operation)
                .field("cause", cause)
                .finish(),
            AcquireOutcome::Unavailable(u) => f.debug_tuple("Unavailable").field(u).finish(),
            AcquireOutcome::Overloaded => f.write_str("Overloaded"),
        }
    }
}

/// Leases over one backend: makes attempts and requests, acquires and inspects.
///
/// Cheap to clone; clones share the backend and the clock.
pub struct LeaseClient<B: LeaseBackend> {
    backend: Arc<B>,
    clock: Arc<dyn Clock>,
    drift: DriftBudget,
    live: Arc<Mutex<LiveGrants<B>>>,
    pub(crate) queues: crate::wait::Queues,
}

/// The grants this client holds handles for, so that a replay of one of them returns a handle
/// on the same state instead of a second, independent one (which would not learn of the first
/// one's release).
///
/// Keyed by a SHA-256 digest of the exact grant (purpose, resource, owner token, operation,
/// fence): 32 bytes in the table instead of a string of about 150 bytes on the heap, for
/// every lease the client holds. The digest stands for the owner token without revealing it,
/// and a hit is still checked against the handle's own grant, so that even a collision could
/// never join two grants' states.
struct LiveGrants<B: LeaseBackend> {
    by_grant: HashMap<GrantKey, Weak<Shared<B>>>,
    sweep_at: usize,
}

/// A SHA-256 digest of an exact grant.
type GrantKey = [u8; 32];

fn grant_key(request: &LeaseRequest, fence: crate::FenceToken) -> GrantKey {
    use sha2::{Digest as _, Sha256};
    let mut digest = Sha256::new();
    // Each variable-length field is prefixed with its length, so that no two different
    // grants are encoded alike.
    for field in [
        request.purpose().as_str(),
        request.resource().as_str(),
        request.attempt().owner_token().expose_secret(),
        request.attempt().operation().as_str(),
    ] {
        digest.update(u64::try_from(field.len()).unwrap_or(u64::MAX).to_be_bytes());
        digest.update(field.as_bytes());
    }
    digest.update(fence.get().to_be_bytes());
    digest.finalize().into()
}

/// Returns true if and only if `handle` holds exactly the grant `request` was given `fence` for.
fn holds<B: LeaseBackend>(
    handle: &LeaseHandle<B>,
    request: &LeaseRequest,
    fence: crate::FenceToken,
) -> bool {
    let grant = handle.grant();
    grant.fence() == fence
        && grant.purpose() == request.purpose()
        && grant.resource() == request.resource()
        && grant.attempt() == request.attempt()
}

impl<B: LeaseBackend> LiveGrants<B> {
    fn register(&mut self, key: GrantKey, handle: &LeaseHandle<B>) {
        self.by_grant.insert(key, handle.downgrade());
        if self.by_grant.len() >= self.sweep_at {
            self.by_grant.retain(|_, weak| weak.strong_count() > 0);
            self.sweep_at = (self.by_grant.len() * 2).max(64);
        }
    }
}

impl<B: LeaseBackend> Clone for LeaseClient<B> {
    fn clone(&self) -> Self {
        Self {
            backend: Arc::clone(&self.backend),
            clock: Arc::clone(&self.clock),
            drift: self.drift,
            live: Arc::clone(&self.live),
            queues: self.queues.clone(),
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
            live: Arc::new(Mutex::new(LiveGrants {
                by_grant: HashMap::new(),
                sweep_at: 64,
            })),
            queues: crate::wait::Queues::default(),
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
        // Read the clock before sending: validity is counted from here, so the round trip and
        // any local queueing are deducted from the lease, never added to it.
        let sent_at = self.clock.now();
        let reply = self.backend.acquire(request).await;
        let handle = |reply: crate::GrantReply| {
            let key = grant_key(request, reply.fence);
            let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
            let existing = live.by_grant.get(&key).and_then(LeaseHandle::upgrade);
            if let Some(existing) = existing.filter(|h| holds(h, request, reply.fence)) {
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
        match self.backend.release_attempt(request).await {
            ReleaseReply::Released => ReleaseOutcome::Released,
            ReleaseReply::AlreadyGone => ReleaseOutcome::AlreadyGone,
            ReleaseReply::NotOwner => ReleaseOutcome::NotOwner,
            ReleaseReply::Failed(Failure::Indeterminate(why)) => ReleaseOutcome::Indeterminate(why),
            ReleaseReply::Failed(Failure::Unavailable(why)) => ReleaseOutcome::Unavailable(why),
            ReleaseReply::Failed(Failure::Overloaded) => ReleaseOutcome::Overloaded,
        }
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
        self.backend.inspect(purpose, resource, attempt).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FenceToken;

    fn request(operation: &str, attempt: Option<&Attempt>) -> LeaseRequest {
        let operation = OperationId::new(operation).unwrap();
        let attempt = match attempt {
            Some(a) => a.with_operation(operation),
            None => Attempt::new(operation).unwrap(),
        };
        LeaseRequest::new(
            Purpose::new("p").unwrap(),
            ResourceDigest::of("r"),
            attempt,
            Duration::from_secs(3),
            DriftBudget::default(),
        )
        .unwrap()
    }

    #[test]
    fn grant_keys_tell_every_field_of_a_grant_apart() {
        let one = request("op", None);
        let fence = FenceToken::new(7).unwrap();
        assert_eq!(grant_key(&one, fence), grant_key(&one.clone(), fence));
        // Another fence, another owner token, another operation of the same owner.
        assert_ne!(
            grant_key(&one, fence),
            grant_key(&one, FenceToken::new(8).unwrap())
        );
        assert_ne!(
            grant_key(&one, fence),
            grant_key(&request("op", None), fence)
        );
        let same_owner = request("op2", Some(one.attempt()));
        assert_ne!(grant_key(&one, fence), grant_key(&same_owner, fence));
    }
}
