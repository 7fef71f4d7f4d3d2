//! Acquires and releases sent together: the entries of one batched run of `acquire.lua` or
//! `release.lua` (`batch.rs` at the crate's root gathers them).
//!
//! A batch of one is exactly the script's single call, whose reply is the entry's own; a batch
//! of more sends each entry's keys, then what every entry shares (acquire's counter idle
//! expiry) once, then each entry's arguments, and the script answers one reply per entry, in
//! order, each what a call of its own would have answered. Only what the single call would
//! send with its optional arguments at their defaults is batched: an acquire with a minimum
//! hold or a holder name goes alone.

use std::io::Write as _;

use redis::Cmd;

use super::{AcquireCall, LeaseScript, ReleaseCall, ScriptArg, ScriptCall};
use crate::keys::FENCE_SUFFIX;

/// One acquire or release that may share a script run with others. Owns what it sends, since
/// another caller may send it; holds the owner token: no `Debug`.
pub(crate) trait BatchEntry: Send + Sync + 'static {
    /// The script's single call, whose header names one entry's keys and arguments.
    type Single: ScriptCall;

    /// What every entry of a run shares, sent once ahead of the entries' arguments, where the
    /// single call sends it: acquire's counter idle expiry; nothing for a release. The same
    /// for every entry of one backend, so it is the batcher's, not each entry's.
    type Shared: Copy + Send + Sync + 'static;

    /// Appends `shared`'s arguments.
    fn push_shared(shared: Self::Shared, cmd: &mut Cmd);

    /// The bytes of `shared`'s arguments, closely.
    fn shared_len_hint(shared: Self::Shared) -> usize;

    /// Appends this entry's keys.
    fn push_keys(&self, cmd: &mut Cmd);

    /// Appends this entry's arguments.
    fn push_args(&self, cmd: &mut Cmd);

    /// The bytes of the keys and arguments, closely.
    fn len_hint(&self) -> usize;
}

/// Appends `key` followed by `suffix` as one argument, without building the string.
fn push_joined(cmd: &mut Cmd, key: &str, suffix: &str) {
    let mut arg = redis::RedisWrite::writer_for_next_arg(cmd);
    // Writing into a command's buffer cannot fail.
    let _ = arg.write_all(key.as_bytes());
    let _ = arg.write_all(suffix.as_bytes());
}

/// An acquire without a minimum hold or a holder name.
pub(crate) struct AcquireEntry {
    pub(crate) lease_key: String,
    /// `<owner token>:<operation id>`.
    pub(crate) attempt: String,
    pub(crate) ttl_in_milliseconds: u64,
}

impl BatchEntry for AcquireEntry {
    type Single = AcquireCall<'static>;
    /// The counter idle expiry in milliseconds.
    type Shared = u64;

    fn push_shared(idle_in_milliseconds: u64, cmd: &mut Cmd) {
        idle_in_milliseconds.push_to(cmd);
    }

    fn shared_len_hint(idle_in_milliseconds: u64) -> usize {
        idle_in_milliseconds.len_hint()
    }

    fn push_keys(&self, cmd: &mut Cmd) {
        cmd.arg(&self.lease_key);
        push_joined(cmd, &self.lease_key, FENCE_SUFFIX);
    }

    fn push_args(&self, cmd: &mut Cmd) {
        cmd.arg(&self.attempt);
        self.ttl_in_milliseconds.push_to(cmd);
    }

    fn len_hint(&self) -> usize {
        2 * self.lease_key.len() + FENCE_SUFFIX.len() + self.attempt.len() + 20
    }
}

impl AcquireEntry {
    /// Whether `attempt` (`<owner token>:<operation id>`) is this entry's.
    pub(crate) fn is_for(&self, attempt: &str) -> bool {
        self.attempt == attempt
    }
}

/// A release of one grant by its fence, announced (if someone was refused the grant) with
/// `PUBLISH` (never on a Cluster, whose keys of one run must share a slot).
pub(crate) struct ReleaseEntry {
    pub(crate) lease_key: String,
    /// `<fence>:<owner token>:<operation id>`.
    pub(crate) grant: String,
}

impl BatchEntry for ReleaseEntry {
    type Single = ReleaseCall<'static>;
    type Shared = ();

    fn push_shared(_: (), _: &mut Cmd) {}

    fn shared_len_hint(_: ()) -> usize {
        0
    }

    fn push_keys(&self, cmd: &mut Cmd) {
        cmd.arg(&self.lease_key);
    }

    fn push_args(&self, cmd: &mut Cmd) {
        cmd.arg(&self.grant);
    }

    fn len_hint(&self) -> usize {
        self.lease_key.len() + self.grant.len()
    }
}

/// One run of a script for every entry of `entries`.
pub(crate) struct BatchCall<'a, E: BatchEntry> {
    pub(crate) shared: E::Shared,
    pub(crate) entries: &'a [E],
}

impl<E: BatchEntry> ScriptCall for BatchCall<'_, E> {
    const KEYS: &'static [&'static str] = E::Single::KEYS;
    const ARGV: &'static [&'static str] = E::Single::ARGV;

    fn script() -> &'static LeaseScript {
        E::Single::script()
    }

    fn push_args(&self, cmd: &mut Cmd) {
        cmd.arg(self.entries.len() * Self::KEYS.len());
        for entry in self.entries {
            entry.push_keys(cmd);
        }
        E::push_shared(self.shared, cmd);
        for entry in self.entries {
            entry.push_args(cmd);
        }
    }

    fn args_len(&self) -> usize {
        E::shared_len_hint(self.shared)
            + self.entries.iter().map(BatchEntry::len_hint).sum::<usize>()
    }
}
