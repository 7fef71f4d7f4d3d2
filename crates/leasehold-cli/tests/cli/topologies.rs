//! Every topology from one `--redis` URL: a real Sentinel deployment and a real Cluster.

use super::*;
use test_support::{RedisCluster, RedisSentinel, sentinel::SERVICE};

/// `host:port,host:port` of `urls` (`redis://host:port` each).
fn hosts(urls: &[String]) -> String {
    urls.iter()
        .map(|url| url.trim_start_matches("redis://"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Runs a command under the lease on `resource` and returns the fence it saw.
fn run_once(url: &str, resource: &str, scratch: &Scratch) -> u64 {
    let mut command = leasehold(url);
    command
        .args(["run", resource, "--holder", "topology-test", "--"])
        .args(scratch.sh(&format!("echo $LEASEHOLD_FENCE > \"$D/{resource}\"")));
    let done = run_to_end(command);
    done.assert_code(0);
    read(&scratch.path(resource))
        .trim()
        .parse()
        .expect("a fence")
}

#[test]
fn run_inspect_list_and_break_through_sentinel() {
    let deployment = RedisSentinel::start();
    // An unreachable Sentinel first: the next one is asked.
    let url = format!(
        "redis+sentinel://127.0.0.1:{},{}/{SERVICE}",
        dead_port(),
        hosts(&deployment.sentinel_urls())
    );
    let scratch = Scratch::new();
    let first = run_once(&url, "s1", &scratch);
    assert!(
        run_once(&url, "s1", &scratch) > first,
        "fences rise on the master"
    );
    assert!(
        deployment
            .master()
            .keys()
            .iter()
            .any(|k| k.ends_with(":fence")),
        "the lease lived on the master the Sentinel names"
    );
    // A lease held now is seen, listed and broken through the same URL.
    let mut command = leasehold(&url);
    command
        .args([
            "run",
            "s2",
            "--ttl",
            "1500ms",
            "--holder",
            "held-through-sentinel",
        ])
        .arg("--")
        .args(scratch.sh(&format!("echo up > \"$D/up\"; {SPIN}")));
    let running = Running::start(command);
    wait_for_file(&scratch.path("up"));
    let mut command = leasehold(&url);
    command.args(["list", "--json"]);
    let listed = run_to_end(command);
    listed.assert_code(0);
    let leases: serde_json::Value = serde_json::from_str(listed.stdout.trim()).unwrap();
    assert_eq!(leases.as_array().map(Vec::len), Some(1), "{listed:#?}");
    assert_eq!(leases[0]["holder_name"], "held-through-sentinel");
    let mut command = leasehold(&url);
    command.args(["break", "s2", "--yes"]);
    let broke = run_to_end(command);
    broke.assert_code(0);
    assert!(broke.stdout.contains("removed the lease of"), "{broke:#?}");
    // The run finds its lease gone at its next renewal and stops its command.
    running.finish().assert_code(70);
    // A service the Sentinels do not know: unavailable, and nothing ran.
    let mut command = leasehold(&format!(
        "redis+sentinel://{}/no-such-service",
        hosts(&deployment.sentinel_urls())
    ));
    command
        .args(["run", "s3", "--"])
        .args(scratch.sh("echo ran > \"$D/ran\""));
    run_to_end(command).assert_code(69);
    assert!(!scratch.path("ran").exists());
}

#[test]
fn run_list_and_break_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let url = format!("redis+cluster://{}", hosts(&cluster.urls()));
    let scratch = Scratch::new();
    // Twelve resources: they land on every master.
    let mut fences = Vec::new();
    for i in 0..12 {
        fences.push(run_once(&url, &format!("c{i}"), &scratch));
    }
    let fence_keys: Vec<usize> = cluster
        .nodes()
        .iter()
        .map(|node| node.keys().iter().filter(|k| k.ends_with(":fence")).count())
        .collect();
    assert_eq!(fence_keys.iter().sum::<usize>(), 12, "{fence_keys:?}");
    assert!(
        fence_keys.iter().all(|&n| n > 0),
        "every master: {fence_keys:?}"
    );
    // Held now on some node, listed from the whole cluster, broken where it lives.
    let mut held = Vec::new();
    for name in ["h1", "h2", "h3", "h4"] {
        let mut command = leasehold(&url);
        command
            .args(["run", name, "--ttl", "1500ms", "--holder", name, "--"])
            .args(scratch.sh(&format!("echo up > \"$D/up-{name}\"; {SPIN}")));
        held.push(Running::start(command));
        wait_for_file(&scratch.path(&format!("up-{name}")));
    }
    let mut command = leasehold(&url);
    command.args(["list", "--json"]);
    let listed = run_to_end(command);
    listed.assert_code(0);
    let leases: serde_json::Value = serde_json::from_str(listed.stdout.trim()).unwrap();
    let mut names: Vec<&str> = leases
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|l| l["holder_name"].as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["h1", "h2", "h3", "h4"], "{listed:#?}");
    let mut command = leasehold(&url);
    command.args(["break", "h3", "--yes", "--json"]);
    let broke = run_to_end(command);
    broke.assert_code(0);
    let removed: serde_json::Value = serde_json::from_str(broke.stdout.trim()).unwrap();
    assert_eq!(removed["removed"], true, "{broke:#?}");
    assert_eq!(removed["holder_name"], "h3", "{broke:#?}");
    let h3 = held.remove(2);
    h3.finish().assert_code(70);
    let mut command = leasehold(&url);
    command.args(["inspect", "h3", "--json"]);
    let after = run_to_end(command);
    after.assert_code(0);
    assert!(after.stdout.contains(r#""state":"free""#), "{after:#?}");
}
