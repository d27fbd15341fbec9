//! A project's Job Site: built from its Project, worker classes, repository clone and bug
//! reports ([`build_site`]), kept between dispatches while nothing it was built from
//! changed ([`reuse_project_site`], pure).

use std::{sync::Arc, time::Duration};

use jiff::{SignedDuration, Timestamp};
use kube::{Api, Client, ResourceExt};
use protobot_api::{BugReport, BuildWorkItem, Project};
use protobot_jobsite::{
    engine::{Engine, EngineConfig},
    executor::Executor,
    intake::RecordedIntakes,
    lease::SystemClock,
    site::{JobSite, RegisteredContracts},
    triage::HeuristicTriage,
};
use protobot_lifecycle::{AuthorizationContext, Grant, Role};
use protobot_stores::KubeStore;

use super::{ProjectError, Settings, WorkerClasses};
use crate::changeset::{MATERIALIZER_SUBJECT, POLICY_VERSION};

/// How long a context the in-cluster Job Site grants its components is valid.
const CONTEXT_TTL: SignedDuration = SignedDuration::from_hours(1);

/// What a project's Job Site was built from: it is rebuilt when any of it changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProjectFingerprint {
    /// The Project object (a re-created Project is another one).
    pub uid: Option<String>,
    /// Its spec's generation.
    pub generation: Option<i64>,
    /// The worker-classes ConfigMap's resourceVersion.
    pub worker_classes: Option<String>,
}

/// How long a project's clone may go unfetched while nothing new arrives.
pub const REFETCH_EVERY: Duration = Duration::from_secs(300);

/// A project's Job Site, kept across dispatches.
pub(super) struct ProjectRuntime<E> {
    pub(super) fingerprint: ProjectFingerprint,
    /// When the clone was last fetched (the fetch's start).
    pub(super) fetched_at: Timestamp,
    /// The project's items (by uid) the watch cache held when that fetch started: their
    /// commits were on the remote before they were created, so the fetch got them.
    pub(super) known_items: std::collections::BTreeSet<String>,
    pub(super) site: Arc<JobSite<KubeStore, E>>,
    pub(super) store: Arc<KubeStore>,
}

/// Whether a project's kept Job Site serves this dispatch (pure): not when the Project or
/// its worker classes changed, when an item appeared that the cache did not hold when the
/// clone was fetched (its contract's commit may be missing), or when the fetch is older
/// than [`REFETCH_EVERY`].
pub fn reuse_project_site(
    kept: &ProjectFingerprint,
    fetched_at: Timestamp,
    known_items: &std::collections::BTreeSet<String>,
    now_fingerprint: &ProjectFingerprint,
    items: &std::collections::BTreeSet<String>,
    now: Timestamp,
) -> bool {
    let age = now.duration_since(fetched_at);
    kept == now_fingerprint
        && items.is_subset(known_items)
        && age >= jiff::SignedDuration::ZERO
        && age < jiff::SignedDuration::try_from(REFETCH_EVERY).unwrap_or(jiff::SignedDuration::ZERO)
}

/// The project's items in the watch cache, by uid.
pub(super) fn project_items(
    items: &kube::runtime::reflector::Store<BuildWorkItem>,
    ns: &str,
    project: &str,
) -> std::collections::BTreeSet<String> {
    items
        .state()
        .iter()
        .filter(|i| i.namespace().as_deref() == Some(ns) && i.spec.project_ref.name == project)
        .map(|i| i.metadata.uid.clone().unwrap_or_else(|| i.name_any()))
        .collect()
}

