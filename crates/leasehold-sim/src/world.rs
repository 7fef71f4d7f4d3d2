//! A world that runs a scenario's lease steps over any backend: clients, the handles they
//! hold, the fenced resources their writes land on, and a timing-free signature of each step.

use std::fmt;

use leasehold::{
    AcquireOutcome, FenceGate, FenceToken, HolderFingerprint, HolderName, InspectOutcome,
    LeaseBackend, LeaseClient, LeaseHandle, LeaseRequest, LeaseState, ReleaseOutcome, RenewOutcome,
};

use crate::scenario::{RESOURCES, purpose, resource_digest};
use crate::signature::Signature;
use crate::step::Step;

/// A handle a world holds, with where it came from.
pub(crate) struct Held<B: LeaseBackend> {
    pub(crate) client: usize,
    pub(crate) resource: usize,
    pub(crate) handle: LeaseHandle<B>,
}

/// Clients, their handles and the fenced resources, over one kind of backend.
pub struct World<B: LeaseBackend> {
    pub(crate) clients: Vec<LeaseClient<B>>,
    pub(crate) held: Vec<Held<B>>,
    gates: Vec<FenceGate>,
    /// Writes accepted per resource, in order: (fence, writer).
    pub(crate) accepted: Vec<Vec<(FenceToken, HolderFingerprint)>>,
    /// Fences of new grants per resource, with the lineage they were granted on.
    pub(crate) grants: Vec<Vec<(u64, FenceToken)>>,
}

impl<B: LeaseBackend> fmt::Debug for World<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("World")
            .field("clients", &self.clients.len())
            .field("handles", &self.held.len())
            .finish_non_exhaustive()
    }
}

/// The signature of an inspection's outcome: who holds it, with what fence.
fn inspected(sig: Signature, outcome: InspectOutcome) -> Signature {
    match outcome {
        InspectOutcome::Free => sig.text("Free"),
        InspectOutcome::HeldByThisAttempt(v) => sig
            .text("Mine(")
            .maybe_fence(v.fence)
            .text(&format!(", {:?})", v.holder))
            .text(&extras(v.holder_name.as_ref(), v.released)),
        InspectOutcome::HeldByOther(v) => sig
            .text("Other(")
            .maybe_fence(v.fence)
            .text(&format!(", {:?})", v.holder))
            .text(&extras(v.holder_name.as_ref(), v.released)),
        InspectOutcome::Indeterminate(_) => sig.text("Indeterminate"),
        other => sig.text(&format!("{other:?}")),
    }
}

fn state_name(state: LeaseState) -> String {
    format!("{state:?}")
}

/// What a contention or view adds when the grant has a holder name or was released for its
/// minimum hold; nothing otherwise, so that signatures without either read as they always did.
fn extras(name: Option<&HolderName>, released: bool) -> String {
    let mut text = String::new();
    if let Some(name) = name {
        text.push_str(&format!(" name {:?}", name.as_str()));
    }
    if released {
        text.push_str(" released");
    }
    text
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

    /// Runs a lease step (`request` from the shared [`RequestBook`](crate::RequestBook)) and returns a signature
    /// of what happened that does not depend on timing: the outcome, fences, holders (with
    /// their holder names and whether the key is kept after release, when so) and the
    /// handle's state. Steps that are not lease calls return `None`.
    ///
    /// The request, not the step, says what is asked for: a test may pass requests with a
    /// minimum hold or a holder name of its own making for an `Acquire` step.
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
                        .text(&format!(", {:?})", c.holder))
                        .text(&extras(c.holder_name.as_ref(), c.released)),
                    AcquireOutcome::OwnerOperationConflict(c) => sig
                        .text("Conflict(")
                        .maybe_fence(c.fence)
                        .text(&format!(", {:?})", c.holder))
                        .text(&extras(c.holder_name.as_ref(), c.released)),
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
                inspected(sig, outcome)
            }
            Step::Watch { client, resource } => {
                let outcome = self.clients[client]
                    .backend()
                    .inspect_watched(&purpose(), &resource_digest(resource))
                    .await;
                inspected(Signature::new(resource).text("watch "), outcome)
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
