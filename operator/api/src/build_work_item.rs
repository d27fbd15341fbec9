//! The `BuildWorkItem` kind: one materialized work item. Its spec is the immutable source
//! contract written by the materializer (only `businessPriority` is for humans); its status
//! is the work-item record of `contracts/lifecycle.md` §4.1, written by the single writer
//! under a `resourceVersion` precondition.
//!
//! Every list in the status is bounded so that the object stays far below etcd's object
//! limit; the `record_*` methods append and drop the oldest entries past the bound, and the
//! generated schema carries the same bound as `maxItems` so that a writer that forgets to
//! trim is refused by the API server instead of growing the object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use jiff::Timestamp;

use crate::{
    common::{
        BusinessPriority, CHANGE_SET_ID_PATTERN, ChangeType, GIT_COMMIT_PATTERN, LifecycleCommand,
        LifecycleState, LocalRef, ModelTier,
    },
    conditions::{Condition, ConditionStatus, ConditionUpdate, reasons, set_condition, types},
    lease::{Lease, leased_condition},
};

/// Bound of the requirement-ID and dependency lists of the spec and status.
pub const REQUIREMENTS_LIMIT: u32 = 256;
/// Longest requirement or work-item ID accepted in the spec lists.
pub const ID_MAX_LENGTH: u32 = 128;
/// Bound of `status.contractVersions`: the newest entries are kept.
pub const CONTRACT_VERSIONS_LIMIT: u32 = 64;
/// Bound of `status.cycles`: the newest entries are kept.
pub const CYCLES_LIMIT: u32 = 32;
/// Bound of `status.readiness.unresolvedReasons`.
pub const UNRESOLVED_REASONS_LIMIT: u32 = 32;

