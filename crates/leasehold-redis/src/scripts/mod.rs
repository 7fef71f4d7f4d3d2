//! The scripts in `lua/`, loaded once, and one typed call per script.
//!
//! A script's contract (its KEYS and ARGV, in order) is written twice: in Lua, in the header
//! that opens the script, and in Rust, as the fields of the script's call struct, declared
//! once with `script_call!`. The macro turns that one field list into the invocation
//! (numkeys, every key, then one argument per field, in declaration order), so no other code
//! counts arguments, and into the field names a unit test checks against the header: the same
//! count, the same order, the same names. Each call also names its reply decoder in
//! `decode.rs`.
//!
//! A call holds the owner token and, for a fenced write, the caller's data: it has no `Debug`,
//! so that neither can end up in a log.

use std::io::Write as _;

use leasehold::FenceToken;
use redis::Cmd;

/// A lease script: its source and SHA-1 (what EVALSHA names it by).
#[derive(Debug)]
pub(crate) struct LeaseScript {
    pub(crate) name: &'static str,
    pub(crate) script: redis::Script,
    pub(crate) source: &'static str,
}

impl LeaseScript {
    fn new(name: &'static str, source: &'static str) -> Self {
        Self {
            name,
            script: redis::Script::new(source),
            source,
        }
    }

    /// Returns the script's SHA-1 in hex.
    pub(crate) fn sha(&self) -> &str {
        self.script.get_hash()
    }
}

/// One run of one script, with its keys and arguments.
pub(crate) trait ScriptCall {
    /// The keys' field names, in KEYS order.
    const KEYS: &'static [&'static str];
    /// The arguments' field names, in ARGV order.
    const ARGV: &'static [&'static str];

    /// Returns the script this call runs, loaded once.
    fn script() -> &'static LeaseScript;

    /// Appends numkeys, the keys and the arguments, in the header's order.
    fn push_args(&self, cmd: &mut Cmd);

    /// The bytes of the keys and arguments, closely: what a command buffer is sized for.
    fn args_len(&self) -> usize;

    /// Returns the `EVALSHA` that runs this call.
    fn evalsha(&self) -> Cmd {
        // Sized once for the command's words, so that writing them does not reallocate on
        // the hot path (and no larger, since many renewals may be in flight at once).
        let words = 3 + Self::KEYS.len() + Self::ARGV.len();
        let sha = Self::script().sha().len();
        let mut cmd = Cmd::with_capacity(words, "EVALSHA".len() + sha + 2 + self.args_len());
        cmd.arg("EVALSHA");
        cmd.arg(Self::script().sha());
        self.push_args(&mut cmd);
        cmd
    }

    /// Returns the `EVAL` that runs this call with the script's whole source.
    fn eval(&self) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(Self::script().source);
        self.push_args(&mut cmd);
        cmd
    }
}

/// A value that is exactly one ARGV entry, in the encoding the scripts expect.
///
/// Only the types the scripts take have one. redis-rs's `ToRedisArgs` is not used instead: it
/// writes nothing for `None`, and a missing argument would shift every later one.
pub(crate) trait ScriptArg {
    /// Appends this value as one argument.
    fn push_to(&self, cmd: &mut Cmd);

    /// How many bytes the argument takes, at most.
    fn len_hint(&self) -> usize;

    /// Whether this is the value a script reads a missing optional argument as (`0`, `""`,
    /// `false`). Only a call's `OPTIONAL` arguments are ever left out for it; a type without a
    /// default is always sent.
    fn is_default(&self) -> bool {
        false
    }
}

impl ScriptArg for &str {
    fn push_to(&self, cmd: &mut Cmd) {
        cmd.arg(*self);
    }
    fn len_hint(&self) -> usize {
        self.len()
    }
    fn is_default(&self) -> bool {
        self.is_empty()
    }
}

impl ScriptArg for &[u8] {
    fn push_to(&self, cmd: &mut Cmd) {
        cmd.arg(*self);
    }
    fn len_hint(&self) -> usize {
        self.len()
    }
}

