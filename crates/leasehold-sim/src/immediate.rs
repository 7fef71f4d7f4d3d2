//! Running a simulated call to completion at once, without a runtime.
//!
//! On a manual world clock nothing waits, so a whole scenario can run in one synchronous step
//! function: each call is polled once, with a waker that is never woken.

/// Polls a future that must complete at once (every simulated call on a manual world clock
/// does).
///
/// # Panics
///
/// If the future is not ready on its first poll.
pub fn run_now<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("a simulated call waited; simulated calls never wait"),
    }
}
