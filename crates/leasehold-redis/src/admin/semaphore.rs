//! An operator's view of counting semaphores: who holds which permit
//! ([`RedisBackend::inspect_semaphore`], [`RedisBackend::list_semaphores`]), removing a stuck
//! permit ([`RedisBackend::break_permit`]) and changing a capacity without evicting anyone
//! ([`RedisBackend::set_semaphore_capacity`]).
//!
//! A permit is a lease on one of the semaphore's slot keys, so each held slot is shown as a
//! lease is ([`LeaseView`]: fence, time left, holder fingerprint and name, never a token), and
//! a permit is broken as a lease is, by `break.lua` on its slot's key.

use leasehold::request::MAX_CAPACITY;
use leasehold::{
    Indeterminate, IndeterminateCause, InspectOutcome, LeaseView, Purpose, ResourceDigest,
    Unavailable, UnavailableCause, UnusableKey,
};

use crate::decode::unreadable;
use crate::scripts::{
    BreakCall, CapacitySet, SemaphoreCapacityCall, SemaphoreInspectCall, SemaphoreRead,
};
use crate::{Error, RedisBackend};

/// A semaphore as [`RedisBackend::inspect_semaphore`] reads it, at one moment (one script).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreView {
    /// The capacity recorded; `None` when no record is left while permits are held (it was
    /// evicted or deleted: the next acquire records its own).
    pub capacity: Option<u32>,
    /// How many slots an acquire counts: the capacity, or more after the capacity was lowered
    /// while higher slots were held (until none of those is).
    pub width: u32,
    /// How many waiters hold a place in the queue whose heartbeat has not lapsed.
    pub waiting: u64,
    /// The held slots, in slot order.
    pub permits: Vec<HeldPermit>,
}

impl SemaphoreView {
    /// A view (for tests and other backends' views).
    pub fn new(capacity: Option<u32>, width: u32, waiting: u64, permits: Vec<HeldPermit>) -> Self {
        Self {
            capacity,
            width,
            waiting,
            permits,
        }
    }
}

/// One held slot of a semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldPermit {
    /// The slot, from 0.
    pub slot: u32,
    /// Its grant, as a lease's is shown (a record kept after release until its minimum hold
    /// ends is `released`).
    pub view: LeaseView,
}

impl HeldPermit {
    /// A held permit (for tests and other backends' views).
    pub fn new(slot: u32, view: LeaseView) -> Self {
        Self { slot, view }
    }
}

/// A semaphore found by [`RedisBackend::list_semaphores`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedSemaphore {
    /// The purpose it was taken for.
    pub purpose: Purpose,
    /// The resource's digest (the raw name is never stored).
    pub resource: ResourceDigest,
    /// What its keys hold.
    pub state: ListedSemaphoreState,
}

impl ListedSemaphore {
    /// A listed semaphore (for tests and other backends' listings).
    pub fn new(purpose: Purpose, resource: ResourceDigest, state: ListedSemaphoreState) -> Self {
        Self {
            purpose,
            resource,
            state,
        }
    }
}

/// What a listed semaphore's keys hold.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListedSemaphoreState {
    /// A semaphore: its record, waiters and held permits (perhaps none).
    Found(SemaphoreView),
    /// A key no semaphore operation can use: an operator should look at it.
    Unusable(UnusableKey),
}

/// What [`RedisBackend::set_semaphore_capacity`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CapacityChange {
    /// The capacity recorded before; `None` if none was (the record now sets the capacity
    /// the first permits must ask for).
    pub previous: Option<u32>,
    /// The capacity recorded now.
    pub capacity: u32,
    /// How many slots acquires count now: above the capacity while a higher slot is held.
    pub width: u32,
    /// How many slots are held.
    pub held: u32,
    /// True if and only if the capacity grew while someone waited, and the waiters were told
    /// so that they try again at once.
    pub woke_waiters: bool,
}

impl CapacityChange {
    /// A change (for tests and other backends' changes).
    pub fn new(
        previous: Option<u32>,
        capacity: u32,
        width: u32,
        held: u32,
        woke_waiters: bool,
    ) -> Self {
        Self {
            previous,
            capacity,
            width,
            held,
            woke_waiters,
        }
    }
}

