//! The command line as typed: clap's view of the flags, before any validation of meaning.
//!
//! Everything here is syntax. Whether a TTL is long enough, a purpose well formed or a URL
//! parseable is decided in [`crate::config`], which turns these into what the commands act on.

use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;

use crate::exit;

/// The default Redis URL.
pub(crate) const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";

const ABOUT: &str = "Distributed leases on Redis: run a command under a lease, inspect a lease.";

const LONG_ABOUT: &str = "\
Distributed leases on Redis: run a command under a lease, inspect a lease, and see fencing at
work in a demo.

A lease lets one process at a time do a piece of work. Every grant carries a fencing token (a
number that grows with every new grant of a resource); pass it to whatever the work writes to,
so that a holder that was paused past its lease cannot overwrite a newer holder's work.

Resource names are hashed (SHA-256) before they are sent: the raw name never reaches Redis.";

/// The `leasehold` command line.
#[derive(Debug, Parser)]
#[command(
    name = "leasehold",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = exit::SUMMARY,
    after_long_help = exit::TABLE,
)]
pub(crate) struct Cli {
    /// Redis URL: redis://[user:password@]host:port[/db] (rediss:// for TLS), unix:///path,
    /// redis+sentinel://host:26379[,host:26379…]/SERVICE[/db] or
    /// redis+cluster://host:port[,host:port…] (rediss+… for TLS).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "LEASEHOLD_REDIS_URL",
        // The variable may hold a password: never show its value in --help.
        hide_env_values = true,
        default_value = DEFAULT_REDIS_URL,
    )]
    pub(crate) redis: String,

    /// Namespace every key starts with ([A-Za-z0-9._-], at most 64 bytes).
    #[arg(
        long,
        global = true,
        value_name = "NS",
        env = "LEASEHOLD_NAMESPACE",
        default_value = "leasehold"
    )]
    pub(crate) namespace: String,

    /// Log what the lease does to stderr: -v the acquire, each renewal and the release;
    /// -vv every command too. LEASEHOLD_LOG (or RUST_LOG) sets a filter instead.
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub(crate) verbose: u8,

    /// Print errors only: no notes (the exit code still tells what happened).
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,

    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The command line's definition, as parsed, shown in `--help`, completed and in the man page:
/// [`Cli`]'s, with one change clap's derive cannot make. `--redis` is global, and with it its
/// variable; but `demo` ignores `LEASEHOLD_REDIS_URL` (it never writes to a server the user
/// did not name on its command line), so its `--help` must not offer it.
pub(crate) fn command() -> clap::Command {
    use clap::CommandFactory as _;
    let mut command = Cli::command();
    // Building propagates the global arguments into each subcommand, where they can then be
    // changed for that subcommand alone.
    command.build();
    let command = command.mut_subcommand("run", |run| {
        run.after_long_help(format!("{}\n\n{}", indented(RUN_EXAMPLES), exit::TABLE))
    });
    command.mut_subcommand("demo", |demo| {
        // In place (`mut_arg` would move the argument behind the index clap built).
        demo.mut_args(|arg| {
            if arg.get_id() != "redis" {
                return arg;
            }
            arg.hide_env(true).hide_default_value(true).help(
                "The Redis server to tell the story on, named on this command line only \
                 (LEASEHOLD_REDIS_URL is ignored) [default: an ephemeral local redis-server]",
            )
        })
    })
}

/// `run` where it is usually called from, consistent with the README's own examples (a test
/// checks that their lines are here): under `Examples:` in `run --help`, and as the EXAMPLES
/// section of leasehold(1) and leasehold-run(1).
const RUN_EXAMPLES: &str = "\
# crontab: run the report on one host per tick; a skip (another host has the lease) exits 0
# and prints nothing, so cron sends no mail
*/5 * * * * leasehold run R --conflict-exit-code 0 -q -- ./report.sh

