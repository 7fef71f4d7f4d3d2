//! What the seeded chaos tests share (elections, semaphores, read/write leases): a small
//! deterministic generator, the seeds a run uses, and the connection faults it injects.

#![allow(dead_code)]

use std::time::Duration;

use leasehold_sim::Fault;

/// A small deterministic generator (xorshift64*): the seed is all a replay needs.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }

    pub fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }

    /// A generator of its own, seeded from this one.
    pub fn fork(&mut self) -> Self {
        Self::new(self.below(u64::MAX))
    }
}

/// `rounds` seeds from the clock, or the one `LEASEHOLD_SIM_SEED` names.
pub fn seeds(rounds: u64) -> Vec<u64> {
    if let Some(seed) = std::env::var("LEASEHOLD_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![seed];
    }
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    (0..rounds).map(|i| start.wrapping_add(i * 7919)).collect()
}

/// A fault of one connection: a request or a reply lost, delayed, or arriving late.
pub fn connection_fault(rng: &mut Rng) -> Fault {
    match rng.below(5) {
        0 => Fault::LoseRequest,
        1 => Fault::LoseReply,
        2 => Fault::DelayRequest(rng.millis(1, 150)),
        3 => Fault::DelayReply(rng.millis(1, 150)),
        _ => Fault::LateRequest(rng.millis(250, 900)),
    }
}
