//! The invariant checker: after each step of a simulated scenario, every [`Invariant`] the mode
//! promises is checked against the server's oracles and the world's handles and writes.

use leasehold::LeaseState;

use crate::invariant::{Evidence, Invariant, Violation};
use crate::request_book::RequestBook;
use crate::scenario::{Mode, RESOURCES, purpose, resource_digest};
use crate::sim_world::SimWorld;
use crate::step::Step;

impl SimWorld {
    /// Returns every invariant the mode promises that is broken after step `index`.
    pub fn violations(&self, mode: Mode, index: usize) -> Vec<Violation> {
        let mut found = Vec::new();
        let mut violation = |evidence| found.push(Violation::new(index, evidence));
        // I1: no renew or release by a non-owner succeeded.
        for bad in self.server.non_owner_successes() {
            violation(Evidence::NonOwnerSuccess(bad));
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
                        violation(Evidence::ActiveNotStored {
                            client: held.client,
                            resource,
                            fence: grant.0,
                            remaining: h.remaining_validity(),
                            stored: stored.clone(),
                        });
                    }
                }
                if !active.contains(&grant) {
                    active.push(grant);
                }
            }
            // I3: at most one grant per resource is Active.
            if active.len() > 1 && !mode.deletes {
                violation(Evidence::SeveralActive { resource, active });
            }
            // I4: accepted writes never go back: each one's fence is above every earlier one,
            // or equal to the last from the same writer.
            for pair in self.world.accepted[resource].windows(2) {
                let ((f0, w0), (f1, w1)) = (&pair[0], &pair[1]);
                if f1 < f0 || (f1 == f0 && w1 != w0) {
                    violation(Evidence::WriteWentBack {
                        resource,
                        earlier: *f0,
                        earlier_writer: w0.clone(),
                        later: *f1,
                        later_writer: w1.clone(),
                    });
                }
            }
            // I5: fences of new grants strictly increase, across lineages too: a lost counter
            // restarts from the server's clock, which the restart or failover has moved on
            // (unless the clock went back by more than that: the LOSSY_CLOCK_STEPS control).
            let grants = &self.world.grants[resource];
            for pair in grants.windows(2) {
                let ((l0, f0), (l1, f1)) = (pair[0], pair[1]);
                if f1 <= f0 {
                    violation(Evidence::FenceDidNotIncrease {
                        resource,
                        earlier: f0,
                        earlier_lineage: l0,
                        later: f1,
                        later_lineage: l1,
                    });
                }
            }
        }
        found
    }
}

/// Runs `steps` on a fresh simulated world, checking the invariants in `checked` after every
/// step ([`Invariant::ALL`] for all of them).
///
/// # Errors
///
/// The first broken invariant among `checked`.
pub fn run_sim(steps: &[Step], mode: Mode, checked: &[Invariant]) -> Result<(), Violation> {
    let mut world = SimWorld::new();
    let mut book = RequestBook::new();
    for (index, step) in steps.iter().enumerate() {
        let request = book.request_for(step, mode);
        world.step(step, request.as_ref());
        if let Some(v) = world
            .violations(mode, index)
            .into_iter()
            .find(|v| checked.contains(&v.invariant()))
        {
            return Err(v);
        }
    }
    Ok(())
}