/// One work item: the unit the Job Site claims, builds, inspects and merges.
// kube's `printcolumn(...)` repeats `type_ =` per column, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "protobot.dev",
    version = "v1alpha1",
    kind = "BuildWorkItem",
    plural = "buildworkitems",
    namespaced,
    status = "BuildWorkItemStatus",
    derive = "PartialEq",
    shortname = "bwi",
    category = "protobot",
    doc = "One work item: the unit the Job Site claims, builds, inspects and merges.",
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.state",
        description = "lifecycle state"
    ),
    printcolumn(
        name = "Priority",
        type_ = "string",
        json_path = ".spec.businessPriority",
        description = "business priority"
    ),
    printcolumn(
        name = "Holder",
        type_ = "string",
        json_path = ".status.lease.holder",
        description = "Job Site holding the lease"
    ),
    printcolumn(
        name = "Version",
        type_ = "integer",
        json_path = ".status.contractVersion",
        description = "contract version"
    ),
    printcolumn(
        name = "Type",
        type_ = "string",
        json_path = ".spec.changeType",
        description = "change type",
        priority = 1
    ),
    printcolumn(
        name = "Branch",
        type_ = "string",
        json_path = ".status.branch",
        description = "integration branch",
        priority = 1
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "whether the Ready condition holds"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "reason of the Ready condition"
    ),
    printcolumn(
        name = "Question",
        type_ = "string",
        json_path = ".status.blockReason",
        description = "what a person must decide before a blocked item moves on (a spec question or a spent budget)",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct BuildWorkItemSpec {
    /// Work-item identity in the work-management store (`id`). Written by the materializer;
    /// immutable.
    #[schemars(length(min = 1, max = ID_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "workItemId is immutable"}]))]
    pub work_item_id: String,
    /// The `Project` this work item belongs to; its name is the record's project id. Written
    /// by the materializer; immutable.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "projectRef is immutable"}]))]
    pub project_ref: LocalRef,
    /// The `ChangeSet` this item was materialized from; absent for a true-bug intake
    /// (`contradicts`) that did not come through a change set. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "changeSetRef is immutable"}]))]
    pub change_set_ref: Option<LocalRef>,
    /// Change-set ID, e.g. `CS-00042`, when the item came from a change set. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = CHANGE_SET_ID_PATTERN), length(max = ID_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "changeSetId is immutable"}]))]
    pub change_set_id: Option<String>,
    /// Stable identity of the logical item; the object name derives from it, and a different
    /// source under the same key is an `IDEMPOTENCY_CONFLICT`. Immutable.
    #[schemars(length(min = 1, max = 1024))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "materializationKey is immutable"}]))]
    pub materialization_key: String,
    /// Change type: `undefined` (adds requirements), `changes` (revises or retires
    /// requirements) or `contradicts` (a true bug, no spec change). Immutable.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "changeType is immutable"}]))]
    pub change_type: ChangeType,
    /// Whether the change needs implementation. Always `true` for a stored work item
    /// (`false` materializes as an omitted reservation); kept for the source fingerprint.
    /// Immutable.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "implementationRequired is immutable"}]))]
    pub implementation_required: bool,
    /// IDs of the requirements this change adds, revises or retires (or, for
    /// `contradicts`, violates); at most 256. Immutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = REQUIREMENTS_LIMIT), inner(length(max = ID_MAX_LENGTH)))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "changedRequirements is immutable"}]))]
    pub changed_requirements: Vec<String>,
    /// IDs of every requirement the implementation must satisfy, the changed ones included;
    /// at most 256. Immutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = REQUIREMENTS_LIMIT), inner(length(max = ID_MAX_LENGTH)))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "applicableRequirements is immutable"}]))]
    pub applicable_requirements: Vec<String>,
    /// Work-item IDs that must be `completed` before this item is claimable; their observed
    /// states are in `status.dependencies`. At most 256. Immutable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = REQUIREMENTS_LIMIT), inner(length(max = ID_MAX_LENGTH)))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "dependencies is immutable"}]))]
    pub dependencies: Vec<String>,
    /// Commit (40 hex digits) of the spec records the item was materialized from; absent
    /// only for records restored into the store without one. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GIT_COMMIT_PATTERN), length(min = 40, max = 40))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "specCommit is immutable"}]))]
    pub spec_commit: Option<String>,
    /// Business priority (`low`, `normal`, `high`, `urgent`); absent means `normal`. The only
    /// field humans may edit; dispatch takes it first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub business_priority: Option<BusinessPriority>,
}

/// The work-item record of the validation-rules/v1 contract plus what the Job Site keeps
/// about its attempts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuildWorkItemStatus {
    /// Lifecycle state: `waiting`, `ready-for-building`, `building`, `inspecting`, `blocked`,
    /// `merging`, `completed` or `abandoned`.
    pub state: LifecycleState,
    /// Contract version: starts at 1 on materialize and grows by exactly 1 on every allowed
    /// lifecycle transition (renewals included). Its own counter, never `resourceVersion` or
    /// `generation`, which also move on writes that are not transitions.
    #[schemars(range(min = 1))]
    pub contract_version: u64,
    /// The newest transitions, one entry per contract version, oldest first (at most 64).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = CONTRACT_VERSIONS_LIMIT))]
    pub contract_versions: Vec<ContractVersionEntry>,
    /// Trusted subject that owns the item while it holds a lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The live or last lease; absent when released. Mirrored as the `Leased` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
    /// Readiness as last stored by `materialize` or a refresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Readiness>,
    /// Dependencies with their states as observed by the store (at most 256).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = REQUIREMENTS_LIMIT))]
    pub dependencies: Vec<DependencyStatus>,
    /// Why the item is `blocked`: the first readiness failure or the spec question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_reason: Option<String>,
    /// ID of the resolution submission currently active for a blocked item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_resolution_submission_id: Option<String>,
    /// Observed by the store: the inspection run's finding ledger is sealed. Cleared by any
    /// transition into a non-inspection, non-terminal state.
    #[serde(default)]
    pub inspection_run_sealed: bool,
    /// Observed by the store: every finding of the sealed run has a terminal disposition.
    #[serde(default)]
    pub findings_terminal: bool,
    /// Observed by the store: the final test run on the candidate passed.
    #[serde(default)]
    pub final_tests_passed: bool,
    /// The tested-candidate envelope stored by `begin-merge`; `record-merge` must match it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_merge: Option<MergeEnvelope>,
    /// Reconciliation evidence observed from Git and the store, never from a command payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciliation: Option<Reconciliation>,
    /// Integration branch, `wi/<id>-build`, once the item was first claimed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The newest build cycles, oldest first (at most 32).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = CYCLES_LIMIT))]
    pub cycles: Vec<CycleRecord>,
    /// Model tier of the newest cycle (the Job Site moves up a tier only on genuine
    /// failures and replays the cycles from the ledger to resume at the right one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation_tier: Option<ModelTier>,
    /// Head commit of the newest candidate: the one under test or inspection, or the one
    /// being merged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GIT_COMMIT_PATTERN))]
    pub candidate_commit: Option<String>,
    /// Merge commit on the target branch, once merged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GIT_COMMIT_PATTERN))]
    pub merge_commit: Option<String>,
    /// Immutable completion evidence, recorded with `completed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion: Option<CompletionEvidence>,
    /// What the item's sandboxed runs spent on model calls, metered at the egress proxy and
    /// read back after each run: totals, per stage and per tier. Absent until a run made a
    /// model call. See docs/cost-and-review.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageStatus>,
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The store's ledger for this item, as JSON: the validation-rules/v1 record, results of
    /// idempotent commands on it, its reservation, blocked-work submissions, decisions on
    /// approvals bound to it, observed readiness and its audit tail. Written only by the
    /// work store in the same status write as the fields above, which mirror it for humans;
    /// see docs/kubernetes-work-store.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<String>,
    /// Conditions `Leased` (mirrors `lease`), `Blocked`, `Stalled` (the item cannot move
    /// without a person: `blocked` or `abandoned`), `AwaitingChecks` (the forge's landing
    /// waits for required checks of the tested head) and the summary `Ready` (`True` once
    /// `completed`), which Flux's kstatus and Argo CD read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// One allowed lifecycle transition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContractVersionEntry {
    /// The contract version the transition produced.
    #[schemars(range(min = 1))]
    pub version: u64,
    /// The lifecycle command, e.g. `claim`.
    pub command: LifecycleCommand,
    /// The state after the transition.
    pub state: LifecycleState,
    /// Trusted subject that issued the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    /// The idempotency key of the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Evaluation time of the transition.
    pub time: Time,
}

