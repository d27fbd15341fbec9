//! Access to a project's remote over HTTPS and SSH: which credentials an operation may use,
//! and the checks of the server it talks to.
//!
//! Pure core: [`RemoteUrl::parse`] (refuses URLs that carry credentials),
//! [`Credentials::from_secret_data`] (the Secret's keys for the URL's transport),
//! [`KnownHosts`] (OpenSSH `known_hosts`, hashed names and `[host]:port` included).
//! Git edge: [`Session`], the callbacks of one fetch, push or ls-remote.
//!
//! Credentials live only in memory and only for one operation: a repository records *which*
//! Secret its remote authenticates with ([`bind_secret`]: `remote.<name>.protobotCredentials
//! = <namespace>/<name>`, a reference, never a credential), and every operation asks the
//! process's [`ResolveCredentials`] ([`install_resolver`]) for the Secret's current content,
//! then drops it. Nothing derived from a credential is written to `.git/config`, to a URL, to
//! an error message or to a log. After a failed operation, [`Session::failure`] says what
//! the callbacks saw (credentials refused, host key changed or unknown, certificate not
//! trusted) as a typed [`AccessError`], so callers never match libgit2's message text.

use std::{
    cell::RefCell,
    collections::BTreeMap,
    fmt,
    sync::{Arc, RwLock},
};

use git2::{
    CertificateCheckStatus, Cred, CredentialType, FetchOptions, PushOptions, RemoteCallbacks,
    Repository,
};
use sha1::Sha1;
use sha2::{Digest, Sha256};

/// The git config key (under `remote.<name>.`) naming the Secret a remote authenticates with.
pub const SECRET_CONFIG_KEY: &str = "protobotCredentials";
/// Username for a `token` when the Secret names none (GitHub's and Gitea's convention;
/// GitLab wants `oauth2`, Bitbucket `x-token-auth`: set `username` for those).
pub const DEFAULT_TOKEN_USERNAME: &str = "x-access-token";
/// SSH username when neither the URL nor the Secret names one.
pub const DEFAULT_SSH_USERNAME: &str = "git";

/// Secret keys, as `kubernetes.io/basic-auth` and `kubernetes.io/ssh-auth` name them.
pub mod keys {
    /// HTTPS username (`kubernetes.io/basic-auth`); SSH username override.
    pub const USERNAME: &str = "username";
    /// HTTPS password (`kubernetes.io/basic-auth`).
    pub const PASSWORD: &str = "password";
    /// HTTPS token (instead of `password`).
    pub const TOKEN: &str = "token";
    /// PEM CA certificate(s) trusted for the HTTPS server, beside the system's.
    pub const CA: &str = "ca.crt";
    /// SSH private key (`kubernetes.io/ssh-auth`), OpenSSH or PEM format.
    pub const SSH_PRIVATE_KEY: &str = "ssh-privatekey";
    /// Passphrase of the SSH private key, when it has one.
    pub const SSH_PASSPHRASE: &str = "ssh-passphrase";
    /// OpenSSH `known_hosts` lines: the only host keys an SSH connection accepts.
    pub const KNOWN_HOSTS: &str = "known_hosts";
}

// === SecretRef ===

/// The Secret (namespace and name) a remote's credentials come from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SecretRef {
    /// Namespace of the Secret (always the Project's).
    pub namespace: String,
    /// Name of the Secret.
    pub name: String,
}

impl SecretRef {
    /// The Secret `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> SecretRef {
        SecretRef {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Parses `namespace/name` (what [`bind_secret`] records).
    pub fn parse(text: &str) -> Option<SecretRef> {
        let (namespace, name) = text.split_once('/')?;
        (!namespace.is_empty() && !name.is_empty() && !name.contains('/'))
            .then(|| SecretRef::new(namespace, name))
    }
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

// === Sensitive ===

/// A credential's bytes: never printed (`Debug` shows `<redacted>`), overwritten when dropped.
pub struct Sensitive(Vec<u8>);

impl Sensitive {
    /// Wraps `bytes`.
    pub fn new(bytes: Vec<u8>) -> Sensitive {
        Sensitive(bytes)
    }

    /// The value as text (libgit2 takes C strings), `None` when it is not UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// The raw bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl Clone for Sensitive {
    fn clone(&self) -> Self {
        Sensitive(self.0.clone())
    }
}

impl fmt::Debug for Sensitive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Drop for Sensitive {
    fn drop(&mut self) {
        // Best effort: libgit2 and libssh2 keep their own copies while a connection lives.
        self.0.fill(0);
        std::hint::black_box(&self.0);
    }
}

// === RemoteUrl ===

/// How a remote is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A path on this machine (`/srv/x.git`, `file://…`): no credentials.
    Local,
    /// `https://`.
    Https,
    /// `http://`: never given credentials.
    Http,
    /// `ssh://` or scp-like `user@host:path`.
    Ssh,
    /// `git://`: unauthenticated.
    Git,
}

impl Transport {
    /// Lower-case name for messages.
    pub fn as_str(&self) -> &'static str {
        match self {
            Transport::Local => "local",
            Transport::Https => "https",
            Transport::Http => "http",
            Transport::Ssh => "ssh",
            Transport::Git => "git",
        }
    }
}

/// A remote URL that carries no credentials, with its transport, host and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteUrl {
    /// The URL as written.
    pub url: String,
    /// Its transport.
    pub transport: Transport,
    /// Host (empty for local paths), without brackets.
    pub host: String,
    /// Port, when the URL names one.
    pub port: Option<u16>,
    /// SSH username from the URL (`ssh://git@…`, `git@host:path`).
    pub username: Option<String>,
}

