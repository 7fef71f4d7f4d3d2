//! The call of `lua/release.lua`.

use leasehold::FenceToken;
use leasehold::backend::ReleaseReply;
use redis::Value;

use crate::decode::{self, UnexpectedReply};

script_call! {
    /// Deletes exactly one grant and announces it on the release channel. A `fence` of `None`
    /// releases the attempt's grant whatever its fence (the cleanup behind an unanswered
    /// acquire); `sharded` announces with `SPUBLISH` (Cluster).
    struct ReleaseCall<'a> runs "release" {
        KEYS { lease_key, release_channel }
        ARGV {
            owner_token: &'a str,
            operation_id: &'a str,
            fence: Option<FenceToken>,
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
