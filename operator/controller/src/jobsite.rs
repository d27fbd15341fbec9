//! The Job Site in the cluster: the same engine and loop as on one machine
//! ([`protobot_jobsite::site::JobSite`]), over the Kubernetes work store and a
//! cluster Executor.
//!
//! Every replica runs passes — on any `BuildWorkItem` change and on a timer —
//! over every `Project` it can see: reconcile expired leases, resume the items
//! its identity still leases, claim ready items within the project's WIP limit
//! and build them. Claims are compare-and-swap on the item's status, so any
//! number of replicas run this without leader election. Each replica keeps its
//! own integration clone per project under its work directory; everything it
//! needs to resume lives in the store and on the remote.
//!
//! Pipeline per project, one step each: read (Project, worker classes) →
//! prepare (clone/fetch) → decide and apply (the Job Site pass) → publish
//! (`InspectionRun` objects for the runs a build produced, owned by their
//! `BuildWorkItem`).

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use futures::StreamExt;
use jiff::{SignedDuration, Timestamp};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        events::{Event, EventType, Recorder, Reporter},
        watcher,
    },
};
use protobot_api::{BugReport, BuildWorkItem, InspectionRun, Project};
use protobot_jobsite::{
    builds::{Builds, Finished},
    engine::{BuildReport, Engine, EngineConfig, Producer, StopSignal, WorkerClass},
    executor::{Executor, Limits},
    inspection::{ProducerKind, Verdict},
    intake::RecordedIntakes,
    lease::SystemClock,
    site::{JobSite, RegisteredContracts, SiteAction},
    triage::HeuristicTriage,
};
use protobot_lifecycle::{AuthorizationContext, Grant, Role};
use protobot_stores::{AdapterConfig, KubeStore, kubernetes::item_name};
use serde::Deserialize;

use crate::changeset::{MATERIALIZER_SUBJECT, POLICY_VERSION};

/// How long a context the in-cluster Job Site grants its components is valid.
const CONTEXT_TTL: SignedDuration = SignedDuration::from_hours(1);

/// Field manager of the Job Site's server-side applies.
pub const FIELD_MANAGER: &str = "protobot/jobsite";
/// Finalizer on every unfinished BuildWorkItem: an item cannot disappear while
/// work (or a merge) may still land for it.
pub const FINALIZER: &str = "protobot.dev/unfinished-work";

/// One replica's Job Site settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The replica's trusted subject (its pod name): leases are held under it.
    pub identity: String,
    /// Integration clones and scratch space.
    pub workdir: PathBuf,
    /// Longest time between passes.
    pub interval: Duration,
    /// Sandbox limits per run.
    pub limits: Limits,
    /// Base URL of the egress proxy for runs whose worker class asks for
    /// egress (`None`: such runs are refused).
    pub egress_proxy: Option<String>,
    /// How often each project's orphaned key claims are collected
    /// ([`KubeStore::collect_orphaned_claims`]), and how old a claim must be.
    pub claim_sweeps: ClaimSweeps,
    /// Where passes are counted (`None`: not recorded).
    pub metrics: Option<crate::metrics::JobSiteMetrics>,
    /// This replica's build slots, shared by every project (`--max-concurrent-builds`).
    pub capacity: Arc<tokio::sync::Semaphore>,
    /// How many permits [`Settings::capacity`] was made with (published as
    /// `protobot_build_slots{state="total"}`).
    pub max_concurrent_builds: usize,
    /// Raised on SIGTERM/SIGINT: no more claims, builds stop at their next boundary.
    pub stop: StopSignal,
    /// Notified once, after a raised [`Settings::stop`], when no pass runs any more.
    pub drained: Arc<tokio::sync::Notify>,
    /// Which repository locations Projects may name: network URLs only unless
    /// `--allow-local-repositories` (the default of [`Settings::new`]: network only).
    pub repositories: crate::project::decide::RepositoryPolicy,
    /// The forge clients of Projects with `spec.forge` (their items land through pull
    /// requests). `None`: [`run`] makes its own (API calls not counted).
    pub forges: Option<Arc<crate::forge::ForgeClients>>,
    /// Where runs' model usage is read back after each sandbox run (the egress proxies'
    /// admin port, [`crate::proxy_usage::ProxyAdminUsage`]); `None`: items record no usage.
    pub usage: Option<Arc<dyn protobot_jobsite::usage::UsageSource>>,
    /// Where this replica publishes its capacity Lease (`None`: nowhere). Default
    /// ([`Settings::new`]): `POD_NAMESPACE` when set ([`crate::capacity::CapacityLease::from_env`]).
    pub capacity_lease: Option<crate::capacity::CapacityLease>,
    /// The node-room check: claim only while a Ready node has room for a run's pod
    /// (`None`: off). Default ([`Settings::new`]): as `PROTOBOT_NODE_ROOM_CHECK` says
    /// ([`crate::capacity::NodeRoomCheck::from_env`]; the chart sets it).
    pub node_room: Option<crate::capacity::NodeRoomCheck>,
}

/// Default of `--max-concurrent-builds`.
pub const DEFAULT_MAX_CONCURRENT_BUILDS: u16 = 8;

impl Settings {
    /// Settings with `max_concurrent_builds` build slots and the defaults: a pass at
    /// least every 15 s, default limits, no egress proxy, hourly claim sweeps.
    pub fn new(
        identity: impl Into<String>,
        workdir: PathBuf,
        max_concurrent_builds: usize,
    ) -> Self {
        Self {
            identity: identity.into(),
            workdir,
            interval: Duration::from_secs(15),
            limits: Limits::default(),
            egress_proxy: None,
            claim_sweeps: ClaimSweeps::default(),
            metrics: None,
            capacity: Arc::new(tokio::sync::Semaphore::new(max_concurrent_builds.max(1))),
            max_concurrent_builds: max_concurrent_builds.max(1),
            stop: StopSignal::new(),
            drained: Arc::new(tokio::sync::Notify::new()),
            repositories: crate::project::decide::RepositoryPolicy::default(),
            forges: None,
            usage: None,
            capacity_lease: crate::capacity::CapacityLease::from_env(),
            node_room: crate::capacity::NodeRoomCheck::from_env(),
        }
    }
}

