//! Acquires and releases sent together: those that start while other commands are in flight
//! go to the server as one run of their script, instead of one command apiece.
//!
//! One that starts alone is sent at once, as the single call it always was, and never comes
//! here (`RedisBackend::batches`). The others join their script's queue. The one that finds
//! the queue empty leads: it yields once, so that the others started in the same turn can
//! join, then takes everything queued and sends it, up to [`MAX_BATCH`] entries a command, and
//! each entry's caller gets its own reply. Each entry's outcome is what a call of its own
//! would have given: the script handles each entry on its own, a lost reply leaves every entry
//! of that command unknown, and a command never sent leaves each not applied. A command
//! refused for want of a permission (an ACL may allow one purpose's keys and not another's) is
//! sent again one entry at a time, since the refusal proves that none of them ran.
//!
//! Cancellation keeps the rule a dropped acquire relies on: its cleanup (`release_attempt`),
//! sent after the drop, must reach the server after everything sent for the acquire, or the
//! acquire must never be sent. An entry whose caller is dropped while it is queued leaves the
//! queue; the cleanup also takes its attempt's entry out of the queue before it is sent; and
//! the leader makes sure of a connection first, then takes the queue and hands the command to
//! the connection under the queue's lock, so an entry is either still queued or already on the
//! connection. An entry on the connection stays listed until its command is done, resends
//! included (after NOSCRIPT the command is sent again, for the dropped caller's entry too), and
//! the cleanup waits for that ([`Batcher::withdraw`]): were it sent at once, it would land
//! between the refused command and its resend, and the resend would make a grant nobody holds.
//! A leader dropped while it yields hands the queue to a task of its own, and one dropped while
//! its command is in flight hands the command to a task that answers the others: no caller's
//! cancellation takes another's reply away.
//!
//! On a Cluster a script's keys must share a slot, so nothing is batched there.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use leasehold::{Failure, Indeterminate, IndeterminateCause, UnavailableCause};
use redis::Value;
use tokio::sync::oneshot;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::decode::{self, unreadable};
use crate::link::Link;
use crate::scripts::{AcquireEntry, BatchCall, BatchEntry, ScriptCall};
use crate::settings::ReplicationGate;

/// The most entries one command carries.
pub(crate) const MAX_BATCH: usize = 64;

/// What a command's run answers one entry: its share of the reply, how many replicas
/// confirmed the command when gated, and the term of the master that answered.
pub(crate) type Sent = Result<(Value, Option<u32>, u64), Failure>;

/// A queued entry and where its reply goes.
struct Slot<E> {
    id: u64,
    entry: E,
    reply: oneshot::Sender<Sent>,
}

struct Queue<E> {
    slots: Vec<Slot<E>>,
    next_id: u64,
}

/// The entries of a command on the connection, listed until the command is done.
struct OnTheWire<E> {
    id: u64,
    entries: Arc<Vec<E>>,
    /// Cancelled when the command is done, or dropped unsent.
    done: CancellationToken,
}

/// The queue of one script's entries not yet sent, and the commands on the connection.
pub(crate) struct Batcher<E: BatchEntry> {
    /// What every command of this queue sends once for all its entries.
    shared: E::Shared,
    queue: Mutex<Queue<E>>,
    /// Locked after `queue` where both are held; alone by a command that is done.
    on_the_wire: Mutex<Vec<OnTheWire<E>>>,
}

type Chunk = Pin<Box<dyn Future<Output = ()> + Send>>;