/// Why a remote URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// The URL carries a password or token.
    #[error(
        "refusing the repository URL {redacted}: it carries credentials; remove them from the URL and put them in the Secret that spec.credentialsSecretRef names (keys username/password or token for https, ssh-privatekey and known_hosts for ssh; see docs/repositories.md)"
    )]
    CredentialsInUrl {
        /// The URL with its user-info replaced by `***`.
        redacted: String,
    },
    /// The URL cannot be parsed.
    #[error("unable to use the repository URL {url}: {why}")]
    Invalid {
        /// The URL (it carries no credentials: those are refused first).
        url: String,
        /// What is wrong.
        why: &'static str,
    },
}

impl RemoteUrl {
    /// Parses `url`, refusing user-info with a password (any scheme) and any user-info on
    /// http(s) (a token may be written as the user name).
    pub fn parse(url: &str) -> Result<RemoteUrl, UrlError> {
        let invalid = |why| UrlError::Invalid {
            url: url.to_owned(),
            why,
        };
        if let Some((scheme, rest)) = url.split_once("://") {
            let transport = match scheme.to_ascii_lowercase().as_str() {
                "file" => Transport::Local,
                "https" => Transport::Https,
                "http" => Transport::Http,
                "ssh" | "git+ssh" | "ssh+git" => Transport::Ssh,
                "git" => Transport::Git,
                _ => return Err(invalid("the scheme is not file, https, http, ssh or git")),
            };
            if transport == Transport::Local {
                return Ok(RemoteUrl::local(url));
            }
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let authority = &rest[..end];
            let (userinfo, hostport) = match authority.rsplit_once('@') {
                Some((u, h)) => (Some(u), h),
                None => (None, authority),
            };
            if let Some(userinfo) = userinfo {
                let web = matches!(transport, Transport::Https | Transport::Http);
                if web || userinfo.contains(':') {
                    return Err(UrlError::CredentialsInUrl {
                        redacted: format!("{scheme}://***@{hostport}{}", &rest[end..]),
                    });
                }
            }
            let (host, port) = split_host_port(hostport).ok_or_else(|| invalid("bad host:port"))?;
            if host.is_empty() {
                return Err(invalid("the URL has no host"));
            }
            return Ok(RemoteUrl {
                url: url.to_owned(),
                transport,
                host,
                port,
                username: userinfo.map(str::to_owned),
            });
        }
        // scp-like `[user@]host:path` (no slash before the colon); anything else is a path.
        if !url.starts_with('/') && !url.starts_with('.') {
            let head = url.split('/').next().unwrap_or_default();
            let (user, rest) = match head.rsplit_once('@') {
                Some((u, r)) => (Some(u), r),
                None => (None, head),
            };
            if let Some((host, _)) = rest.split_once(':')
                && !host.is_empty()
            {
                if user.is_some_and(|u| u.contains(':')) {
                    return Err(UrlError::CredentialsInUrl {
                        redacted: format!("***@{}", &url[url.rfind('@').map_or(0, |i| i + 1)..]),
                    });
                }
                return Ok(RemoteUrl {
                    url: url.to_owned(),
                    transport: Transport::Ssh,
                    host: host
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_owned(),
                    port: None,
                    username: user.map(str::to_owned),
                });
            }
        }
        Ok(RemoteUrl::local(url))
    }

    fn local(url: &str) -> RemoteUrl {
        RemoteUrl {
            url: url.to_owned(),
            transport: Transport::Local,
            host: String::new(),
            port: None,
            username: None,
        }
    }

    /// The name `known_hosts` lists this server under: `host`, or `[host]:port` off port 22.
    pub fn known_hosts_name(&self) -> String {
        match self.port {
            Some(p) if p != 22 => format!("[{}]:{p}", self.host),
            _ => self.host.clone(),
        }
    }
}

fn split_host_port(hostport: &str) -> Option<(String, Option<u16>)> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((host.to_owned(), port));
    }
    match hostport.rsplit_once(':') {
        Some((host, p)) if !p.is_empty() => Some((host.to_owned(), Some(p.parse().ok()?))),
        Some((host, _)) => Some((host.to_owned(), None)),
        None => Some((hostport.to_owned(), None)),
    }
}

// === Credentials ===

/// Credentials for one operation, read from the Secret just before it.
#[derive(Clone, Debug)]
pub enum Credentials {
    /// HTTPS basic auth (a token is a password).
    Https {
        /// Username.
        username: String,
        /// Password or token.
        password: Sensitive,
        /// Extra trusted CA certificates (PEM), from `ca.crt`.
        ca: Option<Vec<u8>>,
    },
    /// An SSH key and the host keys to accept.
    Ssh {
        /// Username override (`username` key); the URL's user otherwise.
        username: Option<String>,
        /// The private key (OpenSSH or PEM).
        private_key: Sensitive,
        /// Its passphrase.
        passphrase: Option<Sensitive>,
        /// The accepted host keys.
        known_hosts: KnownHosts,
    },
}

