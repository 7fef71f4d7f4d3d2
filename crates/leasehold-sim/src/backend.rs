//! One client's connection to a [`SimServer`]: the [`LeaseBackend`] port over the simulated
//! server, with faults injected into its next calls and a log of every request it sent.
//!
//! On a manual world clock, every call completes on its first poll (a fault that takes time
//! moves the clock instead of waiting); on a running one, it waits as a real connection would,
//! with tokio's timers: a lost request or reply waits out the command timeout.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use leasehold::backend::{
    AcquireReply, DowngradeReply, Grant, ReleaseReply, ReleaseWatch, RenewReply,
};
use leasehold::{
    Attempt, Failure, Indeterminate, IndeterminateCause, InspectOutcome, LeaseBackend,
    LeaseRequest, MonotonicInstant, Purpose, ResourceDigest,
};

use crate::fault::Fault;
use crate::keyspace::key_of;
use crate::script::{Applied, Exact, WireOp};
use crate::semaphore::{
    PermitAcquire, PermitRelease, RwAcquire, RwDowngrade, Target, queue_base, rw_of, semaphore_of,
    slot_key, writer_key,
};
use crate::server::SimServer;
use crate::state::Pending;
use crate::units::millis;

/// What a request sent by a [`SimBackend`] asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RequestKind {
    /// An acquire.
    Acquire,
    /// A renewal.
    Renew,
    /// A release.
    Release,
    /// An inspection.
    Inspect,
}

/// A request a [`SimBackend`] sent, for test oracles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SentRequest {
    /// The world clock's reading when the request left the client (before any fault delayed
    /// or lost it).
    pub at: MonotonicInstant,
    /// What it asked for.
    pub kind: RequestKind,
}

/// One client's connection to a [`SimServer`], with injectable faults.
#[derive(Debug)]
pub struct SimBackend {
    server: SimServer,
    command_timeout: Duration,
    counter_idle_expiry: Duration,
    faults: Mutex<VecDeque<Fault>>,
    sent: Mutex<Vec<SentRequest>>,
}

impl SimBackend {
    pub(crate) fn new(server: SimServer, command_timeout: Duration) -> Self {
        Self {
            server,
            command_timeout,
            counter_idle_expiry: Self::DEFAULT_COUNTER_IDLE_EXPIRY,
            faults: Mutex::new(VecDeque::new()),
            sent: Mutex::new(Vec::new()),
        }
    }

