//! Values leasehold did not write, at a lease key or a fence counter, on real redis-server with
//! the default settings (a 200 ms command timeout): every lease call refuses them with a typed
//! answer, whatever their size, and changes nothing stored (issue 34: a 10 MB string at the
//! lease key took the scripts longer than the command timeout to refuse, so the answer was
//! "unknown"). The scripts read no more of a lease key than the longest value a lease stores,
//! and check a counter's length before reading it; the simulator gives the same answers.

mod common;

use std::fmt::Debug;
use std::time::Duration;

use common::{client, delta, lease_key, request, snapshot};
use leasehold_redis::leasehold::{
    AcquireOutcome, FenceToken, HolderName, InspectOutcome, LeaseBackend, LeaseClient,
    LeaseRequest, LossCause, ManualClock, OperationId, Purpose, ReleaseOutcome, RenewOutcome,
    ResourceDigest, UnavailableCause, UnusableKey,
};
use leasehold_redis::{RedisBackend, RedisLeases};
use leasehold_sim::{ForeignValue, SimBackend, SimServer, run_now};
use test_support::RedisServer;

const TTL: Duration = Duration::from_secs(30);
const MB: usize = 1 << 20;

/// The strings planted at a lease key: 10 MB of each shape the scripts' patterns were slowest
/// on (digits, a grant's opening followed by megabytes, the grant then a newline), random
/// bytes, and small ones that are not of a lease's form either.
fn foreign_strings() -> Vec<(&'static str, Vec<u8>)> {
    let big = |head: &[u8], fill: u8| {
        let mut value = head.to_vec();
        value.resize(10 * MB, fill);
        value
    };
    // Deterministic noise, without a dependency: any byte, a newline and ':' among them.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let noise = (0..10 * MB)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed.to_le_bytes()[0]
        })
        .collect();
    vec![
        ("10 MB of digits", big(b"", b'1')),
        ("10 MB opening like a grant", big(b"1:token:", b'o')),
        ("10 MB: a grant, then digits", big(b"1:token:op\n", b'1')),
        ("10 MB of noise", noise),
        ("a word", b"garbage".to_vec()),
        ("a number", b"12345".to_vec()),
        ("the empty string", Vec::new()),
    ]
}

fn set(server: &RedisServer, key: &str, value: &[u8]) {
    // Bytes of any kind, on a connection of its own.
    let text = String::from_utf8_lossy(value);
    if text.as_bytes() == value {
        server.cmd(&["SET", key, &text]);
    } else {
        let mut connection = redis::Client::open(server.url())
            .expect("URL")
            .get_connection()
            .expect("connection");
        let () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query(&mut connection)
            .expect("SET");
    }
}

fn refused_with<T: Debug>(outcome: &T, cause: Option<UnavailableCause>, want: UnusableKey) {
    assert_eq!(
        cause,
        Some(UnavailableCause::UnusableKey(want)),
        "expected {want:?}, got {outcome:?}"
    );
}

fn acquire_cause<B: LeaseBackend>(outcome: &AcquireOutcome<B>) -> Option<UnavailableCause> {
    match outcome {
        AcquireOutcome::Unavailable(u) => Some(u.cause),
        _ => None,
    }
}

fn inspect_cause(outcome: &InspectOutcome) -> Option<UnavailableCause> {
    match outcome {
        InspectOutcome::Unavailable(u) => Some(u.cause),
        _ => None,
    }
}

