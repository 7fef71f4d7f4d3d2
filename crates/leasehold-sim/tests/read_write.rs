//! Read/write leases in the simulation, on tokio's paused clock: readers and writers take
//! their sides of one lease while their connections lose and delay requests and replies, and
//! some are killed. Checked on the one virtual timeline:
//!
//! - no reader holds while a writer does, and never two writers (a control whose holders
//!   outlive their TTL must break it and be caught by the same check);
//! - the writers' fenced store never accepts a write whose fence goes back (also across
//!   restarts and failovers that lose writes);
//! - a reader's fence is at least every writer's that finished before it began (it follows
//!   the last writer), and writers keep coming in while readers keep asking.
//!
//! `LEASEHOLD_SIM_SEED=<seed>` runs the same faults again.

mod chaos;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chaos::{Rng, connection_fault, seeds};
use leasehold::{
    AcquireOutcome, FenceGate, FenceToken, HolderFingerprint, LeaseClient, OperationId, Purpose,
    ResourceDigest, RwMode, TokioClock,
};
use leasehold_sim::{Fault, SimBackend, SimServer};
use tokio::time::Instant;

const COMMAND_TIMEOUT: Duration = Duration::from_millis(200);
const TTL: Duration = Duration::from_secs(1);
const READERS: usize = 5;
const WRITERS: usize = 2;
const RUN_FOR: Duration = Duration::from_secs(30);
const NAME: &str = "sim-rw";

#[derive(Debug, Clone)]
struct Hold {
    write: bool,
    fence: FenceToken,
    start: Instant,
    end: Option<Instant>,
}

#[derive(Debug, Default)]
struct Record {
    holds: Vec<Hold>,
    gate: FenceGate,
    accepted: Vec<FenceToken>,
    refused: usize,
}

type Shared = Arc<Mutex<Record>>;

struct Ending(Shared, usize);

impl Drop for Ending {
    fn drop(&mut self) {
        if let Ok(mut record) = self.0.lock() {
            record.holds[self.1].end = Some(Instant::now());
        }
    }
}

fn begin(record: &Shared, write: bool, fence: FenceToken) -> Ending {
    let mut r = record.lock().unwrap();
    r.holds.push(Hold {
        write,
        fence,
        start: Instant::now(),
        end: None,
    });
    Ending(Arc::clone(record), r.holds.len() - 1)
}

fn write(record: &Shared, worker: usize, fence: FenceToken) {
    let mut r = record.lock().unwrap();
    let me = HolderFingerprint::parse(&format!("{worker:016x}")).unwrap();
    if r.gate.admit(fence, &me).is_ok() {
        r.accepted.push(fence);
    } else {
        r.refused += 1;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holding {
    Kept,
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
    let writer = worker < WRITERS;
    let task = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut round = 0u32;
            loop {
                round += 1;
                let pauses: Vec<Duration> =
                    (0..1 + rng.below(4)).map(|_| rng.millis(5, 120)).collect();
                match holding {
                    Holding::Kept => {
                        let builder = if writer {
                            client.write_lock(NAME)
                        } else {
                            client.read_lock(NAME)
                        };
                        let record = Arc::clone(&record);
                        let _ = builder
                            .ttl(TTL)
                            .wait(Duration::from_secs(10))
                            .queue_heartbeat(Duration::from_millis(600))
                            .run(|held| async move {
                                let fence = held.fence();
                                let _ending = begin(&record, writer, fence);
                                for pause in pauses {
                                    tokio::time::sleep(pause).await;
                                    if writer {
                                        write(&record, worker, fence);
                                    }
                                }
                            })
                            .await;
                    }
                    Holding::PastItsTtl => {
                        let mode = if writer { RwMode::Write } else { RwMode::Read };
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
                            .with_rw(mode)
                            .unwrap()
                            .with_wait_timeout(Duration::from_secs(10))
                            .unwrap();
                        if let AcquireOutcome::Acquired(handle) = client.acquire(&request).await {
                            let fence = handle.fence();
                            let _ending = begin(&record, writer, fence);
                            tokio::time::sleep(TTL * 3).await;
                            let _ = handle.release().await;
                        }
                    }
                }
                tokio::time::sleep(rng.millis(0, 40)).await;
            }
        })
    };
    Process { client, task }
}

