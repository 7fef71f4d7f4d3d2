//! Identities: operations, attempts and their secret owner tokens, purposes, resource digests,
//! and the holder names callers give their grants.

use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha1::Sha1;
use sha2::{Digest as _, Sha256};

use crate::error::{Error, ErrorKind};

/// The longest [`OperationId`], in bytes.
pub const MAX_OPERATION_ID_LEN: usize = 128;
/// The longest [`Purpose`], in bytes.
pub const MAX_PURPOSE_LEN: usize = 64;
/// Number of random bytes in an owner token.
pub const OWNER_TOKEN_BYTES: usize = 24;
/// The longest [`HolderName`], in bytes.
pub const MAX_HOLDER_NAME_LEN: usize = 128;

/// The caller's identifier for one logical operation (a job run, a request id).
///
/// 1 to [`MAX_OPERATION_ID_LEN`] bytes of printable, non-space ASCII. Two attempts with the same
/// owner but different operation ids do not inherit each other's lease.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OperationId(
    // Boxed, not a `String`: 8 bytes fewer in every lease handle, which holds one, and it
    // never grows.
    Box<str>,
);

impl OperationId {
    /// Validates `id`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOperationId`] if `id` is empty, longer than
    /// [`MAX_OPERATION_ID_LEN`] bytes, or contains anything but ASCII `!`..=`~`.
    pub fn new(id: impl Into<String>) -> Result<Self, Error> {
        let id = id.into();
        if id.is_empty() || id.len() > MAX_OPERATION_ID_LEN {
            return Err(Error::new(
                ErrorKind::InvalidOperationId,
                format!(
                    "must be 1 to {MAX_OPERATION_ID_LEN} bytes, got {} bytes",
                    id.len()
                ),
            ));
        }
        if let Some(bad) = id.bytes().position(|b| !b.is_ascii_graphic()) {
            return Err(Error::new(
                ErrorKind::InvalidOperationId,
                format!("byte {bad} is not printable non-space ASCII"),
            ));
        }
        Ok(Self(id.into_boxed_str()))
    }

    /// Returns the id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("OperationId").field(&self.0).finish()
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A secret owner token: 24 bytes from the OS CSPRNG, Base64URL without padding.
///
/// Whoever knows the token can renew or release the lease, so it is never printed: `Debug`
/// shows only its [`HolderFingerprint`] and there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct OwnerToken(
    // The text itself, inline: every lease handle holds one, and a heap string would cost
    // it twice the bytes.
    [u8; OWNER_TOKEN_TEXT_LEN],
);

/// The length of an owner token's text: 24 bytes in Base64 without padding.
const OWNER_TOKEN_TEXT_LEN: usize = OWNER_TOKEN_BYTES / 3 * 4;

impl OwnerToken {
    fn generate() -> Result<Self, Error> {
        let mut bytes = [0u8; OWNER_TOKEN_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| {
            Error::new(
                ErrorKind::Entropy,
                format!("OS random number generator failed: {e}"),
            )
        })?;
        let mut text = [0u8; OWNER_TOKEN_TEXT_LEN];
        // 24 bytes are exactly 32 Base64 characters: the slice always fits, and is filled.
        let written = URL_SAFE_NO_PAD
            .encode_slice(bytes, &mut text)
            .expect("24 bytes are 32 Base64 characters");
        assert_eq!(written, OWNER_TOKEN_TEXT_LEN);
        Ok(Self(text))
    }

    /// Returns the token text, for a provider to send to its server. Never log it.
    pub fn expose_secret(&self) -> &str {
        // Base64 is ASCII, so this never fails.
        std::str::from_utf8(&self.0).expect("an owner token is Base64 text")
    }

    /// Returns the public fingerprint of this token.
    pub fn fingerprint(&self) -> HolderFingerprint {
        HolderFingerprint::of_token_text(self.expose_secret())
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({})", self.fingerprint())
    }
}

/// A short public fingerprint of an owner token: the first 16 lowercase hex digits of
/// SHA-1 of the token text.
///
/// It tells holders apart in diagnostics without revealing the token (the token has 192 random
/// bits, so the fingerprint cannot be inverted). The Lua scripts compute the same value with
/// `redis.sha1hex`, which is why SHA-1 is used here and nowhere else.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HolderFingerprint(String);

impl HolderFingerprint {
    /// Number of hex digits in a fingerprint.
    pub const LEN: usize = 16;

