//! Stopping the command: when to escalate to SIGKILL, and signalling its process group.

use std::time::Duration;

use rustix::process::{Pid, Signal, WaitOptions};

use crate::log::tell;

/// When to stop the command, for one lease.
///
/// The command must be dead *before* the lease's validity ends, since from then on the server
/// may grant the lease to someone else. SIGKILL therefore comes after the grace or when only
/// the margin of validity is left, whichever is first; the margin covers the time a signal
/// takes to land and the process to die (and timer lateness), scaled to the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StopPolicy {
    grace: Duration,
    margin: Duration,
}

impl StopPolicy {
    /// The policy for a lease of `ttl`, with `grace` between SIGTERM and SIGKILL.
    pub(crate) fn new(ttl: Duration, grace: Duration) -> Self {
        let margin = (ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(500));
        Self { grace, margin }
    }

    /// How long after SIGTERM to send SIGKILL, given the validity left when SIGTERM is sent:
    /// `min(grace, remaining − margin)`, and at once when less than the margin is left.
    pub(crate) fn kill_after(&self, remaining_validity: Duration) -> Duration {
        self.grace
            .min(remaining_validity.saturating_sub(self.margin))
    }

    /// The validity left at which leasehold stops the command on its own, even if the
    /// keep-alive has not signalled a loss yet (a renewal stuck in flight, a late task): a
    /// backstop that still leaves one margin of grace.
    pub(crate) fn backstop(&self) -> Duration {
        self.margin * 2
    }

    /// Returns the time between SIGTERM and SIGKILL (`--grace`).
    pub(crate) fn grace(&self) -> Duration {
        self.grace
    }

    /// Returns the margin kept between the command's death and the end of validity.
    #[cfg(test)]
    pub(crate) fn margin(&self) -> Duration {
        self.margin
    }
}

/// The process group the command leads (it is started with its own group).
///
/// Signals go to the whole group, so that stopping the command also stops what it started: a
/// shell script's children would otherwise keep working after the lease was lost.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProcessGroup(Pid);

impl ProcessGroup {
    /// The group led by `pid`, or `None` for a pid that would address more than one group.
    pub(crate) fn led_by(pid: u32) -> Option<Self> {
        // Pid 0 and negative values address the caller's group or all processes: never those.
        i32::try_from(pid).ok().and_then(Pid::from_raw).map(Self)
    }

    /// Sends `signal` to every process in the group. A group that is already gone is fine.
    pub(crate) fn signal(&self, signal: Signal) {
        match rustix::process::kill_process_group(self.0, signal) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => {}
            Err(e) => tell!("leasehold: could not send {signal:?} to the command: {e}"),
        }
    }

    /// Reaps the group's exited processes that are leasehold's children, and returns true if
    /// and only if no process of the group is left.
    ///
    /// Call it only once the group's leader has been waited for: it would take the leader's
    /// status from under `tokio::process`. A zombie still counts as a member, hence the reaping;
    /// orphans of the group are leasehold's children because it is their subreaper
    /// ([`become_subreaper`]).
    pub(crate) fn is_empty(&self) -> bool {
        while let Ok(Some(_)) = rustix::process::waitpgid(self.0, WaitOptions::NOHANG) {}
        // Any other answer (EPERM: a member changed its user) means someone is still there.
        rustix::process::test_kill_process_group(self.0) == Err(rustix::io::Errno::SRCH)
    }
}

/// Makes leasehold the subreaper of what the command starts: a process whose parent exits is
/// re-parented to leasehold instead of init, so that leasehold can reap it and see the
/// command's group empty. (An init that does not reap, as in many containers, would otherwise
/// leave zombies in the group, and leasehold would wait for them until its bound.)
pub(crate) fn become_subreaper() {
    #[cfg(target_os = "linux")]
    {
        // The argument is a flag: any pid sets it.
        if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
            tell!("leasehold: cannot reap what the command leaves behind: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_margin_scales_with_the_ttl_within_bounds() {
        assert_eq!(StopPolicy::new(2000 * MS, 5000 * MS).margin(), 100 * MS);
        assert_eq!(StopPolicy::new(100 * MS, 5000 * MS).margin(), 5 * MS);
        assert_eq!(
            StopPolicy::new(Duration::from_secs(3600), 5000 * MS).margin(),
            500 * MS
        );
    }

    #[test]
    fn sigkill_comes_after_the_grace_or_before_validity_ends_whichever_is_first() {
        let policy = StopPolicy::new(2000 * MS, 5000 * MS);
        // Plenty left: the grace is cut so that death comes a margin before validity ends.
        assert_eq!(policy.kill_after(400 * MS), 300 * MS);
        // Less than the margin left: at once.
        assert_eq!(policy.kill_after(50 * MS), Duration::ZERO);
        assert_eq!(policy.kill_after(Duration::ZERO), Duration::ZERO);
        // A short grace is kept.
        let short = StopPolicy::new(2000 * MS, 100 * MS);
        assert_eq!(short.kill_after(400 * MS), 100 * MS);
        // The deadline never passes the end of validity minus the margin.
        for remaining in [0, 1, 99, 100, 101, 400, 5000, 60_000] {
            let remaining = remaining * MS;
            let after = policy.kill_after(remaining);
            assert!(
                after + policy.margin() <= remaining || after.is_zero(),
                "{remaining:?}"
            );
        }
    }

    #[test]
    fn the_backstop_leaves_a_margin_of_grace() {
        let policy = StopPolicy::new(2000 * MS, 5000 * MS);
        assert_eq!(policy.backstop(), 200 * MS);
        assert_eq!(policy.kill_after(policy.backstop()), policy.margin());
    }

    #[test]
    fn group_zero_is_refused() {
        assert!(ProcessGroup::led_by(0).is_none());
        assert!(ProcessGroup::led_by(u32::MAX).is_none());
        assert!(ProcessGroup::led_by(1234).is_some());
    }
}