# systemd: /etc/systemd/system/report.service; 75 (held elsewhere) is a success
[Service]
Type=oneshot
Environment=LEASEHOLD_REDIS_URL=redis://redis.internal:6379 LEASEHOLD_TTL=1m
ExecStart=/usr/local/bin/leasehold run nightly-report -- /usr/local/bin/report.sh
SuccessExitStatus=75

# and /etc/systemd/system/report.timer, started on every host with
# `systemctl enable --now report.timer` (if the report can end before a host whose clock is
# behind starts it, add --hold-at-least 10m to ExecStart: it then runs once a night)
[Unit]
Description=The nightly report, on one host

[Timer]
OnCalendar=*-*-* 02:00:00

[Install]
WantedBy=timers.target

# a CI step (GitHub Actions): wait for the shared staging environment; the --json report is
# the last line of stdout
- run: leasehold run staging-deploy --wait inf --json -- ./deploy.sh
  env:
    LEASEHOLD_REDIS_URL: ${{ secrets.LEASE_REDIS_URL }}";

/// The examples under a heading, indented as clap indents its own sections.
fn indented(examples: &str) -> String {
    let lines: Vec<String> = examples
        .lines()
        .map(|line| {
            if line.is_empty() {
                String::new()
            } else {
                format!("  {line}")
            }
        })
        .collect();
    format!("Examples:\n{}", lines.join("\n"))
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a command while holding a lease on RESOURCE; stop it if the lease is lost.
    #[command(long_about = RUN_LONG_ABOUT, after_help = exit::SUMMARY, after_long_help = exit::TABLE)]
    // Boxed: far the largest, and one value per process.
    Run(Box<RunArgs>),
    /// Print who holds the lease on RESOURCE (with --semaphore: the permits of its semaphore).
    #[command(long_about = INSPECT_LONG_ABOUT)]
    Inspect(InspectArgs),
    /// List the leases and permits held in the namespace: purpose, digest, slot, fence, time
    /// left, holder.
    #[command(long_about = LIST_LONG_ABOUT)]
    List(ListArgs),
    /// Remove a stuck lease (or with --slot, a permit), whoever holds it (its fence counter
    /// stays); needs --yes.
    #[command(long_about = BREAK_LONG_ABOUT)]
    Break(BreakArgs),
    /// Change the capacity of the semaphore on RESOURCE to N; its holders keep their permits.
    #[command(long_about = CAPACITY_LONG_ABOUT, allow_missing_positional = true)]
    Capacity(CapacityArgs),
    /// Tell the fencing story on an ephemeral local redis-server (or on --redis URL).
    #[command(long_about = DEMO_LONG_ABOUT)]
    Demo,
    /// Print a shell completion script: `leasehold completions bash > /etc/bash_completion.d/leasehold`.
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print a man page (roff): `leasehold man > /usr/local/share/man/man1/leasehold.1`, and
    /// `leasehold man run > /usr/local/share/man/man1/leasehold-run.1` for a subcommand's.
    Man {
        /// The subcommand whose page to print, leasehold-COMMAND(1); without one, leasehold(1).
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(MAN_PAGES))]
        command: Option<String>,
    },
}

/// The subcommands with a man page of their own: every one but `help`, as the top-level
/// page lists them (a test checks the two agree).
pub(crate) const MAN_PAGES: [&str; 8] = [
    "run",
    "inspect",
    "list",
    "break",
    "capacity",
    "demo",
    "completions",
    "man",
];

/// A man page: clap_mangen's, from the same definitions as `--help`, with an EXAMPLES section
/// of its own (clap_mangen would fill `run --help`'s examples into one paragraph).
pub(crate) struct ManPage {
    man: clap_mangen::Man,
    examples: Option<&'static str>,
}

impl std::fmt::Debug for ManPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManPage")
            .field("examples", &self.examples.is_some())
            .finish_non_exhaustive()
    }
}

