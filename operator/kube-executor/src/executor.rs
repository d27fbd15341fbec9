//! [`KubernetesExecutor`]: the `Executor` port on Kubernetes. The pipeline of
//! one run, where only the marked steps touch the API or the disk:
//!
//! admit (conformance report) → build pod + NetworkPolicy (pure, refuses bad
//! runs before anything exists) → reserve the run name → **stage** input →
//! **create** NetworkPolicy, then pod → **watch** until the pod ends, the
//! cancel signal flips, or the executor's own deadline passes → read the log
//! tail → **collect** `/out` → **delete** pod and NetworkPolicy, wait for the
//! pod to be gone → **remove** the staged directory.

use std::{
    collections::{BTreeSet, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::{
    api::{
        core::v1::{ConfigMap, Pod},
        networking::v1::NetworkPolicy,
    },
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, LogParams, PostParams},
    runtime::wait::{await_condition, conditions},
};
use protobot_executors::{
    BackendIdentity, Capability, ConformanceReport, SandboxBackend, conformance::ensure_conformant,
};
use protobot_jobsite::{
    executor::{Executor, ExecutorError, RunOutput, RunSpec, Termination},
    sandbox_audit::{SessionRecord, session_chain},
};
use tokio::{sync::watch, time::Instant};

use crate::{
    config::{KubeExecutorConfig, StagingOwnership},
    manifest::{self, LABEL_EXECUTOR, LABEL_MANAGED_BY, LABEL_RUN_ID, MANAGED_BY},
    names::run_name,
    profile::{SandboxProfile, is_dns_label, is_dns_subdomain},
    staging::{self, Owner},
    status::{PodOutcome, outcome_with},
};

/// A configuration the executor cannot work with.
#[derive(Debug, thiserror::Error)]
#[error("invalid Kubernetes executor configuration: {field}: {reason}")]
pub struct ConfigError {
    /// The field.
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

/// Reading a conformance report failed (a missing report is not an error:
/// the executor then refuses every run).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The ConfigMap could not be read.
    #[error("failed to read conformance ConfigMap {namespace}/{name}")]
    Get {
        /// Namespace.
        namespace: String,
        /// ConfigMap.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The file could not be read.
    #[error("failed to read conformance report {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The report is not the contract's JSON.
    #[error(
        "failed to parse the conformance report from {origin}; regenerate it with `protobot sandbox conformance`"
    )]
    Parse {
        /// Where it came from.
        origin: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

/// Garbage collection failed.
#[derive(Debug, thiserror::Error)]
pub enum GcError {
    /// Listing failed.
    #[error("failed to list {kind} labelled {selector} in {namespace}")]
    List {
        /// Kind.
        kind: &'static str,
        /// Selector.
        selector: String,
        /// Namespace.
        namespace: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Deleting failed.
    #[error("failed to delete {kind} {namespace}/{name}")]
    Delete {
        /// Kind.
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// Removing a staged directory failed.
    #[error("failed to remove the staged directory {path}; remove it by hand")]
    Staging {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// What [`KubernetesExecutor::collect_garbage`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Pods deleted.
    pub pods: Vec<String>,
    /// NetworkPolicies deleted.
    pub network_policies: Vec<String>,
    /// Staged run directories removed.
    pub staging_dirs: Vec<String>,
}

/// Reads the profile's conformance report from the ConfigMap its profile
/// names (`spec.conformance`), in `namespace`. `Ok(None)` when the ConfigMap
/// or its key is absent.
pub async fn read_report_configmap(
    client: Client,
    namespace: &str,
    profile: &SandboxProfile,
) -> Result<Option<ConformanceReport>, ReportError> {
    let source = &profile.spec().conformance;
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let cm = api
        .get_opt(&source.config_map)
        .await
        .map_err(|source_err| ReportError::Get {
            namespace: namespace.to_owned(),
            name: source.config_map.clone(),
            source: source_err,
        })?;
    let Some(json) = cm
        .and_then(|cm| cm.data)
        .and_then(|mut d| d.remove(&source.key))
    else {
        return Ok(None);
    };
    serde_json::from_str(&json)
        .map(Some)
        .map_err(|e| ReportError::Parse {
            origin: format!(
                "ConfigMap {namespace}/{} key {}",
                source.config_map, source.key
            ),
            source: e,
        })
}

/// What a report ConfigMap holds.
enum ReportRead {
    Report(Box<ConformanceReport>),
    Missing,
    Invalid(ReportError),
}

fn report_of(
    cm: &ConfigMap,
    namespace: &str,
    source: &crate::profile::ConformanceSource,
) -> ReportRead {
    let Some(json) = cm.data.as_ref().and_then(|d| d.get(&source.key)) else {
        return ReportRead::Missing;
    };
    match serde_json::from_str(json) {
        Ok(r) => ReportRead::Report(Box::new(r)),
        Err(e) => ReportRead::Invalid(ReportError::Parse {
            origin: format!(
                "ConfigMap {namespace}/{} key {}",
                source.config_map, source.key
            ),
            source: e,
        }),
    }
}

/// Reads a conformance report file.
pub fn read_report_file(path: &std::path::Path) -> Result<ConformanceReport, ReportError> {
    let json = std::fs::read_to_string(path).map_err(|source| ReportError::Read {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&json).map_err(|source| ReportError::Parse {
        origin: path.display().to_string(),
        source,
    })
}

struct Inner {
    client: Client,
    /// `runs/<instance>` under the staging mount.
    runs_dir: PathBuf,
    config: KubeExecutorConfig,
    profile: SandboxProfile,
    /// The profile's conformance report, replaced when its ConfigMap changes
    /// ([`KubernetesExecutor::watch_report`]).
    report: std::sync::RwLock<Option<ConformanceReport>>,
    /// Built by [`KubernetesExecutor::for_conformance`]: runs are the suite's probes, admitted
    /// without a report (the report is what they measure).
    probing: bool,
    in_flight: Mutex<HashSet<String>>,
}

/// Runs sandboxed roles as Kubernetes pods built from a [`SandboxProfile`].
/// Cheap to clone; clones share the set of live runs.
#[derive(Clone)]
pub struct KubernetesExecutor {
    inner: Arc<Inner>,
    owner: Option<OwnerReference>,
}

impl std::fmt::Debug for KubernetesExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesExecutor")
            .field("profile", &self.inner.profile.name())
            .field("namespace", &self.inner.config.namespace)
            .field("instance", &self.inner.config.instance)
            .field("admitted", &self.admit().is_ok())
            .finish_non_exhaustive()
    }
}

/// Releases a run name when its run ends, however it ends.
struct Reservation {
    inner: Arc<Inner>,
    name: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Ok(mut live) = self.inner.in_flight.lock() {
            live.remove(&self.name);
        }
    }
}

/// How waiting for a pod ended.
enum Ending {
    Ended(Termination),
    Cancelled,
    ExecutorDeadline,
    CannotStart(String),
    Vanished,
}

impl KubernetesExecutor {
    /// An executor for `profile` using `client`. `report` is the profile's
    /// `jobsite-sandbox/v1` conformance report (see [`read_report_configmap`]
    /// and [`read_report_file`]); with none, or one that does not pass for
    /// this profile, every run is refused with
    /// [`ExecutorError::ProfileNotConformant`] before anything is created.
    pub fn new(
        client: Client,
        config: KubeExecutorConfig,
        profile: SandboxProfile,
        report: Option<ConformanceReport>,
    ) -> Result<Self, ConfigError> {
        Self::build(client, config, profile, report, false)
    }

    fn build(
        client: Client,
        config: KubeExecutorConfig,
        profile: SandboxProfile,
        report: Option<ConformanceReport>,
        probing: bool,
    ) -> Result<Self, ConfigError> {
        let bad = |field, reason: &str| ConfigError {
            field,
            reason: reason.to_owned(),
        };
        if !is_dns_label(&config.namespace) {
            return Err(bad("namespace", "must be a namespace name"));
        }
        if !is_dns_label(&config.instance) {
            return Err(bad(
                "instance",
                "must be a DNS-1123 label (it is a label value and a directory name)",
            ));
        }
        if !is_dns_subdomain(&config.staging.claim_name) {
            return Err(bad(
                "staging.claim_name",
                "must be a PersistentVolumeClaim name",
            ));
        }
        if !config.staging.mount_path.is_absolute() || !config.output_root.is_absolute() {
            return Err(bad(
                "staging.mount_path / output_root",
                "must be absolute paths",
            ));
        }
        if config.output_root.starts_with(&config.staging.mount_path) {
            return Err(bad(
                "output_root",
                "must be outside the staging volume, where no sandbox can reach collected output",
            ));
        }
        if let Err(why) = manifest::supervisor(&profile, &config) {
            tracing::warn!(
                profile = profile.name(),
                "{why}; pods run without the guest limits and resource-limits is reported unsupported"
            );
        }
        let owner = config.owner.clone();
        Ok(KubernetesExecutor {
            inner: Arc::new(Inner {
                runs_dir: staging::instance_dir(&config.staging.mount_path, &config.instance),
                client,
                config,
                profile,
                report: std::sync::RwLock::new(report),
                probing,
                in_flight: Mutex::default(),
            }),
            owner,
        })
    }

    /// An executor whose runs are the conformance suite's probes
    /// ([`crate::conformance::measure`]): admitted without a report, since producing the
    /// report is what they are for. Never give it to a Job Site: it would run work on a
    /// profile nobody measured. Its pods are labelled with `config.instance` like any
    /// executor's, so use an instance of its own (the CLI uses `conformance`).
    pub fn for_conformance(
        client: Client,
        config: KubeExecutorConfig,
        profile: SandboxProfile,
    ) -> Result<Self, ConfigError> {
        Self::build(client, config, profile, None, true)
    }

    /// Whether this executor was built by [`KubernetesExecutor::for_conformance`].
    pub fn is_probing(&self) -> bool {
        self.inner.probing
    }

    /// The same executor, putting `owner` on the objects of its runs.
    pub fn with_owner(&self, owner: OwnerReference) -> Self {
        KubernetesExecutor {
            inner: self.inner.clone(),
            owner: Some(owner),
        }
    }

    /// The sandbox profile.
    pub fn sandbox_profile(&self) -> &SandboxProfile {
        &self.inner.profile
    }

    /// The configuration.
    pub fn config(&self) -> &KubeExecutorConfig {
        &self.inner.config
    }

    /// The in-guest supervisor this executor puts into pods (`None`: none, see
    /// [`manifest::supervisor`]).
    pub fn supervisor(&self) -> Option<manifest::Supervisor> {
        manifest::supervisor(&self.inner.profile, &self.inner.config)
            .ok()
            .flatten()
    }

    /// Whether runs are admitted: a report for this profile that passes.
    pub fn admit(&self) -> Result<(), ExecutorError> {
        if self.inner.probing {
            return Ok(());
        }
        let profile = self.inner.profile.name();
        let report = self.inner.report.read().unwrap_or_else(|e| e.into_inner());
        match &*report {
            None => Err(ExecutorError::ProfileNotConformant {
                profile: profile.to_owned(),
                reason: format!(
                    "no conformance report; store one in ConfigMap {}/{} key {} (spec.conformance of the profile)",
                    self.inner.config.namespace,
                    self.inner.profile.spec().conformance.config_map,
                    self.inner.profile.spec().conformance.key
                ),
            }),
            Some(report) => {
                ensure_conformant(report, profile)?;
                // The report's own list of required capabilities could be
                // shorter than what the profile demands: check the profile's.
                let missing: Vec<&str> = self
                    .inner
                    .profile
                    .spec()
                    .required_capabilities
                    .iter()
                    .filter(|r| {
                        !report
                            .capabilities
                            .iter()
                            .any(|c| &c.name == *r && c.supported)
                    })
                    .map(String::as_str)
                    .collect();
                if missing.is_empty() {
                    Ok(())
                } else {
                    Err(ExecutorError::ProfileNotConformant {
                        profile: profile.to_owned(),
                        reason: format!(
                            "capabilities the profile requires are unsupported in its report: {}; autonomous execution disabled",
                            missing.join(", ")
                        ),
                    })
                }
            }
        }
    }

    /// Replaces the conformance report (`None`: there is none). Runs already admitted go
    /// on; every later run is checked against the new one.
    pub fn set_report(&self, report: Option<ConformanceReport>) {
        *self.inner.report.write().unwrap_or_else(|e| e.into_inner()) = report;
    }

    /// Keeps the conformance report current from the ConfigMap the profile names
    /// (`spec.conformance`) until the watch ends: a report stored, replaced or deleted
    /// admits or refuses runs without a restart. A report that does not parse refuses runs,
    /// and says why. Needs `list` and `watch` on ConfigMaps in the sandbox namespace.
    pub async fn watch_report(self) {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, watcher};
        let source = self.inner.profile.spec().conformance.clone();
        let namespace = self.inner.config.namespace.clone();
        let api: Api<ConfigMap> = Api::namespaced(self.inner.client.clone(), &namespace);
        let config =
            watcher::Config::default().fields(&format!("metadata.name={}", source.config_map));
        let mut events = watcher(api, config).default_backoff().boxed();
        // Whether the current (re)list has shown the ConfigMap: one deleted while the watch
        // was down is missing from the relist, never a Delete event.
        let mut listed = false;
        while let Some(event) = events.next().await {
            let report = match event {
                Ok(watcher::Event::Init) => {
                    listed = false;
                    continue;
                }
                Ok(watcher::Event::InitApply(cm)) => {
                    listed = true;
                    report_of(&cm, &namespace, &source)
                }
                Ok(watcher::Event::InitDone) if listed => continue,
                Ok(watcher::Event::InitDone) => ReportRead::Missing,
                Ok(watcher::Event::Apply(cm)) => report_of(&cm, &namespace, &source),
                Ok(watcher::Event::Delete(_)) => ReportRead::Missing,
                Err(e) => {
                    tracing::warn!(error = %e, namespace, config_map = source.config_map, "watching the sandbox conformance report failed; retrying with backoff, the last report stays in force");
                    continue;
                }
            };
            match report {
                ReportRead::Report(r) => {
                    tracing::info!(
                        profile = self.inner.profile.name(),
                        passed = r.passed,
                        "sandbox conformance report read"
                    );
                    self.set_report(Some(*r));
                }
                ReportRead::Missing => self.set_report(None),
                ReportRead::Invalid(e) => {
                    tracing::warn!(error = %e, "the sandbox conformance report does not parse; runs are refused until it does");
                    self.set_report(None);
                }
            }
            if let Err(refused) = self.admit() {
                tracing::warn!(error = %refused, "the sandbox executor refuses runs");
            }
        }
    }

    /// Names of the runs in flight in this executor (and its clones).
    pub fn live_runs(&self) -> BTreeSet<String> {
        self.inner
            .in_flight
            .lock()
            .map(|l| l.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.inner.client.clone(), &self.inner.config.namespace)
    }

    fn network_policies(&self) -> Api<NetworkPolicy> {
        Api::namespaced(self.inner.client.clone(), &self.inner.config.namespace)
    }

    fn runs_dir(&self) -> PathBuf {
        self.inner.runs_dir.clone()
    }

    fn staging_owner(&self) -> Option<Owner> {
        let sc = &self.inner.profile.spec().security_context;
        let profile_user = || {
            Some(Owner {
                uid: u32::try_from(sc.run_as_user).ok()?,
                gid: u32::try_from(sc.run_as_group).ok()?,
            })
        };
        match self.inner.config.staging_ownership {
            StagingOwnership::Keep => None,
            StagingOwnership::ProfileUser => profile_user(),
            StagingOwnership::Auto if staging::effective_uid() == Some(0) => profile_user(),
            StagingOwnership::Auto => None,
        }
    }

    fn reserve(&self, name: &str, run_id: &str) -> Result<Reservation, ExecutorError> {
        let mut live = self
            .inner
            .in_flight
            .lock()
            .map_err(|_| ExecutorError::Start {
                run_id: run_id.to_owned(),
                reason: "the executor's run registry is poisoned; restart the operator".into(),
            })?;
        if !live.insert(name.to_owned()) {
            return Err(ExecutorError::Start {
                run_id: run_id.to_owned(),
                reason: format!("run {name} is already executing; wait for it to end"),
            });
        }
        Ok(Reservation {
            inner: self.inner.clone(),
            name: name.to_owned(),
        })
    }

    /// The owner reference of `work_item`'s object in the sandbox namespace, if the
    /// configuration names one and it exists there.
    async fn work_item_owner(&self, work_item: &str) -> Option<OwnerReference> {
        let lookup = self.inner.config.work_item_owner.as_ref()?;
        if work_item.is_empty() {
            return None;
        }
        let (group, version) = lookup
            .api_version
            .split_once('/')
            .unwrap_or(("", lookup.api_version.as_str()));
        let resource = kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(group, version, &lookup.kind),
            &lookup.plural,
        );
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
            self.inner.client.clone(),
            &self.inner.config.namespace,
            &resource,
        );
        let name = (lookup.name_of)(work_item);
        match api.get_opt(&name).await {
            Ok(Some(object)) => Some(OwnerReference {
                api_version: lookup.api_version.clone(),
                kind: lookup.kind.clone(),
                name,
                uid: object.metadata.uid?,
                controller: None,
                block_owner_deletion: None,
            }),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(work_item, error = %e, "could not read the work item that owns this run; its pod is not garbage-collected with it");
                None
            }
        }
    }

    async fn run_checked(
        &self,
        spec: RunSpec,
        mut cancel: watch::Receiver<bool>,
    ) -> Result<RunOutput, ExecutorError> {
        let run_id = spec.run_id.clone();
        let start_err = |reason: String| ExecutorError::Start {
            run_id: run_id.clone(),
            reason,
        };
        self.admit()?;
        let (profile, config) = (&self.inner.profile, &self.inner.config);
        let looked_up = match &self.owner {
            Some(_) => None,
            None => self.work_item_owner(&spec.audit.work_item).await,
        };
        let owner = self.owner.as_ref().or(looked_up.as_ref());
        let pod = manifest::build_pod(profile, config, &spec, owner)
            .map_err(|e| start_err(e.to_string()))?;
        let policy = manifest::build_network_policy(profile, config, &spec, owner);
        let name = run_name(&spec.run_id);
        let _reservation = self.reserve(&name, &run_id)?;
        let out_dir = config
            .output_root
            .join(format!("{name}-{}", unique_suffix()));

        if *cancel.borrow() {
            return self.empty_output(&run_id, out_dir, Termination::Cancelled);
        }

        // A run with egress gets a session token valid until the run's own
        // deadline (build_pod refused the run already if there is no secret).
        let egress_token = match (&spec.egress_proxy, &config.egress_session_secret) {
            (Some(_), Some(secret)) => {
                let valid = spec.limits.wall_clock + config.start_allowance + config.grace_period;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let expires = i64::try_from((now + valid).as_secs()).unwrap_or(i64::MAX);
                Some(protobot_egress::issue_session_token(
                    secret,
                    &manifest::egress_session(&spec),
                    expires,
                ))
            }
            _ => None,
        };
        let (runs, stage_name, workspace, task, owner_ids) = (
            self.runs_dir(),
            name.clone(),
            spec.workspace.clone(),
            spec.task.clone(),
            self.staging_owner(),
        );
        let staged = tokio::task::spawn_blocking(move || {
            staging::stage(
                &runs,
                &stage_name,
                &workspace,
                &task,
                egress_token.as_deref(),
                owner_ids,
            )
        })
        .await
        .map_err(|e| start_err(format!("staging the input panicked: {e}")))?
        .map_err(|e| start_err(format!("failed to stage the input: {}", chain(&e))))?;

        // The policy exists before the pod, so the pod never runs unfenced.
        let pp = PostParams::default();
        let mut created_policy = self.network_policies().create(&pp, &policy).await;
        if matches!(&created_policy, Err(kube::Error::Api(s)) if s.code == 409) {
            // A run of this id left behind by another replica: replace it, once.
            match self.replace_leftover(&name, &run_id).await {
                Ok(()) => created_policy = self.network_policies().create(&pp, &policy).await,
                Err(reason) => {
                    let _ = staging::remove_tree(&staged.root);
                    return Err(start_err(reason));
                }
            }
        }
        if let Err(e) = created_policy {
            let _ = staging::remove_tree(&staged.root);
            return Err(start_err(format!(
                "failed to create NetworkPolicy {name}: {}",
                api_reason(&e)
            )));
        }
        let created = match self.pods().create(&pp, &pod).await {
            Ok(p) => p,
            Err(e) => {
                self.delete_network_policy(&name).await;
                let _ = staging::remove_tree(&staged.root);
                return Err(start_err(format!(
                    "failed to create sandbox pod {name}: {}",
                    api_reason(&e)
                )));
            }
        };
        let uid = created.uid().unwrap_or_default();
        tracing::info!(
            run_id,
            pod = name,
            profile = profile.name(),
            "sandbox pod created"
        );
        let started = Instant::now();
        let deadline = started + spec.limits.wall_clock + config.start_allowance;
        let ending = self.wait(&name, &uid, deadline, &mut cancel).await;
        let elapsed = started.elapsed();

        // Stop the sandbox first when it is still running.
        let still_running = matches!(
            ending,
            Ending::Cancelled | Ending::ExecutorDeadline | Ending::CannotStart(_)
        );
        if still_running {
            self.delete_pod(&name).await;
        }
        let stderr_tail = self.log_tail(&name).await;
        let gone = self.delete_pod_and_wait(&name, &uid).await;
        self.delete_network_policy(&name).await;

        let termination = match ending {
            Ending::Ended(t) => t,
            Ending::Cancelled => Termination::Cancelled,
            Ending::ExecutorDeadline => Termination::LimitExceeded {
                limit: "wall-clock".into(),
            },
            Ending::CannotStart(reason) => {
                if gone {
                    let _ = staging::remove_tree(&staged.root);
                }
                return Err(start_err(format!(
                    "sandbox pod {name} cannot start: {reason}"
                )));
            }
            Ending::Vanished => {
                if gone {
                    let _ = staging::remove_tree(&staged.root);
                }
                return Err(ExecutorError::Collect {
                    run_id,
                    reason: format!(
                        "sandbox pod {name} was deleted before it ended (by another actor or with its node)"
                    ),
                });
            }
        };
        if !gone {
            // The container may still write: collecting now could return a
            // half-written /out. Leave the directory to collect_garbage.
            return Err(ExecutorError::Collect {
                run_id,
                reason: format!(
                    "sandbox pod {name} was not gone {}s after deletion; its output was not collected (collect_garbage removes it later)",
                    config.deletion_timeout.as_secs()
                ),
            });
        }
        let (from, to, root) = (staged.out.clone(), out_dir.clone(), staged.root.clone());
        let collected = tokio::task::spawn_blocking(move || {
            let skipped = staging::collect_out(&from, &to);
            let removed = staging::remove_tree(&root);
            (skipped, removed)
        })
        .await
        .map_err(|e| ExecutorError::Collect {
            run_id: run_id.clone(),
            reason: format!("collecting /out panicked: {e}"),
        })?;
        let skipped = collected.0.map_err(|e| ExecutorError::Collect {
            run_id: run_id.clone(),
            reason: chain(&e),
        })?;
        if !skipped.is_empty() {
            tracing::warn!(
                run_id,
                ?skipped,
                "links and special files in /out were not collected"
            );
        }
        if let Err(e) = collected.1 {
            tracing::warn!(run_id, path = %staged.root.display(), "failed to remove the staged run directory: {e}");
        }
        tracing::info!(run_id, pod = name, ?termination, "sandbox run ended");
        Ok(RunOutput {
            out_dir,
            termination,
            elapsed,
            stderr_tail,
            // Sealed by `run` (the chain covers the whole session).
            audit: Vec::new(),
        })
    }

    fn empty_output(
        &self,
        run_id: &str,
        out_dir: PathBuf,
        termination: Termination,
    ) -> Result<RunOutput, ExecutorError> {
        std::fs::create_dir_all(&out_dir).map_err(|e| ExecutorError::Collect {
            run_id: run_id.to_owned(),
            reason: format!("failed to create {}: {e}", out_dir.display()),
        })?;
        Ok(RunOutput {
            out_dir,
            termination,
            elapsed: Duration::ZERO,
            stderr_tail: String::new(),
            audit: Vec::new(),
        })
    }

    /// Waits until the pod ends, cannot start, vanishes, `cancel` flips or
    /// `deadline` passes. Watch errors are retried until the deadline.
    async fn wait(
        &self,
        name: &str,
        uid: &str,
        deadline: Instant,
        cancel: &mut watch::Receiver<bool>,
    ) -> Ending {
        let cancelled = async {
            // A dropped sender means nobody can cancel any more.
            if cancel.wait_for(|c| *c).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::pin!(cancelled);
        let supervised = self.supervisor().is_some();
        loop {
            let done = |p: Option<&Pod>| match p {
                None => true,
                Some(p) => {
                    p.uid().as_deref() != Some(uid)
                        || outcome_with(p, supervised) != PodOutcome::Pending
                }
            };
            let watched = await_condition(self.pods(), name, done);
            tokio::select! {
                r = watched => match r {
                    Ok(Some(p)) if p.uid().as_deref() == Some(uid) => match outcome_with(&p, supervised) {
                        PodOutcome::Ended(t) => return Ending::Ended(t),
                        PodOutcome::CannotStart(reason) => return Ending::CannotStart(reason),
                        PodOutcome::Pending => {}
                    },
                    Ok(_) => return Ending::Vanished,
                    Err(e) => {
                        tracing::warn!(pod = name, "watching the sandbox pod failed, retrying: {e}");
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_secs(1)) => {}
                            () = tokio::time::sleep_until(deadline) => return Ending::ExecutorDeadline,
                            () = &mut cancelled => return Ending::Cancelled,
                        }
                    }
                },
                () = &mut cancelled => return Ending::Cancelled,
                () = tokio::time::sleep_until(deadline) => return Ending::ExecutorDeadline,
            }
        }
    }

    async fn log_tail(&self, name: &str) -> String {
        let lp = LogParams {
            container: Some(manifest::CONTAINER.to_owned()),
            tail_lines: Some(200),
            ..LogParams::default()
        };
        match self.pods().logs(name, &lp).await {
            Ok(log) => tail(&log, self.inner.config.log_tail_bytes),
            Err(e) => {
                tracing::debug!(pod = name, "no log tail: {e}");
                String::new()
            }
        }
    }

    fn delete_params(&self) -> DeleteParams {
        DeleteParams {
            grace_period_seconds: u32::try_from(self.inner.config.grace_period.as_secs()).ok(),
            ..DeleteParams::background()
        }
    }

    async fn delete_pod(&self, name: &str) {
        if let Err(e) = self.pods().delete(name, &self.delete_params()).await
            && !is_not_found(&e)
        {
            tracing::warn!(pod = name, "deleting the sandbox pod failed: {e}");
        }
    }

    /// Makes room for run `name` when a run of the same id was left behind (run ids are
    /// deterministic per item, cycle and role): by another executor instance, whose replica
    /// held the item's lease before this one and died or lost the lease mid-run, or by this
    /// very instance, when a start or a cleanup was cut off (the API server restarted between
    /// the NetworkPolicy's create and the pod's, and the cleanup's delete failed too: found by
    /// the API-server restart fault of `operator/cli/tests/operator_replicas.rs`, where every
    /// retry then met "already exists" forever). No run of this id is live in this instance
    /// ([`Self::reserve`] let this run start only because it is not), the engine starts a run
    /// only under the item's live lease, and a late command of an old holder is refused by
    /// its stale fencing token, so the leftover's result cannot count: its pod is deleted and
    /// waited for, then its NetworkPolicy.
    async fn replace_leftover(&self, name: &str, run_id: &str) -> Result<(), String> {
        let ours = &self.inner.config.instance;
        let existing = self.network_policies().get_opt(name).await.map_err(|e| {
            format!(
                "reading the NetworkPolicy {name} in the way: {}",
                api_reason(&e)
            )
        })?;
        let owner = existing
            .as_ref()
            .and_then(|p| p.labels().get(LABEL_EXECUTOR).cloned())
            .unwrap_or_default();
        if &owner == ours {
            tracing::warn!(
                run_id,
                pod = name,
                "replacing a run of the same id this executor left behind (an earlier start or cleanup of it was cut off)"
            );
        } else {
            tracing::warn!(
                run_id,
                pod = name,
                left_by = owner.as_str(),
                "replacing a run of the same id left behind by another replica (its lease on the item ended)"
            );
        }
        if let Some(pod) = self
            .pods()
            .get_opt(name)
            .await
            .map_err(|e| format!("reading the pod {name} in the way: {}", api_reason(&e)))?
            && !self
                .delete_pod_and_wait(name, &pod.uid().unwrap_or_default())
                .await
        {
            return Err(format!(
                "the pod {name} left behind by {owner} did not go within {:?}; the run is retried later",
                self.inner.config.deletion_timeout
            ));
        }
        self.delete_network_policy(name).await;
        Ok(())
    }

    /// Deletes the pod and waits (bounded) until it is gone.
    async fn delete_pod_and_wait(&self, name: &str, uid: &str) -> bool {
        self.delete_pod(name).await;
        let gone = await_condition(self.pods(), name, conditions::is_deleted(uid));
        match tokio::time::timeout(self.inner.config.deletion_timeout, gone).await {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                tracing::warn!(pod = name, "waiting for the sandbox pod to go failed: {e}");
                false
            }
            Err(_) => false,
        }
    }

    async fn delete_network_policy(&self, name: &str) {
        if let Err(e) = self
            .network_policies()
            .delete(name, &DeleteParams::default())
            .await
            && !is_not_found(&e)
        {
            tracing::warn!(
                network_policy = name,
                "deleting the NetworkPolicy failed: {e}"
            );
        }
    }

    /// Deletes every pod and NetworkPolicy labelled
    /// `app.kubernetes.io/managed-by=protobot` and `protobot.dev/executor=<instance>`
    /// whose run is not live in this executor, and the staged directories of
    /// this instance whose run is neither live nor still has a pod.
    ///
    /// Uniqueness assumption: one executor (and its clones) per `instance`
    /// value; two operator replicas sharing a namespace and staging volume
    /// must use different instances, or they would collect each other's runs.
    pub async fn collect_garbage(&self) -> Result<GcReport, GcError> {
        let ns = self.inner.config.namespace.clone();
        let selector = format!(
            "{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_EXECUTOR}={}",
            self.inner.config.instance
        );
        let lp = ListParams::default().labels(&selector);
        let live = self.live_runs();
        let is_dead = |labels: &std::collections::BTreeMap<String, String>| {
            labels.get(LABEL_RUN_ID).is_none_or(|r| !live.contains(r))
        };
        let list_err = |kind, source| GcError::List {
            kind,
            selector: selector.clone(),
            namespace: ns.clone(),
            source,
        };
        let mut report = GcReport::default();
        let pods = self
            .pods()
            .list(&lp)
            .await
            .map_err(|e| list_err("pods", e))?;
        for p in pods.items.iter().filter(|p| is_dead(p.labels())) {
            let name = p.name_any();
            match self.pods().delete(&name, &self.delete_params()).await {
                Ok(_) => report.pods.push(name),
                Err(e) if is_not_found(&e) => {}
                Err(source) => {
                    return Err(GcError::Delete {
                        kind: "pod",
                        namespace: ns.clone(),
                        name,
                        source,
                    });
                }
            }
        }
        let policies = self
            .network_policies()
            .list(&lp)
            .await
            .map_err(|e| list_err("networkpolicies", e))?;
        for np in policies.items.iter().filter(|p| is_dead(p.labels())) {
            let name = np.name_any();
            match self
                .network_policies()
                .delete(&name, &DeleteParams::default())
                .await
            {
                Ok(_) => report.network_policies.push(name),
                Err(e) if is_not_found(&e) => {}
                Err(source) => {
                    return Err(GcError::Delete {
                        kind: "networkpolicy",
                        namespace: ns.clone(),
                        name,
                        source,
                    });
                }
            }
        }
        // A staged directory goes only once no pod of its run remains: a pod
        // still terminating may write into it.
        let remaining: BTreeSet<String> = self
            .pods()
            .list(&lp)
            .await
            .map_err(|e| list_err("pods", e))?
            .items
            .iter()
            .filter_map(|p| p.labels().get(LABEL_RUN_ID).cloned())
            .collect();
        let runs = self.runs_dir();
        let staged = staging::staged_runs(&runs).map_err(|source| GcError::Staging {
            path: runs.clone(),
            source,
        })?;
        for dir in staged {
            if live.contains(&dir) || remaining.contains(&dir) {
                continue;
            }
            let path = runs.join(&dir);
            staging::remove_tree(&path).map_err(|source| GcError::Staging { path, source })?;
            report.staging_dirs.push(dir);
        }
        Ok(report)
    }
}

