//! Random lease scenarios: a step language, its proptest strategies, a world that runs steps
//! over any backend, and the invariant checker for the simulated one.
//!
//! The same [`Step`]s drive the invariant suite (simulated server, faults, virtual time) and the
//! differential test (simulated server and real redis-server side by side, compared step by
//! step through [`World::apply`]'s signatures, with fences compared by order: [`by_rank`]).
//!
//! The invariants:
//!
//! - I1: no renewal or release succeeds for anyone but the exact stored holder;
//! - I2: an Active handle's exact grant is what the server holds;
//! - I3: at most one grant per resource is Active;
//! - I4: the fenced resource never accepts a write whose fence goes back;
//! - I5: fences of new grants strictly increase per resource, across restarts and lossy
//!   failovers too (the server's clock carries them over a lost counter).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use leasehold::{
    AcquireOutcome, Attempt, FenceGate, FenceToken, HolderFingerprint, InspectOutcome,
    LeaseBackend, LeaseClient, LeaseHandle, LeaseRequest, LeaseState, ManualClock, OperationId,
    Purpose, ReleaseOutcome, RenewOutcome, ResourceDigest,
};
use leasehold_sim::{Fault, SimBackend, SimServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Clients in a scenario.
pub const CLIENTS: usize = 3;
/// Resources in a scenario.
pub const RESOURCES: usize = 2;
/// The command timeout of simulated clients.
pub const COMMAND_TIMEOUT: Duration = Duration::from_millis(200);

/// Which kinds of step a scenario may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Time passes, and requests and replies are lost, delayed or late.
    pub timing: bool,
    /// Leases are deleted by hand (as an operator's `DEL` would).
    pub deletes: bool,
    /// The server's clock steps forward or back.
    pub clock_steps: bool,
    /// The server restarts without persistence.
    pub restarts: bool,
    /// The server fails over to a replica that lost its last writes.
    pub failovers: bool,
}

impl Mode {
    /// Timing faults only: every invariant must hold.
    pub const TIMING: Mode = Mode {
        timing: true,
        deletes: false,
        clock_steps: false,
        restarts: false,
        failovers: false,
    };
    /// No time and no faults, for comparing against real Redis.
    pub const DIFFERENTIAL: Mode = Mode {
        timing: false,
        deletes: true,
        clock_steps: false,
        restarts: false,
        failovers: false,
    };
    /// Control: server clock steps (I3 must be found broken; I1, I4 and I5 must hold).
    pub const CLOCK_STEPS: Mode = Mode {
        clock_steps: true,
        ..Mode::TIMING
    };
    /// Restarts and lossy failovers, each taking a downtime, on a clock that behaves (I3 must
    /// be found broken; I1, I4 and I5 must hold).
    pub const LOSSY: Mode = Mode {
        restarts: true,
        failovers: true,
        ..Mode::TIMING
    };
    /// Control: restarts and lossy failovers while the server's clock steps forward and back,
    /// sometimes back by more than a loss takes (I5 must be found broken; I1 and I4 must hold).
    pub const LOSSY_CLOCK_STEPS: Mode = Mode {
        clock_steps: true,
        ..Mode::LOSSY
    };

    /// Returns true if and only if the server keeps its promises in this mode, so that I2 and
    /// I3 must hold.
    pub fn is_strict(&self) -> bool {
        !(self.deletes || self.clock_steps || self.restarts || self.failovers)
    }
}

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
    fn fault(self) -> Fault {
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

/// The downtimes of generated restarts and failovers, in milliseconds: from the shortest a
/// real one takes to longer than most TTLs.
pub const DOWNTIMES_MS: std::ops::RangeInclusive<u64> = 1..=500;

/// TTLs a scenario's acquires use, by mode: short ones where time is virtual, long ones
/// where real Redis runs beside the simulation in real time.
pub fn ttls(mode: Mode) -> &'static [u64] {
    if mode.timing {
        &[60, 150, 400, 1000]
    } else {
        &[20_000, 60_000]
    }
}