impl ManPage {
    /// Writes the page (roff) to `w`: EXAMPLES, when the page has them, before VERSION.
    pub(crate) fn render(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        let mut page = Vec::new();
        self.man.render(&mut page)?;
        let Some(examples) = self.examples else {
            return w.write_all(&page);
        };
        let page = String::from_utf8_lossy(&page);
        let section = examples_section(examples);
        let at = page.find("\n.SH VERSION").map_or(page.len(), |at| at + 1);
        w.write_all(page[..at].as_bytes())?;
        w.write_all(section.as_bytes())?;
        w.write_all(page[at..].as_bytes())
    }
}

/// `examples` as a roff section, line for line (`.nf`), escaped so that roff neither reads a
/// line as a request nor prints a flag's `-` as a hyphen that cannot be pasted.
fn examples_section(examples: &str) -> String {
    let mut section = String::from(".SH EXAMPLES\n.nf\n");
    for line in examples.lines() {
        let escaped = line.replace('\\', "\\e").replace('-', "\\-");
        if escaped.starts_with(['.', '\'']) {
            section.push_str("\\&");
        }
        section.push_str(&escaped);
        section.push('\n');
    }
    section.push_str(".fi\n");
    section
}

/// The man page of `leasehold` (`None`) or of one of its subcommands, from the same
/// definitions as `--help`; `help` is left out of the pages, which list the subcommands.
pub(crate) fn man_page(subcommand: Option<&str>) -> Option<ManPage> {
    let top = command()
        .mut_subcommand("help", |help| help.hide(true))
        // The examples get a section of their own: the exit codes alone stay in EXTRA.
        .mut_subcommand("run", |run| run.after_long_help(exit::TABLE));
    let page = match subcommand {
        None => top,
        Some(name) => top
            .find_subcommand(name)
            .filter(|page| !page.is_hide_set())?
            .clone(),
    };
    let examples = matches!(subcommand, None | Some("run")).then_some(RUN_EXAMPLES);
    // The footer names the program and its version on every page, not the subcommand.
    let man = clap_mangen::Man::new(page).source(concat!("leasehold ", env!("CARGO_PKG_VERSION")));
    Some(ManPage { man, examples })
}

const RUN_LONG_ABOUT: &str = "\
Run a command while holding a lease on RESOURCE.

leasehold acquires the lease (waiting up to --wait), starts the command with these variables in
its environment:

  LEASEHOLD_FENCE            the fencing token of this grant: a decimal up to 2^63-1 (store it
                             as a 64-bit BIGINT); pass it to every write
  LEASEHOLD_SLOT             with --capacity only: the permit's slot, 0 to N-1 (a fence orders
                             the grants of one slot: a target keeps the highest fence per slot)
  LEASEHOLD_RESOURCE_DIGEST  the resource's digest (sha256:...), as stored in Redis
  LEASEHOLD_TTL_MS           the lease's TTL in milliseconds

and renews the lease while the command runs. SIGHUP, SIGINT, SIGQUIT and SIGTERM sent to
leasehold are passed on to the command. The first SIGINT or SIGTERM asks it to stop: if it has
not exited after --grace, it gets SIGKILL, and a second SIGINT or SIGTERM sends SIGKILL at
once (for a command that ignores SIGTERM). If the lease is lost, or its validity is about to
end because renewals fail, leasehold sends SIGTERM to the command and SIGKILL after --grace,
but never later than just before the lease's validity ends: the command is dead before anyone
else can be granted the lease. When the command exits, whatever it left running in its process
group gets SIGTERM, and SIGKILL after --grace (capped the same way), while the lease is still
kept; then the lease is released. A release leasehold cannot confirm (Redis down or not answering) is reported, and
proves nothing either way: the lease may then still be held, at most until its TTL runs out,
or may already be gone.

The grant carries a holder name (--holder, by default <hostname>:<pid>), which `inspect` shows
and a refused run prints. It is public text, not a secret.