impl Credentials {
    /// The credentials for `url`'s transport from a Secret's `data` (pure). The error names
    /// the Secret and the keys it needs; it never contains a value.
    pub fn from_secret_data(
        secret: &SecretRef,
        url: &RemoteUrl,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<Credentials, AccessError> {
        let text = |key: &'static str| -> Result<Option<String>, AccessError> {
            match data.get(key) {
                None => Ok(None),
                Some(v) => String::from_utf8(v.clone())
                    .map(|s| Some(s.trim_end_matches(['\n', '\r']).to_owned()))
                    .map_err(|_| AccessError::SecretIncomplete {
                        secret: secret.clone(),
                        transport: url.transport.as_str(),
                        problem: format!("key {key} is not UTF-8 text"),
                    }),
            }
        };
        let incomplete = |problem: String| AccessError::SecretIncomplete {
            secret: secret.clone(),
            transport: url.transport.as_str(),
            problem,
        };
        match url.transport {
            Transport::Https => {
                let token = text(keys::TOKEN)?;
                let password = text(keys::PASSWORD)?;
                let username = text(keys::USERNAME)?;
                let (username, password) = match (token, password, username) {
                    (Some(t), _, u) => (u.unwrap_or_else(|| DEFAULT_TOKEN_USERNAME.into()), t),
                    (None, Some(p), Some(u)) => (u, p),
                    (None, Some(_), None) => {
                        return Err(incomplete(format!(
                            "it has {} but no {}",
                            keys::PASSWORD,
                            keys::USERNAME
                        )));
                    }
                    (None, None, _) => {
                        return Err(incomplete(format!(
                            "it has neither {} nor {}/{}",
                            keys::TOKEN,
                            keys::USERNAME,
                            keys::PASSWORD
                        )));
                    }
                };
                if password.is_empty() {
                    return Err(incomplete("its password or token is empty".into()));
                }
                Ok(Credentials::Https {
                    username,
                    password: Sensitive::new(password.into_bytes()),
                    ca: data.get(keys::CA).cloned(),
                })
            }
            Transport::Ssh => {
                let key = text(keys::SSH_PRIVATE_KEY)?
                    .filter(|k| !k.trim().is_empty())
                    .ok_or_else(|| incomplete(format!("it has no {}", keys::SSH_PRIVATE_KEY)))?;
                let known = text(keys::KNOWN_HOSTS)?.ok_or_else(|| {
                    incomplete(format!(
                        "it has no {} (the host keys to accept: ssh-keyscan output, checked out of band)",
                        keys::KNOWN_HOSTS
                    ))
                })?;
                let known_hosts = KnownHosts::parse(&known);
                if known_hosts.is_empty() {
                    return Err(incomplete(format!(
                        "its {} lists no host key",
                        keys::KNOWN_HOSTS
                    )));
                }
                Ok(Credentials::Ssh {
                    username: text(keys::USERNAME)?,
                    // libssh2 wants the key to end with a newline.
                    private_key: Sensitive::new(format!("{}\n", key.trim_end()).into_bytes()),
                    passphrase: text(keys::SSH_PASSPHRASE)?.map(|p| Sensitive::new(p.into_bytes())),
                    known_hosts,
                })
            }
            Transport::Http => Err(AccessError::PlainHttp {
                secret: secret.clone(),
            }),
            Transport::Local | Transport::Git => Err(incomplete(format!(
                "a {} remote takes no credentials; remove spec.credentialsSecretRef",
                url.transport.as_str()
            ))),
        }
    }
}

// === KnownHosts ===

/// One `known_hosts` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HostEntry {
    revoked: bool,
    patterns: HostPatterns,
    key_type: String,
    key: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostPatterns {
    /// `host,[host]:port,*.example.com,!bad.example.com`.
    Plain(Vec<String>),
    /// `|1|salt|hash` (HMAC-SHA1 of the name, keyed by the salt).
    Hashed { salt: Vec<u8>, hash: Vec<u8> },
}

/// OpenSSH `known_hosts`: plain, wildcard, negated and hashed host names, `[host]:port`,
/// `@revoked`. `@cert-authority` lines are ignored (host certificates are not supported).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownHosts {
    entries: Vec<HostEntry>,
}

/// What [`KnownHosts::check`] found for a host key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostKeyCheck {
    /// The key is listed for the host.
    Known,
    /// The host is listed with other keys only (or this key is `@revoked`).
    Changed {
        /// Key types listed for the host.
        listed: Vec<String>,
    },
    /// The host is not listed.
    Unknown,
}

impl KnownHosts {
    /// Parses `known_hosts` text; lines that do not parse are skipped.
    pub fn parse(text: &str) -> KnownHosts {
        let mut entries = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut fields = line.split_whitespace().peekable();
            let mut revoked = false;
            if let Some(marker) = fields.peek().filter(|f| f.starts_with('@')) {
                match *marker {
                    "@revoked" => revoked = true,
                    _ => continue,
                }
                fields.next();
            }
            let (Some(hosts), Some(key_type), Some(key)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Some(key) = base64_decode(key) else {
                continue;
            };
            let patterns = match hosts.strip_prefix("|1|").and_then(|h| h.split_once('|')) {
                Some((salt, hash)) => match (base64_decode(salt), base64_decode(hash)) {
                    (Some(salt), Some(hash)) => HostPatterns::Hashed { salt, hash },
                    _ => continue,
                },
                None => HostPatterns::Plain(hosts.split(',').map(str::to_owned).collect()),
            };
            entries.push(HostEntry {
                revoked,
                patterns,
                key_type: key_type.to_owned(),
                key,
            });
        }
        KnownHosts { entries }
    }

