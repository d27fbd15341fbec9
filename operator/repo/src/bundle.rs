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
    fs,
    io::Read,
    path::{Path, PathBuf},
};

use git2::{ErrorCode, Oid, Repository};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{export::ProjectionRecord, role::Role, tree::mode, validate::Limits};

/// Version tag of the bundle format.
pub const BUNDLE_FORMAT: &str = "protobot.patch-bundle/v1";
/// Most commits [`collect_bundle`] walks before giving up.
pub const MAX_COLLECT_COMMITS: usize = 10_000;
/// Deepest directory nesting [`collect_bundle`] follows (a 1024-byte path has at most 512
/// components; no real tree nests this deep).
pub const MAX_TREE_DEPTH: usize = 256;
/// Most tree entries [`collect_bundle`] reads over a whole collection, changed or not.
pub const MAX_WALK_ENTRIES: usize = 2_000_000;
/// Most files (and their bytes) copied out of a Worker's object database into the store
/// the Job Site reads it through.
pub const MAX_STORE_FILES: usize = 200_000;
/// See [`MAX_STORE_FILES`].
pub const MAX_STORE_BYTES: u64 = 8 << 30;
/// Longest commit message collected, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

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

/// One file change of a commit. Unknown fields are refused: nothing outside the digest is
/// read from a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
#[serde(deny_unknown_fields)]
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

/// A PatchBundle v1. Unknown fields are refused (they would not be covered by the digest).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// The Worker repository redirects elsewhere: a `.git` file or link, a `commondir`, a
    /// symbolic link inside its git directory.
    #[error(
        "unable to collect a bundle from {path}: {problem}; the Worker must return a plain repository, discard the projection"
    )]
    Indirection {
        /// Path.
        path: PathBuf,
        /// What redirects.
        problem: String,
    },
    /// A commit names an object that is not in what the Worker returned or was given.
    #[error(
        "unable to collect a bundle: object {id} is missing from the Worker's repository; the Worker may only reference objects it wrote or was given"
    )]
    MissingObject {
        /// The missing object.
        id: String,
    },
    /// The trees name more entries than a bundle may change.
    #[error(
        "unable to collect a bundle: the Worker's trees name more than {limit} changed entries; the Worker must shrink its patch"
    )]
    TooManyEntries {
        /// The limit crossed.
        limit: usize,
    },
    /// The trees nest deeper than [`MAX_TREE_DEPTH`].
    #[error(
        "unable to collect a bundle: a Worker tree nests deeper than {limit} directories; the Worker must flatten its patch"
    )]
    TooDeep {
        /// The limit crossed.
        limit: usize,
    },
    /// A tree entry has a name no path can have (empty, `.`, `..`, or with `/` or NUL).
    #[error("unable to collect a bundle: commit {commit} has a tree entry with an invalid name")]
    InvalidEntryName {
        /// Offending commit.
        commit: String,
    },
    /// A file of the Worker repository could not be read or copied.
    #[error("failed to {operation} {path} while collecting a bundle: {source}")]
    Io {
        /// The operation.
        operation: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
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
            BundleError::Indirection { .. } => "indirection",
            BundleError::MissingObject { .. } => "missing-object",
            BundleError::TooManyEntries { .. } => "too-many-entries",
            BundleError::TooDeep { .. } => "too-deep",
            BundleError::InvalidEntryName { .. } => "invalid-entry-name",
            BundleError::Io { .. } => "io",
            BundleError::Git { .. } => "git",
            BundleError::Oversized { .. } => "oversized",
            BundleError::Encoding { .. } => "encoding",
        }
    }
}

fn git(operation: &'static str) -> impl FnOnce(git2::Error) -> BundleError {
    move |source| BundleError::Git { operation, source }
}

/// Like [`git`], but a missing object is [`BundleError::MissingObject`]: the store holds only
/// what the Worker returned, so anything else is an object it was never given.
fn object(operation: &'static str, id: Oid) -> impl FnOnce(git2::Error) -> BundleError {
    move |source| {
        if source.code() == ErrorCode::NotFound {
            BundleError::MissingObject { id: id.to_string() }
        } else {
            BundleError::Git { operation, source }
        }
    }
}

