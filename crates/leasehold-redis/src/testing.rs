//! Helpers for the crate's own tests (the integration tests have theirs in `tests/common`).

use std::time::{Duration, Instant};

/// Looks every 10 ms until `done`, and panics naming `what` if it is not within `within`.
pub(crate) async fn eventually(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
