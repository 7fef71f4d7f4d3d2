//! Issue 34 through the command line: `leasehold run` in a loop, one loop per holder, on one
//! resource through Sentinel while failovers are forced.
//!
//! Every run is a new process, so it asks the Sentinel for the master when it starts: right
//! after a failover a new run reaches the promoted master while an older run may still hold,
//! renew and release the lease on the former master, which keeps acting as one until the
//! Sentinel demotes it. Each command writes its fence (`LEASEHOLD_FENCE`) and `date +%s%N`
//! when it starts and when it ends (its work's end, or SIGTERM); the test keeps each run's
//! exit status.
//!
//! The rule: for every two runs whose commands' [start, end] overlap, the older one (the
//! smaller fence) exited 70 — leasehold told it that its work may not have been covered. No
//! timing is asserted, only the rule and that runs did run.
//!
//! `LEASEHOLD_FAILOVER_HOLDERS_FAILOVERS` sets the number of failovers (default 20); the
//! counts are printed (`--no-capture`).

use super::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use test_support::overlap::{self, Hold as _, failovers};
use test_support::{RedisSentinel, sentinel::SERVICE};

const RESOURCE: &str = "issue-34-cli";

/// Looping holders, each a shell loop of `leasehold run` as it were.
const HOLDERS: usize = 4;

/// How long the test waits, after each settled failover, for one more run to finish before it
/// forces the next failover anyway (pacing only: never asserted).
const NEXT_RUN_WITHIN: Duration = Duration::from_secs(10);

/// One run whose command started.
#[derive(Debug, Clone)]
struct CommandRun {
    holder: usize,
    fence: u64,
    /// Wall-clock nanoseconds, as the command's `date +%s%N` saw them.
    started: u128,
    ended: u128,
    exit: i32,
}

impl overlap::Hold for CommandRun {
    fn fence(&self) -> u64 {
        self.fence
    }

    fn overlaps(&self, other: &CommandRun) -> bool {
        self.started < other.ended && other.started < self.ended
    }

    /// `run` exited 70.
    fn told(&self) -> bool {
        self.exit == 70
    }
}

/// Wall-clock nanoseconds now (the clock `date +%s%N` reads).
fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

/// How long holder `holder`'s `n`th command works: 100 to 400 ms, deterministic.
fn work_millis(holder: usize, n: u64) -> u64 {
    100 + (holder as u64 * 7919 + n * 104_729) % 301
}

/// Runs `leasehold run` again and again until `stop`; records the runs whose command started,
/// and counts the exit statuses of all. Each run is bounded by the harness's `TIMEOUT`.
fn run_in_a_loop(
    holder: usize,
    url: &str,
    scratch: &Scratch,
    runs: &Mutex<Vec<CommandRun>>,
    exits: &Mutex<BTreeMap<i32, usize>>,
    finished: &AtomicUsize,
    stop: &AtomicBool,
) {
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let id = format!("h{holder}-{n}");
        let secs = format!("{:.3}", work_millis(holder, n) as f64 / 1000.0);
        n += 1;
        let mut command = leasehold(url);
        command
            .args([
                "run", RESOURCE, "--ttl", "1s", "--wait", "3s", "--grace", "200ms", "--",
            ])
            .args(scratch.sh(&format!(
                r#"trap 'date +%s%N > "$D/{id}.end"; exit 143' TERM
                   echo "$LEASEHOLD_FENCE $(date +%s%N)" > "$D/{id}.start"
                   sleep {secs}
                   date +%s%N > "$D/{id}.end""#
            )));
        let done = run_to_end(command);
        let exit = done.code();
        *exits.lock().unwrap().entry(exit).or_default() += 1;
        finished.fetch_add(1, Ordering::SeqCst);
        let start = read(&scratch.path(&format!("{id}.start")));
        let Some((fence, started)) = start.trim().split_once(' ') else {
            // The command never started (not acquired, unavailable).
            continue;
        };
        let end = read(&scratch.path(&format!("{id}.end")));
        // A command killed outright (SIGKILL) wrote no end: it ended by the time leasehold
        // exited, which this bounds from above.
        let ended = end.trim().parse().unwrap_or_else(|_| now_nanos());
        runs.lock().unwrap().push(CommandRun {
            holder,
            fence: fence
                .parse()
                .unwrap_or_else(|_| panic!("{id}: fence {fence:?}")),
            started: started
                .parse()
                .unwrap_or_else(|_| panic!("{id}: {start:?}")),
            ended,
            exit,
        });
    }
}

