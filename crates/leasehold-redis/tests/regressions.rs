//! Regression tests for the original's defects, and error classification on a real server.

mod common;

use std::time::Duration;

use common::{client, client_commands, client_with, delta, lease_key, pttl, request};
use leasehold_redis::RedisBackend;
use leasehold_redis::leasehold::{
    AcquireOutcome, BootClock, Clock, DriftBudget, ErrorKind, FenceToken, IndeterminateCause,
    InspectOutcome, LeaseRequest, LeaseState, LossCause, OperationId, Purpose, ReleaseOutcome,
    RenewOutcome, ResourceDigest, UnavailableCause, UnusableKey,
};
use test_support::{FaultProxy, ProxyFault, RedisServer, Reply};

/// Defect 3: a replay used to be granted the full TTL again.
#[tokio::test]
async fn a_replay_never_outlives_the_servers_key() {
    let server = RedisServer::start();
    let client = client(&server);
    let ttl = Duration::from_secs(2);
    let req = request(&client, "d3", "op-a", ttl);
    let first = client.try_acquire(&req).await.into_handle().expect("held");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let replay = match client.try_acquire(&req).await {
        AcquireOutcome::Replayed(h) => h,
        other => panic!("expected Replayed, got {other:?}"),
    };
    let remaining = replay.remaining_validity();
    let server_left = pttl(&server, &lease_key(&client, &req));
    assert!(server_left > 0, "the key expired early: {server_left}");
    assert!(
        remaining <= Duration::from_millis(u64::try_from(server_left).unwrap()),
        "replay believes {remaining:?}, the server keeps the key {server_left} ms"
    );
    assert!(remaining <= Duration::from_millis(500), "{remaining:?}");
    assert_eq!(replay.fence(), first.fence());
    let _ = replay.release().await;
}

/// Defect 6: the observed server expiry ignored the reply's PTTL.
#[tokio::test]
async fn observed_server_expiry_is_within_the_replys_pttl() {
    let server = RedisServer::start();
    let client = client(&server);
    let ttl = Duration::from_secs(3);
    let req = request(&client, "d6", "op-a", ttl);
    let before = BootClock.now();
    let lease = client.try_acquire(&req).await.into_handle().expect("held");
    let after = BootClock.now();
    assert!(lease.observed_server_expiry() >= before + ttl);
    assert!(lease.observed_server_expiry() <= after + ttl);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let replay = client
        .try_acquire(&req)
        .await
        .into_handle()
        .expect("replayed");
    let left =
        Duration::from_millis(u64::try_from(pttl(&server, &lease_key(&client, &req))).unwrap());
    // Read after the PTTL reply: the server's expiry is at most `left` (plus PTTL's millisecond
    // rounding) after this instant, and the replay's observed expiry is never later than it.
    let read_after = BootClock.now();
    // The replay's PTTL is what was left of the first grant, not a fresh TTL.
    assert!(replay.observed_server_expiry() <= read_after + left + Duration::from_millis(1));
    // Never later than the first grant's expiry either: at most a TTL after its reply, plus
    // the millisecond PTTL rounds away (the server counts in whole milliseconds of its wall
    // clock, which may also be slewed against the boot clock by up to 0.5 ms a second): 2 ms
    // at most, where a fresh TTL would be 400 ms over.
    assert!(replay.observed_server_expiry() <= after + ttl + Duration::from_millis(2));
    assert!(replay.valid_until() < replay.observed_server_expiry());
    let _ = replay.release().await;
}

/// Defect 9: a TTL not above the drift budget was refused only after the script had run.
#[tokio::test]
async fn an_invalid_ttl_sends_no_command_and_changes_nothing() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.expect("warm up");
    server.cmd(&["SET", "unrelated", "kept"]);
    let before = server.commandstats();
    let attempt = client.new_attempt(OperationId::new("op").unwrap()).unwrap();
    for ttl in [0, 1, 10] {
        let refused = client.request(
            Purpose::new("test").unwrap(),
            ResourceDigest::of("d9"),
            attempt.clone(),
            Duration::from_millis(ttl),
        );
        assert_eq!(
            refused.unwrap_err().kind(),
            ErrorKind::InvalidTtl,
            "{ttl} ms"
        );
    }
    let zero_drift = DriftBudget::new(Duration::from_millis(50), 0).unwrap();
    assert!(
        LeaseRequest::new(
            Purpose::new("test").unwrap(),
            ResourceDigest::of("d9"),
            attempt,
            Duration::from_millis(50),
            zero_drift,
        )
        .is_err()
    );
    let sent = delta(&before, &server.commandstats());
    assert!(sent.is_empty(), "commands were sent: {sent:?}");
    assert_eq!(
        server.cmd(&["GET", "unrelated"]).as_string(),
        Some("kept".into())
    );
    assert_eq!(server.keys(), vec!["unrelated".to_owned()]);
}

