//! The `ChangeSet` kind: one approved, merged change set registered for materialization
//! (by GitOps, `protobot register` or the repository poller), and what became of it.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    common::{BusinessPriority, CHANGE_SET_ID_PATTERN, ChangeType, GIT_COMMIT_PATTERN, LocalRef},
    conditions::Condition,
};

/// Bound of the requirement-ID lists in `status.impact`.
pub const IMPACT_REQUIREMENTS_LIMIT: u32 = 256;

/// A merged change set awaiting or past materialization into a `BuildWorkItem`.
// kube's `printcolumn(...)` repeats `type_ =` per column, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "protobot.dev",
    version = "v1alpha1",
    kind = "ChangeSet",
    plural = "changesets",
    namespaced,
    status = "ChangeSetStatus",
    derive = "PartialEq",
    shortname = "pbcs",
    category = "protobot",
    doc = "A merged change set awaiting or past materialization into a BuildWorkItem.",
    printcolumn(
        name = "ID",
        type_ = "string",
        json_path = ".spec.changeSetId",
        description = "change-set ID"
    ),
    printcolumn(
        name = "Project",
        type_ = "string",
        json_path = ".spec.projectRef.name",
        description = "project"
    ),
    printcolumn(
        name = "Priority",
        type_ = "string",
        json_path = ".spec.businessPriority",
        description = "business priority"
    ),
    printcolumn(
        name = "Verified",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Verified")].status"#,
        description = "Verified condition"
    ),
    printcolumn(
        name = "Materialized",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Materialized")].status"#,
        description = "Materialized condition"
    ),
    printcolumn(
        name = "Work Item",
        type_ = "string",
        json_path = ".status.workItemRef.name",
        description = "the BuildWorkItem created for it"
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
#[serde(rename_all = "camelCase")]
pub struct ChangeSetSpec {
    /// The `Project` this change set belongs to. Immutable.
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "projectRef is immutable"}]))]
    pub project_ref: LocalRef,
    /// Change-set ID as written by ears-manager, e.g. `CS-00042`. Immutable.
    #[schemars(regex(pattern = CHANGE_SET_ID_PATTERN))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "changeSetId is immutable"}]))]
    pub change_set_id: String,
    /// Full id (40 hex digits) of the merge commit on the default branch that approved the
    /// change set; the materializer reads the manifest at this commit. Immutable.
    #[schemars(regex(pattern = GIT_COMMIT_PATTERN))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "mergeCommit is immutable"}]))]
    pub merge_commit: String,
    /// Business priority (`low`, `normal`, `high`, `urgent`) given to the work item; absent
    /// means `normal`. Humans may change it at any time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub business_priority: Option<BusinessPriority>,
}

/// What became of a change set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangeSetStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The `BuildWorkItem` materialized for this change set; absent while pending and when
    /// the outcome was `omitted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_item_ref: Option<LocalRef>,
    /// The materialization reservation kept under the materialization key. It is the only
    /// record of an `omitted` outcome, which creates no work item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<MaterializationReservation>,
    /// Summary of the impact analysis rerun at the merge commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impact: Option<ImpactSummary>,
    /// The pull request the Project's forge confirmed as the approved merge of this change
    /// set (docs/forge-github.md §1); absent for Projects without a forge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovingPullRequest>,
    /// Conditions `Verified` (merge commit and manifest checked), `Materialized`, and the
    /// summary `Ready` and `Stalled` that GitOps tools read (docs/gitops.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The outcome of `materialize`, as kept in its reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::common::without_description)]
pub enum MaterializationOutcome {
    /// A work item was created in `waiting`.
    #[serde(rename = "waiting")]
    Waiting,
    /// A work item was created in `ready-for-building`.
    #[serde(rename = "ready-for-building")]
    ReadyForBuilding,
    /// A work item was created in `blocked`.
    #[serde(rename = "blocked")]
    Blocked,
    /// No implementation is required: no work item, only this reservation.
    #[serde(rename = "omitted")]
    Omitted,
}

/// A materialization reservation: the create-or-return record of one materialization key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaterializationReservation {
    /// Stable identity of the logical work item; the `BuildWorkItem` name derives from it.
    #[schemars(length(min = 1))]
    pub materialization_key: String,
    /// Fingerprint of the canonical source contract; a later materialization under the same
    /// key with a different fingerprint is an `IDEMPOTENCY_CONFLICT`.
    #[schemars(length(min = 1))]
    pub source_fingerprint: String,
    /// The outcome: `waiting`, `ready-for-building`, `blocked` or `omitted`.
    pub outcome: MaterializationOutcome,
}

/// The pull request that approved a change set's merge, as the forge reported it when the
/// merge was checked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovingPullRequest {
    /// The pull request's number.
    #[schemars(range(min = 1))]
    pub number: u64,
    /// The pull request's page.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub url: String,
    /// The merge commit the forge reports for it (equal to `spec.mergeCommit`).
    #[schemars(regex(pattern = GIT_COMMIT_PATTERN))]
    pub merge_commit: String,
    /// Who approved it; empty under `single-player` review, where the merge is the approval.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub approvers: Vec<String>,
}

/// Summary of the impact analysis of a change set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImpactSummary {
    /// Change type: `undefined` (adds requirements), `changes` (revises or retires
    /// requirements) or `contradicts` (a true bug, no spec change).
    pub change_type: ChangeType,
    /// Whether the change needs implementation; `false` materializes as `omitted`.
    pub implementation_required: bool,
    /// IDs of the requirements the change set adds, revises or retires (at most 256).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = IMPACT_REQUIREMENTS_LIMIT))]
    pub changed_requirements: Vec<String>,
    /// IDs of the requirements the implementation must satisfy (at most 256).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = IMPACT_REQUIREMENTS_LIMIT))]
    pub applicable_requirements: Vec<String>,
    /// Work items this change depends on (their materialization keys or ids).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = IMPACT_REQUIREMENTS_LIMIT))]
    pub dependencies: Vec<String>,
}
