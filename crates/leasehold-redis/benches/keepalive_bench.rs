//! `make bench` (part 3): one process keeps 10,000 leases (TTL 3 s) alive for 60 s.
//!
//! Reports losses, the lowest remaining validity any lease fell to, renew commands per second,
//! client CPU (user + system, from /proc) and the memory each kept lease costs.
//! `LEASEHOLD_BENCH_SECS` and `LEASEHOLD_BENCH_LEASES` shorten or grow the run.
//!
//! # How memory is measured
//!
//! Not by resident set size: an RSS delta counts pages, not bytes; it misses memory the
//! allocator kept from the acquire phase and hands out again (too low), and it keeps the high
//! water mark of every burst (too high, and noisy). Instead a counting global allocator tracks
//! the live heap, charging each allocation what glibc's malloc really takes for it (the
//! request plus an 8-byte header, in 16-byte granules, at least 32 bytes).
//!
//! A kept lease costs two things: its lease handle, with the client's registry entry for its
//! grant (made by the acquire), and the watchdog's share (made by `keep`). The total is,
//! conservatively, the *peak* of the live heap from the first `keep` to the end of the run
//! (renewals and the last acquires in flight included) minus the live heap before the first
//! acquire, per lease. The handle's part is measured on the first 1,000 leases, acquired before
//! any is kept; the watchdog's is the rest. RSS is printed for comparison.
//!
//! Leases are acquired 256 at a time and each is kept as soon as it is granted (after those
//! first 1,000), so that none ages in a long acquisition: 200,000 take longer than the TTL.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use leasehold_redis::leasehold::{
    ErrorKind, KeepAliveSettings, OperationId, Purpose, ResourceDigest, Watchdog,
};
use leasehold_redis::{RedisBackend, RedisSettings};
use test_support::{RedisServer, cpu_time};

