//! The ephemeral run directory: a fresh copy of the projection (never the
//! control plane's export directory itself), the `/out` folder, and the
//! read-only task document; collected and removed after every run.
//!
//! Layout under the scratch root: `run-<run id>-<nonce>/{workspace,out,task/task.json}`.

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt, lchown, symlink},
    path::{Path, PathBuf},
};

/// Owner to give the writable parts of a run directory (the per-run sandbox uid).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Owner {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// One run's ephemeral directory.
#[derive(Debug)]
pub(crate) struct RunDir {
    pub(crate) root: PathBuf,
    pub(crate) workspace: PathBuf,
    pub(crate) out: PathBuf,
    pub(crate) task_dir: PathBuf,
}

/// Why a run directory could not be prepared.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PrepareError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("the workspace {path} is not a sealed projection: {why}")]
    NotSealed { path: PathBuf, why: String },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PrepareError + 'a {
    move |source| PrepareError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Creates a directory with `mode` (fails if it exists).
fn mkdir(path: &Path, mode: u32) -> Result<(), PrepareError> {
    fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(io_err("create directory", path))?;
    // The umask may have narrowed the mode.
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", path))
}

/// Ensures `path` exists as a directory with exactly `mode`.
pub(crate) fn ensure_dir(path: &Path, mode: u32) -> Result<(), PrepareError> {
    fs::create_dir_all(path).map_err(io_err("create directory", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", path))
}

/// Refuses a workspace whose git metadata would reach outside it: a `.git`
/// file (gitdir link), alternates, or configured remotes (ARCHITECTURE.md §4:
/// own object database, no alternates, no remote).
pub(crate) fn check_sealed(workspace: &Path) -> Result<(), PrepareError> {
    let not_sealed = |why: &str| PrepareError::NotSealed {
        path: workspace.to_path_buf(),
        why: why.to_owned(),
    };
    let meta = fs::symlink_metadata(workspace).map_err(io_err("inspect workspace", workspace))?;
    if !meta.is_dir() {
        return Err(not_sealed("it is not a directory"));
    }
    let git = workspace.join(".git");
    let Ok(git_meta) = fs::symlink_metadata(&git) else {
        return Ok(()); // not a repository: nothing can point outside
    };
    if !git_meta.is_dir() {
        return Err(not_sealed(
            ".git is a file or link (a linked worktree or gitdir pointer)",
        ));
    }
    if fs::symlink_metadata(git.join("objects/info/alternates")).is_ok() {
        return Err(not_sealed("it has objects/info/alternates"));
    }
    if fs::symlink_metadata(git.join("commondir")).is_ok() {
        return Err(not_sealed("it has a commondir pointer"));
    }
    if let Ok(config) = fs::read_to_string(git.join("config"))
        && config
            .lines()
            .any(|l| l.trim_start().to_ascii_lowercase().starts_with("[remote"))
    {
        return Err(not_sealed("it has a configured remote"));
    }
    Ok(())
}

/// Git metadata that carries history or host state and is scrubbed from the copy.
const GIT_SCRUB: [&str; 4] = ["logs", "FETCH_HEAD", "ORIG_HEAD", "COMMIT_EDITMSG"];

impl RunDir {
    /// Creates `<scratch_root>/run-<name>` with a copy of `source`, an empty
    /// `out`, and `task/task.json`. Writable parts belong to `owner`.
    pub(crate) fn create(
        scratch_root: &Path,
        name: &str,
        source: &Path,
        task: &serde_json::Value,
        owner: Option<Owner>,
    ) -> Result<RunDir, PrepareError> {
        check_sealed(source)?;
        let root = scratch_root.join(format!("run-{name}"));
        mkdir(&root, 0o711)?;
        let dir = RunDir {
            workspace: root.join("workspace"),
            out: root.join("out"),
            task_dir: root.join("task"),
            root,
        };
        let built = dir.populate(source, task, owner);
        if let Err(e) = built {
            // Best effort: never leave a half-built copy behind.
            let _ = remove_tree(&dir.root);
            return Err(e);
        }
        Ok(dir)
    }

    fn populate(
        &self,
        source: &Path,
        task: &serde_json::Value,
        owner: Option<Owner>,
    ) -> Result<(), PrepareError> {
        copy_tree(source, &self.workspace, owner, true)?;
        let git = self.workspace.join(".git");
        for name in GIT_SCRUB {
            let p = git.join(name);
            if let Ok(m) = fs::symlink_metadata(&p) {
                if m.is_dir() {
                    remove_tree(&p)
                } else {
                    fs::remove_file(&p)
                }
                .map_err(io_err("scrub git metadata", &p))?;
            }
        }
        mkdir(&self.out, 0o700)?;
        mkdir(&self.task_dir, 0o755)?;
        if let Some(o) = owner {
            for p in [&self.workspace, &self.out] {
                lchown(p, Some(o.uid), Some(o.gid)).map_err(io_err("chown", p))?;
            }
        }
        let task_file = self.task_dir.join("task.json");
        let body = serde_json::to_vec_pretty(task).map_err(|e| PrepareError::Io {
            op: "serialize task document",
            path: task_file.clone(),
            source: io::Error::other(e),
        })?;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&task_file)
            .map_err(io_err("create", &task_file))?;
        f.write_all(&body).map_err(io_err("write", &task_file))?;
        Ok(())
    }
}

impl Drop for RunDir {
    /// The fallback when a run future is dropped mid-run (its explicit,
    /// checked removal never ran): remove the ephemeral directory anyway.
    fn drop(&mut self) {
        if let Err(e) = remove_tree(&self.root) {
            tracing::error!(path = %self.root.display(), "removing an ephemeral run directory failed: {e}");
        }
    }
}

/// Copies `src` to `dst` (which must not exist) without following symlinks:
/// directories, regular files (with their permission bits) and symlinks are
/// copied; sockets, fifos and devices are skipped. `top` marks the root call.
fn copy_tree(src: &Path, dst: &Path, owner: Option<Owner>, top: bool) -> Result<(), PrepareError> {
    let meta = fs::symlink_metadata(src).map_err(io_err("inspect", src))?;
    let ft = meta.file_type();
    if ft.is_dir() {
        let mode = if top {
            0o700
        } else {
            meta.permissions().mode() & 0o777 | 0o700
        };
        mkdir(dst, mode)?;
        let entries = fs::read_dir(src).map_err(io_err("read directory", src))?;
        for entry in entries {
            let entry = entry.map_err(io_err("read directory", src))?;
            copy_tree(&entry.path(), &dst.join(entry.file_name()), owner, false)?;
        }
    } else if ft.is_file() {
        let mut from = fs::File::open(src).map_err(io_err("open", src))?;
        let mut to = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(meta.permissions().mode() & 0o777 | 0o600)
            .open(dst)
            .map_err(io_err("create", dst))?;
        io::copy(&mut from, &mut to).map_err(io_err("copy", src))?;
    } else if ft.is_symlink() {
        let target = fs::read_link(src).map_err(io_err("read link", src))?;
        symlink(&target, dst).map_err(io_err("create symlink", dst))?;
    } else {
        return Ok(());
    }
    if let Some(o) = owner {
        lchown(dst, Some(o.uid), Some(o.gid)).map_err(io_err("chown", dst))?;
    }
    Ok(())
}

/// Copies the sandbox's `/out` into the control-plane-owned `dst`: regular
/// files and directories only (new files owned by the control plane, modes
/// 0644/0755). Symlinks and special files are not collected; their relative
/// paths are returned.
pub(crate) fn collect_out(src: &Path, dst: &Path) -> Result<Vec<String>, PrepareError> {
    let mut skipped = Vec::new();
    mkdir(dst, 0o755)?;
    collect_into(src, dst, Path::new(""), &mut skipped)?;
    Ok(skipped)
}

fn collect_into(
    src: &Path,
    dst: &Path,
    rel: &Path,
    skipped: &mut Vec<String>,
) -> Result<(), PrepareError> {
    let entries = fs::read_dir(src).map_err(io_err("read /out directory", src))?;
    for entry in entries {
        let entry = entry.map_err(io_err("read /out directory", src))?;
        let from = entry.path();
        let to = dst.join(entry.file_name());
        let rel = rel.join(entry.file_name());
        let meta = fs::symlink_metadata(&from).map_err(io_err("inspect", &from))?;
        let ft = meta.file_type();
        if ft.is_dir() {
            mkdir(&to, 0o755)?;
            collect_into(&from, &to, &rel, skipped)?;
        } else if ft.is_file() {
            let mut r = fs::File::open(&from).map_err(io_err("open", &from))?;
            let mut w = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o644)
                .open(&to)
                .map_err(io_err("create", &to))?;
            io::copy(&mut r, &mut w).map_err(io_err("copy", &from))?;
        } else {
            skipped.push(rel.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

/// Removes a tree even when the sandbox left directories without write or
/// search permission.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            open_up(path);
            fs::remove_dir_all(path)
        }
    }
}

fn open_up(path: &Path) {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    if meta.is_dir() {
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(0o700));
        if let Ok(entries) = fs::read_dir(path) {
            for e in entries.flatten() {
                open_up(&e.path());
            }
        }
    }
}