impl ScriptArg for u64 {
    fn push_to(&self, cmd: &mut Cmd) {
        cmd.arg(*self);
    }
    fn len_hint(&self) -> usize {
        20
    }
    fn is_default(&self) -> bool {
        *self == 0
    }
}

/// A fence, in decimal.
impl ScriptArg for FenceToken {
    fn push_to(&self, cmd: &mut Cmd) {
        cmd.arg(self.get());
    }
    fn len_hint(&self) -> usize {
        19
    }
}

/// An attempt as the scripts take it, in one argument: `<owner token>:<operation id>`.
///
/// One argument, not two: each costs the server a string made in Lua. The token is Base64URL
/// and never holds `:`, so the first `:` ends it. It holds the owner token: no `Debug`.
#[derive(Clone, Copy)]
pub(crate) struct AttemptArg<'a> {
    pub(crate) owner_token: &'a str,
    pub(crate) operation_id: &'a str,
}

impl<'a> AttemptArg<'a> {
    /// The argument for `attempt`.
    pub(crate) fn of(attempt: &'a leasehold::Attempt) -> Self {
        Self {
            owner_token: attempt.owner_token().expose_secret(),
            operation_id: attempt.operation().as_str(),
        }
    }

    fn write(&self, to: &mut impl std::io::Write) {
        // Writing into a command's buffer cannot fail.
        let _ = to.write_all(self.owner_token.as_bytes());
        let _ = to.write_all(b":");
        let _ = to.write_all(self.operation_id.as_bytes());
    }
}

impl ScriptArg for AttemptArg<'_> {
    fn push_to(&self, cmd: &mut Cmd) {
        self.write(&mut redis::RedisWrite::writer_for_next_arg(cmd));
    }
    fn len_hint(&self) -> usize {
        self.owner_token.len() + 1 + self.operation_id.len()
    }
}

/// A grant as the scripts take it, in one argument: `<fence>:<owner token>:<operation id>`,
/// exactly the grant at the start of the stored value; with no fence (`None`),
/// `:<owner token>:<operation id>`, whatever fence the attempt's grant carries. No `Debug`.
#[derive(Clone, Copy)]
pub(crate) struct GrantArg<'a> {
    pub(crate) fence: Option<FenceToken>,
    pub(crate) attempt: AttemptArg<'a>,
}

impl ScriptArg for GrantArg<'_> {
    fn push_to(&self, cmd: &mut Cmd) {
        let mut arg = redis::RedisWrite::writer_for_next_arg(cmd);
        if let Some(fence) = self.fence {
            // Writing into a command's buffer cannot fail.
            let _ = write!(arg, "{}", fence.get());
        }
        let _ = arg.write_all(b":");
        self.attempt.write(&mut arg);
    }
    fn len_hint(&self) -> usize {
        20 + self.attempt.len_hint()
    }
}

/// A flag, as `"1"` or `"0"`.
impl ScriptArg for bool {
    fn push_to(&self, cmd: &mut Cmd) {
        cmd.arg(if *self { "1" } else { "0" });
    }
    fn len_hint(&self) -> usize {
        1
    }
    fn is_default(&self) -> bool {
        !*self
    }
}

