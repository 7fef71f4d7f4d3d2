//! Fenced writes for data kept in Redis: the effect point that rejects a stale holder.
//!
//! A lease alone cannot stop a holder that was paused past its TTL from writing after a new
//! holder was granted. A fenced write can: [`RedisBackend::fenced_write`](crate::RedisBackend::fenced_write) stores a value in a
//! record next to the lease (same hash slot) only if no write with a higher fence was accepted
//! before, atomically in one script. The new holder's first write raises the record's fence,
//! and from then on the old holder's writes are refused as [`FencedWrite::Stale`].

use std::fmt;

use leasehold::{Error, ErrorKind, Failure, FenceToken};

/// The longest record name, in bytes.
pub const MAX_RECORD_NAME_LEN: usize = 64;

/// The name of a fenced record of a resource: `[a-z0-9._-]{1,64}`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RecordName(String);

impl RecordName {
    /// Validates `name`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidRecordName`] unless it is 1 to [`MAX_RECORD_NAME_LEN`] bytes of
    /// `a-z`, `0-9`, `.`, `_` or `-`.
    pub fn new(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        let charset_ok = name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if name.is_empty() || name.len() > MAX_RECORD_NAME_LEN || !charset_ok {
            return Err(Error::new(
                ErrorKind::InvalidRecordName,
                format!("must match [a-z0-9._-]{{1,{MAX_RECORD_NAME_LEN}}}"),
            ));
        }
        Ok(Self(name))
    }

    /// Returns the name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RecordName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RecordName({:?})", self.0)
    }
}

impl fmt::Display for RecordName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The outcome of a fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a fenced write may have been refused as stale, or be indeterminate"]
pub enum FencedWrite {
    /// Stored: no higher fence had written the record.
    Written,
    /// Refused, nothing changed: a write with a higher fence was accepted before — the
    /// writer's lease was granted to someone else since.
    Stale {
        /// The fence of the record's last accepted write.
        current: FenceToken,
    },
    /// Not written, or sent with an unknown outcome, or refused locally.
    Failed(Failure),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated_before_any_io() {
        for bad in ["", "A", "a b", "{x}", "a:b", &"n".repeat(65)] {
            assert_eq!(
                RecordName::new(bad).unwrap_err().kind(),
                ErrorKind::InvalidRecordName,
                "{bad:?}"
            );
        }
        assert_eq!(
            RecordName::new("orders.v2-1_x").unwrap().as_str(),
            "orders.v2-1_x"
        );
    }
}
