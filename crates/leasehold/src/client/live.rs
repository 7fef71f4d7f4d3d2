//! The grants a client holds handles for, so that a replay joins the existing handle's state.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Weak;

use crate::backend::LeaseBackend;
use crate::fence::FenceToken;
use crate::handle::{LeaseHandle, Shared};
use crate::request::LeaseRequest;

/// The grants this client holds handles for, so that a replay of one of them returns a handle
/// on the same state instead of a second, independent one (which would not learn of the first
/// one's release).
///
/// Keyed by a SHA-256 digest of the exact grant (purpose, resource, owner token, operation,
/// fence): 32 bytes in the table instead of a string of about 150 bytes on the heap, for
/// every lease the client holds. The digest stands for the owner token without revealing it,
/// and a hit is still checked against the handle's own grant, so that even a collision could
/// never join two grants' states.
pub(super) struct LiveGrants<B: LeaseBackend> {
    by_grant: HashMap<GrantKey, Weak<Shared<B>>, BuildHasherDefault<DigestHasher>>,
    sweep_at: usize,
}

/// A SHA-256 digest of an exact grant.
pub(super) type GrantKey = [u8; 32];

/// Hashes a [`GrantKey`] by its first eight bytes. The key is already a SHA-256 digest of
/// input that holds a secret random token, so its bytes are as uniform as any hash's, and no
/// one who cannot see the token can aim keys at one bucket: hashing it again (SipHash, the
/// map's default) would only cost every acquire.
#[derive(Default)]
pub(super) struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn write(&mut self, bytes: &[u8]) {
        // An array is hashed as its length (`write_usize`), then its bytes in one `write`.
        if let Some(head) = bytes.first_chunk::<8>() {
            self.0 ^= u64::from_le_bytes(*head);
        }
    }

    fn write_usize(&mut self, _length: usize) {}

    fn finish(&self) -> u64 {
        self.0
    }
}

fn grant_key(request: &LeaseRequest, fence: FenceToken, slot: Option<u32>) -> GrantKey {
    use sha2::{Digest as _, Sha256};
    let mut digest = Sha256::new();
    // Each variable-length field is prefixed with its length, so that no two different
    // grants are encoded alike.
    for field in [
        request.purpose().as_str(),
        request.resource().as_str(),
        request.attempt().owner_token().expose_secret(),
        request.attempt().operation().as_str(),
    ] {
        digest.update(u64::try_from(field.len()).unwrap_or(u64::MAX).to_be_bytes());
        digest.update(field.as_bytes());
    }
    digest.update(fence.get().to_be_bytes());
    // A lease, a permit and either side of a read/write lease of one name and attempt are
    // different grants; so are a writer and the reader it was downgraded to, which share the
    // attempt and the fence but not the slot.
    digest.update(crate::telemetry::kind_of(request).as_bytes());
    digest.update(slot.map_or(u64::MAX, u64::from).to_be_bytes());
    digest.finalize().into()
}

/// Returns true if and only if `handle` holds exactly the grant `request` was given `fence` for.
fn holds<B: LeaseBackend>(
    handle: &LeaseHandle<B>,
    request: &LeaseRequest,
    fence: FenceToken,
    slot: Option<u32>,
) -> bool {
    let grant = handle.grant();
    grant.fence() == fence
        && grant.slot() == slot
        && grant.purpose() == request.purpose()
        && grant.resource() == request.resource()
        && grant.attempt() == request.attempt()
}

impl<B: LeaseBackend> LiveGrants<B> {
    pub(super) fn new() -> Self {
        Self {
            by_grant: HashMap::default(),
            sweep_at: 64,
        }
    }

    /// Returns a live handle on exactly the grant `request` was given `fence` for, if there is
    /// one, and the grant's key, for [`register`](Self::register) to use without hashing the
    /// grant again.
    pub(super) fn find(
        &self,
        request: &LeaseRequest,
        fence: FenceToken,
        slot: Option<u32>,
    ) -> (Option<LeaseHandle<B>>, GrantKey) {
        let key = grant_key(request, fence, slot);
        let found = self
            .by_grant
            .get(&key)
            .and_then(LeaseHandle::upgrade)
            .filter(|handle| holds(handle, request, fence, slot));
        (found, key)
    }

    /// Records `handle` as the one for the grant whose key [`find`](Self::find) returned, and
    /// now and then forgets the handles that have been dropped.
    pub(super) fn register(&mut self, key: GrantKey, handle: &LeaseHandle<B>) {
        self.by_grant.insert(key, handle.downgrade());
        if self.by_grant.len() >= self.sweep_at {
            self.by_grant.retain(|_, weak| weak.strong_count() > 0);
            self.sweep_at = (self.by_grant.len() * 2).max(64);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::id::{Attempt, OperationId, Purpose, ResourceDigest};
    use crate::request::DriftBudget;
    use FenceToken;

    fn request(operation: &str, attempt: Option<&Attempt>) -> LeaseRequest {
        let operation = OperationId::new(operation).unwrap();
        let attempt = match attempt {
            Some(a) => a.with_operation(operation),
            None => Attempt::new(operation).unwrap(),
        };
        LeaseRequest::new(
            Purpose::new("p").unwrap(),
            ResourceDigest::of("r"),
            attempt,
            Duration::from_secs(3),
            DriftBudget::default(),
        )
        .unwrap()
    }

    #[test]
    fn a_grant_key_hashes_as_its_first_eight_bytes() {
        use std::hash::BuildHasher as _;
        let hashing = BuildHasherDefault::<DigestHasher>::default();
        let mut key: GrantKey = [0; 32];
        key[..8].copy_from_slice(&7u64.to_le_bytes());
        key[8..].fill(0xff);
        assert_eq!(hashing.hash_one(key), 7);
        key[31] = 0;
        assert_eq!(hashing.hash_one(key), 7);
    }

    #[test]
    fn grant_keys_tell_every_field_of_a_grant_apart() {
        let one = request("op", None);
        let fence = FenceToken::new(7).unwrap();
        assert_eq!(
            grant_key(&one, fence, None),
            grant_key(&one.clone(), fence, None)
        );
        // Another fence, another owner token, another operation of the same owner.
        assert_ne!(
            grant_key(&one, fence, None),
            grant_key(&one, FenceToken::new(8).unwrap(), None)
        );
        assert_ne!(
            grant_key(&one, fence, None),
            grant_key(&request("op", None), fence, None)
        );
        let same_owner = request("op2", Some(one.attempt()));
        assert_ne!(
            grant_key(&one, fence, None),
            grant_key(&same_owner, fence, None)
        );
        // Another slot (a writer and the reader it became), another kind (a permit).
        assert_ne!(
            grant_key(&one, fence, None),
            grant_key(&one, fence, Some(0))
        );
        let permit = one.clone().with_capacity(2).unwrap();
        assert_ne!(
            grant_key(&one, fence, Some(0)),
            grant_key(&permit, fence, Some(0))
        );
    }
}
