//! The egress policy: the allow rules a sandbox's HTTP traffic is checked
//! against (everything not named by a rule is denied).
//!
//! A policy is read from YAML or JSON (`serde` with unknown fields refused)
//! and then validated by [`EgressPolicy::new`]; every error names the field at
//! fault (`rules[2].destination`) and says what to write instead. Once built,
//! an [`EgressPolicy`] only holds well-formed rules, so the decision code can
//! compare strings without re-checking them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// HTTP methods a rule may name. `CONNECT` and `TRACE` are deliberately absent:
/// a tunnel hides the request from the proxy, and a trace reflects headers.
pub const RULE_METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// Why a policy document was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("failed to read egress policy {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The document does not have the policy's shape.
    #[error(
        "failed to parse egress policy {origin}: {source}; expected `rules:` with destination, method, path and optional executableDigest, role, credential (docs/egress-proxy.md)"
    )]
    Parse {
        /// File name or `<inline>`.
        origin: String,
        /// The parser's error (names the field and line).
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// A field has a value the proxy cannot enforce.
    #[error("invalid egress policy {origin}: {field}: {reason}")]
    Invalid {
        /// File name or `<inline>`.
        origin: String,
        /// The field path (`rules[0].path`).
        field: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
}

/// The document as written (before validation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyDocument {
    /// The allow rules; an empty list denies everything.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// One allow rule: executable × destination × method × path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    /// `sha256:<64 lowercase hex>` of the executable that may send this
    /// request; `None` admits any executable (and requests without an
    /// attested executable) of the matching role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executable_digest: Option<String>,
    /// The sandboxed role the session must have (`worker-a`, …); `None`: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Lowercase DNS name of the upstream (no scheme, no port, no IP address);
    /// the proxy always reaches it with HTTPS on port 443.
    pub destination: String,
    /// One HTTP method of [`RULE_METHODS`].
    pub method: String,
    /// The exact path (starts with `/`; no query, no fragment, no `..`).
    pub path: String,
    /// Name of the credential the broker injects (`Authorization: Bearer …`);
    /// `None`: the request is forwarded without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

/// A validated policy: deny by default, allow what a rule names exactly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    rules: Vec<Rule>,
}

// === impl EgressPolicy ===

impl EgressPolicy {
    /// Validates `document`; `origin` names it in errors.
    pub fn new(document: PolicyDocument, origin: &str) -> Result<EgressPolicy, PolicyError> {
        for (i, rule) in document.rules.iter().enumerate() {
            validate_rule(rule).map_err(|(field, reason)| PolicyError::Invalid {
                origin: origin.to_owned(),
                field: format!("rules[{i}].{field}"),
                reason,
            })?;
        }
        Ok(EgressPolicy {
            rules: document.rules,
        })
    }

    /// Parses YAML (JSON is YAML too) and validates it.
    pub fn from_yaml(text: &str, origin: &str) -> Result<EgressPolicy, PolicyError> {
        let document: PolicyDocument =
            serde_yaml_ng::from_str(text).map_err(|source| PolicyError::Parse {
                origin: origin.to_owned(),
                source,
            })?;
        EgressPolicy::new(document, origin)
    }

    /// Reads, parses and validates a policy file.
    pub fn load(path: &Path) -> Result<EgressPolicy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Read {
            path: path.to_owned(),
            source,
        })?;
        EgressPolicy::from_yaml(&text, &path.display().to_string())
    }

    /// This policy with `other`'s rules after its own (both already validated).
    pub fn with_rules_of(mut self, other: EgressPolicy) -> EgressPolicy {
        self.rules.extend(other.rules);
        self
    }

    /// The rules, in document order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Names of every credential some rule asks for.
    pub fn credential_names(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().filter_map(|r| r.credential.as_deref())
    }
}

