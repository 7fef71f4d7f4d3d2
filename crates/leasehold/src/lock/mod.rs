//! The one-call layer: a lease in one call, kept alive, released on drop.
//!
//! [`LeaseClient::lock`] makes the attempt, the request and the keep-alive for the caller and
//! returns a [`LeaseGuard`]; [`LockBuilder::run`] (or [`LeaseClient::run`]) runs work under
//! the lease and says whether it covered the work. Underneath is the explicit API
//! ([`LeaseClient::acquire`], [`Watchdog`](crate::Watchdog)), with every guarantee of it:
//!
//! - every call makes a fresh attempt, so a reply lost on the way is resolved by replaying
//!   the same attempt (within the wait), never by a second grant;
//! - `Unavailable` and `Overloaded` tries are retried with backoff until the wait's deadline;
//!   only what is still unknown or not reached then comes back, typed ([`LockError`]); an
//!   unknown one is cleaned up in the background, so no grant is left to nobody;
//! - the guard's loss signal fires before its lease could be granted to anyone else, and
//!   [`run`](LockBuilder::run) cancels the work then;
//! - dropping a guard, or a `lock` or `run` future, releases in the background
//!   ([`LeaseClient::settle`] waits for those releases before a process exits).
//!
//! # Example
//!
//! A lease on `orders/42`, waited for up to 10 s, its fence on every write, the work stopped
//! when the loss signal fires; then a run-once job whose lease stays on the server for ten
//! minutes after its grant (a minimum hold), so that a host whose clock is behind does not run
//! it again:
//!
//! ```no_run
//! # async fn ship(_fence: leasehold::FenceToken) {}
//! # async fn report(_fence: leasehold::FenceToken) -> u64 { 0 }
//! # async fn demo<B: leasehold::LeaseBackend>(client: leasehold::LeaseClient<B>) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use leasehold::{HolderName, RunError};
//!
//! match client.lock("orders/42").ttl(Duration::from_secs(30)).wait(Duration::from_secs(10)).await {
//!     Ok(guard) => {
//!         tokio::select! {
//!             () = ship(guard.fence()) => {}
//!             reason = guard.lost() => eprintln!("stopped before the lease could pass on: {reason}"),
//!         }
//!         let outcome = guard.release().await;
//!         if outcome.ended_early() {
//!             eprintln!("the lease had ended before the work did: {outcome}");
//!         }
//!     }
//!     Err(e) if e.is_contended() => println!("another holder kept it for 10 s"),
//!     Err(e) => return Err(e.into()), // unreachable, unknown (being cleaned up), or refused
//! }
//!
//! let run = client
//!     .lock("nightly-report")
//!     .ttl(Duration::from_secs(60))
//!     .min_hold(Duration::from_secs(10 * 60))
//!     .holder_name(HolderName::new("host-3")?)
//!     .run(|lease| report(lease.fence()))
//!     .await;
//! match run {
//!     Ok(rows) => println!("ran: {rows} rows"),
//!     Err(e) if e.is_contended() => println!("another host ran it"),
//!     Err(RunError::Uncovered { output, .. }) => eprintln!("{output} rows, not covered to the end"),
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(()) }
//! ```

//!
//! # Semaphores
//!
//! [`LeaseClient::semaphore`] takes one *permit* of a counting semaphore: at most N holders
//! at once. Each permit is a lease on one of the semaphore's N *slots*, so it has everything
//! a lease has — a fence, keep-alive by the watchdog, a loss signal that fires before the
//! slot can be granted to anyone else, a typed release, replay of a lost reply — and a
//! [`slot`](LeaseGuard::slot):
//!
//! - **Fenced per slot.** N holders write at once, so "refuse a lower fence" must be kept per
//!   slot: a target stores the highest fence per slot (`UPDATE … WHERE id = $id AND slot =
//!   $slot AND fence <= $fence`). Fences still grow across the whole semaphore, so one
//!   counter serves every slot.
//! - **Fair.** A permit request that waits takes a place in the semaphore's queue on the
//!   server; with f slots free, only the first f places may take them, so no waiter is ever
//!   overtaken by one that began waiting later — in any process. A place lapses one *queue
//!   heartbeat* (default 3 s, [`LockBuilder::queue_heartbeat`]) after its last try, so a
//!   waiter that dies never stalls the queue for longer; a release hands the slot on through
//!   a release notice while someone waits.
//! - **Capacity recorded.** The first request records the capacity; one asking for another
//!   gets [`LockError::CapacityMismatch`] and writes nothing.
//! - **Nothing leaks.** Every key expires after its last permit and waiter.
//!
//! # Read/write leases
//!
//! [`LeaseClient::read_lock`] and [`LeaseClient::write_lock`] take one side of a read/write
//! lease: many readers or one writer. Writers are preferred — a waiting writer stops new
//! readers, so a stream of readers cannot starve it. The writer's grant has a new fence; a
//! reader's fence is the last writer's, so a target that keeps each write's fence refuses a
//! reader whose view a newer writer replaced. [`LeaseGuard::downgrade`] turns the writer
//! into a reader without a gap; [`LeaseGuard::upgrade`] is refused, typed (two upgraders
//! would wait for each other forever).

