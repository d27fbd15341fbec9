//! Small value types shared by several kinds: references, closed vocabularies
//! (lifecycle states and commands, change types, business priorities, model tiers)
//! and the validation patterns that the generated schemas enforce.
//!
//! The spellings are the wire spellings of `contracts/lifecycle.md` §1 and §4.1; each enum
//! renames every variant explicitly so that a Rust rename can never change the API.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Pattern of a full Git commit id: 40 lower-case hex digits (SHA-1 object format).
pub const GIT_COMMIT_PATTERN: &str = "^[0-9a-f]{40}$";

/// Pattern of a change-set ID: `CS-` and at least five digits, e.g. `CS-00042`.
pub const CHANGE_SET_ID_PATTERN: &str = "^CS-[0-9]{5,}$";

/// A reference to another object of a known kind in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalRef {
    /// Name of the referenced object; it lives in the same namespace as the referring object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

impl LocalRef {
    /// A reference to the object called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

/// The human business priority of a change set or work item: the first dispatch criterion,
/// ahead of dependencies, age and the WIP limit.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[schemars(transform = crate::common::without_description)]
pub enum BusinessPriority {
    /// Dispatched after every other priority.
    #[serde(rename = "low")]
    Low,
    /// The default when nobody has set a priority.
    #[default]
    #[serde(rename = "normal")]
    Normal,
    /// Dispatched before `normal` and `low`.
    #[serde(rename = "high")]
    High,
    /// Dispatched first.
    #[serde(rename = "urgent")]
    Urgent,
}

impl BusinessPriority {
    /// The wire spelling (`low`, `normal`, `high`, `urgent`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Normal => "normal",
            Self::High => "high",
            Self::Urgent => "urgent",
        }
    }
}

impl fmt::Display for BusinessPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of change a work item implements (`contracts/lifecycle.md` §4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::common::without_description)]
pub enum ChangeType {
    /// An approved change set that adds requirements, with reviewed impact.
    #[serde(rename = "undefined")]
    Undefined,
    /// Revised or retired requirements, with reviewed impact.
    #[serde(rename = "changes")]
    Changes,
    /// A true bug: no spec change; the violated requirement IDs and scope are given.
    #[serde(rename = "contradicts")]
    Contradicts,
}

impl ChangeType {
    /// The wire spelling (`undefined`, `changes`, `contradicts`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Undefined => "undefined",
            Self::Changes => "changes",
            Self::Contradicts => "contradicts",
        }
    }
}

impl fmt::Display for ChangeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One of the eight persisted work-item lifecycle states of `validation-rules/v1`
/// (`contracts/lifecycle.md` §1.1). The input-only pseudo-values `initial` and `omitted` are
/// never stored and therefore are not variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::common::without_description)]
pub enum LifecycleState {
    /// The full contract exists; at least one build-work dependency is not finished.
    #[serde(rename = "waiting")]
    Waiting,
    /// Contract complete, impact dispositioned, dependencies done: claimable.
    #[serde(rename = "ready-for-building")]
    ReadyForBuilding,
    /// One Job Site holds a live lease and is producing the change.
    #[serde(rename = "building")]
    Building,
    /// The candidate passed the building test gate; independent inspection is running.
    #[serde(rename = "inspecting")]
    Inspecting,
    /// Needs a spec, impact, policy or reconciliation decision; no lease.
    #[serde(rename = "blocked")]
    Blocked,
    /// The tested candidate is being merged and reconciled under the merge fence.
    #[serde(rename = "merging")]
    Merging,
    /// Terminal: merge commit and completion evidence recorded.
    #[serde(rename = "completed")]
    Completed,
    /// Terminal: cancelled and shown never to have integrated anything into Git.
    #[serde(rename = "abandoned")]
    Abandoned,
}

impl LifecycleState {
    /// Every persisted state, in the order of the contract's table.
    pub const ALL: [Self; 8] = [
        Self::Waiting,
        Self::ReadyForBuilding,
        Self::Building,
        Self::Inspecting,
        Self::Blocked,
        Self::Merging,
        Self::Completed,
        Self::Abandoned,
    ];

    /// The wire spelling, e.g. `ready-for-building`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::ReadyForBuilding => "ready-for-building",
            Self::Building => "building",
            Self::Inspecting => "inspecting",
            Self::Blocked => "blocked",
            Self::Merging => "merging",
            Self::Completed => "completed",
            Self::Abandoned => "abandoned",
        }
    }

    /// Whether the state is terminal (`completed` or `abandoned`).
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Abandoned)
    }

    /// Whether the contract requires a live lease in this state (`building`, `inspecting`,
    /// and `merging`, whose lease is the merge fence).
    pub const fn holds_lease(self) -> bool {
        matches!(self, Self::Building | Self::Inspecting | Self::Merging)
    }
}