impl Executor for KubernetesExecutor {
    fn profile(&self) -> &str {
        self.inner.profile.name()
    }

    fn admit(&self) -> Result<(), ExecutorError> {
        KubernetesExecutor::admit(self)
    }

    async fn run(
        &self,
        spec: RunSpec,
        cancel: watch::Receiver<bool>,
    ) -> Result<RunOutput, ExecutorError> {
        let mut out = self.run_checked(spec.clone(), cancel).await?;
        // An output means the pod is gone (or never existed: cancelled before it was created).
        let identity = self.identity();
        let started = !(out.termination == Termination::Cancelled && out.elapsed.is_zero());
        out.audit = session_chain(&SessionRecord {
            backend_name: &identity.name,
            backend_version: &identity.version,
            profile: self.inner.profile.name(),
            spec: &spec,
            termination: started.then_some(&out.termination),
            cleanup: Ok(()),
        })
        .into_events();
        Ok(out)
    }
}

/// What the conformance suite sees of this backend. The capabilities are an
/// honest account of what this executor enforces by itself; the ones it
/// cannot (no broker, no in-guest supervisor) are
/// unsupported, so a report produced through it does not pass until they
/// exist, and every run stays refused.
impl SandboxBackend for KubernetesExecutor {
    fn identity(&self) -> BackendIdentity {
        BackendIdentity {
            name: "protobot-kubernetes".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn capabilities(&self) -> Vec<Capability> {
        let p = self.inner.profile.spec();
        vec![
            Capability::supported(
                "filesystem-isolation",
                format!(
                    "RuntimeClass {} with a read-only root; only the run's staged sub-paths (/workspace, /out, /task read-only) and a size-capped /tmp are mounted",
                    p.runtime_class_name
                ),
            ),
            Capability::supported(
                "git-isolation",
                "the workspace is a copy on the staging volume; projections with remotes, alternates or gitdir links are refused; reflogs scrubbed",
            ),
            Capability::supported(
                "network-policy",
                "one NetworkPolicy per run: all ingress denied, all egress (DNS included) denied except TCP to the profile's egress proxy; needs a CNI that enforces NetworkPolicy",
            ),
            match self.broker() {
                Ok(url) => Capability::supported(
                    "credential-broker",
                    format!(
                        "runs with egress reach only the egress proxy and credential broker (protobot egress-proxy) at {url}, allowed by the run's NetworkPolicy, with a signed session token that expires with the run; the broker injects credentials after authorization and strips them from responses; measured by the SB-NET/SB-CRED probes as pods through it"
                    ),
                ),
                Err(why) => Capability::unsupported("credential-broker", why),
            },
            Capability::supported(
                "lifecycle-cleanup",
                "cancel and the deadline delete the pod; pod, NetworkPolicy and staged directory are removed after every run; collect_garbage removes leftovers by label",
            ),
            match manifest::supervisor(&self.inner.profile, &self.inner.config) {
                Ok(Some(sup)) => Capability::supported(
                    "resource-limits",
                    format!(
                        "wall clock (activeDeadlineSeconds), memory, CPU and ephemeral storage by the pod; CPU time (RLIMIT_CPU), processes (RLIMIT_NPROC), file size (RLIMIT_FSIZE) and open files (RLIMIT_NOFILE) by the in-guest supervisor `protobot sandbox supervise`, copied from {} by an init container",
                        sup.image
                    ),
                ),
                Ok(None) => Capability::unsupported(
                    "resource-limits",
                    "wall clock (activeDeadlineSeconds), memory, CPU and ephemeral storage are enforced; CPU time, process count, file size and open files need the in-guest supervisor, which the profile does not configure (spec.supervisor)",
                ),
                Err(why) => Capability::unsupported(
                    "resource-limits",
                    format!(
                        "CPU time, process count, file size and open files are not enforced: {why}"
                    ),
                ),
            },
            Capability::supported(
                "audit-chain",
                "the pod's lifecycle mapped onto a SHA-256 chain per run: open, network decision, exec, limit or cancel, cleanup",
            ),
        ]
    }

    fn scratch_root(&self) -> &std::path::Path {
        &self.inner.runs_dir
    }

    fn broker_probe_proxy(&self) -> Option<String> {
        self.broker().ok()
    }

    /// The pod of the probe run: found by the marker in its sandbox container's environment
    /// among this executor's pods. From the conformance Job's own pod the probe's processes
    /// are in another PID namespace (and under gVisor another kernel); the pod object goes
    /// only once the kubelet has ended its containers.
    fn probe_processes(
        &self,
        marker: &str,
    ) -> impl std::future::Future<Output = protobot_executors::ProbeProcesses> + Send {
        let pods = self.pods();
        let selector = format!(
            "{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_EXECUTOR}={}",
            self.inner.config.instance
        );
        let wanted = manifest::literal(marker);
        async move {
            let alive = match pods.list(&ListParams::default().labels(&selector)).await {
                Ok(list) => list.items.iter().any(|pod| {
                    pod.spec.iter().flat_map(|s| &s.containers).any(|c| {
                        c.env.iter().flatten().any(|e| {
                            e.name == protobot_executors::PROBE_MARKER_ENV
                                && e.value.as_deref() == Some(wanted.as_str())
                        })
                    })
                }),
                // Unknown: counted as alive, so the check fails closed rather than passing.
                Err(e) => {
                    tracing::warn!("listing sandbox pods for SB-LIFE-001 failed: {e}");
                    true
                }
            };
            protobot_executors::ProbeProcesses::Sandbox { alive }
        }
    }
}

impl KubernetesExecutor {
    /// The egress proxy URL runs with egress are given, when this executor can
    /// give them the broker; else why not (the `credential-broker` detail).
    fn broker(&self) -> Result<String, String> {
        let (profile, config) = (&self.inner.profile, &self.inner.config);
        if profile.spec().egress.proxy.is_none() {
            return Err(format!(
                "profile {} allows no egress (spec.egress.proxy is empty), so runs never reach the egress proxy and credential broker",
                profile.name()
            ));
        }
        match (&config.egress_proxy_url, &config.egress_session_secret) {
            (Some(url), Some(_)) if !url.is_empty() => Ok(url.clone()),
            _ => Err("no egress proxy is configured for this executor: give it the proxy's URL and session secret (protobot operator / sandbox conformance --egress-proxy-url and --egress-session-secret; chart: egressProxy.enabled), so runs with egress get the credential broker and its probes can run".to_owned()),
        }
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// The API's message for a failed call (or the error itself).
fn api_reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 409 => format!(
            "{} (a run with this id is live or was left behind; wait for it or run collect_garbage)",
            s.message
        ),
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => chain(other),
    }
}

/// An error and its sources, `: `-separated.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The last `max` bytes of `s`, cut at a character boundary.
fn tail(s: &str, max: usize) -> String {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_owned()
}

/// A suffix that makes collected output directories unique per run attempt.
fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() & 0xffff_ffff_ffff)
        .unwrap_or(0);
    format!(
        "{:x}{:x}{nanos:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails_cut_at_char_boundaries() {
        assert_eq!(tail("hello", 3), "llo");
        assert_eq!(tail("hé", 1), "");
        assert_eq!(tail("abc", 10), "abc");
    }
}
