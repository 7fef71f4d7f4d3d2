//! Logs and notes on stderr: `-v`, `-q`, `LEASEHOLD_LOG`, and the default that says nothing
//! on success.

use super::*;

#[test]
fn verbose_run_logs_the_acquire_each_renewal_and_the_release() {
    let server = RedisServer::start();
    let mut command = leasehold(&server.url());
    // A 600 ms TTL renewed every 200 ms: a 700 ms command sees a few renewals.
    command.args(["-v", "run", "job", "--ttl", "600ms", "--", "sleep", "0.7"]);
    let done = run_to_end(command);
    done.assert_code(0);
    let log = &done.stderr;
    assert!(log.contains("acquired the lease fence="), "{log}");
    assert!(log.contains("the command started pid="), "{log}");
    assert!(log.contains("renewed outcome=\"renewed\""), "{log}");
    assert!(log.contains("the command ended exit=0"), "{log}");
    assert!(log.contains("released the lease outcome=released"), "{log}");
    // At -v, not the trace-level tries and inspections.
    assert!(!log.contains("TRACE"), "{log}");
    assert!(done.stdout.is_empty(), "{done:#?}");
}

#[test]
fn without_flags_a_successful_run_says_nothing_and_leasehold_log_turns_logs_on() {
    let server = RedisServer::start();
    let mut command = leasehold(&server.url());
    command.args(["run", "job", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(0);
    assert_eq!(done.stderr, "", "{done:#?}");

    let mut command = leasehold(&server.url());
    command
        .env("LEASEHOLD_LOG", "leasehold::run=info")
        .args(["run", "job", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(0);
    assert!(done.stderr.contains("released the lease"), "{done:#?}");
    assert!(!done.stderr.contains("DEBUG"), "{done:#?}");
}

#[test]
fn quiet_silences_the_note_of_a_contended_run_but_not_its_exit_code() {
    let server = RedisServer::start();
    let held = Held::new(&server, "job", Duration::from_secs(30));
    let mut command = leasehold(&server.url());
    command.args(["-q", "run", "job", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(75);
    assert_eq!(done.stderr, "", "{done:#?}");
    // Without -q the same run says who holds it.
    let mut command = leasehold(&server.url());
    command.args(["run", "job", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(75);
    assert!(done.stderr.contains("not acquired"), "{done:#?}");
    drop(held);
}

#[test]
fn a_bad_log_filter_is_a_usage_error_before_any_io() {
    let mut command = leasehold(&dead_url());
    command
        .env("LEASEHOLD_LOG", "leasehold=loud")
        .args(["run", "job", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(2);
    assert!(done.stderr.contains("LEASEHOLD_LOG"), "{done:#?}");
    // -v and -q together are refused too.
    let mut command = leasehold(&dead_url());
    command.args(["-v", "-q", "run", "job", "--", "true"]);
    run_to_end(command).assert_code(2);
}

#[test]
fn very_verbose_run_logs_every_command_by_its_script() {
    let server = RedisServer::start();
    let mut command = leasehold(&server.url());
    command.args(["-vv", "run", "job", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(0);
    let log = &done.stderr;
    assert!(log.contains("TRACE"), "{log}");
    assert!(
        log.contains("command=\"EVALSHA\" script=\"acquire\""),
        "{log}"
    );
    assert!(
        log.contains("command=\"EVALSHA\" script=\"release\""),
        "{log}"
    );
}
