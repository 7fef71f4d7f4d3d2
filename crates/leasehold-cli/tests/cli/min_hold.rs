//! Run with a minimum hold and a holder name: a run-once job is refused to a second run until
//! the hold has passed, and inspect shows who held it.

use super::*;

const HOLD: Duration = Duration::from_millis(1500);
/// How long past the hold a run may take to be granted on this loaded machine.
const BOUND: Duration = Duration::from_secs(10);

#[test]
fn a_second_run_is_refused_until_the_first_runs_hold_has_passed() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let started = Instant::now();
    let mut command = leasehold(&server.url());
    command.args(["run", "job", "--hold-at-least", "1500ms", "--", "true"]);
    run_to_end(command).assert_code(0);

    // At once: the command is done and the lease released, yet its hold keeps the key.
    let mut command = leasehold(&server.url());
    command
        .args(["run", "job", "--", "sh", "-c"])
        .arg(format!("touch '{}'", scratch.path("ran").display()));
    let refused = run_to_end(command);
    refused.assert_code(75);
    assert!(
        refused
            .stderr
            .contains("released and kept until its minimum hold ends"),
        "{refused:#?}"
    );
    assert!(!scratch.path("ran").exists());

    // Then, within a bounded time, it runs: never before the hold ended.
    let mut refusals = 1;
    let ran_at = loop {
        let mut command = leasehold(&server.url());
        command.args(["run", "job", "--", "true"]);
        let done = run_to_end(command);
        match done.code() {
            0 => break done.at,
            75 => refusals += 1,
            _ => panic!("neither ran nor refused: {done:#?}"),
        }
        assert!(
            started.elapsed() < HOLD + BOUND,
            "still refused after {:?}",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(ran_at - started >= HOLD, "ran after {:?}", ran_at - started);
    assert!(refusals >= 1);
}

#[test]
fn inspect_shows_the_holder_name_and_a_release_kept_for_its_hold() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    // The default name while a run holds: this host and the leasehold process's pid.
    let mut command = leasehold(&server.url());
    command
        .args(["run", "held", "--"])
        .args(scratch.sh(r#"echo started > "$D/started"
           i=0; while [ ! -e "$D/go" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done"#));
    let holder = Running::start(command);
    wait_for_file(&scratch.path("started"));
    let json = inspect_json(&server, "held");
    let name = json["holder_name"].as_str().expect("a holder name");
    assert!(name.ends_with(&format!(":{}", holder.pid())), "{json}");
    assert_eq!(json["released"], false, "{json}");
    std::fs::write(scratch.path("go"), "").unwrap();
    holder.finish().assert_code(0);

    // A name from the environment, released at once under a 5 s hold.
    let mut command = leasehold(&server.url());
    command
        .env("LEASEHOLD_HOLDER", "nightly on host-3")
        .env("LEASEHOLD_HOLD_AT_LEAST", "5s")
        .args(["run", "kept", "--", "true"]);
    run_to_end(command).assert_code(0);
    let json = inspect_json(&server, "kept");
    assert_eq!(json["state"], "held", "{json}");
    assert_eq!(json["holder_name"], "nightly on host-3", "{json}");
    assert_eq!(json["released"], true, "{json}");
    let remaining = json["remaining_ms"].as_u64().expect("a number");
    assert!(remaining > 0 && remaining <= 5000, "{json}");
    let mut command = leasehold(&server.url());
    command.args(["inspect", "kept"]);
    let done = run_to_end(command);
    done.assert_code(0);
    assert!(
        done.stdout
            .contains("(\"nightly on host-3\") and kept until its minimum hold ends"),
        "{done:#?}"
    );
}

#[test]
fn bad_holder_names_and_holds_are_usage_errors_before_any_io() {
    let server = RedisServer::start();
    let before = snapshot(&server);
    for (flag, value) in [
        ("--holder", "two\nlines"),
        ("--holder", ""),
        ("--hold-at-least", "2days"),
        ("--hold-at-least", "1500us"),
    ] {
        let mut command = leasehold(&server.url());
        command.args(["run", "bad", flag, value, "--", "true"]);
        let done = run_to_end(command);
        done.assert_code(2);
        assert!(done.stderr.contains(flag), "{flag} {value:?}: {done:#?}");
    }
    assert_eq!(snapshot(&server), before);
    assert!(server.keys().is_empty());
}
