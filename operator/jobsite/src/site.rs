//! The Job Site loop: reconcile, resume, dispatch, build.
//!
//! One pass ([`JobSite::run_once`]):
//! 1. **Reconcile** every active item whose lease expired (whoever held it):
//!    `building`/`inspecting` → `recover-lease` (the work-item branch is kept, the
//!    persisted attempts say where to resume); `merging` → look for the merge on
//!    the default branch by its `Work-Item:` trailer and `record-merge` it from
//!    that evidence, or `merge-not-applied` when it never landed. Each command
//!    carries the observed evidence, so a split Git/WMS failure converges.
//! 2. **Resume** items whose live lease this Job Site (its trusted subject) still
//!    holds: a restarted process adopts its own claim from the store.
//! 3. **Dispatch**: claim ready items by business priority, then age, within the
//!    WIP limit, preferring items that do not overlap running work, and build
//!    them. A lost race (another Job Site claimed first) is skipped silently.
//!
//! Claims are compare-and-swap in the store, so any number of Job Sites can run
//! this loop against one store without leader election.

use std::{path::PathBuf, sync::Arc};

use tracing::Instrument;

use protobot_lifecycle::{
    AuthorizationContext, Command, CommandRequest, FencingToken, OperationEnvelope, Reconciliation,
    State, WorkItemRecord,
};
use protobot_repo::land::{fetch_remote_branch, find_merge_by_trailer};
use protobot_stores::{ItemFilter, Observation, StoreError, WorkStore};
use serde::{Deserialize, Serialize};

use crate::{
    builds::Builds,
    contract::BuildContract,
    dispatch::{Footprint, Priority, plan},
    engine::{BuildReport, Engine, EngineError, GitError},
    executor::Executor,
    lease::{Claim, Held},
    repo_folder::RepoFolder,
};

/// The states in which an item is being worked on under a lease.
const ACTIVE: [State; 3] = [State::Building, State::Inspecting, State::Merging];

/// The states a dispatch acts on (blocked items wait for a person).
const UNFINISHED: [State; 5] = [
    State::Waiting,
    State::ReadyForBuilding,
    State::Building,
    State::Inspecting,
    State::Merging,
];

/// The items of `snapshot` whose live lease `me` holds, as claims to resume (pure).
fn held_in(
    snapshot: &[WorkItemRecord],
    me: &str,
    now: jiff::Timestamp,
) -> Vec<(Claim, WorkItemRecord)> {
    snapshot
        .iter()
        .filter(|r| ACTIVE.contains(&r.state) && r.live_lease(now).is_some_and(|l| l.owner == me))
        .cloned()
        .map(|record| {
            let claim = Claim::new(Held {
                work_item_id: record.id.clone(),
                fencing_token: record
                    .lease
                    .as_ref()
                    .map(|l| l.fencing_token.clone())
                    .unwrap_or_default(),
                state: record.state,
                contract_version: record.contract_version,
            });
            (claim, record)
        })
        .collect()
}

/// Every lifecycle command a Job Site sends (its trusted context's allowed actions).
pub const JOB_SITE_ACTIONS: &[&str] = &[
    "claim",
    "renew-lease",
    "tests-pass",
    "raise-spec-question",
    "return-to-building",
    "begin-merge",
    "merge-conflict",
    "record-merge",
];

/// Every lifecycle command the Job Site's reconciler sends.
pub const RECONCILER_ACTIONS: &[&str] = &[
    "recover-lease",
    "record-merge",
    "merge-not-applied",
    "merge-conflict",
];

/// The Materializer commands of the dependency refresh.
pub const REFRESH_ACTIONS: &[&str] = &["refresh-dependencies", "revalidate"];

/// What a contract declares for dispatch: its scopes and the paths it expects to touch.
pub type Declared = (Vec<String>, Vec<String>);

/// Where a claimed item's build contract comes from. The contract is a
/// deterministic function of the registration, so a restarted Job Site can
/// always rebuild it.
pub trait ContractSource: Send + Sync {
    /// The contract of `record`.
    fn contract(&self, record: &WorkItemRecord) -> Result<BuildContract, String>;

    /// The scopes `record`'s contract declares and the paths it expects to
    /// touch (dispatch asks for every ready and running item on every pass, so
    /// sources that read a repository cache them).
    fn footprint(&self, record: &WorkItemRecord) -> Result<Declared, String> {
        self.contract(record).map(|c| (c.scopes, c.paths))
    }
}

/// Contracts held in memory (the materializer hands them over).
#[derive(Clone, Debug, Default)]
pub struct KnownContracts(pub std::collections::BTreeMap<String, BuildContract>);

impl ContractSource for KnownContracts {
    fn contract(&self, record: &WorkItemRecord) -> Result<BuildContract, String> {
        self.0
            .get(&record.id)
            .cloned()
            .ok_or_else(|| format!("no build contract is known for {}", record.id))
    }
}

