//! Role projections: exporting the allowlisted files of a source commit into a new repository
//! with a synthetic, parentless root commit.
//!
//! Pipeline: read the source tree, manifest and catalog (git2) → plan (pure, [`crate::plan`])
//! → write a fresh repository. Workers read each exported blob once, write it to the working
//! tree and encode it as a stored-deflate pack entry; one writer appends the entries, the trees
//! and the root commit (encoded in memory) to a single packfile with its
//! index ([`crate::pack`]), so the projection's object database is one sequential file, not a
//! loose object per file.
//!
//! Memory per blob is bounded ([`ReadLimits`]): a blob above [`ReadLimits::stream_above`]
//! (32 MiB by default) is never held in memory. The writer streams it itself when its turn in
//! the pack comes, 1 MiB at a time into the working-tree file and the pack entry, hashed as it
//! goes and checked against its ID at the end: inflated, for a whole object; for a delta, by
//! applying it to its base, which is held in memory up to [`ReadLimits::max_deltified`]
//! (512 MiB, Git's `core.bigFileThreshold`; above it the export fails and says to repack).
//! The index is built from the written files' stat data. The new repository is created
//! without templates (so without hooks), with
//! `core.logAllRefUpdates=false` (no reflog), no remote and no alternates; its own pack holds
//! only the exported blobs and the trees and commit built from them. The root commit uses a
//! fixed identity and time, so the same source files and role always give the same commit ID.
//!
//! The [`ProjectionRecord`] returned with the report is control-plane evidence: it lists the
//! withheld paths and must never be placed inside the projection handed to a sandbox.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    fs,
    io::Write,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        mpsc,
    },
};

use git2::{IndexEntry, IndexTime, ObjectType, Oid, Repository, RepositoryInitOptions};
use serde::{Deserialize, Serialize};

use crate::{
    catalog::{self, CATALOG_PATH, CatalogError, ChangeScope, TestSelection},
    manifest::{MANIFEST_PATH, ManifestError, PathClass, ProjectionManifest},
    pack::{ObjectKind, PackEntry, PackWriter, encode_entry},
    plan::{SourceEntry, TestVisibility, WithheldReason, plan_projection},
    role::Role,
    source_odb::{Found, LargeObject, ReadLimits, SourceObjects, SourceReadError, SourceReader},
    tree::{TreeFile, list_files, mode},
};

/// Identity of every synthetic root commit.
pub const PROJECTOR_NAME: &str = "ProtoBot Projector";
/// E-mail of every synthetic root commit.
pub const PROJECTOR_EMAIL: &str = "projector@protobot.invalid";
/// Branch that holds the synthetic root in a projection.
pub const PROJECTION_BRANCH: &str = "refs/heads/main";
/// Version tag of [`ProjectionRecord`].
pub const RECORD_FORMAT: &str = "protobot.projection-record/v1";

/// What to export.
#[derive(Debug, Clone)]
pub struct ExportRequest {
    /// The canonical (or integration) repository to read from.
    pub source_repo: PathBuf,
    /// Revision of the source commit (`--at`), resolved with `git rev-parse` syntax.
    pub at: String,
    /// Role to project for.
    pub role: Role,
    /// Destination directory; must not exist or be empty.
    pub dest: PathBuf,
    /// What the work item changes (drives Worker A's test selection).
    pub scope: ChangeScope,
}

/// Control-plane record of one projection, needed later to validate the returned bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectionRecord {
    /// Always [`RECORD_FORMAT`].
    pub format: String,
    /// The role.
    pub role: Role,
    /// Source commit the projection was exported from.
    pub source_commit: String,
    /// The synthetic root commit of the projection.
    pub root_commit: String,
    /// The manifest at the source commit.
    pub manifest: ProjectionManifest,
    /// Exported paths.
    pub exported: BTreeSet<String>,
    /// Paths of the source commit that were withheld from this role.
    pub withheld: BTreeSet<String>,
    /// Withheld paths the role may nevertheless write whole (Worker A: quarantined tests,
    /// which it replaces without seeing them).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub replaceable: BTreeSet<String>,
}

impl ProjectionRecord {
    /// Writes the record as JSON; keep it outside the projection directory.
    ///
    /// Never writes through a link: a symbolic link (or anything but a regular file) at
    /// `path` is refused, and the text goes to a new file created exclusively (`O_EXCL`)
    /// beside it, then renamed over `path` (a rename replaces a name, it follows nothing).
    pub fn write(&self, path: &Path) -> Result<(), ExportError> {
        let fail = |reason: String| ExportError::Record {
            path: path.to_owned(),
            reason,
        };
        let text = serde_json::to_vec_pretty(self).map_err(|e| fail(e.to_string()))?;
        check_record_target(path)?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let mut temp = tempfile::Builder::new()
            .prefix(".projection-record-")
            .tempfile_in(dir)
            .map_err(|e| fail(format!("unable to create the record exclusively: {e}")))?;
        std::io::Write::write_all(&mut temp, &text).map_err(|e| fail(e.to_string()))?;
        temp.persist(path).map_err(|e| fail(e.error.to_string()))?;
        Ok(())
    }