impl fmt::Display for LifecycleState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One of the sixteen lifecycle commands of `validation-rules/v1`
/// (`contracts/lifecycle.md` §1.2), as recorded in a work item's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::common::without_description)]
pub enum LifecycleCommand {
    /// Create the record from an approved source contract (materializer).
    #[serde(rename = "materialize")]
    Materialize,
    /// `waiting` → `ready-for-building` once every dependency is completed (materializer).
    #[serde(rename = "refresh-dependencies")]
    RefreshDependencies,
    /// `waiting`/`ready-for-building` → `blocked` when a refresh finds a blocker (materializer).
    #[serde(rename = "revalidate")]
    Revalidate,
    /// `blocked` → `ready-for-building` under an approved resolution (materializer).
    #[serde(rename = "resolve-block")]
    ResolveBlock,
    /// `ready-for-building` → `building`; issues the lease and fencing token (Job Site).
    #[serde(rename = "claim")]
    Claim,
    /// Extend the live lease; the token is unchanged (Job Site).
    #[serde(rename = "renew-lease")]
    RenewLease,
    /// `building` → `inspecting` after the build test gate passed (Job Site).
    #[serde(rename = "tests-pass")]
    TestsPass,
    /// `building`/`inspecting` → `blocked` with a spec question (Job Site).
    #[serde(rename = "raise-spec-question")]
    RaiseSpecQuestion,
    /// Refresh an active item: back to `building` with a new token, or `blocked` (Job Site).
    #[serde(rename = "refresh-active")]
    RefreshActive,
    /// `inspecting` → `building` on an in-contract defect or failed final tests (Job Site).
    #[serde(rename = "return-to-building")]
    ReturnToBuilding,
    /// `inspecting` → `merging` with the tested-candidate envelope (Job Site).
    #[serde(rename = "begin-merge")]
    BeginMerge,
    /// `merging` → `building` (Job Site) or `ready-for-building` (reconciler).
    #[serde(rename = "merge-conflict")]
    MergeConflict,
    /// `merging` → `ready-for-building` when Git shows nothing was merged (reconciler).
    #[serde(rename = "merge-not-applied")]
    MergeNotApplied,
    /// `merging` → `completed` with a matching merge envelope (Job Site or reconciler).
    #[serde(rename = "record-merge")]
    RecordMerge,
    /// `building`/`inspecting` → `ready-for-building` after the lease expired (reconciler).
    #[serde(rename = "recover-lease")]
    RecoverLease,
    /// Any non-terminal state except `merging` → `abandoned` (human maintainer).
    #[serde(rename = "abandon")]
    Abandon,
}

/// A model tier of a WorkerClass; escalation moves from `t1` (cheapest) towards `t4`
/// on genuine failures only, never on transient ones.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[schemars(transform = crate::common::without_description)]
pub enum ModelTier {
    /// The cheapest tier.
    #[serde(rename = "t1")]
    T1,
    /// The second tier.
    #[serde(rename = "t2")]
    T2,
    /// The third tier.
    #[serde(rename = "t3")]
    T3,
    /// The strongest tier; escalation stays here.
    #[serde(rename = "t4")]
    T4,
}

/// Schema transform for the closed enums: drops the type's own description so that the
/// field's doc comment is what `kubectl explain` shows. Without it an `Option<Enum>` field
/// would show the enum's description, because the structural-schema rewrite hoists the
/// enum's schema over the field's.
pub(crate) fn without_description(schema: &mut schemars::Schema) {
    schema.remove("description");
}

/// Rewrites the integer formats schemars derives for unsigned Rust integers (`uint8`,
/// `uint16`, `uint32`, `uint64`, `uint`) to the two OpenAPI knows, `int32` and `int64`, in
/// `schema` and every schema under it. kube-apiserver warns about (and ignores) any other
/// integer format on every apply of the CRD; the bounds of the Rust type stay as `minimum`
/// and `maximum`, so the API server still refuses what the type cannot hold.
pub fn kube_integer_formats(
    schema: &mut k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps,
) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
    };
    if schema.type_.as_deref() == Some("integer") {
        let (format, max) = match schema.format.as_deref() {
            Some("uint8") => (Some("int32"), Some(f64::from(u8::MAX))),
            Some("uint16") => (Some("int32"), Some(f64::from(u16::MAX))),
            Some("uint32") => (Some("int64"), Some(f64::from(u32::MAX))),
            // Kubernetes' JSON numbers are int64 at most: that is the real bound.
            Some("uint64" | "uint") => (Some("int64"), None),
            _ => (None, None),
        };
        if let Some(format) = format {
            schema.format = Some(format.to_owned());
            let min = schema.minimum.map_or(0.0, |m| m.max(0.0));
            schema.minimum = Some(min);
            if let Some(max) = max {
                schema.maximum = Some(schema.maximum.map_or(max, |m| m.min(max)));
            }
        }
    }
    for child in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        kube_integer_formats(child);
    }
    match schema.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(s)) => kube_integer_formats(s),
        Some(JSONSchemaPropsOrArray::Schemas(list)) => {
            list.iter_mut().for_each(kube_integer_formats)
        }
        None => {}
    }
    if let Some(JSONSchemaPropsOrBool::Schema(s)) = schema.additional_properties.as_mut() {
        kube_integer_formats(s);
    }
    for list in [&mut schema.all_of, &mut schema.any_of, &mut schema.one_of] {
        list.iter_mut().flatten().for_each(kube_integer_formats);
    }
    if let Some(not) = schema.not.as_mut() {
        kube_integer_formats(not);
    }
}
