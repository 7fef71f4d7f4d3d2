//! Run: losing the lease, signals.

use super::*;

#[test]
fn a_lease_lost_to_another_stops_the_command_70() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    // A command that outlives SIGTERM, and a grace of a minute: a lease found lost outright has
    // no validity left, so SIGKILL must follow SIGTERM at once (D17), not after the grace.
    command
        .args(["run", "r", "--ttl", "1s", "--grace", "1m", "--"])
        .args(scratch.sh(&format!(
            r#"trap 'echo TERM >> "$D/signals"' TERM
               echo $$ > "$D/pid"
               {SPIN}"#
        )));
    let running = Running::start(command);
    let pid: u32 = wait_for_file(&scratch.path("pid")).trim().parse().unwrap();
    // Someone deletes the key: the next renewal (a third of the TTL away) finds it gone.
    let deleted_at = Instant::now();
    assert_eq!(server.cmd(&["DEL", &lease_key("r")]), Reply::Int(1));
    let died_at = wait_until("the command to die", || is_dead(pid).then(Instant::now));
    let done = running.finish();
    done.assert_code(70);
    // In words: what the server said, and what it holds now; SIGKILL at once, said so.
    assert!(
        done.stderr
            .contains("lease lost (the server no longer holds this grant)"),
        "{done:#?}"
    );
    assert!(
        done.stderr
            .contains("SIGTERM and SIGKILL now, as no validity is left for a grace"),
        "{done:#?}"
    );
    assert!(
        done.stderr
            .contains("the lease's key is gone from the server"),
        "{done:#?}"
    );
    for debug in ["LostToAnother", "SIGKILL in 0s"] {
        assert!(!done.stderr.contains(debug), "{debug}: {done:#?}");
    }
    assert!(
        died_at - deleted_at < Duration::from_secs(5),
        "the command lived {:?} after the loss",
        died_at - deleted_at
    );
}

