//! What a build reports: its cycles, inspection runs and outcome ([`BuildReport`]), and the
//! structured trace events every stage decision writes (read back with [`read_trace`]).

use std::path::Path;

use protobot_lifecycle::State;
use serde::{Deserialize, Serialize};

use crate::{escalation::Tier, inspection::Verdict, ledger::Ledger, sanitizer::SanitizedFeedback};

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
    /// What the item's runs spent on model calls so far, as recorded on the item (issue 34).
    #[serde(default, skip_serializing_if = "protobot_usage::UsageLedger::is_empty")]
    pub usage: protobot_usage::UsageLedger,
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

/// Per-call progress, for the report.
#[derive(Default)]
pub(super) struct Progress {
    pub(super) cycles: Vec<CycleReport>,
    pub(super) inspections: Vec<InspectionReport>,
    pub(super) revalidations: u32,
    pub(super) transient: u32,
    /// The model failures of this call since its last completed cycle, oldest first: the
    /// streak a class's retry budget is counted on (the store keeps one attempt per cycle,
    /// so a restarted build counts afresh).
    pub(super) model_failures: Vec<crate::escalation::Attempt>,
    pub(super) ledger: Ledger,
    pub(super) prior_findings: Vec<String>,
    pub(super) digest: Option<String>,
    pub(super) merge_commit: Option<String>,
    /// Why the last gate of this call did not pass, for the block message.
    pub(super) last_cause: Option<String>,
}