    /// True when no entry parsed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Checks the key blob `key` that the server `name` (see [`RemoteUrl::known_hosts_name`])
    /// presented.
    pub fn check(&self, name: &str, key: &[u8]) -> HostKeyCheck {
        let for_host: Vec<&HostEntry> = self
            .entries
            .iter()
            .filter(|e| matches_host(&e.patterns, name))
            .collect();
        if for_host.iter().any(|e| e.revoked && e.key == key) {
            return HostKeyCheck::Changed {
                listed: vec!["@revoked".into()],
            };
        }
        if for_host.iter().any(|e| !e.revoked && e.key == key) {
            return HostKeyCheck::Known;
        }
        let listed: Vec<String> = for_host
            .iter()
            .filter(|e| !e.revoked)
            .map(|e| e.key_type.clone())
            .collect();
        if listed.is_empty() {
            HostKeyCheck::Unknown
        } else {
            HostKeyCheck::Changed { listed }
        }
    }
}

fn matches_host(patterns: &HostPatterns, name: &str) -> bool {
    match patterns {
        HostPatterns::Hashed { salt, hash } => hmac_sha1(salt, name.as_bytes()).as_slice() == hash,
        HostPatterns::Plain(list) => {
            let mut matched = false;
            for p in list {
                if let Some(negated) = p.strip_prefix('!') {
                    if wildcard(negated, name) {
                        return false;
                    }
                } else if wildcard(p, name) {
                    matched = true;
                }
            }
            matched
        }
    }
}

/// `*` and `?` globbing, case-insensitive (host names).
fn wildcard(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a.eq_ignore_ascii_case(b) => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

fn hmac_sha1(key: &[u8], message: &[u8]) -> [u8; 20] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..20].copy_from_slice(&Sha1::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let inner = Sha1::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha1::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

/// OpenSSH's fingerprint of a host key blob: `SHA256:` and unpadded base64.
pub fn fingerprint(key: &[u8]) -> String {
    format!(
        "SHA256:{}",
        base64_encode(&Sha256::digest(key)).trim_end_matches('=')
    )
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.trim_end_matches('=').bytes() {
        let v = BASE64.iter().position(|&b| b == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(BASE64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

// === errors ===

/// Why an operation on a remote could not authenticate or trust the server.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// The remote's URL carries credentials.
    #[error(transparent)]
    Url(#[from] UrlError),
    /// A Secret is named but this process cannot read Secrets.
    #[error(
        "unable to read the credentials Secret {secret}: this process has no credential source; run the operator, or remove the Secret reference"
    )]
    NoResolver {
        /// The Secret.
        secret: SecretRef,
    },
    /// The Secret does not exist.
    #[error(
        "the credentials Secret {secret} does not exist; create it (see docs/repositories.md) or fix spec.credentialsSecretRef"
    )]
    SecretMissing {
        /// The Secret.
        secret: SecretRef,
    },
    /// The Secret could not be read.
    #[error("unable to read the credentials Secret {secret}: {source}")]
    SecretUnreadable {
        /// The Secret.
        secret: SecretRef,
        /// Cause (the API error; it carries no Secret data).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The Secret lacks the keys the URL's transport needs.
    #[error(
        "the credentials Secret {secret} cannot be used for an {transport} repository: {problem}; see docs/repositories.md for its keys"
    )]
    SecretIncomplete {
        /// The Secret.
        secret: SecretRef,
        /// `https`, `ssh`, ...
        transport: &'static str,
        /// What is missing (key names only, never values).
        problem: String,
    },
    /// Credentials would travel in clear text.
    #[error(
        "refusing to send the credentials of Secret {secret} over plain http; use the repository's https:// URL"
    )]
    PlainHttp {
        /// The Secret.
        secret: SecretRef,
    },
    /// The server asked for credentials and no Secret is named.
    #[error(
        "the repository {url} asks for credentials, but no Secret is named for it; create a Secret (docs/repositories.md) and set spec.credentialsSecretRef"
    )]
    CredentialsRequired {
        /// The URL.
        url: String,
    },
    /// The server refused the Secret's credentials.
    #[error(
        "the repository {url} refused the credentials of Secret {secret}; put a valid {what} in the Secret (it needs read and push access to the repository)"
    )]
    AuthenticationFailed {
        /// The URL.
        url: String,
        /// The Secret.
        secret: SecretRef,
        /// `token or password` / `SSH key (and passphrase)`.
        what: &'static str,
    },
    /// The SSH server presented a key other than the listed ones.
    #[error(
        "refusing the SSH server {host}: its host key {fingerprint} is not the one listed for it in known_hosts of {source_name} (listed: {listed}); the server's key changed — if that was expected, put its new key in known_hosts after verifying it out of band, otherwise someone may be intercepting the connection"
    )]
    HostKeyChanged {
        /// The `known_hosts` name of the server.
        host: String,
        /// The presented key's fingerprint.
        fingerprint: String,
        /// Key types listed for the host.
        listed: String,
        /// `Secret ns/name`.
        source_name: String,
    },
    /// The SSH server is not listed.
    #[error(
        "refusing the SSH server {host}: it is not listed in known_hosts of {source_name} (it presented {fingerprint}); add its key to known_hosts (`ssh-keyscan -p PORT HOST`, verified out of band)"
    )]
    HostKeyUnknown {
        /// The `known_hosts` name of the server.
        host: String,
        /// The presented key's fingerprint.
        fingerprint: String,
        /// `Secret ns/name`, or a hint that no Secret is named.
        source_name: String,
    },
    /// The HTTPS certificate did not verify against the Secret's `ca.crt`.
    #[error(
        "the TLS certificate of {host} is not trusted: {why}; put the CA that issued it in the Secret's ca.crt, or use a certificate from a public CA"
    )]
    Certificate {
        /// The server.
        host: String,
        /// What failed.
        why: String,
    },
}

