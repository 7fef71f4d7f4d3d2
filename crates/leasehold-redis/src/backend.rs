//! [`RedisBackend`]: what a backend holds, and its implementation of the
//! [`LeaseBackend`] port.
//!
//! Every port operation fills in one script's typed call (`scripts/`), runs it through the
//! [`Link`] (EVALSHA, with `WAIT` behind it when the settings gate grants on replication) and
//! decodes its reply into the port's typed answer. A grant or renewal the primary applied but too few replicas confirmed is
//! reported `Indeterminate`, never as done. The constructors, one per topology, are in
//! `topology.rs`.

use std::fmt;

use leasehold::backend::{AcquireReply, DowngradeReply, Grant, ReleaseReply, RenewReply};
use leasehold::{
    Attempt, Failure, FenceToken, InspectOutcome, LeaseBackend, LeaseClient, LeaseRequest, Purpose,
    ResourceDigest, UnavailableCause,
};

use crate::batch::Batcher;
use crate::decode::{self, unreadable};
use crate::fenced::{FencedWrite, RecordName};
use crate::link::{self, Link};
use crate::renewals::{self, Renewals};
use crate::scripts::{
    self, AcquireCall, AcquireEntry, AttemptArg, FencedWriteCall, GrantArg, InspectCall,
    ReleaseCall, ReleaseEntry, RenewCall, RenewGrant, RwAcquireCall, RwDowngradeCall,
    SemaphoreAcquireCall, SemaphoreReleaseCall, WatchCall,
};
use crate::settings::RedisSettings;
use crate::settings::{not_replicated, replicated};
use crate::{Error, KeyLayout, notices};

/// A lease client over Redis.
pub type RedisLeases = LeaseClient<RedisBackend>;

/// Leases on one Redis deployment: a standalone server ([`open`](Self::open)), a Cluster
/// ([`open_cluster`](Self::open_cluster)) or a master found through Sentinel
/// ([`open_sentinel`](Self::open_sentinel)).
pub struct RedisBackend {
    link: std::sync::Arc<Link>,
    renewals: Renewals,
    acquires: std::sync::Arc<Batcher<AcquireEntry>>,
    releases: std::sync::Arc<Batcher<ReleaseEntry>>,
    notices: notices::Notices,
    /// When a watch's read was last refused because the server refuses writes: for
    /// [`WATCH_REFUSED_FOR`] after that, watches read with `inspect.lua` at once.
    watch_refused_at: std::sync::Mutex<Option<std::time::Instant>>,
    keys: KeyLayout,
    settings: RedisSettings,
    endpoint: String,
    /// Releases are announced with `SPUBLISH` (cluster) rather than `PUBLISH`.
    sharded: bool,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only host and port: the connection info may hold credentials.
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.endpoint)
            .field("keys", &self.keys)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// Assembles a backend from what a topology's constructor made. No I/O.
    pub(crate) fn from_parts(
        connector: link::Connector,
        notices: notices::Notices,
        settings: RedisSettings,
        endpoint: String,
    ) -> Self {
        Self {
            sharded: matches!(connector, link::Connector::Cluster(_)),
            link: std::sync::Arc::new(Link::new(
                connector,
                endpoint.clone(),
                settings.connect_timeout(),
                settings.max_in_flight(),
            )),
            renewals: Renewals::default(),
            acquires: Batcher::new(settings.counter_idle_expiry_millis()),
            releases: Batcher::new(()),
            notices,
            watch_refused_at: std::sync::Mutex::new(None),
            keys: KeyLayout::new(&settings),
            settings,
            endpoint,
        }
    }

    /// Returns a [`LeaseClient`] over this backend, with the boot-time clock.
    pub fn into_client(self) -> RedisLeases {
        LeaseClient::new(self)
    }

    /// Connects and loads the scripts (the four lease scripts, the fenced write and the break), so
    /// every later operation is one round trip.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] or [`Error::Indeterminate`] if the server cannot be reached or
    /// does not answer in time. Loading a script changes no lease, so either is harmless.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn warm_up(&self) -> Result<(), Error> {
        self.link.load(&scripts::all()).await.map_err(Error::from)
    }

    /// Returns the settings.
    pub fn settings(&self) -> &RedisSettings {
        &self.settings
    }

    /// Returns the key layout.
    pub fn keys(&self) -> &KeyLayout {
        &self.keys
    }

    /// Returns true if and only if releases are announced with `SPUBLISH` (a Cluster).
    pub(crate) fn is_sharded(&self) -> bool {
        self.sharded
    }

    /// Returns true if and only if an acquire or release now joins a batch (`batch.rs`): not
    /// on a Cluster, whose keys of one command must share a slot, and only while other commands
    /// are in flight. One that starts alone goes straight out as the single call, with
    /// nothing to wait for.
    fn batches(&self) -> bool {
        !self.sharded && self.link.busy()
    }

    /// Returns the connection the scripts run on.
    pub(crate) fn link(&self) -> &Link {
        &self.link
    }
}

