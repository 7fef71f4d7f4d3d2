//! An operator's commands: `list` shows who holds what, `break` removes a stuck lease and
//! keeps its fence counter, so the old holder's late fenced writes are still rejected.

use super::*;
use leasehold_redis::{FencedWrite, RecordName};

/// A fenced write of `data` to the record "state" of `name` (purpose cli), as the work under
/// a lease would make it.
fn fenced_write(server: &RedisServer, name: &str, fence: u64, data: &[u8]) -> FencedWrite {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let backend = RedisBackend::open(&server.url(), RedisSettings::default()).unwrap();
    let fence = leasehold_redis::leasehold::FenceToken::new(fence).expect("a fence");
    runtime.block_on(backend.fenced_write(
        &Purpose::new("cli").unwrap(),
        &ResourceDigest::of(name),
        &RecordName::new("state").unwrap(),
        fence,
        data,
    ))
}

fn list_json(server: &RedisServer, args: &[&str]) -> Vec<serde_json::Value> {
    let mut command = leasehold(&server.url());
    command.args(["list", "--json"]).args(args);
    let done = run_to_end(command);
    done.assert_code(0);
    let lines: Vec<&str> = done.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one line of JSON: {done:#?}");
    serde_json::from_str::<serde_json::Value>(lines[0])
        .expect("valid JSON")
        .as_array()
        .expect("an array")
        .clone()
}

#[test]
fn list_shows_a_held_lease_with_its_holder_name() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    assert_eq!(list_json(&server, &[]), Vec::<serde_json::Value>::new());
    let mut command = leasehold(&server.url());
    command
        .args(["run", "orders/1", "--holder", "nightly on host-3", "--"])
        .args(scratch.sh(&format!("echo up > \"$D/up\"; {SPIN}")));
    let running = Running::start(command);
    wait_for_file(&scratch.path("up"));
    let _other = Held::new(&server, "orders/2", Duration::from_secs(30));

    let all = list_json(&server, &[]);
    assert_eq!(all.len(), 2, "{all:?}");
    let run = all
        .iter()
        .find(|l| l["resource"] == ResourceDigest::of("orders/1").as_str())
        .expect("the run's lease is listed");
    assert_eq!(run["holder_name"], "nightly on host-3", "{run}");
    assert_eq!(run["purpose"], "cli");
    assert_eq!(run["state"], "held");
    assert!(run["fence"].as_u64().is_some_and(|f| f > 0), "{run}");
    assert!(
        run["holder"].as_str().is_some_and(|h| h.len() == 16),
        "{run}"
    );
    assert!(
        run["remaining_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0 && ms <= 30_000)
    );
    // What `list` shows is enough to inspect it by: its digest.
    let mut command = leasehold(&server.url());
    let digest = run["resource"].as_str().expect("a digest").to_owned();
    command.args(["inspect", "--digest", &digest, "--json"]);
    let inspected = run_to_end(command);
    inspected.assert_code(0);
    assert!(
        inspected
            .stdout
            .contains(r#""holder_name":"nightly on host-3""#),
        "{inspected:#?}"
    );
    // No fence counter, no other purpose, no raw name.
    assert_eq!(list_json(&server, &["--purpose", "reports"]).len(), 0);
    assert_eq!(list_json(&server, &["--purpose", "cli"]).len(), 2);

    let mut command = leasehold(&server.url());
    command.arg("list");
    let table = run_to_end(command);
    table.assert_code(0);
    let lines: Vec<&str> = table.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{table:#?}");
    assert!(lines[0].starts_with("PURPOSE"), "{table:#?}");
    assert!(
        table.stdout.contains("(\"nightly on host-3\")"),
        "{table:#?}"
    );
    assert!(!table.stdout.contains("orders/"), "{table:#?}");
    drop(running);

    // Another namespace is another list.
    let mut command = leasehold(&server.url());
    command.args(["--namespace", "elsewhere", "list"]);
    let empty = run_to_end(command);
    empty.assert_code(0);
    assert_eq!(empty.stdout.trim(), "no leases in namespace elsewhere");
}

#[test]
fn break_frees_the_lease_and_the_old_holders_next_fenced_write_is_rejected() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    // The old holder: a run whose command is still at work (stuck, as far as anyone knows).
    let mut command = leasehold(&server.url());
    command
        .args(["run", "nightly", "--ttl", "3s", "--holder", "host-1", "--"])
        .args(scratch.sh(&format!("echo $LEASEHOLD_FENCE > \"$D/fence\"; {SPIN}")));
    let old = Running::start(command);
    let old_fence: u64 = wait_for_file(&scratch.path("fence"))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(
        fenced_write(&server, "nightly", old_fence, b"old"),
        FencedWrite::Written
    );

    let mut command = leasehold(&server.url());
    command.args(["break", "nightly", "--yes"]);
    let broke = run_to_end(command);
    broke.assert_code(0);
    assert!(
        broke
            .stdout
            .starts_with("nightly (purpose cli): removed the lease of "),
        "{broke:#?}"
    );
    assert!(broke.stdout.contains("(\"host-1\")"), "{broke:#?}");
    assert!(
        broke.stdout.contains(&format!("fence {old_fence}, "))
            && broke
                .stdout
                .contains(&format!("the fence counter stays at {old_fence}")),
        "{broke:#?}"
    );
    assert_eq!(inspect_json(&server, "nightly")["state"], "free");
    assert_eq!(
        fence_counter(&server, "nightly"),
        Some(old_fence.to_string())
    );

    // The next holder gets a higher fence and writes; the old holder's late write is refused.
    let new = Held::new(&server, "nightly", Duration::from_secs(30));
    let new_fence = new.lease().fence().get();
    assert!(new_fence > old_fence);
    assert_eq!(
        fenced_write(&server, "nightly", new_fence, b"new"),
        FencedWrite::Written
    );
    assert!(matches!(
        fenced_write(&server, "nightly", old_fence, b"late"),
        FencedWrite::Stale { current } if current.get() == new_fence
    ));
    // And the old run learns at its next renewal that the lease is gone: its command is
    // stopped and it exits 70.
    let done = old.finish();
    done.assert_code(70);

    // Nothing to remove: said so, exit 0; by digest, as `list` shows it.
    drop(new);
    let mut command = leasehold(&server.url());
    let digest = ResourceDigest::of("free-one");
    command.args(["break", "--digest", digest.as_str(), "--yes", "--json"]);
    let none = run_to_end(command);
    none.assert_code(0);
    let json: serde_json::Value = serde_json::from_str(none.stdout.trim()).unwrap();
    assert_eq!(json["removed"], false, "{none:#?}");
    assert_eq!(json["state"], "free", "{none:#?}");
}

#[test]
fn break_without_yes_sends_nothing() {
    let server = RedisServer::start();
    let held = Held::new(&server, "nightly", Duration::from_secs(30));
    let before = snapshot(&server);
    let mut command = leasehold(&server.url());
    command.args(["break", "nightly"]);
    let done = run_to_end(command);
    done.assert_code(2);
    assert!(done.stderr.contains("add --yes to do it"), "{done:#?}");
    assert_eq!(snapshot(&server), before);
    let mut command = leasehold(&server.url());
    command.args(["break", "--digest", "sha256:nothex", "--yes"]);
    let bad = run_to_end(command);
    bad.assert_code(2);
    assert!(bad.stderr.contains("--digest"), "{bad:#?}");
    assert!(held.lease().fence().get() >= 1);
}

#[test]
fn list_and_break_exit_paths() {
    // Nothing listens: 69 for both, and break says it removed nothing it knows of.
    for argv in [&["list"][..], &["break", "r", "--yes"][..]] {
        let mut command = leasehold(&dead_url());
        command.args(argv);
        let done = run_to_end(command);
        done.assert_code(69);
        assert!(
            done.stderr.contains("Redis unavailable"),
            "{argv:?}: {done:#?}"
        );
    }
    let server = RedisServer::start();
    // A hash where the lease would be: 65, and it is left alone.
    let key = lease_key("odd");
    server.cmd(&["HSET", &key, "f", "v"]);
    let mut command = leasehold(&server.url());
    command.args(["break", "odd", "--yes"]);
    let done = run_to_end(command);
    done.assert_code(65);
    assert!(done.stderr.contains("nothing was written"), "{done:#?}");
    assert_eq!(
        server.cmd(&["TYPE", &key]).as_string().as_deref(),
        Some("hash")
    );
    // A bad purpose, from the flag or from the variable it came from: 2, named as given.
    let mut command = leasehold(&server.url());
    command.args(["list", "--purpose", "Bad"]);
    let done = run_to_end(command);
    done.assert_code(2);
    assert!(done.stderr.contains("--purpose"), "{done:#?}");
    let mut command = leasehold(&server.url());
    command.env("LEASEHOLD_PURPOSE", "Bad").arg("list");
    let done = run_to_end(command);
    done.assert_code(2);
    assert!(done.stderr.contains("LEASEHOLD_PURPOSE"), "{done:#?}");
    // The variable filters like the flag.
    let _held = Held::new(&server, "by-env", Duration::from_secs(30));
    let mut command = leasehold(&server.url());
    command
        .env("LEASEHOLD_PURPOSE", "reports")
        .args(["list", "--json"]);
    let done = run_to_end(command);
    done.assert_code(0);
    assert_eq!(done.stdout.trim(), "[]", "{done:#?}");
}

/// The holder of a broken lease is told in words what happened: the key was removed (or gone
/// some other way the server cannot tell apart), not a debug name and a zero-second grace.
#[test]
fn a_run_whose_lease_is_broken_says_the_lease_was_removed() {
    let server = RedisServer::start();
    let scratch = Scratch::new();
    let mut command = leasehold(&server.url());
    command
        .args(["run", "nightly", "--ttl", "3s", "--grace", "1m", "--"])
        .args(scratch.sh(&format!(
            r#"trap 'echo TERM >> "$D/signals"' TERM
               echo $$ > "$D/pid"
               {SPIN}"#
        )));
    let old = Running::start(command);
    let pid: u32 = wait_for_file(&scratch.path("pid")).trim().parse().unwrap();
    let mut command = leasehold(&server.url());
    command.args(["break", "nightly", "--yes"]);
    run_to_end(command).assert_code(0);
    wait_until("the command to be stopped", || is_dead(pid).then_some(()));
    let done = old.finish();
    done.assert_code(70);
    for said in [
        "lease lost (the server no longer holds this grant)",
        "SIGTERM and SIGKILL now, as no validity is left for a grace",
        "it was removed (by `leasehold break` or another client deleting the key), or it \
         expired, was evicted or was flushed",
    ] {
        assert!(done.stderr.contains(said), "{said}: {done:#?}");
    }
    for debug in ["LostToAnother", "SIGKILL in 0s"] {
        assert!(!done.stderr.contains(debug), "{debug}: {done:#?}");
    }
}