/// A string of any size at the lease key: acquire, inspect (with and without an attempt) and
/// break are refused with `LeaseForeignValue`, each within the default command timeout;
/// renewing or releasing a grant whose key was overwritten with it finds another holder; and
/// not a byte of what is stored changes, its TTL included.
#[tokio::test]
async fn a_string_of_any_size_at_the_lease_key_is_refused_in_time_and_left_alone() {
    let server = RedisServer::start();
    let client = client(&server);
    let want = UnusableKey::LeaseForeignValue;
    for (what, value) in foreign_strings() {
        server.cmd(&["FLUSHALL"]);
        let req = request(&client, "foreign", "op-a", TTL);
        let key = lease_key(&client, &req);
        set(&server, &key, &value);
        server.cmd(&["PEXPIRE", &key, "600000"]);
        let before = snapshot(&server);

        let outcome = client.try_acquire(&req).await;
        refused_with(&outcome, acquire_cause(&outcome), want);
        let outcome = client.inspect(req.purpose(), req.resource(), None).await;
        refused_with(&outcome, inspect_cause(&outcome), want);
        let outcome = client
            .inspect(req.purpose(), req.resource(), Some(req.attempt()))
            .await;
        refused_with(&outcome, inspect_cause(&outcome), want);
        let outcome = client
            .backend()
            .inspect_watched(req.purpose(), req.resource())
            .await;
        refused_with(&outcome, inspect_cause(&outcome), want);
        match client
            .backend()
            .break_lease(req.purpose(), req.resource())
            .await
        {
            Err(leasehold_redis::Error::Unavailable(u)) => {
                assert_eq!(u.cause, UnavailableCause::UnusableKey(want), "{what}");
            }
            other => panic!("{what}: break answered {other:?}"),
        }
        // The release of whatever this attempt holds (the cleanup behind an unknown acquire).
        assert_eq!(
            client.release_attempt(&req).await,
            ReleaseOutcome::NotOwner,
            "{what}"
        );
        assert_eq!(
            snapshot(&server),
            before,
            "{what}: something stored changed"
        );
        let pttl = common::pttl(&server, &key);
        assert!(pttl > 500_000, "{what}: the TTL changed ({pttl} ms)");

        // A grant whose key someone overwrote with it: certainly not this grant, renewed or
        // released alone or several at once.
        server.cmd(&["FLUSHALL"]);
        let renewed = client.try_acquire(&req).await.into_handle().expect("free");
        let released = client
            .try_acquire(&request(&client, "foreign-2", "op-a", TTL))
            .await
            .into_handle()
            .expect("free");
        let fresh: Vec<_> = (0..3)
            .map(|i| request(&client, &format!("ok-{i}"), "op", TTL))
            .collect();
        let others: Vec<_> =
            futures_util::future::join_all(fresh.iter().map(|r| client.try_acquire(r)))
                .await
                .into_iter()
                .map(|outcome| outcome.into_handle().expect("free"))
                .collect();
        set(&server, &key, &value);
        let released_key = client
            .backend()
            .keys()
            .lease_key(released.purpose(), released.resource());
        set(&server, &released_key, &value);
        let foreign = |server: &RedisServer| -> Vec<_> {
            snapshot(server)
                .into_iter()
                .filter(|(k, _)| *k == key || *k == released_key)
                .collect()
        };
        let before = foreign(&server);
        assert_eq!(before.len(), 2);
        let (renewal, renewals) = tokio::join!(
            renewed.renew(),
            futures_util::future::join_all(others.iter().map(|h| h.renew()))
        );
        assert_eq!(
            renewal,
            RenewOutcome::Lost(LossCause::OtherHolder),
            "{what}"
        );
        assert!(
            renewals.iter().all(RenewOutcome::is_renewed),
            "{what}: {renewals:?}"
        );
        let (release, releases) = tokio::join!(
            released.release(),
            futures_util::future::join_all(others.iter().map(|h| h.release()))
        );
        assert_eq!(release, ReleaseOutcome::NotOwner, "{what}");
        assert!(
            releases.iter().all(|r| *r == ReleaseOutcome::Released),
            "{what}: {releases:?}"
        );
        assert_eq!(foreign(&server), before, "{what}: something stored changed");
    }
}

/// A 10 MB string at the fence counter of a free lease: acquire and inspect are refused with
/// `CounterNotAFence` within the default command timeout, and the counter is left as it is,
/// its TTL included (it is never read, let alone moved and put back).
#[tokio::test]
async fn a_counter_of_any_size_is_refused_in_time_and_left_alone() {
    let server = RedisServer::start();
    let client = client(&server);
    let req = request(&client, "foreign-counter", "op-a", TTL);
    let counter = format!("{}:fence", lease_key(&client, &req));
    for (what, value) in [
        ("10 MB of digits", vec![b'1'; 10 * MB]),
        ("10 MB of letters", vec![b'x'; 10 * MB]),
        ("twenty digits", b"10000000000000000000".to_vec()),
    ] {
        server.cmd(&["FLUSHALL"]);
        set(&server, &counter, &value);
        server.cmd(&["PEXPIRE", &counter, "600000"]);
        let before = snapshot(&server);
        let outcome = client.try_acquire(&req).await;
        refused_with(
            &outcome,
            acquire_cause(&outcome),
            UnusableKey::CounterNotAFence,
        );
        let outcome = client.inspect(req.purpose(), req.resource(), None).await;
        refused_with(
            &outcome,
            inspect_cause(&outcome),
            UnusableKey::CounterNotAFence,
        );
        assert_eq!(
            snapshot(&server),
            before,
            "{what}: something stored changed"
        );
        let pttl = common::pttl(&server, &counter);
        assert!(
            pttl > 500_000,
            "{what}: the counter's TTL changed ({pttl} ms)"
        );
    }
}

