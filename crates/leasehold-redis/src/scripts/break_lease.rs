//! The call of `lua/break.lua`.

use leasehold::InspectOutcome;
use redis::Value;

use crate::decode::{self, UnexpectedReply};

script_call! {
    /// Deletes the lease key whoever holds it (the fence counter stays) and announces the
    /// removal on the release channel; `sharded` announces with `SPUBLISH` (Cluster).
    struct BreakCall runs "break" {
        KEYS { lease_key, release_channel }
        ARGV { sharded: bool }
    }
}

impl BreakCall {
    /// Decodes the script's reply: what was removed, in inspect's shape (`Free`: nothing).
    pub(crate) fn decode(value: &Value) -> Result<InspectOutcome, UnexpectedReply> {
        decode::inspect(value)
    }
}
