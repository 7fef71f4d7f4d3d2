//! The command under the lease: wait for it, pass signals on, stop it when the lease is lost.
//!
//! [`supervise`] sees the command through [`CommandGroup`]: its own process's exit, and its
//! process group to signal. [`Launched`] is the real one; the tests drive the same loop with a
//! scripted command against the simulated lease, in paused time.

use std::io;
use std::process::ExitStatus;

use leasehold_redis::leasehold::{KeptLease, LeaseBackend};
use rustix::process::Signal;
use tokio::time::Instant;

use crate::duration::format_duration;
use crate::signals::Signals;
use crate::stop::{ProcessGroup, StopPolicy};

/// A started command as [`supervise`] sees it.
pub(crate) trait CommandGroup {
    /// Waits for the command's own process to exit.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped wait can be started again.
    fn exited(&mut self) -> impl Future<Output = io::Result<ExitStatus>>;

    /// Sends `signal` to every process in the command's group.
    fn signal(&self, signal: Signal);
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
}

/// How the supervised command ended.
#[derive(Debug)]
pub(crate) struct Ended {
    /// The exit status of the command's own process.
    pub(crate) status: io::Result<ExitStatus>,
    /// Returns true if and only if the lease was lost (or its validity ran down to the
    /// backstop) before the command's exit was seen, and leasehold stopped it.
    pub(crate) lease_lost: bool,
}

/// Waits for the command to exit, passing signals on and stopping it when the lease is lost.
pub(crate) async fn supervise<B: LeaseBackend>(
    command: &mut impl CommandGroup,
    kept: &KeptLease<B>,
    stop: StopPolicy,
    signals: &mut Signals,
) -> Ended {
    let mut stopped = false;
    let mut kill_at: Option<Instant> = None;
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
            // the answer is 70 every time, never a coin toss between 70 and the command's code.
            // No branch can starve another: the loss and backstop branches fire once, the
            // SIGKILL deadline once, and signals only when sent.
            biased;
            reason = kept.signal().lost(), if !stopped => {
                stopped = true;
                kill_at = begin_stop(command, kept, stop, &format!("{reason:?}"));
            }
            () = tokio::time::sleep(until_backstop), if !stopped => {
                if kept.handle().remaining_validity() <= stop.backstop() {
                    stopped = true;
                    kill_at = begin_stop(command, kept, stop, "validity about to end");
                }
            }
            () = sleep_until_or_never(kill_at) => {
                command.signal(Signal::KILL);
                kill_at = None;
            }
            caught = signals.next() => command.signal(caught.signal()),
            status = command.exited() => return Ended { status, lease_lost: stopped },
        }
    }
}

/// Sends SIGTERM and returns when SIGKILL is due (`None`: sent already).
fn begin_stop<B: LeaseBackend>(
    command: &impl CommandGroup,
    kept: &KeptLease<B>,
    stop: StopPolicy,
    reason: &str,
) -> Option<Instant> {
    let kill_after = stop.kill_after(kept.handle().remaining_validity());
    let now = Instant::now();
    eprintln!(
        "leasehold: lease lost ({reason}); stopping the command: SIGTERM now, SIGKILL in {}",
        format_duration(kill_after)
    );
    command.signal(Signal::TERM);
    // A stopped process would hold SIGTERM pending until it is continued.
    command.signal(Signal::CONT);
    if kill_after.is_zero() {
        command.signal(Signal::KILL);
        return None;
    }
    Some(now + kill_after)
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

    use std::cell::RefCell;
    use std::os::unix::process::ExitStatusExt as _;
    use std::time::Duration;

    use leasehold::sim::{SimBackend, SimServer};
    use leasehold::{
        AcquireOutcome, LeaseClient, LossReason, OperationId, Purpose, ResourceDigest, TokioClock,
        Watchdog,
    };

    use super::*;

    const TTL: Duration = Duration::from_secs(3);
    const COMMAND_TIMEOUT: Duration = Duration::from_millis(200);

    /// A command whose exit the test decides, recording the signals its group gets.
    #[derive(Debug, Default)]
    struct Scripted {
        /// Its exit status once it has exited; `None` runs until the test says otherwise.
        status: Option<ExitStatus>,
        signals: RefCell<Vec<Signal>>,
    }

    impl Scripted {
        fn exited_with(code: i32) -> Self {
            Self {
                status: Some(ExitStatus::from_raw(code << 8)),
                ..Self::default()
            }
        }

        fn signals(&self) -> Vec<Signal> {
            self.signals.borrow().clone()
        }
    }

    impl CommandGroup for Scripted {
        fn exited(&mut self) -> impl Future<Output = io::Result<ExitStatus>> {
            let status = self.status;
            async move {
                match status {
                    Some(status) => Ok(status),
                    None => std::future::pending().await,
                }
            }
        }

        fn signal(&self, signal: Signal) {
            self.signals.borrow_mut().push(signal);
        }
    }

    /// A simulated server and a lease kept on it, on tokio's (paused) clock.
    struct World {
        server: SimServer,
        kept: KeptLease<SimBackend>,
    }

    impl World {
        async fn new() -> Self {
            let clock = TokioClock::new();
            let server = SimServer::with_clock(clock);
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
            let kept = Watchdog::default().keep(lease).map_err(|(e, _)| e).unwrap();
            Self { server, kept }
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
}
