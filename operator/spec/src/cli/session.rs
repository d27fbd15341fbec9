//! The shared shell of every command: open the project, validate it, apply
//! the approval and ancestry preconditions (§18, §19), stage writes in memory
//! with recomputed store digests, validate the staged project, and commit
//! atomically with a post-write reload (§23).

use std::{collections::BTreeSet, path::Path, sync::Arc};

use git2::Oid;

use crate::{
    diag::Diagnostic,
    fsio::{self, Faults},
    git::{Git, Lookup},
    ids,
    model::{ChangeSet, Project, StoreKind, StoreTriple},
    outcome::{self, Exit, Failure},
    snapshot::{self, Snapshot},
    validate::{self, Scope},
    vfs::{PROJECT_YAML, PROJECTION_YAML, Vfs},
    yaml,
};

/// Files to write, in write order.
pub type Writes = Vec<(String, Vec<u8>)>;

/// An opened project.
pub struct Session {
    /// Repository and root.
    pub git: Git,
    /// Files as read (the same files the snapshot decoded).
    pub vfs: Arc<Vfs>,
    /// Decoded records.
    pub snap: Snapshot,
    /// HEAD when the files were read.
    pub head: Option<Oid>,
    /// Fault injection for tests.
    pub faults: Faults,
}

/// Writes to stage: files in mutation order, the new configuration, and an
/// optional new projection manifest.
pub struct Staged {
    /// Content and record files, in write order (manifest last).
    pub writes: Vec<(String, Vec<u8>)>,
    /// The configuration to write (store digests are filled in).
    pub project: Project,
    /// New projection manifest text, when needed.
    pub projection: Option<Vec<u8>>,
}

impl Session {
    /// Resolves the root and loads the project.
    pub fn open(cwd: &Path, faults: Faults) -> Result<Session, Failure> {
        let git = Git::discover(cwd)?;
        Self::load(git, faults)
    }

    /// Loads (or reloads) the project of an opened repository.
    pub fn load(git: Git, faults: Faults) -> Result<Session, Failure> {
        let head = git.head();
        let vfs = Arc::new(fsio::load_vfs(&git.root)?);
        let snap = snapshot::open(Arc::clone(&vfs))?;
        Ok(Session {
            git,
            vfs,
            snap,
            head,
            faults,
        })
    }

