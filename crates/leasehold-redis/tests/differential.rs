//! Differential test: the simulated server and real redis-server (the real Lua scripts) give
//! identical outcomes, holders and handle states, and fences in the same order, step by step, on
//! random scenarios without timing faults; and they announce the same releases (D48: only those
//! of a grant someone was refused), counted after every step.
//!
//! Fences are compared by order, not value: each is replaced by its rank among the distinct
//! fences of its resource in the run ([`by_rank`]), in both worlds, before comparing. Fences
//! taken from two clocks (the simulation's virtual one, redis-server's `TIME`) or from a plain
//! counter then compare alike, while a new grant whose fence is lower than or equal to an
//! earlier one in one world only, or a replay whose fence changed, still shows as a difference.
//!
//! `LEASEHOLD_DIFF_CASES` sets the number of scenarios (default 1,000); `LEASEHOLD_SIM_SEED`
//! replays a run. A failure prints the seed, the scenario and the step where they disagree.

use leasehold_sim::scenario::{self, CLIENTS, purpose, resource_digest, steps};
use leasehold_sim::{Mode, RequestBook, Signature, SimWorld, Step, World, by_rank};
use proptest::strategy::{Strategy, ValueTree};
use test_support::RedisServer;

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
    let (mut total_steps, mut total_notices) = (0, 0);
    for case in 0..cases {
        let scenario = strategy
            .new_tree(&mut runner)
            .expect("a scenario")
            .current();
        server.cmd(&["FLUSHALL"]);
        // Zeroes INFO commandstats: PUBLISH is counted from here.
        server.cmd(&["CONFIG", "RESETSTAT"]);
        let mut sim = SimWorld::new();
        let mut real = World::new(clients.clone());
        let mut book = RequestBook::new();
        let (mut simulated, mut actual) = (Vec::new(), Vec::new());
        for step in &scenario {
            let request = book.request_for(step, Mode::DIFFERENTIAL);
            if let Step::Delete { resource } = *step {
                let key = clients[0]
                    .backend()
                    .keys()
                    .lease_key(&purpose(), &resource_digest(resource));
                server.cmd(&["DEL", &key]);
            }
            simulated.push(sim.step(step, request.as_ref()));
            actual.push(real.apply(step, request.as_ref(), 0).await);
            total_steps += 1;
            let published = server.commandstats().get("publish").copied().unwrap_or(0);
            let notices = sim.server.notices_published();
            assert_eq!(
                notices,
                published,
                "LEASEHOLD_SIM_SEED={seed}, scenario {case}, step {} ({step:?}): the simulation \
                 announced {notices} releases, redis-server {published}\nscenario: {scenario:#?}",
                simulated.len() - 1,
            );
        }
        total_notices += sim.server.notices_published();
        let (simulated_ranks, actual_ranks) = (by_rank(&simulated), by_rank(&actual));
        if let Some(index) = (0..scenario.len()).find(|&i| simulated_ranks[i] != actual_ranks[i]) {
            let show = |s: &Option<Signature>| s.as_ref().map(ToString::to_string);
            panic!(
                "LEASEHOLD_SIM_SEED={seed}, scenario {case}, step {index} ({:?}) disagrees\n\
                 by rank:  simulated {:?}, redis-server {:?}\n\
                 as given: simulated {:?}, redis-server {:?}\n\
                 scenario: {scenario:#?}",
                scenario[index],
                simulated_ranks[index],
                actual_ranks[index],
                show(&simulated[index]),
                show(&actual[index]),
            );
        }
    }
    // Scenarios do refuse grants that are later released: the count above compared some.
    assert!(
        total_notices > 0,
        "no release was announced in {cases} scenarios"
    );
    println!(
        "{cases} scenarios, {total_steps} steps, {total_notices} announced releases: \
         simulation and redis-server agree"
    );
}

/// The simulation keeps fence counters as the Redis backend has them kept: the same default
/// idle expiry, and the same values refused (`acquire.lua` and the simulation then set the
/// same TTL, the idle expiry plus the fence's lead over the clock; `fences_survive.rs` and the
/// simulation's `sim_fences.rs` test each).
#[test]
fn the_simulation_keeps_idle_counters_as_long_as_redis() {
    use std::time::Duration;

    let sim = || {
        leasehold_sim::SimServer::new(leasehold_redis::leasehold::ManualClock::new())
            .connect(Duration::from_millis(200))
    };
    let redis = RedisSettings::default();
    assert_eq!(sim().counter_idle_expiry(), redis.counter_idle_expiry());
    let day = Duration::from_secs(24 * 3600);
    for idle in [
        Duration::ZERO,
        Duration::from_millis(999),
        Duration::from_secs(1),
        Duration::from_micros(1_500_500),
        Duration::from_millis(1_501),
        365 * day,
        365 * day + Duration::from_millis(1),
    ] {
        let (in_sim, in_redis) = (
            sim()
                .with_counter_idle_expiry(idle)
                .map(|b| b.counter_idle_expiry()),
            redis
                .clone()
                .with_counter_idle_expiry(idle)
                .map(|s| s.counter_idle_expiry()),
        );
        assert_eq!(in_sim.ok(), in_redis.ok(), "{idle:?}");
    }
}
