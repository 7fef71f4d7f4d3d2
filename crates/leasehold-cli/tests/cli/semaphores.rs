//! `run --capacity N`: one permit of a counting semaphore instead of the lease, its slot in
//! the command's environment; a capacity that disagrees with the semaphore's is refused and
//! writes nothing; a waiter killed in the queue stops blocking it within its heartbeat.

use super::*;

/// The key `suffix` (`capacity`, `queue`, `alive`, `slot:0`, …) of the semaphore that `run
/// --capacity` holds a permit of on `name`.
fn sem_key(name: &str, suffix: &str) -> String {
    format!(
        "leasehold:sem:v1:cli:{{{}}}:{suffix}",
        ResourceDigest::of(name).as_str()
    )
}

fn queued(server: &RedisServer, name: &str) -> Vec<String> {
    match server.cmd(&["ZRANGE", &sem_key(name, "queue"), "0", "-1"]) {
        Reply::Array(Some(items)) => items.iter().filter_map(Reply::as_string).collect(),
        _ => Vec::new(),
    }
}

/// A command that writes `<slot> <fence>` to `$D/<id>`, then works until `$D/stop-<id>`
/// exists (30 s at most).
fn until_told(id: &str) -> String {
    format!(
        r#"echo "$LEASEHOLD_SLOT $LEASEHOLD_FENCE" > "$D/{id}"
           i=0; while [ ! -e "$D/stop-{id}" ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done"#
    )
}

/// What a command started by [`until_told`] saw: its slot and fence.
fn slot_and_fence(scratch: &Scratch, id: &str) -> (u32, u64) {
    let seen = wait_for_file(&scratch.path(id));
    let (slot, fence) = seen.trim().split_once(' ').expect("slot and fence");
    (
        slot.parse().expect("a slot"),
        fence.parse().expect("a fence"),
    )
}

fn tell_to_stop(scratch: &Scratch, id: &str) {
    std::fs::write(scratch.path(&format!("stop-{id}")), "").unwrap();
}

/// `leasehold run NAME --capacity N [extra] -- <until_told(id)>`, started.
fn run_permit(
    server: &RedisServer,
    scratch: &Scratch,
    name: &str,
    capacity: &str,
    extra: &[&str],
    id: &str,
) -> Running {
    let mut command = leasehold(&server.url());
    command
        .args(["run", name, "--capacity", capacity])
        .args(extra)
        .arg("--")
        .args(scratch.sh(&until_told(id)));
    Running::start(command)
}

#[test]
fn two_runs_of_capacity_2_hold_a_permit_each_and_a_third_is_refused_or_waits() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let a = run_permit(&server, &scratch, "pool", "2", &[], "a");
    let b = run_permit(&server, &scratch, "pool", "2", &[], "b");
    let (slot_a, fence_a) = slot_and_fence(&scratch, "a");
    let (slot_b, fence_b) = slot_and_fence(&scratch, "b");
    let mut slots = [slot_a, slot_b];
    slots.sort_unstable();
    assert_eq!(slots, [0, 1], "both at once, each on its own slot");
    assert_ne!(fence_a, fence_b);
    // The semaphore's keys, apart from the lease of the same name.
    assert_eq!(
        server
            .cmd(&["GET", &sem_key("pool", "capacity")])
            .as_string()
            .as_deref(),
        Some("2 2")
    );
    assert_eq!(
        server.cmd(&["EXISTS", &lease_key("pool")]).as_int(),
        Some(0)
    );

    // A third that does not wait: refused, with the conflict's exit status.
    let mut command = leasehold(&server.url());
    command.args(["run", "pool", "--capacity", "2", "--", "true"]);
    let refused = run_to_end(command);
    refused.assert_code(75);
    assert!(
        refused
            .stderr
            .contains("every permit of the semaphore (capacity 2) is held"),
        "{refused:#?}"
    );
    // A third that waits takes a place in the queue, and the permit the first gives back.
    let c = run_permit(
        &server,
        &scratch,
        "pool",
        "2",
        &["--wait", "20s", "--json"],
        "c",
    );
    wait_until("the waiter takes its place", || {
        (queued(&server, "pool").len() == 1).then_some(())
    });
    tell_to_stop(&scratch, "a");
    a.finish().assert_code(0);
    let (slot_c, fence_c) = slot_and_fence(&scratch, "c");
    assert_eq!(slot_c, slot_a, "the slot given back");
    assert!(
        fence_c > fence_a.max(fence_b),
        "fences grow across the semaphore"
    );
    assert!(queued(&server, "pool").is_empty());
    tell_to_stop(&scratch, "c");
    let done = c.finish();
    done.assert_code(0);
    let report: serde_json::Value =
        serde_json::from_str(done.stdout.lines().last().unwrap_or("")).expect("the JSON line");
    assert_eq!(report["slot"], slot_c, "{report}");
    assert_eq!(report["fence"], fence_c, "{report}");
    tell_to_stop(&scratch, "b");
    b.finish().assert_code(0);
    // Released: no slot is held, and a lease's run reports no slot.
    for slot in ["slot:0", "slot:1"] {
        assert_eq!(
            server.cmd(&["EXISTS", &sem_key("pool", slot)]).as_int(),
            Some(0)
        );
    }
    let mut command = leasehold(&server.url());
    command.args(["run", "pool", "--json", "--", "true"]);
    let lease = run_to_end(command);
    lease.assert_code(0);
    assert!(lease.stdout.contains(r#""slot":null"#), "{lease:#?}");
}

#[test]
fn the_capacity_and_the_queue_heartbeat_come_from_the_environment_too() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command
        .env("LEASEHOLD_CAPACITY", "3")
        .env("LEASEHOLD_QUEUE_HEARTBEAT", "500ms")
        .env("LEASEHOLD_WAIT", "1s")
        .args(["run", "env", "--"])
        .args(scratch.sh(r#"echo "$LEASEHOLD_SLOT" > "$D/slot""#));
    run_to_end(command).assert_code(0);
    assert_eq!(read(&scratch.path("slot")), "0\n");
    assert_eq!(
        server
            .cmd(&["GET", &sem_key("env", "capacity")])
            .as_string()
            .as_deref(),
        Some("3 3")
    );
}

#[test]
fn a_capacity_mismatch_exits_78_and_writes_nothing() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let holder = run_permit(&server, &scratch, "pool", "2", &["--ttl", "30s"], "a");
    slot_and_fence(&scratch, "a");
    let before = snapshot(&server);
    for wait in ["0s", "5s"] {
        let mut command = leasehold(&server.url());
        command.args([
            "run",
            "pool",
            "--capacity",
            "3",
            "--wait",
            wait,
            "--json",
            "--",
            "touch",
        ]);
        command.arg(scratch.path("ran"));
        let done = run_to_end(command);
        done.assert_code(78);
        assert!(
            done.stderr.contains(
                "the semaphore \"pool\" (purpose cli) has capacity 2, not 3; nothing was \
                 written and the command was not started: run with --capacity 2"
            ),
            "{done:#?}"
        );
        let report: serde_json::Value =
            serde_json::from_str(done.stdout.trim()).expect("the JSON line");
        assert_eq!(report["outcome"], "capacity_mismatch", "{report}");
        assert_eq!(report["exit"], 78, "{report}");
        assert!(!scratch.path("ran").exists(), "the command was not started");
        assert_eq!(
            snapshot(&server),
            before,
            "wait {wait}: nothing was written"
        );
    }
    tell_to_stop(&scratch, "a");
    holder.finish().assert_code(0);
}

/// A waiter killed while it waits (SIGKILL: no cleanup) keeps its place in the queue only
/// until its heartbeat lapses; the waiter behind it is served then, not at the default
/// heartbeat (3 s), nor never.
#[test]
fn a_sigkilled_waiter_stops_blocking_the_queue_within_its_heartbeat() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let heartbeat = Duration::from_secs(1);
    let waiting = ["--wait", "60s", "--queue-heartbeat", "1s"];
    let holder = run_permit(&server, &scratch, "q", "1", &[], "holder");
    slot_and_fence(&scratch, "holder");
    let mut dead = run_permit(&server, &scratch, "q", "1", &waiting, "dead");
    let dead_token = wait_until("the first waiter takes its place", || {
        queued(&server, "q").first().cloned()
    });
    send(dead.pid(), rustix::process::Signal::KILL);
    let killed_at = Instant::now();
    wait_until("the first waiter is gone", || {
        dead.child.try_wait().ok().flatten().map(|_| ())
    });
    let next = run_permit(&server, &scratch, "q", "1", &waiting, "next");
    // Its own place, behind the dead one's (or alone, if that one has lapsed already).
    wait_until("the second waiter takes its place", || {
        queued(&server, "q")
            .iter()
            .any(|token| *token != dead_token)
            .then_some(())
    });
    tell_to_stop(&scratch, "holder");
    holder.finish().assert_code(0);
    let (slot, _) = slot_and_fence(&scratch, "next");
    let served = killed_at.elapsed();
    assert_eq!(slot, 0);
    // The dead place lapses a heartbeat after its last try (at most a third of one before
    // the kill), and the waiter behind tries three times a heartbeat: within 1.4 s. With the
    // default heartbeat (3 s, a try a second) it would lapse 2 s after the kill at the
    // soonest.
    assert!(served < heartbeat * 2, "served {served:?} after the kill");
    assert!(!queued(&server, "q").contains(&dead_token));
    tell_to_stop(&scratch, "next");
    next.finish().assert_code(0);
    drop(dead);
}
