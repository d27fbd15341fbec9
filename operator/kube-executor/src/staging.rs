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
    fs, io,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use protobot_executors::tree::{self, SealError, TreeError, Unsealed};
pub use protobot_executors::tree::{Owner, remove_tree};

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

impl From<TreeError> for StageError {
    fn from(e: TreeError) -> Self {
        StageError::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
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

/// Refuses a workspace whose git metadata reaches outside it
/// ([`tree::check_sealed`]).
pub fn check_sealed(workspace: &Path) -> Result<(), StageError> {
    tree::check_sealed(workspace).map_err(|e| match e {
        SealError::Io(e) => StageError::Io {
            op: "inspect",
            path: e.path,
            source: e.source,
        },
        SealError::NotSealed(why) => StageError::NotSealed {
            path: workspace.to_path_buf(),
            why: match why {
                Unsealed::GitLink => ".git is a file or link (a gitdir pointer)".to_owned(),
                why => why.to_string(),
            },
        },
    })
}

/// Stages run `name` in `runs` (an [`instance_dir`]): copies `workspace`,
/// writes `task` (and the run's egress session token, if it has one, as
/// [`crate::manifest::EGRESS_TOKEN_FILE`] beside it), creates `out`.
/// Nothing is left behind on failure.
pub fn stage(
    runs: &Path,
    name: &str,
    workspace: &Path,
    task: &serde_json::Value,
    egress_token: Option<&str>,
    owner: Option<Owner>,
) -> Result<StagedRun, StageError> {
    check_sealed(workspace)?;
    fs::create_dir_all(runs).map_err(io_err("create", runs))?;
    let root = runs.join(name);
    if fs::symlink_metadata(&root).is_ok() {
        return Err(StageError::Exists { path: root });
    }
    tree::mkdir(&root, 0o755)?;
    let run = StagedRun {
        workspace: root.join("workspace"),
        out: root.join("out"),
        task: root.join("task"),
        root,
    };
    match populate(&run, workspace, task, egress_token, owner) {
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
    egress_token: Option<&str>,
    owner: Option<Owner>,
) -> Result<(), StageError> {
    tree::copy_tree(workspace, &run.workspace, 0o755, owner)?;
    tree::scrub_git(&run.workspace)?;
    tree::mkdir(&run.out, 0o755)?;
    tree::mkdir(&run.task, 0o755)?;
    if let Some(o) = owner {
        o.apply(&run.out)?;
    }
    let file = run.task.join("task.json");
    let body = serde_json::to_vec_pretty(task).map_err(|e| StageError::Io {
        op: "serialize the task document",
        path: file.clone(),
        source: io::Error::other(e),
    })?;
    tree::write_new_file(&file, 0o444, &body)?;
    if let Some(token) = egress_token {
        let file = run.task.join(crate::manifest::EGRESS_TOKEN_FILE);
        tree::write_new_file(&file, 0o444, token.as_bytes())?;
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
    tree::mkdir(dst, 0o755)?;
    let mut skipped = Vec::new();
    if fs::symlink_metadata(src).is_ok_and(|m| m.is_dir()) {
        tree::collect_into(src, dst, Path::new(""), &mut skipped)?;
    } else {
        skipped.push(".".to_owned());
    }
    Ok(skipped)
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
    use std::os::unix::fs::symlink;

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
        let run = stage(
            &staging,
            "pb-x",
            &ws,
            &serde_json::json!({"a": 1}),
            Some("pbs1.t"),
            None,
        )
        .unwrap();
        assert_eq!(
            fs::read_to_string(run.workspace.join("README")).unwrap(),
            "hello"
        );
        assert!(
            !run.workspace.join(".git/logs").exists(),
            "reflogs scrubbed"
        );
        assert_eq!(
            fs::read_to_string(run.task.join(crate::manifest::EGRESS_TOKEN_FILE)).unwrap(),
            "pbs1.t",
            "the egress token is staged beside the task"
        );
        let task: serde_json::Value =
            serde_json::from_slice(&fs::read(run.task.join("task.json")).unwrap()).unwrap();
        assert_eq!(task, serde_json::json!({"a": 1}));
        assert!(run.out.is_dir());
        assert!(matches!(
            stage(&staging, "pb-x", &ws, &serde_json::json!({}), None, None),
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
        let err = stage(&staging, "pb-y", &ws, &serde_json::json!({}), None, None).unwrap_err();
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
