//! Semaphores in the simulation, on tokio's paused clock: workers take permits of one
//! semaphore, work under them with fenced writes per slot, are killed and come back, while
//! their connections lose and delay requests and replies. Checked on the one virtual
//! timeline:
//!
//! - at most N holders at any instant, and never two holders of one slot (under connection
//!   faults and killed workers; a control whose holders ignore their TTL must break it and
//!   be caught by the same check);
//! - each slot's fenced store never accepts a write whose fence goes back (also across server
//!   restarts and failovers that lose writes, which may break the first by design);
//! - fences are unique across the whole semaphore, and grow from holder to holder of a slot;
//! - dead waiters never stall the queue: every worker that keeps asking is served;
//! - waiters are served in the order they began to wait.
//!
//! A failure prints its seed; `LEASEHOLD_SIM_SEED=<seed>` runs the same faults again.

mod chaos;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chaos::{Rng, connection_fault, seeds};
use leasehold::{
    AcquireOutcome, FenceGate, FenceToken, HolderFingerprint, LeaseClient, OperationId, Purpose,
    ResourceDigest, TokioClock,
};
use leasehold_sim::{Fault, SimBackend, SimServer};
use tokio::time::Instant;

const COMMAND_TIMEOUT: Duration = Duration::from_millis(200);
const TTL: Duration = Duration::from_secs(1);
const CAPACITY: u32 = 3;
const WORKERS: usize = 7;
const RUN_FOR: Duration = Duration::from_secs(30);
const NAME: &str = "sim-semaphore";

/// One hold of a permit, as its worker saw it.
#[derive(Debug, Clone)]
struct Hold {
    worker: usize,
    slot: u32,
    fence: FenceToken,
    start: Instant,
    end: Option<Instant>,
}

#[derive(Debug, Default)]
struct Record {
    holds: Vec<Hold>,
    /// One fenced store per slot.
    gates: HashMap<u32, FenceGate>,
    /// Accepted writes per slot, in the order the store took them.
    accepted: HashMap<u32, Vec<FenceToken>>,
    refused: usize,
}

type Shared = Arc<Mutex<Record>>;

/// Records the end of a hold when dropped: when the work returns or is cancelled.
struct Ending(Shared, usize);

impl Drop for Ending {
    fn drop(&mut self) {
        if let Ok(mut record) = self.0.lock() {
            record.holds[self.1].end = Some(Instant::now());
        }
    }
}

fn fingerprint(worker: usize) -> HolderFingerprint {
    HolderFingerprint::parse(&format!("{worker:016x}")).unwrap()
}

/// Starts a hold; the returned guard ends it.
fn begin(record: &Shared, worker: usize, slot: u32, fence: FenceToken) -> Ending {
    let mut r = record.lock().unwrap();
    r.holds.push(Hold {
        worker,
        slot,
        fence,
        start: Instant::now(),
        end: None,
    });
    Ending(Arc::clone(record), r.holds.len() - 1)
}

/// A write through `slot`'s fenced store.
fn write(record: &Shared, worker: usize, slot: u32, fence: FenceToken) {
    let mut r = record.lock().unwrap();
    let admitted = r
        .gates
        .entry(slot)
        .or_default()
        .admit(fence, &fingerprint(worker))
        .is_ok();
    if admitted {
        r.accepted.entry(slot).or_default().push(fence);
    } else {
        r.refused += 1;
    }
}

/// How a worker holds its permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holding {
    /// The one-call layer: kept alive, work cancelled when the loss signal fires.
    Kept,
    /// The control: the explicit API, no keep-alive, and work that runs past the TTL.
    PastItsTtl,
}

struct Process {
    client: LeaseClient<SimBackend>,
    task: tokio::task::JoinHandle<()>,
}

