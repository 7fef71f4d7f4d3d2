//! The scenario generator: which kinds of step a scenario may hold ([`Mode`]), the proptest
//! strategy that draws them, and seeded runners that make a failure replayable.
//!
//! The same scenarios drive the invariant suite (simulated server, faults, virtual time) and
//! the differential test (simulated server and real redis-server side by side, compared step
//! by step through [`World::apply`](crate::World::apply)'s signatures, with fences compared by
//! order: [`by_rank`](crate::by_rank)).

use std::time::Duration;

use leasehold::{Purpose, ResourceDigest};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::step::{FaultStep, Step};

/// Clients in a scenario.
pub const CLIENTS: usize = 3;
/// Resources in a scenario.
pub const RESOURCES: usize = 2;
/// The command timeout of simulated clients.
pub const COMMAND_TIMEOUT: Duration = Duration::from_millis(200);

/// Which kinds of step a scenario may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// Time passes, and requests and replies are lost, delayed or late.
    pub timing: bool,
    /// Leases are deleted by hand (as an operator's `DEL` would).
    pub deletes: bool,
    /// The server's clock steps forward or back.
    pub clock_steps: bool,
    /// The server restarts without persistence.
    pub restarts: bool,
    /// The server fails over to a replica that lost its last writes.
    pub failovers: bool,
}

impl Mode {
    /// Timing faults only: every invariant must hold.
    pub const TIMING: Mode = Mode {
        timing: true,
        deletes: false,
        clock_steps: false,
        restarts: false,
        failovers: false,
    };
    /// No time and no faults, for comparing against real Redis.
    pub const DIFFERENTIAL: Mode = Mode {
        timing: false,
        deletes: true,
        clock_steps: false,
        restarts: false,
        failovers: false,
    };
    /// Control: server clock steps (I3 must be found broken; I1, I4 and I5 must hold).
    pub const CLOCK_STEPS: Mode = Mode {
        clock_steps: true,
        ..Mode::TIMING
    };
    /// Restarts and lossy failovers, each taking a downtime, on a clock that behaves (I3 must
    /// be found broken; I1, I4 and I5 must hold).
    pub const LOSSY: Mode = Mode {
        restarts: true,
        failovers: true,
        ..Mode::TIMING
    };
    /// Control: restarts and lossy failovers while the server's clock steps forward and back,
    /// sometimes back by more than a loss takes (I5 must be found broken; I1 and I4 must hold).
    pub const LOSSY_CLOCK_STEPS: Mode = Mode {
        clock_steps: true,
        ..Mode::LOSSY
    };

    /// Returns true if and only if the server keeps its promises in this mode, so that I2 and
    /// I3 must hold.
    pub fn is_strict(&self) -> bool {
        !(self.deletes || self.clock_steps || self.restarts || self.failovers)
    }
}

/// The purpose every scenario's leases use.
pub fn purpose() -> Purpose {
    Purpose::new("sim").expect("a valid purpose")
}

/// The digest of the scenario's resource number `resource`.
pub fn resource_digest(resource: usize) -> ResourceDigest {
    ResourceDigest::of(format!("resource-{resource}"))
}

/// The downtimes of generated restarts and failovers, in milliseconds: from the shortest a
/// real one takes to longer than most TTLs.
pub const DOWNTIMES_MS: std::ops::RangeInclusive<u64> = 1..=500;

/// TTLs a scenario's acquires use, by mode: short ones where time is virtual, long ones
/// where real Redis runs beside the simulation in real time.
pub fn ttls(mode: Mode) -> &'static [u64] {
    if mode.timing {
        &[60, 150, 400, 1000]
    } else {
        &[20_000, 60_000]
    }
}

/// The strategy for scenarios of up to `max_len` steps in `mode`.
pub fn steps(mode: Mode, max_len: usize) -> BoxedStrategy<Vec<Step>> {
    let c = 0..CLIENTS;
    let r = 0..RESOURCES;
    let ttl = 0..ttls(mode).len();
    let mut choices: Vec<(u32, BoxedStrategy<Step>)> = vec![
        (
            4,
            (c.clone(), r.clone(), ttl)
                .prop_map(|(client, resource, ttl)| Step::Acquire {
                    client,
                    resource,
                    ttl,
                })
                .boxed(),
        ),
        (
            2,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::Replay { client, resource })
                .boxed(),
        ),
        (
            1,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::OtherOperation { client, resource })
                .boxed(),
        ),
        (
            3,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::Renew { client, resource })
                .boxed(),
        ),
        (
            2,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::Release { client, resource })
                .boxed(),
        ),
        (
            1,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::Inspect { client, resource })
                .boxed(),
        ),
        (
            1,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::Watch { client, resource })
                .boxed(),
        ),
        (
            2,
            (c.clone(), r.clone())
                .prop_map(|(client, resource)| Step::Write { client, resource })
                .boxed(),
        ),
    ];
    if mode.timing {
        choices.push((3, (0u64..1200).prop_map(|ms| Step::Advance { ms }).boxed()));
        let fault = prop_oneof![
            Just(FaultStep::LoseRequest),
            Just(FaultStep::LoseReply),
            (1u64..199).prop_map(FaultStep::DelayRequest),
            (1u64..199).prop_map(FaultStep::DelayReply),
            (201u64..1500).prop_map(FaultStep::LateRequest),
        ];
        choices.push((
            2,
            (c.clone(), fault)
                .prop_map(|(client, fault)| Step::Fault { client, fault })
                .boxed(),
        ));
    }
    if mode.deletes {
        choices.push((
            1,
            r.clone()
                .prop_map(|resource| Step::Delete { resource })
                .boxed(),
        ));
    }
    if mode.clock_steps {
        choices.push((
            1,
            (-800i64..800).prop_map(|ms| Step::ClockStep { ms }).boxed(),
        ));
    }
    if mode.restarts {
        choices.push((
            1,
            DOWNTIMES_MS
                .prop_map(|down_ms| Step::Restart { down_ms })
                .boxed(),
        ));
    }
    if mode.failovers {
        choices.push((
            1,
            (1usize..4, DOWNTIMES_MS)
                .prop_map(|(k, down_ms)| Step::Failover { k, down_ms })
                .boxed(),
        ));
    }
    proptest::collection::vec(
        proptest::strategy::Union::new_weighted(choices),
        1..=max_len,
    )
    .boxed()
}

/// Returns `LEASEHOLD_SIM_CASES`, or `default`.
pub fn cases(default: u32) -> u32 {
    std::env::var("LEASEHOLD_SIM_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Returns a test runner for `cases` cases, seeded from `LEASEHOLD_SIM_SEED` or at random, and
/// the seed, which a failure must print so that it can be run again.
pub fn runner(cases: u32) -> (TestRunner, u64) {
    let seed = std::env::var("LEASEHOLD_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            let mut bytes = [0u8; 8];
            // Falls back to the clock if the OS has no entropy: any seed will do.
            let _ = std::fs::File::open("/dev/urandom")
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
            u64::from_le_bytes(bytes)
                ^ std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
        });
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let config = Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 4096,
        ..Config::default()
    };
    (
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key)),
        seed,
    )
}
