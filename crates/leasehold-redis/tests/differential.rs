//! Differential test: the simulated server and real redis-server (the real Lua scripts) give
//! identical outcomes, fences, holders and handle states, step by step, on random scenarios
//! without timing faults.
//!
//! `LEASEHOLD_DIFF_CASES` sets the number of scenarios (default 1,000); `LEASEHOLD_SIM_SEED`
//! replays a run. A failure prints the seed, the scenario and the step where they disagree.

use proptest::strategy::{Strategy, ValueTree};
use test_support::RedisServer;
use test_support::scenario::{self, CLIENTS, Mode, RequestBook, SimWorld, Step, World, steps};

use leasehold_redis::leasehold::{Purpose, ResourceDigest};
use leasehold_redis::{RedisBackend, RedisSettings};

const MAX_STEPS: usize = 60;

#[tokio::test]
async fn the_simulation_agrees_with_real_redis() {
    let cases: usize = std::env::var("LEASEHOLD_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let server = RedisServer::start();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            RedisBackend::open(&server.url(), RedisSettings::default())
                .expect("valid URL")
                .into_client()
        })
        .collect();
    let (mut runner, seed) = scenario::runner(1);
    let strategy = steps(Mode::DIFFERENTIAL, MAX_STEPS);
    let mut total_steps = 0;
    for case in 0..cases {
        let scenario = strategy
            .new_tree(&mut runner)
            .expect("a scenario")
            .current();
        server.cmd(&["FLUSHALL"]);
        let mut sim = SimWorld::new();
        let mut real = World::new(clients.clone());
        let mut book = RequestBook::new();
        for (index, step) in scenario.iter().enumerate() {
            let request = book.request_for(step, Mode::DIFFERENTIAL);
            if let Step::Delete { resource } = *step {
                let (purpose, digest) = (
                    Purpose::new("sim").unwrap(),
                    ResourceDigest::of(format!("resource-{resource}")),
                );
                let key = clients[0].backend().keys().lease_key(&purpose, &digest);
                server.cmd(&["DEL", &key]);
            }
            let simulated = sim.step(step, request.as_ref());
            let actual = real.apply(step, request.as_ref(), 0).await;
            assert_eq!(
                simulated, actual,
                "LEASEHOLD_SIM_SEED={seed}, scenario {case}, step {index} ({step:?}) disagrees\n\
                 scenario: {scenario:#?}"
            );
            total_steps += 1;
        }
    }
    println!("{cases} scenarios, {total_steps} steps: simulation and redis-server agree");
}
