//! Keep-alive against the simulated server in paused tokio time: cadence counted against
//! virtual time, the signal at the margin when requests or replies are dropped, definite loss
//! at once, and no renewal after a release.
//!
//! The world clock is a `TokioClock`, shared by the server and the client, so every instant
//! here is exact: nothing waits for real time, and nothing depends on how loaded the machine
//! is. Timings with the defaults (TTL 3 s, drift 10 ms + 1 % = 40 ms): a renewal confirmed from
//! a send at `s` is valid until `s + 2.96 s`, its margin (TTL / 5 = 600 ms) is reached at
//! `s + 2.36 s`, and the server's key expires at `s + 3 s`.

use std::time::Duration;

use leasehold::backend::{ReleaseReply, RenewReply};
use leasehold::{
    AcquireOutcome, Clock, DriftBudget, ErrorKind, KeepAliveSettings, LeaseClient, LeaseHandle,
    LeaseState, LossReason, LossSignal, MonotonicInstant, OperationId, Purpose, ReleaseOutcome,
    ResourceDigest, TokioClock, Watchdog,
};
use leasehold_sim::scripted::{self, Op, Scripted};
use leasehold_sim::{Fault, RequestKind, SimBackend, SimServer};
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(3);
const CADENCE: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_millis(600);
const DRIFT: Duration = Duration::from_millis(40);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(200);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One simulated server, and a client on the same virtual clock.
struct World {
    clock: TokioClock,
    server: SimServer,
    client: LeaseClient<SimBackend>,
}

impl World {
    fn new(command_timeout: Duration) -> Self {
        let clock = TokioClock::new();
        let server = SimServer::with_clock(clock);
        let client = LeaseClient::new(server.connect(command_timeout)).with_clock(clock);
        Self {
            clock,
            server,
            client,
        }
    }

    /// Virtual time since the world began.
    fn now(&self) -> Duration {
        self.clock.now().since_origin()
    }

    fn backend(&self) -> &SimBackend {
        self.client.backend()
    }

    /// Sleeps until `at` after the world began.
    async fn until(&self, at: Duration) {
        tokio::time::sleep_until(tokio::time::Instant::now() + at.saturating_sub(self.now())).await;
    }

    async fn acquire(&self, resource: &str) -> LeaseHandle<SimBackend> {
        acquire(&self.client, resource, "op").await
    }

    /// When each request of `kind` was sent, in virtual time since the world began.
    fn sent(&self, kind: RequestKind) -> Vec<Duration> {
        self.backend()
            .sent()
            .iter()
            .filter(|s| s.kind == kind)
            .map(|s| s.at.since_origin())
            .collect()
    }
}

async fn acquire(
    client: &LeaseClient<SimBackend>,
    resource: &str,
    op: &str,
) -> LeaseHandle<SimBackend> {
    let attempt = client.new_attempt(OperationId::new(op).unwrap()).unwrap();
    let request = client
        .request(
            Purpose::new("p").unwrap(),
            ResourceDigest::of(resource),
            attempt,
            TTL,
        )
        .unwrap();
    match client.try_acquire(&request).await {
        AcquireOutcome::Acquired(handle) => handle,
        other => panic!("not acquired: {other}"),
    }
}

/// Acquires `resource` with a client of any backend, on the default purpose and TTL.
async fn acquire_from<B: leasehold::LeaseBackend>(
    client: &LeaseClient<B>,
    resource: &str,
) -> LeaseHandle<B> {
    let attempt = client.new_attempt(OperationId::new("op").unwrap()).unwrap();
    let request = client
        .request(
            Purpose::new("p").unwrap(),
            ResourceDigest::of(resource),
            attempt,
            TTL,
        )
        .unwrap();
    client
        .try_acquire(&request)
        .await
        .into_handle()
        .expect("not acquired")
}

fn since(at: MonotonicInstant) -> Duration {
    at.since_origin()
}

/// Waits for the signal, for at most 10 s of virtual time (a signal that never fires would
/// otherwise let paused time run on for ever).
async fn fired(signal: &LossSignal) -> LossReason {
    tokio::time::timeout(ms(10_000), signal.lost())
        .await
        .expect("the signal never fired")
}

#[tokio::test(start_paused = true)]
async fn renewals_run_at_the_cadence_in_virtual_time() {
    for divisor in [3, 4, 10] {
        let world = World::new(COMMAND_TIMEOUT);
        let handle = world.acquire("r").await;
        let fence = handle.fence();
        let settings = KeepAliveSettings::default()
            .with_cadence_divisor(divisor)
            .unwrap();
        // A temporary watchdog: the kept lease keeps its task running.
        let kept = Watchdog::new(settings).keep(handle).unwrap();
        // Not a multiple of any cadence here, so no renewal is due at the very instant the
        // test looks.
        world.until(ms(10_600)).await;
        let cadence = TTL / divisor;
        let renewals = world.sent(RequestKind::Renew);
        let expected: Vec<Duration> = (1..)
            .map(|k| cadence * k)
            .take_while(|&t| t < ms(10_600))
            .collect();
        assert_eq!(renewals, expected, "TTL / {divisor}");
        assert!(!kept.signal().is_lost(), "{:?}", kept.signal().reason());
        assert_eq!(kept.handle().state(), LeaseState::Active);
        let stored = world
            .server
            .stored(kept.handle().purpose(), kept.handle().resource());
        assert_eq!(stored.map(|s| s.fence), Some(fence), "the server lost it");
        assert_eq!(kept.release().await, ReleaseOutcome::Released);
    }
}

