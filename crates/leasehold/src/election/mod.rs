//! Leader election on a lease: campaign, observe, resign.
//!
//! An [`Election`] is a lease on a name, taken with the one-call layer
//! ([`LeaseClient::lock`]) under the purpose `election`. A [`Candidate`] campaigns for it; the
//! one that gets it leads for a term, whose number is the grant's fence — strictly increasing
//! across leaders, so the leader can fence every write it makes with it. While it leads, the
//! client's watchdog keeps the lease alive, and the leadership's signal fires, with the
//! reason, *before* the lease could be granted to another candidate: a leader that stops
//! when it fires never overlaps the next one.
//!
//! - [`Candidate::campaign`] waits until this candidate leads; [`Leadership::resign`] steps
//!   down at once, and the next candidate takes over through the release notice that wakes
//!   waiters (sub-millisecond), not after a TTL.
//! - [`Candidate::run_until`] campaigns, leads, and campaigns again after every term, until
//!   told to stop; then it resigns.
//! - [`Election::leader`] reads who leads now, and [`Election::observe`] follows every change,
//!   woken by the release notices and the leader's expiry.

mod leadership;
mod observe;

pub use leadership::Leadership;
pub use observe::{Leader, LeaderWatch, ObserveError};

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::backend::LeaseBackend;
use crate::client::LeaseClient;
use crate::error::{Error, ErrorKind};
use crate::id::{HolderName, Purpose, ResourceDigest};
use crate::lock::{HeldLease, LockError};
use crate::request::MAX_WAIT;
use crate::retry::Backoff;

/// The purpose under which elections take their lease unless [`Election::purpose`] says
/// otherwise: an election named like a lock never excludes that lock.
pub const ELECTION_PURPOSE: &str = "election";

/// The TTL of an election's lease unless [`Election::ttl`] says otherwise: how long a
/// leader that dies without resigning keeps the others waiting (client-go's default
/// `LeaseDuration`). It is renewed every third of it.
pub const DEFAULT_ELECTION_TTL: Duration = Duration::from_secs(15);

/// An election for one name: candidates campaign for it, anyone can observe it.
///
/// Made by [`LeaseClient::election`]; cheap to clone.
pub struct Election<B: LeaseBackend> {
    client: LeaseClient<B>,
    resource: ResourceDigest,
    purpose: Purpose,
    ttl: Duration,
}

impl<B: LeaseBackend> Clone for Election<B> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            resource: self.resource.clone(),
            purpose: self.purpose.clone(),
            ttl: self.ttl,
        }
    }
}

impl<B: LeaseBackend> fmt::Debug for Election<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("resource", &self.resource)
            .field("purpose", &self.purpose)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl<B: LeaseBackend> LeaseClient<B> {
    /// Prepares the election for `name`: campaign for it with [`Election::candidate`],
    /// observe it with [`Election::leader`] and [`Election::observe`].
    ///
    /// The name is hashed ([`ResourceDigest::of`]): it never reaches the server. Every
    /// process that names the same election with the same purpose takes part in the same
    /// one, on every topology.
    ///
    /// ```no_run
    /// # async fn demo<B: leasehold::LeaseBackend>(client: leasehold::LeaseClient<B>) -> Result<(), Box<dyn std::error::Error>> {
    /// use leasehold::HolderName;
    ///
    /// let election = client.election("scheduler");
    /// let me = election.candidate(HolderName::new("host-3")?);
    /// let leadership = me.campaign().await?; // waits until this candidate leads
    /// let term = leadership.term(); // fence every write with it
    /// # let _ = term;
    /// leadership.resign().await;
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: impl AsRef<[u8]>) -> Election<B> {
        Election {
            client: self.clone(),
            resource: ResourceDigest::of(name),
            purpose: Purpose::new(ELECTION_PURPOSE)
                .unwrap_or_else(|_| unreachable!("`election` is a valid purpose")),
            ttl: DEFAULT_ELECTION_TTL,
        }
    }
}

impl<B: LeaseBackend> Election<B> {
    /// Sets the TTL of a leader's lease (default 15 s): how long a leader that dies without
    /// resigning keeps the others out. Every candidate of one election should use the same.
    /// A TTL the watchdog cannot keep is refused when a candidate campaigns, before any I/O.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the purpose (default `election`).
    pub fn with_purpose(mut self, purpose: Purpose) -> Self {
        self.purpose = purpose;
        self
    }

    /// Returns the TTL of a leader's lease.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Returns the digest of the election's name, as stored on the server.
    pub fn resource(&self) -> &ResourceDigest {
        &self.resource
    }

    /// Returns the purpose the election's lease is taken under.
    pub fn purpose(&self) -> &Purpose {
        &self.purpose
    }