/// How long after a server refused a watch's write (its mark) watches read without one: a
/// refused `EVALSHA` on a replica also drops the connection (a demoted master's rule), so
/// trying the mark on every read would cost a reconnect per read.
const WATCH_REFUSED_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// `<owner token>:<operation id>`, as the scripts take an attempt. Holds the owner token.
fn attempt_string(attempt: &Attempt) -> String {
    let (token, operation) = (
        attempt.owner_token().expose_secret(),
        attempt.operation().as_str(),
    );
    let mut joined = String::with_capacity(token.len() + 1 + operation.len());
    joined.push_str(token);
    joined.push(':');
    joined.push_str(operation);
    joined
}

/// Decodes what `inspect.lua` (in either form) answered.
fn inspected(replied: Result<(redis::Value, Option<u32>), Failure>) -> InspectOutcome {
    match replied {
        Ok((value, _)) => InspectCall::decode(&value).unwrap_or_else(|e| unreadable(e).into()),
        Err(failure) => failure.into(),
    }
}

impl RedisBackend {
    /// The inspection of `resource`, by `attempt` if given, without a mark.
    fn inspect_call<'a>(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        attempt: Option<&'a Attempt>,
    ) -> InspectCall<'a> {
        // Without an attempt, both are "": the script then only tells free from held.
        let (owner_token, operation_id) = attempt.map_or(("", ""), |a| {
            (a.owner_token().expose_secret(), a.operation().as_str())
        });
        let lease_key = self.keys.lease_key(purpose, resource);
        InspectCall {
            fence_counter_key: KeyLayout::fence_key_of(&lease_key),
            lease_key,
            owner_token,
            operation_id,
            mark: false,
        }
    }

    /// Runs `release.lua` for `attempt`'s grant with `fence`, or with whatever fence it
    /// carries (`None`).
    ///
    /// The release of a grant goes by EVALSHA. The release of an attempt's grant whatever its
    /// fence is the cleanup behind an unanswered acquire, and goes by EVAL with the script's
    /// source: a stalled server may run it only after this client has gone, when a NOSCRIPT
    /// would have nobody to load the script and send it again.
    async fn release_script(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        attempt: &Attempt,
        fence: Option<leasehold::FenceToken>,
    ) -> ReleaseReply {
        let lease_key = self.keys.lease_key(purpose, resource);
        if let (Some(fence), true) = (fence, self.batches()) {
            // With the releases started with it, in one run of the script (`batch.rs`).
            let entry = ReleaseEntry {
                lease_key,
                grant: format!(
                    "{}:{}:{}",
                    fence.get(),
                    attempt.owner_token().expose_secret(),
                    attempt.operation().as_str()
                ),
            };
            return match self.releases.send(&self.link, None, entry).await {
                Ok((value, _, _)) => ReleaseCall::decode(&value)
                    .unwrap_or_else(|e| ReleaseReply::Failed(unreadable(e))),
                Err(failure) => ReleaseReply::Failed(failure),
            };
        }
        if fence.is_none() && !self.sharded {
            // The cleanup behind an acquire: nothing sent for that acquire may land after it.
            if let Some(sending) = self.acquires.withdraw(&attempt_string(attempt)) {
                sending.await;
            }
        }
        let call = ReleaseCall {
            lease_key,
            grant: GrantArg {
                fence,
                attempt: AttemptArg::of(attempt),
            },
            sharded: self.sharded,
        };
        let reply = match fence {
            Some(_) => self.link.eval(&call, None).await,
            None => self
                .link
                .eval_source(&call)
                .await
                .map(|value| (value, None)),
        };
        match reply {
            Ok((value, _)) => {
                ReleaseCall::decode(&value).unwrap_or_else(|e| ReleaseReply::Failed(unreadable(e)))
            }
            Err(failure) => ReleaseReply::Failed(failure),
        }
    }
}