impl<E: BatchEntry> Batcher<E> {
    /// An empty queue, whose commands send `shared` for all their entries.
    pub(crate) fn new(shared: E::Shared) -> Arc<Self> {
        Arc::new(Self {
            shared,
            queue: Mutex::new(Queue {
                slots: Vec::new(),
                next_id: 0,
            }),
            on_the_wire: Mutex::new(Vec::new()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue<E>> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `entry` over `link`, in one command with whatever other entries start with it,
    /// followed by `WAIT` when `gate` asks for replicas.
    pub(crate) async fn send(
        self: &Arc<Self>,
        link: &Arc<Link>,
        gate: Option<ReplicationGate>,
        entry: E,
    ) -> Sent {
        let (reply, answer) = oneshot::channel();
        let (id, leads) = {
            let mut queue = self.lock();
            let id = queue.next_id;
            queue.next_id += 1;
            queue.slots.push(Slot { id, entry, reply });
            (id, queue.slots.len() == 1)
        };
        let mut queued = Queued {
            batcher: self,
            link,
            gate,
            id,
            leads,
            waiting: true,
        };
        if leads {
            // Let the operations started in this turn join the queue first.
            tokio::task::yield_now().await;
            // A connection first, so that the command goes out the moment it is built.
            if let Err(failure) = link.ready().await {
                queued.leads = false;
                self.refuse(&failure);
            } else {
                let mut sending =
                    std::future::poll_fn(|cx| Poll::Ready(self.start(link, gate, id, cx))).await;
                // Taken (by us, or by a leader that took over): nothing of ours is queued.
                queued.leads = false;
                (&mut sending).await;
            }
        }
        let answered = answer.await;
        queued.waiting = false;
        answered.unwrap_or_else(|_| Err(stopped()))
    }

    /// Takes everything queued and hands it to the connection, a command per [`MAX_BATCH`]
    /// entries, each polled once under the queue's lock: an entry is either still queued, or
    /// on the connection ahead of anything sent after the lock is let go.
    fn start(
        self: &Arc<Self>,
        link: &Arc<Link>,
        gate: Option<ReplicationGate>,
        leader: u64,
        cx: &mut Context<'_>,
    ) -> Sending {
        let mut queue = self.lock();
        let slots = std::mem::take(&mut queue.slots);
        let alone = slots.len() == 1 && slots[0].id == leader;
        let mut chunks = Vec::with_capacity(slots.len().div_ceil(MAX_BATCH));
        let mut slots = slots.into_iter().peekable();
        while slots.peek().is_some() {
            let (entries, replies): (Vec<E>, Vec<oneshot::Sender<Sent>>) = slots
                .by_ref()
                .take(MAX_BATCH)
                .map(|slot| (slot.entry, slot.reply))
                .unzip();
            let entries = Arc::new(entries);
            // Listed before the queue's lock is let go: a cleanup finds its entry queued or
            // here, never in between.
            let done = self.list(&mut queue, &entries);
            let mut chunk: Chunk = Box::pin(send_chunk(
                Arc::clone(link),
                gate,
                self.shared,
                entries,
                replies,
                done,
            ));
            if chunk.as_mut().poll(cx).is_pending() {
                chunks.push(chunk);
            }
        }
        drop(queue);
        Sending { chunks, alone }
    }

    /// Lists `entries` as on the connection until the returned guard is dropped.
    fn list(self: &Arc<Self>, queue: &mut Queue<E>, entries: &Arc<Vec<E>>) -> Done<E> {
        let id = queue.next_id;
        queue.next_id += 1;
        let done = CancellationToken::new();
        self.wire().push(OnTheWire {
            id,
            entries: Arc::clone(entries),
            done: done.clone(),
        });
        Done {
            batcher: Arc::clone(self),
            id,
            done,
        }
    }

    fn wire(&self) -> std::sync::MutexGuard<'_, Vec<OnTheWire<E>>> {
        self.on_the_wire
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Answers everything queued with `failure`: nothing was sent.
    fn refuse(&self, failure: &Failure) {
        let slots = std::mem::take(&mut self.lock().slots);
        for slot in slots {
            let _ = slot.reply.send(Err(failure.clone()));
        }
    }

    /// Takes the queue over from a leader that was dropped while it yielded.
    async fn lead(self: Arc<Self>, link: Arc<Link>, gate: Option<ReplicationGate>) {
        if let Err(failure) = link.ready().await {
            self.refuse(&failure);
            return;
        }
        let sending =
            std::future::poll_fn(|cx| Poll::Ready(self.start(&link, gate, u64::MAX, cx))).await;
        sending.await;
    }
}

impl Batcher<AcquireEntry> {
    /// Takes `attempt`'s acquire out of the queue, if it is still there: its caller is gone,
    /// and the cleanup sent after it must not overtake it. If its command is on the connection
    /// instead, returns what the cleanup must wait for before it is sent: that command done,
    /// with whatever it sends again (after NOSCRIPT), so that nothing sent for the acquire
    /// lands after the cleanup. That wait is bounded by the command's own timeouts.
    pub(crate) fn withdraw(&self, attempt: &str) -> Option<WaitForCancellationFutureOwned> {
        let mut queue = self.lock();
        queue.slots.retain(|slot| !slot.entry.is_for(attempt));
        let wire = self.wire();
        let sending = wire
            .iter()
            .find(|sent| sent.entries.iter().any(|entry| entry.is_for(attempt)))?;
        Some(sending.done.clone().cancelled_owned())
    }
}

/// Keeps a command's entries listed as on the connection; dropped when the command is done
/// (or dropped unsent), it takes them off the list and wakes the cleanups that wait for it.
struct Done<E: BatchEntry> {
    batcher: Arc<Batcher<E>>,
    id: u64,
    done: CancellationToken,
}

impl<E: BatchEntry> Drop for Done<E> {
    fn drop(&mut self) {
        // Only this lock: a command can be done while `start` holds the queue's.
        self.batcher
            .on_the_wire
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|sent| sent.id != self.id);
        self.done.cancel();
    }
}

/// An entry's place in its queue while its caller waits.
struct Queued<'a, E: BatchEntry> {
    batcher: &'a Arc<Batcher<E>>,
    link: &'a Arc<Link>,
    gate: Option<ReplicationGate>,
    id: u64,
    /// The caller leads and has not taken the queue yet.
    leads: bool,
    /// The entry may still be queued: its caller has no answer yet.
    waiting: bool,
}

impl<E: BatchEntry> Drop for Queued<'_, E> {
    fn drop(&mut self) {
        if !self.waiting {
            return;
        }
        let others = {
            let mut queue = self.batcher.lock();
            queue.slots.retain(|slot| slot.id != self.id);
            !queue.slots.is_empty()
        };
        // A leader dropped before it took the queue: someone must, or every entry queued behind
        // it waits for ever (no one joining a queue that is not empty leads).
        if self.leads && others {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let batcher = Arc::clone(self.batcher);
                runtime.spawn(batcher.lead(Arc::clone(self.link), self.gate));
            } else {
                // Outside a runtime nothing can be sent: each caller is told its sender stopped.
                self.batcher.lock().slots.clear();
            }
        }
    }
}

