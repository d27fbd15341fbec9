//! Landing a work item: the attestation snapshot commit, the merge of `wi/` into `main`
//! (always a two-parent merge commit with a `Work-Item:` trailer), the push with an
//! expected-remote-head guard, the verification that the remote `main` contains the merge,
//! and lookups by trailer for the reconciler.
//!
//! [`land_work_item`] is idempotent: it first looks for an existing merge of the work item on
//! the remote's first-parent history, so a rerun after a crash between push and verification
//! never creates a second merge.

use std::cell::RefCell;

use git2::{Direction, Oid, Repository, build::TreeUpdateBuilder};
use serde::{Deserialize, Serialize};

use crate::{
    digest::{DigestError, product_tree_digest},
    export::load_manifest,
    integrate::{IntegrateError, WorkItemRef, jobsite_signature, merge_commit},
    manifest::PathClass,
    path::check_project_path,
    remote::{AccessError, Session, SessionError},
    trailers::{self, compose},
    tree::list_files,
};

/// A file of the attestation snapshot (sealed JSONL, rendered Markdown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttestationFile {
    /// Project path; must classify as `attestation-only`.
    pub path: String,
    /// Content.
    pub content: Vec<u8>,
}

/// The committed attestation snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttestationCommit {
    /// The new work-item head.
    pub commit: String,
    /// Its parent (the inspected candidate).
    pub parent: String,
    /// `product_tree_digest` of the new head (equal to the sealed one).
    pub product_tree_digest: String,
}

/// Outcome of [`merge_into_main`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MainMerge {
    /// The merge commit.
    pub merge_commit: String,
    /// Its parents: previous main head, work-item head.
    pub parents: Vec<String>,
    /// True when the merge already existed and nothing was written.
    pub already_merged: bool,
}

/// Outcome of [`land_work_item`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LandOutcome {
    /// The merge commit on the remote default branch.
    pub merge_commit: String,
    /// True when this call pushed it.
    pub pushed: bool,
    /// True when the merge was already on the remote.
    pub already_merged: bool,
    /// The remote head after landing.
    pub remote_head: String,
}

/// Result of [`approved_merge`], as the SCM `approved_merge` read returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovedMerge {
    /// `CS-NNNNN`.
    pub change_set_id: String,
    /// The merge commit that added the manifest to the default branch.
    pub merge_commit: String,
    /// Head of the default branch that was read.
    pub default_head: String,
}

/// Failures while landing.
#[derive(Debug, thiserror::Error)]
pub enum LandError {
    /// A git operation failed.
    #[error("failed to {operation}: {source}")]
    Git {
        /// Operation.
        operation: &'static str,
        /// Cause.
        #[source]
        source: git2::Error,
    },
    /// The remote refused the credentials, its host key or certificate is not trusted, or
    /// the credentials could not be read (the error names the Secret and what to do).
    #[error("unable to {operation}: {source}")]
    Access {
        /// Operation.
        operation: &'static str,
        /// Cause.
        #[source]
        source: AccessError,
    },
    /// An attestation path is not a safe `attestation-only` path.
    #[error(
        "unable to commit attestation `{path}`: {reason}; attestations go under an attestation-only path"
    )]
    AttestationPath {
        /// Path.
        path: String,
        /// Why.
        reason: String,
    },
    /// The product digest changed after the attestation commit.
    #[error(
        "refusing to merge: product_tree_digest changed from {expected} to {actual} after the attestation commit"
    )]
    DigestChanged {
        /// Sealed digest.
        expected: String,
        /// Digest after the snapshot commit.
        actual: String,
    },
    /// Digest computation failed.
    #[error(transparent)]
    Digest(#[from] DigestError),
    /// Merge failures.
    #[error(transparent)]
    Integrate(#[from] IntegrateError),
    /// A ref moved under a compare-and-swap.
    #[error("unable to update {reference}: it is no longer at {expected}; reread and retry")]
    RefMoved {
        /// Ref.
        reference: String,
        /// Expected value.
        expected: String,
    },
    /// The remote head is not the expected one.
    #[error(
        "refusing to push to {remote}/{reference}: remote head is {actual} but {expected} was expected; fetch, revalidate and retry"
    )]
    RemoteMoved {
        /// Remote.
        remote: String,
        /// Remote ref.
        reference: String,
        /// Expected head (`none` for an absent ref).
        expected: String,
        /// Actual head (`none` for an absent ref).
        actual: String,
    },
    /// The remote refused the push.
    #[error("push of {reference} to {remote} was rejected: {reason}")]
    PushRejected {
        /// Remote.
        remote: String,
        /// Ref.
        reference: String,
        /// Remote message.
        reason: String,
    },
    /// The remote moved past the tested candidate.
    #[error(
        "refusing to land {candidate}: {remote}/{reference} is at {remote_head}, which the tested candidate does not contain; merge it into the work-item branch, rerun every gate and land again"
    )]
    Untested {
        /// Remote name.
        remote: String,
        /// Remote branch.
        reference: String,
        /// The fetched remote head.
        remote_head: String,
        /// The work-item head.
        candidate: String,
    },
    /// After pushing, the remote does not contain the merge.
    #[error(
        "remote {remote}/{reference} does not contain merge {commit} after the push; run the reconciler"
    )]
    NotOnRemote {
        /// Remote.
        remote: String,
        /// Ref.
        reference: String,
        /// Merge commit.
        commit: String,
    },
}

