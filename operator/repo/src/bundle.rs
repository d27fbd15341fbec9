//! PatchBundle v1: what a Worker returns, and how the Job Site collects it from the Worker's
//! projection repository.
//!
//! A bundle is the linear list of commits the Worker made on top of the synthetic root, each
//! with its complete file changes (content inline, hex-encoded), plus a digest. The bundle is
//! untrusted until [`crate::validate`] accepts it.
//!
//! # Digest (canonical encoding)
//!
//! `digest = "sha256:" + hex(SHA-256(E))` where `E` is the byte string
//! `"protobot.patch-bundle/v1\n"` followed by, in order, `F(format) F(role) F(base) N(#commits)`
//! and for each commit `F(id) N(#parents) F(parent)… F(message) N(#changes)` and for each
//! change `F(path) F(op) F(mode) B(content)`. `F(s)` is the 8-byte big-endian length of the
//! UTF-8 bytes of `s` followed by those bytes; `N(n)` is `n` as 8-byte big-endian; `B(c)` is
//! the byte `0` when there is no content, else `1` followed by `F` of the *hex text* of the
//! content. Nothing depends on JSON formatting, map order or platform.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use git2::{Oid, Repository, RepositoryOpenFlags};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{
    export::ProjectionRecord,
    role::Role,
    tree::{TreeFile, list_files, mode},
    validate::Limits,
};

/// Version tag of the bundle format.
pub const BUNDLE_FORMAT: &str = "protobot.patch-bundle/v1";
/// Most commits [`collect_bundle`] walks before giving up.
pub const MAX_COLLECT_COMMITS: usize = 10_000;

/// What a change does to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChangeOp {
    /// The path did not exist before.
    Add,
    /// The path existed and changes content or mode.
    Modify,
    /// The path is removed.
    Delete,
}

impl ChangeOp {
    fn as_str(self) -> &'static str {
        match self {
            ChangeOp::Add => "add",
            ChangeOp::Modify => "modify",
            ChangeOp::Delete => "delete",
        }
    }
}

/// One file change of a commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// Project path as recorded in the Worker's tree.
    pub path: String,
    /// Operation.
    pub op: ChangeOp,
    /// Octal Git mode as text (`100644`); the old mode for deletions.
    pub mode: String,
    /// Hex of the new content; `None` for deletions and gitlinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_hex: Option<String>,
}

/// One Worker commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleCommit {
    /// Commit ID inside the projection.
    pub id: String,
    /// Parent IDs inside the projection.
    pub parents: Vec<String>,
    /// Commit message (untrusted text).
    pub message: String,
    /// Changes relative to the parent, sorted by path.
    pub changes: Vec<Change>,
}

/// A PatchBundle v1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchBundle {
    /// Always [`BUNDLE_FORMAT`].
    pub format: String,
    /// Role that produced it.
    pub role: Role,
    /// The synthetic root commit it builds on.
    pub base: String,
    /// Commits, oldest first.
    pub commits: Vec<BundleCommit>,
    /// `sha256:<hex>` over the canonical encoding (module docs).
    pub digest: String,
}

impl PatchBundle {
    /// Builds a bundle and seals it with its digest.
    pub fn new(role: Role, base: String, commits: Vec<BundleCommit>) -> Self {
        let mut bundle = Self {
            format: BUNDLE_FORMAT.to_owned(),
            role,
            base,
            commits,
            digest: String::new(),
        };
        bundle.digest = bundle.compute_digest();
        bundle
    }

    /// Recomputes the digest from the content (ignores the stored `digest`).
    pub fn compute_digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"protobot.patch-bundle/v1\n");
        field(&mut h, &self.format);
        field(&mut h, self.role.as_str());
        field(&mut h, &self.base);
        number(&mut h, self.commits.len());
        for commit in &self.commits {
            field(&mut h, &commit.id);
            number(&mut h, commit.parents.len());
            for parent in &commit.parents {
                field(&mut h, parent);
            }
            field(&mut h, &commit.message);
            number(&mut h, commit.changes.len());
            for change in &commit.changes {
                field(&mut h, &change.path);
                field(&mut h, change.op.as_str());
                field(&mut h, &change.mode);
                match &change.content_hex {
                    None => h.update([0u8]),
                    Some(content) => {
                        h.update([1u8]);
                        field(&mut h, content);
                    }
                }
            }
        }
        format!("sha256:{}", hex::encode(h.finalize()))
    }

    /// Serialises the bundle as JSON (the `patch.bundle` file format).
    pub fn to_json(&self) -> Result<Vec<u8>, BundleError> {
        serde_json::to_vec(self).map_err(|e| BundleError::Encoding {
            reason: e.to_string(),
        })
    }

    /// Parses a bundle file. Only the shape is checked here; validation is separate.
    pub fn from_json(bytes: &[u8]) -> Result<Self, BundleError> {
        serde_json::from_slice(bytes).map_err(|e| BundleError::Encoding {
            reason: e.to_string(),
        })
    }
}

