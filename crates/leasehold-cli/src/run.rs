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
use std::io::{self, Write as _};
use std::time::Duration;

use leasehold_redis::RedisBackend;
use leasehold_redis::RedisLeases;
use leasehold_redis::leasehold::{
    Abandoned, AcquireOutcome, InspectOutcome, LeaseHandle, LeaseRequest, LeaseState, LossReason,
    ReleaseOutcome, UnavailableCause,
};

use crate::config::RunConfig;
use crate::duration::format_duration;
use crate::exit;
use crate::inspect;
use crate::log::{note, tell};
use crate::remedy;
use crate::signals::Signals;
use crate::stop::{self, ProcessGroup};
use crate::supervise::{Ended, Launched, supervise};

/// How long an unknown acquire outcome is replayed before giving up (never past the TTL).
const RESOLVE_BUDGET: Duration = Duration::from_secs(1);
/// How long the cleanup after an acquire given up on may take: the library's background
/// cleanup, then releasing this attempt's grant.
const CLEANUP_BUDGET: Duration = Duration::from_secs(2);

/// What `run --json` reports at the end, filled in as the run goes.
#[derive(Debug, Default)]
struct Report {
    /// `completed`, `not_acquired`, `lost`, `unavailable`, `unusable_key`,
    /// `capacity_mismatch`, `not_started`, `interrupted` or `failed`.
    outcome: &'static str,
    fence: Option<u64>,
    /// With `--capacity`: the permit's slot.
    slot: Option<u32>,
    waited: Option<Duration>,
    held: Option<Duration>,
    command_exit: Option<u8>,
    release: Option<&'static str>,
}

impl Report {
    /// The JSON line: one object, every key always present.
    fn line(&self, exit: u8) -> String {
        let ms = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        serde_json::json!({
            "outcome": if self.outcome.is_empty() { "failed" } else { self.outcome },
            "exit": exit,
            "command_exit": self.command_exit,
            "fence": self.fence,
            "waited_ms": ms(self.waited),
            "held_ms": ms(self.held),
            "release": self.release,
            "slot": self.slot,
        })
        .to_string()
    }
}

/// Runs `leasehold run` and returns its exit code; with `--json`, writes its report last, on
/// stdout: the messages stay on stderr, so that a script reads the report alone (after
/// whatever the command itself printed there).
pub(crate) async fn run(config: RunConfig) -> u8 {
    let json = config.json;
    let mut report = Report::default();
    let code = run_reporting(config, &mut report).await;
    if json {
        // The exit code already tells the outcome: a closed stdout does not change it.
        if let Err(e) = writeln!(io::stdout(), "{}", report.line(code))
            && e.kind() != io::ErrorKind::BrokenPipe
        {
            tell!("leasehold: cannot write the JSON report: {e}");
        }
    }
    code
}

