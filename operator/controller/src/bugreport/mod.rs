//! The BugReport controller: GitOps registration of true bugs. A `BugReport`
//! manifest (applied by Argo CD, Flux or `kubectl`) is all it takes to
//! materialize a bug into a `BuildWorkItem`, as `protobot run --bug` does on
//! one machine.
//!
//! Pipeline, one step per stage; only the edges touch the cluster:
//! read (the BugReport, its Project) → validate ([`decide::validate`]) →
//! decide ([`decide::plan`]: read the facts, reuse the recorded ones, or refuse
//! a changed spec) → read the facts at the default-branch head
//! (`jobsite::materializer::read_bug_facts`) and record them on the status
//! *before* materializing → apply (the `materialize` command through the
//! Kubernetes WorkStore, as the ChangeSet controller does) → status
//! ([`decide::status`], server-side applied under [`FIELD_MANAGER`]) → Events
//! ([`decide::events`]) on transitions.
//!
//! The recorded facts are the bug's durable registration: the materialization
//! key `<project>/bug:<id>@<spec commit>` comes from them, so re-applying the
//! BugReport after the default branch moved finds the same work item, and the
//! in-cluster Job Site rebuilds the contract from them. An invalid spec, an
//! unknown requirement or a changed spec is recorded on status and waits for a
//! change (no retry storm); a repository or API failure requeues with backoff.

pub mod decide;

use std::{path::PathBuf, sync::Arc, time::Duration};

use jiff::Timestamp;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        controller::Action,
        events::{Recorder, Reporter},
    },
};
use protobot_api::{BugReport, BugReportStatus, Project};
use protobot_jobsite::{
    contract::{BugFacts, Intake, build},
    materializer::{BugIntake, MaterializeError, read_bug_facts},
};

use decide::{Outcome, Plan};

/// Field manager of this controller's server-side applies.
pub const FIELD_MANAGER: &str = "protobot/bugreport";
/// The Event reporter of this controller.
pub const REPORTER: &str = "protobot-bugreport";

pub use crate::registration::{Context, Error};

/// The operator's clone of a project for bug intakes (its own, so it never
/// races the ChangeSet controller's clone).
fn clone_dir(workdir: &std::path::Path, ns: &str, project: &str) -> PathBuf {
    workdir.join(ns).join(project).join("bugs")
}

/// One reconcile of one BugReport.
#[tracing::instrument(skip(bug, ctx), fields(name = %bug.name_any(), namespace = ?bug.namespace()))]
pub async fn reconcile(bug: Arc<BugReport>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = bug.name_any();
    let ns = bug.namespace().ok_or_else(|| Error::MissingNamespace {
        kind: "BugReport",
        name: name.clone(),
    })?;
    if bug.metadata.deletion_timestamp.is_some() {
        return release_when_finished(&bug, &ns, &ctx).await;
    }
    // The finalizer goes on before any fact is recorded: the status is the
    // only record of the facts the item's contract is rebuilt from.
    if let Some(finalizers) = decide::with_finalizer(bug.finalizers()) {
        patch_finalizers(&ctx.client, &ns, &bug, finalizers).await?;
    }
    let now = Timestamp::now();
    let outcome = validate_and_materialize(&bug, &ns, &ctx, now).await?;
    let status = decide::status(bug.status.as_ref(), &outcome, bug.metadata.generation, now);
    if bug.status.as_ref() != Some(&status) {
        write_status(&ctx.client, &ns, &name, &status, None).await?;
    }
    publish_events(
        &ctx.client,
        &bug,
        &decide::events(bug.status.as_ref(), &status),
    )
    .await;
    tracing::info!(
        bug = %bug.spec.bug_id,
        outcome = outcome.as_str(),
        work_item = status.work_item_ref.as_ref().map(|r| r.name.as_str()).unwrap_or(""),
        "reconciled"
    );
    Ok(match outcome {
        Outcome::RepositoryUnavailable(_) => Action::requeue(Duration::from_secs(30)),
        // Nothing changes until someone edits the BugReport or the Project.
        _ => Action::await_change(),
    })
}

/// Replaces the finalizers, guarded by the `resourceVersion` read (a
/// conflict requeues the reconcile).
async fn patch_finalizers(
    client: &Client,
    ns: &str,
    bug: &BugReport,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let name = bug.name_any();
    let body = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": bug.resource_version(),
        }
    });
    Api::<BugReport>::namespaced(client.clone(), ns)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map(|_| ())
        .map_err(|source| Error::Finalizer {
            kind: "BugReport",
            name,
            source,
        })
}