/// When to collect the key claims of deleted work items, per project.
#[derive(Clone, Debug)]
pub struct ClaimSweeps {
    /// Time between two sweeps of one project.
    pub every: Duration,
    /// Claims younger than this are kept (a command may be between its claim
    /// and its item).
    pub min_age: Duration,
    last: Arc<std::sync::Mutex<BTreeMap<String, std::time::Instant>>>,
}

impl ClaimSweeps {
    /// Sweeps each project at most every `every`, collecting claims older than `min_age`.
    pub fn new(every: Duration, min_age: Duration) -> Self {
        Self {
            every,
            min_age,
            last: Arc::default(),
        }
    }

    /// Whether `project` is due at `now`; if so, it counts as swept now.
    pub fn due(&self, project: &str, now: std::time::Instant) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return false;
        };
        match last.get(project) {
            Some(at) if now.duration_since(*at) < self.every => false,
            _ => {
                last.insert(project.to_owned(), now);
                true
            }
        }
    }
}

impl Default for ClaimSweeps {
    /// Hourly, for claims at least an hour old.
    fn default() -> Self {
        Self::new(Duration::from_secs(3600), Duration::from_secs(3600))
    }
}

/// The harnesses of a project: the `ConfigMap` named by `spec.workerClassesRef`,
/// keys `worker-a`, `worker-b`, `integration` (each `{"command": [...], "image": ...}`)
/// and optionally `inspectors` (a list of `{"name", "kind", "class"}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerClasses {
    /// Worker A.
    pub worker_a: WorkerClass,
    /// Worker B.
    pub worker_b: WorkerClass,
    /// Integration runner.
    pub integration: WorkerClass,
    /// Inspection producers.
    pub producers: Vec<Producer>,
}

/// Why a project cannot be driven (reported, retried on the next pass).
#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    /// The project names no worker classes, or they are malformed.
    #[error(
        "project {project}: {reason}; create the ConfigMap named by spec.workerClassesRef with worker-a, worker-b and integration"
    )]
    WorkerClasses {
        /// Project.
        project: String,
        /// Why.
        reason: String,
    },
    /// The repository cannot be cloned or fetched.
    #[error("project {project}: repository {url}: {reason}")]
    Repository {
        /// Project.
        project: String,
        /// URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The Project's forge cannot be used: nothing is built (an item of a Project with a
    /// forge never lands around it).
    #[error("project {project}: {source}")]
    Forge {
        /// Project.
        project: String,
        /// Why.
        #[source]
        source: Box<crate::forge::ForgeSetupError>,
    },
    /// `spec.budget` is not an amount of dollars (the CRD's pattern refuses this; a Project
    /// written around the schema is refused here: nothing is built).
    #[error("project {project}: spec.budget.perItem: {source}")]
    Budget {
        /// Project.
        project: String,
        /// Why.
        #[source]
        source: protobot_usage::DollarsError,
    },
    /// The API failed.
    #[error("project {project}: {source}")]
    Api {
        /// Project.
        project: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The pass failed outside any one build.
    #[error("project {project}: {reason}")]
    Pass {
        /// Project.
        project: String,
        /// Why.
        reason: String,
    },
}

#[derive(Deserialize)]
struct ProducerEntry {
    name: String,
    kind: ProducerKind,
    class: WorkerClass,
}

/// Parses the worker-classes `ConfigMap` data (pure).
pub fn worker_classes(
    project: &str,
    data: &BTreeMap<String, String>,
) -> Result<WorkerClasses, ProjectError> {
    let bad = |reason: String| ProjectError::WorkerClasses {
        project: project.into(),
        reason,
    };
    let class = |key: &str| -> Result<WorkerClass, ProjectError> {
        let raw = data
            .get(key)
            .ok_or_else(|| bad(format!("key {key} is missing")))?;
        let class: WorkerClass =
            serde_json::from_str(raw).map_err(|e| bad(format!("key {key}: {e}")))?;
        if class.command.is_empty() {
            return Err(bad(format!("key {key}: command is empty")));
        }
        Ok(class)
    };
    let producers = match data.get("inspectors") {
        None => Vec::new(),
        Some(raw) => serde_json::from_str::<Vec<ProducerEntry>>(raw)
            .map_err(|e| bad(format!("key inspectors: {e}")))?
            .into_iter()
            .map(|p| Producer {
                name: p.name,
                kind: p.kind,
                class: p.class,
            })
            .collect(),
    };
    Ok(WorkerClasses {
        worker_a: class("worker-a")?,
        worker_b: class("worker-b")?,
        integration: class("integration")?,
        producers,
    })
}

/// What one pass did, per project.
pub type PassReport = Vec<(String, Result<Vec<SiteAction>, String>)>;

/// One pass over every project in `namespace` (or all namespaces).
pub async fn pass<E: Executor + 'static>(
    client: &Client,
    namespace: Option<&str>,
    settings: &Settings,
    executor: Arc<E>,
) -> PassReport {
    let projects: Api<Project> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let list = match projects.list(&Default::default()).await {
        Ok(l) => l.items,
        Err(e) => {
            if let Some(metrics) = &settings.metrics {
                metrics
                    .reconcile_errors
                    .with_label_values(&["buildworkitem", "api"])
                    .inc();
            }
            return vec![(String::new(), Err(e.to_string()))];
        }
    };
    let mut report = Vec::new();
    for project in list {
        let name = project.name_any();
        let result = drive_project(client, &project, settings, executor.clone(), None).await;
        if let Err(e) = &result {
            if let Some(metrics) = &settings.metrics {
                metrics
                    .reconcile_errors
                    .with_label_values(&["buildworkitem", e.category()])
                    .inc();
            }
            tracing::warn!(project = %name, error = %e, "job site pass failed");
        }
        report.push((name, result.map_err(|e| e.to_string())));
    }
    report
}

