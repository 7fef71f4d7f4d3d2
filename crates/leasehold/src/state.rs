//! Where a lease handle stands: the states of its state machine.
//!
//! The states live apart from the handle so that outcomes and the backend port can name them
//! without depending on the handle; [`crate::handle`] documents the transitions between them.

use std::fmt;

/// Where a lease handle stands. See [`crate::handle`] for the transition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LeaseState {
    /// Held, and the local validity budget has time left.
    Active,
    /// The local validity budget ran out; the server may or may not still hold the key. A
    /// confirmed renewal can restore `Active`.
    Expired,
    /// The last renew or release had an unknown outcome.
    Unknown,
    /// The server said the grant is gone or held by another. Terminal.
    Lost,
    /// Released (or found already gone on release). Terminal.
    Released,
}

impl LeaseState {
    /// Returns true if and only if no transition leaves this state (`Lost`, `Released`).
    pub fn is_terminal(self) -> bool {
        matches!(self, LeaseState::Lost | LeaseState::Released)
    }
}

impl fmt::Display for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LeaseState::Active => "active",
            LeaseState::Expired => "expired",
            LeaseState::Unknown => "unknown",
            LeaseState::Lost => "lost",
            LeaseState::Released => "released",
        })
    }
}
