//! A lease the watchdog would not keep, given back to its caller.

use std::fmt;

use crate::backend::LeaseBackend;
use crate::error::Error;
use crate::handle::LeaseHandle;

/// Why [`Watchdog::keep`](super::Watchdog::keep) refused a lease, with the lease given back:
/// it is still held, and the caller decides whether to release it.
///
/// An error like any other (`Display`, `source()`), so `?` works; the handle comes back with
/// [`into_parts`](Self::into_parts) or [`into_handle`](Self::into_handle).
#[must_use = "the lease is still held; release it or keep it another way"]
pub struct NotKept<B: LeaseBackend> {
    error: Error,
    handle: LeaseHandle<B>,
}

impl<B: LeaseBackend> NotKept<B> {
    pub(super) fn new(error: Error, handle: LeaseHandle<B>) -> Self {
        Self { error, handle }
    }

    /// Returns why the lease was not kept.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// Returns the error and the handle, still held.
    pub fn into_parts(self) -> (Error, LeaseHandle<B>) {
        (self.error, self.handle)
    }

    /// Returns the handle, still held.
    pub fn into_handle(self) -> LeaseHandle<B> {
        self.handle
    }
}

impl<B: LeaseBackend> fmt::Debug for NotKept<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotKept")
            .field("error", &self.error)
            .field("handle", &self.handle)
            .finish()
    }
}

impl<B: LeaseBackend> fmt::Display for NotKept<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the lease was not kept alive: {}", self.error)
    }
}

impl<B: LeaseBackend> std::error::Error for NotKept<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<B: LeaseBackend> From<NotKept<B>> for Error {
    /// Keeps the error and drops the handle: the lease stays held until its TTL.
    fn from(not_kept: NotKept<B>) -> Self {
        not_kept.error
    }
}