fn field(h: &mut Sha256, text: &str) {
    number(h, text.len());
    h.update(text.as_bytes());
}

fn number(h: &mut Sha256, n: usize) {
    h.update((n as u64).to_be_bytes());
}

/// Failures while collecting or decoding a bundle.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// The Worker repository could not be opened.
    #[error("failed to open worker repository {path}: {source}")]
    Open {
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: git2::Error,
    },
    /// The Worker repository declares alternates (it could reach foreign objects).
    #[error(
        "unable to collect a bundle from {path}: the repository declares object alternates; discard the projection"
    )]
    Alternates {
        /// Path.
        path: PathBuf,
    },
    /// The history is not a linear chain on the synthetic root.
    #[error(
        "unable to collect a bundle: commit {commit} {problem}; the Worker must commit linearly on the projection root"
    )]
    History {
        /// Offending commit.
        commit: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// A tree holds a path that is not UTF-8.
    #[error("unable to collect a bundle: commit {commit} has a path that is not UTF-8")]
    NonUtf8Path {
        /// Offending commit.
        commit: String,
    },
    /// A git operation failed.
    #[error("failed to {operation} while collecting a bundle: {source}")]
    Git {
        /// The operation.
        operation: &'static str,
        /// Cause.
        #[source]
        source: git2::Error,
    },
    /// A blob or the whole content exceeds the limits.
    #[error(
        "unable to collect a bundle: `{path}` brings the content to {size} bytes, over the limit of {limit}; the Worker must shrink its patch"
    )]
    Oversized {
        /// Path that crossed the limit.
        path: String,
        /// Its size (bytes).
        size: u64,
        /// The limit crossed.
        limit: u64,
    },
    /// JSON encoding or decoding failed.
    #[error("failed to encode or decode a patch bundle: {reason}")]
    Encoding {
        /// Cause.
        reason: String,
    },
}

impl BundleError {
    /// Stable label for metrics and Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            BundleError::Open { .. } => "open-worker-repo",
            BundleError::Alternates { .. } => "alternates",
            BundleError::History { .. } => "history",
            BundleError::NonUtf8Path { .. } => "non-utf8-path",
            BundleError::Git { .. } => "git",
            BundleError::Oversized { .. } => "oversized",
            BundleError::Encoding { .. } => "encoding",
        }
    }
}

fn git(operation: &'static str) -> impl FnOnce(git2::Error) -> BundleError {
    move |source| BundleError::Git { operation, source }
}