/// Renewals succeed until 1.5 s, then every request is lost. The last confirmed renewal was
/// sent at 1 s, so the margin point is 3.36 s and the server's key lives until 4 s.
async fn signal_when_renewals_go_unanswered(fault: Fault) -> (World, Duration, Duration) {
    let world = World::new(COMMAND_TIMEOUT);
    let watchdog = Watchdog::default();
    let kept = watchdog.keep(world.acquire("r").await).unwrap();
    world.until(ms(1_500)).await;
    world.backend().inject_many(fault, 1_000);
    let reason = kept.signal().lost().await;
    let fired_at = world.now();
    assert_eq!(reason, LossReason::Unreachable);
    let valid_until = since(kept.handle().valid_until());
    assert_eq!(valid_until, ms(1_000) + TTL - DRIFT);
    // At the margin exactly (the timer wheel counts whole milliseconds, rounding up).
    let margin_point = valid_until - MARGIN;
    assert!(
        fired_at >= margin_point && fired_at <= margin_point + ms(1),
        "fired at {fired_at:?}, margin point {margin_point:?}"
    );
    // Failed renewals were retried (at 2 s, then every 250 ms after each timeout) meanwhile.
    let retries = world
        .sent(RequestKind::Renew)
        .into_iter()
        .filter(|&t| t > ms(1_500))
        .count();
    assert!(retries >= 3, "{retries} renewals after the fault");
    // Before anyone else could be granted the lease: the server still holds this grant.
    let stored = world
        .server
        .stored(kept.handle().purpose(), kept.handle().resource())
        .expect("the key expired before the signal");
    assert_eq!(stored.fence, kept.handle().fence());
    let contender = LeaseClient::new(world.server.connect(COMMAND_TIMEOUT)).with_clock(world.clock);
    let attempt = contender
        .new_attempt(OperationId::new("other").unwrap())
        .unwrap();
    let request = contender
        .request(
            Purpose::new("p").unwrap(),
            ResourceDigest::of("r"),
            attempt,
            TTL,
        )
        .unwrap();
    let outcome = contender.try_acquire(&request).await;
    assert!(matches!(outcome, AcquireOutcome::Contended(_)), "{outcome}");
    (world, fired_at, stored.server_ttl)
}

#[tokio::test(start_paused = true)]
async fn lost_requests_fire_the_signal_at_the_margin() {
    let (world, fired_at, server_ttl) =
        signal_when_renewals_go_unanswered(Fault::LoseRequest).await;
    // The key still has what the renewal at 1 s gave it.
    assert_eq!(server_ttl, ms(4_000) - fired_at);
    drop(world);
}