/// Readiness flags of the validation-rules/v1 contract. The first five are contract-level;
/// the rest are blockers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Readiness {
    /// The source contract is complete.
    #[serde(default)]
    pub contract_complete: bool,
    /// The source is immutable (a merge commit, not a branch).
    #[serde(default)]
    pub source_immutable: bool,
    /// The specification validated.
    #[serde(default)]
    pub specification_validated: bool,
    /// Every requirement reference resolves.
    #[serde(default)]
    pub requirement_references_valid: bool,
    /// The pipeline entry conditions hold.
    #[serde(default)]
    pub pipeline_entry_satisfied: bool,
    /// The impact was dispositioned; `false` blocks.
    #[serde(default)]
    pub impact_dispositioned: bool,
    /// The change is compatible with policy; `false` blocks.
    #[serde(default)]
    pub policy_compatible: bool,
    /// Unresolved reasons; any entry blocks (at most 32).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = UNRESOLVED_REASONS_LIMIT))]
    pub unresolved_reasons: Vec<String>,
}

/// A dependency and its state as observed by the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DependencyStatus {
    /// Work-item ID of the dependency.
    pub id: String,
    /// Its observed lifecycle state; absent when the store cannot see the record, which
    /// counts as `initial` (not complete). Only `completed` satisfies a dependency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<LifecycleState>,
}

/// The merge envelope that binds a merge to the tested candidate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MergeEnvelope {
    /// Digest of the tested product tree.
    pub product_tree_digest: String,
    /// ID of the sealed inspection run that approved the candidate.
    pub inspection_run_id: String,
    /// Head of the integration branch that was tested.
    pub integration_head: String,
    /// Branch the candidate merges into.
    pub target: String,
    /// Contract version the merge completes under.
    pub contract_version: u64,
    /// The merge commit; absent in `expectedMerge`, required in recorded evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_commit: Option<String>,
}