    /// How long a fence counter is kept after its last grant unless
    /// [`with_counter_idle_expiry`](Self::with_counter_idle_expiry) says otherwise: 7 days, the
    /// default of `leasehold_redis::RedisSettings::counter_idle_expiry`.
    pub const DEFAULT_COUNTER_IDLE_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);

    /// Sets how long a fence counter is kept after the last grant this connection makes on it,
    /// as `leasehold_redis::RedisSettings::with_counter_idle_expiry` does for Redis, within the
    /// same bounds: from 1 s to 365 days, in whole milliseconds. Each grant sets the counter's
    /// TTL to it (plus the fence's lead over the server's clock, when the counter is ahead of
    /// it), so a test on virtual time can let a counter expire and see the next fence still
    /// rise, taken from the clock.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidSetting`](leasehold::ErrorKind::InvalidSetting) if below 1 s,
    /// above 365 days, or with a sub-millisecond part.
    pub fn with_counter_idle_expiry(mut self, idle: Duration) -> Result<Self, leasehold::Error> {
        let (min, max) = (Duration::from_secs(1), Duration::from_secs(365 * 24 * 3600));
        if !(min..=max).contains(&idle) || !idle.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(leasehold::Error::new(
                leasehold::ErrorKind::InvalidSetting,
                format!(
                    "counter idle expiry must be whole milliseconds from {min:?} to {max:?}, \
                     got {idle:?}"
                ),
            ));
        }
        self.counter_idle_expiry = idle;
        Ok(self)
    }

    /// Returns how long a fence counter is kept after this connection's last grant on it.
    pub fn counter_idle_expiry(&self) -> Duration {
        self.counter_idle_expiry
    }

    /// An inspection; with `mark`, a watch's, which marks the grant found (`inspect.lua`
    /// with `mark`). Only the mark changes anything, so a lost reply is only an unknown
    /// answer, and a request lost on its way marks nothing.
    async fn read(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        attempt: Option<&Attempt>,
        mark: bool,
    ) -> InspectOutcome {
        let key = key_of(purpose, resource);
        match self.depart(RequestKind::Inspect) {
            Some(Fault::LoseRequest | Fault::LateRequest(_)) => {
                self.server.pass(self.command_timeout).await;
                self.timed_out().into()
            }
            Some(Fault::LoseReply) => {
                let _ = self.server.inspect_now(&key, attempt, mark);
                self.server.pass(self.command_timeout).await;
                self.timed_out().into()
            }
            Some(Fault::DelayRequest(d) | Fault::DelayReply(d)) => {
                self.server.pass(d.min(self.command_timeout)).await;
                self.server.inspect_now(&key, attempt, mark)
            }
            None => self.server.inspect_now(&key, attempt, mark),
        }
    }

    /// Queues a fault for the next call.
    pub fn inject(&self, fault: Fault) {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(fault);
    }

    /// Queues `fault` for each of the next `calls` calls.
    pub fn inject_many(&self, fault: Fault, calls: usize) {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(std::iter::repeat_n(fault, calls));
    }

    /// Drops every queued fault that no call has taken yet.
    pub fn clear_faults(&self) {
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Returns every request this backend sent, oldest first, whatever became of it.
    pub fn sent(&self) -> Vec<SentRequest> {
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Returns the server.
    pub fn server(&self) -> &SimServer {
        &self.server
    }

    fn timed_out(&self) -> Failure {
        Failure::Indeterminate(Indeterminate::new(
            IndeterminateCause::ResponseTimeout,
            "simulated timeout",
        ))
    }

    /// Logs a request leaving the client and takes the fault for it, if one is queued.
    fn depart(&self, kind: RequestKind) -> Option<Fault> {
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(SentRequest {
                at: self.server.clock().now(),
                kind,
            });
        self.faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
    }

    /// Sends `op` through the next fault, if any. On a manual world clock it never waits.
    async fn send(&self, kind: RequestKind, op: WireOp) -> Result<Applied, Failure> {
        let fault = self.depart(kind);
        let server = &self.server;
        let apply = || {
            let mut state = server.lock();
            if let Some(refused) = state.refusal(server.world_now()) {
                return Err(refused);
            }
            let now_us = server.server_now_us(&state);
            Ok(state.apply(&op, now_us, server.retry_after_fallback))
        };
        match fault {
            None => apply(),
            Some(Fault::LoseRequest) => {
                server.pass(self.command_timeout).await;
                Err(self.timed_out())
            }
            Some(Fault::LoseReply) => {
                let _ = apply();
                server.pass(self.command_timeout).await;
                Err(self.timed_out())
            }
            Some(Fault::DelayRequest(d)) => {
                server.pass(d.min(self.command_timeout)).await;
                apply()
            }
            Some(Fault::DelayReply(d)) => {
                let applied = apply();
                server.pass(d.min(self.command_timeout)).await;
                applied
            }
            Some(Fault::LateRequest(d)) => {
                {
                    let mut state = server.lock();
                    let at = server.server_now(&state) + millis(d.max(self.command_timeout));
                    state.pending.push(Pending {
                        apply_at_ms: at,
                        op: op.clone(),
                    });
                }
                server.pass(self.command_timeout).await;
                Err(self.timed_out())
            }
        }
    }
}

fn exact(grant: &Grant) -> Exact {
    (
        grant.fence().get(),
        grant.attempt().owner_token().expose_secret().to_owned(),
        grant.attempt().operation().as_str().to_owned(),
    )
}

impl LeaseBackend for SimBackend {
    async fn acquire(&self, request: &LeaseRequest) -> AcquireReply {
        let heartbeat_ms = if request.wait_timeout().is_zero() {
            0
        } else {
            millis(request.queue_heartbeat())
        };
        let op = match (request.rw(), request.capacity()) {
            (Some(mode), _) => WireOp::AcquireRw(RwAcquire {
                base: rw_of(request.purpose(), request.resource()),
                token: request.attempt().owner_token().expose_secret().to_owned(),
                operation: request.attempt().operation().as_str().to_owned(),
                ttl_ms: millis(request.ttl()),
                holder_name: request.holder_name().cloned(),
                write: mode == leasehold::RwMode::Write,
                heartbeat_ms,
                counter_idle_ms: millis(self.counter_idle_expiry),
            }),
            (None, Some(capacity)) => WireOp::AcquirePermit(PermitAcquire {
                base: semaphore_of(request.purpose(), request.resource()),
                token: request.attempt().owner_token().expose_secret().to_owned(),
                operation: request.attempt().operation().as_str().to_owned(),
                ttl_ms: millis(request.ttl()),
                min_hold_ms: millis(request.min_hold().unwrap_or_default()),
                holder_name: request.holder_name().cloned(),
                capacity,
                heartbeat_ms,
                counter_idle_ms: millis(self.counter_idle_expiry),
            }),
            (None, None) => self.lease_acquire(request),
        };
        match self.send(RequestKind::Acquire, op).await {
            Ok(Applied::Acquire(reply)) => reply,
            Ok(_) => AcquireReply::Failed(self.timed_out()),
            Err(failure) => AcquireReply::Failed(failure),
        }
    }

    async fn renew(&self, grant: &Grant) -> RenewReply {
        let op = WireOp::Renew {
            key: grant_key(grant),
            exact: exact(grant),
            ttl_ms: millis(grant.ttl()),
            term: grant.term(),
        };
        match self.send(RequestKind::Renew, op).await {
            Ok(Applied::Renew(reply)) => reply,
            Ok(_) => RenewReply::Failed(self.timed_out()),
            Err(failure) => RenewReply::Failed(failure),
        }
    }

    async fn release(&self, grant: &Grant) -> ReleaseReply {
        let (base, target) = match (grant.rw(), grant.slot()) {
            (Some(_), Some(slot)) => (rw_of(grant.purpose(), grant.resource()), Target::Slot(slot)),
            (Some(_), None) => (rw_of(grant.purpose(), grant.resource()), Target::Writer),
            (None, slot) => (
                semaphore_of(grant.purpose(), grant.resource()),
                match slot {
                    Some(slot) => Target::Slot(slot),
                    None => Target::Writer,
                },
            ),
        };
        let op = match (grant.rw(), grant.slot()) {
            (None, None) => WireOp::Release {
                key: key_of(grant.purpose(), grant.resource()),
                exact: exact(grant),
            },
            _ => WireOp::ReleasePermit(PermitRelease {
                base,
                target,
                fence: Some(grant.fence().get()),
                token: grant.attempt().owner_token().expose_secret().to_owned(),
                operation: grant.attempt().operation().as_str().to_owned(),
                capacity: 0,
            }),
        };
        match self.send(RequestKind::Release, op).await {
            Ok(Applied::Release(reply)) => reply,
            Ok(_) => ReleaseReply::Failed(self.timed_out()),
            Err(failure) => ReleaseReply::Failed(failure),
        }
    }

    async fn release_attempt(&self, request: &LeaseRequest) -> ReleaseReply {
        if request.is_queued() {
            let capacity = request
                .capacity()
                .unwrap_or(leasehold::request::MAX_READERS);
            let op = WireOp::ReleasePermit(PermitRelease {
                base: queue_base(request),
                target: Target::Any {
                    read_write: request.rw().is_some(),
                },
                fence: None,
                token: request.attempt().owner_token().expose_secret().to_owned(),
                operation: request.attempt().operation().as_str().to_owned(),
                capacity,
            });
            return match self.send(RequestKind::Release, op).await {
                Ok(Applied::Release(reply)) => reply,
                Ok(_) => ReleaseReply::Failed(self.timed_out()),
                Err(failure) => ReleaseReply::Failed(failure),
            };
        }
        self.release_lease_attempt(request).await
    }

    async fn inspect(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        attempt: Option<&Attempt>,
    ) -> InspectOutcome {
        self.read(purpose, resource, attempt, false).await
    }

    async fn inspect_watched(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
    ) -> InspectOutcome {
        self.read(purpose, resource, None, true).await
    }

    fn watch(&self, purpose: &Purpose, resource: &ResourceDigest) -> ReleaseWatch {
        // Notices travel on their own connection in Redis: this connection's faults leave
        // them alone.
        self.server.watch(key_of(purpose, resource))
    }

    async fn downgrade(&self, grant: &Grant) -> DowngradeReply {
        let op = WireOp::Downgrade(RwDowngrade {
            base: rw_of(grant.purpose(), grant.resource()),
            exact: exact(grant),
            ttl_ms: millis(grant.ttl()),
        });
        match self.send(RequestKind::Release, op).await {
            Ok(Applied::Downgrade(reply)) => reply,
            Ok(_) => DowngradeReply::Failed(self.timed_out()),
            Err(failure) => DowngradeReply::Failed(failure),
        }
    }

    fn watch_queue(&self, request: &LeaseRequest) -> ReleaseWatch {
        self.server.watch(queue_base(request))
    }
}

/// The key renew sends for `grant`: its slot's for a permit or a reader, the writer's for a
/// writer.
fn grant_key(grant: &Grant) -> String {
    match (grant.rw(), grant.slot()) {
        (Some(_), Some(slot)) => slot_key(&rw_of(grant.purpose(), grant.resource()), slot),
        (Some(_), None) => writer_key(&rw_of(grant.purpose(), grant.resource())),
        (None, Some(slot)) => slot_key(&semaphore_of(grant.purpose(), grant.resource()), slot),
        (None, None) => key_of(grant.purpose(), grant.resource()),
    }
}

impl SimBackend {
    fn lease_acquire(&self, request: &LeaseRequest) -> WireOp {
        WireOp::Acquire {
            key: key_of(request.purpose(), request.resource()),
            token: request.attempt().owner_token().expose_secret().to_owned(),
            operation: request.attempt().operation().as_str().to_owned(),
            ttl_ms: millis(request.ttl()),
            min_hold_ms: millis(request.min_hold().unwrap_or_default()),
            holder_name: request.holder_name().cloned(),
            counter_idle_ms: millis(self.counter_idle_expiry),
        }
    }

    async fn release_lease_attempt(&self, request: &LeaseRequest) -> ReleaseReply {
        // One request, as `release.lua` with an empty fence: the default (inspect, then
        // release by fence) could not release a grant its own attempt already turned into a
        // record kept for its minimum hold, which the script answers `Released`.
        let op = WireOp::ReleaseAttempt {
            key: key_of(request.purpose(), request.resource()),
            token: request.attempt().owner_token().expose_secret().to_owned(),
            operation: request.attempt().operation().as_str().to_owned(),
        };
        match self.send(RequestKind::Release, op).await {
            Ok(Applied::Release(reply)) => reply,
            Ok(_) => ReleaseReply::Failed(self.timed_out()),
            Err(failure) => ReleaseReply::Failed(failure),
        }
    }
}
