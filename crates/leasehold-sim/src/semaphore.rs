//! Semaphores on the simulated server: `semaphore_acquire.lua` and `semaphore_release.lua`
//! in Rust, reply for reply.
//!
//! A semaphore of capacity N is N slot keys, `<base>:slot:<k>`, each holding a grant exactly
//! as a lease key does (so renewals of a permit are the lease renewal on its slot's key), a
//! capacity record (capacity and width, with an idle expiry), the fence counter `<base>:fence`
//! (fences grow across every slot) and a queue of waiters by arrival, each with the deadline
//! its place lapses at. Waiters are admitted first come, first served: with f slots free, the
//! first f places may take them.

use leasehold::backend::{AcquireReply, DowngradeReply, GrantReply, ReleaseReply};
use leasehold::{Contention, FenceToken, HolderName, LossCause};

use crate::keyspace::{Counter, Keyspace, Stored};
use crate::script::{Applied, Exact, counter_ttl_ms, refused, unusable_lease};
use crate::state::ServerState;
use crate::units::duration_ms;

/// The most lapsed places one acquire drops, as the script's `DROPPED_PER_CALL`.
const DROPPED_PER_CALL: usize = 64;

/// A semaphore's record on the server: its capacity, how many slots an acquire looks at,
/// and its queue. No `Debug`: the queue holds owner tokens.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SemaphoreRecord {
    /// The capacity record, `None` once it expired (or before first use).
    pub(crate) recorded: Option<Recorded>,
    /// Waiters, in no particular order: the queue's order is (arrival, token), as a sorted
    /// set's.
    pub(crate) queue: Vec<Waiter>,
}

/// The capacity record.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recorded {
    pub(crate) capacity: u32,
    pub(crate) width: u32,
    pub(crate) expires_at_ms: i64,
}

/// One place in the queue.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Waiter {
    pub(crate) token: String,
    pub(crate) arrival_us: i64,
    pub(crate) deadline_us: i64,
    /// A read/write lease's writer (in `rw_acquire.lua`'s writers set too).
    pub(crate) writer: bool,
}

/// A permit request as the server receives it.
#[derive(Clone)]
pub(crate) struct PermitAcquire {
    pub(crate) base: String,
    pub(crate) token: String,
    pub(crate) operation: String,
    pub(crate) ttl_ms: i64,
    pub(crate) min_hold_ms: i64,
    pub(crate) holder_name: Option<HolderName>,
    pub(crate) capacity: u32,
    /// Zero for a try that takes no place in the queue.
    pub(crate) heartbeat_ms: i64,
    /// The counter's and the capacity record's idle expiry.
    pub(crate) counter_idle_ms: i64,
}

/// A read/write acquire as the server receives it.
#[derive(Clone)]
pub(crate) struct RwAcquire {
    pub(crate) base: String,
    pub(crate) token: String,
    pub(crate) operation: String,
    pub(crate) ttl_ms: i64,
    pub(crate) holder_name: Option<HolderName>,
    pub(crate) write: bool,
    /// Zero for a try that takes no place in the queue.
    pub(crate) heartbeat_ms: i64,
    /// The counter's idle expiry.
    pub(crate) counter_idle_ms: i64,
}

/// A downgrade as the server receives it: of the writer's grant `exact`.
#[derive(Clone)]
pub(crate) struct RwDowngrade {
    pub(crate) base: String,
    pub(crate) exact: Exact,
    pub(crate) ttl_ms: i64,
}

/// Which key a release is for.
#[derive(Clone, Copy)]
pub(crate) enum Target {
    /// A permit's or a reader's slot.
    Slot(u32),
    /// A read/write lease's writer.
    Writer,
    /// Whatever the attempt holds (a cleanup); `read_write` looks at the writer's key too.
    Any { read_write: bool },
}

