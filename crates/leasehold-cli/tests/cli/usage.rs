//! Usage errors.

use super::*;

#[test]
fn bad_flags_and_durations_are_usage_errors_2_before_any_io() {
    // Nothing listens there: any attempt to connect would be 69, not 2.
    let url = dead_url();
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "r", "--ttl", "5x", "--", "true"],
            "unknown time unit",
        ),
        (&["run", "r", "--ttl", "soon", "--", "true"], "--ttl"),
        (&["run", "r", "--wait=-1s", "--", "true"], "--wait"),
        (&["run", "r", "--grace", "", "--", "true"], "--grace"),
        (&["run", "r", "--ttl", "10ms", "--", "true"], "drift budget"),
        (
            &["run", "r", "--ttl", "1500us", "--", "true"],
            "whole number",
        ),
        (&["run", "r", "--wait", "2h", "--", "true"], "--wait 2h"),
        (
            &["run", "r", "--purpose", "Not Valid", "--", "true"],
            "--purpose",
        ),
        (&["run", "r"], "<CMD>"),
        (&["run", "r", "true"], "unexpected argument"),
        (&["run", "--", "true"], "<RESOURCE>"),
        (&["run", "r", "--frobnicate", "--", "true"], "--frobnicate"),
        (&["run", "r", "--capacity", "0", "--", "true"], "--capacity"),
        (
            &["run", "r", "--queue-heartbeat", "1s", "--", "true"],
            "only with --capacity",
        ),
        (&["inspect"], "<RESOURCE>"),
        (
            &["capacity", "r", "0"],
            "a capacity is a whole number from 1 to 1024",
        ),
        (&["capacity", "r"], "<RESOURCE>"),
        (&["break", "r", "--slot", "x", "--yes"], "--slot"),
        (&["inspect", "r", "--purpose", "a:b"], "--purpose"),
        (&["--namespace", "a:b", "inspect", "r"], "--namespace"),
        (&["frobnicate"], "frobnicate"),
        (&[], "Usage"),
    ];
    for (argv, needle) in cases {
        let mut command = leasehold(&url);
        command.args(*argv);
        let done = run_to_end(command);
        assert_eq!(done.code(), 2, "{argv:?}: {done:#?}");
        assert!(
            done.stderr.contains("error") || done.stderr.contains("Usage"),
            "{argv:?}: {done:#?}"
        );
        assert!(done.stderr.contains(needle), "{argv:?}: {done:#?}");
    }

    // A bad URL is a usage error too, and its password is not echoed, whatever it holds.
    for url in [
        "redis://:hunter2@127.0.0.1:notaport",
        "redis://:hun?ter2@127.0.0.1:notaport",
        "redis://:hun#ter2@127.0.0.1:notaport",
        "redis://:hun?ter2@127.0.0.1:6379",
        "redis://:hun#ter2@127.0.0.1:6379",
    ] {
        for argv in [
            &["inspect", "r"][..],
            &["run", "r", "--", "true"],
            &["demo"],
        ] {
            let mut command = leasehold(url);
            command.args(argv);
            let done = run_to_end(command);
            done.assert_code(2);
            // Reported before anything is done: the demo has not begun its story.
            assert!(done.stdout.is_empty(), "{url} {argv:?}: {done:#?}");
            assert!(done.stderr.contains("--redis"), "{url} {argv:?}: {done:#?}");
            for secret in ["hunter2", "hun?ter2", "hun#ter2", "ter2"] {
                assert!(
                    !done.stderr.contains(secret) && !done.stdout.contains(secret),
                    "{url} {argv:?}: {done:#?}"
                );
            }
        }
    }
}

#[test]
fn help_documents_the_exit_codes_and_never_shows_the_url_variable() {
    let help = |argv: &[&str]| {
        let mut command = leasehold(&dead_url());
        command
            .env(
                "LEASEHOLD_REDIS_URL",
                "redis://:hunter2@example.invalid:6379",
            )
            .args(argv);
        let done = run_to_end(command);
        done.assert_code(0);
        assert!(!done.stdout.contains("hunter2"), "{argv:?}: {done:#?}");
        done
    };
    let top = help(&["--help"]);
    for needle in [
        "75",
        "69",
        "70",
        "128+N",
        "LEASEHOLD_REDIS_URL",
        "LEASEHOLD_NAMESPACE",
        "run",
        "inspect",
        "demo",
    ] {
        assert!(top.stdout.contains(needle), "--help: {needle}: {top:#?}");
    }
    let run = help(&["run", "--help"]);
    for needle in [
        "75",
        "69",
        "70",
        "128+N",
        "LEASEHOLD_FENCE",
        "LEASEHOLD_RESOURCE_DIGEST",
        "LEASEHOLD_TTL_MS",
        "LEASEHOLD_SLOT",
        "--capacity",
        "78",
        "credentials it refuses",
    ] {
        assert!(
            run.stdout.contains(needle),
            "run --help: {needle}: {run:#?}"
        );
    }
}

#[test]
fn a_mistyped_subcommand_gets_the_nearest_one_suggested() {
    let cases: &[(&str, &str)] = &[
        ("rnu", "tip: a similar subcommand exists: 'run'"),
        ("lsit", "tip: a similar subcommand exists: 'list'"),
        ("inspct", "tip: a similar subcommand exists: 'inspect'"),
    ];
    for (typed, tip) in cases {
        let mut command = leasehold(&dead_url());
        command.args([*typed, "r"]);
        let done = run_to_end(command);
        done.assert_code(2);
        assert!(
            done.stderr
                .contains(&format!("unrecognized subcommand '{typed}'")),
            "{typed}: {done:#?}"
        );
        assert!(done.stderr.contains(tip), "{typed}: {done:#?}");
    }
    // Near nothing: no tip.
    let mut command = leasehold(&dead_url());
    command.arg("frobnicate");
    let done = run_to_end(command);
    done.assert_code(2);
    assert!(!done.stderr.contains("similar"), "{done:#?}");
}