impl AccessError {
    /// Stable label for metrics, Event reasons and condition reasons.
    pub fn category(&self) -> &'static str {
        match self {
            AccessError::Url(UrlError::CredentialsInUrl { .. }) => "credentials-in-url",
            AccessError::Url(UrlError::Invalid { .. }) => "invalid-url",
            AccessError::NoResolver { .. }
            | AccessError::SecretMissing { .. }
            | AccessError::SecretUnreadable { .. }
            | AccessError::SecretIncomplete { .. } => "credentials-unavailable",
            AccessError::PlainHttp { .. } => "plain-http",
            AccessError::CredentialsRequired { .. } => "credentials-required",
            AccessError::AuthenticationFailed { .. } => "authentication-failed",
            AccessError::HostKeyChanged { .. } => "host-key-changed",
            AccessError::HostKeyUnknown { .. } => "host-key-unknown",
            AccessError::Certificate { .. } => "certificate-untrusted",
        }
    }
}

// === the resolver ===

/// Reads a Secret's credentials for one operation (the operator: from the API server).
pub trait ResolveCredentials: Send + Sync {
    /// The credentials of `secret` for `url`. Called once per fetch, push or ls-remote;
    /// blocking is fine (git operations run off the async workers).
    fn resolve(&self, secret: &SecretRef, url: &RemoteUrl) -> Result<Credentials, AccessError>;
}

static RESOLVER: RwLock<Option<Arc<dyn ResolveCredentials>>> = RwLock::new(None);

/// Installs the process's credential source (replacing the previous one).
pub fn install_resolver(resolver: Arc<dyn ResolveCredentials>) {
    let mut slot = RESOLVER.write().unwrap_or_else(|e| e.into_inner());
    *slot = Some(resolver);
}

