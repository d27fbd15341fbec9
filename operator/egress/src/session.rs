//! Sessions: who is calling. The control plane registers one session per
//! sandbox run (work item, role, trace id, source commit) in a file the proxy
//! re-reads when it changes, and gives the sandbox its session token.
//!
//! The token is HMAC-SHA256 keyed with the proxy's session secret over the
//! four fields (length-prefixed, so no two field lists share a message), in
//! hex. Both sides derive it, so the sessions file holds no secret. Tokens
//! are compared in constant time, against every session, without stopping at
//! the first match.
//!
//! A *signed* session token (`pbs1.…`, [`issue_session_token`]) carries its
//! session and an expiry, authenticated with the same secret, so the proxy
//! needs no registration at all: the operator mints one per sandbox run,
//! valid until the run's deadline, and nothing has to reach the proxy before
//! the sandbox's first request. Registered sessions still work.
//!
//! Executable identity is optional: `X-Sandbox-Exec-Token` is HMAC-SHA256
//! keyed with the session token over the executable's digest. An in-guest
//! supervisor that holds the session token and measures the binary it runs
//! can attest the digest; a process that holds the session token itself can
//! attest any digest it likes, so this is only as strong as the supervisor's
//! keeping the session token from the workload. Without the header a request
//! has no executable identity, and rules that name a digest do not match it.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::SystemTime,
};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Request header carrying the session token.
pub const SESSION_TOKEN_HEADER: &str = "x-sandbox-session-token";
/// Request header naming the attested executable digest.
pub const EXEC_DIGEST_HEADER: &str = "x-sandbox-exec-digest";
/// Request header attesting it ([`exec_token`]).
pub const EXEC_TOKEN_HEADER: &str = "x-sandbox-exec-token";

const SESSION_CONTEXT: &[u8] = b"protobot-egress-session/v1";
const SIGNED_CONTEXT: &[u8] = b"protobot-egress-signed-session/v1";
/// Prefix of signed session tokens ([`issue_session_token`]).
pub const SIGNED_TOKEN_PREFIX: &str = "pbs1.";
const EXEC_CONTEXT: &[u8] = b"protobot-egress-exec/v1";

/// A registered sandbox session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Session {
    /// The work item the run belongs to.
    pub work_item: String,
    /// The sandboxed role (`worker-a`, …): what rules match on.
    pub role: String,
    /// The run's trace id.
    pub trace_id: String,
    /// The commit the run's projection was built from.
    pub source_commit: String,
    /// The project, for usage attribution (empty when not known).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub project: String,
    /// The build stage (`worker-a`, `worker-b`, `inspection`, …), for usage
    /// attribution (empty when not known).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stage: String,
    /// The build cycle (0 outside build cycles).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cycle: u32,
    /// The escalation tier the run's worker class belongs to (empty when not known).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tier: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The sessions file: `{"sessions": [...]}` (YAML or JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionsDocument {
    /// The registered sessions.
    #[serde(default)]
    pub sessions: Vec<Session>,
}

/// Why sessions or the secret could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// A file could not be read.
    #[error("failed to read {what} {path}")]
    Read {
        /// `sessions file` or `session secret`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The sessions file does not have the expected shape.
    #[error(
        "failed to parse sessions file {path}: {source}; expected `sessions:` with workItem, role, traceId, sourceCommit"
    )]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// The secret is too short to key anything.
    #[error(
        "session secret {path} has {len} bytes; write at least 32 random bytes (e.g. `head -c 32 /dev/urandom | base64`)"
    )]
    WeakSecret {
        /// The file.
        path: PathBuf,
        /// Its length after trimming.
        len: usize,
    },
}

/// The proxy's session secret (never printed).
#[derive(Clone)]
pub struct SessionSecret(Vec<u8>);

impl std::fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionSecret(<redacted>)")
    }
}

impl SessionSecret {
    /// Minimum length in bytes.
    pub const MIN_LEN: usize = 32;

    /// A secret from bytes (tests and callers that hold it already).
    pub fn new(bytes: impl Into<Vec<u8>>) -> SessionSecret {
        SessionSecret(bytes.into())
    }

