//! Inspect.

use super::*;

#[test]
fn inspect_reports_held_and_free_in_one_json_shape() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let mut held = Held::new(&server, "orders/7", ttl);
    let json = inspect_json(&server, "orders/7");
    let keys: Vec<&String> = json.as_object().expect("an object").keys().collect();
    assert_eq!(keys.len(), 7, "{json}");
    assert_eq!(json["purpose"], "cli");
    assert_eq!(json["state"], "held");
    assert_eq!(json["fence"], held.lease().fence().get());
    assert_eq!(
        json["holder"],
        held.lease().attempt().fingerprint().as_str()
    );
    let remaining = json["remaining_ms"].as_u64().expect("a number");
    assert!(remaining > 0 && remaining <= 30_000, "{json}");

    let mut command = leasehold(&server.url());
    command.args(["inspect", "orders/7"]);
    let done = run_to_end(command);
    done.assert_code(0);
    let fingerprint = held.lease().attempt().fingerprint();
    assert!(
        done.stdout
            .contains(&format!("held by {fingerprint}, fence 1")),
        "{done:#?}"
    );

    held.release();
    let json = inspect_json(&server, "orders/7");
    assert_eq!(
        json,
        serde_json::json!({
            "state": "free", "fence": null, "remaining_ms": null, "holder": null,
            "holder_name": null, "released": false, "purpose": "cli"
        })
    );
}

/// The library's `client.lock("nightly-report")` takes its lease for purpose `lock`, an
/// election for `election`, `leasehold run` for `cli`: a name alone finds each.
#[test]
fn a_name_alone_finds_a_lease_the_library_holds_under_its_default_purpose() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    for (name, purpose) in [("nightly-report", "lock"), ("scheduler", "election")] {
        let held = Held::for_purpose(&server, name, ttl, purpose);
        let fingerprint = held.lease().attempt().fingerprint();
        let mut command = leasehold(&server.url());
        command.args(["inspect", name]);
        let done = run_to_end(command);
        done.assert_code(0);
        assert!(
            done.stdout.contains(&format!(
                "{name} (purpose {purpose}): held by {fingerprint}, fence 1"
            )),
            "{done:#?}"
        );
        let json = inspect_json(&server, name);
        assert_eq!(
            (&json["state"], &json["purpose"]),
            (&"held".into(), &purpose.into())
        );
        // Asked under a purpose, it looks there alone.
        let mut command = leasehold(&server.url());
        command.args(["inspect", name, "--purpose", "cli"]);
        let done = run_to_end(command);
        done.assert_code(0);
        assert_eq!(done.stdout.trim(), format!("{name} (purpose cli): free"));
        // `break` removes only what it was named, and says where the name is held.
        let mut command = leasehold(&server.url());
        command.args(["break", name, "--yes"]);
        let done = run_to_end(command);
        done.assert_code(0);
        assert!(
            done.stdout.contains(&format!(
                "no lease; nothing removed; a lease of that name is held under purpose \
                 {purpose} (the library's): add --purpose {purpose} to remove it"
            )),
            "{done:#?}"
        );
        assert_eq!(inspect_json(&server, name)["state"], "held");
        drop(held);
    }
}
