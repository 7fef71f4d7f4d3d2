//! What an unknown outcome leaves to settle: replaying an acquire until its outcome is known,
//! and cleaning up after an acquire that is given up on.
//!
//! Both are lease policy, not process policy: a program that gives up on an acquire (a CLI on
//! Ctrl-C, a job that ran out of time) calls [`LeaseClient::abandon`], and one that must know
//! whether it holds the lease calls [`LeaseClient::resolve`], instead of writing the loops.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::LeaseBackend;
use crate::client::{AcquireOutcome, LeaseClient};
use crate::outcome::{Failure, Indeterminate, ReleaseOutcome};
use crate::request::LeaseRequest;
use crate::retry::Backoff;
use crate::telemetry::lease_span;

/// What [`LeaseClient::abandon`] left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Abandoned {
    /// The attempt held a grant, and it was released.
    Released,
    /// The attempt held no grant when the release ran: none at all, or another holder's.
    NothingHeld,
    /// No definite answer within the budget, for this reason. A grant may exist for the
    /// attempt until its TTL — counted, if the server still holds the acquire unapplied (a
    /// stalled server), from when it applies it. The releases sent went behind the acquire on
    /// its connection where the backend keeps one ([`LeaseClient::release_attempt`]), and undo
    /// such a late grant unless that connection broke first.
    Unknown(Failure),
}

impl fmt::Display for Abandoned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Abandoned::Released => f.write_str("the attempt's grant was released"),
            Abandoned::NothingHeld => f.write_str("the attempt held no grant"),
            Abandoned::Unknown(why) => write!(f, "not known whether a grant is left: {why}"),
        }
    }
}

impl<B: LeaseBackend> LeaseClient<B> {
    /// Replays `request`'s attempt until the outcome of an earlier try, which was `unknown`,
    /// is definite, or `within` has passed (never longer than the request's TTL).
    ///
    /// A replay finds this attempt's grant (`Replayed`: the same fence, with the validity the
    /// server has left), makes it now (`Acquired`), or finds another holder (`Contended`,
    /// `OwnerOperationConflict`): each is returned at once. A replay that is itself
    /// `Indeterminate`, `Unavailable` or `Overloaded` says nothing about the earlier try; it is
    /// retried after a pause, and when the budget is spent the outcome is `Indeterminate`
    /// with the last unknown cause. Then, if the caller gives up, [`abandon`](Self::abandon)
    /// cleans up.
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire`](Self::try_acquire): a dropped replay may have been applied.
    pub async fn resolve(
        &self,
        request: &LeaseRequest,
        mut unknown: Indeterminate,
        within: Duration,
    ) -> AcquireOutcome<B> {
        let span = lease_span!(DEBUG, "resolve", request.purpose(), request.resource());
        async {
            let deadline = Instant::now() + within.min(request.ttl());
            let mut replays = 0u32;
            let mut backoff = Backoff::new();
            let outcome = loop {
                replays += 1;
                match self.try_once(request).await {
                    AcquireOutcome::Indeterminate { cause, .. } => unknown = cause,
                    // Not applied, this time: the earlier try is as unknown as before.
                    AcquireOutcome::Unavailable(_) | AcquireOutcome::Overloaded => {}
                    definite => break definite,
                }
                if Instant::now() >= deadline {
                    break AcquireOutcome::Indeterminate {
                        operation: request.attempt().operation().clone(),
                        cause: unknown,
                    };
                }
                backoff.pause(Some(deadline)).await;
            };
            tracing::debug!(
                outcome = outcome.kind(),
                replays,
                "unknown acquire replayed: {outcome}"
            );
            outcome
        }
        .instrument(span)
        .await
    }

    /// Cleans up after an acquire of `request` that is given up on, within `within`: waits
    /// for the background cleanups of dropped [`acquire`](Self::acquire) futures (a process
    /// about to exit would cut them off), then releases whatever grant the attempt holds
    /// ([`release_attempt`](Self::release_attempt): any fence, never by making a grant),
    /// retried after a pause until a definite answer or the end of the budget. At least one
    /// release is sent, however long the background took.
    ///
    /// # Cancel safety
    ///
    /// Dropping it stops the waiting; a release already sent may have been applied.
    pub async fn abandon(&self, request: &LeaseRequest, within: Duration) -> Abandoned {
        let span = lease_span!(DEBUG, "abandon", request.purpose(), request.resource());
        async {
            let abandoned = self.abandon_within(request, within).await;
            tracing::debug!("cleaned up behind an unknown acquire: {abandoned}");
            abandoned
        }
        .instrument(span)
        .await
    }

    async fn abandon_within(&self, request: &LeaseRequest, within: Duration) -> Abandoned {
        let deadline = Instant::now() + within;
        // The background cleanups never make a grant either, so a budget they use up costs
        // only the retries below, never safety.
        let _ = tokio::time::timeout_at(deadline, self.settle()).await;
        let mut backoff = Backoff::new();
        loop {
            let failure = match self.release_attempt(request).await {
                ReleaseOutcome::Released => return Abandoned::Released,
                ReleaseOutcome::AlreadyGone | ReleaseOutcome::NotOwner => {
                    return Abandoned::NothingHeld;
                }
                ReleaseOutcome::Indeterminate(i) => Failure::Indeterminate(i),
                ReleaseOutcome::Unavailable(u) => Failure::Unavailable(u),
                // Nothing was sent (`release_attempt` has no handle to refuse it, so only the
                // in-flight limit can).
                ReleaseOutcome::Overloaded | ReleaseOutcome::Refused { .. } => Failure::Overloaded,
            };
            if Instant::now() >= deadline {
                return Abandoned::Unknown(failure);
            }
            backoff.pause(Some(deadline)).await;
        }
    }
}
