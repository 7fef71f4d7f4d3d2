//! The lease invariants a simulated scenario must keep, and what a broken one reports.
//!
//! Each [`Invariant`] is a variant, so a test says which one it expects broken or kept
//! (`Invariant::MutualExclusion`), never a string. A [`Violation`] says which step broke it and
//! carries its [`Evidence`]: the typed values the checker saw, one variant per invariant. The
//! docs and messages still number them I1 to I5 ([`Invariant::code`]).
//!
//! [`OnlyTheHolderRenewsOrReleases`](Invariant::OnlyTheHolderRenewsOrReleases),
//! [`FencedWritesNeverGoBack`](Invariant::FencedWritesNeverGoBack) and, on a clock that
//! behaves, [`FencesIncrease`](Invariant::FencesIncrease) hold in every mode;
//! [`ActiveIsStored`](Invariant::ActiveIsStored) and
//! [`MutualExclusion`](Invariant::MutualExclusion) only where the server keeps its promises
//! ([`Mode::is_strict`](crate::Mode::is_strict)): the controls that step the server's clock or
//! lose writes must find them broken.

use std::fmt;
use std::time::Duration;

use leasehold::{FenceToken, HolderFingerprint, OperationId};

use crate::oracle::{NonOwnerSuccess, StoredGrant};

/// A lease invariant, checked after every step of a simulated scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Invariant {
    /// I1: no renewal or release succeeds for anyone but the exact stored holder.
    OnlyTheHolderRenewsOrReleases,
    /// I2: an Active handle's exact grant is what the server holds.
    ActiveIsStored,
    /// I3: at most one grant per resource is Active.
    MutualExclusion,
    /// I4: the fenced resource never accepts a write whose fence goes back.
    FencedWritesNeverGoBack,
    /// I5: fences of new grants strictly increase per resource, across restarts and lossy
    /// failovers too (the server's clock carries them over a lost counter).
    FencesIncrease,
}

impl Invariant {
    /// Every invariant, I1 to I5.
    pub const ALL: [Invariant; 5] = [
        Invariant::OnlyTheHolderRenewsOrReleases,
        Invariant::ActiveIsStored,
        Invariant::MutualExclusion,
        Invariant::FencedWritesNeverGoBack,
        Invariant::FencesIncrease,
    ];

    /// Returns the invariant's number in the docs and messages: `"I1"` to `"I5"`.
    pub fn code(self) -> &'static str {
        match self {
            Invariant::OnlyTheHolderRenewsOrReleases => "I1",
            Invariant::ActiveIsStored => "I2",
            Invariant::MutualExclusion => "I3",
            Invariant::FencedWritesNeverGoBack => "I4",
            Invariant::FencesIncrease => "I5",
        }
    }
}

impl fmt::Display for Invariant {
    /// Says what the invariant means, in one sentence.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Invariant::OnlyTheHolderRenewsOrReleases => {
                "no renewal or release succeeds for anyone but the exact stored holder"
            }
            Invariant::ActiveIsStored => "an Active handle's exact grant is what the server holds",
            Invariant::MutualExclusion => "at most one grant per resource is Active",
            Invariant::FencedWritesNeverGoBack => {
                "the fenced resource never accepts a write whose fence goes back"
            }
            Invariant::FencesIncrease => {
                "fences of new grants strictly increase per resource, across restarts and lossy \
                 failovers too"
            }
        })
    }
}

/// What the checker saw when an invariant broke: one variant per [`Invariant`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Evidence {
    /// I1: the server let a renewal or release through for someone other than the holder.
    NonOwnerSuccess(NonOwnerSuccess),
    /// I2: an Active handle whose exact grant the server does not hold.
    ActiveNotStored {
        /// The scenario client holding the handle.
        client: usize,
        /// The scenario resource.
        resource: usize,
        /// The handle's fence.
        fence: FenceToken,
        /// The handle's remaining validity.
        remaining: Duration,
        /// What the server holds for the resource instead.
        stored: Option<StoredGrant>,
    },
    /// I3: several distinct grants of one resource Active at once.
    SeveralActive {
        /// The scenario resource.
        resource: usize,
        /// The Active grants: fence, holder and operation of each.
        active: Vec<(FenceToken, HolderFingerprint, OperationId)>,
    },
    /// I4: a write accepted after another whose fence is higher, or equal from another writer.
    WriteWentBack {
        /// The scenario resource.
        resource: usize,
        /// The earlier accepted write's fence.
        earlier: FenceToken,
        /// Who made the earlier write.
        earlier_writer: HolderFingerprint,
        /// The later accepted write's fence.
        later: FenceToken,
        /// Who made the later write.
        later_writer: HolderFingerprint,
    },
    /// I5: a new grant whose fence is not above the previous new grant's.
    FenceDidNotIncrease {
        /// The scenario resource.
        resource: usize,
        /// The previous grant's fence.
        earlier: FenceToken,
        /// How many restarts and lossy failovers the server had been through at that grant.
        earlier_lineage: u64,
        /// The later grant's fence.
        later: FenceToken,
        /// The server's lineage at the later grant.
        later_lineage: u64,
    },
}