/// Taken over: what the server holds now is named, the other grant's fence with it.
#[test]
fn a_lease_taken_over_names_the_grant_that_holds_it_now() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--ttl", "3s", "--"])
        .args(scratch.sh(&format!(r#"echo $$ > "$D/pid"; {SPIN}"#)));
    let running = Running::start(command);
    let pid: u32 = wait_for_file(&scratch.path("pid")).trim().parse().unwrap();
    assert_eq!(server.cmd(&["DEL", &lease_key("r")]), Reply::Int(1));
    let other = Held::new(&server, "r", Duration::from_secs(30));
    wait_until("the command to be stopped", || is_dead(pid).then_some(()));
    let done = running.finish();
    done.assert_code(70);
    let fence = other.lease().fence().get();
    assert!(
        done.stderr.contains(&format!(
            "another grant holds the lease now ({}, fence {fence})",
            inspect_json(&server, "r")["holder"]
                .as_str()
                .expect("a holder")
        )),
        "{done:#?}"
    );
}

#[test]
fn a_stopped_server_stops_the_command_before_validity_ends_70() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let ttl = Duration::from_secs(4);
    let mut command = leasehold(&server.url());
    // A long grace and a command that ignores SIGTERM: only the cap can stop it in time.
    command
        .args(["run", "r", "--ttl", "4s", "--grace", "1m", "--"])
        .args(scratch.sh(&format!(
            r#"trap 'echo TERM >> "$D/signals"' TERM
               echo $$ > "$D/pid"
               {SPIN}"#
        )));
    let running = Running::start(command);
    let pid: u32 = wait_for_file(&scratch.path("pid")).trim().parse().unwrap();
    // The server's own deadline, read just before it stops: the key expires `pttl` after the
    // read, which is after `before_pttl`, so the bound below is stricter than the truth. (A
    // renewal that lands in between only moves the real expiry later.)
    let before_pttl = Instant::now();
    let pttl = server
        .cmd(&["PTTL", &lease_key("r")])
        .as_int()
        .and_then(|ms| u64::try_from(ms).ok())
        .map(Duration::from_millis)
        .expect("the lease is held");
    let paused = server.pause();
    let paused_at = Instant::now();
    let died_at = wait_until("the command to die", || is_dead(pid).then(Instant::now));
    let done = running.finish();
    drop(paused);

    done.assert_code(70);
    assert!(
        read(&scratch.path("signals")).contains("TERM"),
        "SIGTERM came first: {done:#?}"
    );
    // Dead before anyone else could be granted the lease, with the drift budget to spare.
    let expiry = before_pttl + pttl - DriftBudget::default().for_ttl(ttl);
    assert!(died_at > paused_at);
    assert!(
        died_at < expiry,
        "the command died {:?} after the lease could have been granted again",
        died_at - expiry
    );
    assert!(
        done.stderr
            .contains("lease lost (renewals failed or went unanswered"),
        "{done:#?}"
    );
    assert!(!done.stderr.contains("Unreachable"), "{done:#?}");
}

#[test]
fn a_command_that_exits_while_leasehold_stalls_past_the_lease_is_70() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--ttl", "300ms", "--"])
        .args(scratch.sh(r#"echo $$ > "$D/pid"
               i=0; while [ ! -e "$D/go" ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done
               exit 0"#));
    let running = Running::start(command);
    let pid: u32 = wait_for_file(&scratch.path("pid")).trim().parse().unwrap();
    // leasehold stalls (a long GC pause, a starved VM); meanwhile the command finishes and the
    // lease runs out at the server.
    send(running.pid(), rustix::process::Signal::STOP);
    wait_until("leasehold to stop", || {
        is_stopped(running.pid()).then_some(())
    });
    std::fs::write(scratch.path("go"), "").unwrap();
    wait_until("the command to exit", || is_dead(pid).then_some(()));
    wait_until("the lease to expire at the server", || {
        (server.cmd(&["EXISTS", &lease_key("r")]) == Reply::Int(0)).then_some(())
    });
    send(running.pid(), rustix::process::Signal::CONT);
    // When leasehold looks again, the exit and the end of the lease are both there: the work
    // may have outlived the lease.
    running.finish().assert_code(70);
}

#[test]
fn sigint_and_sigterm_are_passed_on_to_the_command() {
    use rustix::process::Signal;
    let server = RedisServer::start();
    for (signal, name) in [(Signal::INT, "INT"), (Signal::TERM, "TERM")] {
        let scratch = Scratch::new();
        let mut command = leasehold(&server.url());
        command.args(["run", "r", "--"]).args(scratch.sh(&format!(
            r#"trap 'echo INT >> "$D/signals"; exit 9' INT
               trap 'echo TERM >> "$D/signals"; exit 9' TERM
               echo started > "$D/started"
               {SPIN}"#
        )));
        let running = Running::start(command);
        wait_for_file(&scratch.path("started"));
        send(running.pid(), signal);
        let done = running.finish();
        done.assert_code(9);
        assert_eq!(read(&scratch.path("signals")), format!("{name}\n"));
        assert!(
            done.stderr
                .contains(&format!("SIG{name} passed on to the command")),
            "{done:#?}"
        );
        assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(0));
    }
}

/// A command that traps SIGTERM and carries on: the first SIGTERM or SIGINT is passed on,
/// and a second one sent to leasehold kills it at once, long before the grace ends.
#[test]
fn a_second_sigterm_or_sigint_kills_a_command_that_ignores_the_first() {
    use rustix::process::Signal;
    let server = RedisServer::start();
    for (first, second) in [
        (Signal::TERM, Signal::TERM),
        (Signal::INT, Signal::TERM),
        (Signal::TERM, Signal::INT),
    ] {
        let scratch = Scratch::new();
        let mut command = leasehold(&server.url());
        command
            .args(["run", "r", "--grace", "1m", "--"])
            .args(scratch.sh(&format!(
                r#"trap 'echo caught >> "$D/signals"' INT TERM
                   echo $$ > "$D/pid"
                   {SPIN}"#
            )));
        let running = Running::start(command);
        let pid: u32 = wait_for_file(&scratch.path("pid")).trim().parse().unwrap();
        send(running.pid(), first);
        // Passed on and ignored: the command is still there.
        wait_until("the command to see the first signal", || {
            read(&scratch.path("signals"))
                .contains("caught")
                .then_some(())
        });
        assert!(!is_dead(pid), "{first:?}: the first signal killed it");
        let sent_at = Instant::now();
        send(running.pid(), second);
        let died_at = wait_until("the command to die", || is_dead(pid).then(Instant::now));
        let done = running.finish();
        // Ended by SIGKILL: 128 + 9.
        done.assert_code(137);
        assert!(
            died_at - sent_at < Duration::from_secs(10),
            "{first:?} then {second:?}: it lived {:?} after the second signal, a grace of a \
             minute was not cut short",
            died_at - sent_at
        );
        assert!(
            done.stderr
                .contains("again: sending SIGKILL to the command"),
            "{done:#?}"
        );
        assert_eq!(read(&scratch.path("signals")), "caught\n", "{first:?}");
        assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(0));
    }
}

/// One SIGTERM, and a command that ignores it: SIGKILL when the grace runs out.
#[test]
fn the_grace_after_a_sigterm_ends_with_sigkill() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let grace = Duration::from_millis(500);
    let mut command = leasehold(&server.url());
    command
        .args(["run", "r", "--grace", "500ms", "--"])
        .args(scratch.sh(&format!(
            r#"trap 'echo TERM >> "$D/signals"' TERM
               echo $$ > "$D/pid"
               {SPIN}"#
        )));
    let running = Running::start(command);
    let pid: u32 = wait_for_file(&scratch.path("pid")).trim().parse().unwrap();
    let sent_at = Instant::now();
    send(running.pid(), rustix::process::Signal::TERM);
    let died_at = wait_until("the command to die", || is_dead(pid).then(Instant::now));
    let done = running.finish();
    done.assert_code(137);
    assert_eq!(read(&scratch.path("signals")), "TERM\n", "{done:#?}");
    assert!(
        died_at - sent_at >= grace,
        "killed before the grace ran out"
    );
    assert!(
        done.stderr.contains("SIGKILL in 500ms unless it exits"),
        "{done:#?}"
    );
    assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(0));
}

