//! `leasehold`: run a command under a Redis lease (or a semaphore's permit), inspect a lease,
//! and a fencing demo.
//!
//! Thin by design: parse the command line ([`args`]), validate it into a config before any
//! I/O ([`config`]), then act ([`run`], [`inspect`], [`demo`]). The exit codes are a contract
//! ([`exit`]).
//!
//! # Layout
//!
//! - [`args`]: clap's view of the flags;
//! - [`config`]: validation into what the commands act on;
//! - [`run`]: acquire, supervise the command, release; [`supervise`]: the command under the
//!   lease; [`stop`]: when and how it is stopped; [`signals`]: the signals passed on;
//! - [`inspect`]: who holds a lease, or a semaphore's permits; [`holder`]: the holder name a
//!   run gives its grant;
//! - [`admin`]: an operator's `list` and `break`; [`capacity`]: a semaphore's capacity;
//! - [`demo`] and [`local_redis`]: the fencing story on an ephemeral redis-server;
//! - [`log`]: log lines and notes on stderr, `-v` / `-q`;
//! - [`remedy`]: what to do about a server that could not be used;
//! - [`redact`]: URLs fit to print; [`duration`]: durations in flags and messages;
//! - [`suggestion`]: the subcommand nearest a mistyped one.

#![warn(missing_debug_implementations, rust_2018_idioms, unreachable_pub)]
#![forbid(unsafe_code)]

mod admin;
mod args;
mod capacity;
mod config;
mod demo;
mod duration;
mod exit;
mod holder;
mod inspect;
mod local_redis;
mod log;
mod redact;
mod remedy;
mod run;
mod signals;
mod stop;
mod suggestion;
mod supervise;

use std::process::ExitCode;

use clap::FromArgMatches as _;
use clap::parser::ValueSource;

use crate::args::Cli;
use crate::config::{Config, ConfigError, Origins};

fn main() -> ExitCode {
    let matches = match args::command().try_get_matches() {
        Ok(matches) => matches,
        // --help and --version land here too, with exit code 0.
        Err(mut e) => {
            suggestion::suggest_subcommand(&mut e, &args::command());
            let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
            return match separator_hint(&e, &argv) {
                Some(text) => {
                    eprint!("{text}");
                    exit::code(exit::USAGE)
                }
                None => exit_with_clap_error(&e),
            };
        }
    };
    let redis_typed = matches.value_source("redis") == Some(ValueSource::CommandLine);
    let subcommand = matches.subcommand_name().map(str::to_owned);
    let origins = Origins::from_env(from_env(&matches));
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => return exit_with_clap_error(&e),
    };
    if let Err(message) = log::init(log::Verbosity::from_flags(cli.verbose, cli.quiet)) {
        return exit_with_clap_error(&usage_error(subcommand.as_deref(), message));
    }
    let config = match Config::from_cli(cli, redis_typed, &origins) {
        Ok(config) => config,
        Err(ConfigError::Usage(message)) => {
            return exit_with_clap_error(&usage_error(subcommand.as_deref(), message));
        }
        Err(e @ ConfigError::Setup(_)) => {
            eprintln!("leasehold: {e}");
            return exit::code(exit::FAILURE);
        }
    };
    // Generated from the command line's definition: no I/O but stdout.
    match config {
        Config::Completions(shell) => {
            clap_complete::generate(
                shell,
                &mut args::command(),
                "leasehold",
                &mut std::io::stdout(),
            );
            return exit::code(0);
        }
        Config::Man(subcommand) => {
            // The parser admits only the names of pages there are.
            let Some(page) = args::man_page(subcommand.as_deref()) else {
                eprintln!("leasehold: no man page for {subcommand:?}");
                return exit::code(exit::USAGE);
            };
            return match page.render(&mut std::io::stdout()) {
                Ok(()) => exit::code(0),
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    exit::code(exit::BROKEN_PIPE)
                }
                Err(e) => {
                    eprintln!("leasehold: cannot write the man page: {e}");
                    exit::code(exit::FAILURE)
                }
            };
        }
        _ => {}
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("leasehold: cannot start the async runtime: {e}");
            return exit::code(exit::FAILURE);
        }
    };
    let code = runtime.block_on(async move {
        match config {
            Config::Run(config) => run::run(*config).await,
            Config::Inspect(config) => inspect::inspect(config).await,
            Config::List(config) => admin::list(config).await,
            Config::Break(config) => admin::break_lease(config).await,
            Config::Capacity(config) => capacity::capacity(config).await,
            Config::Demo(config) => demo::demo(config).await,
            Config::Completions(_) | Config::Man(_) => exit::FAILURE,
        }
    });
    exit::code(code)
}

/// The ids of the arguments, global or the subcommand's, whose values came from the
/// environment.
fn from_env(matches: &clap::ArgMatches) -> Vec<String> {
    let env = |m: &clap::ArgMatches| {
        m.ids()
            .filter(|id| m.value_source(id.as_str()) == Some(ValueSource::EnvVariable))
            .map(|id| id.as_str().to_owned())
            .collect::<Vec<_>>()
    };
    let mut ids = env(matches);
    if let Some((_, sub)) = matches.subcommand() {
        ids.extend(env(sub));
    }
    ids
}

/// A validation error in clap's format, with the usage line of the subcommand it is about.
fn usage_error(subcommand: Option<&str>, message: String) -> clap::Error {
    // Built: each subcommand has its full name ("leasehold run") for its usage line.
    let mut command = args::command();
    let kind = clap::error::ErrorKind::ValueValidation;
    match subcommand.and_then(|name| command.find_subcommand_mut(name)) {
        Some(sub) => sub.error(kind, message),
        None => command.error(kind, message),
    }
}

/// clap's message for `leasehold run R CMD` (no `--`) or `leasehold run R` (no command), with
/// a tip on where the command goes; `None` for any other error.
fn separator_hint(e: &clap::Error, argv: &[std::ffi::OsString]) -> Option<String> {
    use clap::error::ErrorKind;
    let about_run = argv.iter().skip(1).any(|a| a == "run");
    let no_separator = !argv.iter().any(|a| a == "--");
    let kind = e.kind();
    if !(about_run
        && no_separator
        && matches!(
            kind,
            ErrorKind::UnknownArgument | ErrorKind::MissingRequiredArgument
        ))
    {
        return None;
    }
    let tip =
        "  tip: the command goes after `--`: leasehold run RESOURCE [OPTIONS] -- CMD [ARGS]...";
    let text = e.render().to_string();
    // After clap's first paragraph (the error itself), before the usage line.
    Some(match text.split_once("\n\n") {
        Some((error, rest)) => format!("{error}\n\n{tip}\n\n{rest}"),
        None => format!("{text}\n{tip}\n"),
    })
}

fn exit_with_clap_error(e: &clap::Error) -> ExitCode {
    let _ = e.print();
    // clap uses 2 for usage errors and 0 for --help / --version.
    exit::code(u8::try_from(e.exit_code()).unwrap_or(exit::USAGE))
}
