//! Reply decoding: every script reply shape, and a typed error for anything else.
//!
//! Nothing here panics on any reply. A reply that does not fit is an error the caller turns
//! into `Indeterminate`, because the script may well have run. An error describes the reply's
//! shape only, never its contents: a reply that is not what the script promises could hold
//! anything, a stored token or the value of a fenced write included.

use std::time::Duration;

use leasehold::backend::{AcquireReply, DowngradeReply, GrantReply, ReleaseReply, RenewReply};
use leasehold::{
    Contention, Failure, FenceToken, HolderFingerprint, HolderName, Indeterminate,
    IndeterminateCause, InspectOutcome, LeaseView, LossCause, Unavailable, UnavailableCause,
    UnusableKey,
};
use redis::Value;

use crate::fenced::FencedWrite;

/// A reply that does not have the shape the script's header promises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected {script} reply: {what}")]
pub(crate) struct UnexpectedReply {
    script: &'static str,
    what: String,
}

pub(crate) fn unexpected_reply(script: &'static str, value: &Value) -> UnexpectedReply {
    // Only the shape is described: a reply value could, in principle, hold a stored token.
    let what = match value {
        Value::Array(items) => format!("an array of {} items", items.len()),
        Value::Int(_) => "an integer".to_owned(),
        Value::Nil => "nil".to_owned(),
        Value::BulkString(_) | Value::SimpleString(_) => "a string".to_owned(),
        _ => "a value of another type".to_owned(),
    };
    UnexpectedReply { script, what }
}

fn items(value: &Value) -> Option<&[Value]> {
    match value {
        Value::Array(items) => Some(items),
        _ => None,
    }
}

fn int(value: Option<&Value>) -> Option<i64> {
    match value? {
        Value::Int(n) => Some(*n),
        _ => None,
    }
}