fn start(
    server: &SimServer,
    clock: TokioClock,
    worker: usize,
    mut rng: Rng,
    record: &Shared,
    holding: Holding,
) -> Process {
    let client = LeaseClient::new(server.connect(COMMAND_TIMEOUT)).with_clock(clock);
    let record = Arc::clone(record);
    let task = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut round = 0u32;
            loop {
                round += 1;
                let pauses: Vec<Duration> =
                    (0..1 + rng.below(5)).map(|_| rng.millis(5, 150)).collect();
                match holding {
                    Holding::Kept => {
                        let record = Arc::clone(&record);
                        let _ = client
                            .semaphore(NAME, CAPACITY)
                            .ttl(TTL)
                            .wait(Duration::from_secs(10))
                            .queue_heartbeat(Duration::from_millis(600))
                            .run(|held| async move {
                                let (slot, fence) = (held.slot().unwrap(), held.fence());
                                let _ending = begin(&record, worker, slot, fence);
                                for pause in pauses {
                                    tokio::time::sleep(pause).await;
                                    write(&record, worker, slot, fence);
                                }
                            })
                            .await;
                    }
                    Holding::PastItsTtl => {
                        let request = client
                            .request(
                                Purpose::new("lock").unwrap(),
                                ResourceDigest::of(NAME),
                                client
                                    .new_attempt(
                                        OperationId::new(format!("w{worker}-{round}")).unwrap(),
                                    )
                                    .unwrap(),
                                TTL,
                            )
                            .unwrap()
                            .with_capacity(CAPACITY)
                            .unwrap()
                            .with_wait_timeout(Duration::from_secs(10))
                            .unwrap();
                        if let AcquireOutcome::Acquired(handle) = client.acquire(&request).await {
                            let (slot, fence) = (handle.slot().unwrap(), handle.fence());
                            let _ending = begin(&record, worker, slot, fence);
                            write(&record, worker, slot, fence);
                            // Works three TTLs without renewing, and never looks at its
                            // validity.
                            tokio::time::sleep(TTL * 3).await;
                            write(&record, worker, slot, fence);
                            let _ = handle.release().await;
                        }
                    }
                }
                tokio::time::sleep(rng.millis(0, 50)).await;
            }
        })
    };
    Process { client, task }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chaos {
    /// Lost and delayed requests and replies, and killed workers.
    Connections,
    /// That, and restarts and failovers that lose writes.
    LosingWrites,
}

async fn run(seed: u64, chaos: Chaos, holding: Holding) -> Record {
    let mut rng = Rng::new(seed);
    let clock = TokioClock::new();
    let server = SimServer::with_clock(clock);
    let record = Shared::default();
    let mut processes: Vec<Process> = (0..WORKERS)
        .map(|i| start(&server, clock, i, rng.fork(), &record, holding))
        .collect();
    let end = Instant::now() + RUN_FOR;
    while Instant::now() < end {
        tokio::time::sleep(rng.millis(10, 300)).await;
        let i = rng.below(WORKERS as u64) as usize;
        match rng.below(12) {
            0 => {
                // Killed: nothing it sends arrives any more (its place in the queue lapses),
                // and its task is gone.
                processes[i]
                    .client
                    .backend()
                    .inject_many(Fault::LoseRequest, 10_000);
                processes[i].task.abort();
                let fresh = rng.fork();
                processes[i] = start(&server, clock, i, fresh, &record, holding);
            }
            1 if chaos == Chaos::LosingWrites => server.restart(rng.millis(0, 200)),
            2 if chaos == Chaos::LosingWrites => {
                let _ = server.failover(rng.below(4) as usize, rng.millis(0, 200));
            }
            _ => processes[i]
                .client
                .backend()
                .inject(connection_fault(&mut rng)),
        }
    }
    for process in processes {
        process.task.abort();
        let _ = process.task.await;
    }
    Arc::try_unwrap(record)
        .map_err(|_| "a worker still holds the record")
        .unwrap()
        .into_inner()
        .unwrap()
}

/// The most holds that overlapped at one instant, and whether two holds of one slot did.
fn most_at_once(holds: &[Hold]) -> (usize, bool) {
    let end = |h: &Hold| h.end.unwrap_or_else(Instant::now);
    // Ends sort before starts at one instant: a hold that ended when another began did not
    // overlap it.
    let mut events: Vec<(Instant, i32)> = holds
        .iter()
        .flat_map(|h| [(h.start, 1), (end(h), -1)])
        .collect();
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    let mut slot_shared = false;
    for (i, a) in holds.iter().enumerate() {
        for b in &holds[i + 1..] {
            if a.slot == b.slot && a.start < end(b) && b.start < end(a) {
                slot_shared = true;
            }
        }
    }
    (usize::try_from(most).unwrap_or(0), slot_shared)
}