    /// Reads a record written by [`ProjectionRecord::write`].
    pub fn read(path: &Path) -> Result<Self, ExportError> {
        let text = fs::read(path).map_err(|e| ExportError::Record {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        let record: Self = serde_json::from_slice(&text).map_err(|e| ExportError::Record {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        if record.format != RECORD_FORMAT {
            return Err(ExportError::Record {
                path: path.to_owned(),
                reason: format!("unsupported format `{}`", record.format),
            });
        }
        Ok(record)
    }
}

/// Refuses a record path that is a symbolic link or not a regular file.
fn check_record_target(path: &Path) -> Result<(), ExportError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_file() => Err(ExportError::Record {
            path: path.to_owned(),
            reason: "it exists and is a symbolic link or not a regular file; remove it or pick another destination".into(),
        }),
        _ => Ok(()),
    }
}

/// Counts of withheld paths by reason kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WithheldSummary {
    /// Reason kind (`unclassified`, `hidden-class:implementation`, …) → count.
    pub by_reason: BTreeMap<String, usize>,
}

/// Where the control-plane record of the projection at `dest` is written: a sibling file
/// `<dest>.projection.json`, never inside the projection handed to a sandbox.
pub fn record_path_for(dest: &Path) -> PathBuf {
    let mut name = dest
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "projection".into());
    name.push(".projection.json");
    dest.with_file_name(name)
}

/// Result of an export, safe to print for operators (counts, not withheld names).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExportReport {
    /// The role.
    pub role: Role,
    /// Source commit.
    pub source_commit: String,
    /// Synthetic root commit.
    pub root_commit: String,
    /// Destination directory.
    pub dest: PathBuf,
    /// Number of exported files.
    pub exported_files: usize,
    /// Exported files by class.
    pub exported_by_class: BTreeMap<PathClass, usize>,
    /// Withheld paths by reason.
    pub withheld: WithheldSummary,
    /// Worker A only: the test selection that decided which tests were exported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_selection: Option<TestSelection>,
    /// Where the record was written ([`record_path_for`]).
    pub record_path: PathBuf,
    /// The record, as written to `record_path`.
    #[serde(skip)]
    pub record: ProjectionRecord,
}

/// Failures of a projection export.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The source repository could not be opened.
    #[error("failed to open source repository {path}: {source}")]
    OpenSource {
        /// Repository path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: git2::Error,
    },
    /// `--at` does not name a commit.
    #[error("unable to resolve `{at}` to a commit in the source repository: {source}")]
    ResolveCommit {
        /// The revision.
        at: String,
        /// Cause.
        #[source]
        source: git2::Error,
    },
    /// The destination exists and is not empty.
    #[error(
        "unable to export into {path}: the destination exists and is not empty; pass a new directory"
    )]
    DestinationNotEmpty {
        /// Destination.
        path: PathBuf,
    },
    /// The projection manifest is invalid.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// `.protobot/projection.yaml` is not a regular file.
    #[error(
        "projection.invalid: .protobot/projection.yaml at the source commit is not a regular file; restore it by a reviewed policy edit"
    )]
    ManifestNotAFile,
    /// The test catalog is invalid.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// A git operation failed.
    #[error("failed to {operation}: {source}")]
    Git {
        /// The operation.
        operation: &'static str,
        /// Cause.
        #[source]
        source: git2::Error,
    },
    /// Filesystem work on the destination failed.
    #[error("failed to {operation} at {path}: {source}")]
    Io {
        /// The operation.
        operation: &'static str,
        /// Path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The source repository's object store is damaged.
    #[error(transparent)]
    SourceObjects(#[from] SourceReadError),
    /// An exported blob could not be read from the source repository's object store.
    #[error("failed to read `{path}` of the source commit: {source}")]
    ReadBlob {
        /// The file's path in the source tree.
        path: String,
        /// Cause (names the object file and what is wrong with it).
        #[source]
        source: SourceReadError,
    },
    /// A projection record could not be read or written.
    #[error("failed to read or write projection record {path}: {reason}")]
    Record {
        /// Path.
        path: PathBuf,
        /// Cause.
        reason: String,
    },
}

impl ExportError {
    /// Stable label for metrics and Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            ExportError::OpenSource { .. } => "open-source",
            ExportError::ResolveCommit { .. } => "resolve-commit",
            ExportError::DestinationNotEmpty { .. } => "destination-not-empty",
            ExportError::Manifest(_) | ExportError::ManifestNotAFile => "projection-invalid",
            ExportError::Catalog(_) => "catalog-invalid",
            ExportError::Git { .. } => "git",
            ExportError::Io { .. } => "io",
            ExportError::SourceObjects(_) | ExportError::ReadBlob { .. } => "source-objects",
            ExportError::Record { .. } => "record",
        }
    }
}

fn git(operation: &'static str) -> impl FnOnce(git2::Error) -> ExportError {
    move |source| ExportError::Git { operation, source }
}