/// A permit release as the server receives it: of `target`'s grant with `fence`, or (a
/// fence of `None`, target `Any`) of whatever the attempt holds, with its place in the queue.
#[derive(Clone)]
pub(crate) struct PermitRelease {
    pub(crate) base: String,
    pub(crate) target: Target,
    pub(crate) fence: Option<u64>,
    pub(crate) token: String,
    pub(crate) operation: String,
    pub(crate) capacity: u32,
}

/// The writer's key of the read/write lease at `base`: its slot `w`.
pub(crate) fn writer_key(base: &str) -> String {
    format!("{base}:slot:w")
}

/// Slot `slot`'s key.
pub(crate) fn slot_key(base: &str, slot: u32) -> String {
    format!("{base}:slot:{slot}")
}

/// The fence counter of the semaphore at `base`.
pub(crate) fn counter_key(base: &str) -> String {
    format!("{base}:fence")
}

impl Keyspace {
    /// Returns the semaphore at `base` as it stands at `now_us`: an expired capacity record
    /// is gone, and so is a queue whose every place lapsed (its key's TTL is its latest
    /// place's).
    fn semaphore(&mut self, base: &str, now_us: i64) -> SemaphoreRecord {
        let mut record = self
            .semaphores
            .get(base)
            .cloned()
            .unwrap_or(SemaphoreRecord {
                recorded: None,
                queue: Vec::new(),
            });
        let now_ms = now_us.div_euclid(1000);
        if record.recorded.is_some_and(|r| now_ms > r.expires_at_ms) {
            record.recorded = None;
        }
        if record
            .queue
            .iter()
            .all(|w| w.deadline_us.div_euclid(1000) < now_ms)
        {
            record.queue.clear();
        }
        record
    }
}

/// Sorts a queue into its sorted set's order: by arrival, then by token.
fn in_order(queue: &mut [Waiter]) {
    queue.sort_by(|a, b| (a.arrival_us, &a.token).cmp(&(b.arrival_us, &b.token)));
}

