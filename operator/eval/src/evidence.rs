//! What one Job Site run produced, as typed values: the **trace bundle**.
//!
//! The shell (`protobot demo`, `protobot eval`) reads it from the run's files
//! (the engine's trace lines, the integration runner's `results.json`, the
//! producers' `findings.jsonl`, the egress proxy's decision events, the model
//! endpoint's request log) and writes it as `trace.json` next to the records.
//! [`crate::records::build`] makes the records from it alone, so a bundle
//! replays offline: the same bundle always gives the same records, and each
//! stage's record reads only its own part.

use protobot_jobsite::{
    engine::{CycleReport, InspectionReport, TraceEvent},
    inspection::ReportedFinding,
    triage::TestResult,
};
use serde::{Deserialize, Serialize};

use crate::schema::Environment;

/// The bundle format's version.
pub const BUNDLE_VERSION: u32 = 1;

/// One run's evidence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSiteRun {
    /// [`BUNDLE_VERSION`].
    pub bundle_version: u32,
    /// The run's id (given by the caller).
    pub run_id: String,
    /// When the records were made (`YYYY-MM-DDTHH:MM:SSZ`, given by the caller).
    pub recorded_at: String,
    /// The fixture the run is evaluated against.
    pub fixture: FixtureRef,
    /// Where and with what it ran.
    pub environment: Environment,
    /// What the Job Site was given.
    pub inputs: RunInputs,
    /// The build's cycles as the engine reported them (decision, feedback, tier).
    pub cycles: Vec<CycleReport>,
    /// Each integration run's results, in the order they ran.
    pub gates: Vec<GateEvidence>,
    /// Each inspection run with what every producer reported.
    pub inspections: Vec<InspectionEvidence>,
    /// How the run ended.
    pub outcome: Outcome,
    /// The fixture's worker-visible checks, run by the evaluator on the merged product.
    pub visible_checks: Vec<CheckOutcome>,
    /// Holdout assets the fixture lists (not run: their files are evaluator-only).
    pub holdout_assets: Vec<String>,
    /// The engine's trace events for the work item (one per stage decision).
    pub engine_trace: Vec<TraceEvent>,
    /// The egress proxy's decision for every request a sandbox made.
    pub egress: Vec<EgressDecision>,
    /// Metadata of every request that reached the model endpoint.
    pub model_requests: Vec<ModelRequest>,
}

/// The fixture, by identity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixtureRef {
    /// `fixture_id`.
    pub id: String,
    /// `corpus_revision`.
    pub corpus_revision: String,
    /// `sha256:<hex>` of the fixture file.
    pub digest: String,
}

/// The Job Site's inputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunInputs {
    /// The work item built.
    pub work_item_id: String,
    /// Its approved, applicable requirements (the Workers' task).
    pub requirement_ids: Vec<String>,
    /// The build contract, as registered (the task every role's document is made from).
    pub contract: serde_json::Value,
}

/// One integration run (the gate of a cycle, or a rerun after the default branch moved).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateEvidence {
    /// The cycle it belongs to.
    pub cycle: u32,
    /// The integration run's id.
    pub run: String,
    /// Its test results.
    pub results: Vec<TestResult>,
    /// Build errors it reported.
    pub build_errors: usize,
}

/// One inspection run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InspectionEvidence {
    /// The engine's report (candidate, findings recorded, verdict).
    pub report: InspectionReport,
    /// What each producer reported, in producer order.
    pub producers: Vec<ProducerFindings>,
}

/// One producer's findings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerFindings {
    /// The producer.
    pub producer: String,
    /// Its findings, as reported.
    pub findings: Vec<ReportedFinding>,
}

/// How the run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// The work item's final state (`completed`, `blocked`, …).
    pub state: String,
    /// The merge commit, when it landed.
    pub merge_commit: Option<String>,
    /// Whether the default branch contains it.
    pub main_contains_merge: bool,
    /// The attested product-tree digest.
    pub product_tree_digest: Option<String>,
    /// Why the build stopped, when it stopped abnormally or blocked.
    pub error: Option<String>,
}

/// One evaluator check on the merged product.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckOutcome {
    /// The fixture's check id (`VIS-…`).
    pub id: String,
    /// The requirements it checks.
    pub requirement_ids: Vec<String>,
    /// Whether it passed.
    pub passed: bool,
    /// What it observed (exit status and the last lines of its output).
    pub evidence: String,
}

/// One decision of the egress proxy (its `protobot::egress` event).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressDecision {
    /// Work item of the session.
    pub work_item: String,
    /// Role of the session.
    pub role: String,
    /// The session's trace id (the sandbox run).
    pub trace_id: String,
    /// Host asked for.
    pub destination: String,
    /// Method.
    pub method: String,
    /// Path.
    pub path: String,
    /// `allowed` or `denied`.
    pub outcome: String,
    /// Why.
    pub reason: String,
    /// HTTP status answered.
    pub status: u16,
}

/// Metadata of one request at the model endpoint (never the key or the prompt).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRequest {
    /// The role whose task marker the conversation carries, when one does.
    pub role: Option<String>,
    /// Path.
    pub path: String,
    /// Model asked for.
    pub model: String,
    /// Messages in the conversation.
    pub messages: usize,
    /// Tools offered.
    pub tools: usize,
    /// Whether it asked for a stream.
    pub stream: bool,
    /// Whether it carried the credential the broker injects.
    pub key_injected: bool,
}