/// Reads a UTF-8 text file of a tree; `None` when absent. Errors when it is not a regular file.
pub(crate) fn read_tree_text(
    repo: &Repository,
    files: &[TreeFile],
    path: &str,
) -> Result<Option<Result<String, ()>>, git2::Error> {
    let Some(file) = files.iter().find(|f| f.path.as_deref() == Some(path)) else {
        return Ok(None);
    };
    if file.mode != mode::FILE && file.mode != mode::EXECUTABLE {
        return Ok(Some(Err(())));
    }
    let blob = repo.find_blob(file.id)?;
    Ok(Some(
        String::from_utf8(blob.content().to_vec()).map_err(|_| ()),
    ))
}

/// `test`-class files of `files` whose content or mode differs from the same path at `base`
/// (or that `base` does not have): what the current build wrote.
fn files_changed_since(
    repo: &Repository,
    files: &[TreeFile],
    manifest: &ProjectionManifest,
    base: &str,
) -> Result<BTreeSet<String>, ExportError> {
    let base_commit = repo
        .revparse_single(base)
        .and_then(|o| o.peel_to_commit())
        .map_err(|source| ExportError::ResolveCommit {
            at: base.to_owned(),
            source,
        })?;
    let base_tree = base_commit
        .tree()
        .map_err(git("read the build base tree"))?;
    let base_files = list_files(repo, &base_tree).map_err(git("list the build base tree"))?;
    let before: BTreeMap<&str, (Oid, i32)> = base_files
        .iter()
        .filter_map(|file| Some((file.path.as_deref()?, (file.id, file.mode))))
        .collect();
    Ok(files
        .iter()
        .filter_map(|file| {
            let path = file.path.as_deref()?;
            let changed = before.get(path) != Some(&(file.id, file.mode));
            (changed && manifest.classify(path) == Some(PathClass::Test)).then(|| path.to_owned())
        })
        .collect())
}

/// Loads the projection manifest of a flattened tree (absent → empty manifest).
pub fn load_manifest(
    repo: &Repository,
    files: &[TreeFile],
) -> Result<ProjectionManifest, ExportError> {
    match read_tree_text(repo, files, MANIFEST_PATH).map_err(git("read the projection manifest"))? {
        None => Ok(ProjectionManifest::empty()),
        Some(Err(())) => Err(ExportError::ManifestNotAFile),
        Some(Ok(text)) => Ok(ProjectionManifest::parse(&text)?),
    }
}

/// Exports a role projection; see the module documentation for the guarantees. Also writes
/// the [`ProjectionRecord`] to [`record_path_for`]`(dest)`.
pub fn export_projection(request: &ExportRequest) -> Result<ExportReport, ExportError> {
    export_projection_with(request, ReadLimits::default())
}

