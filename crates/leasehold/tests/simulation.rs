//! Deterministic simulation: the lease invariants under lost replies, pauses and clock trouble.
//!
//! `LEASEHOLD_SIM_CASES` sets the number of cases (default below, sized for CI on 2 cores);
//! `LEASEHOLD_SIM_SEED` replays a run; every failure prints its seed and the shrunk steps.

use leasehold_sim::invariant::ALL;
use leasehold_sim::scenario::{self, steps};
use leasehold_sim::{Mode, run_sim};
use proptest::test_runner::{TestCaseError, TestError};

/// Steps per scenario, at most.
const MAX_STEPS: usize = 100;
/// Cases per suite in CI; raise with LEASEHOLD_SIM_CASES.
const CI_CASES: u32 = 2_000;

fn explore(mode: Mode, checked: &'static [&'static str], cases: u32) -> (Result<(), String>, u64) {
    let (mut runner, seed) = scenario::runner(cases);
    let result = runner.run(&steps(mode, MAX_STEPS), |s| {
        run_sim(&s, mode, checked).map_err(|v| TestCaseError::fail(v.to_string()))
    });
    let result = result.map_err(|e| match e {
        TestError::Fail(why, steps) => {
            format!("{why}\nshrunk to {} steps: {steps:#?}", steps.len())
        }
        TestError::Abort(why) => format!("aborted: {why}"),
    });
    (result, seed)
}

#[test]
fn timing_faults_keep_every_invariant() {
    let cases = scenario::cases(CI_CASES);
    let (result, seed) = explore(Mode::TIMING, ALL, cases);
    if let Err(e) = result {
        panic!("LEASEHOLD_SIM_SEED={seed} ({cases} cases): {e}");
    }
}

/// Control: the checker bites. With the server's clock stepping, two holders are Active at once;
/// fencing holds, and fences still grow (the counter carries them over a clock that goes back).
#[test]
fn clock_steps_break_mutual_exclusion_and_fencing_still_holds() {
    let cases = scenario::cases(CI_CASES);
    let (found, seed) = explore(Mode::CLOCK_STEPS, &["I3"], cases);
    let found = found.expect_err(&format!("LEASEHOLD_SIM_SEED={seed}: no I3 violation found"));
    assert!(found.contains("I3"), "{found}");
    let (fenced, seed) = explore(Mode::CLOCK_STEPS, &["I1", "I4", "I5"], cases);
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
    let (found, seed) = explore(Mode::LOSSY, &["I3"], cases);
    let found = found.expect_err(&format!("LEASEHOLD_SIM_SEED={seed}: no I3 violation found"));
    assert!(found.contains("I3"), "{found}");
    let (fenced, seed) = explore(Mode::LOSSY, &["I1", "I4", "I5"], cases);
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
    let (found, seed) = explore(Mode::LOSSY_CLOCK_STEPS, &["I5"], cases);
    let found = found.expect_err(&format!("LEASEHOLD_SIM_SEED={seed}: no I5 violation found"));
    assert!(found.contains("I5"), "{found}");
    let (fenced, seed) = explore(Mode::LOSSY_CLOCK_STEPS, &["I1", "I4"], cases);
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
        run_sim(&around_a_restart(0), Mode::LOSSY_CLOCK_STEPS, &["I5"]),
        Ok(())
    );
    assert_eq!(
        run_sim(&around_a_restart(9), Mode::LOSSY_CLOCK_STEPS, &["I5"]),
        Ok(())
    );
    let found = run_sim(&around_a_restart(50), Mode::LOSSY_CLOCK_STEPS, &["I5"])
        .expect_err("a clock 50 ms back across a 10 ms restart reissues fences");
    assert_eq!((found.invariant, found.step), ("I5", 6), "{found}");
    assert!(
        found
            .detail
            .contains("fence 60000 (lineage 1) granted after 100000"),
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
    assert_eq!(run_sim(&steps, Mode::TIMING, ALL), Ok(()));
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