/// Acquires that start together go to the server as one script run (`batch.rs`): the entries
/// whose lease key or counter holds 10 MB are refused, each with its own cause, and the others
/// are granted.
#[tokio::test]
async fn a_batch_refuses_its_foreign_entries_alone_and_grants_the_rest() {
    let server = RedisServer::start();
    let client = client(&server);
    client.backend().warm_up().await.unwrap();
    let at_lease = request(&client, "batch-foreign-lease", "op-a", TTL);
    let at_counter = request(&client, "batch-foreign-counter", "op-a", TTL);
    set(
        &server,
        &lease_key(&client, &at_lease),
        &vec![b'1'; 10 * MB],
    );
    let counter = format!("{}:fence", lease_key(&client, &at_counter));
    set(&server, &counter, &vec![b'1'; 10 * MB]);
    let before = snapshot(&server);
    let first = request(&client, "batch-first", "op-a", TTL);
    let mut requests: Vec<LeaseRequest> = (0..3)
        .map(|i| request(&client, &format!("batch-{i}"), "op-a", TTL))
        .collect();
    requests.push(at_lease);
    requests.push(at_counter);

    let stats = server.commandstats();
    let (alone, outcomes) = tokio::join!(
        client.try_acquire(&first),
        futures_util::future::join_all(requests.iter().map(|r| client.try_acquire(r)))
    );
    let calls = delta(&stats, &server.commandstats());
    assert_eq!(calls.get("evalsha"), Some(&2), "one batch: {calls:?}");
    let mut handles = vec![alone.into_handle().expect("free")];
    let mut outcomes = outcomes.into_iter();
    for _ in 0..3 {
        handles.extend(outcomes.next().expect("an outcome each").into_handle());
    }
    assert_eq!(handles.len(), 4);
    for want in [
        UnusableKey::LeaseForeignValue,
        UnusableKey::CounterNotAFence,
    ] {
        let outcome = outcomes.next().expect("an outcome each");
        refused_with(&outcome, acquire_cause(&outcome), want);
    }
    let after: Vec<_> = snapshot(&server)
        .into_iter()
        .filter(|(key, _)| before.iter().any(|(k, _)| k == key))
        .collect();
    assert_eq!(after, before, "a foreign value changed");
    for handle in &handles {
        assert_eq!(handle.release().await, ReleaseOutcome::Released);
    }
}

