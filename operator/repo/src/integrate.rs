//! Integration: replay an accepted bundle onto an integration-side branch cut from the
//! recorded source commit, then merge that branch into the work-item branch
//! `wi/<id>-<slug>` with a merge commit whose trailers record the projection root and commit
//! IDs, the patch digest, the cycle and the sanitized triage decision.
//!
//! Every ref update is a compare-and-swap. Commits use the Job Site identity and the time the
//! caller passes in, so a rerun with the same inputs produces the same commits and is a no-op.

use git2::{Oid, Repository, Signature, Time, build::TreeUpdateBuilder};
use serde::{Deserialize, Serialize};

use crate::{
    bundle::ChangeOp,
    trailers::{self, compose},
    validate::AcceptedBundle,
};

/// Name of Job Site commits.
pub const JOBSITE_NAME: &str = "ProtoBot Job Site";
/// E-mail of Job Site commits.
pub const JOBSITE_EMAIL: &str = "jobsite@protobot.invalid";

/// The work item an integration step belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkItemRef {
    /// Work-item ID (used verbatim in branch names and trailers).
    pub id: String,
    /// Branch slug.
    pub slug: String,
}

impl WorkItemRef {
    /// `refs/heads/wi/<id>-<slug>`.
    pub fn branch_ref(&self) -> String {
        format!("refs/heads/wi/{}-{}", self.id, self.slug)
    }

    /// `refs/heads/int/<id>/c<cycle>/<role>`: the integration-side branch of one bundle.
    pub fn integration_ref(&self, cycle: u32, role: crate::role::Role) -> String {
        format!("refs/heads/int/{}/c{}/{}", self.id, cycle, role)
    }
}

/// Metadata of one integration cycle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CycleInfo {
    /// Cycle number.
    pub cycle: u32,
    /// Sanitized triage decision that led to this cycle (`initial` for the first).
    pub triage_decision: String,
    /// Commit time, seconds since the epoch (passed in; never read from the clock here).
    pub when: i64,
}

/// Result of applying a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedPatch {
    /// Integration-side branch.
    pub branch: String,
    /// Its head.
    pub head: String,
    /// (projection commit, integration commit) pairs, oldest first.
    pub commits: Vec<(String, String)>,
    /// Digest of the bundle.
    pub patch_digest: String,
    /// True when the branch already held exactly this result.
    pub unchanged: bool,
}

/// Result of a merge into the work-item branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkItemMerge {
    /// Work-item branch.
    pub branch: String,
    /// The merge commit.
    pub merge_commit: String,
    /// Its parents: previous work-item head, integration head.
    pub parents: Vec<String>,
}

/// Integration failures.
#[derive(Debug, thiserror::Error)]
pub enum IntegrateError {
    /// A git operation failed.
    #[error("failed to {operation}: {source}")]
    Git {
        /// Operation.
        operation: &'static str,
        /// Cause.
        #[source]
        source: git2::Error,
    },
    /// The integration branch exists with different content.
    #[error(
        "unable to apply the bundle: {branch} already exists at {head} with other content; pick a new cycle number or delete the stale branch through the reconciler"
    )]
    BranchDiverged {
        /// Branch.
        branch: String,
        /// Its head.
        head: String,
    },
    /// A change could not be applied to the source tree.
    #[error("failed to apply change to `{path}` of projection commit {commit}: {reason}")]
    Apply {
        /// Projection commit.
        commit: String,
        /// Path.
        path: String,
        /// Cause.
        reason: String,
    },
    /// Merging into the work-item branch conflicts.
    #[error("unable to merge {from} into {into}: conflicts in {paths:?}; route to triage")]
    MergeConflict {
        /// Source branch.
        from: String,
        /// Target branch.
        into: String,
        /// Conflicting paths.
        paths: Vec<String>,
    },
    /// The work-item branch moved while merging.
    #[error(
        "unable to update {branch}: it moved from the expected head {expected}; reread and retry"
    )]
    RefMoved {
        /// Branch.
        branch: String,
        /// Expected head.
        expected: String,
    },
}

impl IntegrateError {
    /// Stable label for metrics and Event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            IntegrateError::Git { .. } => "git",
            IntegrateError::BranchDiverged { .. } => "branch-diverged",
            IntegrateError::Apply { .. } => "apply",
            IntegrateError::MergeConflict { .. } => "merge-conflict",
            IntegrateError::RefMoved { .. } => "ref-moved",
        }
    }
}

fn git(operation: &'static str) -> impl FnOnce(git2::Error) -> IntegrateError {
    move |source| IntegrateError::Git { operation, source }
}

pub(crate) fn jobsite_signature(when: i64) -> Result<Signature<'static>, git2::Error> {
    Signature::new(JOBSITE_NAME, JOBSITE_EMAIL, &Time::new(when, 0))
}