fn resolver() -> Option<Arc<dyn ResolveCredentials>> {
    RESOLVER.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Records on `repo`'s `remote` which Secret it authenticates with (`None`: none). Only the
/// reference is written.
pub fn bind_secret(
    repo: &Repository,
    remote: &str,
    secret: Option<&SecretRef>,
) -> Result<(), git2::Error> {
    let mut config = repo.config()?.open_level(git2::ConfigLevel::Local)?;
    let key = format!("remote.{remote}.{SECRET_CONFIG_KEY}");
    match secret {
        Some(s) => config.set_str(&key, &s.to_string()),
        None => match config.remove(&key) {
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(()),
            other => other,
        },
    }
}

/// The Secret `repo`'s `remote` authenticates with, if one is bound.
pub fn bound_secret(repo: &Repository, remote: &str) -> Option<SecretRef> {
    let config = repo.config().ok()?;
    let value = config
        .get_string(&format!("remote.{remote}.{SECRET_CONFIG_KEY}"))
        .ok()?;
    SecretRef::parse(&value)
}

// === Session ===

/// What the callbacks of one operation saw.
#[derive(Debug, Default)]
struct Seen {
    /// Credential requests answered (a second one means the first was refused).
    offered: u32,
    /// The server asked and there was nothing to offer.
    required: bool,
    /// The credentials were refused.
    refused: bool,
    host_key: Option<AccessError>,
    certificate: Option<AccessError>,
}

/// One operation's access to a remote: its URL, the Secret's credentials (dropped with the
/// session) and what the callbacks observed.
pub struct Session {
    url: RemoteUrl,
    secret: Option<SecretRef>,
    credentials: Option<Credentials>,
    seen: RefCell<Seen>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("url", &self.url.url)
            .field("secret", &self.secret)
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session for `url` with explicit credentials (tests, the CLI).
    pub fn new(
        url: &str,
        secret: Option<SecretRef>,
        credentials: Option<Credentials>,
    ) -> Result<Session, AccessError> {
        Ok(Session {
            url: RemoteUrl::parse(url)?,
            secret,
            credentials,
            seen: RefCell::default(),
        })
    }

    /// A session for `url` whose credentials come from `secret` through the installed
    /// resolver (read now, for this one operation).
    pub fn resolve(url: &str, secret: Option<SecretRef>) -> Result<Session, AccessError> {
        let parsed = RemoteUrl::parse(url)?;
        let credentials = match (&secret, &parsed.transport) {
            (None, _) | (Some(_), Transport::Local) => None,
            (Some(s), _) => {
                let resolver =
                    resolver().ok_or_else(|| AccessError::NoResolver { secret: s.clone() })?;
                Some(resolver.resolve(s, &parsed)?)
            }
        };
        Ok(Session {
            url: parsed,
            secret,
            credentials,
            seen: RefCell::default(),
        })
    }

    /// The session for `repo`'s `remote`: its URL and the Secret [`bind_secret`] recorded.
    pub fn for_remote(repo: &Repository, remote: &str) -> Result<Session, SessionError> {
        let handle = repo
            .find_remote(remote)
            .map_err(|source| SessionError::Git {
                remote: remote.to_owned(),
                source,
            })?;
        let url = handle.url().unwrap_or_default().to_owned();
        Session::resolve(&url, bound_secret(repo, remote)).map_err(SessionError::Access)
    }

    /// The remote's URL.
    pub fn url(&self) -> &RemoteUrl {
        &self.url
    }

    /// The callbacks for one libgit2 operation.
    pub fn callbacks(&self) -> RemoteCallbacks<'_> {
        // Bounded waits for every remote operation (crate::timeouts). Should libgit2 refuse
        // them, its defaults stay; `protobot operator` reports that once at startup.
        let _ = crate::timeouts::ensure();
        // Each operation starts afresh: a second request for credentials within one
        // operation means the first were refused.
        *self.seen.borrow_mut() = Seen::default();
        let mut callbacks = RemoteCallbacks::new();
        callbacks.credentials(|_url, username, allowed| self.credential(username, allowed));
        callbacks.certificate_check(|cert, host| self.certificate(cert, host));
        callbacks
    }

    /// Fetch options carrying [`Session::callbacks`].
    pub fn fetch_options(&self) -> FetchOptions<'_> {
        let mut options = FetchOptions::new();
        options.remote_callbacks(self.callbacks());
        options
    }

    /// Push options carrying [`Session::callbacks`].
    pub fn push_options(&self) -> PushOptions<'_> {
        let mut options = PushOptions::new();
        options.remote_callbacks(self.callbacks());
        options
    }

    /// After an operation failed: the access problem the callbacks saw, if any (a changed
    /// host key before refused credentials before an untrusted certificate). `None` means
    /// the failure was something else (network, missing repository): report the git error.
    pub fn failure(&self) -> Option<AccessError> {
        let mut seen = self.seen.borrow_mut();
        if let Some(e) = seen.host_key.take() {
            return Some(e);
        }
        if let Some(e) = seen.certificate.take() {
            return Some(e);
        }
        if seen.refused
            && let Some(secret) = &self.secret
        {
            return Some(AccessError::AuthenticationFailed {
                url: self.url.url.clone(),
                secret: secret.clone(),
                what: match self.credentials {
                    Some(Credentials::Ssh { .. }) => "SSH key (and its passphrase)",
                    _ => "token or username/password",
                },
            });
        }
        if seen.required {
            return Some(AccessError::CredentialsRequired {
                url: self.url.url.clone(),
            });
        }
        None
    }

    fn credential(
        &self,
        username: Option<&str>,
        allowed: CredentialType,
    ) -> Result<Cred, git2::Error> {
        let mut seen = self.seen.borrow_mut();
        let refuse = |why: &str| git2::Error::from_str(why);
        let Some(credentials) = &self.credentials else {
            seen.required = true;
            return Err(refuse(
                "the repository asks for credentials and none are configured",
            ));
        };
        match credentials {
            Credentials::Https {
                username: user,
                password,
                ..
            } if allowed.contains(CredentialType::USER_PASS_PLAINTEXT) => {
                seen.offered += 1;
                if seen.offered > 1 {
                    seen.refused = true;
                    return Err(refuse("the repository refused the credentials"));
                }
                let password = password
                    .as_str()
                    .ok_or_else(|| refuse("the password is not UTF-8"))?;
                Cred::userpass_plaintext(user, password)
            }
            Credentials::Ssh { username: user, .. }
                if allowed.contains(CredentialType::USERNAME) =>
            {
                Cred::username(self.ssh_username(user.as_deref(), username))
            }
            Credentials::Ssh {
                username: user,
                private_key,
                passphrase,
                ..
            } if allowed.contains(CredentialType::SSH_MEMORY)
                || allowed.contains(CredentialType::SSH_KEY) =>
            {
                seen.offered += 1;
                if seen.offered > 1 {
                    seen.refused = true;
                    return Err(refuse("the repository refused the SSH key"));
                }
                let key = private_key
                    .as_str()
                    .ok_or_else(|| refuse("the private key is not UTF-8"))?;
                let phrase = passphrase.as_ref().and_then(Sensitive::as_str);
                Cred::ssh_key_from_memory(
                    self.ssh_username(user.as_deref(), username),
                    None,
                    key,
                    phrase,
                )
            }
            _ => {
                seen.refused = true;
                Err(refuse(
                    "the repository asks for a kind of credentials the Secret does not hold",
                ))
            }
        }
    }

    fn ssh_username<'a>(&'a self, from_secret: Option<&'a str>, asked: Option<&'a str>) -> &'a str {
        from_secret
            .or(asked)
            .or(self.url.username.as_deref())
            .unwrap_or(DEFAULT_SSH_USERNAME)
    }

    fn source_name(&self) -> String {
        match &self.secret {
            Some(s) => format!("Secret {s}"),
            None => "the Project (no credentials Secret is named)".into(),
        }
    }

    fn certificate(
        &self,
        cert: &git2::cert::Cert<'_>,
        host: &str,
    ) -> Result<CertificateCheckStatus, git2::Error> {
        if let Some(hostkey) = cert.as_hostkey() {
            let name = self.url.known_hosts_name();
            let Some(key) = hostkey.hostkey() else {
                let e = AccessError::HostKeyUnknown {
                    host: name,
                    fingerprint: "an unreadable key".into(),
                    source_name: self.source_name(),
                };
                let message = e.to_string();
                self.seen.borrow_mut().host_key = Some(e);
                return Err(git2::Error::from_str(&message));
            };
            let check = match &self.credentials {
                Some(Credentials::Ssh { known_hosts, .. }) => known_hosts.check(&name, key),
                _ => HostKeyCheck::Unknown,
            };
            let problem = match check {
                HostKeyCheck::Known => return Ok(CertificateCheckStatus::CertificateOk),
                HostKeyCheck::Changed { listed } => AccessError::HostKeyChanged {
                    host: name,
                    fingerprint: fingerprint(key),
                    listed: listed.join(", "),
                    source_name: self.source_name(),
                },
                HostKeyCheck::Unknown => AccessError::HostKeyUnknown {
                    host: name,
                    fingerprint: fingerprint(key),
                    source_name: self.source_name(),
                },
            };
            let message = problem.to_string();
            self.seen.borrow_mut().host_key = Some(problem);
            return Err(git2::Error::from_str(&message));
        }
        let ca = match &self.credentials {
            Some(Credentials::Https { ca: Some(ca), .. }) => ca,
            // libgit2 checks the chain against the system's CAs and the host name.
            _ => return Ok(CertificateCheckStatus::CertificatePassthrough),
        };
        let Some(x509) = cert.as_x509() else {
            return Ok(CertificateCheckStatus::CertificatePassthrough);
        };
        match verify_with_ca(x509.data(), host, ca) {
            Ok(()) => Ok(CertificateCheckStatus::CertificateOk),
            Err(why) => {
                let e = AccessError::Certificate {
                    host: host.to_owned(),
                    why,
                };
                let message = e.to_string();
                self.seen.borrow_mut().certificate = Some(e);
                Err(git2::Error::from_str(&message))
            }
        }
    }
}

