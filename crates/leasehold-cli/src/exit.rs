//! Exit codes: a contract scripts depend on. Change none without a changelog entry.
//!
//! The numbers outside the child's own range follow `sysexits.h` where one fits (75
//! `EX_TEMPFAIL`: try again later; 69 `EX_UNAVAILABLE`; 70 `EX_SOFTWARE`; 65 `EX_DATAERR`;
//! 78 `EX_CONFIG`), the shell's
//! conventions for a command that cannot be run (126, 127) or was ended by signal N (128 + N),
//! and clap's 2 for usage errors.

use std::process::{ExitCode, ExitStatus};

use leasehold_redis::leasehold::{Unavailable, UnavailableCause, UnusableKey};

/// A flag, a duration or a value is wrong, nothing was sent; or the configuration it names is
/// wrong for the server (a database it does not have, credentials it refuses), nothing was
/// written.
pub(crate) const USAGE: u8 = 2;
/// The lease was not acquired within `--wait` (another holder has it).
pub(crate) const NOT_ACQUIRED: u8 = 75;
/// Redis is unavailable, or the outcome stayed unknown, before the command started.
pub(crate) const UNAVAILABLE: u8 = 69;
/// The lease was lost while the command ran (the command was stopped), or the release found
/// that it had ended before the command did.
pub(crate) const LEASE_LOST: u8 = 70;
/// A key the lease needs holds something leasehold cannot use (`EX_DATAERR`); nothing was
/// written.
pub(crate) const UNUSABLE_KEY: u8 = 65;
/// The semaphore records another capacity than `run --capacity` asked for (`EX_CONFIG`: the
/// runs of one semaphore are configured apart); nothing was written and the command was not
/// started. Not a usage error: the input is well formed, the server's record disagrees, and
/// trying again does not help until one of them changes.
pub(crate) const CAPACITY_MISMATCH: u8 = 78;
/// The command was found but could not be started.
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
pub(crate) const NOT_FOUND: u8 = 127;
/// Anything else went wrong (the demo's story broke, say).
pub(crate) const FAILURE: u8 = 1;
/// Stdout was closed under us (`leasehold demo | head`): 128 + SIGPIPE, as the shell reports a
/// tool that SIGPIPE ended. (Rust programs ignore SIGPIPE, so the write fails instead.)
pub(crate) const BROKEN_PIPE: u8 = 128 + 13;

/// Says what is wrong with a key the lease needs, and returns [`UNUSABLE_KEY`].
pub(crate) fn unusable_key(what: UnusableKey, shown: &str) -> u8 {
    let remedy = match what {
        UnusableKey::FenceRangeExhausted => {
            "no larger fence can be issued; lease this resource under another purpose or \
             namespace"
        }
        _ => {
            "something other than leasehold wrote there; remove or rename that key, or use \
             another --namespace"
        }
    };
    eprintln!(
        "leasehold: cannot use the lease's keys at {shown}: {what}; nothing was written: {remedy}"
    );
    UNUSABLE_KEY
}

/// Says what is wrong when `u` is a refusal that trying again cannot fix — a key the lease
/// needs holds something else ([`UNUSABLE_KEY`]), or the URL is wrong for this server, as a
/// flag can be ([`USAGE`], the code of every configuration error): it names a database the
/// server does not have, or credentials it refuses — and returns the exit code; `None` for
/// any other cause.
pub(crate) fn lasting_refusal(u: &Unavailable, shown: &str) -> Option<u8> {
    match u.cause {
        UnavailableCause::UnusableKey(what) => Some(unusable_key(what, shown)),
        UnavailableCause::NoSuchDatabase => {
            eprintln!(
                "leasehold: {shown}: the server has no database of the URL's index (it refused \
                 SELECT); use an index below its `databases` setting (16 unless configured)"
            );
            Some(USAGE)
        }
        UnavailableCause::NoPermission => {
            // The detail is the server's error (WRONGPASS, NOAUTH, NOPERM), never the URL.
            eprintln!(
                "leasehold: {shown}: the server refused the credentials ({u}); nothing was \
                 written: check the user and password in the URL (--redis or \
                 LEASEHOLD_REDIS_URL), and that the user's ACL allows what leasehold runs"
            );
            Some(USAGE)
        }
        _ => None,
    }
}

