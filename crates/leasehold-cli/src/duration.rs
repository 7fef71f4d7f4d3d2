//! Durations as people write and read them: humantime in flags (`500ms`, `2s`, `1m`) or a bare
//! number of seconds (`30`, `1.5`, as flock and etcdctl take them), and in messages, shown as
//! they were written or to the whole millisecond.

use std::time::Duration;

/// A duration and the text it was written as, to echo back in messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Written {
    pub(crate) value: Duration,
    pub(crate) text: String,
}

/// How long `--wait` may wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wait {
    /// At most this long.
    Up(Written),
    /// As long as it takes (`inf`).
    Forever,
}

/// What a message says a duration should look like.
const EXPECTED: &str = "expected e.g. 500ms, 2s, 1m, or a number of seconds";

/// Parses a humantime duration (`500ms`, `2s`, `1m`, `1h 30m`) or a bare number of seconds
/// (`30`, `0.5`). The error says what was expected; the caller names the flag or variable.
pub(crate) fn parse_duration(text: &str) -> Result<Written, String> {
    let trimmed = text.trim();
    let value = if trimmed.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && trimmed.bytes().any(|b| b.is_ascii_digit())
    {
        trimmed
            .parse::<f64>()
            .ok()
            .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
            .ok_or_else(|| format!("not a number of seconds ({EXPECTED})"))?
    } else {
        humantime::parse_duration(trimmed).map_err(|e| format!("{e} ({EXPECTED})"))?
    };
    Ok(Written {
        value,
        text: trimmed.to_owned(),
    })
}

/// Parses `--wait`: a duration, or `inf` / `infinity` / `forever`.
pub(crate) fn parse_wait(text: &str) -> Result<Wait, String> {
    match text.trim() {
        "inf" | "infinity" | "forever" => Ok(Wait::Forever),
        _ => parse_duration(text)
            .map(Wait::Up)
            .map_err(|e| e.replace(EXPECTED, &format!("{EXPECTED}, or inf"))),
    }
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

    fn value(text: &str) -> Result<Duration, String> {
        parse_duration(text).map(|w| w.value)
    }

    #[test]
    fn durations_are_humantime_or_seconds() {
        assert_eq!(value("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(value("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(value("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(value("30"), Ok(Duration::from_secs(30)));
        assert_eq!(value("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(value(" 0 "), Ok(Duration::ZERO));
        for bad in ["", "5x", "-1s", "-1", "1.5.2", "1.5.2s", ".", "1e3", "nan"] {
            let message = value(bad).unwrap_err();
            assert!(message.contains("expected e.g."), "{bad:?}: {message}");
        }
    }

    #[test]
    fn a_duration_keeps_the_text_it_was_written_as() {
        assert_eq!(parse_duration("1m30s").unwrap().text, "1m30s");
        assert_eq!(parse_duration("90").unwrap().text, "90");
    }

    #[test]
    fn a_wait_may_be_forever() {
        for forever in ["inf", "infinity", "forever"] {
            assert_eq!(parse_wait(forever), Ok(Wait::Forever));
        }
        assert_eq!(
            parse_wait("10"),
            Ok(Wait::Up(Written {
                value: Duration::from_secs(10),
                text: "10".into()
            }))
        );
        assert!(parse_wait("soon").unwrap_err().contains("or inf"));
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