async fn run(seed: u64, losing_writes: bool, holding: Holding) -> Record {
    let mut rng = Rng::new(seed);
    let clock = TokioClock::new();
    let server = SimServer::with_clock(clock);
    let record = Shared::default();
    let workers = READERS + WRITERS;
    let mut processes: Vec<Process> = (0..workers)
        .map(|i| start(&server, clock, i, rng.fork(), &record, holding))
        .collect();
    let end = Instant::now() + RUN_FOR;
    while Instant::now() < end {
        tokio::time::sleep(rng.millis(10, 300)).await;
        let i = rng.below(workers as u64) as usize;
        match rng.below(12) {
            0 => {
                processes[i]
                    .client
                    .backend()
                    .inject_many(Fault::LoseRequest, 10_000);
                processes[i].task.abort();
                let fresh = rng.fork();
                processes[i] = start(&server, clock, i, fresh, &record, holding);
            }
            1 if losing_writes => server.restart(rng.millis(0, 200)),
            2 if losing_writes => {
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

/// Whether a reader held beside a writer, or two writers at once.
fn exclusion_broken(holds: &[Hold]) -> bool {
    let end = |h: &Hold| h.end.unwrap_or_else(Instant::now);
    holds.iter().enumerate().any(|(i, a)| {
        holds[i + 1..]
            .iter()
            .any(|b| (a.write || b.write) && a.start < end(b) && b.start < end(a))
    })
}

#[tokio::test(start_paused = true)]
async fn under_connection_faults_no_reader_holds_beside_a_writer() {
    for seed in seeds(3) {
        let record = run(seed, false, Holding::Kept).await;
        assert!(
            !exclusion_broken(&record.holds),
            "seed {seed}: a reader held beside a writer, or two writers at once"
        );
        let writes = record.holds.iter().filter(|h| h.write).count();
        let reads = record.holds.len() - writes;
        assert!(writes >= 5, "seed {seed}: writers starved: {writes} writes");
        assert!(reads >= 5, "seed {seed}: {reads} reads");
        assert!(
            record.accepted.windows(2).all(|w| w[0] <= w[1]),
            "seed {seed}: the store took a write whose fence went back"
        );
        // A reader follows the last writer granted before it: its fence is at least that of
        // every writer whose hold ended before it began (it sees every finished write).
        for reader in record.holds.iter().filter(|h| !h.write) {
            for writer in record.holds.iter().filter(|h| h.write) {
                if writer.end.is_some_and(|end| end <= reader.start) {
                    assert!(
                        reader.fence >= writer.fence,
                        "seed {seed}: a reader's fence {} is below an earlier writer's {}",
                        reader.fence,
                        writer.fence
                    );
                }
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_control_whose_holders_outlive_their_ttl_is_caught() {
    let seed = seeds(1)[0];
    let record = run(seed, false, Holding::PastItsTtl).await;
    assert!(
        exclusion_broken(&record.holds),
        "seed {seed}: holders three TTLs past their grants never overlapped"
    );
}

#[tokio::test(start_paused = true)]
async fn across_restarts_and_lossy_failovers_the_store_never_goes_back() {
    for seed in seeds(3) {
        let record = run(seed, true, Holding::Kept).await;
        assert!(
            record.holds.len() > 20,
            "seed {seed}: {} holds",
            record.holds.len()
        );
        assert!(
            record.accepted.windows(2).all(|w| w[0] <= w[1]),
            "seed {seed}: the store took a write whose fence went back"
        );
    }
}

/// A replay of a writer's request after its downgrade finds the reader's grant (same attempt,
/// same fence): it must come back as a live handle on that grant, not as the writer's handle,
/// which the downgrade ended.
#[tokio::test(start_paused = true)]
async fn a_replay_after_a_downgrade_is_the_readers_grant_not_the_ended_writer() {
    let clock = TokioClock::new();
    let server = SimServer::with_clock(clock);
    let client = LeaseClient::new(server.connect(COMMAND_TIMEOUT)).with_clock(clock);
    let request = client
        .request(
            Purpose::new("lock").unwrap(),
            ResourceDigest::of("doc"),
            client
                .new_attempt(OperationId::new("writer").unwrap())
                .unwrap(),
            TTL,
        )
        .unwrap()
        .with_rw(RwMode::Write)
        .unwrap();
    let writer = client
        .try_acquire(&request)
        .await
        .into_handle()
        .expect("free");
    let reader = match writer.downgrade_to_read().await {
        leasehold::DowngradeOutcome::Downgraded(reader) => reader,
        other => panic!("{other:?}"),
    };
    assert_eq!(writer.state(), leasehold::LeaseState::Released);
    let AcquireOutcome::Replayed(replayed) = client.try_acquire(&request).await else {
        panic!("the attempt holds the reader's slot");
    };
    assert_eq!(replayed.fence(), reader.fence());
    assert_eq!(replayed.slot(), reader.slot());
    assert_eq!(replayed.state(), leasehold::LeaseState::Active);
    assert!(replayed.renew().await.is_renewed());
}