mod error;
mod guard;
mod held;

pub use error::{LockError, RunError};
pub use guard::{DowngradeError, LeaseGuard, UpgradeRefused};
pub use held::HeldLease;

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::LeaseBackend;
use crate::client::{AcquireOutcome, LeaseClient};
use crate::error::Error;
use crate::handle::LeaseHandle;
use crate::id::{Attempt, HolderName, OperationId, Purpose, ResourceDigest};
use crate::outcome::ReleaseOutcome;
use crate::request::{LeaseRequest, RwMode};
use crate::retry::Backoff;

/// The TTL of a lease taken with [`LeaseClient::lock`] unless [`LockBuilder::ttl`] says
/// otherwise (as Redisson's watchdog: the lease is renewed every 10 s).
pub const DEFAULT_LOCK_TTL: Duration = Duration::from_secs(30);

/// The purpose of a lease taken with [`LeaseClient::lock`] unless
/// [`LockBuilder::purpose`] says otherwise.
pub const DEFAULT_PURPOSE: &str = "lock";

/// A lease to take in one call: set options, then `.await` it (or [`run`](Self::run) work
/// under it). Made by [`LeaseClient::lock`].
///
/// Without options it tries once for a 30 s lease with purpose `lock` and a fresh operation
/// id, and keeps it alive with the client's watchdog until it is released or dropped.
#[must_use = "a lock does nothing until it is awaited or run"]
pub struct LockBuilder<'a, B: LeaseBackend> {
    client: &'a LeaseClient<B>,
    resource: ResourceDigest,
    purpose: Option<Purpose>,
    operation: Option<OperationId>,
    ttl: Duration,
    wait: Duration,
    min_hold: Duration,
    holder_name: Option<HolderName>,
    /// For a semaphore's permit: its capacity.
    capacity: Option<u32>,
    queue_heartbeat: Option<Duration>,
    /// For a side of a read/write lease: which.
    rw: Option<RwMode>,
}

impl<B: LeaseBackend> fmt::Debug for LockBuilder<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockBuilder")
            .field("resource", &self.resource)
            .field("purpose", &self.purpose)
            .field("operation", &self.operation)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("min_hold", &self.min_hold)
            .field("holder_name", &self.holder_name)
            .field("capacity", &self.capacity)
            .field("queue_heartbeat", &self.queue_heartbeat)
            .field("rw", &self.rw)
            .finish_non_exhaustive()
    }
}

impl<'a, B: LeaseBackend> LockBuilder<'a, B> {
    /// Sets the TTL (default 30 s). The watchdog renews the lease every TTL / 3 by default;
    /// the TTL bounds how long the lease outlives a holder that dies without releasing.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets how long to wait for the lease while others hold it (default: try once). Tries
    /// that did not reach the server, or whose outcome is unknown, are retried within it too.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Sets the purpose (default `lock`): leases of one resource name for different
    /// purposes do not exclude each other.
    pub fn purpose(mut self, purpose: Purpose) -> Self {
        self.purpose = Some(purpose);
        self
    }

    /// Sets the operation id the attempt is made for (default: `lock-` and 16 random hex
    /// digits, fresh for every call).
    pub fn operation(mut self, operation: OperationId) -> Self {
        self.operation = Some(operation);
        self
    }

    /// Keeps the key on the server at least `hold` after the grant, even when the guard is
    /// released sooner or its process dies (ShedLock's `lockAtLeastFor`): a run-once job on
    /// hosts whose clocks differ by seconds still runs once. See
    /// [`LeaseRequest::with_min_hold`]; a bad value is refused when the lock is awaited,
    /// before any I/O.
    pub fn min_hold(mut self, hold: Duration) -> Self {
        self.min_hold = hold;
        self
    }

