//! The calls of `lua/semaphore_acquire.lua` and `lua/semaphore_release.lua`.

use std::time::Duration;

use leasehold::backend::{AcquireReply, DowngradeReply, ReleaseReply};
use redis::Value;

use super::{AttemptArg, GrantArg};
use crate::decode::{self, UnexpectedReply};

script_call! {
    /// Grants one of the semaphore's slots to an attempt, first come first served, replays
    /// the attempt's grant, or keeps the attempt's place in the queue.
    struct SemaphoreAcquireCall<'a> runs "semaphore_acquire" {
        KEYS { capacity_key, fence_counter_key, queue_key, heartbeat_key, slot_key_prefix }
        ARGV {
            attempt: AttemptArg<'a>,
            ttl_in_milliseconds: u64,
            capacity: u64,
            queue_heartbeat_in_milliseconds: u64,
            idle_expiry_in_milliseconds: u64,
        }
        OPTIONAL {
            min_hold_in_milliseconds: u64,
            holder_name: &'a str,
        }
    }
}

impl SemaphoreAcquireCall<'_> {
    /// Decodes the script's reply: a grant has the TTL the script set, `granted_ttl`.
    pub(crate) fn decode(
        value: &Value,
        granted_ttl: Duration,
    ) -> Result<AcquireReply, UnexpectedReply> {
        decode::semaphore_acquire(value, granted_ttl)
    }
}

script_call! {
    /// Releases one permit (a grant with its slot), or whatever slot an attempt holds and
    /// its place in the queue (a grant without a fence, and `slot` empty); announces the
    /// release if someone waits.
    struct SemaphoreReleaseCall<'a> runs "semaphore_release" {
        KEYS { capacity_key, queue_key, heartbeat_key, slot_key_prefix, writers_key }
        ARGV {
            grant: GrantArg<'a>,
            slot: &'a str,
            capacity: u64,
            channel: &'a str,
            sharded: bool,
            writer: bool,
        }
    }
}

impl SemaphoreReleaseCall<'_> {
    /// Decodes the script's reply.
    pub(crate) fn decode(value: &Value) -> Result<ReleaseReply, UnexpectedReply> {
        decode::release(value)
    }
}

script_call! {
    /// Grants one side of a read/write lease (many readers or one writer, writers
    /// preferred), replays the attempt's grant, or keeps its place in the queue.
    struct RwAcquireCall<'a> runs "rw_acquire" {
        KEYS {
            writer_key, fence_counter_key, queue_key, heartbeat_key, writers_key,
            slot_key_prefix,
        }
        ARGV {
            attempt: AttemptArg<'a>,
            ttl_in_milliseconds: u64,
            mode: &'a str,
            queue_heartbeat_in_milliseconds: u64,
            idle_expiry_in_milliseconds: u64,
        }
        OPTIONAL {
            holder_name: &'a str,
        }
    }
}

script_call! {
    /// Turns the writer's grant into a reader's, with the same fence, in one step.
    struct RwDowngradeCall<'a> runs "rw_downgrade" {
        KEYS { writer_key, queue_key, slot_key_prefix }
        ARGV {
            grant: GrantArg<'a>,
            ttl_in_milliseconds: u64,
            channel: &'a str,
            sharded: bool,
        }
    }
}

impl RwDowngradeCall<'_> {
    /// Decodes the script's reply: the reader's grant has the TTL the script set.
    pub(crate) fn decode(
        value: &Value,
        granted_ttl: Duration,
    ) -> Result<DowngradeReply, UnexpectedReply> {
        decode::downgrade(value, granted_ttl)
    }
}
