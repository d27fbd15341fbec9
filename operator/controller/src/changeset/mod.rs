//! The ChangeSet controller: GitOps registration. A `ChangeSet` manifest
//! (applied by Argo CD, Flux, `kubectl` or `protobot register`) is all it takes
//! to materialize an approved change set.
//!
//! Pipeline, one step per stage; only the edges touch the cluster:
//! read (the ChangeSet, its Project) → verify (the change set's merge on the
//! default branch, the manifest at that commit: `jobsite::materializer`; for a
//! Project with a forge, the approving pull request too: [`check_approval`]) →
//! decide (the build contract: `jobsite::contract`) → apply (the `materialize`
//! command through the Kubernetes WorkStore) → status ([`decide::status`],
//! server-side applied under this controller's field manager).
//!
//! A ChangeSet whose project, commit or manifest is wrong records why on its
//! status and waits for a change (no retry storm); a repository or API failure
//! requeues with backoff.
//!
//! Every reconcile of the controller reads the spec store through one
//! [`SnapshotCache`]: a commit's store is decoded and validated once, however
//! many ChangeSets were merged in it (issue 35).

pub mod decide;

use std::{path::PathBuf, sync::Arc, time::Duration};

use jiff::{SignedDuration, Timestamp};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::controller::Action,
};
use protobot_api::{ChangeSet, Project, change_set::ApprovingPullRequest};
use protobot_forge::core::approval::{ApprovalClaim, ApprovedPullRequest, ReviewMode};
use protobot_jobsite::{
    contract::{BuildContract, Intake, build},
    materializer::{MaterializeError, Registration, read_facts_with, snapshot_at_commit},
    snapshots::SnapshotCache,
};
use protobot_lifecycle::{AuthorizationContext, Grant, ResultEnvelope, Role};
use protobot_stores::{AdapterConfig, KubeStore, WorkStore};

use decide::Outcome;

/// Field manager of this controller's server-side applies.
pub const FIELD_MANAGER: &str = "protobot/changeset";
/// Trusted subject the operator materializes as.
pub const MATERIALIZER_SUBJECT: &str = "protobot-materializer";
/// Policy version of the operator's in-process Gate.
pub const POLICY_VERSION: &str = "protobot-policy/v1";

pub use crate::registration::{Context, Error};

/// Where a Project's repository lives on this machine: a path or `file://` URL.
pub fn local_repository(url: &str) -> Option<PathBuf> {
    let path = url.strip_prefix("file://").unwrap_or(url);
    path.starts_with('/').then(|| PathBuf::from(path))
}

fn materializer_context(project: &str, now: Timestamp) -> AuthorizationContext {
    AuthorizationContext::new(Grant {
        project,
        role: Role::Materializer,
        subject: MATERIALIZER_SUBJECT,
        actions: &["materialize"],
        expires_at: now + SignedDuration::from_mins(5),
        policy_version: POLICY_VERSION,
    })
}

/// One reconcile of one ChangeSet (the spec store read through a cache of its own).
pub async fn reconcile(cs: Arc<ChangeSet>, ctx: Arc<Context>) -> Result<Action, Error> {
    reconcile_with(cs, ctx, Arc::default()).await
}

/// One reconcile of one ChangeSet, the spec store read through `snapshots` (shared by the
/// controller's reconciles).
pub async fn reconcile_with(
    cs: Arc<ChangeSet>,
    ctx: Arc<Context>,
    snapshots: Arc<SnapshotCache>,
) -> Result<Action, Error> {
    let name = cs.name_any();
    let ns = cs.namespace().ok_or_else(|| Error::MissingNamespace {
        kind: "ChangeSet",
        name: name.clone(),
    })?;
    let now = Timestamp::now();
    let outcome = verify_and_materialize(&cs, &ns, ctx.as_ref(), now, &snapshots).await?;
    let status = decide::status(cs.status.as_ref(), &outcome, cs.metadata.generation, now);
    if cs.status.as_ref() != Some(&status) {
        let api: Api<ChangeSet> = Api::namespaced(ctx.client.clone(), &ns);
        let body = serde_json::json!({
            "apiVersion": "protobot.dev/v1alpha1",
            "kind": "ChangeSet",
            "status": status,
        });
        api.patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| Error::WriteStatus {
            kind: "ChangeSet",
            name: name.clone(),
            source,
        })?;
    }
    tracing::info!(change_set = %cs.spec.change_set_id, outcome = outcome.as_str(), "reconciled");
    Ok(match outcome {
        // Nothing changes until someone edits the ChangeSet or the Project.
        Outcome::ProjectNotFound(_)
        | Outcome::NotVerified(_)
        | Outcome::ManifestInvalid(_)
        | Outcome::NotApproved { .. } => Action::await_change(),
        Outcome::RepositoryUnavailable(_) | Outcome::ForgeUnavailable(_) => {
            Action::requeue(Duration::from_secs(30))
        }
        Outcome::Materialized { .. } => Action::await_change(),
    })
}

