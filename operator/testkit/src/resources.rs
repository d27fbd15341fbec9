//! The resource types the double serves: the built-in kinds the operator uses and
//! custom resources registered from `CustomResourceDefinition` YAML.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::error::TestkitError;

/// One served resource type (a group/kind with its plural and per-version schemas).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    /// API group; empty for the core group.
    pub group: String,
    /// Served versions, the storage version first.
    pub versions: Vec<String>,
    /// Kind, e.g. `Pod`.
    pub kind: String,
    /// Plural resource name, e.g. `pods`.
    pub plural: String,
    /// Singular resource name, e.g. `pod`.
    pub singular: String,
    /// Short names for discovery.
    pub short_names: Vec<String>,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether the `status` subresource exists (spec and status writes are isolated).
    pub status_subresource: bool,
    /// `openAPIV3Schema` per version (custom resources only).
    pub schemas: BTreeMap<String, Value>,
}

impl ResourceType {
    fn builtin(group: &str, version: &str, kind: &str, plural: &str, namespaced: bool) -> Self {
        Self {
            group: group.to_owned(),
            versions: vec![version.to_owned()],
            kind: kind.to_owned(),
            plural: plural.to_owned(),
            singular: kind.to_lowercase(),
            short_names: Vec::new(),
            namespaced,
            status_subresource: false,
            schemas: BTreeMap::new(),
        }
    }

    fn with_status(mut self) -> Self {
        self.status_subresource = true;
        self
    }

    fn with_short_names(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|n| (*n).to_owned()).collect();
        self
    }

    /// `plural` for core resources, `plural.group` otherwise (as in API messages).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// `apiVersion` for a version of this type.
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_owned()
        } else {
            format!("{}/{version}", self.group)
        }
    }

    /// The storage (first) version.
    pub fn storage_version(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }

    /// Whether this is a custom resource (validated against a schema).
    pub fn is_custom(&self) -> bool {
        !self.schemas.is_empty()
    }

    /// Whether objects carry `metadata.generation` (custom resources, pods,
    /// network policies, CRDs; not ConfigMaps, Secrets, Events, Leases, Namespaces).
    pub fn tracks_generation(&self) -> bool {
        self.is_custom()
            || matches!(
                (self.group.as_str(), self.plural.as_str()),
                ("", "pods")
                    | ("networking.k8s.io", "networkpolicies")
                    | ("apiextensions.k8s.io", "customresourcedefinitions")
            )
    }

    /// Server-side apply list semantics at a version.
    pub fn list_types(&self, version: &str) -> crate::lists::ListTypes {
        crate::lists::ListTypes::new(
            self.schemas.get(version).cloned(),
            self.group.is_empty() && self.plural == "pods",
        )
    }

    /// Subresources served for this type, for discovery.
    pub fn subresources(&self) -> Vec<&'static str> {
        let mut subs = Vec::new();
        if self.status_subresource {
            subs.push("status");
        }
        if self.group.is_empty() && self.plural == "pods" {
            subs.push("log");
        }
        subs
    }
}

/// The built-in kinds: Pod, Secret, ConfigMap, Service, Event (core and events.k8s.io),
/// Namespace, NetworkPolicy, Lease, and CustomResourceDefinition itself.
pub fn builtin_types() -> Vec<ResourceType> {
    vec![
        ResourceType::builtin("", "v1", "Namespace", "namespaces", false)
            .with_status()
            .with_short_names(&["ns"]),
        ResourceType::builtin("", "v1", "Pod", "pods", true)
            .with_status()
            .with_short_names(&["po"]),
        ResourceType::builtin("", "v1", "Secret", "secrets", true),
        ResourceType::builtin("", "v1", "ConfigMap", "configmaps", true).with_short_names(&["cm"]),
        ResourceType::builtin("", "v1", "Service", "services", true).with_short_names(&["svc"]),
        ResourceType::builtin("", "v1", "Event", "events", true).with_short_names(&["ev"]),
        ResourceType::builtin("events.k8s.io", "v1", "Event", "events", true)
            .with_short_names(&["ev"]),
        ResourceType::builtin(
            "networking.k8s.io",
            "v1",
            "NetworkPolicy",
            "networkpolicies",
            true,
        )
        .with_short_names(&["netpol"]),
        ResourceType::builtin("coordination.k8s.io", "v1", "Lease", "leases", true),
        ResourceType::builtin(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
        )
        .with_status()
        .with_short_names(&["crd", "crds"]),
    ]
}

