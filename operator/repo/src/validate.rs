//! The Patch/Ownership Validator: decides whether an untrusted bundle may touch the
//! integration repository.
//!
//! Pure. Checks the bundle against the control-plane [`ProjectionRecord`] and [`Limits`] and
//! reports **every** violation, each with a stable code. Only [`accept_bundle`] can produce an
//! [`AcceptedBundle`], the one type [`crate::integrate`] applies.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::{
    bundle::{BUNDLE_FORMAT, ChangeOp, PatchBundle},
    export::ProjectionRecord,
    manifest::PathClass,
    path::{PathProblem, case_fold_key, check_project_path, normalization_key},
    role::Role,
};

/// Size and count limits of one bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Largest single file content, in bytes.
    pub max_file_bytes: u64,
    /// Largest sum of all contents, in bytes.
    pub max_total_bytes: u64,
    /// Most distinct paths touched.
    pub max_files: usize,
    /// Most commits.
    pub max_commits: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_file_bytes: 4 * 1024 * 1024,
            max_total_bytes: 32 * 1024 * 1024,
            max_files: 2_000,
            max_commits: 500,
        }
    }
}

/// Stable violation codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ViolationCode {
    /// `format` is not PatchBundle v1.
    UnsupportedFormat,
    /// The bundle names another role than the projection's.
    RoleMismatch,
    /// The bundle does not build on the projection's synthetic root.
    BaseMismatch,
    /// The stored digest does not match the content.
    DigestMismatch,
    /// Commits do not form a linear chain on the base, or IDs are malformed or repeated.
    BrokenHistory,
    /// A path has a `..` component.
    PathTraversal,
    /// A path is absolute.
    AbsolutePath,
    /// A path resolves to `.git` on some filesystem.
    GitPath,
    /// A path is empty, has empty or `.` components, or forbidden characters.
    InvalidPath,
    /// A path is under `.protobot/`.
    ProtobotPath,
    /// A symlink is written.
    Symlink,
    /// A submodule (gitlink) is written.
    Submodule,
    /// A mode other than `100644`/`100755`.
    ModeNotAllowed,
    /// No manifest entry covers the path.
    UnclassifiedPath,
    /// The path's class is not writable by the role.
    NotWritableByRole,
    /// The path exists at the source commit but was withheld from this projection.
    WithheldPath,
    /// Two paths collide on a case-insensitive filesystem (and are not merely differently
    /// normalized spellings of one name, which is [`ViolationCode::NormalizationCollision`]).
    CaseFoldCollision,
    /// Two paths are canonically equivalent Unicode (e.g. `café` precomposed, NFC, and
    /// decomposed, NFD): one name on a normalization-insensitive filesystem (APFS, HFS+).
    NormalizationCollision,
    /// A file and a directory would share a name.
    PathConflict,
    /// Content is missing, not hex, or present where it must not be; or the op contradicts the
    /// tree (adding an existing path, modifying or deleting a missing one, touching a path twice
    /// in one commit).
    InvalidChange,
    /// A file exceeds `max_file_bytes`.
    FileTooLarge,
    /// All content exceeds `max_total_bytes`.
    BundleTooLarge,
    /// More distinct paths than `max_files`.
    TooManyFiles,
    /// More commits than `max_commits`.
    TooManyCommits,
}

/// One violation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Violation {
    /// Stable code.
    pub code: ViolationCode,
    /// Projection commit the violation is in, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Path concerned, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Human-readable detail.
    pub detail: String,
}

/// The validator's verdict, printable by `protobot patch check`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationReport {
    /// True when there is no violation.
    pub accepted: bool,
    /// Role the bundle was checked for.
    pub role: Role,
    /// Digest as recomputed from the content.
    pub digest: String,
    /// Number of commits.
    pub commits: usize,
    /// Distinct paths touched.
    pub paths_touched: usize,
    /// Every violation, sorted.
    pub violations: Vec<Violation>,
}

/// A bundle the validator accepted; the only input [`crate::integrate`] applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedBundle {
    bundle: PatchBundle,
    record_source: String,
}

impl AcceptedBundle {
    /// The accepted bundle.
    pub fn bundle(&self) -> &PatchBundle {
        &self.bundle
    }

    /// Source commit of the projection the bundle was validated against.
    pub fn source_commit(&self) -> &str {
        &self.record_source
    }
}

/// Validates and, when clean, accepts the bundle.
pub fn accept_bundle(
    bundle: PatchBundle,
    record: &ProjectionRecord,
    limits: &Limits,
) -> Result<AcceptedBundle, ValidationReport> {
    let report = check_bundle(&bundle, record, limits);
    if report.accepted {
        Ok(AcceptedBundle {
            bundle,
            record_source: record.source_commit.clone(),
        })
    } else {
        Err(report)
    }
}

