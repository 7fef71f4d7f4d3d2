//! A simulated lease server and backend for `leasehold`, random scenarios to drive them, and
//! the invariant checker: deterministic tests of the lease logic.
//!
//! [`SimServer`] keeps leases and fence counters in memory with exactly the semantics of the
//! Redis scripts (`leasehold-redis/lua/*.lua`): the same replies, the same fence rule, PTTLs in
//! whole milliseconds and Redis's expiry rule, on a virtual clock. [`SimBackend`] is one
//! client's connection to it, implementing the [`LeaseBackend`](leasehold::LeaseBackend) port,
//! with [`Fault`]s injected into its next calls. Server-wide faults (clock steps, a restart
//! without persistence, a failover that loses the last writes) are methods of the server.
//!
//! On top of them, [`scenario`] draws random [`Step`]s with proptest, a [`World`] runs them
//! over any backend (so the same steps also run against real redis-server), and the checker in
//! [`checker`] says which [`Invariant`] a [`SimWorld`] broke, after which step, and what it saw.
//!
//! It is a crate of its own, as `tokio-test` is beside `tokio`, so that the provider-neutral
//! `leasehold` knows nothing of Redis keys or expiry and carries no test-only feature: its own
//! tests, the Redis adapter's differential test and the CLI's unit tests take this crate as a
//! dev-dependency.
//!
//! # Testing your own code
//!
//! It is also the test kit for code that uses leasehold: write the code that takes leases
//! generic over the backend (`async fn job<B: LeaseBackend>(client: &LeaseClient<B>)`; the
//! Redis client `leasehold_redis::RedisLeases` is a `LeaseClient<RedisBackend>`), and its tests
//! run it on a [`SimServer`] instead of Redis, as a dev-dependency:
//!
//! ```toml
//! [dev-dependencies]
//! leasehold-sim = { path = "<checkout>/crates/leasehold-sim" }
//! tokio = { version = "1", features = ["macros", "rt", "test-util"] }
//! ```
//!
//! Under `#[tokio::test(start_paused = true)]`, with the server and every client on one
//! [`TokioClock`](leasehold::TokioClock) ([`SimServer::with_clock`]), time is virtual: a test of
//! a 30-second job runs in milliseconds, and every instant is exact. Faults come on demand:
//!
//! - a lost reply or request, a late or delayed one, on one client's next calls
//!   ([`SimBackend::inject`], [`SimBackend::inject_many`] with a [`Fault`]): many lost requests
//!   in a row are a network cut, and past the TTL the lease is the next taker's;
//! - a failover that loses the last writes ([`SimServer::failover`]): a holder whose grant the
//!   new master does not hold is told `LossReason::MasterReplaced`, as on Redis Sentinel;
//! - a restart without persistence ([`SimServer::restart`]), a stepped server clock
//!   ([`SimServer::step_clock`]), a key deleted by hand ([`SimServer::delete`]).
//!
//! `tests/testing_your_code.rs` in this crate is such a test, written as a user writes one: a
//! job that posts rows under a lease, checked through a cut past its TTL while another worker
//! takes over and through a failover; and the same check run on a job that ignores the loss
//! signal, which fails.
//!
//! The world clock is one of two kinds:
//!
//! - a [`ManualClock`](leasehold::ManualClock) ([`SimServer::new`]), moved only by
//!   [`SimServer::advance`] and by the faults themselves. Every future here then completes on
//!   its first poll ([`run_now`]): nothing waits, and a whole scenario runs in one synchronous
//!   step function.
//! - a clock that moves by itself ([`SimServer::with_clock`]), meant to be
//!   [`TokioClock`](leasehold::TokioClock) under `#[tokio::test(start_paused = true)]`. Time
//!   then passes as tokio's does: a lost request or reply makes the call wait out its command
//!   timeout with `tokio::time::sleep`, a delay sleeps, and a late request lands when the clock
//!   gets there. This is what lets the keep-alive watchdog, which sleeps on tokio timers, run
//!   against the simulated server.
//!
//! A lost reply leaves the outcome unknown, and replaying the same attempt finds it:
//!
//! ```
//! use std::time::Duration;
//! use leasehold::{AcquireOutcome, LeaseClient, ManualClock, OperationId, Purpose, ResourceDigest};
//! use leasehold_sim::{Fault, SimServer, run_now};
//!
//! let clock = ManualClock::new();
//! let server = SimServer::new(clock.clone());
//! let client = LeaseClient::new(server.connect(Duration::from_millis(200))).with_clock(clock);
//! let attempt = client.new_attempt(OperationId::new("job-1")?)?;
//! let request = client.request(
//!     Purpose::new("demo")?,
//!     ResourceDigest::of("report"),
//!     attempt,
//!     Duration::from_secs(5),
//! )?;
//!
//! client.backend().inject(Fault::LoseReply);
//! let lost = run_now(client.try_acquire(&request));
//! assert!(matches!(lost, AcquireOutcome::Indeterminate { .. }));
//! let replayed = run_now(client.try_acquire(&request));
//! assert!(matches!(replayed, AcquireOutcome::Replayed(_)));
//! assert!(server.stored(request.purpose(), request.resource()).is_some());
//! # Ok::<(), leasehold::Error>(())
//! ```
//!
//! # Layout
//!
//! - [`server`]: the simulated server, its world clock, time passing, restarts, failovers and
//!   clock steps;
//! - [`backend`]: one client's connection, and the log of the requests it sent;
//! - [`fault`]: the faults a connection's next calls can suffer;
//! - [`oracle`]: what the server shows tests directly;
//! - [`immediate`]: [`run_now`], which completes a call on a manual clock without a runtime;
//! - inside: the keyspace and its expiry rule, the scripts' semantics, the server's state
//!   between requests (snapshots for lossy failovers, late requests, downtime);
//! - [`step`]: the step language of scenarios;
//! - [`scenario`]: the generator: modes, the proptest strategy, seeded runners;
//! - [`request_book`]: the requests a scenario makes, shared by the worlds that run it;
//! - [`world`]: running lease steps over any backend;
//! - [`signature`]: what a step did, independent of timing, and comparing runs by fence order;
//! - [`sim_world`]: the simulated world, and the steps that act on the server;
//! - [`invariant`]: the invariants, and the violations that report a broken one;
//! - [`checker`]: the invariant checker;
//! - [`scripted`]: a backend that models nothing and answers each call as the test scripted
//!   it ([`Scripted`]), for tests of the port's own logic.

#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]

pub mod backend;
pub mod checker;
pub mod fault;
pub mod immediate;
pub mod invariant;
mod keyspace;
pub mod oracle;
pub mod request_book;
pub mod scenario;
mod script;
pub mod scripted;
mod semaphore;
pub mod server;
pub mod signature;
pub mod sim_world;
mod state;
pub mod step;
mod units;
pub mod world;

pub use backend::{RequestKind, SentRequest, SimBackend};
pub use checker::run_sim;
pub use fault::Fault;
pub use immediate::run_now;
pub use invariant::{Evidence, Invariant, Violation};
pub use keyspace::ForeignValue;
pub use oracle::{NonOwnerSuccess, StoredGrant};
pub use request_book::RequestBook;
pub use scenario::Mode;
pub use scripted::{Call, Op, Scripted};
pub use server::SimServer;
pub use signature::{Signature, by_rank};
pub use sim_world::SimWorld;
pub use step::{FaultStep, Step};
pub use world::World;
