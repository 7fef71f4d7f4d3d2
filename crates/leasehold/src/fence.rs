//! Fencing tokens, the guarantee a lease gives, and the rule an effect target applies.
//!
//! A lease alone only *reduces* duplicate work: a holder paused past its expiry (GC, swap,
//! SIGSTOP, a VM migration) can wake and write after a new holder was granted the lease. A
//! fencing token closes that gap if, and only if, the place the work writes to checks it:
//! every new grant on a resource carries a larger token, and the target refuses a write whose
//! token is below the largest it has seen. [`FenceGate`] is that rule in code; docs/guide.md shows
//! it as SQL (`UPDATE … WHERE fence <= $f`).

use std::fmt;

use crate::id::HolderFingerprint;

/// A fencing token: a per-resource number that grows with every new grant.
///
/// Tokens are integers from 1 to 2^63 − 1 ([`FenceToken::MAX`]), so that a target can keep
/// them in a signed 64-bit column (`BIGINT`); they do not fit in 32 bits. How a backend keeps
/// them growing when its counter is lost is the backend's contract (the Redis backend never
/// issues one below the server's clock in microseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FenceToken(u64);

impl FenceToken {
    /// The smallest token.
    pub const MIN: Self = Self(1);

    /// The largest token: 2^63 − 1, the largest signed 64-bit integer.
    pub const MAX: Self = Self(i64::MAX.unsigned_abs());

    /// Makes a token; `None` for zero and for anything above [`FenceToken::MAX`], which no
    /// grant ever carries.
    pub const fn new(value: u64) -> Option<Self> {
        if value == 0 || value > Self::MAX.0 {
            None
        } else {
            Some(Self(value))
        }
    }

    /// Returns the token's number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Returns the token's number as a signed 64-bit integer, as SQL's `BIGINT` stores it.
    /// Every token fits.
    pub const fn to_i64(self) -> i64 {
        // new() never makes a token above i64::MAX.
        self.0 as i64
    }
}

impl From<FenceToken> for u64 {
    fn from(token: FenceToken) -> Self {
        token.get()
    }
}

impl From<FenceToken> for i64 {
    fn from(token: FenceToken) -> Self {
        token.to_i64()
    }
}

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What a lease can promise the work done under it.
///
/// Every grant carries a fencing token, so today every lease is `Fenced`; the enum is
/// non-exhaustive so that a weaker or stronger promise (a backend without fences, a grant
/// confirmed by replicas) can be told apart later without breaking callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Guarantee {
    /// The lease reduces duplicate work while clocks and the network behave, and carries a
    /// fencing token. On its own the lease does **not** stop a paused or partitioned old
    /// holder from writing after a new holder was granted: writes are safe from stale holders
    /// **only** where the effect target checks the token (see [`FenceGate`]). It does not
    /// cover targets that ignore the token, nor a backend that re-issues a token: on Redis, a
    /// lost fence counter together with a server clock stepped back by more than the loss
    /// took.
    Fenced(FenceToken),
}

impl Guarantee {
    /// Returns the fencing token, if the lease has one.
    pub fn fence(self) -> Option<FenceToken> {
        match self {
            Guarantee::Fenced(token) => Some(token),
        }
    }
}

/// A write refused by a [`FenceGate`] because a newer grant has written already.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stale fence {offered}: the target has accepted fence {highest}")]
pub struct StaleFence {
    /// The token the refused write carried.
    pub offered: FenceToken,
    /// The largest token the target had accepted.
    pub highest: FenceToken,
}

/// The check a fenced effect target makes before accepting a write.
///
/// A write is accepted if its token is above every token accepted before, or equal to the
/// largest one *and* from the same writer (the same grant writing again). Anything else is a
/// stale holder and is refused. The writer is identified by its [`HolderFingerprint`], so an
/// equal token reissued by another owner (after a lossy failover) is refused too.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FenceGate {
    highest: Option<(FenceToken, HolderFingerprint)>,
}

impl FenceGate {
    /// Makes a gate that has accepted nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns the largest token accepted so far.
    pub fn highest(&self) -> Option<FenceToken> {
        self.highest.as_ref().map(|(token, _)| *token)
    }

    /// Accepts or refuses a write carrying `fence` from `writer`.
    ///
    /// # Errors
    ///
    /// [`StaleFence`] if a larger token, or the same token from another writer, was accepted
    /// before. The gate is unchanged then.
    pub fn admit(
        &mut self,
        fence: FenceToken,
        writer: &HolderFingerprint,
    ) -> Result<(), StaleFence> {
        match &self.highest {
            Some((highest, by)) if fence < *highest || (fence == *highest && by != writer) => {
                Err(StaleFence {
                    offered: fence,
                    highest: *highest,
                })
            }
            _ => {
                self.highest = Some((fence, writer.clone()));
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(c: char) -> HolderFingerprint {
        HolderFingerprint::parse(&c.to_string().repeat(16)).unwrap()
    }

    fn token(n: u64) -> FenceToken {
        FenceToken::new(n).unwrap()
    }

    #[test]
    fn conversions_keep_the_number() {
        for n in [1, 7, 1 << 53, (1 << 53) + 1, i64::MAX as u64] {
            assert_eq!(u64::from(token(n)), n);
            assert_eq!(i64::from(token(n)), n as i64);
            assert_eq!(token(n).to_i64(), n as i64);
        }
    }

    #[test]
    fn tokens_are_one_to_two_to_the_63_minus_one() {
        assert!(FenceToken::new(0).is_none());
        assert_eq!(token(7).get(), 7);
        assert_eq!(FenceToken::MAX.get(), (1u64 << 63) - 1);
        assert_eq!(FenceToken::new((1u64 << 63) - 1), Some(FenceToken::MAX));
        assert!(FenceToken::new(1u64 << 63).is_none());
        assert!(FenceToken::new(u64::MAX).is_none());
        assert_eq!(i64::from(FenceToken::MAX), i64::MAX);
        assert_eq!(i64::from(token(1 << 53)), 1 << 53);
    }

    #[test]
    fn the_gate_refuses_stale_and_foreign_equal_fences() {
        let mut gate = FenceGate::new();
        gate.admit(token(2), &fp('a')).unwrap();
        gate.admit(token(2), &fp('a')).unwrap();
        assert_eq!(
            gate.admit(token(1), &fp('a')),
            Err(StaleFence {
                offered: token(1),
                highest: token(2)
            })
        );
        assert!(gate.admit(token(2), &fp('b')).is_err());
        gate.admit(token(3), &fp('b')).unwrap();
        assert!(gate.admit(token(2), &fp('a')).is_err());
        assert_eq!(gate.highest(), Some(token(3)));
    }

    #[test]
    fn guarantees_expose_their_fence() {
        assert_eq!(Guarantee::Fenced(token(4)).fence(), Some(token(4)));
    }
}