/// The commands a leader has handed to the connection and not yet seen answered. Dropped
/// early (its caller cancelled), it leaves them to a task that answers the others.
struct Sending {
    chunks: Vec<Chunk>,
    /// The only entry is the leader's own: no one else waits for the answer.
    alone: bool,
}

impl Future for Sending {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.chunks
            .retain_mut(|chunk| chunk.as_mut().poll(cx).is_pending());
        if self.chunks.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        if self.chunks.is_empty() || self.alone {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            for chunk in self.chunks.drain(..) {
                runtime.spawn(chunk);
            }
        }
    }
}

/// Sends one command for `entries` and answers each through `replies`; `done` is dropped once
/// nothing more will be sent for them.
async fn send_chunk<E: BatchEntry>(
    link: Arc<Link>,
    gate: Option<ReplicationGate>,
    shared: E::Shared,
    entries: Arc<Vec<E>>,
    replies: Vec<oneshot::Sender<Sent>>,
    done: Done<E>,
) {
    let _done = done;
    let sent = link
        .eval_in_term(
            &BatchCall {
                shared,
                entries: &entries,
            },
            gate,
        )
        .await;
    match sent {
        Err(Failure::Unavailable(refused))
            if entries.len() > 1 && refused.cause == UnavailableCause::NoPermission =>
        {
            // None of them ran: each is sent alone, so that one entry's refusal is its own.
            let alone = entries.iter().map(|entry| {
                let link = &link;
                async move {
                    link.eval_in_term(
                        &BatchCall {
                            shared,
                            entries: std::slice::from_ref(entry),
                        },
                        gate,
                    )
                    .await
                }
            });
            let each = futures_util::future::join_all(alone).await;
            for (reply, sent) in replies.into_iter().zip(each) {
                let _ = reply.send(sent);
            }
        }
        Err(failure) => {
            for reply in replies {
                let _ = reply.send(Err(failure.clone()));
            }
        }
        Ok(answer) if replies.len() == 1 => {
            // A batch of one is the single call: the reply is the entry's own.
            if let Some(reply) = replies.into_iter().next() {
                let _ = reply.send(Ok(answer));
            }
        }
        Ok((Value::Array(items), confirmed, term)) if items.len() == replies.len() => {
            for (reply, item) in replies.into_iter().zip(items) {
                // A caller that stopped waiting has no one to tell.
                let _ = reply.send(Ok((item, confirmed, term)));
            }
        }
        Ok((other, _, _)) => {
            let failure = unreadable(decode::unexpected_reply(
                BatchCall::<E>::script().name,
                &other,
            ));
            for reply in replies {
                let _ = reply.send(Err(failure.clone()));
            }
        }
    }
}

/// An entry whose sender went away unanswered (its runtime is shutting down): it may have
/// been sent.
fn stopped() -> Failure {
    Failure::Indeterminate(Indeterminate::new(
        IndeterminateCause::ConnectionLost,
        "the batched command's sender stopped",
    ))
}
