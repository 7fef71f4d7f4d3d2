//! The command line validated into what the commands act on, before any I/O.
//!
//! Every check that can fail on the user's input happens here, so that a bad flag is a usage
//! error (exit 2) and never a half-done operation: the library's own validation (purpose,
//! namespace, TTL above the drift budget, wait bound, URL syntax) runs here too.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::OsStrExt as _;
use std::time::Duration;

use leasehold_redis::leasehold::request::{MAX_CAPACITY, MAX_QUEUE_HEARTBEAT, MIN_QUEUE_HEARTBEAT};
use leasehold_redis::leasehold::{
    Attempt, DriftBudget, HolderName, LeaseRequest, MAX_TTL, MAX_WAIT, OperationId, Purpose,
    ResourceDigest,
};
use leasehold_redis::{RedisBackend, RedisSettings};

use crate::args::{
    BreakArgs, CapacityArgs, Cli, Command, InspectArgs, LeaseName, ListArgs, RunArgs,
};
use crate::duration::{Wait, Written, parse_duration, parse_wait};
use crate::exit;
use crate::holder::default_holder_name;
use crate::redact::mask_url;
use crate::stop::StopPolicy;

/// The shortest TTL `run` accepts: renewals, the loss signal and stopping the command all need
/// room inside the lease (the library's own floor is only "above the drift budget").
pub(crate) const MIN_RUN_TTL: Duration = Duration::from_millis(100);
/// The longest grace `run` accepts (far beyond any sensible value; keeps deadlines finite).
pub(crate) const MAX_GRACE: Duration = Duration::from_secs(60 * 60);

/// What to do, validated.
#[derive(Debug)]
pub(crate) enum Config {
    // Boxed: far the largest, and one value per process.
    Run(Box<RunConfig>),
    Inspect(InspectConfig),
    List(ListConfig),
    Break(BreakConfig),
    Capacity(CapacityConfig),
    Demo(DemoConfig),
    /// Print a completion script for the shell.
    Completions(clap_complete::Shell),
    /// Print the man page of `leasehold`, or of the subcommand named.
    Man(Option<String>),
}

/// Why the command line cannot be acted on.
#[derive(Debug)]
pub(crate) enum ConfigError {
    /// The user's input is wrong: exit 2.
    Usage(String),
    /// The input is fine but something needed to prepare failed (the OS random source).
    Setup(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Usage(m) | ConfigError::Setup(m) => f.write_str(m),
        }
    }
}

fn usage(message: impl Into<String>) -> ConfigError {
    ConfigError::Usage(message.into())
}

/// Which values came from the environment rather than the command line, by clap's argument
/// id: a bad value is reported under the name the user set it by.
#[derive(Debug, Default, Clone)]
pub(crate) struct Origins {
    from_env: Vec<String>,
}

impl Origins {
    /// From the ids of the arguments whose values came from their environment variables.
    pub(crate) fn from_env(ids: impl IntoIterator<Item = String>) -> Self {
        Self {
            from_env: ids.into_iter().collect(),
        }
    }

    /// The name to report a value under: `--ttl`, or `LEASEHOLD_TTL` if that is where it came
    /// from.
    pub(crate) fn name(&self, id: &str) -> String {
        if self.from_env.iter().any(|e| e == id) {
            match id {
                "redis" => "LEASEHOLD_REDIS_URL".to_owned(),
                _ => format!("LEASEHOLD_{}", id.to_ascii_uppercase()),
            }
        } else {
            format!("--{}", id.replace('_', "-"))
        }
    }
}

/// A Redis server to talk to: the backend (URL parsed, not connected) and how to name it.
pub(crate) struct Target {
    pub(crate) backend: RedisBackend,
    /// The URL with its credentials masked, for messages.
    pub(crate) shown: String,
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("shown", &self.shown)
            .finish_non_exhaustive()
    }
}

impl Target {
    fn open(url: &str, settings: RedisSettings, origins: &Origins) -> Result<Self, ConfigError> {
        let shown = mask_url(url);
        let backend = RedisBackend::open(url, settings)
            .map_err(|e| usage(format!("{} {shown}: {e}", origins.name("redis"))))?;
        Ok(Self { backend, shown })
    }
}

