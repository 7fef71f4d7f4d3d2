//! The call of `lua/fenced_write.lua`.

use leasehold::FenceToken;
use redis::Value;

use crate::decode::{self, UnexpectedReply};
use crate::fenced::FencedWrite;

script_call! {
    /// Stores `value` in a fenced record unless a higher fence wrote it before.
    struct FencedWriteCall<'a> runs "fenced_write" {
        KEYS { record_key }
        ARGV { fence: FenceToken, value: &'a [u8] }
    }
}

impl FencedWriteCall<'_> {
    /// Decodes the script's reply, which never holds the written value.
    pub(crate) fn decode(value: &Value) -> Result<FencedWrite, UnexpectedReply> {
        decode::fenced_write(value)
    }
}
