//! The server's eviction policy, read once per backend: some policies can end leases early.
//!
//! Under `maxmemory`, a `volatile-*` policy evicts keys that have a TTL, and every live lease
//! has one, as every fence counter does (its idle expiry); an `allkeys-*` policy evicts any
//! key. An evicted lease ends before its holder's validity says so: the next renewal (or the
//! release) finds it gone and reports a loss, but another holder may have been granted it in
//! between. An evicted counter costs nothing: fences never go below the server's clock. Only
//! `noeviction` (the default) is safe; the backend warns once, through `tracing`, when the
//! policy is anything else.

use std::time::Duration;

use redis::Value;

/// What a policy risks, when `maxmemory` is set; `None` when it evicts nothing.
pub(crate) fn risk(policy: &str, maxmemory: u64) -> Option<&'static str> {
    if maxmemory == 0 || policy == "noeviction" {
        return None;
    }
    Some(if policy.starts_with("volatile-") {
        "can evict live leases (every lease has a TTL): a lease may end before its holder's \
         validity does; use maxmemory-policy noeviction"
    } else {
        "can evict live leases and fence counters: a lease may end before its holder's validity \
         does; use maxmemory-policy noeviction"
    })
}

/// Reads `maxmemory-policy` and `maxmemory` with `query` and warns if the policy can evict
/// leases. A server that will not say (an ACL that denies `CONFIG`, a timeout) is not an
/// error: the check is skipped, at debug level.
pub(crate) async fn check<F>(query: F, within: Duration, endpoint: &str)
where
    F: Future<Output = redis::RedisResult<Value>>,
{
    let reply = match tokio::time::timeout(within, query).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(err)) => {
            tracing::debug!(endpoint, error = %err.category(), "maxmemory-policy not checked");
            return;
        }
        Err(_) => {
            tracing::debug!(endpoint, "maxmemory-policy not checked: no answer in time");
            return;
        }
    };
    let Some((policy, maxmemory)) = parse(&reply) else {
        tracing::debug!(endpoint, "maxmemory-policy not checked: unexpected reply");
        return;
    };
    match risk(&policy, maxmemory) {
        Some(what) => tracing::warn!(
            endpoint,
            maxmemory_policy = %policy,
            maxmemory,
            "the server's maxmemory-policy {policy} {what}"
        ),
        None => {
            tracing::debug!(endpoint, maxmemory_policy = %policy, maxmemory, "eviction checked")
        }
    }
}

/// The policy and `maxmemory` from a `CONFIG GET maxmemory-policy maxmemory` reply: an array
/// of names and values (RESP2) or a map (RESP3).
fn parse(reply: &Value) -> Option<(String, u64)> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_owned),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let pairs: Vec<(String, String)> = match reply {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|pair| Some((text(pair.first()?)?, text(pair.get(1)?)?)))
            .collect(),
        Value::Map(entries) => entries
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => return None,
    };
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    Some((get("maxmemory-policy")?, get("maxmemory")?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_noeviction_or_no_limit_is_safe() {
        assert_eq!(risk("noeviction", 1 << 30), None);
        assert_eq!(risk("allkeys-lru", 0), None);
        assert!(risk("volatile-lru", 1).unwrap().contains("live leases"));
        assert!(risk("volatile-ttl", 1).is_some());
        assert!(risk("allkeys-lfu", 1).unwrap().contains("fence counters"));
        assert!(risk("allkeys-random", 1).is_some());
    }

    #[test]
    fn both_reply_shapes_parse() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let array = Value::Array(vec![
            bulk("maxmemory"),
            bulk("1024"),
            bulk("maxmemory-policy"),
            bulk("volatile-lru"),
        ]);
        assert_eq!(parse(&array), Some(("volatile-lru".to_owned(), 1024)));
        let map = Value::Map(vec![
            (bulk("maxmemory-policy"), bulk("noeviction")),
            (bulk("maxmemory"), bulk("0")),
        ]);
        assert_eq!(parse(&map), Some(("noeviction".to_owned(), 0)));
        assert_eq!(parse(&Value::Nil), None);
        assert_eq!(parse(&Value::Array(vec![bulk("maxmemory")])), None);
    }
}
