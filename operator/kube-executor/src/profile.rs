//! Sandbox profiles (`sandbox-profiles/*.yaml`): parse and validate.
//!
//! A profile is what a Kubernetes sandbox pod is built from (ARCHITECTURE.md
//! §4): the RuntimeClass, the restricted security context, resource ceilings,
//! the egress proxy the NetworkPolicy may allow, the capabilities of
//! `jobsite-sandbox/v1` it must prove, and where its conformance report lives.
//! Validation refuses anything weaker than the restricted baseline: a profile
//! cannot switch a protection off, only a new contract version could.
//! Every error names the offending field (`spec.securityContext.runAsNonRoot`).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use protobot_executors::{CONTRACT_VERSION, conformance::ALL_CAPABILITIES};
use serde::{Deserialize, Serialize};

/// `apiVersion` of a profile document.
pub const PROFILE_API_VERSION: &str = "protobot.dev/v1alpha1";
/// `kind` of a profile document.
pub const PROFILE_KIND: &str = "SandboxProfile";
/// The default profile's name.
pub const DEFAULT_PROFILE: &str = "kata";

/// Why a profile document was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file could not be read.
    #[error("failed to read sandbox profile {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The YAML does not have the profile's shape (unknown or missing field,
    /// wrong type).
    #[error("failed to parse sandbox profile {origin}: {source}; see sandbox-profiles/README.md")]
    Parse {
        /// File name or `<inline>`.
        origin: String,
        /// The parser's error (names the field and line).
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// A field has a value the contract does not allow.
    #[error("invalid sandbox profile {origin}: {field}: {reason}")]
    Invalid {
        /// File name or `<inline>`.
        origin: String,
        /// The field path (`spec.securityContext.runAsNonRoot`).
        field: String,
        /// What is wrong and what to write instead.
        reason: String,
    },
}

/// A profile document as written in `sandbox-profiles/` (Kubernetes-style
/// envelope, so it can later become a custom resource unchanged).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileDocument {
    /// `protobot.dev/v1alpha1`.
    pub api_version: String,
    /// `SandboxProfile`.
    pub kind: String,
    /// `name` only.
    pub metadata: ProfileMetadata,
    /// The profile.
    pub spec: ProfileSpec,
}

/// Profile metadata.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileMetadata {
    /// The profile name (what `Executor::profile` returns and what the
    /// conformance report's `profile` must equal).
    pub name: String,
}

/// The profile body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileSpec {
    /// Must be `jobsite-sandbox/v1`.
    pub contract_version: String,
    /// Free text for humans.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The pod's `runtimeClassName` (required: a plain runc container is
    /// explicitly insufficient, contract §2.12).
    pub runtime_class_name: String,
    /// A ServiceAccount with no permissions; `None` uses the namespace's
    /// `default`. Its token is never mounted either way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Secrets in the sandbox namespace the kubelet pulls worker images with
    /// (`imagePullSecrets`; never visible inside the sandbox).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// The restricted security context (validated to be exactly restricted).
    pub security_context: ProfileSecurityContext,
    /// Resource ceilings.
    pub resources: ProfileResources,
    /// Egress: the proxy the NetworkPolicy may allow, or none at all.
    pub egress: ProfileEgress,
    /// Capabilities the conformance report must show supported (all seven of
    /// the closed set: a profile cannot waive one).
    pub required_capabilities: Vec<String>,
    /// Where the operator finds the profile's conformance report.
    pub conformance: ConformanceSource,
    /// The in-guest resource-limit supervisor (`protobot sandbox supervise`): an
    /// init container copies the protobot binary from `image` into an `emptyDir`
    /// and the role's command runs through it, under the run's CPU-time,
    /// process, file-size and open-file limits. `None`: no supervisor, and the
    /// executor reports `resource-limits` unsupported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supervisor: Option<ProfileSupervisor>,
}

/// Where the supervisor comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileSupervisor {
    /// Image holding the protobot binary; empty: the executor's configured
    /// supervisor image ([`crate::KubeExecutorConfig::supervisor_image`]). The chart
    /// writes the operator's own image here in the profiles it installs.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// Absolute path of the protobot binary in that image.
    #[serde(default = "default_supervisor_binary")]
    pub binary_path: String,
}

