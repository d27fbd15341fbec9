//! The `InspectionRun` kind: one independent inspection of a tested candidate. The spec is
//! an immutable manifest written by the Job Site when the run starts; the status tracks the
//! producers and the finding ledger up to the seal.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    common::{GIT_COMMIT_PATTERN, LocalRef},
    conditions::Condition,
};

/// Bound of `spec.requiredProducers` and `status.producersCompleted`.
pub const PRODUCERS_LIMIT: u32 = 32;
/// Bound of `spec.findingsToRecheck`.
pub const FINDINGS_TO_RECHECK_LIMIT: u32 = 256;
/// Bound of `spec.mutation.operators`.
pub const MUTATION_OPERATORS_LIMIT: u32 = 64;
/// Most mutants one campaign may run (`spec.mutation.maxMutants`).
pub const MAX_MUTANTS: u32 = 10_000;
/// Longest wall-clock budget of one campaign in seconds, six hours
/// (`spec.mutation.timeoutSeconds`).
pub const MAX_MUTATION_TIMEOUT_SECONDS: u32 = 21_600;

/// One independent inspection of a tested candidate.
// kube's `printcolumn(...)` repeats `type_ =` per column, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "protobot.dev",
    version = "v1alpha1",
    kind = "InspectionRun",
    plural = "inspectionruns",
    namespaced,
    status = "InspectionRunStatus",
    derive = "PartialEq",
    shortname = "pbir",
    category = "protobot",
    doc = "One independent inspection of a tested candidate.",
    printcolumn(
        name = "Work Item",
        type_ = "string",
        json_path = ".spec.workItemRef.name",
        description = "inspected work item"
    ),
    printcolumn(
        name = "Version",
        type_ = "integer",
        json_path = ".spec.contractVersion",
        description = "contract version at start"
    ),
    printcolumn(
        name = "Sealed",
        type_ = "date",
        json_path = ".status.sealed.at",
        description = "when the ledger was sealed"
    ),
    printcolumn(
        name = "Watermark",
        type_ = "integer",
        json_path = ".status.sealed.highWatermark",
        description = "ledger sequence at the seal",
        priority = 1
    ),
    printcolumn(
        name = "Candidate",
        type_ = "string",
        json_path = ".spec.candidateCommit",
        description = "inspected candidate commit",
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
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "the inspection-run manifest (spec) is immutable"}]))]
#[serde(rename_all = "camelCase")]
pub struct InspectionRunSpec {
    /// The `BuildWorkItem` under inspection.
    pub work_item_ref: LocalRef,
    /// The work item's contract version when the run started; findings bind to it.
    #[schemars(range(min = 1))]
    pub contract_version: u64,
    /// The tested candidate commit (40 hex digits).
    #[schemars(regex(pattern = GIT_COMMIT_PATTERN), length(min = 40, max = 40))]
    pub candidate_commit: String,
    /// Digest of the tested product tree; the merge envelope must carry the same.
    #[schemars(length(min = 1, max = 256))]
    pub product_tree_digest: String,
    /// Producers that must report before the ledger may be sealed, e.g. `inspector-a`,
    /// `mutation` (at most 32).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = PRODUCERS_LIMIT), inner(length(max = 128)))]
    pub required_producers: Vec<String>,
    /// Mutation campaign settings; absent: no mutation campaign.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutation: Option<MutationConfig>,
    /// IDs of findings from earlier runs that this run must recheck (at most 256).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = FINDINGS_TO_RECHECK_LIMIT), inner(length(max = 128)))]
    pub findings_to_recheck: Vec<String>,
    /// Global finding-ledger sequence when the run started; the run's findings come after.
    pub ledger_sequence_at_start: u64,
}

/// Mutation campaign settings of an inspection run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MutationConfig {
    /// Mutation operators to apply; empty: the runner's defaults (at most 64).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MUTATION_OPERATORS_LIMIT), inner(length(max = 128)))]
    pub operators: Vec<String>,
    /// Most mutants the campaign may run (1 to 10000).
    #[schemars(range(min = 1, max = MAX_MUTANTS))]
    pub max_mutants: u32,
    /// Wall-clock budget of the campaign in seconds (1 to 21600, six hours).
    #[schemars(range(min = 1, max = MAX_MUTATION_TIMEOUT_SECONDS))]
    pub timeout_seconds: u32,
    /// Lowest acceptable mutation score in percent; surviving mutants below it are findings.
    #[schemars(range(max = 100))]
    pub minimum_score_percent: u8,
}

/// Progress and seal of an inspection run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InspectionRunStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Producers that reported, in the order they completed (at most 32).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = PRODUCERS_LIMIT))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["producer"]))]
    pub producers_completed: Vec<ProducerCompletion>,
    /// Number of this run's findings in each disposition.
    #[serde(default)]
    pub finding_counts: FindingCounts,
    /// The seal of the finding ledger; absent while producers are reporting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<Seal>,
    /// Digest of the attestation snapshot taken at the seal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_digest: Option<String>,
    /// Conditions `ProducersComplete`, `Sealed`, and the summary `Ready` (sealed) and
    /// `Stalled` (every producer reported without a seal) that GitOps tools read
    /// (docs/gitops.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A producer that finished reporting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProducerCompletion {
    /// Producer name, one of `spec.requiredProducers`.
    pub producer: String,
    /// How many findings it reported.
    pub findings: u32,
    /// When it completed.
    pub completed_time: Time,
}

/// Number of a run's findings in each disposition. Terminal dispositions are `resolved`,
/// `rejected` and `deferred`; `findingsTerminal` holds when `open` and `confirmed` are zero.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FindingCounts {
    /// Reported and not yet dispositioned.
    #[serde(default)]
    pub open: u32,
    /// Confirmed as in-contract defects that need rework.
    #[serde(default)]
    pub confirmed: u32,
    /// Fixed and verified by a recheck.
    #[serde(default)]
    pub resolved: u32,
    /// Not a defect.
    #[serde(default)]
    pub rejected: u32,
    /// Out of scope of this work item; carried to later work.
    #[serde(default)]
    pub deferred: u32,
}

impl FindingCounts {
    /// Whether every finding has a terminal disposition (no `open`, no `confirmed`).
    pub const fn all_terminal(&self) -> bool {
        self.open == 0 && self.confirmed == 0
    }
}

/// The seal of a run's finding ledger.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Seal {
    /// Highest ledger sequence included in the run; later events belong to no sealed run.
    pub high_watermark: u64,
    /// When the ledger was sealed.
    pub at: Time,
}
