//! Deterministic simulation: the lease invariants under lost replies, pauses and clock trouble.
//!
//! `LEASEHOLD_SIM_CASES` sets the number of cases (default below, sized for CI on 2 cores);
//! `LEASEHOLD_SIM_SEED` replays a run; every failure prints its seed and the shrunk steps.

use std::fmt;

use leasehold::FenceToken;
use leasehold_sim::Invariant::{
    self, FencedWritesNeverGoBack, FencesIncrease, MutualExclusion, OnlyTheHolderRenewsOrReleases,
};
use leasehold_sim::scenario::{self, steps};
use leasehold_sim::{Evidence, Mode, Violation, run_sim};
use proptest::test_runner::{TestCaseError, TestError};

/// Steps per scenario, at most.
const MAX_STEPS: usize = 100;
/// Cases per suite in CI; raise with LEASEHOLD_SIM_CASES.
const CI_CASES: u32 = 2_000;

/// What an exploration found: the shrunk scenario's violation, if it has one, and the report
/// to print.
#[derive(Debug)]
struct Found {
    violation: Option<Violation>,
    report: String,
}

impl Found {
    /// Returns the invariant the shrunk scenario breaks, if it breaks one.
    fn invariant(&self) -> Option<Invariant> {
        self.violation.as_ref().map(Violation::invariant)
    }
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.report)
    }
}

fn explore(mode: Mode, checked: &'static [Invariant], cases: u32) -> (Result<(), Found>, u64) {
    let (mut runner, seed) = scenario::runner(cases);
    let result = runner.run(&steps(mode, MAX_STEPS), |s| {
        run_sim(&s, mode, checked).map_err(|v| TestCaseError::fail(v.to_string()))
    });
    let result = result.map_err(|e| match e {
        TestError::Fail(why, steps) => Found {
            // proptest hands back the reason as text; the typed violation comes from running
            // the shrunk steps once more, which gives the same result: a simulated run depends
            // on its steps only (owner tokens are random, but only ever compared for equality).
            violation: run_sim(&steps, mode, checked).err(),
            report: format!("{why}\nshrunk to {} steps: {steps:#?}", steps.len()),
        },
        TestError::Abort(why) => Found {
            violation: None,
            report: format!("aborted: {why}"),
        },
    });
    (result, seed)
}

/// I1, I4 and I5: fencing.
const FENCING: &[Invariant] = &[
    OnlyTheHolderRenewsOrReleases,
    FencedWritesNeverGoBack,
    FencesIncrease,
];

#[test]
fn timing_faults_keep_every_invariant() {
    let cases = scenario::cases(CI_CASES);
    let (result, seed) = explore(Mode::TIMING, &Invariant::ALL, cases);
    if let Err(e) = result {
        panic!("LEASEHOLD_SIM_SEED={seed} ({cases} cases): {e}");
    }
}

/// Control: the checker bites. With the server's clock stepping, two holders are Active at once;
/// fencing holds, and fences still grow (the counter carries them over a clock that goes back).
#[test]
fn clock_steps_break_mutual_exclusion_and_fencing_still_holds() {
    let cases = scenario::cases(CI_CASES);
    let (found, seed) = explore(Mode::CLOCK_STEPS, &[MutualExclusion], cases);
    let found = found.expect_err(&format!("LEASEHOLD_SIM_SEED={seed}: no I3 violation found"));
    assert_eq!(found.invariant(), Some(MutualExclusion), "{found}");
    let (fenced, seed) = explore(Mode::CLOCK_STEPS, FENCING, cases);
    if let Err(e) = fenced {
        panic!("LEASEHOLD_SIM_SEED={seed}: fencing failed under clock steps: {e}");
    }
}

/// Restarts and lossy failovers grant twice (two holders Active at once), but no longer reissue
/// fences: a lost counter starts again from the server's clock, which has moved on by the time
/// the loss took. Fencing holds.
#[test]
fn lossy_failovers_break_exclusion_and_fences_still_grow() {
    let cases = scenario::cases(CI_CASES);
    let (found, seed) = explore(Mode::LOSSY, &[MutualExclusion], cases);
    let found = found.expect_err(&format!("LEASEHOLD_SIM_SEED={seed}: no I3 violation found"));
    assert_eq!(found.invariant(), Some(MutualExclusion), "{found}");
    let (fenced, seed) = explore(Mode::LOSSY, FENCING, cases);
    if let Err(e) = fenced {
        panic!("LEASEHOLD_SIM_SEED={seed}: fencing failed under lossy failovers: {e}");
    }
}