/// Declares the call struct of `lua/<file>.lua`: its keys (owned strings) and arguments, in
/// the header's order and named as the header names them, and its [`ScriptCall`] impl.
///
/// `OPTIONAL` arguments follow the others in ARGV, and are sent only up to the last one that
/// is not its default ([`ScriptArg::is_default`]); the script reads a missing one as that
/// default. A lease with neither a hold nor a holder name then sends two arguments fewer, and
/// each argument costs the server a string made in Lua.
macro_rules! script_call {
    (
        $(#[$doc:meta])*
        struct $name:ident $(<$lt:lifetime>)? runs $file:literal {
            KEYS { $($key:ident),+ $(,)? }
            ARGV { $($arg:ident: $ty:ty),+ $(,)? }
            $(OPTIONAL { $($opt:ident: $opt_ty:ty),+ $(,)? })?
        }
    ) => {
        $(#[$doc])*
        pub(crate) struct $name $(<$lt>)? {
            $(pub(crate) $key: String,)+
            $(pub(crate) $arg: $ty,)+
            $($(pub(crate) $opt: $opt_ty,)+)?
        }

        impl<$($lt)?> $crate::scripts::ScriptCall for $name<$($lt)?> {
            const KEYS: &'static [&'static str] = &[$(stringify!($key)),+];
            const ARGV: &'static [&'static str] =
                &[$(stringify!($arg),)+ $($(stringify!($opt),)+)?];

            fn script() -> &'static $crate::scripts::LeaseScript {
                static SCRIPT: std::sync::LazyLock<$crate::scripts::LeaseScript> =
                    std::sync::LazyLock::new(|| {
                        $crate::scripts::LeaseScript::new(
                            $file,
                            include_str!(concat!("../../lua/", $file, ".lua")),
                        )
                    });
                &SCRIPT
            }

            fn push_args(&self, cmd: &mut redis::Cmd) {
                cmd.arg(Self::KEYS.len());
                $(cmd.arg(&self.$key);)+
                $($crate::scripts::ScriptArg::push_to(&self.$arg, cmd);)+
                $(
                    let optional: &[&dyn $crate::scripts::ScriptArg] = &[$(&self.$opt),+];
                    let sent = optional
                        .iter()
                        .rposition(|arg| !arg.is_default())
                        .map_or(0, |last| last + 1);
                    for arg in &optional[..sent] {
                        arg.push_to(cmd);
                    }
                )?
            }

            fn args_len(&self) -> usize {
                0 $(+ self.$key.len())+
                    $(+ $crate::scripts::ScriptArg::len_hint(&self.$arg))+
                    $($(+ $crate::scripts::ScriptArg::len_hint(&self.$opt))+)?
            }
        }
    };
}

mod acquire;
mod batch;
mod break_lease;
mod fenced_write;
mod inspect;
mod release;
mod renew;
mod semaphore;
mod semaphore_admin;
mod watch;

pub(crate) use acquire::AcquireCall;
pub(crate) use batch::{AcquireEntry, BatchCall, BatchEntry, ReleaseEntry};
pub(crate) use break_lease::BreakCall;
pub(crate) use fenced_write::FencedWriteCall;
pub(crate) use inspect::InspectCall;
pub(crate) use release::ReleaseCall;
pub(crate) use renew::{RenewCall, RenewGrant};
pub(crate) use semaphore::{
    RwAcquireCall, RwDowngradeCall, SemaphoreAcquireCall, SemaphoreReleaseCall,
};
pub(crate) use semaphore_admin::{
    CapacitySet, SemaphoreCapacityCall, SemaphoreInspectCall, SemaphoreRead,
};
pub(crate) use watch::WatchCall;

