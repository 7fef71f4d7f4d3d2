//! An operator's commands: `leasehold list` (the leases and the semaphores' permits held in a
//! namespace) and `leasehold break` (remove a stuck lease or permit, its fence counter kept).

use leasehold_redis::leasehold::{
    InspectOutcome, LeaseBackend as _, LeaseView, Purpose, ResourceDigest, UnusableKey,
};
use leasehold_redis::{
    Error, ListedLease, ListedSemaphore, ListedSemaphoreState, ListedState, RedisBackend,
};
use serde_json::json;

use crate::config::{BreakConfig, ListConfig, Named, Target};
use crate::exit;
use crate::inspect::{answer, json_fields, parts, permits};
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
    let semaphores = match target.backend.list_semaphores(purpose.as_ref()).await {
        Ok(semaphores) => semaphores,
        Err(e) => return failed(&e, &target.shown, "list the semaphores"),
    };
    let rows = rows(&leases, &semaphores);
    let text = if json {
        let items: Vec<String> = rows.iter().map(Row::json).collect();
        format!("[{}]", items.join(","))
    } else if rows.is_empty() {
        match &purpose {
            Some(p) => format!("no leases of purpose {p} in namespace {namespace}"),
            None => format!("no leases in namespace {namespace}"),
        }
    } else {
        table(&rows)
    };
    answer(&text)
}

/// One row of `list`: a lease, one held permit of a semaphore, or a key that cannot be used.
#[derive(Debug)]
struct Row<'a> {
    purpose: &'a Purpose,
    resource: &'a ResourceDigest,
    /// A semaphore's row, not a lease's.
    semaphore: bool,
    /// The permit's slot.
    slot: Option<u32>,
    /// The grant; `None` for a key that cannot be used.
    view: Option<&'a LeaseView>,
    /// What is wrong with a key that cannot be used (`None`: a state this version does not
    /// know, shown as unusable, never as free).
    problem: Option<UnusableKey>,
}

/// The rows of `leases` and of the held permits of `semaphores`, sorted by purpose and digest,
/// a name's lease before its semaphore's permits, those by slot.
fn rows<'a>(leases: &'a [ListedLease], semaphores: &'a [ListedSemaphore]) -> Vec<Row<'a>> {
    let mut rows = Vec::new();
    for lease in leases {
        let (view, problem) = match &lease.state {
            ListedState::Held(view) => (Some(view), None),
            ListedState::Unusable(what) => (None, Some(*what)),
            _ => (None, None),
        };
        rows.push(Row {
            purpose: &lease.purpose,
            resource: &lease.resource,
            semaphore: false,
            slot: None,
            view,
            problem,
        });
    }
    for semaphore in semaphores {
        let row = |slot, view, problem| Row {
            purpose: &semaphore.purpose,
            resource: &semaphore.resource,
            semaphore: true,
            slot,
            view,
            problem,
        };
        match &semaphore.state {
            // One row per held slot; a semaphore with none held has no row, as a free lease.
            ListedSemaphoreState::Found(view) => {
                for permit in &view.permits {
                    rows.push(row(Some(permit.slot), Some(&permit.view), None));
                }
            }
            ListedSemaphoreState::Unusable(what) => rows.push(row(None, None, Some(*what))),
            _ => rows.push(row(None, None, None)),
        }
    }
    rows.sort_by(|a, b| {
        (a.purpose.as_str(), a.resource.as_str(), a.semaphore, a.slot).cmp(&(
            b.purpose.as_str(),
            b.resource.as_str(),
            b.semaphore,
            b.slot,
        ))
    });
    rows
}

impl Row<'_> {
    /// The row as one `--json` object: its purpose and digest, inspect's keys (or the
    /// problem), then its kind and slot.
    fn json(&self) -> String {
        let head = format!(
            r#""purpose":{},"resource":{}"#,
            json!(self.purpose.as_str()),
            json!(self.resource.as_str())
        );
        let body = match self.view {
            Some(view) => json_fields(Some(view)),
            None => format!(
                r#""state":"unusable","problem":{}"#,
                self.problem
                    .map_or(serde_json::Value::Null, |what| json!(what.to_string()))
            ),
        };
        let kind = if self.semaphore { "semaphore" } else { "lease" };
        let slot = self
            .slot
            .map_or(serde_json::Value::Null, |slot| json!(slot));
        format!(r#"{{{head},{body},"kind":{},"slot":{slot}}}"#, json!(kind))
    }
}