/// Waits (bounded) until `finished` reaches `count`; says whether it did.
fn until_finished(finished: &AtomicUsize, count: usize, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while finished.load(Ordering::SeqCst) < count {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn overlapping_runs_through_forced_failovers_the_older_exited_70() {
    let started = Instant::now();
    let deployment = RedisSentinel::start().with_fast_timers();
    let hosts: Vec<String> = deployment
        .sentinel_urls()
        .iter()
        .map(|u| u.trim_start_matches("redis://").to_owned())
        .collect();
    let url = format!("redis+sentinel://{}/{SERVICE}", hosts.join(","));
    let scratch = Scratch::new();
    let runs = Mutex::new(Vec::new());
    let exits = Mutex::new(BTreeMap::new());
    let finished = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let n = failovers();
    let mut unpaced = 0;
    let mut took = Vec::new();
    // Each failover's request, promotion and settling, in wall-clock nanoseconds.
    let mut windows: Vec<(u128, u128, u128)> = Vec::new();
    std::thread::scope(|scope| {
        let loops: Vec<_> = (0..HOLDERS)
            .map(|holder| {
                let (url, scratch, runs, exits) = (&url, &scratch, &runs, &exits);
                let (finished, stop) = (&finished, &stop);
                scope.spawn(move || {
                    run_in_a_loop(holder, url, scratch, runs, exits, finished, stop);
                })
            })
            .collect();
        // The loops stop however this ends (a failed failover panics).
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let _stop = StopOnDrop(&stop);
        assert!(
            until_finished(&finished, 1, Duration::from_secs(30)),
            "no run finished before the first failover"
        );
        for _ in 0..n {
            let (asked, asked_at) = (Instant::now(), now_nanos());
            deployment.failover();
            let (promoted, promoted_at) = (Instant::now(), now_nanos());
            deployment.wait_until_settled();
            took.push((promoted - asked, promoted.elapsed()));
            windows.push((asked_at, promoted_at, now_nanos()));
            let next = finished.load(Ordering::SeqCst) + 1;
            if !until_finished(&finished, next, NEXT_RUN_WITHIN) {
                unpaced += 1;
            }
        }
        stop.store(true, Ordering::SeqCst);
        for handle in loops {
            if let Err(panic) = handle.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });

    let runs = runs.into_inner().unwrap();
    let exits = exits.into_inner().unwrap();
    let told = runs.iter().filter(|r| r.told()).count();
    let overlap::Overlaps {
        overlapping,
        older_told,
        neither_told,
        same_fence,
        violations,
    } = overlap::check(&runs);
    let failover_ms: Vec<u128> = took.iter().map(|(f, _)| f.as_millis()).collect();
    let settle_ms: Vec<u128> = took.iter().map(|(_, s)| s.as_millis()).collect();
    eprintln!(
        "cli: {n} failovers, {} runs whose command started, {overlapping} overlapping pairs, \
         {older_told} with the older exiting 70, {} with the older NOT told ({neither_told} with \
         neither told), {told} runs exited 70; {same_fence} overlapping pairs with one fence",
        runs.len(),
        violations.len(),
    );
    eprintln!(
        "cli: exit statuses of all runs {exits:?}; {unpaced} failovers not followed by a run \
         within {NEXT_RUN_WITHIN:?}; failover() ms {failover_ms:?}; settled after ms \
         {settle_ms:?}; {:.1?} in all",
        started.elapsed()
    );
    // Milliseconds from `origin`, which may be later.
    let ms = |origin: u128, at: u128| {
        let sign = if at < origin { "-" } else { "" };
        format!("{sign}{}", at.abs_diff(origin) / 1_000_000)
    };
    let report: Vec<String> = violations
        .iter()
        .take(20)
        .map(|(older, newer)| {
            // Times are ms from the request of the failover before the overlap began.
            let at = older.started.max(newer.started);
            let (round, origin, near) = windows
                .iter()
                .enumerate()
                .rev()
                .find(|(_, w)| w.0 <= at)
                .map_or((None, 0, String::new()), |(round, w)| {
                    let near = format!("promoted at {}, settled at {}", ms(w.0, w.1), ms(w.0, w.2));
                    (Some(round), w.0, near)
                });
            let show = |r: &CommandRun| {
                format!(
                    "holder {} fence {} ran {}..{} ms, exit {}",
                    r.holder,
                    r.fence,
                    ms(origin, r.started),
                    ms(origin, r.ended),
                    r.exit
                )
            };
            format!(
                "older NOT told: {}\n    newer:          {}\n    (failover {round:?}: asked at 0, \
                 {near})",
                show(older),
                show(newer)
            )
        })
        .collect();
    assert!(
        violations.is_empty(),
        "{} of {overlapping} overlapping pairs of runs had an older run that did not exit 70 \
         (first {}):\n{}",
        violations.len(),
        report.len(),
        report.join("\n")
    );
    let minimum = n.max(10);
    assert!(
        runs.len() >= minimum,
        "only {} runs started their command (at least {minimum} needed)",
        runs.len()
    );
}
