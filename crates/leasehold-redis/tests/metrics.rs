//! The Redis backend's own metrics on a real redis-server, captured by a debugging recorder:
//! commands in flight (back to zero once answered) and reconnects of the release-notice
//! subscriber after the server restarts. (Built with the `metrics` feature.)

use std::time::Duration;

use leasehold::telemetry::names;
use leasehold_redis::{RedisBackend, RedisSettings};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use test_support::RedisServer;

fn value(snapshotter: &Snapshotter, name: &str) -> Option<DebugValue> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(key, ..)| key.key().name() == name)
        .map(|(.., value)| value)
}

#[test]
fn commands_in_flight_and_notice_reconnects_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut server = RedisServer::start();
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let client = RedisBackend::open(&server.url(), RedisSettings::default())
                .unwrap()
                .into_client();
            // A waiting lock subscribes to release notices.
            let guard = client
                .lock("metrics")
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(1))
                .await
                .unwrap();
            let _ = guard.release().await;
            assert_eq!(
                value(&snapshotter, names::REQUESTS_IN_FLIGHT),
                Some(DebugValue::Gauge(0.0.into()))
            );
            server.restart();
            // The subscriber notices the lost connection and comes back (bounded wait).
            let mut reconnects = None;
            for _ in 0..200 {
                reconnects = value(&snapshotter, names::NOTICE_RECONNECTS);
                if reconnects.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            assert!(
                matches!(reconnects, Some(DebugValue::Counter(n)) if n >= 1),
                "{reconnects:?}"
            );
        });
    });
}
