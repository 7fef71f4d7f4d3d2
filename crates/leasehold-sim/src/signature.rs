//! What a lease step did, independent of timing, and how two runs are compared when their
//! fences come from different sources.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use leasehold::FenceToken;

/// What a lease step did, independent of timing: the outcome, holders and handle state as
/// text, with the fences it saw kept apart, so that worlds whose fences come from different
/// sources (a counter, a server's clock) can be compared by the fences' order ([`by_rank`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    resource: usize,
    /// The text around the fences: one piece more than there are fences.
    pieces: Vec<String>,
    /// The fences, in the order the text mentions them.
    fences: Vec<FenceToken>,
}

impl Signature {
    /// Makes an empty signature of a step on `resource`.
    pub fn new(resource: usize) -> Self {
        Self {
            resource,
            pieces: vec![String::new()],
            fences: Vec::new(),
        }
    }

    /// Appends text.
    pub fn text(mut self, text: &str) -> Self {
        if let Some(last) = self.pieces.last_mut() {
            last.push_str(text);
        }
        self
    }

    /// Appends a fence.
    pub fn fence(mut self, fence: FenceToken) -> Self {
        self.fences.push(fence);
        self.pieces.push(String::new());
        self
    }

    /// Appends `Some(fence)` or `None`.
    pub fn maybe_fence(self, fence: Option<FenceToken>) -> Self {
        match fence {
            Some(fence) => self.text("Some(").fence(fence).text(")"),
            None => self.text("None"),
        }
    }

    /// Returns the resource the step was about (fences are ordered per resource).
    pub fn resource(&self) -> usize {
        self.resource
    }

    /// Returns the fences the step saw, in the order the text mentions them.
    pub fn fences(&self) -> &[FenceToken] {
        &self.fences
    }

    /// Returns the text with each fence shown by `show`.
    pub fn render(&self, mut show: impl FnMut(FenceToken) -> String) -> String {
        let mut text = self.pieces[0].clone();
        for (fence, piece) in self.fences.iter().zip(&self.pieces[1..]) {
            text.push_str(&show(*fence));
            text.push_str(piece);
        }
        text
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(|fence| fence.to_string()))
    }
}

/// Renders the signatures of one run with each fence replaced by its rank (`#1` for the
/// smallest) among the distinct fences of its resource in the run. Two runs render alike when
/// their fences are in the same order and equal in the same places, whatever their values: a
/// counter's 1, 2, 3 and a clock's microseconds compare equal, but a new grant with a lower or
/// a repeated fence in one run only does not.
pub fn by_rank(signatures: &[Option<Signature>]) -> Vec<Option<String>> {
    let mut distinct: BTreeMap<usize, BTreeSet<FenceToken>> = BTreeMap::new();
    for s in signatures.iter().flatten() {
        distinct
            .entry(s.resource)
            .or_default()
            .extend(s.fences.iter().copied());
    }
    signatures
        .iter()
        .map(|s| {
            s.as_ref().map(|s| {
                let fences = &distinct[&s.resource];
                s.render(|fence| format!("#{}", fences.range(..fence).count() + 1))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(resource: usize, fence: u64) -> Option<Signature> {
        let fence = FenceToken::new(fence).expect("a fence");
        Some(
            Signature::new(resource)
                .text("Acquired(")
                .fence(fence)
                .text(") Active"),
        )
    }

    fn contended(resource: usize, fence: u64) -> Option<Signature> {
        let fence = FenceToken::new(fence);
        Some(
            Signature::new(resource)
                .text("Contended(")
                .maybe_fence(fence)
                .text(", None)"),
        )
    }

    #[test]
    fn a_signature_shows_its_fences_where_they_were() {
        let s = contended(1, 7).expect("a signature");
        assert_eq!(s.to_string(), "Contended(Some(7), None)");
        assert_eq!(s.fences(), [FenceToken::new(7).expect("a fence")]);
        assert_eq!(s.resource(), 1);
        let none = Signature::new(0).text("Free").maybe_fence(None);
        assert_eq!(none.to_string(), "FreeNone");
    }

    #[test]
    fn counter_and_clock_fences_in_the_same_order_rank_alike() {
        // A counter, and a clock in microseconds: resources interleave, a replay repeats.
        let counter = [grant(0, 1), grant(1, 1), contended(0, 1), grant(0, 2), None];
        let clock = [
            grant(0, 1_000),
            grant(1, 2_000),
            contended(0, 1_000),
            grant(0, 3_000),
            None,
        ];
        assert_eq!(by_rank(&counter), by_rank(&clock));
        assert_eq!(by_rank(&counter)[3].as_deref(), Some("Acquired(#2) Active"));
        assert_eq!(by_rank(&counter)[4], None);
    }

    #[test]
    fn a_lower_or_repeated_fence_for_a_new_grant_ranks_differently() {
        let real = [grant(0, 1), grant(0, 2), grant(0, 3)];
        let lower = [grant(0, 10), grant(0, 30), grant(0, 20)];
        let repeated = [grant(0, 10), grant(0, 20), grant(0, 20)];
        assert_ne!(by_rank(&real), by_rank(&lower));
        assert_ne!(by_rank(&real), by_rank(&repeated));
        // A replay that changed its fence.
        let replay = [grant(0, 1), contended(0, 1)];
        let changed = [grant(0, 1), contended(0, 2)];
        assert_ne!(by_rank(&replay), by_rank(&changed));
    }
}
