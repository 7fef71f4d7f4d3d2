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

fn json_line(done: &Finished) -> serde_json::Value {
    let lines: Vec<&str> = done.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line of JSON: {done:#?}");
    serde_json::from_str(lines[0]).expect("valid JSON")
}

fn leasehold_json(server: &RedisServer, args: &[&str]) -> serde_json::Value {
    let mut command = leasehold(&server.url());
    command.args(args);
    let done = run_to_end(command);
    done.assert_code(0);
    json_line(&done)
}

fn leasehold_text(server: &RedisServer, args: &[&str]) -> String {
    let mut command = leasehold(&server.url());
    command.args(args);
    let done = run_to_end(command);
    done.assert_code(0);
    done.stdout
}

/// The owner token in the grant stored at slot `slot` of `name`'s semaphore.
fn stored_token(server: &RedisServer, name: &str, slot: u32) -> String {
    let stored = server
        .cmd(&["GET", &sem_key(name, &format!("slot:{slot}"))])
        .as_string()
        .expect("a grant");
    stored.split(':').nth(1).expect("a token").to_owned()
}

#[test]
fn inspect_list_and_break_show_and_remove_one_permit_per_slot() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let ttl = ["--ttl", "3s"];
    let a = run_permit(
        &server,
        &scratch,
        "pool",
        "2",
        &[&ttl[..], &["--holder", "host-a"]].concat(),
        "a",
    );
    let b = run_permit(
        &server,
        &scratch,
        "pool",
        "2",
        &[&ttl[..], &["--holder", "host-b"]].concat(),
        "b",
    );
    let (slot_a, fence_a) = slot_and_fence(&scratch, "a");
    let (slot_b, _) = slot_and_fence(&scratch, "b");
    let c = run_permit(&server, &scratch, "pool", "2", &["--wait", "20s"], "c");
    wait_until("the waiter takes its place", || {
        (queued(&server, "pool").len() == 1).then_some(())
    });

    let inspected = leasehold_json(&server, &["inspect", "pool", "--semaphore", "--json"]);
    assert_eq!(inspected["state"], "held", "{inspected}");
    assert_eq!(
        (
            &inspected["capacity"],
            &inspected["width"],
            &inspected["waiting"]
        ),
        (
            &serde_json::json!(2),
            &serde_json::json!(2),
            &serde_json::json!(1)
        ),
        "{inspected}"
    );
    assert_eq!(inspected["purpose"], "cli");
    let permits = inspected["permits"].as_array().expect("permits");
    let slots: Vec<u64> = permits
        .iter()
        .map(|p| p["slot"].as_u64().unwrap())
        .collect();
    assert_eq!(slots, [0, 1], "{inspected}");
    let of_a = &permits[slot_a as usize];
    assert_eq!(of_a["holder_name"], "host-a", "{inspected}");
    assert_eq!(of_a["fence"], fence_a, "{inspected}");
    assert!(of_a["holder"].as_str().is_some_and(|h| h.len() == 16));
    assert!(of_a["remaining_ms"].as_u64().is_some_and(|ms| ms <= 3000));
    // A fingerprint, never the token.
    let token = stored_token(&server, "pool", slot_a);
    let text = leasehold_text(&server, &["inspect", "pool", "--semaphore"]);
    assert!(
        text.starts_with(
            "pool (purpose cli): semaphore of capacity 2, 2 of 2 permits held, 1 waiting\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(&format!("\n  slot {slot_a}: held by ")),
        "{text}"
    );
    assert!(text.contains("(\"host-b\")"), "{text}");
    for shown in [&text, &inspected.to_string()] {
        assert!(!shown.contains(&token), "a token is shown: {shown}");
    }
    // The name alone looks for the lease, which is free, and says where the permits are.
    let plain = leasehold_text(&server, &["inspect", "pool"]);
    assert!(
        plain.contains(
            "free; a semaphore of that name is there under purpose cli, 2 of its \
                        permits held: add --semaphore to see them"
        ),
        "{plain}"
    );
    assert_eq!(inspect_json(&server, "pool")["state"], "free");

    // `list`: one row per held slot, with its slot and kind, beside the leases.
    let _lease = Held::new(&server, "pool", Duration::from_secs(30));
    let listed = leasehold_json(&server, &["list", "--json"]);
    let rows: Vec<(String, serde_json::Value, String)> = listed
        .as_array()
        .expect("an array")
        .iter()
        .map(|row| {
            assert_eq!(
                row["resource"],
                ResourceDigest::of("pool").as_str(),
                "{row}"
            );
            (
                row["kind"].as_str().unwrap().to_owned(),
                row["slot"].clone(),
                row["holder_name"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let name = |slot| if slot == slot_a { "host-a" } else { "host-b" };
    assert_eq!(
        rows,
        [
            ("lease".to_owned(), serde_json::Value::Null, String::new()),
            (
                "semaphore".to_owned(),
                serde_json::json!(0),
                name(0).to_owned()
            ),
            (
                "semaphore".to_owned(),
                serde_json::json!(1),
                name(1).to_owned()
            ),
        ],
        "{listed}"
    );
    let table = leasehold_text(&server, &["list"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    let column = lines[0].find("SLOT").expect("a SLOT column");
    let cells: Vec<&str> = lines[1..].iter().map(|l| &l[column..column + 1]).collect();
    assert_eq!(cells, ["-", "0", "1"], "{table}");

    // `break --slot`: without --yes nothing is sent; with it, one permit goes, the fence
    // counter stays, and the waiter is served on that slot at once.
    let before = snapshot(&server);
    let mut command = leasehold(&server.url());
    command.args(["break", "pool", "--slot", &slot_a.to_string()]);
    run_to_end(command).assert_code(2);
    assert_eq!(snapshot(&server), before);
    let counter = || {
        server
            .cmd(&["GET", &sem_key("pool", "fence")])
            .as_string()
            .and_then(|c| c.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let counted = counter();
    let broke = leasehold_text(
        &server,
        &["break", "pool", "--slot", &slot_a.to_string(), "--yes"],
    );
    assert!(
        broke.starts_with(&format!(
            "pool (purpose cli): removed the permit on slot {slot_a} of "
        )) && broke.contains("(\"host-a\")")
            && broke.contains(&format!("fence {fence_a}, "))
            && broke.contains("the semaphore's fence counter stays"),
        "{broke}"
    );
    let (slot_c, fence_c) = slot_and_fence(&scratch, "c");
    assert_eq!(slot_c, slot_a, "the waiter took the freed slot");
    assert!(fence_c > fence_a && counter() >= counted);
    // The old holder learns at its next renewal (within a third of its TTL): stopped, 70,
    // and told who holds its slot now.
    let done = a.finish();
    done.assert_code(70);
    assert!(
        done.stderr.contains(&format!(
            "the permit was lost while the command ran: another grant holds slot {slot_a} now"
        )),
        "{done:#?}"
    );
    // A free slot: nothing removed, said in JSON too; the lease is left alone by --slot.
    let none = leasehold_json(
        &server,
        &["break", "pool", "--slot", "5", "--yes", "--json"],
    );
    assert_eq!(none["removed"], false, "{none}");
    assert_eq!(none["state"], "free", "{none}");
    assert_eq!(none["slot"], 5, "{none}");
    let slot = slot_b.to_string();
    let removed = leasehold_json(
        &server,
        &["break", "pool", "--slot", &slot, "--yes", "--json"],
    );
    assert_eq!(removed["removed"], true, "{removed}");
    assert_eq!(removed["holder_name"], "host-b", "{removed}");
    assert_eq!(
        inspect_json(&server, "pool")["state"],
        "held",
        "the lease stays"
    );
    b.finish().assert_code(70);
    tell_to_stop(&scratch, "c");
    c.finish().assert_code(0);
}

#[test]
fn break_of_a_name_whose_lease_is_free_points_at_its_permits() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let a = run_permit(&server, &scratch, "pool", "2", &[], "a");
    slot_and_fence(&scratch, "a");
    let said = leasehold_text(&server, &["break", "pool", "--yes"]);
    assert!(
        said.contains(
            "no lease; nothing removed; a semaphore of that name holds 1 permit: name one with \
             --slot K"
        ),
        "{said}"
    );
    tell_to_stop(&scratch, "a");
    a.finish().assert_code(0);
}

#[test]
fn a_lowered_capacity_keeps_its_holders_and_admits_nobody_until_fewer_hold() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let ttl = ["--ttl", "1s"];
    let a = run_permit(&server, &scratch, "pool", "2", &ttl, "a");
    let b = run_permit(&server, &scratch, "pool", "2", &ttl, "b");
    let (slot_a, _) = slot_and_fence(&scratch, "a");
    slot_and_fence(&scratch, "b");
    let said = leasehold_text(&server, &["capacity", "pool", "1"]);
    assert_eq!(
        said.trim(),
        "pool (purpose cli): capacity 2 -> 1, 2 permits held: the holders of the slots up to 1 \
         keep them, and nobody new is admitted until fewer than 1 are held; runs must now ask \
         for --capacity 1 (another is refused, exit 78)"
    );
    let view = leasehold_json(&server, &["inspect", "pool", "--semaphore", "--json"]);
    assert_eq!(
        (&view["capacity"], &view["width"]),
        (&serde_json::json!(1), &serde_json::json!(2))
    );
    // Both holders keep renewing: each slot's time left is seen going back up (a renewal
    // after the change), while both runs go on.
    for slot in [0, 1] {
        let key = sem_key("pool", &format!("slot:{slot}"));
        let mut lowest = i64::MAX;
        wait_until("a renewal after the change", || {
            let pttl = server.cmd(&["PTTL", &key]).as_int().unwrap_or(-2);
            assert!(pttl > 0, "slot {slot} lost its permit");
            lowest = lowest.min(pttl);
            (pttl > lowest + 200).then_some(())
        });
    }
    let refused = |capacity: &str| {
        let mut command = leasehold(&server.url());
        command.args(["run", "pool", "--capacity", capacity, "--", "true"]);
        run_to_end(command)
    };
    let full = refused("1");
    full.assert_code(75);
    let old = refused("2");
    old.assert_code(78);
    assert!(old.stderr.contains("has capacity 1, not 2"), "{old:#?}");
    // One holder left, on a slot at or above the new capacity or not: still full.
    let (last, last_id, gone, gone_id) = if slot_a == 0 {
        (a, "a", b, "b")
    } else {
        (b, "b", a, "a")
    };
    tell_to_stop(&scratch, gone_id);
    gone.finish().assert_code(0);
    refused("1").assert_code(75);
    tell_to_stop(&scratch, last_id);
    last.finish().assert_code(0);
    let admitted = run_permit(&server, &scratch, "pool", "1", &[], "next");
    let (slot, _) = slot_and_fence(&scratch, "next");
    assert_eq!(slot, 0);
    tell_to_stop(&scratch, "next");
    admitted.finish().assert_code(0);
    assert_eq!(
        server
            .cmd(&["GET", &sem_key("pool", "capacity")])
            .as_string()
            .as_deref(),
        Some("1 1"),
        "the width is back to the capacity"
    );
}

#[test]
fn a_raised_capacity_wakes_a_waiter_at_once_and_admits_the_new_capacity() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let holder = run_permit(&server, &scratch, "pool", "1", &["--ttl", "30s"], "holder");
    slot_and_fence(&scratch, "holder");
    // Its next try is 10 s away (a third of its heartbeat; the holder's TTL is 30 s).
    let waiter = run_permit(
        &server,
        &scratch,
        "pool",
        "1",
        &["--wait", "60s", "--queue-heartbeat", "30s"],
        "waiter",
    );
    wait_until("the waiter takes its place", || {
        (queued(&server, "pool").len() == 1).then_some(())
    });
    let raised_at = Instant::now();
    let change = leasehold_json(&server, &["capacity", "pool", "2", "--json"]);
    assert_eq!(
        change,
        serde_json::json!({
            "previous": 1, "capacity": 2, "width": 2, "held": 1, "woke_waiters": true,
            "purpose": "cli"
        })
    );
    // Woken at once, it learns the new capacity: 78, and its place is given back.
    let done = waiter.finish();
    done.assert_code(78);
    assert!(
        done.at - raised_at < Duration::from_secs(3),
        "{:?}",
        done.at - raised_at
    );
    assert!(done.stderr.contains("has capacity 2, not 1"), "{done:#?}");
    assert!(!scratch.path("waiter").exists(), "its command never ran");
    assert!(queued(&server, "pool").is_empty());
    // Asked for with the new capacity, the second slot is granted beside the holder, at once.
    let second = run_permit(&server, &scratch, "pool", "2", &[], "second");
    let (slot, _) = slot_and_fence(&scratch, "second");
    assert_eq!(slot, 1);
    tell_to_stop(&scratch, "second");
    second.finish().assert_code(0);
    tell_to_stop(&scratch, "holder");
    holder.finish().assert_code(0);
}

#[test]
fn capacity_by_digest_and_its_exit_paths() {
    let server = RedisServer::start();
    // No semaphore yet: the record is made, and said so.
    let digest = ResourceDigest::of("fresh");
    let said = leasehold_text(&server, &["capacity", "--digest", digest.as_str(), "3"]);
    assert!(
        said.starts_with(&format!(
            "{digest} (purpose cli): no semaphore was recorded; its capacity is now 3"
        )),
        "{said}"
    );
    assert_eq!(
        server
            .cmd(&["GET", &sem_key("fresh", "capacity")])
            .as_string()
            .as_deref(),
        Some("3 3")
    );
    // A record leasehold did not write: 65, left alone.
    server.cmd(&["SET", &sem_key("odd", "capacity"), "lots"]);
    let mut command = leasehold(&server.url());
    command.args(["capacity", "odd", "2"]);
    let done = run_to_end(command);
    done.assert_code(65);
    assert!(done.stderr.contains("nothing was written"), "{done:#?}");
    assert_eq!(
        server
            .cmd(&["GET", &sem_key("odd", "capacity")])
            .as_string()
            .as_deref(),
        Some("lots")
    );
    let mut command = leasehold(&server.url());
    command.args(["inspect", "odd", "--semaphore"]);
    run_to_end(command).assert_code(65);
    // Nothing listens: 69.
    for argv in [
        &["capacity", "r", "2"][..],
        &["inspect", "r", "--semaphore"][..],
        &["break", "r", "--slot", "0", "--yes"][..],
    ] {
        let mut command = leasehold(&dead_url());
        command.args(argv);
        let done = run_to_end(command);
        done.assert_code(69);
        assert!(
            done.stderr.contains("Redis unavailable"),
            "{argv:?}: {done:#?}"
        );
    }
}