With --hold-at-least D, the lease is kept at least D after it was granted (by Redis's clock),
even if the command exits sooner or leasehold dies, unless Redis loses the key itself (a
restart without persistence, a flush, an eviction): until then every other run is refused (exit
75). For a run-once job started on several hosts whose clocks differ, a D above the skew makes
it run once per schedule tick. D only keeps the key: the command is still stopped when the
lease's TTL runs out unrenewed.

With --capacity N, the run holds one permit of the counting semaphore of N on RESOURCE (consul
lock -n): at most N runs at once, each on its own slot with its own fence, kept alive, stopped
and released exactly as a lease is. Waiters (--wait) are served first come, first served across
hosts, and a waiter that dies stops blocking the queue within --queue-heartbeat. The capacity is
recorded by the first run; a run that asks for another is refused (exit 78) and writes nothing.
A semaphore and a lease of one name are separate.

The command runs in its own process group, and signals go to the whole group, so that stopping
it also stops whatever it started. It is meant for non-interactive commands.";

const INSPECT_LONG_ABOUT: &str = "\
Print who holds the lease on RESOURCE: held (fence, time left, holder fingerprint and name) or
free. A lease released before its minimum hold (`run --hold-at-least`) ended is shown as held,
kept after release until the hold ends.

The holder is a fingerprint of its owner token (16 hex digits), never the token itself, and the
name the holder gave (`run --holder`), if any.
With --json, prints one object:
  {\"state\":\"held\"|\"free\",\"fence\":N|null,\"remaining_ms\":N|null,\"holder\":\"...\"|null}
and, when the holder gave a name or the lease is kept after release, two more keys:
  \"holder_name\":\"...\"|null,\"released\":true|false

With --semaphore, the semaphore of that name (`run --capacity`) instead: its capacity, its width
(above the capacity while permits on higher slots outlive a lowering), the waiters whose place
in its queue is live, and each held slot with its fence, time left and holder. With --json:
  {\"state\":\"held\"|\"free\",\"capacity\":N|null,\"width\":N|null,\"waiting\":N,
   \"permits\":[{\"slot\":N, and the keys above for that slot's grant}],\"purpose\":\"...\"}
(\"free\": no permit held; capacity and width null: no semaphore, or its record was lost.)

Exit status: 0 held or free, 69 Redis unavailable or no answer, 2 usage or configuration
error (a bad flag or URL, a database the server lacks, credentials it refuses).";

const LIST_LONG_ABOUT: &str = "\
List the leases held in the namespace (--namespace), of every purpose or of --purpose P: the
purpose, the resource's digest (the raw name is never stored), the fence, the time left and
the holder (fingerprint and name); and the permits of semaphores (`run --capacity`), one row
per held slot, with its SLOT. Keys are found with SCAN, never KEYS, so a large key space
does not block the server; on a Cluster every master is scanned. Not a snapshot: a lease
granted or released during the walk may or may not be shown.

With --json, prints one array of objects, each:
  {\"purpose\":\"...\",\"resource\":\"sha256:...\",\"state\":\"held\",\"fence\":N|null,
   \"remaining_ms\":N|null,\"holder\":\"...\"|null,\"holder_name\":\"...\"|null,
   \"released\":true|false,\"kind\":\"lease\"|\"semaphore\",\"slot\":N|null}
(a key leasehold cannot use: \"state\":\"unusable\",\"problem\":\"...\" instead of fence to
released.)

Exit status: 0 listed (even none), 69 Redis unavailable or no answer, 2 usage or
configuration error (a bad flag or URL, a database the server lacks, credentials it refuses).";

const BREAK_LONG_ABOUT: &str = "\
Remove the lease on RESOURCE (or on --digest sha256:..., as `list` shows it), whoever holds it:
for a holder that is gone while its lease is long, or kept by --hold-at-least. Only the lease
is deleted: the fence counter stays, so the next grant's fence is higher and the old holder's
late writes, fenced, are still rejected. Waiters are woken as by a release.

The old holder is not told: `leasehold run` finds the lease gone at its next renewal (within
a third of its TTL) and stops its command then (exit 70). Until then it may still be working,
which is why writes must carry the fence.

With --slot K, the permit held on slot K of the semaphore of that name (`run --capacity`,
as `inspect --semaphore` shows it) instead, the same way: only that slot's key is deleted, the
semaphore's fence counter stays, its waiters are woken, and its old holder finds it gone at
its next renewal.

Prints what it removed (holder, fence, time left), or that there was nothing to remove.
With --json, prints one object: {\"removed\":true|false, and inspect's keys} (and, with
--slot, \"slot\":K last).

Exit status: 0 removed or nothing to remove, 69 Redis unavailable, or no answer (it may have
been removed: `inspect` tells), 65 the key holds something else (left alone), 2 usage or
configuration error (no --yes, a bad URL, a database the server lacks, credentials it refuses).";

const CAPACITY_LONG_ABOUT: &str = "\
Change the capacity of the semaphore on RESOURCE (or on --digest sha256:..., as `list` shows
it) to N, from 1 to 1024, evicting no holder: after a lowering, the holders of slots N and
above keep them, and nobody new is admitted until fewer than N permits are held; after a
growth, its waiters are told to try again at once.

From then on every run of the semaphore must ask for --capacity N: one that asks for another,
a waiter's next try included, is refused (exit 78) and writes nothing. With no semaphore of
that name, the record is made, and the first permits must ask for N. The record lives as long
after its last use as one an acquire made (the fence counters' idle expiry, 7 days).

Prints the capacity before and after, and how many permits are held. With --json, prints one
object:
  {\"previous\":N|null,\"capacity\":N,\"width\":N,\"held\":N,\"woke_waiters\":true|false,
   \"purpose\":\"...\"}

Exit status: 0 set, 69 Redis unavailable, or no answer (it may have been set: `inspect
--semaphore` tells), 65 the record or the queue holds something else (left alone), 2 usage or
configuration error (a bad N or URL, a database the server lacks, credentials it refuses).";

const DEMO_LONG_ABOUT: &str = "\
Tell the fencing story: worker A acquires a lease and stalls past its expiry, worker B acquires
the next fence and writes to an `orders` table in an in-memory SQLite database, and A's stale
write, when it wakes, changes no row.

Without --redis on the command line, starts its own redis-server (from LEASEHOLD_REDIS_SERVER or
PATH) on a free port in a temporary directory, and stops it at the end; LEASEHOLD_REDIS_URL is
ignored, so the demo never writes to a server you did not name.

Exit status: 0 the story ran, 69 no redis-server could be started or reached, 2 usage or
configuration error (a bad --redis URL, a database the server lacks, credentials it refuses),
1 otherwise.";

/// `leasehold run`. Durations and exit codes stay text here: [`crate::config`] parses them,
/// so that a bad value names the flag or the variable it came from.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The resource to lease, by its raw name (hashed before it is sent).
    #[arg(value_name = "RESOURCE")]
    pub(crate) resource: OsString,

    /// Why the resource is leased ([a-z0-9._-], at most 64 bytes); part of the key.
    #[arg(
        long,
        value_name = "P",
        env = "LEASEHOLD_PURPOSE",
        default_value = crate::config::CLI_PURPOSE
    )]
    pub(crate) purpose: String,

    /// Lease time to live, renewed while the command runs (e.g. 500ms, 2s, 1m, or seconds).
    #[arg(long, value_name = "D", env = "LEASEHOLD_TTL", default_value = "30s")]
    pub(crate) ttl: String,

    /// How long to wait for the lease if another holder has it (0s: try once; inf: as long as
    /// it takes).
    #[arg(long, value_name = "D", env = "LEASEHOLD_WAIT", default_value = "0s")]
    pub(crate) wait: String,

    /// A name for this holder, shown by `inspect` and to runs refused the lease (at most 128
    /// bytes, no control characters) [default: <hostname>:<pid>].
    #[arg(long, value_name = "NAME", env = "LEASEHOLD_HOLDER")]
    pub(crate) holder: Option<String>,

    /// Keep the lease at least this long after the grant, even if the command exits sooner or
    /// leasehold dies (e.g. 5m), so that a run-once job started on several hosts runs once.
    #[arg(long, value_name = "D", env = "LEASEHOLD_HOLD_AT_LEAST")]
    pub(crate) hold_at_least: Option<String>,

    /// Hold one permit of the counting semaphore of N on RESOURCE instead of the lease: at most
    /// N runs hold one at once (1 to 1024), each with its slot in LEASEHOLD_SLOT; every run of
    /// the semaphore must ask for the capacity it has (`leasehold capacity` changes it).
    #[arg(long, value_name = "N", env = "LEASEHOLD_CAPACITY")]
    pub(crate) capacity: Option<String>,

    /// With --capacity and --wait: how long a waiter's place in the semaphore's queue outlives
    /// its last try (it tries three times as often), so that a waiter that dies blocks the
    /// queue no longer than this (100ms to 1m) [default: 3s].
    #[arg(long, value_name = "D", env = "LEASEHOLD_QUEUE_HEARTBEAT")]
    pub(crate) queue_heartbeat: Option<String>,

    /// Time between SIGTERM and SIGKILL when the lease is lost, or for what the command leaves
    /// running when it exits (capped by what is left of the lease); and after a SIGINT or
    /// SIGTERM sent to leasehold (a second one kills at once).
    #[arg(long, value_name = "D", env = "LEASEHOLD_GRACE", default_value = "5s")]
    pub(crate) grace: String,

    /// Exit status when another holder has the lease (not acquired within --wait): 0 makes a
    /// skipped run a success, as flock -E 0 does [default: 75].
    #[arg(long, value_name = "N", env = "LEASEHOLD_CONFLICT_EXIT_CODE")]
    pub(crate) conflict_exit_code: Option<String>,

    /// Exit status when the lease was lost while the command ran, or ended before it did
    /// (pick one the command itself never uses) [default: 70].
    #[arg(long, value_name = "N", env = "LEASEHOLD_LOSS_EXIT_CODE")]
    pub(crate) loss_exit_code: Option<String>,

    /// At the end, write one JSON object as the last line of stdout (after the command's own
    /// output; messages stay on stderr): outcome, exit status, fence, time waited and held, and
    /// the release's outcome.
    #[arg(long, env = "LEASEHOLD_JSON")]
    pub(crate) json: bool,

    /// The command to run and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

/// A lease named on the command line: its resource, by raw name or by digest, and purpose.
#[derive(Debug, Args)]
pub(crate) struct LeaseName {
    /// The resource, by its raw name (hashed before it is sent).
    #[arg(value_name = "RESOURCE", required_unless_present = "digest")]
    pub(crate) resource: Option<OsString>,

    /// The resource by its digest, as `list` shows it, instead of its name.
    #[arg(long, value_name = "sha256:HEX", conflicts_with = "resource")]
    pub(crate) digest: Option<String>,

    /// The purpose the lease was taken for [default: cli, the purpose of `run`; `inspect` then
    /// looks under the library's defaults too: lock (`lock`, `run`) and election].
    #[arg(long, value_name = "P", env = "LEASEHOLD_PURPOSE")]
    pub(crate) purpose: Option<String>,
}

/// `leasehold inspect`.
#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    #[command(flatten)]
    pub(crate) lease: LeaseName,

    /// The semaphore of that name (`run --capacity`) instead of the lease: its capacity, each
    /// held slot and the waiters.
    #[arg(long)]
    pub(crate) semaphore: bool,

    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `leasehold list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only the leases taken for this purpose [default: every purpose].
    #[arg(long, value_name = "P", env = "LEASEHOLD_PURPOSE")]
    pub(crate) purpose: Option<String>,

    /// Print one JSON array instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `leasehold break`.
#[derive(Debug, Args)]
pub(crate) struct BreakArgs {
    #[command(flatten)]
    pub(crate) lease: LeaseName,

    /// The permit on slot K of the semaphore of that name (as `inspect --semaphore` shows it)
    /// instead of the lease.
    #[arg(long, value_name = "K")]
    pub(crate) slot: Option<String>,

    /// Do it: without --yes, nothing is sent.
    #[arg(long)]
    pub(crate) yes: bool,

    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `leasehold capacity`. N stays text here: [`crate::config`] parses it.
#[derive(Debug, Args)]
pub(crate) struct CapacityArgs {
    #[command(flatten)]
    pub(crate) lease: LeaseName,

    /// The new capacity, from 1 to 1024 (after --digest D, alone).
    #[arg(value_name = "N")]
    pub(crate) capacity: String,

    /// Print one JSON object instead of a sentence.
    #[arg(long)]
    pub(crate) json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
        command().debug_assert();
    }

    #[test]
    fn every_subcommand_but_help_has_a_man_page() {
        let top = command();
        let mut listed: Vec<&str> = top
            .get_subcommands()
            .map(clap::Command::get_name)
            .filter(|name| *name != "help")
            .collect();
        listed.sort_unstable();
        let mut pages = MAN_PAGES;
        pages.sort_unstable();
        assert_eq!(listed, pages);
        for name in MAN_PAGES {
            assert!(man_page(Some(name)).is_some(), "{name}");
        }
        assert!(man_page(Some("help")).is_none());
    }

    #[test]
    fn run_takes_the_command_after_the_separator() {
        let cli = Cli::try_parse_from([
            "leasehold",
            "run",
            "orders/42",
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run");
        };
        assert_eq!(run.resource, "orders/42");
        assert_eq!(run.ttl, "2s");
        assert_eq!(run.wait, "0s");
        assert_eq!(run.grace, "5s");
        assert_eq!(run.conflict_exit_code, None);
        assert_eq!(run.loss_exit_code, None);
        assert_eq!(run.purpose, "cli");
        assert_eq!(run.command, ["sh", "-c", "exit 3"]);
    }

    #[test]
    fn run_takes_a_holder_name_and_a_minimum_hold() {
        let cli = Cli::try_parse_from([
            "leasehold",
            "run",
            "r",
            "--holder",
            "host-3",
            "--hold-at-least",
            "1m 30s",
            "--",
            "true",
        ])
        .unwrap();
        let Command::Run(run) = cli.command else {
            panic!("not run");
        };
        assert_eq!(run.holder.as_deref(), Some("host-3"));
        assert_eq!(run.hold_at_least.as_deref(), Some("1m 30s"));
    }

    #[test]
    fn capacity_takes_a_name_and_n_or_a_digest_and_n() {
        let parse = |argv: &[&str]| {
            let mut full = vec!["leasehold", "capacity"];
            full.extend_from_slice(argv);
            match Cli::try_parse_from(full).map(|cli| cli.command) {
                Ok(Command::Capacity(args)) => Ok(args),
                Ok(other) => panic!("{other:?}"),
                Err(e) => Err(e.kind()),
            }
        };
        let named = parse(&["exports", "4"]).unwrap();
        assert_eq!(named.lease.resource.as_deref(), Some("exports".as_ref()));
        assert_eq!(named.capacity, "4");
        let digested = parse(&["--digest", "sha256:00", "4"]).unwrap();
        assert_eq!(digested.lease.resource, None);
        assert_eq!(digested.lease.digest.as_deref(), Some("sha256:00"));
        assert_eq!(digested.capacity, "4");
        assert!(parse(&["exports"]).is_err(), "no N");
        assert!(parse(&["--digest", "sha256:00", "exports", "4"]).is_err());
    }

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() {
        for argv in [
            &["leasehold", "--namespace", "ns1", "inspect", "r"][..],
            &["leasehold", "inspect", "r", "--namespace", "ns1"][..],
        ] {
            let cli = Cli::try_parse_from(argv).unwrap();
            assert_eq!(cli.namespace, "ns1");
        }
    }
}