/// The longest value a lease stores — the largest fence, the longest operation id and holder
/// name, a minimum hold, the mark of a refused acquire — is within the bound the scripts read
/// up to, and every call reads it in full: the bound refuses nothing leasehold writes.
#[tokio::test]
async fn the_longest_value_a_lease_stores_is_read_in_full() {
    let server = RedisServer::start();
    let client = client(&server);
    let operation = "o".repeat(leasehold_redis::leasehold::id::MAX_OPERATION_ID_LEN);
    // Two-byte characters, to the bound in bytes.
    let name = "é".repeat(leasehold_redis::leasehold::id::MAX_HOLDER_NAME_LEN / 2);
    let long = request(&client, "longest", &operation, TTL)
        .with_min_hold(Duration::from_secs(60))
        .unwrap()
        .with_holder_name(HolderName::new(&name).unwrap());
    let key = lease_key(&client, &long);
    // The largest fence the counter can give.
    let top = FenceToken::MAX.get();
    server.cmd(&["SET", &format!("{key}:fence"), &(top - 1).to_string()]);
    let lease = client.try_acquire(&long).await.into_handle().expect("free");
    assert_eq!(lease.fence(), FenceToken::MAX);
    // Refused, so marked: the longest form of all.
    let other = request(&client, "longest", "op-b", TTL);
    assert!(matches!(
        client.try_acquire(&other).await,
        AcquireOutcome::Contended(_)
    ));
    assert!(common::is_marked(&server, &key));
    let stored = server.cmd(&["STRLEN", &key]).as_int().unwrap();
    // Only the hold's end (the server's clock in microseconds, 16 digits until 2286) is
    // shorter than its bound of 20 digits.
    assert_eq!(stored, 332 - 4, "the stored value is {stored} bytes");
    match client
        .inspect(long.purpose(), long.resource(), Some(long.attempt()))
        .await
    {
        InspectOutcome::HeldByThisAttempt(view) => {
            assert_eq!(view.fence, Some(FenceToken::MAX));
            assert_eq!(view.holder_name.map(|n| n.as_str().to_owned()), Some(name));
        }
        other => panic!("{other:?}"),
    }
    assert!(lease.renew().await.is_renewed());
    assert!(matches!(
        client.try_acquire(&long).await,
        AcquireOutcome::Replayed(_)
    ));
    // Kept for its hold as a record, then released again by the same attempt.
    assert_eq!(lease.release().await, ReleaseOutcome::Released);
    assert_eq!(
        client.release_attempt(&long).await,
        ReleaseOutcome::Released
    );
    match client.inspect(long.purpose(), long.resource(), None).await {
        InspectOutcome::HeldByOther(view) => assert!(view.released),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The simulator against redis-server

/// What a call answered, in terms both worlds share: the variant, and the cause of a refusal.
fn shape_of_acquire<B: LeaseBackend>(outcome: &AcquireOutcome<B>) -> String {
    match outcome {
        AcquireOutcome::Acquired(_) => "Acquired".into(),
        AcquireOutcome::Replayed(_) => "Replayed".into(),
        AcquireOutcome::Contended(_) => "Contended".into(),
        AcquireOutcome::OwnerOperationConflict(_) => "OwnerOperationConflict".into(),
        AcquireOutcome::Indeterminate { cause, .. } => format!("Indeterminate({:?})", cause.cause),
        AcquireOutcome::Unavailable(u) => format!("Unavailable({:?})", u.cause),
        other => format!("{other:?}"),
    }
}

fn shape_of_inspect(outcome: &InspectOutcome) -> String {
    match outcome {
        InspectOutcome::Free => "Free".into(),
        InspectOutcome::HeldByThisAttempt(_) => "HeldByThisAttempt".into(),
        InspectOutcome::HeldByOther(_) => "HeldByOther".into(),
        InspectOutcome::Indeterminate(i) => format!("Indeterminate({:?})", i.cause),
        InspectOutcome::Unavailable(u) => format!("Unavailable({:?})", u.cause),
        other => format!("{other:?}"),
    }
}

fn shape_of_renew(outcome: &RenewOutcome) -> String {
    match outcome {
        RenewOutcome::Renewed { .. } => "Renewed".into(),
        RenewOutcome::Indeterminate(i) => format!("Indeterminate({:?})", i.cause),
        RenewOutcome::Unavailable(u) => format!("Unavailable({:?})", u.cause),
        other => format!("{other:?}"),
    }
}

fn shape_of_release(outcome: &ReleaseOutcome) -> String {
    match outcome {
        ReleaseOutcome::Indeterminate(i) => format!("Indeterminate({:?})", i.cause),
        ReleaseOutcome::Unavailable(u) => format!("Unavailable({:?})", u.cause),
        other => format!("{other:?}"),
    }
}

/// One world: a client of a simulated server or of redis-server, and how to plant a value.
trait Foreign {
    type Backend: LeaseBackend;
    fn client(&self) -> &LeaseClient<Self::Backend>;
    fn plant(&self, resource: &str, at_counter: bool, value: ForeignValue, real: &[u8]);
    fn request(&self, resource: &str, op: &str) -> LeaseRequest {
        let client = self.client();
        let attempt = client.new_attempt(OperationId::new(op).unwrap()).unwrap();
        client
            .request(
                Purpose::new("test").unwrap(),
                ResourceDigest::of(resource),
                attempt,
                TTL,
            )
            .unwrap()
    }
}

struct Simulated {
    server: SimServer,
    client: LeaseClient<SimBackend>,
}

impl Foreign for Simulated {
    type Backend = SimBackend;
    fn client(&self) -> &LeaseClient<SimBackend> {
        &self.client
    }
    fn plant(&self, resource: &str, at_counter: bool, value: ForeignValue, _: &[u8]) {
        let (purpose, digest) = (Purpose::new("test").unwrap(), ResourceDigest::of(resource));
        if at_counter {
            self.server.plant_at_fence_counter(&purpose, &digest, value);
        } else {
            self.server.plant_at_lease_key(&purpose, &digest, value);
        }
    }
}

struct Real<'s> {
    server: &'s RedisServer,
    client: RedisLeases,
}

impl Foreign for Real<'_> {
    type Backend = RedisBackend;
    fn client(&self) -> &RedisLeases {
        &self.client
    }
    fn plant(&self, resource: &str, at_counter: bool, value: ForeignValue, real: &[u8]) {
        let lease = self.client.backend().keys().lease_key(
            &Purpose::new("test").unwrap(),
            &ResourceDigest::of(resource),
        );
        let key = if at_counter {
            format!("{lease}:fence")
        } else {
            lease
        };
        self.server.cmd(&["DEL", &key]);
        match value {
            ForeignValue::OtherType => {
                self.server.cmd(&["HSET", &key, "f", "v"]);
            }
            _ => set(self.server, &key, real),
        }
    }
}