/// Runs `leasehold break` and returns its exit code.
pub(crate) async fn break_lease(config: BreakConfig) -> u8 {
    let BreakConfig {
        target,
        lease,
        slot,
        json,
    } = config;
    if let Some(slot) = slot {
        return break_permit(target, lease, slot, json).await;
    }
    let Named {
        purpose,
        also,
        resource,
        resource_name,
    } = lease;
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
                "{resource_name} (purpose {purpose}): no lease; nothing removed{}{}",
                held_elsewhere(&target.backend, &also, &resource).await,
                semaphore_there(&target.backend, &purpose, &resource).await
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

/// A hint that a semaphore of that name is there, for a `break` that found no lease: its
/// permits are broken one at a time, by slot. Empty when there is none, or it cannot be read.
async fn semaphore_there(
    backend: &RedisBackend,
    purpose: &Purpose,
    resource: &ResourceDigest,
) -> String {
    match backend.inspect_semaphore(purpose, resource).await {
        Ok(Some(view)) if !view.permits.is_empty() => format!(
            "; a semaphore of that name holds {}: name one with --slot K \
             (`leasehold inspect --semaphore` shows them)",
            permits(view.permits.len())
        ),
        _ => String::new(),
    }
}

/// `break --slot K`: one permit of the semaphore `name` names.
async fn break_permit(target: Target, name: Named, slot: u32, json: bool) -> u8 {
    let Named {
        purpose,
        also,
        resource,
        resource_name,
    } = name;
    let removed = match target.backend.break_permit(&purpose, &resource, slot).await {
        Ok(removed) => removed,
        Err(Error::Indeterminate(i)) => {
            eprintln!(
                "leasehold: no answer from Redis at {}: {i}; the permit may or may not have been \
                 removed (`leasehold inspect --semaphore` tells)",
                target.shown
            );
            return exit::UNAVAILABLE;
        }
        Err(e) => return failed(&e, &target.shown, "break the permit"),
    };
    let text = if json {
        format!(
            r#"{{"removed":{},{},"slot":{slot}}}"#,
            removed.is_some(),
            json_fields(removed.as_ref())
        )
    } else {
        match &removed {
            None => format!(
                "{resource_name} (purpose {purpose}): no permit on slot {slot}; nothing \
                 removed{}",
                slot_held_elsewhere(&target.backend, &also, &resource, slot).await
            ),
            Some(view) => {
                let (holder, fence, left) = parts(view);
                format!(
                    "{resource_name} (purpose {purpose}): removed the permit on slot {slot} of \
                     {holder}, {fence}, {left}; the semaphore's fence counter stays, so every \
                     later grant gets a higher fence"
                )
            }
        }
    };
    answer(&text)
}

/// [`held_elsewhere`] for a slot of a semaphore.
async fn slot_held_elsewhere(
    backend: &RedisBackend,
    also: &[Purpose],
    resource: &ResourceDigest,
    slot: u32,
) -> String {
    for purpose in also {
        if let Ok(Some(view)) = backend.inspect_semaphore(purpose, resource).await
            && view.permits.iter().any(|p| p.slot == slot)
        {
            return format!(
                "; slot {slot} of a semaphore of that name is held under purpose {purpose} (the \
                 library's): add --purpose {purpose} to remove it"
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

/// The rows as an aligned table with a header; the SLOT column only when a permit is listed,
/// so that a namespace of leases alone is shown as it always was.
fn table(listed: &[Row<'_>]) -> String {
    let slots = listed.iter().any(|row| row.semaphore);
    let mut header = vec!["PURPOSE".to_owned(), "RESOURCE".to_owned()];
    if slots {
        header.push("SLOT".to_owned());
    }
    header.extend(["FENCE", "LEFT", "HOLDER"].map(str::to_owned));
    let mut rows = vec![header];
    for row in listed {
        let (fence, left, holder) = match (row.view, row.problem) {
            (Some(view), _) => {
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
            (None, Some(what)) => ("-".to_owned(), "-".to_owned(), format!("{what}")),
            (None, None) => ("-".to_owned(), "-".to_owned(), "unknown".to_owned()),
        };
        let mut cells = vec![row.purpose.to_string(), row.resource.to_string()];
        if slots {
            cells.push(
                row.slot
                    .map_or_else(|| "-".to_owned(), |slot| slot.to_string()),
            );
        }
        cells.extend([fence, left, holder]);
        rows.push(cells);
    }
    // Every column but the last (the holder, which may hold spaces) is padded.
    let last = rows[0].len() - 1;
    let widths: Vec<usize> = (0..last)
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (cell, width) in row.iter().zip(&widths) {
                line.push_str(&format!("{cell:<width$}  "));
            }
            line.push_str(&row[last]);
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Says why `what` failed and returns the exit code. Shared by the operator's commands.
pub(crate) fn failed(e: &Error, shown: &str, what: &str) -> u8 {
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
    use leasehold_redis::leasehold::{FenceToken, HolderFingerprint, HolderName};
    use leasehold_redis::{HeldPermit, SemaphoreView};
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

    /// Two held permits (slots 2 and 0) and a semaphore whose record is not leasehold's.
    fn semaphores() -> Vec<ListedSemaphore> {
        let ListedState::Held(view) = lease("cli", Some("host-3:4711")).state else {
            unreachable!()
        };
        let found = SemaphoreView::new(
            Some(3),
            3,
            0,
            vec![
                HeldPermit::new(2, view.clone()),
                HeldPermit::new(0, view.clone()),
            ],
        );
        vec![
            ListedSemaphore::new(
                Purpose::new("cli").unwrap(),
                ResourceDigest::of("r"),
                ListedSemaphoreState::Found(found),
            ),
            ListedSemaphore::new(
                Purpose::new("cli").unwrap(),
                ResourceDigest::of("odd"),
                ListedSemaphoreState::Unusable(UnusableKey::SemaphoreForeignValue),
            ),
        ]
    }

    #[test]
    fn the_json_adds_purpose_and_digest_to_inspects_keys_and_kind_and_slot_after() {
        let digest = ResourceDigest::of("r");
        let leases = [lease("cli", Some("host-3:4711"))];
        let json: Vec<String> = rows(&leases, &[]).iter().map(Row::json).collect();
        assert_eq!(
            json,
            [format!(
                r#"{{"purpose":"cli","resource":"{digest}","state":"held","fence":7,"remaining_ms":29812,"holder":"a9993e364706816a","holder_name":"host-3:4711","released":false,"kind":"lease","slot":null}}"#
            )]
        );
        let unusable = [ListedLease::new(
            Purpose::new("cli").unwrap(),
            digest.clone(),
            ListedState::Unusable(UnusableKey::LeaseWrongType),
        )];
        let parsed: serde_json::Value =
            serde_json::from_str(&rows(&unusable, &[])[0].json()).unwrap();
        assert_eq!(parsed["state"], "unusable");
        // A permit per held slot, in slot order after the name's lease; an unusable semaphore
        // is one row, of no slot.
        let semaphores = semaphores();
        let parsed: Vec<serde_json::Value> = rows(&leases, &semaphores)
            .iter()
            .map(|row| serde_json::from_str(&row.json()).unwrap())
            .collect();
        let kinds: Vec<(&str, &str, serde_json::Value)> = parsed
            .iter()
            .map(|p| {
                (
                    p["kind"].as_str().unwrap(),
                    p["state"].as_str().unwrap(),
                    p["slot"].clone(),
                )
            })
            .collect();
        let odd_first = ResourceDigest::of("odd").as_str() < digest.as_str();
        let mut expected = vec![
            ("lease", "held", serde_json::Value::Null),
            ("semaphore", "held", json!(0)),
            ("semaphore", "held", json!(2)),
        ];
        let odd = ("semaphore", "unusable", serde_json::Value::Null);
        if odd_first {
            expected.insert(0, odd);
        } else {
            expected.push(odd);
        }
        assert_eq!(kinds, expected);
    }

    #[test]
    fn the_table_aligns_its_columns_under_a_header() {
        let leases = [lease("cli", Some("host-3:4711")), lease("billing-x", None)];
        let text = table(&rows(&leases, &[]));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("PURPOSE    RESOURCE"), "{text}");
        assert!(!lines[0].contains("SLOT"), "{text}");
        let column = lines[0].find("FENCE").unwrap();
        assert_eq!(&lines[1][column..column + 1], "7", "{text}");
        assert!(lines[1].ends_with("a9993e364706816a"), "{text}");
        assert!(
            lines[2].ends_with("a9993e364706816a (\"host-3:4711\")"),
            "{text}"
        );
        // With a permit listed, a SLOT column: "-" for a lease.
        let semaphores = semaphores();
        let text = table(&rows(&leases[..1], &semaphores[..1]));
        let lines: Vec<&str> = text.lines().collect();
        let column = lines[0].find("SLOT").expect("a SLOT column");
        let slots: Vec<&str> = lines[1..]
            .iter()
            .map(|line| &line[column..column + 1])
            .collect();
        assert_eq!(slots, ["-", "0", "2"], "{text}");
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