    /// Stores `name` with the grant, so that operators see who holds the lease
    /// ([`LeaseClient::inspect`], `leasehold inspect`). Never the owner token; optional.
    pub fn holder_name(mut self, name: HolderName) -> Self {
        self.holder_name = Some(name);
        self
    }

    /// Sets how long a permit's place in the semaphore's queue outlives its last try
    /// (default 3 s, see [`LeaseRequest::with_queue_heartbeat`]): a waiter that dies keeps
    /// the others out at most this long. Only a semaphore's permit waits in a queue.
    pub fn queue_heartbeat(mut self, heartbeat: Duration) -> Self {
        self.queue_heartbeat = Some(heartbeat);
        self
    }

    /// Builds the request, and checks that the client's watchdog can keep a lease of its TTL:
    /// all before any I/O.
    fn request(&self) -> Result<LeaseRequest, Error> {
        let purpose = match &self.purpose {
            Some(purpose) => purpose.clone(),
            None => Purpose::new(DEFAULT_PURPOSE)?,
        };
        let operation = match &self.operation {
            Some(operation) => operation.clone(),
            None => fresh_operation()?,
        };
        let request = self
            .client
            .request(
                purpose,
                self.resource.clone(),
                Attempt::new(operation)?,
                self.ttl,
            )?
            .with_wait_timeout(self.wait)?
            .with_min_hold(self.min_hold)?;
        let mut request = match &self.holder_name {
            Some(name) => request.with_holder_name(name.clone()),
            None => request,
        };
        if let Some(capacity) = self.capacity {
            request = request.with_capacity(capacity)?;
        }
        if let Some(mode) = self.rw {
            request = request.with_rw(mode)?;
        }
        if let Some(heartbeat) = self.queue_heartbeat {
            request = request.with_queue_heartbeat(heartbeat)?;
        }
        self.client
            .watchdog()
            .settings()
            .check_lease(request.ttl(), request.drift())?;
        Ok(request)
    }

    /// Takes the lease: see [`LeaseClient::lock`].
    async fn take(self) -> Result<LeaseGuard<B>, LockError> {
        let request = self.request()?;
        let handle = acquire_within_wait(self.client, &request).await?;
        self.client.guard(handle).await
    }

    /// Takes the lease, runs `work` under it, and releases it: the result is `Ok` only if the
    /// lease covered the work from its start to its end and the release was confirmed.
    ///
    /// `work` gets a [`HeldLease`] (the fence, the loss signal). If the signal fires first —
    /// which it does before the lease could be granted to anyone else — the work is cancelled
    /// (its future dropped) and the error says why.
    ///
    /// # Errors
    ///
    /// A [`RunError`] that says which step fell short: not acquired, lost while running (with
    /// the reason), finished but uncovered, or finished but not released.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future cancels the work and releases the lease in the background.
    pub async fn run<T, F, Fut>(self, work: F) -> Result<T, RunError<T>>
    where
        F: FnOnce(HeldLease<B>) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.take().await.map_err(RunError::NotAcquired)?;
        let held = HeldLease::new(&guard);
        let signal = guard.signal().clone();
        let finished = tokio::select! {
            // A loss seen together with the work's end wins: it cannot be ruled out.
            biased;
            reason = signal.lost() => Err(reason),
            output = work(held) => Ok(output),
        };
        let release = guard.release().await;
        match finished {
            Err(reason) => Err(RunError::Lost { reason, release }),
            Ok(output) if release.ended_early() => Err(RunError::Uncovered { output, release }),
            Ok(output) if release == ReleaseOutcome::Released => Ok(output),
            Ok(output) => Err(RunError::NotReleased { output, release }),
        }
    }
}

impl<'a, B: LeaseBackend> IntoFuture for LockBuilder<'a, B> {
    type Output = Result<LeaseGuard<B>, LockError>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.take())
    }
}