/// Fetches the project into this replica's clone (created on first use), under the
/// folder's lock: the builds working in the clone take turns with the fetch.
pub(super) async fn fetch_clone(
    project: &Project,
    settings: &Settings,
    clone: &std::path::Path,
) -> Result<(), ProjectError> {
    let name = project.name_any();
    let ns = project.namespace().unwrap_or_default();
    let spec = &project.spec;
    let url = crate::repo_cache::clone_url(&spec.repo_url, settings.repositories).map_err(|e| {
        ProjectError::Repository {
            project: name.clone(),
            url: spec.repo_url.clone(),
            reason: e.to_string(),
        }
    })?;
    let branch = spec.default_branch.clone();
    // The Project's credentials Secret, read by the resolver for each fetch and push.
    let secret = crate::repo_cache::project_secret(&ns, project);
    protobot_jobsite::repo_folder::RepoFolder::new(clone)
        .path(move |dir| {
            crate::repo_cache::mirror_with(&url, &branch, dir, secret.as_ref())
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
        .map_err(|reason| ProjectError::Repository {
            project: name,
            url: spec.repo_url.clone(),
            reason,
        })
}

/// The item budget of `project`'s builds (`spec.budget.perItem`), if it sets one.
pub fn item_budget(project: &Project) -> Result<Option<protobot_usage::ItemBudget>, ProjectError> {
    let Some(text) = project
        .spec
        .budget
        .as_ref()
        .and_then(|b| b.per_item.as_deref())
    else {
        return Ok(None);
    };
    let limit = text.parse().map_err(|source| ProjectError::Budget {
        project: project.name_any(),
        source,
    })?;
    Ok(Some(protobot_usage::ItemBudget {
        limit,
        set_in: format!(
            "spec.budget.perItem of Project {}/{}",
            project.namespace().unwrap_or_default(),
            project.name_any()
        ),
    }))
}

/// The project's Job Site over `store`, with its worker classes and landing, reading
/// contracts from `clone`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn build_site<E: Executor + 'static>(
    client: &Client,
    project: &Project,
    settings: &Settings,
    executor: Arc<E>,
    classes: WorkerClasses,
    store: Arc<KubeStore>,
    clone: std::path::PathBuf,
) -> Result<JobSite<KubeStore, E>, ProjectError> {
    let name = project.name_any();
    let ns = project.namespace().unwrap_or_default();
    let spec = &project.spec;
    // A Project with a forge lands through its pull requests (or as its spec says).
    let forges = settings
        .forges
        .clone()
        .unwrap_or_else(|| Arc::new(crate::forge::ForgeClients::new(client.clone(), None)));
    let landing = match forges.for_project(project).await {
        Ok(Some(forge)) => forge.landing(),
        Ok(None) => protobot_jobsite::landing::Landing::DirectPush,
        Err(source) => {
            return Err(ProjectError::Forge {
                project: name.clone(),
                source: Box::new(source),
            });
        }
    };
    let home = settings.workdir.join(&ns).join(&name);
    let mut config = EngineConfig::new(
        classes.worker_a,
        classes.worker_b,
        classes.integration,
        home.join("scratch"),
    );
    config.producers = classes.producers;
    config.item_budget = item_budget(project)?;
    config.limits = settings.limits.clone();
    config.egress_proxy = settings.egress_proxy.clone();
    config.target_branch = spec.default_branch.clone();
    config.landing = landing;
    // Every context of the project's Job Site: its project, the operator's policy,
    // an hour (a site is rebuilt well within it).
    let grant = Grant {
        project: &name,
        role: Role::Materializer,
        subject: MATERIALIZER_SUBJECT,
        actions: protobot_jobsite::site::REFRESH_ACTIONS,
        expires_at: Timestamp::now() + CONTEXT_TTL,
        policy_version: POLICY_VERSION,
    };
    let engine = Engine {
        store,
        executor,
        clock: Arc::new(SystemClock),
        triage: Arc::new(HeuristicTriage),
        context: AuthorizationContext::new(Grant {
            role: Role::JobSite,
            subject: &settings.identity,
            actions: protobot_jobsite::site::JOB_SITE_ACTIONS,
            expires_at: Timestamp::now() + CONTEXT_TTL,
            ..grant
        }),
        config,
        on_stage: None,
        faults: None,
        stop: Some(settings.stop.clone()),
        usage: settings.usage.clone(),
    };
    Ok(JobSite {
        engine: Arc::new(engine),
        reconciler: AuthorizationContext::new(Grant {
            role: Role::Reconciler,
            subject: &format!("{}-reconciler", settings.identity),
            actions: protobot_jobsite::site::RECONCILER_ACTIONS,
            expires_at: Timestamp::now() + CONTEXT_TTL,
            ..grant
        }),
        contracts: Arc::new(
            RegisteredContracts::new(clone.clone(), &spec.default_branch)
                .with_snapshots(Arc::clone(&settings.snapshots))
                .with_bug_intakes(bug_intakes(client, &ns, &name).await),
        ),
        repo_dir: clone,
        wip_limit: usize::try_from(spec.wip_limit).unwrap_or(1),
        materializer: Some(AuthorizationContext::new(Grant {
            expires_at: Timestamp::now() + CONTEXT_TTL,
            ..grant
        })),
        capacity: Some(Arc::clone(&settings.capacity)),
    })
}

/// The bug intakes recorded on the statuses of `project`'s BugReports (read
/// once per pass). Without them a bug item cannot be built; a failed read is
/// logged and the pass goes on (change-set items do not need them).
async fn bug_intakes(client: &Client, ns: &str, project: &str) -> RecordedIntakes {
    let reports: Api<BugReport> = Api::namespaced(client.clone(), ns);
    match reports.list(&Default::default()).await {
        Ok(list) => recorded_bug_intakes(project, &list.items),
        Err(error) => {
            tracing::warn!(project = %project, %error, "could not read the BugReports; bug items cannot be built this pass");
            RecordedIntakes::new()
        }
    }
}

/// The recorded bug intakes of `project` among `reports` (pure): the facts each
/// BugReport's status recorded, keyed by the work item they materialize as.
/// Reports of other projects, and reports with no recorded facts, are skipped;
/// facts that do not make a contract are logged and skipped.
pub fn recorded_bug_intakes(project: &str, reports: &[BugReport]) -> RecordedIntakes {
    let mut intakes = RecordedIntakes::new();
    for report in reports
        .iter()
        .filter(|r| r.spec.project_ref.name == project)
    {
        let Some(recorded) = report
            .status
            .as_ref()
            .and_then(|s| s.recorded_facts.as_ref())
        else {
            continue;
        };
        let facts = crate::bugreport::decide::bug_facts(project, &report.spec.bug_id, recorded);
        if let Err(error) = intakes.insert(facts) {
            tracing::warn!(bug_report = %report.name_any(), %error, "recorded bug facts skipped");
        }
    }
    intakes
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use protobot_api::{BugReportSpec, BugReportStatus, LocalRef};
    use protobot_jobsite::{
        contract::{BugFacts, Intake, build},
        intake::BugIntakes,
    };

    use super::*;
    use crate::bugreport::decide::recorded_facts;

    fn facts(project: &str, bug: &str) -> BugFacts {
        BugFacts {
            project_id: project.into(),
            bug_id: bug.into(),
            spec_commit: "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d".into(),
            violated_requirement_ids: vec!["REQ-CLI-00001".into()],
            scopes: vec![],
            priority: "high".into(),
            impact: vec![],
            touched_paths: vec![],
        }
    }

    fn report(project: &str, bug: &str, recorded: bool) -> BugReport {
        let mut r = BugReport::new(
            &bug.to_ascii_lowercase(),
            BugReportSpec {
                project_ref: LocalRef::new(project),
                bug_id: bug.into(),
                violated_requirements: vec!["REQ-CLI-00001".into()],
                affected_scopes: vec![],
                business_priority: None,
                summary: None,
            },
        );
        if recorded {
            let f = facts(project, bug);
            let contract = build(&Intake::Bug(f.clone())).unwrap();
            r.status = Some(BugReportStatus {
                recorded_facts: Some(recorded_facts(&f, &contract)),
                ..BugReportStatus::default()
            });
        }
        r
    }

    #[test]
    fn a_projects_job_site_is_kept_until_something_it_was_built_from_changes() {
        let kept = ProjectFingerprint {
            uid: Some("u1".into()),
            generation: Some(3),
            worker_classes: Some("100".into()),
        };
        let fetched: Timestamp = "2026-12-06T10:00:00.500Z".parse().unwrap();
        let now = fetched + jiff::SignedDuration::from_secs(30);
        let set = |ids: &[&str]| {
            ids.iter()
                .map(|s| (*s).to_owned())
                .collect::<std::collections::BTreeSet<_>>()
        };
        let known = set(&["a", "b"]);
        assert!(reuse_project_site(
            &kept, fetched, &known, &kept, &known, now
        ));
        assert!(
            reuse_project_site(&kept, fetched, &known, &kept, &set(&["a"]), now),
            "a deleted item changes nothing"
        );
        // An item the cache did not hold when the fetch started may need a commit it missed.
        assert!(!reuse_project_site(
            &kept,
            fetched,
            &known,
            &kept,
            &set(&["a", "b", "c"]),
            now
        ));
        for changed in [
            ProjectFingerprint {
                uid: Some("u2".into()),
                ..kept.clone()
            },
            ProjectFingerprint {
                generation: Some(4),
                ..kept.clone()
            },
            ProjectFingerprint {
                worker_classes: Some("101".into()),
                ..kept.clone()
            },
        ] {
            assert!(
                !reuse_project_site(&kept, fetched, &known, &changed, &known, now),
                "{changed:?}"
            );
        }
        // A fetch older than REFETCH_EVERY (or from the future: a clock step) is redone.
        let stale = fetched + jiff::SignedDuration::try_from(REFETCH_EVERY).unwrap();
        assert!(!reuse_project_site(
            &kept, fetched, &known, &kept, &known, stale
        ));
        let before = fetched - jiff::SignedDuration::from_secs(1);
        assert!(!reuse_project_site(
            &kept, fetched, &known, &kept, &known, before
        ));
    }

    #[test]
    fn the_job_site_rebuilds_bug_facts_from_the_statuses_of_its_projects_reports() {
        let reports = [
            report("cli-sync", "GH-1", true),
            report("cli-sync", "GH-2", false),
            report("other", "GH-3", true),
        ];
        let intakes = recorded_bug_intakes("cli-sync", &reports);
        assert_eq!(intakes.len(), 1, "{intakes:?}");
        let id = build(&Intake::Bug(facts("cli-sync", "GH-1")))
            .unwrap()
            .work_item_id;
        assert_eq!(
            intakes.recorded(&id).unwrap(),
            Some(facts("cli-sync", "GH-1"))
        );
        assert!(recorded_bug_intakes("nobody", &reports).is_empty());
    }
}
