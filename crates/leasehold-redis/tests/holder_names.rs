//! Holder names on real redis-server: stored with the grant, shown by inspection and in
//! contention, never mixed up with the owner token; and the new options' bad input refused
//! before any I/O.

mod common;

use std::time::Duration;

use common::{client, delta, lease_key, request};
use leasehold_redis::leasehold::{
    AcquireOutcome, ErrorKind, HolderName, InspectOutcome, MAX_TTL, ReleaseOutcome,
};
use test_support::RedisServer;

const TTL: Duration = Duration::from_secs(5);

#[tokio::test]
async fn holder_names_round_trip_through_inspect_and_contention() {
    let server = RedisServer::start();
    let client = client(&server);
    let name = HolderName::new("host-3:4711 (nightly, é)").unwrap();
    let first = request(&client, "names/1", "op-a", TTL).with_holder_name(name.clone());
    let lease = client
        .try_acquire(&first)
        .await
        .into_handle()
        .expect("free");
    let token = first.attempt().owner_token().expose_secret().to_owned();

    // Stored after the grant, on a line of its own: the holder field is the name, and the
    // token appears only where it always did.
    let value = server
        .cmd(&["GET", &lease_key(&client, &first)])
        .as_string()
        .expect("stored");
    let parts: Vec<&str> = value.split('\n').collect();
    assert_eq!(
        parts,
        [
            format!("{}:{token}:op-a", lease.fence()).as_str(),
            "",
            name.as_str()
        ]
    );
    assert!(!parts[2].contains(&token));

    let mut shown = Vec::new();
    for attempt in [None, Some(first.attempt())] {
        let outcome = client
            .inspect(first.purpose(), first.resource(), attempt)
            .await;
        let view = match &outcome {
            InspectOutcome::HeldByOther(view) if attempt.is_none() => view,
            InspectOutcome::HeldByThisAttempt(view) if attempt.is_some() => view,
            other => panic!("{attempt:?}: {other:?}"),
        };
        assert_eq!(view.holder_name.as_ref(), Some(&name));
        assert_eq!(view.holder, Some(first.attempt().fingerprint()));
        assert_eq!(view.fence, Some(lease.fence()));
        assert!(!view.released);
        shown.push(format!("{outcome} / {outcome:?}"));
    }
    let second = request(&client, "names/1", "op-b", TTL)
        .with_holder_name(HolderName::new("host-4").unwrap());
    match client.try_acquire(&second).await {
        AcquireOutcome::Contended(c) => {
            assert_eq!(c.holder_name.as_ref(), Some(&name));
            shown.push(format!("{c} / {c:?}"));
        }
        other => panic!("expected Contended, got {other:?}"),
    }
    // The same owner for another operation names the holder too.
    let conflict = first.for_attempt(
        first
            .attempt()
            .with_operation(leasehold_redis::leasehold::OperationId::new("op-c").unwrap()),
    );
    match client.try_acquire(&conflict).await {
        AcquireOutcome::OwnerOperationConflict(c) => {
            assert_eq!(c.holder_name.as_ref(), Some(&name));
            shown.push(format!("{c} / {c:?}"));
        }
        other => panic!("expected OwnerOperationConflict, got {other:?}"),
    }
    shown.push(format!("{first:?} / {second:?} / {lease:?}"));
    for text in &shown {
        assert!(!text.contains(&token), "the token is shown: {text}");
        assert!(text.contains("host-3:4711"), "{text}");
    }
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_name_survives_release_for_the_hold_and_the_longest_name_fits() {
    let server = RedisServer::start();
    let client = client(&server);
    // 128 bytes: the longest name, in two-byte characters.
    let name = HolderName::new(&"é".repeat(64)).unwrap();
    let first = request(&client, "names/2", "op-a", TTL)
        .with_holder_name(name.clone())
        .with_min_hold(Duration::from_secs(3))
        .unwrap();
    let lease = client
        .try_acquire(&first)
        .await
        .into_handle()
        .expect("free");
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    match client
        .inspect(first.purpose(), first.resource(), None)
        .await
    {
        InspectOutcome::HeldByOther(view) => {
            assert_eq!(view.holder_name.as_ref(), Some(&name));
            assert!(view.released);
            assert_eq!(view.holder, Some(first.attempt().fingerprint()));
        }
        other => panic!("{other:?}"),
    }
    let second = request(&client, "names/2", "op-b", TTL);
    match client.try_acquire(&second).await {
        AcquireOutcome::Contended(c) => {
            assert_eq!(c.holder_name.as_ref(), Some(&name));
            assert!(c.released);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_replay_keeps_the_name_it_was_granted_with() {
    let server = RedisServer::start();
    let client = client(&server);
    let first = request(&client, "names/3", "op-a", TTL)
        .with_holder_name(HolderName::new("first-name").unwrap());
    let lease = client
        .try_acquire(&first)
        .await
        .into_handle()
        .expect("free");
    let renamed = first
        .clone()
        .with_holder_name(HolderName::new("second-name").unwrap());
    assert!(matches!(
        client.try_acquire(&renamed).await,
        AcquireOutcome::Replayed(_)
    ));
    match client
        .inspect(first.purpose(), first.resource(), None)
        .await
    {
        InspectOutcome::HeldByOther(view) => {
            assert_eq!(view.holder_name.unwrap().as_str(), "first-name");
        }
        other => panic!("{other:?}"),
    }
    assert!(lease.renew().await.is_renewed());
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
}

/// Like an invalid TTL: a bad holder name or minimum hold is refused before anything is sent.
#[tokio::test]
async fn bad_names_and_holds_send_no_command_and_change_nothing() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.expect("warm up");
    server.cmd(&["SET", "unrelated", "kept"]);
    let before = server.commandstats();
    for bad in [
        String::new(),
        "n".repeat(129),
        "é".repeat(65),
        "two\nlines".to_owned(),
        "nul\0".to_owned(),
        "esc\u{1b}[2J".to_owned(),
        "bidi\u{202E}".to_owned(),
    ] {
        let err = HolderName::new(&bad).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidHolderName, "{bad:?}");
        assert!(err.is_invalid_input());
    }
    let base = request(&client, "names/bad", "op-a", TTL);
    for bad in [
        MAX_TTL + Duration::from_millis(1),
        Duration::from_micros(1500),
        Duration::from_nanos(999_999),
    ] {
        let err = base.clone().with_min_hold(bad).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidMinHold, "{bad:?}");
    }
    let sent = delta(&before, &server.commandstats());
    assert!(sent.is_empty(), "commands were sent: {sent:?}");
    assert_eq!(server.keys(), vec!["unrelated".to_owned()]);
}