    /// Computes the fingerprint of an owner token's text, for a provider that stores tokens
    /// and must say who holds a lease (the simulator does; Redis computes it in Lua).
    ///
    /// For any token, `HolderFingerprint::of_token_text(token.expose_secret())` equals
    /// `token.fingerprint()`. It takes text in and gives out only the one-way fingerprint, so
    /// it reveals nothing a provider did not already know.
    pub fn of_token_text(text: &str) -> Self {
        let digest = Sha1::digest(text.as_bytes());
        let mut hex = to_hex(&digest);
        hex.truncate(Self::LEN);
        Self(hex)
    }

    /// Parses a fingerprint sent back by a provider; `None` unless it is exactly
    /// [`Self::LEN`] lowercase hex digits.
    pub fn parse(text: &str) -> Option<Self> {
        (text.len() == Self::LEN && is_lower_hex(text)).then(|| Self(text.to_owned()))
    }

    /// Returns the fingerprint as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for HolderFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderFingerprint({})", self.0)
    }
}

impl fmt::Display for HolderFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One attempt at one operation: the operation id and a fresh secret owner token.
///
/// Make the attempt once per operation, *before* the first send, and keep it: re-sending a
/// request with the same attempt after a lost reply is recognised by the server as a replay,
/// not as a second acquisition. `Debug` and `Display` show the operation id and the token's
/// fingerprint, never the token.
#[derive(Clone, PartialEq, Eq)]
pub struct Attempt {
    operation: OperationId,
    token: OwnerToken,
}

impl Attempt {
    /// Makes a new attempt for `operation` with a token from the OS CSPRNG.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Entropy`] if the operating system cannot produce random bytes.
    pub fn new(operation: OperationId) -> Result<Self, Error> {
        Ok(Self {
            operation,
            token: OwnerToken::generate()?,
        })
    }

    /// Returns the operation this attempt belongs to.
    pub fn operation(&self) -> &OperationId {
        &self.operation
    }

    /// Returns the secret owner token.
    pub fn owner_token(&self) -> &OwnerToken {
        &self.token
    }

    /// Returns the public fingerprint of the owner token.
    pub fn fingerprint(&self) -> HolderFingerprint {
        self.token.fingerprint()
    }

    /// Returns a new attempt with the same owner token and another operation id.
    ///
    /// The server treats it as the same owner doing a different operation, which does not
    /// inherit the lease ([`crate::AcquireOutcome::OwnerOperationConflict`]).
    pub fn with_operation(&self, operation: OperationId) -> Self {
        Self {
            operation,
            token: self.token.clone(),
        }
    }
}

impl fmt::Debug for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempt")
            .field("operation", &self.operation.as_str())
            .field("owner", &self.fingerprint().as_str())
            .finish()
    }
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (owner {})", self.operation, self.fingerprint())
    }
}

/// A name the caller gives its grant, for operators: `host-3:4711`, `billing-worker-2`.
///
/// It is stored with the grant and shown by inspection and in contention ("held by host-3"),
/// so that a person can tell who holds a lease without matching fingerprints. It is public
/// text, never a secret: it is not the owner token, proves nothing and grants nothing (only
/// the token renews or releases), and two holders may well give the same name.
///
/// 1 to [`MAX_HOLDER_NAME_LEN`] bytes of UTF-8 with no control character (so no line break,
/// which the stored value uses as its separator) and none of the invisible characters that
/// can make a name print as another: bidirectional overrides and isolates, line and paragraph
/// separators, zero-width marks and the byte-order mark. Spaces are allowed.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HolderName(
    // Shared: a worker gives every lease it takes the same name, and every request and view
    // holds one, so a clone costs a reference count, not a string.
    Arc<str>,
);

impl HolderName {
    /// Validates `name`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidHolderName`] if `name` is empty, longer than
    /// [`MAX_HOLDER_NAME_LEN`] bytes, or contains a control character or one of the invisible
    /// characters listed on [`HolderName`].
    pub fn new(name: &str) -> Result<Self, Error> {
        if name.is_empty() || name.len() > MAX_HOLDER_NAME_LEN {
            return Err(Error::new(
                ErrorKind::InvalidHolderName,
                format!(
                    "must be 1 to {MAX_HOLDER_NAME_LEN} bytes, got {} bytes",
                    name.len()
                ),
            ));
        }
        if let Some((at, c)) = name.char_indices().find(|&(_, c)| !is_printable(c)) {
            return Err(Error::new(
                ErrorKind::InvalidHolderName,
                format!(
                    "byte {at} is U+{:04X}, a control or invisible character",
                    u32::from(c)
                ),
            ));
        }
        Ok(Self(name.into()))
    }

