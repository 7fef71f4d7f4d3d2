//! What an acquire returns: a handle on a grant, or why there is none.

use std::fmt;

use crate::backend::LeaseBackend;
use crate::handle::LeaseHandle;
use crate::id::OperationId;
use crate::outcome::{Contention, Failure, Indeterminate, Unavailable};

/// The outcome of an acquire.
#[non_exhaustive]
#[must_use = "an acquire outcome may hold a lease that must be released, or be indeterminate"]
pub enum AcquireOutcome<B: LeaseBackend> {
    /// A new grant: the handle is `Active` with a new fence.
    Acquired(LeaseHandle<B>),
    /// This attempt already held the lease (a lost reply was replayed): the same fence, and a
    /// validity capped by the key's *remaining* TTL, which the replay did not extend.
    Replayed(LeaseHandle<B>),
    /// Another owner holds the lease.
    Contended(Contention),
    /// The same owner token holds the lease for another operation id; the new operation does
    /// not inherit it.
    OwnerOperationConflict(Contention),
    /// A permit request asked for another capacity than the semaphore has; nothing was
    /// written. Ask again with the recorded capacity, or change it with the operator's
    /// command (`leasehold capacity`).
    CapacityMismatch {
        /// The capacity the semaphore has.
        recorded: u32,
    },
    /// Sent, outcome unknown: the lease may have been granted to this attempt. Replay the same
    /// request (same attempt) or inspect with it to find out.
    Indeterminate {
        /// The operation whose attempt may hold the lease.
        operation: OperationId,
        /// Why the outcome is unknown.
        cause: Indeterminate,
    },
    /// Definitely not applied; nothing is held.
    Unavailable(Unavailable),
    /// Refused locally by the backend's in-flight limit; nothing was sent.
    Overloaded,
}

impl<B: LeaseBackend> AcquireOutcome<B> {
    /// Returns true if and only if the outcome carries a handle (`Acquired` or `Replayed`).
    pub fn is_held(&self) -> bool {
        matches!(
            self,
            AcquireOutcome::Acquired(_) | AcquireOutcome::Replayed(_)
        )
    }

    /// The outcome's name, as metrics label it.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            AcquireOutcome::Acquired(_) => "acquired",
            AcquireOutcome::Replayed(_) => "replayed",
            AcquireOutcome::Contended(_) => "contended",
            AcquireOutcome::OwnerOperationConflict(_) => "owner_operation_conflict",
            AcquireOutcome::CapacityMismatch { .. } => "capacity_mismatch",
            AcquireOutcome::Indeterminate { .. } => "indeterminate",
            AcquireOutcome::Unavailable(_) => "unavailable",
            AcquireOutcome::Overloaded => "overloaded",
        }
    }

    /// Returns the handle, if the outcome carries one.
    pub fn into_handle(self) -> Option<LeaseHandle<B>> {
        match self {
            AcquireOutcome::Acquired(h) | AcquireOutcome::Replayed(h) => Some(h),
            _ => None,
        }
    }
}

impl<B: LeaseBackend> fmt::Debug for AcquireOutcome<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireOutcome::Acquired(h) => f.debug_tuple("Acquired").field(h).finish(),
            AcquireOutcome::Replayed(h) => f.debug_tuple("Replayed").field(h).finish(),
            AcquireOutcome::Contended(c) => f.debug_tuple("Contended").field(c).finish(),
            AcquireOutcome::OwnerOperationConflict(c) => {
                f.debug_tuple("OwnerOperationConflict").field(c).finish()
            }
            AcquireOutcome::CapacityMismatch { recorded } => f
                .debug_struct("CapacityMismatch")
                .field("recorded", recorded)
                .finish(),
            AcquireOutcome::Indeterminate { operation, cause } => f
                .debug_struct("Indeterminate")
                .field("operation", operation)
                .field("cause", cause)
                .finish(),
            AcquireOutcome::Unavailable(u) => f.debug_tuple("Unavailable").field(u).finish(),
            AcquireOutcome::Overloaded => f.write_str("Overloaded"),
        }
    }
}

impl<B: LeaseBackend> fmt::Display for AcquireOutcome<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireOutcome::Acquired(h) => write!(f, "acquired with fence {}", h.fence()),
            AcquireOutcome::Replayed(h) => {
                write!(f, "replayed: this attempt holds it, fence {}", h.fence())
            }
            AcquireOutcome::Contended(c) => write!(f, "contended: {c}"),
            AcquireOutcome::OwnerOperationConflict(c) => write!(
                f,
                "refused: the owner token holds it for another operation ({c})"
            ),
            AcquireOutcome::CapacityMismatch { recorded } => write!(
                f,
                "refused: the semaphore's capacity is {recorded}, not the one asked for"
            ),
            AcquireOutcome::Indeterminate { operation, cause } => {
                write!(f, "{cause}; replay operation {operation} to find out")
            }
            AcquireOutcome::Unavailable(u) => u.fmt(f),
            AcquireOutcome::Overloaded => Failure::Overloaded.fmt(f),
        }
    }
}
