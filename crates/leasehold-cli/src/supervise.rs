//! The command under the lease: wait for it, pass signals on, stop it when the lease is lost.
//!
//! [`supervise`] sees the command through [`CommandGroup`]: its own process's exit, and its
//! process group to signal. [`Launched`] is the real one; the tests drive the same loop with a
//! scripted command against the simulated lease, in paused time.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use leasehold_redis::leasehold::{LeaseBackend, LeaseGuard};
use rustix::process::Signal;
use tokio::time::{Instant, MissedTickBehavior};

use crate::duration::format_duration;
use crate::log::{note, tell};
use crate::signals::{Caught, Signals};
use crate::stop::{ProcessGroup, StopPolicy};

/// How often the group is looked at once its leader has exited (nothing signals that the
/// last of it is gone).
const GROUP_POLL: Duration = Duration::from_millis(10);
/// How long a group may take to vanish after SIGKILL (a process in uninterruptible I/O dies
/// when the I/O ends) before leasehold stops waiting for it.
const KILL_WAIT: Duration = Duration::from_secs(1);

/// A started command as [`supervise`] sees it.
pub(crate) trait CommandGroup {
    /// Waits for the command's own process (the group's leader) to exit.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped wait can be started again.
    fn exited(&mut self) -> impl Future<Output = io::Result<ExitStatus>>;

    /// Sends `signal` to every process in the command's group.
    fn signal(&self, signal: Signal);

    /// Returns true if and only if nothing of the command's group is left. Called only after
    /// [`exited`](Self::exited) has returned.
    fn is_gone(&mut self) -> bool;
}

/// The command, started as the leader of its own process group.
#[derive(Debug)]
pub(crate) struct Launched {
    pub(crate) child: tokio::process::Child,
    pub(crate) group: ProcessGroup,
}

impl CommandGroup for Launched {
    fn exited(&mut self) -> impl Future<Output = io::Result<ExitStatus>> {
        self.child.wait()
    }

    fn signal(&self, signal: Signal) {
        self.group.signal(signal);
    }

    fn is_gone(&mut self) -> bool {
        self.group.is_empty()
    }
}

/// How the supervised command ended.
#[derive(Debug)]
pub(crate) struct Ended {
    /// The exit status of the command's own process.
    pub(crate) status: io::Result<ExitStatus>,
    /// Returns true if and only if the lease was lost (or its validity ran down to the
    /// backstop) before the command's group was gone, and leasehold stopped what was left.
    pub(crate) lease_lost: bool,
}

/// Where a stop of the command's group is.
#[derive(Debug, Default)]
struct Stopping {
    /// SIGTERM was sent.
    terminated: bool,
    /// A SIGINT or SIGTERM sent to leasehold was passed on.
    asked: bool,
    /// When SIGKILL is due.
    kill_at: Option<Instant>,
    /// When SIGKILL was sent.
    killed_at: Option<Instant>,
}

impl Stopping {
    /// Sends SIGTERM (once) and makes SIGKILL due `kill_after` from now, or sooner if it was
    /// due sooner already; at once when `kill_after` is zero.
    fn begin(&mut self, command: &impl CommandGroup, kill_after: Duration) {
        if !self.terminated {
            self.terminated = true;
            command.signal(Signal::TERM);
            // A stopped process would hold SIGTERM pending until it is continued.
            command.signal(Signal::CONT);
        }
        if self.killed_at.is_some() {
            return;
        }
        let at = Instant::now() + kill_after;
        self.kill_at = Some(self.kill_at.map_or(at, |due| due.min(at)));
        if kill_after.is_zero() {
            self.kill(command);
        }
    }

