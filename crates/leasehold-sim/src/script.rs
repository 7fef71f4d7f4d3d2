//! The scripts' semantics: what each request does to the keyspace and what it replies.
//!
//! This is `leasehold-redis/lua/*.lua` in Rust, reply for reply: an acquire grants a free key,
//! replays the same attempt (same fence, the *remaining* PTTL), or names the holder; renew and
//! release act only for the exact stored (fence, token, operation); PTTLs are whole
//! milliseconds. A new grant's fence is `max(counter + 1, server clock in microseconds)`, and
//! the counter becomes that fence, with a TTL of the connection's counter idle expiry (plus the
//! fence's lead over the clock, when it is ahead: `counter_ttl_ms`); a counter at
//! [`FenceToken::MAX`] (or above, which is no fence) fails the acquire definitely, with nothing
//! written. A value a test planted at a lease key or a counter ([`ForeignValue`]) is refused as
//! the scripts refuse one, whatever its size: acquire with [`UnusableKey`], renew
//! `Lost(OtherHolder)`, release `NotOwner`, and nothing written.
//!
//! A minimum hold works as in the scripts: a grant's TTL is `max(ttl, hold)`, a renewal's
//! `max(ttl, hold left)`, and a release before the hold ends keeps the key as a released
//! record (token `~<fingerprint>`, same fence and holder name) until the hold ends, answering
//! `Released`; the same attempt releasing it again is answered `Released` with nothing
//! changed. An acquire refused by a grant marks it, and a release announces only a marked
//! grant (D48). The differential tests against real redis-server hold the two to the same
//! replies, and to the same count of announcements.

use std::time::Duration;

use leasehold::backend::{AcquireReply, DowngradeReply, GrantReply, ReleaseReply, RenewReply};
use leasehold::{
    Contention, Failure, FenceToken, HolderFingerprint, HolderName, LossCause, MAX_TTL,
    Unavailable, UnavailableCause, UnusableKey,
};

use crate::RequestKind;
use crate::keyspace::{Counter, ForeignValue, Keyspace, RELEASED, Stored, fence_key};
use crate::semaphore::{PermitAcquire, PermitRelease, RwAcquire, RwDowngrade};
use crate::state::ServerState;
use crate::units::{duration_ms, millis};

/// A grant as renew and release name it: its fence, owner token and operation.
pub(crate) type Exact = (u64, String, String);

/// A request as the server receives it.
#[derive(Clone)]
pub(crate) enum WireOp {
    Acquire {
        key: String,
        token: String,
        operation: String,
        ttl_ms: i64,
        /// Zero for none.
        min_hold_ms: i64,
        holder_name: Option<HolderName>,
        /// The counter idle expiry the client sends.
        counter_idle_ms: i64,
    },
    Renew {
        key: String,
        exact: Exact,
        ttl_ms: i64,
        /// The term the grant was made in.
        term: u64,
    },
    Release {
        key: String,
        exact: Exact,
    },
    /// A release of whatever grant the attempt holds, whatever its fence (`release.lua` with
    /// an empty fence).
    ReleaseAttempt {
        key: String,
        token: String,
        operation: String,
    },
    /// `semaphore_acquire.lua`.
    AcquirePermit(PermitAcquire),
    /// `semaphore_release.lua`.
    ReleasePermit(PermitRelease),
    /// `rw_acquire.lua`.
    AcquireRw(RwAcquire),
    /// `rw_downgrade.lua`.
    Downgrade(RwDowngrade),
}

/// The reply to a [`WireOp`], of the matching kind.
pub(crate) enum Applied {
    Acquire(AcquireReply),
    Renew(RenewReply),
    Release(ReleaseReply),
    Downgrade(DowngradeReply),
}

impl ServerState {
    /// Applies `op` at `now_us`, the server's clock in microseconds (its milliseconds, for
    /// expiry, are the same reading rounded down).
    /// A renewal of a grant of `term` that found it gone (`cause`): lost to the replacement
    /// if another master has answered since, as the Redis backend tells it.
    fn lost(&self, term: u64, cause: LossCause) -> Applied {
        Applied::Renew(RenewReply::Lost(if term == self.term {
            cause
        } else {
            LossCause::MasterReplaced
        }))
    }