/// `leasehold run`, validated.
#[derive(Debug)]
pub(crate) struct RunConfig {
    pub(crate) target: Target,
    /// The request, with its attempt made once here and kept for every replay.
    pub(crate) request: LeaseRequest,
    pub(crate) stop: StopPolicy,
    /// `--wait inf`: acquire again after every wait of [`MAX_WAIT`] that ends contended.
    pub(crate) wait_forever: bool,
    /// `--wait` as the user wrote it, for messages.
    pub(crate) wait_text: String,
    /// The exit status for a lease another holder has.
    pub(crate) conflict_exit_code: u8,
    /// The exit status for a lease lost while the command ran.
    pub(crate) loss_exit_code: u8,
    /// `--json`: a summary line on stdout at the end.
    pub(crate) json: bool,
    /// The raw name, for messages only: it is never sent.
    pub(crate) resource_name: String,
    pub(crate) program: OsString,
    pub(crate) args: Vec<OsString>,
}

/// A lease named on the command line, validated.
#[derive(Debug)]
pub(crate) struct Named {
    pub(crate) purpose: Purpose,
    /// Where else to look when no purpose was given: the library's default purposes, whose
    /// leases a name alone should find too (empty when one was given).
    pub(crate) also: Vec<Purpose>,
    pub(crate) resource: ResourceDigest,
    /// The raw name (or the digest, if that is how it was given), for the human-readable line
    /// only: it is never sent.
    pub(crate) resource_name: String,
}

/// `leasehold inspect`, validated.
#[derive(Debug)]
pub(crate) struct InspectConfig {
    pub(crate) target: Target,
    pub(crate) lease: Named,
    /// `--semaphore`: the semaphore of that name, not the lease.
    pub(crate) semaphore: bool,
    pub(crate) json: bool,
}

/// `leasehold list`, validated.
#[derive(Debug)]
pub(crate) struct ListConfig {
    pub(crate) target: Target,
    pub(crate) purpose: Option<Purpose>,
    pub(crate) json: bool,
}

/// `leasehold break`, validated.
#[derive(Debug)]
pub(crate) struct BreakConfig {
    pub(crate) target: Target,
    pub(crate) lease: Named,
    /// `--slot K`: the permit on that slot of the semaphore of that name, not the lease.
    pub(crate) slot: Option<u32>,
    pub(crate) json: bool,
}

/// `leasehold capacity`, validated.
#[derive(Debug)]
pub(crate) struct CapacityConfig {
    pub(crate) target: Target,
    pub(crate) semaphore: Named,
    pub(crate) capacity: u32,
    pub(crate) json: bool,
}

/// `leasehold demo`, validated.
#[derive(Debug)]
pub(crate) struct DemoConfig {
    /// The server named on the command line, its URL checked; `None` starts an ephemeral one.
    pub(crate) target: Option<Target>,
    pub(crate) settings: RedisSettings,
}

impl Config {
    /// Validates the parsed command line. `redis_on_command_line` says whether `--redis` was
    /// typed (rather than taken from the environment or the default): only then does `demo`
    /// use it.
    pub(crate) fn from_cli(
        cli: Cli,
        redis_on_command_line: bool,
        origins: &Origins,
    ) -> Result<Self, ConfigError> {
        let settings = RedisSettings::default()
            .with_namespace(&cli.namespace)
            .map_err(|e| usage(format!("{}: {e}", origins.name("namespace"))))?;
        match cli.command {
            Command::Run(args) => {
                run(&cli.redis, settings, *args, origins).map(|run| Config::Run(Box::new(run)))
            }
            Command::Inspect(args) => {
                inspect(&cli.redis, settings, args, origins).map(Config::Inspect)
            }
            Command::List(args) => list(&cli.redis, settings, args, origins).map(Config::List),
            Command::Break(args) => {
                break_lease(&cli.redis, settings, args, origins).map(Config::Break)
            }
            Command::Capacity(args) => {
                set_capacity(&cli.redis, settings, args, origins).map(Config::Capacity)
            }
            Command::Demo => Ok(Config::Demo(DemoConfig {
                // Checked here like the other commands' URLs, so that a bad one is a usage
                // error before the story starts, not a failure in the middle of it.
                target: redis_on_command_line
                    .then(|| Target::open(&cli.redis, settings.clone(), origins))
                    .transpose()?,
                settings,
            })),
            Command::Completions { shell } => Ok(Config::Completions(shell)),
            Command::Man { command } => Ok(Config::Man(command)),
        }
    }
}