fn ctx_workdir(workdir: &std::path::Path, ns: &str, project: &str) -> PathBuf {
    workdir.join(ns).join(project).join("registry")
}

async fn verify_and_materialize(
    cs: &ChangeSet,
    ns: &str,
    ctx: &Context,
    now: Timestamp,
    snapshots: &Arc<SnapshotCache>,
) -> Result<Outcome, Error> {
    let (client, workdir) = (&ctx.client, ctx.workdir.as_path());
    let projects: Api<Project> = Api::namespaced(client.clone(), ns);
    let project_name = cs.spec.project_ref.name.clone();
    let project = match projects.get_opt(&project_name).await {
        Ok(Some(p)) => p,
        Ok(None) => {
            return Ok(Outcome::ProjectNotFound(format!(
                "Project {project_name} does not exist in {ns}"
            )));
        }
        Err(source) => {
            return Err(Error::ReadProject {
                name: project_name,
                source,
            });
        }
    };
    // The forge first: a GitHub App's client mints the installation tokens git
    // authenticates with, so the mirror below must not run before it exists.
    let forge = match ctx.forges.for_project(&project).await {
        Ok(forge) => forge,
        Err(e) => return Ok(Outcome::ForgeUnavailable(e.to_string())),
    };
    // Read through the operator's repository cache: a working clone whose default
    // branch mirrors the project's remote (the remote itself may be bare).
    let repo = ctx_workdir(workdir, ns, &project_name);
    if let Err(reason) = mirror_prepared(&project, ctx.repositories, repo.clone()).await {
        return Ok(Outcome::RepositoryUnavailable(reason));
    }
    let declared_in = repo.clone();
    let registration = Registration {
        project_id: project_name.clone(),
        change_set_id: cs.spec.change_set_id.clone(),
        merge_commit: Some(cs.spec.merge_commit.clone()),
        default_branch: project.spec.default_branch.clone(),
        depends_on: Vec::new(),
        priority: cs
            .spec
            .business_priority
            .map(|p| format!("{p:?}").to_lowercase())
            .unwrap_or_default(),
    };
    // Git reads are blocking; keep them off the async workers.
    let cache = Arc::clone(snapshots);
    let facts = tokio::task::spawn_blocking(move || read_facts_with(&repo, &registration, &cache))
        .await
        .map_err(|e| MaterializeError::Repository {
            path: String::new(),
            reason: e.to_string(),
        });
    let facts = match facts.and_then(|r| r) {
        Ok(f) => f,
        Err(MaterializeError::Repository { reason, .. }) => {
            return Ok(Outcome::RepositoryUnavailable(reason));
        }
        Err(
            e @ (MaterializeError::NotApproved { .. }
            | MaterializeError::NotFound { .. }
            | MaterializeError::MergeMismatch { .. }),
        ) => {
            return Ok(Outcome::NotVerified(e.to_string()));
        }
        Err(
            e
            @ (MaterializeError::MissingManifest(_) | MaterializeError::UnknownRequirement { .. }),
        ) => {
            return Ok(Outcome::ManifestInvalid(e.to_string()));
        }
    };
    // Only a merge the forge confirms an approving pull request made is materialized.
    let approval = match check_approval_with(forge, &project, cs, declared_in, snapshots).await {
        Ok(approval) => approval,
        Err(refused) => return Ok(refused),
    };
    let contract = match build(&Intake::ChangeSet(facts)) {
        Ok(c) => c,
        Err(e) => return Ok(Outcome::ManifestInvalid(e.to_string())),
    };
    let result = materialize(client, ns, &project, &contract, now)
        .await
        .map_err(|source| Error::Store {
            what: format!("change set {}", cs.spec.change_set_id),
            source,
        })?;
    Ok(Outcome::Materialized {
        contract: Box::new(contract),
        result: Box::new(result),
        approval,
    })
}

