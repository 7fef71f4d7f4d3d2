//! Bounded waiting: `LeaseClient::acquire` honours the request's wait timeout.
//!
//! Within one client (and its clones), waiters for one resource queue in FIFO order and only
//! the head of the queue talks to the server; the next waiter becomes head when the head is
//! done. The head tries, and on contention sleeps until a release notice arrives, the
//! holder's remaining TTL has passed (an expiry sends no notice; the jitter keeps processes
//! from retrying in lock step), or the deadline — whichever is first. Every retry reuses the request's attempt, so a retry after an
//! `Indeterminate` is a safe replay.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::LeaseBackend;
use crate::client::{AcquireOutcome, LeaseClient};
use crate::outcome::{Contention, Indeterminate};
use crate::request::LeaseRequest;
use crate::retry::Backoff;
use crate::telemetry::{self, Gauged, lease_span};

/// Since when an acquire waits behind another holder, counted in the waiters gauge while it
/// does.
#[derive(Debug, Default)]
struct Waiting(Option<(Instant, Gauged)>);

impl Waiting {
    fn start(&mut self, request: &LeaseRequest) {
        if self.0.is_none() {
            let kind = telemetry::kind_of(request);
            self.0 = Some((Instant::now(), Gauged::waiter(request.purpose(), kind)));
        }
    }

    fn waited(&self) -> Option<Duration> {
        self.0.as_ref().map(|(since, _)| since.elapsed())
    }
}

/// Per-resource FIFO queues of waiters (tokio's mutex is fair: it queues in FIFO order).
#[derive(Debug, Clone, Default)]
pub(crate) struct Queues {
    by_resource: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    cleanups: Arc<Cleanups>,
}

/// Counts the background cleanups (of dropped acquires and guards), so that [`LeaseClient::settle`] can
/// wait for them (a process about to exit would otherwise cut them off).
#[derive(Debug, Default)]
struct Cleanups {
    running: Mutex<usize>,
    idle: tokio::sync::Notify,
}

/// Counts one cleanup as running until dropped — also when its task is aborted.
struct Running(Arc<Cleanups>);

impl Running {
    fn start(cleanups: &Arc<Cleanups>) -> Self {
        *cleanups
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += 1;
        Self(Arc::clone(cleanups))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self
            .0
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *running -= 1;
        if *running == 0 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Queues {
    fn queue(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self
            .by_resource
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Forget queues nobody waits in, so the map stays as small as the set of contested
        // resources.
        map.retain(|_, q| Arc::strong_count(q) > 1);
        Arc::clone(map.entry(key.to_owned()).or_default())
    }
}

/// Releases, in the background, a lease a dropped `acquire` may have been granted.
///
/// Armed while a try is in flight or its outcome is unknown; if the acquire future is dropped
/// then, the grant may exist with nobody holding its handle. The guard releases whatever grant
/// the attempt holds ([`LeaseClient::release_attempt`]), on the Redis backend behind the
/// acquire on its connection.
struct CancelGuard<'a, B: LeaseBackend> {
    client: &'a LeaseClient<B>,
    request: &'a LeaseRequest,
    armed: bool,
}

impl<B: LeaseBackend> CancelGuard<'_, B> {
    /// The outcome reached the caller: nothing is left for the guard to release.
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl<B: LeaseBackend> Drop for CancelGuard<'_, B> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.client.abandon_in_background(self.request.clone());
    }
}

/// A small jitter below `retry_after / 8` and 25 ms, so that waiters in different processes
/// do not retry in lock step.
fn jitter(retry_after: Duration) -> Duration {
    let cap = (retry_after / 8).min(Duration::from_millis(25));
    let cap_us = u64::try_from(cap.as_micros()).unwrap_or(0);
    if cap_us == 0 {
        return Duration::ZERO;
    }
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return Duration::ZERO;
    }
    Duration::from_micros(u64::from_le_bytes(bytes) % cap_us)
}