fn purpose(text: &str, origins: &Origins) -> Result<Purpose, ConfigError> {
    Purpose::new(text).map_err(|e| usage(format!("{} {text:?}: {e}", origins.name("purpose"))))
}

/// A duration flag or variable, parsed.
fn duration(text: &str, id: &str, origins: &Origins) -> Result<Written, ConfigError> {
    parse_duration(text).map_err(|e| usage(format!("{} {text:?}: {e}", origins.name(id))))
}

/// A semaphore's capacity, from a flag or variable: 1 to [`MAX_CAPACITY`].
fn parse_capacity(text: &str, id: &str, origins: &Origins) -> Result<u32, ConfigError> {
    text.trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_CAPACITY).contains(n))
        .ok_or_else(|| {
            usage(format!(
                "{} {text:?}: a capacity is a whole number from 1 to {MAX_CAPACITY}",
                origins.name(id)
            ))
        })
}

/// An exit status flag or variable: 0 to 255.
fn exit_code(text: &str, id: &str, origins: &Origins) -> Result<u8, ConfigError> {
    text.trim().parse::<u8>().map_err(|_| {
        usage(format!(
            "{} {text:?}: an exit status is a whole number from 0 to 255",
            origins.name(id)
        ))
    })
}

fn resource(raw: &OsString) -> Result<ResourceDigest, ConfigError> {
    if raw.is_empty() {
        return Err(usage("RESOURCE must not be empty"));
    }
    Ok(ResourceDigest::of(raw.as_bytes()))
}

/// Timeouts scaled to the lease: a renewal that hangs for the library's default 200 ms, or a
/// reconnect that takes its default 1 s, must not eat a short lease before the loss signal
/// can fire. Never longer than the defaults.
fn settings_for_ttl(
    settings: RedisSettings,
    ttl: Duration,
    origins: &Origins,
) -> Result<RedisSettings, ConfigError> {
    let defaults = RedisSettings::default();
    let tenth = (ttl / 10).max(Duration::from_millis(1));
    settings
        .with_command_timeout(defaults.command_timeout().min(tenth))
        .and_then(|s| s.with_connect_timeout(defaults.connect_timeout().min(tenth)))
        .map_err(|e| usage(format!("{}: {e}", origins.name("ttl"))))
}

