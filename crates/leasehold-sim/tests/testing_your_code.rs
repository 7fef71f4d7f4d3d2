//! Testing your own code with the simulator: a job written the way a leasehold user writes
//! one, and the tests its author would write for it, on virtual time, with the faults a real
//! deployment has — a network cut past the TTL, a failover that loses the grant — on demand.
//!
//! The job is generic over the backend, so production runs it on Redis
//! (`leasehold_redis::RedisLeases` is a `LeaseClient<RedisBackend>`) and its tests on a
//! [`SimServer`], with no Redis and no waiting: under `start_paused`, a 30-second test runs in
//! milliseconds, and every instant is exact.
//!
//! The last test shows that these tests catch what they are for: run on a job that ignores
//! the loss signal, the same check fails.

use std::sync::Mutex;
use std::time::Duration;

use leasehold::{LeaseBackend, LeaseClient, LossReason, RunError, TokioClock};
use leasehold_sim::{Fault, SimBackend, SimServer};

// ---- The code under test: yours. ----

/// Your store. Like any store a lease protects, it takes the fence with each write and refuses
/// one older than the newest it has seen (a `WHERE fence <= $fence` in SQL).
#[derive(Default)]
struct Ledger {
    rows: Mutex<Vec<(u64, u32)>>,
}

impl Ledger {
    /// Writes `row` under `fence`; false (nothing written) if a newer fence wrote already.
    fn post(&self, fence: u64, row: u32) -> bool {
        let mut rows = self.rows.lock().unwrap();
        if rows.last().is_some_and(|&(newest, _)| newest > fence) {
            return false;
        }
        rows.push((fence, row));
        true
    }

    fn rows(&self) -> Vec<(u64, u32)> {
        self.rows.lock().unwrap().clone()
    }
}

const TTL: Duration = Duration::from_secs(6);
const BATCHES: u32 = 5;

/// Your job: posts the night's invoices in batches, each taking a while, under one lease.
/// `client.lock(..).run(..)` keeps the lease alive and cancels the work if the lease is lost.
async fn post_invoices<B: LeaseBackend>(
    client: &LeaseClient<B>,
    ledger: &Ledger,
) -> Result<u32, RunError<u32>> {
    client
        .lock("invoices")
        .ttl(TTL)
        .run(|held| async move {
            let fence = held.fence().get();
            let mut posted = 0;
            for batch in 0..BATCHES {
                tokio::time::sleep(Duration::from_secs(2)).await; // the slow part
                if ledger.post(fence, batch) {
                    posted += 1;
                }
            }
            posted
        })
        .await
}

/// The same job written without the one-call layer's care: it takes the lease and never
/// looks at the loss signal again.
async fn post_invoices_carelessly<B: LeaseBackend>(
    client: &LeaseClient<B>,
    ledger: &Ledger,
) -> Result<u32, RunError<u32>> {
    let guard = client
        .lock("invoices")
        .ttl(TTL)
        .await
        .map_err(RunError::NotAcquired)?;
    let fence = guard.fence().get();
    let mut posted = 0;
    for batch in 0..BATCHES {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if ledger.post(fence, batch) {
            posted += 1;
        }
    }
    drop(guard);
    Ok(posted)
}

// ---- Its tests: what a user writes with the kit. ----

/// One simulated server on tokio's (paused) clock, and a client of it for each worker.
struct Kit {
    server: SimServer,
    clock: TokioClock,
}

impl Kit {
    fn new() -> Self {
        let clock = TokioClock::new();
        Self {
            server: SimServer::with_clock(clock),
            clock,
        }
    }

    /// A worker: its own connection, with a command timeout of 200 ms.
    fn client(&self) -> LeaseClient<SimBackend> {
        LeaseClient::new(self.server.connect(Duration::from_millis(200))).with_clock(self.clock)
    }
}

#[tokio::test(start_paused = true)]
async fn the_job_posts_every_batch_once_under_one_fence() {
    let kit = Kit::new();
    let ledger = Ledger::default();
    assert_eq!(
        post_invoices(&kit.client(), &ledger).await.unwrap(),
        BATCHES
    );
    let rows = ledger.rows();
    assert_eq!(rows.len(), BATCHES as usize);
    assert!(rows.iter().all(|&(fence, _)| fence == rows[0].0));
}

/// What the tests below check of a run of the job that met a fault: it did not claim the work
/// was covered, and no row it wrote after its lease ended got in.
fn assert_told_and_fenced(
    result: &Result<u32, RunError<u32>>,
    ledger: &Ledger,
    expected: LossReason,
) {
    match result {
        Err(RunError::Lost { reason, .. }) => assert_eq!(*reason, expected),
        other => panic!("the job was not told its lease was lost: {other:?}"),
    }
    // The rows are in fence order: nothing older got in after something newer.
    let rows = ledger.rows();
    assert!(rows.windows(2).all(|w| w[0].0 <= w[1].0), "{rows:?}");
}

/// The network to the server goes (every request lost) after the first batch, for longer
/// than the TTL; another worker takes over once the lease has expired.
async fn cut_off_while_another_takes_over(
    job: impl AsyncFnOnce(&LeaseClient<SimBackend>, &Ledger) -> Result<u32, RunError<u32>>,
) -> (Result<u32, RunError<u32>>, Ledger) {
    let kit = Kit::new();
    let ledger = Ledger::default();
    let (first, second) = (kit.client(), kit.client());
    let result = {
        let run = job(&first, &ledger);
        let cut_and_take_over = async {
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            first.backend().inject_many(Fault::LoseRequest, 1_000);
            // Past the TTL the server has let the lease go: the second worker gets it.
            tokio::time::sleep(TTL).await;
            post_invoices(&second, &ledger).await
        };
        let (result, taken_over) = tokio::join!(run, cut_and_take_over);
        assert_eq!(
            taken_over.unwrap(),
            BATCHES,
            "the second worker posts them all"
        );
        result
    };
    (result, ledger)
}

#[tokio::test(start_paused = true)]
async fn a_worker_cut_off_past_its_ttl_stops_before_another_takes_over() {
    let (result, ledger) = cut_off_while_another_takes_over(post_invoices).await;
    // Renewals went unanswered: the signal fired at the margin, before the server let the
    // lease go, and the work was cancelled then.
    assert_told_and_fenced(&result, &ledger, LossReason::Unreachable);
}

#[tokio::test(start_paused = true)]
async fn a_failover_that_loses_the_grant_tells_the_holder() {
    let kit = Kit::new();
    let ledger = Ledger::default();
    let client = kit.client();
    let run = post_invoices(&client, &ledger);
    let fail_over = async {
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        // The replica had none of the writes (the grant, its renewal): the new master does
        // not hold the lease.
        assert!(kit.server.failover(usize::MAX, Duration::from_millis(100)) > 0);
    };
    let (result, ()) = tokio::join!(run, fail_over);
    assert_told_and_fenced(&result, &ledger, LossReason::MasterReplaced);
}

/// The check above is able to fail: the careless job, cut off the same way, keeps posting
/// after its lease ended and reports success.
#[tokio::test(start_paused = true)]
#[should_panic(expected = "the job was not told its lease was lost")]
async fn the_same_check_fails_for_a_job_that_ignores_the_loss_signal() {
    let (result, ledger) = cut_off_while_another_takes_over(post_invoices_carelessly).await;
    assert_told_and_fenced(&result, &ledger, LossReason::Unreachable);
}