impl ServerState {
    /// `semaphore_acquire.lua`.
    pub(crate) fn acquire_permit(&mut self, op: &PermitAcquire, now_us: i64) -> Applied {
        let idle_ms = op.counter_idle_ms;
        let now = now_us.div_euclid(1000);
        let mut record = self.keyspace.semaphore(&op.base, now_us);
        let reply = |r| Applied::Acquire(r);
        if let Some(recorded) = record.recorded
            && recorded.capacity != op.capacity
        {
            return reply(AcquireReply::CapacityMismatch {
                recorded: recorded.capacity,
            });
        }
        let width = record
            .recorded
            .map_or(op.capacity, |r| r.width.max(op.capacity));
        // Lapsed places, the oldest deadlines first, at most DROPPED_PER_CALL: read first,
        // dropped once no refusal can follow, as the script does.
        let mut lapsed: Vec<String> = record
            .queue
            .iter()
            .filter(|w| w.deadline_us <= now_us)
            .map(|w| (w.deadline_us, w.token.clone()))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .take(DROPPED_PER_CALL)
            .map(|(_, token)| token)
            .collect();
        lapsed.sort_unstable();
        let drop_lapsed = |record: &mut SemaphoreRecord| {
            record
                .queue
                .retain(|w| lapsed.binary_search(&w.token).is_err());
        };
        // A waiter at or past the capacity (the lapsed ahead of it gone) is refused before
        // any slot is read.
        if op.heartbeat_ms > 0 && lapsed.binary_search(&op.token).is_err() {
            let mut kept = record.clone();
            drop_lapsed(&mut kept);
            in_order(&mut kept.queue);
            if let Some(place) = kept.queue.iter().position(|w| w.token == op.token)
                && place >= op.capacity as usize
            {
                let deadline_us = now_us.saturating_add(op.heartbeat_ms.saturating_mul(1000));
                if let Some(waiter) = kept.queue.iter_mut().find(|w| w.token == op.token) {
                    waiter.deadline_us = deadline_us;
                }
                self.before_write();
                self.keyspace.semaphores.insert(op.base.clone(), kept);
                return reply(AcquireReply::Contended(
                    Contention::new(duration_ms((op.heartbeat_ms / 3).max(1)), None, None)
                        .with_ahead(u32::try_from(place).unwrap_or(u32::MAX)),
                ));
            }
        }
        let (mut held, mut free_slot, mut soonest, mut high_held) = (0u32, None, None, false);
        for k in 0..width {
            let key = slot_key(&op.base, k);
            if let Some(what) = unusable_lease(&self.keyspace, &key) {
                return reply(AcquireReply::Failed(refused(what)));
            }
            let Some(stored) = self.keyspace.live(&key, now) else {
                if free_slot.is_none() && k < op.capacity {
                    free_slot = Some(k);
                }
                continue;
            };
            let fence = FenceToken::new(stored.fence).unwrap_or(FenceToken::MIN);
            let pttl = stored.expires_at_ms - now;
            if stored.token == op.token && stored.operation == op.operation {
                return reply(AcquireReply::Replayed(
                    GrantReply::new(fence, duration_ms(pttl.max(0)))
                        .with_term(self.term)
                        .with_slot(k),
                ));
            }
            if stored.token == op.token {
                return reply(AcquireReply::OwnerOperationConflict(
                    Contention::new(duration_ms(pttl.max(1)), stored.holder(), Some(fence))
                        .with_holder_name(stored.holder_name.clone()),
                ));
            }
            held += 1;
            high_held |= k >= op.capacity;
            if pttl > 0 {
                soonest = Some(soonest.map_or(pttl, |s: i64| s.min(pttl)));
            }
        }
        drop_lapsed(&mut record);
        in_order(&mut record.queue);
        let place = record.queue.iter().position(|w| w.token == op.token);
        let ahead = place.unwrap_or(record.queue.len());
        let free = op.capacity.saturating_sub(held) as usize;
        if let Some(slot) = free_slot.filter(|_| free > ahead) {
            let counter_key = counter_key(&op.base);
            if let Some(what) =
                crate::script::unusable_counter_at(&self.keyspace, &counter_key, now)
            {
                return reply(AcquireReply::Failed(refused(what)));
            }
            let counter = self.keyspace.counter(&counter_key, now).unwrap_or(0);
            let clock = u64::try_from(now_us)
                .unwrap_or(0)
                .min(FenceToken::MAX.get());
            let fence = (counter + 1).max(clock);
            let px = op.ttl_ms.max(op.min_hold_ms);
            self.before_write();
            self.keyspace.fences.insert(
                counter_key,
                Counter {
                    value: fence,
                    expires_at_ms: Some(now.saturating_add(counter_ttl_ms(fence, now_us, idle_ms))),
                },
            );
            self.keyspace.leases.insert(
                slot_key(&op.base, slot),
                Stored {
                    fence,
                    token: op.token.clone(),
                    operation: op.operation.clone(),
                    expires_at_ms: now + px,
                    hold_until_us: (op.min_hold_ms > 0)
                        .then(|| now_us.saturating_add(op.min_hold_ms.saturating_mul(1000))),
                    holder_name: op.holder_name.clone(),
                    marked: false,
                },
            );
            if let Some(at) = place {
                record.queue.remove(at);
            }
            record.recorded = Some(Recorded {
                capacity: op.capacity,
                width: if high_held { width } else { op.capacity },
                expires_at_ms: now + idle_ms,
            });
            self.keyspace.semaphores.insert(op.base.clone(), record);
            return reply(AcquireReply::Granted(
                GrantReply::new(
                    FenceToken::new(fence).unwrap_or(FenceToken::MIN),
                    duration_ms(px),
                )
                .with_term(self.term)
                .with_slot(slot),
            ));
        }
        let mut retry_after = soonest;
        if op.heartbeat_ms > 0 {
            let deadline_us = now_us.saturating_add(op.heartbeat_ms.saturating_mul(1000));
            match record.queue.iter_mut().find(|w| w.token == op.token) {
                Some(waiter) => waiter.deadline_us = deadline_us,
                None => record.queue.push(Waiter {
                    token: op.token.clone(),
                    arrival_us: now_us,
                    deadline_us,
                    writer: false,
                }),
            }
            let third = (op.heartbeat_ms / 3).max(1);
            retry_after = Some(retry_after.map_or(third, |r| r.min(third)));
        }
        if record.recorded.is_none() {
            record.recorded = Some(Recorded {
                capacity: op.capacity,
                width,
                expires_at_ms: now + idle_ms,
            });
        }
        if self.keyspace.semaphores.get(&op.base) != Some(&record) {
            self.before_write();
            self.keyspace.semaphores.insert(op.base.clone(), record);
        }
        reply(AcquireReply::Contended(
            Contention::new(duration_ms(retry_after.unwrap_or(1)), None, None)
                .with_ahead(u32::try_from(ahead).unwrap_or(u32::MAX)),
        ))
    }