impl LandError {
    /// Stable label for metrics and Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            LandError::Git { .. } => "git",
            LandError::Access { source, .. } => source.category(),
            LandError::AttestationPath { .. } => "attestation-path",
            LandError::DigestChanged { .. } => "digest-changed",
            LandError::Digest(_) => "digest",
            LandError::Integrate(e) => e.category(),
            LandError::RefMoved { .. } => "ref-moved",
            LandError::RemoteMoved { .. } => "remote-moved",
            LandError::PushRejected { .. } => "push-rejected",
            LandError::NotOnRemote { .. } => "not-on-remote",
            LandError::Untested { .. } => "untested-candidate",
        }
    }
}

fn git(operation: &'static str) -> impl FnOnce(git2::Error) -> LandError {
    move |source| LandError::Git { operation, source }
}

/// The session of one operation on `remote` (its Secret read now), as a [`LandError`].
fn session(repo: &Repository, remote: &str, operation: &'static str) -> Result<Session, LandError> {
    Session::for_remote(repo, remote).map_err(|e| match e {
        SessionError::Git { source, .. } => LandError::Git {
            operation: "find the remote",
            source,
        },
        SessionError::Access(source) => LandError::Access { operation, source },
    })
}

/// A failed network operation: what the session's callbacks saw, else the git error.
fn network(session: &Session, operation: &'static str) -> impl FnOnce(git2::Error) -> LandError {
    move |source| match session.failure() {
        Some(access) => LandError::Access {
            operation,
            source: access,
        },
        None => LandError::Git { operation, source },
    }
}

fn show(id: Option<Oid>) -> String {
    id.map_or_else(|| "none".to_owned(), |i| i.to_string())
}

