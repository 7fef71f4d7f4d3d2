//! Who leads an election, read once or followed as it changes.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::Election;
use crate::backend::LeaseBackend;
use crate::fence::FenceToken;
use crate::id::HolderName;
use crate::outcome::{Indeterminate, InspectOutcome, LeaseView, Unavailable};

/// The first pause before looking again for a new leader while there is none; it doubles up
/// to a quarter of the election's TTL. Reset by every release notice.
const FIRST_LOOK_AGAIN: Duration = Duration::from_millis(1);

/// How long past the leader's expiry on the server a watch looks again: the key is gone by
/// then unless it was renewed.
const PAST_EXPIRY: Duration = Duration::from_millis(1);

/// The leader of an election, as the server stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's term: its grant's fence, strictly increasing across leaders.
    pub term: FenceToken,
    /// The holder name the leader campaigned under.
    pub name: Option<HolderName>,
    /// How long the leader's lease lives on the server unless it is renewed (its `PTTL`).
    pub remaining: Option<Duration>,
}

impl fmt::Display for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(name) => write!(f, "{:?}", name.as_str())?,
            None => f.write_str("an unnamed candidate")?,
        }
        write!(f, ", term {}", self.term)
    }
}

/// Why the leader could not be read. Nothing is changed by a failed read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ObserveError {
    /// The read was sent and no reply came.
    #[error("no answer: {0}")]
    Indeterminate(Indeterminate),
    /// The backend could not be reached (or the key is not a lease).
    #[error("{0}")]
    Unavailable(Unavailable),
    /// Refused locally (the in-flight limit).
    #[error("too many commands in flight")]
    Overloaded,
    /// The election's key holds a grant whose term cannot be read.
    #[error("the leader's term cannot be read")]
    Unreadable,
}

/// What an inspection says of the election: `None` when nobody leads.
fn leader_of(view: LeaseView) -> Result<Option<Leader>, ObserveError> {
    if view.released {
        // The leader resigned; the key waits out a minimum hold with nobody holding it.
        return Ok(None);
    }
    let term = view.fence.ok_or(ObserveError::Unreadable)?;
    Ok(Some(Leader {
        term,
        name: view.holder_name,
        remaining: view.server_ttl,
    }))
}

/// What an inspection's outcome says of the election.
fn read_leader(outcome: InspectOutcome) -> Result<Option<Leader>, ObserveError> {
    match outcome {
        InspectOutcome::Free => Ok(None),
        InspectOutcome::HeldByOther(view) | InspectOutcome::HeldByThisAttempt(view) => {
            leader_of(view)
        }
        InspectOutcome::Indeterminate(i) => Err(ObserveError::Indeterminate(i)),
        InspectOutcome::Unavailable(u) => Err(ObserveError::Unavailable(u)),
        InspectOutcome::Overloaded => Err(ObserveError::Overloaded),
    }
}

impl<B: LeaseBackend> Election<B> {
    /// Reads who leads now: `None` when nobody does. One round trip.
    ///
    /// # Errors
    ///
    /// An [`ObserveError`] when the server could not say.
    pub async fn leader(&self) -> Result<Option<Leader>, ObserveError> {
        read_leader(
            self.client()
                .inspect(self.purpose(), self.resource(), None)
                .await,
        )
    }

    /// [`leader`](Self::leader), by a watch that then waits for the leader's release notice:
    /// the backend makes sure that the leader's resignation is announced.
    async fn leader_watched(&self) -> Result<Option<Leader>, ObserveError> {
        read_leader(
            self.client()
                .inspect_watched(self.purpose(), self.resource())
                .await,
        )
    }

    /// Follows the leader: [`LeaderWatch::next`] returns the leader now, then every change of
    /// leader (a new term, or nobody).
    ///
    /// The watch reads the leader when a release notice says the leader resigned, when the
    /// leader's lease would expire on the server unless renewed, and — while nobody leads —
    /// at growing intervals up to a quarter of the TTL. It never reads faster than that, so a
    /// term shorter than one read may be seen only as its successor; every term that lasts
    /// longer is seen, in order.
    pub fn observe(&self) -> LeaderWatch<B> {
        let watch = self
            .client()
            .backend()
            .watch(self.purpose(), self.resource());
        LeaderWatch {
            election: self.clone(),
            notify: watch.notify().cloned(),
            last: None,
            look_again: FIRST_LOOK_AGAIN,
        }
    }
}

/// A follower of an election's leader, made by [`Election::observe`].
pub struct LeaderWatch<B: LeaseBackend> {
    election: Election<B>,
    notify: Option<Arc<tokio::sync::Notify>>,
    // The term last returned (`Some(None)`: nobody led); `None` before the first `next`.
    last: Option<Option<FenceToken>>,
    look_again: Duration,
}

impl<B: LeaseBackend> fmt::Debug for LeaderWatch<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderWatch")
            .field("election", &self.election)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl<B: LeaseBackend> LeaderWatch<B> {
    /// Waits for the next change of leader and returns it (`None`: nobody leads); the first
    /// call returns the leader now.
    ///
    /// # Errors
    ///
    /// An [`ObserveError`] when a read failed; the watch is unchanged, so call `next` again
    /// to go on (after a pause of your choosing).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a change not yet returned is returned by the next call.
    pub async fn next(&mut self) -> Result<Option<Leader>, ObserveError> {
        let never = tokio::sync::Notify::new();
        loop {
            let notify = self.notify.as_deref().unwrap_or(&never);
            // Subscribed before the read: a release landing during it still wakes us.
            let released = notify.notified();
            let mut released = std::pin::pin!(released);
            released.as_mut().enable();
            let leader = self.election.leader_watched().await?;
            let term = leader.as_ref().map(|l| l.term);
            if self.last != Some(term) {
                self.last = Some(term);
                self.look_again = FIRST_LOOK_AGAIN;
                return Ok(leader);
            }
            let pause = match &leader {
                // Looked at again when the lease would expire unless renewed.
                Some(leader) => leader.remaining.unwrap_or(self.election.ttl()) + PAST_EXPIRY,
                None => {
                    let pause = self.look_again;
                    self.look_again = (pause * 2).min(self.election.ttl() / 4).max(pause);
                    pause
                }
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = released => self.look_again = FIRST_LOOK_AGAIN,
            }
        }
    }
}