/// The approval check of a Project with a forge (docs/forge-github.md §1): `Ok(None)` when the
/// Project has no forge, `Ok(Some(pull request))` when the forge found the approving pull
/// request; else the outcome that stops registration (a refusal with its code, or a forge
/// that could not be asked). `forge` is the Project's, as [`ForgeClients::for_project`] set it
/// up.
///
/// [`ForgeClients::for_project`]: crate::forge::ForgeClients::for_project
pub async fn check_approval(
    forge: Option<Arc<crate::forge::ProjectForge>>,
    project: &Project,
    cs: &ChangeSet,
    repo: PathBuf,
) -> Result<Option<ApprovingPullRequest>, Outcome> {
    check_approval_with(forge, project, cs, repo, &Arc::default()).await
}

/// [`check_approval`], reading `project.yaml` at the merge through `snapshots`.
async fn check_approval_with(
    forge: Option<Arc<crate::forge::ProjectForge>>,
    project: &Project,
    cs: &ChangeSet,
    repo: PathBuf,
    snapshots: &Arc<SnapshotCache>,
) -> Result<Option<ApprovingPullRequest>, Outcome> {
    let Some(forge) = forge else {
        return Ok(None);
    };
    let merge = cs.spec.merge_commit.clone();
    let cache = Arc::clone(snapshots);
    let declared = tokio::task::spawn_blocking(move || declared_review(&repo, &merge, &cache))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
    let (branch_prefix, declared_mode) = declared.map_err(Outcome::RepositoryUnavailable)?;
    let claim = ApprovalClaim {
        change_set_id: cs.spec.change_set_id.clone(),
        merge_commit: cs.spec.merge_commit.clone(),
        default_branch: project.spec.default_branch.clone(),
        branch_prefix,
        repository: forge.config.repository.clone(),
        review_mode: review_mode(forge.config.review_mode, declared_mode.as_deref()),
    };
    match forge.client.approved_merge(&claim).await {
        Ok(Ok(approved)) => {
            tracing::info!(
                change_set = %claim.change_set_id,
                pull_request = approved.number(),
                approvers = ?approved.approvers(),
                "the merge's pull request approves the change set"
            );
            Ok(Some(approving_pull_request(&approved)))
        }
        Ok(Err(refusal)) => Err(Outcome::NotApproved {
            code: refusal.code(),
            message: refusal.to_string(),
        }),
        Err(error) => Err(Outcome::ForgeUnavailable(format!(
            "unable to check the approving pull request on {}: {error}",
            forge.config.repository
        ))),
    }
}

/// How many approvers `status.approval` lists (the CRD's bound); the rest are counted in the
/// log line of the check.
const APPROVERS_SHOWN: usize = 64;

/// The status record of the forge's proof.
fn approving_pull_request(approved: &ApprovedPullRequest) -> ApprovingPullRequest {
    ApprovingPullRequest {
        number: approved.number(),
        url: approved.html_url().to_string(),
        merge_commit: approved.merge_commit().to_string(),
        approvers: approved
            .approvers()
            .iter()
            .take(APPROVERS_SHOWN)
            .cloned()
            .collect(),
    }
}

/// The review mode approvals are checked under: the spec's, else the one `project.yaml`
/// declares, else `multi-player` (the stricter: an undeclared mode never lets an unreviewed
/// merge through).
pub fn review_mode(spec: Option<ReviewMode>, declared: Option<&str>) -> ReviewMode {
    spec.unwrap_or(match declared {
        Some("single-player") => ReviewMode::SinglePlayer,
        _ => ReviewMode::MultiPlayer,
    })
}

