//! A scriptable backend: the test says what each call answers (in tower-test's spirit).
//!
//! The simulator ([`crate::SimServer`]) models a server; a [`Scripted`] backend models
//! nothing. Each operation answers from its own script: one-time answers first, in the order
//! they were given, then the operation's standing answer. An operation the test did not script
//! panics with the operation's name, so a test never passes on a call it did not expect.
//! Every call is logged with its operation and, with [`Scripted::timed_by`], the time it came.
//!
//! ```
//! use std::time::Duration;
//! use leasehold::backend::{AcquireReply, GrantReply};
//! use leasehold::{AcquireOutcome, Failure, FenceToken, LeaseClient, OperationId, Purpose, ResourceDigest};
//! use leasehold_sim::{Op, Scripted, run_now};
//!
//! let backend = Scripted::new();
//! backend
//!     .acquire_once(AcquireReply::Failed(Failure::Overloaded))
//!     .acquire_always(AcquireReply::Granted(GrantReply::new(
//!         FenceToken::MIN,
//!         Duration::from_secs(5),
//!     )));
//! let client = LeaseClient::new(backend);
//! let request = client.request(
//!     Purpose::new("demo")?,
//!     ResourceDigest::of("report"),
//!     client.new_attempt(OperationId::new("job-1")?)?,
//!     Duration::from_secs(5),
//! )?;
//! assert!(matches!(run_now(client.try_acquire(&request)), AcquireOutcome::Overloaded));
//! assert!(run_now(client.try_acquire(&request)).is_held());
//! assert_eq!(client.backend().calls_of(Op::Acquire), 2);
//! # Ok::<(), leasehold::Error>(())
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold::backend::{AcquireReply, Grant, GrantReply, ReleaseReply, RenewReply};
use leasehold::{
    Attempt, Clock, Failure, FenceToken, InspectOutcome, LeaseBackend, LeaseRequest, ManualClock,
    Purpose, ResourceDigest, Unavailable, UnavailableCause,
};

/// The operations of the port, as logged by a [`Scripted`] backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`LeaseBackend::acquire`].
    Acquire,
    /// [`LeaseBackend::renew`].
    Renew,
    /// [`LeaseBackend::release`].
    Release,
    /// [`LeaseBackend::inspect`] (also the first half of the default `release_attempt`).
    Inspect,
}

/// One call a [`Scripted`] backend answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// Which operation.
    pub op: Op,
    /// When it came, on the clock given to [`Scripted::timed_by`] (zero without one).
    pub at: Duration,
}

type Rule<A, R> = Arc<dyn Fn(&A, usize) -> R + Send + Sync>;

/// How one operation answers: one-time answers, then the standing one.
struct Script<A, R> {
    once: VecDeque<Rule<A, R>>,
    always: Option<Rule<A, R>>,
}

impl<A, R> Default for Script<A, R> {
    fn default() -> Self {
        Self {
            once: VecDeque::new(),
            always: None,
        }
    }
}

impl<A, R> Script<A, R> {
    /// Takes the rule for call `n` (0 for the first) of `op`.
    fn next(&mut self, op: Op, n: usize) -> Rule<A, R> {
        self.once
            .pop_front()
            .or_else(|| self.always.clone())
            .unwrap_or_else(|| panic!("the test did not script call {n} of {op:?}"))
    }
}

fn fixed<A, R: Clone + Send + Sync + 'static>(reply: R) -> Rule<A, R> {
    Arc::new(move |_: &A, _| reply.clone())
}

#[derive(Default)]
struct Scripts {
    acquire: Script<LeaseRequest, AcquireReply>,
    renew: Script<Grant, RenewReply>,
    release: Script<Grant, ReleaseReply>,
    inspect: Script<(), InspectOutcome>,
    log: Vec<Call>,
}

impl Scripts {
    fn calls_of(&self, op: Op) -> usize {
        self.log.iter().filter(|c| c.op == op).count()
    }
}

/// A backend that answers each call as the test scripted it, and logs the calls.
#[derive(Default)]
pub struct Scripted {
    scripts: Mutex<Scripts>,
    clock: Option<Arc<dyn Clock>>,
    round_trip: Option<(ManualClock, Duration)>,
}

impl fmt::Debug for Scripted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scripted")
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

/// A grant of the request's full TTL with the smallest fence: what a free server answers.
pub fn grant_in_full(request: &LeaseRequest) -> AcquireReply {
    AcquireReply::Granted(GrantReply::new(FenceToken::MIN, request.ttl()))
}

