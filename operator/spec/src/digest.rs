//! Artifact and store digests (§12): SHA-256 over canonical text (CRLF and
//! lone CR normalized to LF, nothing else), and the per-store digest over
//! `path NUL fileDigest NUL` in byte order of the root-relative paths.

use sha2::{Digest, Sha256};

/// Digest of an empty store.
pub const EMPTY_STORE: &str =
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Why bytes are not canonical text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TextError {
    /// Invalid UTF-8.
    #[error("the content is not valid UTF-8; save it as UTF-8")]
    NotUtf8,
    /// Starts with a BOM.
    #[error("the content starts with a byte-order mark; save it without one")]
    Bom,
}

/// Normalizes CRLF and lone CR to LF after checking UTF-8 and the BOM.
pub fn canonical_text(bytes: &[u8]) -> Result<Vec<u8>, TextError> {
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        return Err(TextError::Bom);
    }
    std::str::from_utf8(bytes).map_err(|_| TextError::NotUtf8)?;
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\r' {
            out.push(b'\n');
            if bytes.get(i + 1) == Some(&b'\n') {
                i += 1;
            }
        } else {
            out.push(bytes[i]);
        }
        i += 1;
    }
    Ok(out)
}

/// `sha256:<hex>` of raw bytes.
pub fn sha256(bytes: &[u8]) -> String {
    prefixed_hex(&Sha256::digest(bytes))
}

/// `sha256:` and lowercase hex, built without intermediate strings (store
/// digests format one of these per file).
fn prefixed_hex(digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(7 + 2 * digest.len());
    out.push_str("sha256:");
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xF)]));
    }
    out
}

/// The v1 canonical text digest.
pub fn text_digest(bytes: &[u8]) -> Result<String, TextError> {
    if bytes.contains(&b'\r') {
        return canonical_text(bytes).map(|t| sha256(&t));
    }
    // Already LF-only (the common case): check, then hash without a copy.
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        return Err(TextError::Bom);
    }
    std::str::from_utf8(bytes).map_err(|_| TextError::NotUtf8)?;
    Ok(sha256(bytes))
}

/// Whether `s` is `sha256:` plus 64 lowercase hex digits.
pub fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    })
}

/// Store digest over `(root-relative path, bytes)` pairs.
pub fn store_digest<'a>(
    files: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<String, TextError> {
    let mut entries: Vec<(&str, String)> = Vec::new();
    for (path, bytes) in files {
        entries.push((path, text_digest(bytes)?));
    }
    Ok(store_digest_of(entries))
}

/// Store digest from `(root-relative path, text digest)` pairs whose file
/// digests were already computed (for example in parallel).
pub fn store_digest_of(mut entries: Vec<(&str, String)>) -> String {
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut h = Sha256::new();
    for (path, d) in entries {
        h.update(path.as_bytes());
        h.update([0]);
        h.update(d.as_bytes());
        h.update([0]);
    }
    prefixed_hex(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_examples() {
        assert_eq!(
            sha256(b""),
            format!("sha256:{}", hex::encode(Sha256::digest(b"")))
        );
        assert_eq!(
            text_digest(b"# Fixture Vision\n").unwrap(),
            "sha256:d50b23aec93611c3905fe3a7ba150e2d3c049732032d455d29e4c75fab27c514"
        );
        assert_eq!(store_digest([]).unwrap(), EMPTY_STORE);
        assert_eq!(text_digest(b"a\r\nb\rc").unwrap(), sha256(b"a\nb\nc"));
        assert_eq!(text_digest(b"\xEF\xBB\xBFx"), Err(TextError::Bom));
        assert_eq!(text_digest(b"\xff"), Err(TextError::NotUtf8));
    }

    #[test]
    fn store_digest_is_order_independent_and_path_sensitive() {
        let a = store_digest([("s/a.yaml", &b"x"[..]), ("s/b.yaml", &b"y"[..])]).unwrap();
        let b = store_digest([("s/b.yaml", &b"y"[..]), ("s/a.yaml", &b"x"[..])]).unwrap();
        let c = store_digest([("t/a.yaml", &b"x"[..]), ("s/b.yaml", &b"y"[..])]).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(is_digest(&a));
        assert!(!is_digest("sha256:ABC"));
    }
}
