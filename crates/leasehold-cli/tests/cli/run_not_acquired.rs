//! Run: not acquired, unavailable, unknown.

use super::*;

#[test]
fn a_held_lease_is_not_acquired_within_the_wait_75() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let _held = Held::new(&server, "r", Duration::from_secs(30));
    for wait in ["0s", "300ms"] {
        let mut command = leasehold(&server.url());
        command
            .args(["run", "r", "--wait", wait, "--"])
            .args(scratch.sh("touch \"$D/ran\""));
        let started = Instant::now();
        let done = run_to_end(command);
        done.assert_code(75);
        assert!(done.stderr.contains("not acquired"), "{done:#?}");
        if wait == "300ms" {
            assert!(done.at - started >= Duration::from_millis(300), "{done:#?}");
            assert!(done.stderr.contains("within 300ms"), "{done:#?}");
        }
        assert!(!scratch.path("ran").exists(), "the command ran");
    }
}

#[test]
fn a_waiting_run_starts_when_the_holder_releases() {
    let server = RedisServer::start();
    let mut held = Held::new(&server, "r", Duration::from_secs(30));
    let holder_fence = fence_counter(&server, "r").expect("held");
    let first_try = evalsha_counter(&server);
    let mut command = leasehold(&server.url());
    command.args([
        "run",
        "r",
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    let running = Running::start(command);
    first_try.wait_for_more();
    let released_at = Instant::now();
    held.release();
    let done = running.finish();
    done.assert_code(0);
    assert!(
        done.stdout.trim().parse::<u64>().expect("a fence") > holder_fence.parse().unwrap(),
        "{done:#?}"
    );
    // Woken by the release notice: the holder's TTL (its retry-after) and the deadline are
    // 20 s and more away.
    assert!(done.at - released_at < Duration::from_secs(10), "{done:#?}");
}

#[test]
fn nothing_listening_is_69_and_the_command_never_starts() {
    let scratch = Scratch::new();
    let url = format!("redis://:hunter2@127.0.0.1:{}", dead_port());
    let mut command = leasehold(&url);
    command
        .args(["run", "r", "--"])
        .args(scratch.sh("touch \"$D/ran\""));
    let done = run_to_end(command);
    done.assert_code(69);
    assert!(!scratch.path("ran").exists(), "the command ran");
    assert!(done.stderr.contains("unavailable"), "{done:#?}");
    // The URL is named, its password masked.
    assert!(done.stderr.contains("redis://:***@127.0.0.1:"), "{done:#?}");
    assert!(!done.stderr.contains("hunter2"), "{done:#?}");

    let mut command = leasehold(&url);
    command.args(["inspect", "r", "--json"]);
    let done = run_to_end(command);
    done.assert_code(69);
    assert!(done.stdout.is_empty(), "{done:#?}");
    assert!(!done.stderr.contains("hunter2"), "{done:#?}");
}

#[test]
fn rediss_urls_are_understood() {
    // TLS is compiled in: the URL is accepted (not a usage error) and the dead port is 69.
    let mut command = leasehold(&format!("rediss://127.0.0.1:{}", dead_port()));
    command.args(["inspect", "r"]);
    run_to_end(command).assert_code(69);
}

#[test]
fn an_outcome_that_stays_unknown_is_69_and_the_command_never_starts() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let paused = WritesPaused::start(&server);
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--ttl", "1s", "--"])
        .args(scratch.sh(r#"echo $LEASEHOLD_FENCE > "$D/ran""#));
    let running = Running::start(command);
    paused.wait_for_a_parked_command();
    let done = running.finish();
    done.assert_code(69);
    assert!(
        done.stderr.contains("replaying the same attempt"),
        "{done:#?}"
    );
    assert!(done.stderr.contains("still unknown"), "{done:#?}");
    assert!(!scratch.path("ran").exists(), "the command ran");
}

#[test]
fn an_unknown_outcome_resolved_by_replay_starts_the_command_with_the_one_grant() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let paused = WritesPaused::start(&server);
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--ttl", "2s", "--"])
        .args(scratch.sh(r#"echo $LEASEHOLD_FENCE > "$D/ran""#));
    let mut running = Running::start(command);
    running.wait_for_stderr("replaying the same attempt");
    // The parked first try now runs and grants; the replays behind it find that grant.
    paused.resume();
    let done = running.finish();
    done.assert_code(0);
    // Had leasehold made a new attempt instead of replaying, the first try's grant would have
    // made it contended; the fence counter says the command ran under the one grant.
    let ran = read(&scratch.path("ran"));
    assert_eq!(
        fence_counter(&server, "r"),
        Some(ran.trim().to_owned()),
        "{done:#?}"
    );
}

#[test]
fn unknown_outcomes_are_replayed_at_a_pace() {
    // A server whose TIME command is renamed away makes the acquire script fail at the
    // server: an error after the script started is `Indeterminate` (it may have written), and
    // it comes back at once, every time.
    let server = RedisServer::start_with_args(&["--rename-command", "TIME", "TIME-RENAMED"]);
    let scratch = Scratch::new();
    let tries = evalsha_counter(&server);
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--ttl", "1s", "--"])
        .args(scratch.sh("touch \"$D/ran\""));
    let done = run_to_end(command);
    done.assert_code(69);
    assert!(done.stderr.contains("still unknown"), "{done:#?}");
    assert!(!scratch.path("ran").exists(), "the command ran");
    // One try, then replays for at most 1 s with a 50 ms pause after each: about 21. Without
    // the pause there are thousands.
    let made = tries.count();
    assert!((2..=30).contains(&made), "{made} tries: {done:#?}");
}