/// Each project's kept Job Site, by namespace and name.
type ProjectRuntimes<E> = Arc<std::sync::Mutex<BTreeMap<(String, String), ProjectRuntime<E>>>>;

/// What the dispatches of [`run`] share.
struct Dispatching<E> {
    /// The builds running in this replica.
    builds: Builds,
    /// The BuildWorkItem controller's watch cache.
    items: kube::runtime::reflector::Store<BuildWorkItem>,
    /// Each project's long-lived Job Site, by namespace and name.
    projects: ProjectRuntimes<E>,
    /// The node-room verdict the executor is gated by.
    room: crate::capacity::RoomView,
    /// What this replica last wrote to each project's `status.queue`, and when.
    queue_writes: QueueWrites,
}

impl<E> Clone for Dispatching<E> {
    fn clone(&self) -> Self {
        Dispatching {
            builds: self.builds.clone(),
            items: self.items.clone(),
            projects: Arc::clone(&self.projects),
            room: self.room.clone(),
            queue_writes: Arc::clone(&self.queue_writes),
        }
    }
}

/// What a replica last wrote to each project's `status.queue` (by namespace and name), and
/// when.
type QueueWrites = Arc<
    std::sync::Mutex<BTreeMap<(String, String), (std::time::Instant, protobot_api::ProjectQueue)>>,
