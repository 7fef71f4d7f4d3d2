//! The holder name `leasehold run` gives its grant unless `--holder` names one:
//! `<hostname>:<pid>`, so that whoever inspects the lease, or is refused it, can tell which
//! host and process holds it.
//!
//! The hostname is read from `/proc/sys/kernel/hostname` (Linux; no dependency needed). Where
//! it cannot be read, or is no valid holder name, the name is the pid alone: still enough to
//! find the process on a host the operator already knows.

use leasehold_redis::leasehold::HolderName;

/// Where Linux keeps the hostname.
const HOSTNAME: &str = "/proc/sys/kernel/hostname";

/// The default holder name of this process.
pub(crate) fn default_holder_name() -> Option<HolderName> {
    let hostname = std::fs::read_to_string(HOSTNAME).ok();
    holder_name_for(hostname.as_deref(), std::process::id())
}

/// `<hostname>:<pid>`, or the pid alone when the hostname is missing, empty or would not make
/// a valid name.
fn holder_name_for(hostname: Option<&str>, pid: u32) -> Option<HolderName> {
    hostname
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .and_then(|host| HolderName::new(&format!("{host}:{pid}")).ok())
        .or_else(|| HolderName::new(&pid.to_string()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_host_and_pid_or_the_pid_alone() {
        let name = |host: Option<&str>| holder_name_for(host, 4711).map(|n| n.as_str().to_owned());
        assert_eq!(name(Some("build-3\n")).as_deref(), Some("build-3:4711"));
        for unusable in [None, Some(""), Some(" \n"), Some("bad\u{1b}host")] {
            assert_eq!(name(unusable).as_deref(), Some("4711"), "{unusable:?}");
        }
        let long = "h".repeat(200);
        assert_eq!(name(Some(&long)).as_deref(), Some("4711"));
    }

    #[test]
    fn this_process_has_a_name_that_ends_with_its_pid() {
        let name = default_holder_name().expect("a name");
        assert!(
            name.as_str().ends_with(&std::process::id().to_string()),
            "{name}"
        );
    }
}