/// Scripts are loaded once; after SCRIPT FLUSH, NOSCRIPT loads them again and retries once.
#[tokio::test]
async fn noscript_after_script_flush_recovers() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "flush", "op-a", Duration::from_secs(5));
    let lease = client.try_acquire(&req).await.into_handle().expect("held");
    server.cmd(&["SCRIPT", "FLUSH"]);
    let before = server.commandstats();
    assert!(lease.renew().await.is_renewed());
    let sent = client_commands(&delta(&before, &server.commandstats()));
    assert_eq!(sent.get("evalsha"), Some(&2), "{sent:?}");
    assert_eq!(sent.get("script|load"), Some(&1), "{sent:?}");
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
}

/// Issue 34: acquires sent together are sent again after NOSCRIPT (a `SCRIPT FLUSH`, a
/// restart), and the resend used to carry the acquire of a caller dropped meanwhile. That
/// caller's cleanup had gone out at once, between the refused command and its resend, so the
/// resend made a grant after its cleanup: a lease nobody held, for its whole TTL.
///
/// The replies are held back (a proxy) while the batch's first EVALSHA is refused, half its
/// callers are dropped, and then let through: the resend follows.
#[tokio::test]
async fn a_dropped_acquire_resent_after_noscript_leaves_no_grant() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let settings = common::settings()
        .with_command_timeout(Duration::from_secs(10))
        .expect("valid timeout");
    let client = RedisBackend::open(&proxy.url(), settings)
        .expect("valid URL")
        .into_client();
    client.backend().warm_up().await.expect("warm up");
    server.cmd(&["SCRIPT", "FLUSH"]);
    proxy.to_client(ProxyFault::Hold);
    let before = server.commandstats();
    let ttl = Duration::from_secs(60);
    // One acquire alone keeps a command in flight, so that the next ones are sent together.
    let first = request(&client, "orphan/first", "op", ttl);
    let alone = {
        let client = client.clone();
        let first = first.clone();
        tokio::spawn(async move { client.acquire(&first).await })
    };
    tokio::task::yield_now().await;
    // With a wait: a dropped `acquire` (unlike `try_acquire`) cleans up behind itself.
    let requests: Vec<_> = (0..16)
        .map(|i| {
            request(&client, &format!("orphan/{i}"), "op", ttl)
                .with_wait_timeout(Duration::from_secs(30))
                .expect("valid wait")
        })
        .collect();
    let mut tasks: Vec<_> = requests
        .iter()
        .map(|req| {
            let client = client.clone();
            let req = req.clone();
            tokio::spawn(async move { client.acquire(&req).await })
        })
        .collect();
    // Both commands reached the server (and were refused: no script); no reply came back.
    let evalsha = |server: &RedisServer| {
        client_commands(&delta(&before, &server.commandstats()))
            .get("evalsha")
            .copied()
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while evalsha(&server) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the acquires were not sent"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Half the batch's callers give up; their cleanups start.
    for task in tasks.iter().step_by(2) {
        task.abort();
    }
    // Give a cleanup sent at once the time to reach the server before the replies pass.
    let cleanups = |server: &RedisServer| {
        client_commands(&delta(&before, &server.commandstats()))
            .get("eval")
            .copied()
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_millis(500);
    while cleanups(&server) < 8 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.to_client(ProxyFault::Pass);
    assert!(matches!(alone.await.unwrap(), AcquireOutcome::Acquired(_)));
    for (i, task) in tasks.drain(..).enumerate() {
        let outcome = task.await;
        if i % 2 == 1 {
            let outcome = outcome.expect("not aborted");
            assert!(
                matches!(outcome, AcquireOutcome::Acquired(_)),
                "{i}: {outcome}"
            );
        }
    }
    tokio::time::timeout(Duration::from_secs(20), client.settle())
        .await
        .expect("the cleanups finished");
    // The batch was sent again after NOSCRIPT, with the dropped callers' entries in it.
    assert!(
        evalsha(&server) >= 3,
        "no resend: the test did not reach its case"
    );
    for (i, req) in requests.iter().enumerate().step_by(2) {
        let found = server.cmd(&["EXISTS", &lease_key(&client, req)]);
        assert_eq!(
            found,
            Reply::Int(0),
            "acquire {i} was dropped, yet its grant is held"
        );
    }
}

/// Issue 34: while a server stalls, the commands waiting for a new connection used to try the
/// connect in turn, each after the last had timed out (one call took 6 s against a 1 s connect
/// timeout and a 0.2 s command timeout). Each now waits for the connect under way at most and
/// takes its answer: every call ends within its own timeouts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_waiting_on_a_stalled_reconnect_finish_within_their_own_bound() {
    let server = RedisServer::start();
    let connect_timeout = Duration::from_millis(300);
    let settings = common::settings()
        .with_connect_timeout(connect_timeout)
        .expect("valid timeout");
    let client = client_with(&server, settings.clone());
    client.backend().warm_up().await.expect("warm up");
    // The connection is closed, and the server then stops answering: connects are accepted
    // by the kernel and never answered.
    server.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
    let paused = server.pause();
    let req = request(&client, "stalled", "op", Duration::from_secs(5));
    // Whatever the first call meets (the closed connection, or a connect that times out), the
    // next ones must reconnect.
    let _ = client.inspect(req.purpose(), req.resource(), None).await;
    let bound = connect_timeout + settings.command_timeout();
    let calls: Vec<_> = (0..64)
        .map(|_| {
            let client = client.clone();
            let req = req.clone();
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let outcome = client.inspect(req.purpose(), req.resource(), None).await;
                (started.elapsed(), outcome)
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for call in calls {
        let (took, outcome) = call.await.expect("the call ran");
        assert!(
            matches!(outcome, InspectOutcome::Unavailable(_)),
            "nothing can be read from a stopped server: {outcome:?}"
        );
        slowest = slowest.max(took);
    }
    paused.resume();
    // A margin for a loaded machine; the defect took 64 connect timeouts (19 s) for the last.
    assert!(
        slowest < bound + Duration::from_secs(1),
        "the slowest of 64 calls took {slowest:?}, beyond its {bound:?} of timeouts"
    );
    eprintln!("64 calls on a stalled reconnect: the slowest took {slowest:?} (bound {bound:?})");
}

/// After warm-up every operation is exactly one round trip: one EVALSHA, nothing else.
#[tokio::test]
async fn every_operation_is_one_round_trip_after_warm_up() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.expect("warm up");
    let req = request(&client, "rtt", "op-a", Duration::from_secs(5));
    let other = request(&client, "rtt", "op-b", Duration::from_secs(5));
    let step = |name: &str, before: &std::collections::BTreeMap<String, u64>| {
        let sent = client_commands(&delta(before, &server.commandstats()));
        assert_eq!(
            sent,
            [("evalsha".to_owned(), 1)].into_iter().collect(),
            "{name} sent {sent:?}"
        );
        server.commandstats()
    };
    let before = server.commandstats();
    let lease = client.try_acquire(&req).await.into_handle().expect("held");
    let before = step("acquire", &before);
    assert!(matches!(
        client.try_acquire(&other).await,
        AcquireOutcome::Contended(_)
    ));
    let before = step("contended acquire", &before);
    assert!(matches!(
        client.try_acquire(&req).await,
        AcquireOutcome::Replayed(_)
    ));
    let before = step("replay", &before);
    assert!(lease.renew().await.is_renewed());
    let before = step("renew", &before);
    assert!(matches!(
        client
            .inspect(req.purpose(), req.resource(), Some(req.attempt()))
            .await,
        InspectOutcome::HeldByThisAttempt(_)
    ));
    let before = step("inspect", &before);
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    step("release", &before);
}

/// Defect 5: "not sent" and "sent, outcome unknown" must be told apart.
#[tokio::test]
async fn a_stopped_server_is_indeterminate_and_a_refusing_one_unavailable() {
    let mut server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.expect("warm up");
    let req = request(&client, "d5", "op-a", Duration::from_secs(5));
    {
        let _paused = server.pause();
        match client.try_acquire(&req).await {
            AcquireOutcome::Indeterminate { operation, cause } => {
                assert_eq!(operation.as_str(), "op-a");
                assert_eq!(cause.cause, IndeterminateCause::ResponseTimeout);
            }
            other => panic!("expected Indeterminate, got {other:?}"),
        }
    }
    // The stalled command ran once the server resumed: replaying the same attempt finds it.
    let lease = loop_until_replayed(&client, &req).await;
    assert_eq!(
        common::fence_counter(&server, &client, &req),
        Some(lease.fence().to_string()),
        "the replay made a second grant"
    );
    server.kill();
    let fresh = common::client(&server);
    match fresh
        .try_acquire(&request(&fresh, "d5", "op-b", Duration::from_secs(5)))
        .await
    {
        AcquireOutcome::Unavailable(u) => assert_eq!(u.cause, UnavailableCause::ConnectionRefused),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    // The old client's connection is dead: at most one Indeterminate, then Unavailable.
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        outcomes.push(lease.renew().await);
    }
    assert!(
        matches!(outcomes.last(), Some(RenewOutcome::Unavailable(u)) if u.cause == UnavailableCause::ConnectionRefused),
        "{outcomes:?}"
    );
    assert!(outcomes.iter().all(|o| matches!(
        o,
        RenewOutcome::Indeterminate(_) | RenewOutcome::Unavailable(_)
    )));
}

async fn loop_until_replayed(
    client: &leasehold_redis::RedisLeases,
    req: &LeaseRequest,
) -> leasehold_redis::leasehold::LeaseHandle<RedisBackend> {
    // Bounded: the resumed server answers within a few command timeouts.
    for _ in 0..10 {
        match client.try_acquire(req).await {
            AcquireOutcome::Replayed(h) => return h,
            AcquireOutcome::Indeterminate { .. } => continue,
            other => panic!("expected Replayed, got {other:?}"),
        }
    }
    panic!("no Replayed within ten tries");
}

/// A local in-flight limit gives Overloaded, without sending anything.
#[tokio::test]
async fn the_in_flight_limit_gives_overloaded() {
    let server = RedisServer::start();
    let settings = common::settings().with_max_in_flight(1).unwrap();
    let client = client_with(&server, settings);
    client.backend().warm_up().await.expect("warm up");
    let first = request(&client, "busy", "op-a", Duration::from_secs(5));
    let second = request(&client, "busy", "op-b", Duration::from_secs(5));
    let _paused = server.pause();
    // `join!` polls the first future first: it takes the only permit before it awaits.
    let (a, b) = tokio::join!(client.try_acquire(&first), client.try_acquire(&second));
    assert!(matches!(a, AcquireOutcome::Indeterminate { .. }), "{a:?}");
    assert!(matches!(b, AcquireOutcome::Overloaded), "{b:?}");
}

/// READONLY, NOPERM, OOM and BUSY are refusals before execution: not applied.
#[tokio::test]
async fn a_replica_refuses_writes_as_unavailable_and_still_inspects() {
    // Replicated at once, not after the default 5 s wait for more replicas to sync with.
    let primary = RedisServer::start_with_args(&["--repl-diskless-sync-delay", "0"]);
    let replica = RedisServer::start();
    replica.cmd(&["REPLICAOF", "127.0.0.1", &primary.port().to_string()]);
    // Synced first: a replica loading the primary's snapshot answers nothing meanwhile, and
    // the inspection below, on a new connection, would then time out (seen on Valkey).
    common::eventually("the replica in sync", Duration::from_secs(30), || {
        let info = replica
            .cmd(&["INFO", "replication"])
            .as_string()
            .unwrap_or_default();
        info.lines().any(|l| l.trim() == "master_link_status:up")
    })
    .await;
    let client = client(&replica);
    let req = request(&client, "ro", "op-a", Duration::from_secs(5));
    match client.try_acquire(&req).await {
        AcquireOutcome::Unavailable(u) => assert_eq!(u.cause, UnavailableCause::ReadOnly, "{u}"),
        other => panic!("expected Unavailable(ReadOnly), got {other:?}"),
    }
    assert_eq!(
        client.inspect(req.purpose(), req.resource(), None).await,
        InspectOutcome::Free
    );
    // A watch's read (an election observer's) marks the grant it finds, a write the replica
    // refuses: it reads as an inspection instead, and the holder's grant stays unmarked.
    use leasehold_redis::leasehold::LeaseBackend as _;
    let on_primary = common::client(&primary);
    let held = request(&on_primary, "ro", "op-b", Duration::from_secs(60));
    let lease = on_primary
        .try_acquire(&held)
        .await
        .into_handle()
        .expect("free on the primary");
    let key = common::lease_key(&client, &req);
    common::eventually("the grant on the replica", Duration::from_secs(30), || {
        replica.cmd(&["EXISTS", &key]).as_int() == Some(1)
    })
    .await;
    let refusals = || -> u64 {
        let info = replica
            .cmd(&["INFO", "errorstats"])
            .as_string()
            .unwrap_or_default();
        info.lines()
            .find_map(|l| l.strip_prefix("errorstat_READONLY:count="))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    };
    for read in 0..2 {
        let before = refusals();
        match client
            .backend()
            .inspect_watched(req.purpose(), req.resource())
            .await
        {
            InspectOutcome::HeldByOther(view) => assert_eq!(view.fence, Some(lease.fence())),
            other => panic!("expected the primary's grant, got {other:?}"),
        }
        // The first read tried the mark and was refused; the next goes straight to a plain
        // inspection, without a refused write (and the reconnect that follows it) per read.
        assert_eq!(refusals() - before, u64::from(read == 0), "read {read}");
    }
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn missing_permissions_are_unavailable_and_the_password_stays_secret() {
    let server = RedisServer::start();
    server.cmd(&[
        "ACL",
        "SETUSER",
        "limited",
        "on",
        ">s3cret-pw",
        "~*",
        "+@all",
        "-evalsha",
    ]);
    let url = format!("redis://limited:s3cret-pw@127.0.0.1:{}", server.port());
    let backend = RedisBackend::open(&url, common::settings()).unwrap();
    assert!(!format!("{backend:?}").contains("s3cret-pw"));
    let client = backend.into_client();
    let req = request(&client, "perm", "op-a", Duration::from_secs(5));
    match client.try_acquire(&req).await {
        AcquireOutcome::Unavailable(u) => {
            assert_eq!(u.cause, UnavailableCause::NoPermission, "{u}");
            assert!(!u.detail.contains("s3cret-pw"));
        }
        other => panic!("expected Unavailable(NoPermission), got {other:?}"),
    }
    let wrong = format!("redis://limited:wrong-pw@127.0.0.1:{}", server.port());
    let client = RedisBackend::open(&wrong, common::settings())
        .unwrap()
        .into_client();
    match client.try_acquire(&req).await {
        AcquireOutcome::Unavailable(u) => {
            assert_eq!(u.cause, UnavailableCause::NoPermission, "{u}");
            assert!(!format!("{u:?}").contains("wrong-pw"));
        }
        other => panic!("expected Unavailable(NoPermission), got {other:?}"),
    }
}

#[tokio::test]
async fn out_of_memory_refuses_acquire_but_still_releases() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "oom", "op-a", Duration::from_secs(5));
    let lease = client.try_acquire(&req).await.into_handle().expect("held");
    server.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let other = request(&client, "oom-2", "op-b", Duration::from_secs(5));
    match client.try_acquire(&other).await {
        AcquireOutcome::Unavailable(u) => assert_eq!(u.cause, UnavailableCause::OutOfMemory, "{u}"),
        other => panic!("expected Unavailable(OutOfMemory), got {other:?}"),
    }
    assert!(lease.renew().await.is_renewed());
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_server_busy_with_a_script_is_unavailable() {
    let server = RedisServer::start_with_args(&["--busy-reply-threshold", "50"]);
    let client = client(&server);
    client.backend().warm_up().await.expect("warm up");
    let port = server.port();
    let blocker = std::thread::spawn(move || {
        // A script that spins until SCRIPT KILL.
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let script = "local i = 0 while true do i = i + 1 end";
        let cmd = format!(
            "*3\r\n$4\r\nEVAL\r\n${}\r\n{script}\r\n$1\r\n0\r\n",
            script.len()
        );
        std::io::Write::write_all(&mut stream, cmd.as_bytes()).unwrap();
        let mut buf = [0u8; 256];
        let _ = std::io::Read::read(&mut stream, &mut buf);
    });
    // Bounded: wait until the server answers BUSY to everyone.
    let busy = (0..500).any(|_| {
        let reply = server.cmd(&["PING"]);
        let busy = matches!(&reply, test_support::Reply::Error(e) if e.starts_with("BUSY"));
        if !busy {
            std::thread::sleep(Duration::from_millis(10));
        }
        busy
    });
    assert!(busy, "the spinning script never made the server busy");
    let req = request(&client, "busy", "op-a", Duration::from_secs(5));
    match client.try_acquire(&req).await {
        AcquireOutcome::Unavailable(u) => assert_eq!(u.cause, UnavailableCause::Busy, "{u}"),
        other => panic!("expected Unavailable(Busy), got {other:?}"),
    }
    server.cmd(&["SCRIPT", "KILL"]);
    blocker.join().unwrap();
    // Busy was a refusal: nothing is held, and the resource is free.
    assert_eq!(
        client.inspect(req.purpose(), req.resource(), None).await,
        InspectOutcome::Free
    );
}

/// No owner token in any Debug, Display or error text.
#[tokio::test]
async fn owner_tokens_never_appear_in_text() {
    let server = RedisServer::start();
    let client = client(&server);
    let holder = request(&client, "secret", "op-a", Duration::from_secs(5));
    let contender = request(&client, "secret", "op-b", Duration::from_secs(5));
    let tokens = [
        holder.attempt().owner_token().expose_secret().to_owned(),
        contender.attempt().owner_token().expose_secret().to_owned(),
    ];
    let mut texts = vec![
        format!("{holder:?}"),
        format!("{}", holder.attempt()),
        format!("{:?}", holder.attempt().owner_token()),
        format!("{client:?}"),
    ];
    let acquired = client.try_acquire(&holder).await;
    texts.push(format!("{acquired:?}"));
    let lease = acquired.into_handle().expect("held");
    texts.push(format!("{lease:?}"));
    texts.push(format!("{:?}", client.try_acquire(&contender).await));
    texts.push(format!("{:?}", client.try_acquire(&holder).await));
    texts.push(format!(
        "{:?}",
        client
            .inspect(holder.purpose(), holder.resource(), Some(holder.attempt()))
            .await
    ));
    {
        let _paused = server.pause();
        let outcome = lease.renew().await;
        texts.push(format!("{outcome:?}"));
        if let RenewOutcome::Indeterminate(i) = &outcome {
            texts.push(i.to_string());
        }
    }
    texts.push(format!("{:?}", lease.release().await));
    texts.push(format!("{:?}", lease.state()));
    let invalid = client.request(
        holder.purpose().clone(),
        holder.resource().clone(),
        holder.attempt().clone(),
        Duration::ZERO,
    );
    texts.push(format!("{:?}", invalid.as_ref().unwrap_err()));
    texts.push(invalid.unwrap_err().to_string());
    for text in &texts {
        for token in &tokens {
            assert!(!text.contains(token.as_str()), "token in {text}");
        }
    }
    assert_ne!(lease.state(), LeaseState::Active);
}

/// Fences are exact over their whole range: granted, stored, inspected, renewed and released
/// at the edges where Lua numbers print as `1e+14` (10^14) or round (2^53), and refused with
/// nothing written at the top (2^63 − 1).
#[tokio::test]
async fn fences_are_exact_at_every_edge_of_their_range() {
    let server = RedisServer::start();
    let client = client(&server);
    let top = FenceToken::MAX.get();
    for (i, counter) in [
        99_999_999_999_999u64,
        100_000_000_000_000,
        (1 << 53) - 1,
        1 << 53,
        // Above the clock (until 2286): the successor carries through every digit, and
        // through the last three.
        10u64.pow(16) - 1,
        10u64.pow(17) + 999,
        top - 1,
    ]
    .into_iter()
    .enumerate()
    {
        let req = request(&client, "edges", &format!("op-{i}"), Duration::from_secs(5));
        let fence_key = format!("{}:fence", lease_key(&client, &req));
        server.cmd(&["SET", &fence_key, &counter.to_string()]);
        let before = common::server_micros(&server);
        let lease = client.try_acquire(&req).await.into_handle().expect("free");
        let after = common::server_micros(&server);
        let fence = lease.fence().get();
        // max(counter + 1, the clock when the script ran), exactly.
        assert!(
            ((counter + 1).max(before)..=(counter + 1).max(after)).contains(&fence),
            "counter {counter}: fence {fence}, clock {before}..={after}"
        );
        let stored = server
            .cmd(&["GET", &lease_key(&client, &req)])
            .as_string()
            .unwrap();
        assert!(
            stored.starts_with(&format!("{fence}:")),
            "{counter}: stored {}",
            &stored[..19]
        );
        match client
            .inspect(req.purpose(), req.resource(), Some(req.attempt()))
            .await
        {
            InspectOutcome::HeldByThisAttempt(view) => assert_eq!(view.fence, Some(lease.fence())),
            other => panic!("{counter}: {other:?}"),
        }
        assert!(lease.renew().await.is_renewed(), "{counter}");
        assert_eq!(lease.release().await, ReleaseOutcome::Released, "{counter}");
        assert_eq!(
            server.cmd(&["GET", &fence_key]).as_string(),
            Some(fence.to_string())
        );
    }
    let req = request(&client, "edges", "op-top", Duration::from_secs(5));
    match client.try_acquire(&req).await {
        AcquireOutcome::Unavailable(u) => assert_eq!(
            u.cause,
            UnavailableCause::UnusableKey(UnusableKey::FenceRangeExhausted)
        ),
        other => panic!("expected FenceRangeExhausted, got {other:?}"),
    }
    assert_eq!(
        server
            .cmd(&["GET", &format!("{}:fence", lease_key(&client, &req))])
            .as_string(),
        Some(top.to_string())
    );
    assert!(!server.keys().contains(&lease_key(&client, &req)));
}

/// Keys of another type, and counters that are not fences, are definite answers with nothing
/// written: never `Indeterminate`, never another owner.
#[tokio::test]
async fn unusable_keys_are_typed_and_left_alone() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "unusable", "op-a", Duration::from_secs(5));
    let lease_key = lease_key(&client, &req);
    let fence_key = format!("{lease_key}:fence");
    let cases: [(&[&str], UnusableKey); 6] = [
        (&["HSET", &lease_key, "f", "v"], UnusableKey::LeaseWrongType),
        (&["RPUSH", &fence_key, "x"], UnusableKey::CounterWrongType),
        (&["SET", &fence_key, "-5"], UnusableKey::CounterNotAFence),
        (&["SET", &fence_key, "007"], UnusableKey::CounterNotAFence),
        (
            &["SET", &fence_key, "9223372036854775808"],
            UnusableKey::CounterNotAFence,
        ),
        (
            &["SET", &fence_key, "garbage"],
            UnusableKey::CounterNotAFence,
        ),
    ];
    for (setup, what) in cases {
        server.cmd(&["FLUSHALL"]);
        server.cmd(setup);
        let before = common::snapshot(&server);
        assert!(!before.is_empty());
        let want = UnavailableCause::UnusableKey(what);
        match client.try_acquire(&req).await {
            AcquireOutcome::Unavailable(u) => assert_eq!(u.cause, want, "{setup:?}"),
            other => panic!("{setup:?}: {other:?}"),
        }
        match client.inspect(req.purpose(), req.resource(), None).await {
            InspectOutcome::Unavailable(u) => assert_eq!(u.cause, want, "{setup:?}"),
            other => panic!("{setup:?}: {other:?}"),
        }
        assert_eq!(common::snapshot(&server), before, "{setup:?} changed");
    }
    // A grant whose key was overwritten with a hash is lost, definitely.
    server.cmd(&["FLUSHALL"]);
    let lease = client.try_acquire(&req).await.into_handle().expect("free");
    server.cmd(&["DEL", &lease_key]);
    server.cmd(&["HSET", &lease_key, "f", "v"]);
    assert_eq!(
        lease.renew().await,
        RenewOutcome::Lost(LossCause::OtherHolder)
    );
    assert_eq!(
        lease.release().await,
        ReleaseOutcome::Refused {
            state: LeaseState::Lost
        }
    );
    assert_eq!(
        server.cmd(&["HGET", &lease_key, "f"]).as_string(),
        Some("v".into())
    );
}