impl<B: LeaseBackend> LeaseClient<B> {
    /// Runs `cleanup` as a task on the current runtime, counted until it ends so that
    /// [`settle`](Self::settle) can wait for it. Outside a runtime it is dropped unstarted,
    /// with a warning: whatever it would have released lives until its TTL.
    pub(crate) fn spawn_cleanup(&self, cleanup: impl Future<Output = ()> + Send + 'static) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no runtime to release on; a grant may live until its TTL");
            return;
        };
        let running = Running::start(&self.queues.cleanups);
        runtime.spawn(async move {
            let _running = running;
            cleanup.await;
        });
    }

    /// Releases, in the background, whatever grant `request`'s attempt may hold: the cleanup
    /// after an acquire whose outcome is unknown and that nobody will resolve.
    pub(crate) fn abandon_in_background(&self, request: LeaseRequest) {
        let client = self.clone();
        self.spawn_cleanup(async move {
            // Never a replay: one that lands before a late acquire would make the grant it
            // came to remove.
            let outcome = client.release_attempt(&request).await;
            tracing::debug!(%outcome, "cleaned up behind an abandoned acquire");
        });
    }

    /// Waits until every background cleanup of this client and its clones has finished: the
    /// releases started by dropped [`acquire`](Self::acquire) and [`lock`](Self::lock) futures,
    /// dropped [`LeaseGuard`](crate::LeaseGuard)s, and `lock` calls whose outcome stayed
    /// unknown.
    ///
    /// Call it before a process exits after cancelling an acquire — on Ctrl-C, say: the
    /// cleanup runs as a task on the runtime, and a runtime that shuts down cuts it off,
    /// leaving a grant that may live until its TTL. Bound it with a timeout if the server may
    /// not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it stops only the waiting.
    pub async fn settle(&self) {
        let cleanups = &self.queues.cleanups;
        loop {
            let idle = cleanups.idle.notified();
            let mut idle = std::pin::pin!(idle);
            // Registered before the count is read, so a cleanup ending in between still wakes us.
            idle.as_mut().enable();
            if *cleanups
                .running
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                == 0
            {
                return;
            }
            idle.await;
        }
    }

    /// Acquires the lease, waiting up to the request's wait timeout; a zero timeout tries once.
    ///
    /// While it waits, only the first waiter of a resource in this client retries; it sleeps
    /// until the holder's remaining TTL has passed (a lease that expires sends no message) or
    /// the deadline. After the deadline the outcome is `Contended` (or
    /// `OwnerOperationConflict`) with the last retry-after seen. The deadline is exceeded by at
    /// most one command: a try that began before it runs to completion. An `Indeterminate` try
    /// is replayed with the same attempt while time remains; `Unavailable` and `Overloaded`
    /// return at once — unless an earlier try was `Indeterminate`: then they are retried too,
    /// and if the deadline comes before a definite answer the outcome is `Indeterminate`,
    /// because a grant to this attempt may exist.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future never leaves a lease nobody knows about: if a try was in flight or
    /// its outcome unknown, a background task (on the current tokio runtime) releases whatever
    /// grant the attempt holds ([`release_attempt`](Self::release_attempt)). A handle already
    /// returned is the caller's.
    pub async fn acquire(&self, request: &LeaseRequest) -> AcquireOutcome<B> {
        let wait = request.wait_timeout();
        if wait.is_zero() {
            return self.try_acquire(request).await;
        }
        let (purpose, resource) = (request.purpose(), request.resource());
        let span = lease_span!(
            DEBUG,
            "acquire",
            purpose,
            resource,
            kind = telemetry::kind_of(request),
            wait_ms = telemetry::ms(wait)
        );
        async {
            let started = Instant::now();
            let mut waiting = Waiting::default();
            let outcome = self.wait_for(request, wait, &mut waiting).await;
            self.acquire_finished(request, &outcome, started.elapsed(), waiting.waited());
            outcome
        }
        .instrument(span)
        .await
    }

    /// The waiting loop of [`acquire`](Self::acquire), telling `waiting` when it waits.
    async fn wait_for(
        &self,
        request: &LeaseRequest,
        wait: Duration,
        waiting: &mut Waiting,
    ) -> AcquireOutcome<B> {
        let deadline = Instant::now() + wait;
        // A permit's waiters do not queue here: each keeps its own place in the semaphore's
        // queue on the server, which serves them in arrival order across processes, several
        // at once when several slots are free, and drops a place not refreshed within the
        // heartbeat.
        let permit = request.is_queued();
        let queue = if permit {
            Arc::default()
        } else {
            self.queues
                .queue(&format!("{}\0{}", request.purpose(), request.resource()))
        };
        let head = match queue.try_lock() {
            Ok(head) => Some(head),
            Err(_) => {
                // Queued behind another waiter of this client.
                waiting.start(request);
                tokio::time::timeout_at(deadline, queue.lock()).await.ok()
            }
        };
        let head = head.is_some();
        let mut guard = CancelGuard {
            client: self,
            request,
            armed: false,
        };
        let watch = if permit {
            self.backend().watch_queue(request)
        } else {
            self.backend().watch(request.purpose(), request.resource())
        };
        let never = tokio::sync::Notify::new();
        let notify = watch.notify().map_or(&never, |n| n.as_ref());
        // Once a try's outcome was unknown, this attempt may hold a grant until the server
        // answers a later try definitely. A later "not applied" says nothing about the earlier
        // try, so it must not be returned in its place: the caller would be told nothing is
        // held, and the grant would be nobody's until its TTL.
        let mut unknown: Option<Indeterminate> = None;
        // Whether a try of this wait took a place in a queue (a refused permit's, waiting).
        let mut queued = false;
        let mut backoff = Backoff::new();
        let outcome = loop {
            // Subscribe first: a release that lands while the try is in flight still wakes us.
            let released = notify.notified();
            let mut released = std::pin::pin!(released);
            released.as_mut().enable();
            guard.armed = true;
            let outcome = self.try_once(request).await;
            tracing::trace!(outcome = outcome.kind(), "tried");
            let contention: &Contention = match &outcome {
                AcquireOutcome::Contended(c) | AcquireOutcome::OwnerOperationConflict(c) => {
                    // The server answered: someone else holds it, so this attempt does not.
                    unknown = None;
                    c
                }
                AcquireOutcome::Indeterminate { cause, .. } => {
                    unknown = Some(cause.clone());
                    if head && Instant::now() < deadline {
                        // Same attempt: the retry is a replay and finds a grant if one was made.
                        backoff.pause(Some(deadline)).await;
                        continue;
                    }
                    // Returned to the caller, who now knows to resolve it.
                    break outcome;
                }
                AcquireOutcome::Unavailable(_) | AcquireOutcome::Overloaded => {
                    let Some(cause) = unknown.take() else {
                        break outcome;
                    };
                    if head && Instant::now() < deadline {
                        unknown = Some(cause);
                        backoff.pause(Some(deadline)).await;
                        continue;
                    }
                    break AcquireOutcome::Indeterminate {
                        operation: request.attempt().operation().clone(),
                        cause,
                    };
                }
                _ => break outcome,
            };
            // Contended: nothing of this attempt's is held while it waits for the next try —
            // but a permit's place in the queue is, and a dropped wait gives it back.
            guard.armed = permit;
            backoff.reset();
            let now = Instant::now();
            // A refused try of a wait takes (or keeps) a place in a permit's queue.
            queued = permit;
            if !head || now >= deadline {
                break outcome;
            }
            waiting.start(request);
            let mut retry_after = contention.retry_after;
            if permit {
                // Tried often enough to keep its place in the queue.
                retry_after = retry_after.min(request.queue_heartbeat() / 3);
            }
            let wake = (now + retry_after + jitter(retry_after)).min(deadline);
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                () = released => {}
            }
        };
        // Whatever it is, the outcome now reaches the caller, who owns what it says.
        guard.disarm();
        let settled = matches!(
            outcome,
            AcquireOutcome::Acquired(_)
                | AcquireOutcome::Replayed(_)
                | AcquireOutcome::Indeterminate { .. }
        );
        if queued && !settled {
            // A place in the queue that a wait ending without a permit left (at its deadline,
            // on a mismatch, unreachable) would keep later waiters out until its heartbeat
            // ran out: given back now, in the background. (An `Indeterminate` end is cleaned
            // up by whoever resolves it; a grant holds no place.)
            self.abandon_in_background(request.clone());
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_is_bounded() {
        for ms in [0u64, 1, 8, 80, 800, 8000] {
            let retry = Duration::from_millis(ms);
            let j = jitter(retry);
            assert!(
                j <= (retry / 8).min(Duration::from_millis(25)),
                "{ms}: {j:?}"
            );
        }
    }

    #[test]
    fn idle_queues_are_forgotten() {
        let queues = Queues::default();
        let a = queues.queue("a");
        drop(queues.queue("b"));
        let _c = queues.queue("c");
        let map = queues.by_resource.lock().unwrap();
        assert!(map.contains_key("a") && map.contains_key("c"));
        assert!(!map.contains_key("b"));
        drop(map);
        drop(a);
    }
}
