//! The Job Site engine: one claimed work item from its spec commit to a merge
//! on the default branch, resumable from whatever the WMS and Git say.
//!
//! [`Engine::build`] is re-entrant. It reads the item's state and persisted
//! attempt history from the work store and continues from there, so a Job Site
//! that crashed (or an item recovered from another Job Site) resumes at the
//! right stage, cycle and model tier:
//! - `building`: one cycle exports the Worker A and Worker B projections of the
//!   work-item branch, runs both Workers concurrently in sandboxes, validates each
//!   Worker's patch bundle against its role's ownership rules before anything
//!   touches the integration repository, merges accepted bundles into
//!   `wi/<id>-build`, runs the integration runner on the candidate in a sandbox
//!   and triages the results; Worker feedback passes the sanitizer. Each cycle
//!   ends with a fenced `Attempt` observation (outcome, tier, candidate,
//!   sanitized feedback). A passing cycle sends `tests-pass`; too many genuine
//!   failures raise a spec question; transient failures retry at the same tier.
//! - `inspecting`: pre-merge revalidation (the current default branch is merged
//!   into the work-item branch and the integration gate reruns when it moved),
//!   an Inspection Run (every configured producer runs through the Executor; the
//!   finding ledger seals or sends the candidate back with sanitized feedback),
//!   the inspection evidence, the attestation snapshot and `begin-merge` with
//!   the tested-candidate envelope.
//! - `merging`: land only a candidate that contains the remote head (guarded
//!   push, verification, idempotent by `Work-Item:` trailer) and `record-merge`;
//!   a remote that moved sends the item back through `merge-conflict`.
//!
//! Every lifecycle command presents the claim's fence; a lost lease stops the
//! work at the next effect boundary; the push is idempotent by trailer. Every effect boundary is named, traced and
//! can be interrupted by a [`FaultHook`], which is how the crash-consistency
//! tests stop the engine at each one.
//!
//! Output contract of the roles (inside the sandbox):
//! - Workers commit in `/workspace` and copy it to `/out/worker` (the control
//!   plane reads their commits from that copy, never from a shared path);
//! - the integration runner writes `/out/results.json`:
//!   `{"build_errors": [{owner, artifact, message}], "results": [{test_id,
//!   requirement_ids, status, baseline}]}` (the triage input);
//! - Inspectors write `/out/findings.jsonl`, mutation campaigns
//!   `/out/campaign.json` (see [`crate::inspection`]).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use git2::{Oid, Repository};

use crate::repo_folder::RepoFolder;
use protobot_lifecycle::{
    AttemptRecord, AuthorizationContext, Command, MergeEnvelope, ResultEnvelope, State,
    WorkItemRecord,
};
use protobot_repo::{
    bundle::collect_bundle,
    catalog::ChangeScope,
    digest::product_tree_digest,
    export::{ProjectionRecord, record_path_for},
    integrate::{
        CycleInfo, WorkItemRef, apply_bundle, ensure_work_item_branch, merge_into_work_item,
        refresh_work_item,
    },
    land::{
        AttestationFile, LandError, commit_attestation, fetch_remote_branch, find_merge_by_trailer,
        land_tested_work_item, push_with_guard, remote_head, verify_remote_contains,
    },
    manifest::PathClass,
    role::Role,
    seams::projection_export,
    trailers,
    validate::{Limits as BundleLimits, accept_bundle},
};
use protobot_stores::{Observation, WorkStore};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::{
    contract::BuildContract,
    escalation::{Escalation, Outcome, Tier, TierModels},
    executor::{Executor, Limits, RunSpec, SandboxRole},
    inspection::{ProducerKind, RoutedFinding, Verdict, carried_over, parse_report, record_run},
    landing::{
        EscalationRequest, ForgeRefusal, Landing, LandingSummary, PullRequestForge,
        PullRequestMerge,
    },
    lease::{Claim, Clock},
    ledger::{Disposition, Ledger},
    sanitizer::{FeedbackOutcome, Origin, RawDiagnostic, RawFeedback, SanitizedFeedback, sanitize},
    triage::{Assignment, Decision, Fault, Side, Triage, TriageInput},
};

/// A progress callback: called with a one-line description of each stage.
pub type StageHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Fault injection: called at every named effect boundary; returning true stops
/// the engine right there, as if its process died ([`EngineError::Interrupted`]).
pub type FaultHook = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// A harness: the command a role runs in its sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerClass {
    /// argv.
    pub command: Vec<String>,
    /// Container image (Kubernetes only).
    pub image: Option<String>,
    /// Whether its runs may reach the egress proxy (and through it, as the
    /// proxy's policy allows, a model API with a credential the broker adds).
    /// Off by default: a run has no network at all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub egress: bool,
    /// The model each escalation tier runs (`{"t1": {"provider", "model"}, …}`); the task
    /// carries the current tier's as `model`. Empty: the harness chooses its own.
    #[serde(default, skip_serializing_if = "TierModels::is_empty")]
    pub tiers: TierModels,
}

/// A finding producer of the Inspection Run: an Inspector or a mutation campaign
/// (a project-configured command), run through the Executor on the Inspector
/// projection of the candidate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Producer {
    /// Producer principal (unique within a run; independence is checked by it).
    pub name: String,
    /// What it writes.
    pub kind: ProducerKind,
    /// Its harness.
    pub class: WorkerClass,
}

/// The egress proxy a run of `class` gets: none unless the class asks for
/// egress, and then the configured proxy or a refusal that says what to set.
pub fn egress_for(class: &WorkerClass, proxy: Option<&str>) -> Result<Option<String>, String> {
    match (class.egress, proxy) {
        (false, _) => Ok(None),
        (true, Some(url)) => Ok(Some(url.to_owned())),
        (true, None) => Err("its worker class asks for egress, but the Job Site has no egress proxy configured; set the proxy URL (protobot operator --egress-proxy-url) or remove \"egress\" from the class".into()),
    }
}

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Most genuine build cycles before raising a spec question.
    pub max_cycles: u32,
    /// Transient failures (executor errors) retried at the same tier, per build.
    pub transient_retries: u32,
    /// The WorkerClass's cheapest tier (escalation starts here).
    pub start_tier: Tier,
    /// Worker A (tests).
    pub worker_a: WorkerClass,
    /// Worker B (implementation).
    pub worker_b: WorkerClass,
    /// The integration runner.
    pub integration: WorkerClass,
    /// Inspection Run producers (none: the run seals on the gate alone).
    pub producers: Vec<Producer>,
    /// Sandbox limits per run.
    pub limits: Limits,
    /// Scratch directory for projections, outputs and trace files.
    pub scratch: PathBuf,
    /// Remote to land on.
    pub remote: String,
    /// Default branch.
    pub target_branch: String,
    /// Base URL of the egress proxy given to runs whose class asks for egress
    /// (`None`: such runs are refused).
    pub egress_proxy: Option<String>,
    /// How [`Engine::build`] lands (the default: a direct push; a Project with a forge lands
    /// through a pull request: `crate::landing`).
    pub landing: Landing,
}

impl EngineConfig {
    /// Settings with the defaults for everything but the harnesses and paths.
    pub fn new(
        worker_a: WorkerClass,
        worker_b: WorkerClass,
        integration: WorkerClass,
        scratch: PathBuf,
    ) -> EngineConfig {
        EngineConfig {
            max_cycles: 3,
            transient_retries: 3,
            start_tier: Tier::T1,
            worker_a,
            worker_b,
            integration,
            producers: Vec::new(),
            limits: Limits::default(),
            scratch,
            remote: "origin".into(),
            target_branch: "main".into(),
            egress_proxy: None,
            landing: Landing::DirectPush,
        }
    }
}

/// What happened in one cycle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CycleReport {
    /// Cycle number.
    pub cycle: u32,
    /// `pass`, `test`, `implementation`, `both`, `rejected-inspection` or `transient`.
    pub decision: String,
    /// Feedback each Worker received (already sanitized).
    pub feedback: Vec<SanitizedFeedback>,
    /// Redactions made.
    pub redactions: usize,
    /// Files scanned in this cycle's Worker projections (none may leak).
    pub projection_files_scanned: usize,
    /// The model tier the Workers ran at.
    pub tier: Tier,
}

/// One sealed or rejected Inspection Run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InspectionReport {
    /// Run id (bound to the candidate).
    pub run_id: String,
    /// Candidate inspected.
    pub candidate: String,
    /// Its product-tree digest.
    pub product_tree_digest: String,
    /// The contract version the run was made for.
    pub contract_version: u64,
    /// Ledger sequence when the run started.
    pub ledger_sequence_at_start: u64,
    /// Producers that completed.
    pub producers: Vec<String>,
    /// Findings recorded in the run.
    pub findings: usize,
    /// The verdict.
    pub verdict: Verdict,
}

/// The end of a build (of this process's part of it, when resumed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildReport {
    /// Work item.
    pub work_item_id: String,
    /// Final state.
    pub state: State,
    /// Cycles run by this process.
    pub cycles: Vec<CycleReport>,
    /// Inspection runs by this process.
    pub inspections: Vec<InspectionReport>,
    /// Times the default branch had moved and was merged in before landing.
    pub revalidations: u32,
    /// The merge commit on the default branch, when completed.
    pub merge_commit: Option<String>,
    /// Evidence: the attested product-tree digest.
    pub product_tree_digest: Option<String>,
    /// Why the item is blocked, when it is.
    pub block_reason: Option<String>,
    /// Lease renewals while this process built it (set by the Job Site, which keeps the lease).
    #[serde(default)]
    pub lease_renewals: crate::lease::LeaseRenewals,
}

