//! Maps every Redis error into the port's vocabulary: not applied, or unknown.
//!
//! The rule is conservative: an error is "not applied" only when it proves the command did not
//! run — the server refused it before executing (READONLY, LOADING, BUSY, …) or no connection
//! existed to send it on. Everything else that happens after a command may have left this
//! process (a timeout, a dropped connection, an error raised inside a script, a reply we cannot
//! read) is `Indeterminate`, because the script may have run.

use leasehold::{Failure, Indeterminate, IndeterminateCause, Unavailable, UnavailableCause};
use redis::RedisError;

/// What a failed command means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Classified {
    /// The server does not have the script cached: it did not run; load it and retry once.
    NoScript,
    /// Definitely not applied.
    NotApplied(Unavailable),
    /// May have been applied.
    Indeterminate(Indeterminate),
}

impl From<Classified> for Failure {
    /// What a failed command means to the caller once nothing more will be tried.
    ///
    /// A NOSCRIPT becomes `Unavailable` (`ScriptMissing`): it proves the script did not run.
    /// The EVALSHA path answers its first NOSCRIPT by loading the script and sending again
    /// before it ever gets here, and the steps that know more about a NOSCRIPT than this
    /// (after a load, for an EVAL) say so in their own detail.
    fn from(classified: Classified) -> Self {
        match classified {
            Classified::NotApplied(u) => Failure::Unavailable(u),
            Classified::Indeterminate(i) => Failure::Indeterminate(i),
            Classified::NoScript => Failure::Unavailable(Unavailable::new(
                UnavailableCause::ScriptMissing,
                "NOSCRIPT: the script is not in the server's script cache",
            )),
        }
    }
}