    /// `semaphore_release.lua`.
    pub(crate) fn release_permit(&mut self, op: &PermitRelease, now_us: i64) -> Applied {
        let now = now_us.div_euclid(1000);
        let mut record = self.keyspace.semaphore(&op.base, now_us);
        let cleanup = op.fence.is_none();
        let keys: Vec<String> = match op.target {
            Target::Slot(slot) => vec![slot_key(&op.base, slot)],
            Target::Writer => vec![writer_key(&op.base)],
            Target::Any { read_write } => {
                let width = record.recorded.map_or(0, |r| r.width).max(op.capacity);
                let mut keys: Vec<String> = (0..width).map(|k| slot_key(&op.base, k)).collect();
                if read_write {
                    keys.push(writer_key(&op.base));
                }
                keys
            }
        };
        if cleanup && record.queue.iter().any(|w| w.token == op.token) {
            self.before_write();
            record.queue.retain(|w| w.token != op.token);
            self.keyspace
                .semaphores
                .insert(op.base.clone(), record.clone());
        }
        let mut reply = ReleaseReply::AlreadyGone;
        for key in keys {
            if unusable_lease(&self.keyspace, &key).is_some() {
                if !cleanup {
                    reply = ReleaseReply::NotOwner;
                }
                continue;
            }
            let Some(stored) = self.keyspace.live(&key, now) else {
                continue;
            };
            let fence = op.fence.unwrap_or(stored.fence);
            let exact = (fence, op.token.clone(), op.operation.clone());
            match self.release(&key, &exact, now_us) {
                Applied::Release(ReleaseReply::Released) => {
                    // `release` announces only a marked grant, and no slot is ever marked: the
                    // semaphore's release is announced while someone waits.
                    let deleted = self.keyspace.live(&key, now).is_none();
                    if deleted && !record.queue.is_empty() {
                        self.announce(&op.base);
                    }
                    return Applied::Release(ReleaseReply::Released);
                }
                _ if !cleanup => reply = ReleaseReply::NotOwner,
                _ => {}
            }
        }
        Applied::Release(reply)
    }
}

/// The base key of the semaphore on `resource` for `purpose`, apart from every lease key.
pub(crate) fn semaphore_of(
    purpose: &leasehold::Purpose,
    resource: &leasehold::ResourceDigest,
) -> String {
    format!("sem:{purpose}:{{{resource}}}")
}

/// The base key of the read/write lease on `resource` for `purpose`, apart from every lease
/// and semaphore key.
pub(crate) fn rw_of(purpose: &leasehold::Purpose, resource: &leasehold::ResourceDigest) -> String {
    format!("rw:{purpose}:{{{resource}}}")
}

