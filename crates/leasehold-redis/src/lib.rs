//! Redis backend for [`leasehold`]: leases with fencing tokens, in four Lua scripts, on a
//! standalone server, behind Sentinel or on a Cluster, picked from one URL.
//!
//! # One call: `lock`, `run`, `election`
//!
//! Open a backend from a URL ([`RedisBackend::open`]: `redis://`, `rediss://`,
//! `redis+sentinel://…/service`, `redis+cluster://…`) and make its client, a [`RedisLeases`].
//! [`lock`](leasehold::LeaseClient::lock) takes a lease and keeps it alive; the
//! [`LeaseGuard`](leasehold::LeaseGuard) it gives has the grant's
//! [`fence`](leasehold::LeaseGuard::fence) for every write, a
//! [`lost`](leasehold::LeaseGuard::lost) future that fires — with the reason — before the
//! lease could be granted to anyone else, and a typed
//! [`release`](leasehold::LeaseGuard::release):
//!
//! ```no_run
//! # async fn write_orders(_fence: leasehold_redis::leasehold::FenceToken) {}
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use leasehold_redis::{RedisBackend, RedisSettings};
//!
//! let client = RedisBackend::open("redis://127.0.0.1:6379", RedisSettings::default())?.into_client();
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
//! [`run`](leasehold::LeaseClient::run) (or [`LockBuilder::run`](leasehold::LockBuilder::run))
//! runs work under a lease and cancels it if the lease is lost; a minimum hold makes a
//! run-once job run once across hosts. [`election`](leasehold::LeaseClient::election) is a
//! leader election on the same lease, whose term is the grant's fence:
//!
//! ```no_run
//! # async fn report(_fence: leasehold_redis::leasehold::FenceToken) -> u64 { 0 }
//! # async fn schedule(_term: leasehold_redis::leasehold::FenceToken) {}
//! # async fn demo(client: leasehold_redis::RedisLeases) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use leasehold_redis::leasehold::HolderName;
//!
//! let outcome = client
//!     .lock("nightly-report")
//!     .ttl(Duration::from_secs(60))
//!     .min_hold(Duration::from_secs(10 * 60))
//!     .run(|lease| report(lease.fence()))
//!     .await;
//! match outcome {
//!     Ok(rows) => println!("ran: {rows} rows"),
//!     Err(e) if e.is_contended() => println!("another host ran it"),
//!     Err(e) => return Err(e.into()),
//! }
//!
//! let me = client
//!     .election("scheduler")
//!     .with_ttl(Duration::from_secs(15))
//!     .candidate(HolderName::new("replica-2")?);
//! let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
//! me.run_until(shutdown, |term| async move { schedule(term.fence()).await }).await?;
//! # Ok(()) }
//! ```
//!
//! # Examples
//!
//! Runnable programs in this crate's `examples/` directory, each run in CI against a real
//! redis-server, with `cargo run -p leasehold-redis --example <name>` against
//! `$LEASEHOLD_REDIS_URL` (default `redis://127.0.0.1:6379`):
//!
//! - `run_once`: a job every host fires (from cron, say) and one of them runs, with a minimum
//!   hold;
//! - `exclusive_worker`: three workers take turns on a queue, kept alive past their TTL, and
//!   stop the moment their lease is lost;
//! - `fenced_sqlite`: a stale holder's fenced write changes no row;
//! - `election`: three candidate processes; the leader is killed, another takes over, and the
//!   dead leader's term is refused as stale;
//! - `metrics` (feature `metrics`): Prometheus text on `127.0.0.1:9898/metrics`.
//!
//! The repository's `docs/guide.md` is the library guide; `docs/operating-redis.md` says how
//! to set Redis up for leases.
//!
//! # The explicit API
//!
//! Everything the one-call layer does is built from an attempt, a request and an acquire,
//! for callers who need every outcome:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use leasehold_redis::leasehold::{AcquireOutcome, OperationId, Purpose, ResourceDigest};
//! use leasehold_redis::{RedisBackend, RedisSettings};
//!
//! let client = RedisBackend::open("redis://127.0.0.1:6379", RedisSettings::default())?.into_client();
//! let attempt = client.new_attempt(OperationId::new("job-1")?)?;
//! let request = client.request(
//!     Purpose::new("reports")?,
//!     ResourceDigest::of("monthly-report"),
//!     attempt,
//!     Duration::from_secs(10),
//! )?;
//! if let AcquireOutcome::Acquired(lease) = client.try_acquire(&request).await {
//!     println!("fence {}", lease.fence());
//!     let _ = lease.release().await;
//! }
//! # Ok(()) }
//! ```
//!
//! # What the backend does
//!
//! [`RedisBackend`] implements the [`leasehold::LeaseBackend`] port on one Redis deployment: a
//! standalone server ([`RedisBackend::open`]), a master found through Sentinel
//! ([`RedisBackend::open_sentinel`]) or a Cluster ([`RedisBackend::open_cluster`]), over TCP or
//! TLS (feature `tls`), optionally gating grants on replication
//! ([`RedisSettings::with_replication`]). With feature `serde`, `RedisConfig` reads the same
//! from a configuration file.
//! Each operation is one script run by EVALSHA (one round trip once the scripts are cached),
//! atomic on the server. Acquire increments a per-resource fence counter on every new grant and
//! stores the fence with the lease; renew and release act only on the exact grant. A counter
//! expires once idle ([`RedisSettings::with_counter_idle_expiry`], 7 days by default): fences
//! never go below the server's clock, so the next one is higher without it.
//!
//! Every Redis error is mapped into the port's vocabulary: refused before running (READONLY,
//! LOADING, BUSY, MASTERDOWN, NOPERM, OOM, …) or never sent (no connection) is `Unavailable`;
//! anything that may have run (a response timeout, a connection dropped after sending, an
//! error inside a script, an unreadable reply) is `Indeterminate`.
//!
//! This is not a quorum lock (Redlock): it runs on one Redis lineage, and a failover that loses
//! writes can grant a lease twice and reissue a fence. The library guide (`docs/guide.md`)
//! says what each guarantee covers.
//!
//! # Layout
//!
//! - `lua/`: the scripts, each opening with its contract (KEYS, ARGV, replies);
//! - [`keys`]: the key layout;
//! - [`fenced`]: fenced writes, the effect point that rejects a stale holder's data;
//! - [`settings`]: timeouts, limits, namespace;
//! - [`Error`]: what can go wrong while setting a backend up (`error.rs`);
//! - internal: `topology` makes a backend for each topology (standalone, Sentinel, Cluster,
//!   TLS); `backend` implements the port; `scripts` holds one typed call per script, its
//!   KEYS and ARGV written once; `link` owns the connection and the EVALSHA path; `notices`
//!   runs release notices (one subscriber per backend); `classify` maps Redis errors,
//!   `decode` reads replies and `eviction` checks the server's eviction policy.

#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![forbid(unsafe_code)]

pub use leasehold;
pub use redis;

mod admin;
mod backend;
mod batch;
mod classify;
mod clients;
#[cfg(feature = "serde")]
mod config;
mod decode;
mod direct;
mod error;
mod eviction;
pub mod fenced;
pub mod keys;
mod link;
mod notices;
mod renewals;
mod scripts;
mod sentinels;
pub mod settings;
mod telemetry;
#[cfg(test)]
mod testing;
mod topology;
mod url;

pub use admin::{
    CapacityChange, HeldPermit, ListedLease, ListedSemaphore, ListedSemaphoreState, ListedState,
    SemaphoreView,
};
pub use backend::{RedisBackend, RedisLeases};
#[cfg(feature = "serde")]
pub use config::RedisConfig;
pub use error::{Error, ErrorKind};
pub use fenced::{FencedWrite, RecordName};
pub use keys::{KeyLayout, SemaphoreKeys};
pub use settings::{RedisSettings, ReplicationGate, Transport};

/// The README's examples compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}

/// The library guide's examples (`docs/guide.md`) compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/guide.md")]
mod guide {}