/// Contracts rebuilt from the registration the materialization key names
/// (`<project>/<CS-NNNNN>@<merge commit>`): the manifest at that merge commit is
/// read again from `repo` through the spec store, so the contract is exactly the
/// one the Materializer built. Bug intakes (`<project>/bug:…`) are rebuilt from
/// the facts recorded where [`RegisteredContracts::with_bug_intakes`] says:
/// [`IntakeFiles`](crate::intake::IntakeFiles) on one machine, or
/// [`RecordedIntakes`](crate::intake::RecordedIntakes) read from the cluster.
#[derive(Debug)]
pub struct RegisteredContracts {
    /// A clone of the project repository (the default branch fetched).
    pub repo: PathBuf,
    /// The default branch.
    pub default_branch: String,
    /// Declared scopes and touched paths by materialization key (they depend on
    /// the registration only).
    footprints: std::sync::Mutex<std::collections::BTreeMap<String, Declared>>,
    /// Where bug intakes are recorded.
    bugs: Option<Box<dyn crate::intake::BugIntakes>>,
    /// The spec stores decoded at the commits read (a contract rebuilt is a pure
    /// function of its merge commit).
    snapshots: Arc<crate::snapshots::SnapshotCache>,
}

impl RegisteredContracts {
    /// Contracts rebuilt from registrations in `repo` (a clone whose
    /// `default_branch` holds the approved change sets).
    pub fn new(repo: PathBuf, default_branch: &str) -> RegisteredContracts {
        RegisteredContracts {
            repo,
            default_branch: default_branch.to_string(),
            footprints: std::sync::Mutex::new(Default::default()),
            bugs: None,
            snapshots: Arc::default(),
        }
    }

    /// Reads the spec stores through `snapshots` (shared with the process's other
    /// materializations) instead of a cache of its own.
    pub fn with_snapshots(
        mut self,
        snapshots: Arc<crate::snapshots::SnapshotCache>,
    ) -> RegisteredContracts {
        self.snapshots = snapshots;
        self
    }

    /// Also rebuilds bug contracts from the intakes recorded in `bugs` (an
    /// [`IntakeFiles`](crate::intake::IntakeFiles) directory or facts held in
    /// memory).
    pub fn with_bug_intakes(
        mut self,
        bugs: impl crate::intake::BugIntakes + 'static,
    ) -> RegisteredContracts {
        self.bugs = Some(Box::new(bugs));
        self
    }
}

/// Splits `<project>/<change set>@<merge>`.
pub fn parse_materialization_key(key: &str) -> Option<(&str, &str, &str)> {
    let (project, rest) = key.split_once('/')?;
    let (change_set, merge) = rest.rsplit_once('@')?;
    (!project.is_empty() && change_set.starts_with("CS-") && merge.len() == 40)
        .then_some((project, change_set, merge))
}

impl ContractSource for RegisteredContracts {
    fn contract(&self, record: &WorkItemRecord) -> Result<BuildContract, String> {
        if record.materialization_key.contains("/bug:") {
            let Some(bugs) = &self.bugs else {
                return Err(format!(
                    "work item {} is a bug intake, and this Job Site has no intake directory to rebuild it from",
                    record.id
                ));
            };
            let facts = bugs
                .recorded(&record.id)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("no bug intake is recorded for work item {}", record.id))?;
            let contract = crate::contract::build(&crate::contract::Intake::Bug(facts))
                .map_err(|e| e.to_string())?;
            if contract.materialization_key != record.materialization_key {
                return Err(format!(
                    "the recorded bug intake of {} rebuilds under key {}, not {}",
                    record.id, contract.materialization_key, record.materialization_key
                ));
            }
            return Ok(contract);
        }
        let (project, change_set, merge) = parse_materialization_key(&record.materialization_key)
            .ok_or_else(|| {
            format!(
                "work item {} has materialization key {:?}, which names no change set registration",
                record.id, record.materialization_key
            )
        })?;
        let registration = crate::materializer::Registration {
            project_id: project.into(),
            change_set_id: change_set.into(),
            merge_commit: Some(merge.into()),
            default_branch: self.default_branch.clone(),
            depends_on: record.dependencies.iter().map(|d| d.id.clone()).collect(),
            priority: record.priority.clone(),
        };
        let facts =
            crate::materializer::read_facts_with(&self.repo, &registration, &self.snapshots)
                .map_err(|e| e.to_string())?;
        let contract = crate::contract::build(&crate::contract::Intake::ChangeSet(facts))
            .map_err(|e| e.to_string())?;
        if contract.work_item_id != record.id {
            return Err(format!(
                "the registration of {} rebuilds as {}; the repository does not hold the approved change set",
                record.id, contract.work_item_id
            ));
        }
        Ok(contract)
    }

    fn footprint(&self, record: &WorkItemRecord) -> Result<Declared, String> {
        let key = &record.materialization_key;
        if let Some(hit) = self
            .footprints
            .lock()
            .ok()
            .and_then(|c| c.get(key).cloned())
        {
            return Ok(hit);
        }
        let contract = self.contract(record)?;
        let footprint = (contract.scopes, contract.paths);
        if let Ok(mut cache) = self.footprints.lock() {
            cache.insert(key.clone(), footprint.clone());
        }
        Ok(footprint)
    }
}

