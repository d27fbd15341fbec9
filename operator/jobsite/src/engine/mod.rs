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
//!
//! One module per stage, each an `impl` block of [`Engine`]: [`resume`] (the loop that
//! reads the item and runs its stage), [`building`] (the triage cycle), [`workers`] (Worker A
//! and Worker B), [`integration`] (the integration gate), [`inspection`], [`merge`]
//! (attestation and landing); beside them the effects every stage uses ([`effects`]), the
//! attempt history read back ([`history`], pure), and the engine's configuration, reports and
//! errors. The pure policies the stages call (dispatch, escalation, triage, sanitizer, ledger,
//! contract) are modules of their own outside the engine.

mod building;
mod config;
mod effects;
mod error;
mod history;
mod inspection;
mod integration;
mod merge;
mod report;
mod resume;
mod workers;

use std::{path::Path, sync::Arc};

use protobot_lifecycle::AuthorizationContext;
use protobot_stores::WorkStore;

pub use self::{
    config::{
        DEFAULT_MODEL_RETRY_DELAY_CAP, EngineConfig, FaultHook, Producer, StageHook, StopSignal,
        WorkerClass, egress_for,
    },
    effects::scan_projection,
    error::{EngineError, GitError},
    history::{BLOCKED_OUTCOME, escalation_from, since_last_block},
    report::{BuildReport, CycleReport, InspectionReport, TraceEvent, read_trace},
};
use crate::{
    contract::BuildContract,
    executor::Executor,
    lease::{Claim, Clock},
    triage::Triage,
};

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
    /// Where each run's model usage is read back from after it ends, for the item's usage
    /// (none: usage is not recorded on items; the proxy still meters it).
    pub usage: Option<Arc<dyn crate::usage::UsageSource>>,
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
