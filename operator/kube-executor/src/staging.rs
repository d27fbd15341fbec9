//! The staging volume, operator side: one directory per run,
//! `runs/<executor instance>/<run name>/{workspace,task/task.json,out}`, which the sandbox pod
//! mounts by `subPath` (and nothing else of the volume).
//!
//! In: the projection is copied (never linked) after checking that its git
//! metadata cannot reach outside it (no `.git` file, alternates, commondir or
//! remote), and reflogs are scrubbed. Out: `/out` is copied into a
//! control-plane-owned directory outside the volume, regular files and
//! directories only, never following a link the sandbox planted. Then the
//! run's directory is removed.

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt, lchown, symlink},
    path::{Path, PathBuf},
};

use crate::manifest::RUNS_DIR;

/// Why staging failed.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// A filesystem operation failed.
    #[error("failed to {op} {path}")]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The workspace is not a sealed projection.
    #[error("the workspace {path} is not a sealed projection: {why}; export a fresh projection")]
    NotSealed {
        /// The workspace.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// A directory for this run already exists.
    #[error(
        "the staging directory {path} already exists: a run with this id is live or was left behind; wait for it or run collect_garbage"
    )]
    Exists {
        /// The directory.
        path: PathBuf,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StageError + 'a {
    move |source| StageError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Owner to give the parts the sandbox writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// uid.
    pub uid: u32,
    /// gid.
    pub gid: u32,
}

/// One staged run.
#[derive(Clone, Debug)]
pub struct StagedRun {
    /// `runs/<name>`.
    pub root: PathBuf,
    /// `runs/<name>/workspace`.
    pub workspace: PathBuf,
    /// `runs/<name>/out`.
    pub out: PathBuf,
    /// `runs/<name>/task`.
    pub task: PathBuf,
}

/// The directory of executor `instance`'s runs under the staging mount.
pub fn instance_dir(staging: &Path, instance: &str) -> PathBuf {
    staging.join(RUNS_DIR).join(instance)
}

/// Git metadata carrying history or host state, scrubbed from the copy.
const GIT_SCRUB: [&str; 4] = ["logs", "FETCH_HEAD", "ORIG_HEAD", "COMMIT_EDITMSG"];

