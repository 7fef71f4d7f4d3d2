//! The simulated server's release announcements (D48) across a lossy failover: the mark that
//! a refused acquire writes is a write like any other, so a failover can lose it and keep the
//! grant. The release is then not announced; the waiters are woken by the failover itself
//! (the Redis backend's notice connection comes back) and mark the grant again as they retry.

mod common;

use common::world;
use leasehold::{AcquireOutcome, LeaseClient, LeaseRequest, ReleaseOutcome};
use leasehold_sim::{SimBackend, SimServer, run_now};

fn request(client: &LeaseClient<SimBackend>, op: &str) -> LeaseRequest {
    common::request(client, op, 10_000)
}

/// Whether a try by another owner is refused (and so marks the grant).
fn refused(client: &LeaseClient<SimBackend>, op: &str) -> bool {
    matches!(
        run_now(client.try_acquire(&request(client, op))),
        AcquireOutcome::Contended(_)
    )
}

/// Grants the lease, has another owner refused once, and then, with `lose_the_mark`, fails
/// over to a replica that missed that one write. Returns how many releases were announced
/// once the holder released, and whether the grant outlived the failover.
fn release_after_a_refusal(lose_the_mark: bool, refused_again: bool) -> (u64, bool) {
    let (server, client, _) = world();
    let holder = request(&client, "holder");
    let lease = run_now(client.try_acquire(&holder)).into_handle().unwrap();
    let fence = lease.fence();
    assert!(refused(&client, "waiter"));
    let mut kept = true;
    if lose_the_mark {
        assert_eq!(server.failover(1, SimServer::MIN_DOWNTIME), 1);
        server.advance(SimServer::MIN_DOWNTIME);
        let stored = server.stored(holder.purpose(), holder.resource());
        kept = stored.is_some_and(|s| s.fence == fence);
    }
    if refused_again {
        assert!(refused(&client, "waiter-again"));
    }
    assert_eq!(run_now(lease.release()), ReleaseOutcome::Released);
    (server.notices_published(), kept)
}

#[test]
fn a_release_someone_was_refused_is_announced() {
    assert_eq!(release_after_a_refusal(false, false), (1, true));
}

#[test]
fn a_failover_that_loses_the_mark_keeps_the_grant_and_its_release_unannounced() {
    assert_eq!(release_after_a_refusal(true, false), (0, true));
}

#[test]
fn a_refusal_after_that_failover_marks_the_grant_again() {
    assert_eq!(release_after_a_refusal(true, true), (1, true));
}