fn io(operation: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> BundleError {
    let path = path.to_owned();
    move |source| BundleError::Io {
        operation,
        path,
        source,
    }
}

/// Collects the commits of a Worker's projection repository into a sealed bundle.
///
/// The Worker's repository is never opened as a repository: its object files are copied
/// into a fresh object database the Job Site builds ([`WorkerStore`]), so a `.git` file, a
/// `commondir` or alternates cannot make libgit2 read objects of the host, and a commit that
/// names an object the Worker neither wrote nor was given is [`BundleError::MissingObject`].
/// `HEAD` is read back along parents to the record's synthetic root; merges and foreign roots
/// are refused. Content is copied as found, symlinks and gitlinks included, so that the
/// validator can report them.
///
/// Resource limits are enforced while reading, before content is loaded: a history longer
/// than `limits.max_commits`, a blob over `limits.max_file_bytes` or content over
/// `limits.max_total_bytes` stops collection with [`BundleError::Oversized`]; the tree walk
/// only descends into subtrees that changed and stops at [`MAX_TREE_DEPTH`], at
/// [`MAX_WALK_ENTRIES`] entries read and at eight times `limits.max_files` changed entries,
/// so a hostile repository cannot exhaust the control plane's memory or time.
pub fn collect_bundle(
    worker_repo: &Path,
    record: &ProjectionRecord,
    limits: &Limits,
) -> Result<PatchBundle, BundleError> {
    let store = WorkerStore::build(worker_repo)?;
    let repo = &store.repo;
    let base = Oid::from_str(&record.root_commit).map_err(git("parse the root commit id"))?;
    let mut current = repo
        .find_commit(store.head)
        .map_err(object("resolve the worker HEAD", store.head))?;

    let mut chain = Vec::new();
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
        let parent_id = current.parent_id(0).map_err(git("read a parent id"))?;
        let parent = repo
            .find_commit(parent_id)
            .map_err(object("read a parent commit", parent_id))?;
        chain.push(current);
        current = parent;
    }
    chain.reverse();

    let base_commit = repo
        .find_commit(base)
        .map_err(object("read the projection root", base))?;
    let odb = repo.odb().map_err(git("open the worker object database"))?;
    let mut walk = Walk {
        repo,
        odb: &odb,
        limits,
        total: 0,
        entries: 0,
        changed: 0,
        max_changed: limits.max_files.saturating_mul(8).max(64),
        commit: String::new(),
        changes: Vec::new(),
    };
    let mut previous = base_commit.tree_id();
    let mut commits = Vec::with_capacity(chain.len());
    for commit in &chain {
        let message = commit.message_bytes();
        walk.total = walk.total.saturating_add(message.len() as u64);
        if message.len() > MAX_MESSAGE_BYTES || walk.total > limits.max_total_bytes {
            return Err(BundleError::Oversized {
                path: format!("(message of commit {})", commit.id()),
                size: message.len() as u64,
                limit: (MAX_MESSAGE_BYTES as u64).min(limits.max_total_bytes),
            });
        }
        walk.commit = commit.id().to_string();
        let tree = commit.tree_id();
        walk.diff(Some(previous), Some(tree), &mut Vec::new(), 0)?;
        let mut changes = std::mem::take(&mut walk.changes);
        changes.sort_by(|a, b| a.path.cmp(&b.path));
        commits.push(BundleCommit {
            id: commit.id().to_string(),
            parents: commit.parent_ids().map(|p| p.to_string()).collect(),
            message: String::from_utf8_lossy(message).into_owned(),
            changes,
        });
        previous = tree;
    }
    Ok(PatchBundle::new(
        record.role,
        record.root_commit.clone(),
        commits,
    ))
}

/// A tree entry: raw mode and object ID.
type Entry = (i32, Oid);