    /// Returns the name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Returns true if and only if `c` may appear in a [`HolderName`].
fn is_printable(c: char) -> bool {
    const INVISIBLE: &[char] = &[
        '\u{200B}', '\u{200C}', '\u{200D}', '\u{200E}', '\u{200F}', // zero-width, marks
        '\u{2028}', '\u{2029}', // line and paragraph separators
        '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', // embeddings, overrides
        '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}', // isolates
        '\u{FEFF}', // byte-order mark
    ];
    !c.is_control() && !INVISIBLE.contains(&c)
}

impl fmt::Debug for HolderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HolderName").field(&self.as_str()).finish()
    }
}

impl fmt::Display for HolderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a resource is leased: `[a-z0-9._-]{1,64}`, part of the key.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Purpose(
    // Shared: an application has few purposes and many leases, each of whose handles holds
    // one, so a clone costs a reference count, not a string.
    Arc<str>,
);

impl Purpose {
    /// Validates `purpose`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidPurpose`] unless it is 1 to [`MAX_PURPOSE_LEN`] bytes of
    /// `a-z`, `0-9`, `.`, `_` or `-`.
    pub fn new(purpose: impl Into<String>) -> Result<Self, Error> {
        let purpose = purpose.into();
        let charset_ok = purpose
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if purpose.is_empty() || purpose.len() > MAX_PURPOSE_LEN || !charset_ok {
            return Err(Error::new(
                ErrorKind::InvalidPurpose,
                format!("must match [a-z0-9._-]{{1,{MAX_PURPOSE_LEN}}}"),
            ));
        }
        Ok(Self(purpose.into()))
    }

    /// Returns the purpose as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Purpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Purpose").field(&self.0).finish()
    }
}

impl fmt::Display for Purpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A versioned, lowercase SHA-256 digest of the caller's resource id:
/// `sha256:<64 lowercase hex digits>`.
///
/// Providers only ever see the digest: raw resource ids never reach the server, which keeps
/// them private, bounds the key length and rules out hash-tag injection. The `sha256:` prefix
/// is the version: another scheme would use another prefix.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ResourceDigest(
    // The text itself, inline: it always has the same length, and every lease handle holds
    // one.
    [u8; ResourceDigest::TEXT_LEN],
);

impl ResourceDigest {
    const PREFIX: &'static str = "sha256:";
    const TEXT_LEN: usize = Self::PREFIX.len() + 64;

    /// Hashes a raw resource id.
    pub fn of(raw_resource_id: impl AsRef<[u8]>) -> Self {
        let digest = Sha256::digest(raw_resource_id.as_ref());
        let mut text = [0u8; Self::TEXT_LEN];
        let (prefix, hex) = text.split_at_mut(Self::PREFIX.len());
        prefix.copy_from_slice(Self::PREFIX.as_bytes());
        for (pair, byte) in hex.chunks_exact_mut(2).zip(digest) {
            pair.copy_from_slice(&hex_digits(byte));
        }
        Self(text)
    }

    /// Validates a digest made elsewhere.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidResourceDigest`] unless `text` is `sha256:` followed by exactly 64
    /// lowercase hex digits.
    pub fn parse(text: &str) -> Result<Self, Error> {
        match text.strip_prefix(Self::PREFIX) {
            Some(hex) if hex.len() == 64 && is_lower_hex(hex) => {
                let mut inline = [0u8; Self::TEXT_LEN];
                inline.copy_from_slice(text.as_bytes());
                Ok(Self(inline))
            }
            _ => Err(Error::new(
                ErrorKind::InvalidResourceDigest,
                "must be `sha256:` followed by 64 lowercase hex digits",
            )),
        }
    }

    /// Returns the digest as text, prefix included.
    pub fn as_str(&self) -> &str {
        // Made of ASCII only (the prefix and hex digits), so this never fails.
        std::str::from_utf8(&self.0).expect("a resource digest is ASCII")
    }
}

impl fmt::Debug for ResourceDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ResourceDigest")
            .field(&self.as_str())
            .finish()
    }
}

impl fmt::Display for ResourceDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The two lowercase hex digits of `byte`.
fn hex_digits(byte: u8) -> [u8; 2] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    [
        DIGITS[usize::from(byte >> 4)],
        DIGITS[usize::from(byte & 0x0f)],
    ]
}

