//! An operator's commands: `leasehold list` (the leases held in a namespace) and `leasehold
//! break` (remove a stuck one, its fence counter kept).

use leasehold_redis::leasehold::{
    InspectOutcome, LeaseBackend as _, LeaseView, Purpose, ResourceDigest,
};
use leasehold_redis::{Error, ListedLease, ListedState, RedisBackend};
use serde_json::json;

use crate::config::{BreakConfig, ListConfig, Named};
use crate::exit;
use crate::inspect::{answer, json_fields, parts};
use crate::remedy;

/// Runs `leasehold list` and returns its exit code.
pub(crate) async fn list(config: ListConfig) -> u8 {
    let ListConfig {
        target,
        purpose,
        json,
    } = config;
    let namespace = target.backend.settings().namespace().to_owned();
    let leases = match target.backend.list(purpose.as_ref()).await {
        Ok(leases) => leases,
        Err(e) => return failed(&e, &target.shown, "list the leases"),
    };
    let text = if json {
        let items: Vec<String> = leases.iter().map(listed_json).collect();
        format!("[{}]", items.join(","))
    } else if leases.is_empty() {
        match &purpose {
            Some(p) => format!("no leases of purpose {p} in namespace {namespace}"),
            None => format!("no leases in namespace {namespace}"),
        }
    } else {
        table(&leases)
    };
    answer(&text)
}

/// Runs `leasehold break` and returns its exit code.
pub(crate) async fn break_lease(config: BreakConfig) -> u8 {
    let BreakConfig {
        target,
        lease:
            Named {
                purpose,
                also,
                resource,
                resource_name,
            },
        json,
    } = config;
    let removed = match target.backend.break_lease(&purpose, &resource).await {
        Ok(removed) => removed,
        Err(Error::Indeterminate(i)) => {
            eprintln!(
                "leasehold: no answer from Redis at {}: {i}; the lease may or may not have been \
                 removed (`leasehold inspect` tells)",
                target.shown
            );
            return exit::UNAVAILABLE;
        }
        Err(e) => return failed(&e, &target.shown, "break the lease"),
    };
    let text = if json {
        format!(
            r#"{{"removed":{},{}}}"#,
            removed.is_some(),
            json_fields(removed.as_ref())
        )
    } else {
        match &removed {
            None => format!(
                "{resource_name} (purpose {purpose}): no lease; nothing removed{}",
                held_elsewhere(&target.backend, &also, &resource).await
            ),
            Some(view) => removed_sentence(&resource_name, &purpose.to_string(), view),
        }
    };
    answer(&text)
}

/// Where else a lease of that name is held, among the library's default purposes a name
/// alone was also looked up under, as a hint to add `--purpose` (`break` removes only what it
/// was named: never a lease of another purpose without being told).
async fn held_elsewhere(
    backend: &RedisBackend,
    also: &[Purpose],
    resource: &ResourceDigest,
) -> String {
    for purpose in also {
        if let InspectOutcome::HeldByOther(_) = backend.inspect(purpose, resource, None).await {
            return format!(
                "; a lease of that name is held under purpose {purpose} (the library's): add \
                 --purpose {purpose} to remove it"
            );
        }
    }
    String::new()
}

/// What `break` says it removed.
fn removed_sentence(resource: &str, purpose: &str, view: &LeaseView) -> String {
    let (holder, fence, left) = parts(view);
    let kept = match view.fence {
        Some(f) => format!("the fence counter stays at {f}, so the next grant gets a higher one"),
        None => "the fence counter stays".to_owned(),
    };
    format!(
        "{resource} (purpose {purpose}): removed the lease of {holder}, {fence}, {left}; {kept}"
    )
}

