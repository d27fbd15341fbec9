//! The ephemeral run directory: a fresh copy of the projection (never the
//! control plane's export directory itself), the `/out` folder, and the
//! read-only task document; collected and removed after every run.
//!
//! Layout under the scratch root: `run-<run id>-<nonce>/{workspace,out,task/task.json}`.

use std::{
    io,
    path::{Path, PathBuf},
};

use crate::tree::{self, SealError, TreeError};
pub(crate) use crate::tree::{Owner, remove_tree};

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

impl From<TreeError> for PrepareError {
    fn from(e: TreeError) -> Self {
        PrepareError::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        }
    }
}

/// Ensures `path` exists as a directory with exactly `mode`.
pub(crate) fn ensure_dir(path: &Path, mode: u32) -> Result<(), PrepareError> {
    Ok(tree::ensure_dir(path, mode)?)
}

/// Refuses a workspace whose git metadata would reach outside it
/// ([`tree::check_sealed`]).
pub(crate) fn check_sealed(workspace: &Path) -> Result<(), PrepareError> {
    tree::check_sealed(workspace).map_err(|e| match e {
        SealError::Io(e) => e.into(),
        SealError::NotSealed(why) => PrepareError::NotSealed {
            path: workspace.to_path_buf(),
            why: why.to_string(),
        },
    })
}

/// Copies the sandbox's `/out` into the control-plane-owned `dst`
/// ([`tree::collect_out`]); returns the relative paths of what was skipped.
pub(crate) fn collect_out(src: &Path, dst: &Path) -> Result<Vec<String>, PrepareError> {
    Ok(tree::collect_out(src, dst)?)
}

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
        tree::mkdir(&root, 0o711)?;
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
        tree::copy_tree(source, &self.workspace, 0o700, owner)?;
        tree::scrub_git(&self.workspace)?;
        tree::mkdir(&self.out, 0o700)?;
        tree::mkdir(&self.task_dir, 0o755)?;
        if let Some(o) = owner {
            for p in [&self.workspace, &self.out] {
                o.apply(p)?;
            }
        }
        let task_file = self.task_dir.join("task.json");
        let body = serde_json::to_vec_pretty(task).map_err(|e| PrepareError::Io {
            op: "serialize task document",
            path: task_file.clone(),
            source: io::Error::other(e),
        })?;
        Ok(tree::write_new_file(&task_file, 0o444, &body)?)
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