fn to_hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .flat_map(|&b| hex_digits(b))
        .map(char::from)
        .collect()
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_ids_are_bounded_and_printable() {
        assert!(OperationId::new("job-42:run/7").is_ok());
        assert!(OperationId::new("x".repeat(MAX_OPERATION_ID_LEN)).is_ok());
        for bad in [
            "",
            "has space",
            "tab\t",
            "é",
            &"x".repeat(MAX_OPERATION_ID_LEN + 1),
        ] {
            let err = OperationId::new(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidOperationId, "{bad:?}");
        }
    }

    #[test]
    fn holder_names_are_bounded_printable_utf8() {
        for good in [
            "host-3:4711",
            "billing worker 2",
            "hôte-é",
            "ホスト",
            &"n".repeat(MAX_HOLDER_NAME_LEN),
        ] {
            assert_eq!(HolderName::new(good).unwrap().as_str(), good);
        }
        // 64 two-byte characters: 128 bytes, at the bound.
        assert!(HolderName::new(&"é".repeat(64)).is_ok());
        for bad in [
            "",
            "line\nbreak",
            "cr\r",
            "tab\t",
            "nul\0",
            "esc\u{1b}[31m",
            "del\u{7f}",
            "c1\u{85}",
            "rtl\u{202E}txet",
            "zero\u{200B}width",
            "sep\u{2028}",
            "bom\u{FEFF}",
            &"n".repeat(MAX_HOLDER_NAME_LEN + 1),
            &"é".repeat(65),
        ] {
            assert_eq!(
                HolderName::new(bad).unwrap_err().kind(),
                ErrorKind::InvalidHolderName,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_refused_holder_name_is_not_echoed_raw() {
        let err = HolderName::new("a\u{1b}]0;pwned\u{7}").unwrap_err();
        let text = err.to_string();
        assert!(!text.chars().any(char::is_control), "{text:?}");
    }

    #[test]
    fn purposes_use_a_small_charset() {
        assert!(Purpose::new("billing.nightly_run-2").is_ok());
        for bad in [
            "",
            "Upper",
            "a:b",
            "{tag}",
            "a b",
            &"p".repeat(MAX_PURPOSE_LEN + 1),
        ] {
            assert_eq!(
                Purpose::new(bad).unwrap_err().kind(),
                ErrorKind::InvalidPurpose,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn digests_hash_and_parse() {
        let d = ResourceDigest::of("orders/42");
        assert!(d.as_str().starts_with("sha256:"));
        assert_eq!(d.as_str().len(), 7 + 64);
        assert_eq!(ResourceDigest::parse(d.as_str()).unwrap(), d);
        // Known vector: SHA-256("abc").
        assert_eq!(
            ResourceDigest::of("abc").as_str(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let upper = d.as_str().to_uppercase().replace("SHA256", "sha256");
        for bad in [
            "",
            "sha256:",
            "orders/42",
            &upper,
            &d.as_str()[..70],
            &format!("{}0", d.as_str()),
            "md5:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ] {
            assert_eq!(
                ResourceDigest::parse(bad).unwrap_err().kind(),
                ErrorKind::InvalidResourceDigest,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn tokens_are_24_random_bytes_in_base64url() {
        let op = OperationId::new("op").unwrap();
        let a = Attempt::new(op.clone()).unwrap();
        let b = Attempt::new(op).unwrap();
        let token = a.owner_token().expose_secret();
        assert_eq!(token.len(), 32);
        assert!(
            token
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        );
        assert_eq!(
            URL_SAFE_NO_PAD.decode(token).unwrap().len(),
            OWNER_TOKEN_BYTES
        );
        assert_ne!(token, b.owner_token().expose_secret());
    }

    #[test]
    fn tokens_never_show_in_debug_or_display() {
        let a = Attempt::new(OperationId::new("op-1").unwrap()).unwrap();
        let token = a.owner_token().expose_secret().to_owned();
        for text in [
            format!("{a:?}"),
            format!("{a:#?}"),
            format!("{a}"),
            format!("{:?}", a.owner_token()),
        ] {
            assert!(!text.contains(&token), "{text}");
            assert!(text.contains(a.fingerprint().as_str()), "{text}");
        }
    }

    #[test]
    fn fingerprint_matches_redis_sha1hex_prefix() {
        // SHA-1("abc") = a9993e364706816aba3e25717850c26c9cd0d89d
        assert_eq!(
            HolderFingerprint::of_token_text("abc").as_str(),
            "a9993e364706816a"
        );
        assert!(HolderFingerprint::parse("a9993e364706816a").is_some());
        assert!(HolderFingerprint::parse("A9993E364706816A").is_none());
        assert!(HolderFingerprint::parse("a9993e").is_none());
    }

    #[test]
    fn a_token_and_its_text_have_the_same_fingerprint() {
        let a = Attempt::new(OperationId::new("op").unwrap()).unwrap();
        let text = a.owner_token().expose_secret();
        assert_eq!(HolderFingerprint::of_token_text(text), a.fingerprint());
    }
}