>;

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
struct ProjectRuntime<E> {
    fingerprint: ProjectFingerprint,
    /// When the clone was last fetched (the fetch's start).
    fetched_at: Timestamp,
    /// The project's items (by uid) the watch cache held when that fetch started: their
    /// commits were on the remote before they were created, so the fetch got them.
    known_items: std::collections::BTreeSet<String>,
    site: Arc<JobSite<KubeStore, E>>,
    store: Arc<KubeStore>,
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
fn project_items(
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

/// The project's worker classes and their ConfigMap's resourceVersion.
async fn read_worker_classes(
    client: &Client,
    project: &Project,
) -> Result<(WorkerClasses, Option<String>), ProjectError> {
    let name = project.name_any();
    let ns = project.namespace().unwrap_or_default();
    let Some(r) = &project.spec.worker_classes_ref else {
        return Err(ProjectError::WorkerClasses {
            project: name,
            reason: "spec.workerClassesRef is not set".into(),
        });
    };
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &ns);
    let map = maps
        .get_opt(&r.name)
        .await
        .map_err(|source| ProjectError::Api {
            project: name.clone(),
            source,
        })?
        .ok_or_else(|| ProjectError::WorkerClasses {
            project: name.clone(),
            reason: format!("ConfigMap {} does not exist", r.name),
        })?;
    let version = map.metadata.resource_version.clone();
    Ok((
        worker_classes(&name, &map.data.unwrap_or_default())?,
        version,
    ))
}

/// Fetches the project into this replica's clone (created on first use), under the
/// folder's lock: the builds working in the clone take turns with the fetch.
async fn fetch_clone(
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
async fn build_site<E: Executor + 'static>(
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

/// Drives one project: reads its worker classes, fetches its repository, and runs the
/// Job Site. With `dispatching`, a dispatch: the project's Job Site is kept between
/// dispatches and rebuilt (with a fetch) only when the Project or its worker classes
/// changed, an item arrived since the last fetch, or [`REFETCH_EVERY`] passed
/// ([`reuse_project_site`]); its store reads the items from the watch cache; its builds
/// start in tasks of their own and finish on the builds' channel (published by [`run`]).
/// Without, a whole pass over listed items, built afresh, that returns when its builds
/// have finished ([`pass`]).
async fn drive_project<E: Executor + 'static>(
    client: &Client,
    project: &Project,
    settings: &Settings,
    executor: Arc<E>,
    dispatching: Option<&Dispatching<E>>,
) -> Result<Vec<SiteAction>, ProjectError> {
    let name = project.name_any();
    let ns = project.namespace().unwrap_or_default();
    let spec = &project.spec;
    if let Some(forges) = &settings.forges
        && let Some(forge) = forges.cached(project).await
    {
        show_checks_waits(client, &ns, &name, &forge).await;
    }
    let (classes, classes_version) = read_worker_classes(client, project).await?;
    let fingerprint = ProjectFingerprint {
        uid: project.metadata.uid.clone(),
        generation: project.metadata.generation,
        worker_classes: classes_version,
    };
    let key = (ns.clone(), name.clone());
    let now = Timestamp::now();
    let kept = dispatching.and_then(|d| {
        let projects = d
            .projects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let kept = projects.get(&key)?;
        let items = project_items(&d.items, &ns, &name);
        let reuse = reuse_project_site(
            &kept.fingerprint,
            kept.fetched_at,
            &kept.known_items,
            &fingerprint,
            &items,
            now,
        );
        if !reuse {
            tracing::debug!(project = %name, kept = ?kept.fingerprint, now = ?fingerprint, fetched_at = %kept.fetched_at, new_items = items.difference(&kept.known_items).count(), "rebuilding the project's Job Site");
        }
        reuse.then(|| (Arc::clone(&kept.site), Arc::clone(&kept.store)))
    });
    let (site, store) = match kept {
        Some(kept) => kept,
        None => {
            let clone = settings.workdir.join(&ns).join(&name).join("repo");
            // The items known before the fetch starts (see [`ProjectRuntime::known_items`]).
            let known_items = dispatching
                .map(|d| project_items(&d.items, &ns, &name))
                .unwrap_or_default();
            let fetched = fetch_clone(project, settings, &clone).await;
            if let Some(metrics) = &settings.metrics {
                let outcome = if fetched.is_ok() { "ok" } else { "failed" };
                metrics
                    .repository_fetches
                    .with_label_values(&[outcome])
                    .inc();
            }
            fetched?;
            let mut store = KubeStore::new(
                client.clone(),
                &ns,
                &name,
                AdapterConfig {
                    materializer_subject: MATERIALIZER_SUBJECT.into(),
                    lease_seconds: i64::from(spec.lease_duration_seconds),
                },
            );
            if let Some(d) = dispatching {
                store = store.with_item_cache(d.items.clone());
            }
            let store = Arc::new(store);
            let site = Arc::new(
                build_site(
                    client,
                    project,
                    settings,
                    executor,
                    classes,
                    Arc::clone(&store),
                    clone,
                )
                .await?,
            );
            if let Some(d) = dispatching {
                d.projects
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .insert(
                        key,
                        ProjectRuntime {
                            fingerprint,
                            fetched_at: now,
                            known_items,
                            site: Arc::clone(&site),
                            store: Arc::clone(&store),
                        },
                    );
            }
            (site, store)
        }
    };
    let actions = match dispatching {
        Some(d) => site
            .dispatch(&d.builds, &project_tag(&ns, &name))
            .await
            .map_err(|e| ProjectError::Pass {
                project: name.clone(),
                reason: e.to_string(),
            })?,
        // The pass is a task of its own: its builds run their git work on the blocking
        // pool and everything else on any runtime thread.
        None => tokio::spawn({
            let site = Arc::clone(&site);
            async move { site.run_once().await }
        })
        .await
        .map_err(|e| ProjectError::Pass {
            project: name.clone(),
            reason: format!("the pass stopped before it finished: {e}"),
        })?
        .map_err(|e| ProjectError::Pass {
            project: name.clone(),
            reason: e.to_string(),
        })?,
    };
    publish(client, &ns, settings, &actions).await;
    if let Some(d) = dispatching {
        show_queue(client, project, settings, &*site.engine.executor, d).await;
    }
    if dispatching.is_none() {
        // A one-shot pass guards the items itself; under [`run`] the BuildWorkItem
        // controller does, item by item ([`crate::build_items`]).
        guard_unfinished(client, &ns, &name).await;
    }
    if settings
        .claim_sweeps
        .due(&format!("{ns}/{name}"), std::time::Instant::now())
    {
        match store
            .collect_orphaned_claims(Timestamp::now(), settings.claim_sweeps.min_age)
            .await
        {
            Ok(swept) => {
                tracing::info!(project = %name, ?swept, "collected the key claims of deleted work items")
            }
            Err(e) => {
                tracing::warn!(project = %name, error = %e, "could not collect the key claims of deleted work items; retrying at the next sweep")
            }
        }
    }
    Ok(actions)
}

/// The project's queue after a dispatch, from the watch cache, this replica's free slots
/// and its admission ([`protobot_jobsite::capacity::queue`]): written to the Project's
/// `status.queue` when it says something new, counted in `protobot_items_queued`, and a
/// Warning Event when the wait becomes a fault (no node room, runs refused).
async fn show_queue<E: Executor>(
    client: &Client,
    project: &Project,
    settings: &Settings,
    executor: &E,
    d: &Dispatching<E>,
) {
    use protobot_api::LifecycleState as S;
    let name = project.name_any();
    let ns = project.namespace().unwrap_or_default();
    let (mut ready, mut active) = (0usize, 0usize);
    for item in d.items.state() {
        if item.namespace().as_deref() != Some(ns.as_str()) || item.spec.project_ref.name != name {
            continue;
        }
        match item.status.as_ref().map(|s| s.state) {
            Some(S::ReadyForBuilding) => ready += 1,
            Some(S::Building | S::Inspecting | S::Merging) => active += 1,
            _ => {}
        }
    }
    let input = protobot_jobsite::capacity::QueueInput {
        ready,
        active,
        wip_limit: usize::try_from(project.spec.wip_limit).unwrap_or(1),
        free_slots: settings.capacity.available_permits(),
        admission: crate::capacity::admission(&d.room.get(), executor.admit()),
    };
    let queue = protobot_jobsite::capacity::queue(&input);
    if let Some(metrics) = &settings.metrics {
        metrics
            .items_queued
            .with_label_values(&[&project_tag(&ns, &name)])
            .set(i64::try_from(queue.queued).unwrap_or(i64::MAX));
    }
    let next = crate::capacity::queue_status(&queue, &settings.identity, Timestamp::now());
    let key = (ns, name);
    let last = d
        .queue_writes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&key)
        .cloned();
    // What the Project shows: the cached status, unless this replica wrote since (the
    // cache may lag its own write by a moment: it must not write, or warn, twice).
    let cached = project.status.as_ref().and_then(|s| s.queue.clone());
    let shown = match (cached, &last) {
        (Some(c), Some((_, mine))) if c.observed_time.0 < mine.observed_time.0 => {
            Some(mine.clone())
        }
        (None, Some((_, mine))) => Some(mine.clone()),
        (cached, _) => cached,
    };
    let since_last = last.as_ref().map(|(at, _)| at.elapsed());
    if crate::capacity::queue_write_due(shown.as_ref(), &next, since_last) {
        let event = crate::capacity::queue_event(shown.as_ref(), &next, queue.reason);
        let written =
            crate::capacity::publish_queue(client, project, &settings.identity, &next, event).await;
        if written {
            d.queue_writes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(key, (std::time::Instant::now(), next));
        }
    }
}

/// The tag of a project's builds in [`Builds`]: `namespace/name` (a namespace holds no
/// `/`).
pub fn project_tag(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// What a Job Site did, made visible: metrics, each built item's inspection runs (objects
/// it owns) and its time since registration when it completed, and the items' Events.
async fn publish(client: &Client, ns: &str, settings: &Settings, actions: &[SiteAction]) {
    if let Some(metrics) = &settings.metrics {
        metrics.record_actions(actions);
    }
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), ns);
    for action in actions {
        let SiteAction::Built { report } = action else {
            continue;
        };
        let Ok(item) = items.get(&item_name(&report.work_item_id)).await else {
            continue;
        };
        publish_inspections(client, ns, &item, report).await;
        if let Some(metrics) = &settings.metrics
            && report.state == protobot_lifecycle::State::Completed
        {
            record_completion(metrics, &item);
        }
    }
    publish_events(client, ns, &settings.identity, actions).await;
}