/// A BugReport being deleted: lets it go once its work item is finished (or
/// absent); until then it stays, and is looked at again every 30 s.
async fn release_when_finished(bug: &BugReport, ns: &str, ctx: &Context) -> Result<Action, Error> {
    let Some(finalizers) = decide::without_finalizer(bug.finalizers()) else {
        return Ok(Action::await_change());
    };
    let item = bug
        .status
        .as_ref()
        .and_then(|s| s.work_item_ref.as_ref())
        .map(|r| r.name.clone());
    let state = match &item {
        None => None,
        Some(name) => Api::<protobot_api::BuildWorkItem>::namespaced(ctx.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(|source| Error::ReadWorkItem {
                name: name.clone(),
                source,
            })?
            .and_then(|i| i.status.map(|s| s.state)),
    };
    if decide::may_release(state) {
        patch_finalizers(&ctx.client, ns, bug, finalizers).await?;
        tracing::info!(bug = %bug.spec.bug_id, "released: its work item is finished");
        return Ok(Action::await_change());
    }
    if let Some(name) = item.as_deref()
        && decide::abandon_requested(bug.annotations())
    {
        match abandon_on_deletion(bug, ns, ctx, name).await? {
            Ok(()) => {
                // The Event first: once the finalizer is gone the report may vanish at
                // once, and a reader who sees it gone must find the Event saying why. A
                // failed release is retried and then takes the released-item path above
                // (the item is abandoned), so the Event is not published twice.
                publish_events(&ctx.client, bug, &[decide::abandoned_on_deletion(name)]).await;
                patch_finalizers(&ctx.client, ns, bug, finalizers).await?;
                tracing::info!(bug = %bug.spec.bug_id, work_item = name, "abandoned its work item and released");
                return Ok(Action::await_change());
            }
            Err(why) => {
                tracing::warn!(bug = %bug.spec.bug_id, work_item = name, reason = %why, "the abandon annotation could not abandon the work item");
                publish_events(&ctx.client, bug, &[decide::abandon_refused(name, &why)]).await;
                return Ok(Action::requeue(Duration::from_secs(30)));
            }
        }
    }
    tracing::info!(
        bug = %bug.spec.bug_id,
        work_item = ?item,
        ?state,
        "deletion waits until the bug's work item is finished (its contract is rebuilt from this report)"
    );
    publish_events(&ctx.client, bug, &[decide::deletion_waits(item.as_deref())]).await;
    Ok(Action::requeue(Duration::from_secs(30)))
}

/// Abandons work item `name` of a deleted, annotated BugReport through its
/// Project's work store. The inner `Err` is why it was not abandoned (the
/// report stays); the outer one a store failure (requeued).
async fn abandon_on_deletion(
    bug: &BugReport,
    ns: &str,
    ctx: &Context,
    name: &str,
) -> Result<Result<(), String>, Error> {
    use protobot_stores::WorkStore;
    let project_name = bug.spec.project_ref.name.clone();
    let Some(project) = Api::<Project>::namespaced(ctx.client.clone(), ns)
        .get_opt(&project_name)
        .await
        .map_err(|source| Error::ReadProject {
            name: project_name.clone(),
            source,
        })?
    else {
        return Ok(Err(format!(
            "Project {project_name} does not exist in {ns}"
        )));
    };
    let store = protobot_stores::KubeStore::new(
        ctx.client.clone(),
        ns,
        &project_name,
        protobot_stores::AdapterConfig {
            materializer_subject: crate::changeset::MATERIALIZER_SUBJECT.into(),
            lease_seconds: i64::from(project.spec.lease_duration_seconds),
        },
    );
    let store_error = |source| Error::Store {
        what: format!("the abandon of {name}"),
        source,
    };
    let Some(record) = store.get(name).await.map_err(store_error)? else {
        return Ok(Ok(()));
    };
    // Git's evidence: is the item's merge on the default branch?
    let repo = clone_dir(&ctx.workdir, ns, &project_name);
    if let Err(why) =
        crate::changeset::mirror_project(&project, ctx.repositories, repo.clone(), &ctx.forges)
            .await
    {
        return Ok(Err(why));
    }
    let (branch, id) = (project.spec.default_branch.clone(), record.id.clone());
    let integrated = tokio::task::spawn_blocking(move || -> Result<Option<String>, String> {
        let git = git2::Repository::open(&repo).map_err(|e| e.to_string())?;
        let tip = git
            .refname_to_id(&format!("refs/heads/{branch}"))
            .map_err(|e| format!("the mirror has no {branch}: {e}"))?;
        protobot_repo::land::find_merge_by_trailer(&git, tip, &id)
            .map(|m| m.map(|oid| oid.to_string()))
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    let integrated = match integrated {
        Ok(i) => i,
        Err(why) => return Ok(Err(format!("failed to look for its merge: {why}"))),
    };
    let now = Timestamp::now();
    let context = decide::abandon_context(ns, &bug.name_any(), &project_name, now);
    match protobot_stores::maintainer::abandon(&store, &context, &record, REPORTER, integrated, now)
        .await
    {
        Ok(_) => Ok(Ok(())),
        Err(protobot_stores::maintainer::AbandonError::Store { source, .. }) => {
            Err(store_error(source))
        }
        Err(refused) => Ok(Err(refused.to_string())),
    }
}

/// Server-side applies `status`. With `expected_version`, the write is also a
/// compare-and-swap on the object's `resourceVersion`: it fails with a conflict
/// (and the reconcile requeues) when someone wrote the object since it was read.
async fn write_status(
    client: &Client,
    ns: &str,
    name: &str,
    status: &BugReportStatus,
    expected_version: Option<String>,
) -> Result<(), Error> {
    let api: Api<BugReport> = Api::namespaced(client.clone(), ns);
    let mut body = serde_json::json!({
        "apiVersion": "protobot.dev/v1alpha1",
        "kind": "BugReport",
        "status": status,
    });
    if let Some(version) = expected_version {
        body["metadata"] = serde_json::json!({ "resourceVersion": version });
    }
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| ())
    .map_err(|source| Error::WriteStatus {
        kind: "BugReport",
        name: name.to_string(),
        source,
    })
}

async fn publish_events(client: &Client, bug: &BugReport, events: &[kube::runtime::events::Event]) {
    if events.is_empty() {
        return;
    }
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: REPORTER.into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let reference = bug.object_ref(&());
    for event in events {
        if let Err(error) = recorder
            .publish(&crate::events::bounded(event), &reference)
            .await
        {
            tracing::warn!(bug = %bug.spec.bug_id, reason = %event.reason, %error, "could not publish an event");
        }
    }
}

async fn validate_and_materialize(
    bug: &BugReport,
    ns: &str,
    ctx: &Context,
    now: Timestamp,
) -> Result<Outcome, Error> {
    let validated = match decide::validate(&bug.spec) {
        Ok(v) => v,
        Err(why) => return Ok(Outcome::Invalid(why)),
    };
    let projects: Api<Project> = Api::namespaced(ctx.client.clone(), ns);
    let project_name = bug.spec.project_ref.name.clone();
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
    let recorded = bug.status.as_ref().and_then(|s| s.recorded_facts.as_ref());
    let facts = match decide::plan(&project_name, &validated, recorded) {
        Plan::FactsChanged(why) => return Ok(Outcome::FactsChanged(why)),
        Plan::Reuse(facts) => *facts,
        Plan::ReadFacts => {
            let facts = match read_facts(bug, &project, &validated, ns, ctx).await {
                Ok(f) => f,
                Err(outcome) => return Ok(outcome),
            };
            // Recorded before materializing, so the work item never exists
            // without the facts its contract is rebuilt from.
            let contract = match build(&Intake::Bug(facts.clone())) {
                Ok(c) => c,
                Err(e) => return Ok(Outcome::Invalid(e.to_string())),
            };
            let recording = Outcome::Recorded {
                facts: Box::new(facts.clone()),
                contract: Box::new(contract),
            };
            let status = decide::status(
                bug.status.as_ref(),
                &recording,
                bug.metadata.generation,
                now,
            );
            // Compare-and-swap on the version read: when replicas race on a new
            // BugReport (possibly reading different heads), one records its facts,
            // the others conflict, requeue and reuse what was recorded, so a bug
            // never materializes under two keys.
            write_status(
                &ctx.client,
                ns,
                &bug.name_any(),
                &status,
                bug.resource_version(),
            )
            .await?;
            facts
        }
    };
    let contract = match build(&Intake::Bug(facts.clone())) {
        Ok(c) => c,
        Err(e) => return Ok(Outcome::Invalid(e.to_string())),
    };
    let result = crate::changeset::materialize(&ctx.client, ns, &project, &contract, now)
        .await
        .map_err(|source| Error::Store {
            what: format!("bug {}", bug.spec.bug_id),
            source,
        })?;
    Ok(Outcome::Materialized {
        facts: Box::new(facts),
        contract: Box::new(contract),
        result: Box::new(result),
    })
}

/// Mirrors the project and reads the bug's facts at the default-branch head;
/// what went wrong is an [`Outcome`] for the status.
async fn read_facts(
    bug: &BugReport,
    project: &Project,
    validated: &decide::Validated,
    ns: &str,
    ctx: &Context,
) -> Result<BugFacts, Outcome> {
    let project_name = project.name_any();
    let repo = clone_dir(&ctx.workdir, ns, &project_name);
    crate::changeset::mirror_project(project, ctx.repositories, repo.clone(), &ctx.forges)
        .await
        .map_err(Outcome::RepositoryUnavailable)?;
    let intake = BugIntake {
        project_id: project_name,
        bug_id: bug.spec.bug_id.clone(),
        violated_requirement_ids: validated.violated.clone(),
        scopes: validated.scopes.clone(),
        default_branch: project.spec.default_branch.clone(),
        priority: validated.priority.clone(),
    };
    // Git reads are blocking; keep them off the async workers.
    let read = tokio::task::spawn_blocking(move || read_bug_facts(&repo, &intake))
        .await
        .map_err(|e| Outcome::RepositoryUnavailable(e.to_string()))?;
    read.map_err(|e| match e {
        MaterializeError::Repository { .. } => Outcome::RepositoryUnavailable(e.to_string()),
        MaterializeError::UnknownRequirement { .. } => Outcome::UnknownRequirement(e.to_string()),
        // Change-set errors; a bug read never raises them.
        MaterializeError::NotApproved { .. }
        | MaterializeError::NotFound { .. }
        | MaterializeError::MergeMismatch { .. }
        | MaterializeError::MissingManifest(_) => Outcome::Invalid(e.to_string()),
    })
}

/// Requeues failed reconciles with a delay (the runtime adds its own backoff per object).
pub fn error_policy(_bug: Arc<BugReport>, _error: &Error, _ctx: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

/// Runs the controller until the stream ends (shutdown), with the repository
/// cache under `workdir`.
pub async fn run_with(
    client: Client,
    namespace: Option<String>,
    workdir: PathBuf,
    repositories: crate::project::decide::RepositoryPolicy,
) {
    run_metered(client, namespace, workdir, repositories, None).await;
}

/// [`run_with`], with reconciles timed and failures counted (`controller="bugreport"`).
pub async fn run_metered(
    client: Client,
    namespace: Option<String>,
    workdir: PathBuf,
    repositories: crate::project::decide::RepositoryPolicy,
    metrics: Option<crate::metrics::JobSiteMetrics>,
) {
    let api = crate::drive::scoped_api::<BugReport>(client.clone(), namespace.as_deref());
    // Bug registration asks no forge; the clients are built only when asked for.
    let forges = Arc::new(crate::forge::ForgeClients::new(client.clone(), None));
    let ctx = Arc::new(Context {
        client,
        workdir,
        repositories,
        forges,
    });
    let projects = crate::drive::scoped_api::<Project>(ctx.client.clone(), namespace.as_deref());
    let controller = kube::runtime::Controller::new(api, kube::runtime::watcher::Config::default());
    let reports = controller.store();
    // A BugReport waits for its Project (applied later, or its repository reachable again):
    // a Project's change reconciles the BugReports that name it and have no work item yet.
    let controller = controller.watches(
        projects,
        kube::runtime::watcher::Config::default(),
        move |project: Project| waiting_for(&reports.state(), &project),
    );
    let runner = crate::drive::Runner::new("bugreport")
        .metered(metrics)
        .publishing(ctx.client.clone());
    runner.run(controller, reconcile, error_policy, ctx).await;
}

/// The BugReports of `reports` that name `project` (same namespace) and have no work item
/// yet: those a change of the Project may unblock.
fn waiting_for(
    reports: &[Arc<BugReport>],
    project: &Project,
) -> Vec<kube::runtime::reflector::ObjectRef<BugReport>> {
    let (ns, name) = (project.namespace(), project.name_any());
    reports
        .iter()
        .filter(|b| b.namespace() == ns && b.spec.project_ref.name == name)
        .filter(|b| b.status.as_ref().is_none_or(|s| s.work_item_ref.is_none()))
        .map(|b| kube::runtime::reflector::ObjectRef::from_obj(b.as_ref()))
        .collect()
}