/// Returns true if and only if `error` is, or was caused by, a write to a closed pipe.
pub(crate) fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// The short form, shown under `-h`.
pub(crate) const SUMMARY: &str = "\
Exit status of `run`: the command's own (128+N if signal N ended it); 75 lease not acquired
within --wait; 69 Redis unavailable or outcome unknown before the command started; 70 lease
lost while the command ran, or found gone at release; 65 a lease key holds something
leasehold cannot use; 78 the semaphore has another capacity than --capacity; 126/127
command not executable / not found; 2 usage or configuration
error (a bad flag or URL, a database the server lacks, credentials it refuses); 1 internal
failure. Use --help for more.";

/// The full table, shown under `--help`.
pub(crate) const TABLE: &str = "\
Exit status of `run`:
  0-255    the command ran to completion: its own exit code
  128+N    the command was ended by signal N (e.g. 143 for SIGTERM, 137 for SIGKILL)
  75       the lease was not acquired within --wait: another holder has it
  69       Redis unavailable, or the acquire's outcome stayed unknown, before the command
           started; the command was not started
  70       the lease was lost while the command (or what it left running) ran, and it was
           stopped; or the command finished but the release found the lease already gone
           (expired, deleted, evicted, lost in a restart) or held by another grant: its work
           may not have been covered by the lease
  65       a key the lease needs holds something leasehold cannot use (a hash, a list or a
           string leasehold did not write, of any size, at the lease key; a fence counter that
           is not a fence or is at 2^63-1); nothing was written and the command was not
           started
  78       --capacity N: the semaphore's recorded capacity is another (every run of it must
           ask for the same; `leasehold capacity` changes it); nothing was written and the
           command was not started
  126      the command could not be executed
  127      the command was not found
  2        usage or configuration error: a bad flag, variable, duration or URL, nothing
           sent; or a URL wrong for the server, nothing written: a database index it does not
           have (it refused SELECT), or credentials it refuses (a wrong or missing password,
           a user whose ACL lacks what leasehold runs)
  1        leasehold itself failed: it could not catch signals or lost track of the command
If leasehold itself gets SIGHUP, SIGINT, SIGQUIT or SIGTERM before the command starts, it
gives up and exits with 128+N (129, 130, 131, 143).

`inspect`: 0 (held or free), 69 Redis unavailable or no answer, 65 a lease key holds
something leasehold cannot use, 2 usage or configuration error (as for `run`).
`list`: 0 (even none), 69, 2. `break`: 0 (removed, or nothing to remove), 69 (unavailable,
or no answer: `inspect` tells whether it was removed), 65, 2 (also: no --yes).
`capacity`: 0 (set), 69 (unavailable, or no answer: `inspect --semaphore` tells whether it
was set), 65, 2.
`demo`: 0, 69 no redis-server could be started or reached, 2 usage or configuration error,
1 otherwise.

Environment: LEASEHOLD_REDIS_URL (--redis), LEASEHOLD_NAMESPACE (--namespace),
LEASEHOLD_REDIS_SERVER (the redis-server binary `demo` starts).";

/// The exit code that reports how a child process ended: its code, or 128 + the signal.
pub(crate) fn of_child(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt as _;
    if let Some(code) = status.code() {
        // A process's exit code is already 0..=255 on Unix.
        return u8::try_from(code & 0xff).unwrap_or(FAILURE);
    }
    status.signal().map_or(FAILURE, of_signal)
}

/// The exit code that reports a process ended by signal `signal`: 128 + N, the shell's rule.
pub(crate) fn of_signal(signal: i32) -> u8 {
    u8::try_from(128 + signal).unwrap_or(FAILURE)
}

/// Converts to `ExitCode`.
pub(crate) fn code(code: u8) -> ExitCode {
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt as _;

    #[test]
    fn children_report_their_code_or_128_plus_the_signal() {
        // Raw wait statuses: exit code in the high byte, terminating signal in the low bits.
        assert_eq!(of_child(ExitStatus::from_raw(0)), 0);
        assert_eq!(of_child(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(of_child(ExitStatus::from_raw(255 << 8)), 255);
        assert_eq!(of_child(ExitStatus::from_raw(15)), 143);
        assert_eq!(of_child(ExitStatus::from_raw(9)), 137);
        assert_eq!(of_child(ExitStatus::from_raw(2)), 130);
        assert_eq!(of_signal(1), 129);
        assert_eq!(of_signal(3), 131);
    }

    #[test]
    fn the_codes_are_distinct() {
        let codes = [
            USAGE,
            NOT_ACQUIRED,
            UNAVAILABLE,
            LEASE_LOST,
            UNUSABLE_KEY,
            CAPACITY_MISMATCH,
            CANNOT_EXECUTE,
            NOT_FOUND,
            FAILURE,
            BROKEN_PIPE,
        ];
        let mut sorted = codes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), codes.len());
    }
}
