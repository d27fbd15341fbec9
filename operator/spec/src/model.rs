//! Record schemas (§5, §8, §10, §11): serde structs as read from disk
//! (strict: unknown fields refused, enums kept as strings so that bad values
//! become diagnostics), plus their canonical forms as ordered [`Node`]s.

use serde::Deserialize;

use crate::node::Node;

/// `applies_to` of a requirement.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppliesTo {
    /// Interface IDs.
    #[serde(default)]
    pub interfaces: Vec<String>,
    /// Free scope selectors; `project` is reserved for project-wide ones.
    #[serde(default)]
    pub scopes: Vec<String>,
}

/// `verification` of a requirement.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verification {
    /// `isolated-interface` or `implementation-aware`.
    #[serde(default)]
    pub mode: String,
    /// Required when the mode is `implementation-aware`.
    #[serde(default)]
    pub rationale: String,
}

/// One relationship entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Relationship {
    /// `depends-on`, `conflicts-with`, `supersedes` or `related-to`.
    #[serde(default, rename = "type")]
    pub kind: String,
    /// Target requirement ID.
    #[serde(default)]
    pub target: String,
}

/// Relationship types (§13).
pub const RELATIONSHIP_TYPES: [&str; 4] =
    ["conflicts-with", "depends-on", "related-to", "supersedes"];

/// Whether a relationship type is stored on both ends.
pub fn is_symmetric(kind: &str) -> bool {
    kind == "conflicts-with" || kind == "related-to"
}

/// A requirement record (§8).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Requirement {
    /// `REQ-<SCOPE>-<NNNNN>`.
    #[serde(default)]
    pub id: String,
    /// EARS pattern name.
    #[serde(default, rename = "type")]
    pub kind: String,
    /// Requirement text.
    #[serde(default)]
    pub text: String,
    /// Applicability (required).
    #[serde(default)]
    pub applies_to: Option<AppliesTo>,
    /// Verification (required).
    #[serde(default)]
    pub verification: Option<Verification>,
    /// Who wrote it.
    #[serde(default)]
    pub provenance: String,
    /// Creation timestamp.
    #[serde(default)]
    pub created: String,
    /// Relationships to other requirements.
    #[serde(default)]
    pub relationships: Vec<Relationship>,
    /// `active` (default) or `retired`.
    #[serde(default)]
    pub status: String,
}

impl Requirement {
    /// Fills defaults and sorts set-like lists (§4).
    pub fn canonicalize(&mut self) {
        if let Some(a) = &mut self.applies_to {
            a.interfaces.sort();
            a.scopes.sort();
        }
        match &mut self.verification {
            Some(v) if v.mode.is_empty() => v.mode = "isolated-interface".to_owned(),
            _ => {}
        }
        self.relationships.sort();
        if self.status.is_empty() {
            self.status = "active".to_owned();
        }
    }

    /// Effective status (`active` when omitted).
    pub fn status(&self) -> &str {
        if self.status.is_empty() {
            "active"
        } else {
            &self.status
        }
    }

    /// Scopes (empty when applies_to is absent).
    pub fn scopes(&self) -> &[String] {
        self.applies_to.as_ref().map_or(&[], |a| &a.scopes)
    }

    /// Interfaces (empty when applies_to is absent).
    pub fn interfaces(&self) -> &[String] {
        self.applies_to.as_ref().map_or(&[], |a| &a.interfaces)
    }

    /// Canonical document form (YAML and JSON share it).
    pub fn to_node(&self) -> Node {
        let mut n = Node::map()
            .with("id", Node::s(&self.id))
            .with("type", Node::s(&self.kind))
            .with("text", Node::s(&self.text));
        if let Some(a) = &self.applies_to {
            let mut an = Node::map();
            if !a.interfaces.is_empty() {
                an = an.with("interfaces", Node::strs(a.interfaces.iter().cloned()));
            }
            if !a.scopes.is_empty() {
                an = an.with("scopes", Node::strs(a.scopes.iter().cloned()));
            }
            n = n.with("applies_to", an);
        }
        if let Some(v) = &self.verification {
            n = n.with(
                "verification",
                Node::map()
                    .with("mode", Node::s(&v.mode))
                    .with_opt_str("rationale", &v.rationale),
            );
        }
        n = n
            .with("provenance", Node::s(&self.provenance))
            .with("created", Node::s(&self.created));
        if !self.relationships.is_empty() {
            n = n.with(
                "relationships",
                Node::List(
                    self.relationships
                        .iter()
                        .map(|r| {
                            Node::map()
                                .with("type", Node::s(&r.kind))
                                .with("target", Node::s(&r.target))
                        })
                        .collect(),
                ),
            );
        }
        n.with("status", Node::s(self.status()))
    }
}