/// Acquires within the request's wait: waits on contention, replays unknown tries, and
/// retries tries that did not reach the server with backoff, until the deadline.
async fn acquire_within_wait<B: LeaseBackend>(
    client: &LeaseClient<B>,
    request: &LeaseRequest,
) -> Result<LeaseHandle<B>, LockError> {
    let deadline = Instant::now() + request.wait_timeout();
    let mut backoff = Backoff::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        // The same attempt every time: a try after an unknown one is a replay.
        let this_try = request.clone().with_wait_timeout(left)?;
        let failed = match client.acquire(&this_try).await {
            AcquireOutcome::Acquired(handle) | AcquireOutcome::Replayed(handle) => {
                return Ok(handle);
            }
            AcquireOutcome::Contended(c) | AcquireOutcome::OwnerOperationConflict(c) => {
                return Err(LockError::Contended(c));
            }
            AcquireOutcome::CapacityMismatch { recorded } => {
                return Err(LockError::CapacityMismatch { recorded });
            }
            AcquireOutcome::Indeterminate { cause, .. } => {
                // `acquire` replayed until the deadline. Nobody can resolve this attempt
                // after us, so whatever it may hold is released now.
                client.abandon_in_background(request.clone());
                return Err(LockError::Indeterminate(cause));
            }
            AcquireOutcome::Unavailable(u) => LockError::Unavailable(u),
            AcquireOutcome::Overloaded => LockError::Overloaded,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(failed);
        }
        backoff.pause(Some(deadline)).await;
    }
}

/// Returns `lock-` and 16 random hex digits.
fn fresh_operation() -> Result<OperationId, Error> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| {
        Error::new(
            crate::error::ErrorKind::Entropy,
            format!("no random operation id: {e}"),
        )
    })?;
    OperationId::new(format!("lock-{:016x}", u64::from_le_bytes(bytes)))
}

