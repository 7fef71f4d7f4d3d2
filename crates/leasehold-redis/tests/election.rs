//! Leader election on real redis-server: one leader at a time on a shared timeline, terms that
//! strictly increase, hand-off through the release notice, take-over after a killed leader,
//! the leadership signal before validity ends, and observers that see every change.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::client;
use leasehold_redis::leasehold::{
    BootClock, Clock, Election, FenceToken, HolderName, Leader, LossReason, ReleaseOutcome,
};
use leasehold_redis::{RedisBackend, RedisLeases};
use test_support::sentinel::SERVICE;
use test_support::{FaultProxy, ProxyFault, RedisCluster, RedisSentinel, RedisServer};
use tokio::sync::watch;

/// One term as its leader lived it: from the moment `lead` started to the moment it stopped
/// (returned or was cancelled), on the one monotonic clock every candidate reads.
#[derive(Debug, Clone)]
struct Term {
    candidate: usize,
    term: FenceToken,
    start: Instant,
    end: Option<Instant>,
}

/// Every term of every candidate, on one timeline.
#[derive(Debug, Clone, Default)]
struct Timeline(Arc<Mutex<Vec<Term>>>);

impl Timeline {
    fn begin(&self, candidate: usize, term: FenceToken) -> Ending {
        let mut terms = self.0.lock().unwrap();
        terms.push(Term {
            candidate,
            term,
            start: Instant::now(),
            end: None,
        });
        Ending {
            timeline: self.clone(),
            index: terms.len() - 1,
        }
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn terms(&self) -> Vec<Term> {
        self.0.lock().unwrap().clone()
    }

    /// Requires that no two terms overlapped and that terms strictly increase in the order
    /// they began.
    fn assert_one_leader_at_a_time(&self) {
        let mut terms = self.terms();
        terms.sort_by_key(|t| t.start);
        for pair in terms.windows(2) {
            let (before, after) = (&pair[0], &pair[1]);
            let ended = before.end.expect("every term ended before the check");
            assert!(
                ended <= after.start,
                "two leaders at once: {before:?} and {after:?}"
            );
            assert!(
                after.term > before.term,
                "terms went back: {before:?} then {after:?}"
            );
        }
    }
}

/// Records the end of a term when dropped: when `lead` returns or is cancelled.
struct Ending {
    timeline: Timeline,
    index: usize,
}

impl Drop for Ending {
    fn drop(&mut self) {
        if let Ok(mut terms) = self.timeline.0.lock() {
            terms[self.index].end = Some(Instant::now());
        }
    }
}

fn election(client: &RedisLeases, ttl: Duration) -> Election<RedisBackend> {
    client.election("scheduler").with_ttl(ttl)
}

fn name(i: usize) -> HolderName {
    HolderName::new(&format!("candidate-{i}")).unwrap()
}

/// Starts candidate `i` on `client`: each term lasts `hold` (then it resigns and campaigns
/// again), until `stop` says so.
fn candidate(
    client: &RedisLeases,
    i: usize,
    ttl: Duration,
    hold: Duration,
    timeline: &Timeline,
    stop: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let me = election(client, ttl).candidate(name(i));
    let timeline = timeline.clone();
    let mut stop = stop.clone();
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        me.run_until(stopped, |held| {
            let ending = timeline.begin(i, held.fence());
            async move {
                let _ending = ending;
                tokio::time::sleep(hold).await;
            }
        })
        .await
        .expect("the election's TTL is valid");
    })
}

/// Waits, boundedly, until `done` holds.
async fn until(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn one_candidate_leads_at_a_time_and_terms_strictly_increase() {
    let server = RedisServer::start();
    let timeline = Timeline::default();
    let (stop, stopped) = watch::channel(false);
    // Three candidates, each on its own client (as three processes would be), with terms of
    // different lengths so that hand-offs land at every point of the others' waits.
    let clients: Vec<_> = (0..3).map(|_| client(&server)).collect();
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let hold = Duration::from_millis(15 + 10 * i as u64);
            candidate(c, i, Duration::from_secs(2), hold, &timeline, &stopped)
        })
        .collect();
    until("30 terms", Duration::from_secs(30), || timeline.len() >= 30).await;
    stop.send(true).unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    timeline.assert_one_leader_at_a_time();
    // The last leader resigned on the way out: nobody leads.
    assert_eq!(
        election(&clients[0], Duration::from_secs(2)).leader().await,
        Ok(None)
    );
}

