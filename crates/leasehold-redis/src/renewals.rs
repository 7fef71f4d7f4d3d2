//! Renewals sent together: the renewals of many leases that come due at once go to the server
//! as one run of `renew.lua`, up to [`MAX_BATCH`] grants each, instead of one command apiece.
//!
//! A renewal joins a queue. The one that finds the queue empty yields once, so that the others
//! started in the same turn (the watchdog starts every due renewal before it waits) can join,
//! then hands everything queued to a task of its own, which sends it and answers each
//! renewal; it hands it over even if it is dropped while it yields. Each renewal's outcome is its own, as if it had been sent alone: the script
//! renews each grant on its own, a lost reply leaves every renewal of that call unknown, and a
//! call never sent leaves each not applied. The handle read its clock before it called, so the
//! time spent queued only shortens the validity it counts, never lengthens it. Nothing is
//! sent later than it would have been: the queue waits for no timer.
//!
//! On a Cluster a script's keys must share a slot, so renewals there go one at a time.

use std::sync::{Arc, Mutex, PoisonError};

use leasehold::backend::{Grant, RenewReply};
use leasehold::{Failure, FenceToken, Indeterminate, IndeterminateCause, LossCause};
use tokio::sync::oneshot;

use crate::decode::unreadable;
use crate::link::Link;
use crate::scripts::{AttemptArg, GrantArg, RenewCall, RenewGrant};
use crate::settings::ReplicationGate;
use crate::settings::{not_replicated, replicated};

/// The most grants one call renews (Redisson renews up to 100 locks in one command).
pub(crate) const MAX_BATCH: usize = 100;

/// A renewal waiting to be sent. Holds the owner token: no `Debug`.
struct Pending {
    lease_key: String,
    owner_token: String,
    operation_id: String,
    fence: FenceToken,
    ttl_in_milliseconds: u64,
    /// The term the grant was made in.
    term: u64,
    reply: oneshot::Sender<RenewReply>,
}

/// The queue of renewals not yet handed to a sender.
#[derive(Default)]
pub(crate) struct Renewals {
    queue: Mutex<Vec<Pending>>,
}

impl Renewals {
    /// Renews `grant` (its lease key `lease_key`), in one call with whatever other renewals
    /// are started with it.
    pub(crate) async fn renew(
        &self,
        link: &Arc<Link>,
        gate: Option<ReplicationGate>,
        grant: &Grant,
        lease_key: String,
    ) -> RenewReply {
        let attempt = grant.attempt();
        let (reply, answer) = oneshot::channel();
        let leads = {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.push(Pending {
                lease_key,
                owner_token: attempt.owner_token().expose_secret().to_owned(),
                operation_id: attempt.operation().as_str().to_owned(),
                fence: grant.fence(),
                ttl_in_milliseconds: grant.ttl_millis(),
                term: grant.term(),
                reply,
            });
            queue.len() == 1
        };
        if leads {
            let flush = Flush {
                renewals: self,
                link,
                gate,
            };
            // Let the renewals started in this turn join the queue first.
            tokio::task::yield_now().await;
            drop(flush);
        }
        answer.await.unwrap_or_else(|_| {
            // The sender went away (its runtime is shutting down): it may have been sent.
            RenewReply::Failed(Failure::Indeterminate(Indeterminate::new(
                IndeterminateCause::ConnectionLost,
                "the batched renewal's sender stopped",
            )))
        })
    }
}

/// Hands everything queued to senders when dropped: when the renewal that leads has yielded,
/// or when it is dropped while it yields (a cancelled renewal). Either way the queue is sent,
/// or no renewal after it would ever lead again, and every one would wait for ever.
struct Flush<'a> {
    renewals: &'a Renewals,
    link: &'a Arc<Link>,
    gate: Option<ReplicationGate>,
}