/// Checks the bundle and reports every violation.
pub fn check_bundle(
    bundle: &PatchBundle,
    record: &ProjectionRecord,
    limits: &Limits,
) -> ValidationReport {
    let mut v = Vec::new();
    let digest = bundle.compute_digest();
    let mut push = |code, commit: Option<&str>, path: Option<&str>, detail: String| {
        v.push(Violation {
            code,
            commit: commit.map(str::to_owned),
            path: path.map(str::to_owned),
            detail,
        })
    };

    if bundle.format != BUNDLE_FORMAT {
        push(
            ViolationCode::UnsupportedFormat,
            None,
            None,
            format!("format `{}`", bundle.format),
        );
    }
    if bundle.role != record.role {
        push(
            ViolationCode::RoleMismatch,
            None,
            None,
            format!(
                "bundle role {} but projection role {}",
                bundle.role, record.role
            ),
        );
    }
    if bundle.base != record.root_commit {
        push(
            ViolationCode::BaseMismatch,
            None,
            None,
            "base is not the projection root".into(),
        );
    }
    if bundle.digest != digest {
        push(
            ViolationCode::DigestMismatch,
            None,
            None,
            "stored digest differs from content".into(),
        );
    }
    if bundle.commits.len() > limits.max_commits {
        push(
            ViolationCode::TooManyCommits,
            None,
            None,
            format!(
                "{} commits, limit {}",
                bundle.commits.len(),
                limits.max_commits
            ),
        );
    }

    // History: a linear chain on the base with well-formed, unique IDs.
    let mut expected_parent = bundle.base.clone();
    let mut seen_ids = BTreeSet::new();
    for commit in &bundle.commits {
        let well_formed = commit.id.len() == 40 && commit.id.bytes().all(|b| b.is_ascii_hexdigit());
        if !well_formed || !seen_ids.insert(commit.id.clone()) {
            push(
                ViolationCode::BrokenHistory,
                Some(&commit.id),
                None,
                "malformed or repeated id".into(),
            );
        }
        if commit.parents != [expected_parent.clone()] {
            push(
                ViolationCode::BrokenHistory,
                Some(&commit.id),
                None,
                "parent is not the previous commit of the chain".into(),
            );
        }
        expected_parent = commit.id.clone();
    }

    // Per change, replaying the tree state of the projection.
    let role_class = record.role.writable_class();
    let mut present: BTreeSet<String> = record.exported.clone();
    let mut touched: BTreeSet<String> = BTreeSet::new();
    let mut total_bytes: u64 = 0;
    for commit in &bundle.commits {
        let mut in_commit = BTreeSet::new();
        for change in &commit.changes {
            let c = Some(commit.id.as_str());
            let p = Some(change.path.as_str());
            touched.insert(change.path.clone());
            if !in_commit.insert(change.path.clone()) {
                push(
                    ViolationCode::InvalidChange,
                    c,
                    p,
                    "path changed twice in one commit".into(),
                );
            }
            if let Err(problem) = check_project_path(&change.path) {
                let code = match problem {
                    PathProblem::ParentComponent => ViolationCode::PathTraversal,
                    PathProblem::Absolute => ViolationCode::AbsolutePath,
                    PathProblem::GitComponent => ViolationCode::GitPath,
                    PathProblem::Empty
                    | PathProblem::EmptyOrDotComponent
                    | PathProblem::ForbiddenCharacter => ViolationCode::InvalidPath,
                };
                push(code, c, p, problem.to_string());
            } else {
                let first = change.path.split('/').next().unwrap_or_default();
                // Same folding as `.git`: case-insensitive, NTFS trailing dots and spaces,
                // HFS+ ignorable code points.
                if crate::path::names_the_same(first, ".protobot") {
                    push(
                        ViolationCode::ProtobotPath,
                        c,
                        p,
                        "writes under .protobot/".into(),
                    );
                }
                match record.manifest.classify(&change.path) {
                    None => push(
                        ViolationCode::UnclassifiedPath,
                        c,
                        p,
                        "no manifest entry".into(),
                    ),
                    Some(class) if Some(class) != role_class => push(
                        ViolationCode::NotWritableByRole,
                        c,
                        p,
                        format!("class {class} is not writable by {}", record.role),
                    ),
                    Some(_) => {}
                }
                if record.withheld.contains(&change.path) {
                    push(
                        ViolationCode::WithheldPath,
                        c,
                        p,
                        "path was withheld from this projection".into(),
                    );
                }
            }
            if change.op != ChangeOp::Delete {
                match change.mode.as_str() {
                    "100644" | "100755" => {}
                    "120000" => push(ViolationCode::Symlink, c, p, "symlink".into()),
                    "160000" => push(ViolationCode::Submodule, c, p, "submodule".into()),
                    other => push(ViolationCode::ModeNotAllowed, c, p, format!("mode {other}")),
                }
            }
            match (change.op, &change.content_hex) {
                (ChangeOp::Delete, None) => {}
                (ChangeOp::Delete, Some(_)) => push(
                    ViolationCode::InvalidChange,
                    c,
                    p,
                    "deletion carries content".into(),
                ),
                (_, None) if change.mode == "160000" => {}
                (_, None) => push(ViolationCode::InvalidChange, c, p, "content missing".into()),
                (_, Some(text)) => {
                    if text.len() % 2 != 0 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
                        push(
                            ViolationCode::InvalidChange,
                            c,
                            p,
                            "content is not hex".into(),
                        );
                    }
                    let bytes = (text.len() / 2) as u64;
                    total_bytes = total_bytes.saturating_add(bytes);
                    if bytes > limits.max_file_bytes {
                        push(
                            ViolationCode::FileTooLarge,
                            c,
                            p,
                            format!("{bytes} bytes, limit {}", limits.max_file_bytes),
                        );
                    }
                }
            }
            let exists = present.contains(&change.path);
            match change.op {
                ChangeOp::Add if exists => push(
                    ViolationCode::InvalidChange,
                    c,
                    p,
                    "adds a path that exists".into(),
                ),
                ChangeOp::Modify | ChangeOp::Delete if !exists => push(
                    ViolationCode::InvalidChange,
                    c,
                    p,
                    "modifies or deletes a path that does not exist".into(),
                ),
                _ => {}
            }
            if change.op == ChangeOp::Delete {
                present.remove(&change.path);
            } else {
                present.insert(change.path.clone());
            }
        }
    }
    if total_bytes > limits.max_total_bytes {
        push(
            ViolationCode::BundleTooLarge,
            None,
            None,
            format!("{total_bytes} bytes, limit {}", limits.max_total_bytes),
        );
    }
    if touched.len() > limits.max_files {
        push(
            ViolationCode::TooManyFiles,
            None,
            None,
            format!("{} paths, limit {}", touched.len(), limits.max_files),
        );
    }

    // Collisions in the tree the integration side will hold: final projection state plus the
    // withheld paths (which integration still has).
    let mut all: BTreeSet<&str> = present.iter().map(String::as_str).collect();
    all.extend(record.withheld.iter().map(String::as_str));
    let mut folded: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut normalized: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for path in &all {
        folded.entry(case_fold_key(path)).or_default().push(path);
        normalized
            .entry(normalization_key(path))
            .or_default()
            .push(path);
    }
    for path in &touched {
        if !present.contains(path) {
            continue;
        }
        let key = normalization_key(path);
        let equivalent: Vec<&str> = normalized
            .get(&key)
            .map(|group| group.iter().copied().filter(|o| o != path).collect())
            .unwrap_or_default();
        if !equivalent.is_empty() {
            push(
                ViolationCode::NormalizationCollision,
                None,
                Some(path),
                format!(
                    "`{}` is the same name as {} under Unicode normalization (NFC `{}`)",
                    path.escape_default(),
                    equivalent
                        .iter()
                        .map(|o| format!("`{}`", o.escape_default()))
                        .collect::<Vec<_>>()
                        .join(", "),
                    key.escape_default()
                ),
            );
        }
        // Paths that fold together only through case (possibly with a different
        // normalization too); pure normalization variants are reported above.
        let others: Vec<&str> = folded
            .get(&case_fold_key(path))
            .map(|group| {
                group
                    .iter()
                    .copied()
                    .filter(|o| o != path && normalization_key(o) != key)
                    .collect()
            })
            .unwrap_or_default();
        if !others.is_empty() {
            push(
                ViolationCode::CaseFoldCollision,
                None,
                Some(path),
                format!("collides with {}", others.join(", ")),
            );
        }
        let mut prefix = String::new();
        for component in path.split('/') {
            if !prefix.is_empty() {
                if all.contains(prefix.as_str()) {
                    push(
                        ViolationCode::PathConflict,
                        None,
                        Some(path),
                        format!("`{prefix}` is a file"),
                    );
                }
                prefix.push('/');
            }
            prefix.push_str(component);
        }
        let dir = format!("{path}/");
        if all
            .range::<str, _>((
                std::ops::Bound::Excluded(dir.as_str()),
                std::ops::Bound::Unbounded,
            ))
            .next()
            .is_some_and(|next| next.starts_with(&dir))
        {
            push(
                ViolationCode::PathConflict,
                None,
                Some(path),
                "a directory has this name".into(),
            );
        }
    }

    v.sort();
    v.dedup();
    ValidationReport {
        accepted: v.is_empty(),
        role: bundle.role,
        digest,
        commits: bundle.commits.len(),
        paths_touched: touched.len(),
        violations: v,
    }
}

/// Helper for callers that hold a class, not a role: may `role` write `class`?
pub fn role_may_write(role: Role, class: PathClass) -> bool {
    role.writable_class() == Some(class)
}
