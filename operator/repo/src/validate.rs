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
    path::{PathProblem, check_path_length, check_project_path, fold_key, normalization_key},
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
    /// A file and a directory would share a name (in any commit of the history, under the
    /// folded key).
    PathConflict,
    /// The path is its class as spelled, but another class's path (or below another class's
    /// directory) on a case-insensitive, normalizing or NTFS checkout.
    LookAlikePath,
    /// A component is over 255 bytes or the path over 1024 bytes.
    PathTooLong,
    /// The bundle writes a `.gitattributes` file (policy decision, `docs/worker-output.md`).
    AttributesFile,
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

    // Per change, replaying the tree state of the projection. The integration side holds
    // the projection's files plus the withheld ones, and integration replays every commit,
    // so collisions and file/directory conflicts are checked on every commit's tree, not
    // only on the final one.
    let role_class = record.role.writable_class();
    let folded_manifest = record.manifest.folded();
    let mut present: BTreeSet<String> = record.exported.clone();
    let mut tree = FoldedTree::default();
    for path in record.exported.iter().chain(record.withheld.iter()) {
        tree.insert_original(path);
    }
    let mut touched: BTreeSet<String> = BTreeSet::new();
    let mut total_bytes: u64 = 0;
    for commit in &bundle.commits {
        let mut in_commit = BTreeSet::new();
        let c = Some(commit.id.as_str());
        for change in &commit.changes {
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
                    PathProblem::TooLong => ViolationCode::PathTooLong,
                    PathProblem::Empty
                    | PathProblem::EmptyOrDotComponent
                    | PathProblem::ForbiddenCharacter => ViolationCode::InvalidPath,
                };
                push(code, c, p, problem.to_string());
            } else {
                if let Err(problem) = check_path_length(&change.path) {
                    push(ViolationCode::PathTooLong, c, p, problem.to_string());
                }
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
                let last = change.path.rsplit('/').next().unwrap_or_default();
                if crate::path::names_the_same(last, ".gitattributes") {
                    push(
                        ViolationCode::AttributesFile,
                        c,
                        p,
                        "writes a .gitattributes file (attributes change how other files are checked out, diffed and reviewed; they are reviewed policy)".into(),
                    );
                }
                let exact = record.manifest.classify(&change.path);
                match exact {
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
                if let Some(exact) = exact {
                    let folded = folded_manifest.classify(&change.path);
                    let others: Vec<&str> = folded
                        .iter()
                        .filter(|class| **class != exact)
                        .map(|class| class.as_str())
                        .collect();
                    if !others.is_empty() {
                        push(
                            ViolationCode::LookAlikePath,
                            c,
                            p,
                            format!(
                                "`{}` is class {exact} as spelled but class {} on a case-insensitive, normalizing or NTFS checkout",
                                change.path.escape_default(),
                                others.join(", ")
                            ),
                        );
                    }
                }
                if record.withheld.contains(&change.path)
                    && !record.replaceable.contains(&change.path)
                {
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
                    other => push(
                        ViolationCode::ModeNotAllowed,
                        c,
                        p,
                        format!("mode {}", other.escape_default()),
                    ),
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
                if present.remove(&change.path) {
                    tree.remove(&change.path);
                }
            } else if present.insert(change.path.clone())
                && !record.replaceable.contains(&change.path)
            {
                // A replaced path is in the tree already (as a withheld original).
                tree.insert(&change.path);
            }
        }
        // This commit's tree: every path it writes against everything alive after it.
        for change in commit.changes.iter().filter(|ch| ch.op != ChangeOp::Delete) {
            for (code, detail) in tree.conflicts(&change.path) {
                push(code, c, Some(&change.path), detail);
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

/// The paths alive in the integration tree, indexed by their folded key ([`fold_key`]) and
/// by the folded keys of their directories, maintained commit by commit.
#[derive(Debug, Default)]
struct FoldedTree {
    /// Folded path → the exact spellings alive under it.
    files: BTreeMap<String, BTreeSet<String>>,
    /// Folded directory → exact spelling → number of alive paths below it.
    dirs: BTreeMap<String, BTreeMap<String, usize>>,
    /// Directories of the tree the bundle started from: a look-alike spelling that was
    /// already there is not the Worker's doing.
    original_dirs: BTreeSet<String>,
}

/// The directory prefixes of `path` (`a`, `a/b` for `a/b/c`).
fn directories(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(move |(i, _)| &path[..i])
}

impl FoldedTree {
    fn insert_original(&mut self, path: &str) {
        self.insert(path);
        self.original_dirs
            .extend(directories(path).map(str::to_owned));
    }

    fn insert(&mut self, path: &str) {
        self.files
            .entry(fold_key(path))
            .or_default()
            .insert(path.to_owned());
        for dir in directories(path) {
            *self
                .dirs
                .entry(fold_key(dir))
                .or_default()
                .entry(dir.to_owned())
                .or_default() += 1;
        }
    }

    fn remove(&mut self, path: &str) {
        let key = fold_key(path);
        if let Some(group) = self.files.get_mut(&key) {
            group.remove(path);
            if group.is_empty() {
                self.files.remove(&key);
            }
        }
        for dir in directories(path) {
            let key = fold_key(dir);
            if let Some(spellings) = self.dirs.get_mut(&key) {
                if let Some(count) = spellings.get_mut(dir) {
                    *count = count.saturating_sub(1);
                    if *count == 0 {
                        spellings.remove(dir);
                    }
                }
                if spellings.is_empty() {
                    self.dirs.remove(&key);
                }
            }
        }
    }

    /// Every collision and conflict `path` (alive in the tree) has with the rest of it.
    fn conflicts(&self, path: &str) -> Vec<(ViolationCode, String)> {
        let mut out = Vec::new();
        let key = fold_key(path);
        let normal = normalization_key(path);
        let others = self
            .files
            .get(&key)
            .into_iter()
            .flatten()
            .filter(|o| *o != path);
        let (equivalent, folded): (Vec<&String>, Vec<&String>) =
            others.partition(|o| normalization_key(o) == normal);
        if !equivalent.is_empty() {
            out.push((
                ViolationCode::NormalizationCollision,
                format!(
                    "`{}` is the same name as {} under Unicode normalization (NFC `{}`)",
                    path.escape_default(),
                    quoted(&equivalent),
                    normal.escape_default()
                ),
            ));
        }
        // Paths that fold together through case, ignorable code points or NTFS trailing dots
        // and spaces (pure normalization variants are reported above).
        if !folded.is_empty() {
            out.push((
                ViolationCode::CaseFoldCollision,
                format!("collides with {}", quoted(&folded)),
            ));
        }
        if self.dirs.contains_key(&key) {
            out.push((
                ViolationCode::PathConflict,
                "a directory has this name".into(),
            ));
        }
        for dir in directories(path) {
            let dir_key = fold_key(dir);
            if let Some(files) = self.files.get(&dir_key) {
                out.push((
                    ViolationCode::PathConflict,
                    format!("{} is a file", quoted(&files.iter().collect::<Vec<_>>())),
                ));
            }
            let spellings: Vec<&String> = self
                .dirs
                .get(&dir_key)
                .into_iter()
                .flat_map(|s| s.keys())
                .filter(|s| *s != dir)
                .collect();
            if !spellings.is_empty() && !self.original_dirs.contains(dir) {
                out.push((
                    ViolationCode::CaseFoldCollision,
                    format!(
                        "directory `{}` is also spelled {}",
                        dir.escape_default(),
                        quoted(&spellings)
                    ),
                ));
            }
        }
        out
    }
}

fn quoted(paths: &[&String]) -> String {
    paths
        .iter()
        .map(|o| format!("`{}`", o.escape_default()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Helper for callers that hold a class, not a role: may `role` write `class`?
pub fn role_may_write(role: Role, class: PathClass) -> bool {
    role.writable_class() == Some(class)
}
