//! The scripts' semantics: what each request does to the keyspace and what it replies.
//!
//! This is `leasehold-redis/lua/*.lua` in Rust, reply for reply: an acquire grants a free key,
//! replays the same attempt (same fence, the *remaining* PTTL), or names the holder; renew and
//! release act only for the exact stored (fence, token, operation); PTTLs are whole
//! milliseconds. A new grant's fence is `max(counter + 1, server clock in microseconds)`, and
//! the counter becomes that fence; a counter at [`FenceToken::MAX`] (or above, which is no
//! fence) fails the acquire definitely, with nothing written. The differential test against
//! real redis-server holds the two to the same replies.

use std::time::Duration;

use leasehold::backend::{AcquireReply, GrantReply, ReleaseReply, RenewReply};
use leasehold::{
    Contention, Failure, FenceToken, HolderFingerprint, LossCause, Unavailable, UnavailableCause,
    UnusableKey,
};

use crate::RequestKind;
use crate::keyspace::{Stored, fence_key};
use crate::state::ServerState;
use crate::units::duration_ms;

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
    },
    Renew {
        key: String,
        exact: Exact,
        ttl_ms: i64,
    },
    Release {
        key: String,
        exact: Exact,
    },
}

/// The reply to a [`WireOp`], of the matching kind.
pub(crate) enum Applied {
    Acquire(AcquireReply),
    Renew(RenewReply),
    Release(ReleaseReply),
}

impl ServerState {
    /// Applies `op` at `now_us`, the server's clock in microseconds (its milliseconds, for
    /// expiry, are the same reading rounded down).
    pub(crate) fn apply(&mut self, op: &WireOp, now_us: i64, fallback: Duration) -> Applied {
        let now = now_us.div_euclid(1000);
        match op {
            WireOp::Acquire {
                key,
                token,
                operation,
                ttl_ms,
            } => match self.keyspace.live(key, now) {
                None => {
                    let counter_key = fence_key(key);
                    let counter = self.keyspace.fences.get(&counter_key).copied().unwrap_or(0);
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
                    self.keyspace.fences.insert(counter_key, fence);
                    self.keyspace.leases.insert(
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
                        Some(HolderFingerprint::of_token_text(&stored.token)),
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
            WireOp::Renew { key, exact, ttl_ms } => match self.keyspace.live(key, now) {
                None => Applied::Renew(RenewReply::Lost(LossCause::Absent)),
                Some(stored) if !matches_exact(&stored, exact) => {
                    Applied::Renew(RenewReply::Lost(LossCause::OtherHolder))
                }
                Some(stored) => {
                    self.audit(RequestKind::Renew, &stored, exact);
                    self.before_write();
                    if let Some(stored) = self.keyspace.leases.get_mut(key) {
                        stored.expires_at_ms = now + ttl_ms;
                    }
                    Applied::Renew(RenewReply::Renewed {
                        server_ttl: duration_ms(*ttl_ms),
                    })
                }
            },
            WireOp::Release { key, exact } => match self.keyspace.live(key, now) {
                None => Applied::Release(ReleaseReply::AlreadyGone),
                Some(stored) if !matches_exact(&stored, exact) => {
                    Applied::Release(ReleaseReply::NotOwner)
                }
                Some(stored) => {
                    self.audit(RequestKind::Release, &stored, exact);
                    self.before_write();
                    self.keyspace.leases.remove(key);
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

fn matches_exact(stored: &Stored, exact: &Exact) -> bool {
    stored.fence == exact.0 && stored.token == exact.1 && stored.operation == exact.2
}
