//! The provider port: the four wire operations a lease backend implements.
//!
//! A backend only moves requests to its server and decodes the replies into these types. It
//! holds no clock and no state machine: [`crate::LeaseClient`] reads the clock before every
//! send and [`crate::LeaseHandle`] turns replies into validity and state, once, for every
//! backend (the Redis adapter and the simulator share that code).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::fence::FenceToken;
use crate::id::{Attempt, Purpose, ResourceDigest};
use crate::outcome::{
    Contention, Failure, Indeterminate, IndeterminateCause, InspectOutcome, LossCause,
};
use crate::request::{LeaseRequest, RwMode};

/// One grant, as the handle knows it: what to send to renew or release exactly this grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    purpose: Purpose,
    resource: ResourceDigest,
    attempt: Attempt,
    fence: FenceToken,
    ttl: Duration,
    term: u64,
    slot: Option<u32>,
    rw: Option<RwMode>,
}

impl Grant {
    pub(crate) fn new(request: &LeaseRequest, reply: &GrantReply) -> Self {
        Self {
            purpose: request.purpose().clone(),
            resource: request.resource().clone(),
            attempt: request.attempt().clone(),
            fence: reply.fence,
            ttl: request.ttl(),
            term: reply.term,
            slot: reply.slot,
            rw: request.rw(),
        }
    }

    /// Returns the side of a read/write lease this grant holds, `None` for a lease or a
    /// permit. A reader's grant has its reader slot ([`slot`](Self::slot)); the writer's has
    /// none.
    pub fn rw(&self) -> Option<RwMode> {
        self.rw
    }

    /// Returns the semaphore slot this grant is a permit for, `None` for a lease. A permit
    /// is renewed and released as a lease on its slot.
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }

    /// Returns the backend's term when it granted (see [`GrantReply::term`]).
    pub fn term(&self) -> u64 {
        self.term
    }

    /// Returns the purpose.
    pub fn purpose(&self) -> &Purpose {
        &self.purpose
    }

    /// Returns the resource digest.
    pub fn resource(&self) -> &ResourceDigest {
        &self.resource
    }

    /// Returns the attempt that holds the grant.
    pub fn attempt(&self) -> &Attempt {
        &self.attempt
    }

    /// Returns the grant's fencing token.
    pub fn fence(&self) -> FenceToken {
        self.fence
    }

    /// Returns the TTL every renewal sets (the request's TTL; renewals never shorten it). A
    /// grant with a minimum hold is renewed for the longer of this and what is left of the
    /// hold, which the server knows from the stored grant.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Returns the TTL in whole milliseconds.
    pub fn ttl_millis(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }
}

/// What the server granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GrantReply {
    /// The grant's fencing token.
    pub fence: FenceToken,
    /// The key's remaining time to live on the server, from the reply (PTTL).
    pub server_ttl: Duration,
    /// The backend's *term* when the server granted: a number it changes whenever the server
    /// that decides is replaced (a Sentinel failover names another master). A renewal of a
    /// grant from an earlier term that finds it gone is a loss to the replacement
    /// ([`LossCause::MasterReplaced`]). 0 for a backend
    /// that has no terms.
    pub term: u64,
    /// For a permit of a semaphore: the slot granted, from 0 to the capacity − 1. `None`
    /// for a lease.
    pub slot: Option<u32>,
}

impl GrantReply {
    /// Makes a `GrantReply` of term 0, for a lease.
    pub fn new(fence: FenceToken, server_ttl: Duration) -> Self {
        Self {
            fence,
            server_ttl,
            term: 0,
            slot: None,
        }
    }

    /// Returns this reply, for a permit of `slot`.
    pub fn with_slot(mut self, slot: u32) -> Self {
        self.slot = Some(slot);
        self
    }

    /// Returns this reply, of `term`.
    pub fn with_term(mut self, term: u64) -> Self {
        self.term = term;
        self
    }
}