/// The bounded tree differ of [`collect_bundle`].
struct Walk<'a> {
    repo: &'a Repository,
    odb: &'a git2::Odb<'a>,
    limits: &'a Limits,
    /// Content bytes so far.
    total: u64,
    /// Tree entries read so far.
    entries: usize,
    /// Changed entries so far.
    changed: usize,
    max_changed: usize,
    /// Commit being diffed (for errors).
    commit: String,
    /// Changes of that commit.
    changes: Vec<Change>,
}

impl Walk<'_> {
    /// Entries of a tree, by name (read and counted against [`MAX_WALK_ENTRIES`]).
    fn entries_of(&mut self, tree: Option<Oid>) -> Result<BTreeMap<Vec<u8>, Entry>, BundleError> {
        let mut out = BTreeMap::new();
        let Some(id) = tree else {
            return Ok(out);
        };
        let tree = self
            .repo
            .find_tree(id)
            .map_err(object("read a worker tree", id))?;
        self.entries = self.entries.saturating_add(tree.len());
        if self.entries > MAX_WALK_ENTRIES {
            return Err(BundleError::TooManyEntries {
                limit: MAX_WALK_ENTRIES,
            });
        }
        for entry in tree.iter() {
            let name = entry.name_bytes();
            if name.is_empty()
                || name == b"."
                || name == b".."
                || name.contains(&b'/')
                || name.contains(&0)
            {
                return Err(BundleError::InvalidEntryName {
                    commit: self.commit.clone(),
                });
            }
            out.insert(name.to_vec(), (entry.filemode_raw(), entry.id()));
        }
        Ok(out)
    }

    /// Emits the changes from tree `before` to tree `after` below `prefix`, descending only
    /// into subtrees whose IDs differ.
    fn diff(
        &mut self,
        before: Option<Oid>,
        after: Option<Oid>,
        prefix: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), BundleError> {
        if before == after {
            return Ok(());
        }
        if depth > MAX_TREE_DEPTH {
            return Err(BundleError::TooDeep {
                limit: MAX_TREE_DEPTH,
            });
        }
        let old = self.entries_of(before)?;
        let new = self.entries_of(after)?;
        let mut names: Vec<&Vec<u8>> = old.keys().chain(new.keys()).collect();
        names.sort();
        names.dedup();
        for name in names {
            let (o, n) = (old.get(name).copied(), new.get(name).copied());
            if o == n {
                continue;
            }
            self.changed += 1;
            if self.changed > self.max_changed {
                return Err(BundleError::TooManyEntries {
                    limit: self.max_changed,
                });
            }
            let mark = prefix.len();
            if !prefix.is_empty() {
                prefix.push(b'/');
            }
            prefix.extend_from_slice(name);
            let is_tree = |e: Option<Entry>| e.is_some_and(|(m, _)| m == mode::TREE);
            let tree_of = |e: Option<Entry>| e.filter(|(m, _)| *m == mode::TREE).map(|(_, id)| id);
            let file_of = |e: Option<Entry>| e.filter(|(m, _)| *m != mode::TREE);
            if is_tree(o) || is_tree(n) {
                self.diff(tree_of(o), tree_of(n), prefix, depth + 1)?;
            }
            match (file_of(o), file_of(n)) {
                (None, None) => {}
                (Some((m, _)), None) => self.push(prefix, ChangeOp::Delete, m, None)?,
                (None, Some((m, id))) => self.push(prefix, ChangeOp::Add, m, Some(id))?,
                (Some(_), Some((m, id))) => self.push(prefix, ChangeOp::Modify, m, Some(id))?,
            }
            prefix.truncate(mark);
        }
        Ok(())
    }

    fn push(
        &mut self,
        path: &[u8],
        op: ChangeOp,
        file_mode: i32,
        id: Option<Oid>,
    ) -> Result<(), BundleError> {
        let Ok(path) = String::from_utf8(path.to_vec()) else {
            return Err(BundleError::NonUtf8Path {
                commit: self.commit.clone(),
            });
        };
        let content_hex = match id {
            Some(id) if file_mode != mode::GITLINK => {
                let (size, _) = self
                    .odb
                    .read_header(id)
                    .map_err(object("read a worker object header", id))?;
                let size = size as u64;
                self.total = self.total.saturating_add(size);
                let limit = self.limits.max_file_bytes;
                if size > limit || self.total > self.limits.max_total_bytes {
                    return Err(BundleError::Oversized {
                        path,
                        size,
                        limit: if size > limit {
                            limit
                        } else {
                            self.limits.max_total_bytes
                        },
                    });
                }
                let blob = self
                    .repo
                    .find_blob(id)
                    .map_err(object("read a worker blob", id))?;
                Some(hex::encode(blob.content()))
            }
            _ => None,
        };
        self.changes.push(Change {
            path,
            op,
            mode: format!("{file_mode:06o}"),
            content_hex,
        });
        Ok(())
    }
}

