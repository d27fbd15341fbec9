//! Who the Job Site is on GitHub: a token from a Secret, or a GitHub App whose installation
//! tokens are minted and refreshed here, held only in memory.
//!
//! The App's JWT (RS256, `iat` 60 s in the past against clock drift, `exp` 9 minutes ahead,
//! `iss` = the app id) is signed with `ring`; the private key is parsed once (PKCS#1
//! `BEGIN RSA PRIVATE KEY`, as GitHub issues it, or PKCS#8 `BEGIN PRIVATE KEY`). An installation
//! token is reused until [`REFRESH_MARGIN`] before its expiry, then minted again. Every secret
//! value is a [`Sensitive`]: `Debug` prints `<redacted>` and no error carries one.

use std::{fmt, time::Duration};

use base64::{
    Engine as _,
    engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD},
};
use protobot_repo::remote::Sensitive;
use ring::{
    rand::SystemRandom,
    signature::{RSA_PKCS1_SHA256, RsaKeyPair},
};

/// An installation token is minted again this long before it expires.
pub const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);

/// Why credentials could not be prepared (no secret value ever appears in a message).
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The token Secret's value is empty or not a valid header value.
    #[error(
        "unable to use the GitHub token from {secret}: it is empty or holds characters an HTTP header cannot carry (store the bare token under key `token`)"
    )]
    BadToken {
        /// `namespace/name` of the Secret.
        secret: String,
    },
    /// The private key is not an RSA PEM key ring accepts.
    #[error(
        "unable to read the GitHub App private key from {secret}: {why} (store the PEM file GitHub generated under key `private-key.pem`)"
    )]
    BadKey {
        /// `namespace/name` of the Secret.
        secret: String,
        /// What was wrong (never the key).
        why: &'static str,
    },
    /// Signing the JWT failed.
    #[error("failed to sign the GitHub App JWT for app {app_id}")]
    Sign {
        /// The app.
        app_id: u64,
    },
}

/// A parsed GitHub App key (not `Debug`-printable beyond its size).
pub struct AppKey {
    // Boxed: a key pair is large, and `Credentials` moves around by value.
    pair: Box<RsaKeyPair>,
}

impl fmt::Debug for AppKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "AppKey(<redacted> {} bits)",
            self.pair.public().modulus_len() * 8
        )
    }
}

impl AppKey {
    /// Parses a PEM private key. `secret` names where it came from (for messages).
    pub fn from_pem(pem: &Sensitive, secret: &str) -> Result<AppKey, AuthError> {
        let bad = |why| AuthError::BadKey {
            secret: secret.to_string(),
            why,
        };
        let text = pem.as_str().ok_or_else(|| bad("it is not UTF-8 text"))?;
        let (label, body) = pem_body(text).ok_or_else(|| bad("it has no PEM block"))?;
        let der = Sensitive::new(
            STANDARD
                .decode(body.as_bytes())
                .map_err(|_| bad("its PEM body is not base64"))?,
        );
        let pair = match label.as_str() {
            "RSA PRIVATE KEY" => RsaKeyPair::from_der(der.as_bytes()),
            "PRIVATE KEY" => RsaKeyPair::from_pkcs8(der.as_bytes()),
            _ => return Err(bad("it is not an RSA private key")),
        }
        .map_err(|_| bad("ring refused it as an RSA key of 2048 bits or more"))?;
        Ok(AppKey {
            pair: Box::new(pair),
        })
    }

    /// The JWT GitHub accepts from the App (`now` in UTC epoch seconds).
    pub fn jwt(&self, app_id: u64, now: i64) -> Result<Sensitive, AuthError> {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
        let claims = URL_SAFE_NO_PAD.encode(
            format!(
                r#"{{"iat":{},"exp":{},"iss":"{app_id}"}}"#,
                now - 60,
                now + 9 * 60
            )
            .as_bytes(),
        );
        let signing_input = format!("{header}.{claims}");
        let mut signature = vec![0u8; self.pair.public().modulus_len()];
        self.pair
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signing_input.as_bytes(),
                &mut signature,
            )
            .map_err(|_| AuthError::Sign { app_id })?;
        Ok(Sensitive::new(
            format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature)).into_bytes(),
        ))
    }
}

/// The label and the base64 body of the first PEM block.
fn pem_body(text: &str) -> Option<(String, String)> {
    let mut lines = text.lines().map(str::trim);
    let label = lines
        .by_ref()
        .find_map(|l| l.strip_prefix("-----BEGIN ")?.strip_suffix("-----"))?
        .to_string();
    let end = format!("-----END {label}-----");
    let mut body = String::new();
    for line in lines {
        if line == end {
            return Some((label, body));
        }
        if line.contains(':') {
            // Encrypted PEM headers (`Proc-Type:`): not supported.
            return None;
        }
        body.push_str(line);
    }
    None
}

/// How the Job Site authenticates.
#[derive(Debug)]
pub enum Credentials {
    /// A token (fine-grained or classic PAT, or any bearer token) read from a Secret.
    Token {
        /// The token.
        token: Sensitive,
        /// `namespace/name` of its Secret (for messages).
        secret: String,
    },
    /// A GitHub App installation.
    App {
        /// App id.
        app_id: u64,
        /// Installation id (of the App on the project's repository or organization).
        installation_id: u64,
        /// Its private key.
        key: AppKey,
    },
}

