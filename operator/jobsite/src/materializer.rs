//! The Materializer's shell: reads what a registration names from the
//! project's repository and hands the facts to the pure contract builder.
//!
//! Registration is a change-set ID and, optionally, the merge commit the
//! registrar saw (a GitOps `ChangeSet` manifest, `protobot register`, or the
//! default-branch poller). The shell finds the change set's merge commit on the
//! default branch with `approved_merge` (never trusting the registrar's claim
//! alone), reads the manifest and the requirement store *at that commit*
//! through the spec store (no checkout), reruns impact analysis and `check`,
//! and returns [`ChangeSetFacts`]. It never writes to the repository.
//!
//! What it decodes at a commit (the store, its validation, the test catalog) is
//! a pure function of the commit: [`read_facts_with`] and [`read_bug_facts_with`]
//! take it from a [`SnapshotCache`] the caller holds, so a burst of
//! registrations merged together decodes and validates the store once, not once
//! per change set. [`read_facts`] and [`read_bug_facts`] use a cache of their
//! own, for one call.

use std::{path::Path, sync::Arc};

use protobot_spec::{git::Git, impact, model::StoreKind, snapshot};

use crate::{
    contract::{Action, AssessmentStatus, BugFacts, ChangeSetFacts, Disposition, ImpactEntry},
    snapshots::{SnapshotAt, SnapshotCache},
};

/// A registration to materialize.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registration {
    /// Project id.
    pub project_id: String,
    /// `CS-NNNNN`.
    pub change_set_id: String,
    /// The merge commit the registrar saw, if any (verified, never trusted).
    pub merge_commit: Option<String>,
    /// The project's default branch.
    pub default_branch: String,
    /// Build work items this one depends on (resolved by the caller).
    pub depends_on: Vec<String>,
    /// Business priority snapshot.
    pub priority: String,
}

/// Why a registration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MaterializeError {
    /// The repository or a commit could not be read.
    #[error("failed to read the project repository at {path}: {reason}")]
    Repository {
        /// Work tree.
        path: String,
        /// Cause.
        reason: String,
    },
    /// The change set has no merge on the default branch (not approved yet).
    #[error(
        "change set {change_set_id} is not merged on {branch}: {reason}; register it after its pull request merges"
    )]
    NotApproved {
        /// Change set.
        change_set_id: String,
        /// Default branch.
        branch: String,
        /// Detail.
        reason: String,
    },
    /// No branch of the repository holds the change set's manifest: the ID is wrong.
    #[error(
        "there is no change set {change_set_id} on {branch} or any other branch of the repository; check the ID (`ears-manager change-set list` on {branch} lists the approved ones)"
    )]
    NotFound {
        /// Change set.
        change_set_id: String,
        /// Default branch.
        branch: String,
    },
    /// The registrar named another commit than the default branch merged.
    #[error(
        "registration names merge commit {registered} but {branch} merged change set {change_set_id} in {actual}; fix the ChangeSet's mergeCommit"
    )]
    MergeMismatch {
        /// Change set.
        change_set_id: String,
        /// Default branch.
        branch: String,
        /// What the registration said.
        registered: String,
        /// What Git says.
        actual: String,
    },
    /// The manifest is not in the store at the merge commit.
    #[error("change set {0} has no manifest at its merge commit")]
    MissingManifest(String),
    /// A bug report names a requirement that is not active at the spec commit.
    #[error(
        "bug {bug_id} names {requirement_id}, which is not an active requirement on {branch} at {spec_commit}; a true bug violates an approved requirement (name it, or change the spec first)"
    )]
    UnknownRequirement {
        /// Bug.
        bug_id: String,
        /// The requirement named.
        requirement_id: String,
        /// Default branch.
        branch: String,
        /// The commit read.
        spec_commit: String,
    },
}

/// A true-bug report to materialize: no change set, the requirements the
/// current behaviour violates and where it shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BugIntake {
    /// Project id.
    pub project_id: String,
    /// Stable bug identity (tracker id).
    pub bug_id: String,
    /// Requirement ids the behaviour violates (at least one).
    pub violated_requirement_ids: Vec<String>,
    /// Affected scopes.
    pub scopes: Vec<String>,
    /// The project's default branch (its head is the spec commit).
    pub default_branch: String,
    /// Business priority snapshot.
    pub priority: String,
}

/// Reads the facts of a bug report at the head of the default branch: every
/// violated requirement must be active there, and deterministic impact
/// analysis (as for a change set revising them, scoped by the report) marks
/// every candidate applicable.
pub fn read_bug_facts(workdir: &Path, bug: &BugIntake) -> Result<BugFacts, MaterializeError> {
    read_bug_facts_with(workdir, bug, &SnapshotCache::default())
}

