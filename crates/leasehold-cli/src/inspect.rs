//! `leasehold inspect`: who holds a lease, or the permits of a semaphore (`--semaphore`), as a
//! sentence or one JSON object.

use std::io::Write as _;

use leasehold_redis::leasehold::{InspectOutcome, LeaseView, Purpose, ResourceDigest};
use leasehold_redis::{RedisBackend, SemaphoreView};
use serde_json::{Value, json};

use crate::config::{InspectConfig, Named, Target};
use crate::duration::format_duration;
use crate::exit;
use crate::remedy;

/// Runs `leasehold inspect` and returns its exit code.
///
/// With no purpose given, a name free under `run`'s purpose is looked up under the library's
/// default purposes too, so that `leasehold inspect nightly-report` finds the lease a Rust
/// job's `client.lock("nightly-report")` holds; the answer names the purpose it was found
/// under.
pub(crate) async fn inspect(config: InspectConfig) -> u8 {
    let InspectConfig {
        target,
        lease,
        semaphore,
        json,
    } = config;
    if semaphore {
        return inspect_semaphore(target, lease, json).await;
    }
    let Named {
        purpose,
        also,
        resource,
        resource_name,
    } = lease;
    let shown = target.shown;
    let client = RedisBackend::into_client(target.backend);
    let looked_at: Vec<Purpose> = std::iter::once(purpose.clone())
        .chain(also.iter().cloned())
        .collect();
    let mut found = (purpose.clone(), None);
    for purpose in std::iter::once(purpose).chain(also) {
        // No attempt: inspection by a bystander, which sees the holder's fingerprint only.
        let view = match client.inspect(&purpose, &resource, None).await {
            InspectOutcome::Free => None,
            InspectOutcome::HeldByOther(view) | InspectOutcome::HeldByThisAttempt(view) => {
                Some(view)
            }
            InspectOutcome::Unavailable(u) => {
                if let Some(code) = exit::lasting_refusal(&u, &shown) {
                    return code;
                }
                eprintln!("leasehold: Redis unavailable at {shown}: {u}");
                remedy::tell_for(&u, &shown);
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
        if view.is_some() {
            found = (purpose, view);
            break;
        }
    }
    let (purpose, view) = found;
    let line = if json {
        to_json(&purpose, view.as_ref())
    } else {
        let hint = if view.is_none() {
            semaphore_hint(client.backend(), &looked_at, &resource).await
        } else {
            String::new()
        };
        format!(
            "{resource_name} (purpose {purpose}): {}{hint}",
            describe(view.as_ref())
        )
    };
    answer(&line)
}

/// Where a semaphore of that name is, among the purposes a free lease was looked up under,
/// as a hint to add `--semaphore` (`run --capacity` holds no lease, so its name alone looks
/// free); empty when there is none, or it cannot be read (the answer stands without it).
async fn semaphore_hint(
    backend: &RedisBackend,
    purposes: &[Purpose],
    resource: &ResourceDigest,
) -> String {
    for purpose in purposes {
        if let Ok(Some(view)) = backend.inspect_semaphore(purpose, resource).await {
            return format!(
                "; a semaphore of that name is there under purpose {purpose}, {} of its \
                 permits held: add --semaphore to see them",
                view.permits.len()
            );
        }
    }
    String::new()
}

/// `inspect --semaphore`: the first purpose of `name`'s that has a semaphore, or free under
/// the first one looked at.
async fn inspect_semaphore(target: Target, name: Named, json: bool) -> u8 {
    let Named {
        purpose,
        also,
        resource,
        resource_name,
    } = name;
    let mut found = (purpose.clone(), None);
    for purpose in std::iter::once(purpose).chain(also) {
        match target.backend.inspect_semaphore(&purpose, &resource).await {
            Ok(Some(view)) => {
                found = (purpose, Some(view));
                break;
            }
            Ok(None) => {}
            Err(e) => return crate::admin::failed(&e, &target.shown, "inspect the semaphore"),
        }
    }
    let (purpose, view) = found;
    let text = if json {
        semaphore_json(&purpose, view.as_ref())
    } else {
        format!(
            "{resource_name} (purpose {purpose}): {}",
            describe_semaphore(view.as_ref())
        )
    };
    answer(&text)
}

/// The `inspect --semaphore --json` object: the same keys, in the documented order, whether
/// there is a semaphore or not; each permit is its slot and [`json_fields`]'s keys.
fn semaphore_json(purpose: &Purpose, view: Option<&SemaphoreView>) -> String {
    let permits: Vec<String> = view
        .map(|view| {
            view.permits
                .iter()
                .map(|p| format!(r#"{{"slot":{},{}}}"#, p.slot, json_fields(Some(&p.view))))
                .collect()
        })
        .unwrap_or_default();
    let state = if permits.is_empty() { "free" } else { "held" };
    let capacity = view
        .and_then(|v| v.capacity)
        .map_or(Value::Null, |c| json!(c));
    // A width is known only with a record: without one it is the held slots' span.
    let width = view
        .filter(|v| v.capacity.is_some())
        .map_or(Value::Null, |v| json!(v.width));
    let waiting = view.map_or(0, |v| v.waiting);
    format!(
        r#"{{"state":{},"capacity":{capacity},"width":{width},"waiting":{waiting},"permits":[{}],"purpose":{}}}"#,
        json!(state),
        permits.join(","),
        json!(purpose.as_str())
    )
}

/// "1 permit", "2 permits": how many permits, in words.
pub(crate) fn permits(n: usize) -> String {
    if n == 1 {
        "1 permit".to_owned()
    } else {
        format!("{n} permits")
    }
}

/// `inspect --semaphore`'s sentence, with a line per held slot.
fn describe_semaphore(view: Option<&SemaphoreView>) -> String {
    let Some(view) = view else {
        return "no semaphore (no capacity recorded, no permit held)".to_owned();
    };
    let held = view.permits.len();
    let head = match view.capacity {
        Some(capacity) if view.width > capacity => format!(
            "semaphore of capacity {capacity}, width {} (held slots above the capacity count \
             until they are released), {} held",
            view.width,
            permits(held)
        ),
        Some(capacity) => {
            format!("semaphore of capacity {capacity}, {held} of {capacity} permits held")
        }
        None => format!(
            "semaphore with no capacity recorded (the record was lost; the next permit records \
             its own), {} held",
            permits(held)
        ),
    };
    let mut text = format!("{head}, {} waiting", view.waiting);
    for permit in &view.permits {
        text.push_str(&format!(
            "\n  slot {}: {}",
            permit.slot,
            describe(Some(&permit.view))
        ));
    }
    text
}

/// Writes a command's answer on stdout and returns the exit code: 0, or what a closed or
/// failing stdout calls for. Shared by `inspect`, `list` and `break`.
pub(crate) fn answer(text: &str) -> u8 {
    match writeln!(std::io::stdout(), "{text}") {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => exit::BROKEN_PIPE,
        Err(e) => {
            eprintln!("leasehold: cannot write the answer: {e}");
            exit::FAILURE
        }
    }
}

/// The `--json` object: the same seven keys, in the documented order, whether held or free,
/// so that a script reads one shape; a key that does not apply is `null` (or `false`). The
/// last, `purpose`, says where the lease was found (or, free, the first purpose looked at).
fn to_json(purpose: &Purpose, view: Option<&LeaseView>) -> String {
    format!(
        r#"{{{},"purpose":{}}}"#,
        json_fields(view),
        json!(purpose.as_str())
    )
}

/// The six keys of [`to_json`], without the braces, for `list` and `break` to add theirs.
pub(crate) fn json_fields(view: Option<&LeaseView>) -> String {
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
    // Always present, so that a held and a free lease have one shape for scripts.
    let name = view
        .and_then(|view| view.holder_name.as_ref())
        .map_or(Value::Null, |name| json!(name.as_str()));
    let released = view.is_some_and(|view| view.released);
    // serde_json's maps sort their keys; scripts read the keys in this order in the docs.
    format!(
        r#""state":{},"fence":{fence},"remaining_ms":{remaining_ms},"holder":{holder},"holder_name":{name},"released":{released}"#,
        json!(state)
    )
}

fn describe(view: Option<&LeaseView>) -> String {
    let Some(view) = view else {
        return "free".to_owned();
    };
    let (holder, fence, left) = parts(view);
    if view.released {
        return format!(
            "released by {holder} and kept until its minimum hold ends, {fence}, {left}"
        );
    }
    format!("held by {holder}, {fence}, {left}")
}

/// A held lease's holder (fingerprint and quoted name), fence and time left, as text.
pub(crate) fn parts(view: &LeaseView) -> (String, String, String) {
    let mut holder = view
        .holder
        .as_ref()
        .map_or_else(|| "an unreadable holder".to_owned(), |h| h.to_string());
    if let Some(name) = &view.holder_name {
        // Quoted: a name may hold spaces and commas. It never holds a control character.
        holder.push_str(&format!(" ({:?})", name.as_str()));
    }
    let fence = view
        .fence
        .map_or_else(|| "no fence".to_owned(), |f| format!("fence {f}"));
    let left = view.server_ttl.map_or_else(
        || "no expiry".to_owned(),
        |d| format!("{} left", format_duration(d)),
    );
    (holder, fence, left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_redis::HeldPermit;
    use leasehold_redis::leasehold::{FenceToken, HolderFingerprint, HolderName};
    use std::time::Duration;

    fn cli() -> Purpose {
        Purpose::new("cli").unwrap()
    }

    fn held() -> LeaseView {
        LeaseView::new(
            FenceToken::new(7),
            Some(Duration::from_millis(29_812)),
            HolderFingerprint::parse("a9993e364706816a"),
        )
    }

    #[test]
    fn json_has_the_same_seven_keys_held_or_free() {
        assert_eq!(
            to_json(&cli(), None),
            r#"{"state":"free","fence":null,"remaining_ms":null,"holder":null,"holder_name":null,"released":false,"purpose":"cli"}"#
        );
        assert_eq!(
            to_json(&cli(), Some(&held())),
            r#"{"state":"held","fence":7,"remaining_ms":29812,"holder":"a9993e364706816a","holder_name":null,"released":false,"purpose":"cli"}"#
        );
        let unreadable = LeaseView::new(None, None, None);
        assert_eq!(
            to_json(&cli(), Some(&unreadable)),
            r#"{"state":"held","fence":null,"remaining_ms":null,"holder":null,"holder_name":null,"released":false,"purpose":"cli"}"#
        );
    }

    #[test]
    fn json_shows_the_holder_name_and_released_when_there_are_any() {
        let named = held().with_holder_name(HolderName::new("host-3:4711").unwrap());
        assert_eq!(
            to_json(&cli(), Some(&named)),
            r#"{"state":"held","fence":7,"remaining_ms":29812,"holder":"a9993e364706816a","holder_name":"host-3:4711","released":false,"purpose":"cli"}"#
        );
        let kept = held().with_released(true);
        assert_eq!(
            to_json(&cli(), Some(&kept)),
            r#"{"state":"held","fence":7,"remaining_ms":29812,"holder":"a9993e364706816a","holder_name":null,"released":true,"purpose":"cli"}"#
        );
        // A name is JSON-escaped like any string.
        let quoted = held().with_holder_name(HolderName::new(r#"a "b" \ c"#).unwrap());
        let parsed: Value = serde_json::from_str(&to_json(&cli(), Some(&quoted))).unwrap();
        assert_eq!(parsed["holder_name"], r#"a "b" \ c"#);
    }

    #[test]
    fn the_sentence_names_the_holder_and_a_kept_release() {
        let named = held().with_holder_name(HolderName::new("host-3:4711").unwrap());
        assert_eq!(
            describe(Some(&named)),
            "held by a9993e364706816a (\"host-3:4711\"), fence 7, 29s 812ms left"
        );
        assert_eq!(
            describe(Some(&named.with_released(true))),
            "released by a9993e364706816a (\"host-3:4711\") and kept until its minimum hold \
             ends, fence 7, 29s 812ms left"
        );
    }

    #[test]
    fn a_semaphore_has_one_json_shape_with_a_permit_per_held_slot() {
        assert_eq!(
            semaphore_json(&cli(), None),
            r#"{"state":"free","capacity":null,"width":null,"waiting":0,"permits":[],"purpose":"cli"}"#
        );
        let named = held().with_holder_name(HolderName::new("host-3:4711").unwrap());
        let view = SemaphoreView::new(
            Some(1),
            3,
            2,
            vec![HeldPermit::new(0, named), HeldPermit::new(2, held())],
        );
        assert_eq!(
            semaphore_json(&cli(), Some(&view)),
            r#"{"state":"held","capacity":1,"width":3,"waiting":2,"permits":[{"slot":0,"state":"held","fence":7,"remaining_ms":29812,"holder":"a9993e364706816a","holder_name":"host-3:4711","released":false},{"slot":2,"state":"held","fence":7,"remaining_ms":29812,"holder":"a9993e364706816a","holder_name":null,"released":false}],"purpose":"cli"}"#
        );
        assert_eq!(
            describe_semaphore(Some(&view)),
            "semaphore of capacity 1, width 3 (held slots above the capacity count until they \
             are released), 2 permits held, 2 waiting\n  slot 0: held by a9993e364706816a \
             (\"host-3:4711\"), fence 7, 29s 812ms left\n  slot 2: held by a9993e364706816a, \
             fence 7, 29s 812ms left"
        );
        let empty = SemaphoreView::new(Some(2), 2, 0, Vec::new());
        assert!(
            semaphore_json(&cli(), Some(&empty))
                .starts_with(r#"{"state":"free","capacity":2,"width":2,"#)
        );
        assert_eq!(
            describe_semaphore(Some(&empty)),
            "semaphore of capacity 2, 0 of 2 permits held, 0 waiting"
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