impl RedisBackend {
    /// Runs `semaphore_acquire.lua` for one permit of a semaphore, or `rw_acquire.lua` for
    /// one side of a read/write lease.
    async fn acquire_queued(&self, request: &LeaseRequest) -> AcquireReply {
        // A try that does not wait takes no place in the queue.
        let heartbeat = if request.wait_timeout().is_zero() {
            0
        } else {
            request.queue_heartbeat_millis()
        };
        let idle = millis(self.settings.counter_idle_expiry());
        let holder_name = request.holder_name().map_or("", |name| name.as_str());
        let attempt = AttemptArg::of(request.attempt());
        let gate = self.settings.replication();
        let replied = match (request.rw(), request.capacity()) {
            (Some(mode), _) => {
                let keys = self.keys.read_write(request.purpose(), request.resource());
                let call = RwAcquireCall {
                    writer_key: keys.writer(),
                    fence_counter_key: keys.fence_counter,
                    queue_key: keys.queue,
                    heartbeat_key: keys.heartbeats,
                    writers_key: keys.writers,
                    slot_key_prefix: keys.slot_prefix,
                    attempt,
                    ttl_in_milliseconds: request.ttl_millis(),
                    mode: match mode {
                        leasehold::RwMode::Read => "read",
                        _ => "write",
                    },
                    queue_heartbeat_in_milliseconds: heartbeat,
                    idle_expiry_in_milliseconds: idle,
                    holder_name,
                };
                self.link.eval_in_term(&call, gate).await
            }
            (None, capacity) => {
                let keys = self.keys.semaphore(request.purpose(), request.resource());
                let call = SemaphoreAcquireCall {
                    capacity_key: keys.capacity,
                    fence_counter_key: keys.fence_counter,
                    queue_key: keys.queue,
                    heartbeat_key: keys.heartbeats,
                    slot_key_prefix: keys.slot_prefix,
                    attempt,
                    ttl_in_milliseconds: request.ttl_millis(),
                    capacity: u64::from(capacity.unwrap_or(1)),
                    queue_heartbeat_in_milliseconds: heartbeat,
                    idle_expiry_in_milliseconds: idle,
                    min_hold_in_milliseconds: request.min_hold_millis(),
                    holder_name,
                };
                self.link.eval_in_term(&call, gate).await
            }
        };
        let granted_ttl =
            std::time::Duration::from_millis(request.ttl_millis().max(request.min_hold_millis()));
        confirmed_in_term(replied, gate, |value| {
            SemaphoreAcquireCall::decode(value, granted_ttl)
        })
    }