/// Reconciliation evidence status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::common::without_description)]
pub enum ReconciliationStatus {
    /// The merge conflicted.
    #[serde(rename = "conflict")]
    Conflict,
    /// Git shows the merge was not applied.
    #[serde(rename = "not-applied")]
    NotApplied,
    /// Git shows the merge; the envelope records it.
    #[serde(rename = "merge-recorded")]
    MergeRecorded,
    /// The expired lease may be recovered.
    #[serde(rename = "lease-recovered")]
    LeaseRecovered,
    /// Nothing of the item was integrated into Git.
    #[serde(rename = "not-integrated")]
    NotIntegrated,
}

/// What Git shows was done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::common::without_description)]
pub enum GitMutation {
    /// Nothing was changed.
    #[serde(rename = "none")]
    None,
    /// The merge conflicted.
    #[serde(rename = "conflict")]
    Conflict,
    /// The merge is on the target.
    #[serde(rename = "merged")]
    Merged,
}

/// Reconciliation evidence on the current record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reconciliation {
    /// Evidence status: `conflict`, `not-applied`, `merge-recorded`, `lease-recovered` or
    /// `not-integrated`.
    pub status: ReconciliationStatus,
    /// What Git shows: `none`, `conflict` or `merged`.
    pub git_mutation: GitMutation,
    /// The observed merge envelope; required for `merge-recorded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_envelope: Option<MergeEnvelope>,
    /// When the evidence was observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_time: Option<Time>,
}

/// How a build cycle ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::common::without_description)]
pub enum CycleOutcome {
    /// The cycle is still running.
    #[serde(rename = "running")]
    Running,
    /// The candidate passed the build test gate.
    #[serde(rename = "passed")]
    Passed,
    /// Triage blamed the tests (a genuine failure: escalates).
    #[serde(rename = "test-fault")]
    TestFault,
    /// Triage blamed the implementation (a genuine failure: escalates).
    #[serde(rename = "implementation-fault")]
    ImplementationFault,
    /// Triage blamed both (a genuine failure: escalates).
    #[serde(rename = "both-faults")]
    BothFaults,
    /// A transient failure (timeout, rate limit, image pull): retried without escalating.
    #[serde(rename = "transient")]
    Transient,
    /// Inspection sent the candidate back (a genuine failure: escalates).
    #[serde(rename = "rejected-inspection")]
    RejectedInspection,
}

/// One build cycle of a work item.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CycleRecord {
    /// Cycle number, starting at 1.
    #[schemars(range(min = 1))]
    pub cycle: u32,
    /// Model tier the workers ran at.
    pub tier: ModelTier,
    /// How the cycle ended: `running`, `passed`, `test-fault`, `implementation-fault`,
    /// `both-faults`, `transient` or `rejected-inspection`.
    pub outcome: CycleOutcome,
    /// Candidate commit the cycle produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GIT_COMMIT_PATTERN))]
    pub candidate_commit: Option<String>,
    /// When the cycle started.
    pub start_time: Time,
    /// When the cycle ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Time>,
}

/// Bound of `status.usage.stages` (one entry per build stage).
pub const USAGE_STAGES_LIMIT: u32 = 4;
/// Bound of `status.usage.tiers` (one entry per model tier).
pub const USAGE_TIERS_LIMIT: u32 = 4;

/// What an item's model calls spent (docs/cost-and-review.md). Bounded: one entry per stage
/// and per tier, never per run or per call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageStatus {
    /// Sandboxed runs whose usage was read back.
    pub runs: u64,
    /// Everything the item's runs spent.
    pub total: UsageAmount,
    /// By build stage, in build order (only stages that made model calls).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = USAGE_STAGES_LIMIT))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["stage"]))]
    pub stages: Vec<StageUsage>,
    /// By model tier of the Worker runs (runs outside build cycles have none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = USAGE_TIERS_LIMIT))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["tier"]))]
    pub tiers: Vec<TierUsage>,
}