    /// A SIGINT or SIGTERM sent to leasehold, `caught`: the first is passed on, and SIGKILL
    /// follows after `grace` (or sooner, if it was due sooner already); a second one sends
    /// SIGKILL at once, for a command that does not stop on the first.
    fn asked(&mut self, command: &impl CommandGroup, caught: Caught, grace: Duration) {
        if self.killed_at.is_some() {
            return;
        }
        if self.asked {
            tell!(
                "leasehold: {} again: sending SIGKILL to the command",
                caught.name()
            );
            self.kill(command);
            return;
        }
        self.asked = true;
        // Said before the signal goes on, so that what the command prints on it comes after.
        note!(
            "leasehold: {} passed on to the command; SIGKILL in {} unless it exits, or at once \
             on another SIGINT or SIGTERM",
            caught.name(),
            format_duration(grace)
        );
        command.signal(caught.signal());
        let at = Instant::now() + grace;
        self.kill_at = Some(self.kill_at.map_or(at, |due| due.min(at)));
    }

    fn kill(&mut self, command: &impl CommandGroup) {
        command.signal(Signal::KILL);
        self.kill_at = None;
        self.killed_at = Some(Instant::now());
    }
}

/// Waits for the command to exit, and for whatever it left in its group to be gone, passing
/// signals on and stopping the group when the lease is lost.
///
/// A SIGINT or SIGTERM sent to leasehold asks the command to stop: the first is passed on,
/// and SIGKILL follows after the grace, or at once on a second one (a command that ignores
/// SIGTERM could otherwise be stopped only by SIGKILL to leasehold, which leaves it running
/// without a lease).
///
/// Nothing of the group may outlive the lease: once the command's own process has exited,
/// what is left of its group (`worker &`) is stopped as a lost lease's command is —
/// SIGTERM, then SIGKILL after the grace, capped by the validity left — while the lease is
/// still kept alive, and `supervise` returns only when the group is gone.
pub(crate) async fn supervise<B: LeaseBackend>(
    command: &mut impl CommandGroup,
    kept: &LeaseGuard<B>,
    stop: StopPolicy,
    signals: &mut Signals,
) -> Ended {
    let mut status: Option<io::Result<ExitStatus>> = None;
    let mut lease_lost = false;
    let mut stopping = Stopping::default();
    let mut poll = tokio::time::interval(GROUP_POLL);
    poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        // Woken when the validity left reaches the backstop unless a renewal extends it first;
        // then it is read again.
        let until_backstop = kept
            .handle()
            .remaining_validity()
            .saturating_sub(stop.backstop());
        tokio::select! {
            // In this order, not at random: when the command's exit and the lease's end are
            // ready together, the lease's end wins. The work may have outlived the lease, so
            // the answer is 70 every time, never a coin toss between 70 and the command's code
            // (and see the exit branch for a lease's end no timer has reported yet).
            // No branch can starve another: the loss and backstop branches fire once, the
            // SIGKILL deadline once, and signals only when sent.
            biased;
            reason = kept.signal().lost(), if !lease_lost => {
                lease_lost = true;
                lost(command, kept, stop, &mut stopping, &reason.to_string());
            }
            () = tokio::time::sleep(until_backstop), if !lease_lost => {
                if kept.handle().remaining_validity() <= stop.backstop() {
                    lease_lost = true;
                    lost(command, kept, stop, &mut stopping, "validity about to end");
                }
            }
            () = sleep_until_or_never(stopping.kill_at) => stopping.kill(command),
            caught = signals.next() => {
                if caught.asks_to_stop() {
                    stopping.asked(command, caught, stop.grace());
                } else {
                    command.signal(caught.signal());
                }
            }
            exited = command.exited(), if status.is_none() => {
                // The branches above come first, but a stall (SIGSTOP, a starved VM) can end
                // with this task already queued: it then sees the exit, which is read from the
                // process table on every poll, before the timer wheel has been turned to fire
                // the backstop. So the lease itself is read too: seen at the exit, a loss or
                // a validity down to the backstop is the lease's end, and it wins.
                if !lease_lost
                    && (kept.signal().is_lost()
                        || kept.handle().remaining_validity() <= stop.backstop())
                {
                    lease_lost = true;
                    let reason = kept
                        .signal()
                        .reason()
                        .map_or_else(|| "validity about to end".to_owned(), |r| r.to_string());
                    let reason = format!("{reason}, as the command exited");
                    lost(command, kept, stop, &mut stopping, &reason);
                }
                if exited.is_err() {
                    // Lost track of it: whatever is running must not outlive the lease.
                    stopping.kill(command);
                }
                status = Some(exited);
                if command.is_gone() {
                    break;
                }
                if !stopping.terminated {
                    let kill_after = stop.kill_after(kept.handle().remaining_validity());
                    tell!(
                        "leasehold: the command exited and left processes in its group; \
                         stopping them before the lease is released: SIGTERM now, SIGKILL in {}",
                        format_duration(kill_after)
                    );
                    stopping.begin(command, kill_after);
                }
            }
            _ = poll.tick(), if status.is_some() => {
                if command.is_gone() {
                    break;
                }
                if stopping.killed_at.is_some_and(|at| at.elapsed() >= KILL_WAIT) {
                    tell!(
                        "leasehold: processes of the command's group are still there {} after \
                         SIGKILL; releasing the lease anyway",
                        format_duration(KILL_WAIT)
                    );
                    break;
                }
            }
        }
    }
    Ended {
        status: status.unwrap_or_else(|| Err(io::Error::other("no exit status"))),
        lease_lost,
    }
}