impl RedisBackend {
    /// Reads the semaphore on `resource` for `purpose` in one script, changing nothing: its
    /// recorded capacity and width, how many waiters hold a live place in its queue, and each
    /// held slot as [`inspect`](leasehold::LeaseClient::inspect) shows a lease (the holder's
    /// fingerprint, never its token). `None` if there is no semaphore: no capacity recorded,
    /// no permit held and no waiter. Read-only: it runs on a replica too.
    ///
    /// Without a record every slot up to [`MAX_CAPACITY`] is looked at, so that permits held
    /// after the record was evicted are still shown.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] if the server cannot be reached, or a key holds something
    /// leasehold did not write ([`UnavailableCause::UnusableKey`]); [`Error::Indeterminate`]
    /// if no reply came. Nothing is changed either way.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it changes nothing.
    pub async fn inspect_semaphore(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
    ) -> Result<Option<SemaphoreView>, Error> {
        let keys = self.keys().semaphore(purpose, resource);
        let call = SemaphoreInspectCall {
            capacity_key: keys.capacity,
            heartbeat_key: keys.heartbeats,
            slot_key_prefix: keys.slot_prefix,
            slot_limit: u64::from(MAX_CAPACITY),
        };
        let (value, _) = self.link().eval(&call, None).await?;
        match SemaphoreInspectCall::decode(&value).map_err(unreadable)? {
            SemaphoreRead::Absent => Ok(None),
            SemaphoreRead::Found {
                capacity,
                width,
                waiting,
                held,
            } => Ok(Some(SemaphoreView::new(
                (capacity > 0).then_some(capacity),
                width,
                waiting,
                held.into_iter()
                    .map(|(slot, view)| HeldPermit::new(slot, view))
                    .collect(),
            ))),
            SemaphoreRead::Failed(failure) => Err(Error::from(failure)),
        }
    }

    /// Lists the semaphores in this backend's namespace (and key version), of one purpose or
    /// all, sorted by purpose and digest: `SCAN` (never `KEYS`), on every master of a Cluster,
    /// for capacity records and slot keys, then each semaphore read as
    /// [`inspect_semaphore`](Self::inspect_semaphore) reads it. Not a snapshot: a permit
    /// granted or released during the walk may or may not be listed.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] or [`Error::Indeterminate`] if the server cannot be reached or
    /// a reply is lost; nothing is changed either way.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it changes nothing.
    pub async fn list_semaphores(
        &self,
        purpose: Option<&Purpose>,
    ) -> Result<Vec<ListedSemaphore>, Error> {
        let all = self.keys().semaphore_pattern();
        // The pattern is the layout's semaphore prefix and a `*`: nothing in it needs escaping
        // (namespace, version and purpose have no glob characters).
        let prefix = all.strip_suffix('*').unwrap_or(&all);
        let pattern = match purpose {
            Some(purpose) => format!("{prefix}{purpose}:{{sha256:*}}:*"),
            None => all.clone(),
        };
        let keys = self.link().scan(&pattern).await.map_err(Error::from)?;
        let mut found: Vec<(Purpose, ResourceDigest)> = keys
            .iter()
            .filter_map(|key| self.parse_semaphore_key(prefix, key))
            .collect();
        found.sort_by(|a, b| (a.0.as_str(), a.1.as_str()).cmp(&(b.0.as_str(), b.1.as_str())));
        found.dedup();
        let mut semaphores = Vec::with_capacity(found.len());
        for (purpose, resource) in found {
            let state = match self.inspect_semaphore(&purpose, &resource).await {
                Ok(Some(view)) => ListedSemaphoreState::Found(view),
                // Expired or released since the scan.
                Ok(None) => continue,
                Err(Error::Unavailable(Unavailable {
                    cause: UnavailableCause::UnusableKey(what),
                    ..
                })) => ListedSemaphoreState::Unusable(what),
                Err(e) => return Err(e),
            };
            semaphores.push(ListedSemaphore::new(purpose, resource, state));
        }
        Ok(semaphores)
    }