/// [`read_bug_facts`], taking what it decodes at the head from `cache` (and keeping it there).
pub fn read_bug_facts_with(
    workdir: &Path,
    bug: &BugIntake,
    cache: &SnapshotCache,
) -> Result<BugFacts, MaterializeError> {
    let repo = git2::Repository::open(workdir).map_err(|e| repo_error(workdir, e))?;
    let branch_ref = format!("refs/heads/{}", bug.default_branch);
    let head = repo
        .refname_to_id(&branch_ref)
        .map_err(|e| repo_error(workdir, format!("no {branch_ref}: {e}")))?;
    let git = Git::discover(workdir).map_err(|f| repo_error(workdir, f.message))?;
    let at = snapshot_at(cache, workdir, &repo, &git, head)?;
    let snap = at.snapshot();
    let requirements: Vec<&protobot_spec::model::Requirement> =
        snap.requirements.iter().map(|r| &r.record).collect();
    let mut interfaces = std::collections::BTreeSet::new();
    for id in &bug.violated_requirement_ids {
        let Some(r) = requirements
            .iter()
            .find(|r| &r.id == id && r.status() == "active")
        else {
            return Err(MaterializeError::UnknownRequirement {
                bug_id: bug.bug_id.clone(),
                requirement_id: id.clone(),
                branch: bug.default_branch.clone(),
                spec_commit: head.to_string(),
            });
        };
        interfaces.extend(r.interfaces().iter().cloned());
    }
    // The report as a change set that revises the violated requirements.
    let probe = protobot_spec::model::ChangeSet {
        operations: Some(
            bug.violated_requirement_ids
                .iter()
                .map(|id| protobot_spec::model::RequirementOp {
                    action: "revise".into(),
                    requirement_id: id.clone(),
                    rationale: String::new(),
                })
                .collect(),
        ),
        affected_interfaces: Some(interfaces.into_iter().collect()),
        affected_scopes: bug.scopes.clone(),
        ..protobot_spec::model::ChangeSet::default()
    };
    let impact = impact::candidates(&probe, requirements.iter().copied())
        .into_iter()
        .map(|c| ImpactEntry {
            requirement_id: c.requirement_id,
            disposition: Disposition::Applicable,
            rationale: format!(
                "true bug: applicable until a reviewed change set says otherwise (matched by {})",
                c.matched_by.join(", ")
            ),
        })
        .collect();
    Ok(BugFacts {
        touched_paths: at.touched_paths(&bug.violated_requirement_ids),
        project_id: bug.project_id.clone(),
        bug_id: bug.bug_id.clone(),
        spec_commit: head.to_string(),
        violated_requirement_ids: bug.violated_requirement_ids.clone(),
        scopes: bug.scopes.clone(),
        priority: bug.priority.clone(),
        impact,
    })
}

