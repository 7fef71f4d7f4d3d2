//! Fenced writes on real redis-server: a stale holder's write is refused once a newer grant
//! has written, whatever its lease handle believes.

mod common;

use std::time::Duration;

use common::{client, request};
use leasehold_redis::leasehold::{FenceToken, LeaseState};
use leasehold_redis::{FencedWrite, RecordName};
use test_support::RedisServer;

fn stored(server: &RedisServer, key: &str) -> (Option<String>, Option<String>) {
    (
        server.cmd(&["HGET", key, "fence"]).as_string(),
        server.cmd(&["HGET", key, "value"]).as_string(),
    )
}

#[tokio::test]
async fn a_holder_paused_past_expiry_cannot_overwrite_the_new_holder() {
    let server = RedisServer::start();
    let client = client(&server);
    let backend = client.backend();
    let name = RecordName::new("order-42").unwrap();
    // A holds a short lease and "stalls" past its expiry without noticing.
    let a = request(&client, "orders/42", "op-a", Duration::from_millis(100));
    let a_lease = client.try_acquire(&a).await.into_handle().expect("free");
    let a_fence = a_lease.fence();
    let write = |fence: FenceToken, value: &'static str| {
        backend.fenced_write(a.purpose(), a.resource(), &name, fence, value.as_bytes())
    };
    assert_eq!(write(a_fence, "paid by A").await, FencedWrite::Written);
    let key = backend.keys().record_key(a.purpose(), a.resource(), &name);
    loop {
        // Bounded by the 100 ms TTL: the key expires on the server.
        if !server.keys().contains(&common::lease_key(&client, &a)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // B is granted the next fence and writes.
    let b = request(&client, "orders/42", "op-b", Duration::from_secs(10));
    let b_lease = client.try_acquire(&b).await.into_handle().expect("expired");
    assert!(b_lease.fence() > a_fence);
    assert_eq!(
        write(b_lease.fence(), "shipped by B").await,
        FencedWrite::Written
    );
    // A wakes up and writes with its old fence: refused, and B's value stands.
    assert_eq!(
        write(a_fence, "refunded by A").await,
        FencedWrite::Stale {
            current: b_lease.fence()
        }
    );
    assert_eq!(
        stored(&server, &key),
        (
            Some(b_lease.fence().get().to_string()),
            Some("shipped by B".into())
        )
    );
    // B may write again under the same grant.
    assert_eq!(
        write(b_lease.fence(), "delivered by B").await,
        FencedWrite::Written
    );
    assert_ne!(a_lease.state(), LeaseState::Active);
    assert!(!key.contains("orders/42"), "{key}");
}

#[tokio::test]
async fn fences_compare_as_numbers_not_as_text() {
    let server = RedisServer::start();
    let client = client(&server);
    let backend = client.backend();
    let req = request(&client, "numbers", "op-a", Duration::from_secs(10));
    let name = RecordName::new("n").unwrap();
    let write = |fence: u64| {
        backend.fenced_write(
            req.purpose(),
            req.resource(),
            &name,
            FenceToken::new(fence).unwrap(),
            b"v",
        )
    };
    assert_eq!(write(10).await, FencedWrite::Written);
    // "9" sorts after "10" as text; as a fence it is older.
    assert_eq!(
        write(9).await,
        FencedWrite::Stale {
            current: FenceToken::new(10).unwrap()
        }
    );
    // Exact at every edge of the fence range, where a Lua number would round or print as
    // "1e+14".
    for edge in [
        100_000_000_000_000 - 1,
        100_000_000_000_000,
        (1 << 53) - 1,
        1 << 53,
        (1 << 53) + 1,
        FenceToken::MAX.get() - 1,
        FenceToken::MAX.get(),
    ] {
        assert_eq!(write(edge).await, FencedWrite::Written, "{edge}");
        assert_eq!(
            write(edge - 1).await,
            FencedWrite::Stale {
                current: FenceToken::new(edge).unwrap()
            },
            "{edge}"
        );
    }
}