impl ProjectError {
    /// Stable label for `protobot_reconcile_errors_total{category}`.
    pub fn category(&self) -> &'static str {
        match self {
            ProjectError::WorkerClasses { .. } => "worker-classes",
            ProjectError::Repository { .. } => "repository",
            ProjectError::Forge { source, .. } => source.category(),
            ProjectError::Budget { .. } => "budget",
            ProjectError::Api { .. } => "api",
            ProjectError::Pass { .. } => "pass",
        }
    }
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

/// The Kubernetes Event a Job Site action is reported with (pure): the work item
/// it concerns and the event.
pub fn event_for(action: &SiteAction) -> Option<(String, Event)> {
    let event = |type_, reason: &str, action: &str, note: String| Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    Some(match action {
        SiteAction::Built { report } => {
            let ev = match report.state {
                protobot_lifecycle::State::Completed => event(
                    EventType::Normal,
                    "Completed",
                    "Merge",
                    format!(
                        "merged into the default branch as {} after {} cycle(s)",
                        report.merge_commit.as_deref().unwrap_or("?"),
                        report.cycles.len()
                    ),
                ),
                protobot_lifecycle::State::Blocked => {
                    event(EventType::Warning, "Blocked", "Build", blocked_note(report))
                }
                other => event(EventType::Normal, "Built", "Build", format!("now {other}")),
            };
            (report.work_item_id.clone(), ev)
        }
        SiteAction::RecoveredLease { work_item_id } => (
            work_item_id.clone(),
            event(
                EventType::Warning,
                "LeaseRecovered",
                "Reconcile",
                "the lease expired; the item is ready again".into(),
            ),
        ),
        SiteAction::RecordedMerge {
            work_item_id,
            merge_commit,
        } => (
            work_item_id.clone(),
            event(
                EventType::Normal,
                "MergeRecorded",
                "Reconcile",
                format!("found merge {merge_commit} by its Work-Item trailer"),
            ),
        ),
        SiteAction::MergeNotApplied { work_item_id } => (
            work_item_id.clone(),
            event(
                EventType::Warning,
                "MergeNotApplied",
                "Reconcile",
                "the merge never landed; the item is ready again".into(),
            ),
        ),
        SiteAction::DependenciesRefreshed { work_item_id } => (
            work_item_id.clone(),
            event(
                EventType::Normal,
                "Ready",
                "RefreshDependencies",
                "every dependency completed".into(),
            ),
        ),
        SiteAction::Revalidated {
            work_item_id,
            reason,
        } => (
            work_item_id.clone(),
            event(EventType::Warning, "Blocked", "Revalidate", reason.clone()),
        ),
        SiteAction::Failed {
            work_item_id,
            error,
        }
        | SiteAction::MergeUnverified {
            work_item_id,
            error,
        } => (
            work_item_id.clone(),
            event(EventType::Warning, "BuildStopped", "Build", error.clone()),
        ),
        SiteAction::Claimed { .. } | SiteAction::LostClaim { .. } => return None,
    })
}

/// Longest Event note the API server accepts (events.k8s.io/v1: 1 kB).
const EVENT_NOTE_LIMIT: usize = 1024;

/// The note of a blocked build's Event: the block reason, then what the item's runs spent
/// per stage (issue 34), cut to the API's limit on a character boundary (the spend stays
/// whole; the reason is cut first).
fn blocked_note(report: &protobot_jobsite::engine::BuildReport) -> String {
    let reason = report.block_reason.clone().unwrap_or_default();
    if report.usage.is_empty() {
        return truncate(reason, EVENT_NOTE_LIMIT);
    }
    let spent = format!(" (spent: {})", report.usage.summary().brief());
    let room = EVENT_NOTE_LIMIT.saturating_sub(spent.len());
    truncate(
        format!("{}{spent}", truncate(reason, room)),
        EVENT_NOTE_LIMIT,
    )
}

fn truncate(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let mut at = limit;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
    }
    text
}

async fn publish_events(client: &Client, ns: &str, identity: &str, actions: &[SiteAction]) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "protobot-jobsite".into(),
            instance: Some(identity.into()),
        },
    );
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), ns);
    for action in actions {
        let Some((id, event)) = event_for(action) else {
            continue;
        };
        let Ok(item) = items.get(&item_name(&id)).await else {
            continue;
        };
        if let Err(e) = recorder
            .publish(&crate::events::bounded(&event), &item.object_ref(&()))
            .await
        {
            tracing::warn!(work_item = %id, error = %e, "could not publish an event");
        }
    }
}

/// Shows the forge's checks waits on the project's items as their `AwaitingChecks`
/// condition (`True` while the landing waits for required checks, `False` once it no longer
/// does). Visibility only: a failure is logged and retried by the next pass, and the status
/// write carries the item's resourceVersion, so it never overwrites a store write (the store
/// retries its own on the conflict and keeps the condition).
async fn show_checks_waits(
    client: &Client,
    ns: &str,
    project: &str,
    forge: &crate::forge::ProjectForge,
) {
    if !forge.checks_to_show() {
        return;
    }
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), ns);
    let selector = format!(
        "{}={}",
        protobot_stores::kubernetes::PROJECT_LABEL,
        protobot_stores::kubernetes::label_value(project)
    );
    let listed = match items
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
    {
        Ok(l) => l.items,
        Err(error) => {
            tracing::warn!(project, %error, "could not list work items to show checks waits");
            return;
        }
    };
    let waits = forge.waits.current();
    let mut showing = std::collections::BTreeSet::new();
    for (name, resource_version, status) in
        crate::forge::awaiting_checks_updates(&listed, &waits, Timestamp::now())
    {
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": resource_version},
            "status": {"conditions": status.conditions},
        });
        if let Err(error) = items
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::debug!(project, item = %name, %error, "could not show a checks wait; next pass");
        }
    }
    for item in &listed {
        if waits
            .iter()
            .any(|w| w.work_item_id == item.spec.work_item_id)
        {
            showing.insert(item.name_any());
        }
    }
    forge.showing(showing);
}