fn assert_writes_never_go_back(seed: u64, record: &Record) {
    for (slot, accepted) in &record.accepted {
        assert!(
            accepted.windows(2).all(|w| w[0] <= w[1]),
            "seed {seed}: slot {slot}'s store took a write whose fence went back: {accepted:?}"
        );
    }
}

fn assert_fences_unique(seed: u64, record: &Record) {
    let mut fences: Vec<FenceToken> = record.holds.iter().map(|h| h.fence).collect();
    let count = fences.len();
    fences.sort();
    fences.dedup();
    assert_eq!(
        fences.len(),
        count,
        "seed {seed}: a fence was granted twice"
    );
}

#[tokio::test(start_paused = true)]
async fn under_connection_faults_at_most_n_hold_at_once_each_slot_fenced() {
    for seed in seeds(3) {
        let record = run(seed, Chaos::Connections, Holding::Kept).await;
        let (most, slot_shared) = most_at_once(&record.holds);
        assert!(
            most <= CAPACITY as usize,
            "seed {seed}: {most} holders at once"
        );
        assert!(!slot_shared, "seed {seed}: two holders of one slot at once");
        assert!(most >= 2, "seed {seed}: never two holders: not a semaphore");
        assert_writes_never_go_back(seed, &record);
        assert_fences_unique(seed, &record);
        // Holds of one slot never overlap, so they follow one another: their fences grow.
        let mut by_start = record.holds.clone();
        by_start.sort_by_key(|h| h.start);
        for slot in 0..CAPACITY {
            let fences: Vec<FenceToken> = by_start
                .iter()
                .filter(|h| h.slot == slot)
                .map(|h| h.fence)
                .collect();
            assert!(
                fences.windows(2).all(|w| w[0] < w[1]),
                "seed {seed}: slot {slot}'s fences went back: {fences:?}"
            );
        }
        // Killed workers' places lapse: every worker keeps being served.
        for worker in 0..WORKERS {
            let served = record.holds.iter().filter(|h| h.worker == worker).count();
            assert!(
                served >= 3,
                "seed {seed}: worker {worker} served {served} times"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_control_whose_holders_outlive_their_ttl_is_caught() {
    let seed = seeds(1)[0];
    let record = run(seed, Chaos::Connections, Holding::PastItsTtl).await;
    let (most, _) = most_at_once(&record.holds);
    assert!(
        most > CAPACITY as usize,
        "seed {seed}: holders three TTLs past their permits never overlapped ({most} at most)"
    );
    // The fenced stores still refuse every stale write.
    assert!(
        record.refused > 0,
        "seed {seed}: no stale write was refused"
    );
    assert_writes_never_go_back(seed, &record);
}

#[tokio::test(start_paused = true)]
async fn across_restarts_and_lossy_failovers_slot_stores_never_go_back() {
    for seed in seeds(3) {
        let record = run(seed, Chaos::LosingWrites, Holding::Kept).await;
        assert!(
            record.holds.len() > 20,
            "seed {seed}: {} holds",
            record.holds.len()
        );
        assert_writes_never_go_back(seed, &record);
        assert_fences_unique(seed, &record);
    }
}

#[tokio::test(start_paused = true)]
async fn sixteen_waiters_are_served_in_the_order_they_began_to_wait() {
    let clock = TokioClock::new();
    let server = SimServer::with_clock(clock);
    let client = LeaseClient::new(server.connect(COMMAND_TIMEOUT)).with_clock(clock);
    let holder = client
        .semaphore("turns", 1)
        .ttl(Duration::from_secs(30))
        .await
        .expect("free");
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..16 {
        // Each on its own connection, as processes would be.
        let client = LeaseClient::new(server.connect(COMMAND_TIMEOUT)).with_clock(clock);
        let order = Arc::clone(&order);
        waiters.push(tokio::spawn(async move {
            let permit = client
                .semaphore("turns", 1)
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(600))
                .await
                .expect("served");
            order.lock().unwrap().push(i);
            let _ = permit.release().await;
        }));
        // The next begins to wait a little later.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = holder.release().await;
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
    assert_eq!(*order.lock().unwrap(), (0..16).collect::<Vec<_>>());
}
