//! The call of `lua/watch.lua`.

use leasehold::InspectOutcome;
use redis::Value;

use crate::decode::{self, UnexpectedReply};

script_call! {
    /// Reads the lease as an inspection without an attempt does, and marks the grant it finds
    /// so that its release is announced: the read of a reader that then waits for the notice.
    struct WatchCall runs "watch" {
        KEYS { lease_key, fence_counter_key }
    }
}

impl WatchCall {
    /// Decodes the script's reply, which is `inspect.lua`'s without an attempt.
    pub(crate) fn decode(value: &Value) -> Result<InspectOutcome, UnexpectedReply> {
        decode::inspect(value)
    }
}