/// The strategy for scenarios of up to `max_len` steps in `mode`.
pub fn steps(mode: Mode, max_len: usize) -> BoxedStrategy<Vec<Step>> {
    let c = 0..CLIENTS;
    let r = 0..RESOURCES;
    let ttl = 0..ttls(mode).len();
    let mut choices: Vec<(u32, BoxedStrategy<Step>)> = vec![
        (
            4,
            (c.clone(), r.clone(), ttl)
                .prop_map(|(client, resource, ttl)| Step::Acquire {
                    client,
                    resource,
                    ttl,
                })
                .boxed(),
        ),
        (
            2,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::Replay { client, resource })
                .boxed(),
        ),
        (
            1,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::OtherOperation { client, resource })
                .boxed(),
        ),
        (
            3,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::Renew { client, resource })
                .boxed(),
        ),
        (
            2,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::Release { client, resource })
                .boxed(),
        ),
        (
            1,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::Inspect { client, resource })
                .boxed(),
        ),
        (
            2,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::Write { client, resource })
                .boxed(),
        ),
    ];
    if mode.timing {
        choices.push((3, (0u64..1200).prop_map(|ms| Step::Advance { ms }).boxed()));
        let fault = prop_oneof![
            Just(FaultStep::LoseRequest),
            Just(FaultStep::LoseReply),
            (1u64..199).prop_map(FaultStep::DelayRequest),
            (1u64..199).prop_map(FaultStep::DelayReply),
            (201u64..1500).prop_map(FaultStep::LateRequest),
        ];
        choices.push((
            2,
            (c.clone(), fault)
                .prop_map(|(client, fault)| Step::Fault { client, fault })
                .boxed(),
        ));
    }
    if mode.deletes {
        choices.push((
            1,
            r.clone()
                .prop_map(|resource| Step::Delete { resource })
                .boxed(),
        ));
    }
    if mode.clock_steps {
        choices.push((
            1,
            (-800i64..800).prop_map(|ms| Step::ClockStep { ms }).boxed(),
        ));
    }
    if mode.restarts {
        choices.push((
            1,
            DOWNTIMES_MS
                .prop_map(|down_ms| Step::Restart { down_ms })
                .boxed(),
        ));
    }
    if mode.failovers {
        choices.push((
            1,
            (1usize..4, DOWNTIMES_MS)
                .prop_map(|(k, down_ms)| Step::Failover { k, down_ms })
                .boxed(),
        ));
    }
    proptest::collection::vec(
        proptest::strategy::Union::new_weighted(choices),
        1..=max_len,
    )
    .boxed()
}

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
                    Purpose::new("sim").ok()?,
                    ResourceDigest::of(format!("resource-{resource}")),
                    attempt,
                    Duration::from_millis(ttls(mode)[ttl]),
                    leasehold::DriftBudget::default(),
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

/// A handle a world holds, with where it came from.
struct Held<B: LeaseBackend> {
    client: usize,
    resource: usize,
    handle: LeaseHandle<B>,
}

/// Clients, their handles and the fenced resources, over one kind of backend.
pub struct World<B: LeaseBackend> {
    clients: Vec<LeaseClient<B>>,
    held: Vec<Held<B>>,
    gates: Vec<FenceGate>,
    /// Writes accepted per resource, in order: (fence, writer).
    accepted: Vec<Vec<(FenceToken, HolderFingerprint)>>,
    /// Fences of new grants per resource, with the lineage they were granted on.
    grants: Vec<Vec<(u64, FenceToken)>>,
}

impl<B: LeaseBackend> fmt::Debug for World<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("World")
            .field("clients", &self.clients.len())
            .field("handles", &self.held.len())
            .finish_non_exhaustive()
    }
}

fn state_name(state: LeaseState) -> String {
    format!("{state:?}")
}

impl<B: LeaseBackend> World<B> {
    /// Makes a world over `clients` (one per scenario client).
    pub fn new(clients: Vec<LeaseClient<B>>) -> Self {
        Self {
            clients,
            held: Vec::new(),
            gates: vec![FenceGate::new(); RESOURCES],
            accepted: vec![Vec::new(); RESOURCES],
            grants: vec![Vec::new(); RESOURCES],
        }
    }

    /// Returns the clients.
    pub fn clients(&self) -> &[LeaseClient<B>] {
        &self.clients
    }

    fn latest(&self, client: usize, resource: usize) -> Option<&LeaseHandle<B>> {
        self.held
            .iter()
            .rev()
            .find(|h| h.client == client && h.resource == resource)
            .map(|h| &h.handle)
    }