fn run(
    url: &str,
    settings: RedisSettings,
    args: RunArgs,
    origins: &Origins,
) -> Result<RunConfig, ConfigError> {
    let name = |id| origins.name(id);
    let purpose = purpose(&args.purpose, origins)?;
    let resource = resource(&args.resource)?;
    let ttl = duration(&args.ttl, "ttl", origins)?;
    let wait = parse_wait(&args.wait)
        .map_err(|e| usage(format!("{} {:?}: {e}", name("wait"), args.wait)))?;
    let grace = duration(&args.grace, "grace", origins)?;
    let hold = args
        .hold_at_least
        .as_deref()
        .map(|text| duration(text, "hold_at_least", origins))
        .transpose()?;
    let code = |text: &Option<String>, id, default| {
        text.as_deref()
            .map_or(Ok(default), |text| exit_code(text, id, origins))
    };
    let conflict_exit_code = code(
        &args.conflict_exit_code,
        "conflict_exit_code",
        exit::NOT_ACQUIRED,
    )?;
    let loss_exit_code = code(&args.loss_exit_code, "loss_exit_code", exit::LEASE_LOST)?;
    let capacity = args
        .capacity
        .as_deref()
        .map(|text| parse_capacity(text, "capacity", origins))
        .transpose()?;
    let heartbeat = args
        .queue_heartbeat
        .as_deref()
        .map(|text| duration(text, "queue_heartbeat", origins))
        .transpose()?;
    let operation = OperationId::new(format!("leasehold-run-{}", std::process::id()))
        .map_err(|e| ConfigError::Setup(e.to_string()))?;
    let attempt = Attempt::new(operation).map_err(|e| ConfigError::Setup(e.to_string()))?;
    let drift = DriftBudget::default();
    let request = LeaseRequest::new(purpose, resource, attempt, ttl.value, drift)
        .map_err(|e| usage(format!("{} {}: {e}", name("ttl"), ttl.text)))?;
    if ttl.value < MIN_RUN_TTL {
        return Err(usage(format!(
            "{} {}: must be at least {} for `run` (renewals and stopping the command need room \
             inside the lease)",
            name("ttl"),
            ttl.text,
            humantime::format_duration(MIN_RUN_TTL),
        )));
    }
    let (wait_timeout, wait_forever, wait_text) = match wait {
        Wait::Up(wait) => (wait.value, false, wait.text),
        Wait::Forever => (MAX_WAIT, true, "inf".to_owned()),
    };
    let request = request.with_wait_timeout(wait_timeout).map_err(|_| {
        usage(format!(
            "{} {wait_text}: must be at most {}, or inf",
            name("wait"),
            humantime::format_duration(MAX_WAIT),
        ))
    })?;
    // The name is public text shown to operators; the error never repeats it (it may hold
    // the control characters it is refused for).
    let holder = match &args.holder {
        Some(holder) => {
            Some(HolderName::new(holder).map_err(|e| usage(format!("{}: {e}", name("holder"))))?)
        }
        None => default_holder_name(),
    };
    let request = match holder {
        Some(name) => request.with_holder_name(name),
        None => request,
    };
    let request = match hold {
        Some(hold) => request.with_min_hold(hold.value).map_err(|e| {
            usage(format!(
                "{} {}: {e} (at most {})",
                name("hold_at_least"),
                hold.text,
                humantime::format_duration(MAX_TTL),
            ))
        })?,
        None => request,
    };
    let request = match capacity {
        // In range: checked above, with the flag named.
        Some(n) => request
            .with_capacity(n)
            .map_err(|e| usage(format!("{}: {e}", name("capacity"))))?,
        None => request,
    };
    let request = match heartbeat {
        // A lease's waiters keep no place on the server: a heartbeat would mean nothing.
        Some(_) if capacity.is_none() => {
            return Err(usage(format!(
                "{}: only with --capacity (the waiters of a semaphore keep a place in its \
                 queue; a lease's do not)",
                name("queue_heartbeat")
            )));
        }
        Some(heartbeat) => request.with_queue_heartbeat(heartbeat.value).map_err(|_| {
            usage(format!(
                "{} {}: must be whole milliseconds from {} to {}",
                name("queue_heartbeat"),
                heartbeat.text,
                humantime::format_duration(MIN_QUEUE_HEARTBEAT),
                humantime::format_duration(MAX_QUEUE_HEARTBEAT),
            ))
        })?,
        None => request,
    };
    if grace.value > MAX_GRACE {
        return Err(usage(format!(
            "{} {}: must be at most {}",
            name("grace"),
            grace.text,
            humantime::format_duration(MAX_GRACE),
        )));
    }
    let mut command = args.command.into_iter();
    let program = command
        .next()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| usage("no command given after `--`"))?;
    let settings = settings_for_ttl(settings, ttl.value, origins)?;
    Ok(RunConfig {
        target: Target::open(url, settings, origins)?,
        stop: StopPolicy::new(ttl.value, grace.value),
        request,
        wait_forever,
        wait_text,
        conflict_exit_code,
        loss_exit_code,
        json: args.json,
        resource_name: args.resource.to_string_lossy().into_owned(),
        program,
        args: command.collect(),
    })
}

fn inspect(
    url: &str,
    settings: RedisSettings,
    args: InspectArgs,
    origins: &Origins,
) -> Result<InspectConfig, ConfigError> {
    Ok(InspectConfig {
        lease: named(&args.lease, origins)?,
        semaphore: args.semaphore,
        json: args.json,
        target: Target::open(url, settings, origins)?,
    })
}

/// The purpose `run` takes leases for unless told otherwise.
pub(crate) const CLI_PURPOSE: &str = "cli";