    /// Runs `semaphore_release.lua`: for the grant of `fence` on `slot`, or (`None`) for
    /// whatever slot `attempt` holds in the semaphore of `capacity`, with its place in the
    /// queue — the cleanup behind an unanswered acquire or a wait given up, sent by EVAL
    /// with the source as `release.lua`'s is (see [`Self::release_script`]).
    async fn release_permit(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        attempt: &Attempt,
        read_write: bool,
        grant: Option<(FenceToken, String)>,
        capacity: u32,
    ) -> ReleaseReply {
        let keys = if read_write {
            self.keys.read_write(purpose, resource)
        } else {
            self.keys.semaphore(purpose, resource)
        };
        let (fence, slot) = match grant {
            Some((fence, slot)) => (Some(fence), slot),
            None => (None, String::new()),
        };
        let call = SemaphoreReleaseCall {
            capacity_key: keys.capacity,
            queue_key: keys.queue,
            heartbeat_key: keys.heartbeats,
            slot_key_prefix: keys.slot_prefix,
            writers_key: keys.writers,
            grant: GrantArg {
                fence,
                attempt: AttemptArg::of(attempt),
            },
            slot: &slot,
            capacity: u64::from(capacity),
            channel: &keys.channel,
            sharded: self.sharded,
            writer: read_write,
        };
        let reply = match fence {
            Some(_) => self.link.eval(&call, None).await,
            None => self
                .link
                .eval_source(&call)
                .await
                .map(|value| (value, None)),
        };
        match reply {
            Ok((value, _)) => SemaphoreReleaseCall::decode(&value)
                .unwrap_or_else(|e| ReleaseReply::Failed(unreadable(e))),
            Err(failure) => ReleaseReply::Failed(failure),
        }
    }
}

/// Decodes an acquire script's reply with `decode`: a grant or replay too few replicas
/// confirmed is `Indeterminate` (D21), and one confirmed carries the term it was made in.
fn confirmed_in_term(
    replied: Result<(redis::Value, Option<u32>, u64), leasehold::Failure>,
    gate: Option<crate::ReplicationGate>,
    decode: impl FnOnce(&redis::Value) -> Result<AcquireReply, decode::UnexpectedReply>,
) -> AcquireReply {
    let (value, confirmed, term) = match replied {
        Ok(replied) => replied,
        Err(failure) => return AcquireReply::Failed(failure),
    };
    match decode(&value) {
        Ok(AcquireReply::Granted(_) | AcquireReply::Replayed(_))
            if !replicated(gate, confirmed) =>
        {
            AcquireReply::Failed(not_replicated(gate, confirmed))
        }
        Ok(AcquireReply::Granted(grant)) => AcquireReply::Granted(grant.with_term(term)),
        Ok(AcquireReply::Replayed(grant)) => AcquireReply::Replayed(grant.with_term(term)),
        Ok(reply) => reply,
        Err(e) => AcquireReply::Failed(unreadable(e)),
    }
}