/// The lease is lost, for `reason` (in words): stop the group, SIGKILL no later than the
/// validity left allows.
fn lost<B: LeaseBackend>(
    command: &impl CommandGroup,
    kept: &LeaseGuard<B>,
    stop: StopPolicy,
    stopping: &mut Stopping,
    reason: &str,
) {
    let kill_after = stop.kill_after(kept.handle().remaining_validity());
    let how = if kill_after.is_zero() {
        // A lease the server no longer holds has no validity left: another may be granted it
        // now, so there is no time for a grace.
        "SIGTERM and SIGKILL now, as no validity is left for a grace".to_owned()
    } else {
        format!("SIGTERM now, SIGKILL in {}", format_duration(kill_after))
    };
    tell!("leasehold: lease lost ({reason}); stopping the command: {how}");
    stopping.begin(command, kill_after);
}

async fn sleep_until_or_never(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    //! `supervise` against the simulated server, in paused time: every instant is exact, and
    //! two events can be made ready at once, which a real process and server cannot promise.

    use std::cell::{Cell, RefCell};
    use std::os::unix::process::ExitStatusExt as _;
    use std::time::Duration;

    use leasehold::{
        AcquireOutcome, Clock, LeaseClient, LossReason, ManualClock, OperationId, Purpose,
        ResourceDigest, TokioClock,
    };
    use leasehold_sim::{Fault, SimBackend, SimServer};

    use super::*;

    const TTL: Duration = Duration::from_secs(3);
    const COMMAND_TIMEOUT: Duration = Duration::from_millis(200);

    /// A command whose exit the test decides, recording the signals its group gets and when.
    #[derive(Debug, Default)]
    struct Scripted {
        /// Its exit status once it has exited; `None` runs until `exit` says otherwise.
        status: Option<ExitStatus>,
        /// Its exit, when the test sends it.
        exit: Option<tokio::sync::oneshot::Receiver<ExitStatus>>,
        /// What it left running in its group, if anything, and the signal that ends that
        /// (SIGKILL always does).
        leftovers_die_on: Option<Signal>,
        left_gone: Cell<bool>,
        signals: RefCell<Vec<(Signal, Instant)>>,
    }

    impl Scripted {
        fn exited_with(code: i32) -> Self {
            Self {
                status: Some(ExitStatus::from_raw(code << 8)),
                ..Self::default()
            }
        }

        /// Exited with `code`, leaving processes in its group that `die_on` ends.
        fn left_behind(code: i32, die_on: Signal) -> Self {
            Self {
                leftovers_die_on: Some(die_on),
                ..Self::exited_with(code)
            }
        }

        fn signals(&self) -> Vec<Signal> {
            self.signals.borrow().iter().map(|(s, _)| *s).collect()
        }

        fn sent_at(&self, signal: Signal) -> Instant {
            self.signals
                .borrow()
                .iter()
                .find(|(s, _)| *s == signal)
                .map(|(_, at)| *at)
                .unwrap_or_else(|| panic!("no {signal:?}"))
        }
    }

    impl CommandGroup for Scripted {
        fn exited(&mut self) -> impl Future<Output = io::Result<ExitStatus>> {
            let status = self.status;
            let exit = self.exit.as_mut();
            async move {
                match (status, exit) {
                    (Some(status), _) => Ok(status),
                    (None, Some(exit)) => exit.await.map_err(io::Error::other),
                    (None, None) => std::future::pending().await,
                }
            }
        }

        fn signal(&self, signal: Signal) {
            self.signals.borrow_mut().push((signal, Instant::now()));
            if signal == Signal::KILL || self.leftovers_die_on == Some(signal) {
                self.left_gone.set(true);
            }
        }

        fn is_gone(&mut self) -> bool {
            self.leftovers_die_on.is_none() || self.left_gone.get()
        }
    }

    /// A simulated server and a lease kept on it, on tokio's (paused) clock.
    struct World {
        server: SimServer,
        client: LeaseClient<SimBackend>,
        kept: LeaseGuard<SimBackend>,
    }

    impl World {
        async fn new() -> Self {
            let clock = TokioClock::new();
            Self::on(SimServer::with_clock(clock), clock).await
        }

        async fn on(server: SimServer, clock: impl Clock) -> Self {
            let client = LeaseClient::new(server.connect(COMMAND_TIMEOUT)).with_clock(clock);
            let attempt = client
                .new_attempt(OperationId::new("run").unwrap())
                .unwrap();
            let request = client
                .request(
                    Purpose::new("cli").unwrap(),
                    ResourceDigest::of("r"),
                    attempt,
                    TTL,
                )
                .unwrap();
            let AcquireOutcome::Acquired(lease) = client.try_acquire(&request).await else {
                panic!("not acquired");
            };
            let kept = client.guard(lease).await.unwrap();
            Self {
                server,
                client,
                kept,
            }
        }

        /// Takes the lease away at the server; the next renewal finds it gone.
        fn delete(&self) {
            let handle = self.kept.handle();
            self.server.delete(handle.purpose(), handle.resource());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_exit_seen_together_with_a_loss_is_a_loss() {
        let mut signals = Signals::new().unwrap();
        let stop = StopPolicy::new(TTL, Duration::from_secs(60));
        // Which of two ready branches an unbiased `select!` takes is a coin toss: enough
        // rounds that a toss would show.
        for round in 0..32 {
            let world = World::new().await;
            world.delete();
            assert_eq!(world.kept.signal().lost().await, LossReason::LostToAnother);
            // The command exited at the same time: both are ready when `supervise` first looks.
            let mut command = Scripted::exited_with(0);
            let ended = supervise(&mut command, &world.kept, stop, &mut signals).await;
            assert!(ended.lease_lost, "round {round}: {ended:?}");
            assert_eq!(ended.status.unwrap().code(), Some(0));
            // Lost to another: SIGKILL at once, whatever the grace.
            assert_eq!(
                command.signals(),
                [Signal::TERM, Signal::CONT, Signal::KILL],
                "round {round}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_exit_seen_after_the_validity_ran_out_is_a_loss_before_any_timer_says_so() {
        let mut signals = Signals::new().unwrap();
        let stop = StopPolicy::new(TTL, Duration::from_secs(60));
        let clock = ManualClock::new();
        let world = World::on(SimServer::new(clock.clone()), clock.clone()).await;
        // The keep-alive has taken the lease and armed its timers (which do not move either).
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let (exit, exited) = tokio::sync::oneshot::channel();
        let mut command = Scripted {
            exit: Some(exited),
            ..Scripted::default()
        };
        let (ended, ()) = tokio::join!(
            supervise(&mut command, &world.kept, stop, &mut signals),
            async {
                // `supervise` has looked once and armed its timers. Now the lease's clock
                // moves past the validity and tokio's timers do not know, as after a stall that
                // ends with leasehold's task queued: it polls the command's exit (ready: it is
                // read from the process table on every poll) before the timer wheel is turned.
                clock.advance(TTL);
                assert_eq!(world.kept.handle().remaining_validity(), Duration::ZERO);
                exit.send(ExitStatus::from_raw(0)).unwrap();
            }
        );
        assert!(ended.lease_lost, "{ended:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_command_that_leaves_nothing_behind_gets_no_signal() {
        let mut signals = Signals::new().unwrap();
        let world = World::new().await;
        let mut command = Scripted::exited_with(3);
        let stop = StopPolicy::new(TTL, Duration::from_secs(5));
        let ended = supervise(&mut command, &world.kept, stop, &mut signals).await;
        assert!(!ended.lease_lost);
        assert_eq!(ended.status.unwrap().code(), Some(3));
        assert!(command.signals().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn what_the_command_leaves_behind_is_stopped_with_sigterm() {
        let mut signals = Signals::new().unwrap();
        let world = World::new().await;
        let mut command = Scripted::left_behind(0, Signal::TERM);
        let stop = StopPolicy::new(TTL, Duration::from_secs(5));
        let ended = supervise(&mut command, &world.kept, stop, &mut signals).await;
        assert!(!ended.lease_lost);
        assert_eq!(ended.status.unwrap().code(), Some(0));
        assert_eq!(command.signals(), [Signal::TERM, Signal::CONT]);
    }

    #[tokio::test(start_paused = true)]
    async fn leftovers_that_ignore_sigterm_get_sigkill_after_the_grace() {
        let mut signals = Signals::new().unwrap();
        let world = World::new().await;
        let mut command = Scripted::left_behind(0, Signal::KILL);
        let grace = Duration::from_secs(1);
        let stop = StopPolicy::new(TTL, grace);
        let ended = supervise(&mut command, &world.kept, stop, &mut signals).await;
        assert!(!ended.lease_lost, "the lease is kept alive meanwhile");
        assert_eq!(
            command.signals(),
            [Signal::TERM, Signal::CONT, Signal::KILL]
        );
        assert_eq!(
            command.sent_at(Signal::KILL) - command.sent_at(Signal::TERM),
            grace
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_sigkill_for_leftovers_comes_before_validity_ends() {
        let mut signals = Signals::new().unwrap();
        let world = World::new().await;
        // No renewal is answered from here on.
        world
            .client
            .backend()
            .inject_many(Fault::LoseRequest, 1_000);
        let mut command = Scripted::left_behind(0, Signal::KILL);
        let stop = StopPolicy::new(TTL, Duration::from_secs(60));
        let valid_until = Instant::now() + world.kept.handle().remaining_validity();
        let ended = supervise(&mut command, &world.kept, stop, &mut signals).await;
        // Stopped before the lease ran out, though the grace is a minute; and reported as lost,
        // since the renewals went unanswered while the leftovers ran.
        assert!(command.sent_at(Signal::KILL) + stop.margin() <= valid_until);
        assert!(ended.lease_lost);
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_while_leftovers_run_kills_them_at_once() {
        let mut signals = Signals::new().unwrap();
        let world = World::new().await;
        let mut command = Scripted::left_behind(0, Signal::KILL);
        let stop = StopPolicy::new(TTL, Duration::from_secs(60));
        world.delete();
        let ended = supervise(&mut command, &world.kept, stop, &mut signals).await;
        assert!(ended.lease_lost);
        assert_eq!(ended.status.unwrap().code(), Some(0));
        // SIGTERM when the command exited; SIGKILL at the renewal that found the key gone (the
        // first is due a third of the TTL in), not a minute later.
        assert_eq!(
            command.signals(),
            [Signal::TERM, Signal::CONT, Signal::KILL]
        );
        assert_eq!(
            command.sent_at(Signal::KILL) - command.sent_at(Signal::TERM),
            TTL / 3
        );
    }
}