/// A bearer token with its expiry (UTC epoch seconds; `None`: does not expire).
#[derive(Clone, Debug)]
pub struct Bearer {
    /// The token.
    pub token: Sensitive,
    /// When it expires.
    pub expires_at: Option<i64>,
}

impl Bearer {
    /// Whether it is still good at `now` with the refresh margin to spare.
    pub fn fresh_at(&self, now: i64) -> bool {
        let margin = i64::try_from(REFRESH_MARGIN.as_secs()).unwrap_or(300);
        self.expires_at.is_none_or(|at| now + margin < at)
    }
}

/// Checks that a token can be sent as `Authorization: Bearer …` (printable ASCII, no spaces).
pub fn check_token(token: &Sensitive, secret: &str) -> Result<(), AuthError> {
    let ok = !token.as_bytes().is_empty() && token.as_bytes().iter().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(())
    } else {
        Err(AuthError::BadToken {
            secret: secret.to_string(),
        })
    }
}

/// `Bearer <token>` as a header value marked sensitive (HTTP layers never log it).
pub fn authorization(token: &Sensitive) -> Option<http::HeaderValue> {
    let mut value = Vec::with_capacity(token.as_bytes().len() + 7);
    value.extend_from_slice(b"Bearer ");
    value.extend_from_slice(token.as_bytes());
    let value = Sensitive::new(value);
    let mut header = http::HeaderValue::from_bytes(value.as_bytes()).ok()?;
    header.set_sensitive(true);
    Some(header)
}

/// Parses GitHub's `expires_at` (RFC 3339) to epoch seconds.
pub fn parse_expiry(text: &str) -> Option<i64> {
    text.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const KEY: &str = include_str!("../tests/fixtures/test-app-key.pem");
    const PUBLIC: &[u8] = include_bytes!("../tests/fixtures/test-app-key.pub.der");

    #[test]
    fn the_jwt_is_rs256_with_the_documented_claims_and_verifies() {
        let key = AppKey::from_pem(&Sensitive::new(KEY.as_bytes().to_vec()), "ns/app").unwrap();
        let jwt = key.jwt(12345, 1_000_000).unwrap();
        let jwt = jwt.as_str().unwrap();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(claims["iss"], "12345");
        assert_eq!(claims["iat"], 1_000_000 - 60);
        assert_eq!(claims["exp"], 1_000_000 + 540);
        let header: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
        assert_eq!(header["alg"], "RS256");
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        ring::signature::UnparsedPublicKey::new(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            PUBLIC,
        )
        .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature)
        .unwrap();
    }

    #[test]
    fn bad_keys_are_refused_without_echoing_them() {
        for (pem, why) in [
            ("not a key", "no PEM block"),
            (
                "-----BEGIN RSA PRIVATE KEY-----\n!!!!\n-----END RSA PRIVATE KEY-----\n",
                "base64",
            ),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n",
                "ring refused",
            ),
            (
                "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n",
                "not an RSA",
            ),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nAAAA\n-----END RSA PRIVATE KEY-----\n",
                "no PEM block",
            ),
        ] {
            let e =
                AppKey::from_pem(&Sensitive::new(pem.as_bytes().to_vec()), "ns/app").unwrap_err();
            let text = e.to_string();
            assert!(text.contains(why), "{text}");
            assert!(text.contains("ns/app"), "{text}");
            assert!(!text.contains("AAAA"), "{text}");
        }
        let key = AppKey::from_pem(&Sensitive::new(KEY.as_bytes().to_vec()), "ns/app").unwrap();
        assert_eq!(format!("{key:?}"), "AppKey(<redacted> 2048 bits)");
    }

    #[test]
    fn tokens_must_be_header_safe_and_the_header_is_sensitive() {
        assert!(check_token(&Sensitive::new(b"ghs_abc".to_vec()), "s").is_ok());
        for bad in [&b""[..], b"a b", b"a\nb", "ä".as_bytes()] {
            let e = check_token(&Sensitive::new(bad.to_vec()), "ns/tok").unwrap_err();
            assert!(e.to_string().contains("ns/tok"));
        }
        let h = authorization(&Sensitive::new(b"ghs_abc".to_vec())).unwrap();
        assert!(h.is_sensitive());
        assert_eq!(format!("{h:?}"), "Sensitive");
    }

    #[test]
    fn a_bearer_is_refreshed_inside_the_margin() {
        let b = Bearer {
            token: Sensitive::new(b"ghs_distinctive".to_vec()),
            expires_at: Some(10_000),
        };
        assert!(b.fresh_at(10_000 - 301));
        assert!(!b.fresh_at(10_000 - 300));
        assert_eq!(parse_expiry("2026-12-02T03:00:00Z"), Some(1_796_180_400));
        assert_eq!(parse_expiry("tomorrow"), None);
        assert!(!format!("{b:?}").contains("distinctive"), "{b:?}");
    }
}
