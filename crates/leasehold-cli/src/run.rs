//! `leasehold run`: acquire, run the command under the lease, stop it on loss, release.
//!
//! The order of events is the safety argument:
//!
//! 1. The command starts only with a *confirmed* grant: `Acquired`, or `Replayed` when an
//!    unknown outcome was resolved by replaying the same attempt.
//! 2. While it runs, the watchdog renews the lease. When the loss signal fires, or the
//!    validity left falls to the backstop (should the signal be late), the command's process
//!    group gets SIGTERM, then SIGKILL after the grace, capped so that the command is dead a
//!    margin before the validity ends ([`StopPolicy`](crate::stop::StopPolicy)); see
//!    [`supervise`].
//! 3. The lease is released only after the command has exited and nothing of its process
//!    group is left (what it leaves running is stopped like a lost lease's command).

use std::ffi::OsStr;
use std::io;
use std::time::Duration;

use leasehold_redis::RedisBackend;
use leasehold_redis::RedisLeases;
use leasehold_redis::leasehold::{
    AcquireOutcome, LeaseHandle, LeaseRequest, LeaseState, ReleaseOutcome, UnavailableCause,
    Watchdog,
};
use tokio::time::Instant;

use crate::config::RunConfig;
use crate::duration::format_duration;
use crate::exit;
use crate::signals::Signals;
use crate::stop::{self, ProcessGroup};
use crate::supervise::{Ended, Launched, supervise};

/// How long an unknown acquire outcome is replayed before giving up (never past the TTL).
const RESOLVE_BUDGET: Duration = Duration::from_secs(1);
/// Pause after every replay without a definite answer, so that a server that fails fast (a
/// refused port, a script error) is not hammered in a tight loop until the budget is spent.
const REPLAY_PAUSE: Duration = Duration::from_millis(50);
/// How long each step of the cleanup after an interrupted acquire may take: waiting for the
/// library's background cleanup, then releasing this attempt's grant.
const CLEANUP_BUDGET: Duration = Duration::from_secs(1);

/// Runs `leasehold run` and returns its exit code.
pub(crate) async fn run(config: RunConfig) -> u8 {
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("leasehold: cannot catch signals: {e}");
            return exit::FAILURE;
        }
    };
    let RunConfig {
        target,
        request,
        stop,
        program,
        args,
    } = config;
    let shown = target.shown;
    let client = RedisBackend::into_client(target.backend);

    let acquired = tokio::select! {
        acquired = acquire(&client, &request, &shown) => acquired,
        caught = signals.next() => {
            eprintln!("leasehold: {} before the command started; giving up", caught.name());
            abandon(&client, &request).await;
            return caught.exit_code();
        }
    };
    let lease = match acquired {
        Ok(lease) => lease,
        Err(code) => return code,
    };

    let watchdog = Watchdog::default();
    let kept = match watchdog.keep(lease) {
        Ok(kept) => kept,
        Err((e, lease)) => {
            eprintln!("leasehold: cannot keep the lease alive: {e}; the command was not started");
            report_release(lease.release().await);
            return exit::UNAVAILABLE;
        }
    };
    // A replayed grant may have little validity left: never start work that would have to be
    // stopped at once.
    if kept.signal().is_lost() || kept.handle().remaining_validity() <= stop.backstop() {
        eprintln!(
            "leasehold: the grant is about to expire (validity left {}); the command was not \
             started",
            format_duration(kept.handle().remaining_validity())
        );
        report_release(kept.release().await);
        return exit::UNAVAILABLE;
    }

    stop::become_subreaper();
    let mut child = match spawn(&program, &args, kept.handle()) {
        Ok(child) => child,
        Err(e) => {
            let code = if e.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            eprintln!("leasehold: cannot run {}: {e}", program.display());
            report_release(kept.release().await);
            return code;
        }
    };
    let Some(group) = child.id().and_then(ProcessGroup::led_by) else {
        // A freshly spawned child always has a pid; this is unreachable in practice.
        eprintln!("leasehold: the command has no process id; stopping it");
        let _ = child.kill().await;
        report_release(kept.release().await);
        return exit::FAILURE;
    };
    let mut command = Launched { child, group };

    // Returns once nothing of the command's group is left: only then may the lease go.
    let Ended { status, lease_lost } = supervise(&mut command, &kept, stop, &mut signals).await;
    let ended_early = report_release(kept.release().await);
    if lease_lost {
        eprintln!(
            "leasehold: the lease was lost while the command ran; its work may not have been \
             covered by the lease"
        );
        return exit::LEASE_LOST;
    }
    if let Some(found) = ended_early {
        // The command exited while the lease still looked valid, yet the grant was gone by
        // the release: it ended before the work did, and may have been granted to another.
        eprintln!(
            "leasehold: the lease ended before the command did: the release found {found}; its \
             work may not have been covered by the lease (the command exited {})",
            match &status {
                Ok(status) => format!("with status {}", exit::of_child(*status)),
                Err(_) => "untracked".to_owned(),
            }
        );
        return exit::LEASE_LOST;
    }
    match status {
        Ok(status) => exit::of_child(status),
        Err(e) => {
            eprintln!("leasehold: lost track of the command ({e}); it was killed");
            exit::FAILURE
        }
    }
}

