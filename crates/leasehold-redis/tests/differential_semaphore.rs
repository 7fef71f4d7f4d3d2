//! Differential test for semaphores and read/write leases: the simulated server and real
//! redis-server (the real `semaphore_*.lua` and `rw_*.lua` scripts) give the same outcomes,
//! slots and fence order, step by step, on random sequences of permit requests and readers'
//! and writers' requests (try once, or take a place in the queue), replays, renewals,
//! releases, downgrades, cleanups of an attempt and requests with the wrong capacity, from
//! several clients.
//!
//! Fences are compared by rank among the distinct fences of the run, as in `differential.rs`.
//! TTLs and heartbeats are long, so nothing expires during a run: timing is not compared.
//! `LEASEHOLD_DIFF_CASES` sets the number of sequences (default 300); `LEASEHOLD_SIM_SEED`
//! replays one.

use std::time::Duration;

use leasehold_redis::leasehold::{
    AcquireOutcome, DowngradeOutcome, LeaseBackend, LeaseClient, LeaseHandle, LeaseRequest,
    ManualClock, OperationId, Purpose, ReleaseOutcome, RenewOutcome, ResourceDigest, RwMode,
};
use leasehold_redis::{RedisBackend, RedisSettings};
use leasehold_sim::{SimBackend, SimServer};
use test_support::RedisServer;

const CLIENTS: usize = 3;
const STEPS: usize = 30;
const CAPACITY: u32 = 2;
const TTL: Duration = Duration::from_secs(60);

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// A new attempt of client `client` asks for a permit of capacity `capacity` (CAPACITY or
    /// another), or (`Some`) a side of the read/write lease; `queued`: it waits (takes a place).
    Acquire {
        client: usize,
        queued: bool,
        capacity: u32,
        rw: Option<RwMode>,
    },
    /// The `n`-th handle so far is downgraded (a writer's becomes a reader's).
    Downgrade { n: usize },
    /// The `n`-th request made so far is sent again (a replay).
    Replay { n: usize },
    /// The `n`-th handle so far is renewed.
    Renew { n: usize },
    /// The `n`-th handle so far is released.
    Release { n: usize },
    /// The `n`-th request's attempt is cleaned up (whatever slot it holds, and its place).
    ReleaseAttempt { n: usize },
}

fn scenario(rng: &mut Rng) -> Vec<Step> {
    (0..STEPS)
        .map(|_| {
            let n = rng.below(8) as usize;
            match rng.below(11) {
                0..=3 => Step::Acquire {
                    client: rng.below(CLIENTS as u64) as usize,
                    queued: rng.below(2) == 0,
                    capacity: if rng.below(8) == 0 {
                        CAPACITY + 1
                    } else {
                        CAPACITY
                    },
                    rw: match rng.below(4) {
                        0 => Some(RwMode::Read),
                        1 => Some(RwMode::Write),
                        _ => None,
                    },
                },
                10 => Step::Downgrade { n },
                4 => Step::Replay { n },
                5 => Step::Renew { n },
                6 | 7 => Step::Release { n },
                _ => Step::ReleaseAttempt { n },
            }
        })
        .collect()
}

/// One world: its clients, the requests and handles made so far, and every fence seen.
struct World<B: LeaseBackend> {
    clients: Vec<LeaseClient<B>>,
    requests: Vec<LeaseRequest>,
    handles: Vec<LeaseHandle<B>>,
    fences: Vec<u64>,
}

impl<B: LeaseBackend> World<B> {
    fn new(clients: Vec<LeaseClient<B>>) -> Self {
        Self {
            clients,
            requests: Vec::new(),
            handles: Vec::new(),
            fences: Vec::new(),
        }
    }

    fn note(&mut self, fence: u64) {
        if !self.fences.contains(&fence) {
            self.fences.push(fence);
            self.fences.sort_unstable();
        }
    }

    /// What `outcome` says, comparably: its kind, slot and fence.
    fn acquired(&mut self, outcome: AcquireOutcome<B>) -> String {
        let kind = format!("{outcome:?}")
            .split(['(', ' ', '{'])
            .next()
            .unwrap_or("")
            .to_owned();
        match outcome {
            AcquireOutcome::Acquired(h) | AcquireOutcome::Replayed(h) => {
                let fence = h.fence().get();
                self.note(fence);
                let said = format!("{kind} slot {:?} fence #{fence}", h.slot());
                self.handles.push(h);
                said
            }
            AcquireOutcome::CapacityMismatch { recorded } => format!("{kind} {recorded}"),
            _ => kind,
        }
    }