/// Commits the attestation snapshot on the work-item branch, recomputes
/// `product_tree_digest` and refuses (moving no ref) when it differs from `sealed_digest`.
pub fn commit_attestation(
    repo: &Repository,
    work_item: &WorkItemRef,
    files: &[AttestationFile],
    sealed_digest: &str,
    when: i64,
) -> Result<AttestationCommit, LandError> {
    let branch = work_item.branch_ref();
    let head = repo
        .find_reference(&branch)
        .and_then(|r| r.peel_to_commit())
        .map_err(git("read the work-item branch"))?;
    let head_tree = head.tree().map_err(git("read the candidate tree"))?;
    let listed = list_files(repo, &head_tree).map_err(git("list the candidate tree"))?;
    let manifest = load_manifest(repo, &listed).map_err(|e| LandError::AttestationPath {
        path: crate::manifest::MANIFEST_PATH.into(),
        reason: e.to_string(),
    })?;
    let mut update = TreeUpdateBuilder::new();
    for file in files {
        if let Err(problem) = check_project_path(&file.path) {
            return Err(LandError::AttestationPath {
                path: file.path.clone(),
                reason: problem.to_string(),
            });
        }
        if manifest.classify(&file.path) != Some(PathClass::AttestationOnly) {
            return Err(LandError::AttestationPath {
                path: file.path.clone(),
                reason: "the path is not classified attestation-only".into(),
            });
        }
        let blob = repo
            .blob(&file.content)
            .map_err(git("write an attestation blob"))?;
        update.upsert(file.path.as_str(), blob, git2::FileMode::Blob);
    }
    let tree_id = update
        .create_updated(repo, &head_tree)
        .map_err(git("build the attestation tree"))?;
    let tree = repo
        .find_tree(tree_id)
        .map_err(git("read the attestation tree"))?;
    let signature = jobsite_signature(when).map_err(git("build the Job Site signature"))?;
    let message = compose(
        &format!("Attest inspection of {}", work_item.id),
        None,
        &[
            (trailers::WORK_ITEM, work_item.id.clone()),
            (trailers::PRODUCT_TREE_DIGEST, sealed_digest.to_owned()),
        ],
    );
    let commit = repo
        .commit(None, &signature, &signature, &message, &tree, &[&head])
        .map_err(git("write the attestation commit"))?;
    let actual = product_tree_digest(repo, commit)?;
    if actual != sealed_digest {
        return Err(LandError::DigestChanged {
            expected: sealed_digest.to_owned(),
            actual,
        });
    }
    repo.reference_matching(
        &branch,
        commit,
        true,
        head.id(),
        "protobot: attestation snapshot",
    )
    .map_err(|_| LandError::RefMoved {
        reference: branch.clone(),
        expected: head.id().to_string(),
    })?;
    Ok(AttestationCommit {
        commit: commit.to_string(),
        parent: head.id().to_string(),
        product_tree_digest: actual,
    })
}

/// Finds, on the first-parent history from `tip`, a merge commit whose `Work-Item:` trailer
/// names `work_item_id`.
pub fn find_merge_by_trailer(
    repo: &Repository,
    tip: Oid,
    work_item_id: &str,
) -> Result<Option<Oid>, LandError> {
    let mut current = Some(repo.find_commit(tip).map_err(git("read the branch tip"))?);
    while let Some(commit) = current {
        if commit.parent_count() >= 2 {
            let message = String::from_utf8_lossy(commit.message_bytes());
            let found = trailers::parse(&message);
            if trailers::value(&found, trailers::WORK_ITEM) == Some(work_item_id) {
                return Ok(Some(commit.id()));
            }
        }
        current = if commit.parent_count() == 0 {
            None
        } else {
            Some(commit.parent(0).map_err(git("walk first parents"))?)
        };
    }
    Ok(None)
}

/// Merges the work-item branch into the local branch `main_ref` with a merge commit (never a
/// fast-forward), unless a merge with the work item's trailer is already on it. The local ref
/// moves by compare-and-swap.
pub fn merge_into_main(
    repo: &Repository,
    work_item: &WorkItemRef,
    main_ref: &str,
    when: i64,
) -> Result<MainMerge, LandError> {
    let main_head = repo
        .find_reference(main_ref)
        .and_then(|r| r.peel_to_commit())
        .map(|c| c.id())
        .map_err(git("read the default branch"))?;
    if let Some(existing) = find_merge_by_trailer(repo, main_head, &work_item.id)? {
        let commit = repo
            .find_commit(existing)
            .map_err(git("read the existing merge"))?;
        return Ok(MainMerge {
            merge_commit: existing.to_string(),
            parents: commit.parent_ids().map(|p| p.to_string()).collect(),
            already_merged: true,
        });
    }
    let wi_branch = work_item.branch_ref();
    let wi_head = repo
        .find_reference(&wi_branch)
        .and_then(|r| r.peel_to_commit())
        .map(|c| c.id())
        .map_err(git("read the work-item branch"))?;
    let message = compose(
        &format!(
            "Merge {} into {}",
            wi_branch.trim_start_matches("refs/heads/"),
            main_ref.trim_start_matches("refs/heads/")
        ),
        None,
        &[(trailers::WORK_ITEM, work_item.id.clone())],
    );
    let merge = merge_commit(
        repo, main_head, wi_head, &message, when, &wi_branch, main_ref,
    )?;
    repo.reference_matching(
        main_ref,
        merge,
        true,
        main_head,
        "protobot: merge work item",
    )
    .map_err(|_| LandError::RefMoved {
        reference: main_ref.into(),
        expected: main_head.to_string(),
    })?;
    Ok(MainMerge {
        merge_commit: merge.to_string(),
        parents: vec![main_head.to_string(), wi_head.to_string()],
        already_merged: false,
    })
}

