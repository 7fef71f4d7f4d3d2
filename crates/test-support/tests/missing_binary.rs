//! `redis_server_binary` reads `LEASEHOLD_REDIS_SERVER`. This file is its own test process
//! with a single test, so changing the environment here cannot race another test.

use test_support::{RedisServer, redis_server_binary};

#[test]
fn a_missing_override_panics_with_an_install_hint() {
    // SAFETY: the only test in this process; no other thread reads the environment.
    unsafe { std::env::set_var("LEASEHOLD_REDIS_SERVER", "/nonexistent/redis-server") };
    for attempt in [
        std::panic::catch_unwind(|| drop(redis_server_binary())),
        std::panic::catch_unwind(|| drop(RedisServer::start())),
    ] {
        let panic = attempt.expect_err("a missing binary did not panic");
        let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("apt-get install"), "{message}");
        assert!(message.contains("/nonexistent/redis-server"), "{message}");
    }
}