/// The library's default purposes: of `lock` and `run`, and of `election`.
fn library_purposes() -> Result<Vec<Purpose>, ConfigError> {
    [
        leasehold_redis::leasehold::lock::DEFAULT_PURPOSE,
        leasehold_redis::leasehold::election::ELECTION_PURPOSE,
    ]
    .into_iter()
    .map(|p| Purpose::new(p).map_err(|e| usage(e.to_string())))
    .collect()
}

/// The lease `name` names: by digest or by raw name, with its purpose.
fn named(name: &LeaseName, origins: &Origins) -> Result<Named, ConfigError> {
    let (purpose, also) = match &name.purpose {
        Some(given) => (purpose(given, origins)?, Vec::new()),
        None => (
            Purpose::new(CLI_PURPOSE).map_err(|e| usage(e.to_string()))?,
            library_purposes()?,
        ),
    };
    let (resource, resource_name) = match (&name.digest, &name.resource) {
        (Some(digest), _) => (
            ResourceDigest::parse(digest).map_err(|e| usage(format!("--digest: {e}")))?,
            digest.clone(),
        ),
        (None, Some(raw)) => (resource(raw)?, raw.to_string_lossy().into_owned()),
        (None, None) => return Err(usage("name the lease: RESOURCE or --digest")),
    };
    Ok(Named {
        purpose,
        also,
        resource,
        resource_name,
    })
}

fn list(
    url: &str,
    settings: RedisSettings,
    args: ListArgs,
    origins: &Origins,
) -> Result<ListConfig, ConfigError> {
    Ok(ListConfig {
        purpose: args
            .purpose
            .as_deref()
            .map(|p| purpose(p, origins))
            .transpose()?,
        json: args.json,
        target: Target::open(url, settings, origins)?,
    })
}

fn break_lease(
    url: &str,
    settings: RedisSettings,
    args: BreakArgs,
    origins: &Origins,
) -> Result<BreakConfig, ConfigError> {
    let lease = named(&args.lease, origins)?;
    let slot = args
        .slot
        .as_deref()
        .map(|text| {
            text.trim()
                .parse::<u32>()
                .ok()
                .filter(|k| *k < MAX_CAPACITY)
                .ok_or_else(|| {
                    usage(format!(
                        "--slot {text:?}: a slot is a whole number from 0 to {}",
                        MAX_CAPACITY - 1
                    ))
                })
        })
        .transpose()?;
    if !args.yes {
        return Err(usage(
            "break removes the lease whoever holds it, and nothing tells the holder until its \
             next renewal; add --yes to do it (`leasehold inspect` shows who holds it)",
        ));
    }
    Ok(BreakConfig {
        lease,
        slot,
        json: args.json,
        target: Target::open(url, settings, origins)?,
    })
}

