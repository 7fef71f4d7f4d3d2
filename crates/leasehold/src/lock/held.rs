//! What work run under a lease sees of it.

use std::fmt;
use std::time::Duration;

use super::guard::LeaseGuard;
use crate::backend::LeaseBackend;
use crate::fence::FenceToken;
use crate::handle::LeaseHandle;
use crate::keepalive::{LossReason, LossSignal};

/// The lease that work run by [`LockBuilder::run`](super::LockBuilder::run) runs under: its
/// fence, its loss signal and its remaining validity. Cheap to clone.
///
/// It cannot release or renew the lease: `run` owns both.
pub struct HeldLease<B: LeaseBackend> {
    handle: LeaseHandle<B>,
    signal: LossSignal,
}

impl<B: LeaseBackend> Clone for HeldLease<B> {
    fn clone(&self) -> Self {
        Self {
            handle: self.handle.share(),
            signal: self.signal.clone(),
        }
    }
}

impl<B: LeaseBackend> fmt::Debug for HeldLease<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLease")
            .field("fence", &self.handle.fence())
            .field("lost", &self.signal.reason())
            .finish_non_exhaustive()
    }
}

impl<B: LeaseBackend> HeldLease<B> {
    pub(crate) fn new(guard: &LeaseGuard<B>) -> Self {
        Self {
            handle: guard.handle().share(),
            signal: guard.signal().clone(),
        }
    }

    /// Returns the grant's fencing token: pass it to every write the work makes.
    pub fn fence(&self) -> FenceToken {
        self.handle.fence()
    }

    /// Returns the semaphore slot of a permit, `None` for a lease (see
    /// [`LeaseGuard::slot`](crate::LeaseGuard::slot)).
    pub fn slot(&self) -> Option<u32> {
        self.handle.slot()
    }

    /// Returns how long the lease is still known to be valid (zero once it is not).
    pub fn remaining_validity(&self) -> Duration {
        self.handle.remaining_validity()
    }

    /// Returns the loss signal.
    pub fn signal(&self) -> &LossSignal {
        &self.signal
    }

    /// Returns true if and only if the loss signal has fired.
    pub fn is_lost(&self) -> bool {
        self.signal.is_lost()
    }

    /// Waits until the loss signal fires and returns why.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lost(&self) -> LossReason {
        self.signal.lost().await
    }
}
