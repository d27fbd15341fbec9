//! Read-only entry points for other crates (the Job Site materializer):
//! open a project from a working tree or from a commit (through libgit2, no
//! checkout), validated exactly as `ears-manager` reads are (whole project,
//! drafts allowed). Writes stay with the CLI.

use std::path::Path;

use crate::{
    cli::session::Session,
    fsio::Faults,
    git::{Git, Lookup},
    ids,
    outcome::{self, Exit, Failure},
    snapshot::{self, Snapshot},
    validate::{self, Scope},
};

/// Loads and validates the project of the working tree containing `path`.
pub fn open_worktree(path: &Path) -> Result<Snapshot, Failure> {
    let session = Session::open(path, Faults::default())?;
    session.validate_for_read()?;
    Ok(session.snap)
}

/// Loads and validates the project as of `commit` (full 40-hex) in the
/// repository containing `path`. The working tree is irrelevant.
pub fn open_commit(path: &Path, commit: &str) -> Result<Snapshot, Failure> {
    if !ids::is_full_sha(commit) {
        return Err(Failure::new(
            Exit::Validation,
            "revision.invalid",
            "The commit must be a full 40-hex commit ID.",
        ));
    }
    let git = Git::discover(path)?;
    let Lookup::Commit(oid) = git.lookup(commit) else {
        return Err(Failure::new(
            Exit::Validation,
            "revision.not_found",
            "The commit does not exist in this repository.",
        ));
    };
    let vfs = git.commit_vfs(oid)?;
    let snap = snapshot::open(vfs)?;
    match outcome::wrap(validate::validate(&snap, &Scope::default()), true) {
        Some(f) => Err(f),
        None => Ok(snap),
    }
}