fn set_capacity(
    url: &str,
    settings: RedisSettings,
    args: CapacityArgs,
    origins: &Origins,
) -> Result<CapacityConfig, ConfigError> {
    let semaphore = named(&args.lease, origins)?;
    // N has no variable: the name to report it under is the argument's.
    let capacity = args.capacity.trim().parse::<u32>().ok();
    let capacity = capacity
        .filter(|n| (1..=MAX_CAPACITY).contains(n))
        .ok_or_else(|| {
            usage(format!(
                "N {:?}: a capacity is a whole number from 1 to {MAX_CAPACITY}",
                args.capacity
            ))
        })?;
    Ok(CapacityConfig {
        semaphore,
        capacity,
        json: args.json,
        target: Target::open(url, settings, origins)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    fn config(argv: &[&str]) -> Result<Config, ConfigError> {
        let mut full = vec!["leasehold", "--redis", "redis://127.0.0.1:1"];
        full.extend_from_slice(argv);
        Config::from_cli(
            Cli::try_parse_from(full).expect("parses"),
            true,
            &Origins::default(),
        )
    }

    fn usage_message(argv: &[&str]) -> String {
        match config(argv) {
            Err(ConfigError::Usage(m)) => m,
            other => panic!("{argv:?}: expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn a_valid_run_becomes_a_request() {
        let Ok(Config::Run(run)) = config(&[
            "run",
            "orders/42",
            "--ttl",
            "2s",
            "--wait",
            "1s",
            "--",
            "sh",
            "-c",
            "true",
        ]) else {
            panic!("not a run config");
        };
        assert_eq!(run.request.ttl(), Duration::from_secs(2));
        assert_eq!(run.request.wait_timeout(), Duration::from_secs(1));
        assert_eq!(run.request.resource(), &ResourceDigest::of("orders/42"));
        assert_eq!(run.request.purpose().as_str(), "cli");
        assert_eq!(run.program, "sh");
        assert_eq!(run.args, ["-c", "true"]);
        // By default: no minimum hold, and this host and process as the holder name.
        assert_eq!(run.request.min_hold(), None);
        let name = run.request.holder_name().expect("a default holder name");
        assert!(
            name.as_str().ends_with(&std::process::id().to_string()),
            "{name}"
        );
        // Timeouts scaled to the short lease.
        let settings = run.target.backend.settings();
        assert_eq!(settings.command_timeout(), Duration::from_millis(200));
        assert_eq!(settings.connect_timeout(), Duration::from_millis(200));
    }

    #[test]
    fn a_holder_name_and_a_minimum_hold_go_into_the_request() {
        let Ok(Config::Run(run)) = config(&[
            "run",
            "r",
            "--holder",
            "nightly on host-3",
            "--hold-at-least",
            "1500ms",
            "--",
            "true",
        ]) else {
            panic!("not a run config");
        };
        assert_eq!(
            run.request.holder_name().map(HolderName::as_str),
            Some("nightly on host-3")
        );
        assert_eq!(run.request.min_hold(), Some(Duration::from_millis(1500)));
        // The TTL and the timeouts scaled to it are the TTL's, not the hold's.
        assert_eq!(run.request.ttl(), Duration::from_secs(30));
    }

    #[test]
    fn a_capacity_makes_it_a_permit_request_with_its_queue_heartbeat() {
        let Ok(Config::Run(run)) = config(&["run", "r", "--", "true"]) else {
            panic!("not a run config");
        };
        assert_eq!(run.request.capacity(), None, "a lease by default");
        let Ok(Config::Run(run)) = config(&[
            "run",
            "r",
            "--capacity",
            "3",
            "--queue-heartbeat",
            "1500ms",
            "--",
            "true",
        ]) else {
            panic!("not a run config");
        };
        assert_eq!(run.request.capacity(), Some(3));
        assert_eq!(run.request.queue_heartbeat(), Duration::from_millis(1500));
        assert_eq!(run.resource_name, "r");
    }

    #[test]
    fn a_wait_of_inf_waits_in_rounds_of_the_longest_wait() {
        let Ok(Config::Run(run)) = config(&["run", "r", "--wait", "inf", "--", "true"]) else {
            panic!("not a run config");
        };
        assert!(run.wait_forever);
        assert_eq!(run.request.wait_timeout(), MAX_WAIT);
        let Ok(Config::Run(run)) = config(&["run", "r", "--wait", "90", "--", "true"]) else {
            panic!("not a run config");
        };
        assert!(!run.wait_forever);
        assert_eq!(run.request.wait_timeout(), Duration::from_secs(90));
        assert_eq!(run.wait_text, "90");
        assert_eq!((run.conflict_exit_code, run.loss_exit_code), (75, 70));
    }

    #[test]
    fn short_leases_get_short_timeouts() {
        let Ok(Config::Run(run)) = config(&["run", "r", "--ttl", "500ms", "--", "true"]) else {
            panic!("not a run config");
        };
        let settings = run.target.backend.settings();
        assert_eq!(settings.command_timeout(), Duration::from_millis(50));
        assert_eq!(settings.connect_timeout(), Duration::from_millis(50));
    }

    #[test]
    fn bad_values_are_usage_errors_with_the_flag_named() {
        let cases: &[(&[&str], &str)] = &[
            (&["run", "r", "--ttl", "10ms", "--", "true"], "--ttl 10ms"),
            (
                &["run", "r", "--ttl", "1500us", "--", "true"],
                "whole number",
            ),
            (
                &["run", "r", "--ttl", "50ms", "--", "true"],
                "at least 100ms",
            ),
            (&["run", "r", "--ttl", "2days", "--", "true"], "--ttl"),
            (&["run", "r", "--wait", "2h", "--", "true"], "--wait 2h"),
            (&["run", "r", "--grace", "2h", "--", "true"], "--grace 2h"),
            (
                &["run", "r", "--hold-at-least", "2days", "--", "true"],
                "--hold-at-least 2days",
            ),
            (
                &["run", "r", "--hold-at-least", "1500us", "--", "true"],
                "whole number",
            ),
            (&["run", "r", "--holder", "", "--", "true"], "--holder"),
            (&["run", "r", "--holder", "a\nb", "--", "true"], "--holder"),
            (&["run", "r", "--purpose", "Bad", "--", "true"], "--purpose"),
            (
                &["run", "r", "--capacity", "0", "--", "true"],
                "--capacity \"0\": a capacity is a whole number from 1 to 1024",
            ),
            (
                &["run", "r", "--capacity", "1025", "--", "true"],
                "from 1 to 1024",
            ),
            (
                &["run", "r", "--capacity", "two", "--", "true"],
                "--capacity",
            ),
            (
                &["run", "r", "--queue-heartbeat", "1s", "--", "true"],
                "--queue-heartbeat: only with --capacity",
            ),
            (
                &[
                    "run",
                    "r",
                    "--capacity",
                    "2",
                    "--queue-heartbeat",
                    "50ms",
                    "--",
                    "true",
                ],
                "--queue-heartbeat 50ms: must be whole milliseconds from 100ms to 1m",
            ),
            (&["run", "", "--", "true"], "RESOURCE"),
            (&["run", "r", "--", ""], "no command"),
            (&["inspect", "r", "--purpose", "a:b"], "--purpose"),
            (
                &["break", "r", "--slot", "1024", "--yes"],
                "--slot \"1024\": a slot is a whole number from 0 to 1023",
            ),
            (&["break", "r", "--slot", "one", "--yes"], "--slot \"one\""),
            (
                &["capacity", "r", "0"],
                "N \"0\": a capacity is a whole number from 1 to 1024",
            ),
            (&["capacity", "r", "many"], "N \"many\""),
            (&["--namespace", "a:b", "inspect", "r"], "--namespace"),
        ];
        for (argv, needle) in cases {
            let message = usage_message(argv);
            assert!(message.contains(needle), "{argv:?}: {message}");
        }
    }

    #[test]
    fn a_bad_url_is_a_usage_error_that_does_not_echo_a_password() {
        let cli = Cli::try_parse_from([
            "leasehold",
            "--redis",
            "redis://:hunter2@host:notaport",
            "inspect",
            "r",
        ])
        .unwrap();
        match Config::from_cli(cli, true, &Origins::default()) {
            Err(ConfigError::Usage(m)) => {
                assert!(m.contains("--redis"), "{m}");
                assert!(!m.contains("hunter2"), "{m}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_demo_uses_only_a_typed_url() {
        let cli = || Cli::try_parse_from(["leasehold", "demo"]).unwrap();
        let Ok(Config::Demo(demo)) = Config::from_cli(cli(), false, &Origins::default()) else {
            panic!("not a demo");
        };
        assert!(demo.target.is_none());
        let Ok(Config::Demo(demo)) = Config::from_cli(cli(), true, &Origins::default()) else {
            panic!("not a demo");
        };
        assert!(demo.target.is_some());
    }

    #[test]
    fn the_demo_checks_a_typed_url_but_not_an_ignored_one() {
        let cli = || {
            Cli::try_parse_from(["leasehold", "--redis", "redis://:hun?ter2@h:x", "demo"]).unwrap()
        };
        match Config::from_cli(cli(), true, &Origins::default()) {
            Err(ConfigError::Usage(m)) => {
                assert!(m.contains("--redis"), "{m}");
                assert!(!m.contains("ter2"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        // Not typed (from the environment): ignored, so not checked either.
        assert!(matches!(
            Config::from_cli(cli(), false, &Origins::default()),
            Ok(Config::Demo(DemoConfig { target: None, .. }))
        ));
    }
}