/// [`export_projection`] holding at most `limits` of one blob in memory (tests use small
/// limits to stream small blobs).
pub fn export_projection_with(
    request: &ExportRequest,
    limits: ReadLimits,
) -> Result<ExportReport, ExportError> {
    check_record_target(&record_path_for(&request.dest))?;
    let source =
        Repository::open(&request.source_repo).map_err(|source| ExportError::OpenSource {
            path: request.source_repo.clone(),
            source,
        })?;
    let commit = source
        .revparse_single(&request.at)
        .and_then(|o| o.peel_to_commit())
        .map_err(|source| ExportError::ResolveCommit {
            at: request.at.clone(),
            source,
        })?;
    let tree = commit.tree().map_err(git("read the source tree"))?;
    let files = list_files(&source, &tree).map_err(git("list the source tree"))?;
    let manifest = load_manifest(&source, &files)?;

    let selection = if request.role == Role::WorkerA {
        let entries = match read_tree_text(&source, &files, CATALOG_PATH)
            .map_err(git("read the test catalog"))?
        {
            None | Some(Err(())) => Vec::new(),
            Some(Ok(text)) => catalog::parse_catalog(&text)?,
        };
        Some(catalog::select_tests(&entries, &request.scope))
    } else {
        None
    };
    let tests = match &selection {
        Some(selection) => TestVisibility {
            withheld: selection.withheld_files(),
            own: match &request.scope.build_base {
                Some(base) => files_changed_since(&source, &files, &manifest, base)?,
                None => BTreeSet::new(),
            },
        },
        None => TestVisibility::default(),
    };

    let entries: Vec<SourceEntry> = files
        .iter()
        .map(|f| SourceEntry {
            path: f.path.clone(),
            mode: f.mode,
        })
        .collect();
    let lossy: Vec<String> = files
        .iter()
        .map(|f| String::from_utf8_lossy(&f.path_bytes).into_owned())
        .collect();
    let plan = plan_projection(&entries, &lossy, &manifest, request.role, &tests);

    let existed = request.dest.exists();
    prepare_destination(&request.dest)?;
    // On failure, leave the destination as it was found: no half-written projection.
    let result = (|| {
        let dest = init_projection_repo(&request.dest)?;
        let pack_dir = dest.path().join("objects").join("pack");
        let workdir = dest
            .workdir()
            .map(Path::to_owned)
            .ok_or_else(|| ExportError::Io {
                operation: "find the projection working tree",
                path: request.dest.clone(),
                source: std::io::Error::other("the projection repository is bare"),
            })?;
        let jobs: Vec<(&TreeFile, &str)> = plan
            .include
            .iter()
            .map(|(position, planned)| (&files[*position], planned.path.as_str()))
            .collect();
        // Trees and the root commit are built in memory first: their IDs and the object
        // count are known before the pack header is written.
        let mut root = DirNode::default();
        let mut exported_by_class = BTreeMap::new();
        let mut exported = BTreeSet::new();
        for (position, planned) in &plan.include {
            let file = &files[*position];
            root.insert(&planned.path, file.id, file.mode);
            *exported_by_class.entry(planned.class).or_insert(0) += 1;
            exported.insert(planned.path.clone());
        }
        let mut trees = Vec::new();
        let tree_id = root
            .encode(&mut trees)
            .map_err(git("hash the projection trees"))?;
        let (root_commit, commit_bytes) = encode_root_commit(tree_id, request.role)?;
        let mut unique: HashSet<Oid> = HashSet::with_capacity(jobs.len() + trees.len() + 1);
        let owners: Vec<bool> = jobs.iter().map(|(f, _)| unique.insert(f.id)).collect();
        unique.extend(trees.iter().map(|(id, _)| *id));
        unique.insert(root_commit);
        let count = u32::try_from(unique.len()).map_err(|_| ExportError::Io {
            operation: "count the projection objects",
            path: request.dest.clone(),
            source: std::io::Error::other("more than 2^32 objects"),
        })?;

        let pack_io = |source| ExportError::Io {
            operation: "write the projection pack",
            path: pack_dir.clone(),
            source,
        };
        let mut pack = PackWriter::create(&pack_dir, count).map_err(pack_io)?;
        let objects = SourceObjects::open(&source.commondir().join("objects"))?;
        let written = write_blobs(
            &request.source_repo,
            &objects,
            limits,
            &jobs,
            &owners,
            &workdir,
            &mut pack,
        )?;
        for (id, bytes) in &trees {
            pack.append(&encode_entry(*id, ObjectKind::Tree, bytes))
                .map_err(pack_io)?;
        }
        pack.append(&encode_entry(
            root_commit,
            ObjectKind::Commit,
            &commit_bytes,
        ))
        .map_err(pack_io)?;
        pack.finish().map_err(pack_io)?;

        let mut index = dest.index().map_err(git("open the projection index"))?;
        for ((position, planned), meta) in plan.include.iter().zip(&written) {
            let file = &files[*position];
            index
                .add(&index_entry(&planned.path, file.id, file.mode, meta))
                .map_err(git("add a file to the projection index"))?;
        }
        index.write().map_err(git("write the projection index"))?;
        dest.reference(PROJECTION_BRANCH, root_commit, false, "projection root")
            .map_err(git("point the projection branch at the synthetic root"))?;
        remove_if_present(&dest.path().join("hooks"))?;
        remove_if_present(&dest.path().join("logs"))?;

        let mut withheld_summary = WithheldSummary::default();
        let mut withheld = BTreeSet::new();
        let mut replaceable = BTreeSet::new();
        for (path, reason) in &plan.withheld {
            let key = match reason {
                WithheldReason::Unclassified => "unclassified".to_owned(),
                WithheldReason::HiddenClass { class } => format!("hidden-class:{class}"),
                WithheldReason::QuarantinedTest => "quarantined-test".to_owned(),
                WithheldReason::LegacyTest => "legacy-test".to_owned(),
                WithheldReason::UnsafePath { .. } => "unsafe-path".to_owned(),
                WithheldReason::NonUtf8Path => "non-utf8-path".to_owned(),
                WithheldReason::UnsupportedMode { .. } => "unsupported-mode".to_owned(),
            };
            *withheld_summary.by_reason.entry(key).or_insert(0) += 1;
            withheld.insert(path.clone());
            if *reason == WithheldReason::QuarantinedTest {
                replaceable.insert(path.clone());
            }
        }
        let record = ProjectionRecord {
            format: RECORD_FORMAT.to_owned(),
            role: request.role,
            source_commit: commit.id().to_string(),
            root_commit: root_commit.to_string(),
            manifest,
            exported,
            withheld,
            replaceable,
        };
        let record_path = record_path_for(&request.dest);
        record.write(&record_path)?;
        Ok(ExportReport {
            role: request.role,
            source_commit: commit.id().to_string(),
            root_commit: root_commit.to_string(),
            dest: request.dest.clone(),
            exported_files: plan.include.len(),
            exported_by_class,
            withheld: withheld_summary,
            test_selection: selection,
            record_path,
            record,
        })
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&request.dest);
        let _ = fs::remove_file(record_path_for(&request.dest));
        if existed {
            let _ = fs::create_dir_all(&request.dest);
        }
    }
    result
}