impl Drop for Flush<'_> {
    fn drop(&mut self) {
        let queue = &self.renewals.queue;
        let queued = std::mem::take(&mut *queue.lock().unwrap_or_else(PoisonError::into_inner));
        // Outside a runtime nothing can be sent: the queued renewals are dropped, and each of
        // their callers is told its renewal's sender stopped (unknown, never "not renewed").
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut queued = queued.into_iter().peekable();
        while queued.peek().is_some() {
            let batch: Vec<Pending> = queued.by_ref().take(MAX_BATCH).collect();
            // A task of its own: a caller that stops waiting must not take the others'
            // renewals down with it.
            runtime.spawn(send(Arc::clone(self.link), self.gate, batch));
        }
    }
}

/// Sends one batch and answers each of its renewals.
async fn send(link: Arc<Link>, gate: Option<ReplicationGate>, batch: Vec<Pending>) {
    let call = RenewCall {
        grants: batch
            .iter()
            .map(|p| RenewGrant {
                lease_key: &p.lease_key,
                grant: GrantArg {
                    fence: Some(p.fence),
                    attempt: AttemptArg {
                        owner_token: &p.owner_token,
                        operation_id: &p.operation_id,
                    },
                },
                ttl_in_milliseconds: p.ttl_in_milliseconds,
            })
            .collect(),
    };
    let (replies, term) = run(&link, gate, &call).await;
    drop(call);
    for (pending, reply) in batch.into_iter().zip(replies) {
        // A renewal whose caller stopped waiting has no one to tell.
        let _ = pending.reply.send(in_term(reply, pending.term, term));
    }
}

/// A renewal's reply, given the term its grant was made in and the term of the master that
/// answered: a grant of an earlier term found gone was lost to the master's replacement.
pub(crate) fn in_term(reply: RenewReply, granted: u64, answered: Option<u64>) -> RenewReply {
    match reply {
        RenewReply::Lost(_) if answered.is_some_and(|term| term != granted) => {
            RenewReply::Lost(LossCause::MasterReplaced)
        }
        reply => reply,
    }
}

/// Runs `call` and returns one reply per grant, in order: the script's, or the call's failure
/// for each; and the term of the master that answered, if one did.
pub(crate) async fn run(
    link: &Link,
    gate: Option<ReplicationGate>,
    call: &RenewCall<'_>,
) -> (Vec<RenewReply>, Option<u64>) {
    let every = |reply: RenewReply| vec![reply; call.grants.len()];
    match link.eval_in_term(call, gate).await {
        Ok((value, confirmed, term)) => (
            match call.decode(&value) {
                Ok(replies) => replies
                    .into_iter()
                    .map(|reply| match reply {
                        // The key's TTL was extended on the primary only: a failover now could
                        // bring back the old, shorter TTL, so the extension is not proven.
                        RenewReply::Renewed { .. } if !replicated(gate, confirmed) => {
                            RenewReply::Failed(not_replicated(gate, confirmed))
                        }
                        reply => reply,
                    })
                    .collect(),
                Err(e) => every(RenewReply::Failed(unreadable(e))),
            },
            Some(term),
        ),
        Err(failure) => (every(RenewReply::Failed(failure)), None),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_grant_of_an_earlier_term_found_gone_was_lost_to_the_replacement() {
        let renewed = RenewReply::Renewed {
            server_ttl: Duration::from_secs(3),
        };
        let unknown = RenewReply::Failed(Failure::Indeterminate(Indeterminate::new(
            IndeterminateCause::ResponseTimeout,
            "no reply",
        )));
        for cause in [LossCause::Absent, LossCause::OtherHolder] {
            let lost = RenewReply::Lost(cause);
            // The master of the grant's own term said so: that is the loss.
            assert_eq!(in_term(lost.clone(), 2, Some(2)), lost);
            // A later term's master said so: the replacement lost it.
            assert_eq!(
                in_term(lost.clone(), 1, Some(2)),
                RenewReply::Lost(LossCause::MasterReplaced)
            );
            // No master answered: there is no term to compare.
            assert_eq!(in_term(lost.clone(), 1, None), lost);
        }
        // Anything but a loss stands: a renewal the new master confirmed proves the grant.
        assert_eq!(in_term(renewed.clone(), 1, Some(2)), renewed);
        assert_eq!(in_term(unknown.clone(), 1, Some(2)), unknown);
    }
}