/// Acquires, waiting up to the request's wait timeout; resolves an unknown outcome by replay.
async fn acquire(
    client: &RedisLeases,
    request: &LeaseRequest,
    shown: &str,
) -> Result<LeaseHandle<RedisBackend>, u8> {
    match client.acquire(request).await {
        AcquireOutcome::Acquired(lease) | AcquireOutcome::Replayed(lease) => Ok(lease),
        AcquireOutcome::Indeterminate { cause, .. } => {
            eprintln!(
                "leasehold: the acquire's outcome is unknown ({cause}); replaying the same \
                 attempt to find out"
            );
            resolve(client, request, shown, cause.to_string()).await
        }
        other => Err(not_acquired(other, request, shown)),
    }
}

/// Replays the same attempt until the outcome is known or the budget is spent.
///
/// A replay either finds this attempt's grant (`Replayed`: confirmed, with the validity the
/// server has left), makes it now (`Acquired`), or finds another holder. Giving up leaves a
/// grant that may exist to its TTL: without a reply there is no handle to release it with.
async fn resolve(
    client: &RedisLeases,
    request: &LeaseRequest,
    shown: &str,
    mut last: String,
) -> Result<LeaseHandle<RedisBackend>, u8> {
    let budget = RESOLVE_BUDGET.min(request.ttl());
    let deadline = Instant::now() + budget;
    while Instant::now() < deadline {
        match client.try_acquire(request).await {
            AcquireOutcome::Acquired(lease) | AcquireOutcome::Replayed(lease) => return Ok(lease),
            // An unknown outcome can come back as fast as a refusal (a script error, a reset
            // connection): every answer that is not definite is followed by the pause.
            AcquireOutcome::Indeterminate { cause, .. } => last = cause.to_string(),
            AcquireOutcome::Unavailable(u) => last = u.to_string(),
            AcquireOutcome::Overloaded => last = "too many commands in flight".to_owned(),
            other => return Err(not_acquired(other, request, shown)),
        }
        tokio::time::sleep_until((Instant::now() + REPLAY_PAUSE).min(deadline)).await;
    }
    let unknown = format!(
        "leasehold: the outcome is still unknown after {} ({last}); the command was not started",
        format_duration(budget)
    );
    // Redis may still apply the unanswered acquire: a stalled server runs what waits on its
    // socket when it resumes, long after we are gone. A release of this attempt sent now goes
    // behind it on the same connection, and undoes that grant the moment it is made.
    match tokio::time::timeout(CLEANUP_BUDGET, client.release_attempt(request)).await {
        Ok(ReleaseOutcome::Released) => {
            eprintln!("{unknown}; the acquire had been applied, and its grant is released");
        }
        Ok(ReleaseOutcome::AlreadyGone | ReleaseOutcome::NotOwner) => {
            eprintln!("{unknown}; no grant of this attempt is left");
        }
        _ => eprintln!(
            "{unknown}. A release of this attempt was sent behind the acquire on the same \
             connection: Redis runs them in order, so a grant it makes when it gets to the \
             acquire is removed at once. Only if that connection broke first can a grant \
             still appear, when Redis applies the acquire, and live up to {} from then.",
            format_duration(request.ttl())
        ),
    }
    Err(exit::UNAVAILABLE)
}