type FieldError = (&'static str, String);

fn validate_rule(rule: &Rule) -> Result<(), FieldError> {
    if let Some(digest) = &rule.executable_digest
        && !is_digest(digest)
    {
        return Err((
            "executableDigest",
            format!("{digest:?} is not `sha256:` followed by 64 lowercase hex digits"),
        ));
    }
    if let Some(role) = &rule.role
        && !is_label(role)
    {
        return Err((
            "role",
            format!("{role:?} is not a role name (lowercase letters, digits and `-`)"),
        ));
    }
    validate_destination(&rule.destination).map_err(|reason| ("destination", reason))?;
    if !RULE_METHODS.contains(&rule.method.as_str()) {
        return Err((
            "method",
            format!(
                "{:?} is not one of {} (uppercase; CONNECT and TRACE are never allowed)",
                rule.method,
                RULE_METHODS.join(", ")
            ),
        ));
    }
    validate_path(&rule.path).map_err(|reason| ("path", reason))?;
    if let Some(name) = &rule.credential
        && !is_credential_name(name)
    {
        return Err((
            "credential",
            format!(
                "{name:?} is not a credential file name (letters, digits, `-`, `_`, `.`; not starting with `.`)"
            ),
        ));
    }
    Ok(())
}

/// `sha256:` + 64 lowercase hex digits.
pub fn is_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A credential name is a plain file name in the credentials directory.
pub fn is_credential_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

fn validate_destination(host: &str) -> Result<(), String> {
    if host.contains("://") || host.contains('/') {
        return Err(format!(
            "{host:?} must be a bare host name: drop the scheme and path"
        ));
    }
    if host.contains(':') || host.starts_with('[') {
        return Err(format!(
            "{host:?} names a port or an IPv6 address: write only the DNS name (the proxy always uses port 443)"
        ));
    }
    if crate::address::is_numeric_host(host) || host == "localhost" || host.ends_with(".localhost")
    {
        return Err(format!(
            "{host:?} is an IP address or loopback name: rules name DNS hosts only"
        ));
    }
    if host.starts_with("dns-") {
        return Err(format!(
            "{host:?} starts with `dns-`, which the proxy always denies as DNS tunnelling"
        ));
    }
    if host.is_empty() || host.len() > 253 {
        return Err("a DNS name has 1 to 253 characters".to_owned());
    }
    for label in host.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !ok {
            return Err(format!(
                "{host:?} is not a lowercase DNS name (labels of a-z, 0-9 and inner `-`, no trailing dot)"
            ));
        }
    }
    Ok(())
}