/// Reads the head of `remote_ref` on `remote` without fetching (`ls-remote`).
pub fn remote_head(
    repo: &Repository,
    remote: &str,
    remote_ref: &str,
) -> Result<Option<Oid>, LandError> {
    let access = session(repo, remote, "connect to the remote")?;
    remote_head_with(repo, &access, remote, remote_ref)
}

fn remote_head_with(
    repo: &Repository,
    access: &Session,
    remote: &str,
    remote_ref: &str,
) -> Result<Option<Oid>, LandError> {
    let mut handle = repo.find_remote(remote).map_err(git("find the remote"))?;
    let connection = handle
        .connect_auth(Direction::Fetch, Some(access.callbacks()), None)
        .map_err(network(access, "connect to the remote"))?;
    let found = connection
        .list()
        .map_err(git("list remote refs"))?
        .iter()
        .find(|h| h.name() == remote_ref)
        .map(|h| h.oid());
    drop(connection);
    Ok(found)
}

/// An exclusive lock on a local remote (`None` for network remotes): a flock on the
/// remote's directory itself, so nothing is left in the user's repository.
fn local_push_lock(repo: &Repository, remote: &str) -> Result<Option<std::fs::File>, LandError> {
    let handle = repo.find_remote(remote).map_err(git("find the remote"))?;
    let url = handle.url().unwrap_or_default();
    let path = std::path::Path::new(url.strip_prefix("file://").unwrap_or(url));
    if url.contains("://") && !url.starts_with("file://") || !path.is_dir() {
        return Ok(None);
    }
    let lock = |e: std::io::Error| LandError::Git {
        operation: "lock the local remote for a guarded push",
        source: git2::Error::from_str(&e.to_string()),
    };
    let file = std::fs::File::open(path).map_err(lock)?;
    file.lock().map_err(lock)?;
    Ok(Some(file))
}

/// Pushes `local_ref` to `remote_ref` (no force, no tags) only when the remote head equals
/// `expected_remote_head` (`None`: the ref must be absent). Returns the pushed commit.
///
/// The guard is read immediately before a non-forced push, so a remote that moved in between
/// to a commit that is not an ancestor of ours is still refused by the fast-forward rule.
pub fn push_with_guard(
    repo: &Repository,
    remote: &str,
    local_ref: &str,
    remote_ref: &str,
    expected_remote_head: Option<Oid>,
) -> Result<Oid, LandError> {
    let local = repo
        .find_reference(local_ref)
        .and_then(|r| r.peel_to_commit())
        .map(|c| c.id())
        .map_err(git("read the local ref to push"))?;
    // The local transport updates the remote ref without comparing its old value,
    // so two pushes that both read the same head could both "succeed", the second
    // silently dropping the first. Protobot processes pushing to a remote on this
    // machine therefore serialize check-and-push with a lock file in the remote;
    // network remotes get the compare-and-swap from receive-pack itself.
    let _guard = local_push_lock(repo, remote)?;
    // One read of the credentials for the guard and the push.
    let access = session(repo, remote, "push to the remote")?;
    let actual = remote_head_with(repo, &access, remote, remote_ref)?;
    if actual != expected_remote_head {
        return Err(LandError::RemoteMoved {
            remote: remote.into(),
            reference: remote_ref.into(),
            expected: show(expected_remote_head),
            actual: show(actual),
        });
    }
    let rejection: RefCell<Option<String>> = RefCell::new(None);
    let mut callbacks = access.callbacks();
    callbacks.push_update_reference(|_name, status| {
        if let Some(message) = status {
            *rejection.borrow_mut() = Some(message.to_owned());
        }
        Ok(())
    });
    let mut options = git2::PushOptions::new();
    options.remote_callbacks(callbacks);
    let mut handle = repo.find_remote(remote).map_err(git("find the remote"))?;
    let refspec = format!("{local_ref}:{remote_ref}");
    handle
        .push(&[refspec.as_str()], Some(&mut options))
        .map_err(|source| {
            if source.code() == git2::ErrorCode::NotFastForward {
                LandError::PushRejected {
                    remote: remote.into(),
                    reference: remote_ref.into(),
                    reason: source.message().to_owned(),
                }
            } else {
                network(&access, "push to the remote")(source)
            }
        })?;
    drop(options);
    if let Some(reason) = rejection.into_inner() {
        return Err(LandError::PushRejected {
            remote: remote.into(),
            reference: remote_ref.into(),
            reason,
        });
    }
    Ok(local)
}

