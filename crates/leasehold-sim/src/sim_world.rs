//! The simulated world: one [`SimServer`], the scenario's clients on one manual virtual clock,
//! and the steps that act on the server rather than through a client.

use std::fmt;
use std::time::Duration;

use leasehold::{LeaseClient, LeaseRequest, ManualClock};

use crate::scenario::{CLIENTS, COMMAND_TIMEOUT, purpose, resource_digest};
use crate::signature::Signature;
use crate::step::Step;
use crate::world::World;
use crate::{SimBackend, SimServer, run_now};

/// A simulated world: one server, [`CLIENTS`] clients on one virtual clock.
pub struct SimWorld {
    /// The server.
    pub server: SimServer,
    /// The clients and their handles.
    pub world: World<SimBackend>,
}

impl fmt::Debug for SimWorld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimWorld")
            .field("world", &self.world)
            .finish()
    }
}

impl Default for SimWorld {
    fn default() -> Self {
        Self::new()
    }
}

impl SimWorld {
    /// Makes a fresh world at virtual time zero.
    pub fn new() -> Self {
        let clock = ManualClock::new();
        let server = SimServer::new(clock.clone());
        let clients = (0..CLIENTS)
            .map(|_| LeaseClient::new(server.connect(COMMAND_TIMEOUT)).with_clock(clock.clone()))
            .collect();
        Self {
            server,
            world: World::new(clients),
        }
    }

    /// Runs one step; returns the lease step's signature, if it was one.
    pub fn step(&mut self, step: &Step, request: Option<&LeaseRequest>) -> Option<Signature> {
        match *step {
            Step::Advance { ms } => self.server.advance(Duration::from_millis(ms)),
            Step::Fault { client, fault } => {
                self.world.clients[client].backend().inject(fault.fault())
            }
            Step::Delete { resource } => self.server.delete(&purpose(), &resource_digest(resource)),
            Step::ClockStep { ms } => self.server.step_clock(ms),
            Step::Restart { down_ms } => self.server.restart(Duration::from_millis(down_ms)),
            Step::Failover { k, down_ms } => {
                self.server.failover(k, Duration::from_millis(down_ms));
            }
            _ => {
                let lineage = self.server.lineage();
                return run_now(self.world.apply(step, request, lineage));
            }
        }
        None
    }
}