/// Creates `wi/<id>-<slug>` at the source commit unless it exists; returns its head.
pub fn ensure_work_item_branch(
    repo: &Repository,
    work_item: &WorkItemRef,
    source_commit: Oid,
) -> Result<Oid, IntegrateError> {
    let name = work_item.branch_ref();
    if let Ok(reference) = repo.find_reference(&name) {
        return reference
            .peel_to_commit()
            .map(|c| c.id())
            .map_err(git("read the work-item branch"));
    }
    repo.reference(
        &name,
        source_commit,
        false,
        "protobot: create work-item branch",
    )
    .map_err(git("create the work-item branch"))?;
    Ok(source_commit)
}

/// Replays an accepted bundle onto `int/<id>/c<cycle>/<role>`, cut from the source commit the
/// bundle was validated against. Idempotent for identical inputs.
pub fn apply_bundle(
    repo: &Repository,
    accepted: &AcceptedBundle,
    work_item: &WorkItemRef,
    cycle: &CycleInfo,
) -> Result<AppliedPatch, IntegrateError> {
    let bundle = accepted.bundle();
    let source = Oid::from_str(accepted.source_commit()).map_err(git("parse the source commit"))?;
    let signature = jobsite_signature(cycle.when).map_err(git("build the Job Site signature"))?;
    let mut head = repo
        .find_commit(source)
        .map_err(git("read the source commit"))?;
    let mut pairs = Vec::with_capacity(bundle.commits.len());
    for commit in &bundle.commits {
        let base_tree = head.tree().map_err(git("read the integration tree"))?;
        let mut update = TreeUpdateBuilder::new();
        for change in &commit.changes {
            match change.op {
                ChangeOp::Delete => {
                    update.remove(change.path.as_str());
                }
                ChangeOp::Add | ChangeOp::Modify => {
                    let apply_err = |reason: String| IntegrateError::Apply {
                        commit: commit.id.clone(),
                        path: change.path.clone(),
                        reason,
                    };
                    let content = change
                        .content_hex
                        .as_deref()
                        .ok_or_else(|| apply_err("no content".into()))
                        .and_then(|h| hex::decode(h).map_err(|e| apply_err(e.to_string())))?;
                    let file_mode = match change.mode.as_str() {
                        "100755" => git2::FileMode::BlobExecutable,
                        "100644" => git2::FileMode::Blob,
                        other => return Err(apply_err(format!("mode {other}"))),
                    };
                    let blob = repo.blob(&content).map_err(git("write a patch blob"))?;
                    update.upsert(change.path.as_str(), blob, file_mode);
                }
            }
        }
        let tree_id = update
            .create_updated(repo, &base_tree)
            .map_err(git("build the patched tree"))?;
        let tree = repo
            .find_tree(tree_id)
            .map_err(git("read the patched tree"))?;
        let subject = commit.message.lines().next().unwrap_or("worker commit");
        let rest: String = commit
            .message
            .lines()
            .skip(1)
            .collect::<Vec<_>>()
            .join("\n");
        let message = compose(
            &trailers::neutralise(subject),
            Some(&trailers::neutralise(&rest)),
            &[
                (trailers::WORK_ITEM, work_item.id.clone()),
                (trailers::CYCLE, cycle.cycle.to_string()),
                (trailers::PROJECTION_ROLE, bundle.role.to_string()),
                (trailers::PROJECTION_COMMIT, commit.id.clone()),
            ],
        );
        let id = repo
            .commit(None, &signature, &signature, &message, &tree, &[&head])
            .map_err(git("write an integration commit"))?;
        pairs.push((commit.id.clone(), id.to_string()));
        head = repo
            .find_commit(id)
            .map_err(git("read an integration commit"))?;
    }
    let branch = work_item.integration_ref(cycle.cycle, bundle.role);
    let unchanged = match repo.find_reference(&branch) {
        Ok(existing) => {
            let current = existing.target().unwrap_or(Oid::ZERO_SHA1);
            if current != head.id() {
                return Err(IntegrateError::BranchDiverged {
                    branch,
                    head: current.to_string(),
                });
            }
            true
        }
        Err(_) => {
            repo.reference(&branch, head.id(), false, "protobot: apply patch bundle")
                .map_err(git("create the integration branch"))?;
            false
        }
    };
    Ok(AppliedPatch {
        branch,
        head: head.id().to_string(),
        commits: pairs,
        patch_digest: bundle.digest.clone(),
        unchanged,
    })
}

