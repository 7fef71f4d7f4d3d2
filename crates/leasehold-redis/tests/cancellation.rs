//! Commands dropped at every stage, on the suite's transport (`LEASEHOLD_TEST_TRANSPORT`; issue
//! 34): before anything was written (waiting for a connection), in the middle of a write the
//! socket took only part of (the proxy holds the requests back until it takes no more), and
//! while waiting for the reply — many at once on one connection, with replies held back and
//! connections killed under them. A reply must never reach another command: each command reads
//! one resource whose fence only it expects, so a reply meant for another shows as a wrong
//! fence. Afterwards the connection must serve every resource again.

mod common;

use std::time::Duration;

use common::request;
use leasehold_redis::leasehold::{FenceToken, InspectOutcome, LeaseHandle};
use leasehold_redis::{RedisBackend, RedisLeases, RedisSettings, Transport};
use test_support::{FaultProxy, ProxyFault, RedisServer};

/// Resources read at once; each holds a grant with a fence of its own.
const RESOURCES: usize = 32;

/// How long after its first poll a command is dropped, if it is: at once (its write done or
/// queued, its reply not read), after a few microseconds or milliseconds, or never.
const DROP_AFTER: [Option<Duration>; 6] = [
    None,
    Some(Duration::ZERO),
    Some(Duration::from_micros(50)),
    Some(Duration::from_micros(300)),
    Some(Duration::from_millis(2)),
    None,
];

/// What one round did to the connection while its commands were in flight.
#[derive(Debug, Clone, Copy)]
enum RoundFault {
    /// Nothing.
    None,
    /// Requests held back at the proxy: writes are taken only in part, then not at all.
    RequestsHeld,
    /// Replies held back: every command waits for its reply.
    RepliesHeld,
    /// The server kills the connection: commands then wait for a new one.
    Killed,
}

const ROUNDS: [RoundFault; 8] = [
    RoundFault::None,
    RoundFault::RequestsHeld,
    RoundFault::RepliesHeld,
    RoundFault::Killed,
    RoundFault::RequestsHeld,
    RoundFault::None,
    RoundFault::RepliesHeld,
    RoundFault::Killed,
];

#[derive(Debug, Default)]
struct Tally {
    answered: usize,
    dropped: usize,
    failed: usize,
    wrong: Vec<String>,
}

/// Holds every resource through `holders`, returning the handles and their fences.
async fn hold_all(holders: &RedisLeases) -> (Vec<LeaseHandle<RedisBackend>>, Vec<FenceToken>) {
    let mut handles = Vec::new();
    for i in 0..RESOURCES {
        let req = request(
            holders,
            &format!("cancel/{i}"),
            "holder",
            Duration::from_secs(300),
        );
        let lease = holders
            .try_acquire(&req)
            .await
            .into_handle()
            .expect("each resource is free");
        handles.push(lease);
    }
    let fences = handles.iter().map(LeaseHandle::fence).collect();
    (handles, fences)
}

/// Reads resource `i` through `client`, dropping the read `drop_after` its first poll.
async fn read(
    client: RedisLeases,
    i: usize,
    drop_after: Option<Duration>,
) -> Option<InspectOutcome> {
    let req = request(
        &client,
        &format!("cancel/{i}"),
        "reader",
        Duration::from_secs(1),
    );
    let read = client.inspect(req.purpose(), req.resource(), None);
    match drop_after {
        None => Some(read.await),
        Some(after) => tokio::time::timeout(after, read).await.ok(),
    }
}

/// Judges one read of resource `i`, whose fence is `fence`.
fn judge(tally: &mut Tally, i: usize, fence: FenceToken, outcome: Option<InspectOutcome>) {
    match outcome {
        None => tally.dropped += 1,
        Some(InspectOutcome::HeldByOther(view)) if view.fence == Some(fence) => tally.answered += 1,
        Some(
            InspectOutcome::Indeterminate(_)
            | InspectOutcome::Unavailable(_)
            | InspectOutcome::Overloaded,
        ) => tally.failed += 1,
        Some(other) => tally
            .wrong
            .push(format!("resource {i} (fence {fence}) read {other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_command_never_takes_another_commands_reply() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    // The grants are taken over redis-rs whatever the suite's transport: only the readers'
    // connection is under test.
    let holders = RedisBackend::open(
        &server.url(),
        RedisSettings::default().with_transport(Transport::RedisRs),
    )
    .expect("valid URL")
    .into_client();
    let (handles, fences) = hold_all(&holders).await;
    let settings = common::settings()
        .with_command_timeout(Duration::from_secs(2))
        .and_then(|s| s.with_max_in_flight(8192))
        .expect("valid settings");
    let reader = RedisBackend::open(&proxy.url(), settings)
        .expect("valid URL")
        .into_client();
    let mut tally = Tally::default();
    for (round, fault) in ROUNDS.iter().enumerate() {
        // A round with requests held sends enough to fill the socket's buffers (some 600 KB),
        // so that writes are taken in part and the rest waits.
        let commands = match fault {
            RoundFault::RequestsHeld => 2400,
            _ => 512,
        };
        if let RoundFault::RequestsHeld = fault {
            proxy.to_server(ProxyFault::Hold);
        }
        if let RoundFault::RepliesHeld = fault {
            proxy.to_client(ProxyFault::Hold);
        }
        let reads: Vec<_> = (0..commands)
            .map(|k| {
                let i = (k * 7 + round) % RESOURCES;
                let drop_after = DROP_AFTER[(k + round) % DROP_AFTER.len()];
                (i, tokio::spawn(read(reader.clone(), i, drop_after)))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(30)).await;
        match fault {
            RoundFault::Killed => {
                // Every client connection but the killer's: the reader's goes through the proxy.
                server.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
            }
            RoundFault::RequestsHeld => proxy.to_server(ProxyFault::Pass),
            RoundFault::RepliesHeld => proxy.to_client(ProxyFault::Pass),
            RoundFault::None => {}
        }
        for (i, task) in reads {
            let outcome = tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("every read ends within its timeouts")
                .expect("the read ran");
            judge(&mut tally, i, fences[i], outcome);
        }
    }
    // The connection recovers: every resource is read right again, each within a few tries
    // (the first after a kill may meet the closed connection).
    for (i, fence) in fences.iter().enumerate() {
        let mut read_right = false;
        for _ in 0..5 {
            let mut once = Tally::default();
            judge(&mut once, i, *fence, read(reader.clone(), i, None).await);
            tally.wrong.append(&mut once.wrong);
            if once.answered == 1 {
                read_right = true;
                break;
            }
        }
        assert!(read_right, "resource {i} was not read after the faults");
    }
    eprintln!(
        "cancellation on the {} transport: {} answered, {} dropped, {} failed, {} wrong",
        common::transport().as_str(),
        tally.answered,
        tally.dropped,
        tally.failed,
        tally.wrong.len()
    );
    assert!(
        tally.wrong.is_empty(),
        "replies reached the wrong command: {:?}",
        &tally.wrong[..tally.wrong.len().min(10)]
    );
    // Otherwise the test did not reach its cases.
    assert!(tally.dropped > 1000 && tally.answered > 1000, "{tally:?}");
    for lease in handles {
        let _ = lease.release().await;
    }
}