#[tokio::test(start_paused = true)]
async fn lost_replies_fire_the_signal_at_the_margin_though_the_server_renewed() {
    let (world, fired_at, server_ttl) = signal_when_renewals_go_unanswered(Fault::LoseReply).await;
    // The server applied the unanswered renewals and holds the key longer than the client may
    // count on: validity comes only from confirmed renewals.
    assert!(server_ttl > ms(4_000) - fired_at, "{server_ttl:?}");
    drop(world);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_hangs_does_not_delay_the_signal() {
    // The backend would wait 10 s for a reply, far past the lease's validity.
    let world = World::new(ms(10_000));
    let kept = Watchdog::default().keep(world.acquire("r").await).unwrap();
    world.backend().inject(Fault::LoseRequest);
    assert_eq!(kept.signal().lost().await, LossReason::Unreachable);
    // Granted at 0: the margin point is 2.36 s, while the renewal sent at 1 s still hangs.
    let fired_at = world.now();
    let margin_point = TTL - DRIFT - MARGIN;
    assert!(
        fired_at >= margin_point && fired_at <= margin_point + ms(1),
        "{fired_at:?}"
    );
    assert_eq!(world.sent(RequestKind::Renew), vec![ms(1_000)]);
}

#[tokio::test(start_paused = true)]
async fn a_definite_loss_fires_at_the_next_renewal() {
    // The key is deleted (absent), or deleted and granted to another (other holder).
    for granted_to_another in [false, true] {
        let world = World::new(COMMAND_TIMEOUT);
        let kept = Watchdog::default().keep(world.acquire("r").await).unwrap();
        world.until(ms(1_500)).await;
        let handle = kept.handle();
        world.server.delete(handle.purpose(), handle.resource());
        if granted_to_another {
            let other =
                LeaseClient::new(world.server.connect(COMMAND_TIMEOUT)).with_clock(world.clock);
            let theirs = acquire(&other, "r", "theirs").await;
            assert!(theirs.fence() > handle.fence());
        }
        assert_eq!(kept.signal().lost().await, LossReason::LostToAnother);
        // At once: at the renewal due at 2 s, not at some margin later.
        assert_eq!(world.now(), ms(2_000));
        assert_eq!(handle.state(), LeaseState::Lost);
        // And nothing more is sent for it.
        sleep(ms(5_000)).await;
        assert_eq!(world.sent(RequestKind::Renew), vec![ms(1_000), ms(2_000)]);
    }
}

/// Asserts that the release is the last request, and that no renewal follows it.
fn assert_release_is_last(world: &World) {
    let sent = world.backend().sent();
    let release = sent
        .iter()
        .position(|s| s.kind == RequestKind::Release)
        .expect("no release was sent");
    assert_eq!(release, sent.len() - 1, "sent after the release: {sent:?}");
}

#[tokio::test(start_paused = true)]
async fn no_renewal_is_sent_after_a_release() {
    // Released between renewals, a millisecond either side of a due renewal, and exactly when
    // one is due (both tasks wake at the same virtual instant, in either order).
    for release_at in [1_500, 999, 1_000, 1_001, 2_000] {
        let world = World::new(COMMAND_TIMEOUT);
        let kept = Watchdog::default().keep(world.acquire("r").await).unwrap();
        let signal = kept.signal().clone();
        world.until(ms(release_at)).await;
        assert_eq!(kept.release().await, ReleaseOutcome::Released);
        assert_eq!(signal.reason(), Some(LossReason::Released));
        sleep(ms(10_000)).await;
        assert_release_is_last(&world);
    }
}

#[tokio::test(start_paused = true)]
async fn a_release_waits_for_a_renewal_being_sent() {
    let world = World::new(COMMAND_TIMEOUT);
    let kept = Watchdog::default().keep(world.acquire("r").await).unwrap();
    // The renewal sent at 1 s gets its reply at 1.15 s; the release is asked for at 1.1 s.
    world.backend().inject(Fault::DelayReply(ms(150)));
    world.until(ms(1_100)).await;
    assert_eq!(kept.release().await, ReleaseOutcome::Released);
    assert_eq!(world.now(), ms(1_150));
    assert_eq!(world.sent(RequestKind::Release), vec![ms(1_150)]);
    sleep(ms(10_000)).await;
    assert_release_is_last(&world);
}

#[tokio::test(start_paused = true)]
async fn a_release_through_the_handle_or_a_replayed_handle_fires_released() {
    for through_replay in [false, true] {
        let world = World::new(COMMAND_TIMEOUT);
        let attempt = world
            .client
            .new_attempt(OperationId::new("op").unwrap())
            .unwrap();
        let request = world
            .client
            .request(
                Purpose::new("p").unwrap(),
                ResourceDigest::of("r"),
                attempt,
                TTL,
            )
            .unwrap();
        let handle = world
            .client
            .try_acquire(&request)
            .await
            .into_handle()
            .unwrap();
        let kept = Watchdog::default().keep(handle).unwrap();
        world.until(ms(1_500)).await;
        let outcome = if through_replay {
            // A replay of the same request: a handle on the same state.
            let AcquireOutcome::Replayed(replayed) = world.client.try_acquire(&request).await
            else {
                panic!("not replayed");
            };
            replayed.release().await
        } else {
            kept.handle().release().await
        };
        assert_eq!(outcome, ReleaseOutcome::Released);
        // Seen when its next renewal comes due, at 2 s; nothing is sent for it.
        assert_eq!(fired(kept.signal()).await, LossReason::Released);
        assert_eq!(world.now(), ms(2_000));
        sleep(ms(5_000)).await;
        assert_release_is_last(&world);
    }
}

#[tokio::test(start_paused = true)]
async fn keeping_a_lost_or_released_handle_fires_at_once_with_its_reason() {
    for (release, reason) in [
        (false, LossReason::LostToAnother),
        (true, LossReason::Released),
    ] {
        let world = World::new(COMMAND_TIMEOUT);
        let handle = world.acquire("r").await;
        if release {
            assert_eq!(handle.release().await, ReleaseOutcome::Released);
        } else {
            world.server.delete(handle.purpose(), handle.resource());
            assert!(matches!(
                handle.renew().await,
                leasehold::RenewOutcome::Lost(_)
            ));
        }
        let kept = Watchdog::default().keep(handle).unwrap();
        // Before `keep` returned.
        assert_eq!(kept.signal().reason(), Some(reason));
        sleep(ms(5_000)).await;
        assert_eq!(world.sent(RequestKind::Renew).len(), usize::from(!release));
    }
}

#[test]
fn settings_that_leave_no_room_for_a_retry_are_refused() {
    // Cadence TTL / 2 and margin TTL / 2: a renewal at the cadence is due at the margin point
    // already, so one failure would fire the signal with no retry. Refused in either order.
    let error = KeepAliveSettings::default()
        .with_cadence_divisor(2)
        .unwrap()
        .with_margin_divisor(2)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidSetting);
    let error = KeepAliveSettings::default()
        .with_margin_divisor(2)
        .unwrap()
        .with_cadence_divisor(2)
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidSetting);
    // TTL / 2 + a retry interval (TTL / 8) + TTL / 3 < TTL: room for one retry.
    assert!(
        KeepAliveSettings::default()
            .with_cadence_divisor(2)
            .unwrap()
            .with_margin_divisor(3)
            .is_ok()
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_whose_validity_leaves_no_room_for_a_retry_is_refused() {
    // A drift budget of 2.3 s leaves a 3 s lease 700 ms of validity after each renewal, less
    // than its margin (600 ms) and a retry interval (250 ms): every renewal would be due at
    // once, in an endless loop. A 20 ms lease, less its drift (10.2 ms), is not valid for a
    // cadence (6.7 ms), a retry interval (1.7 ms) and the margin (4 ms) either.
    for (drift, ttl) in [
        (DriftBudget::new(ms(2_300), 0).unwrap(), TTL),
        (DriftBudget::default(), ms(20)),
    ] {
        let clock = TokioClock::new();
        let server = SimServer::with_clock(clock);
        let client = LeaseClient::new(server.connect(COMMAND_TIMEOUT))
            .with_clock(clock)
            .with_drift_budget(drift);
        let attempt = client.new_attempt(OperationId::new("op").unwrap()).unwrap();
        let request = client
            .request(
                Purpose::new("p").unwrap(),
                ResourceDigest::of("r"),
                attempt,
                ttl,
            )
            .unwrap();
        let handle = client.try_acquire(&request).await.into_handle().unwrap();
        let (error, handle) = Watchdog::default().keep(handle).unwrap_err().into_parts();
        assert_eq!(error.kind(), ErrorKind::InvalidSetting, "{error}");
        assert!(error.is_invalid_input());
        // The handle is given back, still held, and nothing was sent for it.
        assert_eq!(handle.release().await, ReleaseOutcome::Released);
        assert_eq!(client.backend().sent().len(), 2);
    }
}

#[tokio::test(start_paused = true)]
async fn the_signal_after_a_release_follows_its_outcome() {
    // Lost meanwhile (the key deleted and granted to another): `NotOwner`.
    let world = World::new(COMMAND_TIMEOUT);
    let kept = Watchdog::default().keep(world.acquire("r").await).unwrap();
    let signal = kept.signal().clone();
    world.until(ms(1_400)).await;
    world
        .server
        .delete(kept.handle().purpose(), kept.handle().resource());
    let other = LeaseClient::new(world.server.connect(COMMAND_TIMEOUT)).with_clock(world.clock);
    let _theirs = acquire(&other, "r", "theirs").await;
    assert_eq!(kept.release().await, ReleaseOutcome::NotOwner);
    assert_eq!(signal.reason(), Some(LossReason::LostToAnother));

    // The reply lost: the key may or may not be gone.
    let world = World::new(COMMAND_TIMEOUT);
    let kept = Watchdog::default().keep(world.acquire("r").await).unwrap();
    let signal = kept.signal().clone();
    world.until(ms(1_400)).await;
    world.backend().inject(Fault::LoseReply);
    assert!(matches!(
        kept.release().await,
        ReleaseOutcome::Indeterminate(_)
    ));
    assert_eq!(signal.reason(), Some(LossReason::Unreachable));
}

#[tokio::test(start_paused = true)]
async fn a_release_that_was_not_applied_can_be_tried_again_with_the_handle() {
    let clock = TokioClock::new();
    // Renewals succeed; the first release is refused (`Unavailable`, not applied).
    let backend = Scripted::healthy();
    backend.release_once(ReleaseReply::Failed(scripted::refused()));
    let client = LeaseClient::new(backend).with_clock(clock);
    let kept = Watchdog::default()
        .keep(acquire_from(&client, "r").await)
        .unwrap();
    let signal = kept.signal().clone();
    sleep(ms(1_500)).await;
    let (outcome, handle) = kept.release_returning_handle().await;
    assert!(
        matches!(outcome, ReleaseOutcome::Unavailable(_)),
        "{outcome:?}"
    );
    // Neither renewed any more nor released: the work is told, and the lease is still held.
    assert_eq!(signal.reason(), Some(LossReason::Unreachable));
    assert_eq!(handle.state(), LeaseState::Active);
    assert_eq!(handle.release().await, ReleaseOutcome::Released);
}

#[tokio::test(start_paused = true)]
async fn a_release_waits_for_a_renewal_whose_request_is_still_on_its_way() {
    // The renewal sent at 1 s reaches the server only at 1.15 s; the release is asked for at
    // 1.1 s, when the watchdog has nothing left to stop: the renewal is already sent. Only
    // the handle's send lock keeps the release from overtaking it on the wire.
    let world = World::new(COMMAND_TIMEOUT);
    let kept = Watchdog::default().keep(world.acquire("r").await).unwrap();
    world.backend().inject(Fault::DelayRequest(ms(150)));
    world.until(ms(1_100)).await;
    assert_eq!(kept.release().await, ReleaseOutcome::Released);
    assert_eq!(world.sent(RequestKind::Release), vec![ms(1_150)]);
    // The renewal landed and was confirmed before the release was sent, and the release
    // deleted the key: nothing of the lease is left on the server.
    assert!(
        world
            .server
            .stored(&Purpose::new("p").unwrap(), &ResourceDigest::of("r"))
            .is_none()
    );
    sleep(ms(10_000)).await;
    assert_release_is_last(&world);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_kept_lease_stops_its_renewals_and_frees_its_slot() {
    let world = World::new(COMMAND_TIMEOUT);
    let watchdog = Watchdog::new(KeepAliveSettings::default().with_max_leases(1).unwrap());
    let kept = watchdog.keep(world.acquire("a").await).unwrap();
    let signal = kept.signal().clone();
    world.until(ms(1_500)).await;
    drop(kept);
    // Work holding the signal is told at once: nothing renews the lease any more.
    assert_eq!(signal.reason(), Some(LossReason::Dropped));
    // The slot is free at once.
    let again = watchdog.keep(world.acquire("b").await).unwrap();
    world.until(ms(11_200)).await;
    // "a" was renewed once, at 1 s; "b" (kept at 1.5 s) every second since.
    let renewals = world.sent(RequestKind::Renew);
    let expected: Vec<Duration> = std::iter::once(ms(1_000))
        .chain((1..=9).map(|k| ms(1_500) + CADENCE * k))
        .collect();
    assert_eq!(renewals, expected);
    assert!(
        world
            .server
            .stored(&Purpose::new("p").unwrap(), &ResourceDigest::of("a"))
            .is_none()
    );
    assert_eq!(again.release().await, ReleaseOutcome::Released);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_watchdog_and_its_leases_stops_the_task() {
    let world = World::new(COMMAND_TIMEOUT);
    let watchdog = Watchdog::default();
    let kept = watchdog.keep(world.acquire("r").await).unwrap();
    let signal = kept.signal().clone();
    let tasks = tokio::runtime::Handle::current().metrics();
    assert_eq!(tasks.num_alive_tasks(), 1);
    world.until(ms(1_500)).await;
    drop(watchdog);
    // Still renewed while the kept lease lives.
    world.until(ms(2_500)).await;
    assert_eq!(world.sent(RequestKind::Renew), vec![ms(1_000), ms(2_000)]);
    drop(kept);
    assert_eq!(signal.reason(), Some(LossReason::Dropped));
    sleep(ms(10_000)).await;
    assert_eq!(world.sent(RequestKind::Renew), vec![ms(1_000), ms(2_000)]);
    // The task itself has ended, not merely gone quiet.
    assert_eq!(tasks.num_alive_tasks(), 0);
}

/// A world with a lease granted at 0 and kept (with `fault` queued for its first renewal) at
/// `kept_at`.
async fn kept_late(
    command_timeout: Duration,
    kept_at: Duration,
    fault: Option<Fault>,
) -> (World, leasehold::KeptLease<SimBackend>) {
    let world = World::new(command_timeout);
    let handle = world.acquire("r").await;
    world.until(kept_at).await;
    if let Some(fault) = fault {
        world.backend().inject(fault);
    }
    let kept = Watchdog::default().keep(handle).unwrap();
    (world, kept)
}

#[tokio::test(start_paused = true)]
async fn a_lease_kept_late_is_renewed_a_retry_interval_before_its_margin_point() {
    // Granted at 0: valid until 2.96 s, margin point 2.36 s. Kept at 1.9 s, its first renewal
    // is due a retry interval (250 ms) before the margin point, so that its reply is due
    // before it; kept at 2.2 s, that instant has passed and it is sent at once.
    for (kept_at, renewed_at) in [(1_900, 2_110), (2_200, 2_200)] {
        let (world, kept) = kept_late(COMMAND_TIMEOUT, ms(kept_at), None).await;
        world.until(ms(2_900)).await;
        assert_eq!(world.sent(RequestKind::Renew), vec![ms(renewed_at)]);
        assert!(!kept.signal().is_lost(), "{:?}", kept.signal().reason());
        assert_eq!(
            since(kept.handle().valid_until()),
            ms(renewed_at) + TTL - DRIFT
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_first_renewal_answered_after_the_margin_point_is_too_late() {
    // Kept at 2.34 s, 20 ms before the margin point: its first renewal is sent at once and
    // answered 100 ms later, past the margin point, where the signal has already fired.
    let (world, kept) =
        kept_late(COMMAND_TIMEOUT, ms(2_340), Some(Fault::DelayReply(ms(100)))).await;
    assert_eq!(fired(kept.signal()).await, LossReason::Unreachable);
    assert_eq!(world.now(), TTL - DRIFT - MARGIN);
    assert_eq!(world.sent(RequestKind::Renew), vec![ms(2_340)]);
}

#[tokio::test(start_paused = true)]
async fn a_late_first_renewal_that_fails_or_hangs_fires_the_signal_at_the_margin_point() {
    // Kept at 2.2 s and sent at once: whether the backend gives up after 200 ms (at 2.4 s) or
    // would wait 10 s, the signal fires at the margin point, 2.36 s.
    for timeout in [COMMAND_TIMEOUT, ms(10_000)] {
        let (world, kept) = kept_late(timeout, ms(2_200), Some(Fault::LoseRequest)).await;
        assert_eq!(fired(kept.signal()).await, LossReason::Unreachable);
        assert_eq!(world.now(), TTL - DRIFT - MARGIN, "timeout {timeout:?}");
        assert_eq!(world.sent(RequestKind::Renew), vec![ms(2_200)]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_lease_kept_past_its_margin_point_fires_at_once() {
    // With 460 ms or 160 ms of validity left (less than the margin), nothing is sent: the work
    // could not be given the margin to stop in if a renewal failed. With none left, `Expired`.
    for (kept_at, reason) in [
        (2_500, LossReason::Unreachable),
        (2_800, LossReason::Unreachable),
        (3_000, LossReason::Expired),
    ] {
        let (world, kept) = kept_late(ms(10_000), ms(kept_at), None).await;
        assert_eq!(fired(kept.signal()).await, reason, "kept at {kept_at} ms");
        assert_eq!(world.now(), ms(kept_at));
        sleep(ms(1_000)).await;
        assert_eq!(world.sent(RequestKind::Renew), vec![]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_starved_runtime_fires_the_signal_as_soon_as_it_wakes_past_the_margin_point() {
    // Renewed at 1 s: valid until 3.96 s, margin point 3.36 s. The backend would wait 10 s.
    let world = World::new(ms(10_000));
    let kept = Watchdog::default().keep(world.acquire("r").await).unwrap();
    world.until(ms(1_500)).await;
    world.backend().inject(Fault::LoseRequest);
    // Starve the watchdog's task: tokio's clock jumps to 3.9 s before it runs again, so it
    // sees the renewal due at 2 s only then, 60 ms before validity ends.
    tokio::time::advance(ms(2_400)).await;
    assert_eq!(fired(kept.signal()).await, LossReason::Unreachable);
    assert_eq!(world.now(), ms(3_900));
    assert_eq!(world.sent(RequestKind::Renew), vec![ms(1_000)]);
}

#[tokio::test(start_paused = true)]
async fn a_renewal_queued_behind_the_in_flight_cap_fires_the_signal_by_the_margin_point() {
    // One renewal in flight at most. "a" renews at 2 s, and its reply comes at 2.6 s (then
    // "b" is never sent before its margin point) or at 2.35 s (then "b" is sent and lost).
    // "b", granted at 0 and kept at 2.34 s, is due at once: its margin point is 2.36 s.
    for a_answered_after in [600, 350] {
        let world = World::new(ms(10_000));
        let watchdog = Watchdog::new(KeepAliveSettings::default().with_max_in_flight(1).unwrap());
        let a = world.acquire("a").await;
        let b = world.acquire("b").await;
        let kept_a = watchdog.keep(a).unwrap();
        world.until(ms(1_500)).await;
        world
            .backend()
            .inject(Fault::DelayReply(ms(a_answered_after)));
        world.backend().inject(Fault::LoseRequest);
        world.until(ms(2_340)).await;
        let kept_b = watchdog.keep(b).unwrap();
        assert_eq!(fired(kept_b.signal()).await, LossReason::Unreachable);
        let fired_at = world.now();
        let margin_point = TTL - DRIFT - MARGIN;
        assert!(
            fired_at <= margin_point + ms(1),
            "fired at {fired_at:?}, margin point {margin_point:?}"
        );
        assert!(!kept_a.signal().is_lost());
        let b_sent = world.sent(RequestKind::Renew).len() == 3;
        assert_eq!(b_sent, a_answered_after < 360);
    }
}

#[tokio::test(start_paused = true)]
async fn renewals_in_flight_are_bounded_and_the_rest_wait_their_turn() {
    // 100 leases on one watchdog that sends at most 10 renewals at once; every reply takes
    // 20 ms. A round of 100 renewals then takes 200 ms: well inside the cadence.
    const LEASES: usize = 100;
    const MAX_IN_FLIGHT: usize = 10;
    let world = World::new(COMMAND_TIMEOUT);
    let watchdog = Watchdog::new(
        KeepAliveSettings::default()
            .with_max_in_flight(MAX_IN_FLIGHT)
            .unwrap(),
    );
    let mut kept = Vec::new();
    for i in 0..LEASES {
        let handle = world.acquire(&format!("r{i}")).await;
        kept.push(watchdog.keep(handle).unwrap());
    }
    world
        .backend()
        .inject_many(Fault::DelayReply(ms(20)), 100_000);
    sleep(ms(10_500)).await;
    assert!(kept.iter().all(|k| !k.signal().is_lost()));
    let renewals = world.sent(RequestKind::Renew);
    // Ten rounds (the queue delays each lease by at most 200 ms a round).
    assert!(renewals.len() >= LEASES * 9, "{} renewals", renewals.len());
    // Each renewal is in flight for [sent, sent + 20 ms): never more than 10 overlap.
    let most = renewals
        .iter()
        .map(|&t| {
            renewals
                .iter()
                .filter(|&&u| u <= t && t < u + ms(20))
                .count()
        })
        .max()
        .unwrap();
    assert_eq!(most, MAX_IN_FLIGHT);
    for k in kept {
        world.backend().clear_faults();
        let _ = k.release().await;
    }
}

#[test]
fn a_runtime_shutdown_fires_the_signal_and_the_next_keep_starts_a_new_task() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let watchdog = Watchdog::default();
    let first = runtime();
    let (world, kept) = first.block_on(async {
        let world = World::new(COMMAND_TIMEOUT);
        let kept = watchdog.keep(world.acquire("a").await).unwrap();
        (world, kept)
    });
    assert!(!kept.signal().is_lost());
    // The watchdog's task dies with its runtime: nothing renews the lease any more.
    drop(first);
    assert_eq!(kept.signal().reason(), Some(LossReason::WatchdogStopped));
    drop((world, kept));
    runtime().block_on(async {
        let world = World::new(COMMAND_TIMEOUT);
        let kept = watchdog.keep(world.acquire("b").await).unwrap();
        world.until(ms(1_500)).await;
        assert_eq!(world.sent(RequestKind::Renew), vec![ms(1_000)]);
        assert_eq!(kept.release().await, ReleaseOutcome::Released);
    });
}

#[tokio::test(start_paused = true)]
async fn renewals_that_fail_at_once_are_retried_at_a_pace_until_the_margin_point() {
    let clock = TokioClock::new();
    // The server refuses every connection after the grant: renewals fail at once. Past 100 of
    // them the backend panics (which stops the lease), so a watchdog that retried in a tight
    // loop fails the test instead of hanging it.
    let backend = Scripted::healthy().timed_by(clock);
    backend.renew_always_with(|_, n| {
        assert!(n < 100, "retried in a loop");
        RenewReply::Failed(scripted::refused())
    });
    let client = LeaseClient::new(backend).with_clock(clock);
    let handle = acquire_from(&client, "r").await;
    let kept = Watchdog::default().keep(handle).unwrap();
    // Granted at 0: margin point 2.36 s. A retry interval (250 ms) after each failure, the
    // last one a retry interval before the margin point; none after it, as none could be
    // answered in time.
    assert_eq!(fired(kept.signal()).await, LossReason::Unreachable);
    assert_eq!(clock.now().since_origin(), TTL - DRIFT - MARGIN);
    let renewals = client.backend().times_of(Op::Renew);
    assert_eq!(
        renewals,
        [1_000, 1_250, 1_500, 1_750, 2_000, 2_110].map(ms).to_vec()
    );
}

#[tokio::test(start_paused = true)]
async fn a_panicking_backend_stops_only_its_own_leases() {
    let world = World::new(COMMAND_TIMEOUT);
    let watchdog = Watchdog::default();
    let healthy = watchdog.keep(world.acquire("r").await).unwrap();
    // A broken backend: its renewals panic.
    let broken = Scripted::healthy();
    broken
        .renew_always_with(|_, _| panic!("a broken backend (this panic is expected by the test)"));
    let broken_client = LeaseClient::new(broken).with_clock(world.clock);
    let attempt = broken_client
        .new_attempt(OperationId::new("op").unwrap())
        .unwrap();
    let request = broken_client
        .request(
            Purpose::new("p").unwrap(),
            ResourceDigest::of("r"),
            attempt,
            TTL,
        )
        .unwrap();
    let broken = watchdog
        .keep(
            broken_client
                .try_acquire(&request)
                .await
                .into_handle()
                .unwrap(),
        )
        .unwrap();
    assert_eq!(broken.signal().lost().await, LossReason::WatchdogStopped);
    assert_eq!(world.now(), ms(1_000));
    world.until(ms(5_500)).await;
    assert!(!healthy.signal().is_lost());
    assert_eq!(
        world.sent(RequestKind::Renew),
        (1..=5).map(|k| CADENCE * k).collect::<Vec<_>>()
    );
    assert_eq!(healthy.release().await, ReleaseOutcome::Released);
    assert_eq!(broken.release().await, ReleaseOutcome::Released);
}

/// Asks `watchdog` to keep `count` more leases of `world`, all at one instant (one renewal a
/// second each), against a server that answers each command in 10 ms; returns those it kept,
/// and how many it refused for its load (released).
async fn keep_many(
    world: &World,
    watchdog: &Watchdog,
    from: usize,
    count: usize,
) -> (Vec<leasehold::KeptLease<SimBackend>>, usize) {
    // Acquired without delay, so that no time passes between the first keep and the last.
    world.backend().clear_faults();
    let mut handles = Vec::new();
    for i in from..from + count {
        handles.push(world.acquire(&format!("r{i}")).await);
    }
    world
        .backend()
        .inject_many(Fault::DelayReply(ms(10)), 100_000);
    let (mut kept, mut refused) = (Vec::new(), Vec::new());
    for handle in handles {
        match watchdog.keep(handle) {
            Ok(lease) => kept.push(lease),
            Err(not_kept) => {
                let (error, handle) = not_kept.into_parts();
                assert_eq!(error.kind(), ErrorKind::WatchdogOverloaded, "{error}");
                refused.push(handle);
            }
        }
    }
    let refusals = refused.len();
    let released = futures_util::future::join_all(refused.iter().map(|h| h.release())).await;
    assert!(released.iter().all(|r| *r == ReleaseOutcome::Released));
    (kept, refusals)
}

/// A watchdog with 4 renewals in flight against a server that answers each in 10 ms (see
/// [`keep_many`]) can confirm 400 renewals a second; leases of TTL 3 s need one a second each.
fn slow_watchdog(assumed_capacity: u32) -> Watchdog {
    Watchdog::new(
        KeepAliveSettings::default()
            .with_max_in_flight(4)
            .unwrap()
            .with_assumed_capacity(assumed_capacity)
            .unwrap(),
    )
}

#[tokio::test(start_paused = true)]
async fn a_watchdog_asked_for_far_more_than_it_can_keep_refuses_the_rest_and_loses_none() {
    let world = World::new(COMMAND_TIMEOUT);
    // Until it has measured, it admits three quarters of the 100 a second it assumes.
    let watchdog = slow_watchdog(100);
    assert_eq!(watchdog.admission_limit(), 75.0);
    let (mut kept, refused_first) = keep_many(&world, &watchdog, 0, 1_000).await;
    assert_eq!((kept.len(), refused_first), (75, 925));
    // Its renewals measure its capacity: 4 slots over 10 ms each. It then admits 300.
    sleep(ms(3_000)).await;
    assert_eq!(watchdog.renewal_capacity(), Some(400.0));
    assert_eq!(watchdog.admission_limit(), 300.0);
    let (more, refused_then) = keep_many(&world, &watchdog, 1_000, 1_000).await;
    assert_eq!((more.len(), refused_then), (225, 775));
    kept.extend(more);
    assert_eq!(watchdog.renewals_needed(), 300.0);
    // Ten cadences later, none of the 300 it took on is lost.
    sleep(ms(10_000)).await;
    let lost: Vec<_> = kept.iter().filter_map(|k| k.signal().reason()).collect();
    assert!(lost.is_empty(), "{} lost: {lost:?}", lost.len());
    // Everything it took on was renewed all along: released, every grant is still its own.
    for k in kept {
        assert_eq!(k.release().await, ReleaseOutcome::Released);
    }
    assert_eq!(watchdog.renewals_needed(), 0.0);
}

#[tokio::test(start_paused = true)]
async fn the_same_watchdog_made_to_take_them_all_loses_leases() {
    // The control: told it can confirm 10,000 a second, it takes on all 1,000 and then
    // cannot renew them in time (a round takes 2.5 s against a margin point at 2.36 s, and
    // the rounds fall further behind).
    let world = World::new(COMMAND_TIMEOUT);
    let watchdog = slow_watchdog(10_000);
    let (kept, refused) = keep_many(&world, &watchdog, 0, 1_000).await;
    assert_eq!((kept.len(), refused), (1_000, 0));
    sleep(ms(10_000)).await;
    let lost = kept.iter().filter(|k| k.signal().is_lost()).count();
    assert!(lost > 300, "only {lost} of 1,000 lost");
    // Having measured, it now refuses what it cannot keep.
    assert!(watchdog.renewal_capacity().is_some_and(|c| c <= 400.0));
    let (_, refused) = keep_many(&world, &watchdog, 1_000, 1).await;
    assert_eq!(refused, 1);
}

#[tokio::test(start_paused = true)]
async fn the_one_call_lock_refuses_a_lease_its_watchdog_would_be_overloaded_by_and_releases_it() {
    // A watchdog that admits 0.75 renewals a second: a lease of TTL 3 s (one a second) is
    // taken on only while it keeps nothing else.
    let world = World::new(COMMAND_TIMEOUT);
    let client = world.client.clone().with_keep_alive(
        KeepAliveSettings::default()
            .with_assumed_capacity(1)
            .unwrap(),
    );
    let first = client.lock("a").ttl(TTL).await.expect("the first is kept");
    match client.lock("b").ttl(TTL).await {
        Err(leasehold::LockError::Refused(error)) => {
            assert_eq!(error.kind(), ErrorKind::WatchdogOverloaded);
            assert!(!error.is_invalid_input(), "{error}");
        }
        other => panic!("not refused: {other:?}"),
    }
    // The refused lease was released at once: another caller takes it without waiting.
    let other = LeaseClient::new(world.server.connect(COMMAND_TIMEOUT)).with_clock(world.clock);
    let b = other.lock("b").ttl(TTL).await.expect("b was released");
    assert_eq!(b.release().await, ReleaseOutcome::Released);
    assert_eq!(first.release().await, ReleaseOutcome::Released);
}
