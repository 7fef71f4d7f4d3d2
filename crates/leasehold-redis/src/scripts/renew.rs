//! The call of `lua/renew.lua`: one grant, or a batch of grants in one script run.
//!
//! Not declared with `script_call!`: its keys and arguments repeat once per grant. The header
//! names one grant's slice, and the test checks those names and their count.

use std::sync::LazyLock;

use leasehold::backend::RenewReply;
use redis::{Cmd, Value};

use super::{GrantArg, LeaseScript, ScriptArg as _, ScriptCall};
use crate::decode::{self, UnexpectedReply};

/// One grant to renew. Holds the owner token: no `Debug`.
pub(crate) struct RenewGrant<'a> {
    pub(crate) lease_key: &'a str,
    pub(crate) grant: GrantArg<'a>,
    pub(crate) ttl_in_milliseconds: u64,
}

/// Sets the TTL of each of `grants` again, each exactly as a call of its own would.
pub(crate) struct RenewCall<'a> {
    pub(crate) grants: Vec<RenewGrant<'a>>,
}

impl ScriptCall for RenewCall<'_> {
    const KEYS: &'static [&'static str] = &["lease_key"];
    const ARGV: &'static [&'static str] = &["grant", "ttl_in_milliseconds"];

    fn script() -> &'static LeaseScript {
        static SCRIPT: LazyLock<LeaseScript> =
            LazyLock::new(|| LeaseScript::new("renew", include_str!("../../lua/renew.lua")));
        &SCRIPT
    }

    fn push_args(&self, cmd: &mut Cmd) {
        cmd.arg(self.grants.len());
        for grant in &self.grants {
            cmd.arg(grant.lease_key);
        }
        for grant in &self.grants {
            grant.grant.push_to(cmd);
            grant.ttl_in_milliseconds.push_to(cmd);
        }
    }

    fn args_len(&self) -> usize {
        self.grants
            .iter()
            .map(|g| g.lease_key.len() + g.grant.len_hint() + g.ttl_in_milliseconds.len_hint())
            .sum()
    }
}

impl RenewCall<'_> {
    /// Decodes the script's reply: one [`RenewReply`] per grant, in order.
    pub(crate) fn decode(&self, value: &Value) -> Result<Vec<RenewReply>, UnexpectedReply> {
        let bad = || decode::unexpected_reply("renew", value);
        let Value::Array(items) = value else {
            return Err(bad());
        };
        if items.len() != self.grants.len() {
            return Err(bad());
        }
        items.iter().map(decode::renew).collect()
    }
}
