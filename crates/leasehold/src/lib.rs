//! Distributed leases with typed certainty, conservative validity and fencing tokens.
//!
//! `leasehold` is the provider-neutral half of a lease library: the identities, requests,
//! outcomes and the lease handle's state machine, with no server in its dependency graph.
//! `leasehold-redis` implements the [`LeaseBackend`] port on Redis and re-exports this crate;
//! a program depends on `leasehold-redis`, whose client is a [`LeaseClient`] like the one
//! below.
//!
//! # One call: `lock`, `run`, `election`
//!
//! [`LeaseClient::lock`] takes a lease on a name, keeps it alive with the client's
//! [`Watchdog`], and gives a [`LeaseGuard`]: its [`fence`](LeaseGuard::fence) goes with every
//! write, its [`lost`](LeaseGuard::lost) future fires — with the reason — before the lease
//! could be granted to anyone else, and [`release`](LeaseGuard::release) says, typed, how the
//! release went (dropping the guard releases in the background).
//!
//! ```no_run
//! # async fn write_orders(_fence: leasehold::FenceToken) {}
//! # async fn demo<B: leasehold::LeaseBackend>(client: leasehold::LeaseClient<B>) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//!
//! let guard = client
//!     .lock("orders/42")
//!     .ttl(Duration::from_secs(30))
//!     .wait(Duration::from_secs(10))
//!     .await?;
//! tokio::select! {
//!     () = write_orders(guard.fence()) => {}               // every write carries the fence
//!     reason = guard.lost() => eprintln!("stopped: {reason}"),
//! }
//! println!("{}", guard.release().await);                 // a typed ReleaseOutcome
//! # Ok(()) }
//! ```
//!
//! [`LeaseClient::run`] (or [`LockBuilder::run`]) runs work under a lease, cancels it if the
//! lease is lost, and says how it fell short ([`RunError`]: not acquired, lost, finished but
//! uncovered, not released). [`LeaseClient::election`] is a leader election on the same
//! lease, whose term is the grant's fence ([`Candidate::run_until`], [`Leadership`]):
//!
//! ```no_run
//! # async fn report(_fence: leasehold::FenceToken) -> u64 { 0 }
//! # async fn schedule(_term: leasehold::FenceToken) {}
//! # async fn demo<B: leasehold::LeaseBackend>(client: leasehold::LeaseClient<B>) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use leasehold::HolderName;
//!
//! match client.run("nightly-report", Duration::from_secs(60), |lease| report(lease.fence())).await {
//!     Ok(rows) => println!("ran: {rows} rows"),
//!     Err(e) if e.is_contended() => println!("another host ran it"),
//!     Err(e) => return Err(e.into()),
//! }
//!
//! let me = client.election("scheduler").candidate(HolderName::new("replica-2")?);
//! let shutdown = std::future::pending::<()>(); // or a Ctrl-C future: resigns when it completes
//! me.run_until(shutdown, |term| async move { schedule(term.fence()).await }).await?;
//! # Ok(()) }
//! ```
//!
//! Runnable programs against a real Redis are in `leasehold-redis`'s `examples/` directory:
//! `run_once` (a job that runs once across hosts), `exclusive_worker` (workers that take
//! turns, kept alive past their TTL), `fenced_sqlite` (a stale holder's write changes no row),
//! `election` (three candidate processes, the leader killed) and `metrics` (Prometheus).
//! `docs/guide.md` in the repository is the library guide.
//!
//! # What a lease is
//!
//! A *lease* is not a lock. It reduces duplicate work: while clocks and the network behave,
//! one holder at a time does the work. A holder paused past its expiry can still wake and
//! write after someone else was granted the lease; only the [`FenceToken`] that every grant
//! carries, checked where the write lands ([`FenceGate`]), rejects that stale write. See
//! [`Guarantee`] for what is and is not covered.
//!
//! Three rules run through the API:
//!
//! - **Certainty is typed.** Every call returns what is known: applied, not applied, or
//!   unknown (`Indeterminate`, resolved by replaying or inspecting with the same [`Attempt`]).
//! - **Validity is conservative.** Counted from a monotonic clock read before the send, capped
//!   by the server's remaining TTL, minus a drift budget; see [`handle`].
//! - **Bad input is refused before any I/O** with an [`Error`].
//!
//! # The explicit API
//!
//! Everything the one-call layer does is built from these calls — an attempt, a request,
//! an acquire — for callers who need every outcome:
//!
//! ```no_run
//! # async fn demo<B: leasehold::LeaseBackend>(client: leasehold::LeaseClient<B>) -> Result<(), leasehold::Error> {
//! use std::time::Duration;
//! use leasehold::{AcquireOutcome, OperationId, Purpose, ResourceDigest};
//!
//! let attempt = client.new_attempt(OperationId::new("nightly-2026-12-02")?)?;
//! let request = client.request(
//!     Purpose::new("billing")?,
//!     ResourceDigest::of("invoice-run"),
//!     attempt,
//!     Duration::from_secs(30),
//! )?;
//! match client.try_acquire(&request).await {
//!     AcquireOutcome::Acquired(lease) | AcquireOutcome::Replayed(lease) => {
//!         // Pass lease.fence() to every write the work makes.
//!         let _ = lease.release().await;
//!     }
//!     AcquireOutcome::Indeterminate { .. } => { /* replay `request` to find out */ }
//!     _ => { /* not held: contended, unavailable or overloaded */ }
//! }
//! # Ok(()) }
//! ```
//!
//! A handle taken this way is kept alive with [`Watchdog::keep`] or [`Watchdog::run`], or
//! handed to [`LeaseClient::guard`] for a [`LeaseGuard`].
//!
//! # Layout
//!
//! - [`lock`]: the one-call layer (`lock`, `run`, guards);
//! - [`election`]: leader election on a lease: campaigns, terms, the leader's watch;
//! - [`id`]: operation ids, attempts and owner tokens, purposes, resource digests;
//! - [`request`]: lease requests and the drift budget;
//! - [`backend`]: the provider port, and the replies a provider gives (kept apart from the
//!   outcomes users see, which are re-exported here);
//! - [`client`]: acquire (once or waiting), inspect, and recovery: replaying an unknown
//!   acquire, cleaning up behind one given up on;
//! - [`handle`]: renew and release; validity and the state machine ([`LeaseState`]);
//! - [`outcome`]: the typed outcomes;
//! - [`fence`]: fencing tokens, guarantees and the effect-point rule;
//! - [`keepalive`]: the watchdog, loss signals and work run under a lease;
//! - [`telemetry`]: tracing and metrics;
//! - [`clock`]: the monotonic clock seam.
//!
//! The simulated server and backend that the tests run against live in the unpublished
//! `leasehold-sim` crate, so that nothing here knows Redis's keys or expiry rule.