/// Why a build stopped abnormally (a rejected command is a lost claim).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The lease is gone: stop touching the item.
    #[error(transparent)]
    LeaseLost(#[from] crate::lease::LeaseLost),
    /// A lifecycle command was rejected.
    #[error("{command} on {work_item_id} was rejected: {code}")]
    Rejected {
        /// Item.
        work_item_id: String,
        /// Command.
        command: String,
        /// Code.
        code: String,
    },
    /// The store failed.
    #[error("work store failed: {0}")]
    Store(#[from] protobot_stores::StoreError),
    /// Git failed.
    #[error("failed to {operation}: {reason}")]
    Git {
        /// What.
        operation: &'static str,
        /// Why.
        reason: String,
    },
    /// The sandbox failed (not the command in it).
    #[error(transparent)]
    Executor(#[from] crate::executor::ExecutorError),
    /// An exported projection holds a path its role must never see.
    #[error("the {role} projection holds {path}, which that role must never see; the build stops")]
    ProjectionLeak {
        /// Role.
        role: &'static str,
        /// The offending path.
        path: String,
    },
    /// A role's output is malformed.
    #[error("the {role} output is unusable: {reason}")]
    Output {
        /// Role.
        role: &'static str,
        /// Why.
        reason: String,
    },
    /// The work item is in a state this engine does not drive.
    #[error(
        "work item {work_item_id} is {state}; the Job Site drives only building, inspecting and merging items"
    )]
    NotDrivable {
        /// Item.
        work_item_id: String,
        /// Its state.
        state: State,
    },
    /// A Worker's patch was refused for a gap in the projection policy (a path
    /// no entry classifies): another cycle cannot help, so the item blocks with
    /// this reason (`crate::triage::policy_gap`).
    #[error("{reason}")]
    PolicyGap {
        /// The block reason: the paths, their class and the fix.
        reason: String,
    },
    /// Fault injection stopped the engine at a boundary (tests only).
    #[error("interrupted at effect boundary {boundary}")]
    Interrupted {
        /// The boundary.
        boundary: String,
    },
    /// The merge was pushed but the default branch, fetched back, does not contain it: it
    /// is never recorded; the item stays `merging` until the reconciler finds it not
    /// applied.
    #[error("failed to verify the merge on the default branch: {reason}")]
    MergeNotVerified {
        /// What the verification saw.
        reason: String,
    },
    /// The forge refused to merge the pull request for a reason a person must resolve (a
    /// failing required check, branch protection) or because it rejected the request: the
    /// build stops, the item stays `merging` with its merge envelope, and (for a person's
    /// decision) the forge's escalation issue says what to decide.
    #[error("the merge of {work_item_id} was refused: {refusal}")]
    MergeRefused {
        /// Item.
        work_item_id: String,
        /// The forge's typed reason.
        refusal: ForgeRefusal,
    },
    /// The process is shutting down: the engine stopped at an effect boundary. The lease
    /// lapses (or another Job Site recovers it) and the item resumes from its record.
    #[error(
        "stopped at effect boundary {boundary}: this Job Site is shutting down; another one resumes the item once its lease lapses"
    )]
    ShuttingDown {
        /// The boundary.
        boundary: String,
    },
}

/// Raised when the process shuts down (SIGTERM, SIGINT): engines stop at their next effect
/// boundary and Job Sites claim nothing more. Shared by every engine of a process.
#[derive(Clone, Debug, Default)]
pub struct StopSignal(Arc<std::sync::atomic::AtomicBool>);

