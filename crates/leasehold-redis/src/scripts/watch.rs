//! The watch form of `lua/inspect.lua`: the read of an election observer, which marks the
//! grant it finds so that its release is announced (D48).

use super::{InspectCall, LeaseScript, ScriptCall};

/// An inspection with its `mark` argument set, run as the `watch` form of `inspect.lua`: the
/// same source whose first line lets it write (`allow-oom` instead of `no-writes`). A server
/// that refuses writes refuses it whole; [`InspectCall`] still reads there.
pub(crate) struct WatchCall<'a>(pub(crate) InspectCall<'a>);

impl ScriptCall for WatchCall<'_> {
    const KEYS: &'static [&'static str] = InspectCall::KEYS;
    const ARGV: &'static [&'static str] = InspectCall::ARGV;

    fn script() -> &'static LeaseScript {
        static SOURCE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
            let inspect = InspectCall::script().source;
            let (_read_only, body) = inspect.split_once('\n').unwrap_or(("", inspect));
            format!("#!lua flags=allow-oom\n{body}")
        });
        static SCRIPT: std::sync::LazyLock<LeaseScript> =
            std::sync::LazyLock::new(|| LeaseScript::new("watch", &SOURCE));
        &SCRIPT
    }

    fn push_args(&self, cmd: &mut redis::Cmd) {
        self.0.push_args(cmd);
    }

    fn args_len(&self) -> usize {
        self.0.args_len()
    }
}
