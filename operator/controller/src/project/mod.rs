//! The Project controller: what the operator observes about each repository
//! under its care, on the Project's status.
//!
//! Pipeline, one step per stage; only the edges touch the cluster:
//! read (the Project) → validate ([`decide::validate_spec`]) → observe (mirror
//! the repository into the operator's cache, the default branch's head, the
//! spec store's `project.yaml` at that head, the sandbox profile's conformance)
//! → decide ([`decide::status`], [`decide::ready_event`],
//! [`decide::requeue_after`]) → apply (the status, server-side applied under
//! this controller's field manager; an Event when `Ready` changes).
//!
//! An invalid spec records why on the status and waits for a change (no retry
//! storm); an unreachable repository is retried with a growing delay; every
//! other Project is looked at again every minute, to notice a moved head. Every
//! replica runs this controller: the status is a pure function of what the
//! replica observed, applied under one field manager, so concurrent replicas
//! write the same thing.

pub mod decide;
pub mod poll;

use std::{collections::BTreeMap, path::Path, path::PathBuf, sync::Arc, time::Duration};

use jiff::Timestamp;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        controller::Action,
        events::{Recorder, Reporter},
    },
};
use protobot_api::{Project, ProjectStatus, project::SandboxConformance};
use protobot_spec::{git::Git, outcome::Failure, snapshot};

use decide::{ConfigCheck, Conformance, Outcome, RepoFailure};

/// Field manager of this controller's server-side applies.
pub const FIELD_MANAGER: &str = "protobot/project";
/// The `reportingController` of this controller's Events.
pub const EVENT_REPORTER: &str = "protobot-project";

/// Errors of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object has no namespace (the CRD is namespaced; this is a bug).
    #[error("Project {0} has no namespace; Projects are namespaced, recreate it in a namespace")]
    MissingNamespace(String),
    /// Writing the status failed.
    #[error(
        "failed to write the status of Project {name}: {source}; check the operator's RBAC for projects/status"
    )]
    WriteStatus {
        /// Project.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// Stable category for metrics and Events.
    pub fn category(&self) -> &'static str {
        match self {
            Error::MissingNamespace(_) => "missing-namespace",
            Error::WriteStatus { .. } => "write-status",
        }
    }
}

/// Shared state of the controller.
pub struct Context {
    /// The client.
    pub client: Client,
    /// The repository cache (one clone per Project under `<ns>/<name>/project`).
    pub workdir: PathBuf,
    /// Conformance summaries of the sandbox profiles this operator knows, by
    /// profile name. A profile missing here is reported `SandboxConformant=Unknown`.
    pub conformance: BTreeMap<String, SandboxConformance>,
    /// Where sandbox profiles and their conformance reports are read from when
    /// `conformance` has no summary for a profile.
    pub profiles: Option<ProfileReports>,
    /// Publishes the `Ready` Events.
    pub recorder: Recorder,
    /// Which repository locations Projects may name. [`Context::new`] allows local paths
    /// (as every caller did before the policy existed); `protobot operator` passes its
    /// `--allow-local-repositories` flag, off by default.
    pub repositories: decide::RepositoryPolicy,
    /// The operator's forge clients (shared with the ChangeSet controller and the Job Site).
    /// A Project whose repository is served with its GitHub App's installation tokens needs
    /// its App client built before its repository is read: the git transport mints tokens
    /// through it. `None`: this controller builds no forge client.
    pub forges: Option<Arc<crate::forge::ForgeClients>>,
}

/// Where the controller finds sandbox profiles (`<dir>/<name>.yaml`, the chart's
/// profiles ConfigMap mount) and the namespace of their conformance-report
/// ConfigMaps. Every replica reads the same files and ConfigMaps, so replicas
/// agree on `SandboxConformant`.
#[derive(Clone, Debug)]
pub struct ProfileReports {
    /// Directory of the profile documents.
    pub dir: PathBuf,
    /// Namespace of the sandbox pods and report ConfigMaps.
    pub namespace: String,
}

impl Context {
    /// A context with no conformance information that accepts network repositories only
    /// (set [`Context::repositories`] to allow local ones). Installs the process's
    /// credentials source (Secrets read through `client`, once per git operation).
    pub fn new(client: Client, workdir: PathBuf) -> Context {
        crate::repo_cache::SecretResolver::install(&client);
        Context {
            recorder: Recorder::new(client.clone(), Reporter::from(EVENT_REPORTER)),
            client,
            workdir,
            conformance: BTreeMap::new(),
            profiles: None,
            repositories: decide::RepositoryPolicy::default(),
            forges: None,
        }
    }
}