impl StopSignal {
    /// A signal not raised yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises it (idempotent).
    pub fn raise(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether it was raised.
    pub fn is_raised(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

fn git_err<E: std::fmt::Display>(operation: &'static str) -> impl Fn(E) -> EngineError {
    move |e| EngineError::Git {
        operation,
        reason: e.to_string(),
    }
}

#[derive(Debug, Default, Deserialize)]
struct Results {
    #[serde(default)]
    build_errors: Vec<crate::triage::BuildError>,
    #[serde(default)]
    results: Vec<crate::triage::TestResult>,
}

/// A run's id (unique and deterministic) and the build cycle it belongs to (0 for
/// inspection runs).
struct RunName {
    run_id: String,
    cycle: u32,
}

impl RunName {
    fn new(run_id: String, cycle: u32) -> Self {
        Self { run_id, cycle }
    }
}

/// A structured trace event: one per stage decision, written as a JSON line to
/// `<scratch>/traces/<work item>.jsonl` and emitted through `tracing`, so every
/// agentic component can be evaluated from a recorded run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEvent {
    /// When (trusted clock).
    pub at: jiff::Timestamp,
    /// Work item.
    pub work_item_id: String,
    /// Stage: `cycle`, `gate`, `inspection`, `revalidation`, `land`, `command`, …
    pub stage: String,
    /// Cycle, when the event belongs to one.
    pub cycle: Option<u32>,
    /// The inputs the decision was made from.
    pub inputs: serde_json::Value,
    /// The decision.
    pub decision: serde_json::Value,
    /// How long the stage took.
    pub duration_ms: u64,
}

/// Reads the trace events recorded for `work_item_id` under `scratch`.
pub fn read_trace(scratch: &Path, work_item_id: &str) -> Vec<TraceEvent> {
    std::fs::read_to_string(scratch.join("traces").join(format!("{work_item_id}.jsonl")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Scans an exported projection and fails closed if it holds a path its role
/// must never see (Worker A: implementation; Worker B: test source; both:
/// anything unclassified, integration-only or attestation-only; the Inspector:
/// anything unclassified or integration-only). The export
/// already filters by role; this is the independent check the demo and every
/// build run on what actually landed on disk. Returns the number of files scanned.
pub fn scan_projection(dir: &Path, role: Role) -> Result<usize, EngineError> {
    use protobot_repo::manifest::PathClass;
    let record = ProjectionRecord::read(&record_path_for(dir))
        .map_err(git_err("read the projection record"))?;
    let mut stack = vec![dir.to_path_buf()];
    let mut scanned = 0;
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(git_err("scan a projection"))?;
        for entry in entries {
            let entry = entry.map_err(git_err("scan a projection"))?;
            let path = entry.path();
            if entry.file_name() == ".git" {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(dir)
                .map(|p| p.to_string_lossy().replace('\\', "/"))
                .unwrap_or_default();
            scanned += 1;
            let class = record.manifest.classify(&rel);
            let allowed = matches!(
                (role, class),
                (_, Some(PathClass::Shared))
                    | (Role::WorkerA, Some(PathClass::Test))
                    | (Role::WorkerB, Some(PathClass::Implementation))
                    | (
                        Role::Inspector,
                        Some(
                            PathClass::Test
                                | PathClass::Implementation
                                | PathClass::AttestationOnly
                        )
                    )
            );
            if !allowed {
                return Err(EngineError::ProjectionLeak {
                    role: role.as_str(),
                    path: rel,
                });
            }
        }
    }
    Ok(scanned)
}

/// Maps a persisted attempt outcome to its escalation class.
/// The attempt outcome that marks where an item was blocked.
pub const BLOCKED_OUTCOME: &str = "blocked";

/// The attempts after the last block marker (all of them when there is none).
pub fn since_last_block(attempts: &[AttemptRecord]) -> &[AttemptRecord] {
    match attempts.iter().rposition(|a| a.outcome == BLOCKED_OUTCOME) {
        Some(at) => &attempts[at + 1..],
        None => attempts,
    }
}

fn outcome_of(label: &str) -> Outcome {
    match label {
        "passed" => Outcome::Succeeded,
        "rejected-inspection" => Outcome::RejectedInspection,
        "transient" => Outcome::ExecutorError,
        _ => Outcome::FailedGate,
    }
}

fn tier_label(tier: Tier) -> String {
    serde_json::to_value(tier)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn tier_from(label: &str) -> Tier {
    serde_json::from_value(json!(label)).unwrap_or(Tier::T1)
}

/// The escalation a restarted Job Site resumes with: the persisted attempts, replayed.
pub fn escalation_from(start: Tier, attempts: &[AttemptRecord]) -> Escalation {
    let mut escalation = Escalation::new(start);
    escalation.history = attempts
        .iter()
        .map(|a| crate::escalation::Attempt {
            tier: tier_from(&a.tier),
            outcome: outcome_of(&a.outcome),
        })
        .collect();
    escalation
}

fn label_of(decision: &Decision) -> String {
    match decision {
        Decision::Pass => "passed".into(),
        Decision::Rework { fault, .. } => serde_json::to_value(fault)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
    }
}

/// What a gate (an integration run plus triage) decided.
struct Gate {
    decision: Decision,
    feedback: Vec<SanitizedFeedback>,
    redactions: usize,
}

/// Per-call progress, for the report.
#[derive(Default)]
struct Progress {
    cycles: Vec<CycleReport>,
    inspections: Vec<InspectionReport>,
    revalidations: u32,
    transient: u32,
    ledger: Ledger,
    prior_findings: Vec<String>,
    digest: Option<String>,
    merge_commit: Option<String>,
}

/// The engine.
pub struct Engine<S, E> {
    /// The WMS port.
    pub store: Arc<S>,
    /// The sandbox port.
    pub executor: Arc<E>,
    /// Trusted time.
    pub clock: Arc<dyn Clock>,
    /// Fault attribution.
    pub triage: Arc<dyn Triage>,
    /// The Job Site's trusted context.
    pub context: AuthorizationContext,
    /// Settings.
    pub config: EngineConfig,
    /// Called at every stage (live progress display; tracing logs the same).
    pub on_stage: Option<StageHook>,
    /// Fault injection at effect boundaries (tests).
    pub faults: Option<FaultHook>,
    /// Raised on shutdown: the engine stops at its next effect boundary.
    pub stop: Option<StopSignal>,
}

struct Item<'a> {
    id: &'a str,
    landing: &'a Landing,
    contract: &'a BuildContract,
    /// The integration repository: every git operation runs through it, on the blocking
    /// pool (no git handle lives across an await, so the build's future is `Send`).
    repo: RepoFolder,
    wi: WorkItemRef,
    scope: ChangeScope,
    approved: BTreeSet<String>,
}

impl Item<'_> {
    /// Runs `work` on the integration repository (blocking pool, one at a time per folder).
    async fn git<T, F>(&self, work: F) -> Result<T, EngineError>
    where
        T: Send + 'static,
        F: FnOnce(&Repository) -> Result<T, EngineError> + Send + 'static,
    {
        self.repo
            .repo(work)
            .await
            .map_err(git_err("run git on the integration repository"))?
    }

    /// Exports the `role` projection of `at` into `dest` and scans it, off the runtime.
    async fn export(
        &self,
        operation: &'static str,
        at: &str,
        role: Role,
        dest: &Path,
        scan: bool,
    ) -> Result<usize, EngineError> {
        let (at, dest, scope) = (at.to_string(), dest.to_path_buf(), self.scope.clone());
        self.repo
            .path(move |dir| {
                projection_export(dir, &at, role, &dest, scope).map_err(git_err(operation))?;
                if scan {
                    scan_projection(&dest, role)
                } else {
                    Ok(0)
                }
            })
            .await
            .map_err(git_err(operation))?
    }
}

impl<S: WorkStore, E: Executor> Engine<S, E> {
    fn stage(&self, what: &str) {
        tracing::info!(stage = what, "job site");
        if let Some(f) = &self.on_stage {
            f(what);
        }
    }

    /// Whether the process is shutting down (the engine stops at its next boundary).
    pub fn stopping(&self) -> bool {
        self.stop.as_ref().is_some_and(StopSignal::is_raised)
    }

    /// A named effect boundary: traced, and where a shutdown or fault injection may stop
    /// the engine.
    pub(crate) fn boundary(&self, id: &str, name: &str) -> Result<(), EngineError> {
        tracing::debug!(work_item = id, boundary = name, "effect boundary");
        if self.stopping() {
            tracing::info!(
                work_item = id,
                boundary = name,
                "stopping at an effect boundary: shutting down"
            );
            return Err(EngineError::ShuttingDown {
                boundary: name.to_string(),
            });
        }
        if self.faults.as_ref().is_some_and(|f| f(name)) {
            tracing::warn!(
                work_item = id,
                boundary = name,
                "interrupted by fault injection"
            );
            return Err(EngineError::Interrupted {
                boundary: name.to_string(),
            });
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn trace(
        &self,
        id: &str,
        stage: &str,
        cycle: Option<u32>,
        inputs: serde_json::Value,
        decision: serde_json::Value,
        started: Instant,
    ) {
        let event = TraceEvent {
            at: self.clock.now(),
            work_item_id: id.to_string(),
            stage: stage.to_string(),
            cycle,
            inputs,
            decision,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        tracing::info!(
            target: "protobot::trace",
            work_item = id,
            stage,
            cycle,
            duration_ms = event.duration_ms,
            decision = %event.decision,
            "trace"
        );
        let dir = self.config.scratch.join("traces");
        let line = serde_json::to_string(&event).unwrap_or_default();
        let written = std::fs::create_dir_all(&dir).and_then(|()| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(format!("{id}.jsonl")))?;
            writeln!(f, "{line}")
        });
        if let Err(e) = written {
            tracing::warn!(work_item = id, error = %e, "could not write the trace file");
        }
    }

    async fn command(
        &self,
        claim: &Claim,
        command: Command,
        payload: serde_json::Value,
    ) -> Result<ResultEnvelope, EngineError> {
        let _exclusive = claim.exclusive().await;
        let held = claim.check()?;
        // Keys are derived from the version the command moves from: a retry after a
        // lost response replays, a later command at a new version is a new key.
        let key = format!(
            "{}:{}:v{}",
            held.work_item_id,
            command.as_str(),
            held.contract_version
        );
        let mut env = claim.command(command, &key)?;
        // The in-process Gate grants the Job Site exactly the refs of the
        // candidate it produced and presents (target, run, heads, merge).
        let mut context = self.context.clone();
        if let Some(m) = payload.get("merge_envelope") {
            for key in [
                "target",
                "integration_head",
                "merge_commit",
                "inspection_run_id",
            ] {
                if let Some(r) = m
                    .get(key)
                    .and_then(|v| v.as_str())
                    .filter(|r| !r.is_empty())
                    && !context.allowed_refs.iter().any(|a| a == r)
                {
                    context.allowed_refs.push(r.to_string());
                }
            }
        }
        env.payload = Some(payload);
        let started = Instant::now();
        let result = self
            .store
            .execute(Some(&context), &env, self.clock.now())
            .await?;
        self.trace(
            &env.work_item_id,
            "command",
            None,
            json!({"command": command.as_str(), "expected_version": held.contract_version}),
            json!({"ok": result.ok, "code": result.code().map(|c| c.as_str().to_string())}),
            started,
        );
        if !result.ok {
            claim.mark_lost();
            return Err(EngineError::Rejected {
                work_item_id: env.work_item_id,
                command: command.as_str().into(),
                code: result
                    .code()
                    .map(|c| c.as_str().to_string())
                    .unwrap_or_default(),
            });
        }
        claim.record(&result);
        self.boundary(&env.work_item_id, &format!("after:{}", command.as_str()))?;
        Ok(result)
    }

    fn now_secs(&self) -> i64 {
        self.clock.now().as_second()
    }

    async fn run_role(
        &self,
        claim: &Claim,
        role: SandboxRole,
        class: &WorkerClass,
        workspace: &Path,
        task: serde_json::Value,
        RunName { run_id, cycle }: RunName,
    ) -> Result<crate::executor::RunOutput, EngineError> {
        let work_item = claim.check()?.work_item_id;
        let egress_proxy = match egress_for(class, self.config.egress_proxy.as_deref()) {
            Ok(proxy) => proxy,
            Err(reason) => {
                return Err(crate::executor::ExecutorError::Start { run_id, reason }.into());
            }
        };
        let spec = RunSpec {
            run_id: run_id.clone(),
            role,
            workspace: workspace.to_path_buf(),
            task,
            command: class.command.clone(),
            image: class.image.clone(),
            env: Default::default(),
            limits: self.config.limits.clone(),
            egress_proxy,
            audit: crate::executor::RunAudit {
                work_item: work_item.clone(),
                cycle,
                trace_id: run_id.clone(),
            },
        };
        let started = Instant::now();
        // Boxed, like every stage below: no future nests another's whole state, so polling
        // a build needs no more stack than a runtime thread has.
        let out = Box::pin(self.executor.run(spec, claim.lost_signal())).await?;
        let failure = crate::triage::harness_failure(&out.termination, &out.stderr_tail);
        // The chain itself stays private; its head ties the session to this trace.
        self.trace(
            &work_item,
            "sandbox",
            (cycle > 0).then_some(cycle),
            json!({"run_id": run_id, "role": role}),
            json!({
                "termination": out.termination,
                "audit_events": out.audit.len(),
                "audit_head": out.audit.last().map(|e| e.event_digest.as_str()),
                "stderr_tail": failure.as_ref().map(|_| crate::triage::sanitized_stderr_tail(&out.stderr_tail)),
            }),
            started,
        );
        // A Worker that did not exit 0 failed, even when it committed: its
        // output is never imported.
        if let (Some(reason), SandboxRole::WorkerA | SandboxRole::WorkerB) = (failure, role) {
            // A run cancelled because the lease was lost reports that instead.
            claim.check()?;
            return Err(EngineError::Output {
                role: role.as_str(),
                reason,
            });
        }
        Ok(out)
    }

    async fn record_attempt(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        attempt: AttemptRecord,
    ) -> Result<(), EngineError> {
        let held = claim.check()?;
        let cycle = attempt.cycle;
        let started = Instant::now();
        let summary = json!({"outcome": attempt.outcome, "tier": attempt.tier});
        self.store
            .observe(
                item.id,
                Observation::Attempt {
                    fencing_token: held.fencing_token,
                    attempt,
                },
            )
            .await
            .map_err(|e| {
                claim.mark_lost();
                EngineError::Store(e)
            })?;
        // Written after the store accepted it: an `attempt` trace line means durable.
        self.trace(item.id, "attempt", Some(cycle), json!({}), summary, started);
        self.boundary(item.id, &format!("after:attempt-{cycle}"))
    }

    async fn head(&self, item: &Item<'_>) -> Result<Oid, EngineError> {
        let branch = item.wi.branch_ref();
        item.git(move |repo| {
            repo.refname_to_id(&branch)
                .map_err(git_err("read the work-item head"))
        })
        .await
    }

    async fn digest(&self, item: &Item<'_>, commit: Oid) -> Result<String, EngineError> {
        item.git(move |repo| {
            product_tree_digest(repo, commit).map_err(git_err("compute the product tree digest"))
        })
        .await
    }

    /// Builds (or resumes) a claimed item from its contract in the integration
    /// repository `repo_dir`, until it is completed or blocked.
    pub async fn build(
        &self,
        claim: &Claim,
        contract: &BuildContract,
        repo_dir: &Path,
    ) -> Result<BuildReport, EngineError> {
        self.build_landing(claim, contract, repo_dir, &self.config.landing)
            .await
    }

    /// [`Engine::build`], landing as `landing` says (a direct push, or through a pull request
    /// on the forge: `crate::landing`).
    pub async fn build_landing(
        &self,
        claim: &Claim,
        contract: &BuildContract,
        repo_dir: &Path,
        landing: &Landing,
    ) -> Result<BuildReport, EngineError> {
        let id = contract.work_item_id.as_str();
        let repo = RepoFolder::new(repo_dir);
        let wi = WorkItemRef {
            id: id.to_string(),
            slug: protobot_lifecycle::BUILD_BRANCH_SLUG.into(),
        };
        let source =
            Oid::from_str(&contract.spec_commit).map_err(git_err("parse the spec commit"))?;
        {
            let wi = wi.clone();
            repo.repo(move |repo| {
                ensure_work_item_branch(repo, &wi, source)
                    .map(drop)
                    .map_err(git_err("create the work-item branch"))
            })
            .await
            .map_err(git_err("open the integration repository"))??;
        }
        // Added requirements have no prior tests to quarantine; only revisions do.
        let revised = if contract.change_type == "changes" {
            contract.changed_requirement_ids.iter().cloned().collect()
        } else {
            BTreeSet::new()
        };
        let item = Item {
            id,
            landing,
            contract,
            repo,
            wi,
            scope: ChangeScope {
                revised,
                retired: contract.retired_requirement_ids.iter().cloned().collect(),
                ..ChangeScope::default()
            },
            approved: contract
                .applicable_requirement_ids
                .iter()
                .cloned()
                .collect(),
        };
        let mut progress = Progress::default();
        loop {
            // Read under the claim's lock so a concurrent renewal cannot make the
            // held version and the stored one look different.
            let (held, record) = {
                let _exclusive = claim.exclusive().await;
                let held = claim.check()?;
                let record = self.store.get(id).await?.ok_or_else(|| {
                    protobot_stores::StoreError::NotFound(format!("work item {id}"))
                })?;
                (held, record)
            };
            if record.contract_version != held.contract_version || record.state != held.state {
                // Someone else moved the item: the claim is stale.
                claim.mark_lost();
                return Err(EngineError::Rejected {
                    work_item_id: id.into(),
                    command: "resume".into(),
                    code: "STALE_CONTRACT_VERSION".into(),
                });
            }
            match record.state {
                // Each stage's future is boxed: the build's own future stays small, and so
                // does the stack a runtime thread needs to poll it.
                State::Building => {
                    Box::pin(self.building(claim, &item, &record, &mut progress)).await?
                }
                State::Inspecting => {
                    Box::pin(self.inspecting(claim, &item, &record, &mut progress)).await?
                }
                State::Merging => {
                    Box::pin(self.merging(claim, &item, &record, &mut progress)).await?
                }
                State::Completed | State::Blocked => {
                    return Ok(BuildReport {
                        work_item_id: id.into(),
                        state: record.state,
                        cycles: progress.cycles,
                        inspections: progress.inspections,
                        revalidations: progress.revalidations,
                        merge_commit: progress.merge_commit.or_else(|| {
                            record
                                .expected_merge
                                .as_ref()
                                .map(|m| m.merge_commit.clone())
                                .filter(|m| !m.is_empty())
                        }),
                        product_tree_digest: progress.digest.or_else(|| {
                            record
                                .expected_merge
                                .as_ref()
                                .map(|m| m.product_tree_digest.clone())
                                .filter(|d| !d.is_empty())
                        }),
                        block_reason: Some(record.block_reason.clone()).filter(|r| !r.is_empty()),
                        lease_renewals: claim.renewals(),
                    });
                }
                other => {
                    return Err(EngineError::NotDrivable {
                        work_item_id: id.into(),
                        state: other,
                    });
                }
            }
        }
    }

    /// Records that the item blocks at `cycle` (an attempt with outcome
    /// [`BLOCKED_OUTCOME`]): attempts before it no longer count against the
    /// budget once the block is resolved, and the next cycle gets a new number.
    async fn record_block_marker(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        cycle: u32,
    ) -> Result<(), EngineError> {
        let now = self.clock.now();
        self.record_attempt(
            claim,
            item,
            AttemptRecord {
                cycle,
                tier: tier_label(self.config.start_tier),
                outcome: BLOCKED_OUTCOME.into(),
                candidate_commit: String::new(),
                feedback: json!([]),
                started_at: Some(now),
                finished_at: now,
            },
        )
        .await
    }

    async fn raise_question(&self, claim: &Claim, question: String) -> Result<(), EngineError> {
        self.stage(&format!("blocked: {question}"));
        self.command(
            claim,
            Command::RaiseSpecQuestion,
            json!({"question": question}),
        )
        .await?;
        Ok(())
    }

    async fn building(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        record: &WorkItemRecord,
        progress: &mut Progress,
    ) -> Result<(), EngineError> {
        let attempts = &record.attempts;
        let head = self.head(item).await?;
        // Resume: the last cycle passed and the product is unchanged since (a crash
        // before tests-pass, or a landing race that sent the item back).
        let passed = attempts.last().filter(|a| a.outcome == "passed");
        let unchanged = match passed.and_then(|a| Oid::from_str(&a.candidate_commit).ok()) {
            Some(candidate) => {
                item.git(move |repo| {
                    let before = product_tree_digest(repo, candidate).ok();
                    let now = product_tree_digest(repo, head)
                        .map_err(git_err("compute the product tree digest"))?;
                    Ok(before == Some(now))
                })
                .await?
            }
            None => false,
        };
        if let Some(last) = passed.filter(|_| unchanged) {
            self.stage(&format!(
                "building: cycle {} already passed on this candidate; resuming at tests-pass",
                last.cycle
            ));
            self.command(
                claim,
                Command::TestsPass,
                json!({"build_tests_passed": true}),
            )
            .await?;
            return Ok(());
        }
        // Only the attempts since the item was last blocked count: a
        // resolved block (`protobot retry`) starts a fresh budget.
        let recent = since_last_block(attempts);
        let genuine = recent
            .iter()
            .filter(|a| outcome_of(&a.outcome).is_genuine_failure())
            .count();
        if genuine >= self.config.max_cycles as usize {
            let next = attempts.last().map_or(1, |a| a.cycle + 1);
            self.record_block_marker(claim, item, next).await?;
            return self
                .raise_question(
                    claim,
                    format!(
                        "no passing candidate after {genuine} cycles (the last triage found a {} fault); the Job Site traces say what failed in each cycle. Fix the cause (tests, implementation, harness or requirements) on the default branch, then run `protobot retry` (or `protobot abandon`)",
                        attempts
                            .iter()
                            .rev()
                            .find(|a| outcome_of(&a.outcome).is_genuine_failure())
                            .map_or("build", |a| a.outcome.as_str())
                    ),
                )
                .await;
        }
        let escalation = escalation_from(self.config.start_tier, recent);
        let cycle = match attempts.last() {
            Some(a) if a.outcome == "transient" => a.cycle,
            Some(a) => a.cycle + 1,
            None => 1,
        };
        let feedback: Vec<SanitizedFeedback> = attempts
            .iter()
            .rev()
            .find(|a| a.outcome != "transient")
            .and_then(|a| serde_json::from_value(a.feedback.clone()).ok())
            .unwrap_or_default();
        let tier = escalation.current_tier();
        let started = Instant::now();
        let attempt_started = self.clock.now();
        match Box::pin(self.cycle(claim, item, cycle, tier, genuine as u32, &feedback)).await {
            Ok((gate, scanned)) => {
                let label = label_of(&gate.decision);
                self.trace(
                    item.id,
                    "cycle",
                    Some(cycle),
                    json!({"tier": tier, "feedback_in": feedback.len()}),
                    json!({"decision": label, "redactions": gate.redactions}),
                    started,
                );
                progress.cycles.push(CycleReport {
                    cycle,
                    decision: if label == "passed" {
                        "pass".into()
                    } else {
                        label.clone()
                    },
                    feedback: gate.feedback.clone(),
                    redactions: gate.redactions,
                    projection_files_scanned: scanned,
                    tier,
                });
                let candidate = self.head(item).await?.to_string();
                self.record_attempt(
                    claim,
                    item,
                    AttemptRecord {
                        cycle,
                        tier: tier_label(tier),
                        outcome: label.clone(),
                        candidate_commit: candidate,
                        feedback: serde_json::to_value(&gate.feedback).unwrap_or_default(),
                        started_at: Some(attempt_started),
                        finished_at: self.clock.now(),
                    },
                )
                .await?;
                if gate.decision == Decision::Pass {
                    self.command(
                        claim,
                        Command::TestsPass,
                        json!({"build_tests_passed": true}),
                    )
                    .await?;
                } else {
                    let _exclusive = claim.exclusive().await;
                    crate::lease::renew_once(
                        self.store.as_ref(),
                        &self.context,
                        claim,
                        self.clock.as_ref(),
                    )
                    .await?;
                }
                Ok(())
            }
            Err(EngineError::PolicyGap { reason }) => {
                self.record_block_marker(claim, item, cycle).await?;
                self.raise_question(claim, reason).await
            }
            Err(EngineError::Executor(
                e @ (crate::executor::ExecutorError::Start { .. }
                | crate::executor::ExecutorError::Collect { .. }),
            )) => {
                // Transient: retried at the same tier, never escalated. (A
                // non-conformant profile is not transient: it stops the build.)
                progress.transient += 1;
                tracing::warn!(work_item = item.id, cycle, error = %e, "transient executor failure");
                self.trace(
                    item.id,
                    "cycle",
                    Some(cycle),
                    json!({"tier": tier}),
                    json!({"decision": "transient", "error": e.to_string()}),
                    started,
                );
                progress.cycles.push(CycleReport {
                    cycle,
                    decision: "transient".into(),
                    feedback: feedback.clone(),
                    redactions: 0,
                    projection_files_scanned: 0,
                    tier,
                });
                self.record_attempt(
                    claim,
                    item,
                    AttemptRecord {
                        cycle,
                        tier: tier_label(tier),
                        outcome: "transient".into(),
                        candidate_commit: String::new(),
                        feedback: serde_json::to_value(&feedback).unwrap_or_default(),
                        started_at: Some(attempt_started),
                        finished_at: self.clock.now(),
                    },
                )
                .await?;
                if progress.transient > self.config.transient_retries {
                    return Err(EngineError::Executor(e));
                }
                Ok(())
            }
            Err(other) => Err(other),
        }
    }

    /// One build cycle: Workers, bundles, integration gate.
    async fn cycle(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        cycle: u32,
        tier: Tier,
        genuine_so_far: u32,
        feedback: &[SanitizedFeedback],
    ) -> Result<(Gate, usize), EngineError> {
        let id = item.id;
        self.stage(&format!(
            "building: cycle {cycle} (tier {}): exporting projections, running Worker A and Worker B in sandboxes",
            tier_label(tier)
        ));
        let head = self.head(item).await?.to_string();
        let dir = self.config.scratch.join(format!("{id}-c{cycle}"));
        // A rerun of this cycle (after a crash) starts from clean projections.
        let _ = std::fs::remove_dir_all(&dir);
        let (pa, pb) = (dir.join("projection-a"), dir.join("projection-b"));
        let scanned = item
            .export(
                "export the Worker A projection",
                &head,
                Role::WorkerA,
                &pa,
                true,
            )
            .await?
            + item
                .export(
                    "export the Worker B projection",
                    &head,
                    Role::WorkerB,
                    &pb,
                    true,
                )
                .await?;
        let budget = self.config.max_cycles.saturating_sub(genuine_so_far + 1);
        let task = |side: Side| {
            let class = match side {
                Side::Tests => &self.config.worker_a,
                Side::Implementation => &self.config.worker_b,
            };
            json!({
                "role": side,
                "work_item_id": id,
                "cycle": cycle,
                "retry_budget": budget,
                "model_tier": tier,
                "model": class.tiers.model_for(tier),
                "requirement_ids": item.contract.applicable_requirement_ids,
                "feedback": feedback.iter().filter(|f| f.recipient == side).collect::<Vec<_>>(),
            })
        };
        let (out_a, out_b) = tokio::join!(
            self.run_role(
                claim,
                SandboxRole::WorkerA,
                &self.config.worker_a,
                &pa,
                task(Side::Tests),
                RunName::new(format!("{id}-c{cycle}-a"), cycle),
            ),
            self.run_role(
                claim,
                SandboxRole::WorkerB,
                &self.config.worker_b,
                &pb,
                task(Side::Implementation),
                RunName::new(format!("{id}-c{cycle}-b"), cycle),
            ),
        );
        let (out_a, out_b) = (out_a?, out_b?);
        let mut raw_for: Vec<(Side, Vec<RawDiagnostic>)> = Vec::new();
        let decision_text = if cycle == 1 { "initial" } else { "rework" };
        for (side, role, proj, out) in [
            (Side::Tests, Role::WorkerA, &pa, out_a),
            (Side::Implementation, Role::WorkerB, &pb, out_b),
        ] {
            let record = ProjectionRecord::read(&record_path_for(proj))
                .map_err(git_err("read the projection record"))?;
            let worker_repo = out.out_dir.join("worker");
            // Worker output is untrusted: a refusal or failure anywhere on the import path
            // (collection, apply, merge) ends this cycle for that Worker with a sanitized
            // reason (a stable category, never the Worker's text) and counts against the
            // retry budget; it never stops the build with the lease held.
            let refused = |stage: &str, category: &str| {
                (
                    side,
                    vec![RawDiagnostic {
                        artifact: String::new(),
                        origin: Origin::Build,
                        message: format!("{stage}: {category}"),
                    }],
                )
            };
            let bundle = match collect_bundle(&worker_repo, &record, &BundleLimits::default()) {
                Ok(bundle) => bundle,
                Err(e) => {
                    tracing::warn!(work_item = id, cycle, role = role.as_str(), category = e.category(), error = %e, "worker output refused");
                    raw_for.push(refused("output-refused", e.category()));
                    continue;
                }
            };
            if bundle.commits.is_empty() {
                // The Worker changed nothing this cycle.
                continue;
            }
            match accept_bundle(bundle, &record, &BundleLimits::default()) {
                Ok(accepted) => {
                    let info = CycleInfo {
                        cycle,
                        triage_decision: decision_text.into(),
                        when: self.now_secs(),
                    };
                    claim.check()?;
                    let wi = item.wi.clone();
                    let imported = item
                        .git(move |repo| {
                            Ok(apply_bundle(repo, &accepted, &wi, &info)
                                .map_err(|e| ("apply-failed", e.category(), e.to_string()))
                                .and_then(|applied| {
                                    merge_into_work_item(repo, &wi, &applied, &accepted, &info)
                                        .map(drop)
                                        .map_err(|e| ("merge-failed", e.category(), e.to_string()))
                                }))
                        })
                        .await?;
                    if let Err((stage, category, error)) = imported {
                        // A lost lease is not the Worker's fault.
                        claim.check()?;
                        tracing::warn!(
                            work_item = id,
                            cycle,
                            role = role.as_str(),
                            category,
                            error,
                            "worker output failed to import"
                        );
                        raw_for.push(refused(stage, category));
                        continue;
                    }
                    self.boundary(id, &format!("after:import-{}-{cycle}", role.as_str()))?;
                }
                Err(report) => {
                    let refused: Vec<crate::triage::RefusedPath> = report
                        .violations
                        .iter()
                        .filter_map(|v| {
                            v.path.as_ref().map(|path| crate::triage::RefusedPath {
                                path: path.clone(),
                                class: record.manifest.classify(path).map(PathClass::as_str),
                                code: serde_json::to_value(v.code)
                                    .ok()
                                    .and_then(|c| c.as_str().map(str::to_string))
                                    .unwrap_or_default(),
                            })
                        })
                        .collect();
                    self.stage(&format!(
                        "building: cycle {cycle}: {}",
                        crate::triage::describe_refusal(side, &refused)
                    ));
                    self.trace(
                        id,
                        "refused-patch",
                        Some(cycle),
                        json!({"role": role.as_str()}),
                        json!({"violations": report.violations}),
                        Instant::now(),
                    );
                    if let Some(reason) = crate::triage::policy_gap(side, &refused) {
                        return Err(EngineError::PolicyGap { reason });
                    }
                    let diags = report
                        .violations
                        .iter()
                        .map(|v| RawDiagnostic {
                            artifact: v.path.clone().unwrap_or_default(),
                            origin: Origin::Build,
                            message: serde_json::to_value(v.code)
                                .ok()
                                .and_then(|c| c.as_str().map(str::to_string))
                                .unwrap_or_default(),
                        })
                        .collect::<Vec<_>>();
                    raw_for.push((side, diags));
                }
            }
        }
        let gate = Box::pin(self.gate(claim, item, cycle, &dir, budget, raw_for)).await?;
        Ok((gate, scanned))
    }

    /// The integration gate on the current work-item head: build and test it in a
    /// sandbox, triage, and build each Worker's sanitized feedback.
    async fn gate(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        cycle: u32,
        dir: &Path,
        budget: u32,
        rejected: Vec<(Side, Vec<RawDiagnostic>)>,
    ) -> Result<Gate, EngineError> {
        let id = item.id;
        self.stage(&format!(
            "building: cycle {cycle}: integration run on the candidate"
        ));
        let started = Instant::now();
        let candidate = self.head(item).await?.to_string();
        let pi = dir.join("integration");
        let _ = std::fs::remove_dir_all(&pi);
        item.export(
            "export the integration tree",
            &candidate,
            Role::Inspector,
            &pi,
            false,
        )
        .await?;
        let manifest = ProjectionRecord::read(&record_path_for(&pi))
            .map_err(git_err("read the projection record"))?
            .manifest;
        let out = self
            .run_role(
                claim,
                SandboxRole::IntegrationRunner,
                &self.config.integration,
                &pi,
                json!({"role": "integration-runner", "cycle": cycle}),
                RunName::new(
                    format!(
                        "{id}-c{cycle}-int-{}",
                        &candidate[..12.min(candidate.len())]
                    ),
                    cycle,
                ),
            )
            .await?;
        let results: Results = match std::fs::read(out.out_dir.join("results.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| EngineError::Output {
                role: "integration-runner",
                reason: e.to_string(),
            })?,
            Err(e) => {
                return Err(EngineError::Output {
                    role: "integration-runner",
                    reason: format!(
                        "no results.json ({e}); {}",
                        crate::triage::harness_failure(&out.termination, &out.stderr_tail)
                            .unwrap_or_else(|| "the harness exited 0".into())
                    ),
                });
            }
        };
        let input = TriageInput {
            build_errors: results.build_errors,
            results: results.results,
        };
        let decision = if rejected.is_empty() {
            self.triage.decide(&input)
        } else {
            // A rejected bundle is rework for its author, whatever the tests say.
            Decision::Rework {
                fault: if rejected.len() == 2 {
                    Fault::Both
                } else if rejected[0].0 == Side::Tests {
                    Fault::Test
                } else {
                    Fault::Implementation
                },
                assignments: rejected
                    .iter()
                    .map(|(s, diags)| Assignment {
                        side: *s,
                        requirement_ids: item.approved.clone(),
                        reason: if diags.iter().any(|d| {
                            ["output-refused:", "apply-failed:", "merge-failed:"]
                                .iter()
                                .any(|stage| d.message.starts_with(stage))
                        }) {
                            "your output could not be imported: return a plain repository whose commits build linearly on the projection root and only reference objects you were given or wrote".into()
                        } else {
                            "your patch touched paths your role does not own".into()
                        },
                    })
                    .collect(),
            }
        };
        let mut feedback = Vec::new();
        let mut redactions = 0;
        if let Decision::Rework { fault, assignments } = &decision {
            for a in assignments {
                let diagnostics = rejected
                    .iter()
                    .find(|(s, _)| *s == a.side)
                    .map(|(_, d)| d.clone())
                    .unwrap_or_default();
                let raw = RawFeedback {
                    recipient: a.side,
                    outcome: FeedbackOutcome::Fail,
                    fault: Some(*fault),
                    retry_budget: budget,
                    requirement_ids: a.requirement_ids.iter().cloned().collect(),
                    reason: a.reason.clone(),
                    diagnostics,
                };
                let (record, n) = self.sanitized(&raw, item, &manifest);
                redactions += n;
                feedback.push(record);
            }
        }
        let label = label_of(&decision);
        self.trace(
            id,
            "gate",
            Some(cycle),
            json!({"candidate": candidate, "results": input.results.len(), "build_errors": input.build_errors.len(), "rejected_bundles": rejected.len()}),
            json!({"decision": label, "redactions": redactions}),
            started,
        );
        self.stage(&format!(
            "building: cycle {cycle}: triage → {} ({redactions} redactions in Worker feedback)",
            if label == "passed" { "pass" } else { &label }
        ));
        Ok(Gate {
            decision,
            feedback,
            redactions,
        })
    }

    fn sanitized(
        &self,
        raw: &RawFeedback,
        item: &Item<'_>,
        manifest: &protobot_repo::manifest::ProjectionManifest,
    ) -> (SanitizedFeedback, usize) {
        let side = raw.recipient;
        let owned = |path: &str| {
            matches!(
                (side, manifest.classify(path)),
                (Side::Tests, Some(PathClass::Test))
                    | (Side::Implementation, Some(PathClass::Implementation))
            )
        };
        let record = sanitize(raw, &item.approved, &owned);
        let n = record.redactions.len();
        (record.sanitized, n)
    }

    async fn inspecting(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        record: &WorkItemRecord,
        progress: &mut Progress,
    ) -> Result<(), EngineError> {
        let id = item.id;
        let next_cycle = record.attempts.last().map_or(1, |a| a.cycle + 1);
        let recent = since_last_block(&record.attempts);
        let genuine = recent
            .iter()
            .filter(|a| outcome_of(&a.outcome).is_genuine_failure())
            .count() as u32;
        let budget = self.config.max_cycles.saturating_sub(genuine + 1);
        let tier = escalation_from(self.config.start_tier, recent).current_tier();
        let attempt_started = self.clock.now();
        // Pre-merge revalidation: merge the current default branch in; when it
        // moved, every gate reruns on the refreshed candidate.
        let started = Instant::now();
        let remote_ref = format!("refs/heads/{}", self.config.target_branch);
        let (remote, wi, now) = (self.config.remote.clone(), item.wi.clone(), self.now_secs());
        let refreshed = item
            .git(move |repo| {
                let main = fetch_remote_branch(repo, &remote, &remote_ref)
                    .map_err(git_err("fetch the default branch"))?;
                Ok(main.map(|main| (main, refresh_work_item(repo, &wi, main, now))))
            })
            .await?;
        if let Some((main, refreshed)) = refreshed {
            match refreshed {
                Ok(refresh) => {
                    self.trace(
                        id,
                        "revalidation",
                        None,
                        json!({"default_head": main.to_string()}),
                        json!({"merged_in": refresh.merge_commit}),
                        started,
                    );
                    if refresh.merge_commit.is_some() {
                        progress.revalidations += 1;
                        self.boundary(id, "after:revalidation-merge")?;
                        self.stage("inspecting: the default branch moved; merged it in, rerunning the integration gate");
                        let dir = self
                            .config
                            .scratch
                            .join(format!("{id}-revalidate-{}", progress.revalidations));
                        let gate =
                            Box::pin(self.gate(claim, item, next_cycle, &dir, budget, Vec::new()))
                                .await?;
                        if gate.decision != Decision::Pass {
                            let label = label_of(&gate.decision);
                            progress.cycles.push(CycleReport {
                                cycle: next_cycle,
                                decision: label.clone(),
                                feedback: gate.feedback.clone(),
                                redactions: gate.redactions,
                                projection_files_scanned: 0,
                                tier,
                            });
                            self.record_attempt(
                                claim,
                                item,
                                AttemptRecord {
                                    cycle: next_cycle,
                                    tier: tier_label(tier),
                                    outcome: label,
                                    candidate_commit: self.head(item).await?.to_string(),
                                    feedback: serde_json::to_value(&gate.feedback)
                                        .unwrap_or_default(),
                                    started_at: Some(attempt_started),
                                    finished_at: self.clock.now(),
                                },
                            )
                            .await?;
                            self.command(
                                claim,
                                Command::ReturnToBuilding,
                                json!({"final_tests_failed": true}),
                            )
                            .await?;
                            return Ok(());
                        }
                    }
                }
                Err(e) if e.category() == "merge-conflict" => {
                    return self
                        .raise_question(
                            claim,
                            format!(
                                "the work-item branch conflicts with {}: {e}",
                                self.config.target_branch
                            ),
                        )
                        .await;
                }
                Err(e) => return Err(git_err("merge the default branch in")(e.to_string())),
            }
        }
        // The Inspection Run on the (possibly refreshed) candidate.
        let head = self.head(item).await?;
        let candidate = head.to_string();
        let run_id = format!("{id}-ir-{}", &candidate[..12.min(candidate.len())]);
        self.stage(&format!(
            "inspecting: inspection run {run_id} with {} producer(s)",
            self.config.producers.len()
        ));
        let started = Instant::now();
        let mut reports = Vec::new();
        if !self.config.producers.is_empty() {
            let dir = self.config.scratch.join(&run_id);
            let pi = dir.join("inspector");
            let _ = std::fs::remove_dir_all(&pi);
            item.export(
                "export the Inspector projection",
                &candidate,
                Role::Inspector,
                &pi,
                true,
            )
            .await?;
            for producer in &self.config.producers {
                let (role, file) = match producer.kind {
                    ProducerKind::Inspector => (SandboxRole::Inspector, "findings.jsonl"),
                    ProducerKind::Mutation => (SandboxRole::MutationRunner, "campaign.json"),
                };
                let out = self
                    .run_role(
                        claim,
                        role,
                        &producer.class,
                        &pi,
                        json!({"role": role, "work_item_id": id, "inspection_run_id": run_id, "candidate": candidate, "requirement_ids": item.contract.applicable_requirement_ids}),
                        RunName::new(format!("{run_id}-{}", producer.name), 0),
                    )
                    .await?;
                let bytes =
                    std::fs::read(out.out_dir.join(file)).map_err(|e| EngineError::Output {
                        role: "inspector",
                        reason: format!(
                            "{} wrote no {file} ({e}); termination {:?}",
                            producer.name, out.termination
                        ),
                    })?;
                let findings =
                    parse_report(&producer.name, producer.kind, &bytes).map_err(|e| {
                        EngineError::Output {
                            role: "inspector",
                            reason: e.to_string(),
                        }
                    })?;
                reports.push((producer.name.clone(), findings));
            }
        }
        let prior = std::mem::take(&mut progress.prior_findings);
        let sequence_at_start = progress.ledger.sequence;
        let candidate_digest = self.digest(item, head).await?;
        let verdict = record_run(&mut progress.ledger, &run_id, &candidate, &reports, &prior)
            .map_err(|e| EngineError::Output {
                role: "inspection",
                reason: e.to_string(),
            })?;
        let findings = progress.ledger.current_findings(&run_id).len();
        self.trace(
            id,
            "inspection",
            None,
            json!({"run_id": run_id, "candidate": candidate, "producers": reports.iter().map(|(p, f)| json!({"producer": p, "findings": f.len()})).collect::<Vec<_>>(), "recheck": prior}),
            serde_json::to_value(&verdict).unwrap_or_default(),
            started,
        );
        progress.inspections.push(InspectionReport {
            run_id: run_id.clone(),
            candidate: candidate.clone(),
            product_tree_digest: candidate_digest,
            contract_version: claim.held().map(|h| h.contract_version).unwrap_or_default(),
            ledger_sequence_at_start: sequence_at_start,
            producers: reports.iter().map(|(p, _)| p.clone()).collect(),
            findings,
            verdict: verdict.clone(),
        });
        match verdict {
            Verdict::Sealed { watermark } => {
                self.store
                    .observe(
                        id,
                        Observation::Inspection {
                            inspection_run_sealed: true,
                            findings_terminal: true,
                            final_tests_passed: true,
                        },
                    )
                    .await?;
                self.boundary(id, "after:observe-inspection")?;
                Box::pin(self.attest_and_begin_merge(claim, item, &run_id, watermark, progress))
                    .await
            }
            Verdict::Rework { routed } => {
                let (feedback, redactions) = self.finding_feedback(item, &routed, budget).await?;
                self.stage(&format!(
                    "inspecting: {} finding(s) routed back to the Workers ({redactions} redactions)",
                    routed.len()
                ));
                progress.prior_findings = carried_over(&progress.ledger, &run_id);
                progress.cycles.push(CycleReport {
                    cycle: next_cycle,
                    decision: "rejected-inspection".into(),
                    feedback: feedback.clone(),
                    redactions,
                    projection_files_scanned: 0,
                    tier,
                });
                self.record_attempt(
                    claim,
                    item,
                    AttemptRecord {
                        cycle: next_cycle,
                        tier: tier_label(tier),
                        outcome: "rejected-inspection".into(),
                        candidate_commit: candidate,
                        feedback: serde_json::to_value(&feedback).unwrap_or_default(),
                        started_at: Some(attempt_started),
                        finished_at: self.clock.now(),
                    },
                )
                .await?;
                self.command(
                    claim,
                    Command::ReturnToBuilding,
                    json!({"in_contract_defect": true}),
                )
                .await?;
                Ok(())
            }
            Verdict::Blocked { reason } => self.raise_question(claim, reason).await,
        }
    }

    /// Worker feedback for routed findings, through the sanitizer.
    async fn finding_feedback(
        &self,
        item: &Item<'_>,
        routed: &[RoutedFinding],
        budget: u32,
    ) -> Result<(Vec<SanitizedFeedback>, usize), EngineError> {
        let head = self.head(item).await?;
        let manifest = item
            .git(move |repo| {
                let tree = repo
                    .find_commit(head)
                    .and_then(|c| c.tree())
                    .map_err(git_err("read the candidate tree"))?;
                let listed = protobot_repo::tree::list_files(repo, &tree)
                    .map_err(git_err("list the candidate tree"))?;
                protobot_repo::export::load_manifest(repo, &listed)
                    .map_err(git_err("read the projection manifest"))
            })
            .await?;
        let mut out = Vec::new();
        let mut redactions = 0;
        for side in [Side::Tests, Side::Implementation] {
            let mine: Vec<&RoutedFinding> = routed
                .iter()
                .filter(|r| match r.disposition {
                    Disposition::TestDefect | Disposition::TestGap => side == Side::Tests,
                    Disposition::BothDefective => true,
                    _ => side == Side::Implementation,
                })
                .collect();
            if mine.is_empty() {
                continue;
            }
            let raw = RawFeedback {
                recipient: side,
                outcome: FeedbackOutcome::Fail,
                fault: Some(if side == Side::Tests {
                    Fault::Test
                } else {
                    Fault::Implementation
                }),
                retry_budget: budget,
                requirement_ids: mine
                    .iter()
                    .flat_map(|r| r.requirement_ids.iter().cloned())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
                reason: "inspection found a defect in your part of the candidate".into(),
                diagnostics: mine
                    .iter()
                    .flat_map(|r| {
                        r.paths.iter().map(|p| RawDiagnostic {
                            artifact: p.clone(),
                            origin: Origin::Inspection,
                            message: r.category.clone(),
                        })
                    })
                    .collect(),
            };
            let (f, n) = self.sanitized(&raw, item, &manifest);
            redactions += n;
            out.push(f);
        }
        Ok((out, redactions))
    }

    async fn attest_and_begin_merge(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        run_id: &str,
        watermark: u64,
        progress: &mut Progress,
    ) -> Result<(), EngineError> {
        let id = item.id;
        let head = self.head(item).await?;
        let owned_id = id.to_string();
        let (digest, already) = item
            .git(move |repo| {
                let digest = product_tree_digest(repo, head)
                    .map_err(git_err("compute the product tree digest"))?;
                // Idempotent: a resumed Job Site finds its own attestation commit at the head.
                let already = repo.find_commit(head).ok().is_some_and(|c| {
                    let found = trailers::parse(&String::from_utf8_lossy(c.message_bytes()));
                    trailers::value(&found, trailers::WORK_ITEM) == Some(owned_id.as_str())
                        && trailers::value(&found, trailers::PRODUCT_TREE_DIGEST)
                            == Some(digest.as_str())
                });
                Ok((digest, already))
            })
            .await?;
        let attested = if already {
            head.to_string()
        } else {
            let files = vec![
                AttestationFile {
                    path: format!(".protobot/attestations/{id}/findings.jsonl"),
                    content: progress.ledger.snapshot_jsonl(run_id).into_bytes(),
                },
                AttestationFile {
                    path: format!(".protobot/attestations/{id}/report.md"),
                    content: format!(
                        "# Inspection report for {id}\n\nRun `{run_id}` sealed at ledger sequence {watermark} with every finding terminal.\nProduct tree digest: `{digest}`.\n"
                    )
                    .into_bytes(),
                },
            ];
            let (wi, sealed, now) = (item.wi.clone(), digest.clone(), self.now_secs());
            let attested = item
                .git(move |repo| {
                    commit_attestation(repo, &wi, &files, &sealed, now)
                        .map_err(git_err("commit the attestation snapshot"))
                })
                .await?;
            self.boundary(id, "after:attestation")?;
            attested.commit
        };
        progress.digest = Some(digest.clone());
        let version = claim.held().map(|h| h.contract_version).unwrap_or_default();
        let envelope = MergeEnvelope {
            product_tree_digest: digest,
            inspection_run_id: run_id.to_string(),
            integration_head: attested,
            target: self.config.target_branch.clone(),
            contract_version: version + 1,
            merge_commit: String::new(),
        };
        self.stage("merging: attestation committed; merging wi/ into the default branch");
        self.command(
            claim,
            Command::BeginMerge,
            json!({"merge_envelope": envelope}),
        )
        .await?;
        Ok(())
    }

    async fn merging(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        record: &WorkItemRecord,
        progress: &mut Progress,
    ) -> Result<(), EngineError> {
        let id = item.id;
        let Some(mut envelope) = record.expected_merge.clone() else {
            return Err(EngineError::Output {
                role: "work store",
                reason: format!("{id} is merging without a merge envelope"),
            });
        };
        progress.digest = Some(envelope.product_tree_digest.clone());
        // `merging` takes no renewals: `begin-merge` was the last fenced write, and
        // landing is idempotent by trailer, so a Job Site that lost the item in
        // between can only rediscover the same merge, never add a second one.
        claim.check()?;
        self.boundary(id, "before:land")?;
        if let Landing::PullRequest(forge) = item.landing {
            return Box::pin(self.land_through_pull_request(
                claim,
                item,
                envelope,
                progress,
                forge.as_ref(),
            ))
            .await;
        }
        let started = Instant::now();
        let (wi, remote, target, now) = (
            item.wi.clone(),
            self.config.remote.clone(),
            self.config.target_branch.clone(),
            self.now_secs(),
        );
        let landed = item
            .git(move |repo| Ok(land_tested_work_item(repo, &wi, &remote, &target, now)))
            .await?;
        self.trace(
            id,
            "land",
            None,
            json!({"integration_head": envelope.integration_head}),
            match &landed {
                Ok(l) => json!({"merge_commit": l.merge_commit, "pushed": l.pushed, "already_merged": l.already_merged}),
                Err(e) => json!({"error": e.category()}),
            },
            started,
        );
        match landed {
            Ok(landed) => {
                self.boundary(id, "after:land")?;
                envelope.merge_commit = landed.merge_commit.clone();
                self.command(
                    claim,
                    Command::RecordMerge,
                    json!({"merge_envelope": envelope}),
                )
                .await?;
                progress.merge_commit = Some(landed.merge_commit);
                self.stage("completed: merged, verified on the default branch and recorded");
                Ok(())
            }
            Err(LandError::Untested { .. } | LandError::RemoteMoved { .. }) => {
                // The default branch moved past the tested candidate: back to building
                // (a fresh fence), where the passed cycle is reused and revalidated.
                self.stage("merging: the default branch moved; revalidating before landing");
                self.command(claim, Command::MergeConflict, json!({}))
                    .await?;
                Ok(())
            }
            Err(e @ LandError::NotOnRemote { .. }) => {
                // Pushed, but the remote does not contain the merge: never record it.
                tracing::error!(work_item = id, error = %e, "merge verification failed");
                Err(EngineError::MergeNotVerified {
                    reason: e.to_string(),
                })
            }
            Err(e) => Err(git_err("land the work item")(e)),
        }
    }

    /// Lands through a pull request ([`Landing::PullRequest`]): the same preconditions as a
    /// direct push (the candidate contains the default head, a merge already there by its
    /// trailer is recorded, not repeated), then push `wi/…` without force, let the forge open
    /// or reuse the pull request and merge it with the tested head as the guard, and verify
    /// by fetching that the default branch holds a merge of exactly the tested head.
    async fn land_through_pull_request(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        mut envelope: MergeEnvelope,
        progress: &mut Progress,
        forge: &dyn PullRequestForge,
    ) -> Result<(), EngineError> {
        let id = item.id;
        let remote = self.config.remote.as_str();
        let target_ref = format!("refs/heads/{}", self.config.target_branch);
        let started = Instant::now();
        let (remote_main, existing) = {
            let (remote, target_ref, id) = (remote.to_string(), target_ref.clone(), id.to_string());
            item.git(move |repo| {
                let main = fetch_remote_branch(repo, &remote, &target_ref)
                    .map_err(git_err("fetch the default branch"))?
                    .ok_or_else(|| {
                        git_err("fetch the default branch")(format!("{remote} has no {target_ref}"))
                    })?;
                let existing = find_merge_by_trailer(repo, main, &id)
                    .map_err(git_err("look for an existing merge of the work item"))?;
                Ok((main, existing))
            })
            .await?
        };
        if let Some(existing) = existing {
            self.stage("merging: the default branch already holds this work item's merge");
            return self
                .record_landed(claim, &mut envelope, existing.to_string(), progress)
                .await;
        }
        let head = self.head(item).await?;
        let contains_main = head == remote_main
            || item
                .git(move |repo| {
                    repo.graph_descendant_of(head, remote_main)
                        .map_err(git_err("compare the candidate with the default branch"))
                })
                .await?;
        if !contains_main {
            return self
                .revalidate(claim, "the default branch moved past the tested candidate")
                .await;
        }
        let wi_ref = item.wi.branch_ref();
        {
            let (remote, wi_ref) = (remote.to_string(), wi_ref.clone());
            item.git(move |repo| {
                let pushed = remote_head(repo, &remote, &wi_ref)
                    .map_err(git_err("read the remote work-item branch"))?;
                if pushed != Some(head) {
                    push_with_guard(repo, &remote, &wi_ref, &wi_ref, pushed)
                        .map_err(git_err("push the work-item branch"))?;
                }
                Ok(())
            })
            .await?;
        }
        self.boundary(id, "after:push-work-item-branch")?;
        let request = PullRequestMerge {
            work_item_id: id.to_string(),
            head_branch: wi_ref.trim_start_matches("refs/heads/").to_string(),
            base_branch: self.config.target_branch.clone(),
            tested_head: head.to_string(),
            merge_message: trailers::compose(
                &format!(
                    "Merge {} into {}",
                    wi_ref.trim_start_matches("refs/heads/"),
                    self.config.target_branch
                ),
                None,
                &[(trailers::WORK_ITEM, id.to_string())],
            ),
            summary: LandingSummary {
                // `<project>/<CS-NNNNN>@<merge>` for a change set (a bug has another key).
                change_set_id: item
                    .contract
                    .materialization_key
                    .split(['/', '@'])
                    .nth(1)
                    .filter(|c| c.starts_with("CS-"))
                    .map(str::to_string),
                product_tree_digest: envelope.product_tree_digest.clone(),
                inspection_run_id: envelope.inspection_run_id.clone(),
                findings: progress.inspections.iter().map(|r| r.findings).sum(),
                cycles: progress.cycles.len(),
                evidence: vec![
                    (
                        "findings snapshot".to_string(),
                        format!(".protobot/attestations/{id}/findings.jsonl"),
                    ),
                    (
                        "inspection report".to_string(),
                        format!(".protobot/attestations/{id}/report.md"),
                    ),
                ],
            },
        };
        let answer = forge.merge(&request).await;
        self.trace(
            id,
            "land",
            None,
            json!({"integration_head": envelope.integration_head, "tested_head": request.tested_head, "via": "pull-request"}),
            match &answer {
                Ok(m) => json!({"merge_commit": m.merge_commit, "pull_request": m.pull_request}),
                Err(r) => json!({"refused": r.category()}),
            },
            started,
        );
        match answer {
            Ok(merged) => {
                self.boundary(id, "after:land")?;
                let verified = match Oid::from_str(&merged.merge_commit).ok() {
                    Some(merge) => {
                        self.verify_pull_request_merge(item, &target_ref, merge, head)
                            .await?
                    }
                    None => false,
                };
                if !verified {
                    tracing::error!(work_item = id, merge_commit = %merged.merge_commit, "pull-request merge not verified");
                    return Err(EngineError::MergeNotVerified {
                        reason: format!(
                            "the forge reported pull request #{} merged as {}, but {remote}/{} does not contain a merge of the tested head {head}",
                            merged.pull_request, merged.merge_commit, self.config.target_branch
                        ),
                    });
                }
                self.record_landed(claim, &mut envelope, merged.merge_commit, progress)
                    .await
            }
            Err(ForgeRefusal::HeadMoved { reason } | ForgeRefusal::Conflict { reason }) => {
                self.revalidate(claim, &reason).await
            }
            Err(refusal @ ForgeRefusal::Blocked { .. }) => {
                let escalation = EscalationRequest {
                    work_item_id: id.to_string(),
                    reason: refusal.to_string(),
                    decision: "Make the candidate mergeable under the default branch's rules (fix the failing check, or satisfy or adjust the protection rule), then run `protobot retry`; or `protobot abandon` the work item.".to_string(),
                };
                if let Err(error) = forge.escalate(&escalation).await {
                    // The refusal stands either way; the issue is the visible copy of it.
                    tracing::warn!(work_item = id, %error, "failed to open the escalation issue");
                }
                self.stage(&format!("merging: refused by the forge: {refusal}"));
                Err(EngineError::MergeRefused {
                    work_item_id: id.to_string(),
                    refusal,
                })
            }
            Err(refusal) => Err(EngineError::MergeRefused {
                work_item_id: id.to_string(),
                refusal,
            }),
        }
    }

    /// Whether `target_ref`, fetched now, contains `merge` and `merge` is a merge of the
    /// tested `head` (its second parent): the forge's "merged" is never trusted alone.
    async fn verify_pull_request_merge(
        &self,
        item: &Item<'_>,
        target_ref: &str,
        merge: Oid,
        head: Oid,
    ) -> Result<bool, EngineError> {
        let (remote, target_ref) = (self.config.remote.clone(), target_ref.to_string());
        item.git(move |repo| {
            let contains = verify_remote_contains(repo, &remote, &target_ref, merge)
                .map_err(git_err("verify the default branch"))?;
            let merges_head = repo
                .find_commit(merge)
                .ok()
                .is_some_and(|c| c.parent_count() == 2 && c.parent_id(1).ok() == Some(head));
            Ok(contains && merges_head)
        })
        .await
    }

    /// Back to building (a fresh fence): the passed cycle is reused and revalidated against
    /// the new default head, then the item lands again.
    async fn revalidate(&self, claim: &Claim, why: &str) -> Result<(), EngineError> {
        self.stage(&format!("merging: {why}; revalidating before landing"));
        self.command(claim, Command::MergeConflict, json!({}))
            .await?;
        Ok(())
    }

    async fn record_landed(
        &self,
        claim: &Claim,
        envelope: &mut MergeEnvelope,
        merge_commit: String,
        progress: &mut Progress,
    ) -> Result<(), EngineError> {
        envelope.merge_commit = merge_commit.clone();
        self.command(
            claim,
            Command::RecordMerge,
            json!({"merge_envelope": envelope}),
        )
        .await?;
        progress.merge_commit = Some(merge_commit);
        self.stage("completed: merged, verified on the default branch and recorded");
        Ok(())
    }
}

/// Compile-time check: a build is a `Send` future (it runs as a task of its own).
fn _a_build_is_send<S: WorkStore + 'static, E: Executor + 'static>(
    engine: &Engine<S, E>,
    claim: &Claim,
    contract: &BuildContract,
    repo_dir: &Path,
) {
    fn send<T: Send>(_: &T) {}
    send(&engine.build(claim, contract, repo_dir));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(egress: bool) -> WorkerClass {
        WorkerClass {
            command: vec!["harness".into()],
            image: None,
            egress,
            tiers: Default::default(),
        }
    }

    #[test]
    fn only_classes_that_ask_for_egress_get_the_proxy() {
        let proxy = Some("http://egress:3128");
        assert_eq!(egress_for(&class(false), proxy), Ok(None));
        assert_eq!(
            egress_for(&class(true), proxy),
            Ok(Some("http://egress:3128".to_owned()))
        );
        let refused = egress_for(&class(true), None).unwrap_err();
        assert!(refused.contains("--egress-proxy-url"), "{refused}");
    }

    #[test]
    fn egress_is_off_unless_a_class_document_says_so() {
        let plain: WorkerClass = serde_json::from_str(r#"{"command":["h"],"image":null}"#).unwrap();
        assert!(!plain.egress);
        assert!(!serde_json::to_string(&plain).unwrap().contains("egress"));
        let asks: WorkerClass =
            serde_json::from_str(r#"{"command":["h"],"image":null,"egress":true}"#).unwrap();
        assert!(asks.egress);
    }
}