/// Calls, tokens and cost of some model calls.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageAmount {
    /// Calls whose answer reported usage.
    pub calls: u64,
    /// Calls whose answer reported none: their tokens are unknown, never guessed.
    #[serde(default)]
    pub calls_without_usage: u64,
    /// Fresh input tokens.
    pub input_tokens: u64,
    /// Output tokens (reasoning included).
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Input tokens written to the prompt cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// The part of the output tokens the model reported as reasoning.
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// Cost in micro-dollars (millionths of a US dollar), priced with the worker class's
    /// prices or else the egress proxy's; absent when some call's model has no price (the
    /// cost is unknown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_microdollars: Option<u64>,
    /// Calls with tokens whose model has no price (the cost is unknown while any exist).
    #[serde(default)]
    pub unpriced_calls: u64,
    /// The cost for humans: `$0.003600`, or `unknown`.
    pub cost: String,
}

/// A build stage whose runs made model calls.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum UsageStage {
    /// Worker A (tests).
    WorkerA,
    /// Worker B (implementation).
    WorkerB,
    /// The integration runner.
    Integration,
    /// Inspectors and mutation campaigns.
    Inspection,
}

/// What one build stage spent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageUsage {
    /// The stage.
    pub stage: UsageStage,
    /// What its runs spent.
    pub spent: UsageAmount,
}

/// What the Worker runs of one model tier spent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TierUsage {
    /// The tier.
    pub tier: ModelTier,
    /// What its runs spent.
    pub spent: UsageAmount,
}

/// Completion evidence recorded with `completed`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompletionEvidence {
    /// The merge envelope that completed the item, merge commit included.
    pub merge_envelope: MergeEnvelope,
    /// Whether Git shows the merge on the target branch (the reconciliation evidence the
    /// item completed with).
    pub verified_on_target: bool,
    /// When the item completed.
    pub completed_time: Time,
}

// === impl BuildWorkItemStatus ===

impl BuildWorkItemStatus {
    /// A fresh record as `materialize` stores it: contract version 1, nothing else.
    pub fn materialized(state: LifecycleState) -> Self {
        Self {
            state,
            contract_version: 1,
            contract_versions: Vec::new(),
            owner: None,
            lease: None,
            readiness: None,
            dependencies: Vec::new(),
            block_reason: None,
            active_resolution_submission_id: None,
            inspection_run_sealed: false,
            findings_terminal: false,
            final_tests_passed: false,
            expected_merge: None,
            reconciliation: None,
            branch: None,
            cycles: Vec::new(),
            escalation_tier: None,
            candidate_commit: None,
            merge_commit: None,
            completion: None,
            usage: None,
            observed_generation: None,
            ledger: None,
            conditions: Vec::new(),
        }
    }

    /// Appends a transition to `contractVersions`, dropping the oldest past the bound.
    pub fn record_contract_version(&mut self, entry: ContractVersionEntry) {
        push_bounded(&mut self.contract_versions, entry, CONTRACT_VERSIONS_LIMIT);
    }

    /// Appends a build cycle, dropping the oldest past the bound.
    pub fn record_cycle(&mut self, cycle: CycleRecord) {
        push_bounded(&mut self.cycles, cycle, CYCLES_LIMIT);
    }

    /// Recomputes the conditions that mirror the record: `Leased` (from `lease` at `now`),
    /// `Blocked` (from `state` and `blockReason`), `Stalled` and `Ready` (from `state`),
    /// and reports whether any changed. A condition whose status is unchanged keeps its
    /// `lastTransitionTime`.
    pub fn mirror_conditions(&mut self, observed_generation: Option<i64>, now: Timestamp) -> bool {
        let updates = [
            leased_condition(self.lease.as_ref(), now),
            blocked_condition(self.state, self.block_reason.as_deref()),
            stalled_condition(self.state, self.block_reason.as_deref()),
            ready_condition(self.state),
        ];
        let mut changed = false;
        for update in updates {
            changed |= set_condition(&mut self.conditions, update, observed_generation, now);
        }
        changed
    }
}

