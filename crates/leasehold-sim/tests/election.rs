//! Elections in the simulation, on tokio's paused clock: candidates campaign, lead, resign, are
//! killed and come back, while their connections lose and delay requests and replies — and an
//! observer follows. Checked on the one virtual timeline:
//!
//! - I3 with terms: no two candidates believe they lead at once (under connection faults);
//! - I4 with terms: the fenced store, guarded by the term, never accepts a write whose term
//!   goes back (also across server restarts, which may break I3 by design);
//! - terms strictly increase from leader to leader (across restarts: stay unique), and the
//!   observer sees them in order.
//!
//! A failure prints its seed; `LEASEHOLD_SIM_SEED=<seed>` runs the same faults and the same
//! leaders' work again. (Not always the same interleaving: `tokio::select!` in the library
//! draws its own branch order, which only an unstable tokio build can seed.)

mod chaos;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chaos::{Rng, connection_fault, seeds};
use leasehold::{FenceGate, FenceToken, HolderFingerprint, HolderName, LeaseClient, TokioClock};
use leasehold_sim::{Fault, SimBackend, SimServer};
use tokio::sync::watch;
use tokio::time::Instant;

const COMMAND_TIMEOUT: Duration = Duration::from_millis(200);
const TTL: Duration = Duration::from_secs(1);
const CANDIDATES: usize = 3;
const RUN_FOR: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
struct Term {
    term: FenceToken,
    start: Instant,
    end: Option<Instant>,
}

/// What every party recorded, on the virtual timeline.
#[derive(Debug, Default)]
struct Record {
    terms: Vec<Term>,
    gate: FenceGate,
    accepted: Vec<FenceToken>,
    refused: usize,
}

type Shared = Arc<Mutex<Record>>;

/// Records the end of a term when dropped: when `lead` returns or is cancelled.
struct Ending(Shared, usize);

impl Drop for Ending {
    fn drop(&mut self) {
        if let Ok(mut record) = self.0.lock() {
            record.terms[self.1].end = Some(Instant::now());
        }
    }
}

fn fingerprint(candidate: usize) -> HolderFingerprint {
    HolderFingerprint::parse(&format!("{candidate:016x}")).unwrap()
}

/// A candidate's process: its own connection, campaigning until stopped.
struct Process {
    client: LeaseClient<SimBackend>,
    task: tokio::task::JoinHandle<()>,
}

fn start(
    server: &SimServer,
    clock: TokioClock,
    i: usize,
    mut rng: Rng,
    record: &Shared,
    stop: &watch::Receiver<bool>,
) -> Process {
    let client = LeaseClient::new(server.connect(COMMAND_TIMEOUT)).with_clock(clock);
    let me = client
        .election("sim-election")
        .with_ttl(TTL)
        .candidate(HolderName::new(&format!("candidate-{i}")).unwrap());
    let record = Arc::clone(record);
    let mut stop = stop.clone();
    let task = tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        me.run_until(stopped, |held| {
            let term = held.fence();
            let ending = {
                let mut r = record.lock().unwrap();
                r.terms.push(Term {
                    term,
                    start: Instant::now(),
                    end: None,
                });
                Ending(Arc::clone(&record), r.terms.len() - 1)
            };
            let writes = 1 + rng.below(6);
            let pauses: Vec<Duration> = (0..writes).map(|_| rng.millis(5, 120)).collect();
            let record = Arc::clone(&record);
            async move {
                let _ending = ending;
                for pause in pauses {
                    tokio::time::sleep(pause).await;
                    // The write a leader makes: fenced by its term at the store.
                    let mut r = record.lock().unwrap();
                    if r.gate.admit(term, &fingerprint(i)).is_ok() {
                        r.accepted.push(term);
                    } else {
                        r.refused += 1;
                    }
                }
                // Then it resigns, and campaigns again.
            }
        })
        .await
        .expect("a valid election");
    });
    Process { client, task }
}

/// Faults the chaos task may inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chaos {
    /// Lost and delayed requests and replies, and killed candidates.
    Connections,
    /// That, and server restarts that lose every key.
    Restarts,
}