/// Interface types (§10).
pub const INTERFACE_TYPES: [&str; 8] = [
    "network-service",
    "cli",
    "repl",
    "linkable-library",
    "web-gui",
    "native-gui",
    "persistent-state",
    "package-source",
];

/// An interface record (§10).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interface {
    /// Kebab ID.
    #[serde(default)]
    pub id: String,
    /// Display name.
    #[serde(default)]
    pub name: String,
    /// Interface type.
    #[serde(default, rename = "type")]
    pub kind: String,
    /// Free text, for example `OpenAPI 3.1`.
    #[serde(default)]
    pub spec_approach: String,
    /// Free text.
    #[serde(default)]
    pub description: String,
    /// Creation timestamp.
    #[serde(default)]
    pub created: String,
    /// `active` (default) or `retired`.
    #[serde(default)]
    pub status: String,
}

impl Interface {
    /// Fills defaults.
    pub fn canonicalize(&mut self) {
        if self.status.is_empty() {
            self.status = "active".to_owned();
        }
    }

    /// Canonical document form.
    pub fn to_node(&self) -> Node {
        Node::map()
            .with("id", Node::s(&self.id))
            .with("name", Node::s(&self.name))
            .with("type", Node::s(&self.kind))
            .with_opt_str("spec_approach", &self.spec_approach)
            .with_opt_str("description", &self.description)
            .with("created", Node::s(&self.created))
            .with(
                "status",
                Node::s(if self.status.is_empty() {
                    "active"
                } else {
                    &self.status
                }),
            )
    }
}

/// A requirement operation of a change set.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequirementOp {
    /// `add`, `revise` or `retire`.
    #[serde(default)]
    pub action: String,
    /// Target requirement.
    #[serde(default)]
    pub requirement_id: String,
    /// Optional rationale.
    #[serde(default)]
    pub rationale: String,
}

/// An interface operation of a change set.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceOp {
    /// `add` or `revise`.
    #[serde(default)]
    pub action: String,
    /// Target interface.
    #[serde(default)]
    pub interface_id: String,
    /// Optional rationale.
    #[serde(default)]
    pub rationale: String,
}

/// An artifact operation of a change set.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactOp {
    /// `add` or `revise`.
    #[serde(default)]
    pub action: String,
    /// Target artifact.
    #[serde(default)]
    pub artifact_id: String,
    /// Optional rationale.
    #[serde(default)]
    pub rationale: String,
}

/// One impact-assessment entry (§11).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assessment {
    /// Assessed requirement.
    #[serde(default)]
    pub requirement_id: String,
    /// `applicable` or `not-applicable`.
    #[serde(default)]
    pub disposition: String,
    /// Non-blank reason.
    #[serde(default)]
    pub rationale: String,
    /// `mechanical` or `semantic`.
    #[serde(default)]
    pub origin: String,
}

impl Assessment {
    /// Canonical document form.
    pub fn to_node(&self) -> Node {
        Node::map()
            .with("requirement_id", Node::s(&self.requirement_id))
            .with("disposition", Node::s(&self.disposition))
            .with("rationale", Node::s(&self.rationale))
            .with("origin", Node::s(&self.origin))
    }
}

