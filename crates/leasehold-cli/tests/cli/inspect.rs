//! Inspect.

use super::*;

#[test]
fn inspect_reports_held_and_free_in_one_json_shape() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let mut held = Held::new(&server, "orders/7", ttl);
    let json = inspect_json(&server, "orders/7");
    let keys: Vec<&String> = json.as_object().expect("an object").keys().collect();
    assert_eq!(keys.len(), 6, "{json}");
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
            "holder_name": null, "released": false
        })
    );
}