/// `repository.branch_prefix` and `repository.review_mode` of `project.yaml` at `merge` in
/// the clone `repo` (read as the materializer reads the change set).
fn declared_review(
    repo: &std::path::Path,
    merge: &str,
    snapshots: &SnapshotCache,
) -> Result<(String, Option<String>), String> {
    let oid = git2::Oid::from_str(merge).map_err(|e| format!("merge commit {merge}: {e}"))?;
    let at = snapshot_at_commit(repo, oid, snapshots).map_err(|e| match e {
        MaterializeError::Repository { reason, .. } => reason,
        other => other.to_string(),
    })?;
    let project = &at.snapshot().project;
    let mode = project
        .repository
        .as_ref()
        .and_then(|r| r.review_mode.clone());
    Ok((project.branch_prefix(), mode))
}

/// Brings the operator's clone of `project` in `dir` up to its remote's default
/// branch (git is blocking: it runs off the async workers). The error says
/// which repository could not be mirrored and why — a location `repositories` does not
/// allow included, before anything is read. The Project's forge is set up first through
/// `forges`: a GitHub App's client mints the installation tokens git authenticates with.
pub(crate) async fn mirror_project(
    project: &Project,
    repositories: crate::project::decide::RepositoryPolicy,
    dir: PathBuf,
    forges: &crate::forge::ForgeClients,
) -> Result<(), String> {
    if let Err(e) = forges.for_project(project).await {
        return Err(format!(
            "repository {} could not be mirrored: the forge (spec.forge) could not be set up: {e}",
            project.spec.repo_url
        ));
    }
    mirror_prepared(project, repositories, dir).await
}