async fn run_reporting(config: RunConfig, report: &mut Report) -> u8 {
    let started = std::time::Instant::now();
    let mut signals = match Signals::new() {
        Ok(signals) => signals,
        Err(e) => {
            tell!("leasehold: cannot catch signals: {e}");
            return exit::FAILURE;
        }
    };
    let RunConfig {
        target,
        request,
        stop,
        wait_forever,
        wait_text,
        conflict_exit_code,
        loss_exit_code,
        json: _,
        resource_name,
        program,
        args,
    } = config;
    let exits = Exits {
        conflict: conflict_exit_code,
        loss: loss_exit_code,
    };
    let shown = target.shown;
    let client = RedisBackend::into_client(target.backend);

    let acquired = tokio::select! {
        acquired = acquire(
            &client, &request, &shown, &resource_name, wait_forever, &wait_text, exits,
        ) => acquired,
        caught = signals.next() => {
            tell!("leasehold: {} before the command started; giving up", caught.name());
            abandon(&client, &request).await;
            report.outcome = "interrupted";
            report.waited = Some(started.elapsed());
            return caught.exit_code();
        }
    };
    report.waited = Some(started.elapsed());
    let lease = match acquired {
        Ok(lease) => lease,
        Err((code, outcome)) => {
            report.outcome = outcome;
            return code;
        }
    };
    report.fence = Some(lease.fence().get());
    report.slot = lease.slot();
    let granted = std::time::Instant::now();
    report.outcome = "not_started";

    // From here the one-call layer's guard keeps the lease alive and releases it; a lease it
    // cannot keep has been released already.
    let kept = match client.guard(lease).await {
        Ok(kept) => kept,
        Err(e) => {
            tell!("leasehold: cannot keep the lease alive: {e}; the command was not started");
            report.outcome = "unavailable";
            return exit::UNAVAILABLE;
        }
    };
    // A replayed grant may have little validity left: never start work that would have to be
    // stopped at once.
    if kept.signal().is_lost() || kept.handle().remaining_validity() <= stop.backstop() {
        tell!(
            "leasehold: the grant is about to expire (validity left {}); the command was not \
             started",
            format_duration(kept.handle().remaining_validity())
        );
        report_release(released(kept.release().await, report, granted));
        report.outcome = "unavailable";
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
            tell!("leasehold: cannot run {}: {e}", program.display());
            report_release(released(kept.release().await, report, granted));
            return code;
        }
    };
    let Some(group) = child.id().and_then(ProcessGroup::led_by) else {
        // A freshly spawned child always has a pid; this is unreachable in practice.
        tell!("leasehold: the command has no process id; stopping it");
        let _ = child.kill().await;
        report_release(released(kept.release().await, report, granted));
        return exit::FAILURE;
    };
    let mut command = Launched { child, group };
    if let Some(pid) = command.child.id() {
        tracing::info!(pid, "the command started");
    }

    // Returns once nothing of the command's group is left: only then may the lease go.
    let Ended { status, lease_lost } = supervise(&mut command, &kept, stop, &mut signals).await;
    let lost_at_server = matches!(
        kept.signal().reason(),
        Some(LossReason::LostToAnother | LossReason::MasterReplaced)
    );
    match &status {
        Ok(status) => {
            report.command_exit = Some(exit::of_child(*status));
            tracing::info!(exit = exit::of_child(*status), "the command ended");
        }
        Err(e) => tracing::info!(error = %e, "the command ended, untracked"),
    }
    let release = released(kept.release().await, report, granted);
    tracing::info!(outcome = %release, "released the lease");
    let ended_early = report_release(release);
    if lease_lost {
        let found = if lost_at_server {
            found_after_loss(&client, &request, report.slot).await
        } else {
            String::new()
        };
        let what = held(&request);
        tell!(
            "leasehold: the {what} was lost while the command ran{found}; its work may not have \
             been covered by the {what}"
        );
        report.outcome = "lost";
        return exits.loss;
    }
    if let Some(found) = ended_early {
        // The command exited while the lease still looked valid, yet the grant was gone by
        // the release: it ended before the work did, and may have been granted to another.
        let what = held(&request);
        tell!(
            "leasehold: the {what} ended before the command did: the release found {found}; its \
             work may not have been covered by the {what} (the command exited {})",
            match &status {
                Ok(status) => format!("with status {}", exit::of_child(*status)),
                Err(_) => "untracked".to_owned(),
            }
        );
        report.outcome = "lost";
        return exits.loss;
    }
    match status {
        Ok(status) => {
            report.outcome = "completed";
            exit::of_child(status)
        }
        Err(e) => {
            tell!("leasehold: lost track of the command ({e}); it was killed");
            exit::FAILURE
        }
    }
}

/// What the server holds now for a lease a renewal found it no longer held, as a clause for
/// the loss message (empty when it cannot be read).
///
/// Read after the command is gone, so that it delays no signal. It tells what is there now,
/// not what the renewal met: a key found gone may have been removed by an operator or
/// another client, or have expired, been evicted or flushed; and a new grant may have come
/// since.
async fn found_after_loss(
    client: &RedisLeases,
    request: &LeaseRequest,
    slot: Option<u32>,
) -> String {
    if let Some(slot) = slot {
        return found_after_permit_loss(client, request, slot).await;
    }
    match client
        .inspect(request.purpose(), request.resource(), None)
        .await
    {
        InspectOutcome::Free => ": the lease's key is gone from the server: it was removed (by \
             `leasehold break` or another client deleting the key), or it expired, was evicted \
             or was flushed"
            .to_owned(),
        InspectOutcome::HeldByOther(view) => {
            let (holder, fence, _) = inspect::parts(&view);
            format!(": another grant holds the lease now ({holder}, {fence})")
        }
        _ => String::new(),
    }
}