/// Where the protobot image (Dockerfile) keeps the binary.
pub const DEFAULT_SUPERVISOR_BINARY: &str = "/usr/local/bin/protobot";

fn default_supervisor_binary() -> String {
    DEFAULT_SUPERVISOR_BINARY.to_owned()
}

/// The container security context of the profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileSecurityContext {
    /// Must be true.
    pub run_as_non_root: bool,
    /// Non-zero uid the sandbox runs as.
    pub run_as_user: i64,
    /// Non-zero gid the sandbox runs as.
    pub run_as_group: i64,
    /// Must be true.
    pub read_only_root_filesystem: bool,
    /// Must be false.
    pub allow_privilege_escalation: bool,
    /// Must drop `ALL` and add nothing.
    pub capabilities: ProfileCapabilities,
    /// Must be `RuntimeDefault` (or `Localhost` with a profile).
    pub seccomp_profile: ProfileSeccomp,
}

/// Linux capabilities.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileCapabilities {
    /// Must contain `ALL`.
    pub drop: Vec<String>,
    /// Must be empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<String>,
}

/// Seccomp profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileSeccomp {
    /// `RuntimeDefault` or `Localhost`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The node-local profile when `type` is `Localhost`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub localhost_profile: Option<String>,
}

/// Resource ceilings of the profile. A run's memory and wall clock come from
/// its `RunSpec::limits`; the profile caps memory and fixes CPU and disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileResources {
    /// CPU limit of every sandbox container (`"2"`, `"500m"`).
    pub cpu: String,
    /// CPU the scheduler reserves for every sandbox container (`"250m"`); at most `cpu`.
    /// Absent: `cpu` (request = limit). A smaller request lets runs share a node's cores
    /// and still burst to `cpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_request: Option<String>,
    /// The largest memory limit a run may ask for (`4Gi`); larger runs are refused.
    pub max_memory: String,
    /// Ephemeral-storage request = limit (container writable layer and logs).
    pub ephemeral_storage: String,
    /// Size of the writable `/tmp` (a memory-backed `emptyDir`, counted in the
    /// memory limit).
    pub tmp_size_limit: String,
}

/// Egress of the profile.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileEgress {
    /// The egress proxy (and credential broker) pods the NetworkPolicy lets
    /// sandboxes reach; `None`: no egress at all, and runs asking for a
    /// proxy are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<EgressProxy>,
}

/// The one egress destination a sandbox may reach.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressProxy {
    /// Labels of the proxy's namespace (`matchLabels`).
    pub namespace_selector: BTreeMap<String, String>,
    /// Labels of the proxy's pods (`matchLabels`; must not be empty).
    pub pod_selector: BTreeMap<String, String>,
    /// The proxy's TCP port.
    pub port: u16,
}

/// Where the conformance report of the profile is kept: a ConfigMap in the
/// operator's namespace whose `key` holds the contract's `ConformanceReport`
/// JSON (written by `protobot sandbox conformance --profile NAME`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConformanceSource {
    /// ConfigMap name.
    pub config_map: String,
    /// Data key holding the report JSON.
    pub key: String,
}

/// A validated profile: only [`SandboxProfile::parse`] and
/// [`SandboxProfile::load`] make one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxProfile {
    doc: ProfileDocument,
    cpu_millis: u64,
    cpu_request_millis: u64,
    max_memory_bytes: u64,
    ephemeral_storage_bytes: u64,
    tmp_size_bytes: u64,
}

impl SandboxProfile {
    /// Parses and validates a profile document; `origin` names it in errors.
    pub fn parse(yaml: &str, origin: &str) -> Result<Self, ProfileError> {
        let doc: ProfileDocument =
            serde_yaml_ng::from_str(yaml).map_err(|source| ProfileError::Parse {
                origin: origin.to_owned(),
                source,
            })?;
        Self::validate(doc, origin)
    }