fn crd_err(name: &str, reason: impl Into<String>) -> TestkitError {
    TestkitError::InvalidCrd {
        name: name.to_owned(),
        reason: reason.into(),
    }
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

/// Build a [`ResourceType`] from an `apiextensions.k8s.io/v1` CRD object.
pub fn from_crd(crd: &Value) -> Result<ResourceType, TestkitError> {
    let name = str_at(crd, &["metadata", "name"]).unwrap_or("<unnamed>");
    if crd.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
        return Err(crd_err(name, "kind is not CustomResourceDefinition"));
    }
    let spec = crd
        .get("spec")
        .ok_or_else(|| crd_err(name, "missing spec"))?;
    let group = str_at(spec, &["group"]).ok_or_else(|| crd_err(name, "missing spec.group"))?;
    let kind =
        str_at(spec, &["names", "kind"]).ok_or_else(|| crd_err(name, "missing spec.names.kind"))?;
    let plural = str_at(spec, &["names", "plural"])
        .ok_or_else(|| crd_err(name, "missing spec.names.plural"))?;
    let singular = str_at(spec, &["names", "singular"])
        .map(str::to_owned)
        .unwrap_or_else(|| kind.to_lowercase());
    let short_names = spec
        .pointer("/names/shortNames")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let namespaced = match str_at(spec, &["scope"]) {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        other => return Err(crd_err(name, format!("invalid spec.scope {other:?}"))),
    };
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .ok_or_else(|| crd_err(name, "missing spec.versions"))?;
    let mut served = Vec::new();
    let mut schemas = BTreeMap::new();
    let mut status_subresource = false;
    for v in versions {
        let vname = str_at(v, &["name"]).ok_or_else(|| crd_err(name, "version without name"))?;
        if v.get("served").and_then(Value::as_bool) == Some(false) {
            continue;
        }
        let schema = v
            .pointer("/schema/openAPIV3Schema")
            .cloned()
            .ok_or_else(|| crd_err(name, format!("version {vname} has no openAPIV3Schema")))?;
        if v.pointer("/subresources/status").is_some() {
            status_subresource = true;
        }
        if v.get("storage").and_then(Value::as_bool) == Some(true) {
            served.insert(0, vname.to_owned());
        } else {
            served.push(vname.to_owned());
        }
        schemas.insert(vname.to_owned(), schema);
    }
    if served.is_empty() {
        return Err(crd_err(name, "no served versions"));
    }
    Ok(ResourceType {
        group: group.to_owned(),
        versions: served,
        kind: kind.to_owned(),
        plural: plural.to_owned(),
        singular,
        short_names,
        namespaced,
        status_subresource,
        schemas,
    })
}

/// Parse a (possibly multi-document) YAML string into JSON values, skipping empty documents.
pub fn parse_yaml_documents(yaml: &str) -> Result<Vec<Value>, TestkitError> {
    use serde::Deserialize;
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(yaml) {
        let value = Value::deserialize(doc).map_err(|source| TestkitError::Yaml {
            source: Box::new(source),
        })?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The set of served types, looked up by group and plural.
#[derive(Debug, Clone, Default)]
pub struct TypeRegistry {
    types: BTreeMap<(String, String), ResourceType>,
}

impl TypeRegistry {
    /// A registry holding the built-in kinds.
    pub fn with_builtins() -> Self {
        let mut reg = Self::default();
        for t in builtin_types() {
            reg.insert(t);
        }
        reg
    }

    /// Add or replace a type.
    pub fn insert(&mut self, rt: ResourceType) {
        self.types.insert((rt.group.clone(), rt.plural.clone()), rt);
    }

    /// Remove a type (when its CRD is deleted).
    pub fn remove(&mut self, group: &str, plural: &str) -> Option<ResourceType> {
        self.types.remove(&(group.to_owned(), plural.to_owned()))
    }

    /// The type served at `group`/`version` under `plural`.
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceType> {
        self.types
            .get(&(group.to_owned(), plural.to_owned()))
            .filter(|t| t.versions.iter().any(|v| v == version))
    }

    /// The type of an object by its `apiVersion` and `kind`.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<&ResourceType> {
        let (group, version) = split_api_version(api_version);
        self.types
            .values()
            .find(|t| t.group == group && t.kind == kind && t.versions.iter().any(|v| v == version))
    }

    /// All types.
    pub fn all(&self) -> impl Iterator<Item = &ResourceType> {
        self.types.values()
    }
}

/// Split `group/version` (or a bare core `version`) into its parts.
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}
