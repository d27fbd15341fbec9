//! The `BugReport` kind: one true bug registered for materialization (by GitOps or
//! `kubectl apply`), and the facts it was materialized from.
//!
//! A true bug has no change set: it names the approved requirements the current behaviour
//! violates and where it shows. Its facts cannot be read again from the repository later (the
//! default branch moves), so the controller records them in `status.recordedFacts` before
//! it materializes; the in-cluster Job Site rebuilds the bug's build contract from them.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    change_set::{IMPACT_REQUIREMENTS_LIMIT, ImpactSummary},
    common::{BusinessPriority, GIT_COMMIT_PATTERN, LocalRef},
    conditions::Condition,
};

/// Pattern of a bug ID: a tracker id such as `GH-17` or `JIRA-4211`.
pub const BUG_ID_PATTERN: &str = "^[A-Za-z][A-Za-z0-9._-]{0,62}$";

/// Pattern of a requirement ID as written in a `BugReport`: a letter, then letters, digits,
/// `.`, `_` or `-`, e.g. `REQ-CLI-00001`.
pub const REQUIREMENT_ID_PATTERN: &str = "^[A-Za-z][A-Za-z0-9._-]{0,127}$";

/// Bound of the scope lists of a `BugReport`.
pub const SCOPES_LIMIT: u32 = 64;

/// Longest `spec.summary`.
pub const SUMMARY_MAX_LENGTH: u32 = 1024;

/// A true bug (the behaviour violates approved requirements) to materialize into a
/// `BuildWorkItem` without a change set.
// kube's `printcolumn(...)` repeats `type_ =` per column, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "protobot.dev",
    version = "v1alpha1",
    kind = "BugReport",
    plural = "bugreports",
    namespaced,
    status = "BugReportStatus",
    derive = "PartialEq",
    shortname = "pbbug",
    category = "protobot",
    doc = "A true bug (behaviour that violates approved requirements) awaiting or past materialization into a BuildWorkItem.",
    printcolumn(
        name = "Bug",
        type_ = "string",
        json_path = ".spec.bugId",
        description = "bug ID"
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
        name = "Valid",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Valid")].status"#,
        description = "Valid condition"
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
pub struct BugReportSpec {
    /// The `Project` the bug is in. Immutable. See docs/job-site.md ("Registering a true bug").
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "projectRef is immutable"}]))]
    pub project_ref: LocalRef,
    /// Stable bug identity, usually the tracker id, e.g. `GH-17`: a letter, then up to 62
    /// letters, digits, `.`, `_` or `-`. The work item's materialization key is
    /// `<project>/bug:<bugId>@<spec commit>`. Immutable.
    #[schemars(regex(pattern = BUG_ID_PATTERN))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": "self == oldSelf", "message": "bugId is immutable"}]))]
    pub bug_id: String,
    /// IDs of the approved requirements the current behaviour violates, e.g.
    /// `REQ-CLI-00001` (at least one, at most 256). Each must be active on the default branch
    /// when the bug is first materialized. Changing the list after materialization is
    /// refused (`Valid=False`, `FactsChanged`): report other requirements under
    /// another bug ID.
    #[schemars(length(min = 1, max = IMPACT_REQUIREMENTS_LIMIT))]
    #[schemars(inner(regex(pattern = REQUIREMENT_ID_PATTERN)))]
    pub violated_requirements: Vec<String>,
    /// Scopes where the bug shows (e.g. `cli`); they narrow impact analysis and keep
    /// overlapping work apart in dispatch. Optional, at most 64. Changing them after
    /// materialization is refused like `violatedRequirements`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = SCOPES_LIMIT))]
    #[schemars(inner(length(min = 1, max = 253)))]
    pub affected_scopes: Vec<String>,
    /// Business priority (`low`, `normal`, `high`, `urgent`) given to the work item; absent
    /// means `normal`. The value at materialization is the item's priority snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub business_priority: Option<BusinessPriority>,
    /// One-line human summary of the bug, for people reading the object; it does not enter
    /// the build contract. At most 1024 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = SUMMARY_MAX_LENGTH))]
    pub summary: Option<String>,
}

/// What became of a bug report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BugReportStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The `BuildWorkItem` materialized for this bug; absent until it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_item_ref: Option<LocalRef>,
    /// The facts the bug was materialized from, recorded before the work item is created.
    /// They are the bug's durable registration: the Job Site rebuilds the build contract
    /// from them, and a later reconcile reuses them instead of reading the (moved) default
    /// branch again. Never edit them by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_facts: Option<RecordedBugFacts>,
    /// Summary of the impact analysis at the recorded spec commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impact: Option<ImpactSummary>,
    /// Conditions `Valid` (the spec is well formed and every violated requirement is active
    /// on the default branch), `Materialized` (the work item exists), and the summary `Ready`
    /// and `Stalled` that GitOps tools read (docs/gitops.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The facts of a true-bug intake, as read once at the head of the default branch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecordedBugFacts {
    /// The default-branch commit (40 hex digits) the facts were read at; the build contract
    /// is bound to it.
    #[schemars(regex(pattern = GIT_COMMIT_PATTERN))]
    pub spec_commit: String,
    /// Stable identity of the logical work item, `<project>/bug:<bugId>@<specCommit>`.
    #[schemars(length(min = 1))]
    pub materialization_key: String,
    /// The work-item ID the facts materialize as.
    #[schemars(length(min = 1))]
    pub work_item_id: String,
    /// The violated requirement IDs, sorted and without duplicates.
    #[schemars(length(min = 1, max = IMPACT_REQUIREMENTS_LIMIT))]
    pub violated_requirements: Vec<String>,
    /// The affected scopes, sorted and without duplicates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = SCOPES_LIMIT))]
    pub affected_scopes: Vec<String>,
    /// The business priority snapshot (`low`, `normal`, `high`, `urgent`; empty for none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub priority: String,
    /// Impact candidates of the violated requirements at the spec commit; a true bug marks
    /// every one applicable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = IMPACT_REQUIREMENTS_LIMIT))]
    pub impact: Vec<RecordedImpact>,
    /// Test-catalog files that verify a violated requirement (the paths the build is
    /// expected to touch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = IMPACT_REQUIREMENTS_LIMIT))]
    pub touched_paths: Vec<String>,
}

/// One impact candidate of a bug (always applicable).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecordedImpact {
    /// The candidate requirement's ID.
    #[schemars(length(min = 1))]
    pub requirement_id: String,
    /// Why it is a candidate, as impact analysis wrote it; may be empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rationale: String,
}
