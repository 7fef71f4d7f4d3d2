//! The rule a failover campaign checks (issue 34): of two holds of one lease with different
//! fences that overlapped in time, the older (the smaller fence) must have been told that its
//! work may not have been covered.

/// Failovers per campaign: `LEASEHOLD_FAILOVER_HOLDERS_FAILOVERS`, or 20.
///
/// # Panics
///
/// If the variable is set to something other than a count.
pub fn failovers() -> usize {
    const VAR: &str = "LEASEHOLD_FAILOVER_HOLDERS_FAILOVERS";
    match std::env::var(VAR) {
        Ok(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{VAR}={value:?} is not a count")),
        Err(_) => 20,
    }
}

/// One hold of a lease, as a test recorded it.
pub trait Hold {
    /// The grant's fence.
    fn fence(&self) -> u64;
    /// Returns true if and only if this hold and `other` overlapped in time.
    fn overlaps(&self, other: &Self) -> bool;
    /// Returns true if and only if the holder was told its work may not have been covered.
    fn told(&self) -> bool;
}

/// What [`check`] found among the pairs of holds.
#[derive(Debug)]
pub struct Overlaps<'a, H> {
    /// Pairs with different fences that overlapped.
    pub overlapping: usize,
    /// Of those, the pairs whose older hold was told.
    pub older_told: usize,
    /// Pairs where neither was told: both believed their work covered (issue 34's finding).
    pub neither_told: usize,
    /// Pairs with one fence that overlapped (a replay seen twice, not two grants).
    pub same_fence: usize,
    /// The pairs that break the rule, (older, newer).
    pub violations: Vec<(&'a H, &'a H)>,
}

/// Checks every pair of `holds` against the rule.
pub fn check<H: Hold>(holds: &[H]) -> Overlaps<'_, H> {
    let mut found = Overlaps {
        overlapping: 0,
        older_told: 0,
        neither_told: 0,
        same_fence: 0,
        violations: Vec::new(),
    };
    for (a, first) in holds.iter().enumerate() {
        for second in &holds[a + 1..] {
            if !first.overlaps(second) {
                continue;
            }
            if first.fence() == second.fence() {
                found.same_fence += 1;
                continue;
            }
            found.overlapping += 1;
            let (older, newer) = if first.fence() < second.fence() {
                (first, second)
            } else {
                (second, first)
            };
            if older.told() {
                found.older_told += 1;
            } else {
                if !newer.told() {
                    found.neither_told += 1;
                }
                found.violations.push((older, newer));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    struct H(u64, u32, u32, bool);

    impl Hold for H {
        fn fence(&self) -> u64 {
            self.0
        }
        fn overlaps(&self, other: &Self) -> bool {
            self.1 < other.2 && other.1 < self.2
        }
        fn told(&self) -> bool {
            self.3
        }
    }

    #[test]
    fn the_older_of_two_overlapping_holds_must_be_told() {
        let holds = [
            H(1, 0, 10, false),
            H(2, 5, 15, false), // overlaps 1: neither told
            H(3, 20, 30, true),
            H(4, 25, 35, false), // overlaps 3, whose holder was told
            H(4, 26, 27, false), // a replay of 4
        ];
        let found = check(&holds);
        assert_eq!(
            (
                found.overlapping,
                found.older_told,
                found.neither_told,
                found.same_fence
            ),
            (3, 2, 1, 1)
        );
        assert_eq!(found.violations.len(), 1);
        assert_eq!(found.violations[0].0.fence(), 1);
    }
}