/// Collects the commits of a Worker's projection repository into a sealed bundle.
///
/// Reads `HEAD` back along parents to the record's synthetic root; merges, foreign roots and
/// alternates are refused. Content is copied as found, symlinks and gitlinks included, so
/// that the validator can report them.
///
/// Resource limits are enforced while reading, before content is loaded: a history longer
/// than `limits.max_commits`, a blob over `limits.max_file_bytes` or content over
/// `limits.max_total_bytes` stops collection with [`BundleError::Oversized`], so a hostile
/// repository cannot exhaust the control plane's memory.
pub fn collect_bundle(
    worker_repo: &Path,
    record: &ProjectionRecord,
    limits: &Limits,
) -> Result<PatchBundle, BundleError> {
    let alternates = worker_repo.join(".git/objects/info/alternates");
    if alternates.exists() || worker_repo.join("objects/info/alternates").exists() {
        return Err(BundleError::Alternates {
            path: worker_repo.to_owned(),
        });
    }
    let repo = Repository::open_ext(
        worker_repo,
        RepositoryOpenFlags::NO_SEARCH,
        std::iter::empty::<&std::ffi::OsStr>(),
    )
    .map_err(|source| BundleError::Open {
        path: worker_repo.to_owned(),
        source,
    })?;
    let base = Oid::from_str(&record.root_commit).map_err(git("parse the root commit id"))?;
    let head = repo
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(git("resolve the worker HEAD"))?;

    let mut chain = Vec::new();
    let mut current = head;
    while current.id() != base {
        if chain.len() >= MAX_COLLECT_COMMITS.min(limits.max_commits.saturating_add(1)) {
            return Err(BundleError::History {
                commit: current.id().to_string(),
                problem: "is too far from the projection root",
            });
        }
        match current.parent_count() {
            1 => {}
            0 => {
                return Err(BundleError::History {
                    commit: current.id().to_string(),
                    problem: "is a root other than the projection root",
                });
            }
            _ => {
                return Err(BundleError::History {
                    commit: current.id().to_string(),
                    problem: "is a merge",
                });
            }
        }
        let parent = current.parent(0).map_err(git("read a parent commit"))?;
        chain.push(current);
        current = parent;
    }
    chain.reverse();

    let base_commit = repo
        .find_commit(base)
        .map_err(git("read the projection root"))?;
    let mut previous = files_by_path(&repo, &base_commit)?;
    let mut commits = Vec::with_capacity(chain.len());
    let mut budget = Budget { limits, total: 0 };
    for commit in &chain {
        let files = files_by_path(&repo, commit)?;
        let changes = diff_files(&repo, &previous, &files, &mut budget)?;
        commits.push(BundleCommit {
            id: commit.id().to_string(),
            parents: commit.parent_ids().map(|p| p.to_string()).collect(),
            message: String::from_utf8_lossy(commit.message_bytes()).into_owned(),
            changes,
        });
        previous = files;
    }
    Ok(PatchBundle::new(
        record.role,
        record.root_commit.clone(),
        commits,
    ))
}

fn files_by_path(
    repo: &Repository,
    commit: &git2::Commit<'_>,
) -> Result<BTreeMap<String, TreeFile>, BundleError> {
    let tree = commit.tree().map_err(git("read a worker tree"))?;
    let mut out = BTreeMap::new();
    for file in list_files(repo, &tree).map_err(git("list a worker tree"))? {
        let Some(path) = file.path.clone() else {
            return Err(BundleError::NonUtf8Path {
                commit: commit.id().to_string(),
            });
        };
        out.insert(path, file);
    }
    Ok(out)
}

struct Budget<'a> {
    limits: &'a Limits,
    total: u64,
}

fn diff_files(
    repo: &Repository,
    before: &BTreeMap<String, TreeFile>,
    after: &BTreeMap<String, TreeFile>,
    budget: &mut Budget<'_>,
) -> Result<Vec<Change>, BundleError> {
    let odb = repo.odb().map_err(git("open the worker object database"))?;
    let mut changes = Vec::new();
    for (path, new) in after {
        let op = match before.get(path) {
            None => ChangeOp::Add,
            Some(old) if old.id == new.id && old.mode == new.mode => continue,
            Some(_) => ChangeOp::Modify,
        };
        let content_hex = if new.mode == mode::GITLINK {
            None
        } else {
            let (size, _) = odb
                .read_header(new.id)
                .map_err(git("read a worker object header"))?;
            let size = size as u64;
            budget.total = budget.total.saturating_add(size);
            let limit = budget.limits.max_file_bytes;
            if size > limit || budget.total > budget.limits.max_total_bytes {
                return Err(BundleError::Oversized {
                    path: path.clone(),
                    size,
                    limit: if size > limit {
                        limit
                    } else {
                        budget.limits.max_total_bytes
                    },
                });
            }
            let blob = repo.find_blob(new.id).map_err(git("read a worker blob"))?;
            Some(hex::encode(blob.content()))
        };
        changes.push(Change {
            path: path.clone(),
            op,
            mode: format!("{:06o}", new.mode),
            content_hex,
        });
    }
    for (path, old) in before {
        if !after.contains_key(path) {
            changes.push(Change {
                path: path.clone(),
                op: ChangeOp::Delete,
                mode: format!("{:06o}", old.mode),
                content_hex: None,
            });
        }
    }
    changes.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(changes)
}
