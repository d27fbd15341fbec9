//! `protobot operator`: the controllers, the work-item state collector and
//! the admin server in one process. Any number of replicas may run: claims are
//! compare-and-swap on object status, so no leader election is needed.

use std::{net::SocketAddr, sync::Arc};

use futures::StreamExt;
use kube::{
    Api,
    runtime::{WatchStreamExt, reflector, watcher},
};
use protobot_api::{BuildWorkItem, LifecycleState};
use protobot_lifecycle::State;

use crate::{
    admin::{self, Readiness},
    metrics::{JobSiteMetrics, StateCounts},
};

/// Why the operator stopped.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// No cluster configuration could be found.
    #[error("failed to configure the Kubernetes client (in-cluster or KUBECONFIG): {0}")]
    Client(#[source] kube::Error),
    /// Metrics could not be registered.
    #[error("failed to register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// The admin server could not start.
    #[error(transparent)]
    Admin(#[from] admin::AdminError),
    /// The WMS API could not start.
    #[error(transparent)]
    WmsApi(#[from] crate::wms_api::WmsApiError),
}

/// Work items by state, read from the reflector's cache at scrape time.
pub struct CachedStates(pub reflector::Store<BuildWorkItem>);

/// Drops from a cached `BuildWorkItem` everything the state cache never reads.
/// The ledger, the attempt history, idempotency results and managed fields are
/// most of an item's bytes; a cache of ten thousand full items would hold
/// well over a hundred MiB, pruned it holds identity, project and state.
pub fn prune_for_state_cache(item: &mut BuildWorkItem) {
    let meta = &mut item.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    meta.owner_references = None;
    meta.finalizers = None;
    let spec = &mut item.spec;
    spec.materialization_key = String::new();
    spec.changed_requirements = Vec::new();
    spec.applicable_requirements = Vec::new();
    spec.dependencies = Vec::new();
    spec.spec_commit = None;
    spec.change_set_ref = None;
    if let Some(status) = item.status.as_mut() {
        status.contract_versions = Vec::new();
        status.owner = None;
        status.lease = None;
        status.readiness = None;
        status.dependencies = Vec::new();
        status.block_reason = None;
        status.active_resolution_submission_id = None;
        status.expected_merge = None;
        status.reconciliation = None;
        status.branch = None;
        status.cycles = Vec::new();
        status.candidate_commit = None;
        status.merge_commit = None;
        status.completion = None;
        status.ledger = None;
        status.conditions = Vec::new();
    }
}

/// The operator's cache of work items (for the by-state collector): a
/// reflector over `items` whose objects are pruned as they arrive. Poll the
/// returned future to keep the cache current.
pub fn state_cache(
    items: Api<BuildWorkItem>,
) -> (
    reflector::Store<BuildWorkItem>,
    impl std::future::Future<Output = ()>,
) {
    let (reader, writer) = reflector::store();
    // Small list pages: each page is decoded in full before pruning, so the
    // page size bounds the transient memory of a (re)list.
    let reflect = watcher(items, watcher::Config::default().page_size(100))
        .default_backoff()
        .modify(prune_for_state_cache)
        .reflect(writer)
        .for_each(|_| async {});
    (reader, reflect)
}

fn state_of(s: LifecycleState) -> State {
    match s {
        LifecycleState::Waiting => State::Waiting,
        LifecycleState::ReadyForBuilding => State::ReadyForBuilding,
        LifecycleState::Building => State::Building,
        LifecycleState::Inspecting => State::Inspecting,
        LifecycleState::Blocked => State::Blocked,
        LifecycleState::Merging => State::Merging,
        LifecycleState::Completed => State::Completed,
        LifecycleState::Abandoned => State::Abandoned,
    }
}

impl StateCounts for CachedStates {
    fn counts(&self) -> Vec<(State, u64)> {
        let mut counts: std::collections::BTreeMap<State, u64> = Default::default();
        for item in self.0.state() {
            if let Some(s) = item.status.as_ref() {
                *counts.entry(state_of(s.state)).or_default() += 1;
            }
        }
        counts.into_iter().collect()
    }
}

/// The in-cluster Job Site of this replica: its settings and executor.
pub struct JobSiteRuntime<E> {
    /// Identity, work directory, pass interval, limits.
    pub settings: crate::jobsite::Settings,
    /// The sandbox executor (pods from the sandbox profile).
    pub executor: Arc<E>,
}

/// Runs the operator until the controllers stop: registration (ChangeSets and
/// BugReports), Project status, the state collector, the admin server and —
/// when given — this replica's Job Site. `repositories` says which repository
/// locations Projects may name (`--allow-local-repositories`). With `wms_api`,
/// the WMS Adapter API is served over HTTP too (`crate::wms_api`).
#[allow(clippy::too_many_arguments)]
pub async fn run<E: protobot_jobsite::executor::Executor + 'static>(
    namespace: Option<String>,
    admin_addr: SocketAddr,
    job_site: Option<JobSiteRuntime<E>>,
    profiles: Option<crate::project::ProfileReports>,
    api_errors: crate::api_errors::ApiErrorSink,
    repositories: crate::project::decide::RepositoryPolicy,
    wms_api: Option<crate::wms_api::WmsApiConfig>,
) -> Result<(), OperatorError> {
    let client = crate::api_errors::infer_client(&api_errors)
        .await
        .map_err(OperatorError::Client)?;
    let items: Api<BuildWorkItem> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (reader, reflect) = state_cache(items);
    let registry = prometheus::Registry::new();
    let metrics = JobSiteMetrics::register(&registry, Arc::new(CachedStates(reader.clone())))?;
    // `protobot_forge_api_calls_total` and `protobot_forge_rate_limit_waits_total`.
    let forge_metrics = protobot_forge::metrics::ForgeMetrics::register(&registry)?;
    api_errors.count_into(metrics.reconcile_errors.clone());
    let readiness = Readiness::default();
    let (bound, _server) = admin::serve(admin_addr, registry, readiness.clone()).await?;
    let _wms_api = match wms_api {
        Some(cfg) => Some(crate::wms_api::serve(client.clone(), cfg).await?),
        None => None,
    };
    tracing::info!(version = env!("CARGO_PKG_VERSION"), %bound, namespace = ?namespace, "protobot operator starting");
    let ready = {
        let reader = reader.clone();
        let readiness = readiness.clone();
        async move {
            // Ready only once the caches synced.
            if reader.wait_until_ready().await.is_ok() {
                readiness.set_ready();
                tracing::info!("caches synced; ready");
            }
        }
    };
    let registry_dir = job_site
        .as_ref()
        .map(|j| j.settings.workdir.join("registry"))
        .unwrap_or_else(|| std::env::temp_dir().join("protobot-repositories"));
    // GitHub clients per Project, shared by registration (approvals) and the Job Site
    // (landing through pull requests); their API calls are counted on the registry.
    let forges = Arc::new(crate::forge::ForgeClients::new(
        client.clone(),
        Some(forge_metrics),
    ));
    let registration = crate::changeset::run_forged(
        client.clone(),
        namespace.clone(),
        registry_dir.clone(),
        repositories,
        Some(metrics.clone()),
        Arc::clone(&forges),
    );
    let bug_registration = crate::bugreport::run_metered(
        client.clone(),
        namespace.clone(),
        registry_dir.clone(),
        repositories,
        Some(metrics.clone()),
    );
    // Every replica observes Projects: the status is applied under one field
    // manager from what each observed, so replicas write the same thing.
    let mut project_ctx = crate::project::Context::new(client.clone(), registry_dir);
    project_ctx.profiles = profiles;
    project_ctx.repositories = repositories;
    project_ctx.forges = Some(Arc::clone(&forges));
    let projects = crate::project::run_metered(
        namespace.clone(),
        Arc::new(project_ctx),
        Some(metrics.clone()),
    );
    let inspection_runs =
        crate::inspectionrun::run_metered(client.clone(), namespace.clone(), Some(metrics.clone()));
    let jobs = async {
        match job_site {
            Some(j) => {
                metrics.slots.attach(
                    Arc::clone(&j.settings.capacity),
                    j.settings.max_concurrent_builds,
                );
                let settings = crate::jobsite::Settings {
                    metrics: Some(metrics.clone()),
                    repositories,
                    forges: Some(Arc::clone(&forges)),
                    ..j.settings
                };
                crate::jobsite::run(client.clone(), namespace.clone(), settings, j.executor).await
            }
            None => tracing::info!("no Job Site in this replica (registration and metrics only)"),
        }
    };
    tokio::join!(
        reflect,
        ready,
        registration,
        bug_registration,
        projects,
        inspection_runs,
        jobs
    );
    Ok(())
}
