//! What a simulated server shows test oracles: the grant it holds for a resource, read without
//! going through a client, and any renewal or release it let through for someone else.

use std::fmt;
use std::time::Duration;

use leasehold::{FenceToken, HolderFingerprint};

use crate::RequestKind;

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

/// A renewal or release that succeeded for a requester other than the exact stored holder:
/// what the server records so that invariant I1 can be checked
/// ([`Invariant::OnlyTheHolderRenewsOrReleases`](crate::Invariant::OnlyTheHolderRenewsOrReleases)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NonOwnerSuccess {
    /// What succeeded: [`RequestKind::Renew`] or [`RequestKind::Release`].
    pub request: RequestKind,
    /// The fence the requester named.
    pub fence: u64,
    /// The fence the server held.
    pub stored_fence: u64,
}

impl fmt::Display for NonOwnerSuccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.request {
            RequestKind::Renew => "renew",
            RequestKind::Release => "release",
            RequestKind::Acquire => "acquire",
            RequestKind::Inspect => "inspect",
        };
        write!(
            f,
            "{what} succeeded for fence {} while fence {} was stored",
            self.fence, self.stored_fence
        )
    }
}