/// The store a Worker's output is read through: a fresh bare repository in a temporary
/// directory holding copies of the Worker's object files (loose objects and packs, nothing
/// of `objects/info/`), and the Worker's `HEAD` resolved by hand.
struct WorkerStore {
    _dir: tempfile::TempDir,
    repo: Repository,
    head: Oid,
}

impl WorkerStore {
    fn build(worker_repo: &Path) -> Result<Self, BundleError> {
        let indirection = |problem: String| BundleError::Indirection {
            path: worker_repo.to_owned(),
            problem,
        };
        let top = fs::symlink_metadata(worker_repo).map_err(io("read", worker_repo))?;
        if !top.is_dir() {
            return Err(indirection("the repository is not a directory".into()));
        }
        let dotgit = worker_repo.join(".git");
        let git_dir = match fs::symlink_metadata(&dotgit) {
            Ok(meta) if meta.is_dir() => dotgit,
            Ok(_) => {
                return Err(indirection(
                    "`.git` is a file or a link (`gitdir:` indirection)".into(),
                ));
            }
            Err(_) if worker_repo.join("objects").is_dir() => worker_repo.to_owned(),
            Err(e) => return Err(io("find the git directory of", worker_repo)(e)),
        };
        let dir = tempfile::Builder::new()
            .prefix("protobot-worker-store-")
            .tempdir()
            .map_err(io("create a store for", worker_repo))?;
        let repo = Repository::init_bare(dir.path()).map_err(git("create the worker store"))?;
        let mut copy = Copy {
            worker_repo,
            files: 0,
            bytes: 0,
        };
        copy.scan(&git_dir, 0)?;
        copy.files = 0;
        copy.objects(&git_dir.join("objects"), &dir.path().join("objects"))?;
        let head = read_head(&git_dir).map_err(indirection)?;
        Ok(Self {
            _dir: dir,
            repo,
            head,
        })
    }
}

struct Copy<'a> {
    worker_repo: &'a Path,
    files: usize,
    bytes: u64,
}

