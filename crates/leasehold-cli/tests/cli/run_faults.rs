//! Run: what the tool says is what happened (faults from outside).

use super::*;

/// Starts `run r` with a long TTL and a command that waits for `$D/go`, and waits until its
/// grant is on the server.
fn run_until_go(server: &RedisServer, scratch: &Scratch) -> Running {
    let mut command = leasehold(&server.url());
    command.args(["run", "r", "--ttl", "30s", "--"]).args(
        scratch.sh(r#": > "$D/started"; while [ ! -e "$D/go" ]; do sleep 0.01; done; exit 3"#),
    );
    let running = Running::start(command);
    // The command has started, so `run` had the grant's reply: a key on the server alone is
    // not enough (a test that then restarts Redis would lose the reply, and the acquire would
    // be unknown, not held).
    wait_until("the command started", || {
        scratch.path("started").exists().then_some(())
    });
    assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(1));
    running
}

#[test]
fn a_lease_deleted_before_the_command_exits_is_70_not_its_code() {
    for wipe in [&["DEL", "<key>"][..], &["FLUSHALL"][..]] {
        let server = RedisServer::start();
        let scratch = Scratch::new();
        let running = run_until_go(&server, &scratch);
        // Gone behind the holder's back, and the command exits before the next renewal (a
        // third of 30 s away): only the release can tell.
        let key = lease_key("r");
        let args: Vec<&str> = wipe
            .iter()
            .map(|a| if *a == "<key>" { key.as_str() } else { a })
            .collect();
        server.cmd(&args);
        std::fs::write(scratch.path("go"), "").unwrap();
        let done = running.finish();
        done.assert_code(70);
        assert!(
            done.stderr
                .contains("the lease ended before the command did"),
            "{wipe:?}: {done:#?}"
        );
        assert!(done.stderr.contains("no grant"), "{wipe:?}: {done:#?}");
        assert!(done.stderr.contains("status 3"), "{wipe:?}: {done:#?}");
    }
}

/// Redis restarted (taking the lease with it) and is down when the command exits: the release
/// cannot be confirmed, and `run` says only what it can know — the lease may still be held, at
/// most until its TTL runs out, or may already be gone — never that it lives on (issue 34).
#[test]
fn a_release_unconfirmed_while_redis_is_down_claims_only_what_is_known() {
    let mut server = RedisServer::start();
    let scratch = Scratch::new();
    let running = run_until_go(&server, &scratch);
    server.restart();
    server.kill();
    std::fs::write(scratch.path("go"), "").unwrap();
    let done = running.finish();
    // The release proves nothing either way: the command's own status.
    done.assert_code(3);
    assert!(
        done.stderr.contains("the release was not confirmed"),
        "{done:#?}"
    );
    assert!(
        done.stderr.contains("may still be held") && done.stderr.contains("or may already be gone"),
        "{done:#?}"
    );
    for claim in ["lives until", "lease lives", "is still held"] {
        assert!(!done.stderr.contains(claim), "{claim:?}: {done:#?}");
    }
}

#[test]
fn a_lease_granted_to_another_before_the_command_exits_is_70() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let running = run_until_go(&server, &scratch);
    assert_eq!(server.cmd(&["DEL", &lease_key("r")]), Reply::Int(1));
    // Someone else is granted the lease and works while our command still runs.
    let mut other = Held::new(&server, "r", Duration::from_secs(30));
    std::fs::write(scratch.path("go"), "").unwrap();
    let done = running.finish();
    done.assert_code(70);
    assert!(done.stderr.contains("another grant"), "{done:#?}");
    // The other grant was left alone.
    assert_eq!(inspect_json(&server, "r")["state"], "held");
    other.release();
}

