//! The scheduling arithmetic: when a kept lease is renewed, when its signal must fire, and
//! why.
//!
//! Everything here is a pure function of durations, divisors, outcomes and states: nothing
//! reads a clock or needs a runtime. The watchdog's task reads each lease's remaining
//! validity and state, and passes them in.

use std::time::Duration;

use super::signal::LossReason;
use crate::handle::LeaseState;
use crate::outcome::{IndeterminateCause, LossCause, ReleaseOutcome, RenewOutcome};

/// Returns true if and only if a cadence of TTL / `cadence_divisor`, a retry interval and a
/// margin of TTL / `margin_divisor` add up to less than the TTL: TTL / c + TTL / 4c + TTL / m
/// < TTL, that is 5m + 4c < 4cm (in integers, so that it holds for every TTL alike).
pub(super) fn has_room(cadence_divisor: u32, margin_divisor: u32) -> bool {
    let (c, m) = (u64::from(cadence_divisor), u64::from(margin_divisor));
    5 * m + 4 * c < 4 * c * m
}

/// The shortest retry interval: a cadence / 4 that rounds to nothing would retry a failing
/// backend in a tight loop.
const MIN_RETRY: Duration = Duration::from_millis(1);

/// The intervals that pace one kept lease, fractions of its TTL, and the decisions taken
/// from them.
///
/// Pure arithmetic: nothing here reads a clock. The lease's remaining validity is read by the
/// caller and passed in, so that one reading serves one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Schedule {
    /// How long after a confirmation the next renewal is due: TTL / the cadence divisor.
    pub(super) cadence: Duration,
    /// The wait before retrying a failed renewal: a quarter of the cadence, so that with the
    /// defaults at least two retries happen between the first failure and the signal (and at
    /// least [`MIN_RETRY`]).
    pub(super) retry: Duration,
    /// The validity left at which the signal fires unless a renewal was confirmed: TTL / the
    /// margin divisor.
    pub(super) margin: Duration,
}

impl Schedule {
    /// The schedule of a lease of `ttl` under the given divisors.
    pub(super) fn new(ttl: Duration, cadence_divisor: u32, margin_divisor: u32) -> Self {
        let cadence = ttl / cadence_divisor;
        Self {
            cadence,
            retry: (cadence / 4).max(MIN_RETRY),
            margin: ttl / margin_divisor,
        }
    }

    /// Returns true if and only if a lease valid for `validity` after each renewal can be
    /// kept: that validity must be more than the cadence, a retry interval and the margin
    /// together, or a failed renewal could not be retried in time (and with less than the
    /// margin and a retry interval, every renewal would be due at once, for ever).
    pub(super) fn fits(&self, validity: Duration) -> bool {
        validity > self.cadence + self.retry + self.margin
    }

    /// How long from now, with `remaining` validity, until the margin point: the instant the
    /// remaining validity falls to the margin.
    pub(super) fn until_margin(&self, remaining: Duration) -> Duration {
        remaining.saturating_sub(self.margin)
    }

    /// Returns true if and only if, with `remaining` validity and no confirmation to extend
    /// it, the signal must fire now: the remaining validity is down to the margin.
    pub(super) fn must_fire(&self, remaining: Duration) -> bool {
        remaining <= self.margin
    }

    /// How long from now, with `remaining` validity, the next renewal is due: a cadence
    /// after a confirmation, a retry interval after a failure, but never later than a retry
    /// interval before the margin point, so that the reply is due before the signal would
    /// fire. After a failure with no retry interval left before the margin point, no retry
    /// could be answered in time: the wait is then to the margin point, where the signal fires.
    pub(super) fn next_renewal(&self, remaining: Duration, failing: bool) -> Duration {
        let to_margin = self.until_margin(remaining);
        let latest = to_margin.saturating_sub(self.retry);
        if !failing {
            self.cadence.min(latest)
        } else if to_margin > self.retry {
            self.retry.min(latest)
        } else {
            // Also what keeps a backend that fails at once from being retried in a tight loop.
            to_margin
        }
    }
}

