//! The invariant checker: what must hold after every step of a simulated scenario, and what
//! a broken invariant reports.
//!
//! The invariants:
//!
//! - I1: no renewal or release succeeds for anyone but the exact stored holder;
//! - I2: an Active handle's exact grant is what the server holds;
//! - I3: at most one grant per resource is Active;
//! - I4: the fenced resource never accepts a write whose fence goes back;
//! - I5: fences of new grants strictly increase per resource, across restarts and lossy
//!   failovers too (the server's clock carries them over a lost counter).
//!
//! I2 and I3 hold only where the server keeps its promises ([`Mode::is_strict`]); the controls
//! that step the server's clock or lose writes must find them broken.

use std::fmt;

use leasehold::LeaseState;

use crate::request_book::RequestBook;
use crate::scenario::{Mode, RESOURCES, purpose, resource_digest};
use crate::sim_world::SimWorld;
use crate::step::Step;

/// An invariant broken at a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Which invariant: "I1" … "I5".
    pub invariant: &'static str,
    /// The index of the step after which it was found.
    pub step: usize,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} broken after step {}: {}",
            self.invariant, self.step, self.detail
        )
    }
}

impl SimWorld {
    /// Returns every invariant the mode promises that is broken after step `index`.
    pub fn violations(&self, mode: Mode, index: usize) -> Vec<Violation> {
        let mut found = Vec::new();
        let mut violation = |invariant, detail: String| {
            found.push(Violation {
                invariant,
                step: index,
                detail,
            })
        };
        // I1: no renew or release by a non-owner succeeded.
        for bad in self.server.non_owner_successes() {
            violation("I1", bad);
        }
        let purpose = purpose();
        for resource in 0..RESOURCES {
            let stored = self.server.stored(&purpose, &resource_digest(resource));
            let mut active = Vec::new();
            for held in self.world.held.iter().filter(|h| h.resource == resource) {
                let h = &held.handle;
                if h.state() != LeaseState::Active {
                    continue;
                }
                let grant = (
                    h.fence(),
                    h.attempt().fingerprint(),
                    h.attempt().operation().clone(),
                );
                if mode.is_strict() {
                    // I2: an Active handle's exact grant is what the server holds.
                    let matches = stored.as_ref().is_some_and(|s| {
                        s.fence == grant.0 && s.holder == grant.1 && s.operation == grant.2.as_str()
                    });
                    if !matches {
                        violation(
                            "I2",
                            format!(
                                "client {} resource {resource}: Active with fence {} and {:?} left, server holds {stored:?}",
                                held.client,
                                grant.0,
                                h.remaining_validity()
                            ),
                        );
                    }
                }
                if !active.contains(&grant) {
                    active.push(grant);
                }
            }
            // I3: at most one grant per resource is Active.
            if active.len() > 1 && !mode.deletes {
                violation(
                    "I3",
                    format!(
                        "resource {resource}: {} Active grants: {active:?}",
                        active.len()
                    ),
                );
            }
            // I4: accepted writes never go back: each one's fence is above every earlier one,
            // or equal to the last from the same writer.
            for pair in self.world.accepted[resource].windows(2) {
                let ((f0, w0), (f1, w1)) = (&pair[0], &pair[1]);
                if f1 < f0 || (f1 == f0 && w1 != w0) {
                    violation(
                        "I4",
                        format!(
                            "resource {resource}: write {f1} by {w1} accepted after {f0} by {w0}"
                        ),
                    );
                }
            }
            // I5: fences of new grants strictly increase, across lineages too: a lost counter
            // restarts from the server's clock, which the restart or failover has moved on
            // (unless the clock went back by more than that: the LOSSY_CLOCK_STEPS control).
            let grants = &self.world.grants[resource];
            for pair in grants.windows(2) {
                let ((l0, f0), (l1, f1)) = (pair[0], pair[1]);
                if f1 <= f0 {
                    violation(
                        "I5",
                        format!(
                            "resource {resource}: fence {f1} (lineage {l1}) granted after {f0} \
                             (lineage {l0})"
                        ),
                    );
                }
            }
        }
        found
    }
}

/// Every invariant.
pub const ALL: &[&str] = &["I1", "I2", "I3", "I4", "I5"];

/// Runs `steps` on a fresh simulated world, checking the invariants named in `checked` after
/// every step.
///
/// # Errors
///
/// The first broken invariant among `checked`.
pub fn run_sim(steps: &[Step], mode: Mode, checked: &[&str]) -> Result<(), Violation> {
    let mut world = SimWorld::new();
    let mut book = RequestBook::new();
    for (index, step) in steps.iter().enumerate() {
        let request = book.request_for(step, mode);
        world.step(step, request.as_ref());
        if let Some(v) = world
            .violations(mode, index)
            .into_iter()
            .find(|v| checked.contains(&v.invariant))
        {
            return Err(v);
        }
    }
    Ok(())
}
