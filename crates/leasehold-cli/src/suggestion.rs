//! "Did you mean": the subcommand nearest a mistyped one.
//!
//! clap suggests by Jaro similarity, which misses the commonest slips in short names: `rnu`,
//! `lsit` or `mna` share too few letters in place with `run`, `list` or `man` to pass its
//! threshold. An edit distance that counts a swap of two neighbours as one edit finds them.

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// Adds to `e`, an unrecognized subcommand, the subcommands of `command` nearest the one typed
/// (in clap's "a similar subcommand exists" tip), when any is near enough. Leaves any other
/// error, or a name near none, as it is.
pub(crate) fn suggest_subcommand(e: &mut clap::Error, command: &clap::Command) {
    if e.kind() != ErrorKind::InvalidSubcommand {
        return;
    }
    let Some(ContextValue::String(typed)) = e.get(ContextKind::InvalidSubcommand) else {
        return;
    };
    let names = command
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set())
        .map(clap::Command::get_name);
    let nearest = nearest(typed, names);
    if !nearest.is_empty() {
        e.insert(
            ContextKind::SuggestedSubcommand,
            ContextValue::Strings(nearest),
        );
    }
}

/// The names nearest `typed`, nearest first, within the distance allowed for its length: one
/// edit for a name of up to four letters, two for a longer one.
fn nearest<'a>(typed: &str, names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let allowed = if typed.chars().count() <= 4 { 1 } else { 2 };
    let mut near: Vec<(usize, &str)> = names
        .map(|name| (distance(typed, name), name))
        .filter(|(d, _)| *d <= allowed)
        .collect();
    near.sort_unstable();
    let Some(&(best, _)) = near.first() else {
        return Vec::new();
    };
    near.into_iter()
        .filter(|(d, _)| *d == best)
        .map(|(_, name)| name.to_owned())
        .collect()
}

/// The optimal string alignment distance: insertions, deletions, substitutions and swaps of
/// two neighbouring characters, each one edit.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Three rows of the table: two back (for swaps), the last and the one being filled.
    let mut before: Vec<usize> = vec![0; b.len() + 1];
    let mut last: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut row = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            row[j] = (last[j] + 1).min(row[j - 1] + 1).min(last[j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                row[j] = row[j].min(before[j - 2] + 1);
            }
        }
        before = std::mem::replace(&mut last, row);
    }
    last[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every subcommand: those with a man page, and `help`.
    fn suggested(typed: &str) -> Vec<String> {
        nearest(typed, crate::args::MAN_PAGES.into_iter().chain(["help"]))
    }

    #[test]
    fn swaps_and_slips_find_the_subcommand() {
        assert_eq!(suggested("rnu"), ["run"]);
        assert_eq!(suggested("rn"), ["run"]);
        assert_eq!(suggested("lsit"), ["list"]);
        assert_eq!(suggested("mna"), ["man"]);
        assert_eq!(suggested("inspct"), ["inspect"]);
        assert_eq!(suggested("brake"), ["break"]);
        assert_eq!(suggested("completion"), ["completions"]);
    }

    #[test]
    fn a_name_near_nothing_gets_no_suggestion() {
        assert!(suggested("frobnicate").is_empty());
        assert!(suggested("xyz").is_empty());
    }

    #[test]
    fn the_distance_counts_a_swap_as_one_edit() {
        assert_eq!(distance("rnu", "run"), 1);
        assert_eq!(distance("", "run"), 3);
        assert_eq!(distance("run", "run"), 0);
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