/// How a command handed to a connection failed.
#[derive(Debug)]
pub(crate) enum QueryError {
    /// The connection refused the command before writing any of it: it had closed, or too
    /// many commands were waiting for a server that did not answer. Nothing was sent.
    NotWritten(&'static str),
    /// What redis-rs reports, or a failure after the command may have been written.
    Redis(RedisError),
}

impl From<RedisError> for QueryError {
    fn from(err: RedisError) -> Self {
        QueryError::Redis(err)
    }
}

impl From<QueryError> for RedisError {
    /// For a caller that only reports the failure (the connection's own setup, the eviction
    /// check): a command never written is a connection that is not there.
    fn from(err: QueryError) -> Self {
        match err {
            QueryError::Redis(err) => err,
            QueryError::NotWritten(why) => {
                std::io::Error::new(std::io::ErrorKind::NotConnected, why).into()
            }
        }
    }
}

/// Classifies a failed command: one never written is not applied; the rest as
/// [`after_send`].
pub(crate) fn after_query(err: &QueryError) -> Classified {
    match err {
        QueryError::NotWritten(why) => {
            Classified::NotApplied(Unavailable::new(UnavailableCause::NotConnected, *why))
        }
        QueryError::Redis(err) => after_send(err),
    }
}

/// Server error codes that Redis returns *before* executing a command.
fn refused_before_execution(code: &str) -> Option<UnavailableCause> {
    Some(match code {
        "READONLY" => UnavailableCause::ReadOnly,
        "LOADING" => UnavailableCause::Loading,
        "BUSY" => UnavailableCause::Busy,
        "MASTERDOWN" => UnavailableCause::MasterDown,
        "NOPERM" | "NOAUTH" | "WRONGPASS" => UnavailableCause::NoPermission,
        "OOM" => UnavailableCause::OutOfMemory,
        "MISCONF" | "NOREPLICAS" => UnavailableCause::WritesRefused,
        "CLUSTERDOWN" | "TRYAGAIN" => UnavailableCause::ClusterDown,
        // A redirect is answered instead of running the command: it ran nowhere.
        "MOVED" | "ASK" => UnavailableCause::Redirected,
        _ => return None,
    })
}

/// Describes an error for an outcome's `detail`. Redis errors carry the server's message and
/// never our arguments, so no token can leak through here.
fn describe(err: &RedisError) -> String {
    err.to_string()
}

/// Classifies an error from a command that was handed to a live connection.
pub(crate) fn after_send(err: &RedisError) -> Classified {
    if let Some(code) = err.code() {
        if code == "NOSCRIPT" {
            return Classified::NoScript;
        }
        if let Some(cause) = refused_before_execution(code) {
            return Classified::NotApplied(Unavailable::new(cause, describe(err)));
        }
        // Any other server error (e.g. "ERR Error running script"): the script may have made
        // writes before failing, and Redis does not roll them back.
        return Classified::Indeterminate(Indeterminate::new(
            IndeterminateCause::ServerError,
            describe(err),
        ));
    }
    if err.kind() == redis::ErrorKind::ClusterConnectionNotFound {
        // The cluster client had no connection to the slot's node, so nothing was sent.
        return Classified::NotApplied(Unavailable::new(
            UnavailableCause::NotConnected,
            describe(err),
        ));
    }
    let cause = if err.is_timeout() {
        IndeterminateCause::ResponseTimeout
    } else if err.is_io_error() || err.is_connection_dropped() {
        // The bytes may have reached the server before the connection broke.
        IndeterminateCause::ConnectionLost
    } else {
        IndeterminateCause::UnexpectedReply
    };
    Classified::Indeterminate(Indeterminate::new(cause, describe(err)))
}

/// Classifies an error from making a connection: nothing was sent, so nothing was applied.
pub(crate) fn connect_failure(err: &RedisError) -> Unavailable {
    let cause = if err.is_connection_refusal() {
        UnavailableCause::ConnectionRefused
    } else if err.is_timeout() {
        UnavailableCause::ConnectTimeout
    } else if let Some(cause) = err.code().and_then(refused_before_execution) {
        cause
    } else if err.kind() == redis::ErrorKind::AuthenticationFailed {
        UnavailableCause::NoPermission
    } else if refused_select(err) {
        UnavailableCause::NoSuchDatabase
    } else {
        UnavailableCause::NotConnected
    };
    Unavailable::new(cause, describe(err))
}

/// True if and only if `err` is redis-rs's report of a `SELECT` the server refused while
/// connecting (its only sign is the text: the reply is a plain `ERR`).
fn refused_select(err: &RedisError) -> bool {
    let text = err.to_string();
    text.contains("refused to switch database") || text.contains("DB index is out of range")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn server_error(code: &str, message: &str) -> RedisError {
        let reply = format!("-{code} {message}\r\n");
        match redis::parse_redis_value(reply.as_bytes()) {
            Ok(redis::Value::ServerError(e)) => e.into(),
            other => panic!("not a server error: {other:?}"),
        }
    }

    #[test]
    fn refusals_before_execution_are_not_applied() {
        for (code, cause) in [
            ("READONLY", UnavailableCause::ReadOnly),
            ("LOADING", UnavailableCause::Loading),
            ("BUSY", UnavailableCause::Busy),
            ("MASTERDOWN", UnavailableCause::MasterDown),
            ("NOPERM", UnavailableCause::NoPermission),
            ("OOM", UnavailableCause::OutOfMemory),
            ("MISCONF", UnavailableCause::WritesRefused),
            ("NOREPLICAS", UnavailableCause::WritesRefused),
            ("CLUSTERDOWN", UnavailableCause::ClusterDown),
            ("TRYAGAIN", UnavailableCause::ClusterDown),
            ("MOVED", UnavailableCause::Redirected),
            ("ASK", UnavailableCause::Redirected),
        ] {
            match after_send(&server_error(code, "refused")) {
                Classified::NotApplied(u) => assert_eq!(u.cause, cause, "{code}"),
                other => panic!("{code}: {other:?}"),
            }
        }
    }

    #[test]
    fn noscript_asks_for_a_reload() {
        assert_eq!(
            after_send(&server_error("NOSCRIPT", "No matching script.")),
            Classified::NoScript
        );
    }

    #[test]
    fn errors_inside_a_script_are_indeterminate() {
        match after_send(&server_error("ERR", "Error running script")) {
            Classified::Indeterminate(i) => assert_eq!(i.cause, IndeterminateCause::ServerError),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn timeouts_and_drops_after_send_are_indeterminate() {
        for (kind, cause) in [
            (io::ErrorKind::TimedOut, IndeterminateCause::ResponseTimeout),
            (
                io::ErrorKind::BrokenPipe,
                IndeterminateCause::ConnectionLost,
            ),
            (
                io::ErrorKind::ConnectionReset,
                IndeterminateCause::ConnectionLost,
            ),
            // Even "refused" cannot prove anything once a command was handed to a connection.
            (
                io::ErrorKind::ConnectionRefused,
                IndeterminateCause::ConnectionLost,
            ),
        ] {
            let err = RedisError::from(io::Error::from(kind));
            match after_send(&err) {
                Classified::Indeterminate(i) => assert_eq!(i.cause, cause, "{kind:?}"),
                other => panic!("{kind:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn classified_failures_keep_their_meaning() {
        let refused = Unavailable::new(UnavailableCause::ReadOnly, "READONLY");
        assert_eq!(
            Failure::from(Classified::NotApplied(refused.clone())),
            Failure::Unavailable(refused)
        );
        let unknown = Indeterminate::new(IndeterminateCause::ResponseTimeout, "timed out");
        assert_eq!(
            Failure::from(Classified::Indeterminate(unknown.clone())),
            Failure::Indeterminate(unknown)
        );
        // NOSCRIPT proves the script did not run: never Indeterminate.
        match Failure::from(Classified::NoScript) {
            Failure::Unavailable(u) => assert_eq!(u.cause, UnavailableCause::ScriptMissing),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn connect_failures_are_not_applied() {
        let refused = RedisError::from(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(
            connect_failure(&refused).cause,
            UnavailableCause::ConnectionRefused
        );
        let timeout = RedisError::from(io::Error::from(io::ErrorKind::TimedOut));
        assert_eq!(
            connect_failure(&timeout).cause,
            UnavailableCause::ConnectTimeout
        );
    }
}