/// Keeps [`FINALIZER`] on every unfinished item of the project and removes it from
/// finished ones (completed or abandoned), so a deletion waits for the work.
async fn guard_unfinished(client: &Client, ns: &str, project: &str) {
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), ns);
    let selector = format!(
        "{}={}",
        protobot_stores::kubernetes::PROJECT_LABEL,
        protobot_stores::kubernetes::label_value(project)
    );
    let Ok(list) = items
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
    else {
        return;
    };
    for item in list.items {
        let finished = item.status.as_ref().is_some_and(|s| {
            matches!(
                s.state,
                protobot_api::LifecycleState::Completed | protobot_api::LifecycleState::Abandoned
            )
        });
        let mut finalizers = item.finalizers().to_vec();
        let has = finalizers.iter().any(|f| f == FINALIZER);
        if finished == has {
            if finished {
                finalizers.retain(|f| f != FINALIZER);
            } else {
                finalizers.push(FINALIZER.into());
            }
            let patch = serde_json::json!({"metadata": {
                "finalizers": finalizers,
                "resourceVersion": item.resource_version(),
            }});
            if let Err(e) = items
                .patch(
                    &item.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                tracing::debug!(item = %item.name_any(), error = %e, "finalizer update deferred");
            }
        }
    }
}

/// The `InspectionRun` objects of a build (pure): one per run, owned by the item.
pub fn inspection_runs(item: &BuildWorkItem, report: &BuildReport) -> Vec<serde_json::Value> {
    let owner = item.controller_owner_ref(&());
    report
        .inspections
        .iter()
        .map(|run| {
            let name = item_name(&run.run_id);
            let sealed = match &run.verdict {
                Verdict::Sealed { watermark } => {
                    Some(serde_json::json!({"highWatermark": watermark, "at": Timestamp::now().to_string()}))
                }
                _ => None,
            };
            serde_json::json!({
                "apiVersion": "protobot.dev/v1alpha1",
                "kind": "InspectionRun",
                "metadata": {
                    "name": name,
                    "labels": {
                        "app.kubernetes.io/managed-by": "protobot",
                        // Work-item names may be up to 253 characters; a label value 63.
                        "protobot.dev/work-item": protobot_stores::kubernetes::label_value(&item.name_any()),
                    },
                    "ownerReferences": owner.iter().collect::<Vec<_>>(),
                },
                "spec": {
                    "workItemRef": {"name": item.name_any()},
                    "contractVersion": run.contract_version,
                    "candidateCommit": run.candidate,
                    "productTreeDigest": run.product_tree_digest,
                    "requiredProducers": run.producers,
                    "ledgerSequenceAtStart": run.ledger_sequence_at_start,
                },
                "status": {
                    // A list-map keyed by producer: one entry per producer, even if a
                    // report named one twice (the server refuses duplicate keys).
                    "producersCompleted": run.producers.iter().collect::<std::collections::BTreeSet<_>>().into_iter().map(|p| serde_json::json!({
                        "producer": p, "findings": run.findings, "completedTime": Timestamp::now().to_string(),
                    })).collect::<Vec<_>>(),
                    "sealed": sealed,
                },
            })
        })
        .collect()
}

/// `protobot_registration_to_completion_seconds` for an item this pass completed: from its
/// `BuildWorkItem`'s creation (registration) to now.
fn record_completion(metrics: &crate::metrics::JobSiteMetrics, item: &BuildWorkItem) {
    if let Some(registered) = &item.metadata.creation_timestamp {
        let took = Timestamp::now().duration_since(registered.0);
        metrics
            .registration_to_completion
            .observe(took.as_secs_f64().max(0.0));
    }
}

async fn publish_inspections(
    client: &Client,
    ns: &str,
    item: &BuildWorkItem,
    report: &BuildReport,
) {
    let runs: Api<InspectionRun> = Api::namespaced(client.clone(), ns);
    for body in inspection_runs(item, report) {
        let name = body["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut spec_only = body.clone();
        if let Some(o) = spec_only.as_object_mut() {
            o.remove("status");
        }
        let status = serde_json::json!({
            "apiVersion": "protobot.dev/v1alpha1",
            "kind": "InspectionRun",
            "status": body["status"],
        });
        // The spec is immutable (CEL `self == oldSelf` on each field): it is written once,
        // when the run is first published, and never applied again.
        let created = match runs.get_opt(&name).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => runs
                .patch(&name, &params, &Patch::Apply(&spec_only))
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        let written = match created {
            Ok(()) => runs
                .patch_status(&name, &params, &Patch::Apply(&status))
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::warn!(inspection_run = %name, error = %e, "could not publish the inspection run");
        }
    }
}

/// Longest wait before a failing project is driven again.
const MAX_PROJECT_BACKOFF: Duration = Duration::from_secs(300);

/// When a project may be driven next (pure bookkeeping of the dispatcher).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProjectSchedule {
    /// Passes that failed in a row.
    pub failures: u32,
    /// Not before this instant (after a failure).
    pub not_before: Option<std::time::Instant>,
    /// Something changed while a pass ran: drive it again when the pass ends.
    pub dirty: bool,
}

impl ProjectSchedule {
    /// Records a pass outcome at `now`: success clears the backoff; a failure doubles it
    /// (1 s, 2 s, 4 s … at most [`MAX_PROJECT_BACKOFF`]).
    pub fn finished(&mut self, ok: bool, now: std::time::Instant) {
        if ok {
            self.failures = 0;
            self.not_before = None;
        } else {
            self.failures = self.failures.saturating_add(1);
            let wait = Duration::from_secs(1u64 << self.failures.min(10).saturating_sub(1))
                .min(MAX_PROJECT_BACKOFF);
            self.not_before = Some(now + wait);
        }
    }

    /// Whether the project may be driven at `now`.
    pub fn due(&self, now: std::time::Instant) -> bool {
        self.not_before.is_none_or(|t| now >= t)
    }
}

