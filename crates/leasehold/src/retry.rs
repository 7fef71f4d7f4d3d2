//! The one pause policy of the crate's retry loops.
//!
//! A try without a definite answer — a refused connection, a full in-flight limit, an
//! unanswered command being replayed, a release that did not get through — is tried again
//! after a pause: 20 ms first, doubling up to 1 s, so that a server that fails fast is not
//! hammered in a tight loop, and one that is back soon is reached soon. A pause never runs
//! past the caller's deadline: the last try goes at the deadline, so a server back just then is
//! still reached. The acquire (`lock`), its replays (`resolve`), the cleanup behind it
//! (`abandon`), the waiting acquire's replays and an election's rounds all pause by it.

use std::time::Duration;

use tokio::time::Instant;

/// The pauses between the tries of one retry loop.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    /// The first pause.
    pub(crate) const FIRST: Duration = Duration::from_millis(20);
    /// The longest pause.
    pub(crate) const MAX: Duration = Duration::from_secs(1);

    /// A loop's pauses, from the first.
    pub(crate) fn new() -> Self {
        Self { next: Self::FIRST }
    }

    /// Sleeps for the next pause, but not past `deadline`, and doubles the one after.
    pub(crate) async fn pause(&mut self, deadline: Option<Instant>) {
        let wake = Instant::now() + self.next;
        tokio::time::sleep_until(deadline.map_or(wake, |deadline| wake.min(deadline))).await;
        self.next = (self.next * 2).min(Self::MAX);
    }

    /// Starts again from the first pause (after a definite answer).
    pub(crate) fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pauses_double_up_to_a_second_and_stop_at_the_deadline() {
        let mut backoff = Backoff::new();
        let start = Instant::now();
        let mut at = Vec::new();
        for _ in 0..8 {
            backoff.pause(None).await;
            at.push(start.elapsed().as_millis());
        }
        // 20, 40, 80, 160, 320, 640, then 1,000 each.
        assert_eq!(at, [20, 60, 140, 300, 620, 1_260, 2_260, 3_260]);
        // A deadline cuts a pause short.
        let deadline = Instant::now() + Duration::from_millis(300);
        backoff.pause(Some(deadline)).await;
        assert_eq!(Instant::now(), deadline);
        backoff.reset();
        let before = Instant::now();
        backoff.pause(None).await;
        assert_eq!(before.elapsed(), Backoff::FIRST);
    }
}
