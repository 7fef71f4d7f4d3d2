//! What the simulator's tests share: a server and a client on one virtual clock, and requests
//! for the one resource they use.

use std::time::Duration;

use leasehold::{LeaseClient, LeaseRequest, ManualClock, OperationId, Purpose, ResourceDigest};
use leasehold_sim::{SimBackend, SimServer};

/// A simulated server and a client of it (200 ms command timeout), on a clock of their own.
pub fn world() -> (SimServer, LeaseClient<SimBackend>, ManualClock) {
    let clock = ManualClock::new();
    let server = SimServer::new(clock.clone());
    let client =
        LeaseClient::new(server.connect(Duration::from_millis(200))).with_clock(clock.clone());
    (server, client, clock)
}

/// A new attempt's request for the resource `job`, for operation `op`, with a TTL of `ttl_ms`.
pub fn request(client: &LeaseClient<SimBackend>, op: &str, ttl_ms: u64) -> LeaseRequest {
    let attempt = client.new_attempt(OperationId::new(op).unwrap()).unwrap();
    client
        .request(
            Purpose::new("sim").unwrap(),
            ResourceDigest::of("job"),
            attempt,
            Duration::from_millis(ttl_ms),
        )
        .unwrap()
}