/// Control: the design's assumption bites. A server clock stepped back by more than a restart or
/// failover takes, around the loss of a counter, reissues fences; the fenced resource still
/// refuses the stale writes.
#[test]
fn a_clock_stepped_back_across_a_lost_counter_reissues_fences_and_fencing_still_holds() {
    let cases = scenario::cases(CI_CASES);
    let (found, seed) = explore(Mode::LOSSY_CLOCK_STEPS, &[FencesIncrease], cases);
    let found = found.expect_err(&format!("LEASEHOLD_SIM_SEED={seed}: no I5 violation found"));
    assert_eq!(found.invariant(), Some(FencesIncrease), "{found}");
    let (fenced, seed) = explore(
        Mode::LOSSY_CLOCK_STEPS,
        &[OnlyTheHolderRenewsOrReleases, FencedWritesNeverGoBack],
        cases,
    );
    if let Err(e) = fenced {
        panic!("LEASEHOLD_SIM_SEED={seed}: fencing failed with clocks stepped across losses: {e}");
    }
}

/// The boundary of that assumption, on one scenario: a grant at 100 ms (fence 100,000), the
/// server's clock stepped back, a restart taking 10 ms, a grant once it is back. Stepped back by
/// less than the restart took, the new fence is above; by more, it is below.
#[test]
fn fences_survive_a_restart_unless_the_clock_went_back_further_than_it_took() {
    use leasehold_sim::Step::*;
    let around_a_restart = |back_ms: i64| {
        [
            Advance { ms: 100 },
            Acquire {
                client: 0,
                resource: 0,
                ttl: 0,
            },
            ClockStep { ms: -back_ms },
            Restart { down_ms: 10 },
            // Refused: the server is still down.
            Acquire {
                client: 1,
                resource: 0,
                ttl: 0,
            },
            Advance { ms: 10 },
            Acquire {
                client: 1,
                resource: 0,
                ttl: 0,
            },
        ]
    };
    assert_eq!(
        run_sim(
            &around_a_restart(0),
            Mode::LOSSY_CLOCK_STEPS,
            &[FencesIncrease]
        ),
        Ok(())
    );
    assert_eq!(
        run_sim(
            &around_a_restart(9),
            Mode::LOSSY_CLOCK_STEPS,
            &[FencesIncrease]
        ),
        Ok(())
    );
    let found = run_sim(
        &around_a_restart(50),
        Mode::LOSSY_CLOCK_STEPS,
        &[FencesIncrease],
    )
    .expect_err("a clock 50 ms back across a 10 ms restart reissues fences");
    assert_eq!(
        (found.invariant(), found.step()),
        (FencesIncrease, 6),
        "{found}"
    );
    let fence = |n| FenceToken::new(n).expect("a fence");
    assert_eq!(
        found.evidence(),
        &Evidence::FenceDidNotIncrease {
            resource: 0,
            earlier: fence(100_000),
            earlier_lineage: 0,
            later: fence(60_000),
            later_lineage: 1,
        },
        "{found}"
    );
}

/// Shrunk failure, seed 7259834229043148879: a replay returned a second, independent handle for
/// the same grant; releasing through it left the first handle Active with no key on the server.
/// Fixed by sharing one state between every handle of a grant.
#[test]
fn regression_release_through_a_replayed_handle_is_seen_by_the_first() {
    use leasehold_sim::Step::*;
    let steps = [
        Acquire {
            client: 0,
            resource: 0,
            ttl: 0,
        },
        Release {
            client: 0,
            resource: 0,
        },
        Acquire {
            client: 2,
            resource: 0,
            ttl: 0,
        },
        Release {
            client: 2,
            resource: 0,
        },
        Acquire {
            client: 1,
            resource: 0,
            ttl: 0,
        },
        Replay {
            client: 1,
            resource: 0,
        },
        Release {
            client: 1,
            resource: 0,
        },
    ];
    assert_eq!(run_sim(&steps, Mode::TIMING, &Invariant::ALL), Ok(()));
}

#[test]
fn the_simulator_never_prints_a_token() {
    use leasehold_sim::{RequestBook, SimWorld, Step};
    let mut world = SimWorld::new();
    let mut book = RequestBook::new();
    let step = Step::Acquire {
        client: 0,
        resource: 0,
        ttl: 0,
    };
    let request = book.request_for(&step, Mode::TIMING).expect("a request");
    world.step(&step, Some(&request));
    let token = request.attempt().owner_token().expose_secret();
    let text = format!(
        "{:?} {:?} {world:?}",
        world.server,
        world.world.clients()[0].backend()
    );
    assert!(
        world
            .server
            .stored(request.purpose(), request.resource())
            .is_some()
    );
    assert!(!text.contains(token), "{text}");
}
