//! What a simulated server shows test oracles: the grant it holds for a resource, read without
//! going through a client.

use std::time::Duration;

use leasehold::{FenceToken, HolderFingerprint};

/// The grant a simulated server holds for a resource right now, for test oracles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredGrant {
    /// The grant's fence.
    pub fence: FenceToken,
    /// The holder's fingerprint.
    pub holder: HolderFingerprint,
    /// The holder's operation id.
    pub operation: String,
    /// The key's remaining time to live, by the server's clock.
    pub server_ttl: Duration,
}
