//! The projection manifest `.protobot/projection.yaml`: parsing and path classification.
//!
//! Pure. Format (spec-store contract §6): a mapping with integer `version: 1` and an optional
//! `paths` sequence of `{path, class}` mappings. A trailing `/` marks a directory entry that
//! covers everything below it. Lookup for `p`: its own file entry, else the directory entry
//! `p/`, else the nearest ancestor directory entry; no entry means *unclassified*, which every
//! consumer denies. Other top-level keys are preserved policy and ignored here.
//!
//! One rule is not negotiable by the manifest: everything under `.protobot/attestations/` is
//! `attestation-only` (seed: "always attestation-only").

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use serde::{Deserialize, Serialize};
use serde_yaml_ng::Value;

use crate::path::{check_project_path, fold_key, is_under};

/// Repository path of the projection manifest.
pub const MANIFEST_PATH: &str = ".protobot/projection.yaml";
/// Directory that is always `attestation-only`.
pub const ATTESTATIONS_DIR: &str = ".protobot/attestations";

/// The five path classes of the projection manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PathClass {
    /// Specifications, contracts, build protocol: visible to every role, writable by none.
    Shared,
    /// Test source: Worker A's domain.
    Test,
    /// Implementation source: Worker B's domain.
    Implementation,
    /// Visible only in the private integration environment.
    IntegrationOnly,
    /// Attestation snapshots: excluded from builds, digests and Worker views.
    AttestationOnly,
}

impl PathClass {
    /// The manifest spelling of the class.
    pub fn as_str(self) -> &'static str {
        match self {
            PathClass::Shared => "shared",
            PathClass::Test => "test",
            PathClass::Implementation => "implementation",
            PathClass::IntegrationOnly => "integration-only",
            PathClass::AttestationOnly => "attestation-only",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "shared" => PathClass::Shared,
            "test" => PathClass::Test,
            "implementation" => PathClass::Implementation,
            "integration-only" => PathClass::IntegrationOnly,
            "attestation-only" => PathClass::AttestationOnly,
            _ => return None,
        })
    }
}

impl fmt::Display for PathClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A manifest that could not be parsed; `field` follows the ears-manager diagnostic fields
/// (`version`, `paths`, `paths[i]`, `paths[i].path`, `paths[i].class`, or empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "projection.invalid: unable to use .protobot/projection.yaml (field `{field}`): {reason}; fix the manifest by a reviewed policy edit"
)]
pub struct ManifestError {
    /// Offending field.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

impl ManifestError {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// A parsed projection manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectionManifest {
    /// File entries, path → class.
    files: BTreeMap<String, PathClass>,
    /// Directory entries without their trailing `/`, path → class.
    dirs: BTreeMap<String, PathClass>,
}

impl ProjectionManifest {
    /// The manifest of a repository without `.protobot/projection.yaml`: everything unclassified.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Parses the manifest text.
    pub fn parse(text: &str) -> Result<Self, ManifestError> {
        let value: Value = serde_yaml_ng::from_str(text)
            .map_err(|e| ManifestError::new("", format!("not valid YAML: {e}")))?;
        let Value::Mapping(map) = value else {
            return Err(ManifestError::new("", "the manifest is not a mapping"));
        };
        match map.get("version") {
            Some(Value::Number(n)) if n.as_u64() == Some(1) && n.is_u64() => {}
            Some(_) => {
                return Err(ManifestError::new(
                    "version",
                    "version must be the integer 1",
                ));
            }
            None => return Err(ManifestError::new("version", "version is missing")),
        }
        let mut manifest = Self::default();
        let Some(paths) = map.get("paths") else {
            return Ok(manifest);
        };
        let Value::Sequence(entries) = paths else {
            return Err(ManifestError::new("paths", "paths must be a sequence"));
        };
        for (i, entry) in entries.iter().enumerate() {
            let Value::Mapping(entry) = entry else {
                return Err(ManifestError::new(
                    format!("paths[{i}]"),
                    "entry is not a mapping",
                ));
            };
            if entry.len() != 2 {
                return Err(ManifestError::new(
                    format!("paths[{i}]"),
                    "entry must have exactly the keys `path` and `class`",
                ));
            }
            let Some(Value::String(path)) = entry.get("path") else {
                return Err(ManifestError::new(
                    format!("paths[{i}].path"),
                    "path must be a string",
                ));
            };
            let Some(Value::String(class)) = entry.get("class") else {
                return Err(ManifestError::new(
                    format!("paths[{i}].class"),
                    "class must be a string",
                ));
            };
            let class = PathClass::parse(class).ok_or_else(|| {
                ManifestError::new(
                    format!("paths[{i}].class"),
                    format!("unknown class `{class}`"),
                )
            })?;
            let (bare, is_dir) = match path.strip_suffix('/') {
                Some(bare) => (bare, true),
                None => (path.as_str(), false),
            };
            check_project_path(bare).map_err(|problem| {
                ManifestError::new(format!("paths[{i}].path"), problem.to_string())
            })?;
            if manifest.files.contains_key(bare) || manifest.dirs.contains_key(bare) {
                return Err(ManifestError::new(
                    format!("paths[{i}].path"),
                    format!("`{bare}` is listed twice"),
                ));
            }
            let target = if is_dir {
                &mut manifest.dirs
            } else {
                &mut manifest.files
            };
            target.insert(bare.to_owned(), class);
        }
        Ok(manifest)
    }