/// A change-set manifest (§11). Status is derived from Git, not stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeSet {
    /// `CS-<NNNNN>`.
    #[serde(default)]
    pub id: String,
    /// Full commit ID the set was cut from.
    #[serde(default)]
    pub base_commit: String,
    /// What the set is for.
    #[serde(default)]
    pub intent: String,
    /// Requirement operations (must be present, may be empty).
    #[serde(default)]
    pub operations: Option<Vec<RequirementOp>>,
    /// Interface operations.
    #[serde(default)]
    pub interface_operations: Vec<InterfaceOp>,
    /// Artifact operations.
    #[serde(default)]
    pub artifact_operations: Vec<ArtifactOp>,
    /// Affected interfaces (must be present, may be empty).
    #[serde(default)]
    pub affected_interfaces: Option<Vec<String>>,
    /// Affected scopes.
    #[serde(default)]
    pub affected_scopes: Vec<String>,
    /// Whether implementation work is needed.
    #[serde(default)]
    pub implementation_required: Option<bool>,
    /// Required when no implementation is needed.
    #[serde(default)]
    pub implementation_rationale: String,
    /// Reviewed impact dispositions.
    #[serde(default)]
    pub impact_assessment: Vec<Assessment>,
    /// The base the assessment was reviewed against.
    #[serde(default)]
    pub impact_assessment_base_commit: String,
    /// Creation timestamp.
    #[serde(default)]
    pub created: String,
}

impl ChangeSet {
    /// Sorts set-like lists and lowercases commit IDs (§4).
    pub fn canonicalize(&mut self) {
        if let Some(ops) = &mut self.operations {
            ops.sort();
        }
        self.interface_operations.sort();
        self.artifact_operations.sort();
        if let Some(a) = &mut self.affected_interfaces {
            a.sort();
        }
        self.affected_scopes.sort();
        self.impact_assessment.sort();
        if crate::ids::is_full_sha(&self.base_commit) {
            self.base_commit = self.base_commit.to_ascii_lowercase();
        }
        if crate::ids::is_full_sha(&self.impact_assessment_base_commit) {
            self.impact_assessment_base_commit =
                self.impact_assessment_base_commit.to_ascii_lowercase();
        }
    }

    /// Requirement operations (empty when absent).
    pub fn ops(&self) -> &[RequirementOp] {
        self.operations.as_deref().unwrap_or(&[])
    }

    /// Affected interfaces (empty when absent).
    pub fn affected_interfaces(&self) -> &[String] {
        self.affected_interfaces.as_deref().unwrap_or(&[])
    }

    /// Canonical document form.
    pub fn to_node(&self) -> Node {
        let op = |action: &str, key: &str, id: &str, rationale: &str| {
            Node::map()
                .with("action", Node::s(action))
                .with(key, Node::s(id))
                .with_opt_str("rationale", rationale)
        };
        let mut n = Node::map()
            .with("id", Node::s(&self.id))
            .with("base_commit", Node::s(&self.base_commit))
            .with("intent", Node::s(&self.intent))
            .with(
                "operations",
                Node::List(
                    self.ops()
                        .iter()
                        .map(|o| op(&o.action, "requirement_id", &o.requirement_id, &o.rationale))
                        .collect(),
                ),
            );
        if !self.interface_operations.is_empty() {
            n = n.with(
                "interface_operations",
                Node::List(
                    self.interface_operations
                        .iter()
                        .map(|o| op(&o.action, "interface_id", &o.interface_id, &o.rationale))
                        .collect(),
                ),
            );
        }
        if !self.artifact_operations.is_empty() {
            n = n.with(
                "artifact_operations",
                Node::List(
                    self.artifact_operations
                        .iter()
                        .map(|o| op(&o.action, "artifact_id", &o.artifact_id, &o.rationale))
                        .collect(),
                ),
            );
        }
        n = n.with(
            "affected_interfaces",
            Node::strs(self.affected_interfaces().iter().cloned()),
        );
        if !self.affected_scopes.is_empty() {
            n = n.with(
                "affected_scopes",
                Node::strs(self.affected_scopes.iter().cloned()),
            );
        }
        if let Some(b) = self.implementation_required {
            n = n.with("implementation_required", Node::Bool(b));
        }
        n = n.with_opt_str("implementation_rationale", &self.implementation_rationale);
        if !self.impact_assessment.is_empty() {
            n = n.with(
                "impact_assessment",
                Node::List(
                    self.impact_assessment
                        .iter()
                        .map(Assessment::to_node)
                        .collect(),
                ),
            );
        }
        n.with_opt_str(
            "impact_assessment_base_commit",
            &self.impact_assessment_base_commit,
        )
        .with("created", Node::s(&self.created))
    }
}

/// `project` block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectMeta {
    /// Project ID.
    #[serde(default)]
    pub id: String,
    /// Display name.
    #[serde(default)]
    pub name: String,
}