    /// Reads a secret file (trailing whitespace trimmed; at least 32 bytes).
    pub fn load(path: &Path) -> Result<SessionSecret, SessionError> {
        let bytes = std::fs::read(path).map_err(|source| SessionError::Read {
            what: "session secret",
            path: path.to_owned(),
            source,
        })?;
        let len = bytes.trim_ascii_end().len();
        if len < Self::MIN_LEN {
            return Err(SessionError::WeakSecret {
                path: path.to_owned(),
                len,
            });
        }
        Ok(SessionSecret(bytes[..len].to_vec()))
    }
}

/// HMAC-SHA256 (RFC 2104) over `parts`, each length-prefixed.
fn hmac(key: &[u8], context: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for part in std::iter::once(context).chain(parts.iter().copied()) {
        inner.update((part.len() as u64).to_be_bytes());
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// The session token the control plane hands to the sandbox of `session`.
pub fn session_token(secret: &SessionSecret, session: &Session) -> String {
    let cycle = session.cycle.to_string();
    let mut parts: Vec<&[u8]> = vec![
        session.work_item.as_bytes(),
        session.role.as_bytes(),
        session.trace_id.as_bytes(),
        session.source_commit.as_bytes(),
    ];
    // The attribution fields join the MAC only when set, so a session without
    // them keeps the token it always had.
    let attributed = !session.project.is_empty()
        || !session.stage.is_empty()
        || session.cycle != 0
        || !session.tier.is_empty();
    if attributed {
        parts.extend([
            session.project.as_bytes(),
            session.stage.as_bytes(),
            cycle.as_bytes(),
            session.tier.as_bytes(),
        ]);
    }
    hex::encode(hmac(&secret.0, SESSION_CONTEXT, &parts))
}

/// What a signed session token carries.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SignedClaims {
    work_item: String,
    role: String,
    trace_id: String,
    source_commit: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    project: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    stage: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    cycle: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    tier: String,
    /// Unix seconds after which the token is refused.
    expires_at: i64,
}

/// A self-contained session token for `session`, valid until
/// `expires_at_unix` (seconds): `pbs1.<hex of the claims JSON>.<hex of
/// HMAC-SHA256 over it, keyed with the secret>`. Not secret from the sandbox
/// it is given to; it names only that sandbox's session.
pub fn issue_session_token(
    secret: &SessionSecret,
    session: &Session,
    expires_at_unix: i64,
) -> String {
    let claims = SignedClaims {
        work_item: session.work_item.clone(),
        role: session.role.clone(),
        trace_id: session.trace_id.clone(),
        source_commit: session.source_commit.clone(),
        project: session.project.clone(),
        stage: session.stage.clone(),
        cycle: session.cycle,
        tier: session.tier.clone(),
        expires_at: expires_at_unix,
    };
    // Serializing plain strings and an integer cannot fail.
    let payload = serde_json::to_vec(&claims).unwrap_or_default();
    let mac = hmac(&secret.0, SIGNED_CONTEXT, &[&payload]);
    format!(
        "{SIGNED_TOKEN_PREFIX}{}.{}",
        hex::encode(&payload),
        hex::encode(mac)
    )
}

/// The session of a signed token, if `secret` signed it and it has not
/// expired at `now_unix`. The MAC is compared in constant time before the
/// claims are parsed.
pub fn verify_session_token(secret: &SessionSecret, token: &str, now_unix: i64) -> Option<Session> {
    let rest = token.strip_prefix(SIGNED_TOKEN_PREFIX)?;
    let (payload_hex, mac_hex) = rest.split_once('.')?;
    let payload = hex::decode(payload_hex).ok()?;
    let expected = hex::encode(hmac(&secret.0, SIGNED_CONTEXT, &[&payload]));
    if !tokens_equal(&expected, mac_hex) {
        return None;
    }
    let claims: SignedClaims = serde_json::from_slice(&payload).ok()?;
    if now_unix >= claims.expires_at {
        return None;
    }
    Some(Session {
        work_item: claims.work_item,
        role: claims.role,
        trace_id: claims.trace_id,
        source_commit: claims.source_commit,
        project: claims.project,
        stage: claims.stage,
        cycle: claims.cycle,
        tier: claims.tier,
    })
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The `X-Sandbox-Exec-Token` attesting `digest` within the session of `token`.
pub fn exec_token(session_token: &str, digest: &str) -> String {
    hex::encode(hmac(
        session_token.as_bytes(),
        EXEC_CONTEXT,
        &[digest.as_bytes()],
    ))
}

/// Constant-time equality of two strings (length is not secret).
pub fn tokens_equal(a: &str, b: &str) -> bool {
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

/// The registered sessions with their derived tokens.
#[derive(Clone, Debug, Default)]
struct Table {
    entries: Vec<(String, Arc<Session>)>,
}

/// Registered sessions, shared between the server and the reloader.
#[derive(Clone, Debug)]
pub struct SessionRegistry {
    secret: SessionSecret,
    table: Arc<RwLock<Table>>,
}

impl SessionRegistry {
    /// An empty registry (every caller is unauthenticated until sessions are set).
    pub fn new(secret: SessionSecret) -> SessionRegistry {
        SessionRegistry {
            secret,
            table: Arc::new(RwLock::new(Table::default())),
        }
    }

    /// Replaces every session.
    pub fn replace(&self, sessions: Vec<Session>) {
        let entries = sessions
            .into_iter()
            .map(|s| (session_token(&self.secret, &s), Arc::new(s)))
            .collect();
        // A poisoned lock only means a writer panicked mid-replace of a Vec;
        // the value is still a whole table, so keep serving it.
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        *table = Table { entries };
    }

    /// How many sessions are registered.
    pub fn len(&self) -> usize {
        self.table
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
    }

    /// Whether none is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The session of a signed token ([`verify_session_token`], against the
    /// clock), or else the registered session whose token is `token`,
    /// comparing against all of them in constant time each.
    pub fn authenticate(&self, token: &str) -> Option<Arc<Session>> {
        if token.starts_with(SIGNED_TOKEN_PREFIX) {
            return verify_session_token(&self.secret, token, unix_now()).map(Arc::new);
        }
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let mut found = None;
        for (candidate, session) in &table.entries {
            if tokens_equal(candidate, token) && found.is_none() {
                found = Some(Arc::clone(session));
            }
        }
        found
    }

    /// Reads a sessions file and replaces the registry's content with it.
    pub fn load_file(&self, path: &Path) -> Result<usize, SessionError> {
        let text = std::fs::read_to_string(path).map_err(|source| SessionError::Read {
            what: "sessions file",
            path: path.to_owned(),
            source,
        })?;
        let doc: SessionsDocument = if text.trim().is_empty() {
            SessionsDocument::default()
        } else {
            serde_yaml_ng::from_str(&text).map_err(|source| SessionError::Parse {
                path: path.to_owned(),
                source,
            })?
        };
        let n = doc.sessions.len();
        self.replace(doc.sessions);
        Ok(n)
    }

    /// Re-reads `path` whenever its modification time differs from the one
    /// seen when this is called, checking every `every`, until the future is
    /// dropped. A file that cannot be read or parsed leaves the previous
    /// sessions in place and is reported once per change.
    pub fn watch_file(
        self,
        path: PathBuf,
        every: std::time::Duration,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        // Taken now, not at the first poll: a change made between this call
        // and the task's first run must still count as a change.
        let seen = mtime(&path);
        self.watch_from(path, every, seen)
    }

    async fn watch_from(
        self,
        path: PathBuf,
        every: std::time::Duration,
        mut seen: Option<SystemTime>,
    ) {
        let mut ticker = tokio::time::interval(every);
        loop {
            ticker.tick().await;
            let now = mtime(&path);
            if now == seen {
                continue;
            }
            seen = now;
            match self.load_file(&path) {
                Ok(n) => tracing::info!(
                    target: "protobot::egress",
                    sessions = n,
                    path = %path.display(),
                    "reloaded the sessions file"
                ),
                Err(error) => tracing::warn!(
                    target: "protobot::egress",
                    error = %error,
                    "kept the previous sessions: the sessions file could not be loaded"
                ),
            }
        }
    }
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(role: &str) -> Session {
        Session {
            work_item: "wi-1".into(),
            role: role.into(),
            trace_id: "trace-1".into(),
            source_commit: "abc123".into(),
            ..Default::default()
        }
    }

    fn secret() -> SessionSecret {
        SessionSecret::new(vec![7u8; 32])
    }

    #[test]
    fn hmac_matches_rfc4231_test_case_2_without_framing() {
        // Sanity of the construction: with an empty context and no framing the
        // function is plain HMAC; here we re-derive RFC 4231 case 2 by hand.
        fn plain(key: &[u8], msg: &[u8]) -> [u8; 32] {
            let mut k = [0u8; 64];
            k[..key.len()].copy_from_slice(key);
            let mut i = Sha256::new();
            i.update(k.map(|b| b ^ 0x36));
            i.update(msg);
            let mut o = Sha256::new();
            o.update(k.map(|b| b ^ 0x5c));
            o.update(i.finalize());
            o.finalize().into()
        }
        assert_eq!(
            hex::encode(plain(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn tokens_depend_on_every_field_and_the_secret() {
        let base = session_token(&secret(), &session("worker-b"));
        assert_eq!(base.len(), 64);
        assert_eq!(base, session_token(&secret(), &session("worker-b")));
        let mut variants = vec![
            session_token(&SessionSecret::new(vec![8u8; 32]), &session("worker-b")),
            session_token(&secret(), &session("worker-a")),
        ];
        for f in [
            (|s: &mut Session| s.work_item = "wi-2".into()) as fn(&mut Session),
            |s| s.trace_id = "trace-2".into(),
            |s| s.source_commit = "def456".into(),
        ] {
            let mut s = session("worker-b");
            f(&mut s);
            variants.push(session_token(&secret(), &s));
        }
        for v in variants {
            assert_ne!(v, base);
        }
        // Length prefixes keep field boundaries apart.
        let a = Session {
            work_item: "ab".into(),
            role: "c".into(),
            ..session("x")
        };
        let b = Session {
            work_item: "a".into(),
            role: "bc".into(),
            ..session("x")
        };
        assert_ne!(session_token(&secret(), &a), session_token(&secret(), &b));
    }

    #[test]
    fn the_registry_authenticates_only_registered_tokens() {
        let reg = SessionRegistry::new(secret());
        let token = session_token(&secret(), &session("worker-b"));
        assert!(reg.authenticate(&token).is_none());
        reg.replace(vec![session("worker-a"), session("worker-b")]);
        assert_eq!(reg.len(), 2);
        assert_eq!(reg.authenticate(&token).unwrap().role, "worker-b");
        assert!(reg.authenticate("").is_none());
        assert!(reg.authenticate(&token[..63]).is_none());
        assert!(reg.authenticate(&token.to_uppercase()).is_none());
    }

    #[test]
    fn usage_attribution_rides_in_the_token_and_leaves_old_tokens_alone() {
        let plain = session("worker-b");
        // The token a session without attribution always had (before the fields existed).
        assert_eq!(
            session_token(&secret(), &plain),
            hex::encode(hmac(
                &secret().0,
                SESSION_CONTEXT,
                &[b"wi-1", b"worker-b", b"trace-1", b"abc123"]
            ))
        );
        let attributed = Session {
            project: "shop".into(),
            stage: "worker-b".into(),
            cycle: 3,
            tier: "premium".into(),
            ..plain.clone()
        };
        assert_ne!(
            session_token(&secret(), &plain),
            session_token(&secret(), &attributed)
        );
        for changed in [
            Session {
                tier: "standard".into(),
                ..attributed.clone()
            },
            Session {
                cycle: 4,
                ..attributed.clone()
            },
        ] {
            assert_ne!(
                session_token(&secret(), &changed),
                session_token(&secret(), &attributed)
            );
        }
        let token = issue_session_token(&secret(), &attributed, 1_000);
        assert_eq!(verify_session_token(&secret(), &token, 0), Some(attributed));
        // A token minted before the fields existed still verifies, unattributed.
        let old = r#"{"workItem":"wi-1","role":"worker-b","traceId":"trace-1","sourceCommit":"abc123","expiresAt":1000}"#;
        let mac = hex::encode(hmac(&secret().0, SIGNED_CONTEXT, &[old.as_bytes()]));
        let old = format!("{SIGNED_TOKEN_PREFIX}{}.{mac}", hex::encode(old));
        assert_eq!(verify_session_token(&secret(), &old, 0), Some(plain));
    }

    #[test]
    fn signed_tokens_carry_their_session_until_they_expire() {
        let s = session("worker-b");
        let token = issue_session_token(&secret(), &s, 1_000);
        assert!(token.starts_with(SIGNED_TOKEN_PREFIX));
        assert_eq!(
            verify_session_token(&secret(), &token, 999),
            Some(s.clone())
        );
        assert_eq!(
            verify_session_token(&secret(), &token, 1_000),
            None,
            "expired"
        );
        let other = SessionSecret::new(vec![9u8; 32]);
        assert_eq!(
            verify_session_token(&other, &token, 0),
            None,
            "another secret"
        );
        // Any change to the claims breaks the MAC: here, a longer expiry.
        let (payload, mac) = token[SIGNED_TOKEN_PREFIX.len()..].split_once('.').unwrap();
        let claims = String::from_utf8(hex::decode(payload).unwrap()).unwrap();
        let forged = claims.replace("1000", "9999999999");
        let forged = format!("{SIGNED_TOKEN_PREFIX}{}.{mac}", hex::encode(forged));
        assert_eq!(
            verify_session_token(&secret(), &forged, 0),
            None,
            "forged claims"
        );
        for junk in ["pbs1.", "pbs1.zz.zz", "pbs1..", &token[..token.len() - 1]] {
            assert_eq!(verify_session_token(&secret(), junk, 0), None, "{junk}");
        }
        // The registry accepts a live signed token with no registration.
        let reg = SessionRegistry::new(secret());
        let live = issue_session_token(&secret(), &s, unix_now() + 60);
        assert_eq!(reg.authenticate(&live).as_deref(), Some(&s));
        let stale = issue_session_token(&secret(), &s, unix_now() - 1);
        assert!(reg.authenticate(&stale).is_none());
    }

    #[test]
    fn exec_tokens_bind_the_digest_to_the_session() {
        let t = session_token(&secret(), &session("worker-b"));
        let other = session_token(&secret(), &session("worker-a"));
        let d = "sha256:00";
        assert_eq!(exec_token(&t, d), exec_token(&t, d));
        assert_ne!(exec_token(&t, d), exec_token(&other, d));
        assert_ne!(exec_token(&t, d), exec_token(&t, "sha256:01"));
    }

    #[test]
    fn sessions_files_load_and_bad_ones_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.yaml");
        std::fs::write(
            &path,
            "sessions:\n  - workItem: wi-1\n    role: worker-b\n    traceId: trace-1\n    sourceCommit: abc123\n",
        )
        .unwrap();
        let reg = SessionRegistry::new(secret());
        assert_eq!(reg.load_file(&path).unwrap(), 1);
        std::fs::write(&path, "").unwrap();
        assert_eq!(reg.load_file(&path).unwrap(), 0);
        std::fs::write(&path, "sessions:\n  - workItem: wi-1\n    token: x\n").unwrap();
        let err = reg.load_file(&path).unwrap_err();
        assert!(err.to_string().contains("sessions.yaml"), "{err}");
    }

    #[test]
    fn short_secrets_are_refused_and_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "short\n").unwrap();
        assert!(matches!(
            SessionSecret::load(&path),
            Err(SessionError::WeakSecret { len: 5, .. })
        ));
        std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
        let s = SessionSecret::load(&path).unwrap();
        assert!(!format!("{s:?}").contains("0123"));
    }

    #[tokio::test]
    async fn the_watcher_reloads_when_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.json");
        std::fs::write(&path, r#"{"sessions":[]}"#).unwrap();
        let reg = SessionRegistry::new(secret());
        reg.load_file(&path).unwrap();
        let task = tokio::spawn(
            reg.clone()
                .watch_file(path.clone(), std::time::Duration::from_millis(10)),
        );
        let doc = SessionsDocument {
            sessions: vec![session("worker-b")],
        };
        std::fs::write(&path, serde_json::to_string(&doc).unwrap()).unwrap();
        // Make the change visible even on file systems with coarse mtimes.
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(SystemTime::now() + std::time::Duration::from_secs(5))
            .unwrap();
        for _ in 0..500 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            if reg.len() == 1 {
                break;
            }
        }
        assert_eq!(reg.len(), 1);
        task.abort();
    }
}