/// A lease as one `--json` object: its purpose and digest, then inspect's keys.
fn listed_json(lease: &ListedLease) -> String {
    let head = format!(
        r#""purpose":{},"resource":{}"#,
        json!(lease.purpose.as_str()),
        json!(lease.resource.as_str())
    );
    match &lease.state {
        ListedState::Held(view) => format!("{{{head},{}}}", json_fields(Some(view))),
        ListedState::Unusable(what) => format!(
            r#"{{{head},"state":"unusable","problem":{}}}"#,
            json!(what.to_string())
        ),
        // A state this version does not know: shown as unusable, never as free.
        _ => format!(r#"{{{head},"state":"unusable","problem":null}}"#),
    }
}

/// The leases as an aligned table with a header.
fn table(leases: &[ListedLease]) -> String {
    let mut rows = vec![[
        "PURPOSE".to_owned(),
        "RESOURCE".to_owned(),
        "FENCE".to_owned(),
        "LEFT".to_owned(),
        "HOLDER".to_owned(),
    ]];
    for lease in leases {
        let (fence, left, holder) = match &lease.state {
            ListedState::Held(view) => {
                let (holder, _, _) = parts(view);
                let fence = view.fence.map_or_else(|| "-".to_owned(), |f| f.to_string());
                let left = view.server_ttl.map_or_else(
                    || "no expiry".to_owned(),
                    |d| crate::duration::format_duration(d).to_string(),
                );
                let holder = if view.released {
                    format!("{holder}, released, kept for its minimum hold")
                } else {
                    holder
                };
                (fence, left, holder)
            }
            ListedState::Unusable(what) => ("-".to_owned(), "-".to_owned(), format!("{what}")),
            _ => ("-".to_owned(), "-".to_owned(), "unknown".to_owned()),
        };
        rows.push([
            lease.purpose.to_string(),
            lease.resource.to_string(),
            fence,
            left,
            holder,
        ]);
    }
    let widths: Vec<usize> = (0..4)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (cell, width) in row.iter().zip(&widths) {
                line.push_str(&format!("{cell:<width$}  "));
            }
            line.push_str(&row[4]);
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Says why `what` failed and returns the exit code.
fn failed(e: &Error, shown: &str, what: &str) -> u8 {
    match e {
        Error::Unavailable(u) => {
            if let Some(code) = exit::lasting_refusal(u, shown) {
                return code;
            }
            eprintln!("leasehold: Redis unavailable at {shown}, could not {what}: {u}");
            remedy::tell_for(u, shown);
        }
        Error::Indeterminate(i) => {
            eprintln!("leasehold: no answer from Redis at {shown}, could not {what}: {i}");
        }
        other => eprintln!("leasehold: could not {what} at {shown}: {other}"),
    }
    exit::UNAVAILABLE
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_redis::leasehold::{
        FenceToken, HolderFingerprint, HolderName, Purpose, ResourceDigest, UnusableKey,
    };
    use std::time::Duration;

    fn lease(purpose: &str, name: Option<&str>) -> ListedLease {
        let mut view = LeaseView::new(
            FenceToken::new(7),
            Some(Duration::from_millis(29_812)),
            HolderFingerprint::parse("a9993e364706816a"),
        );
        if let Some(name) = name {
            view = view.with_holder_name(HolderName::new(name).unwrap());
        }
        ListedLease::new(
            Purpose::new(purpose).unwrap(),
            ResourceDigest::of("r"),
            ListedState::Held(view),
        )
    }

    #[test]
    fn the_json_adds_purpose_and_digest_to_inspects_keys() {
        let digest = ResourceDigest::of("r");
        assert_eq!(
            listed_json(&lease("cli", Some("host-3:4711"))),
            format!(
                r#"{{"purpose":"cli","resource":"{digest}","state":"held","fence":7,"remaining_ms":29812,"holder":"a9993e364706816a","holder_name":"host-3:4711","released":false}}"#
            )
        );
        let unusable = ListedLease::new(
            Purpose::new("cli").unwrap(),
            digest.clone(),
            ListedState::Unusable(UnusableKey::LeaseWrongType),
        );
        let parsed: serde_json::Value = serde_json::from_str(&listed_json(&unusable)).unwrap();
        assert_eq!(parsed["state"], "unusable");
    }

    #[test]
    fn the_table_aligns_its_columns_under_a_header() {
        let text = table(&[lease("cli", Some("host-3:4711")), lease("billing-x", None)]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("PURPOSE    RESOURCE"), "{text}");
        let column = lines[0].find("FENCE").unwrap();
        assert_eq!(&lines[1][column..column + 1], "7", "{text}");
        assert!(
            lines[1].ends_with("a9993e364706816a (\"host-3:4711\")"),
            "{text}"
        );
        assert!(lines[2].ends_with("a9993e364706816a"), "{text}");
    }

    #[test]
    fn break_says_what_it_removed_and_that_the_fence_stays() {
        let ListedState::Held(view) = lease("cli", Some("host-3:4711")).state else {
            unreachable!()
        };
        assert_eq!(
            removed_sentence("nightly", "cli", &view),
            "nightly (purpose cli): removed the lease of a9993e364706816a (\"host-3:4711\"), \
             fence 7, 29s 812ms left; the fence counter stays at 7, so the next grant gets a \
             higher one"
        );
    }
}