    /// Reads, parses and validates a profile file.
    pub fn load(path: &Path) -> Result<Self, ProfileError> {
        let yaml = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&yaml, &path.display().to_string())
    }

    /// Loads every `*.yaml` profile of a directory, sorted by file name.
    pub fn load_dir(dir: &Path) -> Result<Vec<Self>, ProfileError> {
        let read = |source| ProfileError::Read {
            path: dir.to_owned(),
            source,
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(read)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(read)?;
        files.retain(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"));
        files.sort();
        files.iter().map(|p| Self::load(p)).collect()
    }

    /// Validates a parsed document.
    pub fn validate(doc: ProfileDocument, origin: &str) -> Result<Self, ProfileError> {
        let invalid = |field: &str, reason: String| ProfileError::Invalid {
            origin: origin.to_owned(),
            field: field.to_owned(),
            reason,
        };
        if doc.api_version != PROFILE_API_VERSION {
            return Err(invalid(
                "apiVersion",
                format!("is {:?}; write {PROFILE_API_VERSION:?}", doc.api_version),
            ));
        }
        if doc.kind != PROFILE_KIND {
            return Err(invalid(
                "kind",
                format!("is {:?}; write {PROFILE_KIND:?}", doc.kind),
            ));
        }
        if !is_dns_label(&doc.metadata.name) {
            return Err(invalid(
                "metadata.name",
                format!(
                    "{:?} is not a DNS-1123 label (lower-case letters, digits and '-', at most 63)",
                    doc.metadata.name
                ),
            ));
        }
        let s = &doc.spec;
        if s.contract_version != CONTRACT_VERSION {
            return Err(invalid(
                "spec.contractVersion",
                format!(
                    "is {:?}; this executor implements {CONTRACT_VERSION:?}",
                    s.contract_version
                ),
            ));
        }
        if !is_dns_subdomain(&s.runtime_class_name) {
            return Err(invalid(
                "spec.runtimeClassName",
                format!(
                    "{:?} is not a RuntimeClass name; a sandbox needs a sandboxed runtime (kata, gvisor): a plain runc container is insufficient",
                    s.runtime_class_name
                ),
            ));
        }
        if matches!(s.runtime_class_name.as_str(), "runc" | "crun" | "default") {
            return Err(invalid(
                "spec.runtimeClassName",
                format!(
                    "{:?} is a plain container runtime; jobsite-sandbox/v1 §2.12 calls it insufficient: use kata or gvisor",
                    s.runtime_class_name
                ),
            ));
        }
        if let Some(sa) = &s.service_account_name
            && !is_dns_subdomain(sa)
        {
            return Err(invalid(
                "spec.serviceAccountName",
                format!("{sa:?} is not a valid name"),
            ));
        }
        if let Some(bad) = s.image_pull_secrets.iter().find(|n| !is_dns_subdomain(n)) {
            return Err(invalid(
                "spec.imagePullSecrets",
                format!("{bad:?} is not a valid Secret name"),
            ));
        }
        let sc = &s.security_context;
        let must = |ok: bool, field: &str, want: &str| {
            if ok {
                Ok(())
            } else {
                Err(invalid(
                    field,
                    format!("must be {want}: the restricted baseline cannot be weakened"),
                ))
            }
        };
        must(
            sc.run_as_non_root,
            "spec.securityContext.runAsNonRoot",
            "true",
        )?;
        must(
            sc.run_as_user > 0,
            "spec.securityContext.runAsUser",
            "a non-zero uid",
        )?;
        must(
            sc.run_as_group > 0,
            "spec.securityContext.runAsGroup",
            "a non-zero gid",
        )?;
        must(
            sc.read_only_root_filesystem,
            "spec.securityContext.readOnlyRootFilesystem",
            "true",
        )?;
        must(
            !sc.allow_privilege_escalation,
            "spec.securityContext.allowPrivilegeEscalation",
            "false",
        )?;
        must(
            sc.capabilities.drop.iter().any(|c| c == "ALL"),
            "spec.securityContext.capabilities.drop",
            "[ALL]",
        )?;
        must(
            sc.capabilities.add.is_empty(),
            "spec.securityContext.capabilities.add",
            "empty",
        )?;
        match (
            sc.seccomp_profile.type_.as_str(),
            &sc.seccomp_profile.localhost_profile,
        ) {
            ("RuntimeDefault", None) => {}
            ("Localhost", Some(p)) if !p.is_empty() => {}
            _ => {
                return Err(invalid(
                    "spec.securityContext.seccompProfile",
                    "must be {type: RuntimeDefault} or {type: Localhost, localhostProfile: …}; Unconfined is not allowed".into(),
                ));
            }
        }
        let r = &s.resources;
        let cpu_millis = parse_cpu_millis(&r.cpu).filter(|m| *m > 0).ok_or_else(|| {
            invalid(
                "spec.resources.cpu",
                format!(
                    "{:?} is not a positive CPU quantity (\"2\", \"500m\")",
                    r.cpu
                ),
            )
        })?;
        let cpu_request_millis = match &r.cpu_request {
            None => cpu_millis,
            Some(q) => parse_cpu_millis(q)
                .filter(|m| *m > 0 && *m <= cpu_millis)
                .ok_or_else(|| {
                    invalid(
                        "spec.resources.cpuRequest",
                        format!(
                            "{q:?} is not a positive CPU quantity at most spec.resources.cpu ({:?})",
                            r.cpu
                        ),
                    )
                })?,
        };
        let bytes = |field: &str, q: &str| {
            parse_bytes(q).filter(|b| *b > 0).ok_or_else(|| {
                invalid(
                    field,
                    format!("{q:?} is not a positive byte quantity (\"512Mi\", \"2Gi\", \"1G\")"),
                )
            })
        };
        let max_memory_bytes = bytes("spec.resources.maxMemory", &r.max_memory)?;
        let ephemeral_storage_bytes =
            bytes("spec.resources.ephemeralStorage", &r.ephemeral_storage)?;
        let tmp_size_bytes = bytes("spec.resources.tmpSizeLimit", &r.tmp_size_limit)?;
        if tmp_size_bytes >= max_memory_bytes {
            return Err(invalid(
                "spec.resources.tmpSizeLimit",
                "must be smaller than maxMemory: /tmp is memory-backed and counted in the memory limit".into(),
            ));
        }
        if let Some(p) = &s.egress.proxy {
            if p.pod_selector.is_empty() {
                return Err(invalid(
                    "spec.egress.proxy.podSelector",
                    "must name the proxy's pod labels: an empty selector would allow every pod"
                        .into(),
                ));
            }
            if p.port == 0 {
                return Err(invalid(
                    "spec.egress.proxy.port",
                    "must be the proxy's TCP port (1-65535)".into(),
                ));
            }
        }
        for (i, c) in s.required_capabilities.iter().enumerate() {
            if !ALL_CAPABILITIES.contains(&c.as_str()) {
                return Err(invalid(
                    &format!("spec.requiredCapabilities[{i}]"),
                    format!(
                        "{c:?} is not a jobsite-sandbox/v1 capability (one of {})",
                        ALL_CAPABILITIES.join(", ")
                    ),
                ));
            }
        }
        if let Some(missing) = ALL_CAPABILITIES
            .iter()
            .find(|c| !s.required_capabilities.iter().any(|r| r == *c))
        {
            return Err(invalid(
                "spec.requiredCapabilities",
                format!(
                    "misses {missing:?}: a Kubernetes profile must require every capability of the closed set (§2.2)"
                ),
            ));
        }
        if !is_dns_subdomain(&s.conformance.config_map) {
            return Err(invalid(
                "spec.conformance.configMap",
                format!("{:?} is not a ConfigMap name", s.conformance.config_map),
            ));
        }
        if s.conformance.key.is_empty() {
            return Err(invalid(
                "spec.conformance.key",
                "must name the data key holding the report JSON".into(),
            ));
        }
        if let Some(sup) = &s.supervisor {
            if !sup.binary_path.starts_with('/')
                || sup
                    .binary_path
                    .chars()
                    .any(|c| c.is_whitespace() || c == '\0')
            {
                return Err(invalid(
                    "spec.supervisor.binaryPath",
                    format!(
                        "{:?} is not an absolute path; write the protobot binary's path in the image ({DEFAULT_SUPERVISOR_BINARY})",
                        sup.binary_path
                    ),
                ));
            }
            if sup
                .image
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(invalid(
                    "spec.supervisor.image",
                    format!("{:?} is not an image reference", sup.image),
                ));
            }
        }
        Ok(SandboxProfile {
            doc,
            cpu_millis,
            cpu_request_millis,
            max_memory_bytes,
            ephemeral_storage_bytes,
            tmp_size_bytes,
        })
    }

    /// The profile name.
    pub fn name(&self) -> &str {
        &self.doc.metadata.name
    }

    /// The whole document.
    pub fn document(&self) -> &ProfileDocument {
        &self.doc
    }

    /// The profile body.
    pub fn spec(&self) -> &ProfileSpec {
        &self.doc.spec
    }

    /// CPU limit, in millicores.
    pub fn cpu_millis(&self) -> u64 {
        self.cpu_millis
    }

    /// The CPU request of every sandbox container, in millicores (`cpuRequest`, else the
    /// limit).
    pub fn cpu_request_millis(&self) -> u64 {
        self.cpu_request_millis
    }

    /// Largest memory limit a run may ask for.
    pub fn max_memory_bytes(&self) -> u64 {
        self.max_memory_bytes
    }

    /// Ephemeral-storage request and limit.
    pub fn ephemeral_storage_bytes(&self) -> u64 {
        self.ephemeral_storage_bytes
    }

    /// Size limit of the memory-backed `/tmp`.
    pub fn tmp_size_bytes(&self) -> u64 {
        self.tmp_size_bytes
    }
}