fn prepare_destination(dest: &Path) -> Result<(), ExportError> {
    match fs::read_dir(dest) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(ExportError::DestinationNotEmpty {
                    path: dest.to_owned(),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            fs::create_dir_all(dest).map_err(|source| ExportError::Io {
                operation: "create the destination",
                path: dest.to_owned(),
                source,
            })
        }
        Err(source) => Err(ExportError::Io {
            operation: "inspect the destination",
            path: dest.to_owned(),
            source,
        }),
    }
}

fn init_projection_repo(dest: &Path) -> Result<Repository, ExportError> {
    let mut options = RepositoryInitOptions::new();
    options
        .external_template(false)
        .no_reinit(true)
        .initial_head("main");
    let repo = Repository::init_opts(dest, &options).map_err(git("initialise the projection"))?;
    {
        let mut config = repo.config().map_err(git("open the projection config"))?;
        config
            .set_bool("core.logAllRefUpdates", false)
            .map_err(git("disable reflogs in the projection"))?;
    }
    Ok(repo)
}

/// The synthetic root commit (fixed identity and time, no parent) and its ID, encoded as
/// libgit2 and Git write it.
fn encode_root_commit(tree_id: Oid, role: Role) -> Result<(Oid, Vec<u8>), ExportError> {
    let person = format!("{PROJECTOR_NAME} <{PROJECTOR_EMAIL}> 0 +0000");
    let text = format!(
        "tree {tree_id}\nauthor {person}\ncommitter {person}\n\nProjection root\n\nProjection-Role: {role}\n"
    );
    let bytes = text.into_bytes();
    let id = Oid::hash_object(ObjectType::Commit, &bytes)
        .map_err(git("hash the synthetic root commit"))?;
    Ok((id, bytes))
}

/// Jobs a worker takes at once.
const BATCH: usize = 16;

/// What a worker hands the pack writer for the first job of a blob ID.
enum ToPack {
    /// A blob up to [`ReadLimits::stream_above`], encoded by the worker.
    Entry(PackEntry),
    /// A larger blob, not read yet: the writer streams it into the working-tree file and the
    /// pack.
    Stream(LargeObject),
}

/// Writes every job's blob to the working tree and, for the first job of each blob ID, into
/// the pack. Workers (one per core, each with its own handle on the source repository) take
/// jobs in small batches, read each blob once, write the file and encode its pack entry; this
/// thread appends the entries to the pack in job order (holding the few that arrive early),
/// so the same projection always gives the same pack bytes and name. A large whole blob is
/// streamed by this thread, when its turn comes, into both its file and the pack. Returns
/// the metadata of each written file, in job order.
fn write_blobs(
    source_repo: &Path,
    objects: &SourceObjects,
    limits: ReadLimits,
    jobs: &[(&TreeFile, &str)],
    owners: &[bool],
    workdir: &Path,
    pack: &mut PackWriter,
) -> Result<Vec<fs::Metadata>, ExportError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8)
        .min(jobs.len().div_ceil(BATCH).max(1));
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (sender, receiver) = mpsc::sync_channel::<(usize, ToPack)>(64);
    // Positions whose blob goes into the pack, in the order it is written.
    let order: Vec<usize> = (0..jobs.len()).filter(|p| owners[*p]).collect();
    let pack_dir = workdir.join(".git/objects/pack");
    let (written, appended) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let sender = sender.clone();
                let (next, stop) = (&next, &stop);
                scope.spawn(move || {
                    let result = write_blob_worker(
                        source_repo,
                        objects,
                        limits,
                        jobs,
                        owners,
                        workdir,
                        next,
                        stop,
                        &sender,
                    );
                    if result.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    result
                })
            })
            .collect();
        drop(sender);
        let mut reader = objects.reader_with(limits);
        let pack_io = |source| ExportError::Io {
            operation: "write the projection pack",
            path: pack_dir.clone(),
            source,
        };
        let mut appended: Result<Vec<(usize, fs::Metadata)>, ExportError> = Ok(Vec::new());
        let mut streamed = Vec::new();
        let mut early: BTreeMap<usize, ToPack> = BTreeMap::new();
        let mut due = order.iter().peekable();
        'receive: for (position, message) in &receiver {
            early.insert(position, message);
            while let Some(&&position) = due.peek() {
                let Some(message) = early.remove(&position) else {
                    break;
                };
                due.next();
                let result = match message {
                    ToPack::Entry(entry) => pack.append(&entry).map(drop).map_err(pack_io),
                    ToPack::Stream(large) => {
                        let (file, path) = jobs[position];
                        stream_blob(&mut reader, file, path, workdir, &large, Some(&mut *pack))
                            .map(|meta| streamed.push((position, meta)))
                    }
                };
                if let Err(e) = result {
                    stop.store(true, Ordering::Relaxed);
                    appended = Err(e);
                    break 'receive;
                }
            }
        }
        if appended.is_ok() {
            appended = Ok(streamed);
        }
        // Unblock workers still sending after a failure.
        drop(receiver);
        let written: Vec<Result<Vec<(usize, fs::Metadata)>, ExportError>> = handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ExportError::Io {
                        operation: "join an export thread",
                        path: workdir.to_owned(),
                        source: std::io::Error::other("export thread panicked"),
                    })
                })
            })
            .collect();
        (written, appended)
    });
    // A worker's own failure is the root cause; report it before the writer's.
    let mut all = Vec::with_capacity(jobs.len());
    for result in written {
        all.extend(result?);
    }
    all.extend(appended?);
    all.sort_unstable_by_key(|(position, _)| *position);
    if all.len() != jobs.len() {
        return Err(ExportError::Io {
            operation: "write the projection files",
            path: workdir.to_owned(),
            source: std::io::Error::other("an export thread stopped early"),
        });
    }
    Ok(all.into_iter().map(|(_, meta)| meta).collect())
}