    pub(crate) fn apply(&mut self, op: &WireOp, now_us: i64, fallback: Duration) -> Applied {
        let now = now_us.div_euclid(1000);
        match op {
            WireOp::Acquire {
                key,
                token,
                operation,
                ttl_ms,
                min_hold_ms,
                holder_name,
                counter_idle_ms,
            } => match (
                unusable_lease(&self.keyspace, key),
                self.keyspace.live(key, now),
            ) {
                // A value leasehold did not write is refused before anything else is read.
                (Some(what), _) => Applied::Acquire(AcquireReply::Failed(refused(what))),
                (None, None) => {
                    if let Some(unusable) = unusable_counter_of(&self.keyspace, key, now) {
                        return Applied::Acquire(AcquireReply::Failed(refused(unusable)));
                    }
                    let counter_key = fence_key(key);
                    let counter = self.keyspace.counter(&counter_key, now).unwrap_or(0);
                    // A clock beyond the fence range (or before its origin) adds nothing.
                    let clock = u64::try_from(now_us)
                        .unwrap_or(0)
                        .min(FenceToken::MAX.get());
                    let fence = (counter + 1).max(clock);
                    let px = (*ttl_ms).max(*min_hold_ms);
                    self.before_write();
                    self.keyspace.fences.insert(
                        counter_key,
                        Counter {
                            value: fence,
                            expires_at_ms: Some(now.saturating_add(counter_ttl_ms(
                                fence,
                                now_us,
                                *counter_idle_ms,
                            ))),
                        },
                    );
                    self.keyspace.leases.insert(
                        key.clone(),
                        Stored {
                            fence,
                            token: token.clone(),
                            operation: operation.clone(),
                            expires_at_ms: now + px,
                            hold_until_us: (*min_hold_ms > 0)
                                .then(|| now_us.saturating_add(min_hold_ms.saturating_mul(1000))),
                            holder_name: holder_name.clone(),
                            marked: false,
                        },
                    );
                    Applied::Acquire(AcquireReply::Granted(
                        GrantReply::new(
                            FenceToken::new(fence).unwrap_or(FenceToken::MIN),
                            duration_ms(px),
                        )
                        .with_term(self.term),
                    ))
                }
                (None, Some(stored)) => {
                    let pttl = stored.expires_at_ms - now;
                    let fence = FenceToken::new(stored.fence).unwrap_or(FenceToken::MIN);
                    let contention = Contention::new(
                        if pttl > 0 {
                            duration_ms(pttl)
                        } else {
                            fallback
                        },
                        stored.holder(),
                        Some(fence),
                    )
                    .with_holder_name(stored.holder_name.clone())
                    .with_released(stored.is_released());
                    // A released record's token never equals an owner token.
                    if stored.token == *token && stored.operation == *operation {
                        return Applied::Acquire(AcquireReply::Replayed(
                            GrantReply::new(fence, duration_ms(pttl)).with_term(self.term),
                        ));
                    }
                    self.mark(key);
                    Applied::Acquire(if stored.token == *token {
                        AcquireReply::OwnerOperationConflict(contention)
                    } else {
                        AcquireReply::Contended(contention)
                    })
                }
            },
            WireOp::Renew {
                key,
                exact,
                ttl_ms,
                term,
            } => match self.keyspace.live(key, now) {
                // A value leasehold did not write is certainly not this grant.
                _ if unusable_lease(&self.keyspace, key).is_some() => {
                    self.lost(*term, LossCause::OtherHolder)
                }
                None => self.lost(*term, LossCause::Absent),
                Some(stored) if !matches_exact(&stored, exact) => {
                    self.lost(*term, LossCause::OtherHolder)
                }
                Some(stored) => {
                    self.audit(RequestKind::Renew, &stored, exact);
                    let ttl_ms = (*ttl_ms).max(hold_left_ms(&stored, now_us));
                    self.before_write();
                    if let Some(stored) = self.keyspace.leases.get_mut(key) {
                        stored.expires_at_ms = now + ttl_ms;
                    }
                    Applied::Renew(RenewReply::Renewed {
                        server_ttl: duration_ms(ttl_ms),
                    })
                }
            },
            WireOp::Release { key, exact } => self.release(key, exact, now_us),
            WireOp::AcquirePermit(permit) => self.acquire_permit(permit, now_us),
            WireOp::ReleasePermit(permit) => self.release_permit(permit, now_us),
            WireOp::AcquireRw(rw) => self.acquire_rw(rw, now_us),
            WireOp::Downgrade(rw) => self.downgrade_rw(rw, now_us),
            WireOp::ReleaseAttempt {
                key,
                token,
                operation,
            } => {
                if unusable_lease(&self.keyspace, key).is_some() {
                    return Applied::Release(ReleaseReply::NotOwner);
                }
                // The fence is whatever the stored grant carries.
                let Some(fence) = self.keyspace.live(key, now).map(|s| s.fence) else {
                    return Applied::Release(ReleaseReply::AlreadyGone);
                };
                self.release(key, &(fence, token.clone(), operation.clone()), now_us)
            }
        }
    }

