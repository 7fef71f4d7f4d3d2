//! An operator's view: the leases held in a namespace ([`RedisBackend::list`]), and removing
//! a stuck one ([`RedisBackend::break_lease`]); the same for semaphores, and a change of a
//! semaphore's capacity, in [`semaphore`].
//!
//! None is part of the lease port: a library user holds, renews and releases its own
//! leases; these act on anyone's, for the people who run the deployment.

mod semaphore;

pub use semaphore::{
    CapacityChange, HeldPermit, ListedSemaphore, ListedSemaphoreState, SemaphoreView,
};

use leasehold::{
    Indeterminate, IndeterminateCause, InspectOutcome, LeaseBackend as _, LeaseView, Purpose,
    ResourceDigest, Unavailable, UnavailableCause, UnusableKey,
};

use crate::decode::unreadable;
use crate::scripts::BreakCall;
use crate::{Error, KeyLayout, RedisBackend};

/// A lease found by [`RedisBackend::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedLease {
    /// The purpose it was taken for.
    pub purpose: Purpose,
    /// The resource's digest (the raw name is never stored).
    pub resource: ResourceDigest,
    /// What its key holds.
    pub state: ListedState,
}

impl ListedLease {
    /// A listed lease (for tests and other backends' listings).
    pub fn new(purpose: Purpose, resource: ResourceDigest, state: ListedState) -> Self {
        Self {
            purpose,
            resource,
            state,
        }
    }
}

/// What a listed lease's key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListedState {
    /// A lease: its fence, time left, holder fingerprint and name.
    Held(LeaseView),
    /// A key no lease operation can use (another type, a string leasehold did not write, a
    /// counter out of range): an operator should look at it.
    Unusable(UnusableKey),
}

impl RedisBackend {
    /// Lists the leases in this backend's namespace (and key version), of one purpose or all,
    /// sorted by purpose and digest: `SCAN` (never `KEYS`), on every master of a Cluster, then
    /// each lease read as [`inspect`](leasehold::LeaseClient::inspect) reads it, without an
    /// attempt. Not a snapshot: a lease granted or released during the walk may or may not be
    /// listed, and each is read at its own moment.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] or [`Error::Indeterminate`] if the server cannot be reached or a
    /// reply is lost; nothing is changed either way.
    pub async fn list(&self, purpose: Option<&Purpose>) -> Result<Vec<ListedLease>, Error> {
        let pattern = self.keys().lease_pattern(purpose);
        let keys = self.link().scan(&pattern).await.map_err(Error::from)?;
        let mut found: Vec<(Purpose, ResourceDigest)> = keys
            .iter()
            .filter_map(|key| self.keys().parse_lease_key(key))
            .collect();
        found.sort_by(|a, b| (a.0.as_str(), a.1.as_str()).cmp(&(b.0.as_str(), b.1.as_str())));
        found.dedup();
        let mut leases = Vec::with_capacity(found.len());
        for (purpose, resource) in found {
            let state = match self.inspect(&purpose, &resource, None).await {
                // Released or expired since the scan.
                InspectOutcome::Free => continue,
                InspectOutcome::HeldByOther(view) | InspectOutcome::HeldByThisAttempt(view) => {
                    ListedState::Held(view)
                }
                InspectOutcome::Unavailable(Unavailable {
                    cause: UnavailableCause::UnusableKey(what),
                    ..
                }) => ListedState::Unusable(what),
                InspectOutcome::Unavailable(u) => return Err(Error::Unavailable(u)),
                InspectOutcome::Indeterminate(i) => return Err(Error::Indeterminate(i)),
                other => {
                    return Err(Error::Indeterminate(Indeterminate::new(
                        IndeterminateCause::UnexpectedReply,
                        format!("inspect answered {other:?}"),
                    )));
                }
            };
            leases.push(ListedLease::new(purpose, resource, state));
        }
        Ok(leases)
    }

    /// Removes the lease on `resource` for `purpose`, whoever holds it — an operator's remedy
    /// for a holder that is gone but whose lease is long, or kept by a minimum hold. Only the
    /// lease key is deleted: the fence counter stays, so the next grant's fence is higher
    /// than the removed one and the old holder's late fenced writes are still rejected. The
    /// removal is announced as a release is, so that waiters try at once.
    ///
    /// The old holder is not told: its next renewal finds the lease gone and reports it lost,
    /// and its keep-alive stops its work then. Until that renewal it may still be working,
    /// which is why its writes must be fenced.
    ///
    /// Returns what was removed, or `None` if there was no lease.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] if nothing was removed: the server could not be reached, or the
    /// key holds something leasehold did not write — another type, or a string that is not a
    /// lease's value, of any size ([`UnavailableCause::UnusableKey`], left alone);
    /// [`Error::Indeterminate`] if the reply was lost (it may have been removed: inspect
    /// tells).
    pub async fn break_lease(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
    ) -> Result<Option<LeaseView>, Error> {
        let lease_key = self.keys().lease_key(purpose, resource);
        let call = BreakCall {
            release_channel: KeyLayout::release_channel_of(&lease_key),
            lease_key,
            sharded: self.is_sharded(),
        };
        let outcome = match self.link().eval(&call, None).await {
            Ok((value, _)) => BreakCall::decode(&value).map_err(unreadable),
            Err(failure) => Err(failure),
        };
        match outcome {
            Ok(InspectOutcome::Free) => Ok(None),
            Ok(InspectOutcome::HeldByOther(view) | InspectOutcome::HeldByThisAttempt(view)) => {
                Ok(Some(view))
            }
            Ok(InspectOutcome::Unavailable(u)) => Err(Error::Unavailable(u)),
            Ok(InspectOutcome::Indeterminate(i)) => Err(Error::Indeterminate(i)),
            Ok(other) => Err(Error::Indeterminate(Indeterminate::new(
                IndeterminateCause::UnexpectedReply,
                format!("break answered {other:?}"),
            ))),
            Err(failure) => Err(Error::from(failure)),
        }
    }
}
