//! Working-tree I/O at the edge: reading governed files into a [`Vfs`]
//! (refusing symlink components), and atomic multi-file transactions
//! (same-directory temp file, fsync, rename; rollback in reverse order on any
//! failure, §23).

use std::{
    collections::BTreeMap,
    fs,
    io::{self, Read, Write},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use crate::{
    diag::Diagnostic,
    model::StoreKind,
    outcome::{Exit, Failure},
    snapshot,
    vfs::{DirState, FileState, PROJECT_YAML, PROJECTION_YAML, Vfs},
};

/// Whether any existing component of `rel` under `root` is a symlink.
fn has_symlink_component(root: &Path, rel: &str) -> bool {
    let mut cur = root.to_path_buf();
    for part in rel.split('/') {
        cur.push(part);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
    false
}

/// Reads one governed file.
pub fn read_file(root: &Path, rel: &str) -> FileState {
    if has_symlink_component(root, rel) {
        return FileState::Symlink;
    }
    let path = root.join(rel);
    match fs::symlink_metadata(&path) {
        Err(e)
            if e.kind() == io::ErrorKind::NotFound || e.kind() == io::ErrorKind::NotADirectory =>
        {
            FileState::Absent
        }
        Err(_) => FileState::Unreadable,
        Ok(m) if !m.is_file() => FileState::NotRegular,
        Ok(_) => fs::read(&path).map_or(FileState::Unreadable, FileState::Bytes),
    }
}

/// Reads a directory entry the listing showed as a regular file. What is
/// opened must still be a regular file (a directory or device swapped in
/// after the listing reads as `NotRegular`); like the previous
/// `symlink_metadata` + `read`, a symlink swapped in between is followed.
fn read_regular(path: &Path) -> FileState {
    let mut file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return FileState::Absent,
        Err(_) => return FileState::Unreadable,
    };
    let len = match file.metadata() {
        Ok(m) if m.is_file() => m.len(),
        Ok(_) => return FileState::NotRegular,
        Err(_) => return FileState::Unreadable,
    };
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0).saturating_add(1));
    match file.read_to_end(&mut bytes) {
        Ok(_) => FileState::Bytes(bytes),
        Err(_) => FileState::Unreadable,
    }
}

/// Lists one store directory (dot-files excluded).
pub fn read_dir(root: &Path, rel: &str) -> DirState {
    if has_symlink_component(root, rel) {
        return DirState::Symlink;
    }
    let path = root.join(rel);
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return DirState::Absent,
        Err(_) => return DirState::Unreadable,
        Ok(m) if !m.is_dir() => return DirState::NotDir,
        Ok(_) => {}
    }
    let Ok(iter) = fs::read_dir(&path) else {
        return DirState::Unreadable;
    };
    // List first (names and entry types), then read the regular files.
    let mut listed: Vec<(String, Option<PathBuf>, FileState)> = Vec::new();
    for entry in iter {
        let Ok(entry) = entry else {
            return DirState::Unreadable;
        };
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            return DirState::Unreadable;
        };
        if name.starts_with('.') {
            continue;
        }
        // The directory's own components were checked above, so only the
        // entry itself can be a symlink: its type comes with the listing
        // (no extra syscall on Linux), and the opened file is checked again.
        let state = match entry.file_type() {
            Ok(t) if t.is_symlink() => FileState::Symlink,
            Ok(t) if !t.is_file() => FileState::NotRegular,
            Ok(_) => {
                listed.push((name, Some(entry.path()), FileState::Absent));
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => FileState::Absent,
            Err(_) => FileState::Unreadable,
        };
        listed.push((name, None, state));
    }
    // Large stores are read on a few threads (the page cache serves most of
    // it, so this is CPU-bound in the kernel).
    let read: Vec<Option<FileState>> = crate::par::map(&listed, 512, 4, |(_, path, _)| {
        path.as_deref().map(read_regular)
    });
    for (entry, state) in listed.iter_mut().zip(read) {
        if let Some(state) = state {
            entry.2 = state;
        }
    }
    let entries: BTreeMap<String, FileState> = listed
        .into_iter()
        .map(|(name, _, state)| (name, state))
        .collect();
    DirState::Listing(entries)
}