/// Computes the `Blocked` condition: `True` with the block reason as message while the
/// state is `blocked`, `False` otherwise.
pub fn blocked_condition(state: LifecycleState, block_reason: Option<&str>) -> ConditionUpdate {
    if state == LifecycleState::Blocked {
        ConditionUpdate::new(
            types::BLOCKED,
            ConditionStatus::True,
            reasons::BLOCK_RECORDED,
            block_reason.unwrap_or("blocked without a recorded reason"),
        )
    } else {
        ConditionUpdate::new(
            types::BLOCKED,
            ConditionStatus::False,
            reasons::NOT_BLOCKED,
            format!("the item is {state}"),
        )
    }
}

/// Computes the `AwaitingChecks` condition: `True` with `waiting` (what the landing waits
/// for, until when) as message while the forge's landing waits for required checks of the
/// tested head; `False` otherwise. The operator sets it from the forge's waits; the record has
/// no part in it.
pub fn awaiting_checks_condition(waiting: Option<&str>) -> ConditionUpdate {
    match waiting {
        Some(message) => ConditionUpdate::new(
            types::AWAITING_CHECKS,
            ConditionStatus::True,
            reasons::REQUIRED_CHECKS_PENDING,
            message,
        ),
        None => ConditionUpdate::new(
            types::AWAITING_CHECKS,
            ConditionStatus::False,
            reasons::NOT_AWAITING_CHECKS,
            "the landing is not waiting for required checks",
        ),
    }
}

/// Reasons of a work item's `Stalled` and `Ready` conditions (the types are
/// [`types::STALLED`] and [`types::READY`]).
pub mod work_item_conditions {
    /// `Ready=True`: the item is `completed`.
    pub const COMPLETED: &str = "Completed";
    /// `Ready=False`, `Stalled=False`: the item is on its way (`waiting` to `merging`).
    pub const IN_PROGRESS: &str = "InProgress";
    /// `Ready=False`, `Stalled=True`: the item is `blocked`.
    pub const BLOCKED: &str = "Blocked";
    /// `Ready=False`, `Stalled=True`: the item was `abandoned`.
    pub const ABANDONED: &str = "Abandoned";
}

/// Computes the `Stalled` condition: `True` while the item is `blocked` (the block reason
/// as message) or `abandoned`, `False` otherwise.
pub fn stalled_condition(state: LifecycleState, block_reason: Option<&str>) -> ConditionUpdate {
    use work_item_conditions as wic;
    match state {
        LifecycleState::Blocked => ConditionUpdate::new(
            types::STALLED,
            ConditionStatus::True,
            wic::BLOCKED,
            block_reason.unwrap_or("blocked without a recorded reason"),
        ),
        LifecycleState::Abandoned => ConditionUpdate::new(
            types::STALLED,
            ConditionStatus::True,
            wic::ABANDONED,
            "the item was abandoned; it will not be built",
        ),
        other => ConditionUpdate::new(
            types::STALLED,
            ConditionStatus::False,
            if other == LifecycleState::Completed {
                wic::COMPLETED
            } else {
                wic::IN_PROGRESS
            },
            format!("the item is {other}"),
        ),
    }
}

/// Computes the summary `Ready` condition: `True` once `completed`; `False` with the reason
/// `Blocked`, `Abandoned` or `InProgress` otherwise.
pub fn ready_condition(state: LifecycleState) -> ConditionUpdate {
    use work_item_conditions as wic;
    let (status, reason) = match state {
        LifecycleState::Completed => (ConditionStatus::True, wic::COMPLETED),
        LifecycleState::Blocked => (ConditionStatus::False, wic::BLOCKED),
        LifecycleState::Abandoned => (ConditionStatus::False, wic::ABANDONED),
        _ => (ConditionStatus::False, wic::IN_PROGRESS),
    };
    ConditionUpdate::new(types::READY, status, reason, format!("the item is {state}"))
}

/// Pushes `item` and drops the oldest entries so that at most `limit` remain.
fn push_bounded<T>(list: &mut Vec<T>, item: T, limit: u32) {
    list.push(item);
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if list.len() > limit {
        let excess = list.len() - limit;
        list.drain(..excess);
    }
}