fn text(value: Option<&Value>) -> Option<&[u8]> {
    match value? {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// A positive PTTL as a duration; `None` for "no TTL" (-1), "absent" (-2) or zero.
fn pttl(millis: i64) -> Option<Duration> {
    u64::try_from(millis)
        .ok()
        .filter(|&ms| ms > 0)
        .map(Duration::from_millis)
}

/// A fence, which the scripts send as a decimal string (exact over the whole range, where a
/// Lua number is not); an integer is read too. `None` for zero, a negative number, anything
/// above [`FenceToken::MAX`] or anything that is not a plain decimal.
pub(crate) fn fence(value: Option<&Value>) -> Option<FenceToken> {
    match value? {
        Value::Int(n) => u64::try_from(*n).ok().and_then(FenceToken::new),
        Value::BulkString(bytes) => {
            // Digits only: `u64::from_str` would take a leading '+'.
            if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
                return None;
            }
            std::str::from_utf8(bytes)
                .ok()?
                .parse::<u64>()
                .ok()
                .and_then(FenceToken::new)
        }
        _ => None,
    }
}

/// A `{-2, what}` reply: a key the script could not use, and so wrote nothing.
pub(crate) fn unusable(items: &[Value]) -> Option<Failure> {
    let what = match text(items.get(1))? {
        b"lease-type" => UnusableKey::LeaseWrongType,
        b"lease-value" => UnusableKey::LeaseForeignValue,
        b"counter-type" => UnusableKey::CounterWrongType,
        b"counter-value" => UnusableKey::CounterNotAFence,
        b"fence-range" => UnusableKey::FenceRangeExhausted,
        b"record-type" => UnusableKey::RecordWrongType,
        b"semaphore-value" => UnusableKey::SemaphoreForeignValue,
        _ => return None,
    };
    Some(Failure::Unavailable(Unavailable::new(
        UnavailableCause::UnusableKey(what),
        format!("{what}; nothing was written"),
    )))
}

fn holder(value: Option<&Value>) -> Option<HolderFingerprint> {
    text(value)
        .and_then(|bytes| std::str::from_utf8(bytes).ok())
        .and_then(HolderFingerprint::parse)
}

/// A holder name; `None` for `""` (no name), and for anything that is not a valid name,
/// which the scripts never store.
fn holder_name(value: Option<&Value>) -> Option<HolderName> {
    text(value)
        .and_then(|bytes| std::str::from_utf8(bytes).ok())
        .filter(|name| !name.is_empty())
        .and_then(|name| HolderName::new(name).ok())
}

/// The released flag: true only for exactly 1 (replies from before it existed have none).
fn released(value: Option<&Value>) -> bool {
    int(value) == Some(1)
}

/// Decodes a `semaphore_acquire.lua` reply; a grant's key has the TTL the script set,
/// `granted_ttl`.
pub(crate) fn semaphore_acquire(
    value: &Value,
    granted_ttl: Duration,
) -> Result<AcquireReply, UnexpectedReply> {
    let bad = || unexpected_reply("semaphore_acquire", value);
    let items = items(value).ok_or_else(bad)?;
    // A slot of -1 is a read/write lease's writer's: no slot.
    let slot = |at: usize| match int(items.get(at)) {
        Some(-1) => Ok(None),
        other => other
            .and_then(|slot| u32::try_from(slot).ok())
            .map(Some)
            .ok_or_else(bad),
    };
    let with_slot = |grant: GrantReply, slot: Option<u32>| match slot {
        Some(slot) => grant.with_slot(slot),
        None => grant,
    };
    match int(items.first()).ok_or_else(bad)? {
        1 => {
            let fence = fence(items.get(1)).ok_or_else(bad)?;
            Ok(AcquireReply::Granted(with_slot(
                GrantReply::new(fence, granted_ttl),
                slot(2)?,
            )))
        }
        2 => {
            let fence = fence(items.get(1)).ok_or_else(bad)?;
            let left = int(items.get(2)).and_then(pttl).unwrap_or(Duration::ZERO);
            Ok(AcquireReply::Replayed(with_slot(
                GrantReply::new(fence, left),
                slot(3)?,
            )))
        }
        3 => {
            let retry_after = int(items.get(2)).and_then(pttl).ok_or_else(bad)?;
            slot(5)?;
            Ok(AcquireReply::OwnerOperationConflict(
                Contention::new(retry_after, holder(items.get(3)), fence(items.get(1)))
                    .with_holder_name(holder_name(items.get(4))),
            ))
        }
        0 => {
            let retry_after = int(items.get(1)).and_then(pttl).ok_or_else(bad)?;
            let ahead = int(items.get(2))
                .and_then(|ahead| u32::try_from(ahead).ok())
                .ok_or_else(bad)?;
            Ok(AcquireReply::Contended(
                Contention::new(retry_after, None, None).with_ahead(ahead),
            ))
        }
        -3 => {
            let recorded = int(items.get(1))
                .and_then(|c| u32::try_from(c).ok())
                .ok_or_else(bad)?;
            Ok(AcquireReply::CapacityMismatch { recorded })
        }
        -2 => unusable(items).map(AcquireReply::Failed).ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// Decodes a `rw_downgrade.lua` reply; the reader's key has the TTL the script set.
pub(crate) fn downgrade(
    value: &Value,
    granted_ttl: Duration,
) -> Result<DowngradeReply, UnexpectedReply> {
    let bad = || unexpected_reply("rw_downgrade", value);
    let items = items(value).ok_or_else(bad)?;
    match int(items.first()).ok_or_else(bad)? {
        1 => {
            let fence = fence(items.get(1)).ok_or_else(bad)?;
            let slot = int(items.get(2))
                .and_then(|slot| u32::try_from(slot).ok())
                .ok_or_else(bad)?;
            Ok(DowngradeReply::Downgraded(
                GrantReply::new(fence, granted_ttl).with_slot(slot),
            ))
        }
        0 => Ok(DowngradeReply::Lost(LossCause::Absent)),
        -1 => Ok(DowngradeReply::Lost(LossCause::OtherHolder)),
        _ => Err(bad()),
    }
}

/// Decodes an `acquire.lua` reply. A grant is the fence alone, and the key's TTL is the one
/// the script set, `granted_ttl` (the request's TTL, or its minimum hold if longer); a
/// holder's key without a TTL gets `fallback`.
pub(crate) fn acquire(
    value: &Value,
    granted_ttl: Duration,
    fallback: Duration,
) -> Result<AcquireReply, UnexpectedReply> {
    let bad = || unexpected_reply("acquire", value);
    if let Value::BulkString(_) = value {
        let fence = fence(Some(value)).ok_or_else(bad)?;
        return Ok(AcquireReply::Granted(GrantReply::new(fence, granted_ttl)));
    }
    let items = items(value).ok_or_else(bad)?;
    let status = int(items.first()).ok_or_else(bad)?;
    if status == -2 {
        return unusable(items).map(AcquireReply::Failed).ok_or_else(bad);
    }
    let fence_v = items.get(1).ok_or_else(bad)?;
    let pttl_ms = int(items.get(2)).ok_or_else(bad)?;
    let grant = || -> Result<GrantReply, UnexpectedReply> {
        let fence = fence(Some(fence_v)).ok_or_else(bad)?;
        // A granted or replayed key always has a TTL; a missing one grants no validity.
        Ok(GrantReply::new(
            fence,
            pttl(pttl_ms).unwrap_or(Duration::ZERO),
        ))
    };
    let contention = || {
        Contention::new(
            pttl(pttl_ms).unwrap_or(fallback),
            holder(items.get(3)),
            fence(Some(fence_v)),
        )
        .with_holder_name(holder_name(items.get(4)))
        .with_released(released(items.get(5)))
    };
    match status {
        2 => Ok(AcquireReply::Replayed(grant()?)),
        3 => Ok(AcquireReply::OwnerOperationConflict(contention())),
        0 => Ok(AcquireReply::Contended(contention())),
        _ => Err(bad()),
    }
}

/// Decodes one grant's `renew.lua` reply: the TTL it set (milliseconds, positive), 0 or -1.
pub(crate) fn renew(value: &Value) -> Result<RenewReply, UnexpectedReply> {
    let bad = || unexpected_reply("renew", value);
    match int(Some(value)).ok_or_else(bad)? {
        0 => Ok(RenewReply::Lost(LossCause::Absent)),
        -1 => Ok(RenewReply::Lost(LossCause::OtherHolder)),
        ttl => {
            let ttl = pttl(ttl).ok_or_else(bad)?;
            Ok(RenewReply::Renewed { server_ttl: ttl })
        }
    }
}

/// Decodes a `release.lua` reply: an integer.
pub(crate) fn release(value: &Value) -> Result<ReleaseReply, UnexpectedReply> {
    let bad = || unexpected_reply("release", value);
    match int(Some(value)).ok_or_else(bad)? {
        1 => Ok(ReleaseReply::Released),
        0 => Ok(ReleaseReply::AlreadyGone),
        -1 => Ok(ReleaseReply::NotOwner),
        _ => Err(bad()),
    }
}

/// Decodes an `inspect.lua` reply.
pub(crate) fn inspect(value: &Value) -> Result<InspectOutcome, UnexpectedReply> {
    let bad = || unexpected_reply("inspect", value);
    let items = items(value).ok_or_else(bad)?;
    let status = int(items.first()).ok_or_else(bad)?;
    if status == 0 {
        return Ok(InspectOutcome::Free);
    }
    if status == -2 {
        return unusable(items).map(InspectOutcome::from).ok_or_else(bad);
    }
    let view = LeaseView::new(
        fence(items.get(1)),
        int(items.get(2)).and_then(pttl),
        holder(items.get(3)),
    )
    .with_holder_name(holder_name(items.get(4)))
    .with_released(released(items.get(5)));
    match status {
        1 => Ok(InspectOutcome::HeldByThisAttempt(view)),
        2 => Ok(InspectOutcome::HeldByOther(view)),
        _ => Err(bad()),
    }
}

/// Decodes a `fenced_write.lua` reply: `{1, fence}`, `{0, current}` or `{-2, what}`.
///
/// The writer's value is never in a well-formed reply, and an error names the reply's shape
/// only, so nothing here can repeat what was written.
pub(crate) fn fenced_write(value: &Value) -> Result<FencedWrite, UnexpectedReply> {
    let bad = || unexpected_reply("fenced_write", value);
    let items = items(value).ok_or_else(bad)?;
    match int(items.first()).ok_or_else(bad)? {
        1 => Ok(FencedWrite::Written),
        0 => fence(items.get(1))
            .map(|current| FencedWrite::Stale { current })
            .ok_or_else(bad),
        -2 => unusable(items).map(FencedWrite::Failed).ok_or_else(bad),
        _ => Err(bad()),
    }
}

/// Turns an undecodable reply into `Indeterminate`: the script may have run.
pub(crate) fn unreadable(err: UnexpectedReply) -> Failure {
    Failure::Indeterminate(Indeterminate::new(
        IndeterminateCause::UnexpectedReply,
        err.to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arr(items: Vec<Value>) -> Value {
        Value::Array(items)
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    const FALLBACK: Duration = Duration::from_millis(50);
    const TTL: Duration = Duration::from_millis(2000);

    #[test]
    fn acquire_replies_decode() {
        let granted = acquire(&bulk("7"), Duration::from_secs(2), FALLBACK);
        assert_eq!(
            granted,
            Ok(AcquireReply::Granted(GrantReply::new(
                FenceToken::new(7).unwrap(),
                Duration::from_secs(2)
            )))
        );
        let replayed = acquire(
            &arr(vec![Value::Int(2), Value::Int(7), Value::Int(480)]),
            TTL,
            FALLBACK,
        );
        assert_eq!(
            replayed,
            Ok(AcquireReply::Replayed(GrantReply::new(
                FenceToken::new(7).unwrap(),
                Duration::from_millis(480)
            )))
        );
        let fp = "0123456789abcdef";
        match acquire(
            &arr(vec![
                Value::Int(0),
                Value::Int(9),
                Value::Int(1234),
                bulk(fp),
            ]),
            TTL,
            FALLBACK,
        ) {
            Ok(AcquireReply::Contended(c)) => {
                assert_eq!(c.retry_after, Duration::from_millis(1234));
                assert_eq!(c.holder.unwrap().as_str(), fp);
                assert_eq!(c.fence, FenceToken::new(9));
            }
            other => panic!("{other:?}"),
        }
        // No TTL on the holder's key: the configured fallback.
        match acquire(
            &arr(vec![Value::Int(3), Value::Int(9), Value::Int(-1), bulk(fp)]),
            TTL,
            FALLBACK,
        ) {
            Ok(AcquireReply::OwnerOperationConflict(c)) => assert_eq!(c.retry_after, FALLBACK),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn holder_names_and_released_records_decode() {
        let fp = "0123456789abcdef";
        match acquire(
            &arr(vec![
                Value::Int(0),
                bulk("9"),
                Value::Int(1500),
                bulk(fp),
                bulk("host-3:4711"),
                Value::Int(1),
            ]),
            TTL,
            FALLBACK,
        ) {
            Ok(AcquireReply::Contended(c)) => {
                assert_eq!(c.holder.unwrap().as_str(), fp);
                assert_eq!(c.holder_name.unwrap().as_str(), "host-3:4711");
                assert!(c.released);
                assert_eq!(c.retry_after, Duration::from_millis(1500));
            }
            other => panic!("{other:?}"),
        }
        // No name, a live grant; and a name the scripts would never store is no name.
        for (name, flag) in [("", 0), ("bad\nname", 0), ("x", 7)] {
            match acquire(
                &arr(vec![
                    Value::Int(0),
                    bulk("9"),
                    Value::Int(1500),
                    bulk(fp),
                    bulk(name),
                    Value::Int(flag),
                ]),
                TTL,
                FALLBACK,
            ) {
                Ok(AcquireReply::Contended(c)) => {
                    assert_eq!(c.holder_name.map(|n| n.as_str().to_owned()), {
                        (name == "x").then(|| "x".to_owned())
                    });
                    assert!(!c.released, "{flag}");
                }
                other => panic!("{other:?}"),
            }
        }
        match inspect(&arr(vec![
            Value::Int(2),
            bulk("4"),
            Value::Int(900),
            bulk(fp),
            bulk("host-3"),
            Value::Int(1),
        ])) {
            Ok(InspectOutcome::HeldByOther(view)) => {
                assert_eq!(view.holder_name.unwrap().as_str(), "host-3");
                assert!(view.released);
                assert_eq!(view.fence, FenceToken::new(4));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_unusable_key_decodes_by_name_for_acquire_and_inspect() {
        for (what, want) in [
            ("lease-type", UnusableKey::LeaseWrongType),
            ("lease-value", UnusableKey::LeaseForeignValue),
            ("counter-type", UnusableKey::CounterWrongType),
            ("counter-value", UnusableKey::CounterNotAFence),
            ("fence-range", UnusableKey::FenceRangeExhausted),
        ] {
            let reply = arr(vec![Value::Int(-2), bulk(what)]);
            let cause = UnavailableCause::UnusableKey(want);
            assert!(
                matches!(
                    acquire(&reply, TTL, FALLBACK),
                    Ok(AcquireReply::Failed(Failure::Unavailable(ref u))) if u.cause == cause
                ),
                "{what}"
            );
            assert!(
                matches!(inspect(&reply), Ok(InspectOutcome::Unavailable(ref u)) if u.cause == cause),
                "{what}"
            );
        }
    }

    #[test]
    fn a_replay_without_ttl_grants_nothing() {
        match acquire(
            &arr(vec![Value::Int(2), Value::Int(3), Value::Int(-1)]),
            TTL,
            FALLBACK,
        ) {
            Ok(AcquireReply::Replayed(g)) => assert_eq!(g.server_ttl, Duration::ZERO),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_replies_are_errors_not_panics() {
        let cases = vec![
            Value::Nil,
            Value::Int(1),
            bulk("0"),
            bulk("-5"),
            bulk("+5"),
            bulk("9223372036854775808"),
            bulk(""),
            arr(vec![]),
            arr(vec![Value::Int(1)]),
            // The grant's reply before it was the fence alone.
            arr(vec![Value::Int(1), Value::Int(7), Value::Int(10)]),
            arr(vec![Value::Int(2), Value::Int(0), Value::Int(10)]),
            arr(vec![Value::Int(2), Value::Int(-5), Value::Int(10)]),
            arr(vec![Value::Int(9), Value::Int(1), Value::Int(10)]),
            arr(vec![bulk("1"), Value::Int(1), Value::Int(10)]),
            arr(vec![Value::Int(1), Value::Nil, Value::Int(10)]),
        ];
        for v in &cases {
            assert!(acquire(v, TTL, FALLBACK).is_err(), "acquire {v:?}");
        }
        // Renew answers an integer per grant: a table (what it answered before), a negative
        // TTL or a string is no reply it gives.
        for v in [
            Value::Nil,
            arr(vec![]),
            arr(vec![Value::Int(1), Value::Int(3000)]),
            arr(vec![Value::Int(0)]),
            Value::Int(-2),
            bulk("3000"),
        ] {
            assert!(renew(&v).is_err(), "renew {v:?}");
        }
        for v in [Value::Nil, arr(vec![]), arr(vec![Value::Int(7)])] {
            assert!(inspect(&v).is_err(), "inspect {v:?}");
            assert!(release(&v).is_err(), "release {v:?}");
        }
        // Release answers an integer, never a table (what it answered before).
        for v in [Value::Int(7), arr(vec![Value::Int(1)]), bulk("1")] {
            assert!(release(&v).is_err(), "release {v:?}");
        }
    }

    #[test]
    fn renew_release_and_inspect_replies_decode() {
        assert_eq!(
            renew(&Value::Int(3000)),
            Ok(RenewReply::Renewed {
                server_ttl: Duration::from_secs(3)
            })
        );
        assert_eq!(
            renew(&Value::Int(0)),
            Ok(RenewReply::Lost(LossCause::Absent))
        );
        assert_eq!(
            renew(&Value::Int(-1)),
            Ok(RenewReply::Lost(LossCause::OtherHolder))
        );
        assert_eq!(release(&Value::Int(1)), Ok(ReleaseReply::Released));
        assert_eq!(release(&Value::Int(0)), Ok(ReleaseReply::AlreadyGone));
        assert_eq!(release(&Value::Int(-1)), Ok(ReleaseReply::NotOwner));
        assert_eq!(inspect(&arr(vec![Value::Int(0)])), Ok(InspectOutcome::Free));
        match inspect(&arr(vec![
            Value::Int(1),
            Value::Int(4),
            Value::Int(900),
            bulk("0123456789abcdef"),
        ])) {
            Ok(InspectOutcome::HeldByThisAttempt(view)) => {
                assert_eq!(view.fence, FenceToken::new(4));
                assert_eq!(view.server_ttl, Some(Duration::from_millis(900)));
            }
            other => panic!("{other:?}"),
        }
        match inspect(&arr(vec![
            Value::Int(2),
            Value::Int(0),
            Value::Int(-1),
            bulk(""),
        ])) {
            Ok(InspectOutcome::HeldByOther(view)) => {
                assert_eq!(view, LeaseView::new(None, None, None));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn fenced_write_replies_decode_and_garbage_is_an_error_not_a_panic() {
        assert_eq!(
            fenced_write(&arr(vec![Value::Int(1), bulk("7")])),
            Ok(FencedWrite::Written)
        );
        assert_eq!(
            fenced_write(&arr(vec![Value::Int(0), bulk("9223372036854775807")])),
            Ok(FencedWrite::Stale {
                current: FenceToken::MAX
            })
        );
        assert!(matches!(
            fenced_write(&arr(vec![Value::Int(-2), bulk("record-type")])),
            Ok(FencedWrite::Failed(Failure::Unavailable(u)))
                if u.cause == UnavailableCause::UnusableKey(UnusableKey::RecordWrongType)
        ));
        for garbage in [
            Value::Nil,
            arr(vec![]),
            arr(vec![Value::Int(0), bulk("x")]),
            arr(vec![Value::Int(0), bulk("0")]),
            arr(vec![Value::Int(0), bulk("+5")]),
            arr(vec![Value::Int(0), bulk("-1")]),
            arr(vec![Value::Int(0), bulk("9223372036854775808")]),
            arr(vec![Value::Int(-2), bulk("something")]),
            arr(vec![Value::Int(2), bulk("1")]),
        ] {
            assert!(fenced_write(&garbage).is_err(), "{garbage:?}");
        }
    }

    /// Whatever the server sends back, even the written value itself where a fence or a
    /// status belongs, neither the decoded outcome nor the error prints that value.
    #[test]
    fn fenced_write_errors_never_show_the_written_value() {
        const VALUE: &str = "card=4111-1111-1111-1111";
        let written = || bulk(VALUE);
        let replies = [
            written(),
            Value::SimpleString(VALUE.to_owned()),
            arr(vec![written()]),
            arr(vec![written(), Value::Int(1)]),
            arr(vec![Value::Int(1), written()]),
            arr(vec![Value::Int(0), written()]),
            arr(vec![Value::Int(-2), written()]),
            arr(vec![Value::Int(7), written()]),
            arr(vec![Value::Int(0), arr(vec![written()])]),
            arr(vec![arr(vec![Value::Int(1), written()])]),
        ];
        for reply in &replies {
            let decoded = fenced_write(reply);
            let shown = format!("{decoded:?}");
            assert!(!shown.contains(VALUE), "{shown}");
            if let Err(e) = decoded {
                let shown = format!("{e} / {e:?}");
                assert!(!shown.contains(VALUE), "{shown}");
                assert!(shown.contains("fenced_write"), "{shown}");
            }
        }
    }

    /// What the property test plants in replies as the fenced write's value.
    const PLANTED: &str = "planted-value-0f7c";

    /// Any reply a server could send, biased towards the shapes the scripts use (an array
    /// that opens with a small status), so that every arm is reached, nested a few levels.
    fn any_reply() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Nil),
            Just(Value::Okay),
            any::<i64>().prop_map(Value::Int),
            (-3i64..4).prop_map(Value::Int),
            prop::collection::vec(any::<u8>(), 0..24).prop_map(Value::BulkString),
            "[0-9+-]{0,21}".prop_map(|s| Value::BulkString(s.into_bytes())),
            prop::sample::select(vec![
                "lease-type",
                "lease-value",
                "counter-type",
                "counter-value",
                "fence-range",
                "record-type",
                "0123456789abcdef",
                PLANTED,
            ])
            .prop_map(bulk),
            ".{0,12}".prop_map(Value::SimpleString),
            any::<f64>().prop_map(Value::Double),
            any::<bool>().prop_map(Value::Boolean),
        ];
        leaf.prop_recursive(3, 32, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                ((-3i64..4), prop::collection::vec(inner, 0..5)).prop_map(|(status, rest)| {
                    let mut items = vec![Value::Int(status)];
                    items.extend(rest);
                    Value::Array(items)
                }),
            ]
        })
    }

    proptest! {
        /// No reply makes a decoder panic, and none makes the fenced-write decoder show the
        /// value it may carry.
        #[test]
        fn no_reply_makes_a_decoder_panic(reply in any_reply()) {
            let _ = acquire(&reply, TTL, FALLBACK);
            let _ = renew(&reply);
            let _ = release(&reply);
            let _ = inspect(&reply);
            let decoded = fenced_write(&reply);
            let shown = match &decoded {
                Ok(outcome) => format!("{outcome:?}"),
                Err(e) => format!("{e} / {e:?}"),
            };
            prop_assert!(!shown.contains(PLANTED), "{}", shown);
        }
    }
}
