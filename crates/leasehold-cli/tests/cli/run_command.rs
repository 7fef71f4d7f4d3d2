//! Run: the command, its environment and its exit code.

use super::*;

#[test]
fn the_command_sees_the_lease_and_its_exit_code_is_passed_on() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command
        .args(["run", "orders/42", "--ttl", "1500ms", "--"])
        .args(scratch.sh(
            r#"printf '%s\n%s\n%s\n' "$LEASEHOLD_FENCE" "$LEASEHOLD_RESOURCE_DIGEST" \
               "$LEASEHOLD_TTL_MS" > "$D/env"; exit 7"#,
        ));
    run_to_end(command).assert_code(7);
    let env = read(&scratch.path("env"));
    let lines: Vec<&str> = env.lines().collect();
    let fence = fence_counter(&server, "orders/42").expect("a grant moved the counter");
    assert_eq!(
        lines,
        [
            fence.as_str(),
            ResourceDigest::of("orders/42").as_str(),
            "1500"
        ],
        "{env:?}"
    );
}

#[test]
fn the_fence_grows_across_runs() {
    let server = RedisServer::start();
    let fences: Vec<String> = (0..3)
        .map(|_| {
            let mut command = leasehold(&server.url());
            command.args([
                "run",
                "jobs/nightly",
                "--",
                "sh",
                "-c",
                "echo $LEASEHOLD_FENCE",
            ]);
            let done = run_to_end(command);
            done.assert_code(0);
            done.stdout.trim().to_owned()
        })
        .collect();
    let fences: Vec<u64> = fences
        .iter()
        .map(|f| f.parse().expect("a decimal"))
        .collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    // No longer a small counter: the server's clock in microseconds, beyond 32 bits.
    assert!(fences[0] > u64::from(u32::MAX), "{fences:?}");
    assert_eq!(
        fence_counter(&server, "jobs/nightly"),
        Some(fences[2].to_string())
    );
}

#[test]
fn a_command_ended_by_signal_n_gives_128_plus_n() {
    let server = RedisServer::start();
    for (signal, code) in [("TERM", 143), ("KILL", 137), ("INT", 130)] {
        let mut command = leasehold(&server.url());
        command.args(["run", "r", "--", "sh", "-c", &format!("kill -{signal} $$")]);
        run_to_end(command).assert_code(code);
    }
}

#[test]
fn a_command_that_cannot_be_found_is_127_and_the_lease_is_released() {
    let server = RedisServer::start();
    let mut command = leasehold(&server.url());
    command.args(["run", "r", "--", "/nonexistent/command"]);
    let done = run_to_end(command);
    done.assert_code(127);
    assert!(done.stderr.contains("/nonexistent/command"), "{done:#?}");
    assert_eq!(inspect_json(&server, "r")["state"], "free");
}

#[test]
fn the_lease_is_renewed_while_the_command_runs() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    // Four TTLs long: the command completes only if the lease is kept alive throughout.
    command.args(["run", "r", "--ttl", "300ms", "--"]).args(
        scratch.sh(r#"echo $LEASEHOLD_FENCE > "$D/fence"; sleep 1.2; touch "$D/done"; exit 5"#),
    );
    let running = Running::start(command);
    let fence = wait_for_file(&scratch.path("fence")).trim().to_owned();
    // Until the command is done, the key is there, held by the one grant (the stored value
    // is `fence:token:operation`).
    let mut samples = 0;
    loop {
        let done_before = scratch.path("done").exists();
        let stored = server.cmd(&["GET", &lease_key("r")]).as_string();
        if done_before {
            break;
        }
        match stored {
            Some(value) => {
                assert_eq!(value.split(':').next(), Some(fence.as_str()), "{value}");
                samples += 1;
            }
            // Released, which happens only once the command is done.
            None => assert!(scratch.path("done").exists(), "the lease lapsed"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let done = running.finish();
    done.assert_code(5);
    assert!(samples >= 10, "{samples} samples: {done:#?}");
    // Renewed, not re-acquired: the fence counter saw one grant.
    assert_eq!(fence_counter(&server, "r"), Some(fence));
}

#[test]
fn a_command_that_cannot_be_executed_is_126_and_the_lease_is_released() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let script = scratch.path("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let mut command = leasehold(&server.url());
    command.args(["run", "r", "--"]).arg(&script);
    let done = run_to_end(command);
    done.assert_code(126);
    assert!(done.stderr.contains("not-executable.sh"), "{done:#?}");
    assert_eq!(inspect_json(&server, "r")["state"], "free");
}

#[test]
fn after_the_command_exits_the_lease_is_free() {
    let server = RedisServer::start();
    let mut command = leasehold(&server.url());
    command.args(["run", "r", "--", "sh", "-c", "exit 0"]);
    run_to_end(command).assert_code(0);
    assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(0));
    let json = inspect_json(&server, "r");
    assert_eq!(json["state"], "free", "{json}");
}

#[test]
fn nothing_the_command_leaves_behind_outlives_the_lease() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    // A worker that ignores SIGTERM and writes with the fence until it is killed, started in
    // the background by a command that exits at once.
    std::fs::write(
        scratch.path("worker.sh"),
        r#"trap 'echo TERM >> "$D/signals"' TERM
           echo $$ > "$D/worker"
           i=0; while [ $i -lt 600 ]; do echo "$LEASEHOLD_FENCE" >> "$D/writes"; sleep 0.05; i=$((i+1)); done"#,
    )
    .unwrap();
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--grace", "300ms", "--"])
        .args(scratch.sh(r#"D="$D" sh "$D/worker.sh" &
               while [ ! -s "$D/writes" ]; do sleep 0.01; done
               exit 0"#));
    let done = run_to_end(command);
    // The command's own code: it ran to completion, and the lease was kept meanwhile.
    done.assert_code(0);
    let worker: u32 = read(&scratch.path("worker")).trim().parse().unwrap();
    // Gone before leasehold released the lease and exited: asked first, then killed.
    assert!(is_dead(worker), "the worker outlived leasehold: {done:#?}");
    assert_eq!(read(&scratch.path("signals")), "TERM\n", "{done:#?}");
    assert!(done.stderr.contains("left processes"), "{done:#?}");
    assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(0));
}

/// Someone profiling their program with valgrind must not see it crash. rustix's own backend
/// found the vDSO through the auxiliary vector, which valgrind lays out otherwise, and the
/// first clock read died of SIGSEGV (rustix#1559); the workspace builds rustix on libc.
/// `make test` installs valgrind when it is missing.
#[test]
fn it_runs_under_valgrind() {
    let server = RedisServer::start();
    let found = Command::new("valgrind").arg("--version").output();
    assert!(
        found.is_ok_and(|out| out.status.success()),
        "valgrind is not installed: apt-get install -y valgrind (make test installs it)"
    );
    let mut command = leasehold_under(&["valgrind", "--tool=none", "-q"], &server.url());
    command.args([
        "run",
        "profiled/job",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCE",
    ]);
    let done = run_to_end(command);
    done.assert_code(0);
    assert_eq!(
        fence_counter(&server, "profiled/job"),
        Some(done.stdout.trim().to_owned()),
        "{done:#?}"
    );
}