    async fn step(&mut self, step: Step, case: usize, index: usize) -> String {
        match step {
            Step::Acquire {
                client,
                queued,
                capacity,
                rw,
            } => {
                let c = &self.clients[client];
                let op = OperationId::new(format!("c{case}-s{index}")).unwrap();
                let request = c
                    .request(
                        Purpose::new("diff").unwrap(),
                        ResourceDigest::of("sem"),
                        c.new_attempt(op).unwrap(),
                        TTL,
                    )
                    .unwrap();
                let request = match rw {
                    Some(mode) => request.with_rw(mode),
                    None => request.with_capacity(capacity),
                };
                let mut request = request
                    .unwrap()
                    .with_queue_heartbeat(Duration::from_secs(60))
                    .unwrap();
                if queued {
                    request = request.with_wait_timeout(Duration::from_secs(1)).unwrap();
                }
                // One try: a waiting request takes its place, and nothing loops.
                let outcome = c.try_acquire(&request).await;
                self.requests.push(request);
                self.acquired(outcome)
            }
            Step::Replay { n } => match self.requests.get(n).cloned() {
                Some(request) => {
                    let outcome = self.clients[0].try_acquire(&request).await;
                    self.acquired(outcome)
                }
                None => "-".to_owned(),
            },
            Step::Renew { n } => match self.handles.get(n) {
                Some(h) => match h.renew().await {
                    RenewOutcome::Renewed { .. } => "renewed".to_owned(),
                    other => format!("{other:?}"),
                },
                None => "-".to_owned(),
            },
            Step::Downgrade { n } => match self.handles.get(n) {
                Some(h) => match h.downgrade_to_read().await {
                    DowngradeOutcome::Downgraded(reader) => {
                        let fence = reader.fence().get();
                        self.note(fence);
                        let said = format!("downgraded slot {:?} fence #{fence}", reader.slot());
                        self.handles.push(reader);
                        said
                    }
                    other => format!("{other:?}"),
                },
                None => "-".to_owned(),
            },
            Step::Release { n } => match self.handles.get(n) {
                Some(h) => format!("{:?}", h.release().await),
                None => "-".to_owned(),
            },
            Step::ReleaseAttempt { n } => match self.requests.get(n) {
                Some(request) => {
                    let outcome: ReleaseOutcome = self.clients[0].release_attempt(request).await;
                    format!("{outcome:?}")
                }
                None => "-".to_owned(),
            },
        }
    }
}

/// Replaces every `#<fence>` in `said` by its rank among `fences`.
fn by_rank(said: &str, fences: &[u64]) -> String {
    let mut out = String::new();
    let mut rest = said;
    while let Some(at) = rest.find('#') {
        out.push_str(&rest[..=at]);
        rest = &rest[at + 1..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        rest = &rest[digits.len()..];
        let fence: u64 = digits.parse().unwrap_or(0);
        let rank = fences
            .iter()
            .position(|f| *f == fence)
            .unwrap_or(usize::MAX);
        out.push_str(&rank.to_string());
    }
    out.push_str(rest);
    out
}

#[tokio::test]
async fn the_simulation_agrees_with_real_redis_on_semaphores() {
    let cases: usize = std::env::var("LEASEHOLD_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let seed: u64 = std::env::var("LEASEHOLD_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                .max(1)
        });
    let server = RedisServer::start();
    let real_clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            RedisBackend::open(&server.url(), RedisSettings::default())
                .expect("valid URL")
                .into_client()
        })
        .collect();
    let mut rng = Rng(seed);
    let mut compared = 0;
    for case in 0..cases {
        let steps = scenario(&mut rng);
        server.cmd(&["FLUSHALL"]);
        let clock = ManualClock::new();
        let sim_server = SimServer::new(clock.clone());
        let sim_clients: Vec<LeaseClient<SimBackend>> = (0..CLIENTS)
            .map(|_| {
                LeaseClient::new(sim_server.connect(Duration::from_millis(200)))
                    .with_clock(clock.clone())
            })
            .collect();
        let mut sim = World::new(sim_clients);
        let mut real = World::new(real_clients.clone());
        let (mut simulated, mut actual) = (Vec::new(), Vec::new());
        for (index, step) in steps.iter().enumerate() {
            simulated.push(sim.step(*step, case, index).await);
            actual.push(real.step(*step, case, index).await);
            // Both clocks move a little between steps, as a real one does.
            clock.advance(Duration::from_millis(1));
        }
        let simulated: Vec<String> = simulated.iter().map(|s| by_rank(s, &sim.fences)).collect();
        let actual: Vec<String> = actual.iter().map(|s| by_rank(s, &real.fences)).collect();
        for (i, (s, a)) in simulated.iter().zip(&actual).enumerate() {
            assert_eq!(
                s, a,
                "seed {seed}, case {case}, step {i} ({:?}): the simulation says {s:?}, \
                 redis-server {a:?}\nsteps: {steps:?}",
                steps[i]
            );
        }
        compared += steps.len();
        for h in sim.handles.drain(..) {
            let _ = h.release().await;
        }
        for h in real.handles.drain(..) {
            let _ = h.release().await;
        }
    }
    assert_eq!(compared, cases * STEPS);
}
