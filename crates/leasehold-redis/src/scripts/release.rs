//! The call of `lua/release.lua`.

use leasehold::backend::ReleaseReply;
use redis::Value;

use super::GrantArg;
use crate::decode::{self, UnexpectedReply};

script_call! {
    /// Deletes exactly one grant, and announces it on the release channel if someone was
    /// refused it. A grant without a fence releases the attempt's grant whatever its fence
    /// (the cleanup behind an unanswered acquire); `sharded` announces with `SPUBLISH`
    /// (Cluster).
    struct ReleaseCall<'a> runs "release" {
        KEYS { lease_key }
        ARGV {
            grant: GrantArg<'a>,
        }
        OPTIONAL {
            sharded: bool,
        }
    }
}

impl ReleaseCall<'_> {
    /// Decodes the script's reply.
    pub(crate) fn decode(value: &Value) -> Result<ReleaseReply, UnexpectedReply> {
        decode::release(value)
    }
}