/// `repository` block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepositoryMeta {
    /// Canonical remote URL (no credentials).
    #[serde(default)]
    pub canonical_remote: Option<String>,
    /// Default branch (default `main`).
    #[serde(default)]
    pub default_branch: Option<String>,
    /// `single-player` or `multi-player`.
    #[serde(default)]
    pub review_mode: Option<String>,
    /// Branch prefix (default `cs/`).
    #[serde(default)]
    pub branch_prefix: Option<String>,
}

/// `schema_versions` block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchemaVersions {
    /// Must be 1.
    #[serde(default)]
    pub specification: Option<i64>,
    /// Must be 1.
    #[serde(default)]
    pub project: Option<i64>,
}

/// `stores` block (paths), also used for `store_digests`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreTriple {
    /// Requirements store entry.
    #[serde(default)]
    pub requirements: Option<String>,
    /// Interfaces store entry.
    #[serde(default)]
    pub interfaces: Option<String>,
    /// Change-set store entry.
    #[serde(default)]
    pub change_sets: Option<String>,
}

/// Store kinds, in the fixed order requirements, interfaces, change sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StoreKind {
    /// Requirement records.
    Requirements,
    /// Interface records.
    Interfaces,
    /// Change-set manifests.
    ChangeSets,
}

impl StoreKind {
    /// All three, in order.
    pub const ALL: [StoreKind; 3] = [
        StoreKind::Requirements,
        StoreKind::Interfaces,
        StoreKind::ChangeSets,
    ];

    /// Key in `stores` / `store_digests`.
    pub fn key(self) -> &'static str {
        match self {
            StoreKind::Requirements => "requirements",
            StoreKind::Interfaces => "interfaces",
            StoreKind::ChangeSets => "change_sets",
        }
    }

    /// Default store directory.
    pub fn default_dir(self) -> &'static str {
        match self {
            StoreKind::Requirements => ".protobot/requirements",
            StoreKind::Interfaces => ".protobot/interfaces",
            StoreKind::ChangeSets => ".protobot/change-sets",
        }
    }
}

impl StoreTriple {
    /// Entry for a kind.
    pub fn get(&self, kind: StoreKind) -> Option<&String> {
        match kind {
            StoreKind::Requirements => self.requirements.as_ref(),
            StoreKind::Interfaces => self.interfaces.as_ref(),
            StoreKind::ChangeSets => self.change_sets.as_ref(),
        }
    }

    /// Sets the entry for a kind.
    pub fn set(&mut self, kind: StoreKind, value: String) {
        match kind {
            StoreKind::Requirements => self.requirements = Some(value),
            StoreKind::Interfaces => self.interfaces = Some(value),
            StoreKind::ChangeSets => self.change_sets = Some(value),
        }
    }

    fn to_node(&self) -> Node {
        let mut n = Node::map();
        for k in StoreKind::ALL {
            if let Some(v) = self.get(k) {
                n = n.with(k.key(), Node::s(v));
            }
        }
        n
    }
}

/// An artifact registry entry (§11, §17).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    /// Kebab ID.
    #[serde(default)]
    pub id: String,
    /// `vision`, `architecture`, `interface-idl`, `interface-prose`.
    #[serde(default)]
    pub kind: String,
    /// Project-relative path.
    #[serde(default)]
    pub path: String,
    /// `sha256:<hex>` of the canonical text.
    #[serde(default)]
    pub digest: String,
    /// `user` or `ears-manager`.
    #[serde(default)]
    pub owner: String,
    /// Optional validator name.
    #[serde(default)]
    pub validator: String,
}

/// Artifact kinds the code accepts.
pub const ARTIFACT_KINDS: [&str; 4] =
    ["vision", "architecture", "interface-idl", "interface-prose"];
/// Artifact owners the code accepts.
pub const ARTIFACT_OWNERS: [&str; 2] = ["user", "ears-manager"];

/// Kinds a validator may be attached to, or `None` for unknown validators.
pub fn validator_kinds(name: &str) -> Option<&'static [&'static str]> {
    match name {
        "markdownlint" => Some(&["vision", "architecture", "interface-prose"]),
        "openapi-lint" | "protoc" => Some(&["interface-idl"]),
        _ => None,
    }
}

impl Artifact {
    /// Registry (YAML) form.
    pub fn to_node(&self) -> Node {
        Node::map()
            .with("id", Node::s(&self.id))
            .with("kind", Node::s(&self.kind))
            .with("path", Node::s(&self.path))
            .with("digest", Node::s(&self.digest))
            .with("owner", Node::s(&self.owner))
            .with_opt_str("validator", &self.validator)
    }

