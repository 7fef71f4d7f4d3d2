//! Messages that say what is wrong: a bad URL names the part (never the password), a database
//! the server lacks is a usage error, `demo --help` offers no variable it ignores, and a
//! command without `--` gets a tip.

use super::*;

/// Runs `leasehold --redis URL inspect r`, which must refuse before any I/O.
fn refused_url(url: &str) -> Finished {
    let mut command = leasehold(url);
    command.args(["inspect", "r"]);
    let done = run_to_end(command);
    done.assert_code(2);
    done
}

#[test]
fn an_invalid_url_says_why_without_the_password() {
    let cases = [
        (
            "http://:hunter2@h:6379",
            "the scheme http:// is not one leasehold speaks",
        ),
        ("127.0.0.1:6379", "does not start with a scheme"),
        (
            "redis://:hunter2@h:notaport",
            "the port of the host is not a number from 1 to 65535",
        ),
        (
            "redis://:hunter2@h:0",
            "the port of the host is not a number",
        ),
        ("redis://:hunter2@:6379", "the host is empty"),
        (
            "redis://:hunter2@h/x",
            "the database index is not a whole number",
        ),
        (
            "redis://:hunter2@h/-3",
            "the database index is not a whole number",
        ),
        (
            "redis://:hunter2@a:1,b:2",
            "it names several hosts: use redis+cluster://",
        ),
        ("redis+sentinel://:hunter2@a:26379", "it names no service"),
        (
            "redis+sentinel://:hunter2@a:1,b:x/m",
            "the port of host 2 of 2",
        ),
        (
            "redis+cluster://:hunter2@a:1/4",
            "a Cluster has database 0 only",
        ),
    ];
    for (url, needle) in cases {
        let done = refused_url(url);
        assert!(done.stderr.contains(needle), "{url}: {done:#?}");
        assert!(done.stderr.contains("--redis"), "{url}: {done:#?}");
        assert!(!done.stderr.contains("hunter2"), "{url}: {done:#?}");
    }
    // From the environment, the variable is named instead of the flag.
    let mut command = Command::new(BIN);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("LEASEHOLD_") {
            command.env_remove(name);
        }
    }
    command
        .env("LEASEHOLD_REDIS_URL", "redis://:hunter2@h:99999")
        .args(["list"]);
    let done = run_to_end(command);
    done.assert_code(2);
    assert!(
        done.stderr
            .contains("LEASEHOLD_REDIS_URL redis://:***@h:99999: invalid Redis URL: the port"),
        "{done:#?}"
    );
}

#[test]
fn a_database_the_server_does_not_have_is_a_usage_error() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let url = format!("{}/99", server.url());
    let mut command = leasehold(&url);
    command
        .args(["run", "r", "--"])
        .args(scratch.sh("echo ran > \"$D/ran\""));
    let done = run_to_end(command);
    done.assert_code(2);
    assert!(
        done.stderr
            .contains("the server has no database of the URL's index"),
        "{done:#?}"
    );
    assert!(!scratch.path("ran").exists(), "the command must not run");
    for argv in [&["inspect", "r"][..], &["list"][..]] {
        let mut command = leasehold(&url);
        command.args(argv);
        let done = run_to_end(command);
        done.assert_code(2);
        assert!(done.stderr.contains("no database"), "{argv:?}: {done:#?}");
    }
    assert!(server.keys().is_empty());
}

#[test]
fn demo_help_does_not_offer_the_url_variable_it_ignores() {
    let help = |argv: &[&str]| {
        let mut command = leasehold(&dead_url());
        command.args(argv);
        let done = run_to_end(command);
        done.assert_code(0);
        done.stdout
    };
    for argv in [
        &["demo", "--help"][..],
        &["demo", "-h"][..],
        &["help", "demo"][..],
    ] {
        let text = help(argv);
        assert!(
            !text.contains("[env: LEASEHOLD_REDIS_URL"),
            "{argv:?}: {text}"
        );
        assert!(
            text.contains("LEASEHOLD_REDIS_URL is ignored"),
            "{argv:?}: {text}"
        );
    }
    // Every other command still offers it.
    for argv in [
        &["run", "--help"][..],
        &["inspect", "--help"][..],
        &["list", "--help"][..],
    ] {
        let text = help(argv);
        assert!(
            text.contains("[env: LEASEHOLD_REDIS_URL"),
            "{argv:?}: {text}"
        );
    }
}