impl Evidence {
    /// Returns the invariant this evidence breaks.
    pub fn invariant(&self) -> Invariant {
        match self {
            Evidence::NonOwnerSuccess(_) => Invariant::OnlyTheHolderRenewsOrReleases,
            Evidence::ActiveNotStored { .. } => Invariant::ActiveIsStored,
            Evidence::SeveralActive { .. } => Invariant::MutualExclusion,
            Evidence::WriteWentBack { .. } => Invariant::FencedWritesNeverGoBack,
            Evidence::FenceDidNotIncrease { .. } => Invariant::FencesIncrease,
        }
    }
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Evidence::NonOwnerSuccess(success) => write!(f, "{success}"),
            Evidence::ActiveNotStored {
                client,
                resource,
                fence,
                remaining,
                stored,
            } => write!(
                f,
                "client {client} resource {resource}: Active with fence {fence} and {remaining:?} \
                 left, server holds {stored:?}"
            ),
            Evidence::SeveralActive { resource, active } => write!(
                f,
                "resource {resource}: {} Active grants: {active:?}",
                active.len()
            ),
            Evidence::WriteWentBack {
                resource,
                earlier,
                earlier_writer,
                later,
                later_writer,
            } => write!(
                f,
                "resource {resource}: write {later} by {later_writer} accepted after {earlier} by \
                 {earlier_writer}"
            ),
            Evidence::FenceDidNotIncrease {
                resource,
                earlier,
                earlier_lineage,
                later,
                later_lineage,
            } => write!(
                f,
                "resource {resource}: fence {later} (lineage {later_lineage}) granted after \
                 {earlier} (lineage {earlier_lineage})"
            ),
        }
    }
}

/// An invariant broken at a step of a scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    step: usize,
    evidence: Evidence,
}

impl Violation {
    /// Makes the violation `evidence` shows, found after step `step`.
    pub fn new(step: usize, evidence: Evidence) -> Self {
        Self { step, evidence }
    }

    /// Returns the invariant that was broken.
    pub fn invariant(&self) -> Invariant {
        self.evidence.invariant()
    }

    /// Returns the index of the step after which it was found.
    pub fn step(&self) -> usize {
        self.step
    }

    /// Returns what the checker saw.
    pub fn evidence(&self) -> &Evidence {
        &self.evidence
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let invariant = self.invariant();
        write!(
            f,
            "{} ({invariant}) broken after step {}: {}",
            invariant.code(),
            self.step,
            self.evidence
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_invariant_has_its_own_code_and_sentence() {
        let codes: Vec<_> = Invariant::ALL.iter().map(|i| i.code()).collect();
        assert_eq!(codes, ["I1", "I2", "I3", "I4", "I5"]);
        let mut sentences: Vec<_> = Invariant::ALL.iter().map(ToString::to_string).collect();
        sentences.sort();
        sentences.dedup();
        assert_eq!(sentences.len(), Invariant::ALL.len());
    }

    #[test]
    fn a_violation_names_its_invariant_step_and_evidence() {
        let fence = |n| FenceToken::new(n).expect("a fence");
        let v = Violation::new(
            6,
            Evidence::FenceDidNotIncrease {
                resource: 0,
                earlier: fence(100_000),
                earlier_lineage: 0,
                later: fence(60_000),
                later_lineage: 1,
            },
        );
        assert_eq!(v.invariant(), Invariant::FencesIncrease);
        assert_eq!(v.step(), 6);
        assert_eq!(
            v.to_string(),
            "I5 (fences of new grants strictly increase per resource, across restarts and lossy \
             failovers too) broken after step 6: resource 0: fence 60000 (lineage 1) granted \
             after 100000 (lineage 0)"
        );
    }
}