    /// JSON data form (owner before digest, §17 `artifact put`).
    pub fn to_data(&self) -> Node {
        Node::map()
            .with("id", Node::s(&self.id))
            .with("kind", Node::s(&self.kind))
            .with("path", Node::s(&self.path))
            .with("owner", Node::s(&self.owner))
            .with("digest", Node::s(&self.digest))
            .with_opt_str("validator", &self.validator)
    }
}

/// `.protobot/project.yaml` (§5).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Project {
    /// Identity.
    #[serde(default)]
    pub project: Option<ProjectMeta>,
    /// Repository block.
    #[serde(default)]
    pub repository: Option<RepositoryMeta>,
    /// Schema versions.
    #[serde(default)]
    pub schema_versions: Option<SchemaVersions>,
    /// Store directories.
    #[serde(default)]
    pub stores: Option<StoreTriple>,
    /// Store digests.
    #[serde(default)]
    pub store_digests: Option<StoreTriple>,
    /// Artifact registry.
    #[serde(default)]
    pub artifacts: Vec<Artifact>,
}

impl Project {
    /// Configured (or default) store directory for a kind.
    pub fn store_dir(&self, kind: StoreKind) -> String {
        self.stores
            .as_ref()
            .and_then(|s| s.get(kind))
            .cloned()
            .unwrap_or_else(|| kind.default_dir().to_owned())
    }

    /// Default branch (`main` when omitted).
    pub fn default_branch(&self) -> String {
        self.repository
            .as_ref()
            .and_then(|r| r.default_branch.clone())
            .unwrap_or_else(|| "main".to_owned())
    }

    /// Branch prefix (`cs/` when omitted).
    pub fn branch_prefix(&self) -> String {
        self.repository
            .as_ref()
            .and_then(|r| r.branch_prefix.clone())
            .unwrap_or_else(|| "cs/".to_owned())
    }

    /// Canonical remote (empty when missing).
    pub fn canonical_remote(&self) -> String {
        self.repository
            .as_ref()
            .and_then(|r| r.canonical_remote.clone())
            .unwrap_or_default()
    }

    /// Fills defaults and sorts the registry (§4).
    pub fn canonicalize(&mut self) {
        let repo = self.repository.get_or_insert_with(RepositoryMeta::default);
        repo.default_branch.get_or_insert_with(|| "main".to_owned());
        repo.branch_prefix.get_or_insert_with(|| "cs/".to_owned());
        let stores = self.stores.get_or_insert_with(StoreTriple::default);
        for k in StoreKind::ALL {
            if stores.get(k).is_none() {
                stores.set(k, k.default_dir().to_owned());
            }
        }
        self.artifacts.sort();
    }

    /// Canonical document form.
    pub fn to_node(&self) -> Node {
        let mut n = Node::map();
        if let Some(p) = &self.project {
            n = n.with(
                "project",
                Node::map()
                    .with("id", Node::s(&p.id))
                    .with("name", Node::s(&p.name)),
            );
        }
        if let Some(r) = &self.repository {
            let mut rn = Node::map();
            for (k, v) in [
                ("canonical_remote", &r.canonical_remote),
                ("default_branch", &r.default_branch),
                ("review_mode", &r.review_mode),
                ("branch_prefix", &r.branch_prefix),
            ] {
                if let Some(v) = v {
                    rn = rn.with(k, Node::s(v));
                }
            }
            n = n.with("repository", rn);
        }
        if let Some(s) = &self.schema_versions {
            let mut sn = Node::map();
            if let Some(v) = s.project {
                sn = sn.with("project", Node::Int(v));
            }
            if let Some(v) = s.specification {
                sn = sn.with("specification", Node::Int(v));
            }
            n = n.with("schema_versions", sn);
        }
        if let Some(s) = &self.stores {
            n = n.with("stores", s.to_node());
        }
        if let Some(s) = &self.store_digests {
            n = n.with("store_digests", s.to_node());
        }
        if !self.artifacts.is_empty() {
            n = n.with(
                "artifacts",
                Node::List(self.artifacts.iter().map(Artifact::to_node).collect()),
            );
        }
        n
    }
}