/// A renewal that restores the grant's full TTL: what a server holding the grant answers.
pub fn renew_in_full(grant: &Grant) -> RenewReply {
    RenewReply::Renewed {
        server_ttl: grant.ttl(),
    }
}

/// A refused connection: definitely not applied.
pub fn refused() -> Failure {
    Failure::Unavailable(Unavailable::new(
        UnavailableCause::ConnectionRefused,
        "refused (scripted)",
    ))
}

impl Scripted {
    /// A backend with nothing scripted: every call panics until the test says what it answers.
    pub fn new() -> Self {
        Self::default()
    }

    /// A healthy server for one holder: acquires grant in full, renewals renew in full,
    /// releases release, inspections find the lease free. Override any of them.
    pub fn healthy() -> Self {
        let backend = Self::new();
        backend
            .acquire_always_with(|request, _| grant_in_full(request))
            .renew_always_with(|grant, _| renew_in_full(grant))
            .release_always(ReleaseReply::Released)
            .inspect_always(InspectOutcome::Free);
        backend
    }

    /// Stamps each logged call with `clock`'s reading.
    pub fn timed_by(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Advances `clock` by `rtt` on every call, as a round trip would (use the same
    /// [`ManualClock`] for the client).
    pub fn round_trip(mut self, clock: ManualClock, rtt: Duration) -> Self {
        self.round_trip = Some((clock, rtt));
        self
    }

    fn edit(&self, f: impl FnOnce(&mut Scripts)) -> &Self {
        f(&mut self.scripts());
        self
    }

    fn scripts(&self) -> std::sync::MutexGuard<'_, Scripts> {
        self.scripts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns every call answered so far, in order.
    pub fn log(&self) -> Vec<Call> {
        self.scripts().log.clone()
    }

    /// Returns how many calls were answered so far.
    pub fn calls(&self) -> usize {
        self.scripts().log.len()
    }

    /// Returns how many calls of `op` were answered so far.
    pub fn calls_of(&self, op: Op) -> usize {
        self.scripts().calls_of(op)
    }

    /// Returns when each call of `op` came.
    pub fn times_of(&self, op: Op) -> Vec<Duration> {
        let scripts = self.scripts();
        scripts
            .log
            .iter()
            .filter(|c| c.op == op)
            .map(|c| c.at)
            .collect()
    }

    /// Logs a call of `op`, moves the round-trip clock, and takes the rule that answers it.
    /// The lock is released before the rule runs, so a rule may panic or call back freely.
    fn answer<A, R>(&self, op: Op, arg: &A, pick: fn(&mut Scripts) -> &mut Script<A, R>) -> R {
        let at = self
            .clock
            .as_ref()
            .map_or(Duration::ZERO, |c| c.now().since_origin());
        let (rule, n) = {
            let mut scripts = self.scripts();
            // The call's number is how many calls of `op` the log holds before it.
            let n = scripts.calls_of(op);
            scripts.log.push(Call { op, at });
            (pick(&mut scripts).next(op, n), n)
        };
        if let Some((clock, rtt)) = &self.round_trip {
            clock.advance(*rtt);
        }
        rule(arg, n)
    }
}

// Scripting methods, one set per operation: `*_once` queues an answer for the next call not
// yet answered by an earlier one; `*_always` sets the answer once the queue is empty; `*_with`
// takes a function of the call's argument and number (0 for the operation's first call). They
// take `&self`, so a test can script more answers on a backend a client already owns.
macro_rules! script_methods {
    ($field:ident, $arg:ty, $reply:ty, $once:ident, $once_with:ident, $always:ident, $always_with:ident) => {
        impl Scripted {
            #[doc = concat!("Answers the next `", stringify!($field), "` with `reply`.")]
            pub fn $once(&self, reply: $reply) -> &Self {
                self.edit(|s| s.$field.once.push_back(fixed(reply)))
            }

            #[doc = concat!("Answers the next `", stringify!($field), "` with `rule(arg, n)`.")]
            pub fn $once_with(
                &self,
                rule: impl Fn(&$arg, usize) -> $reply + Send + Sync + 'static,
            ) -> &Self {
                self.edit(|s| s.$field.once.push_back(Arc::new(rule)))
            }

            #[doc = concat!("Answers every `", stringify!($field), "` after the queued ones with `reply`.")]
            pub fn $always(&self, reply: $reply) -> &Self {
                self.edit(|s| s.$field.always = Some(fixed(reply)))
            }

            #[doc = concat!("Answers every `", stringify!($field), "` after the queued ones with `rule(arg, n)`.")]
            pub fn $always_with(
                &self,
                rule: impl Fn(&$arg, usize) -> $reply + Send + Sync + 'static,
            ) -> &Self {
                self.edit(|s| s.$field.always = Some(Arc::new(rule)))
            }
        }
    };
}

script_methods!(
    acquire,
    LeaseRequest,
    AcquireReply,
    acquire_once,
    acquire_once_with,
    acquire_always,
    acquire_always_with
);
script_methods!(
    renew,
    Grant,
    RenewReply,
    renew_once,
    renew_once_with,
    renew_always,
    renew_always_with
);
script_methods!(
    release,
    Grant,
    ReleaseReply,
    release_once,
    release_once_with,
    release_always,
    release_always_with
);

impl Scripted {
    /// Answers the next inspection with `outcome`.
    pub fn inspect_once(&self, outcome: InspectOutcome) -> &Self {
        self.edit(|s| s.inspect.once.push_back(fixed(outcome)))
    }

    /// Answers every inspection after the queued ones with `outcome`.
    pub fn inspect_always(&self, outcome: InspectOutcome) -> &Self {
        self.edit(|s| s.inspect.always = Some(fixed(outcome)))
    }
}

impl LeaseBackend for Scripted {
    async fn acquire(&self, request: &LeaseRequest) -> AcquireReply {
        self.answer(Op::Acquire, request, |s| &mut s.acquire)
    }

    async fn renew(&self, grant: &Grant) -> RenewReply {
        self.answer(Op::Renew, grant, |s| &mut s.renew)
    }

    async fn release(&self, grant: &Grant) -> ReleaseReply {
        self.answer(Op::Release, grant, |s| &mut s.release)
    }

    async fn inspect(
        &self,
        _: &Purpose,
        _: &ResourceDigest,
        _: Option<&Attempt>,
    ) -> InspectOutcome {
        self.answer(Op::Inspect, &(), |s| &mut s.inspect)
    }
}

#[cfg(test)]
mod tests {
    use leasehold::{AcquireOutcome, LeaseClient, OperationId, RenewOutcome};

    use super::*;
    use crate::run_now;

    fn client(backend: Scripted, clock: &ManualClock) -> (LeaseClient<Scripted>, LeaseRequest) {
        let client = LeaseClient::new(backend).with_clock(clock.clone());
        let attempt = client.new_attempt(OperationId::new("op").unwrap()).unwrap();
        let request = client
            .request(
                Purpose::new("p").unwrap(),
                ResourceDigest::of("r"),
                attempt,
                Duration::from_secs(3),
            )
            .unwrap();
        (client, request)
    }

    #[test]
    fn one_time_answers_come_first_in_order_then_the_standing_one() {
        let clock = ManualClock::new();
        let backend = Scripted::new().round_trip(clock.clone(), Duration::from_millis(4));
        backend
            .acquire_once(AcquireReply::Failed(Failure::Overloaded))
            .acquire_once(AcquireReply::Failed(refused()))
            .acquire_always_with(|request, n| {
                assert_eq!(n, 2, "the standing answer is the third call");
                grant_in_full(request)
            })
            .renew_always_with(|grant, _| renew_in_full(grant));
        let (client, request) = client(backend.timed_by(clock.clone()), &clock);
        assert!(matches!(
            run_now(client.try_acquire(&request)),
            AcquireOutcome::Overloaded
        ));
        assert!(matches!(
            run_now(client.try_acquire(&request)),
            AcquireOutcome::Unavailable(_)
        ));
        let lease = run_now(client.try_acquire(&request))
            .into_handle()
            .expect("granted");
        assert!(matches!(
            run_now(lease.renew()),
            RenewOutcome::Renewed { .. }
        ));
        let backend = client.backend();
        assert_eq!(backend.calls(), 4);
        assert_eq!(backend.calls_of(Op::Acquire), 3);
        assert_eq!(backend.calls_of(Op::Renew), 1);
        // Each call came one round trip after the one before.
        let ms = Duration::from_millis;
        assert_eq!(backend.times_of(Op::Acquire), vec![ms(0), ms(4), ms(8)]);
        assert_eq!(backend.times_of(Op::Renew), vec![ms(12)]);
    }

    #[test]
    #[should_panic(expected = "the test did not script call 0 of Release")]
    fn a_call_the_test_did_not_script_panics_with_its_name() {
        let clock = ManualClock::new();
        let backend = Scripted::new();
        backend.acquire_always_with(|request, _| grant_in_full(request));
        let (client, request) = client(backend, &clock);
        let lease = run_now(client.try_acquire(&request))
            .into_handle()
            .expect("granted");
        let _ = run_now(lease.release());
    }
}