/// Reads every governed file of the project rooted at `root`.
pub fn load_vfs(root: &Path) -> Result<Vfs, Failure> {
    // Readers share the project lock, so a load never sees another writer's half-finished
    // transaction (a record written, its manifest or digests not yet).
    let _shared = StoreLock::shared(root, LOCK_WAIT)?;
    load_vfs_unlocked(root)
}

fn load_vfs_unlocked(root: &Path) -> Result<Vfs, Failure> {
    let protobot = root.join(".protobot");
    let protobot_is_dir = match fs::symlink_metadata(&protobot) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(Failure::new(
                Exit::Project,
                "project.not_initialized",
                "This repository has no .protobot/project.yaml; run 'ears-manager project init' first.",
            ));
        }
        Err(_) => {
            return Err(Failure::new(
                Exit::Io,
                "project.configuration_unreadable",
                "The .protobot directory cannot be inspected; check its permissions.",
            ));
        }
        Ok(m) if m.file_type().is_symlink() => false,
        Ok(m) if !m.is_dir() => {
            return Err(Failure::new(
                Exit::Io,
                "project.configuration_unreadable",
                ".protobot is not a directory; move it aside and restore the project.",
            ));
        }
        Ok(_) => true,
    };
    if !protobot_is_dir {
        return Err(Failure::new(
            Exit::Project,
            "project.invalid_configuration",
            "The project configuration is not valid.",
        )
        .with_diagnostics(vec![
            Diagnostic::new(
                "project.invalid_path",
                ".protobot must be a real directory, not a symlink.",
            )
            .at(".protobot"),
        ]));
    }
    let project_yaml = read_file(root, PROJECT_YAML);
    if project_yaml == FileState::Absent {
        return Err(Failure::new(
            Exit::Project,
            "project.not_initialized",
            "This repository has no .protobot/project.yaml; run 'ears-manager project init' first.",
        ));
    }
    let mut vfs = Vfs {
        protobot_is_dir,
        project_yaml,
        projection_yaml: read_file(root, PROJECTION_YAML),
        stores: BTreeMap::new(),
        artifacts: BTreeMap::new(),
    };
    if let Ok(project) = snapshot::decode_project(&vfs.project_yaml) {
        for kind in StoreKind::ALL {
            let dir = project.store_dir(kind);
            if crate::rules::is_canonical_path(&dir) {
                let state = read_dir(root, &dir);
                vfs.stores.insert(dir, state);
            }
        }
        for a in &project.artifacts {
            if crate::rules::is_canonical_path(&a.path) {
                vfs.artifacts
                    .insert(a.path.clone(), read_file(root, &a.path));
            }
        }
    }
    Ok(vfs)
}

/// Where a transaction should fail on purpose (fault-injection tests).
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Fail just before this write step (0-based: each file write is a step,
    /// and `writes.len()` is the post-write check).
    pub fail_before_step: Option<usize>,
    /// Make the rollback fail too (to provoke `storage.write_unknown`).
    pub fail_rollback: bool,
    /// Make restoring the original branch after a failed `change-set
    /// create` unconfirmable (to provoke `git.write_unknown`).
    pub fail_branch_restore: bool,
}

/// One step of a rollback. Each names the bytes this transaction wrote, so a rollback only
/// restores a file that still holds them: it undoes its own change, never another writer's.
enum Undo {
    Restore {
        path: PathBuf,
        bytes: Vec<u8>,
        perms: fs::Permissions,
        written: Vec<u8>,
    },
    Delete {
        path: PathBuf,
        written: Vec<u8>,
    },
    RemoveDir(PathBuf),
}

