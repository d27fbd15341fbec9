//! Keeping credentials out of what the sandbox sees and what is logged:
//! header filters for both directions and byte-level replacement in bodies.

use bytes::Bytes;
use hyper::{HeaderMap, header};

/// What replaces a credential found in a response body or a logged field.
pub const REDACTED: &str = "[redacted]";

/// Hop-by-hop headers (RFC 9110 §7.6.1) and proxy headers never forwarded in
/// either direction.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The sandbox's request headers minus hop-by-hop, `Host`, `Content-Length`
/// (recomputed), `Accept-Encoding` (the proxy asks for identity so it can scan
/// bodies) and every `X-Sandbox-*` header (session and executable tokens stay
/// with the proxy).
pub fn forwardable_request_headers(from: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    for (name, value) in from {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n)
            || n.starts_with("x-sandbox-")
            || name == header::HOST
            || name == header::CONTENT_LENGTH
            || name == header::ACCEPT_ENCODING
            || name == header::AUTHORIZATION
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// Removes from an upstream response's headers: `Authorization`,
/// `Proxy-Authorization`, `Set-Cookie`, hop-by-hop headers,
/// `Content-Length` (the body may change) and any header whose value holds
/// one of `secrets`.
pub fn strip_response_headers(headers: &mut HeaderMap, secrets: &[&str]) {
    let mut drop: Vec<header::HeaderName> = Vec::new();
    for (name, value) in headers.iter() {
        let n = name.as_str();
        let holds_secret = secrets
            .iter()
            .any(|s| !s.is_empty() && contains(value.as_bytes(), s.as_bytes()));
        if holds_secret
            || HOP_BY_HOP.contains(&n)
            || name == header::AUTHORIZATION
            || name == header::SET_COOKIE
            || name == header::CONTENT_LENGTH
        {
            drop.push(name.clone());
        }
    }
    for name in drop {
        headers.remove(&name);
    }
}

/// `body` with every occurrence of each secret replaced by [`REDACTED`].
pub fn scrub_body(body: Bytes, secrets: &[&str]) -> Bytes {
    let mut current = body;
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        if contains(&current, secret.as_bytes()) {
            current = Bytes::from(replace(&current, secret.as_bytes(), REDACTED.as_bytes()));
        }
    }
    current
}

/// `text` with every secret replaced (for log fields and denial details).
pub fn scrub_text(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_owned();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        if out.contains(secret) {
            out = out.replace(secret, REDACTED);
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

fn replace(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use hyper::header::HeaderValue;

    use super::*;

    #[test]
    fn request_headers_lose_sandbox_and_hop_by_hop_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-sandbox-session-token", HeaderValue::from_static("tok"));
        h.insert("x-sandbox-exec-token", HeaderValue::from_static("tok2"));
        h.insert("connection", HeaderValue::from_static("close"));
        h.insert("host", HeaderValue::from_static("proxy:3128"));
        h.insert("accept-encoding", HeaderValue::from_static("gzip"));
        h.insert("proxy-authorization", HeaderValue::from_static("Basic x"));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h.insert("anthropic-version", HeaderValue::from_static("2023-06-01"));
        let out = forwardable_request_headers(&h);
        let names: Vec<_> = out.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "anthropic-version"]);
    }

    #[test]
    fn response_headers_lose_credentials_cookies_and_echoes() {
        let mut h = HeaderMap::new();
        h.insert("authorization", HeaderValue::from_static("Bearer s3cret"));
        h.insert("set-cookie", HeaderValue::from_static("a=b"));
        h.insert("x-echo", HeaderValue::from_static("you sent Bearer s3cret"));
        h.insert("content-length", HeaderValue::from_static("10"));
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        strip_response_headers(&mut h, &["s3cret"]);
        let names: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type"]);
    }

    #[test]
    fn bodies_and_text_are_scrubbed_everywhere() {
        let b = scrub_body(
            Bytes::from_static(b"s3cret-a s3cret s3cres3cret"),
            &["s3cret", ""],
        );
        assert_eq!(&b[..], b"[redacted]-a [redacted] s3cre[redacted]");
        let untouched = Bytes::from_static(b"nothing here");
        assert_eq!(scrub_body(untouched.clone(), &["s3cret"]), untouched);
        assert_eq!(scrub_text("/x/s3cret", &["s3cret"]), "/x/[redacted]");
    }
}