/// A W3C-format trace id (32 hex digits) for the build under one claim: a
/// digest (FNV-1a, 128 bits) of the work item and the claim's fencing token, so
/// every process logging about the same claim derives the same id, and a new
/// claim gets a new one.
pub fn trace_id(work_item_id: &str, fencing_token: &FencingToken) -> String {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut hash = OFFSET;
    for byte in work_item_id
        .bytes()
        .chain(std::iter::once(0))
        .chain(fencing_token.as_str().bytes())
    {
        hash ^= u128::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    format!("{hash:032x}")
}

/// The span every log line of one build carries (JSON logs show it): the work
/// item, the fencing token of the claim it builds under, the contract version the build
/// started from and the trace id. It is a root (`parent: None`): exported over OTLP, each
/// build attempt is one trace whose children are the stages (docs/tracing.md).
fn build_span(claim: &Claim, record: &WorkItemRecord) -> tracing::Span {
    let token = claim.held().map(|h| h.fencing_token).unwrap_or_default();
    tracing::info_span!(
        parent: None,
        "build",
        work_item = %record.id,
        fencing_token = %token.as_str(),
        contract_version = record.contract_version,
        state = %record.state,
        trace_id = %trace_id(&record.id, &token),
    )
}

/// What a pass did to one item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum SiteAction {
    /// An expired lease was recovered (item back to ready).
    RecoveredLease {
        /// Item.
        work_item_id: String,
    },
    /// A landed merge whose WMS write was lost was recorded from Git evidence.
    RecordedMerge {
        /// Item.
        work_item_id: String,
        /// The merge found by trailer.
        merge_commit: String,
    },
    /// A merge that never landed was returned to ready.
    MergeNotApplied {
        /// Item.
        work_item_id: String,
    },
    /// The item was built (fully or until blocked) by this Job Site.
    Built {
        /// The report.
        report: Box<BuildReport>,
    },
    /// This Job Site claimed the item (its build follows).
    Claimed {
        /// Item.
        work_item_id: String,
    },
    /// The claim was refused: another Job Site won it, or the item moved on.
    LostClaim {
        /// Item.
        work_item_id: String,
        /// Why it was refused.
        code: ClaimRefused,
    },
    /// A waiting item's dependencies all completed: it is ready now.
    DependenciesRefreshed {
        /// Item.
        work_item_id: String,
    },
    /// A dependency was abandoned: the item is blocked with that reason.
    Revalidated {
        /// Item.
        work_item_id: String,
        /// Why.
        reason: String,
    },
    /// The merge was pushed but the default branch does not contain it (the build
    /// stopped; the reconciler returns the item once it finds the merge not applied).
    MergeUnverified {
        /// Item.
        work_item_id: String,
        /// What the verification saw.
        error: String,
    },
    /// The build stopped with an error (the lease will expire and be recovered).
    Failed {
        /// Item.
        work_item_id: String,
        /// Why.
        error: String,
    },
}

/// Why a claim was refused: a normal outcome when Job Sites race, never an error. On the
/// wire (`--output json`) it is the code's string, as before it was typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum ClaimRefused {
    /// The store refused it with this code (`STALE_CONTRACT_VERSION`, `DUPLICATE_CLAIM`, …):
    /// another Job Site won, or the item moved on.
    #[error("{0}")]
    Code(protobot_lifecycle::Code),
    /// The store refused it without a code.
    #[error("REJECTED")]
    Uncoded,
    /// The store allowed it but issued no fencing token (a store defect): the item is
    /// not built, and its lease lapses.
    #[error("NO_FENCING_TOKEN")]
    NoFencingToken,
}

impl From<ClaimRefused> for String {
    fn from(refused: ClaimRefused) -> String {
        refused.to_string()
    }
}

impl TryFrom<String> for ClaimRefused {
    type Error = String;

    fn try_from(code: String) -> Result<Self, String> {
        match code.as_str() {
            "REJECTED" => Ok(ClaimRefused::Uncoded),
            "NO_FENCING_TOKEN" => Ok(ClaimRefused::NoFencingToken),
            other => protobot_lifecycle::Code::parse(other)
                .map(ClaimRefused::Code)
                .ok_or_else(|| format!("{other:?} is not a claim refusal code")),
        }
    }
}