/// `duration` in whole milliseconds, as the scripts take it.
fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl LeaseBackend for RedisBackend {
    async fn acquire(&self, request: &LeaseRequest) -> AcquireReply {
        if request.is_queued() {
            return self.acquire_queued(request).await;
        }
        let attempt = request.attempt();
        let lease_key = self.keys.lease_key(request.purpose(), request.resource());
        let gate = self.settings.replication();
        let reply = if self.batches()
            && request.min_hold_millis() == 0
            && request.holder_name().is_none()
        {
            // With the acquires started with it, in one run of the script (`batch.rs`).
            let entry = AcquireEntry {
                lease_key,
                attempt: attempt_string(attempt),
                ttl_in_milliseconds: request.ttl_millis(),
            };
            self.acquires.send(&self.link, gate, entry).await
        } else {
            let call = AcquireCall {
                fence_counter_key: KeyLayout::fence_key_of(&lease_key),
                lease_key,
                counter_idle_expiry_in_milliseconds: self.settings.counter_idle_expiry_millis(),
                attempt: AttemptArg::of(attempt),
                ttl_in_milliseconds: request.ttl_millis(),
                min_hold_in_milliseconds: request.min_hold_millis(),
                holder_name: request.holder_name().map_or("", |name| name.as_str()),
            };
            self.link.eval_in_term(&call, gate).await
        };
        // What the script sets on a grant: the TTL, or the minimum hold if longer.
        let granted_ttl =
            std::time::Duration::from_millis(request.ttl_millis().max(request.min_hold_millis()));
        let fallback = self.settings.retry_after_fallback();
        confirmed_in_term(reply, gate, |value| {
            AcquireCall::decode(value, granted_ttl, fallback)
        })
    }

    async fn renew(&self, grant: &Grant) -> RenewReply {
        // A permit is renewed as the lease on its slot's key is.
        let lease_key = match (grant.rw(), grant.slot()) {
            (Some(_), Some(slot)) => self
                .keys
                .read_write(grant.purpose(), grant.resource())
                .slot(slot),
            (Some(_), None) => self
                .keys
                .read_write(grant.purpose(), grant.resource())
                .writer(),
            (None, Some(slot)) => self
                .keys
                .semaphore(grant.purpose(), grant.resource())
                .slot(slot),
            (None, None) => self.keys.lease_key(grant.purpose(), grant.resource()),
        };
        let gate = self.settings.replication();
        if !self.sharded {
            // Sent with the renewals started with it, in one call (`renewals.rs`).
            return self
                .renewals
                .renew(&self.link, gate, grant, lease_key)
                .await;
        }
        // On a Cluster a call's keys must share a slot: one grant per call.
        let attempt = grant.attempt();
        let call = RenewCall {
            grants: vec![RenewGrant {
                lease_key: &lease_key,
                grant: GrantArg {
                    fence: Some(grant.fence()),
                    attempt: AttemptArg::of(attempt),
                },
                ttl_in_milliseconds: grant.ttl_millis(),
            }],
        };
        let (mut replies, term) = renewals::run(&self.link, gate, &call).await;
        let reply = replies.pop().unwrap_or_else(|| {
            RenewReply::Failed(unreadable(decode::unexpected_reply(
                "renew",
                &redis::Value::Nil,
            )))
        });
        renewals::in_term(reply, grant.term(), term)
    }

    async fn release(&self, grant: &Grant) -> ReleaseReply {
        if grant.slot().is_some() || grant.rw().is_some() {
            // A permit, a reader (its slot) or a writer (the slot "w").
            let slot = grant
                .slot()
                .map_or_else(|| "w".to_owned(), |s| s.to_string());
            return self
                .release_permit(
                    grant.purpose(),
                    grant.resource(),
                    grant.attempt(),
                    grant.rw().is_some(),
                    Some((grant.fence(), slot)),
                    0,
                )
                .await;
        }
        self.release_script(
            grant.purpose(),
            grant.resource(),
            grant.attempt(),
            Some(grant.fence()),
        )
        .await
    }

    async fn release_attempt(&self, request: &LeaseRequest) -> ReleaseReply {
        if request.is_queued() {
            let readers = leasehold::request::MAX_READERS;
            return self
                .release_permit(
                    request.purpose(),
                    request.resource(),
                    request.attempt(),
                    request.rw().is_some(),
                    None,
                    request.capacity().unwrap_or(readers),
                )
                .await;
        }
        // One script on the connection the acquires went on, behind them: a late grant is
        // undone the moment it is made.
        self.release_script(
            request.purpose(),
            request.resource(),
            request.attempt(),
            None,
        )
        .await
    }

    fn watch(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
    ) -> leasehold::backend::ReleaseWatch {
        self.notices
            .watch(self.keys.release_channel(purpose, resource))
    }

    async fn downgrade(&self, grant: &Grant) -> DowngradeReply {
        let keys = self.keys.read_write(grant.purpose(), grant.resource());
        let call = RwDowngradeCall {
            writer_key: keys.writer(),
            queue_key: keys.queue,
            slot_key_prefix: keys.slot_prefix,
            grant: GrantArg {
                fence: Some(grant.fence()),
                attempt: AttemptArg::of(grant.attempt()),
            },
            ttl_in_milliseconds: grant.ttl_millis(),
            channel: &keys.channel,
            sharded: self.sharded,
        };
        let gate = self.settings.replication();
        match self.link.eval_in_term(&call, gate).await {
            Ok((value, confirmed, term)) => match RwDowngradeCall::decode(&value, grant.ttl()) {
                Ok(DowngradeReply::Downgraded(_)) if !replicated(gate, confirmed) => {
                    DowngradeReply::Failed(not_replicated(gate, confirmed))
                }
                Ok(DowngradeReply::Downgraded(reader)) => {
                    DowngradeReply::Downgraded(reader.with_term(term))
                }
                Ok(reply) => reply,
                Err(e) => DowngradeReply::Failed(unreadable(e)),
            },
            Err(failure) => DowngradeReply::Failed(failure),
        }
    }

    fn watch_queue(&self, request: &LeaseRequest) -> leasehold::backend::ReleaseWatch {
        let keys = match request.rw() {
            Some(_) => self.keys.read_write(request.purpose(), request.resource()),
            None => self.keys.semaphore(request.purpose(), request.resource()),
        };
        self.notices.watch(keys.channel)
    }

    async fn inspect(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        attempt: Option<&Attempt>,
    ) -> InspectOutcome {
        let call = self.inspect_call(purpose, resource, attempt);
        inspected(self.link.eval(&call, None).await)
    }

    async fn inspect_watched(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
    ) -> InspectOutcome {
        let refused_lately = self
            .watch_refused_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < WATCH_REFUSED_FOR);
        if refused_lately {
            return self.inspect(purpose, resource, None).await;
        }
        // The watch form of inspect.lua marks the grant it finds, so that its release is
        // announced (D48).
        let mut call = self.inspect_call(purpose, resource, None);
        call.mark = true;
        match self.link.eval(&WatchCall(call), None).await {
            // A server that refuses writes (a replica, MISCONF, NOREPLICAS) refused the whole
            // script, mark and read: the read alone still tells who holds the lease, and the
            // reader then learns of a release by the holder's TTL.
            Err(Failure::Unavailable(refused))
                if matches!(
                    refused.cause,
                    UnavailableCause::ReadOnly | UnavailableCause::WritesRefused
                ) =>
            {
                *self
                    .watch_refused_at
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some(std::time::Instant::now());
                self.inspect(purpose, resource, None).await
            }
            replied => inspected(replied),
        }
    }
}

