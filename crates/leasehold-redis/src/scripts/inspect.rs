//! The call of `lua/inspect.lua`.

use leasehold::InspectOutcome;
use redis::Value;

use crate::decode::{self, UnexpectedReply};

script_call! {
    /// Reads the lease without changing anything. `owner_token` and `operation_id` are both
    /// `""` to inspect without an attempt. `mark` is for the script's watch form only
    /// ([`WatchCall`](super::WatchCall)): this form may not write, and is sent without it.
    struct InspectCall<'a> runs "inspect" {
        KEYS { lease_key, fence_counter_key }
        ARGV { owner_token: &'a str, operation_id: &'a str }
        OPTIONAL { mark: bool }
    }
}

impl InspectCall<'_> {
    /// Decodes the script's reply.
    pub(crate) fn decode(value: &Value) -> Result<InspectOutcome, UnexpectedReply> {
        decode::inspect(value)
    }
}