/// The base key of the queue a queued `request` waits in: its semaphore's or its read/write
/// lease's.
pub(crate) fn queue_base(request: &leasehold::LeaseRequest) -> String {
    match request.rw() {
        Some(_) => rw_of(request.purpose(), request.resource()),
        None => semaphore_of(request.purpose(), request.resource()),
    }
}

/// How many reader slots a read/write lease has, as `rw_acquire.lua`'s `READERS`.
const READERS: u32 = leasehold::request::MAX_READERS;

impl ServerState {
    /// `rw_acquire.lua`.
    pub(crate) fn acquire_rw(&mut self, op: &RwAcquire, now_us: i64) -> Applied {
        let idle_ms = op.counter_idle_ms;
        let now = now_us.div_euclid(1000);
        let mut record = self.keyspace.semaphore(&op.base, now_us);
        let reply = |r| Applied::Acquire(r);
        let (mut writer_held, mut readers, mut free_slot, mut soonest) = (false, 0u32, None, None);
        let keys = std::iter::once((None, writer_key(&op.base)))
            .chain((0..READERS).map(|k| (Some(k), slot_key(&op.base, k))));
        for (slot, key) in keys {
            if let Some(what) = unusable_lease(&self.keyspace, &key) {
                return reply(AcquireReply::Failed(refused(what)));
            }
            let Some(stored) = self.keyspace.live(&key, now) else {
                if slot.is_some() && free_slot.is_none() {
                    free_slot = slot;
                }
                continue;
            };
            let fence = FenceToken::new(stored.fence).unwrap_or(FenceToken::MIN);
            let pttl = stored.expires_at_ms - now;
            if stored.token == op.token && stored.operation == op.operation {
                let grant = GrantReply::new(fence, duration_ms(pttl.max(0))).with_term(self.term);
                return reply(AcquireReply::Replayed(match slot {
                    Some(k) => grant.with_slot(k),
                    None => grant,
                }));
            }
            if stored.token == op.token {
                return reply(AcquireReply::OwnerOperationConflict(
                    Contention::new(duration_ms(pttl.max(1)), stored.holder(), Some(fence))
                        .with_holder_name(stored.holder_name.clone()),
                ));
            }
            match slot {
                None => writer_held = true,
                Some(_) => readers += 1,
            }
            if pttl > 0 {
                soonest = Some(soonest.map_or(pttl, |s: i64| s.min(pttl)));
            }
        }
        record.queue.retain(|w| w.deadline_us > now_us);
        in_order(&mut record.queue);
        let writers: Vec<&Waiter> = record.queue.iter().filter(|w| w.writer).collect();
        let ahead = if op.write {
            writers
                .iter()
                .position(|w| w.token == op.token)
                .unwrap_or(writers.len())
        } else {
            writers.len()
        };
        let admitted = if op.write {
            !writer_held && readers == 0 && ahead == 0
        } else {
            !writer_held && writers.is_empty() && free_slot.is_some()
        };
        if admitted {
            let counter_key = counter_key(&op.base);
            if let Some(what) =
                crate::script::unusable_counter_at(&self.keyspace, &counter_key, now)
            {
                let reader_at_top =
                    !op.write && what == leasehold::UnusableKey::FenceRangeExhausted;
                if !reader_at_top {
                    return reply(AcquireReply::Failed(refused(what)));
                }
            }
            let counter = self.keyspace.counter(&counter_key, now).unwrap_or(0);
            let clock = u64::try_from(now_us)
                .unwrap_or(0)
                .min(FenceToken::MAX.get());
            let (fence, key, slot) = if op.write {
                ((counter + 1).max(clock), writer_key(&op.base), None)
            } else {
                let slot = free_slot.unwrap_or(0);
                (
                    if counter == 0 { clock.max(1) } else { counter },
                    slot_key(&op.base, slot),
                    Some(slot),
                )
            };
            self.before_write();
            self.keyspace.fences.insert(
                counter_key,
                Counter {
                    value: fence,
                    expires_at_ms: Some(now.saturating_add(counter_ttl_ms(fence, now_us, idle_ms))),
                },
            );
            self.keyspace.leases.insert(
                key,
                Stored {
                    fence,
                    token: op.token.clone(),
                    operation: op.operation.clone(),
                    expires_at_ms: now + op.ttl_ms,
                    hold_until_us: None,
                    holder_name: op.holder_name.clone(),
                    marked: false,
                },
            );
            record.queue.retain(|w| w.token != op.token);
            self.keyspace.semaphores.insert(op.base.clone(), record);
            let grant = GrantReply::new(
                FenceToken::new(fence).unwrap_or(FenceToken::MIN),
                duration_ms(op.ttl_ms),
            )
            .with_term(self.term);
            return reply(AcquireReply::Granted(match slot {
                Some(k) => grant.with_slot(k),
                None => grant,
            }));
        }
        let mut retry_after = soonest;
        if op.heartbeat_ms > 0 {
            let deadline_us = now_us.saturating_add(op.heartbeat_ms.saturating_mul(1000));
            match record.queue.iter_mut().find(|w| w.token == op.token) {
                Some(waiter) => {
                    waiter.deadline_us = deadline_us;
                    waiter.writer |= op.write;
                }
                None => record.queue.push(Waiter {
                    token: op.token.clone(),
                    arrival_us: now_us,
                    deadline_us,
                    writer: op.write,
                }),
            }
            let third = (op.heartbeat_ms / 3).max(1);
            retry_after = Some(retry_after.map_or(third, |r| r.min(third)));
        }
        if self.keyspace.semaphores.get(&op.base) != Some(&record) {
            self.before_write();
            self.keyspace.semaphores.insert(op.base.clone(), record);
        }
        reply(AcquireReply::Contended(
            Contention::new(duration_ms(retry_after.unwrap_or(1)), None, None)
                .with_ahead(u32::try_from(ahead).unwrap_or(u32::MAX)),
        ))
    }