/// The clone of a Project's repository this controller observes (its own, so it
/// never races the ChangeSet controller's or the Job Site's clones).
pub fn clone_dir(workdir: &Path, ns: &str, project: &str) -> PathBuf {
    workdir.join(ns).join(project).join("project")
}

/// One reconcile of one Project.
pub async fn reconcile(project: Arc<Project>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = project.name_any();
    let ns = project
        .namespace()
        .ok_or_else(|| Error::MissingNamespace(name.clone()))?;
    let now = Timestamp::now();
    let outcome = observe(&project, &clone_dir(&ctx.workdir, &ns, &name), &ctx).await;
    let before = project.status.as_ref();
    let mut status = decide::status(before, &outcome, project.metadata.generation, now);
    let polling = project.spec.poll_approved_change_sets.as_ref();
    let observed_head = match &outcome {
        Outcome::Observed { head, .. } => Some(head.clone()),
        _ => None,
    };
    // Polling counts from the first head it saw unless the spec names a commit.
    if let (Some(p), Some(head)) = (polling, &observed_head)
        && p.since_commit.is_none()
        && status.poll_baseline.is_none()
    {
        status.poll_baseline = Some(head.clone());
    }
    if before != Some(&status) {
        let api: Api<Project> = Api::namespaced(ctx.client.clone(), &ns);
        // `status.queue` is the Job Site's (field manager `protobot/jobsite`): this
        // controller's apply leaves it out so it never owns (or rewinds) it.
        let owned = ProjectStatus {
            queue: None,
            ..status.clone()
        };
        let body = serde_json::json!({
            "apiVersion": "protobot.dev/v1alpha1",
            "kind": "Project",
            "status": owned,
        });
        api.patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| Error::WriteStatus {
            name: name.clone(),
            source,
        })?;
        if let Some(event) = decide::ready_event(before, &status) {
            // Events are best effort: a lost Event never fails the reconcile.
            if let Err(e) = ctx
                .recorder
                .publish(&crate::events::bounded(&event), &project.object_ref(&()))
                .await
            {
                tracing::warn!(project = %name, error = %e, "could not publish an event");
            }
        }
    }
    if let (Some(p), Some(head)) = (polling, &observed_head)
        && let Some(baseline) = p.since_commit.clone().or(status.poll_baseline.clone())
    {
        register_merged(&project, &ns, &ctx, baseline, head.clone()).await;
    }
    tracing::info!(project = %name, outcome = outcome.as_str(), "reconciled");
    Ok(match decide::requeue_after(&outcome, &status, now) {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// Field manager of the `ChangeSet` objects the poller applies.
pub const POLLER_FIELD_MANAGER: &str = "protobot/project-poller";

/// Registers (server-side applies a `ChangeSet` for) every change set merged
/// since `baseline` ([`poll`]). Failures are logged and retried at the next
/// observation; a registration already applied is applied again unchanged.
async fn register_merged(
    project: &Project,
    ns: &str,
    ctx: &Context,
    baseline: String,
    head: String,
) {
    let name = project.name_any();
    let dir = clone_dir(&ctx.workdir, ns, &name);
    let branch = project.spec.default_branch.clone();
    let found =
        tokio::task::spawn_blocking(move || poll::merged_since(&dir, &branch, &baseline, &head))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
    let (merged, skipped) = match found {
        Ok(found) => found,
        Err(reason) => {
            tracing::warn!(project = %name, %reason, "could not poll the default branch for change sets");
            return;
        }
    };
    for why in skipped {
        tracing::info!(project = %name, reason = %why, "not registering a change set that did not arrive by a merge");
    }
    let api: Api<protobot_api::ChangeSet> = Api::namespaced(ctx.client.clone(), ns);
    for m in merged {
        let object = poll::change_set_object(project, &m);
        let object_name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        match api
            .patch(
                &object_name,
                &PatchParams::apply(POLLER_FIELD_MANAGER),
                &Patch::Apply(&object),
            )
            .await
        {
            Ok(_) => {
                tracing::info!(project = %name, change_set = %m.change_set_id, object = %object_name, "registered a merged change set")
            }
            Err(e) => {
                tracing::warn!(project = %name, change_set = %m.change_set_id, error = %e, "could not register a merged change set; retrying at the next observation")
            }
        }
    }
}

async fn conformance(ctx: &Context, profile: &str) -> Conformance {
    if let Some(report) = ctx.conformance.get(profile) {
        return Conformance::Report(report.clone());
    }
    let Some(source) = &ctx.profiles else {
        return Conformance::Unavailable(format!(
            "this operator was started without sandbox profiles, so it cannot check profile {profile} \
             (the Job Site checks its own profile's report when it starts and claims no work while it fails)"
        ));
    };
    let path = source.dir.join(format!("{profile}.yaml"));
    let loaded = match protobot_kube_executor::SandboxProfile::load(&path) {
        Ok(p) => p,
        Err(e) => {
            return Conformance::Unavailable(format!(
                "sandbox profile {profile} cannot be read from {}: {e}; install it with the chart's sandbox profiles",
                path.display()
            ));
        }
    };
    match protobot_kube_executor::read_report_configmap(
        ctx.client.clone(),
        &source.namespace,
        &loaded,
    )
    .await
    {
        Ok(Some(report)) => {
            Conformance::Report(decide::summarize(profile, &report, None, Timestamp::now()))
        }
        Ok(None) => Conformance::Missing(format!(
            "no conformance report is stored for sandbox profile {profile} in namespace {}; the chart measures it with a Job on install and upgrade (re-run it: kubectl create job --from=cronjob/<release>-protobot-conformance <name>), or run 'protobot sandbox conformance --profile {profile}' against the cluster: the Job Site schedules nothing for this project until a passing report is stored",
            source.namespace
        )),
        Err(e) => Conformance::Unavailable(format!(
            "the conformance report of sandbox profile {profile} could not be read: {e}"
        )),
    }
}

async fn observe(project: &Project, dir: &Path, ctx: &Context) -> Outcome {
    let spec = &project.spec;
    // The same location check every controller that clones makes (repo_cache::clone_url).
    let clone_url = crate::repo_cache::clone_url(&spec.repo_url, ctx.repositories);
    let problems: Vec<String> = [
        decide::validate_spec(spec).err(),
        clone_url.as_ref().err().map(ToString::to_string),
    ]
    .into_iter()
    .flatten()
    .collect();
    let (Ok(url), true) = (clone_url, problems.is_empty()) else {
        return Outcome::InvalidSpec(problems.join("; "));
    };
    let conformance = conformance(ctx, &spec.sandbox_profile).await;
    // The forge's identity may be what git authenticates with (a GitHub App's installation
    // tokens): set it up first, so reading the repository never depends on another
    // controller having done it.
    if let Some(forges) = &ctx.forges
        && let Err(e) = forges.for_project(project).await
    {
        return Outcome::Unreachable {
            failure: RepoFailure::CredentialsUnavailable,
            reason: decide::redact_credentials(&format!(
                "repository {} could not be read: the forge (spec.forge) could not be set up: {e}",
                spec.repo_url
            )),
            conformance,
        };
    }
    let ns = project.namespace().unwrap_or_default();
    let secret = crate::repo_cache::project_secret(&ns, project);
    let local = crate::changeset::local_repository(&spec.repo_url);
    let (url, branch, spec_path, dir) = (
        url,
        spec.default_branch.clone(),
        spec.spec_path.clone(),
        dir.to_path_buf(),
    );
    // Git is blocking; keep it off the async workers.
    let observed = tokio::task::spawn_blocking(move || {
        // libgit2 calls a missing local path an "unsupported URL protocol".
        if let Some(path) = local.filter(|p| !p.exists()) {
            return Err(ObserveError::Other(format!(
                "{} does not exist",
                path.display()
            )));
        }
        observe_repository(&url, &branch, &dir, &spec_path, secret.as_ref())
    })
    .await
    .map_err(|e| ObserveError::Other(e.to_string()))
    .and_then(|r| r);
    match observed {
        Ok((head, config)) => Outcome::Observed {
            head,
            config,
            conformance,
        },
        Err(ObserveError::Access(e)) => Outcome::Unreachable {
            failure: RepoFailure::of(&e),
            reason: decide::redact_credentials(&format!(
                "repository {} could not be read: {e}",
                spec.repo_url
            )),
            conformance,
        },
        Err(e) => Outcome::Unreachable {
            failure: RepoFailure::Unavailable,
            reason: decide::redact_credentials(&format!(
                "repository {} could not be read: {e}; check spec.repoUrl, spec.defaultBranch and the operator's access to the repository",
                spec.repo_url
            )),
            conformance,
        },
    }
}

/// Why the repository could not be observed.
#[derive(Debug, thiserror::Error)]
enum ObserveError {
    /// Credentials, host key or certificate (the message names the Secret).
    #[error(transparent)]
    Access(protobot_repo::remote::AccessError),
    /// Mirroring failed otherwise.
    #[error(transparent)]
    Mirror(crate::repo_cache::MirrorError),
    /// The clone could not be read.
    #[error("failed to {operation}: {source}")]
    Git {
        operation: &'static str,
        #[source]
        source: git2::Error,
    },
    /// Anything else (a missing path or branch).
    #[error("{0}")]
    Other(String),
}

/// Mirrors the repository, returns the default branch's head as the remote
/// reports it and the project configuration at that head.
fn observe_repository(
    url: &str,
    branch: &str,
    dir: &Path,
    spec_path: &str,
    secret: Option<&protobot_repo::remote::SecretRef>,
) -> Result<(String, ConfigCheck), ObserveError> {
    let git = |operation: &'static str| move |source| ObserveError::Git { operation, source };
    let tracking = format!("refs/remotes/origin/{branch}");
    // Forget the last fetched head, so a branch deleted on the remote reads as missing.
    if let Ok(repo) = git2::Repository::open(dir)
        && let Ok(mut r) = repo.find_reference(&tracking)
    {
        r.delete().map_err(git("forget the last fetched head"))?;
    }
    crate::repo_cache::mirror_with(url, branch, dir, secret).map_err(|e| match e {
        crate::repo_cache::MirrorError::Fetch {
            source: protobot_repo::land::LandError::Access { source, .. },
        } => ObserveError::Access(source),
        other => ObserveError::Mirror(other),
    })?;
    let repo = git2::Repository::open(dir).map_err(git("open the clone"))?;
    let head = match repo.refname_to_id(&tracking) {
        Ok(head) => head,
        Err(e) if e.code() == git2::ErrorCode::NotFound => {
            return Err(ObserveError::Other(format!(
                "the repository has no branch {branch}"
            )));
        }
        Err(e) => return Err(git("read the default branch")(e)),
    };
    Ok((head.to_string(), read_config(dir, head, spec_path)))
}

/// `<specPath>/project.yaml` at `head`, through the spec store.
fn read_config(dir: &Path, head: git2::Oid, spec_path: &str) -> ConfigCheck {
    if !decide::is_spec_store_dir(spec_path) {
        return ConfigCheck::Invalid(format!(
            "spec.specPath is {spec_path:?}, but the spec store lives in {dir}/; move the spec store there or set spec.specPath to {dir}/",
            dir = decide::SPEC_STORE_DIR
        ));
    }
    let vfs = match Git::discover(dir).and_then(|git| git.commit_vfs(head)) {
        Ok(vfs) => vfs,
        Err(f) => return ConfigCheck::Unreadable(describe(&f)),
    };
    match snapshot::open(vfs) {
        Ok(_) => ConfigCheck::Valid,
        Err(f) if f.code == "storage.read_failed" => ConfigCheck::Unreadable(describe(&f)),
        Err(f) => ConfigCheck::Invalid(describe(&f)),
    }
}

/// The first error of a spec-store failure, with where and what to do.
fn describe(f: &Failure) -> String {
    let Some(d) = f.diagnostics.first() else {
        return format!("{}: {}", f.code, f.message);
    };
    let at: Vec<&str> = [d.path.as_deref(), d.field.as_deref()]
        .into_iter()
        .flatten()
        .collect();
    let mut s = format!("{}: {}", d.code, d.message);
    if !at.is_empty() {
        s.push_str(&format!(" ({})", at.join(" ")));
    }
    if let Some(hint) = &d.hint {
        s.push_str("; ");
        s.push_str(hint);
    }
    s
}

/// Requeues failed reconciles with a delay (the runtime adds its own backoff per object).
pub fn error_policy(_project: Arc<Project>, _error: &Error, _ctx: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

/// Runs the controller until the stream ends (shutdown), with the repository
/// cache under `workdir`, no sandbox profiles, and the repository locations
/// `repositories` allows.
pub async fn run_with(
    client: Client,
    namespace: Option<String>,
    workdir: PathBuf,
    repositories: decide::RepositoryPolicy,
) {
    let mut ctx = Context::new(client, workdir);
    ctx.repositories = repositories;
    run_context(namespace, Arc::new(ctx)).await;
}

/// [`run_with`] with a prepared [`Context`] (e.g. with sandbox profiles).
pub async fn run_context(namespace: Option<String>, ctx: Arc<Context>) {
    run_metered(namespace, ctx, None).await;
}

/// [`run_context`], with reconciles timed and failures counted (`controller="project"`).
pub async fn run_metered(
    namespace: Option<String>,
    ctx: Arc<Context>,
    metrics: Option<crate::metrics::JobSiteMetrics>,
) {
    let api = crate::drive::scoped_api::<Project>(ctx.client.clone(), namespace.as_deref());
    let runner = crate::drive::Runner::new("project")
        .metered(metrics)
        .publishing(ctx.client.clone());
    runner.watch(api, reconcile, error_policy, ctx).await;
}