/// Runs one seeded election and returns what was recorded and what the observer saw.
async fn run(seed: u64, chaos: Chaos) -> (Record, Vec<Option<FenceToken>>) {
    let mut rng = Rng::new(seed);
    let clock = TokioClock::new();
    let server = SimServer::with_clock(clock);
    let record = Shared::default();
    let (stop, stopped) = watch::channel(false);
    let mut processes: Vec<Process> = (0..CANDIDATES)
        .map(|i| {
            let rng = rng.fork();
            start(&server, clock, i, rng, &record, &stopped)
        })
        .collect();
    let observer = {
        let client = LeaseClient::new(server.connect(COMMAND_TIMEOUT)).with_clock(clock);
        let election = client.election("sim-election").with_ttl(TTL);
        let mut stop = stopped.clone();
        tokio::spawn(async move {
            let mut watch = election.observe();
            let mut seen = Vec::new();
            loop {
                let next = tokio::select! {
                    _ = stop.changed() => return seen,
                    next = watch.next() => next,
                };
                match next {
                    Ok(leader) => seen.push(leader.map(|l| l.term)),
                    // A failed read changes nothing: look again a little later.
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        })
    };
    let end = Instant::now() + RUN_FOR;
    while Instant::now() < end {
        tokio::time::sleep(rng.millis(10, 300)).await;
        let i = rng.below(CANDIDATES as u64) as usize;
        match rng.below(10) {
            0 => {
                // Killed: nothing it sends arrives any more, and its task is gone.
                processes[i]
                    .client
                    .backend()
                    .inject_many(Fault::LoseRequest, 10_000);
                processes[i].task.abort();
                let rng = rng.fork();
                processes[i] = start(&server, clock, i, rng, &record, &stopped);
            }
            1 if chaos == Chaos::Restarts => server.restart(rng.millis(0, 200)),
            _ => processes[i]
                .client
                .backend()
                .inject(connection_fault(&mut rng)),
        }
    }
    for process in &processes {
        process.client.backend().clear_faults();
    }
    stop.send(true).unwrap();
    for process in processes {
        let _ = process.task.await;
    }
    let seen = observer.await.unwrap();
    let record = Arc::try_unwrap(record)
        .map_err(|_| "a candidate still holds the record")
        .unwrap()
        .into_inner()
        .unwrap();
    (record, seen)
}

/// I3 with terms: sorted by start, each term ended before the next began.
fn assert_one_leader_at_a_time(seed: u64, record: &Record) {
    let mut terms = record.terms.clone();
    terms.sort_by_key(|t| t.start);
    for pair in terms.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        // A killed candidate's term ends when its task is aborted: recorded by the drop.
        let ended = before.end.expect("every term ended");
        assert!(
            ended <= after.start,
            "seed {seed}: I3 broken, two leaders at once: {before:?} and {after:?}"
        );
    }
}

/// Terms strictly increase from leader to leader, and accepted writes never go back (I4).
fn assert_terms_increase(seed: u64, record: &Record) {
    let mut terms = record.terms.clone();
    terms.sort_by_key(|t| t.start);
    for pair in terms.windows(2) {
        assert!(
            pair[1].term > pair[0].term,
            "seed {seed}: terms went back: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
    assert_writes_never_go_back(seed, record);
}

/// No two leaders share a term, and accepted writes never go back (I4). What holds across
/// restarts: a grant made just before one, whose reply arrives after it, starts a term lower
/// than one granted since — a stale leader, which its term fences out.
fn assert_terms_unique(seed: u64, record: &Record) {
    let mut terms: Vec<FenceToken> = record.terms.iter().map(|t| t.term).collect();
    terms.sort();
    for pair in terms.windows(2) {
        assert!(
            pair[1] > pair[0],
            "seed {seed}: two leaders had term {:?}",
            pair[0]
        );
    }
    assert_writes_never_go_back(seed, record);
}

fn assert_writes_never_go_back(seed: u64, record: &Record) {
    for pair in record.accepted.windows(2) {
        assert!(pair[1] >= pair[0], "seed {seed}: I4 broken: {pair:?}");
    }
}

/// The observer saw terms in the order they were led, and only terms that were led.
fn assert_observed_in_order(seed: u64, record: &Record, seen: &[Option<FenceToken>]) {
    let led: Vec<FenceToken> = record.terms.iter().map(|t| t.term).collect();
    let seen: Vec<FenceToken> = seen.iter().flatten().copied().collect();
    for pair in seen.windows(2) {
        assert!(pair[1] > pair[0], "seed {seed}: observed {pair:?}");
    }
    // A grant that no `lead` ran under (a killed candidate's, or one made by a request that
    // arrived after its attempt was given up and before the clean-up removed it) is a leader
    // too, as far as the server is concerned: the observer may see it. Most terms were seen.
    let both = seen.iter().filter(|term| led.contains(term)).count();
    // Woken by every release notice, it misses only terms shorter than one of its reads.
    assert!(
        both * 5 >= led.len() * 4,
        "seed {seed}: the observer saw only {both} of {} terms",
        led.len()
    );
}

#[tokio::test(start_paused = true)]
async fn under_connection_faults_one_leader_at_a_time_and_terms_increase() {
    for seed in seeds(6) {
        let (record, seen) = run(seed, Chaos::Connections).await;
        assert!(
            record.terms.len() >= 20,
            "seed {seed}: only {} terms",
            record.terms.len()
        );
        assert_one_leader_at_a_time(seed, &record);
        assert_terms_increase(seed, &record);
        assert_observed_in_order(seed, &record, &seen);
        // One leader at a time: no leader's write was refused.
        assert_eq!(record.refused, 0, "seed {seed}");
    }
}

#[tokio::test(start_paused = true)]
async fn across_restarts_terms_stay_unique_and_stale_writes_are_refused() {
    for seed in seeds(6) {
        let (record, seen) = run(seed, Chaos::Restarts).await;
        assert!(record.terms.len() >= 20, "seed {seed}");
        // A restart loses the leader's key, so another may be elected while the first still
        // believes it leads (I3 may break, by design), and a grant whose reply was delayed
        // past a restart may start after a higher one (CI found seed 1796376255941481083):
        // terms need not increase by start, but the term fences a stale leader's writes out.
        assert_terms_unique(seed, &record);
        assert_observed_in_order(seed, &record, &seen);
    }
}
