//! Keep-alive cadence and margins in paused tokio time, against a scripted backend.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{
    AcquireReply, Attempt, Failure, FenceToken, Grant, GrantReply, Indeterminate,
    IndeterminateCause, InspectOutcome, LeaseBackend, LeaseClient, LeaseHandle, LossCause,
    LossReason, OperationId, Purpose, ReleaseReply, RenewReply, ResourceDigest, TokioClock,
    Watchdog,
};

use tokio::time::Instant;

/// Renews as told, recording when each renewal arrived.
#[derive(Debug)]
struct Recorder {
    reply: Mutex<RenewReply>,
    renewals: Mutex<Vec<Instant>>,
}

/// The backend the client owns; the test keeps the other `Arc` to read the record.
#[derive(Debug)]
struct Shared(Arc<Recorder>);

impl LeaseBackend for Shared {
    async fn acquire(&self, request: &leasehold::LeaseRequest) -> AcquireReply {
        AcquireReply::Granted(GrantReply::new(FenceToken::MIN, request.ttl()))
    }
    async fn renew(&self, _: &Grant) -> RenewReply {
        self.0.renewals.lock().unwrap().push(Instant::now());
        self.0.reply.lock().unwrap().clone()
    }
    async fn release(&self, _: &Grant) -> ReleaseReply {
        ReleaseReply::Released
    }
    async fn inspect(
        &self,
        _: &Purpose,
        _: &ResourceDigest,
        _: Option<&Attempt>,
    ) -> InspectOutcome {
        InspectOutcome::Free
    }
}

const TTL: Duration = Duration::from_secs(3);

async fn lease(reply: RenewReply) -> (Arc<Recorder>, LeaseHandle<Shared>, Instant) {
    let recorder = Arc::new(Recorder {
        reply: Mutex::new(reply),
        renewals: Mutex::new(Vec::new()),
    });
    let client = LeaseClient::new(Shared(Arc::clone(&recorder))).with_clock(TokioClock::new());
    let attempt = client.new_attempt(OperationId::new("op").unwrap()).unwrap();
    let req = client
        .request(
            Purpose::new("p").unwrap(),
            ResourceDigest::of("r"),
            attempt,
            TTL,
        )
        .unwrap();
    let start = Instant::now();
    let handle = client.try_acquire(&req).await.into_handle().unwrap();
    (recorder, handle, start)
}

#[tokio::test(start_paused = true)]
async fn renewals_run_at_a_third_of_the_ttl() {
    let (recorder, handle, start) = lease(RenewReply::Renewed { server_ttl: TTL }).await;
    let kept = Watchdog::default()
        .keep(handle)
        .map_err(|(e, _)| e)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    assert!(!kept.signal().is_lost());
    let renewals = recorder.renewals.lock().unwrap().clone();
    assert_eq!(renewals.len(), 10, "{renewals:?}");
    for (i, at) in renewals.iter().enumerate() {
        assert_eq!(*at - start, TTL / 3 * (i as u32 + 1), "renewal {i}");
    }
    let _ = kept.release().await;
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_fire_the_signal_at_the_margin_before_validity_ends() {
    let indeterminate = RenewReply::Failed(Failure::Indeterminate(Indeterminate::new(
        IndeterminateCause::ResponseTimeout,
        "t",
    )));
    let (recorder, handle, _start) = lease(indeterminate).await;
    let kept = Watchdog::default()
        .keep(handle)
        .map_err(|(e, _)| e)
        .unwrap();
    let reason = kept.signal().lost().await;
    assert_eq!(reason, LossReason::Unreachable);
    // It fires once the remaining validity is down to the margin (TTL / 5), give or take one
    // retry interval (cadence / 4), and never after validity has ended.
    let remaining = kept.handle().remaining_validity();
    let margin = TTL / 5;
    assert!(
        remaining > Duration::ZERO,
        "fired only after validity ended"
    );
    assert!(remaining <= margin, "fired early, with {remaining:?} left");
    assert!(
        remaining + TTL / 12 >= margin,
        "fired late, with {remaining:?} left"
    );
    assert!(
        recorder.renewals.lock().unwrap().len() >= 2,
        "it gave up without retrying"
    );
}

#[tokio::test(start_paused = true)]
async fn a_definite_loss_fires_at_the_first_renewal() {
    let (recorder, handle, start) = lease(RenewReply::Lost(LossCause::OtherHolder)).await;
    let kept = Watchdog::default()
        .keep(handle)
        .map_err(|(e, _)| e)
        .unwrap();
    assert_eq!(kept.signal().lost().await, LossReason::LostToAnother);
    assert_eq!(Instant::now() - start, TTL / 3);
    assert_eq!(recorder.renewals.lock().unwrap().len(), 1);
}
