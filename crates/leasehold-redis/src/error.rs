//! The crate's error type: what can go wrong while setting a backend up.
//!
//! Lease operations never return it: they report typed outcomes (`Contended`,
//! `Indeterminate`, `Unavailable`, …) through the port. [`Error`] is for the steps before any
//! lease exists: parsing a URL, choosing a topology, warming up.

use leasehold::{Failure, Indeterminate, IndeterminateCause, Unavailable};

/// What kind of [`Error`] happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The connection URL could not be parsed.
    InvalidUrl,
    /// The server could not be reached, or refused before running anything.
    Unavailable,
    /// A command was sent and its outcome is unknown.
    Indeterminate,
    /// The settings ask for something this topology cannot do.
    Unsupported,
    /// A setting in a `RedisConfig` (feature `serde`) is out of its range.
    InvalidSetting,
}

/// An error from setting up the backend (leases themselves report typed outcomes instead).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The connection URL could not be parsed. The URL is not repeated, so that a password in
    /// it cannot leak.
    #[error("invalid Redis URL: {0}")]
    InvalidUrl(String),
    /// Definitely not done.
    #[error("{0}")]
    Unavailable(Unavailable),
    /// Sent, outcome unknown.
    #[error("{0}")]
    Indeterminate(Indeterminate),
    /// The settings ask for something this topology cannot do.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A setting in a `RedisConfig` (feature `serde`) is out of its range (what the
    /// [`crate::RedisSettings`] setter refused).
    #[error("invalid setting: {0}")]
    InvalidSetting(String),
}

impl Error {
    /// Returns what kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidUrl(_) => ErrorKind::InvalidUrl,
            Error::Unavailable(_) => ErrorKind::Unavailable,
            Error::Indeterminate(_) => ErrorKind::Indeterminate,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::InvalidSetting(_) => ErrorKind::InvalidSetting,
        }
    }

    /// Returns true if and only if trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self,
            Error::InvalidUrl(_) | Error::Unsupported(_) | Error::InvalidSetting(_)
        )
    }
}

impl From<Failure> for Error {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Indeterminate(i) => Error::Indeterminate(i),
            Failure::Unavailable(u) => Error::Unavailable(u),
            Failure::Overloaded => Error::Unavailable(Unavailable::new(
                leasehold::UnavailableCause::NotConnected,
                "in-flight limit reached",
            )),
            _ => Error::Indeterminate(Indeterminate::new(
                IndeterminateCause::UnexpectedReply,
                "unknown failure",
            )),
        }
    }
}
