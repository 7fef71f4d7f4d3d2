//! The call of `lua/renew.lua`.

use leasehold::FenceToken;
use leasehold::backend::RenewReply;
use redis::Value;

use crate::decode::{self, UnexpectedReply};

script_call! {
    /// Sets the TTL of exactly one grant again.
    struct RenewCall<'a> runs "renew" {
        KEYS { lease_key }
        ARGV {
            owner_token: &'a str,
            operation_id: &'a str,
            fence: FenceToken,
            ttl_in_milliseconds: u64,
        }
    }
}

impl RenewCall<'_> {
    /// Decodes the script's reply.
    pub(crate) fn decode(value: &Value) -> Result<RenewReply, UnexpectedReply> {
        decode::renew(value)
    }
}
