//! Faults injected into one client's next calls: requests and replies lost, delayed, or
//! arriving after the client gave up.
//!
//! Server-wide faults (clock steps, restarts, lossy failovers) are methods of
//! [`SimServer`](crate::SimServer); these act on one connection ([`SimBackend::inject`]).
//!
//! [`SimBackend::inject`]: crate::SimBackend::inject

use std::time::Duration;

/// A fault injected into a client's next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The request is lost before the server applies it; the client times out.
    LoseRequest,
    /// The server applies the request and the reply is lost; the client times out.
    LoseReply,
    /// The request reaches the server after this delay (shorter than the command timeout).
    DelayRequest(Duration),
    /// The reply reaches the client after this delay (shorter than the command timeout).
    DelayReply(Duration),
    /// The client times out, and the request reaches the server this long after it was sent
    /// (longer than the command timeout): applied when the world clock gets there.
    LateRequest(Duration),
}
