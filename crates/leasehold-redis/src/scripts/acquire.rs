//! The call of `lua/acquire.lua`.

use std::time::Duration;

use leasehold::backend::AcquireReply;
use redis::Value;

use super::AttemptArg;
use crate::decode::{self, UnexpectedReply};

script_call! {
    /// Grants the lease to an attempt, replays the attempt's grant, or says who holds it.
    /// `min_hold_in_milliseconds` is 0 and `holder_name` is `""` for none: the stored value is
    /// then exactly what it was before either option existed. The counter idle expiry comes
    /// first, as in a batch, where every lease of the call shares it.
    struct AcquireCall<'a> runs "acquire" {
        KEYS { lease_key, fence_counter_key }
        ARGV {
            counter_idle_expiry_in_milliseconds: u64,
            attempt: AttemptArg<'a>,
            ttl_in_milliseconds: u64,
        }
        OPTIONAL {
            min_hold_in_milliseconds: u64,
            holder_name: &'a str,
        }
    }
}

impl AcquireCall<'_> {
    /// Decodes the script's reply: a grant has the TTL the script set, `granted_ttl`; a
    /// holder's key without a TTL gets `retry_after_fallback`.
    pub(crate) fn decode(
        value: &Value,
        granted_ttl: Duration,
        retry_after_fallback: Duration,
    ) -> Result<AcquireReply, UnexpectedReply> {
        decode::acquire(value, granted_ttl, retry_after_fallback)
    }
}