/// Refuses a workspace whose git metadata reaches outside it.
pub fn check_sealed(workspace: &Path) -> Result<(), StageError> {
    let not_sealed = |why: &str| StageError::NotSealed {
        path: workspace.to_path_buf(),
        why: why.to_owned(),
    };
    let meta = fs::symlink_metadata(workspace).map_err(io_err("inspect", workspace))?;
    if !meta.is_dir() {
        return Err(not_sealed("it is not a directory"));
    }
    let git = workspace.join(".git");
    let Ok(git_meta) = fs::symlink_metadata(&git) else {
        return Ok(());
    };
    if !git_meta.is_dir() {
        return Err(not_sealed(".git is a file or link (a gitdir pointer)"));
    }
    for (p, why) in [
        ("objects/info/alternates", "it has objects/info/alternates"),
        ("commondir", "it has a commondir pointer"),
    ] {
        if fs::symlink_metadata(git.join(p)).is_ok() {
            return Err(not_sealed(why));
        }
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

/// Stages run `name` in `runs` (an [`instance_dir`]): copies `workspace`,
/// writes `task`, creates `out`.
/// Nothing is left behind on failure.
pub fn stage(
    runs: &Path,
    name: &str,
    workspace: &Path,
    task: &serde_json::Value,
    owner: Option<Owner>,
) -> Result<StagedRun, StageError> {
    check_sealed(workspace)?;
    fs::create_dir_all(runs).map_err(io_err("create", runs))?;
    let root = runs.join(name);
    if fs::symlink_metadata(&root).is_ok() {
        return Err(StageError::Exists { path: root });
    }
    mkdir(&root, 0o755)?;
    let run = StagedRun {
        workspace: root.join("workspace"),
        out: root.join("out"),
        task: root.join("task"),
        root,
    };
    match populate(&run, workspace, task, owner) {
        Ok(()) => Ok(run),
        Err(e) => {
            let _ = remove_tree(&run.root);
            Err(e)
        }
    }
}

fn populate(
    run: &StagedRun,
    workspace: &Path,
    task: &serde_json::Value,
    owner: Option<Owner>,
) -> Result<(), StageError> {
    copy_tree(workspace, &run.workspace, owner, true)?;
    let git = run.workspace.join(".git");
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
    mkdir(&run.out, 0o755)?;
    mkdir(&run.task, 0o755)?;
    if let Some(o) = owner {
        lchown(&run.out, Some(o.uid), Some(o.gid)).map_err(io_err("chown", &run.out))?;
    }
    let file = run.task.join("task.json");
    let body = serde_json::to_vec_pretty(task).map_err(|e| StageError::Io {
        op: "serialize the task document",
        path: file.clone(),
        source: io::Error::other(e),
    })?;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(&file)
        .map_err(io_err("create", &file))?;
    f.write_all(&body).map_err(io_err("write", &file))
}

fn mkdir(path: &Path, mode: u32) -> Result<(), StageError> {
    fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(io_err("create directory", path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", path))
}

/// Copies `src` to `dst` (absent) without following symlinks; special files
/// are skipped.
fn copy_tree(src: &Path, dst: &Path, owner: Option<Owner>, top: bool) -> Result<(), StageError> {
    let meta = fs::symlink_metadata(src).map_err(io_err("inspect", src))?;
    let ft = meta.file_type();
    if ft.is_dir() {
        let mode = if top {
            0o755
        } else {
            meta.permissions().mode() & 0o777 | 0o700
        };
        mkdir(dst, mode)?;
        for entry in fs::read_dir(src).map_err(io_err("read directory", src))? {
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

/// Copies the run's `out` into `dst` (absent, created 0755): regular files and
/// directories only; returns the relative paths of what was skipped (links,
/// special files).
pub fn collect_out(src: &Path, dst: &Path) -> Result<Vec<String>, StageError> {
    if let Some(parent) = dst.parent() {
        fs::create_dir_all(parent).map_err(io_err("create", parent))?;
    }
    mkdir(dst, 0o755)?;
    let mut skipped = Vec::new();
    if fs::symlink_metadata(src).is_ok_and(|m| m.is_dir()) {
        collect_into(src, dst, Path::new(""), &mut skipped)?;
    } else {
        skipped.push(".".to_owned());
    }
    Ok(skipped)
}

fn collect_into(
    src: &Path,
    dst: &Path,
    rel: &Path,
    skipped: &mut Vec<String>,
) -> Result<(), StageError> {
    for entry in fs::read_dir(src).map_err(io_err("read", src))? {
        let entry = entry.map_err(io_err("read", src))?;
        let (from, to, rel) = (
            entry.path(),
            dst.join(entry.file_name()),
            rel.join(entry.file_name()),
        );
        let meta = fs::symlink_metadata(&from).map_err(io_err("inspect", &from))?;
        if meta.is_dir() {
            mkdir(&to, 0o755)?;
            collect_into(&from, &to, &rel, skipped)?;
        } else if meta.is_file() {
            // The pod has terminated before collection, so nothing can swap
            // this file for a link between the check above and the open.
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
/// search permission. Absent is fine.
pub fn remove_tree(path: &Path) -> io::Result<()> {
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

/// Names of the run directories present in an instance directory.
pub fn staged_runs(runs: &Path) -> io::Result<Vec<String>> {
    match fs::read_dir(runs) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// The effective uid of this process (owner of `/proc/self`).
pub fn effective_uid() -> Option<u32> {
    fs::metadata("/proc/self").ok().map(|m| m.uid())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(dir: &Path) -> PathBuf {
        let ws = dir.join("projection");
        fs::create_dir_all(ws.join(".git/logs")).unwrap();
        fs::write(ws.join(".git/config"), "[core]\n\tbare = false\n").unwrap();
        fs::write(ws.join(".git/logs/HEAD"), "old history").unwrap();
        fs::write(ws.join("README"), "hello").unwrap();
        ws
    }

    #[test]
    fn staging_copies_scrubs_and_refuses_a_second_stage() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = repo(tmp.path());
        let staging = tmp.path().join("staging");
        let run = stage(&staging, "pb-x", &ws, &serde_json::json!({"a": 1}), None).unwrap();
        assert_eq!(
            fs::read_to_string(run.workspace.join("README")).unwrap(),
            "hello"
        );
        assert!(
            !run.workspace.join(".git/logs").exists(),
            "reflogs scrubbed"
        );
        let task: serde_json::Value =
            serde_json::from_slice(&fs::read(run.task.join("task.json")).unwrap()).unwrap();
        assert_eq!(task, serde_json::json!({"a": 1}));
        assert!(run.out.is_dir());
        assert!(matches!(
            stage(&staging, "pb-x", &ws, &serde_json::json!({}), None),
            Err(StageError::Exists { .. })
        ));
        assert_eq!(staged_runs(&staging).unwrap(), vec!["pb-x".to_owned()]);
    }

    #[test]
    fn a_workspace_with_a_remote_is_refused_and_nothing_is_staged() {
        let tmp = tempfile::tempdir().unwrap();
        let ws = repo(tmp.path());
        fs::write(
            ws.join(".git/config"),
            "[remote \"origin\"]\n\turl = https://example.invalid/x\n",
        )
        .unwrap();
        let staging = tmp.path().join("staging");
        let err = stage(&staging, "pb-y", &ws, &serde_json::json!({}), None).unwrap_err();
        assert!(matches!(err, StageError::NotSealed { .. }), "{err}");
        assert!(staged_runs(&staging).unwrap().is_empty());
    }

    #[test]
    fn collecting_out_skips_links_planted_by_the_sandbox() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        fs::create_dir_all(out.join("sub")).unwrap();
        fs::write(out.join("results.json"), "{}").unwrap();
        fs::write(out.join("sub/x"), "x").unwrap();
        symlink("/etc/passwd", out.join("passwd")).unwrap();
        let dst = tmp.path().join("collected/run");
        let skipped = collect_out(&out, &dst).unwrap();
        assert_eq!(skipped, vec!["passwd".to_owned()]);
        assert_eq!(fs::read_to_string(dst.join("results.json")).unwrap(), "{}");
        assert_eq!(fs::read_to_string(dst.join("sub/x")).unwrap(), "x");
        assert!(!dst.join("passwd").exists());
    }
}
