//! The four lease scripts and the fenced write, loaded once from `lua/*.lua`.

use std::sync::LazyLock;

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

pub(crate) static ACQUIRE: LazyLock<LeaseScript> =
    LazyLock::new(|| LeaseScript::new("acquire", include_str!("../lua/acquire.lua")));
pub(crate) static RENEW: LazyLock<LeaseScript> =
    LazyLock::new(|| LeaseScript::new("renew", include_str!("../lua/renew.lua")));
pub(crate) static RELEASE: LazyLock<LeaseScript> =
    LazyLock::new(|| LeaseScript::new("release", include_str!("../lua/release.lua")));
pub(crate) static INSPECT: LazyLock<LeaseScript> =
    LazyLock::new(|| LeaseScript::new("inspect", include_str!("../lua/inspect.lua")));

pub(crate) static FENCED_WRITE: LazyLock<LeaseScript> =
    LazyLock::new(|| LeaseScript::new("fenced_write", include_str!("../lua/fenced_write.lua")));

/// Every script, for warm-up.
pub(crate) fn all() -> [&'static LeaseScript; 5] {
    [&ACQUIRE, &RENEW, &RELEASE, &INSPECT, &FENCED_WRITE]
}