    /// Returns a candidate that campaigns under `name`: the holder name stored with its
    /// grant, which observers see ([`Leader::name`]). Never the owner token.
    pub fn candidate(&self, name: HolderName) -> Candidate<B> {
        Candidate {
            election: self.clone(),
            name,
        }
    }

    pub(crate) fn client(&self) -> &LeaseClient<B> {
        &self.client
    }
}

/// One candidate of an [`Election`], under its holder name.
pub struct Candidate<B: LeaseBackend> {
    election: Election<B>,
    name: HolderName,
}

impl<B: LeaseBackend> Clone for Candidate<B> {
    fn clone(&self) -> Self {
        Self {
            election: self.election.clone(),
            name: self.name.clone(),
        }
    }
}

impl<B: LeaseBackend> fmt::Debug for Candidate<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Candidate")
            .field("election", &self.election)
            .field("name", &self.name)
            .finish()
    }
}

impl<B: LeaseBackend> Candidate<B> {
    /// Returns the candidate's holder name.
    pub fn name(&self) -> &HolderName {
        &self.name
    }

    /// Returns the election this candidate campaigns in.
    pub fn election(&self) -> &Election<B> {
        &self.election
    }

    /// Waits, as long as it takes, until this candidate leads, and returns its
    /// [`Leadership`]. Contention is waited out (woken by the leader's release notice or
    /// expiry); a server that cannot be reached, or a try whose outcome stayed unknown, is
    /// retried with backoff.
    ///
    /// # Errors
    ///
    /// Only [`LockError::Refused`]: the election's TTL was refused before any I/O, or the
    /// watchdog could not keep the lease (it was then released).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future never leaves a lease nobody knows about (as [`LeaseClient::lock`]).
    pub async fn campaign(&self) -> Result<Leadership<B>, LockError> {
        let mut backoff = Backoff::new();
        loop {
            match self.campaign_round(MAX_WAIT).await {
                Ok(leadership) => return Ok(leadership),
                Err(refused @ LockError::Refused(_)) => return Err(refused),
                // Another candidate leads: the next round comes soon.
                Err(LockError::Contended(_)) => {
                    backoff.reset();
                    backoff.pause(None).await;
                }
                Err(_) => backoff.pause(None).await,
            }
        }
    }

    /// Campaigns for at most `wait` (at most [`MAX_WAIT`]).
    ///
    /// # Errors
    ///
    /// [`LockError::Contended`] when another candidate still leads at the deadline (with
    /// who, under which term); otherwise as [`LeaseClient::lock`] with a wait.
    ///
    /// # Cancel safety
    ///
    /// As [`campaign`](Self::campaign).
    pub async fn campaign_within(&self, wait: Duration) -> Result<Leadership<B>, LockError> {
        if wait > MAX_WAIT {
            return Err(LockError::Refused(Error::new(
                ErrorKind::InvalidWaitTimeout,
                format!("a campaign waits at most {MAX_WAIT:?}, not {wait:?}"),
            )));
        }
        self.campaign_round(wait).await
    }

    async fn campaign_round(&self, wait: Duration) -> Result<Leadership<B>, LockError> {
        let election = &self.election;
        let guard = election
            .client
            .lock_resource(election.resource.clone())
            .purpose(election.purpose.clone())
            .ttl(election.ttl)
            .wait(wait)
            .holder_name(self.name.clone())
            .await?;
        Ok(Leadership::new(guard))
    }

    /// Leads whenever it can, until `stop` completes: campaigns, runs `lead` for the term,
    /// and campaigns again when the term ends — by a loss (the signal fired; `lead` is
    /// cancelled then, before the lease could be granted to another), or because `lead`
    /// returned (the candidate then resigns, and the others get their turn). When `stop`
    /// completes, `lead` is cancelled, the candidate resigns (the release is awaited) and
    /// `run_until` returns.
    ///
    /// `lead` gets a [`HeldLease`] whose fence is the term.
    ///
    /// # Errors
    ///
    /// As [`campaign`](Self::campaign): only a refusal before any I/O.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future cancels `lead` and resigns in the background (see
    /// [`LeaseClient::settle`]); prefer `stop` for a shutdown that waits for the release.
    pub async fn run_until<S, F, Fut>(&self, stop: S, mut lead: F) -> Result<(), LockError>
    where
        S: Future<Output = ()>,
        F: FnMut(HeldLease<B>) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut stop = std::pin::pin!(stop);
        loop {
            let leadership = tokio::select! {
                biased;
                () = &mut stop => return Ok(()),
                leadership = self.campaign() => leadership?,
            };
            let held = leadership.held();
            let signal = held.signal().clone();
            let stopped = tokio::select! {
                // A loss seen together with anything else wins: the work stops at once.
                biased;
                _ = signal.lost() => false,
                () = &mut stop => true,
                () = lead(held) => false,
            };
            let _ = leadership.resign().await;
            if stopped {
                return Ok(());
            }
        }
    }
}
