//! The crate's one error type: input that was refused before any I/O.

use std::fmt;

/// What kind of [`Error`] happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// An operation id was empty, too long or not printable ASCII.
    InvalidOperationId,
    /// A purpose was empty, too long or used characters outside `[a-z0-9._-]`.
    InvalidPurpose,
    /// A resource digest was not of the form `sha256:<64 lowercase hex digits>`.
    InvalidResourceDigest,
    /// A TTL was zero, not a whole number of milliseconds at least 1 ms, above the maximum,
    /// or not above the drift budget it would be reduced by.
    InvalidTtl,
    /// A wait timeout was above the maximum.
    InvalidWaitTimeout,
    /// A minimum hold was not a whole number of milliseconds, or above the maximum TTL.
    InvalidMinHold,
    /// A semaphore's capacity was 0 or above [`MAX_CAPACITY`](crate::request::MAX_CAPACITY).
    InvalidCapacity,
    /// A holder name was empty, too long, or held a control or invisible character.
    InvalidHolderName,
    /// A drift budget was out of its documented bounds.
    InvalidDriftBudget,
    /// A setting (namespace, key version, timeout, limit…) was out of its documented bounds,
    /// or settings do not fit together or with the lease they are used for (keep-alive).
    InvalidSetting,
    /// A record name (for a fenced write) was empty, too long or used characters outside
    /// `[a-z0-9._-]`.
    InvalidRecordName,
    /// The operating system's random number generator could not produce an owner token.
    Entropy,
    /// The watchdog already keeps as many leases as it was built for.
    WatchdogFull,
    /// The watchdog's leases already need as many renewals per second as it admits: three
    /// quarters of the capacity it measured (or assumed, before it has measured). Keeping
    /// more would risk losing leases it already keeps; try again later, or on another
    /// process.
    WatchdogOverloaded,
}

/// Input refused before any I/O, or a local resource (entropy) that was not available.
///
/// Nothing was sent to any server when this error is returned, so nothing stored there was
/// changed by the call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    /// Makes an error of `kind` with a human-readable explanation.
    ///
    /// The message must never contain an owner token or a credential.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Returns what kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Returns true if and only if the input itself was refused (as opposed to a local
    /// resource being unavailable); retrying the same input will fail the same way.
    pub fn is_invalid_input(&self) -> bool {
        !matches!(
            self.kind,
            ErrorKind::Entropy | ErrorKind::WatchdogFull | ErrorKind::WatchdogOverloaded
        )
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            ErrorKind::InvalidOperationId => "invalid operation id",
            ErrorKind::InvalidPurpose => "invalid purpose",
            ErrorKind::InvalidResourceDigest => "invalid resource digest",
            ErrorKind::InvalidTtl => "invalid TTL",
            ErrorKind::InvalidWaitTimeout => "invalid wait timeout",
            ErrorKind::InvalidMinHold => "invalid minimum hold",
            ErrorKind::InvalidCapacity => "invalid capacity",
            ErrorKind::InvalidHolderName => "invalid holder name",
            ErrorKind::InvalidDriftBudget => "invalid drift budget",
            ErrorKind::InvalidSetting => "invalid setting",
            ErrorKind::InvalidRecordName => "invalid record name",
            ErrorKind::Entropy => "no entropy",
            ErrorKind::WatchdogFull => "watchdog full",
            ErrorKind::WatchdogOverloaded => "watchdog overloaded",
        };
        f.write_str(text)
    }
}