impl<B: LeaseBackend> LeaseClient<B> {
    /// Prepares a lease on `name` in one call; `.await` it for a [`LeaseGuard`].
    ///
    /// The name is hashed ([`ResourceDigest::of`]): it never reaches the server. Set the TTL,
    /// wait, purpose, operation, minimum hold and holder name on the builder.
    ///
    /// ```no_run
    /// # async fn demo<B: leasehold::LeaseBackend>(client: leasehold::LeaseClient<B>) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    ///
    /// let guard = client
    ///     .lock("orders/42")
    ///     .ttl(Duration::from_secs(30))
    ///     .wait(Duration::from_secs(10))
    ///     .await?;
    /// let fence = guard.fence(); // pass it to every write
    /// # let _ = fence;
    /// guard.release().await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// A [`LockError`] when no guard could be given: another holder kept the lease through the
    /// wait, the server could not be reached, the outcome stayed unknown (and is being
    /// cleaned up), or the input was refused before any I/O.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future never leaves a lease nobody knows about: a grant it may have made
    /// is released in the background, as with [`acquire`](Self::acquire).
    pub fn lock(&self, name: impl AsRef<[u8]>) -> LockBuilder<'_, B> {
        self.lock_resource(ResourceDigest::of(name))
    }

    /// As [`lock`](Self::lock), for a resource already hashed.
    pub(crate) fn lock_resource(&self, resource: ResourceDigest) -> LockBuilder<'_, B> {
        LockBuilder {
            client: self,
            resource,
            purpose: None,
            operation: None,
            ttl: DEFAULT_LOCK_TTL,
            wait: Duration::ZERO,
            min_hold: Duration::ZERO,
            holder_name: None,
            capacity: None,
            queue_heartbeat: None,
            rw: None,
        }
    }

    /// Prepares the read side of the read/write lease on `name`: held by many readers at
    /// once (at most [`MAX_READERS`](crate::request::MAX_READERS)), never beside the writer.
    /// `.await` it for a [`LeaseGuard`] whose [`fence`](LeaseGuard::fence) is the fence of the
    /// last writer before it: a target that keeps each write's fence can tell a reader whose
    /// view a newer writer replaced. Writers are preferred: while one waits, no new reader
    /// comes in. See [the read/write guide](crate::lock#readwrite-leases).
    ///
    /// ```no_run
    /// # async fn demo<B: leasehold::LeaseBackend>(client: leasehold::LeaseClient<B>) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    ///
    /// let writer = client.write_lock("catalog").wait(Duration::from_secs(10)).await?;
    /// // ... rewrite the catalog with writer.fence() ...
    /// let reader = writer.downgrade().await?; // now one reader among many, no gap
    /// // ... read it back, as others may now ...
    /// reader.release().await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock); a minimum hold is refused ([`LockError::Refused`]).
    pub fn read_lock(&self, name: impl AsRef<[u8]>) -> LockBuilder<'_, B> {
        let mut builder = self.lock_resource(ResourceDigest::of(name));
        builder.rw = Some(RwMode::Read);
        builder
    }

    /// Prepares the write side of the read/write lease on `name`: held by one writer while
    /// no reader holds the read side. Its fence is new, larger than every earlier writer's.
    /// [`LeaseGuard::downgrade`] turns it into a reader without a gap; a reader is never
    /// upgraded ([`LeaseGuard::upgrade`] says why).
    ///
    /// # Errors
    ///
    /// As [`read_lock`](Self::read_lock).
    pub fn write_lock(&self, name: impl AsRef<[u8]>) -> LockBuilder<'_, B> {
        let mut builder = self.lock_resource(ResourceDigest::of(name));
        builder.rw = Some(RwMode::Write);
        builder
    }

    /// Prepares one permit of the counting semaphore of `capacity` on `name`; `.await` it for
    /// a [`LeaseGuard`] whose [`slot`](LeaseGuard::slot) is the permit's.
    ///
    /// At most `capacity` permits are held at once. Each permit is a lease on one of the
    /// semaphore's slots, with its own fence (fences grow across the whole semaphore), kept
    /// alive by the watchdog and lost — with the signal before anyone else can be given the
    /// slot — like a lease. Waiters (with [`wait`](LockBuilder::wait)) are served first come,
    /// first served across processes; see [the semaphore guide](crate::lock#semaphores).
    /// The builder is the one [`lock`](Self::lock) gives, with the same options.
    ///
    /// ```no_run
    /// # async fn export(_slot: u32, _fence: leasehold::FenceToken) {}
    /// # async fn demo<B: leasehold::LeaseBackend>(client: leasehold::LeaseClient<B>) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    ///
    /// let permit = client
    ///     .semaphore("exports", 8) // at most 8 exports at once
    ///     .wait(Duration::from_secs(30))
    ///     .await?;
    /// let slot = permit.slot().expect("a permit has a slot");
    /// export(slot, permit.fence()).await; // writes carry the slot and the fence
    /// permit.release().await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), and [`LockError::CapacityMismatch`] when the semaphore
    /// recorded another capacity (nothing was written), and [`LockError::Refused`] for a
    /// capacity of 0 or above [`MAX_CAPACITY`](crate::request::MAX_CAPACITY).
    ///
    /// # Cancel safety
    ///
    /// As [`lock`](Self::lock); a dropped wait also gives its place in the queue back.
    pub fn semaphore(&self, name: impl AsRef<[u8]>, capacity: u32) -> LockBuilder<'_, B> {
        let mut builder = self.lock_resource(ResourceDigest::of(name));
        builder.capacity = Some(capacity);
        builder
    }

    /// Hands a lease taken with the explicit API ([`acquire`](Self::acquire)) to the
    /// client's watchdog and returns its [`LeaseGuard`]: kept alive from now on, released on
    /// [`LeaseGuard::release`] or in the background on drop.
    ///
    /// For callers that want every outcome of the acquire, but the guard's keep-alive and
    /// release after it (as `leasehold run` does).
    ///
    /// # Errors
    ///
    /// [`LockError::Refused`] when the watchdog cannot keep the lease (it is full or
    /// overloaded, or the lease's TTL is too short for its schedule). The lease has then been released: a lease
    /// nobody renews is never handed out.
    pub async fn guard(&self, handle: LeaseHandle<B>) -> Result<LeaseGuard<B>, LockError> {
        match self.watchdog().keep(handle) {
            Ok(kept) => Ok(LeaseGuard::new(kept, self.clone())),
            Err(not_kept) => {
                let (error, handle) = not_kept.into_parts();
                let _ = handle.release().await;
                Err(LockError::Refused(error))
            }
        }
    }

    /// Runs `work` under a lease on `name` of `ttl`, taken without waiting: a shorthand for
    /// `self.lock(name).ttl(ttl).run(work)` (see [`LockBuilder::run`]).
    ///
    /// # Errors
    ///
    /// As [`LockBuilder::run`].
    ///
    /// # Cancel safety
    ///
    /// As [`LockBuilder::run`].
    pub async fn run<T, F, Fut>(
        &self,
        name: impl AsRef<[u8]>,
        ttl: Duration,
        work: F,
    ) -> Result<T, RunError<T>>
    where
        F: FnOnce(HeldLease<B>) -> Fut,
        Fut: Future<Output = T>,
    {
        self.lock(name).ttl(ttl).run(work).await
    }
}
