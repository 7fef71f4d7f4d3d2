//! What the command says on stderr besides its results: log lines through tracing (`-v`,
//! `-vv`, `LEASEHOLD_LOG`, `RUST_LOG`), and notes (`-q` silences them; errors stay).

use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::EnvFilter;

/// Set by `-q`: notes are not printed.
static QUIET: AtomicBool = AtomicBool::new(false);

/// How much the command says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verbosity {
    /// `-q`: errors only.
    Quiet,
    /// No flag: the results and notes, and logs only if `LEASEHOLD_LOG` or `RUST_LOG` asks.
    Normal,
    /// `-v`: also what the lease does (acquire, each renewal, release), at debug level.
    Verbose,
    /// `-vv`: also every command and try, at trace level.
    Trace,
}

impl Verbosity {
    /// From the flags: `-q`, or the number of `-v`s.
    pub(crate) fn from_flags(verbose: u8, quiet: bool) -> Self {
        match (quiet, verbose) {
            (true, _) => Self::Quiet,
            (false, 0) => Self::Normal,
            (false, 1) => Self::Verbose,
            (false, _) => Self::Trace,
        }
    }
}

/// The log filter: a flag wins over the environment, `LEASEHOLD_LOG` over `RUST_LOG`; with
/// neither, nothing is logged (the output stays as it was before logs existed).
fn directives(
    verbosity: Verbosity,
    leasehold_log: Option<String>,
    rust_log: Option<String>,
) -> String {
    match verbosity {
        Verbosity::Quiet => "error".to_owned(),
        Verbosity::Verbose => "leasehold=debug,leasehold_redis=debug".to_owned(),
        Verbosity::Trace => "leasehold=trace,leasehold_redis=trace".to_owned(),
        Verbosity::Normal => leasehold_log
            .or(rust_log)
            .filter(|d| !d.trim().is_empty())
            .unwrap_or_else(|| "off".to_owned()),
    }
}

/// Starts logging to stderr at `verbosity`.
///
/// # Errors
///
/// The message, if `LEASEHOLD_LOG` or `RUST_LOG` is not a valid filter (a usage error: it is
/// reported before any I/O).
pub(crate) fn init(verbosity: Verbosity) -> Result<(), String> {
    QUIET.store(verbosity == Verbosity::Quiet, Ordering::Relaxed);
    let env = |name| std::env::var(name).ok();
    let directives = directives(verbosity, env("LEASEHOLD_LOG"), env("RUST_LOG"));
    let filter = EnvFilter::try_new(&directives)
        .map_err(|e| format!("LEASEHOLD_LOG / RUST_LOG {directives:?}: {e}"))?;
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .finish();
    // Only `main` sets it, once; a second call would change nothing.
    let _ = tracing::subscriber::set_global_default(subscriber);
    Ok(())
}

/// Returns true if and only if `-q` was given.
pub(crate) fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Writes `line` and a newline to stderr in one write: the command shares stderr, and a line
/// written in pieces (as `eprintln!` writes a formatted one) could have its output land in the
/// middle.
pub(crate) fn write_line(line: std::fmt::Arguments<'_>) {
    let whole = format!("{line}\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), whole.as_bytes());
}

/// Prints a message to stderr in one write ([`write_line`]): for what is said while the
/// command may be running and writing there too.
macro_rules! tell {
    ($($arg:tt)*) => {
        $crate::log::write_line(format_args!($($arg)*))
    };
}
pub(crate) use tell;

/// Prints a note to stderr, unless `-q` was given: what is not an error (an outcome the exit
/// code already tells, or a step on the way). In one write, as [`tell!`].
macro_rules! note {
    ($($arg:tt)*) => {
        if !$crate::log::quiet() {
            $crate::log::write_line(format_args!($($arg)*));
        }
    };
}
pub(crate) use note;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_wins_over_the_environment_and_leasehold_log_over_rust_log() {
        let set = |s: &str| Some(s.to_owned());
        assert_eq!(directives(Verbosity::Normal, None, None), "off");
        assert_eq!(
            directives(Verbosity::Normal, set("warn"), set("trace")),
            "warn"
        );
        assert_eq!(directives(Verbosity::Normal, None, set("info")), "info");
        assert_eq!(directives(Verbosity::Normal, set(" "), None), "off");
        assert_eq!(directives(Verbosity::Quiet, set("trace"), None), "error");
        assert!(directives(Verbosity::Verbose, set("off"), None).contains("leasehold=debug"));
        assert!(directives(Verbosity::Trace, None, None).contains("leasehold=trace"));
        assert_eq!(Verbosity::from_flags(3, false), Verbosity::Trace);
        assert_eq!(Verbosity::from_flags(2, true), Verbosity::Quiet);
    }
}
