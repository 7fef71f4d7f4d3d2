//! URLs fit to print: credentials masked.

/// The mask that stands in for a secret.
const MASK: &str = "***";

/// Returns `url` with its credentials masked: the password (or a lone user part, which some
/// deployments use as the password) and the values of query parameters that look secret.
///
/// Conservative on purpose: everything before the *last* `@` in the URL is treated as
/// credentials, so a password with an unescaped `@`, `/`, `?` or `#` is still masked whole.
/// The `@` is looked for before the query is split off, since a `?` or `#` in a password would
/// otherwise be taken for the query's start and the password shown as host and query. An `@`
/// in the query itself makes more of the URL masked, never less. Text without a `scheme://`
/// is not shown at all.
pub(crate) fn mask_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<not a URL: not shown>".to_owned();
    };
    let (credentials, after) = match rest.rsplit_once('@') {
        Some((userinfo, after)) => {
            let masked = match userinfo.split_once(':') {
                Some((user, _password)) => format!("{user}:{MASK}@"),
                // A lone user part: some deployments use it as the password.
                None => format!("{MASK}@"),
            };
            (masked, after)
        }
        None => (String::new(), rest),
    };
    let (location, query) = match after.find(['?', '#']) {
        Some(at) => after.split_at(at),
        None => (after, ""),
    };
    format!("{scheme}://{credentials}{location}{}", mask_query(query))
}

/// Masks the values of `pass`, `password`, `token`, `secret`… parameters in `?query#fragment`.
fn mask_query(query_and_fragment: &str) -> String {
    let (query, fragment) = match query_and_fragment.find('#') {
        Some(at) => query_and_fragment.split_at(at),
        None => (query_and_fragment, ""),
    };
    let Some(query) = query.strip_prefix('?') else {
        return query_and_fragment.to_owned();
    };
    let masked: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if looks_secret(key) => format!("{key}={MASK}"),
            _ => pair.to_owned(),
        })
        .collect();
    format!("?{}{fragment}", masked.join("&"))
}

fn looks_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    ["pass", "secret", "token", "auth", "key"]
        .iter()
        .any(|word| key.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked() {
        let cases = [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://:hunter2@host:6379/0", "redis://:***@host:6379/0"),
            ("rediss://alice:hunter2@host", "rediss://alice:***@host"),
            ("redis://hunter2@host", "redis://***@host"),
            ("redis://a:hun@ter2@host/1", "redis://a:***@host/1"),
            ("redis://a:hun/ter2@host/1", "redis://a:***@host/1"),
            (
                "unix:///run/redis.sock?db=1&pass=hunter2",
                "unix:///run/redis.sock?db=1&pass=***",
            ),
            (
                "redis://host?protocol=resp3&password=hunter2#insecure",
                "redis://host?protocol=resp3&password=***#insecure",
            ),
            ("rediss://host#insecure", "rediss://host#insecure"),
            // A `?` or `#` in the password does not start the query: the last `@` ends it.
            ("redis://:se?cret@h", "redis://:***@h"),
            ("redis://:se#cret@h", "redis://:***@h"),
            (
                "redis://a:se?cret@h:6379/0?db=1",
                "redis://a:***@h:6379/0?db=1",
            ),
            ("redis://se#cret@h", "redis://***@h"),
            // An `@` in the query is taken as the end of credentials: more is masked, never less.
            ("redis://:p?w@h?user=a@b", "redis://:***@b"),
        ];
        for (url, shown) in cases {
            let masked = mask_url(url);
            assert_eq!(masked, shown, "{url}");
            assert!(!masked.contains("hunter2"), "{masked}");
            assert!(!masked.contains("cret"), "{masked}");
        }
    }

    #[test]
    fn text_that_is_not_a_url_is_not_shown() {
        assert!(!mask_url("hunter2").contains("hunter2"));
    }
}
