//! The scheduling arithmetic: when a kept lease is renewed, when its signal must fire, and
//! why.
//!
//! Everything here is a pure function of durations, divisors, outcomes and states: nothing
//! reads a clock or needs a runtime. The watchdog's task reads each lease's remaining
//! validity and state, and passes them in.

use std::time::Duration;

use super::signal::LossReason;
use crate::handle::LeaseState;
use crate::outcome::{ReleaseOutcome, RenewOutcome};

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
        Some(RenewOutcome::Lost(_)) => RenewalVerdict::Ended(LossReason::LostToAnother),
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