/// Runs the same calls in `world` on leases whose key, or whose counter, holds a planted
/// value, and returns the shapes of their answers, in order.
async fn run_calls<W: Foreign>(
    world: &W,
    case: usize,
    at_counter: bool,
    value: ForeignValue,
    real: &[u8],
) -> Vec<String> {
    let client = world.client();
    let mut shapes = Vec::new();
    let resource = format!("diff-{case}");
    if !at_counter {
        // Grants whose key is then overwritten: one renewed, one released.
        let renewed = client
            .try_acquire(&world.request(&format!("{resource}-renewed"), "op-a"))
            .await
            .into_handle()
            .expect("free");
        let released = client
            .try_acquire(&world.request(&format!("{resource}-released"), "op-a"))
            .await
            .into_handle()
            .expect("free");
        world.plant(&format!("{resource}-renewed"), false, value, real);
        world.plant(&format!("{resource}-released"), false, value, real);
        shapes.push(shape_of_renew(&renewed.renew().await));
        shapes.push(shape_of_release(&renewed.release().await));
        shapes.push(shape_of_release(&released.release().await));
    }
    world.plant(&resource, at_counter, value, real);
    let req = world.request(&resource, "op-a");
    shapes.push(shape_of_acquire(&client.try_acquire(&req).await));
    shapes.push(shape_of_inspect(
        &client.inspect(req.purpose(), req.resource(), None).await,
    ));
    shapes.push(shape_of_inspect(
        &client
            .inspect(req.purpose(), req.resource(), Some(req.attempt()))
            .await,
    ));
    shapes.push(shape_of_inspect(
        &client
            .backend()
            .inspect_watched(req.purpose(), req.resource())
            .await,
    ));
    shapes.push(shape_of_release(&client.release_attempt(&req).await));
    shapes
}

/// The simulator's script model refuses a planted value as redis-server's scripts do, call
/// for call: at the lease key (another type; strings of any size), and at the counter of a
/// free lease (another type; a string that is no fence).
#[tokio::test]
async fn the_simulation_answers_foreign_values_as_redis_does() {
    let server = RedisServer::start();
    let real = Real {
        server: &server,
        client: client(&server),
    };
    let clock = ManualClock::new();
    let sim_server = SimServer::new(clock.clone());
    let simulated = Simulated {
        client: LeaseClient::new(sim_server.connect(Duration::from_millis(200))).with_clock(clock),
        server: sim_server,
    };
    let mut cases: Vec<(String, bool, ForeignValue, Vec<u8>)> = vec![
        (
            "a hash at the lease key".into(),
            false,
            ForeignValue::OtherType,
            Vec::new(),
        ),
        (
            "a hash at the counter".into(),
            true,
            ForeignValue::OtherType,
            Vec::new(),
        ),
        (
            "a word at the counter".into(),
            true,
            ForeignValue::String,
            b"garbage".to_vec(),
        ),
        (
            "10 MB at the counter".into(),
            true,
            ForeignValue::String,
            vec![b'1'; 10 * MB],
        ),
    ];
    for (what, value) in foreign_strings() {
        cases.push((
            format!("{what} at the lease key"),
            false,
            ForeignValue::String,
            value,
        ));
    }
    for (case, (what, at_counter, value, bytes)) in cases.iter().enumerate() {
        let simulated = run_now(run_calls(&simulated, case, *at_counter, *value, bytes));
        let actual = run_calls(&real, case, *at_counter, *value, bytes).await;
        assert_eq!(
            simulated, actual,
            "{what}: the simulation disagrees with redis-server"
        );
        let want = match (at_counter, value) {
            (false, ForeignValue::OtherType) => UnusableKey::LeaseWrongType,
            (false, _) => UnusableKey::LeaseForeignValue,
            (true, ForeignValue::OtherType) => UnusableKey::CounterWrongType,
            (true, _) => UnusableKey::CounterNotAFence,
        };
        let refused = format!("Unavailable({:?})", UnavailableCause::UnusableKey(want));
        let from = usize::from(!at_counter) * 3;
        assert_eq!(
            actual[from..from + 4],
            [refused.clone(), refused.clone(), refused.clone(), refused],
            "{what}"
        );
    }
}
