//! The signals `leasehold run` catches and passes on to the command.

use std::io;

use rustix::process::Signal;
use tokio::signal::unix::{SignalKind, signal};

use crate::exit;

/// A signal leasehold passes on to the command (or gives up on, before the command starts).
///
/// Not only SIGINT and SIGTERM: a SIGHUP (a closed terminal or SSH session) or SIGQUIT
/// (`Ctrl-\`) ends a process by default too, and one that ended leasehold would leave the
/// command, in its own process group, running on after the lease lapsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caught {
    Hangup,
    Interrupt,
    Quit,
    Terminate,
}

impl Caught {
    pub(crate) fn signal(self) -> Signal {
        match self {
            Caught::Hangup => Signal::HUP,
            Caught::Interrupt => Signal::INT,
            Caught::Quit => Signal::QUIT,
            Caught::Terminate => Signal::TERM,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Caught::Hangup => "SIGHUP",
            Caught::Interrupt => "SIGINT",
            Caught::Quit => "SIGQUIT",
            Caught::Terminate => "SIGTERM",
        }
    }

    /// Returns true if and only if this signal asks the command to stop (SIGINT or SIGTERM),
    /// so that a second one, or the grace after the first, ends it with SIGKILL.
    pub(crate) fn asks_to_stop(self) -> bool {
        matches!(self, Caught::Interrupt | Caught::Terminate)
    }

    /// The exit code of a process ended by this signal.
    pub(crate) fn exit_code(self) -> u8 {
        exit::of_signal(self.signal().as_raw())
    }
}

/// SIGHUP, SIGINT, SIGQUIT and SIGTERM, caught from the start so that none of them kills
/// leasehold while it holds (or may hold) a lease.
pub(crate) struct Signals {
    hangup: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            hangup: signal(SignalKind::hangup())?,
            interrupt: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// Waits for the next one. Cancel safe.
    pub(crate) async fn next(&mut self) -> Caught {
        tokio::select! {
            Some(()) = self.hangup.recv() => Caught::Hangup,
            Some(()) = self.interrupt.recv() => Caught::Interrupt,
            Some(()) = self.quit.recv() => Caught::Quit,
            Some(()) = self.terminate.recv() => Caught::Terminate,
            else => std::future::pending().await,
        }
    }
}