/// [`found_after_loss`] for a permit: what the server holds now on its slot.
async fn found_after_permit_loss(
    client: &RedisLeases,
    request: &LeaseRequest,
    slot: u32,
) -> String {
    let permits = match client
        .backend()
        .inspect_semaphore(request.purpose(), request.resource())
        .await
    {
        Ok(Some(semaphore)) => semaphore.permits,
        // No semaphore left at all (a flush, say): its slot's key is gone too.
        Ok(None) => Vec::new(),
        Err(_) => return String::new(),
    };
    match permits.iter().find(|p| p.slot == slot) {
        None => format!(
            ": slot {slot}'s key is gone from the server: it was removed (by `leasehold break \
             --slot {slot}` or another client deleting the key), or it expired, was evicted or \
             was flushed"
        ),
        Some(permit) => {
            let (holder, fence, _) = inspect::parts(&permit.view);
            format!(": another grant holds slot {slot} now ({holder}, {fence})")
        }
    }
}

/// What a run holds, in messages: a lease, or a permit of a semaphore.
fn held(request: &LeaseRequest) -> &'static str {
    if request.capacity().is_some() {
        "permit"
    } else {
        "lease"
    }
}

/// The exit statuses `run` was told to use.
#[derive(Debug, Clone, Copy)]
struct Exits {
    /// Another holder has the lease.
    conflict: u8,
    /// The lease was lost while the command ran.
    loss: u8,
}

/// Records a release's outcome and the time held in `report`, and passes the outcome on.
fn released(
    outcome: ReleaseOutcome,
    report: &mut Report,
    granted: std::time::Instant,
) -> ReleaseOutcome {
    report.release = Some(outcome.kind());
    report.held = Some(granted.elapsed());
    outcome
}

/// Acquires, waiting up to the request's wait timeout (with `forever`, again after every wait
/// that ends contended); resolves an unknown outcome by replay. A refusal is the exit code and
/// the report's outcome.
///
/// Giving up on an outcome that stayed unknown cleans up behind it ([`abandon`]): without a
/// reply there is no handle to release a grant with, and a stalled server may still apply the
/// acquire long after this process is gone.
async fn acquire(
    client: &RedisLeases,
    request: &LeaseRequest,
    shown: &str,
    resource_name: &str,
    forever: bool,
    wait_text: &str,
    exits: Exits,
) -> Result<LeaseHandle<RedisBackend>, (u8, &'static str)> {
    let permit = request.capacity().is_some();
    let outcome = loop {
        let outcome = match client.acquire(request).await {
            AcquireOutcome::Indeterminate { cause, .. } => {
                note!(
                    "leasehold: the acquire's outcome is unknown ({cause}); replaying the same \
                     attempt to find out"
                );
                client.resolve(request, cause, RESOLVE_BUDGET).await
            }
            other => other,
        };
        match outcome {
            AcquireOutcome::Contended(_) if forever => {
                if permit {
                    // A permit's wait that ends contended gives its place in the queue back in
                    // the background, with a release of whatever this attempt holds: it must
                    // land before the next round's acquire, or it would take back a slot that
                    // round was just granted. (The next round queues again, at the back.)
                    client.settle().await;
                }
            }
            other => break other,
        }
    };
    if permit
        && !request.wait_timeout().is_zero()
        && matches!(
            outcome,
            AcquireOutcome::CapacityMismatch { .. }
                | AcquireOutcome::Unavailable(_)
                | AcquireOutcome::Overloaded
        )
    {
        // A wait that ends on these keeps the place its earlier tries took in the queue, which
        // would keep later waiters out until its heartbeat lapsed: given back now. Nothing is
        // held (these are answers that no grant was made), so the release frees no slot.
        let _ = client.release_attempt(request).await;
    }
    match outcome {
        AcquireOutcome::Acquired(lease) | AcquireOutcome::Replayed(lease) => {
            tracing::info!(
                fence = %lease.fence(),
                slot = lease.slot(),
                validity_ms = lease.remaining_validity().as_millis(),
                "acquired the lease"
            );
            Ok(lease)
        }
        AcquireOutcome::Indeterminate { cause, .. } => {
            tell!(
                "leasehold: the outcome is still unknown after {} ({cause}); the command was not \
                 started",
                format_duration(RESOLVE_BUDGET.min(request.ttl()))
            );
            abandon(client, request).await;
            Err((exit::UNAVAILABLE, "unavailable"))
        }
        other => Err(not_acquired(
            other,
            request,
            shown,
            resource_name,
            wait_text,
            exits,
        )),
    }
}