/// Fetches `remote_ref` into `refs/remotes/<remote>/<name>` and returns the fetched head.
pub fn fetch_remote_branch(
    repo: &Repository,
    remote: &str,
    remote_ref: &str,
) -> Result<Option<Oid>, LandError> {
    let name = remote_ref.trim_start_matches("refs/heads/");
    let tracking = format!("refs/remotes/{remote}/{name}");
    fetch_refspecs(repo, remote, &[format!("+{remote_ref}:{tracking}")])?;
    match repo.find_reference(&tracking) {
        Ok(r) => Ok(r.target()),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(LandError::Git {
            operation: "read the tracking ref",
            source: e,
        }),
    }
}

/// Fetches `refspecs` from `remote`, authenticated with the Secret the remote is bound to
/// ([`crate::remote::bind_secret`]), read for this fetch only.
pub fn fetch_refspecs(
    repo: &Repository,
    remote: &str,
    refspecs: &[String],
) -> Result<(), LandError> {
    let access = session(repo, remote, "fetch from the remote")?;
    let mut handle = repo.find_remote(remote).map_err(git("find the remote"))?;
    let mut options = access.fetch_options();
    handle
        .fetch(refspecs, Some(&mut options), None)
        .map_err(network(&access, "fetch from the remote"))
}

/// True when the remote's `remote_ref`, freshly fetched, is or descends from `commit`.
pub fn verify_remote_contains(
    repo: &Repository,
    remote: &str,
    remote_ref: &str,
    commit: Oid,
) -> Result<bool, LandError> {
    let Some(head) = fetch_remote_branch(repo, remote, remote_ref)? else {
        return Ok(false);
    };
    if head == commit {
        return Ok(true);
    }
    repo.graph_descendant_of(head, commit)
        .map_err(git("check remote ancestry"))
}

/// Lands the work item on `remote`'s `branch` (e.g. `main`): fetch, reuse an existing merge
/// if the remote already has one for this work item, otherwise write the merge commit onto the
/// fetched remote head, push it from a private scratch ref (`refs/protobot/landing/<id>`) with
/// that head as the guard, verify, and finally fast-forward the local branch when it is an
/// ancestor of the merge. Idempotent across crashes at any point: a rerun either finds the
/// merge on the remote or rebuilds the same merge onto the current remote head.
pub fn land_work_item(
    repo: &Repository,
    work_item: &WorkItemRef,
    remote: &str,
    branch: &str,
    when: i64,
) -> Result<LandOutcome, LandError> {
    land(repo, work_item, remote, branch, when, false)
}

/// [`land_work_item`] for a tested candidate: refuses with [`LandError::Untested`] (and
/// pushes nothing) when the work-item branch does not contain the fetched remote head, so
/// the merge commit's tree is always the tested tree plus nothing it was not tested with.
/// The same fetched head is the push guard, so a remote that moves after the check is
/// refused by the push ([`LandError::RemoteMoved`]). Revalidate (merge the new head into
/// the work-item branch and rerun every gate) and land again.
pub fn land_tested_work_item(
    repo: &Repository,
    work_item: &WorkItemRef,
    remote: &str,
    branch: &str,
    when: i64,
) -> Result<LandOutcome, LandError> {
    land(repo, work_item, remote, branch, when, true)
}