    /// `rw_downgrade.lua`.
    pub(crate) fn downgrade_rw(&mut self, op: &RwDowngrade, now_us: i64) -> Applied {
        let now = now_us.div_euclid(1000);
        let key = writer_key(&op.base);
        if unusable_lease(&self.keyspace, &key).is_some() {
            return Applied::Downgrade(DowngradeReply::Lost(LossCause::OtherHolder));
        }
        let Some(stored) = self.keyspace.live(&key, now) else {
            return Applied::Downgrade(DowngradeReply::Lost(LossCause::Absent));
        };
        if (stored.fence, &stored.token, &stored.operation)
            != (op.exact.0, &op.exact.1, &op.exact.2)
        {
            return Applied::Downgrade(DowngradeReply::Lost(LossCause::OtherHolder));
        }
        let Some(slot) = (0..READERS).find(|&k| {
            let key = slot_key(&op.base, k);
            unusable_lease(&self.keyspace, &key).is_none()
                && self.keyspace.live(&key, now).is_none()
        }) else {
            return Applied::Downgrade(DowngradeReply::Lost(LossCause::OtherHolder));
        };
        self.before_write();
        self.keyspace.leases.remove(&key);
        self.keyspace.leases.insert(
            slot_key(&op.base, slot),
            Stored {
                expires_at_ms: now + op.ttl_ms,
                marked: false,
                ..stored.clone()
            },
        );
        let record = self.keyspace.semaphore(&op.base, now_us);
        if !record.queue.is_empty() {
            self.announce(&op.base);
        }
        Applied::Downgrade(DowngradeReply::Downgraded(
            GrantReply::new(
                FenceToken::new(stored.fence).unwrap_or(FenceToken::MIN),
                duration_ms(op.ttl_ms),
            )
            .with_term(self.term)
            .with_slot(slot),
        ))
    }
}