#[allow(clippy::too_many_arguments)]
fn write_blob_worker(
    source_repo: &Path,
    objects: &SourceObjects,
    limits: ReadLimits,
    jobs: &[(&TreeFile, &str)],
    owners: &[bool],
    workdir: &Path,
    next: &AtomicUsize,
    stop: &AtomicBool,
    sender: &mpsc::SyncSender<(usize, ToPack)>,
) -> Result<Vec<(usize, fs::Metadata)>, ExportError> {
    let source = Repository::open(source_repo).map_err(|source| ExportError::OpenSource {
        path: source_repo.to_owned(),
        source,
    })?;
    let odb = source
        .odb()
        .map_err(git("open the source object database"))?;
    let mut reader = objects.reader_with(limits);
    let mut out = Vec::new();
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(out);
        }
        let start = next.fetch_add(BATCH, Ordering::Relaxed);
        if start >= jobs.len() {
            return Ok(out);
        }
        for position in start..(start + BATCH).min(jobs.len()) {
            let (file, path) = jobs[position];
            let blob = match read_source_blob(&mut reader, &odb, file.id, path)? {
                BlobRead::Held(blob) => blob,
                BlobRead::Large(large) if owners[position] => {
                    // The writer streams it into the file and the pack when its turn comes.
                    if sender.send((position, ToPack::Stream(large))).is_err() {
                        return Ok(out);
                    }
                    continue;
                }
                BlobRead::Large(large) => {
                    // Another path has the same blob and puts it in the pack.
                    out.push((
                        position,
                        stream_blob(&mut reader, file, path, workdir, &large, None)?,
                    ));
                    continue;
                }
            };
            let content = blob.data();
            let target = workdir.join(path);
            let mut handle =
                create_file(&target).map_err(io("write a projection file", &target))?;
            handle
                .write_all(content)
                .map_err(io("write a projection file", &target))?;
            if file.mode == mode::EXECUTABLE {
                make_executable(&handle)
                    .map_err(io("mark a projection file executable", &target))?;
            }
            let meta = handle
                .metadata()
                .map_err(io("stat a projection file", &target))?;
            drop(handle);
            out.push((position, meta));
            if owners[position] {
                let entry = encode_entry(file.id, ObjectKind::Blob, content);
                if sender.send((position, ToPack::Entry(entry))).is_err() {
                    // The pack writer failed and reports why.
                    return Ok(out);
                }
            }
        }
    }
}

fn io(operation: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ExportError {
    let path = path.to_owned();
    move |source| ExportError::Io {
        operation,
        path,
        source,
    }
}

/// Why streaming a blob stopped: reading it, or writing it.
enum StreamError {
    Read(SourceReadError),
    Write(ExportError),
}

impl From<SourceReadError> for StreamError {
    fn from(source: SourceReadError) -> Self {
        StreamError::Read(source)
    }
}

/// Streams large blob `file` (at `path` in the tree) into its working-tree file under
/// `workdir` and, with `pack`, into the pack: 1 MiB at a time, nothing of it held. Its content
/// is checked against its ID only at the end; on an error the file and the pack hold part of
/// it, and the export removes the whole projection.
fn stream_blob(
    reader: &mut SourceReader<'_>,
    file: &TreeFile,
    path: &str,
    workdir: &Path,
    large: &LargeObject,
    pack: Option<&mut PackWriter>,
) -> Result<fs::Metadata, ExportError> {
    let target = workdir.join(path);
    let pack_dir = workdir.join(".git/objects/pack");
    let mut handle = create_file(&target).map_err(io("write a projection file", &target))?;
    let mut entry = match pack {
        Some(pack) => pack
            .begin(file.id, ObjectKind::Blob, large.size)
            .map_err(io("write the projection pack", &pack_dir))?,
        None => None,
    };
    reader
        .stream(file.id, large, |piece| {
            handle
                .write_all(piece)
                .map_err(|e| StreamError::Write(io("write a projection file", &target)(e)))?;
            if let Some(entry) = entry.as_mut() {
                entry.write(piece).map_err(|e| {
                    StreamError::Write(io("write the projection pack", &pack_dir)(e))
                })?;
            }
            Ok(())
        })
        .map_err(|e| match e {
            StreamError::Read(source) => ExportError::ReadBlob {
                path: path.to_owned(),
                source,
            },
            StreamError::Write(e) => e,
        })?;
    if let Some(entry) = entry {
        entry
            .finish()
            .map_err(io("write the projection pack", &pack_dir))?;
    }
    if file.mode == mode::EXECUTABLE {
        make_executable(&handle).map_err(io("mark a projection file executable", &target))?;
    }
    handle
        .metadata()
        .map_err(io("stat a projection file", &target))
}

/// A blob read from the source repository.
enum SourceBlob<'odb> {
    /// Read by [`SourceReader`].
    Own(Vec<u8>),
    /// Read by libgit2 (objects the reader leaves to it).
    Libgit2(git2::OdbObject<'odb>),
}

/// What [`read_source_blob`] found.
enum BlobRead<'odb> {
    /// Read into memory.
    Held(SourceBlob<'odb>),
    /// A blob above [`ReadLimits::stream_above`], found, not read: stream it.
    Large(LargeObject),
}

impl SourceBlob<'_> {
    fn data(&self) -> &[u8] {
        match self {
            SourceBlob::Own(bytes) => bytes,
            SourceBlob::Libgit2(object) => object.data(),
        }
    }
}