#[test]
fn sighup_and_sigquit_are_passed_on_to_the_command() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command.args(["run", "r", "--"]).args(scratch.sh(&format!(
        r#"trap 'echo HUP >> "$D/signals"' HUP
           trap 'echo QUIT >> "$D/signals"; exit 9' QUIT
           echo started > "$D/started"
           {SPIN}"#
    )));
    let running = Running::start(command);
    wait_for_file(&scratch.path("started"));
    // A closed terminal: leasehold must neither die of it nor leave the command running
    // without a lease.
    send(running.pid(), rustix::process::Signal::HUP);
    wait_until("the command to report SIGHUP", || {
        read(&scratch.path("signals")).contains("HUP").then_some(())
    });
    send(running.pid(), rustix::process::Signal::QUIT);
    let done = running.finish();
    done.assert_code(9);
    assert_eq!(read(&scratch.path("signals")), "HUP\nQUIT\n");
    assert_eq!(server.cmd(&["EXISTS", &lease_key("r")]), Reply::Int(0));
}

#[test]
fn a_signal_while_waiting_gives_128_plus_n_and_leaves_no_grant() {
    use rustix::process::Signal;
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let held = Held::new(&server, "r", Duration::from_secs(30));
    for (signal, code, name) in [
        (Signal::INT, 130, "SIGINT"),
        (Signal::TERM, 143, "SIGTERM"),
        (Signal::HUP, 129, "SIGHUP"),
        (Signal::QUIT, 131, "SIGQUIT"),
    ] {
        let first_try = evalsha_counter(&server);
        let mut command = leasehold(&server.url());
        command
            .args(["run", "r", "--wait", "20s", "--"])
            .args(scratch.sh("touch \"$D/ran\""));
        let running = Running::start(command);
        // Waiting: tried once, contended, and asleep until the holder's TTL or a release notice.
        first_try.wait_for_more();
        send(running.pid(), signal);
        let done = running.finish();
        done.assert_code(code);
        assert!(
            done.stderr
                .contains(&format!("{name} before the command started")),
            "{done:#?}"
        );
        assert!(!scratch.path("ran").exists(), "the command ran");
        // The test's lease is untouched.
        let json = inspect_json(&server, "r");
        assert_eq!(json["fence"], held.lease().fence().get(), "{json}");
    }
}

/// Starts `run --wait` through a proxy and interrupts it while its acquire's outcome is unknown
/// to it but a grant exists: the try reaches the server, which grants it, and the reply is held
/// back. Returns the running leasehold once it has said it is giving up.
fn interrupt_while_a_grant_is_unknown(
    server: &RedisServer,
    proxy: &FaultProxy,
    scratch: &Scratch,
) -> Running {
    let paused = WritesPaused::start(server);
    let mut command = leasehold(&proxy.url());
    command
        .args(["run", "r", "--wait", "20s", "--ttl", "5s", "--"])
        .args(scratch.sh("touch \"$D/ran\""));
    let mut running = Running::start(command);
    // Connected, and its try waits at the server; from now on no reply gets through.
    paused.wait_for_a_parked_command();
    proxy.to_client(ProxyFault::Hold);
    paused.resume();
    wait_until("the grant leasehold does not know of", || {
        (server.cmd(&["EXISTS", &lease_key("r")]) == Reply::Int(1)).then_some(())
    });
    send(running.pid(), rustix::process::Signal::INT);
    running.wait_for_stderr("SIGINT before the command started");
    running
}

#[test]
fn interrupted_while_the_outcome_is_unknown_releases_the_grant() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let scratch = Scratch::new();
    let running = interrupt_while_a_grant_is_unknown(&server, &proxy, &scratch);
    // Replies come back after longer than two command timeouts (200 ms each at this TTL),
    // well inside the cleanup budget.
    std::thread::sleep(Duration::from_millis(600));
    proxy.to_client(ProxyFault::Pass);
    let done = running.finish();
    done.assert_code(130);
    assert!(!scratch.path("ran").exists(), "the command ran");
    assert_eq!(
        server.cmd(&["EXISTS", &lease_key("r")]),
        Reply::Int(0),
        "the grant was left behind: {done:#?}"
    );
    assert!(!done.stderr.contains("may live"), "{done:#?}");
}

#[test]
fn interrupted_while_the_outcome_stays_unknown_says_what_may_be_left() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let scratch = Scratch::new();
    let running = interrupt_while_a_grant_is_unknown(&server, &proxy, &scratch);
    // No reply gets through before leasehold gives up.
    let done = running.finish();
    done.assert_code(130);
    assert!(!scratch.path("ran").exists(), "the command ran");
    assert!(
        done.stderr
            .contains("could not confirm that no grant is left"),
        "{done:#?}"
    );
    assert!(
        done.stderr
            .contains("sent behind the acquire on the same connection"),
        "{done:#?}"
    );
    // Only the replies were held: the release reached the server behind the acquire, and
    // removed its grant.
    assert_eq!(
        server.cmd(&["EXISTS", &lease_key("r")]),
        Reply::Int(0),
        "the grant was left behind: {done:#?}"
    );
}
