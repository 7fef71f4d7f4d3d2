//! What a user can do about a server that could not be used: the line that follows the error.

use leasehold_redis::leasehold::{Unavailable, UnavailableCause};

/// Says what to do when `u` is a connection nothing accepted at `shown`: start Redis there,
/// or point leasehold to the server it should use. Prints nothing for any other cause.
pub(crate) fn tell_for(u: &Unavailable, shown: &str) {
    if let Some(tip) = tip_for(u, shown) {
        eprintln!("{tip}");
    }
}

fn tip_for(u: &Unavailable, shown: &str) -> Option<String> {
    match u.cause {
        UnavailableCause::ConnectionRefused => Some(format!(
            "leasehold: tip: nothing accepts connections at {shown}. Start Redis there \
             (`redis-server`, which listens on 6379 unless given --port N, or `sudo systemctl \
             start redis-server`), or point leasehold to your server with --redis URL or \
             LEASEHOLD_REDIS_URL"
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connection_says_how_to_start_or_point_to_redis() {
        let refused = Unavailable::new(UnavailableCause::ConnectionRefused, "refused");
        let tip = tip_for(&refused, "redis://127.0.0.1:1").expect("a tip");
        for needle in [
            "redis://127.0.0.1:1",
            "redis-server",
            "--redis",
            "LEASEHOLD_REDIS_URL",
        ] {
            assert!(tip.contains(needle), "{needle}: {tip}");
        }
        let timeout = Unavailable::new(UnavailableCause::ConnectTimeout, "timed out");
        assert_eq!(tip_for(&timeout, "redis://h:1"), None);
    }
}