/// What a renewal's outcome (`None` if the backend panicked) means for its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RenewalVerdict {
    /// The renewal was confirmed: the next one is due a cadence on.
    Confirmed,
    /// Failed, indeterminate or overloaded: nothing is proven either way, and the lease is
    /// retried while validity above the margin remains.
    Unproven,
    /// The lease has ended, or nothing will renew it any more: the signal fires.
    Ended(LossReason),
}

/// Judges a renewal by its outcome alone.
pub(super) fn renewal_verdict(outcome: Option<&RenewOutcome>) -> RenewalVerdict {
    match outcome {
        Some(RenewOutcome::Renewed { .. }) => RenewalVerdict::Confirmed,
        Some(RenewOutcome::Lost(LossCause::MasterReplaced)) => {
            RenewalVerdict::Ended(LossReason::MasterReplaced)
        }
        Some(RenewOutcome::Lost(_)) => RenewalVerdict::Ended(LossReason::LostToAnother),
        // Ran on a master the Sentinels no longer name, and not confirmed on the one they do:
        // a failover is a loss until proven otherwise.
        Some(RenewOutcome::Indeterminate(unknown))
            if unknown.cause == IndeterminateCause::MasterReplaced =>
        {
            RenewalVerdict::Ended(LossReason::MasterReplaced)
        }
        // Refused from Lost, or because a release is under way (any other state).
        Some(RenewOutcome::Refused {
            state: LeaseState::Lost,
        }) => RenewalVerdict::Ended(LossReason::LostToAnother),
        Some(RenewOutcome::Refused { .. }) => RenewalVerdict::Ended(LossReason::Released),
        None => RenewalVerdict::Ended(LossReason::WatchdogStopped),
        Some(
            RenewOutcome::Indeterminate(_)
            | RenewOutcome::Unavailable(_)
            | RenewOutcome::Overloaded,
        ) => RenewalVerdict::Unproven,
    }
}

/// Why the signal fires after [`KeptLease::release`] returned `outcome`.
///
/// [`KeptLease::release`]: super::KeptLease::release
pub(super) fn release_reason(outcome: &ReleaseOutcome) -> LossReason {
    match outcome {
        ReleaseOutcome::Released
        | ReleaseOutcome::Refused {
            state: LeaseState::Released,
        } => LossReason::Released,
        // The grant was gone before the release came: the lease ended under the work.
        ReleaseOutcome::AlreadyGone | ReleaseOutcome::NotOwner | ReleaseOutcome::Refused { .. } => {
            LossReason::LostToAnother
        }
        // Not applied, or not known to be: neither renewed any more nor known to be released.
        ReleaseOutcome::Indeterminate(_)
        | ReleaseOutcome::Unavailable(_)
        | ReleaseOutcome::Overloaded => LossReason::Unreachable,
    }
}