#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]

pub mod backend;
pub mod client;
pub mod clock;
pub mod election;
pub mod error;
pub mod fence;
pub mod handle;
pub mod id;
pub mod keepalive;
pub mod lock;
pub mod outcome;
pub mod request;
mod retry;
mod state;
pub mod telemetry;

pub use backend::LeaseBackend;
pub use client::{Abandoned, AcquireOutcome, LeaseClient};
pub use clock::{BootClock, Clock, ManualClock, MonotonicInstant, TokioClock};
pub use election::{Candidate, Election, Leader, LeaderWatch, Leadership, ObserveError};
pub use error::{Error, ErrorKind};
pub use fence::{FenceGate, FenceToken, Guarantee, StaleFence};
pub use handle::{DowngradeOutcome, LeaseHandle};
pub use id::{
    Attempt, HolderFingerprint, HolderName, OperationId, OwnerToken, Purpose, ResourceDigest,
};
pub use keepalive::{
    KeepAliveSettings, KeptLease, LossReason, LossSignal, NotKept, Scoped, Uncovered, Watchdog,
};
pub use lock::{
    DowngradeError, HeldLease, LeaseGuard, LockBuilder, LockError, RunError, UpgradeRefused,
};
pub use outcome::{
    Contention, Failure, Indeterminate, IndeterminateCause, InspectOutcome, LeaseView, LossCause,
    ReleaseOutcome, RenewOutcome, Unavailable, UnavailableCause, UnusableKey,
};
pub use request::{DriftBudget, LeaseRequest, MAX_TTL, MAX_WAIT, MIN_TTL, RwMode};
pub use state::LeaseState;