/// How long a write waits for another writer's lock before giving up.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// The project's write lock: an advisory `flock` on a lock file in the Git directory (or,
/// without one, beside `.protobot`). The kernel drops it when the process ends, so a killed
/// writer never leaves a stale lock.
pub struct StoreLock {
    _file: Option<fs::File>,
    exclusive: bool,
}

thread_local! {
    /// Whether this thread holds a project's exclusive lock (its post-write reload must not
    /// wait for itself).
    static HOLDS_LOCK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Drop for StoreLock {
    fn drop(&mut self) {
        if self.exclusive {
            HOLDS_LOCK.with(|h| h.set(false));
        }
    }
}

impl StoreLock {
    /// A shared lock for reading (best effort: without a writable lock file, reads go
    /// unlocked; inside this thread's own write, no second lock is taken).
    pub fn shared(root: &Path, wait: std::time::Duration) -> Result<Self, Failure> {
        let none = Self {
            _file: None,
            exclusive: false,
        };
        if HOLDS_LOCK.with(std::cell::Cell::get) {
            return Ok(none);
        }
        let Ok(file) = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(Self::path(root))
        else {
            return Ok(none);
        };
        match lock_within(file, true, wait) {
            Ok(Some(file)) => Ok(Self {
                _file: Some(file),
                exclusive: false,
            }),
            Ok(None) => Err(held_too_long(wait)),
            Err(_) => Ok(none),
        }
    }

    /// The lock file of the project at `root`.
    pub fn path(root: &Path) -> PathBuf {
        let git = root.join(".git");
        match fs::symlink_metadata(&git) {
            Ok(m) if m.is_dir() => git.join("ears-manager.lock"),
            _ => root.join(".ears-manager.lock"),
        }
    }

    /// Takes the lock, waiting at most `wait` for another writer to finish.
    pub fn acquire(root: &Path, wait: std::time::Duration) -> Result<Self, Failure> {
        let path = Self::path(root);
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| {
                write_failed(&format!(
                    "The project lock could not be opened ({})",
                    e.kind()
                ))
            })?;
        match lock_within(file, false, wait) {
            Ok(Some(file)) => {
                HOLDS_LOCK.with(|h| h.set(true));
                Ok(Self {
                    _file: Some(file),
                    exclusive: true,
                })
            }
            Ok(None) => Err(held_too_long(wait)),
            Err(e) => Err(write_failed(&format!(
                "The project lock could not be taken ({})",
                e.kind()
            ))),
        }
    }
}

fn held_too_long(wait: std::time::Duration) -> Failure {
    Failure::new(
        Exit::Conflict,
        "change_set.concurrent_update",
        format!(
            "Another ears-manager write held the project lock for {} s; rerun the command when it has finished.",
            wait.as_secs()
        ),
    )
}

/// Locks `file` (shared or exclusive), waiting at most `wait`; `None` when the wait ran out.
/// The blocking `flock` runs on a helper thread; if the wait runs out first, that thread
/// drops the file (and with it the lock) as soon as it gets it.
fn lock_within(
    file: fs::File,
    shared: bool,
    wait: std::time::Duration,
) -> io::Result<Option<fs::File>> {
    let now = if shared {
        file.try_lock_shared()
    } else {
        file.try_lock()
    };
    match now {
        Ok(()) => return Ok(Some(file)),
        Err(fs::TryLockError::WouldBlock) => {}
        Err(fs::TryLockError::Error(e)) => return Err(e),
    }
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let locked = if shared {
            file.lock_shared()
        } else {
            file.lock()
        };
        let _ = sender.send(locked.map(|()| file));
    });
    match receiver.recv_timeout(wait) {
        Ok(Ok(file)) => Ok(Some(file)),
        Ok(Err(e)) => Err(e),
        Err(_) => Ok(None),
    }
}