/// Why the signal fires for a lease whose remaining validity is down to the margin (or to
/// nothing), from what its handle has recorded: a lease released or lost through its handle
/// (or through a replayed handle, which shares its state) is not merely unconfirmed.
pub(super) fn margin_reason(state: LeaseState) -> LossReason {
    match state {
        LeaseState::Lost => LossReason::LostToAnother,
        LeaseState::Released => LossReason::Released,
        LeaseState::Expired => LossReason::Expired,
        _ => LossReason::Unreachable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::{Indeterminate, Unavailable, UnavailableCause};

    const NS: Duration = Duration::from_nanos(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A 3 s lease under the default divisors: a cadence of 1 s, a retry of 250 ms and a
    /// margin of 600 ms, so its margin point is 600 ms before the end of its validity.
    fn three_seconds() -> Schedule {
        Schedule::new(Duration::from_secs(3), 3, 5)
    }

    /// Every lease state. The match fails to compile when a state is added, until it is
    /// listed here (and its reasons are pinned below).
    fn every_state() -> [LeaseState; 5] {
        let states = [
            LeaseState::Active,
            LeaseState::Expired,
            LeaseState::Unknown,
            LeaseState::Lost,
            LeaseState::Released,
        ];
        for state in states {
            match state {
                LeaseState::Active
                | LeaseState::Expired
                | LeaseState::Unknown
                | LeaseState::Lost
                | LeaseState::Released => {}
            }
        }
        states
    }

    fn indeterminate() -> Indeterminate {
        Indeterminate::new(IndeterminateCause::ResponseTimeout, "no reply")
    }

    fn unavailable() -> Unavailable {
        Unavailable::new(UnavailableCause::ConnectionRefused, "refused")
    }

    #[test]
    fn the_intervals_are_fractions_of_the_ttl() {
        assert_eq!(
            three_seconds(),
            Schedule {
                cadence: ms(1_000),
                retry: ms(250),
                margin: ms(600),
            }
        );
        assert_eq!(
            Schedule::new(Duration::from_secs(60), 4, 10),
            Schedule {
                cadence: Duration::from_secs(15),
                retry: ms(3_750),
                margin: Duration::from_secs(6),
            }
        );
    }

    #[test]
    fn a_retry_is_never_shorter_than_a_millisecond() {
        // A quarter of a 1 ms cadence would be 250 us.
        assert_eq!(Schedule::new(ms(3), 3, 5).retry, ms(1));
        // A cadence that rounds to nothing still retries a millisecond later, not at once.
        let tiny = Schedule::new(NS * 99, 100, 100);
        assert_eq!(tiny.cadence, Duration::ZERO);
        assert_eq!(tiny.retry, ms(1));
        // At and above the floor, the quarter itself.
        assert_eq!(Schedule::new(ms(12), 3, 5).retry, ms(1));
        assert_eq!(
            Schedule::new(ms(15), 3, 5).retry,
            Duration::from_micros(1_250)
        );
    }

    #[test]
    fn after_a_confirmation_the_next_renewal_is_a_cadence_away() {
        let s = three_seconds();
        // Fresh from a confirmation (validity 2.96 s after the drift budget): 2.36 s to the
        // margin point, 2.11 s to the last moment a renewal may be sent.
        assert_eq!(s.next_renewal(ms(2_960), false), s.cadence);
        // Exactly a cadence before that last moment, still the cadence.
        let edge = s.cadence + s.retry + s.margin;
        assert_eq!(s.next_renewal(edge, false), s.cadence);
        assert_eq!(s.next_renewal(edge + NS, false), s.cadence);
    }

    #[test]
    fn a_renewal_is_capped_to_a_retry_before_the_margin_point() {
        let s = three_seconds();
        let edge = s.cadence + s.retry + s.margin;
        assert_eq!(s.next_renewal(edge - NS, false), s.cadence - NS);
        // 1.5 s left: 900 ms to the margin point, so it is sent 650 ms from now.
        assert_eq!(s.next_renewal(ms(1_500), false), ms(650));
        // With no more than a retry left before the margin point, it is due at once.
        assert_eq!(s.next_renewal(s.margin + s.retry, false), Duration::ZERO);
        assert_eq!(s.next_renewal(ms(700), false), Duration::ZERO);
        assert_eq!(s.next_renewal(Duration::ZERO, false), Duration::ZERO);
    }

    #[test]
    fn after_a_failure_the_next_renewal_is_a_retry_away() {
        let s = three_seconds();
        assert_eq!(s.next_renewal(ms(2_960), true), s.retry);
        // 1.1 s left: 500 ms to the margin point, room for a whole retry interval and more.
        assert_eq!(s.next_renewal(ms(1_100), true), s.retry);
        // Capped, like a confirmed one, to a retry before the margin point: 1 s left is
        // 400 ms to the margin point, so the retry goes 150 ms from now.
        assert_eq!(s.next_renewal(ms(1_000), true), ms(150));
        // One nanosecond more than a retry before the margin point: sent in that nanosecond.
        assert_eq!(s.next_renewal(s.margin + s.retry + NS, true), NS);
    }

    #[test]
    fn with_no_room_for_a_retry_the_wait_is_to_the_margin_point() {
        let s = three_seconds();
        // Exactly a retry before the margin point: no retry could be answered in time.
        assert_eq!(s.next_renewal(s.margin + s.retry, true), s.retry);
        // 700 ms left: the margin point is 100 ms away.
        assert_eq!(s.next_renewal(ms(700), true), ms(100));
        // At or past the margin point, nothing to wait for.
        assert_eq!(s.next_renewal(s.margin, true), Duration::ZERO);
        assert_eq!(s.next_renewal(ms(10), true), Duration::ZERO);
    }

    #[test]
    fn the_margin_point_is_the_validity_above_the_margin() {
        let s = three_seconds();
        assert_eq!(s.until_margin(ms(2_960)), ms(2_360));
        assert_eq!(s.until_margin(s.margin + NS), NS);
        assert_eq!(s.until_margin(s.margin), Duration::ZERO);
        assert_eq!(s.until_margin(ms(100)), Duration::ZERO);
    }

    #[test]
    fn the_signal_must_fire_at_exactly_the_margin() {
        let s = three_seconds();
        assert!(s.must_fire(s.margin));
        assert!(!s.must_fire(s.margin + NS));
        assert!(s.must_fire(s.margin - NS));
        assert!(s.must_fire(Duration::ZERO));
        assert!(!s.must_fire(ms(2_960)));
    }

    #[test]
    fn a_lease_fits_only_with_more_than_a_cadence_a_retry_and_the_margin() {
        let s = three_seconds();
        let edge = ms(1_850);
        assert_eq!(edge, s.cadence + s.retry + s.margin);
        assert!(!s.fits(edge));
        assert!(s.fits(edge + NS));
        assert!(!s.fits(edge - NS));
        assert!(!s.fits(Duration::ZERO));
        assert!(s.fits(ms(2_960)));
    }

    #[test]
    fn the_divisors_have_room_exactly_when_5m_plus_4c_is_below_4cm() {
        // The setters allow 2 to 100; a divisor of 1 (a cadence or a margin of the whole
        // TTL) has no room, and is checked too, as the formula must say so.
        for c in 1..=100u32 {
            for m in 1..=100u32 {
                let (ci, mi) = (i64::from(c), i64::from(m));
                // 5m + 4c = 4cm has no solution here ((4c - 5)(m - 1) = 5 has none in
                // integers), so `<` and `<=` agree and no pair sits on the boundary.
                assert_ne!(5 * mi + 4 * ci, 4 * ci * mi, "c = {c}, m = {m}");
                let expected = 4 * ci * mi - 5 * mi - 4 * ci > 0;
                assert_eq!(has_room(c, m), expected, "c = {c}, m = {m}");
                // The same in Durations: the cadence, a quarter of it and the margin add up
                // to less than the TTL. Off the boundary by at least TTL / 4cm, far more
                // than the rounding of the divisions.
                for secs in [1, 30, 3_600] {
                    let ttl = Duration::from_secs(secs);
                    let room = ttl / c + ttl / (4 * c) + ttl / m < ttl;
                    assert_eq!(has_room(c, m), room, "c = {c}, m = {m}, ttl = {ttl:?}");
                    // And what a lease kept with no drift budget then needs.
                    let fits = Schedule::new(ttl, c, m).fits(ttl);
                    assert_eq!(has_room(c, m), fits, "c = {c}, m = {m}, ttl = {ttl:?}");
                }
            }
        }
        // As documented: only a cadence and a margin of TTL / 2 each are refused.
        let refused: Vec<_> = (2..=100u32)
            .flat_map(|c| (2..=100u32).map(move |m| (c, m)))
            .filter(|&(c, m)| !has_room(c, m))
            .collect();
        assert_eq!(refused, [(2, 2)]);
    }

    #[test]
    fn a_renewal_is_judged_by_its_outcome() {
        let remaining = ms(2_960);
        assert_eq!(
            renewal_verdict(Some(&RenewOutcome::Renewed { remaining })),
            RenewalVerdict::Confirmed
        );
        for cause in [LossCause::Absent, LossCause::OtherHolder] {
            assert_eq!(
                renewal_verdict(Some(&RenewOutcome::Lost(cause))),
                RenewalVerdict::Ended(LossReason::LostToAnother)
            );
        }
        // A grant the new master does not hold, or a renewal that ran on a replaced master and
        // could not be confirmed on the new one: a failover is a loss until proven otherwise.
        for outcome in [
            RenewOutcome::Lost(LossCause::MasterReplaced),
            RenewOutcome::Indeterminate(Indeterminate::new(
                IndeterminateCause::MasterReplaced,
                "ran on a replaced master",
            )),
        ] {
            assert_eq!(
                renewal_verdict(Some(&outcome)),
                RenewalVerdict::Ended(LossReason::MasterReplaced)
            );
        }
        for outcome in [
            RenewOutcome::Indeterminate(indeterminate()),
            RenewOutcome::Indeterminate(Indeterminate::new(
                IndeterminateCause::MasterUnconfirmed,
                "no Sentinel answered",
            )),
            RenewOutcome::Unavailable(unavailable()),
            RenewOutcome::Overloaded,
        ] {
            assert_eq!(
                renewal_verdict(Some(&outcome)),
                RenewalVerdict::Unproven,
                "{outcome:?}"
            );
        }
        for state in every_state() {
            // Refused from Lost: lost; from any other state, a release is under way.
            let reason = match state {
                LeaseState::Lost => LossReason::LostToAnother,
                _ => LossReason::Released,
            };
            assert_eq!(
                renewal_verdict(Some(&RenewOutcome::Refused { state })),
                RenewalVerdict::Ended(reason),
                "{state:?}"
            );
        }
        // The backend panicked.
        assert_eq!(
            renewal_verdict(None),
            RenewalVerdict::Ended(LossReason::WatchdogStopped)
        );
    }

    #[test]
    fn a_release_is_judged_by_its_outcome() {
        let cases = [
            (ReleaseOutcome::Released, LossReason::Released),
            (ReleaseOutcome::AlreadyGone, LossReason::LostToAnother),
            (ReleaseOutcome::NotOwner, LossReason::LostToAnother),
            (
                ReleaseOutcome::Indeterminate(indeterminate()),
                LossReason::Unreachable,
            ),
            (
                ReleaseOutcome::Unavailable(unavailable()),
                LossReason::Unreachable,
            ),
            (ReleaseOutcome::Overloaded, LossReason::Unreachable),
        ];
        for (outcome, reason) in cases {
            assert_eq!(release_reason(&outcome), reason, "{outcome:?}");
        }
        for state in every_state() {
            let reason = match state {
                LeaseState::Released => LossReason::Released,
                _ => LossReason::LostToAnother,
            };
            assert_eq!(
                release_reason(&ReleaseOutcome::Refused { state }),
                reason,
                "{state:?}"
            );
        }
    }

    #[test]
    fn at_the_margin_the_reason_comes_from_the_lease_state() {
        for state in every_state() {
            let reason = match state {
                LeaseState::Active | LeaseState::Unknown => LossReason::Unreachable,
                LeaseState::Expired => LossReason::Expired,
                LeaseState::Lost => LossReason::LostToAnother,
                LeaseState::Released => LossReason::Released,
            };
            assert_eq!(margin_reason(state), reason, "{state:?}");
        }
    }
}
