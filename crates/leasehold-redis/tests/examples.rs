//! The examples run against a real redis-server and say what they should: built by `cargo
//! test` (and nextest) next to the test binaries, they are run from there. A missing example
//! binary fails the test; it never skips.

use std::path::PathBuf;
use std::process::Command;

use test_support::RedisServer;

/// Runs example `name` against `server` and returns its stdout, requiring exit status 0.
fn run_example(server: &RedisServer, name: &str) -> String {
    run_example_with(server, name, &[])
}

/// Runs example `name` with `args` against `server`: its stdout, requiring exit status 0.
fn run_example_with(server: &RedisServer, name: &str, args: &[&str]) -> String {
    // target/<profile>/deps/<this test> → target/<profile>/examples/<name>
    let exe = std::env::current_exe().expect("the test's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let example: PathBuf = dir.join("examples").join(name);
    assert!(
        example.exists(),
        "{} is missing: build the examples (cargo test builds them)",
        example.display()
    );
    let out = Command::new(&example)
        .args(args)
        .env("LEASEHOLD_REDIS_URL", server.url())
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name}: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_run_once_example_runs_once_and_then_skips() {
    let server = RedisServer::start();
    let first = run_example(&server, "run_once");
    assert!(first.contains("ran the nightly report"), "{first}");
    let second = run_example(&server, "run_once");
    assert!(second.contains("skipped: another host ran it"), "{second}");
}

#[test]
fn the_exclusive_workers_take_turns_and_each_finishes_covered() {
    let server = RedisServer::start();
    let out = run_example(&server, "exclusive_worker");
    for n in 1..=3 {
        assert!(out.contains(&format!("worker {n} done: released")), "{out}");
    }
    // One at a time: every "works" line is followed by its own "finished" before the next.
    // (Not by "done", which is printed once the release returned: by then the next worker
    // may hold the lease and have printed its "works".)
    let lines: Vec<&str> = out.lines().filter(|l| !l.contains(" done: ")).collect();
    assert_eq!(lines.len(), 6, "{out}");
    for pair in lines.chunks(2) {
        let who = pair[0].split_whitespace().nth(1).expect("a worker number");
        assert!(pair[0].contains("works with fence"), "{out}");
        assert_eq!(pair[1], format!("worker {who} finished its batch"), "{out}");
    }
}

#[test]
fn the_fenced_sqlite_example_rejects_the_stale_write() {
    let server = RedisServer::start();
    let out = run_example(&server, "fenced_sqlite");
    assert!(out.contains("wrote: 1 row changed"), "{out}");
    assert!(out.contains("wrote: 0 rows changed"), "{out}");
}

#[test]
fn the_election_example_replaces_a_killed_leader_and_fences_out_its_term() {
    let server = RedisServer::start();
    let out = run_example(&server, "election");
    let term_after = |prefix: &str| -> u64 {
        let line = out
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{out}"));
        let at = line.find("term ").expect("a term") + "term ".len();
        line[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|t| t.parse().ok())
            .expect("a term number")
    };
    let old = term_after("killed candidate");
    // The supervisor's own line: "candidate <n> took over as term <t> after ...".
    let new_leader_term = term_after("candidate ");
    assert!(out.contains("took over as term"), "{out}");
    assert!(new_leader_term > old, "{out}");
    assert!(
        out.contains(&format!(
            "dead leader's term {old} now: Stale {{ current: FenceToken({new_leader_term}) }}"
        )),
        "{out}"
    );
    // The two survivors stop cleanly when told to (the leader resigning on its way out).
    assert_eq!(out.matches("stopped: exit status: 0").count(), 2, "{out}");
}

/// Built with the `metrics` feature only (as `make test` builds every example).
#[cfg(feature = "metrics")]
#[test]
fn the_metrics_example_renders_what_its_leases_did_for_prometheus() {
    let server = RedisServer::start();
    let out = run_example_with(&server, "metrics", &["--once"]);
    // Three workers took turns, renewing while they worked; one try found the lock held.
    for line in [
        "leasehold_acquires_total{purpose=\"lock\",outcome=\"acquired\"} 3",
        "leasehold_acquires_total{purpose=\"lock\",outcome=\"contended\"} 1",
        "leasehold_releases_total{purpose=\"lock\",outcome=\"released\"} 3",
        "leasehold_losses_total{purpose=\"lock\",reason=\"released\"} 3",
        "leasehold_leases_kept 0",
        "leasehold_redis_requests_in_flight 0",
        "leasehold_waiters{purpose=\"lock\",kind=\"lease\"} 0",
        "leasehold_held{purpose=\"lock\",kind=\"lease\"} 0",
    ] {
        assert!(out.lines().any(|l| l == line), "no {line:?} in:\n{out}");
    }
    let renewals = out
        .lines()
        .find_map(|l| {
            l.strip_prefix("leasehold_renewals_total{purpose=\"lock\",outcome=\"renewed\"} ")
        })
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    // Each 700 ms turn under a 600 ms TTL renewed at least once (every 200 ms).
    assert!(renewals >= 3, "{renewals} renewals in:\n{out}");
    for name in [
        "acquire_wait",
        "renew_validity_left",
        "hold_duration",
        "renew_duration",
    ] {
        assert!(
            out.contains(&format!("leasehold_{name}_seconds")),
            "{name}:\n{out}"
        );
    }
}

#[test]
fn the_semaphore_example_runs_two_exports_at_a_time_and_readers_follow_the_writer() {
    let server = RedisServer::start();
    let out = run_example(&server, "semaphore");
    for n in 1..=5 {
        assert!(out.contains(&format!("worker {n} done: released")), "{out}");
    }
    let most = out
        .lines()
        .filter_map(|l| l.split('(').nth(1)?.split(' ').next()?.parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    assert_eq!(
        most, 2,
        "at most two at once, and two did run at once:\n{out}"
    );
    let fence = out
        .lines()
        .find_map(|l| l.strip_prefix("writer rewrote the catalog with fence "))
        .expect("the writer's line");
    assert!(
        out.contains(&format!("two readers follow fence {fence} and {fence}")),
        "{out}"
    );
    assert!(out.contains("readers done: released and released"), "{out}");
}