/// Refuses a write over a store whose recorded digest does not match its content (a
/// direct edit): recomputing the digests would re-seal the edit (§17 Writes, §23.3).
fn verify_recorded_digests(observed: &Vfs) -> Result<(), Failure> {
    match crate::outcome::wrap(direct_edit_diagnostics(observed), false) {
        None => Ok(()),
        Some(failure) => Err(failure),
    }
}

/// One `project.store_digest_mismatch` per store whose recorded digest does not match
/// its content in `observed` (the state a command read): a direct edit. A write stages
/// new digests, so its staged validation cannot see this; the write reports these
/// together with its own diagnostics, in one pass.
pub fn direct_edit_diagnostics(observed: &Vfs) -> Vec<Diagnostic> {
    if !matches!(observed.project_yaml, FileState::Bytes(_)) {
        return Vec::new();
    }
    // An undecodable project is reported by the staged validation.
    let Ok(snap) = snapshot::open(observed.clone()) else {
        return Vec::new();
    };
    let mut diags = Vec::new();
    for kind in StoreKind::ALL {
        let recorded = snap
            .project
            .store_digests
            .as_ref()
            .and_then(|s| s.get(kind));
        let computed = snap.digests.get(&kind).cloned().flatten();
        if let (Some(recorded), Some(computed)) = (recorded, computed)
            && crate::digest::is_digest(recorded)
            && *recorded != computed
        {
            diags.push(
                Diagnostic::new(
                    "project.store_digest_mismatch",
                    "The store content does not match its recorded digest.",
                )
                .at(PROJECT_YAML)
                .field(format!("store_digests.{}", kind.key()))
                .hint("Undo direct edits to the store or make them through ears-manager."),
            );
        }
    }
    diags
}

static SEQ: AtomicU64 = AtomicU64::new(0);

fn write_failed(message: &str) -> Failure {
    Failure::new(
        Exit::Io,
        "storage.write_failed",
        format!("{message}; nothing was changed. Check disk space and permissions, then retry."),
    )
}

fn write_not_allowed(rel: &str) -> Failure {
    Failure::new(
        Exit::Validation,
        "storage.write_not_allowed",
        "A write target is not a regular file inside the project.",
    )
    .with_diagnostics(vec![
        Diagnostic::new(
            "storage.write_not_allowed",
            "The write target goes through a symlink or is not a regular file.",
        )
        .at(rel)
        .hint("Replace the symlink or special file with a regular file, or choose another path."),
    ])
}