/// The dispatcher of this replica: one dispatch per Project at a time, each in its own
/// task, started when one of the project's work items appears or changes state, when the
/// Project changes, when one of its builds finishes (a slot is free), and at least every
/// `settings.interval`. A dispatch claims and resumes; every build then runs in a task of
/// its own ([`Builds`]), so a slow build holds up no dispatch, and the replica's capacity
/// is shared by every project. A finished build is published (inspection runs, Events,
/// metrics) as soon as it ends. A project whose dispatch fails (its repository
/// unreachable, its worker classes missing) backs off alone; an item whose build stopped
/// with an error backs off alone ([`protobot_jobsite::builds::item_backoff`]); the
/// others go on. Projects are read from a watch-fed cache, not listed per event. On
/// [`Settings::stop`] no dispatch starts any more, the running builds stop at their next
/// effect boundary, and [`Settings::drained`] is notified once they have.
pub async fn run<E: Executor + Send + Sync + 'static>(
    client: Client,
    namespace: Option<String>,
    settings: Settings,
    executor: Arc<E>,
) {
    use crate::capacity::{RoomGated, RoomState, RoomView};
    // Back-pressure: with the node-room check, runs are admitted only while a node has
    // room for a run's pod (claims wait until the first read says so).
    let room = RoomView::new(match &settings.node_room {
        None => RoomState::Off,
        Some(_) => RoomState::Unknown("the node-room check has not read the nodes yet".into()),
    });
    if let Some(check) = settings.node_room.clone() {
        tokio::spawn(crate::capacity::watch_node_room(
            client.clone(),
            check,
            room.clone(),
            settings.stop.clone(),
        ));
    }
    // Published capacity: the replica's Lease, deleted when it stops.
    let lease = settings.capacity_lease.clone().map(|lease| {
        tokio::spawn(crate::capacity::publish_capacity(
            client.clone(),
            lease,
            settings.identity.clone(),
            Arc::clone(&settings.capacity),
            settings.max_concurrent_builds,
            room.clone(),
            settings.stop.clone(),
        ))
    });
    let executor = Arc::new(RoomGated::new(executor, room.clone()));
    let projects: Api<Project> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (cache, writer) = kube::runtime::reflector::store::<Project>();
    let mut project_events = kube::runtime::reflector(
        writer,
        watcher(projects, watcher::Config::default()).default_backoff(),
    )
    .applied_objects()
    .boxed();
    let mut tick = tokio::time::interval(settings.interval);
    let mut schedules: BTreeMap<(String, String), ProjectSchedule> = BTreeMap::new();
    let mut running: tokio::task::JoinSet<((String, String), bool)> = tokio::task::JoinSet::new();
    let mut busy: std::collections::BTreeSet<(String, String)> = Default::default();
    // One set of forge clients for every pass, so a Project's client (and its App's
    // installation token) is reused until its spec or Secret changes.
    let mut settings = settings;
    if settings.forges.is_none() {
        settings.forges = Some(Arc::new(crate::forge::ForgeClients::new(
            client.clone(),
            None,
        )));
    }
    let settings = Arc::new(settings);
    let (builds, mut finished) = Builds::new();
    // The BuildWorkItem controller reconciles each item and wakes its project's dispatch.
    let (wake, mut wakes) = tokio::sync::mpsc::unbounded_channel();
    // Its watch cache is the dispatches' view of the items (no list call per dispatch).
    let (item_cache, item_writer) = kube::runtime::reflector::store::<BuildWorkItem>();
    let items = tokio::spawn(crate::build_items::run_with_cache(
        client.clone(),
        namespace.clone(),
        crate::build_items::ItemContext::new(
            client.clone(),
            settings.identity.clone(),
            builds.clone(),
            wake,
            settings.metrics.clone(),
        ),
        {
            let stop = settings.stop.clone();
            async move { stop.raised().await }
        },
        (item_cache.clone(), item_writer),
    ));
    let dispatching = Dispatching {
        builds: builds.clone(),
        items: item_cache,
        projects: Arc::default(),
        room,
        queue_writes: Arc::default(),
    };
    let mut stop_poll = tokio::time::interval(Duration::from_millis(200));
    loop {
        // Which projects this wake-up concerns (`None`: all of them).
        let mut wanted: Option<(String, String)> = None;
        let mut all = false;
        tokio::select! {
            _ = tick.tick() => all = true,
            _ = stop_poll.tick() => {}
            woken = wakes.recv() => match woken {
                Some(key) => wanted = Some(key),
                // The item controller ended (its watch cannot end otherwise): stop too.
                None => return,
            },
            event = project_events.next() => match event {
                Some(Ok(p)) => wanted = Some((p.namespace().unwrap_or_default(), p.name_any())),
                Some(Err(_)) => {}
                None => return,
            },
            Some(done) = running.join_next(), if !running.is_empty() => {
                if let Ok((key, ok)) = done {
                    busy.remove(&key);
                    let schedule = schedules.entry(key.clone()).or_default();
                    schedule.finished(ok, std::time::Instant::now());
                    if std::mem::take(&mut schedule.dirty) {
                        wanted = Some(key);
                    }
                }
            }
            Some(done) = finished.recv() => {
                // A build ended: publish it, and let its project use the free slot. A build
                // that stopped with an error may have met a stale clone: the project's
                // next dispatch fetches and builds its Job Site afresh.
                if let Some((ns, name)) = done.tag.split_once('/') {
                    let key = (ns.to_owned(), name.to_owned());
                    if matches!(done.action, SiteAction::Failed { .. } | SiteAction::MergeUnverified { .. }) {
                        dispatching
                            .projects
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .remove(&key);
                    }
                    wanted = Some(key);
                }
                let (client, settings) = (client.clone(), Arc::clone(&settings));
                tokio::spawn(async move { publish_finished(&client, &settings, done).await });
            }
        }
        if settings.stop.is_raised() {
            if let Some(lease) = lease {
                // The publisher deletes the Lease once it sees the stop (bounded: a stuck
                // API call must not hold the shutdown; the Lease then goes stale).
                let _ = tokio::time::timeout(Duration::from_secs(5), lease).await;
            }
            drain(&mut running, &builds, &settings).await;
            let _ = items.await;
            return;
        }
        let now = std::time::Instant::now();
        if all {
            // Forget the Job Sites of Projects that are gone.
            let present: std::collections::BTreeSet<(String, String)> = cache
                .state()
                .iter()
                .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
                .collect();
            dispatching
                .projects
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .retain(|key, _| present.contains(key));
            // And their queue figures.
            if let Some(metrics) = &settings.metrics {
                for (ns, name) in schedules.keys().filter(|k| !present.contains(*k)) {
                    let _ = metrics
                        .items_queued
                        .remove_label_values(&[&project_tag(ns, name)]);
                }
            }
            schedules.retain(|key, _| present.contains(key));
        }
        for project in cache.state() {
            let key = (project.namespace().unwrap_or_default(), project.name_any());
            if !all && wanted.as_ref() != Some(&key) {
                continue;
            }
            let schedule = schedules.entry(key.clone()).or_default();
            if busy.contains(&key) {
                schedule.dirty = true;
                continue;
            }
            if !schedule.due(now) {
                continue;
            }
            busy.insert(key.clone());
            let (client, settings, executor, dispatching) = (
                client.clone(),
                Arc::clone(&settings),
                Arc::clone(&executor),
                dispatching.clone(),
            );
            running.spawn(async move {
                let ok = drive_metered(&client, &project, &settings, executor, &dispatching).await;
                (key, ok)
            });
        }
    }
}