#[test]
fn keys_of_another_type_are_named_and_nothing_is_written() {
    let fence_key = format!("{}:fence", lease_key("r"));
    // Longer than the scripts could refuse within the default 200 ms command timeout when
    // they read all of it (issue 34): refused unread now, as any string leasehold did not
    // write is.
    let ten_mb = "1".repeat(10 << 20);
    let cases: [(&[&str], &str); 8] = [
        (
            &["HSET", &lease_key("r"), "f", "v"],
            "the lease key holds a value of another type",
        ),
        (
            &["SET", &lease_key("r"), &ten_mb],
            "the lease key holds a string that leasehold did not write",
        ),
        (
            &["SET", &lease_key("r"), "garbage"],
            "the lease key holds a string that leasehold did not write",
        ),
        (
            &["SET", &fence_key, &ten_mb],
            "the fence counter holds something that is not a fence",
        ),
        (
            &["RPUSH", &fence_key, "x"],
            "the fence counter holds a value of another type",
        ),
        (
            &["SET", &fence_key, "-5"],
            "the fence counter holds something that is not a fence",
        ),
        (
            &["SET", &fence_key, "garbage"],
            "the fence counter holds something that is not a fence",
        ),
        (
            &["SET", &fence_key, "9223372036854775807"],
            "the fence counter is at the top of the fence range",
        ),
    ];
    for (setup, said) in cases {
        let server = RedisServer::start();
        let scratch = Scratch::new();
        server.cmd(setup);
        let before = snapshot(&server);
        assert!(!before.is_empty());
        let mut command = leasehold(&server.url());
        command
            .args(["run", "r", "--"])
            .args(scratch.sh(r#"touch "$D/ran""#));
        let done = run_to_end(command);
        done.assert_code(65);
        assert!(done.stderr.contains(said), "{setup:?}: {done:#?}");
        assert!(
            done.stderr.contains("nothing was written"),
            "{setup:?}: {done:#?}"
        );
        // Not another owner, not an unknown outcome.
        for wrong in ["held by", "may exist", "unknown", "no answer"] {
            assert!(!done.stderr.contains(wrong), "{setup:?}: {done:#?}");
        }
        assert!(!scratch.path("ran").exists(), "{setup:?}: the command ran");
        assert_eq!(snapshot(&server), before, "{setup:?}: a key changed");
        let mut command = leasehold(&server.url());
        command.args(["inspect", "r"]);
        let done = run_to_end(command);
        done.assert_code(65);
        assert!(done.stderr.contains(said), "{setup:?}: {done:#?}");
    }
}

#[test]
fn fences_are_exact_to_the_top_of_the_range() {
    let server = RedisServer::start();
    let fence_key = format!("{}:fence", lease_key("r"));
    let clock = {
        let Reply::Array(Some(time)) = server.cmd(&["TIME"]) else {
            panic!("TIME");
        };
        time[0].as_string().unwrap().parse::<u64>().unwrap() * 1_000_000
    };
    let top = i64::MAX.unsigned_abs();
    for counter in [
        99_999_999_999_999,
        100_000_000_000_000,
        (1 << 53) - 1,
        1 << 53,
        top - 1,
    ] {
        server.cmd(&["SET", &fence_key, &counter.to_string()]);
        let mut command = leasehold(&server.url());
        // Longer than the TTL: renewed at this fence before it ends.
        command.args([
            "run",
            "r",
            "--ttl",
            "300ms",
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_FENCE; sleep 0.5",
        ]);
        let done = run_to_end(command);
        done.assert_code(0);
        let fence: u64 = done.stdout.trim().parse().expect("a decimal fence");
        if counter + 1 > clock {
            assert_eq!(fence, counter + 1, "{done:#?}");
        } else {
            // Below the server's clock: the clock in microseconds wins.
            assert!(fence > clock && fence > counter, "{counter}: {done:#?}");
        }
        assert_eq!(fence_counter(&server, "r"), Some(fence.to_string()));
    }
    // At the top: refused, nothing written, no fence reused.
    let mut command = leasehold(&server.url());
    command.args(["run", "r", "--", "true"]);
    run_to_end(command).assert_code(65);
    assert_eq!(fence_counter(&server, "r"), Some(top.to_string()));
    assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(0));
}

#[test]
fn an_acquire_applied_after_run_gave_up_leaves_no_grant() {
    let server = RedisServer::start();
    // Held for a second by someone else: leasehold connects, tries, and waits to try again.
    let _holder = Held::new(&server, "r", Duration::from_secs(1));
    let counter = fence_counter(&server, "r");
    let clients = || {
        server
            .cmd(&["CLIENT", "LIST"])
            .as_string()
            .map(|c| c.lines().count())
    };
    let before = clients();
    let first_try = evalsha_counter(&server);
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--wait", "2s", "--ttl", "5s", "--"])
        .args(scratch.sh(r#"touch "$D/ran""#));
    let running = Running::start(command);
    first_try.wait_for_more();
    // Frozen with leasehold's connection open: its next try, its replays and whatever follows
    // wait on the server's socket, unanswered.
    let paused = server.pause();
    let done = running.finish();
    done.assert_code(69);
    assert!(done.stderr.contains("still unknown"), "{done:#?}");
    assert!(
        done.stderr
            .contains("sent behind the acquire on the same connection"),
        "{done:#?}"
    );
    // leasehold has exited. The server resumes, runs what the closed connection left in
    // order (the holder's key has expired by now, so the acquire grants), then frees it.
    paused.resume();
    wait_until("leasehold's connections to be served and closed", || {
        (clients() == before).then_some(())
    });
    assert_ne!(
        fence_counter(&server, "r"),
        counter,
        "the stalled acquire never granted"
    );
    assert_eq!(
        server.cmd(&["EXISTS", &lease_key("r")]),
        Reply::Int(0),
        "the late grant outlived the run that gave up on it: {done:#?}"
    );
    assert!(!scratch.path("ran").exists(), "the command ran");
}

#[test]
fn a_lost_lease_exits_with_the_loss_exit_code_asked_for() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command
        .env("LEASEHOLD_LOSS_EXIT_CODE", "99")
        .args(["run", "r", "--ttl", "30s", "--"])
        .args(scratch.sh(r#"while [ ! -e "$D/go" ]; do sleep 0.01; done; exit 70"#));
    let running = Running::start(command);
    wait_until("the grant", || {
        (server.cmd(&["EXISTS", &lease_key("r")]) == Reply::Int(1)).then_some(())
    });
    server.cmd(&["DEL", &lease_key("r")]);
    std::fs::write(scratch.path("go"), "").unwrap();
    // The command's own 70 is no longer mistaken for a loss: the loss is 99.
    let done = running.finish();
    done.assert_code(99);
    assert!(
        done.stderr
            .contains("the lease ended before the command did"),
        "{done:#?}"
    );
}
