//! Differential test of minimum holds and holder names: the same hand-written sequences run on
//! the simulated server (virtual time) and on real redis-server (real time, with margins far
//! above the machine's scheduling noise), and give identical signatures step by step, fences
//! compared by order ([`by_rank`]) as in `differential.rs`.
//!
//! Each sequence acquires with a hold, releases early (or not at all), meets a second caller
//! contended by the kept key, replays the released attempt, inspects (holder name and the
//! released flag show), lets the hold end and is granted again with a higher fence.

use std::time::Duration;

use leasehold_redis::leasehold::{DriftBudget, HolderName, LeaseRequest, OperationId};
use leasehold_redis::{RedisBackend, RedisSettings};
use leasehold_sim::scenario::{CLIENTS, purpose, resource_digest};
use leasehold_sim::{Signature, SimWorld, Step, World, by_rank};
use test_support::RedisServer;

/// One step of a sequence: a lease step with its request, or time passing.
enum Act {
    Lease(Step, Option<Box<LeaseRequest>>),
    Wait(u64),
}

/// A request for `resource`, by a new attempt at operation `op`, with a hold (0: none) and a
/// holder name if given.
fn req(resource: usize, op: &str, ttl_ms: u64, hold_ms: u64, name: Option<&str>) -> LeaseRequest {
    let attempt = leasehold_redis::leasehold::Attempt::new(OperationId::new(op).unwrap()).unwrap();
    let request = LeaseRequest::new(
        purpose(),
        resource_digest(resource),
        attempt,
        Duration::from_millis(ttl_ms),
        DriftBudget::default(),
    )
    .unwrap()
    .with_min_hold(Duration::from_millis(hold_ms))
    .unwrap();
    match name {
        Some(name) => request.with_holder_name(HolderName::new(name).unwrap()),
        None => request,
    }
}

fn acquire(client: usize, request: &LeaseRequest) -> Act {
    let resource = resource_of(request);
    Act::Lease(
        Step::Acquire {
            client,
            resource,
            ttl: 0,
        },
        Some(Box::new(request.clone())),
    )
}

fn inspect(client: usize, request: &LeaseRequest) -> Act {
    let resource = resource_of(request);
    Act::Lease(
        Step::Inspect { client, resource },
        Some(Box::new(request.clone())),
    )
}

fn release(client: usize, resource: usize) -> Act {
    Act::Lease(Step::Release { client, resource }, None)
}

fn renew(client: usize, resource: usize) -> Act {
    Act::Lease(Step::Renew { client, resource }, None)
}

fn resource_of(request: &LeaseRequest) -> usize {
    (0..2)
        .find(|&r| resource_digest(r) == *request.resource())
        .expect("a scenario resource")
}

/// The sequences, each on fresh servers. Waits leave at least 400 ms between a step and the
/// end of the hold it must (or must not) see.
fn sequences() -> Vec<Vec<Act>> {
    let first = req(0, "c0-run-1", 20_000, 1500, Some("host-0:11"));
    let second = req(0, "c1-run-1", 20_000, 0, Some("host-1:22"));
    let released_early = vec![
        acquire(0, &first),
        inspect(1, &second),
        renew(0, 0),
        release(0, 0),
        acquire(1, &second),
        acquire(0, &first),
        inspect(0, &first),
        inspect(1, &second),
        renew(0, 0),
        Act::Wait(1900),
        acquire(1, &second),
        inspect(1, &second),
        acquire(0, &first),
        release(1, 0),
        inspect(0, &first),
    ];

    // A short TTL under a longer hold, never released: the holder "died".
    let died = req(1, "c2-run-1", 300, 1500, None);
    let after = req(1, "c0-run-2", 20_000, 0, None);
    let holder_died = vec![
        acquire(2, &died),
        Act::Wait(700),
        acquire(0, &after),
        inspect(0, &after),
        Act::Wait(1200),
        acquire(0, &after),
        inspect(0, &after),
        release(0, 1),
    ];

    // A hold that ends before the release: the release deletes, as without one, and announces
    // itself, since someone was refused the grant (which marked it) before.
    let short = req(0, "c1-run-2", 20_000, 200, Some("host-1:22"));
    let next = req(0, "c2-run-2", 20_000, 0, None);
    let released_late = vec![
        acquire(1, &short),
        acquire(2, &next),
        Act::Wait(600),
        release(1, 0),
        inspect(2, &next),
        acquire(2, &next),
        release(2, 0),
    ];
    vec![released_early, holder_died, released_late]
}

#[tokio::test]
async fn the_simulation_agrees_with_real_redis_on_holds_and_names() {
    let server = RedisServer::start();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            RedisBackend::open(&server.url(), RedisSettings::default())
                .expect("valid URL")
                .into_client()
        })
        .collect();
    let mut total_notices = 0;
    for (case, sequence) in sequences().into_iter().enumerate() {
        server.cmd(&["FLUSHALL"]);
        // Zeroes INFO commandstats: PUBLISH is counted from here.
        server.cmd(&["CONFIG", "RESETSTAT"]);
        let mut sim = SimWorld::new();
        let mut real = World::new(clients.clone());
        let (mut simulated, mut actual): (Vec<Option<Signature>>, Vec<Option<Signature>>) =
            (Vec::new(), Vec::new());
        let mut shown = Vec::new();
        for act in &sequence {
            match act {
                Act::Lease(step, request) => {
                    shown.push(format!("{step:?}"));
                    simulated.push(sim.step(step, request.as_deref()));
                    actual.push(real.apply(step, request.as_deref(), 0).await);
                }
                Act::Wait(ms) => {
                    shown.push(format!("wait {ms} ms"));
                    sim.step(&Step::Advance { ms: *ms }, None);
                    tokio::time::sleep(Duration::from_millis(*ms)).await;
                    simulated.push(None);
                    actual.push(None);
                }
            }
            // The same releases announced (D48), after every step.
            let published = server.commandstats().get("publish").copied().unwrap_or(0);
            assert_eq!(
                sim.server.notices_published(),
                published,
                "sequence {case}, after {}: announcements disagree",
                shown[shown.len() - 1]
            );
        }
        total_notices += sim.server.notices_published();
        let (simulated_ranks, actual_ranks) = (by_rank(&simulated), by_rank(&actual));
        for index in 0..sequence.len() {
            assert_eq!(
                simulated_ranks[index], actual_ranks[index],
                "sequence {case}, step {index} ({}) disagrees\nsimulated: {simulated_ranks:#?}\n\
                 redis-server: {actual_ranks:#?}",
                shown[index]
            );
        }
        // The sequences do reach what they are about.
        let text = actual_ranks.iter().flatten().cloned().collect::<Vec<_>>();
        println!("sequence {case}: {text:#?}");
        if case == 0 {
            for needle in [
                " name \"host-0:11\" released",
                "Acquired(#2)",
                "Other(Some(#1)",
            ] {
                assert!(
                    text.iter().any(|t| t.contains(needle)),
                    "{needle}: {text:#?}"
                );
            }
        }
    }
    // The last sequence announces its marked grant's release: the count compared one.
    assert!(total_notices > 0, "no release was announced");
}
