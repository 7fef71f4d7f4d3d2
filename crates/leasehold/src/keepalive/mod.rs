//! Keep-alive: leases renewed automatically, and work told to stop *before* a lease can be lost.
//!
//! A [`Watchdog`] renews every lease registered with it at a cadence (TTL / 3 by default).
//! Each kept lease has a [`LossSignal`], modelled on `CancellationToken::cancelled()`, that
//! fires once with a [`LossReason`]: at once on a definite loss (the server says another grant
//! holds the key or it is gone, or the lease was released), and — while renewals fail or are
//! indeterminate — as soon as the remaining validity falls to a safety margin, which is before
//! the server's key could expire and be granted to anyone else. Validity only ever comes from
//! confirmed renewals, counted from before they were sent, so a starved runtime can make the
//! signal fire late but can never extend a lease.
//!
//! # How it runs
//!
//! One task per watchdog keeps all of its leases; a kept lease is an entry in a map and one
//! slot in a timer wheel ([`DelayQueue`]), not a task. The slot holds the next instant that
//! matters to the lease:
//!
//! - while it waits, its next renewal: a cadence after the last confirmation, or a retry
//!   interval (cadence / 4) after a failed renewal — but never later than a retry interval
//!   before its *margin point*, the instant its remaining validity falls to the margin, so
//!   that every renewal has at least that long to be answered before the signal would fire;
//! - while a renewal is due (queued for a send slot, or being sent), the margin point, set
//!   once when the renewal comes due.
//!
//! So the signal fires at the margin point when the last renewal failed, and also when a
//! renewal is still queued or unanswered then, without waiting for the backend to give up. A
//! task that wakes past the margin point (a starved runtime) fires the signal at once, and so
//! does a lease kept with no more than the margin left: nothing sent then could be confirmed
//! in time. After a failure, a retry follows a retry interval later, as long as it can still
//! be sent a retry interval before the margin point; after that the signal waits for the
//! margin point. A lease found with no validity left at all fires [`LossReason::Expired`].
//!
//! Due renewals are sent concurrently, at most [`KeepAliveSettings::with_max_in_flight`] at
//! once and the rest in the order they came due, so that they pipeline over the backend's
//! multiplexed connection. A renewal's future is allocated when it is sent and freed when it
//! completes: between renewals a lease costs the watchdog a map entry, a wheel slot and its
//! [`LossSignal`] (about 350 bytes with its [`KeptLease`], as measured by the bench).
//!
//! Dropping a [`KeptLease`] stops its renewals and fires its signal
//! ([`LossReason::Dropped`]); [`KeptLease::release`] stops them and releases, and the signal
//! then says how the release went.
//!
//! The timer wheel runs on tokio's clock, which stops while the system is suspended, while
//! validity is counted on the handle's clock ([`BootClock`](crate::BootClock) counts through
//! a suspend): after a suspend the signal can come late, by up to a cadence after the resume,
//! but validity is never overstated.
//!
//! The watchdog is not generic: leases of any backend share its task, each seen through a
//! type-erased view of its handle. A backend that panics while renewing stops only its own
//! lease (its signal fires, [`LossReason::WatchdogStopped`]).
//!
//! [`DelayQueue`]: tokio_util::time::DelayQueue

// One file per concept: the loss signal, the scheduling arithmetic (pure), the public types,
// and the task that keeps the leases.
mod keeper;
mod kept_lease;
mod load;
mod not_kept;
mod schedule;
mod scoped;
mod settings;
mod signal;
mod watchdog;

pub use kept_lease::KeptLease;
pub use not_kept::NotKept;
pub use scoped::{Scoped, Uncovered};
pub use settings::KeepAliveSettings;
pub use signal::{LossReason, LossSignal};
pub use watchdog::Watchdog;
