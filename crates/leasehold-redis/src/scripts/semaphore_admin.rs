//! The calls of `lua/semaphore_inspect.lua` and `lua/semaphore_capacity.lua`: an operator's
//! view of a semaphore and a change of its capacity.

use leasehold::{Failure, InspectOutcome, LeaseView};
use redis::Value;

use crate::decode::{self, UnexpectedReply};

script_call! {
    /// Reads a semaphore's record, its live waiters and every held slot, changing nothing.
    struct SemaphoreInspectCall runs "semaphore_inspect" {
        KEYS { capacity_key, heartbeat_key, slot_key_prefix }
        ARGV { slot_limit: u64 }
    }
}

/// What `semaphore_inspect.lua` read.
#[derive(Debug)]
pub(crate) enum SemaphoreRead {
    /// No record, no held slot, no waiter.
    Absent,
    /// The record (`capacity` 0 for none), the width, the live waiters and the held slots.
    Found {
        capacity: u32,
        width: u32,
        waiting: u64,
        held: Vec<(u32, LeaseView)>,
    },
    /// A key the script could not use.
    Failed(Failure),
}

impl SemaphoreInspectCall {
    /// Decodes the script's reply.
    pub(crate) fn decode(value: &Value) -> Result<SemaphoreRead, UnexpectedReply> {
        let bad = || decode::unexpected_reply("semaphore_inspect", value);
        let Value::Array(items) = value else {
            return Err(bad());
        };
        match int(items.first()).ok_or_else(bad)? {
            0 => Ok(SemaphoreRead::Absent),
            -2 => decode::unusable(items)
                .map(SemaphoreRead::Failed)
                .ok_or_else(bad),
            1 => {
                let number = |at: usize| {
                    int(items.get(at))
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(bad)
                };
                let (capacity, width) = (number(1)?, number(2)?);
                let waiting = int(items.get(3))
                    .and_then(|n| u64::try_from(n).ok())
                    .ok_or_else(bad)?;
                let mut held = Vec::with_capacity(items.len().saturating_sub(4));
                for entry in &items[4..] {
                    let Value::Array(pair) = entry else {
                        return Err(bad());
                    };
                    let slot = int(pair.first())
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(bad)?;
                    // Each slot's entry is inspect.lua's reply for a lease held by another.
                    let view = match pair.get(1).map(decode::inspect) {
                        Some(Ok(InspectOutcome::HeldByOther(view))) => view,
                        _ => return Err(bad()),
                    };
                    held.push((slot, view));
                }
                Ok(SemaphoreRead::Found {
                    capacity,
                    width,
                    waiting,
                    held,
                })
            }
            _ => Err(bad()),
        }
    }
}

script_call! {
    /// Records a new capacity for a semaphore, its width kept above every held slot, and
    /// announces a growth to its waiters.
    struct SemaphoreCapacityCall<'a> runs "semaphore_capacity" {
        KEYS { capacity_key, queue_key, slot_key_prefix }
        ARGV {
            capacity: u64,
            slot_limit: u64,
            idle_expiry_in_milliseconds: u64,
            channel: &'a str,
            sharded: bool,
        }
    }
}

/// What `semaphore_capacity.lua` did.
#[derive(Debug)]
pub(crate) enum CapacitySet {
    /// Recorded: the capacity before (0 for none), the width now, the slot keys there, and
    /// whether waiters were told.
    Set {
        previous: u32,
        width: u32,
        held: u32,
        announced: bool,
    },
    /// Nothing written: a key is not leasehold's.
    Failed(Failure),
}

impl SemaphoreCapacityCall<'_> {
    /// Decodes the script's reply.
    pub(crate) fn decode(value: &Value) -> Result<CapacitySet, UnexpectedReply> {
        let bad = || decode::unexpected_reply("semaphore_capacity", value);
        let Value::Array(items) = value else {
            return Err(bad());
        };
        let number = |at: usize| {
            int(items.get(at))
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(bad)
        };
        match int(items.first()).ok_or_else(bad)? {
            1 => Ok(CapacitySet::Set {
                previous: number(1)?,
                width: number(2)?,
                held: number(3)?,
                announced: number(4)? == 1,
            }),
            -2 => decode::unusable(items)
                .map(CapacitySet::Failed)
                .ok_or_else(bad),
            _ => Err(bad()),
        }
    }
}

fn int(value: Option<&Value>) -> Option<i64> {
    match value? {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn an_inspect_reply_reads_back_every_held_slot() {
        let view = |fence: &str, released: i64| {
            Value::Array(vec![
                Value::Int(2),
                text(fence),
                Value::Int(1500),
                text("a9993e364706816a"),
                text("host-3:4711"),
                Value::Int(released),
            ])
        };
        let reply = Value::Array(vec![
            Value::Int(1),
            Value::Int(2),
            Value::Int(3),
            Value::Int(1),
            Value::Array(vec![Value::Int(0), view("7", 0)]),
            Value::Array(vec![Value::Int(2), view("9", 1)]),
        ]);
        let SemaphoreRead::Found {
            capacity,
            width,
            waiting,
            held,
        } = SemaphoreInspectCall::decode(&reply).unwrap()
        else {
            panic!("not found");
        };
        assert_eq!((capacity, width, waiting), (2, 3, 1));
        let slots: Vec<(u32, u64, bool)> = held
            .iter()
            .map(|(slot, v)| (*slot, v.fence.unwrap().get(), v.released))
            .collect();
        assert_eq!(slots, [(0, 7, false), (2, 9, true)]);
        assert_eq!(
            held[0].1.holder_name.as_ref().map(|n| n.as_str()),
            Some("host-3:4711")
        );
        assert!(matches!(
            SemaphoreInspectCall::decode(&Value::Array(vec![Value::Int(0)])),
            Ok(SemaphoreRead::Absent)
        ));
        // A slot whose entry is not a lease's view is no reply the script gives.
        let odd = Value::Array(vec![
            Value::Int(1),
            Value::Int(2),
            Value::Int(2),
            Value::Int(0),
            Value::Array(vec![Value::Int(0), Value::Array(vec![Value::Int(0)])]),
        ]);
        assert!(SemaphoreInspectCall::decode(&odd).is_err());
    }

    #[test]
    fn a_capacity_reply_reads_back() {
        let reply = Value::Array(vec![
            Value::Int(1),
            Value::Int(3),
            Value::Int(4),
            Value::Int(2),
            Value::Int(1),
        ]);
        assert!(matches!(
            SemaphoreCapacityCall::decode(&reply),
            Ok(CapacitySet::Set {
                previous: 3,
                width: 4,
                held: 2,
                announced: true
            })
        ));
        let foreign = Value::Array(vec![Value::Int(-2), text("semaphore-value")]);
        assert!(matches!(
            SemaphoreCapacityCall::decode(&foreign),
            Ok(CapacitySet::Failed(Failure::Unavailable(_)))
        ));
        assert!(SemaphoreCapacityCall::decode(&Value::Int(1)).is_err());
    }
}
