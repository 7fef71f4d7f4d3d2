//! The requests a scenario makes, kept apart from the worlds that run it.
//!
//! One book serves every world that runs a scenario, so the attempts (and therefore the owner
//! tokens and fingerprints) are the same in all of them: that is what lets the differential
//! test compare holders across the simulated server and real redis-server.

use std::time::Duration;

use leasehold::{Attempt, DriftBudget, LeaseRequest, OperationId};

use crate::scenario::{CLIENTS, Mode, RESOURCES, purpose, resource_digest, ttls};
use crate::step::Step;

/// Requests made by a scenario, shared by every world that runs it (so that attempts, and
/// therefore tokens and fingerprints, are the same in all of them).
#[derive(Debug, Default)]
pub struct RequestBook {
    last: Vec<Option<LeaseRequest>>,
    operations: u64,
}

impl RequestBook {
    /// Makes an empty book.
    pub fn new() -> Self {
        Self {
            last: vec![None; CLIENTS * RESOURCES],
            operations: 0,
        }
    }

    /// Returns the request `step` sends, if it sends one, recording new attempts.
    pub fn request_for(&mut self, step: &Step, mode: Mode) -> Option<LeaseRequest> {
        let slot = |client: usize, resource: usize| client * RESOURCES + resource;
        match *step {
            Step::Acquire {
                client,
                resource,
                ttl,
            } => {
                self.operations += 1;
                let op = OperationId::new(format!("c{client}-op{}", self.operations)).ok()?;
                let attempt = Attempt::new(op).ok()?;
                let request = LeaseRequest::new(
                    purpose(),
                    resource_digest(resource),
                    attempt,
                    Duration::from_millis(ttls(mode)[ttl]),
                    DriftBudget::default(),
                )
                .ok()?;
                self.last[slot(client, resource)] = Some(request.clone());
                Some(request)
            }
            Step::Replay { client, resource } | Step::Inspect { client, resource } => {
                self.last[slot(client, resource)].clone()
            }
            Step::OtherOperation { client, resource } => {
                self.operations += 1;
                let last = self.last[slot(client, resource)].as_ref()?;
                let op = OperationId::new(format!("c{client}-op{}", self.operations)).ok()?;
                let request = last.for_attempt(last.attempt().with_operation(op));
                self.last[slot(client, resource)] = Some(request.clone());
                Some(request)
            }
            _ => None,
        }
    }
}