/// Reports an outcome that carries no lease and returns the exit code for it.
fn not_acquired(outcome: AcquireOutcome<RedisBackend>, request: &LeaseRequest, shown: &str) -> u8 {
    match outcome {
        AcquireOutcome::Contended(c) | AcquireOutcome::OwnerOperationConflict(c) => {
            let holder = c
                .holder
                .map_or_else(|| "another owner".to_owned(), |h| h.to_string());
            let fence = c
                .fence
                .map_or_else(String::new, |f| format!(" with fence {f}"));
            let within = if request.wait_timeout().is_zero() {
                String::new()
            } else {
                format!(" within {}", format_duration(request.wait_timeout()))
            };
            eprintln!(
                "leasehold: not acquired{within}: held by {holder}{fence}, retry after {}",
                format_duration(c.retry_after)
            );
            exit::NOT_ACQUIRED
        }
        AcquireOutcome::Unavailable(u) => {
            if let UnavailableCause::UnusableKey(what) = u.cause {
                return exit::unusable_key(what, shown);
            }
            eprintln!("leasehold: Redis unavailable at {shown}: {u}; the command was not started");
            exit::UNAVAILABLE
        }
        AcquireOutcome::Overloaded => {
            eprintln!("leasehold: too many commands in flight; the command was not started");
            exit::UNAVAILABLE
        }
        other => {
            eprintln!(
                "leasehold: unexpected acquire outcome {}; the command was not started",
                other.name()
            );
            exit::UNAVAILABLE
        }
    }
}

/// Cleans up after an acquire that was interrupted: a grant may exist for the attempt.
///
/// First the library's own cleanup: a waiting acquire that is dropped releases its attempt's
/// grant in a background task, which the runtime's shutdown at exit
/// would cut off half-way. Then, with the background quiet, this attempt's grant is released
/// (whatever its fence, never by making one), retried at a pace until a definite answer or the
/// budget's end. Anything short of a definite answer is reported.
async fn abandon(client: &RedisLeases, request: &LeaseRequest) {
    if tokio::time::timeout(CLEANUP_BUDGET, client.settle())
        .await
        .is_err()
    {
        eprintln!(
            "leasehold: the interrupted acquire's own cleanup did not finish within {}",
            format_duration(CLEANUP_BUDGET)
        );
    }
    let deadline = Instant::now() + CLEANUP_BUDGET;
    let mut last = "no answer".to_owned();
    let cleaned = tokio::time::timeout_at(deadline, async {
        loop {
            match release_this_attempt(client, request).await {
                Ok(()) => return,
                Err(why) => last = why,
            }
            tokio::time::sleep(REPLAY_PAUSE).await;
        }
    })
    .await;
    if cleaned.is_err() {
        eprintln!(
            "leasehold: could not confirm that no grant is left ({last}); a grant may live until \
             its TTL ({})",
            format_duration(request.ttl())
        );
    }
}

/// Releases this attempt's grant if there is one, never making one. `Ok` means none is left
/// for certain: it was released, or there was none; `Err` says why that is not known.
async fn release_this_attempt(client: &RedisLeases, request: &LeaseRequest) -> Result<(), String> {
    match client.release_attempt(request).await {
        ReleaseOutcome::Released | ReleaseOutcome::AlreadyGone | ReleaseOutcome::NotOwner => Ok(()),
        ReleaseOutcome::Indeterminate(i) => Err(i.to_string()),
        ReleaseOutcome::Unavailable(u) => Err(u.to_string()),
        other => Err(format!("{other:?}")),
    }
}

fn spawn(
    program: &OsStr,
    args: &[std::ffi::OsString],
    lease: &LeaseHandle<RedisBackend>,
) -> io::Result<tokio::process::Child> {
    tokio::process::Command::new(program)
        .args(args)
        .env("LEASEHOLD_FENCE", lease.fence().get().to_string())
        .env("LEASEHOLD_RESOURCE_DIGEST", lease.resource().as_str())
        .env("LEASEHOLD_TTL_MS", lease.ttl().as_millis().to_string())
        // Its own group: a stop reaches everything it started, and a terminal's Ctrl-C reaches
        // it once, through leasehold, not twice.
        .process_group(0)
        .spawn()
}

/// Reports a release that was not confirmed. Returns what the release found when it proves the
/// lease had ended before it: no grant at all, or another grant.
fn report_release(outcome: ReleaseOutcome) -> Option<&'static str> {
    match outcome {
        ReleaseOutcome::Released => None,
        ReleaseOutcome::AlreadyGone => Some("no grant (expired, deleted, evicted or lost)"),
        ReleaseOutcome::NotOwner => Some("another grant"),
        ReleaseOutcome::Refused {
            state: LeaseState::Lost,
        } => Some("that the lease was lost"),
        // Released already: nothing left to release.
        ReleaseOutcome::Refused { .. } => None,
        other => {
            let why = match &other {
                ReleaseOutcome::Indeterminate(i) => i.to_string(),
                ReleaseOutcome::Unavailable(u) => u.to_string(),
                other => format!("{other:?}"),
            };
            eprintln!(
                "leasehold: the release was not confirmed ({why}); the lease lives until its TTL \
                 runs out"
            );
            None
        }
    }
}