    /// Builds a manifest from `(path, class)` entries (directory entries end in `/`); for tests
    /// and callers that already hold parsed policy.
    pub fn from_entries<'a>(
        entries: impl IntoIterator<Item = (&'a str, PathClass)>,
    ) -> Result<Self, ManifestError> {
        let mut text = String::from("version: 1\npaths:\n");
        for (path, class) in entries {
            let path = serde_json::to_string(path)
                .map_err(|e| ManifestError::new("paths", e.to_string()))?;
            text.push_str(&format!("  - path: {path}\n    class: {class}\n"));
        }
        Self::parse(&text)
    }

    /// Classifies a project path; `None` is *unclassified* (denied by every consumer).
    pub fn classify(&self, path: &str) -> Option<PathClass> {
        if is_under(path, ATTESTATIONS_DIR) {
            return Some(PathClass::AttestationOnly);
        }
        if let Some(class) = self.files.get(path) {
            return Some(*class);
        }
        let mut candidate = path;
        loop {
            if let Some(class) = self.dirs.get(candidate) {
                return Some(*class);
            }
            match candidate.rfind('/') {
                Some(cut) => candidate = &candidate[..cut],
                None => return None,
            }
        }
    }
}

/// The manifest's entries under their folded keys ([`fold_key`]): how a case-insensitive,
/// normalizing or NTFS checkout would classify a path. Entries of different classes may fold
/// together; a lookup then returns every class of the winning level.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FoldedManifest {
    files: BTreeMap<String, BTreeSet<PathClass>>,
    dirs: BTreeMap<String, BTreeSet<PathClass>>,
    attestations: String,
}

impl FoldedManifest {
    /// The classes a folded checkout could give `path`: the most specific folded entry
    /// level (file entry, then directory entries from the path up); empty when unclassified.
    pub fn classify(&self, path: &str) -> BTreeSet<PathClass> {
        let key = fold_key(path);
        if is_under(&key, &self.attestations) {
            return BTreeSet::from([PathClass::AttestationOnly]);
        }
        if let Some(classes) = self.files.get(&key) {
            return classes.clone();
        }
        let mut candidate = key.as_str();
        loop {
            if let Some(classes) = self.dirs.get(candidate) {
                return classes.clone();
            }
            match candidate.rfind('/') {
                Some(cut) => candidate = &candidate[..cut],
                None => return BTreeSet::new(),
            }
        }
    }
}