/// A backend's answer to an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireReply {
    /// A new grant, with a new fence.
    Granted(GrantReply),
    /// This attempt already held it: the same fence and the *current* PTTL (not extended).
    Replayed(GrantReply),
    /// Another owner holds it.
    Contended(Contention),
    /// The same owner token holds it for another operation id.
    OwnerOperationConflict(Contention),
    /// A permit request's capacity is not the one the semaphore recorded; nothing was
    /// written.
    CapacityMismatch {
        /// The capacity the semaphore has.
        recorded: u32,
    },
    /// No definite answer.
    Failed(Failure),
}

/// A backend's answer to a renew.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewReply {
    /// The exact grant (owner, operation, fence) was held and its TTL was set again.
    Renewed {
        /// The key's time to live on the server after the renewal.
        server_ttl: Duration,
    },
    /// The grant is no longer held.
    Lost(LossCause),
    /// No definite answer.
    Failed(Failure),
}

/// A backend's answer to a downgrade of a writer's grant to a reader's.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DowngradeReply {
    /// The writer's grant was exactly the one held: it is now a reader's, in the reader
    /// slot of the reply, with the writer's fence, in one step (no other writer could come
    /// in between).
    Downgraded(GrantReply),
    /// The writer's grant is no longer held.
    Lost(LossCause),
    /// No definite answer.
    Failed(Failure),
}

/// A backend's answer to a release.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseReply {
    /// The exact grant was held and was deleted.
    Released,
    /// The key was absent.
    AlreadyGone,
    /// Another grant holds the key; it was left alone.
    NotOwner,
    /// No definite answer.
    Failed(Failure),
}

/// A subscription to release notices for one resource.
///
/// Waiters take a [`tokio::sync::Notify`] permit future from it *before* they try, so that a
/// release that lands while the try is in flight still wakes them. A backend without
/// notifications returns [`ReleaseWatch::none`], and waiters fall back to the holder's TTL.
#[derive(Debug, Clone)]
pub struct ReleaseWatch {
    notify: Option<Arc<tokio::sync::Notify>>,
}

impl ReleaseWatch {
    /// A watch that never fires.
    pub fn none() -> Self {
        Self { notify: None }
    }

    /// A watch that fires when `notify.notify_waiters()` is called.
    pub fn new(notify: Arc<tokio::sync::Notify>) -> Self {
        Self {
            notify: Some(notify),
        }
    }

    /// Returns the notifier, if this watch has one.
    pub(crate) fn notify(&self) -> Option<&Arc<tokio::sync::Notify>> {
        self.notify.as_ref()
    }
}