    /// Read-path validation: drafts allowed, no change set proposed.
    pub fn validate_for_read(&self) -> Result<(), Failure> {
        match outcome::wrap(validate::validate(&self.snap, &Scope::default()), true) {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }

    /// Whether a change-set manifest is approved (§18).
    pub fn is_approved(&self, manifest_path: &str, refs: &[Oid]) -> Result<bool, Failure> {
        for r in refs {
            if self.git.path_in_commit(*r, manifest_path)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// IDs of every proposed change set.
    pub fn proposed(&self) -> Result<BTreeSet<String>, Failure> {
        let refs = self.git.approval_refs(&self.snap.project)?;
        proposed_by_refs(&self.git, &self.snap, &refs)
    }

    /// The change set a write targets, after the approval and ancestry
    /// preconditions of §18–§19.
    pub fn writable_change_set(&self, id: &str) -> Result<ChangeSet, Failure> {
        let Some(rec) = self.snap.change_set(id) else {
            return Err(Failure::new(
                Exit::Validation,
                "change_set.not_proposed",
                format!("Change set {id} was not found; create it first."),
            ));
        };
        let refs = self.git.approval_refs(&self.snap.project)?;
        if self.is_approved(&rec.path, &refs)? {
            return Err(Failure::new(
                Exit::Conflict,
                "change_set.not_proposed",
                format!("Change set {id} is already approved; start a new change set."),
            ));
        }
        let cs = rec.record.clone();
        if cs.base_commit.is_empty() {
            return Err(Failure::new(
                Exit::Validation,
                "change_set.not_proposed",
                format!("Change set {id} has no base commit."),
            ));
        }
        let base = self.base_oid(&cs.base_commit)?;
        let head = self.head.ok_or_else(|| {
            Failure::new(
                Exit::Conflict,
                "change_set.base_mismatch",
                "HEAD has no commit; the change set base cannot be checked.",
            )
        })?;
        if !self.git.is_ancestor(base, head)? {
            return Err(Failure::new(
                Exit::Conflict,
                "change_set.base_mismatch",
                format!(
                    "The base commit of {id} is not an ancestor of HEAD; check out the change-set branch."
                ),
            ));
        }
        Ok(cs)
    }

    /// Resolves a recorded or requested base commit.
    pub fn base_oid(&self, hex: &str) -> Result<Oid, Failure> {
        base_oid(&self.git, hex)
    }

    /// Stages, validates and commits. Returns the mutation paths.
    pub fn finish(
        &self,
        staged: Staged,
        scope: &Scope,
        allow_draft: bool,
    ) -> Result<Vec<String>, Failure> {
        let (writes, _) = self.stage(staged, scope, allow_draft)?;
        if self.git.head() != self.head {
            return Err(Failure::new(
                Exit::Conflict,
                "change_set.base_mismatch",
                "HEAD moved while the command ran; rerun it.",
            ));
        }
        let root = self.git.root.clone();
        // Any governed file (configuration, projection, store entries) that
        // changed or appeared since the read aborts the write (§12, §19.5).
        let now = fsio::load_vfs(&root)?;
        if now.project_yaml != self.vfs.project_yaml
            || now.projection_yaml != self.vfs.projection_yaml
            || now.stores != self.vfs.stores
        {
            return Err(Failure::new(
                Exit::Conflict,
                "change_set.concurrent_update",
                "A governed file changed while the command ran; rerun the command.",
            ));
        }
        let scope = scope.clone();
        fsio::commit(&root, &writes, &self.vfs, self.faults, || {
            post_check(&root, &scope, allow_draft)
        })?;
        Ok(writes.into_iter().map(|(p, _)| p).collect())
    }

    /// Builds the full write list and validates the staged project.
    pub fn stage(
        &self,
        staged: Staged,
        scope: &Scope,
        allow_draft: bool,
    ) -> Result<(Writes, Snapshot), Failure> {
        let Staged {
            mut writes,
            mut project,
            projection,
        } = staged;
        let mut vfs = Vfs::clone(&self.vfs);
        for (p, b) in &writes {
            vfs.overlay(p, b.clone());
        }
        let pre = snapshot::open(vfs.clone())?;
        project.canonicalize();
        let mut digests = project.store_digests.clone().unwrap_or_default();
        for kind in StoreKind::ALL {
            if let Some(Some(d)) = pre.digests.get(&kind) {
                digests.set(kind, d.clone());
            }
        }
        project.store_digests = Some(digests);
        let pbytes = yaml::emit_managed(&project.to_node()).into_bytes();
        vfs.overlay(PROJECT_YAML, pbytes.clone());
        writes.push((PROJECT_YAML.to_owned(), pbytes));
        if let Some(p) = projection {
            vfs.overlay(PROJECTION_YAML, p.clone());
            writes.push((PROJECTION_YAML.to_owned(), p));
        }
        let snap = snapshot::open(vfs)?;
        // A refusal carries every diagnostic: a direct edit of a store (seen only in
        // what was read, since the staged digests are recomputed) with the rest.
        let mut diagnostics = fsio::direct_edit_diagnostics(&self.vfs);
        diagnostics.extend(validate::validate(&snap, scope));
        if let Some(f) = outcome::wrap(diagnostics, allow_draft) {
            return Err(f);
        }
        Ok((writes, snap))
    }
}

fn post_check(root: &Path, scope: &Scope, allow_draft: bool) -> Result<(), Failure> {
    let failed = |d: Vec<Diagnostic>| {
        Failure::new(
            Exit::Io,
            "storage.post_write_failed",
            "The project did not reload cleanly after the write; nothing was changed.",
        )
        .with_diagnostics(d)
    };
    let vfs = fsio::load_vfs(root).map_err(|f| failed(f.diagnostics))?;
    let snap = snapshot::open(vfs).map_err(|f| failed(f.diagnostics))?;
    match outcome::wrap(validate::validate(&snap, scope), allow_draft) {
        Some(f) => Err(failed(f.diagnostics)),
        None => Ok(()),
    }
}

/// Empty store digests for every store (used by `project init`).
pub fn digests_of(snap: &Snapshot) -> StoreTriple {
    let mut t = StoreTriple::default();
    for kind in StoreKind::ALL {
        if let Some(Some(d)) = snap.digests.get(&kind) {
            t.set(kind, d.clone());
        }
    }
    t
}

/// The snapshot a read command works on: the working tree (validated, drafts
/// allowed), or with `--at <sha>` the project as of that commit, read through
/// libgit2 without a checkout.
pub fn read_snapshot(at: Option<&str>, env: &super::Env<'_>) -> Result<Snapshot, Failure> {
    match at {
        None => {
            let session = Session::open(env.cwd, env.faults)?;
            session.validate_for_read()?;
            Ok(session.snap)
        }
        Some(at) => crate::store::open_commit(env.cwd, at.trim()),
    }
}

/// Resolves a recorded or requested base commit: full 40-hex and a local
/// commit object, else `change_set.invalid_base` (4); missing from a shallow
/// clone → `git.read_failed` (6).
pub fn base_oid(git: &Git, hex: &str) -> Result<Oid, Failure> {
    let invalid = |named: bool| {
        let msg = if named {
            format!(
                "The base commit {} is not a local commit object.",
                hex.to_ascii_lowercase()
            )
        } else {
            "The base commit is not a full 40-hex commit ID.".to_owned()
        };
        Failure::new(Exit::Validation, "change_set.invalid_base", msg)
    };
    if !ids::is_full_sha(hex) {
        return Err(invalid(false));
    }
    match git.lookup(hex) {
        Lookup::Commit(oid) => Ok(oid),
        Lookup::Missing if git.repo.is_shallow() => Err(Failure::new(
            Exit::Io,
            "git.read_failed",
            "The base commit is missing from this shallow clone; deepen the clone.",
        )),
        _ => Err(invalid(true)),
    }
}

/// IDs of the change sets whose manifest is in the tree of none of `refs`.
fn proposed_by_refs(git: &Git, snap: &Snapshot, refs: &[Oid]) -> Result<BTreeSet<String>, Failure> {
    // List the change-set store once per ref instead of one tree lookup per
    // manifest and ref.
    let dir = snap.project.store_dir(StoreKind::ChangeSets);
    let mut approved_paths = BTreeSet::new();
    for r in refs {
        for name in git.dir_names_in_commit(*r, &dir)? {
            approved_paths.insert(format!("{dir}/{name}"));
        }
    }
    Ok(snap
        .change_sets
        .iter()
        .filter(|rec| !approved_paths.contains(&rec.path))
        .map(|rec| rec.record.id.clone())
        .collect())
}

/// Resolves `--at` (§17): full 40-hex, else `revision.invalid` (4); a commit
/// of this repository, else `revision.not_found` (4).
pub fn resolve_at(cwd: &Path, at: &str) -> Result<(Git, Oid), Failure> {
    let at = at.trim();
    if !ids::is_full_sha(at) {
        return Err(Failure::new(
            Exit::Validation,
            "revision.invalid",
            "--at takes a full 40-hex commit ID.",
        ));
    }
    let git = Git::discover(cwd)?;
    let Lookup::Commit(commit) = git.lookup(at) else {
        return Err(Failure::new(
            Exit::Validation,
            "revision.not_found",
            "The --at commit does not exist in this repository.",
        ));
    };
    Ok((git, commit))
}

/// The project as of a commit, read from its tree through libgit2 without a
/// checkout (`revision.read_failed` (6) when the tree cannot be read), and
/// decoded but not validated.
pub struct AtCommit {
    /// The repository.
    pub git: Git,
    /// The `--at` commit.
    pub commit: Oid,
    /// The decoded project.
    pub snap: Snapshot,
}

impl AtCommit {
    /// Resolves `--at` and loads the project of that commit.
    pub fn open(cwd: &Path, at: &str) -> Result<AtCommit, Failure> {
        let (git, commit) = resolve_at(cwd, at)?;
        let vfs = git.commit_vfs(commit)?;
        let snap = snapshot::open(vfs)?;
        Ok(AtCommit { git, commit, snap })
    }

    /// Whether the commit is approved as a whole: some approval ref (§18)
    /// equals it or descends from it (the `change-set show --at` test).
    pub fn commit_approved(&self, refs: &[Oid]) -> Result<bool, Failure> {
        for r in refs {
            if self.git.is_ancestor(self.commit, *r)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Proposed change sets as of the commit (`change-set list --at`,
    /// `check --at`): none when the commit itself is approved; otherwise
    /// those whose manifest is in no approval ref's tree (the §18 rule), so
    /// sets merged long ago stay approved on an unmerged commit.
    pub fn proposed(&self) -> Result<BTreeSet<String>, Failure> {
        let refs = self.git.approval_refs(&self.snap.project)?;
        if self.commit_approved(&refs)? {
            return Ok(BTreeSet::new());
        }
        proposed_by_refs(&self.git, &self.snap, &refs)
    }
}