/// Job Site failures outside any one build.
#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    /// The store failed.
    #[error("work store failed: {0}")]
    Store(#[from] StoreError),
    /// Git failed while gathering reconciliation evidence.
    #[error("failed to read reconciliation evidence from Git: {0}")]
    Git(#[source] GitError),
}

/// One Job Site.
pub struct JobSite<S, E> {
    /// The engine (its context's subject is this Job Site's identity).
    pub engine: Arc<Engine<S, E>>,
    /// The reconciler's trusted context.
    pub reconciler: AuthorizationContext,
    /// Build contracts.
    pub contracts: Arc<dyn ContractSource>,
    /// This Job Site's integration repository (a clone of the project with the remote).
    pub repo_dir: PathBuf,
    /// Most items built at once.
    pub wip_limit: usize,
    /// The Materializer's trusted context, when this Job Site also refreshes
    /// waiting items whose dependencies moved.
    pub materializer: Option<AuthorizationContext>,
    /// Build slots shared by every Job Site of this process (`--max-concurrent-builds`).
    /// `None`: one build at a time, each claimed right before it is built. `Some`: a pass
    /// claims as many ready items as there are free slots (within the WIP limit) and
    /// builds them, and the items it resumes, concurrently.
    pub capacity: Option<Arc<tokio::sync::Semaphore>>,
}

/// A claimed or resumed item waiting for its build in a concurrent pass.
struct Pending {
    claim: Claim,
    record: WorkItemRecord,
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<S: WorkStore + 'static, E: Executor> JobSite<S, E> {
    fn now(&self) -> jiff::Timestamp {
        self.engine.clock.now()
    }

    /// Runs passes until one finds nothing to reconcile, resume or claim.
    pub async fn run_until_idle(&self) -> Result<Vec<SiteAction>, SiteError> {
        let mut all = Vec::new();
        loop {
            let actions = self.run_once().await?;
            let progressed = actions.iter().any(|a| {
                !matches!(
                    a,
                    SiteAction::Claimed { .. }
                        | SiteAction::LostClaim { .. }
                        | SiteAction::Failed { .. }
                        | SiteAction::MergeUnverified { .. }
                )
            });
            all.extend(actions);
            if !progressed {
                return Ok(all);
            }
        }
    }

    /// One pass: reconcile, refresh dependencies, resume, dispatch; returns when every
    /// build it started has finished (single-machine runs and tests; a long-running Job
    /// Site uses [`Self::dispatch`]).
    pub async fn run_once(&self) -> Result<Vec<SiteAction>, SiteError> {
        let (actions, pending) = self.gather(&|_| false).await?;
        Ok(self.finish(actions, pending).await)
    }

    /// One dispatch of a long-running Job Site: reconcile expired leases, refresh
    /// dependencies, resume the items this Job Site holds that are not building here
    /// (nor backing off after a failed build, [`Builds::is_busy`]), claim ready items within the WIP limit and the free build slots; each build
    /// then runs in a task of its own in `builds` (under `tag`, reported on its channel
    /// when it finishes), and this returns without waiting for any. Without a
    /// [`Self::capacity`] the builds run inline, one at a time, as in [`Self::run_once`].
    pub async fn dispatch(
        self: &Arc<Self>,
        builds: &Builds,
        tag: &str,
    ) -> Result<Vec<SiteAction>, SiteError>
    where
        E: 'static,
    {
        let now = std::time::Instant::now();
        let (actions, pending) = self.gather(&|id| builds.is_busy(tag, id, now)).await?;
        for p in pending {
            let site = Arc::clone(self);
            let span = build_span(&p.claim, &p.record);
            let id = p.record.id.clone();
            builds.start(tag, &id, async move {
                let Pending {
                    claim,
                    record,
                    _slot: slot,
                } = p;
                let action = site.build(&claim, &record).instrument(span).await;
                // The slot is free only once the build (and its lease keeper) stopped.
                drop(slot);
                action
            });
        }
        Ok(actions)
    }

    /// Reconciles, refreshes, and claims or resumes: the claimed and resumed items
    /// whose builds are still to run (built inline without a capacity), skipping held
    /// items for which `building_here` is true.
    async fn gather(
        &self,
        building_here: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<(Vec<SiteAction>, Vec<Pending>), SiteError> {
        // One read of the project's unfinished items serves the whole dispatch; it is read
        // again only when reconciling or refreshing changed something. Finished items are
        // not read: a project's history costs a dispatch nothing (a store with a watch
        // cache does not even read their ledgers).
        let unfinished = ItemFilter {
            states: UNFINISHED.to_vec(),
        };
        let snapshot = self.engine.store.list(&unfinished).await?;
        let mut actions = self.reconcile_in(&snapshot).await?;
        if let Some(materializer) = &self.materializer {
            actions.extend(
                refresh_dependencies_in(
                    self.engine.store.as_ref(),
                    materializer,
                    self.now(),
                    &snapshot,
                )
                .await?,
            );
        }
        let snapshot = if actions.is_empty() {
            snapshot
        } else {
            self.engine.store.list(&unfinished).await?
        };
        let now = self.now();
        let mut pending = Vec::new();
        for (claim, record) in held_in(&snapshot, &self.engine.context.subject, now) {
            if building_here(&record.id) {
                continue;
            }
            tracing::info!(work_item = %record.id, state = %record.state, "resuming an item this Job Site still holds");
            if self.capacity.is_none() {
                actions.push(
                    self.build(&claim, &record)
                        .instrument(build_span(&claim, &record))
                        .await,
                );
            } else {
                // Held items are built whatever the free slots: their leases are running.
                pending.push(Pending {
                    _slot: self.slot(),
                    claim,
                    record,
                });
            }
        }
        if self.engine.stopping() {
            tracing::info!("shutting down: claiming no work");
            return Ok((actions, pending));
        }
        // Claim nothing while the executor refuses to run (a missing or failing
        // conformance report): recovery and resumption above still happen.
        if let Err(refusal) = self.engine.executor.admit() {
            tracing::warn!(error = %refusal, "the executor refuses runs; claiming no work");
            return Ok((actions, pending));
        }
        // Back-pressure before any planning: with every build slot of this process taken
        // nothing can be claimed, and planning is not free (an item's footprint rebuilds its
        // contract from the repository). A flood of ready items must cost a full replica
        // nothing per dispatch.
        if self
            .capacity
            .as_ref()
            .is_some_and(|c| c.available_permits() == 0)
        {
            tracing::debug!("every build slot of this process is taken; claiming nothing");
            return Ok((actions, pending));
        }
        let ready: Vec<WorkItemRecord> = snapshot
            .iter()
            .filter(|r| r.state == State::ReadyForBuilding)
            .cloned()
            .collect();
        // Items other Job Sites (or earlier passes) are building count against
        // the project's WIP limit and steer dispatch away from their scopes.
        let running: Vec<Footprint> = snapshot
            .iter()
            .filter(|r| ACTIVE.contains(&r.state) && r.live_lease(now).is_some())
            .map(|r| self.footprint(r))
            .collect();
        if running.len() >= self.wip_limit.max(1) {
            tracing::debug!("the project's WIP limit is reached; claiming nothing");
            return Ok((actions, pending));
        }
        let footprints: Vec<Footprint> = ready.iter().map(|r| self.footprint(r)).collect();
        for id in plan(&footprints, &running, self.wip_limit.max(1)) {
            let Some(record) = ready.iter().find(|r| r.id == id) else {
                continue;
            };
            let slot = match &self.capacity {
                None => None,
                Some(_) => match self.slot() {
                    Some(slot) => Some(slot),
                    None => {
                        tracing::debug!(
                            "every build slot of this process is taken; claiming no more"
                        );
                        break;
                    }
                },
            };
            match self.claim(record).await? {
                Ok(claim) => {
                    actions.push(SiteAction::Claimed {
                        work_item_id: id.clone(),
                    });
                    if let Err(e) = self.engine.boundary(&id, "after:claim") {
                        actions.push(SiteAction::Failed {
                            work_item_id: id,
                            error: e.to_string(),
                        });
                        continue;
                    }
                    if self.capacity.is_none() {
                        actions.push(
                            self.build(&claim, record)
                                .instrument(build_span(&claim, record))
                                .await,
                        );
                    } else {
                        pending.push(Pending {
                            claim,
                            record: record.clone(),
                            _slot: slot,
                        });
                    }
                }
                Err(code) => actions.push(SiteAction::LostClaim {
                    work_item_id: id,
                    code,
                }),
            }
        }
        Ok((actions, pending))
    }

    /// A free build slot of this process, if any (`None` also without a capacity).
    fn slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.capacity
            .as_ref()
            .and_then(|c| Arc::clone(c).try_acquire_owned().ok())
    }

    /// Builds the pending items concurrently (each renews its own lease) and appends what
    /// each build did, in the order they were claimed or resumed.
    async fn finish(&self, mut actions: Vec<SiteAction>, pending: Vec<Pending>) -> Vec<SiteAction> {
        let builds = pending.iter().map(|p| {
            self.build(&p.claim, &p.record)
                .instrument(build_span(&p.claim, &p.record))
        });
        actions.extend(futures::future::join_all(builds).await);
        actions
    }

    /// What dispatch knows of an item: its priority, when it became ready, the
    /// scopes its contract declares and the paths it expects to touch (none when
    /// the contract cannot be read: the build reports that error itself).
    fn footprint(&self, record: &WorkItemRecord) -> Footprint {
        let (scopes, paths) = self.contracts.footprint(record).unwrap_or_else(|error| {
            tracing::debug!(work_item = %record.id, %error, "no declared footprint for dispatch");
            (Vec::new(), Vec::new())
        });
        Footprint {
            id: record.id.clone(),
            priority: Priority::from_snapshot(&record.priority),
            ready_since: record.state_since.unwrap_or(jiff::Timestamp::UNIX_EPOCH),
            scopes: scopes.into_iter().collect(),
            paths: paths.into_iter().collect(),
        }
    }

    async fn build(&self, claim: &Claim, record: &WorkItemRecord) -> SiteAction {
        let contract = match self.contracts.contract(record) {
            Ok(c) => c,
            Err(error) => {
                return SiteAction::Failed {
                    work_item_id: record.id.clone(),
                    error,
                };
            }
        };
        // Renew at a third of the lease while the build runs; the keeper marks the
        // claim lost (and the engine stops at its next boundary) if renewals fail.
        let current = self.engine.store.get(&record.id).await.ok().flatten();
        let lease = current
            .as_ref()
            .and_then(|r| r.lease.as_ref())
            .map(|l| l.expires_at.duration_since(self.now()))
            .and_then(|d| std::time::Duration::try_from(d).ok())
            .filter(|d| !d.is_zero())
            .unwrap_or(std::time::Duration::from_secs(900));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let keeper = tokio::spawn(crate::lease::keep_alive(
            self.engine.store.clone(),
            self.engine.context.clone(),
            claim.clone(),
            self.engine.clock.clone(),
            lease,
            stop_rx,
        ));
        let built = Box::pin(self.engine.build(claim, &contract, &self.repo_dir)).await;
        let _ = stop_tx.send(true);
        let _ = keeper.await;
        match built {
            Ok(mut report) => {
                // The keeper has stopped: every renewal is counted.
                report.lease_renewals = claim.renewals();
                SiteAction::Built {
                    report: Box::new(report),
                }
            }
            Err(e @ EngineError::MergeNotVerified { .. }) => SiteAction::MergeUnverified {
                work_item_id: record.id.clone(),
                error: e.to_string(),
            },
            Err(e) => {
                tracing::warn!(work_item = %record.id, error = %e, "build stopped");
                SiteAction::Failed {
                    work_item_id: record.id.clone(),
                    error: e.to_string(),
                }
            }
        }
    }

    /// Claims `record` (compare-and-swap on its version); `Ok(Err(refused))` if the claim
    /// was refused (another Job Site won, or the item moved on).
    async fn claim(
        &self,
        record: &WorkItemRecord,
    ) -> Result<Result<Claim, ClaimRefused>, SiteError> {
        let env = OperationEnvelope::command(CommandRequest {
            command: Command::Claim,
            actor_context_ref: "job-site",
            work_item_id: &record.id,
            expected_state: State::ReadyForBuilding,
            expected_contract_version: record.contract_version,
            idempotency_key: format!(
                "{}:claim:v{}:{}",
                record.id, record.contract_version, self.engine.context.subject
            ),
        });
        let result = self
            .engine
            .store
            .execute(Some(&self.engine.context), &env, self.now())
            .await?;
        let Some(decision) = result.decision.as_ref().filter(|_| result.ok) else {
            let code = result
                .code()
                .map_or(ClaimRefused::Uncoded, ClaimRefused::Code);
            tracing::debug!(work_item = %record.id, %code, "claim lost");
            return Ok(Err(code));
        };
        let (Some(token), Some(after)) = (decision.fencing_token_issued.clone(), decision.after)
        else {
            return Ok(Err(ClaimRefused::NoFencingToken));
        };
        tracing::info!(work_item = %record.id, "claimed");
        Ok(Ok(Claim::new(Held {
            work_item_id: record.id.clone(),
            fencing_token: token,
            state: after.state,
            contract_version: after.contract_version,
        })))
    }

    /// Reconciles every active item whose lease expired.
    pub async fn reconcile(&self) -> Result<Vec<SiteAction>, SiteError> {
        let all = self.engine.store.list(&ItemFilter::default()).await?;
        self.reconcile_in(&all).await
    }

    /// [`Self::reconcile`] over the items of `snapshot`.
    async fn reconcile_in(
        &self,
        snapshot: &[WorkItemRecord],
    ) -> Result<Vec<SiteAction>, SiteError> {
        let now = self.now();
        let mut actions = Vec::new();
        for record in snapshot
            .iter()
            .filter(|r| ACTIVE.contains(&r.state) && r.live_lease(now).is_none())
        {
            if let Some(action) = self.reconcile_one(record).await? {
                actions.push(action);
            }
        }
        Ok(actions)
    }

    async fn reconcile_one(
        &self,
        record: &WorkItemRecord,
    ) -> Result<Option<SiteAction>, SiteError> {
        let id = record.id.clone();
        let (evidence, command, action) = match record.state {
            State::Building | State::Inspecting => (
                Reconciliation {
                    status: "lease-recovered".into(),
                    git_mutation: "none".into(),
                    merge_envelope: None,
                },
                Command::RecoverLease,
                SiteAction::RecoveredLease {
                    work_item_id: id.clone(),
                },
            ),
            State::Merging => {
                let config = &self.engine.config;
                let remote_ref = format!("refs/heads/{}", config.target_branch);
                let (remote, item) = (config.remote.clone(), id.clone());
                let merged = RepoFolder::new(&self.repo_dir)
                    .repo(
                        move |repo| match fetch_remote_branch(repo, &remote, &remote_ref)? {
                            Some(head) => find_merge_by_trailer(repo, head, &item),
                            None => Ok(None),
                        },
                    )
                    .await
                    .map_err(|e| SiteError::Git(e.into()))?
                    .map_err(|e| SiteError::Git(e.into()))?;
                match (merged, record.expected_merge.clone()) {
                    (Some(merge), Some(mut envelope)) => {
                        envelope.merge_commit = merge.to_string();
                        (
                            Reconciliation {
                                status: "merge-recorded".into(),
                                git_mutation: "merged".into(),
                                merge_envelope: Some(envelope),
                            },
                            Command::RecordMerge,
                            SiteAction::RecordedMerge {
                                work_item_id: id.clone(),
                                merge_commit: merge.to_string(),
                            },
                        )
                    }
                    _ => (
                        Reconciliation {
                            status: "not-applied".into(),
                            git_mutation: "none".into(),
                            merge_envelope: None,
                        },
                        Command::MergeNotApplied,
                        SiteAction::MergeNotApplied {
                            work_item_id: id.clone(),
                        },
                    ),
                }
            }
            _ => return Ok(None),
        };
        self.engine
            .store
            .observe(&id, Observation::Reconciliation(evidence))
            .await?;
        // The candidate's refs (the reconciler presents no merge commit of its own).
        let context = self.reconciler.clone().with_refs(
            record
                .expected_merge
                .iter()
                .flat_map(|m| [&m.target, &m.integration_head, &m.inspection_run_id])
                .filter(|r| !r.is_empty())
                .map(String::as_str),
        );
        let env = OperationEnvelope::command(CommandRequest {
            command,
            actor_context_ref: "reconciler",
            work_item_id: &id,
            expected_state: record.state,
            expected_contract_version: record.contract_version,
            idempotency_key: format!("{id}:{}:v{}", command.as_str(), record.contract_version),
        });
        let result = self
            .engine
            .store
            .execute(Some(&context), &env, self.now())
            .await?;
        if !result.ok {
            // Another reconciler or Job Site moved it first; the next pass sees the new state.
            tracing::info!(work_item = %id, code = ?result.code(), "reconciliation skipped");
            return Ok(None);
        }
        tracing::info!(work_item = %id, command = command.as_str(), "reconciled");
        Ok(Some(action))
    }
}

/// The Materializer's refresh of items that wait on other work items: a
/// `waiting` item whose dependencies all completed gets `refresh-dependencies`
/// (the store re-reads their states inside the command); a `waiting` or
/// `ready-for-building` item with an abandoned dependency is revalidated into
/// `blocked`, with the dependency named in its observed readiness.
pub async fn refresh_dependencies<S: WorkStore>(
    store: &S,
    materializer: &AuthorizationContext,
    now: jiff::Timestamp,
) -> Result<Vec<SiteAction>, SiteError> {
    let all = store.list(&ItemFilter::default()).await?;
    refresh_dependencies_in(store, materializer, now, &all).await
}

/// [`refresh_dependencies`] over the items of `all` (at least every waiting and ready item
/// of the project); a dependency not among them is read from the store.
async fn refresh_dependencies_in<S: WorkStore>(
    store: &S,
    materializer: &AuthorizationContext,
    now: jiff::Timestamp,
    all: &[WorkItemRecord],
) -> Result<Vec<SiteAction>, SiteError> {
    let mut known: std::collections::BTreeMap<String, State> =
        all.iter().map(|r| (r.id.clone(), r.state)).collect();
    let mut actions = Vec::new();
    for record in all.iter().filter(|r| {
        matches!(r.state, State::Waiting | State::ReadyForBuilding) && !r.dependencies.is_empty()
    }) {
        for d in &record.dependencies {
            if !known.contains_key(&d.id)
                && let Some(dependency) = store.get(&d.id).await?
            {
                known.insert(d.id.clone(), dependency.state);
            }
        }
        let state_of = |id: &str| known.get(id).copied();
        let abandoned: Vec<&str> = record
            .dependencies
            .iter()
            .filter(|d| state_of(&d.id) == Some(State::Abandoned))
            .map(|d| d.id.as_str())
            .collect();
        let (command, action) = if !abandoned.is_empty() {
            let reason = format!(
                "dependency {} was abandoned; re-plan or resolve the block",
                abandoned.join(", ")
            );
            let mut readiness = record.readiness.clone();
            if !readiness.unresolved_reasons.contains(&reason) {
                readiness.unresolved_reasons.push(reason.clone());
            }
            store
                .observe(&record.id, Observation::Readiness(readiness))
                .await?;
            (
                Command::Revalidate,
                SiteAction::Revalidated {
                    work_item_id: record.id.clone(),
                    reason,
                },
            )
        } else if record.state == State::Waiting
            && record
                .dependencies
                .iter()
                .all(|d| state_of(&d.id) == Some(State::Completed))
        {
            (
                Command::RefreshDependencies,
                SiteAction::DependenciesRefreshed {
                    work_item_id: record.id.clone(),
                },
            )
        } else {
            continue;
        };
        let env = OperationEnvelope::command(CommandRequest {
            command,
            actor_context_ref: "materializer",
            work_item_id: &record.id,
            expected_state: record.state,
            expected_contract_version: record.contract_version,
            idempotency_key: format!(
                "{}:{}:v{}",
                record.id,
                command.as_str(),
                record.contract_version
            ),
        });
        let result = store.execute(Some(materializer), &env, now).await?;
        if result.ok {
            tracing::info!(work_item = %record.id, command = command.as_str(), "dependencies refreshed");
            actions.push(action);
        } else {
            tracing::info!(work_item = %record.id, code = ?result.code(), "dependency refresh skipped");
        }
    }
    Ok(actions)
}

/// Compile-time check: a Job Site pass (and so every build in it) is a `Send` future, so
/// it runs as a task of its own on any runtime thread.
fn _a_pass_is_send<S: WorkStore + 'static, E: Executor + 'static>(site: &JobSite<S, E>) {
    fn send<T: Send>(_: &T) {}
    send(&site.run_once());
    send(&site.run_until_idle());
}

/// Convenience: whether an engine error means "another actor owns the item now".
pub fn is_lost(error: &EngineError) -> bool {
    matches!(
        error,
        EngineError::LeaseLost(_) | EngineError::Rejected { .. }
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::{ContractSource, FencingToken, RegisteredContracts, trace_id};
    use crate::{
        contract::BugFacts,
        intake::{IntakeFiles, RecordedIntakes},
    };
    use protobot_lifecycle::{State, WorkItemRecord};

    fn bug() -> BugFacts {
        BugFacts {
            touched_paths: vec!["tests/test_dry_run.sh".into()],
            project_id: "cli-sync".into(),
            bug_id: "GH-17".into(),
            spec_commit: "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d".into(),
            violated_requirement_ids: vec!["REQ-CLI-00001".into()],
            scopes: vec!["cli".into()],
            priority: "high".into(),
            impact: vec![],
        }
    }

    #[test]
    fn bug_contracts_are_rebuilt_from_intakes_held_in_memory_or_on_disk() {
        let mut recorded = RecordedIntakes::new();
        let contract = recorded.insert(bug()).unwrap();
        let mut record =
            WorkItemRecord::new(&contract.work_item_id, "cli-sync", State::Building, 2);
        record.materialization_key = contract.materialization_key.clone();
        // No repository is read for a bug: the path does not even exist.
        let nowhere = std::path::PathBuf::from("/nonexistent/protobot-repo");
        let in_memory =
            RegisteredContracts::new(nowhere.clone(), "main").with_bug_intakes(recorded);
        assert_eq!(in_memory.contract(&record).unwrap(), contract);
        assert_eq!(
            in_memory.footprint(&record).unwrap(),
            (contract.scopes.clone(), contract.paths.clone())
        );
        // One machine: the same facts from an intake directory give the same contract.
        let tmp = tempfile::tempdir().unwrap();
        let files = IntakeFiles::new(tmp.path());
        files.record(&bug()).unwrap();
        let on_disk = RegisteredContracts::new(nowhere.clone(), "main").with_bug_intakes(files);
        assert_eq!(on_disk.contract(&record).unwrap(), contract);
        // No facts for the item, a key the facts do not rebuild under, no intakes at all.
        let empty = RegisteredContracts::new(nowhere.clone(), "main")
            .with_bug_intakes(RecordedIntakes::new());
        let err = empty.contract(&record).unwrap_err();
        assert!(err.contains("no bug intake is recorded"), "{err}");
        let mut moved = record.clone();
        moved.materialization_key = format!("cli-sync/bug:GH-17@{}", "f".repeat(40));
        let err = in_memory.contract(&moved).unwrap_err();
        assert!(err.contains("rebuilds under key"), "{err}");
        let err = RegisteredContracts::new(nowhere, "main")
            .contract(&record)
            .unwrap_err();
        assert!(err.contains("no intake directory"), "{err}");
    }

    #[test]
    fn a_claim_refusal_is_its_code_on_the_wire_and_reads_back() {
        use super::ClaimRefused;
        for refused in [
            ClaimRefused::Code(protobot_lifecycle::Code::DuplicateClaim),
            ClaimRefused::Uncoded,
            ClaimRefused::NoFencingToken,
        ] {
            let wire = serde_json::to_value(refused).unwrap();
            assert_eq!(wire, serde_json::Value::String(refused.to_string()));
            assert_eq!(
                serde_json::from_value::<ClaimRefused>(wire).unwrap(),
                refused
            );
        }
        assert_eq!(
            serde_json::to_value(ClaimRefused::Code(
                protobot_lifecycle::Code::StaleContractVersion
            ))
            .unwrap(),
            "STALE_CONTRACT_VERSION"
        );
        let err = serde_json::from_value::<ClaimRefused>("NOPE".into()).unwrap_err();
        assert!(err.to_string().contains("NOPE"), "{err}");
    }

    #[test]
    fn trace_ids_are_w3c_shaped_stable_and_distinct_per_claim() {
        let fence = |t: &str| FencingToken::from(t);
        let id = trace_id("wi-cs-00001-abcdef0123", &fence("fence-7"));
        assert_eq!(id.len(), 32);
        assert!(
            id.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_ne!(id, "0".repeat(32), "all zeros is an invalid trace id");
        assert_eq!(id, trace_id("wi-cs-00001-abcdef0123", &fence("fence-7")));
        assert_ne!(id, trace_id("wi-cs-00001-abcdef0123", &fence("fence-8")));
        assert_ne!(trace_id("ab", &fence("c")), trace_id("a", &fence("bc")));
    }
}
