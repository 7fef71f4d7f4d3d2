//! Durations as people write and read them: humantime in flags (`500ms`, `2s`, `1m`) and in
//! messages, shown to the whole millisecond.

use std::time::Duration;

/// Parses a humantime duration (`500ms`, `2s`, `1m`, `1h 30m`), for clap.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (expected e.g. 500ms, 2s, 1m)"))
}

/// A duration for people: whole milliseconds (`1s 500ms`), since finer digits in a message
/// about leases and timeouts are noise.
pub(crate) fn format_duration(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_humantime() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        for bad in ["", "5", "5x", "-1s", "1.5.2s"] {
            let message = parse_duration(bad).unwrap_err();
            assert!(message.contains("expected e.g."), "{bad:?}: {message}");
        }
    }

    #[test]
    fn durations_are_shown_to_the_millisecond() {
        assert_eq!(
            format_duration(Duration::from_micros(1_500_700)).to_string(),
            "1s 500ms"
        );
        assert_eq!(format_duration(Duration::ZERO).to_string(), "0s");
    }
}
