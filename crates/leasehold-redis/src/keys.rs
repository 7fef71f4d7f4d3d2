//! Key layout: `{namespace}:lease:{version}:{purpose}:{{digest}}` and its `:fence` counter.
//!
//! The digest sits inside a hash tag, so the lease key and its fence counter always share a
//! Cluster slot and one script can touch both. Only validated parts reach a key: the namespace
//! and version have no `:` or braces, the purpose is `[a-z0-9._-]`, and the resource is a
//! digest, so a raw resource id can never reach Redis or inject a hash tag.

use leasehold::{Purpose, ResourceDigest};

use crate::settings::RedisSettings;

/// What a lease key's fence counter and release channel append to it.
pub(crate) const FENCE_SUFFIX: &str = ":fence";
pub(crate) const RELEASED_SUFFIX: &str = ":released";

/// Builds the keys for a namespace and key version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: String,
    semaphore_prefix: String,
    rw_prefix: String,
}

/// The keys of one semaphore, all under its digest's hash tag (one Cluster slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreKeys {
    /// `<base>:capacity`: `"<capacity> <width>"`, recorded on first use.
    pub capacity: String,
    /// `<base>:fence`: the fence counter of every slot.
    pub fence_counter: String,
    /// `<base>:queue`: waiters by arrival.
    pub queue: String,
    /// `<base>:alive`: waiters by the time their place lapses.
    pub heartbeats: String,
    /// `<base>:slot:`: slot k's key is this and k.
    pub slot_prefix: String,
    /// `<base>:released`: the channel releases are announced on while someone waits.
    pub channel: String,
    /// `<base>:writers`: a read/write lease's waiting writers (no semaphore has one).
    pub writers: String,
}

impl SemaphoreKeys {
    /// Returns slot `slot`'s key.
    pub fn slot(&self, slot: u32) -> String {
        format!("{}{slot}", self.slot_prefix)
    }

    /// Returns a read/write lease's writer key: the slot `w`.
    pub fn writer(&self) -> String {
        format!("{}w", self.slot_prefix)
    }

    /// Returns the key of the fenced record `name` of `slot`: each slot's record keeps the
    /// highest fence written through that slot.
    pub fn record(&self, slot: u32, name: &crate::fenced::RecordName) -> String {
        format!("{}{slot}:record:{}", self.slot_prefix, name.as_str())
    }
}

impl KeyLayout {
    /// Makes the layout of `settings`.
    pub fn new(settings: &RedisSettings) -> Self {
        Self {
            prefix: format!("{}:lease:{}:", settings.namespace(), settings.key_version()),
            semaphore_prefix: format!("{}:sem:{}:", settings.namespace(), settings.key_version()),
            rw_prefix: format!("{}:rw:{}:", settings.namespace(), settings.key_version()),
        }
    }

    /// Returns the keys of the read/write lease on `resource` for `purpose`:
    /// `{namespace}:rw:{version}:{purpose}:{{digest}}` and a suffix each (readers are its
    /// slots, the writer its slot `w`), apart from every lease and semaphore key.
    pub fn read_write(&self, purpose: &Purpose, resource: &ResourceDigest) -> SemaphoreKeys {
        Self::queued(&self.rw_prefix, purpose, resource)
    }

    /// Returns the keys of the semaphore on `resource` for `purpose`:
    /// `{namespace}:sem:{version}:{purpose}:{{digest}}` and a suffix each. A semaphore and
    /// a lease of one name never share a key.
    pub fn semaphore(&self, purpose: &Purpose, resource: &ResourceDigest) -> SemaphoreKeys {
        Self::queued(&self.semaphore_prefix, purpose, resource)
    }

    fn queued(prefix: &str, purpose: &Purpose, resource: &ResourceDigest) -> SemaphoreKeys {
        let base = format!("{}{}:{{{}}}", prefix, purpose.as_str(), resource.as_str());
        SemaphoreKeys {
            capacity: joined(&base, ":capacity"),
            fence_counter: joined(&base, FENCE_SUFFIX),
            queue: joined(&base, ":queue"),
            heartbeats: joined(&base, ":alive"),
            slot_prefix: joined(&base, ":slot:"),
            channel: joined(&base, RELEASED_SUFFIX),
            writers: joined(&base, ":writers"),
        }
    }

    /// Returns the `SCAN MATCH` pattern of every key of every semaphore in this layout.
    pub fn semaphore_pattern(&self) -> String {
        format!("{}*", self.semaphore_prefix)
    }

    /// Returns the `SCAN MATCH` pattern of every key of every read/write lease in this
    /// layout.
    pub fn read_write_pattern(&self) -> String {
        format!("{}*", self.rw_prefix)
    }

    /// Returns the lease key for `purpose` and `resource`.
    pub fn lease_key(&self, purpose: &Purpose, resource: &ResourceDigest) -> String {
        // Built by hand, sized once: this runs on every lease operation.
        let (purpose, resource) = (purpose.as_str(), resource.as_str());
        let mut key = String::with_capacity(self.prefix.len() + purpose.len() + resource.len() + 3);
        key.push_str(&self.prefix);
        key.push_str(purpose);
        key.push_str(":{");
        key.push_str(resource);
        key.push('}');
        key
    }

    /// Returns the fence counter key of the lease key `lease_key`, without building the lease
    /// key again.
    pub(crate) fn fence_key_of(lease_key: &str) -> String {
        joined(lease_key, FENCE_SUFFIX)
    }

