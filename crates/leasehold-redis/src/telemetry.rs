//! The Redis backend's own metrics (with the `metrics` feature), under the names in
//! [`leasehold::telemetry::names`]: commands in flight, and reconnects of the release-notice
//! subscriber. Without the feature, nothing here records anything.

#[cfg(feature = "metrics")]
use leasehold::telemetry::names;

/// Counts one command in flight while it lives.
#[derive(Debug)]
pub(crate) struct InFlight {
    #[cfg(feature = "metrics")]
    gauge: metrics::Gauge,
}

impl InFlight {
    /// One more command in flight, until dropped.
    pub(crate) fn start() -> Self {
        #[cfg(feature = "metrics")]
        {
            let gauge = metrics::gauge!(names::REQUESTS_IN_FLIGHT);
            gauge.increment(1.0);
            Self { gauge }
        }
        #[cfg(not(feature = "metrics"))]
        Self {}
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        self.gauge.decrement(1.0);
    }
}

/// Counts a reconnect of the release-notice subscriber.
pub(crate) fn notice_reconnect() {
    #[cfg(feature = "metrics")]
    metrics::counter!(names::NOTICE_RECONNECTS).increment(1);
}