/// Merges an applied patch into the work-item branch with a merge commit (never a
/// fast-forward), carrying the cycle trailers.
pub fn merge_into_work_item(
    repo: &Repository,
    work_item: &WorkItemRef,
    applied: &AppliedPatch,
    accepted: &AcceptedBundle,
    cycle: &CycleInfo,
) -> Result<WorkItemMerge, IntegrateError> {
    let bundle = accepted.bundle();
    let branch = work_item.branch_ref();
    let ours_id = repo
        .find_reference(&branch)
        .and_then(|r| r.peel_to_commit())
        .map(|c| c.id())
        .map_err(git("read the work-item branch"))?;
    let theirs_id = Oid::from_str(&applied.head).map_err(git("parse the integration head"))?;
    let last_projection_commit = bundle
        .commits
        .last()
        .map(|c| c.id.clone())
        .unwrap_or_else(|| bundle.base.clone());
    let message = compose(
        &format!(
            "Merge {} cycle {} for {}",
            bundle.role, cycle.cycle, work_item.id
        ),
        None,
        &[
            (trailers::WORK_ITEM, work_item.id.clone()),
            (trailers::CYCLE, cycle.cycle.to_string()),
            (trailers::PROJECTION_ROLE, bundle.role.to_string()),
            (trailers::PROJECTION_ROOT, bundle.base.clone()),
            (trailers::PROJECTION_COMMIT, last_projection_commit),
            (trailers::PATCH_DIGEST, bundle.digest.clone()),
            (trailers::TRIAGE_DECISION, cycle.triage_decision.clone()),
        ],
    );
    let merge = merge_commit(
        repo,
        ours_id,
        theirs_id,
        &message,
        cycle.when,
        &applied.branch,
        &branch,
    )?;
    repo.reference_matching(&branch, merge, true, ours_id, "protobot: merge cycle")
        .map_err(|_| IntegrateError::RefMoved {
            branch: branch.clone(),
            expected: ours_id.to_string(),
        })?;
    Ok(WorkItemMerge {
        branch,
        merge_commit: merge.to_string(),
        parents: vec![ours_id.to_string(), theirs_id.to_string()],
    })
}

/// Writes (without moving any ref) a two-parent merge commit of `ours` and `theirs`.
pub(crate) fn merge_commit(
    repo: &Repository,
    ours: Oid,
    theirs: Oid,
    message: &str,
    when: i64,
    from: &str,
    into: &str,
) -> Result<Oid, IntegrateError> {
    let ours_c = repo
        .find_commit(ours)
        .map_err(git("read our merge parent"))?;
    let theirs_c = repo
        .find_commit(theirs)
        .map_err(git("read their merge parent"))?;
    let mut index = repo
        .merge_commits(&ours_c, &theirs_c, None)
        .map_err(git("merge the trees"))?;
    if index.has_conflicts() {
        let mut paths: Vec<String> = index
            .conflicts()
            .map_err(git("list merge conflicts"))?
            .filter_map(Result::ok)
            .filter_map(|c| c.our.or(c.their).or(c.ancestor))
            .map(|e| String::from_utf8_lossy(&e.path).into_owned())
            .collect();
        paths.sort();
        paths.dedup();
        return Err(IntegrateError::MergeConflict {
            from: from.into(),
            into: into.into(),
            paths,
        });
    }
    let tree_id = index
        .write_tree_to(repo)
        .map_err(git("write the merged tree"))?;
    let tree = repo
        .find_tree(tree_id)
        .map_err(git("read the merged tree"))?;
    let signature = jobsite_signature(when).map_err(git("build the Job Site signature"))?;
    repo.commit(
        None,
        &signature,
        &signature,
        message,
        &tree,
        &[&ours_c, &theirs_c],
    )
    .map_err(git("write the merge commit"))
}

/// Result of [`refresh_work_item`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refresh {
    /// Work-item head after the refresh.
    pub head: String,
    /// The refresh merge commit, or `None` when `main` was already merged in.
    pub merge_commit: Option<String>,
}

/// Merges a default-branch commit into the work-item branch (blocked-item resume, pre-merge
/// revalidation): a merge commit with `Work-Item:` and `Source-Commit:` trailers, never a
/// rebase; a no-op when the commit is already in the branch.
pub fn refresh_work_item(
    repo: &Repository,
    work_item: &WorkItemRef,
    main_commit: Oid,
    when: i64,
) -> Result<Refresh, IntegrateError> {
    let branch = work_item.branch_ref();
    let head = repo
        .find_reference(&branch)
        .and_then(|r| r.peel_to_commit())
        .map(|c| c.id())
        .map_err(git("read the work-item branch"))?;
    let merged = head == main_commit
        || repo
            .graph_descendant_of(head, main_commit)
            .map_err(git("check whether main is merged in"))?;
    if merged {
        return Ok(Refresh {
            head: head.to_string(),
            merge_commit: None,
        });
    }
    let message = compose(
        &format!(
            "Merge {main_commit} into {}",
            branch.trim_start_matches("refs/heads/")
        ),
        None,
        &[
            (trailers::WORK_ITEM, work_item.id.clone()),
            (trailers::SOURCE_COMMIT, main_commit.to_string()),
        ],
    );
    let merge = merge_commit(repo, head, main_commit, &message, when, "main", &branch)?;
    repo.reference_matching(&branch, merge, true, head, "protobot: refresh from main")
        .map_err(|_| IntegrateError::RefMoved {
            branch: branch.clone(),
            expected: head.to_string(),
        })?;
    Ok(Refresh {
        head: merge.to_string(),
        merge_commit: Some(merge.to_string()),
    })
}