fn replace_file(path: &Path, bytes: &[u8], perms: Option<&fs::Permissions>) -> io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("no parent directory"))?;
    let tmp = dir.join(format!(
        ".ears-manager-txn-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(bytes)?;
        if let Some(p) = perms {
            f.set_permissions(p.clone())?;
        }
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        if let Ok(d) = fs::File::open(dir) {
            // Directory fsync is best effort: not every platform supports it.
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Writes all files or none. `observed` is the state the command read; any
/// target that changed since is a `change_set.concurrent_update`.
/// `post_check` runs after the last write; its failure rolls back too.
pub fn commit(
    root: &Path,
    writes: &[(String, Vec<u8>)],
    observed: &Vfs,
    faults: Faults,
    post_check: impl FnOnce() -> Result<(), Failure>,
) -> Result<(), Failure> {
    // One writer at a time: the checks below and the writes, post-check and rollback after
    // them all happen under the project's lock, so a concurrent writer either sees this
    // write complete or fails its own check (`change_set.concurrent_update`).
    let _lock = StoreLock::acquire(root, LOCK_WAIT)?;
    for (rel, _) in writes {
        if has_symlink_component(root, rel) {
            return Err(write_not_allowed(rel));
        }
        let now = read_file(root, rel);
        if matches!(now, FileState::NotRegular | FileState::Symlink) {
            return Err(write_not_allowed(rel));
        }
        let before = observed.get(rel);
        let same = match (&before, &now) {
            (FileState::Bytes(a), FileState::Bytes(b)) => a == b,
            (FileState::Absent, FileState::Absent) => true,
            _ => false,
        };
        if !same {
            return Err(Failure::new(
                Exit::Conflict,
                "change_set.concurrent_update",
                "A governed file changed while the command ran; rerun the command.",
            ));
        }
    }
    // The observed state is what is on disk now (every target was checked above, and
    // `project.yaml`, which records the digests, is a target of every governed write): a
    // digest mismatch in it is a direct edit, not another writer's half-finished write.
    verify_recorded_digests(observed)?;
    let mut undo: Vec<Undo> = Vec::new();
    let mut outcome = Ok(());
    for (step, (rel, bytes)) in writes.iter().enumerate() {
        if faults.fail_before_step == Some(step) {
            outcome = Err(write_failed("An injected fault interrupted the write"));
            break;
        }
        let path = root.join(rel);
        if let Err(e) = apply_one(root, rel, &path, bytes, &mut undo) {
            outcome = Err(write_failed(&format!(
                "A file could not be written ({})",
                e.kind()
            )));
            break;
        }
    }
    if outcome.is_ok() {
        outcome = if faults.fail_before_step == Some(writes.len()) {
            Err(Failure::new(
                Exit::Io,
                "storage.post_write_failed",
                "An injected fault failed the post-write check; nothing was changed.",
            ))
        } else {
            post_check()
        };
    }
    match outcome {
        Ok(()) => Ok(()),
        Err(failure) => match if faults.fail_rollback { Err(io::Error::other("injected")) } else { rollback(undo) } {
            Ok(()) => Err(failure),
            Err(_) => Err(Failure::new(
                Exit::Io,
                "storage.write_unknown",
                "A write failed and the rollback could not be confirmed; inspect the tree with 'check' before retrying.",
            )
            .unknown()),
        },
    }
}

fn apply_one(
    root: &Path,
    rel: &str,
    path: &Path,
    bytes: &[u8],
    undo: &mut Vec<Undo>,
) -> io::Result<()> {
    // Create missing parent directories one by one, recording each.
    let mut cur = root.to_path_buf();
    let parts: Vec<&str> = rel.split('/').collect();
    for part in &parts[..parts.len().saturating_sub(1)] {
        cur.push(part);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(io::Error::other("a parent is not a directory")),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&cur)?;
                undo.push(Undo::RemoveDir(cur.clone()));
            }
            Err(e) => return Err(e),
        }
    }
    match fs::symlink_metadata(path) {
        Ok(m) => {
            let original = fs::read(path)?;
            let perms = m.permissions();
            replace_file(path, bytes, Some(&perms))?;
            undo.push(Undo::Restore {
                path: path.to_path_buf(),
                bytes: original,
                perms,
                written: bytes.to_vec(),
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            replace_file(path, bytes, None)?;
            undo.push(Undo::Delete {
                path: path.to_path_buf(),
                written: bytes.to_vec(),
            });
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

fn rollback(undo: Vec<Undo>) -> io::Result<()> {
    // A file that no longer holds what this transaction wrote was changed by someone else:
    // leave it, and report the rollback as unconfirmed.
    let ours = |path: &Path, written: &[u8]| -> io::Result<()> {
        match fs::read(path) {
            Ok(now) if now == written => Ok(()),
            Ok(_) => Err(io::Error::other("changed by another writer")),
            Err(e) => Err(e),
        }
    };
    let mut result = Ok(());
    for step in undo.into_iter().rev() {
        let r = match step {
            Undo::Restore {
                path,
                bytes,
                perms,
                written,
            } => ours(&path, &written).and_then(|()| replace_file(&path, &bytes, Some(&perms))),
            Undo::Delete { path, written } => {
                ours(&path, &written).and_then(|()| fs::remove_file(path))
            }
            Undo::RemoveDir(path) => fs::remove_dir(path),
        };
        if r.is_err() {
            result = r;
        }
    }
    result
}