fn validate_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("{path:?} must start with `/`"));
    }
    if path.contains(['?', '#']) {
        return Err(format!(
            "{path:?} has a query or fragment: rules match the path only"
        ));
    }
    if path.starts_with("/tls-bypass") {
        return Err(format!(
            "{path:?} starts with `/tls-bypass`, which the proxy always denies"
        ));
    }
    if path.split('/').any(|s| s == ".." || s == ".") {
        return Err(format!(
            "{path:?} has `.` or `..` segments: write the normalised path"
        ));
    }
    if !path.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{path:?} has spaces or non-ASCII characters: percent-encode them as the client sends them"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const DIGEST: &str =
        "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn yaml_with(field: &str, value: &str) -> String {
        let mut fields = vec![
            ("executableDigest", DIGEST.to_owned()),
            ("role", "worker-b".to_owned()),
            ("destination", "registry.example.invalid".to_owned()),
            ("method", "GET".to_owned()),
            ("path", "/v2/allowed".to_owned()),
            ("credential", "registry".to_owned()),
        ];
        for f in &mut fields {
            if f.0 == field {
                f.1 = value.to_owned();
            }
        }
        let mut out = "rules:\n".to_owned();
        for (i, (k, v)) in fields.iter().enumerate() {
            let lead = if i == 0 { "  - " } else { "    " };
            out.push_str(&format!("{lead}{k}: {v:?}\n"));
        }
        out
    }

    #[test]
    fn a_full_rule_parses_and_keeps_every_field() {
        let p = EgressPolicy::from_yaml(&yaml_with("", ""), "<inline>").unwrap();
        assert_eq!(
            p.rules(),
            &[Rule {
                executable_digest: Some(DIGEST.to_owned()),
                role: Some("worker-b".to_owned()),
                destination: "registry.example.invalid".to_owned(),
                method: "GET".to_owned(),
                path: "/v2/allowed".to_owned(),
                credential: Some("registry".to_owned()),
            }]
        );
        assert_eq!(p.credential_names().collect::<Vec<_>>(), ["registry"]);
    }

    #[test]
    fn json_and_an_empty_document_are_accepted() {
        let p = EgressPolicy::from_yaml(
            r#"{"rules":[{"destination":"api.example.invalid","method":"POST","path":"/v1/messages"}]}"#,
            "<inline>",
        )
        .unwrap();
        assert_eq!(p.rules().len(), 1);
        assert_eq!(p.rules()[0].executable_digest, None);
        assert!(
            EgressPolicy::from_yaml("{}", "x")
                .unwrap()
                .rules()
                .is_empty()
        );
    }

    #[test]
    fn unknown_fields_are_refused_with_the_field_name() {
        let err = EgressPolicy::from_yaml(
            "rules:\n  - destination: a.example\n    method: GET\n    path: /\n    port: 8443\n",
            "p.yaml",
        )
        .unwrap_err();
        assert!(matches!(err, PolicyError::Parse { .. }));
        let text = err.to_string();
        assert!(text.contains("p.yaml") && text.contains("port"), "{text}");
    }

    #[test]
    fn each_bad_field_is_named_in_the_error() {
        let cases = [
            (
                "executableDigest",
                "sha256:abc",
                "rules[0].executableDigest",
            ),
            (
                "executableDigest",
                &DIGEST.to_uppercase(),
                "rules[0].executableDigest",
            ),
            ("role", "Worker B", "rules[0].role"),
            (
                "destination",
                "https://registry.example.invalid",
                "rules[0].destination",
            ),
            (
                "destination",
                "registry.example.invalid:8443",
                "rules[0].destination",
            ),
            ("destination", "127.0.0.1", "rules[0].destination"),
            ("destination", "127.1", "rules[0].destination"),
            ("destination", "[::1]", "rules[0].destination"),
            ("destination", "localhost", "rules[0].destination"),
            ("destination", "dns-tunnel.invalid", "rules[0].destination"),
            (
                "destination",
                "Registry.Example.Invalid",
                "rules[0].destination",
            ),
            (
                "destination",
                "registry.example.invalid.",
                "rules[0].destination",
            ),
            ("method", "get", "rules[0].method"),
            ("method", "CONNECT", "rules[0].method"),
            ("path", "v2/allowed", "rules[0].path"),
            ("path", "/v2/allowed?x=1", "rules[0].path"),
            ("path", "/v2/../secret", "rules[0].path"),
            ("path", "/tls-bypass", "rules[0].path"),
            ("credential", "../etc/passwd", "rules[0].credential"),
            ("credential", ".hidden", "rules[0].credential"),
        ];
        for (field, value, named) in cases {
            let err = EgressPolicy::from_yaml(&yaml_with(field, value), "p.yaml").unwrap_err();
            match &err {
                PolicyError::Invalid { field: f, .. } => {
                    assert_eq!(f, named, "{field}={value}: {err}");
                }
                other => panic!("{field}={value}: expected Invalid, got {other}"),
            }
        }
    }

    #[test]
    fn a_missing_file_is_a_read_error_naming_it() {
        let err = EgressPolicy::load(Path::new("/nonexistent/policy.yaml")).unwrap_err();
        assert!(matches!(err, PolicyError::Read { .. }));
        assert!(err.to_string().contains("/nonexistent/policy.yaml"));
    }
}
