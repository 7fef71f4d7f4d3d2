//! Where one RESP2 reply ends in the bytes read so far.
//!
//! The reader of a [`super::DirectConnection`] must split what it reads into whole replies
//! before it can hand them out: a read may end in the middle of one, or hold several. This
//! finds the end of the first; redis-rs's public parser then reads exactly those bytes.
//! Arrays are walked with a count of the items still owed, never by recursion, so that no
//! reply, however deeply nested, can exhaust the stack here.

use std::io;

/// The longest line (a status, an error, an integer, a length) a reply may hold. Redis's are
/// short; a longer one is a broken stream, refused before the reader keeps rescanning it.
const MAX_LINE: usize = 1 << 20;

/// The length of the first whole reply in `bytes`: `Ok(None)` if it has not all arrived.
///
/// # Errors
///
/// An `InvalidData` error if the bytes are not RESP2: the connection cannot be read any
/// further, as nothing says where the next reply would start.
pub(super) fn reply_length(bytes: &[u8]) -> io::Result<Option<usize>> {
    let mut at = 0;
    // Replies still to be read before the first one is whole: its items, and theirs.
    let mut owed: u64 = 1;
    while owed > 0 {
        owed -= 1;
        let Some(kind) = bytes.get(at).copied() else {
            return Ok(None);
        };
        let Some(line_end) = find_line_end(bytes, at + 1) else {
            if bytes.len() - at > MAX_LINE {
                return Err(invalid("a line longer than any reply's"));
            }
            return Ok(None);
        };
        let line = &bytes[at + 1..line_end];
        at = line_end + 2;
        match kind {
            b'+' | b'-' | b':' => {}
            b'$' => {
                let Some(length) = length(line)? else {
                    continue;
                };
                let end = at
                    .checked_add(length)
                    .and_then(|end| end.checked_add(2))
                    .ok_or_else(|| invalid("a bulk string longer than memory"))?;
                if bytes.len() < end {
                    return Ok(None);
                }
                if &bytes[end - 2..end] != b"\r\n" {
                    return Err(invalid("a bulk string not ended by CRLF"));
                }
                at = end;
            }
            b'*' => {
                if let Some(items) = length(line)? {
                    owed = owed
                        .checked_add(items as u64)
                        .ok_or_else(|| invalid("an array longer than memory"))?;
                }
            }
            _ => return Err(invalid("a reply of a type RESP2 does not have")),
        }
    }
    Ok(Some(at))
}

/// The index of the `\r` of the first CRLF at or after `from`, if there is one yet.
fn find_line_end(bytes: &[u8], from: usize) -> Option<usize> {
    let rest = bytes.get(from..)?;
    rest.windows(2)
        .position(|pair| pair == b"\r\n")
        .map(|offset| from + offset)
}

/// A bulk string's or an array's length: `None` for `-1` (nil).
fn length(line: &[u8]) -> io::Result<Option<usize>> {
    if line == b"-1" {
        return Ok(None);
    }
    std::str::from_utf8(line)
        .ok()
        .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|digits| digits.parse::<usize>().ok())
        .map(Some)
        .ok_or_else(|| invalid("a length that is not a count"))
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unreadable reply from the server: {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Encodes a reply the way a server would.
    fn encode(reply: &Reply) -> Vec<u8> {
        match reply {
            Reply::Simple(s) => format!("+{s}\r\n").into_bytes(),
            Reply::Error(s) => format!("-ERR {s}\r\n").into_bytes(),
            Reply::Int(n) => format!(":{n}\r\n").into_bytes(),
            Reply::Bulk(None) => b"$-1\r\n".to_vec(),
            Reply::Bulk(Some(b)) => {
                let mut out = format!("${}\r\n", b.len()).into_bytes();
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
                out
            }
            Reply::Array(None) => b"*-1\r\n".to_vec(),
            Reply::Array(Some(items)) => {
                let mut out = format!("*{}\r\n", items.len()).into_bytes();
                for item in items {
                    out.extend(encode(item));
                }
                out
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Reply {
        Simple(String),
        Error(String),
        Int(i64),
        Bulk(Option<Vec<u8>>),
        Array(Option<Vec<Reply>>),
    }

    fn reply() -> impl Strategy<Value = Reply> {
        let line = "[a-zA-Z0-9 :]{0,12}";
        let leaf = prop_oneof![
            line.prop_map(Reply::Simple),
            line.prop_map(Reply::Error),
            any::<i64>().prop_map(Reply::Int),
            // Bulk strings may hold CRLF and any byte: only their length tells where they end.
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40))
                .prop_map(Reply::Bulk),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            proptest::option::of(proptest::collection::vec(inner, 0..6)).prop_map(Reply::Array)
        })
    }

    proptest! {
        /// A whole reply is found exactly, whatever follows it; every prefix of it is
        /// incomplete, never an error or a shorter reply.
        #[test]
        fn a_reply_ends_where_the_server_ended_it(first in reply(), second in reply()) {
            let one = encode(&first);
            let mut both = one.clone();
            both.extend(encode(&second));
            prop_assert_eq!(reply_length(&both).unwrap(), Some(one.len()));
            prop_assert_eq!(reply_length(&one).unwrap(), Some(one.len()));
            for cut in 0..one.len() {
                prop_assert_eq!(reply_length(&one[..cut]).unwrap(), None, "cut at {}", cut);
            }
            // redis-rs reads exactly those bytes as one reply.
            prop_assert!(redis::parse_redis_value(&both[..one.len()]).is_ok());
        }

        /// No input makes it panic; what it finds is within the input.
        #[test]
        fn any_bytes_are_answered(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok(Some(n)) = reply_length(&bytes) {
                prop_assert!(n <= bytes.len());
            }
        }
    }

    #[test]
    fn deep_nesting_and_huge_counts_are_answered_without_recursion() {
        let deep = "*1\r\n".repeat(1_000_000);
        assert_eq!(reply_length(deep.as_bytes()).unwrap(), None);
        let huge = format!("*{}\r\n*{}\r\n", u64::MAX, u64::MAX);
        assert!(!matches!(reply_length(huge.as_bytes()), Ok(Some(_))));
        assert!(!matches!(
            reply_length(b"$18446744073709551615\r\n"),
            Ok(Some(_))
        ));
    }

    #[test]
    fn a_line_that_never_ends_is_an_error_once_it_is_longer_than_any_reply_s() {
        let mut line = b"+".to_vec();
        line.resize(MAX_LINE, b'x');
        assert_eq!(reply_length(&line).unwrap(), None);
        line.extend_from_slice(b"xx");
        assert_eq!(
            reply_length(&line).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn what_is_not_resp2_is_an_error() {
        for bytes in [
            &b"?x\r\n"[..],
            b"$x\r\n",
            b"*-2\r\n",
            b"$3\r\nabcde",
            b"$\r\n",
        ] {
            assert_eq!(
                reply_length(bytes).unwrap_err().kind(),
                io::ErrorKind::InvalidData,
                "{bytes:?}"
            );
        }
    }
}