impl RedisBackend {
    /// Stores `value` in the record `name` of `resource` if no write with a fence above
    /// `fence` was accepted before (equal fences are accepted: one grant writing again).
    ///
    /// Pass the fence of the grant the work runs under (`lease.fence()`). The record lives
    /// next to the lease, in the same Cluster slot, as a hash with fields `fence` and `value`
    /// under [`KeyLayout::record_key`](crate::KeyLayout::record_key); read it with `HGET`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the command was sent leaves its outcome unknown, like an
    /// `Indeterminate` result; writing the same value with the same fence again is harmless.
    pub async fn fenced_write(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        name: &RecordName,
        fence: FenceToken,
        value: &[u8],
    ) -> FencedWrite {
        self.fenced_write_to(
            self.keys().record_key(purpose, resource, name),
            fence,
            value,
        )
        .await
    }

    /// As [`fenced_write`](Self::fenced_write), for a semaphore's permit: the record is
    /// kept per slot, so that the N holders of a semaphore write at once, each refused only
    /// once its own slot was granted again with a higher fence. Pass the permit's slot and
    /// fence (`guard.slot()`, `guard.fence()`); the record is a hash under
    /// [`SemaphoreKeys::record`](crate::SemaphoreKeys::record).
    ///
    /// # Cancel safety
    ///
    /// As [`fenced_write`](Self::fenced_write).
    pub async fn fenced_write_permit(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        slot: u32,
        name: &RecordName,
        fence: FenceToken,
        value: &[u8],
    ) -> FencedWrite {
        let key = self.keys().semaphore(purpose, resource).record(slot, name);
        self.fenced_write_to(key, fence, value).await
    }

    async fn fenced_write_to(
        &self,
        record_key: String,
        fence: FenceToken,
        value: &[u8],
    ) -> FencedWrite {
        let call = FencedWriteCall {
            record_key,
            fence,
            value,
        };
        let reply = self.link().eval(&call, None).await;
        match reply {
            Ok((value, _)) => FencedWriteCall::decode(&value)
                .unwrap_or_else(|e| FencedWrite::Failed(unreadable(e))),
            Err(failure) => FencedWrite::Failed(failure),
        }
    }
}