/// A lease backend: moves the four lease operations to a server, atomically there.
///
/// Implementations must keep these contracts, which the handle's safety rests on:
///
/// - `acquire` grants only if the key is absent, and then with a fencing token larger than any
///   issued before for the resource — also, within the backend's documented assumptions, after
///   its server lost the counter (the Redis backend: never below the server's clock in
///   microseconds); a replay by the same attempt returns
///   the same token and the *current* remaining TTL without extending it;
/// - `renew` and `release` act only if the stored grant is exactly the given one (owner token,
///   operation id and fence);
/// - `renew` sets the TTL to the grant's TTL, or to what is left of the grant's minimum hold
///   if that is longer;
/// - a request's minimum hold ([`LeaseRequest::min_hold`]) keeps the key at least that long
///   after the grant, by the server's clock: the grant's TTL is `max(ttl, min_hold)`, and a
///   release (or `release_attempt`) before the hold ends answers
///   [`ReleaseReply::Released`] but keeps the key, turned into a record that is no longer the
///   attempt's grant (renew, release-by-fence and replay no longer match it; acquires are
///   contended, [`Contention::released`] set), with the same fence and holder name, until
///   the hold ends; it sends no release notice. Releasing such a record again, by the attempt
///   that released it, answers `Released` and changes nothing;
/// - a request's holder name ([`LeaseRequest::holder_name`]) is stored with the grant and
///   returned by `inspect` ([`LeaseView::holder_name`](crate::LeaseView::holder_name)) and in
///   contention ([`Contention::holder_name`]); it is never the owner token;
/// - a [`Failure::Unavailable`] or [`Failure::Overloaded`] is returned only when the command
///   was certainly not applied; anything uncertain is [`Failure::Indeterminate`].
///
/// A request with a capacity ([`LeaseRequest::with_capacity`]) asks for one *permit* of the
/// semaphore of that capacity on the resource, kept apart from the lease of the same name:
///
/// - the capacity is recorded by the first request; one asking for another is answered
///   [`AcquireReply::CapacityMismatch`] and nothing is written;
/// - a permit is a grant of one *slot* (0 to capacity − 1, [`GrantReply::slot`]) that no other
///   grant holds, with a fence larger than any issued before for the semaphore (every slot),
///   and is renewed and released exactly as a lease on that slot is ([`Grant::slot`]);
/// - at most `capacity` slots are held at once, and waiters are served first come, first
///   served: a request that waits ([`LeaseRequest::wait_timeout`] not zero) and is refused
///   takes a place in the semaphore's queue, and only the first f places may take f free
///   slots. A place lapses one [`LeaseRequest::queue_heartbeat`] after its last try;
///   `release_attempt` gives it back (and the slot the attempt holds, if any);
/// - [`watch_queue`](Self::watch_queue) fires when a permit is released while someone
///   waits.
///
/// A request with a side of a read/write lease ([`LeaseRequest::with_rw`]) is queued the
/// same way, kept apart from the lease and the semaphore of its name: one writer, whose grant
/// has a new fence, or up to [`MAX_READERS`](crate::request::MAX_READERS) readers, each in
/// a reader slot with the last writer's fence; writers are preferred (a waiting writer lets
/// no new reader in). [`downgrade`](Self::downgrade) turns the writer's grant into a
/// reader's in one step.
pub trait LeaseBackend: Send + Sync + 'static {
    /// Tries once to acquire the lease described by `request`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the command applied on the server, exactly like an
    /// `Indeterminate` reply; replay with the same attempt to find out.
    fn acquire(&self, request: &LeaseRequest) -> impl Future<Output = AcquireReply> + Send;

    /// Renews exactly `grant`.
    ///
    /// # Cancel safety
    ///
    /// As for [`Self::acquire`]: a dropped renew may have been applied.
    fn renew(&self, grant: &Grant) -> impl Future<Output = RenewReply> + Send;

    /// Releases exactly `grant`.
    ///
    /// # Cancel safety
    ///
    /// As for [`Self::acquire`]: a dropped release may have been applied.
    fn release(&self, grant: &Grant) -> impl Future<Output = ReleaseReply> + Send;

    /// Releases whatever grant `request`'s attempt holds, whatever its fence: the cleanup
    /// after an acquire whose outcome stayed unknown, which never makes a grant just to drop
    /// it (as a replay followed by a release would).
    ///
    /// A backend whose commands on one connection run in order should send it on the
    /// connection the unanswered acquire went on: queued behind it, it undoes a grant the
    /// acquire makes late the moment that grant is made. The default inspects, then releases
    /// the grant found (two round trips, with no such ordering).
    ///
    /// # Cancel safety
    ///
    /// As for [`Self::acquire`]: a dropped release may have been applied.
    fn release_attempt(&self, request: &LeaseRequest) -> impl Future<Output = ReleaseReply> + Send {
        async move {
            let found = self
                .inspect(
                    request.purpose(),
                    request.resource(),
                    Some(request.attempt()),
                )
                .await;
            let view = match found {
                InspectOutcome::HeldByThisAttempt(view) => view,
                InspectOutcome::Free => return ReleaseReply::AlreadyGone,
                InspectOutcome::HeldByOther(_) => return ReleaseReply::NotOwner,
                InspectOutcome::Indeterminate(i) => {
                    return ReleaseReply::Failed(Failure::Indeterminate(i));
                }
                InspectOutcome::Unavailable(u) => {
                    return ReleaseReply::Failed(Failure::Unavailable(u));
                }
                InspectOutcome::Overloaded => return ReleaseReply::Failed(Failure::Overloaded),
            };
            let Some(fence) = view.fence else {
                return ReleaseReply::Failed(Failure::Indeterminate(Indeterminate::new(
                    IndeterminateCause::UnexpectedReply,
                    "this attempt's grant was reported without a fence",
                )));
            };
            let grant = GrantReply::new(fence, Duration::ZERO);
            self.release(&Grant::new(request, &grant)).await
        }
    }

    /// Turns exactly `grant`, the writer's side of a read/write lease, into a reader's with
    /// the same fence and attempt, atomically: readers waiting may come in at once, another
    /// writer never in between. The default answers that it is not supported, having sent
    /// nothing.
    ///
    /// # Cancel safety
    ///
    /// As [`Self::acquire`]: a dropped downgrade may have been applied.
    fn downgrade(&self, grant: &Grant) -> impl Future<Output = DowngradeReply> + Send {
        let _ = grant;
        std::future::ready(DowngradeReply::Failed(Failure::Unavailable(
            crate::outcome::Unavailable::new(
                crate::outcome::UnavailableCause::Unsupported,
                "this backend has no read/write leases",
            ),
        )))
    }

    /// Reads who holds the lease on `resource` for `purpose`; with an attempt, whether that
    /// attempt holds it. Never changes anything.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: inspection changes nothing.
    fn inspect(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        attempt: Option<&Attempt>,
    ) -> impl Future<Output = InspectOutcome> + Send;

    /// Reads who holds the lease, as [`inspect`](Self::inspect) does without an attempt, for a
    /// reader that then waits for the holder's release notice (an election's observer). A
    /// backend that announces only the releases someone waits for makes sure that this
    /// holder's is announced (the Redis backend marks the grant, as a refused acquire does).
    /// The default is `inspect`, right for a backend whose releases are all announced or none
    /// are; a backend that wraps another must forward this method too, or its observers learn
    /// of a resignation only by the leader's TTL.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: at most, the holder's release is announced.
    fn inspect_watched(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
    ) -> impl Future<Output = InspectOutcome> + Send {
        self.inspect(purpose, resource, None)
    }

    /// Subscribes to release notices for `resource`. Notices are hints that only make a
    /// waiter retry sooner: a missed one costs latency, never safety. The default has none.
    fn watch(&self, purpose: &Purpose, resource: &ResourceDigest) -> ReleaseWatch {
        let _ = (purpose, resource);
        ReleaseWatch::none()
    }

    /// Subscribes to the notices a queued `request` waits for ([`LeaseRequest::is_queued`]):
    /// a release of any permit of its semaphore, or of either side of its read/write lease,
    /// while someone waits in the queue. The default has none.
    fn watch_queue(&self, request: &LeaseRequest) -> ReleaseWatch {
        let _ = request;
        ReleaseWatch::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::OperationId;
    use crate::request::DriftBudget;

    #[test]
    fn debug_of_a_grant_hides_the_owner_token() {
        let attempt = Attempt::new(OperationId::new("op").unwrap()).unwrap();
        let token = attempt.owner_token().expose_secret().to_owned();
        let request = LeaseRequest::new(
            Purpose::new("p").unwrap(),
            ResourceDigest::of("r"),
            attempt,
            Duration::from_secs(3),
            DriftBudget::default(),
        )
        .unwrap();
        let grant = Grant::new(
            &request,
            &GrantReply::new(FenceToken::new(7).unwrap(), Duration::ZERO),
        );
        let text = format!("{grant:?}");
        assert!(text.contains("fence"), "{text}");
        assert!(!text.contains(&token), "{text}");
    }
}
