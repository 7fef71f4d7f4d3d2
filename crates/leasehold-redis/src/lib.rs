//! Redis backend for [`leasehold`]: leases with fencing tokens, in four Lua scripts.
//!
//! [`RedisBackend`] implements the [`leasehold::LeaseBackend`] port on one Redis deployment: a
//! standalone server ([`RedisBackend::open`]), a master found through Sentinel
//! ([`RedisBackend::open_sentinel`]) or a Cluster ([`RedisBackend::open_cluster`]), over TCP or
//! TLS (feature `tls`), optionally gating grants on replication
//! ([`RedisSettings::with_replication`]).
//! Each operation is one script run by EVALSHA (one round trip once the scripts are cached),
//! atomic on the server. Acquire increments a per-resource fence counter on every new grant and
//! stores the fence with the lease; renew and release act only on the exact grant.
//!
//! Every Redis error is mapped into the port's vocabulary: refused before running (READONLY,
//! LOADING, BUSY, MASTERDOWN, NOPERM, OOM, …) or never sent (no connection) is `Unavailable`;
//! anything that may have run (a response timeout, a connection dropped after sending, an
//! error inside a script, an unreadable reply) is `Indeterminate`.
//!
//! This is not a quorum lock (Redlock): it runs on one Redis lineage, and a failover that loses
//! writes can grant a lease twice and reissue a fence. See the README for what each guarantee
//! covers.
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

pub use admin::{ListedLease, ListedState};
pub use backend::{RedisBackend, RedisLeases};
#[cfg(feature = "serde")]
pub use config::RedisConfig;
pub use error::{Error, ErrorKind};
pub use fenced::{FencedWrite, RecordName};
pub use keys::KeyLayout;
pub use settings::{RedisSettings, ReplicationGate, Transport};

/// The README's examples compile as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}