/// Reads a blob of the source (canonical or integration) repository, or finds it when it is
/// too large to read into memory ([`BlobRead::Large`]).
///
/// [`SourceReader`] reads it and checks it against its ID with plain SHA-1: libgit2's
/// whole-object read re-hashes every object with collision-detecting SHA-1, which was most
/// of an export's CPU. The source repository is the Job Site's own; objects from Workers
/// (untrusted) are never read here, and reads of Worker repositories ([`crate::bundle`]) keep
/// libgit2's verification. Objects the reader leaves alone (alternates, for one) are read
/// with libgit2, verified, and whole whatever their size.
fn read_source_blob<'odb>(
    reader: &mut SourceReader<'_>,
    odb: &'odb git2::Odb<'_>,
    id: Oid,
    path: &str,
) -> Result<BlobRead<'odb>, ExportError> {
    let not_a_blob = |kind: ObjectType| ExportError::Io {
        operation: "read a source blob",
        path: PathBuf::from(path),
        source: std::io::Error::other(format!("{id} is a {kind}, not a blob")),
    };
    let found = reader
        .read_bounded(id)
        .map_err(|source| ExportError::ReadBlob {
            path: path.to_owned(),
            source,
        })?;
    match found {
        Some(Found::Loaded(object)) if object.kind != ObjectType::Blob => {
            Err(not_a_blob(object.kind))
        }
        Some(Found::Loaded(object)) => Ok(BlobRead::Held(SourceBlob::Own(object.data))),
        Some(Found::Large(large)) if large.kind != ObjectType::Blob => Err(not_a_blob(large.kind)),
        Some(Found::Large(large)) => Ok(BlobRead::Large(large)),
        None => {
            let object = odb.read(id).map_err(git("read a source blob"))?;
            if object.kind() != ObjectType::Blob {
                return Err(not_a_blob(object.kind()));
            }
            Ok(BlobRead::Held(SourceBlob::Libgit2(object)))
        }
    }
}

/// Creates (truncates) a working-tree file, creating its missing parent directories on the
/// first miss, as a checkout does: no separate pass over the directories.
fn create_file(target: &Path) -> std::io::Result<fs::File> {
    match fs::File::create(target) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::File::create(target)
        }
        other => other,
    }
}

#[cfg(unix)]
fn make_executable(file: &fs::File) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(fs::Permissions::from_mode(0o755))
}

#[cfg(not(unix))]
fn make_executable(_file: &fs::File) -> std::io::Result<()> {
    Ok(())
}

/// An index entry carrying the stat data of the file just written, so `git status` in the
/// projection is clean without rehashing every file.
fn index_entry(path: &str, id: Oid, file_mode: i32, meta: &fs::Metadata) -> IndexEntry {
    #[cfg(unix)]
    let (ctime, mtime, dev, ino, uid, gid) = {
        use std::os::unix::fs::MetadataExt;
        (
            IndexTime::new(meta.ctime() as i32, meta.ctime_nsec() as u32),
            IndexTime::new(meta.mtime() as i32, meta.mtime_nsec() as u32),
            meta.dev() as u32,
            meta.ino() as u32,
            meta.uid(),
            meta.gid(),
        )
    };
    #[cfg(not(unix))]
    let (ctime, mtime, dev, ino, uid, gid) =
        (IndexTime::new(0, 0), IndexTime::new(0, 0), 0, 0, 0, 0);
    IndexEntry {
        ctime,
        mtime,
        dev,
        ino,
        mode: file_mode as u32,
        uid,
        gid,
        file_size: meta.len() as u32,
        id,
        flags: path.len().min(0xfff) as u16,
        flags_extended: 0,
        path: path.as_bytes().to_vec(),
    }
}