#[tokio::test]
async fn a_resigning_leader_is_replaced_through_the_notice_not_the_ttl() {
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    // A TTL far above the bound: only the release notice explains a hand-off within it.
    let ttl = Duration::from_secs(20);
    let first = election(&a, ttl)
        .candidate(name(0))
        .campaign()
        .await
        .unwrap();
    let next = election(&b, ttl).candidate(name(1));
    let waiting = tokio::spawn(async move {
        let leadership = next.campaign().await.unwrap();
        (leadership, Instant::now())
    });
    // The second candidate has tried and is waiting: its try found the first leading.
    let watched = election(&a, ttl);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        watched.leader().await.unwrap().map(|l| l.term),
        Some(first.term())
    );
    let first_term = first.term();
    let resigned_at = Instant::now();
    assert_eq!(first.resign().await, ReleaseOutcome::Released);
    let (second, led_at) = waiting.await.unwrap();
    assert!(
        led_at - resigned_at < Duration::from_secs(2),
        "{:?}",
        led_at - resigned_at
    );
    assert!(second.term() > first_term);
    let leader = watched.leader().await.unwrap().expect("a leader");
    assert_eq!(leader.term, second.term());
    assert_eq!(leader.name, Some(name(1)));
    assert_eq!(second.resign().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_killed_leader_is_replaced_within_the_ttl_plus_a_bound() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr());
    let doomed = RedisBackend::open(&proxy.url(), common::settings())
        .unwrap()
        .into_client();
    let survivor = client(&server);
    let ttl = Duration::from_secs(1);
    let first = election(&doomed, ttl)
        .candidate(name(0))
        .campaign()
        .await
        .unwrap();
    let first_term = first.term();
    let next = election(&survivor, ttl).candidate(name(1));
    let waiting = tokio::spawn(async move {
        let leadership = next.campaign().await.unwrap();
        (leadership, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Killed: nothing it sends reaches the server from here on, not even the release that
    // dropping its leadership starts.
    proxy.to_server(ProxyFault::Hold);
    let killed_at = Instant::now();
    drop(first);
    let (second, led_at) = waiting.await.unwrap();
    let took = led_at - killed_at;
    assert!(took < ttl + Duration::from_secs(1), "{took:?}");
    assert!(second.term() > first_term);
    assert_eq!(second.resign().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn a_frozen_server_ends_leadership_before_the_lease_s_validity_ends() {
    let server = RedisServer::start();
    let client = client(&server);
    let leadership = election(&client, Duration::from_secs(1))
        .candidate(name(0))
        .campaign()
        .await
        .unwrap();
    let _paused = server.pause();
    let reason = tokio::time::timeout(Duration::from_secs(5), leadership.lost())
        .await
        .expect("the leadership signal never fired");
    let fired_at = BootClock.now();
    assert_eq!(reason, LossReason::Unreachable);
    assert!(!leadership.is_leading());
    assert!(
        fired_at < leadership.handle().valid_until(),
        "fired after validity ended"
    );
}

/// Follows `election` until `stop`, collecting every leader the watch returned.
fn observer(
    election: Election<RedisBackend>,
    stop: &watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Vec<Option<Leader>>> {
    let mut stop = stop.clone();
    tokio::spawn(async move {
        let mut watch = election.observe();
        let mut seen = Vec::new();
        loop {
            tokio::select! {
                _ = stop.wait_for(|stop| *stop) => return seen,
                next = watch.next() => seen.push(next.expect("the server answers")),
            }
        }
    })
}

#[tokio::test]
async fn observers_see_every_change_of_leader_in_order() {
    let server = RedisServer::start();
    let timeline = Timeline::default();
    let (stop_candidates, candidates_stopped) = watch::channel(false);
    let (stop_observer, observer_stopped) = watch::channel(false);
    let ttl = Duration::from_secs(2);
    let watcher = client(&server);
    let seen = observer(election(&watcher, ttl), &observer_stopped);
    let clients: Vec<_> = (0..3).map(|_| client(&server)).collect();
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            candidate(
                c,
                i,
                ttl,
                Duration::from_millis(60),
                &timeline,
                &candidates_stopped,
            )
        })
        .collect();
    until("12 terms", Duration::from_secs(30), || timeline.len() >= 12).await;
    stop_candidates.send(true).unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    // The last resignation's notice reaches the observer, which then sees nobody leading.
    assert_eq!(election(&watcher, ttl).leader().await, Ok(None));
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop_observer.send(true).unwrap();
    let seen = seen.await.unwrap();
    let mut led: Vec<Term> = timeline.terms();
    led.sort_by_key(|t| t.start);
    let led: Vec<FenceToken> = led.iter().map(|t| t.term).collect();
    let seen_terms: Vec<FenceToken> = seen.iter().flatten().map(|l| l.term).collect();
    assert_eq!(seen_terms, led, "observed {seen:?}");
    // Each leader is seen under its own name, and the watch ends on nobody.
    let names: Vec<_> = seen.iter().flatten().map(|l| l.name.clone()).collect();
    let expected: Vec<_> = {
        let mut terms = timeline.terms();
        terms.sort_by_key(|t| t.start);
        terms.iter().map(|t| Some(name(t.candidate))).collect()
    };
    assert_eq!(names, expected);
    assert_eq!(seen.last(), Some(&None));
}

/// A campaign, a resignation handed off through the notice, and an observer that sees both
/// terms: on any deployment `open` connects to.
async fn hand_off_and_observe(open: impl Fn() -> RedisLeases) {
    let ttl = Duration::from_secs(20);
    let (a, b, watcher) = (open(), open(), open());
    let (stop, stopped) = watch::channel(false);
    let seen = observer(election(&watcher, ttl), &stopped);
    let first = election(&a, ttl)
        .candidate(name(0))
        .campaign()
        .await
        .unwrap();
    let next = election(&b, ttl).candidate(name(1));
    let waiting = tokio::spawn(async move { next.campaign().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first_term = first.term();
    let resigned_at = Instant::now();
    assert_eq!(first.resign().await, ReleaseOutcome::Released);
    let second = waiting.await.unwrap();
    assert!(
        resigned_at.elapsed() < Duration::from_secs(5),
        "not through the notice"
    );
    assert!(second.term() > first_term);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.send(true).unwrap();
    let seen: Vec<FenceToken> = seen
        .await
        .unwrap()
        .iter()
        .flatten()
        .map(|l| l.term)
        .collect();
    assert_eq!(seen, [first_term, second.term()]);
    assert_eq!(second.resign().await, ReleaseOutcome::Released);
}

#[tokio::test]
async fn an_election_hands_off_and_is_observed_through_sentinel() {
    let deployment = RedisSentinel::start();
    hand_off_and_observe(|| {
        RedisBackend::open_sentinel(
            &deployment.sentinel_urls(),
            SERVICE,
            None,
            common::settings(),
        )
        .unwrap()
        .into_client()
    })
    .await;
}

#[tokio::test]
async fn an_election_hands_off_and_is_observed_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    hand_off_and_observe(|| {
        RedisBackend::open_cluster(&cluster.urls(), common::settings())
            .unwrap()
            .into_client()
    })
    .await;
}

#[tokio::test]
async fn a_campaign_with_a_ttl_the_watchdog_cannot_keep_is_refused_before_any_io() {
    // Nothing listens on this port: a refusal that reached for the server would say so.
    let client = RedisBackend::open("redis://127.0.0.1:1", common::settings())
        .unwrap()
        .into_client();
    let refused = election(&client, Duration::from_millis(5))
        .candidate(name(0))
        .campaign()
        .await
        .unwrap_err();
    assert!(refused.is_definite());
    assert!(
        matches!(refused, leasehold_redis::leasehold::LockError::Refused(_)),
        "{refused:?}"
    );
}

/// An observer is told of a resignation by the release notice even when no candidate waits:
/// nobody but the observer listens, and it never acquires.
#[tokio::test]
async fn an_observer_alone_sees_a_resignation_through_the_notice_not_the_ttl() {
    let server = RedisServer::start();
    let (leader_client, observer_client) = (client(&server), client(&server));
    let ttl = Duration::from_secs(20);
    let leading = election(&leader_client, ttl)
        .candidate(name(0))
        .campaign()
        .await
        .unwrap();
    let mut watch = election(&observer_client, ttl).observe();
    let now = watch.next().await.unwrap();
    assert_eq!(now.map(|l| l.term), Some(leading.term()));
    // Once the observer's subscription is in place (its first connection wakes every watch
    // once, which must not be what tells it of the resignation), the leader resigns, while
    // the observer waits for the next change.
    let subscribed = || match server.cmd(&["PUBSUB", "CHANNELS", "*:released"]) {
        test_support::Reply::Array(Some(items)) => !items.is_empty(),
        _ => false,
    };
    until(
        "the observer's subscription",
        Duration::from_secs(10),
        subscribed,
    )
    .await;
    // Resigned once the observer has read the term again (one script call that is not a
    // renewal, which PEXPIREs), so that it waits for the change, not reads it.
    let reads = || {
        let stats = server.commandstats();
        let count = |name: &str| stats.get(name).copied().unwrap_or(0);
        count("evalsha").saturating_sub(count("pexpire"))
    };
    let before = reads();
    let next = tokio::spawn(async move { watch.next().await });
    until("the observer's read", Duration::from_secs(10), || {
        reads() > before
    })
    .await;
    let resigned_at = Instant::now();
    assert_eq!(leading.resign().await, ReleaseOutcome::Released);
    let next = next.await.unwrap().unwrap();
    assert_eq!(next, None, "nobody leads after the resignation");
    // The TTL was 20 s: only the notice explains seeing it this soon.
    assert!(
        resigned_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        resigned_at.elapsed()
    );
}
