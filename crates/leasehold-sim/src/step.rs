//! The step language of random scenarios: lease calls by numbered clients on numbered
//! resources, time passing, and the faults a scenario may inject.
//!
//! Steps name clients and resources by index (below [`CLIENTS`](crate::scenario::CLIENTS) and
//! [`RESOURCES`](crate::scenario::RESOURCES)) and durations in milliseconds, so that a shrunk
//! failure prints as a short, readable list that can be pasted into a regression test.

use std::time::Duration;

use crate::Fault;

/// A fault for a client's next call, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultStep {
    /// Lost before it is applied.
    LoseRequest,
    /// Lost after it is applied.
    LoseReply,
    /// Request delayed.
    DelayRequest(u64),
    /// Reply delayed.
    DelayReply(u64),
    /// Request arrives after the client gave up.
    LateRequest(u64),
}

impl FaultStep {
    /// The simulator's fault for this step.
    pub(crate) fn fault(self) -> Fault {
        match self {
            FaultStep::LoseRequest => Fault::LoseRequest,
            FaultStep::LoseReply => Fault::LoseReply,
            FaultStep::DelayRequest(ms) => Fault::DelayRequest(Duration::from_millis(ms)),
            FaultStep::DelayReply(ms) => Fault::DelayReply(Duration::from_millis(ms)),
            FaultStep::LateRequest(ms) => Fault::LateRequest(Duration::from_millis(ms)),
        }
    }
}

/// One step of a scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A new attempt (new operation id, new token) tries to acquire.
    Acquire {
        /// Which client.
        client: usize,
        /// Which resource.
        resource: usize,
        /// Index into the mode's TTLs.
        ttl: usize,
    },
    /// The client's last request is sent again (same attempt).
    Replay {
        /// Which client.
        client: usize,
        /// Which resource.
        resource: usize,
    },
    /// The same owner token tries with another operation id.
    OtherOperation {
        /// Which client.
        client: usize,
        /// Which resource.
        resource: usize,
    },
    /// The client's latest handle renews.
    Renew {
        /// Which client.
        client: usize,
        /// Which resource.
        resource: usize,
    },
    /// The client's latest handle releases.
    Release {
        /// Which client.
        client: usize,
        /// Which resource.
        resource: usize,
    },
    /// The client inspects with its last attempt.
    Inspect {
        /// Which client.
        client: usize,
        /// Which resource.
        resource: usize,
    },
    /// The client reads who holds the resource as an election's observer does, without an
    /// attempt, marking the grant it finds so that its release is announced (D48).
    Watch {
        /// Which client.
        client: usize,
        /// Which resource.
        resource: usize,
    },
    /// The client writes to the fenced resource with its latest handle's fence, whatever the
    /// handle's state (a paused holder does not check).
    Write {
        /// Which client.
        client: usize,
        /// Which resource.
        resource: usize,
    },
    /// Virtual time passes (also: every client pauses).
    Advance {
        /// Milliseconds.
        ms: u64,
    },
    /// A fault for the client's next call.
    Fault {
        /// Which client.
        client: usize,
        /// The fault.
        fault: FaultStep,
    },
    /// The lease is deleted by hand.
    Delete {
        /// Which resource.
        resource: usize,
    },
    /// The server's clock steps.
    ClockStep {
        /// Milliseconds, forward or back.
        ms: i64,
    },
    /// The server restarts without persistence, and refuses requests while it does.
    Restart {
        /// How long it takes, in milliseconds of world time (at least 1).
        down_ms: u64,
    },
    /// The server fails over, losing its last `k` writes, and refuses requests while it does.
    Failover {
        /// Writes lost.
        k: usize,
        /// How long it takes, in milliseconds of world time (at least 1).
        down_ms: u64,
    },
}