/// Why [`Session::for_remote`] could not start.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The remote does not exist.
    #[error("failed to find the remote {remote}: {source}")]
    Git {
        /// Remote name.
        remote: String,
        /// Cause.
        #[source]
        source: git2::Error,
    },
    /// The credentials could not be had.
    #[error(transparent)]
    Access(AccessError),
}

/// Verifies the server's leaf certificate (DER) for `host` against the PEM CAs in `ca`.
fn verify_with_ca(leaf: &[u8], host: &str, ca: &[u8]) -> Result<(), String> {
    use rustls_pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
    let anchors_der: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(ca)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("ca.crt is not PEM certificates ({e})"))?;
    if anchors_der.is_empty() {
        return Err("ca.crt holds no certificate".into());
    }
    let anchors = anchors_der
        .iter()
        .map(|c| webpki::anchor_from_trusted_cert(c).map_err(|e| format!("ca.crt: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let leaf = CertificateDer::from(leaf);
    let end =
        webpki::EndEntityCert::try_from(&leaf).map_err(|e| format!("its certificate: {e}"))?;
    end.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        &anchors,
        &[],
        UnixTime::now(),
        webpki::KeyUsage::server_auth(),
        None,
        None,
    )
    .map_err(|e| format!("not issued by a CA in ca.crt ({e})"))?;
    let name = ServerName::try_from(host).map_err(|e| format!("host name {host}: {e}"))?;
    end.verify_is_valid_for_subject_name(&name)
        .map_err(|e| format!("not valid for {host} ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(u: &str) -> RemoteUrl {
        RemoteUrl::parse(u).unwrap_or_else(|e| panic!("{u}: {e}"))
    }

    #[test]
    fn urls_with_credentials_are_refused_without_echoing_them() {
        for bad in [
            "https://alice:s3cr3t@example.com/a.git",
            "https://ghp_tokenvalue@example.com/a.git",
            "http://u:p@example.com/a.git",
            "ssh://git:hunter2@example.com/a.git",
            "git:hunter2@example.com:a.git",
        ] {
            let e = RemoteUrl::parse(bad).unwrap_err();
            let text = e.to_string();
            assert!(matches!(e, UrlError::CredentialsInUrl { .. }), "{bad}");
            for secret in ["s3cr3t", "ghp_tokenvalue", "hunter2", ":p@"] {
                assert!(!text.contains(secret), "{text}");
            }
            assert!(text.contains("spec.credentialsSecretRef"), "{text}");
        }
    }

    #[test]
    fn transports_hosts_and_ports_are_read() {
        let u = url("ssh://git@127.0.0.1:2222/srv/a.git");
        assert_eq!(
            (u.transport, u.host.as_str(), u.port, u.username.as_deref()),
            (Transport::Ssh, "127.0.0.1", Some(2222), Some("git"))
        );
        assert_eq!(u.known_hosts_name(), "[127.0.0.1]:2222");
        let u = url("git@github.com:team/a.git");
        assert_eq!(
            (u.transport, u.host.as_str()),
            (Transport::Ssh, "github.com")
        );
        assert_eq!(u.known_hosts_name(), "github.com");
        let u = url("https://[::1]:8443/a.git");
        assert_eq!(
            (u.transport, u.host.as_str(), u.port),
            (Transport::Https, "::1", Some(8443))
        );
        assert_eq!(url("/srv/a.git").transport, Transport::Local);
        assert_eq!(url("file:///srv/a.git").transport, Transport::Local);
        assert_eq!(url("../a.git").transport, Transport::Local);
        assert!(matches!(
            RemoteUrl::parse("ftp://example.com/a"),
            Err(UrlError::Invalid { .. })
        ));
    }

    fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn https_secrets_take_a_token_or_a_username_and_password() {
        let s = SecretRef::new("team-a", "repo-creds");
        let https = url("https://example.com/a.git");
        match Credentials::from_secret_data(&s, &https, &data(&[("token", "t0k\n")])) {
            Ok(Credentials::Https {
                username, password, ..
            }) => {
                assert_eq!(username, DEFAULT_TOKEN_USERNAME);
                assert_eq!(
                    password.as_str(),
                    Some("t0k"),
                    "a trailing newline is dropped"
                );
                assert_eq!(format!("{password:?}"), "<redacted>");
            }
            other => panic!("{other:?}"),
        }
        let e =
            Credentials::from_secret_data(&s, &https, &data(&[("password", "pw")])).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("team-a/repo-creds") && text.contains("no username"),
            "{text}"
        );
        assert!(!text.contains("pw"), "{text}");
        let e = Credentials::from_secret_data(&s, &https, &data(&[])).unwrap_err();
        assert_eq!(e.category(), "credentials-unavailable");
        let e = Credentials::from_secret_data(
            &s,
            &url("http://example.com/a.git"),
            &data(&[("token", "t")]),
        )
        .unwrap_err();
        assert_eq!(e.category(), "plain-http");
    }

    #[test]
    fn ssh_secrets_need_a_key_and_known_hosts() {
        let s = SecretRef::new("ns", "deploy-key");
        let ssh = url("ssh://git@example.com/a.git");
        let e = Credentials::from_secret_data(&s, &ssh, &data(&[("ssh-privatekey", "KEY")]))
            .unwrap_err();
        assert!(e.to_string().contains("no known_hosts"), "{e}");
        let e = Credentials::from_secret_data(
            &s,
            &ssh,
            &data(&[("ssh-privatekey", "KEY"), ("known_hosts", "# nothing\n")]),
        )
        .unwrap_err();
        assert!(e.to_string().contains("lists no host key"), "{e}");
        let ok = Credentials::from_secret_data(
            &s,
            &ssh,
            &data(&[
                ("ssh-privatekey", "KEY"),
                ("known_hosts", "example.com ssh-ed25519 AAAA\n"),
            ]),
        );
        assert!(matches!(ok, Ok(Credentials::Ssh { .. })), "{ok:?}");
    }

    #[test]
    fn known_hosts_matches_plain_ported_wildcard_negated_and_hashed_names() {
        let key_a = b"key-a".to_vec();
        let key_b = b"key-b".to_vec();
        let a = base64_encode(&key_a);
        let b = base64_encode(&key_b);
        // A hashed entry for [127.0.0.1]:2222, as `ssh-keygen -H` writes it.
        let salt = b"0123456789abcdefghij".to_vec();
        let hash = hmac_sha1(&salt, b"[127.0.0.1]:2222");
        let text = format!(
            "# comment\nexample.com,other.org ssh-ed25519 {a}\n*.corp,!bad.corp ssh-rsa {a}\n|1|{}|{} ssh-ed25519 {b}\n@revoked example.com ssh-rsa {b}\n@cert-authority * ssh-rsa {b}\ngarbage\n",
            base64_encode(&salt),
            base64_encode(&hash)
        );
        let known = KnownHosts::parse(&text);
        assert_eq!(known.check("example.com", &key_a), HostKeyCheck::Known);
        assert_eq!(known.check("EXAMPLE.com", &key_a), HostKeyCheck::Known);
        assert_eq!(
            known.check("example.com", &key_b),
            HostKeyCheck::Changed {
                listed: vec!["@revoked".into()]
            },
            "a revoked key is refused even where it is listed"
        );
        assert_eq!(known.check("git.corp", &key_a), HostKeyCheck::Known);
        assert_eq!(known.check("bad.corp", &key_a), HostKeyCheck::Unknown);
        assert_eq!(known.check("[127.0.0.1]:2222", &key_b), HostKeyCheck::Known);
        assert_eq!(
            known.check("[127.0.0.1]:2222", &key_a),
            HostKeyCheck::Changed {
                listed: vec!["ssh-ed25519".into()]
            }
        );
        assert_eq!(
            known.check("127.0.0.1", &key_b),
            HostKeyCheck::Unknown,
            "the port is part of the name"
        );
        assert_eq!(
            known.check("other.org", &key_b),
            HostKeyCheck::Changed {
                listed: vec!["ssh-ed25519".into()]
            }
        );
    }

    #[test]
    fn hmac_sha1_and_base64_match_their_rfc_vectors() {
        // RFC 2202 test case 2.
        assert_eq!(
            hex::encode(hmac_sha1(b"Jefe", b"what do ya want for nothing?")),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
        // RFC 4648 section 10.
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(plain.as_bytes()), encoded);
            assert_eq!(base64_decode(encoded).as_deref(), Some(plain.as_bytes()));
        }
        assert_eq!(base64_decode("Zm9v!"), None);
        assert!(fingerprint(b"x").starts_with("SHA256:") && !fingerprint(b"x").ends_with('='));
    }

    #[test]
    fn a_repository_records_only_the_secret_reference() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let repo = Repository::init(tmp.path()).unwrap_or_else(|e| panic!("{e}"));
        repo.remote("origin", "https://example.com/a.git")
            .unwrap_or_else(|e| panic!("{e}"));
        let s = SecretRef::new("ns", "creds");
        bind_secret(&repo, "origin", Some(&s)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bound_secret(&repo, "origin"), Some(s));
        bind_secret(&repo, "origin", None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bound_secret(&repo, "origin"), None);
        bind_secret(&repo, "origin", None)
            .unwrap_or_else(|e| panic!("removing twice is fine: {e}"));
        assert_eq!(SecretRef::parse("a/b/c"), None);
        assert_eq!(SecretRef::parse("/b"), None);
    }
}