    /// Releases exactly `exact`: deletes it, or keeps it as a released record until its
    /// minimum hold ends.
    pub(crate) fn release(&mut self, key: &str, exact: &Exact, now_us: i64) -> Applied {
        let now = now_us.div_euclid(1000);
        // A value leasehold did not write is certainly not this grant: left alone.
        if unusable_lease(&self.keyspace, key).is_some() {
            return Applied::Release(ReleaseReply::NotOwner);
        }
        let Some(stored) = self.keyspace.live(key, now) else {
            return Applied::Release(ReleaseReply::AlreadyGone);
        };
        let record_token = released_token(&exact.1);
        if !matches_exact(&stored, exact) {
            // The same attempt's release again, after one that kept the record: answered as
            // it was, changing nothing.
            let again = stored.is_released()
                && stored.hold_until_us.is_some()
                && (stored.fence, &stored.token, &stored.operation)
                    == (exact.0, &record_token, &exact.2);
            return Applied::Release(if again {
                ReleaseReply::Released
            } else {
                ReleaseReply::NotOwner
            });
        }
        self.audit(RequestKind::Release, &stored, exact);
        self.before_write();
        let left = hold_left_ms(&stored, now_us);
        if left > 0 {
            if let Some(kept) = self.keyspace.leases.get_mut(key) {
                kept.token = record_token;
                kept.expires_at_ms = now + left;
                kept.marked = false;
            }
        } else {
            // Deleted, and announced if someone was refused it; a record kept for a minimum
            // hold announces nothing.
            self.keyspace.leases.remove(key);
            if stored.marked {
                self.announce(key);
            }
        }
        Applied::Release(ReleaseReply::Released)
    }
}

/// The TTL a grant gives its counter, as `acquire.lua` sets it: the idle expiry, plus the
/// fence's lead over the clock (`now_us`) in milliseconds rounded up when the fence is ahead of
/// it, so that a counter the clock has not reached yet lasts until the clock has been past it
/// for the idle expiry. With the clock floor, the counter is needed no longer.
pub(crate) fn counter_ttl_ms(fence: u64, now_us: i64, idle_ms: i64) -> i64 {
    let lead_us = i128::from(fence) - i128::from(now_us);
    // Ceiling division, as the script's math.ceil.
    let lead_ms = if lead_us > 0 {
        (lead_us + 999) / 1000
    } else {
        0
    };
    i64::try_from(i128::from(idle_ms) + lead_ms).unwrap_or(i64::MAX)
}

/// What is left of `stored`'s minimum hold at `now_us`, in whole milliseconds rounded up: 0
/// if it has none or it has ended, and at most [`MAX_TTL`] (a clock stepped back).
fn hold_left_ms(stored: &Stored, now_us: i64) -> i64 {
    stored.hold_until_us.map_or(0, |until| {
        let left_us = until.saturating_sub(now_us);
        // Ceiling division, as the scripts' math.ceil.
        let left = left_us.div_euclid(1000) + i64::from(left_us.rem_euclid(1000) != 0);
        left.clamp(0, millis(MAX_TTL))
    })
}

/// The token of the record a release before the hold's end leaves: `~` and the fingerprint.
fn released_token(token: &str) -> String {
    format!("{RELEASED}{}", HolderFingerprint::of_token_text(token))
}

/// A refusal of a key the scripts cannot use: definitely not applied, nothing written.
pub(crate) fn refused(what: UnusableKey) -> Failure {
    Failure::Unavailable(Unavailable::new(
        UnavailableCause::UnusableKey(what),
        format!("simulated: {what}"),
    ))
}

/// Returns what is wrong with the value at lease key `key`, if leasehold did not write it:
/// the scripts refuse it before they look at anything else, whatever its length.
pub(crate) fn unusable_lease(keyspace: &Keyspace, key: &str) -> Option<UnusableKey> {
    keyspace.foreign.get(key).map(|value| match value {
        ForeignValue::OtherType => UnusableKey::LeaseWrongType,
        ForeignValue::String => UnusableKey::LeaseForeignValue,
    })
}

/// Returns what is wrong with the fence counter beside lease key `key`, so that no new grant
/// can follow it, if anything: what `acquire.lua` refuses a free lease for, and `inspect.lua`
/// reports for one, at `now` (server milliseconds).
pub(crate) fn unusable_counter_of(keyspace: &Keyspace, key: &str, now: i64) -> Option<UnusableKey> {
    unusable_counter_at(keyspace, &fence_key(key), now)
}

/// Returns what is wrong with the fence counter at `counter_key` at `now`, if anything.
pub(crate) fn unusable_counter_at(
    keyspace: &Keyspace,
    counter_key: &str,
    now: i64,
) -> Option<UnusableKey> {
    match keyspace.foreign.get(counter_key) {
        Some(ForeignValue::OtherType) => Some(UnusableKey::CounterWrongType),
        Some(ForeignValue::String) => Some(UnusableKey::CounterNotAFence),
        None => unusable_counter(keyspace.counter(counter_key, now).unwrap_or(0)),
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

fn matches_exact(stored: &Stored, exact: &Exact) -> bool {
    stored.fence == exact.0 && stored.token == exact.1 && stored.operation == exact.2
}
