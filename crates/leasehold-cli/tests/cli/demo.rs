//! Demo.

use super::*;

#[test]
fn the_demo_tells_the_story_and_rejects_the_stale_write() {
    // The environment's URL is ignored: the demo starts its own server.
    let mut command = Command::new(BIN);
    command
        .env("LEASEHOLD_REDIS_URL", dead_url())
        .env_remove("LEASEHOLD_NAMESPACE")
        .arg("demo");
    let done = run_to_end(command);
    done.assert_code(0);
    let (a, b) = demo_fences(&done);
    for needle in [
        "ephemeral",
        "store it as BIGINT",
        "contended",
        "1 row changed: accepted",
        "0 rows changed: the stale write was REJECTED",
        &format!("(fence {a} is older than {b})"),
        &format!("status 'packed by B' | fence {b}"),
    ] {
        assert!(done.stdout.contains(needle), "{needle}: {done:#?}");
    }
}

#[test]
fn the_demo_runs_on_a_server_named_with_redis() {
    let server = RedisServer::start();
    let mut command = leasehold(&server.url());
    // Would be used instead of starting one, were --redis not typed.
    command
        .env("LEASEHOLD_REDIS_SERVER", "/nonexistent/redis-server")
        .arg("demo");
    let done = run_to_end(command);
    done.assert_code(0);
    let (_, b) = demo_fences(&done);
    for needle in [
        "(named with --redis)",
        "0 rows changed: the stale write was REJECTED",
    ] {
        assert!(done.stdout.contains(needle), "{needle}: {done:#?}");
    }
    assert!(!done.stdout.contains("ephemeral"), "{done:#?}");
    // The story ran on this server: its fence counter is the demo's.
    let digest = ResourceDigest::of("orders/42");
    let fence_key = format!("leasehold:lease:v1:demo:{{{}}}:fence", digest.as_str());
    assert_eq!(
        server.cmd(&["GET", &fence_key]).as_string(),
        Some(b.to_string())
    );
}

#[test]
fn the_demo_against_an_unreachable_server_is_69() {
    let url = format!("redis://:hunter2@127.0.0.1:{}", dead_port());
    let mut command = leasehold(&url);
    command.arg("demo");
    let done = run_to_end(command);
    done.assert_code(69);
    assert!(done.stderr.contains("unavailable"), "{done:#?}");
    assert!(done.stderr.contains("redis://:***@127.0.0.1:"), "{done:#?}");
    assert!(!done.stderr.contains("hunter2"), "{done:#?}");
    assert!(!done.stderr.contains("the demo failed"), "{done:#?}");
}

#[test]
fn the_demo_without_redis_server_gives_the_install_hint() {
    let mut command = Command::new(BIN);
    command
        .env_remove("LEASEHOLD_REDIS_URL")
        .env("LEASEHOLD_REDIS_SERVER", "/nonexistent/redis-server")
        .arg("demo");
    let done = run_to_end(command);
    done.assert_code(69);
    assert!(
        done.stderr.contains("sudo apt-get install -y redis-server"),
        "{done:#?}"
    );
}