#[test]
fn a_command_without_the_separator_gets_a_tip() {
    for argv in [&["run", "x", "true"][..], &["run", "x"][..]] {
        let mut command = leasehold(&dead_url());
        command.args(argv);
        let done = run_to_end(command);
        done.assert_code(2);
        assert!(
            done.stderr.contains(
                "tip: the command goes after `--`: leasehold run RESOURCE [OPTIONS] -- CMD"
            ),
            "{argv:?}: {done:#?}"
        );
        assert!(done.stderr.contains("Usage: leasehold run"), "{done:#?}");
    }
    // Another mistake gets clap's message alone.
    let mut command = leasehold(&dead_url());
    command.args(["run", "x", "--tll", "2s", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(2);
    assert!(!done.stderr.contains("tip: the command goes"), "{done:#?}");
}

#[test]
fn a_refused_connection_says_how_to_start_or_point_to_redis() {
    // Nothing listens on the port: each command says how to start Redis or name another.
    let url = dead_url();
    for argv in [
        &["run", "r", "--", "true"][..],
        &["inspect", "r"],
        &["list"],
        &["break", "r", "--yes"],
        // The demo on a server of the user's, not its own.
        &["demo", "--redis", url.as_str()],
    ] {
        let mut command = leasehold(&url);
        command.args(argv);
        let done = run_to_end(command);
        done.assert_code(69);
        assert!(
            done.stderr
                .contains(&format!("tip: nothing accepts connections at {url}")),
            "{argv:?}: {done:#?}"
        );
        for needle in ["redis-server", "--redis URL", "LEASEHOLD_REDIS_URL"] {
            assert!(
                done.stderr.contains(needle),
                "{argv:?}: {needle}: {done:#?}"
            );
        }
    }
    // A server that answers but refuses for another reason gets no such tip.
    let server = RedisServer::start();
    let mut command = leasehold(&format!("{}/99", server.url()));
    command.args(["inspect", "r"]);
    let done = run_to_end(command);
    assert!(!done.stderr.contains("tip: nothing accepts"), "{done:#?}");
}

/// A configuration error: 2, as a bad URL or a database the server lacks, never 69.
#[test]
fn credentials_the_server_refuses_are_a_configuration_error_2() {
    let password = "pw-cli-7c1e-right";
    let wrong = "pw-cli-7c1e-wrong";
    let server = RedisServer::start();
    // Set once the harness has seen the server answer: from now on it needs the password.
    assert_eq!(
        server.cmd(&["CONFIG", "SET", "requirepass", password]),
        Reply::Status("OK".into())
    );
    let port = server.port();
    let scratch = Scratch::new();
    // A wrong password, and none at all.
    for url in [
        format!("redis://:{wrong}@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
    ] {
        for argv in [
            &["run", "r", "--", "sh", "-c", "touch \"$D/ran\""][..],
            &["inspect", "r"],
            &["list"],
            &["break", "r", "--yes"],
            &["demo"],
        ] {
            let mut command = leasehold(&url);
            command.env("D", scratch.path("")).args(argv);
            let done = run_to_end(command);
            done.assert_code(2);
            assert!(
                done.stderr.contains("the server refused the credentials"),
                "{argv:?}: {done:#?}"
            );
            assert!(
                done.stderr
                    .contains("check the user and password in the URL"),
                "{argv:?}: {done:#?}"
            );
            let printed = format!("{}{}", done.stdout, done.stderr);
            assert!(!printed.contains(wrong), "{argv:?}: {done:#?}");
        }
    }
    assert!(!scratch.path("ran").exists(), "the command ran");
    // The right password works.
    let mut command = leasehold(&format!("redis://:{password}@127.0.0.1:{port}"));
    command.args(["run", "r", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(0);
    assert!(!done.stderr.contains(password), "{done:#?}");
}