/// Whether `s` is a DNS-1123 label.
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a DNS-1123 subdomain.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Parses a Kubernetes CPU quantity into millicores (`"2"`, `"1.5"`, `"500m"`).
pub fn parse_cpu_millis(q: &str) -> Option<u64> {
    if let Some(m) = q.strip_suffix('m') {
        return m.parse().ok();
    }
    let (whole, frac) = q.split_once('.').unwrap_or((q, ""));
    if frac.len() > 3 || (whole.is_empty() && frac.is_empty()) {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let frac_millis: u64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<3}").parse().ok()?
    };
    whole.checked_mul(1000)?.checked_add(frac_millis)
}

/// Parses a Kubernetes byte quantity (`"512Mi"`, `"2Gi"`, `"1G"`, `"1000"`).
pub fn parse_bytes(q: &str) -> Option<u64> {
    const SUFFIXES: [(&str, u64); 10] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
    ];
    for (suffix, mult) in SUFFIXES {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<u64>().ok()?.checked_mul(mult);
        }
    }
    q.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KATA: &str = include_str!("../../../sandbox-profiles/kata.yaml");

    fn edited(from: &str, to: &str) -> Result<SandboxProfile, ProfileError> {
        assert!(
            KATA.contains(from),
            "fixture text {from:?} not in kata.yaml"
        );
        SandboxProfile::parse(&KATA.replacen(from, to, 1), "kata.yaml")
    }

    fn invalid_field(r: Result<SandboxProfile, ProfileError>) -> String {
        match r {
            Err(ProfileError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        }
    }

    #[test]
    fn the_default_profile_parses_with_its_quantities() {
        let p = SandboxProfile::parse(KATA, "kata.yaml").unwrap();
        assert_eq!(p.name(), DEFAULT_PROFILE);
        assert_eq!(p.spec().runtime_class_name, "kata");
        assert_eq!(p.cpu_millis(), 2000);
        assert_eq!(p.max_memory_bytes(), 4 << 30);
        assert_eq!(p.ephemeral_storage_bytes(), 2 << 30);
        assert_eq!(p.tmp_size_bytes(), 512 << 20);
        assert_eq!(p.spec().egress.proxy.as_ref().unwrap().port, 3128);
        let sup = p.spec().supervisor.as_ref().unwrap();
        assert_eq!(sup.image, "", "the operator's own image");
        assert_eq!(sup.binary_path, DEFAULT_SUPERVISOR_BINARY);
    }

    #[test]
    fn weakening_the_security_context_names_the_field() {
        let cases = [
            (
                "runAsNonRoot: true",
                "runAsNonRoot: false",
                "spec.securityContext.runAsNonRoot",
            ),
            (
                "runAsUser: 65532",
                "runAsUser: 0",
                "spec.securityContext.runAsUser",
            ),
            (
                "readOnlyRootFilesystem: true",
                "readOnlyRootFilesystem: false",
                "spec.securityContext.readOnlyRootFilesystem",
            ),
            (
                "allowPrivilegeEscalation: false",
                "allowPrivilegeEscalation: true",
                "spec.securityContext.allowPrivilegeEscalation",
            ),
            (
                "drop: [ALL]",
                "drop: [NET_RAW]",
                "spec.securityContext.capabilities.drop",
            ),
            (
                "drop: [ALL]",
                "drop: [ALL]\n      add: [SYS_ADMIN]",
                "spec.securityContext.capabilities.add",
            ),
            (
                "type: RuntimeDefault",
                "type: Unconfined",
                "spec.securityContext.seccompProfile",
            ),
            (
                "runtimeClassName: kata",
                "runtimeClassName: runc",
                "spec.runtimeClassName",
            ),
            (
                "runtimeClassName: kata",
                "runtimeClassName: \"\"",
                "spec.runtimeClassName",
            ),
            ("cpu: \"2\"", "cpu: two", "spec.resources.cpu"),
            (
                "cpuRequest: 250m",
                "cpuRequest: \"3\"",
                "spec.resources.cpuRequest",
            ),
            (
                "cpuRequest: 250m",
                "cpuRequest: 0m",
                "spec.resources.cpuRequest",
            ),
            (
                "maxMemory: 4Gi",
                "maxMemory: 256Mi",
                "spec.resources.tmpSizeLimit",
            ),
            ("    - audit-chain\n", "", "spec.requiredCapabilities"),
            (
                "    - audit-chain\n",
                "    - audit-chain\n    - teleport\n",
                "spec.requiredCapabilities[7]",
            ),
            (
                "contractVersion: jobsite-sandbox/v1",
                "contractVersion: jobsite-sandbox/v2",
                "spec.contractVersion",
            ),
            ("name: kata", "name: Kata", "metadata.name"),
            ("port: 3128", "port: 0", "spec.egress.proxy.port"),
            (
                "binaryPath: /usr/local/bin/protobot",
                "binaryPath: protobot",
                "spec.supervisor.binaryPath",
            ),
        ];
        for (from, to, field) in cases {
            assert_eq!(invalid_field(edited(from, to)), field, "{from} -> {to}");
        }
    }

    #[test]
    fn an_unknown_field_is_a_parse_error_that_names_it() {
        let err = edited(
            "runAsNonRoot: true",
            "runAsNonRoot: true\n    privileged: true",
        )
        .unwrap_err();
        assert!(matches!(err, ProfileError::Parse { .. }), "{err}");
        assert!(err.to_string().contains("privileged"), "{err}");
    }

    #[test]
    fn a_profile_without_a_proxy_parses() {
        let yaml = KATA.replace(
            "    proxy:\n      namespaceSelector:\n        kubernetes.io/metadata.name: protobot-system\n      podSelector:\n        app.kubernetes.io/name: protobot-egress-proxy\n      port: 3128\n",
            "    {}\n",
        );
        let yaml = yaml.replace("  egress:\n    {}\n", "  egress: {}\n");
        let p = SandboxProfile::parse(&yaml, "no-proxy").unwrap();
        assert!(p.spec().egress.proxy.is_none());
    }

    #[test]
    fn quantities_parse_like_kubernetes() {
        assert_eq!(parse_cpu_millis("500m"), Some(500));
        assert_eq!(parse_cpu_millis("1.5"), Some(1500));
        assert_eq!(parse_cpu_millis("2"), Some(2000));
        assert_eq!(parse_cpu_millis("x"), None);
        assert_eq!(parse_bytes("1Ki"), Some(1024));
        assert_eq!(parse_bytes("1G"), Some(1_000_000_000));
        assert_eq!(parse_bytes("77"), Some(77));
        assert_eq!(parse_bytes("1Xi"), None);
    }
}