/// [`mirror_project`] for a caller that has set the Project's forge up already.
async fn mirror_prepared(
    project: &Project,
    repositories: crate::project::decide::RepositoryPolicy,
    dir: PathBuf,
) -> Result<(), String> {
    let secret = crate::repo_cache::project_secret(
        project.metadata.namespace.as_deref().unwrap_or_default(),
        project,
    );
    let branch = project.spec.default_branch.clone();
    let url = crate::repo_cache::clone_url(&project.spec.repo_url, repositories);
    tokio::task::spawn_blocking(move || {
        crate::repo_cache::mirror_with(&url?, &branch, &dir, secret.as_ref())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r.map_err(|e| e.to_string()))
    .map_err(|reason| {
        crate::project::decide::redact_credentials(&format!(
            "repository {} could not be mirrored: {reason}",
            project.spec.repo_url
        ))
    })
}

/// Sends `contract`'s `materialize` command through the project's Kubernetes
/// work store as the operator's Materializer: the create-or-return of the
/// contract's materialization key (a replay returns the first result).
pub(crate) async fn materialize(
    client: &Client,
    ns: &str,
    project: &Project,
    contract: &BuildContract,
    now: Timestamp,
) -> Result<ResultEnvelope, protobot_stores::StoreError> {
    let project_name = project.name_any();
    let store = KubeStore::new(
        client.clone(),
        ns,
        &project_name,
        AdapterConfig {
            materializer_subject: MATERIALIZER_SUBJECT.into(),
            lease_seconds: i64::from(project.spec.lease_duration_seconds),
        },
    );
    let ctx = materializer_context(&project_name, now);
    let env = contract.materialize_envelope(&project_name, "protobot-operator");
    store.execute(Some(&ctx), &env, now).await
}

/// Requeues failed reconciles with a delay (the runtime adds its own backoff per object).
pub fn error_policy(_cs: Arc<ChangeSet>, _error: &Error, _ctx: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

/// Runs the controller until the stream ends (shutdown), with the repository cache
/// under `workdir` and the repository locations `repositories` allows. Approvals of Projects
/// with a forge are checked with clients of its own (API calls not counted: see
/// [`run_forged`]).
pub async fn run_with(
    client: Client,
    namespace: Option<String>,
    workdir: PathBuf,
    repositories: crate::project::decide::RepositoryPolicy,
) {
    run_metered(client, namespace, workdir, repositories, None).await;
}

/// [`run_with`], with reconciles timed and failures counted (`controller="changeset"`).
pub async fn run_metered(
    client: Client,
    namespace: Option<String>,
    workdir: PathBuf,
    repositories: crate::project::decide::RepositoryPolicy,
    metrics: Option<crate::metrics::JobSiteMetrics>,
) {
    let forges = Arc::new(crate::forge::ForgeClients::new(client.clone(), None));
    run_forged(client, namespace, workdir, repositories, metrics, forges).await;
}

/// [`run_metered`] with the operator's forge clients (shared with the Job Site, their API
/// calls counted on the operator's registry).
pub async fn run_forged(
    client: Client,
    namespace: Option<String>,
    workdir: PathBuf,
    repositories: crate::project::decide::RepositoryPolicy,
    metrics: Option<crate::metrics::JobSiteMetrics>,
    forges: Arc<crate::forge::ForgeClients>,
) {
    let api = crate::drive::scoped_api::<ChangeSet>(client.clone(), namespace.as_deref());
    let ctx = Arc::new(Context {
        client,
        workdir,
        repositories,
        forges,
    });
    let projects = crate::drive::scoped_api::<Project>(ctx.client.clone(), namespace.as_deref());
    // At most `materializations()` ChangeSets are reconciled at once. A materialization
    // reads and validates the project's spec store at the merge commit on the blocking pool
    // (CPU-bound, O(size of the store) on a cache miss; the cache below makes it once per
    // commit); unbounded, a flood of 1,000 ChangeSets ran 1,000 of
    // them side by side on 2 cores, none finished within minutes and the process grew past
    // 600 MiB (docs/capacity.md). Bounded, they finish one after another at the machine's pace.
    let controller = kube::runtime::Controller::new(api, kube::runtime::watcher::Config::default())
        .with_config(kube::runtime::controller::Config::default().concurrency(materializations()));
    let change_sets = controller.store();
    // A ChangeSet waits for its Project (applied later, as GitOps tools may order them, or
    // its repository reachable again): a Project's change reconciles the ChangeSets that
    // name it and are not materialized yet. Materialized ones are left alone.
    let controller = controller.watches(
        projects,
        kube::runtime::watcher::Config::default(),
        move |project: Project| waiting_for(&change_sets.state(), &project),
    );
    // One cache for every reconcile: a flood merged in one commit decodes its store once.
    let snapshots = Arc::new(SnapshotCache::default());
    let reconcile = move |cs, ctx| reconcile_with(cs, ctx, Arc::clone(&snapshots));
    let runner = crate::drive::Runner::new("changeset")
        .metered(metrics)
        .publishing(ctx.client.clone());
    runner.run(controller, reconcile, error_policy, ctx).await;
}

/// How many ChangeSets the controller reconciles at once: the machine's cores (at least 1,
/// at most 8), as materializations are CPU-bound.
pub fn materializations() -> u16 {
    std::thread::available_parallelism()
        .map(|n| u16::try_from(n.get()).unwrap_or(8))
        .unwrap_or(1)
        .clamp(1, 8)
}

/// The ChangeSets of `change_sets` that name `project` (same namespace) and have no work
/// item yet: those a change of the Project may unblock.
fn waiting_for(
    change_sets: &[Arc<ChangeSet>],
    project: &Project,
) -> Vec<kube::runtime::reflector::ObjectRef<ChangeSet>> {
    let (ns, name) = (project.namespace(), project.name_any());
    change_sets
        .iter()
        .filter(|cs| cs.namespace() == ns && cs.spec.project_ref.name == name)
        .filter(|cs| cs.status.as_ref().is_none_or(|s| s.work_item_ref.is_none()))
        .map(|cs| kube::runtime::reflector::ObjectRef::from_obj(cs.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_review_mode_wins_and_an_undeclared_one_is_multi_player() {
        assert_eq!(
            review_mode(Some(ReviewMode::SinglePlayer), Some("multi-player")),
            ReviewMode::SinglePlayer
        );
        assert_eq!(
            review_mode(None, Some("single-player")),
            ReviewMode::SinglePlayer
        );
        assert_eq!(
            review_mode(None, Some("multi-player")),
            ReviewMode::MultiPlayer
        );
        assert_eq!(review_mode(None, None), ReviewMode::MultiPlayer);
    }
}
