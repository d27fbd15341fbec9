//! Git at the edge, through libgit2 (no `git` process, no hooks, no fetch,
//! replace refs never consulted): root discovery, commit lookups, ancestry,
//! the approval rule (§18), reading a project from a commit (`--at`), and
//! cutting / undoing a change-set branch (§17 EM-07).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use git2::{BranchType, ErrorCode, ObjectType, Oid, Repository, StatusOptions};

use crate::{
    model::{Project, StoreKind},
    outcome::{Exit, Failure},
    rules, snapshot,
    vfs::{DirState, FileState, PROJECT_YAML, PROJECTION_YAML, Vfs},
};

/// An opened repository and its working-tree root.
pub struct Git {
    /// The repository.
    pub repo: Repository,
    /// Working-tree root (holds `.protobot/`).
    pub root: PathBuf,
}

fn read_failed(what: &str) -> Failure {
    Failure::new(
        Exit::Io,
        "git.read_failed",
        format!("Git could not {what}; check the repository and retry."),
    )
}

/// Result of looking up a caller-supplied commit ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// No such object.
    Missing,
    /// The object exists but is not a commit (for example a tag).
    NotCommit,
    /// A commit.
    Commit(Oid),
}

impl Git {
    /// Finds the working tree containing `cwd`.
    pub fn discover(cwd: &Path) -> Result<Git, Failure> {
        let not_root = || {
            Failure::new(
                Exit::Project,
                "project.not_git_root",
                "Run ears-manager inside a Git working tree.",
            )
        };
        let repo = Repository::discover(cwd).map_err(|_| not_root())?;
        let root = repo.workdir().ok_or_else(not_root)?.to_path_buf();
        let root = root.canonicalize().unwrap_or(root);
        Ok(Git { repo, root })
    }

    /// The commit HEAD points at, if any.
    pub fn head(&self) -> Option<Oid> {
        self.repo
            .head()
            .ok()
            .and_then(|h| h.peel_to_commit().ok())
            .map(|c| c.id())
    }

    /// The branch HEAD is on (`None` when detached or unborn).
    pub fn head_branch(&self) -> Option<String> {
        let head = self.repo.head().ok()?;
        if !head.is_branch() {
            return None;
        }
        head.shorthand().ok().map(str::to_owned)
    }

    /// The commit of `refs/heads/<name>`.
    pub fn local_branch(&self, name: &str) -> Option<Oid> {
        self.repo
            .find_branch(name, BranchType::Local)
            .ok()
            .and_then(|b| b.get().peel_to_commit().ok())
            .map(|c| c.id())
    }

    /// Looks up a full hex object ID.
    pub fn lookup(&self, hex: &str) -> Lookup {
        let Ok(oid) = Oid::from_str(hex) else {
            return Lookup::Missing;
        };
        match self.repo.find_object(oid, None) {
            Ok(obj) if obj.kind() == Some(ObjectType::Commit) => Lookup::Commit(oid),
            Ok(_) => Lookup::NotCommit,
            Err(_) => Lookup::Missing,
        }
    }

    /// Whether `a` is an ancestor of `b` (a commit is its own ancestor).
    pub fn is_ancestor(&self, a: Oid, b: Oid) -> Result<bool, Failure> {
        if a == b {
            return Ok(true);
        }
        if self.repo.is_shallow() {
            return Err(read_failed("prove ancestry in a shallow clone"));
        }
        self.repo
            .graph_descendant_of(b, a)
            .map_err(|_| read_failed("compute ancestry"))
    }

