//! `leasehold capacity`: change a semaphore's capacity, evicting no holder.

use leasehold_redis::leasehold::{Purpose, ResourceDigest};
use leasehold_redis::{CapacityChange, Error, RedisBackend};
use serde_json::{Value, json};

use crate::admin::failed;
use crate::config::{CapacityConfig, Named};
use crate::exit;
use crate::inspect::{answer, permits};

/// Runs `leasehold capacity` and returns its exit code.
pub(crate) async fn capacity(config: CapacityConfig) -> u8 {
    let CapacityConfig {
        target,
        semaphore:
            Named {
                purpose,
                also,
                resource,
                resource_name,
            },
        capacity,
        json,
    } = config;
    let change = match target
        .backend
        .set_semaphore_capacity(&purpose, &resource, capacity)
        .await
    {
        Ok(change) => change,
        Err(Error::Indeterminate(i)) => {
            eprintln!(
                "leasehold: no answer from Redis at {}: {i}; the capacity may or may not have \
                 been set (`leasehold inspect --semaphore` tells)",
                target.shown
            );
            return exit::UNAVAILABLE;
        }
        Err(e) => return failed(&e, &target.shown, "set the capacity"),
    };
    let text = if json {
        to_json(&purpose, &change)
    } else {
        let elsewhere = if change.previous.is_none() {
            recorded_elsewhere(&target.backend, &also, &resource).await
        } else {
            String::new()
        };
        format!(
            "{resource_name} (purpose {purpose}): {}{elsewhere}",
            describe(&change)
        )
    };
    answer(&text)
}

/// The `--json` object, its keys in the documented order.
fn to_json(purpose: &Purpose, change: &CapacityChange) -> String {
    let previous = change.previous.map_or(Value::Null, |p| json!(p));
    format!(
        r#"{{"previous":{previous},"capacity":{},"width":{},"held":{},"woke_waiters":{},"purpose":{}}}"#,
        change.capacity,
        change.width,
        change.held,
        change.woke_waiters,
        json!(purpose.as_str())
    )
}

fn describe(change: &CapacityChange) -> String {
    let CapacityChange {
        capacity,
        width,
        held,
        ..
    } = *change;
    let held = usize::try_from(held).unwrap_or(usize::MAX);
    let ask = format!(
        "runs must now ask for --capacity {capacity} (another is refused, exit {})",
        exit::CAPACITY_MISMATCH
    );
    match change.previous {
        None => format!(
            "no semaphore was recorded; its capacity is now {capacity}, {} held: \
             the first permits must ask for --capacity {capacity}",
            permits(held)
        ),
        Some(previous) if previous == capacity => {
            format!(
                "the capacity was {capacity} already, {} held",
                permits(held)
            )
        }
        Some(previous) if capacity > previous => {
            let woke = if change.woke_waiters {
                "; its waiters were told to try again"
            } else {
                ""
            };
            format!(
                "capacity {previous} -> {capacity}, {} held{woke}; {ask}",
                permits(held)
            )
        }
        Some(previous) => {
            let kept = if width > capacity {
                format!(
                    ": the holders of the slots up to {} keep them, and nobody new is admitted \
                     until fewer than {capacity} are held",
                    width - 1
                )
            } else {
                String::new()
            };
            format!(
                "capacity {previous} -> {capacity}, {} held{kept}; {ask}",
                permits(held)
            )
        }
    }
}

/// Where a semaphore of that name was recorded, among the library's default purposes a name
/// alone also names, for a capacity set where none was: the operator may have meant that one
/// (`capacity` sets only what it was named, and has now made a record under its purpose).
async fn recorded_elsewhere(
    backend: &RedisBackend,
    also: &[Purpose],
    resource: &ResourceDigest,
) -> String {
    for purpose in also {
        if let Ok(Some(view)) = backend.inspect_semaphore(purpose, resource).await {
            let recorded = view.capacity.map_or_else(
                || "no capacity recorded".to_owned(),
                |c| format!("capacity {c}"),
            );
            return format!(
                "; a semaphore of that name is under purpose {purpose} (the library's, \
                 {recorded}): add --purpose {purpose} to change that one"
            );
        }
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(previous: Option<u32>, capacity: u32, width: u32, woke: bool) -> CapacityChange {
        CapacityChange::new(previous, capacity, width, 2, woke)
    }

    #[test]
    fn the_sentence_says_what_changed_and_what_runs_must_ask_for() {
        assert_eq!(
            describe(&change(Some(3), 1, 3, false)),
            "capacity 3 -> 1, 2 permits held: the holders of the slots up to 2 keep them, and \
             nobody new is admitted until fewer than 1 are held; runs must now ask for \
             --capacity 1 (another is refused, exit 78)"
        );
        assert_eq!(
            describe(&change(Some(1), 2, 2, true)),
            "capacity 1 -> 2, 2 permits held; its waiters were told to try again; runs must now \
             ask for --capacity 2 (another is refused, exit 78)"
        );
        assert_eq!(
            describe(&change(Some(2), 2, 2, false)),
            "the capacity was 2 already, 2 permits held"
        );
        assert!(describe(&change(None, 4, 4, false)).starts_with("no semaphore was recorded"));
    }

    #[test]
    fn the_json_has_every_key_in_order() {
        let purpose = Purpose::new("cli").unwrap();
        assert_eq!(
            to_json(&purpose, &change(Some(3), 1, 3, false)),
            r#"{"previous":3,"capacity":1,"width":3,"held":2,"woke_waiters":false,"purpose":"cli"}"#
        );
        assert_eq!(
            to_json(&purpose, &change(None, 4, 4, false)),
            r#"{"previous":null,"capacity":4,"width":4,"held":2,"woke_waiters":false,"purpose":"cli"}"#
        );
    }
}