fn remove_if_present(path: &Path) -> Result<(), ExportError> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ExportError::Io {
            operation: "remove a template directory",
            path: path.to_owned(),
            source,
        }),
    }
}

/// An in-memory directory used to build nested trees bottom-up.
#[derive(Default)]
pub(crate) struct DirNode {
    files: BTreeMap<String, (Oid, i32)>,
    dirs: BTreeMap<String, DirNode>,
}

impl DirNode {
    pub(crate) fn insert(&mut self, path: &str, id: Oid, file_mode: i32) {
        match path.split_once('/') {
            None => {
                self.files.insert(path.to_owned(), (id, file_mode));
            }
            Some((head, rest)) => self
                .dirs
                .entry(head.to_owned())
                .or_default()
                .insert(rest, id, file_mode),
        }
    }

    /// Encodes this directory's tree and, first, every subtree (with its ID, into `out`) exactly as Git writes them: entries sorted by name, directories
    /// compared as if their name ended in `/`. Returns this tree's ID.
    pub(crate) fn encode(&self, out: &mut Vec<(Oid, Vec<u8>)>) -> Result<Oid, git2::Error> {
        let mut entries: Vec<(Vec<u8>, i32, &str, Oid)> =
            Vec::with_capacity(self.files.len() + self.dirs.len());
        for (name, dir) in &self.dirs {
            let id = dir.encode(out)?;
            let mut key = name.as_bytes().to_vec();
            key.push(b'/');
            entries.push((key, mode::TREE, name, id));
        }
        for (name, (id, file_mode)) in &self.files {
            // A name that is also a directory: the directory wins, as with a tree builder.
            if !self.dirs.contains_key(name) {
                entries.push((name.as_bytes().to_vec(), *file_mode, name, *id));
            }
        }
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut bytes = Vec::with_capacity(entries.len() * 48);
        for (_, entry_mode, name, id) in &entries {
            bytes.extend_from_slice(format!("{entry_mode:o} {name}\0").as_bytes());
            bytes.extend_from_slice(id.as_bytes());
        }
        let id = Oid::hash_object(ObjectType::Tree, &bytes)?;
        // Identical subtrees repeat here; the pack writer keeps each object once.
        out.push((id, bytes));
        Ok(id)
    }
}

#[cfg(test)]
mod tests {
    use git2::{Signature, Time};

    use super::*;

    fn write_with_treebuilder(node: &DirNode, repo: &Repository) -> Oid {
        let mut builder = repo.treebuilder(None).unwrap();
        for (name, (id, file_mode)) in &node.files {
            builder.insert(name, *id, *file_mode).unwrap();
        }
        for (name, dir) in &node.dirs {
            let id = write_with_treebuilder(dir, repo);
            builder.insert(name, id, mode::TREE).unwrap();
        }
        builder.write().unwrap()
    }

    #[test]
    fn encoded_trees_and_root_commit_match_what_libgit2_writes() {
        let dir = tempfile::TempDir::new().unwrap();
        let repo = Repository::init_bare(dir.path()).unwrap();
        let a = repo.blob(b"a\n").unwrap();
        let b = repo.blob(b"b\n").unwrap();
        let mut root = DirNode::default();
        // Names whose order depends on directories sorting as `name/`.
        for (path, id, file_mode) in [
            ("a.b", a, mode::FILE),
            ("a/x", b, mode::FILE),
            ("a-b/y", a, mode::EXECUTABLE),
            ("a0", b, mode::FILE),
            ("ab/a", a, mode::FILE),
            ("same1/f", a, mode::FILE),
            ("same2/f", a, mode::FILE),
            ("z", b, mode::EXECUTABLE),
        ] {
            root.insert(path, id, file_mode);
        }
        let mut trees = Vec::new();
        let encoded = root.encode(&mut trees).unwrap();
        assert_eq!(encoded, write_with_treebuilder(&root, &repo));
        for (id, bytes) in &trees {
            assert_eq!(repo.find_tree(*id).unwrap().id(), *id);
            assert_eq!(Oid::hash_object(ObjectType::Tree, bytes).unwrap(), *id);
        }
        assert_eq!(
            DirNode::default().encode(&mut Vec::new()).unwrap(),
            repo.treebuilder(None).unwrap().write().unwrap()
        );

        let (commit, bytes) = encode_root_commit(encoded, Role::WorkerA).unwrap();
        let signature = Signature::new(PROJECTOR_NAME, PROJECTOR_EMAIL, &Time::new(0, 0)).unwrap();
        let tree = repo.find_tree(encoded).unwrap();
        let expected = repo
            .commit(
                None,
                &signature,
                &signature,
                "Projection root\n\nProjection-Role: worker-a\n",
                &tree,
                &[],
            )
            .unwrap();
        assert_eq!(commit, expected);
        assert_eq!(
            repo.odb().unwrap().read(expected).unwrap().data(),
            bytes.as_slice()
        );
    }
}