    /// Reads a capacity record's or a slot's key of this layout back into its semaphore's
    /// purpose and digest; `None` for any other key (the fence counter, the queue, a fenced
    /// record, another layout's key), so that each semaphore is found by the keys that say
    /// it is there.
    fn parse_semaphore_key(&self, prefix: &str, key: &str) -> Option<(Purpose, ResourceDigest)> {
        let rest = key.strip_prefix(prefix)?;
        let (purpose, tagged) = rest.split_once(":{")?;
        let (digest, _) = tagged.split_once('}')?;
        let purpose = Purpose::new(purpose).ok()?;
        let digest = ResourceDigest::parse(digest).ok()?;
        // Only the exact keys this layout would build.
        let keys = self.keys().semaphore(&purpose, &digest);
        let is_slot = key
            .strip_prefix(&keys.slot_prefix)
            .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()));
        (key == keys.capacity || is_slot).then_some((purpose, digest))
    }

    /// Removes the permit held on `slot` of the semaphore on `resource` for `purpose`,
    /// whoever holds it — an operator's remedy for a holder that is gone while its permit is
    /// long, or kept by a minimum hold — exactly as [`break_lease`](Self::break_lease)
    /// removes a lease: only the slot's key is deleted (by `break.lua`, a slot's key being a
    /// lease key in form), the semaphore's fence counter stays, so every later grant's fence
    /// is higher and the old holder's late fenced writes are still rejected. The removal is
    /// announced on the semaphore's channel, so that waiters try at once.
    ///
    /// The old holder is not told: its next renewal finds the slot gone and reports the
    /// permit lost. Until then it may still be working, which is why its writes must be
    /// fenced.
    ///
    /// Returns what was removed, or `None` if the slot was free.
    ///
    /// # Errors
    ///
    /// As [`break_lease`](Self::break_lease): [`Error::Unavailable`] if nothing was removed
    /// (the server could not be reached, or the slot's key holds something leasehold did not
    /// write, left alone); [`Error::Indeterminate`] if the reply was lost.
    ///
    /// # Cancel safety
    ///
    /// Dropping it may leave the permit removed or not: inspect tells.
    pub async fn break_permit(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        slot: u32,
    ) -> Result<Option<LeaseView>, Error> {
        let keys = self.keys().semaphore(purpose, resource);
        let call = BreakCall {
            lease_key: keys.slot(slot),
            release_channel: keys.channel,
            sharded: self.is_sharded(),
        };
        let (value, _) = self.link().eval(&call, None).await?;
        match BreakCall::decode(&value).map_err(unreadable)? {
            InspectOutcome::Free => Ok(None),
            InspectOutcome::HeldByOther(view) | InspectOutcome::HeldByThisAttempt(view) => {
                Ok(Some(view))
            }
            InspectOutcome::Unavailable(u) => Err(Error::Unavailable(u)),
            InspectOutcome::Indeterminate(i) => Err(Error::Indeterminate(i)),
            other => Err(Error::Indeterminate(Indeterminate::new(
                IndeterminateCause::UnexpectedReply,
                format!("break answered {other:?}"),
            ))),
        }
    }

    /// Records `capacity` as the capacity of the semaphore on `resource` for `purpose`, in one
    /// script, evicting no holder: the width becomes the largest of the width recorded, the
    /// highest held slot + 1 and `capacity`, so that after a lowering the holders above the
    /// new capacity keep their slots and nobody new is admitted until fewer than `capacity`
    /// are held. The record lives the counter idle expiry after this
    /// ([`RedisSettings::with_counter_idle_expiry`](crate::RedisSettings::with_counter_idle_expiry)),
    /// as after an acquire. When the
    /// capacity grows and someone waits, the change is announced as a release is, so that
    /// the waiters try at once.
    ///
    /// From then on an acquire asking for another capacity is refused
    /// ([`AcquireOutcome::CapacityMismatch`](leasehold::AcquireOutcome::CapacityMismatch),
    /// nothing written), the next try of a waiter that asked for the old one included: change
    /// what the semaphore's users ask for with it. With no semaphore there, the record is
    /// made: the first permits must then ask for `capacity`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSetting`] if `capacity` is 0 or above [`MAX_CAPACITY`] (nothing is
    /// sent); [`Error::Unavailable`] if nothing was written (the server could not be reached,
    /// or the record or the queue holds something leasehold did not write,
    /// [`UnavailableCause::UnusableKey`]); [`Error::Indeterminate`] if the reply was lost (it
    /// may have been set: [`inspect_semaphore`](Self::inspect_semaphore) tells).
    ///
    /// # Cancel safety
    ///
    /// Dropping it may leave the capacity set or not: inspect tells.
    pub async fn set_semaphore_capacity(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        capacity: u32,
    ) -> Result<CapacityChange, Error> {
        if capacity == 0 || capacity > MAX_CAPACITY {
            return Err(Error::InvalidSetting(format!(
                "a semaphore's capacity must be from 1 to {MAX_CAPACITY}, got {capacity}"
            )));
        }
        let keys = self.keys().semaphore(purpose, resource);
        let call = SemaphoreCapacityCall {
            capacity_key: keys.capacity,
            queue_key: keys.queue,
            slot_key_prefix: keys.slot_prefix,
            capacity: u64::from(capacity),
            slot_limit: u64::from(MAX_CAPACITY),
            // What the semaphore's acquire gives the record, so that a capacity an operator
            // set lasts as one an acquire recorded.
            idle_expiry_in_milliseconds: self.settings().counter_idle_expiry_millis(),
            channel: &keys.channel,
            sharded: self.is_sharded(),
        };
        let (value, _) = self.link().eval(&call, None).await?;
        match SemaphoreCapacityCall::decode(&value).map_err(unreadable)? {
            CapacitySet::Set {
                previous,
                width,
                held,
                announced,
            } => Ok(CapacityChange::new(
                (previous > 0).then_some(previous),
                capacity,
                width,
                held,
                announced,
            )),
            CapacitySet::Failed(failure) => Err(Error::from(failure)),
        }
    }
}