/// Waits for the running dispatches to end and the running builds to stop at their next
/// effect boundary, then notifies [`Settings::drained`].
async fn drain(
    running: &mut tokio::task::JoinSet<((String, String), bool)>,
    builds: &Builds,
    settings: &Settings,
) {
    tracing::info!(
        dispatches = running.len(),
        builds = builds.len(),
        "shutting down: claiming no more work; waiting for the running builds to reach an effect boundary"
    );
    while running.join_next().await.is_some() {}
    builds.drained().await;
    tracing::info!("every build stopped; their leases lapse and another replica resumes them");
    settings.drained.notify_one();
}

/// Publishes a finished build ([`publish`]) and logs what it did.
async fn publish_finished(client: &Client, settings: &Settings, done: Finished) {
    let Some((ns, project)) = done.tag.split_once('/') else {
        return;
    };
    match &done.action {
        SiteAction::Built { report } => {
            tracing::info!(%project, work_item = %done.work_item_id, state = %report.state, "build finished")
        }
        other => {
            tracing::info!(%project, work_item = %done.work_item_id, action = ?other, "build stopped; the item backs off before it is resumed")
        }
    }
    publish(client, ns, settings, std::slice::from_ref(&done.action)).await;
}

/// One project's pass with its duration, errors and log line recorded; true when it did
/// not fail.
async fn drive_metered<E: Executor + 'static>(
    client: &Client,
    project: &Project,
    settings: &Settings,
    executor: Arc<E>,
    dispatching: &Dispatching<E>,
) -> bool {
    let name = project.name_any();
    // Dropped at the end: the pass's duration.
    let _timer = settings
        .metrics
        .as_ref()
        .map(|m| m.reconcile("buildworkitem"));
    match drive_project(client, project, settings, executor, Some(dispatching)).await {
        Ok(actions) => {
            if !actions.is_empty() {
                tracing::info!(project = %name, actions = actions.len(), "job site pass");
            }
            true
        }
        Err(e) => {
            if let Some(metrics) = &settings.metrics {
                metrics
                    .reconcile_errors
                    .with_label_values(&["buildworkitem", e.category()])
                    .inc();
            }
            tracing::warn!(project = %name, error = %e, "job site pass failed; this project backs off, the others go on");
            false
        }
    }
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

    #[test]
    fn a_blocked_build_s_event_says_what_was_spent_within_the_note_limit() {
        let mut report = BuildReport {
            work_item_id: "wi-1".into(),
            state: protobot_lifecycle::State::Blocked,
            cycles: Vec::new(),
            inspections: Vec::new(),
            revalidations: 0,
            merge_commit: None,
            product_tree_digest: None,
            block_reason: Some("the tests still fail after 3 cycles".into()),
            lease_renewals: Default::default(),
            usage: Default::default(),
        };
        let note = |report: &BuildReport| {
            let action = SiteAction::Built {
                report: Box::new(report.clone()),
            };
            event_for(&action).unwrap().1.note.unwrap()
        };
        assert_eq!(note(&report), "the tests still fail after 3 cycles");
        report.usage.record(protobot_usage::RunSpend {
            run_id: "wi-1-c1-b".into(),
            stage: protobot_usage::Stage::WorkerB,
            tier: "t1".into(),
            spend: protobot_usage::Spend {
                calls: 3,
                tokens: protobot_usage::TokenCounts {
                    input: 1000,
                    output: 200,
                    ..Default::default()
                },
                cost_microdollars: 4200,
                ..Default::default()
            },
        });
        assert_eq!(
            note(&report),
            "the tests still fail after 3 cycles (spent: worker-b 1200 tokens $0.004200; total 1200 tokens in 3 calls, $0.004200)"
        );
        report.block_reason = Some("é".repeat(2000));
        let long = note(&report);
        assert!(long.len() <= EVENT_NOTE_LIMIT, "{}", long.len());
        assert!(
            long.ends_with("$0.004200)"),
            "the spend stays whole: {long}"
        );
    }

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
    fn a_failing_project_backs_off_exponentially_alone_and_recovers_at_once() {
        let start = std::time::Instant::now();
        let mut failing = ProjectSchedule::default();
        let healthy = ProjectSchedule::default();
        assert!(failing.due(start));
        let mut waits = Vec::new();
        for _ in 0..12 {
            failing.finished(false, start);
            waits.push(failing.not_before.unwrap() - start);
        }
        assert_eq!(waits[0], Duration::from_secs(1));
        assert_eq!(waits[1], Duration::from_secs(2));
        assert_eq!(waits[2], Duration::from_secs(4));
        assert_eq!(*waits.last().unwrap(), MAX_PROJECT_BACKOFF);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert!(!failing.due(start + Duration::from_secs(299)));
        assert!(failing.due(start + MAX_PROJECT_BACKOFF));
        assert!(healthy.due(start), "another project is not delayed");
        failing.finished(true, start);
        assert!(failing.due(start) && failing.failures == 0);
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