fn land(
    repo: &Repository,
    work_item: &WorkItemRef,
    remote: &str,
    branch: &str,
    when: i64,
    require_tested: bool,
) -> Result<LandOutcome, LandError> {
    let remote_ref = format!("refs/heads/{branch}");
    let local_ref = format!("refs/heads/{branch}");
    let Some(remote_main) = fetch_remote_branch(repo, remote, &remote_ref)? else {
        return Err(LandError::RemoteMoved {
            remote: remote.into(),
            reference: remote_ref,
            expected: "an existing default branch".into(),
            actual: "none".into(),
        });
    };
    if let Some(existing) = find_merge_by_trailer(repo, remote_main, &work_item.id)? {
        fast_forward_local(repo, &local_ref, existing)?;
        return Ok(LandOutcome {
            merge_commit: existing.to_string(),
            pushed: false,
            already_merged: true,
            remote_head: remote_main.to_string(),
        });
    }
    let wi_branch = work_item.branch_ref();
    let wi_head = repo
        .find_reference(&wi_branch)
        .and_then(|r| r.peel_to_commit())
        .map(|c| c.id())
        .map_err(git("read the work-item branch"))?;
    if require_tested
        && wi_head != remote_main
        && !repo
            .graph_descendant_of(wi_head, remote_main)
            .map_err(git("check that the candidate contains the remote head"))?
    {
        return Err(LandError::Untested {
            remote: remote.into(),
            reference: remote_ref,
            remote_head: remote_main.to_string(),
            candidate: wi_head.to_string(),
        });
    }
    let message = compose(
        &format!(
            "Merge {} into {branch}",
            wi_branch.trim_start_matches("refs/heads/")
        ),
        None,
        &[(trailers::WORK_ITEM, work_item.id.clone())],
    );
    let merge = merge_commit(
        repo,
        remote_main,
        wi_head,
        &message,
        when,
        &wi_branch,
        &remote_ref,
    )?;
    let scratch = format!("refs/protobot/landing/{}", work_item.id);
    repo.reference(&scratch, merge, true, "protobot: merge to land")
        .map_err(git("write the landing scratch ref"))?;
    push_with_guard(repo, remote, &scratch, &remote_ref, Some(remote_main))?;
    if !verify_remote_contains(repo, remote, &remote_ref, merge)? {
        return Err(LandError::NotOnRemote {
            remote: remote.into(),
            reference: remote_ref,
            commit: merge.to_string(),
        });
    }
    fast_forward_local(repo, &local_ref, merge)?;
    if let Ok(mut reference) = repo.find_reference(&scratch) {
        reference
            .delete()
            .map_err(git("delete the landing scratch ref"))?;
    }
    Ok(LandOutcome {
        merge_commit: merge.to_string(),
        pushed: true,
        already_merged: false,
        remote_head: merge.to_string(),
    })
}

/// Moves the local branch to `target` when it is absent or an ancestor of `target`; leaves a
/// diverged local branch alone (the remote is the source of truth after landing).
fn fast_forward_local(repo: &Repository, local_ref: &str, target: Oid) -> Result<(), LandError> {
    match repo.find_reference(local_ref).ok().and_then(|r| r.target()) {
        None => {
            repo.reference(local_ref, target, false, "protobot: track landed merge")
                .map_err(git("create the local default branch"))?;
        }
        Some(local) if local == target => {}
        Some(local) => {
            let behind = repo
                .graph_descendant_of(target, local)
                .map_err(git("compare the local default branch"))?;
            if behind {
                repo.reference_matching(local_ref, target, true, local, "protobot: fast-forward")
                    .map_err(|_| LandError::RefMoved {
                        reference: local_ref.into(),
                        expected: local.to_string(),
                    })?;
            }
        }
    }
    Ok(())
}

