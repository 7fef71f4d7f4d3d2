//! The metrics a scripted scenario emits, captured by a debugging recorder: an acquire that
//! is contended and then granted, renewals, a loss, and a release — with their names,
//! labels and values. (Built with the `metrics` feature; `make test` builds every feature.)

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold::telemetry::names;
use leasehold::{LeaseClient, LossReason, Purpose, ResourceDigest, TokioClock};
use leasehold_sim::SimServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

const TTL: Duration = Duration::from_secs(3);

/// One metric, as the recorder saw it: its labels sorted, and its value.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

type Metrics = BTreeMap<(String, Vec<(String, String)>), Seen>;

fn capture(recorder: &DebuggingRecorder) -> Metrics {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let seen = match value {
                DebugValue::Counter(n) => Seen::Counter(n),
                DebugValue::Gauge(g) => Seen::Gauge(g.into_inner()),
                DebugValue::Histogram(h) => Seen::Histogram(h.into_iter().map(|v| v.0).collect()),
            };
            ((key.name().to_owned(), labels), seen)
        })
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut labels: Vec<_> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    labels
}

fn get<'a>(metrics: &'a Metrics, name: &str, pairs: &[(&str, &str)]) -> &'a Seen {
    metrics
        .get(&(name.to_owned(), labels(pairs)))
        .unwrap_or_else(|| panic!("no {name} {pairs:?} in {metrics:#?}"))
}

fn counter(metrics: &Metrics, name: &str, pairs: &[(&str, &str)]) -> u64 {
    match get(metrics, name, pairs) {
        Seen::Counter(n) => *n,
        other => panic!("{name} is {other:?}"),
    }
}

fn histogram(metrics: &Metrics, name: &str, pairs: &[(&str, &str)]) -> Vec<f64> {
    match get(metrics, name, pairs) {
        Seen::Histogram(values) => values.clone(),
        other => panic!("{name} is {other:?}"),
    }
}

fn gauge(metrics: &Metrics, name: &str, pairs: &[(&str, &str)]) -> f64 {
    match get(metrics, name, pairs) {
        Seen::Gauge(g) => *g,
        other => panic!("{name} is {other:?}"),
    }
}

/// Two clients on one simulated server, on tokio's paused clock: A holds `job`, B waits for
/// it, A renews and then releases, B is granted, B's key is deleted behind its back and B's
/// next renewal finds it lost.
async fn scenario(server: SimServer, clock: TokioClock) {
    let a = LeaseClient::new(server.connect(Duration::from_millis(200))).with_clock(clock);
    let b = LeaseClient::new(server.connect(Duration::from_millis(200))).with_clock(clock);
    let first = a.lock("job").ttl(TTL).await.expect("A is granted");
    let waiting = tokio::spawn(async move {
        let guard = b.lock("job").ttl(TTL).wait(Duration::from_secs(30)).await;
        (b, guard)
    });
    // A holds past its TTL: only renewals keep it.
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    assert_eq!(first.release().await, leasehold::ReleaseOutcome::Released);
    let (b, second) = waiting.await.unwrap();
    let second = second.expect("B is granted after A's release");
    // Gone behind B's back (as a FLUSHALL would): its next renewal finds it lost.
    server.delete(&Purpose::new("lock").unwrap(), &ResourceDigest::of("job"));
    let reason = tokio::time::timeout(TTL, second.lost())
        .await
        .expect("a loss");
    assert_eq!(reason, LossReason::LostToAnother);
    drop(second);
    b.settle().await;
}

