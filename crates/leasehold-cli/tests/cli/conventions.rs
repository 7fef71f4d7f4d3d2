//! Run where cron, systemd and CI call it: exit statuses chosen by the caller, every flag from
//! the environment, durations as people write them, and a JSON summary.

use super::*;

/// The last line of stdout, parsed as the `--json` summary; no line of stderr is one.
fn summary(done: &Finished) -> serde_json::Value {
    assert!(
        !done.stderr.lines().any(|l| l.starts_with('{')),
        "JSON on stderr: {done:#?}"
    );
    let line = done.stdout.lines().last().unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {done:#?}"))
}

/// The CLI guide's (docs/cli.md) crontab line, split into `leasehold`'s arguments.
fn readme_cron_line() -> Vec<String> {
    let readme = include_str!("../../../../docs/cli.md");
    let line = readme
        .lines()
        .find_map(|l| l.strip_prefix("*/5 * * * * leasehold "))
        .expect("docs/cli.md shows a crontab line");
    line.split_whitespace().map(str::to_owned).collect()
}

#[test]
fn a_skipped_run_with_conflict_exit_code_0_and_q_succeeds_and_prints_nothing() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let report = scratch.path("report.sh");
    std::fs::write(
        &report,
        "#!/bin/sh\necho ran >> \"$(dirname \"$0\")/ran\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&report, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cron = readme_cron_line();
    assert!(
        cron.contains(&"--conflict-exit-code".to_owned()),
        "{cron:?}"
    );
    // The CLI guide's cron line, exactly: it runs when the lease is free...
    let mut command = leasehold(&server.url());
    command.current_dir(scratch.path("")).args(&cron);
    let done = run_to_end(command);
    done.assert_code(0);
    assert_eq!(read(&scratch.path("ran")), "ran\n", "{done:#?}");
    // ...and while another holds it, skips with 0 and prints nothing (cron sends no mail).
    let held = Held::new(&server, "R", Duration::from_secs(30));
    let mut command = leasehold(&server.url());
    command.current_dir(scratch.path("")).args(&cron);
    let done = run_to_end(command);
    done.assert_code(0);
    assert_eq!(
        (done.stdout.as_str(), done.stderr.as_str()),
        ("", ""),
        "{done:#?}"
    );
    assert_eq!(read(&scratch.path("ran")), "ran\n", "it did not run again");
    // The issue's form, and the same from the environment with any other status.
    let mut command = leasehold(&server.url());
    command.args(["run", "R", "--conflict-exit-code", "0", "-q", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(0);
    assert_eq!(
        (done.stdout.as_str(), done.stderr.as_str()),
        ("", ""),
        "{done:#?}"
    );
    let mut command = leasehold(&server.url());
    command
        .env("LEASEHOLD_CONFLICT_EXIT_CODE", "3")
        .args(["run", "R", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(3);
    assert!(done.stderr.contains("not acquired"), "{done:#?}");
    drop(held);
}

#[test]
fn a_wait_of_inf_waits_until_the_holder_is_gone() {
    let server = RedisServer::start();
    // Never renewed: it expires after 1 s, and the run gets the lease then.
    let held = Held::new(&server, "R", Duration::from_secs(1));
    let mut command = leasehold(&server.url());
    command.args(["run", "R", "--wait", "inf", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(0);
    let mut command = leasehold(&server.url());
    command
        .env("LEASEHOLD_WAIT", "forever")
        .args(["run", "R", "--", "true"]);
    run_to_end(command).assert_code(0);
    drop(held);
}

#[test]
fn every_run_flag_comes_from_the_environment_and_seconds_are_a_duration() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command
        .env("LEASEHOLD_TTL", "2")
        .env("LEASEHOLD_WAIT", "1.5")
        .env("LEASEHOLD_GRACE", "1")
        .env("LEASEHOLD_PURPOSE", "nightly")
        .env("LEASEHOLD_HOLDER", "host-9")
        .env("LEASEHOLD_JSON", "true")
        .args(["run", "R", "--"])
        .args(scratch.sh(r#"echo "$LEASEHOLD_TTL_MS" > "$D/ttl""#));
    let done = run_to_end(command);
    done.assert_code(0);
    assert_eq!(read(&scratch.path("ttl")).trim(), "2000");
    assert_eq!(summary(&done)["outcome"], "completed", "{done:#?}");
    // The purpose came from the environment: the key is under it.
    let keys = server.keys();
    assert!(
        keys.iter()
            .any(|k| k.starts_with("leasehold:lease:v1:nightly:")),
        "{keys:?}"
    );
}

#[test]
fn a_bad_value_names_the_variable_it_came_from_or_the_flag() {
    let server = RedisServer::start();
    let cases: &[(&str, &str, &str)] = &[
        ("LEASEHOLD_TTL", "soon", "LEASEHOLD_TTL \"soon\""),
        (
            "LEASEHOLD_TTL",
            "0.05",
            "LEASEHOLD_TTL 0.05: must be at least 100ms",
        ),
        ("LEASEHOLD_WAIT", "2h", "LEASEHOLD_WAIT 2h: must be at most"),
        ("LEASEHOLD_GRACE", "-1", "LEASEHOLD_GRACE \"-1\""),
        ("LEASEHOLD_PURPOSE", "Bad", "LEASEHOLD_PURPOSE \"Bad\""),
        ("LEASEHOLD_HOLDER", "", "LEASEHOLD_HOLDER"),
        (
            "LEASEHOLD_HOLD_AT_LEAST",
            "2days",
            "LEASEHOLD_HOLD_AT_LEAST 2days",
        ),
        (
            "LEASEHOLD_CONFLICT_EXIT_CODE",
            "256",
            "LEASEHOLD_CONFLICT_EXIT_CODE \"256\": an exit status is a whole number from 0 to 255",
        ),
        (
            "LEASEHOLD_LOSS_EXIT_CODE",
            "x",
            "LEASEHOLD_LOSS_EXIT_CODE \"x\"",
        ),
        ("LEASEHOLD_NAMESPACE", "a:b", "LEASEHOLD_NAMESPACE"),
        (
            "LEASEHOLD_CAPACITY",
            "0",
            "LEASEHOLD_CAPACITY \"0\": a capacity is a whole number from 1 to 1024",
        ),
        (
            "LEASEHOLD_QUEUE_HEARTBEAT",
            "1s",
            "LEASEHOLD_QUEUE_HEARTBEAT: only with --capacity",
        ),
    ];
    for (name, value, expected) in cases {
        let mut command = leasehold(&server.url());
        command.env(name, value).args(["run", "R", "--", "true"]);
        let done = run_to_end(command);
        done.assert_code(2);
        assert!(done.stderr.contains(expected), "{name}={value}: {done:#?}");
        let flag = format!(
            "--{}",
            name["LEASEHOLD_".len()..].to_lowercase().replace('_', "-")
        );
        assert!(
            !done.stderr.contains(&format!("{flag} ")),
            "{name}: {done:#?}"
        );
    }
    // Typed, the flag is named, and the duration echoed as it was written.
    let mut command = leasehold(&server.url());
    command.args(["run", "R", "--ttl", "0.05", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(2);
    assert!(
        done.stderr.contains("--ttl 0.05: must be at least 100ms"),
        "{done:#?}"
    );
    assert_eq!(server.keys(), Vec::<String>::new(), "nothing was written");
}

#[test]
fn run_json_reports_the_outcome_exit_fence_times_and_release() {
    let server = RedisServer::start();
    let mut command = leasehold(&server.url());
    command.args(["run", "R", "--json", "--", "sh", "-c", "sleep 0.2; exit 3"]);
    let done = run_to_end(command);
    done.assert_code(3);
    let report = summary(&done);
    assert_eq!(report["outcome"], "completed", "{report}");
    assert_eq!(report["exit"], 3, "{report}");
    assert_eq!(report["command_exit"], 3, "{report}");
    assert!(report["fence"].as_u64().is_some_and(|f| f > 0), "{report}");
    assert!(report["waited_ms"].as_u64().is_some(), "{report}");
    assert!(
        report["held_ms"].as_u64().is_some_and(|ms| ms >= 200),
        "{report}"
    );
    assert_eq!(report["release"], "released", "{report}");

    let held = Held::new(&server, "R", Duration::from_secs(30));
    let mut command = leasehold(&server.url());
    command.args(["run", "R", "--json", "-q", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(75);
    let report = summary(&done);
    assert_eq!(report["outcome"], "not_acquired", "{report}");
    assert_eq!(report["exit"], 75, "{report}");
    assert!(
        report["fence"].is_null() && report["release"].is_null(),
        "{report}"
    );
    // -q leaves the summary only, on stdout.
    assert_eq!(done.stderr, "", "{done:#?}");
    assert_eq!(done.stdout.lines().count(), 1, "{done:#?}");
    // Without -q, the human line goes to stderr and stdout holds the summary alone.
    let mut command = leasehold(&server.url());
    command.args(["run", "R", "--json", "--", "true"]);
    let done = run_to_end(command);
    done.assert_code(75);
    assert!(done.stderr.contains("not acquired"), "{done:#?}");
    assert_eq!(done.stdout.lines().count(), 1, "{done:#?}");
    assert_eq!(summary(&done)["outcome"], "not_acquired", "{done:#?}");
    drop(held);
}

#[test]
fn completions_and_the_man_page_come_from_the_command_line_s_definition() {
    let cases: &[(&[&str], &str)] = &[
        (&["completions", "bash"], "_leasehold()"),
        (&["completions", "zsh"], "#compdef leasehold"),
        (&["completions", "fish"], "complete -c leasehold"),
        (&["man"], ".TH leasehold 1"),
    ];
    for (args, marker) in cases {
        let mut command = leasehold("redis://127.0.0.1:1");
        command.args(*args);
        let done = run_to_end(command);
        done.assert_code(0);
        assert!(
            done.stdout.contains(marker),
            "{args:?}: {}",
            &done.stdout[..done.stdout.len().min(400)]
        );
        // Generated, not written by hand: the newest flag and subcommand are there.
        let newest = if args[0] == "man" {
            "completions"
        } else {
            "conflict-exit-code"
        };
        assert!(done.stdout.contains(newest), "{args:?}");
        assert_eq!(done.stderr, "", "{args:?}");
    }
    let mut command = leasehold("redis://127.0.0.1:1");
    command.args(["completions", "tcsh"]);
    run_to_end(command).assert_code(2);
}

/// Every page the top-level man page names, leasehold-COMMAND(1), can be printed, and is that
/// page: `run`'s tells its flags and its exit codes.
#[test]
fn every_man_page_the_top_page_names_can_be_printed() {
    let man = |args: &[&str]| {
        let mut command = leasehold("redis://127.0.0.1:1");
        command.arg("man").args(args);
        run_to_end(command)
    };
    let top = man(&[]);
    top.assert_code(0);
    let named: Vec<&str> = top
        .stdout
        .lines()
        .filter_map(|line| line.strip_prefix("leasehold\\-")?.strip_suffix("(1)"))
        .collect();
    assert!(named.contains(&"run") && named.len() >= 5, "{named:?}");
    for name in named {
        let page = man(&[name]);
        page.assert_code(0);
        let title = format!(".TH leasehold-{name} 1 ");
        assert!(
            page.stdout.contains(&title),
            "{name}: {}",
            &page.stdout[..200.min(page.stdout.len())]
        );
        assert!(
            page.stdout.contains("\"leasehold "),
            "{name}: no program in the footer"
        );
    }
    let run = man(&["run"]).stdout;
    for flag in ["ttl", "wait", "grace", "hold\\-at\\-least", "75", "SIGTERM"] {
        assert!(run.contains(flag), "leasehold-run(1) lacks {flag}");
    }
    man(&["nope"]).assert_code(2);
}

/// `run --help` and the man pages show where `run` is called from — cron, a systemd service
/// and its timer, a CI step — with the CLI guide's (docs/cli.md) own lines, word for word.
#[test]
fn run_help_and_the_man_pages_show_the_readme_s_examples_and_a_timer() {
    let readme = include_str!("../../../../docs/cli.md");
    let readme_lines: Vec<&str> = readme
        .lines()
        .filter(|l| {
            l.starts_with("*/5 * * * * leasehold ")
                || l.starts_with("ExecStart=")
                || l.starts_with("SuccessExitStatus=")
                || l.starts_with("Environment=LEASEHOLD_")
                || l.starts_with("- run: leasehold run ")
                || l.contains("LEASEHOLD_REDIS_URL: ${{")
        })
        .map(str::trim)
        .collect();
    assert_eq!(
        readme_lines.len(),
        6,
        "docs/cli.md's examples: {readme_lines:?}"
    );
    let timer = [
        "[Timer]",
        "OnCalendar=*-*-* 02:00:00",
        "WantedBy=timers.target",
        "systemctl enable --now report.timer",
    ];
    let output = |args: &[&str]| {
        let mut command = leasehold("redis://127.0.0.1:1");
        command.args(args);
        let done = run_to_end(command);
        done.assert_code(0);
        done.stdout
    };
    let help = output(&["run", "--help"]);
    let at = help.find("\nExamples:\n").expect("an Examples section");
    let examples = &help[at..];
    // Unescaped as man shows them: a flag's `\-` is a `-`.
    let run_page = output(&["man", "run"]).replace("\\-", "-");
    let top_page = output(&["man"]).replace("\\-", "-");
    for (name, text) in [
        ("run --help", examples),
        ("leasehold-run(1)", run_page.as_str()),
        ("leasehold(1)", top_page.as_str()),
    ] {
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for line in &readme_lines {
            assert!(lines.contains(line), "{name} lacks {line:?}: {text}");
        }
        for needle in timer {
            assert!(text.contains(needle), "{name} lacks {needle:?}: {text}");
        }
    }
    // In a section of its own, line for line, not filled into a paragraph.
    for page in [&run_page, &top_page] {
        let section = page
            .find(".SH EXAMPLES\n.nf\n")
            .expect("an EXAMPLES section");
        assert!(page[section..].contains("\n.fi\n"), "{page}");
    }
}