    /// Runs a lease step (`request` from the shared [`RequestBook`]) and returns a signature
    /// of what happened that does not depend on timing: the outcome, fences, holders and the
    /// handle's state. Steps that are not lease calls return `None`.
    pub async fn apply(
        &mut self,
        step: &Step,
        request: Option<&LeaseRequest>,
        lineage: u64,
    ) -> Option<Signature> {
        Some(match *step {
            Step::Acquire {
                client, resource, ..
            }
            | Step::Replay { client, resource }
            | Step::OtherOperation { client, resource } => {
                let sig = Signature::new(resource);
                let Some(request) = request else {
                    return Some(sig.text("no request"));
                };
                let outcome = self.clients[client].try_acquire(request).await;
                let signature = match &outcome {
                    AcquireOutcome::Acquired(h) => {
                        self.grants[resource].push((lineage, h.fence()));
                        sig.text("Acquired(")
                            .fence(h.fence())
                            .text(&format!(") {}", state_name(h.state())))
                    }
                    AcquireOutcome::Replayed(h) => sig
                        .text("Replayed(")
                        .fence(h.fence())
                        .text(&format!(") {}", state_name(h.state()))),
                    AcquireOutcome::Contended(c) => sig
                        .text("Contended(")
                        .maybe_fence(c.fence)
                        .text(&format!(", {:?})", c.holder)),
                    AcquireOutcome::OwnerOperationConflict(c) => sig
                        .text("Conflict(")
                        .maybe_fence(c.fence)
                        .text(&format!(", {:?})", c.holder)),
                    AcquireOutcome::Indeterminate { .. } => sig.text("Indeterminate"),
                    AcquireOutcome::Unavailable(_) => sig.text("Unavailable"),
                    AcquireOutcome::Overloaded => sig.text("Overloaded"),
                    _ => sig.text("Unknown outcome"),
                };
                if let Some(handle) = outcome.into_handle() {
                    self.held.push(Held {
                        client,
                        resource,
                        handle,
                    });
                }
                signature
            }
            Step::Renew { client, resource } => {
                let sig = Signature::new(resource);
                match self.latest(client, resource) {
                    None => sig.text("no handle"),
                    Some(h) => {
                        let outcome = match h.renew().await {
                            RenewOutcome::Renewed { .. } => "Renewed".to_owned(),
                            RenewOutcome::Lost(cause) => format!("Lost({cause:?})"),
                            RenewOutcome::Refused { state } => format!("Refused({state:?})"),
                            RenewOutcome::Indeterminate(_) => "Indeterminate".to_owned(),
                            other => format!("{other:?}"),
                        };
                        sig.text(&format!("{outcome} {}", state_name(h.state())))
                    }
                }
            }
            Step::Release { client, resource } => {
                let sig = Signature::new(resource);
                match self.latest(client, resource) {
                    None => sig.text("no handle"),
                    Some(h) => {
                        let outcome = match h.release().await {
                            ReleaseOutcome::Indeterminate(_) => "Indeterminate".to_owned(),
                            other => format!("{other:?}"),
                        };
                        sig.text(&format!("{outcome} {}", state_name(h.state())))
                    }
                }
            }
            Step::Inspect { client, resource } => {
                let sig = Signature::new(resource);
                let Some(request) = request else {
                    return Some(sig.text("no request"));
                };
                let outcome = self.clients[client]
                    .inspect(
                        request.purpose(),
                        request.resource(),
                        Some(request.attempt()),
                    )
                    .await;
                match outcome {
                    InspectOutcome::Free => sig.text("Free"),
                    InspectOutcome::HeldByThisAttempt(v) => sig
                        .text("Mine(")
                        .maybe_fence(v.fence)
                        .text(&format!(", {:?})", v.holder)),
                    InspectOutcome::HeldByOther(v) => sig
                        .text("Other(")
                        .maybe_fence(v.fence)
                        .text(&format!(", {:?})", v.holder)),
                    InspectOutcome::Indeterminate(_) => sig.text("Indeterminate"),
                    other => sig.text(&format!("{other:?}")),
                }
            }
            Step::Write { client, resource } => {
                let sig = Signature::new(resource);
                let Some(h) = self.latest(client, resource) else {
                    return Some(sig.text("no handle"));
                };
                let (fence, writer) = (h.fence(), h.attempt().fingerprint());
                let sig = sig.text("write ").fence(fence);
                match self.gates[resource].admit(fence, &writer) {
                    Ok(()) => {
                        self.accepted[resource].push((fence, writer));
                        sig.text(" accepted")
                    }
                    Err(_) => sig.text(" rejected"),
                }
            }
            _ => return None,
        })
    }
}

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
            Step::Delete { resource } => self.server.delete(
                &Purpose::new("sim").expect("valid"),
                &ResourceDigest::of(format!("resource-{resource}")),
            ),
            Step::ClockStep { ms } => self.server.step_clock(ms),
            Step::Restart { down_ms } => self.server.restart(Duration::from_millis(down_ms)),
            Step::Failover { k, down_ms } => {
                self.server.failover(k, Duration::from_millis(down_ms));
            }
            _ => {
                let lineage = self.server.lineage();
                return leasehold_sim::run_now(self.world.apply(step, request, lineage));
            }
        }
        None
    }

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
        let purpose = Purpose::new("sim").expect("valid");
        for resource in 0..RESOURCES {
            let digest = ResourceDigest::of(format!("resource-{resource}"));
            let stored = self.server.stored(&purpose, &digest);
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

/// Returns `LEASEHOLD_SIM_CASES`, or `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("LEASEHOLD_SIM_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Returns a test runner for `cases` cases, seeded from `LEASEHOLD_SIM_SEED` or at random, and
/// the seed, which a failure must print so that it can be run again.
pub fn runner(cases: u32) -> (TestRunner, u64) {
    let seed = std::env::var("LEASEHOLD_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            let mut bytes = [0u8; 8];
            // Falls back to the clock if the OS has no entropy: any seed will do.
            let _ = std::fs::File::open("/dev/urandom")
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
            u64::from_le_bytes(bytes)
                ^ std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
        });
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    (
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key)),
        seed,
    )
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