#[test]
fn a_scripted_scenario_emits_these_metrics_and_labels() {
    let recorder = DebuggingRecorder::new();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let clock = TokioClock::new();
            scenario(SimServer::with_clock(clock), clock).await;
        });
    });
    let m = capture(&recorder);
    let lock = ("purpose", "lock");

    // Acquires: both granted, once each; B waited for A's release (about TTL + 1 s).
    assert_eq!(
        counter(&m, names::ACQUIRES, &[lock, ("outcome", "acquired")]),
        2
    );
    let took = histogram(&m, names::ACQUIRE_SECONDS, &[lock, ("outcome", "acquired")]);
    assert_eq!(took.len(), 2);
    let waited = histogram(&m, names::WAIT_SECONDS, &[lock]);
    assert_eq!(waited.len(), 1, "{waited:?}");
    assert!((3.9..4.1).contains(&waited[0]), "{waited:?}");
    assert_eq!(gauge(&m, names::WAITERS, &[lock, ("kind", "lease")]), 0.0);
    assert_eq!(gauge(&m, names::HELD, &[lock, ("kind", "lease")]), 0.0);

    // Renewals: A's kept it past its TTL, each confirmed with validity left; B's last one
    // found the key gone.
    let renewed = counter(&m, names::RENEWALS, &[lock, ("outcome", "renewed")]);
    assert!(renewed >= 3, "{renewed} renewals");
    assert_eq!(
        counter(&m, names::RENEWALS, &[lock, ("outcome", "lost")]),
        1
    );
    assert_eq!(
        histogram(&m, names::RENEW_SECONDS, &[lock]).len() as u64,
        renewed + 1
    );
    let left = histogram(&m, names::RENEW_VALIDITY_LEFT_SECONDS, &[lock]);
    assert_eq!(left.len() as u64, renewed);
    assert!(
        left.iter().all(|s| *s > 0.0 && *s < TTL.as_secs_f64()),
        "{left:?}"
    );

    // A's release, and how long A held (TTL + 1 s on the paused clock).
    assert_eq!(
        counter(&m, names::RELEASES, &[lock, ("outcome", "released")]),
        1
    );
    let held = histogram(&m, names::HOLD_SECONDS, &[lock]);
    assert_eq!(held.len(), 1);
    assert!((3.9..4.1).contains(&held[0]), "{held:?}");

    // Losses: B's to the deletion; A's signal fired as released, its own doing.
    let losses = |reason| counter(&m, names::LOSSES, &[lock, ("reason", reason)]);
    assert_eq!(losses("lost_to_another"), 1);
    assert_eq!(losses("released"), 1);
    assert_eq!(gauge(&m, names::LEASES_KEPT, &[]), 0.0);

    // Labels are bounded: only these keys, and never a digest, a fence or the resource.
    let digest = ResourceDigest::of("job").to_string();
    for (name, pairs) in m.keys() {
        assert!(name.starts_with("leasehold_"), "{name}");
        for (key, value) in pairs {
            assert!(
                ["purpose", "outcome", "reason", "kind"].contains(&key.as_str()),
                "{name} {key}"
            );
            assert!(
                !value.contains("job") && !digest.contains(value.as_str()),
                "{value}"
            );
            assert!(
                !value.chars().any(|c| c.is_ascii_digit()),
                "{name} {key}={value}"
            );
        }
    }
}

/// Permits held and waiting, by purpose and kind: two permits of a semaphore of capacity 2
/// held, a third request waiting and a reader of a read/write lease, seen at once (a
/// snapshot drains the recorder, so it is taken once); then, on a fresh recorder, every
/// gauge back to zero once all is released.
#[test]
fn permits_held_and_waiting_are_gauged_by_kind() {
    let run = |snapshot_while_held: bool| {
        let recorder = DebuggingRecorder::new();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let mut seen = None;
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(async {
                let clock = TokioClock::new();
                let server = SimServer::with_clock(clock);
                let client =
                    LeaseClient::new(server.connect(Duration::from_millis(200))).with_clock(clock);
                let a = client.semaphore("pool", 2).ttl(TTL).await.expect("free");
                let b = client.semaphore("pool", 2).ttl(TTL).await.expect("free");
                let reader = client.read_lock("doc").ttl(TTL).await.expect("free");
                let waiting = {
                    let client = client.clone();
                    tokio::spawn(async move {
                        client
                            .semaphore("pool", 2)
                            .ttl(TTL)
                            .wait(Duration::from_secs(30))
                            .await
                    })
                };
                tokio::time::sleep(Duration::from_millis(100)).await;
                if snapshot_while_held {
                    seen = Some(capture(&recorder));
                }
                let _ = a.release().await;
                let c = waiting.await.unwrap().expect("handed on");
                let _ = reader.release().await;
                let _ = b.release().await;
                let _ = c.release().await;
            });
        });
        seen.unwrap_or_else(|| capture(&recorder))
    };
    let lock = ("purpose", "lock");
    let held = run(true);
    assert_eq!(gauge(&held, names::HELD, &[lock, ("kind", "permit")]), 2.0);
    assert_eq!(
        gauge(&held, names::WAITERS, &[lock, ("kind", "permit")]),
        1.0
    );
    assert_eq!(gauge(&held, names::HELD, &[lock, ("kind", "read")]), 1.0);
    let after = run(false);
    for kind in ["permit", "read"] {
        assert_eq!(gauge(&after, names::HELD, &[lock, ("kind", kind)]), 0.0);
    }
    assert_eq!(
        gauge(&after, names::WAITERS, &[lock, ("kind", "permit")]),
        0.0
    );
}
