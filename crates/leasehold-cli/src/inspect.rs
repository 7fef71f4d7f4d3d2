//! `leasehold inspect`: who holds a lease, as a sentence or one JSON object.

use std::io::Write as _;

use leasehold_redis::RedisBackend;
use leasehold_redis::leasehold::{InspectOutcome, LeaseView, UnavailableCause};
use serde_json::{Value, json};

use crate::config::InspectConfig;
use crate::duration::format_duration;
use crate::exit;

/// Runs `leasehold inspect` and returns its exit code.
pub(crate) async fn inspect(config: InspectConfig) -> u8 {
    let InspectConfig {
        target,
        purpose,
        resource,
        resource_name,
        json,
    } = config;
    let shown = target.shown;
    let client = RedisBackend::into_client(target.backend);
    // No attempt: inspection by a bystander, which sees the holder's fingerprint only.
    let view = match client.inspect(&purpose, &resource, None).await {
        InspectOutcome::Free => None,
        InspectOutcome::HeldByOther(view) | InspectOutcome::HeldByThisAttempt(view) => Some(view),
        InspectOutcome::Unavailable(u) => {
            if let UnavailableCause::UnusableKey(what) = u.cause {
                return exit::unusable_key(what, &shown);
            }
            eprintln!("leasehold: Redis unavailable at {shown}: {u}");
            return exit::UNAVAILABLE;
        }
        InspectOutcome::Indeterminate(i) => {
            eprintln!("leasehold: no answer from Redis at {shown}: {i}");
            return exit::UNAVAILABLE;
        }
        other => {
            eprintln!("leasehold: could not inspect: {other:?}");
            return exit::UNAVAILABLE;
        }
    };
    let line = if json {
        to_json(view.as_ref())
    } else {
        format!(
            "{resource_name} (purpose {purpose}): {}",
            describe(view.as_ref())
        )
    };
    match writeln!(std::io::stdout(), "{line}") {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit::BROKEN_PIPE,
        Err(e) => {
            eprintln!("leasehold: cannot write the answer: {e}");
            exit::FAILURE
        }
    }
}

/// The `--json` object: the same four keys, in the documented order, whether held or free.
fn to_json(view: Option<&LeaseView>) -> String {
    let (state, fence, remaining_ms, holder) = match view {
        None => ("free", Value::Null, Value::Null, Value::Null),
        Some(view) => (
            "held",
            view.fence.map_or(Value::Null, |f| json!(f.get())),
            view.server_ttl.map_or(Value::Null, |d| {
                json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            }),
            view.holder
                .as_ref()
                .map_or(Value::Null, |h| json!(h.as_str())),
        ),
    };
    // serde_json's maps sort their keys; scripts read the keys in this order in the docs.
    format!(
        r#"{{"state":{},"fence":{fence},"remaining_ms":{remaining_ms},"holder":{holder}}}"#,
        json!(state)
    )
}

fn describe(view: Option<&LeaseView>) -> String {
    let Some(view) = view else {
        return "free".to_owned();
    };
    let holder = view
        .holder
        .as_ref()
        .map_or_else(|| "an unreadable holder".to_owned(), |h| h.to_string());
    let fence = view
        .fence
        .map_or_else(|| "no fence".to_owned(), |f| format!("fence {f}"));
    let left = view.server_ttl.map_or_else(
        || "no expiry".to_owned(),
        |d| format!("{} left", format_duration(d)),
    );
    format!("held by {holder}, {fence}, {left}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_redis::leasehold::{FenceToken, HolderFingerprint};
    use std::time::Duration;

    fn held() -> LeaseView {
        LeaseView::new(
            FenceToken::new(7),
            Some(Duration::from_millis(29_812)),
            HolderFingerprint::parse("a9993e364706816a"),
        )
    }

    #[test]
    fn json_has_the_same_four_keys_held_or_free() {
        assert_eq!(
            to_json(None),
            r#"{"state":"free","fence":null,"remaining_ms":null,"holder":null}"#
        );
        assert_eq!(
            to_json(Some(&held())),
            r#"{"state":"held","fence":7,"remaining_ms":29812,"holder":"a9993e364706816a"}"#
        );
        let unreadable = LeaseView::new(None, None, None);
        assert_eq!(
            to_json(Some(&unreadable)),
            r#"{"state":"held","fence":null,"remaining_ms":null,"holder":null}"#
        );
    }

    #[test]
    fn the_sentence_names_holder_fence_and_time_left() {
        assert_eq!(describe(None), "free");
        assert_eq!(
            describe(Some(&held())),
            "held by a9993e364706816a, fence 7, 29s 812ms left"
        );
    }
}