/// Every script, for warm-up: the four lease scripts, an observer's watch, the fenced write,
/// an operator's break, a semaphore's acquire and release, a read/write lease's acquire and
/// downgrade, then an operator's semaphore inspect and capacity change.
pub(crate) fn all() -> [&'static LeaseScript; 13] {
    [
        AcquireCall::script(),
        RenewCall::script(),
        ReleaseCall::script(),
        InspectCall::script(),
        WatchCall::script(),
        FencedWriteCall::script(),
        BreakCall::script(),
        SemaphoreAcquireCall::script(),
        SemaphoreReleaseCall::script(),
        RwAcquireCall::script(),
        RwDowngradeCall::script(),
        SemaphoreInspectCall::script(),
        SemaphoreCapacityCall::script(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `-- KEYS[n]` (or `-- ARGV[n]`) lines of a script's header, as (n, description).
    fn header(source: &str, table: &str) -> Vec<(usize, String)> {
        let open = format!("{table}[");
        source
            .lines()
            .take_while(|line| line.starts_with("--") || line.starts_with("#!"))
            .filter_map(|line| {
                let entry = line
                    .trim_start_matches('-')
                    .trim_start()
                    .strip_prefix(&open)?;
                let (index, description) = entry.split_once(']')?;
                Some((index.parse().ok()?, description.trim().to_owned()))
            })
            .collect()
    }

    /// The indices `table[n]` the script's code (not its header) reads.
    fn used(source: &str, table: &str) -> Vec<usize> {
        let code: String = source
            .lines()
            .skip_while(|line| line.starts_with("--") || line.starts_with("#!"))
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let open = format!("{table}[");
        let mut used: Vec<usize> = code
            .match_indices(&open)
            .filter_map(|(at, _)| {
                let rest = &code[at + open.len()..];
                rest[..rest.find(']')?].parse().ok()
            })
            .collect();
        used.sort_unstable();
        used.dedup();
        used
    }

    /// Tells how `source`'s header for `table` differs from a call's `fields`, if it does: it
    /// must list exactly those entries, in order, each description opening with the field's
    /// name (`fence_counter_key` names "fence counter key …"), and the code must read exactly
    /// the entries the header lists.
    fn mismatch(source: &str, table: &str, fields: &[&str]) -> Option<String> {
        if let Some(named) = misnamed(source, table, fields) {
            return Some(named);
        }
        let expected: Vec<usize> = (1..=fields.len()).collect();
        let read = used(source, table);
        if read != expected {
            return Some(format!(
                "the code reads {table} {read:?}, the header lists {expected:?}"
            ));
        }
        None
    }

    /// The first half of [`mismatch`]: the header lists exactly the call's fields, in order,
    /// each named as the field. For a script whose entries repeat per entry, read in a loop
    /// by index arithmetic, [`check_repeated`] adds [`unlisted`] to it.
    fn misnamed(source: &str, table: &str, fields: &[&str]) -> Option<String> {
        let entries = header(source, table);
        let listed: Vec<usize> = entries.iter().map(|(n, _)| *n).collect();
        let expected: Vec<usize> = (1..=fields.len()).collect();
        if listed != expected {
            return Some(format!(
                "the header lists {table} {listed:?}, the call has {fields:?}"
            ));
        }
        for ((n, description), field) in entries.iter().zip(fields) {
            let name = field.replace('_', " ");
            let lowercase = description.to_lowercase();
            let names_it = lowercase
                .strip_prefix(&name)
                .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric() || c == '_'));
            if !names_it {
                return Some(format!(
                    "{table}[{n}] is {description:?}, but the call's field {n} is `{field}`"
                ));
            }
        }
        None
    }

    fn check<C: ScriptCall>() {
        let script = C::script();
        for (table, fields) in [("KEYS", C::KEYS), ("ARGV", C::ARGV)] {
            if let Some(mismatch) = mismatch(script.source, table, fields) {
                panic!("lua/{}.lua: {mismatch}", script.name);
            }
        }
    }

    /// Tells which entries the code of a script read in a loop (by index arithmetic) reads by
    /// a literal index that its header does not list, if any; an optional argument of the
    /// single call is read so.
    fn unlisted(source: &str, table: &str, fields: &[&str]) -> Option<String> {
        let unlisted: Vec<usize> = used(source, table)
            .into_iter()
            .filter(|n| !(1..=fields.len()).contains(n))
            .collect();
        (!unlisted.is_empty())
            .then(|| format!("the code reads {table} {unlisted:?}, which the header does not list"))
    }

    /// [`check`] for a script whose keys and arguments repeat once per entry, read in a loop:
    /// the header names them as [`misnamed`] says, and [`unlisted`] finds nothing.
    fn check_repeated<C: ScriptCall>() {
        let script = C::script();
        for (table, fields) in [("KEYS", C::KEYS), ("ARGV", C::ARGV)] {
            let found = misnamed(script.source, table, fields)
                .or_else(|| unlisted(script.source, table, fields));
            if let Some(mismatch) = found {
                panic!("lua/{}.lua: {mismatch}", script.name);
            }
        }
    }

    #[test]
    fn each_header_lists_its_calls_keys_and_arguments_in_order() {
        check_repeated::<AcquireCall<'_>>();
        check_repeated::<RenewCall<'_>>();
        check_repeated::<ReleaseCall<'_>>();
        check::<InspectCall<'_>>();
        check::<WatchCall<'_>>();
        check::<FencedWriteCall<'_>>();
        check::<BreakCall>();
        check::<SemaphoreAcquireCall<'_>>();
        check::<SemaphoreReleaseCall<'_>>();
        check::<RwAcquireCall<'_>>();
        check::<RwDowngradeCall<'_>>();
        check::<SemaphoreInspectCall>();
        check::<SemaphoreCapacityCall<'_>>();
    }

    /// The check tells a header that drifted from its call: swapped, missing, unnamed or
    /// unread entries, and code that reads an entry the header does not list.
    #[test]
    fn a_header_that_drifted_is_caught() {
        let good = "#!lua\n-- KEYS[1]  lease key\n-- ARGV[1]  owner token   Base64URL\n\
                    -- ARGV[2]  operation id\n--          (continued)\n\
                    return {KEYS[1], ARGV[1], ARGV[2]} -- not ARGV[3]";
        let fields = ["owner_token", "operation_id"];
        assert_eq!(mismatch(good, "KEYS", &["lease_key"]), None);
        assert_eq!(mismatch(good, "ARGV", &fields), None);
        assert!(mismatch(good, "ARGV", &["operation_id", "owner_token"]).is_some());
        assert!(mismatch(good, "ARGV", &["owner_token"]).is_some());
        assert!(mismatch(good, "ARGV", &["owner_token", "operation_id", "ttl"]).is_some());
        assert!(mismatch(good, "ARGV", &["owner_id", "operation_id"]).is_some());
        assert!(mismatch(good, "KEYS", &["lease_key", "fence_counter_key"]).is_some());
        let unnamed = good.replace("ARGV[2]  operation id", "ARGV[2]  \"\" or an id");
        assert!(mismatch(&unnamed, "ARGV", &fields).is_some());
        let reads_more = good.replace("ARGV[2]}", "ARGV[2], ARGV[3]}");
        assert!(mismatch(&reads_more, "ARGV", &fields).is_some());
        let reads_less = good.replace(", ARGV[2]}", "}");
        assert!(mismatch(&reads_less, "ARGV", &fields).is_some());
        // In a loop, reads by index arithmetic are not counted; a literal one must be listed.
        let looped = good.replace(
            "{KEYS[1], ARGV[1], ARGV[2]}",
            "{KEYS[i], ARGV[2 * i], ARGV[2]}",
        );
        assert_eq!(unlisted(&looped, "KEYS", &["lease_key"]), None);
        assert_eq!(unlisted(&looped, "ARGV", &fields), None);
        let reads_unlisted = looped.replace("ARGV[2]}", "ARGV[3]}");
        assert!(unlisted(&reads_unlisted, "ARGV", &fields).is_some());
    }

    #[test]
    fn every_script_in_lua_has_a_call_and_is_warmed_up() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/lua");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("lua/")
            .map(|entry| {
                entry
                    .expect("lua/ entry")
                    .file_name()
                    .into_string()
                    .expect("name")
            })
            .filter(|name| name.ends_with(".lua"))
            .collect();
        files.sort();
        // The watch form of inspect.lua has no file of its own.
        let mut warmed: Vec<String> = all()
            .iter()
            .filter(|s| s.name != WatchCall::script().name)
            .map(|s| format!("{}.lua", s.name))
            .collect();
        warmed.sort();
        assert_eq!(files, warmed);
        let read = |name: &str| {
            std::fs::read_to_string(format!("{dir}/{name}.lua")).expect("script source")
        };
        for script in all() {
            if script.name != WatchCall::script().name {
                assert_eq!(script.source, read(script.name), "{}", script.name);
            }
        }
        // It differs from inspect.lua in its first line only: its flags let it write.
        let inspect = read("inspect");
        let (flags, body) = WatchCall::script().source.split_once('\n').expect("a line");
        assert_eq!(Some(body), inspect.split_once('\n').map(|(_, b)| b));
        assert_eq!(flags, "#!lua flags=allow-oom");
        assert!(inspect.starts_with("#!lua flags=no-writes\n"));
    }

    /// The longest value a lease stores, from the documented limits, is the bound every
    /// script that reads a lease key reads up to (one byte more, to tell a longer value),
    /// refusing a longer value unread; `acquire.lua`, which describes the value, states it.
    #[test]
    fn every_script_that_reads_a_lease_key_bounds_it_by_the_longest_lease_value() {
        use leasehold::id::{MAX_HOLDER_NAME_LEN, MAX_OPERATION_ID_LEN, OWNER_TOKEN_BYTES};
        let fence = FenceToken::MAX.get().to_string().len();
        // Base64URL without padding; a record kept after release has "~" and 16 hex digits.
        let token = OWNER_TOKEN_BYTES.div_ceil(3) * 4;
        assert!(token > leasehold::HolderFingerprint::LEN);
        // The hold's end: the server's clock in microseconds plus the hold, below 2^64.
        let hold_until = u64::MAX.to_string().len();
        // "<fence>:<owner token>:<operation id>\n<hold until>\n<holder name>\n"
        let longest = fence
            + 1
            + token
            + 1
            + MAX_OPERATION_ID_LEN
            + 1
            + hold_until
            + 1
            + MAX_HOLDER_NAME_LEN
            + 1;
        assert_eq!(longest, 332);
        let line = format!("local LONGEST, LONGEST_TEXT = {longest}, '{longest}'");
        for script in [
            AcquireCall::script(),
            RenewCall::script(),
            ReleaseCall::script(),
            InspectCall::script(),
            WatchCall::script(),
            BreakCall::script(),
            SemaphoreInspectCall::script(),
        ] {
            assert!(
                script.source.lines().any(|l| l == line),
                "lua/{}.lua has no `{line}`",
                script.name
            );
        }
        let stated = format!("at most {longest} bytes");
        assert!(
            AcquireCall::script().source.contains(&stated),
            "acquire.lua's header does not say {stated:?}"
        );
    }

    /// The words of a command, as sent.
    fn words(cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .filter_map(|arg| match arg {
                redis::Arg::Simple(bytes) => Some(bytes.to_vec()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_invocation_is_numkeys_keys_then_arguments() {
        let attempt = AttemptArg {
            owner_token: "tok",
            operation_id: "op:1",
        };
        let release = ReleaseCall {
            lease_key: "lk".to_owned(),
            grant: GrantArg {
                fence: None,
                attempt,
            },
            sharded: true,
        };
        let eval = words(&release.eval());
        assert_eq!(
            eval[..2],
            [b"EVAL".to_vec(), ReleaseCall::script().source.into()]
        );
        // No fence: the grant opens with ':', whatever fence the attempt's grant carries.
        let sent: [&[u8]; 4] = [b"1", b"lk", b":tok:op:1", b"1"];
        assert_eq!(eval[2..], sent.map(<[u8]>::to_vec));
        // Not sharded: the flag is left out, and PUBLISH is the script's default.
        let unsharded = ReleaseCall {
            sharded: false,
            grant: GrantArg {
                fence: FenceToken::new(5),
                attempt,
            },
            ..release
        };
        let sent: [&[u8]; 3] = [b"1", b"lk", b"5:tok:op:1"];
        assert_eq!(words(&unsharded.evalsha())[2..], sent.map(<[u8]>::to_vec));

        let grant = |key, fence| RenewGrant {
            lease_key: key,
            grant: GrantArg {
                fence: Some(fence),
                attempt,
            },
            ttl_in_milliseconds: 1500,
        };
        let renew = RenewCall {
            grants: vec![grant("lk", FenceToken::MAX)],
        };
        let evalsha = words(&renew.evalsha());
        assert_eq!(
            evalsha[..2],
            [b"EVALSHA".to_vec(), RenewCall::script().sha().into()]
        );
        let sent: [&[u8]; 4] = [b"1", b"lk", b"9223372036854775807:tok:op:1", b"1500"];
        assert_eq!(evalsha[2..], sent.map(<[u8]>::to_vec));
        // Several grants: every key, then each grant and its TTL in turn.
        let two = FenceToken::new(2).unwrap();
        let batch = RenewCall {
            grants: vec![grant("k1", FenceToken::MAX), grant("k2", two)],
        };
        let sent: [&[u8]; 7] = [
            b"2",
            b"k1",
            b"k2",
            b"9223372036854775807:tok:op:1",
            b"1500",
            b"2:tok:op:1",
            b"1500",
        ];
        assert_eq!(words(&batch.evalsha())[2..], sent.map(<[u8]>::to_vec));

        let acquire = AcquireCall {
            lease_key: "lk".to_owned(),
            fence_counter_key: "fk".to_owned(),
            counter_idle_expiry_in_milliseconds: 604_800_000,
            attempt,
            ttl_in_milliseconds: 1500,
            min_hold_in_milliseconds: 0,
            holder_name: "",
        };
        // Neither a hold nor a name: the two optional arguments are left out.
        let sent: [&[u8]; 6] = [b"2", b"lk", b"fk", b"604800000", b"tok:op:1", b"1500"];
        assert_eq!(words(&acquire.evalsha())[2..], sent.map(<[u8]>::to_vec));
        // A name without a hold: the hold is sent as its default, to keep the name's place.
        let named = AcquireCall {
            holder_name: "web-1",
            ..acquire
        };
        let sent: [&[u8]; 8] = [
            b"2",
            b"lk",
            b"fk",
            b"604800000",
            b"tok:op:1",
            b"1500",
            b"0",
            b"web-1",
        ];
        assert_eq!(words(&named.evalsha())[2..], sent.map(<[u8]>::to_vec));
        let held = AcquireCall {
            min_hold_in_milliseconds: 60_000,
            holder_name: "",
            ..named
        };
        let sent: [&[u8]; 7] = [
            b"2",
            b"lk",
            b"fk",
            b"604800000",
            b"tok:op:1",
            b"1500",
            b"60000",
        ];
        assert_eq!(words(&held.evalsha())[2..], sent.map(<[u8]>::to_vec));
    }

    /// A batch sends every entry's keys, then what the entries share once (acquire's counter
    /// idle expiry, where the single call has it), then each entry's arguments; a batch of
    /// one is word for word the single call.
    #[test]
    fn a_batch_sends_keys_then_the_shared_argument_then_each_entrys() {
        let entry = |key: &str, attempt: &str| AcquireEntry {
            lease_key: key.to_owned(),
            attempt: attempt.to_owned(),
            ttl_in_milliseconds: 1500,
        };
        let entries = [entry("k1", "tok:op:1"), entry("k2", "tok:op:2")];
        let batch = BatchCall {
            shared: 1000,
            entries: &entries,
        };
        let sent: [&[u8]; 10] = [
            b"4",
            b"k1",
            b"k1:fence",
            b"k2",
            b"k2:fence",
            b"1000",
            b"tok:op:1",
            b"1500",
            b"tok:op:2",
            b"1500",
        ];
        assert_eq!(words(&batch.evalsha())[2..], sent.map(<[u8]>::to_vec));
        let one = BatchCall {
            shared: 1000,
            entries: &entries[..1],
        };
        let single = AcquireCall {
            lease_key: "k1".to_owned(),
            fence_counter_key: "k1:fence".to_owned(),
            counter_idle_expiry_in_milliseconds: 1000,
            attempt: AttemptArg {
                owner_token: "tok",
                operation_id: "op:1",
            },
            ttl_in_milliseconds: 1500,
            min_hold_in_milliseconds: 0,
            holder_name: "",
        };
        assert_eq!(words(&one.evalsha()), words(&single.evalsha()));
        // A release shares nothing: its keys, then its grants.
        let releases = [ReleaseEntry {
            lease_key: "k1".to_owned(),
            grant: "5:tok:op:1".to_owned(),
        }];
        let release = BatchCall {
            shared: (),
            entries: &releases,
        };
        let sent: [&[u8]; 3] = [b"1", b"k1", b"5:tok:op:1"];
        assert_eq!(words(&release.evalsha())[2..], sent.map(<[u8]>::to_vec));
    }
}