    /// Commits of the default-branch refs that count for approval (§18):
    /// the local branch and the remote-tracking branch of every remote whose
    /// first fetch URL, without userinfo, equals the canonical remote.
    pub fn approval_refs(&self, project: &Project) -> Result<Vec<Oid>, Failure> {
        let branch = project.default_branch();
        if !rules::is_valid_branch_name(&branch) {
            // No ref can be named: nothing is approved. Every command validates the project
            // next, which reports `project.invalid_configuration` on the field
            // `repository.default_branch` alongside every other finding (§18, §22.2), and
            // refuses any write.
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        if let Some(oid) = self.local_branch(&branch) {
            out.push(oid);
        }
        let canonical = project.canonical_remote();
        for (name, _) in self.canonical_remotes(&canonical)? {
            let refname = format!("refs/remotes/{name}/{branch}");
            if let Ok(oid) = self.repo.refname_to_id(&refname)
                && let Ok(c) = self.repo.find_commit(oid)
            {
                out.push(c.id());
            }
        }
        if out.is_empty() {
            return Err(Failure::new(
                Exit::Project,
                "project.default_branch_unresolved",
                "The default branch does not resolve to a commit locally or on the canonical remote.",
            ));
        }
        Ok(out)
    }

    /// Remotes whose first fetch URL matches the canonical remote exactly.
    pub fn canonical_remotes(&self, canonical: &str) -> Result<Vec<(String, String)>, Failure> {
        let names = self
            .repo
            .remotes()
            .map_err(|_| read_failed("list the remotes"))?;
        let mut out = Vec::new();
        for name in names.iter().filter_map(|n| n.ok().flatten()) {
            let Ok(remote) = self.repo.find_remote(name) else {
                continue;
            };
            if let Ok(url) = remote.url()
                && !canonical.is_empty()
                && rules::strip_userinfo(url) == canonical
            {
                out.push((name.to_owned(), url.to_owned()));
            }
        }
        Ok(out)
    }

    /// Whether `path` exists in the tree of `commit`.
    pub fn path_in_commit(&self, commit: Oid, path: &str) -> Result<bool, Failure> {
        let tree = self
            .repo
            .find_commit(commit)
            .and_then(|c| c.tree())
            .map_err(|_| read_failed("read a commit tree"))?;
        match tree.get_path(Path::new(path)) {
            Ok(_) => Ok(true),
            Err(e) if e.code() == ErrorCode::NotFound => Ok(false),
            Err(_) => Err(read_failed("read a commit tree")),
        }
    }

    /// Reads the governed files of `commit` into a [`Vfs`].
    pub fn commit_vfs(&self, commit: Oid) -> Result<Vfs, Failure> {
        let rf = || {
            Failure::new(
                Exit::Io,
                "revision.read_failed",
                "The requested commit could not be read; check the repository.",
            )
        };
        let tree = self
            .repo
            .find_commit(commit)
            .and_then(|c| c.tree())
            .map_err(|_| rf())?;
        let file = |rel: &str| -> FileState {
            match tree.get_path(Path::new(rel)) {
                Err(_) => FileState::Absent,
                Ok(entry) => match entry.filemode() {
                    0o120000 => FileState::Symlink,
                    0o100644 | 0o100755 => self
                        .repo
                        .find_blob(entry.id())
                        .map_or(FileState::Unreadable, |b| {
                            FileState::Bytes(b.content().to_vec())
                        }),
                    _ => FileState::NotRegular,
                },
            }
        };
        let project_yaml = file(PROJECT_YAML);
        let mut vfs = Vfs {
            protobot_is_dir: true,
            project_yaml,
            projection_yaml: file(PROJECTION_YAML),
            stores: BTreeMap::new(),
            artifacts: BTreeMap::new(),
        };
        if let Ok(project) = snapshot::decode_project(&vfs.project_yaml) {
            for kind in StoreKind::ALL {
                let dir = project.store_dir(kind);
                let state = match tree.get_path(Path::new(&dir)) {
                    Err(_) => DirState::Absent,
                    Ok(entry) if entry.filemode() == 0o120000 => DirState::Symlink,
                    Ok(entry) if entry.kind() != Some(ObjectType::Tree) => DirState::NotDir,
                    Ok(entry) => match self.repo.find_tree(entry.id()) {
                        Err(_) => DirState::Unreadable,
                        Ok(sub) => {
                            let mut entries = BTreeMap::new();
                            for e in sub.iter() {
                                let Ok(name) = e.name() else { continue };
                                if name.starts_with('.') {
                                    continue;
                                }
                                entries.insert(name.to_owned(), file(&format!("{dir}/{name}")));
                            }
                            DirState::Listing(entries)
                        }
                    },
                };
                vfs.stores.insert(dir, state);
            }
            for a in &project.artifacts {
                vfs.artifacts.insert(a.path.clone(), file(&a.path));
            }
        }
        Ok(vfs)
    }

    /// Whether tracked files have staged or unstaged changes.
    pub fn has_tracked_changes(&self) -> Result<bool, Failure> {
        let mut opts = StatusOptions::new();
        opts.include_untracked(false).include_ignored(false);
        let statuses = self
            .repo
            .statuses(Some(&mut opts))
            .map_err(|_| read_failed("read the working-tree status"))?;
        Ok(statuses.iter().any(|s| !s.status().is_empty()))
    }

    /// Change-set numbers used by branch names `<prefix><5 digits>-…` in
    /// local heads and the canonical remotes' tracking refs.
    pub fn branch_numbers(&self, prefix: &str, canonical: &str) -> Result<BTreeSet<u32>, Failure> {
        let mut out = BTreeSet::new();
        let mut prefixes = vec![format!("refs/heads/{prefix}")];
        for (name, _) in self.canonical_remotes(canonical)? {
            prefixes.push(format!("refs/remotes/{name}/{prefix}"));
        }
        let refs = self
            .repo
            .references()
            .map_err(|_| read_failed("list references"))?;
        for r in refs.flatten() {
            let Ok(name) = r.name() else { continue };
            for p in &prefixes {
                if let Some(rest) = name.strip_prefix(p.as_str())
                    && rest.len() > 6
                    && rest.as_bytes()[5] == b'-'
                    && let Ok(n) = rest[..5].parse::<u32>()
                    && rest[..5].bytes().all(|c| c.is_ascii_digit())
                {
                    out.insert(n);
                }
            }
        }
        Ok(out)
    }

    /// Where a branch name already exists: locally or on a canonical remote.
    pub fn branch_location(
        &self,
        branch: &str,
        canonical: &str,
    ) -> Result<Option<String>, Failure> {
        if self.repo.find_branch(branch, BranchType::Local).is_ok() {
            return Ok(Some("locally".to_owned()));
        }
        for (name, _) in self.canonical_remotes(canonical)? {
            if self
                .repo
                .refname_to_id(&format!("refs/remotes/{name}/{branch}"))
                .is_ok()
            {
                return Ok(Some(format!("on remote {name}")));
            }
        }
        Ok(None)
    }

    /// Creates `branch` at `base` and checks it out (safe checkout: a
    /// conflicting untracked file aborts). Returns the branch HEAD was on.
    pub fn cut_branch(&self, branch: &str, base: Oid) -> Result<String, Failure> {
        let original = self.head_branch().ok_or_else(|| {
            Failure::new(
                Exit::Conflict,
                "change_set.unexpected_branch",
                "HEAD is detached; check out a branch before creating a change set.",
            )
        })?;
        let commit = self
            .repo
            .find_commit(base)
            .map_err(|_| read_failed("read the base commit"))?;
        self.repo.branch(branch, &commit, false).map_err(|_| {
            Failure::new(
                Exit::Io,
                "git.write_failed",
                "The change-set branch could not be created; nothing was changed.",
            )
        })?;
        let mut co = git2::build::CheckoutBuilder::new();
        co.safe();
        if self
            .repo
            .checkout_tree(commit.as_object(), Some(&mut co))
            .is_err()
        {
            return Err(self.undo_cut(&original, branch).err().unwrap_or_else(|| {
                Failure::new(
                    Exit::Conflict,
                    "change_set.uncommitted_changes",
                    "Local files would be overwritten by the change-set branch; commit or move them first.",
                )
            }));
        }
        if self.repo.set_head(&format!("refs/heads/{branch}")).is_err() {
            return Err(self.undo_cut(&original, branch).err().unwrap_or_else(|| {
                Failure::new(Exit::Io, "git.write_failed", "The change-set branch could not be checked out; the original branch was restored.")
            }));
        }
        Ok(original)
    }

    /// Restores `original` and deletes `branch`. Errors with
    /// `git.write_unknown` when that cannot be confirmed.
    pub fn undo_cut(&self, original: &str, branch: &str) -> Result<(), Failure> {
        let unknown = || {
            Failure::new(Exit::Io, "git.write_unknown", "Restoring the original branch could not be confirmed; inspect the repository before retrying.").unknown()
        };
        let target = self
            .repo
            .find_branch(original, BranchType::Local)
            .ok()
            .and_then(|b| b.get().peel_to_commit().ok())
            .ok_or_else(unknown)?;
        let mut co = git2::build::CheckoutBuilder::new();
        co.force();
        self.repo
            .checkout_tree(target.as_object(), Some(&mut co))
            .map_err(|_| unknown())?;
        self.repo
            .set_head(&format!("refs/heads/{original}"))
            .map_err(|_| unknown())?;
        let mut b = self
            .repo
            .find_branch(branch, BranchType::Local)
            .map_err(|_| unknown())?;
        b.delete().map_err(|_| unknown())?;
        Ok(())
    }
}

impl Git {
    /// Names of the entries of directory `dir` in the tree of `commit`
    /// (empty when absent).
    pub fn dir_names_in_commit(&self, commit: Oid, dir: &str) -> Result<Vec<String>, Failure> {
        let tree = self
            .repo
            .find_commit(commit)
            .and_then(|c| c.tree())
            .map_err(|_| read_failed("read a commit tree"))?;
        let Ok(entry) = tree.get_path(Path::new(dir)) else {
            return Ok(Vec::new());
        };
        let Ok(sub) = self.repo.find_tree(entry.id()) else {
            return Ok(Vec::new());
        };
        Ok(sub
            .iter()
            .filter_map(|e| e.name().ok().map(str::to_owned))
            .collect())
    }
}