/// Reports an outcome that carries no lease and returns the exit code for it.
fn not_acquired(
    outcome: AcquireOutcome<RedisBackend>,
    request: &LeaseRequest,
    shown: &str,
    resource_name: &str,
    wait_text: &str,
    exits: Exits,
) -> (u8, &'static str) {
    let within = if request.wait_timeout().is_zero() {
        String::new()
    } else {
        format!(" within {wait_text}")
    };
    match outcome {
        AcquireOutcome::Contended(c) if request.capacity().is_some() => {
            // A semaphore's refusal names no holder: there are several (`inspect --semaphore`
            // shows them), and a free slot may be promised to the waiters ahead.
            note!(
                "leasehold: not acquired{within}: every permit of the semaphore (capacity {}) is \
                 held or promised to a waiter ahead, retry after {}",
                request.capacity().unwrap_or_default(),
                format_duration(c.retry_after)
            );
            (exits.conflict, "not_acquired")
        }
        AcquireOutcome::CapacityMismatch { recorded } => {
            let asked = request.capacity().unwrap_or_default();
            tell!(
                "leasehold: the semaphore {resource_name:?} (purpose {}) has capacity {recorded}, \
                 not {asked}; nothing was written and the command was not started: run with \
                 --capacity {recorded}, or change the semaphore's capacity with `leasehold \
                 capacity` (its holders keep their permits)",
                request.purpose()
            );
            (exit::CAPACITY_MISMATCH, "capacity_mismatch")
        }
        AcquireOutcome::Contended(c) | AcquireOutcome::OwnerOperationConflict(c) => {
            let mut holder = c
                .holder
                .map_or_else(|| "another owner".to_owned(), |h| h.to_string());
            if let Some(name) = &c.holder_name {
                holder.push_str(&format!(" ({:?})", name.as_str()));
            }
            let mut fence = c
                .fence
                .map_or_else(String::new, |f| format!(" with fence {f}"));
            if c.released {
                // The holder is done; its minimum hold keeps everyone out a while longer.
                fence.push_str(", released and kept until its minimum hold ends");
            }
            note!(
                "leasehold: not acquired{within}: held by {holder}{fence}, retry after {}",
                format_duration(c.retry_after)
            );
            (exits.conflict, "not_acquired")
        }
        AcquireOutcome::Unavailable(u) => {
            if let Some(code) = exit::lasting_refusal(&u, shown) {
                let unusable = matches!(u.cause, UnavailableCause::UnusableKey(_));
                return (
                    code,
                    if unusable {
                        "unusable_key"
                    } else {
                        "unavailable"
                    },
                );
            }
            tell!("leasehold: Redis unavailable at {shown}: {u}; the command was not started");
            remedy::tell_for(&u, shown);
            (exit::UNAVAILABLE, "unavailable")
        }
        AcquireOutcome::Overloaded => {
            tell!("leasehold: too many commands in flight; the command was not started");
            (exit::UNAVAILABLE, "unavailable")
        }
        other => {
            tell!("leasehold: unexpected acquire outcome ({other}); the command was not started");
            (exit::UNAVAILABLE, "unavailable")
        }
    }
}

/// Cleans up after an acquire given up on, through the library ([`RedisLeases::abandon`]):
/// its background cleanups, then a release of this attempt's grant whatever its fence, never by
/// making one, sent behind the acquire on the same connection. Says what is left.
async fn abandon(client: &RedisLeases, request: &LeaseRequest) {
    match client.abandon(request, CLEANUP_BUDGET).await {
        Abandoned::Released => {
            note!("leasehold: the acquire had been applied; its grant is released");
        }
        Abandoned::Unknown(why) => tell!(
            "leasehold: could not confirm that no grant is left ({why}). A release of this \
             attempt was sent behind the acquire on the same connection: Redis runs them in \
             order, so a grant it makes when it gets to the acquire is removed at once. Only if \
             that connection broke first can a grant still appear, when Redis applies the \
             acquire, and live up to {} from then.",
            format_duration(request.ttl())
        ),
        // Nothing was held: nothing to say.
        _ => {}
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
        .envs(
            lease
                .slot()
                .map(|slot| ("LEASEHOLD_SLOT", slot.to_string())),
        )
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
            // Nothing here says whether the lease is still held: the release may have been
            // applied (an unknown outcome), and a restart, a flush or an eviction may already
            // have taken the lease. Only the upper bound is known.
            tell!(
                "leasehold: the release was not confirmed ({why}); the lease may still be held, \
                 at most until its TTL runs out, or may already be gone"
            );
            None
        }
    }
}