impl ProjectionManifest {
    /// The entries under their folded keys, for look-alike checks.
    pub fn folded(&self) -> FoldedManifest {
        let mut out = FoldedManifest {
            attestations: fold_key(ATTESTATIONS_DIR),
            ..FoldedManifest::default()
        };
        for (path, class) in &self.files {
            out.files.entry(fold_key(path)).or_default().insert(*class);
        }
        for (path, class) in &self.dirs {
            out.dirs.entry(fold_key(path)).or_default().insert(*class);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_classification_sees_another_class_through_look_alike_spellings() {
        let m = ProjectionManifest::parse(SAMPLE).unwrap().folded();
        let test = BTreeSet::from([PathClass::Test]);
        assert_eq!(m.classify("src/TestData/x.bin"), test);
        assert_eq!(m.classify("src/testdata./x.bin"), test);
        assert_eq!(m.classify("src/test\u{200c}data/x.bin"), test);
        assert_eq!(
            m.classify("SRC/lib.rs"),
            BTreeSet::from([PathClass::Implementation])
        );
        assert_eq!(
            m.classify(".Protobot/Attestations/x"),
            BTreeSet::from([PathClass::AttestationOnly])
        );
        assert!(m.classify("README.md").is_empty());
    }

    const SAMPLE: &str = "version: 1\nowner: humans\npaths:\n  - path: docs/\n    class: shared\n  - path: src/\n    class: implementation\n  - path: src/testdata/\n    class: test\n  - path: src/testdata/golden.txt\n    class: shared\n  - path: tests/\n    class: test\n  - path: ci/\n    class: integration-only\n";

    #[test]
    fn most_specific_entry_wins() {
        let m = ProjectionManifest::parse(SAMPLE).unwrap();
        assert_eq!(m.classify("docs/vision.md"), Some(PathClass::Shared));
        assert_eq!(m.classify("src/lib.rs"), Some(PathClass::Implementation));
        assert_eq!(m.classify("src/testdata/x.bin"), Some(PathClass::Test));
        assert_eq!(
            m.classify("src/testdata/golden.txt"),
            Some(PathClass::Shared)
        );
        assert_eq!(m.classify("src"), Some(PathClass::Implementation));
        assert_eq!(m.classify("ci/run.sh"), Some(PathClass::IntegrationOnly));
        assert_eq!(m.classify("README.md"), None);
        assert_eq!(m.classify("srcx/lib.rs"), None);
        assert_eq!(
            m.classify("Src/lib.rs"),
            None,
            "classification is case-sensitive"
        );
    }

    #[test]
    fn attestations_are_attestation_only_whatever_the_manifest_says() {
        let m = ProjectionManifest::from_entries([(".protobot/", PathClass::Shared)]).unwrap();
        assert_eq!(
            m.classify(".protobot/attestations/r.jsonl"),
            Some(PathClass::AttestationOnly)
        );
        assert_eq!(
            m.classify(".protobot/requirements/a.yaml"),
            Some(PathClass::Shared)
        );
    }

    #[test]
    fn invalid_manifests_name_the_field() {
        let cases = [
            ("", ""),
            ("# only a comment\n", ""),
            ("paths: []\n", "version"),
            ("version: '1'\n", "version"),
            ("version: 2\n", "version"),
            ("version: 1\npaths: {}\n", "paths"),
            ("version: 1\npaths:\n  - docs/\n", "paths[0]"),
            (
                "version: 1\npaths:\n  - path: docs/\n    class: shared\n    x: 1\n",
                "paths[0]",
            ),
            (
                "version: 1\npaths:\n  - path: ../x\n    class: shared\n",
                "paths[0].path",
            ),
            (
                "version: 1\npaths:\n  - path: docs/\n    class: public\n",
                "paths[0].class",
            ),
            (
                "version: 1\npaths:\n  - path: docs\n    class: shared\n  - path: docs/\n    class: test\n",
                "paths[1].path",
            ),
        ];
        for (text, field) in cases {
            let err = ProjectionManifest::parse(text).unwrap_err();
            assert_eq!(err.field, field, "manifest {text:?}: {err}");
        }
    }
}