/// The system allocator, counting live bytes and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// What glibc's malloc takes for a request of `size` bytes on 64-bit Linux.
fn charged(layout: Layout) -> usize {
    let chunk = (layout.size() + 8).div_ceil(16) * 16;
    // Over-aligned requests may waste up to the alignment in front of the chunk.
    chunk.max(32) + layout.align().saturating_sub(16)
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so it keeps
// `System`'s contract; the counters are plain atomics and never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(charged(layout), Ordering::Relaxed) + charged(layout);
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from `alloc` with this `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(charged(layout), Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(charged(layout), Ordering::Relaxed) + charged(layout);
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged; `ptr` came from `alloc` with `layout`.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // Safe to build: `realloc`'s contract makes `new_size` valid with this alignment.
            let new_layout = Layout::from_size_align(new_size, layout.align()).unwrap_or(layout);
            let live = LIVE.fetch_add(charged(new_layout), Ordering::Relaxed) + charged(new_layout);
            PEAK.fetch_max(live, Ordering::Relaxed);
            LIVE.fetch_sub(charged(layout), Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Starts a new peak from the live heap now.
fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let leases = env("LEASEHOLD_BENCH_LEASES", 10_000) as usize;
    let secs = env("LEASEHOLD_BENCH_SECS", 60);
    let server = RedisServer::start();
    // Default settings: the watchdog sends at most 256 renewals at once, well inside the
    // backend's in-flight limit (1,024), even when all 10,000 leases come due together.
    let client = RedisBackend::open(&server.url(), RedisSettings::default())?.into_client();
    client.backend().warm_up().await?;
    let watchdog = Watchdog::new(KeepAliveSettings::default().with_max_leases(leases)?);
    let purpose = Purpose::new("bench")?;
    let heap_before_acquire = live();
    let rss_before = rss_kib();
    let acquire = |i: usize| {
        let (client, purpose) = (&client, &purpose);
        async move {
            let attempt = client.new_attempt(OperationId::new(format!("op-{i}"))?)?;
            let req = client.request(
                purpose.clone(),
                ResourceDigest::of(format!("lease-{i}")),
                attempt,
                Duration::from_secs(3),
            )?;
            let handle = client.try_acquire(&req).await.into_handle();
            handle.ok_or_else(|| Box::<dyn std::error::Error>::from("not granted"))
        }
    };
    // The first leases (at most 1,000) are acquired before any is kept, to measure what a
    // handle costs; then they are kept, and every later lease is kept as soon as it is granted,
    // so that none ages in a long acquisition (200,000 take longer than the TTL).
    let calibration = leases.min(1_000);
    let mut first = futures_util::stream::iter(0..calibration)
        .map(acquire)
        .buffer_unordered(256);
    let mut handles = Vec::with_capacity(calibration);
    while let Some(handle) = first.next().await {
        handles.push(handle?);
    }
    drop(first);
    let handle_share =
        live().saturating_sub(heap_before_acquire) as f64 / calibration.max(1) as f64;
    reset_peak();
    let mut kept = Vec::with_capacity(leases);
    // A lease the watchdog refuses for its load (more than it admits, three quarters of the
    // capacity it measured) is dropped: it expires in 3 s, and holds no memory meanwhile.
    let mut refused = 0_usize;
    // Whether the watchdog took the lease on.
    let mut keep = |handle| match watchdog.keep(handle) {
        Ok(lease) => {
            kept.push(lease);
            Ok(true)
        }
        Err(not_kept) if not_kept.error().kind() == ErrorKind::WatchdogOverloaded => Ok(false),
        Err(not_kept) => Err(not_kept.into_parts().0),
    };
    for handle in handles {
        refused += usize::from(!keep(handle)?);
    }
    let mut rest = futures_util::stream::iter(calibration..leases)
        .map(acquire)
        .buffer_unordered(256);
    while let Some(handle) = rest.next().await {
        refused += usize::from(!keep(handle?)?);
    }
    drop(rest);
    // Refused before the watchdog had measured its capacity, leases are asked for again
    // once it has: the measured limit admits up to three quarters of it.
    let refused_first = refused;
    if refused > 0 {
        tokio::time::sleep(Duration::from_secs(3)).await;
        refused = 0;
        let mut again = futures_util::stream::iter(leases..leases + refused_first)
            .map(acquire)
            .buffer_unordered(256);
        while let Some(handle) = again.next().await {
            refused += usize::from(!keep(handle?)?);
        }
    }
    let evalsha = |s: &RedisServer| s.commandstats().get("evalsha").copied().unwrap_or(0);
    let server_pid = server.pid().to_string();
    let (cpu0, server_cpu0) = (cpu_time("self"), cpu_time(&server_pid));
    let (calls0, t0) = (evalsha(&server), Instant::now());
    // Four times a second, the lowest remaining validity of any lease still kept: how close
    // renewals came to the margin (600 ms), where the signal would fire. It reads every
    // lease's clock and state, so it costs CPU of its own, told apart below: the CPU time of
    // the thread that runs it, read around it (the loop never awaits, so nothing else runs on
    // that thread meanwhile; a preempted loop is not charged for the time it waited).
    let mut lowest = Duration::MAX;
    let mut sampling_time = Duration::ZERO;
    let mut sampling = tokio::time::interval(Duration::from_millis(250));
    sampling.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while t0.elapsed() < Duration::from_secs(secs) {
        sampling.tick().await;
        let sampled_at = cpu_time("thread-self");
        let now_lowest = kept
            .iter()
            .filter(|k| !k.signal().is_lost())
            .map(|k| k.handle().remaining_validity())
            .min();
        lowest = lowest.min(now_lowest.unwrap_or(Duration::MAX));
        sampling_time += cpu_time("thread-self").saturating_sub(sampled_at);
    }
    let (cpu1, server_cpu1) = (cpu_time("self"), cpu_time(&server_pid));
    let (calls1, elapsed) = (evalsha(&server), t0.elapsed());
    let (heap_end, heap_peak, rss_after) = (live(), PEAK.load(Ordering::Relaxed), rss_kib());
    let mut reasons = std::collections::BTreeMap::new();
    for reason in kept.iter().filter_map(|k| k.signal().reason()) {
        *reasons.entry(format!("{reason:?}")).or_insert(0_usize) += 1;
    }
    let lost: usize = reasons.values().sum();
    let cpu_share = (cpu1 - cpu0).as_secs_f64() / elapsed.as_secs_f64();
    let per_lease = |bytes: usize| bytes as f64 / kept.len().max(1) as f64;
    println!(
        "{leases} leases asked for, TTL 3 s: {} kept for {:.1} s; refused (WatchdogOverloaded) \
         {refused_first} at first, {refused} of them asked for again 3 s later",
        kept.len(),
        elapsed.as_secs_f64()
    );
    println!("losses:                 {lost} {reasons:?}");
    println!(
        "lowest validity left:   {} ms (the signal fires at 600)",
        lowest.as_millis()
    );
    println!(
        "renew commands / s:     {:.0}",
        (calls1 - calls0) as f64 / elapsed.as_secs_f64()
    );
    println!(
        "watchdog's load:        {:.0} renewals / s needed, {} measured it can confirm, \
         admits up to {:.0} / s",
        watchdog.renewals_needed(),
        watchdog
            .renewal_capacity()
            .map_or_else(|| "not yet".to_owned(), |c| format!("{c:.0} / s")),
        watchdog.admission_limit()
    );
    let sampling_share = sampling_time.as_secs_f64() / elapsed.as_secs_f64();
    let server_share = (server_cpu1 - server_cpu0).as_secs_f64() / elapsed.as_secs_f64();
    println!(
        "client CPU:             {:.1} % of one core keeping them ({:.1} % in all, {:.1} % of \
         it this bench's own sampling of every lease's validity)",
        (cpu_share - sampling_share).max(0.0) * 100.0,
        cpu_share * 100.0,
        sampling_share * 100.0
    );
    println!(
        "server CPU:             {:.1} % of one core (redis-server, renewing them)",
        server_share * 100.0
    );
    let total_peak = per_lease(heap_peak.saturating_sub(heap_before_acquire));
    let total_end = per_lease(heap_end.saturating_sub(heap_before_acquire));
    let watchdog_peak = (total_peak - handle_share).max(0.0);
    let watchdog_end = (total_end - handle_share).max(0.0);
    println!(
        "memory per kept lease:  {:.0} bytes at peak, {:.0} at the end (live heap, all of it)",
        handle_share + watchdog_peak,
        handle_share + watchdog_end,
    );
    println!(
        "  of which:             lease handle and grant registry {handle_share:.0}; \
         watchdog {watchdog_peak:.0} at peak, {watchdog_end:.0} at the end"
    );
    println!(
        "  for comparison:       RSS {} KiB -> {} KiB, handles and all ({:.0} bytes per lease)",
        rss_before,
        rss_after,
        per_lease(rss_after.saturating_sub(rss_before) as usize * 1024),
    );
    for k in kept {
        let _ = k.release().await;
    }
    Ok(())
}
