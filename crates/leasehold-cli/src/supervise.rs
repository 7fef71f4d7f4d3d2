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
            status = command.exited() => return Ended { status, lease_lost: stopped },
            caught = signals.next() => command.signal(caught.signal()),
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