/// `approved_merge` failures, with the SCM failure codes.
#[derive(Debug, thiserror::Error)]
pub enum ApprovedMergeError {
    /// The change-set ID does not match `^CS-[0-9]{5}$`.
    #[error("unable to look up an approved merge: `{0}` is not a change-set id (CS-NNNNN)")]
    InvalidRequest(String),
    /// The manifest is not on the default branch (or the branch is missing).
    #[error("change set {0} is not approved on the default branch")]
    NotApproved(String),
    /// The commit that added the manifest is not a merge commit.
    #[error(
        "change set {change_set_id} reached the default branch in {commit}, which is not a merge commit (a squash or rebase merge): approval is a merge commit on the default branch; revert {commit} and merge the change-set branch with a merge commit (`git merge --no-ff`, or your forge's \"Create a merge commit\")"
    )]
    NotAMergeCommit {
        /// Change set.
        change_set_id: String,
        /// The non-merge commit.
        commit: String,
    },
    /// A git read failed.
    #[error("failed to {operation} during approved_merge: {source}")]
    Git {
        /// Operation.
        operation: &'static str,
        /// Cause.
        #[source]
        source: git2::Error,
    },
}

impl ApprovedMergeError {
    /// The SCM failure code (`NOT_APPROVED`, `NOT_A_MERGE_COMMIT`, …).
    pub fn code(&self) -> &'static str {
        match self {
            ApprovedMergeError::InvalidRequest(_) => "INVALID_REQUEST",
            ApprovedMergeError::NotApproved(_) => "NOT_APPROVED",
            ApprovedMergeError::NotAMergeCommit { .. } => "NOT_A_MERGE_COMMIT",
            ApprovedMergeError::Git { .. } => "GIT_FAILED",
        }
    }
}

/// Default change-set store of ears-manager.
pub const CHANGE_SET_STORE: &str = ".protobot/change-sets";

/// Finds the merge commit that brought change set `change_set_id`'s manifest
/// (`<store>/cs-<nnnnn>.yaml`) onto `default_ref`: walks the first-parent history of the
/// default head to the commit that added the manifest, which must have two or more parents.
/// The host and ears-manager approval checks of the SCM are the caller's.
pub fn approved_merge(
    repo: &Repository,
    default_ref: &str,
    change_set_id: &str,
    store_dir: &str,
) -> Result<ApprovedMerge, ApprovedMergeError> {
    let digits = change_set_id.strip_prefix("CS-").unwrap_or_default();
    if digits.len() != 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ApprovedMergeError::InvalidRequest(change_set_id.to_owned()));
    }
    let manifest = format!("{}/cs-{digits}.yaml", store_dir.trim_end_matches('/'));
    let git = |operation: &'static str| move |source| ApprovedMergeError::Git { operation, source };
    let Ok(head) = repo
        .find_reference(default_ref)
        .and_then(|r| r.peel_to_commit())
    else {
        return Err(ApprovedMergeError::NotApproved(change_set_id.to_owned()));
    };
    let has = |commit: &git2::Commit<'_>| -> Result<bool, ApprovedMergeError> {
        let tree = commit.tree().map_err(git("read a tree"))?;
        match tree.get_path(std::path::Path::new(&manifest)) {
            Ok(_) => Ok(true),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(false),
            Err(e) => Err(ApprovedMergeError::Git {
                operation: "look up the manifest",
                source: e,
            }),
        }
    };
    if !has(&head)? {
        return Err(ApprovedMergeError::NotApproved(change_set_id.to_owned()));
    }
    let mut current = head.clone();
    while current.parent_count() > 0 {
        let parent = current.parent(0).map_err(git("walk first parents"))?;
        if !has(&parent)? {
            break;
        }
        current = parent;
    }
    if current.parent_count() < 2 {
        return Err(ApprovedMergeError::NotAMergeCommit {
            change_set_id: change_set_id.to_owned(),
            commit: current.id().to_string(),
        });
    }
    Ok(ApprovedMerge {
        change_set_id: change_set_id.to_owned(),
        merge_commit: current.id().to_string(),
        default_head: head.id().to_string(),
    })
}