impl Copy<'_> {
    fn count(&mut self, bytes: u64) -> Result<(), BundleError> {
        self.files += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        if self.files > MAX_STORE_FILES || self.bytes > MAX_STORE_BYTES {
            return Err(BundleError::Oversized {
                path: "(worker object database)".into(),
                size: self.bytes,
                limit: MAX_STORE_BYTES,
            });
        }
        Ok(())
    }

    /// Refuses every redirection anywhere in the git directory: symbolic links, `.git`
    /// files, `commondir`, `gitdir` and (http-)alternates files.
    fn scan(&mut self, dir: &Path, depth: usize) -> Result<(), BundleError> {
        if depth > 16 {
            return Err(BundleError::TooDeep { limit: 16 });
        }
        for entry in fs::read_dir(dir).map_err(io("list", dir))? {
            let entry = entry.map_err(io("list", dir))?;
            let path = entry.path();
            let kind = entry.file_type().map_err(io("stat", &path))?;
            self.count(0)?;
            let name = entry.file_name();
            let problem = |what: &str| BundleError::Indirection {
                path: self.worker_repo.to_owned(),
                problem: format!(
                    "{what} at {}",
                    path.strip_prefix(self.worker_repo)
                        .unwrap_or(&path)
                        .display()
                ),
            };
            if kind.is_symlink() {
                return Err(problem("a symbolic link"));
            }
            match name.to_str() {
                Some("alternates" | "http-alternates") => {
                    return Err(BundleError::Alternates {
                        path: self.worker_repo.to_owned(),
                    });
                }
                Some("commondir") => return Err(problem("a `commondir` file")),
                Some("gitdir" | ".git") => return Err(problem("a `gitdir` or `.git` file")),
                _ => {}
            }
            if kind.is_dir() {
                self.scan(&path, depth + 1)?;
            }
        }
        Ok(())
    }

    /// Copies loose objects (`xx/<38 hex>`) and packs (`pack/pack-*.{pack,idx}`), regular
    /// files only.
    fn objects(&mut self, from: &Path, to: &Path) -> Result<(), BundleError> {
        for entry in fs::read_dir(from).map_err(io("list", from))? {
            let entry = entry.map_err(io("list", from))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let kind = entry.file_type().map_err(io("stat", &entry.path()))?;
            if !kind.is_dir() {
                continue;
            }
            let loose = name.len() == 2 && name.bytes().all(|b| b.is_ascii_hexdigit());
            if !loose && name != "pack" {
                continue;
            }
            let target = to.join(name);
            fs::create_dir_all(&target).map_err(io("create", &target))?;
            for file in fs::read_dir(entry.path()).map_err(io("list", &entry.path()))? {
                let file = file.map_err(io("list", &entry.path()))?;
                let file_name = file.file_name();
                let Some(file_name) = file_name.to_str() else {
                    continue;
                };
                let wanted = if loose {
                    file_name.len() == 38 && file_name.bytes().all(|b| b.is_ascii_hexdigit())
                } else {
                    file_name.starts_with("pack-")
                        && (file_name.ends_with(".pack") || file_name.ends_with(".idx"))
                };
                let meta = fs::symlink_metadata(file.path()).map_err(io("stat", &file.path()))?;
                if !wanted || !meta.is_file() {
                    continue;
                }
                self.count(meta.len())?;
                fs::copy(file.path(), target.join(file_name)).map_err(io("copy", &file.path()))?;
            }
        }
        Ok(())
    }
}

/// Reads a small regular file of the git directory (never through a link).
fn small_file(path: &Path, limit: u64) -> Result<Option<String>, String> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(_) => return Ok(None),
    };
    if !meta.is_file() {
        return Err(format!("`{}` is not a regular file", path.display()));
    }
    let mut text = String::new();
    fs::File::open(path)
        .and_then(|f| f.take(limit).read_to_string(&mut text))
        .map_err(|e| format!("unable to read `{}`: {e}", path.display()))?;
    Ok(Some(text))
}

/// Resolves `HEAD` by hand: a detached ID, or one `ref: refs/…` level read from the loose
/// ref or `packed-refs`.
fn read_head(git_dir: &Path) -> Result<Oid, String> {
    let head = small_file(&git_dir.join("HEAD"), 4096)?.ok_or("the repository has no HEAD")?;
    let head = head.trim_end();
    let Some(name) = head.strip_prefix("ref: ") else {
        return parse_id(head);
    };
    if !name.starts_with("refs/") || !git2::Reference::is_valid_name(name) || name.contains("..") {
        return Err("HEAD names an invalid reference".into());
    }
    if let Some(text) = small_file(&git_dir.join(name), 4096)? {
        return parse_id(text.trim_end());
    }
    let packed = small_file(&git_dir.join("packed-refs"), 16 << 20)?.unwrap_or_default();
    packed
        .lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(_, r)| *r == name)
        .map(|(id, _)| parse_id(id))
        .unwrap_or_else(|| Err(format!("HEAD names `{name}`, which does not exist")))
}

fn parse_id(text: &str) -> Result<Oid, String> {
    if text.len() == 40 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        Oid::from_str(text).map_err(|e| e.to_string())
    } else {
        Err("HEAD is not a commit id or a reference".into())
    }
}