    /// Returns the release channel of the lease key `lease_key`, without building the lease
    /// key again.
    pub(crate) fn release_channel_of(lease_key: &str) -> String {
        joined(lease_key, RELEASED_SUFFIX)
    }

    /// Returns the `SCAN MATCH` pattern of every lease key in this layout, or of `purpose`'s
    /// only. No part needs escaping: namespace, version and purpose have no glob characters.
    pub fn lease_pattern(&self, purpose: Option<&Purpose>) -> String {
        match purpose {
            Some(purpose) => format!("{}{}:{{sha256:*}}", self.prefix, purpose),
            None => format!("{}*:{{sha256:*}}", self.prefix),
        }
    }

    /// Reads a lease key of this layout back into its purpose and resource digest; `None` for
    /// any other key (a fence counter, a record, another layout's key).
    pub fn parse_lease_key(&self, key: &str) -> Option<(Purpose, ResourceDigest)> {
        let rest = key.strip_prefix(&self.prefix)?;
        let (purpose, tagged) = rest.split_once(":{")?;
        let digest = tagged.strip_suffix('}')?;
        let purpose = Purpose::new(purpose).ok()?;
        let digest = ResourceDigest::parse(digest).ok()?;
        // Only the exact key this layout would build: nothing after the tag.
        (self.lease_key(&purpose, &digest) == key).then_some((purpose, digest))
    }

    /// Returns the channel releases of `resource` are announced on (same hash slot).
    pub fn release_channel(&self, purpose: &Purpose, resource: &ResourceDigest) -> String {
        Self::release_channel_of(&self.lease_key(purpose, resource))
    }

    /// Returns the key of the fenced record `name` of `resource` (same hash slot).
    pub fn record_key(
        &self,
        purpose: &Purpose,
        resource: &ResourceDigest,
        name: &crate::fenced::RecordName,
    ) -> String {
        let mut key = self.lease_key(purpose, resource);
        key.push_str(":record:");
        key.push_str(name.as_str());
        key
    }

    /// Returns the fencing counter key for `purpose` and `resource` (same hash slot).
    pub fn fence_key(&self, purpose: &Purpose, resource: &ResourceDigest) -> String {
        Self::fence_key_of(&self.lease_key(purpose, resource))
    }
}

/// `key` with `suffix` appended, in one allocation.
fn joined(key: &str, suffix: &str) -> String {
    let mut joined = String::with_capacity(key.len() + suffix.len());
    joined.push_str(key);
    joined.push_str(suffix);
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_layout_and_share_a_hash_tag() {
        let layout = KeyLayout::new(&RedisSettings::default());
        let purpose = Purpose::new("billing").unwrap();
        let digest = ResourceDigest::of("orders/42");
        let lease = layout.lease_key(&purpose, &digest);
        assert_eq!(lease, format!("leasehold:lease:v1:billing:{{{digest}}}"));
        assert_eq!(
            layout.fence_key(&purpose, &digest),
            format!("{lease}:fence")
        );
        let tag = |key: &str| {
            let open = key.find('{').unwrap();
            let close = open + key[open..].find('}').unwrap();
            key[open..=close].to_owned()
        };
        assert_eq!(tag(&lease), format!("{{{digest}}}"));
        assert_eq!(tag(&layout.fence_key(&purpose, &digest)), tag(&lease));
        assert!(!lease.contains("orders/42"));
    }

    #[test]
    fn a_semaphores_keys_share_one_hash_tag_and_no_lease_key() {
        let layout = KeyLayout::new(&RedisSettings::default());
        let purpose = Purpose::new("exports").unwrap();
        let digest = ResourceDigest::of("api");
        let keys = layout.semaphore(&purpose, &digest);
        let tag = format!("{{{digest}}}");
        for key in [
            &keys.capacity,
            &keys.fence_counter,
            &keys.queue,
            &keys.heartbeats,
            &keys.slot(3),
            &keys.channel,
        ] {
            assert!(key.starts_with("leasehold:sem:v1:exports:"), "{key}");
            assert_eq!(key.matches('{').count(), 1, "{key}");
            assert!(key.contains(&tag), "{key}");
            assert_eq!(layout.parse_lease_key(key), None, "{key}");
        }
        assert_eq!(keys.slot(3), format!("{}3", keys.slot_prefix));
        assert_ne!(keys.fence_counter, layout.fence_key(&purpose, &digest));
    }

    #[test]
    fn a_lease_key_reads_back_and_no_other_key_does() {
        let layout = KeyLayout::new(&RedisSettings::default());
        let purpose = Purpose::new("billing").unwrap();
        let digest = ResourceDigest::of("orders/42");
        let lease = layout.lease_key(&purpose, &digest);
        assert_eq!(
            layout.parse_lease_key(&lease),
            Some((purpose.clone(), digest.clone()))
        );
        let name = crate::fenced::RecordName::new("state").unwrap();
        for other in [
            layout.fence_key(&purpose, &digest),
            layout.record_key(&purpose, &digest, &name),
            lease.replace("leasehold:", "other:"),
            lease.replace("sha256:", "md5:"),
            format!("{lease}x"),
            "leasehold:lease:v1:Bad:{sha256:00}".to_owned(),
        ] {
            assert_eq!(layout.parse_lease_key(&other), None, "{other}");
        }
        assert_eq!(
            layout.lease_pattern(Some(&purpose)),
            "leasehold:lease:v1:billing:{sha256:*}"
        );
        assert_eq!(
            layout.lease_pattern(None),
            "leasehold:lease:v1:*:{sha256:*}"
        );
    }
}