fn repo_error(path: &Path, reason: impl std::fmt::Display) -> MaterializeError {
    MaterializeError::Repository {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// The text of the test catalog at `commit`, if it has one that is UTF-8 (a
/// dispatch hint: a missing or malformed catalog gives no touched paths; the build
/// reports it).
fn catalog_text(repo: &git2::Repository, commit: git2::Oid) -> Option<String> {
    repo.find_commit(commit)
        .and_then(|c| c.tree())
        .and_then(|t| t.get_path(Path::new(protobot_repo::catalog::CATALOG_PATH)))
        .and_then(|e| repo.find_blob(e.id()))
        .ok()
        .and_then(|b| String::from_utf8(b.content().to_vec()).ok())
}

/// The spec store and test catalog at `commit` of the repository at `workdir`,
/// from `cache` or read (and kept there): for callers that read more of the
/// project at a registration's commit.
pub fn snapshot_at_commit(
    workdir: &Path,
    commit: git2::Oid,
    cache: &SnapshotCache,
) -> Result<Arc<SnapshotAt>, MaterializeError> {
    let git = Git::discover(workdir).map_err(|f| repo_error(workdir, f.message))?;
    snapshot_at(cache, workdir, &git.repo, &git, commit)
}

/// The spec store and test catalog at `commit`, from `cache` or read (and kept there).
fn snapshot_at(
    cache: &SnapshotCache,
    workdir: &Path,
    repo: &git2::Repository,
    git: &Git,
    commit: git2::Oid,
) -> Result<Arc<SnapshotAt>, MaterializeError> {
    cache.get_or_read(commit, || {
        let vfs = git
            .commit_vfs(commit)
            .map_err(|f| repo_error(workdir, f.message))?;
        let snap = snapshot::open(vfs).map_err(|f| repo_error(workdir, f.message))?;
        Ok(SnapshotAt::new(snap, catalog_text(repo, commit).as_deref()))
    })
}

/// A branch (local or remote-tracking) whose head holds the manifest of
/// `change_set_id` under `store_dir`, if any: where an unapproved change set is.
fn branch_holding(repo: &git2::Repository, change_set_id: &str, store_dir: &str) -> Option<String> {
    let digits = change_set_id.strip_prefix("CS-")?;
    let manifest = format!("{}/cs-{digits}.yaml", store_dir.trim_end_matches('/'));
    let refs = repo.references().ok()?;
    refs.flatten()
        .filter(|r| r.is_branch() || r.is_remote())
        .find_map(|r| {
            let tree = r.peel_to_commit().ok()?.tree().ok()?;
            tree.get_path(Path::new(&manifest)).ok()?;
            r.shorthand().ok().map(str::to_owned)
        })
}

/// Reads the facts of a registration from the work tree at `workdir`.
pub fn read_facts(workdir: &Path, reg: &Registration) -> Result<ChangeSetFacts, MaterializeError> {
    read_facts_with(workdir, reg, &SnapshotCache::default())
}

/// [`read_facts`], taking what it decodes at the default branch's head and at the merge
/// commit from `cache` (and keeping it there): the same facts, whatever the cache holds.
pub fn read_facts_with(
    workdir: &Path,
    reg: &Registration,
    cache: &SnapshotCache,
) -> Result<ChangeSetFacts, MaterializeError> {
    let repo = git2::Repository::open(workdir).map_err(|e| repo_error(workdir, e))?;
    let branch_ref = format!("refs/heads/{}", reg.default_branch);
    let head = repo
        .refname_to_id(&branch_ref)
        .map_err(|e| repo_error(workdir, format!("no {branch_ref}: {e}")))?;
    let git = Git::discover(workdir).map_err(|f| repo_error(workdir, f.message))?;
    let store_dir = snapshot_at(cache, workdir, &repo, &git, head)?
        .snapshot()
        .project
        .store_dir(StoreKind::ChangeSets);
    let approved = protobot_repo::land::approved_merge(
        &repo,
        &branch_ref,
        &reg.change_set_id,
        &store_dir,
    )
    .map_err(
        |e| match branch_holding(&repo, &reg.change_set_id, &store_dir) {
            None if matches!(e, protobot_repo::land::ApprovedMergeError::NotApproved(_)) => {
                MaterializeError::NotFound {
                    change_set_id: reg.change_set_id.clone(),
                    branch: reg.default_branch.clone(),
                }
            }
            found => MaterializeError::NotApproved {
                change_set_id: reg.change_set_id.clone(),
                branch: reg.default_branch.clone(),
                reason: match found {
                    Some(other) => format!(
                        "{e}; it is on {other}: merge that into {} with a merge commit and push it",
                        reg.default_branch
                    ),
                    None => e.to_string(),
                },
            },
        },
    )?;
    if let Some(registered) = &reg.merge_commit
        && !registered.eq_ignore_ascii_case(&approved.merge_commit)
    {
        return Err(MaterializeError::MergeMismatch {
            change_set_id: reg.change_set_id.clone(),
            branch: reg.default_branch.clone(),
            registered: registered.clone(),
            actual: approved.merge_commit,
        });
    }
    let merge = git2::Oid::from_str(&approved.merge_commit).map_err(|e| repo_error(workdir, e))?;
    let at = snapshot_at(cache, workdir, &repo, &git, merge)?;
    let cs = at
        .snapshot()
        .change_set(&reg.change_set_id)
        .map(|r| r.record.clone())
        .ok_or_else(|| MaterializeError::MissingManifest(reg.change_set_id.clone()))?;
    let assessment_status = match at.impact_status(&cs) {
        impact::Status::Complete => AssessmentStatus::Complete,
        impact::Status::Incomplete => AssessmentStatus::Incomplete,
        impact::Status::Stale => AssessmentStatus::Stale,
    };
    let diagnostics = at.diagnostics();
    let unresolved_references = diagnostics
        .iter()
        .filter(|d| d.code.starts_with("reference."))
        .map(|d| format!("{}: {}", d.code, d.record_id.clone().unwrap_or_default()))
        .collect();
    let check_errors = diagnostics.iter().map(|d| d.code.clone()).collect();
    let operations = cs
        .ops()
        .iter()
        .filter_map(|op| {
            let action = match op.action.as_str() {
                "add" => Action::Add,
                "revise" => Action::Revise,
                "retire" => Action::Retire,
                _ => return None,
            };
            Some((action, op.requirement_id.clone()))
        })
        .collect();
    let impact = cs
        .impact_assessment
        .iter()
        .map(|a| ImpactEntry {
            requirement_id: a.requirement_id.clone(),
            disposition: if a.disposition == "applicable" {
                Disposition::Applicable
            } else {
                Disposition::NotApplicable
            },
            rationale: a.rationale.clone(),
        })
        .collect();
    let changed: Vec<String> = cs
        .ops()
        .iter()
        .filter(|op| op.action != "retire")
        .map(|op| op.requirement_id.clone())
        .collect();
    let touched_paths = at.touched_paths(&changed);
    Ok(ChangeSetFacts {
        touched_paths,
        project_id: reg.project_id.clone(),
        change_set_id: reg.change_set_id.clone(),
        merge_commit: approved.merge_commit,
        operations,
        affected_interfaces: cs.affected_interfaces.clone().unwrap_or_default(),
        affected_scopes: cs.affected_scopes.clone(),
        // A missing key is a `check` error; the contract still needs a value.
        implementation_required: cs.implementation_required.unwrap_or(true),
        impact,
        assessment_status,
        merged_on_default_branch: true,
        check_errors,
        unresolved_references,
        depends_on: reg.depends_on.clone(),
        priority: reg.priority.clone(),
    })
}
