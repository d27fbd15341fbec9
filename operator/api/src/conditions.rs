//! Kubernetes-style status conditions: the shared [`Condition`] type, the closed sets of
//! condition types ([`types`]) and reasons ([`reasons`]), and [`set_condition`], the one pure
//! function that merges a freshly computed condition into a status.
//!
//! Controllers never build a [`Condition`] by hand: they compute a [`ConditionUpdate`] (what
//! the condition says now) in a pure function and let [`set_condition`] decide the
//! bookkeeping. `lastTransitionTime` is kept when the status did not change, so a condition
//! recomputed on every reconcile does not look like a new transition; the time is passed in,
//! never read from a clock, so every rule here is testable.

use std::fmt;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Condition types used by the protobot kinds. One condition of each type at most per object.
pub mod types {
    /// `BuildWorkItem`: a Job Site holds a live lease (mirrors `status.lease`).
    pub const LEASED: &str = "Leased";
    /// `BuildWorkItem`: the item is `blocked`; the message carries the block reason.
    pub const BLOCKED: &str = "Blocked";
    /// `ChangeSet`: the merge commit exists on the default branch and its manifest is valid.
    pub const VERIFIED: &str = "Verified";
    /// `ChangeSet`: the change set was materialized into a work item or an omitted reservation.
    pub const MATERIALIZED: &str = "Materialized";
    /// `BugReport`: the spec is well formed and every violated requirement is active on the
    /// default branch.
    pub const VALID: &str = "Valid";
    /// `Project`: the repository answered with the default branch.
    pub const REPO_REACHABLE: &str = "RepoReachable";
    /// `Project`: `<specPath>/project.yaml` parsed and validated at the observed head.
    pub const PROJECT_CONFIG_VALID: &str = "ProjectConfigValid";
    /// `Project`: the sandbox profile's conformance report passed.
    pub const SANDBOX_CONFORMANT: &str = "SandboxConformant";
    /// Every kind but `BuildWorkItem` (whose `status.state` says it): the object reached what
    /// its spec asks for. `Project`: the three checks above hold and the Job Site may schedule
    /// work; `ChangeSet`, `BugReport`: verified (valid) and materialized; `InspectionRun`:
    /// sealed. Flux's kstatus reads `Ready=True` as `Current`; the Argo CD health checks in
    /// `charts/protobot/health/` as `Healthy` (docs/gitops.md).
    pub const READY: &str = "Ready";
    /// `Project`, `ChangeSet`, `BugReport`, `InspectionRun`: the controller stopped: nothing
    /// changes until someone fixes the object, its repository or what it names; the reason and
    /// message say what. kstatus reads `Stalled=True` as `Failed`, Argo CD as `Degraded`.
    /// `False` while the object progresses or is ready.
    pub const STALLED: &str = "Stalled";
    /// `BuildWorkItem`: landing through the forge waits for the required status checks of
    /// the tested head to report (`True` while it waits; the message names the checks and the
    /// deadline). Not a lifecycle state: the item stays `merging`.
    pub const AWAITING_CHECKS: &str = "AwaitingChecks";
    /// `InspectionRun`: every required producer reported.
    pub const PRODUCERS_COMPLETE: &str = "ProducersComplete";
    /// `InspectionRun`: the finding ledger was sealed at a high watermark.
    pub const SEALED: &str = "Sealed";
}

/// Condition reasons: CamelCase, stable, usable as Event reasons and metric labels.
pub mod reasons {
    /// `Leased=True`: the lease is live at the evaluation time.
    pub const LEASE_HELD: &str = "LeaseHeld";
    /// `Leased=False`: a lease is recorded but its expiry is at or before the evaluation time.
    pub const LEASE_EXPIRED: &str = "LeaseExpired";
    /// `Leased=False`: no lease is recorded.
    pub const NOT_LEASED: &str = "NotLeased";

    /// `Blocked=True`: the item waits for a spec, impact, policy or reconciliation decision.
    pub const BLOCK_RECORDED: &str = "BlockRecorded";
    /// `Blocked=False`: the item is not blocked.
    pub const NOT_BLOCKED: &str = "NotBlocked";

    /// `Verified=True`: merge commit found on the default branch with a valid manifest.
    pub const MERGE_COMMIT_VERIFIED: &str = "MergeCommitVerified";
    /// `Verified=False`: the merge commit is not (yet) on the default branch.
    pub const MERGE_COMMIT_NOT_FOUND: &str = "MergeCommitNotFound";
    /// `Verified=False`: the change-set manifest at the merge commit is missing or invalid.
    pub const MANIFEST_INVALID: &str = "ManifestInvalid";
    /// The ChangeSet names a Project that does not exist.
    pub const PROJECT_NOT_FOUND: &str = "ProjectNotFound";
    /// The Project's repository cannot be read (unsupported location or I/O failure).
    pub const REPOSITORY_UNAVAILABLE: &str = "RepositoryUnavailable";

    /// `Valid=True` (`BugReport`): every violated requirement is active; the facts are recorded.
    pub const REQUIREMENTS_ACTIVE: &str = "RequirementsActive";
    /// `Valid=False` (`BugReport`): a violated requirement is not active on the default branch.
    pub const UNKNOWN_REQUIREMENT: &str = "UnknownRequirement";
    /// `Valid=False` (`BugReport`): the spec is malformed; the message names the field.
    pub const SPEC_INVALID: &str = "SpecInvalid";
    /// `Valid=False` (`BugReport`): the spec no longer matches the facts the bug was
    /// materialized from; report the new facts under another bug ID.
    pub const FACTS_CHANGED: &str = "FactsChanged";

    /// `Materialized=True`: a `BuildWorkItem` was created (or returned) for the change set.
    pub const WORK_ITEM_CREATED: &str = "WorkItemCreated";
    /// `Materialized=True`: no implementation is required; only a reservation was kept.
    pub const OMITTED: &str = "Omitted";
    /// `Materialized=False`: the key is bound to a different source fingerprint.
    pub const SOURCE_CONFLICT: &str = "SourceConflict";
    /// `Materialized=False`/`Unknown`: materialization has not run yet.
    pub const PENDING: &str = "Pending";

    /// Generic `True` reason for a check that passed.
    pub const PASSED: &str = "Passed";
    /// Generic `False` reason for a check that failed; the message says which one.
    pub const FAILED: &str = "Failed";
    /// Generic `Unknown` reason: the check could not be run; the message says why.
    pub const CHECK_ERROR: &str = "CheckError";

    /// `Sealed=True`: the ledger was sealed.
    pub const SEALED: &str = "Sealed";
    /// `Sealed=False` / `ProducersComplete=False`: producers are still reporting.
    pub const COLLECTING: &str = "Collecting";
    /// `Sealed=False`, `Stalled=True` (`InspectionRun`): every producer reported and the ledger
    /// was not sealed: findings sent the candidate back, or need a person.
    pub const UNSEALED: &str = "Unsealed";

    /// `Stalled=False`: the object is progressing or ready.
    pub const NOT_STALLED: &str = "NotStalled";

    /// `AwaitingChecks=True`: the forge refused the merge until required checks report on the
    /// tested head.
    pub const REQUIRED_CHECKS_PENDING: &str = "RequiredChecksPending";
    /// `AwaitingChecks=False`: the landing does not wait for checks (any more).
    pub const NOT_AWAITING_CHECKS: &str = "NotAwaitingChecks";
}

/// Where an object stands, as its summary conditions `Ready` and `Stalled` say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Reached what the spec asks for: `Ready=True`, `Stalled=False`.
    Ready,
    /// Still moving (or waiting for something that arrives by itself): `Ready=False`,
    /// `Stalled=False`.
    Progressing,
    /// Stopped until someone acts: `Ready=False`, `Stalled=True`.
    Stalled,
}

/// The `Ready` and `Stalled` updates that say `health`, with the reason and message of the
/// condition that decided it (so `kubectl get`'s `Reason` column names the cause).
pub fn summary(
    health: Health,
    reason: &'static str,
    message: impl Into<String>,
) -> [ConditionUpdate; 2] {
    let message = message.into();
    let not_stalled = |m: &str| {
        ConditionUpdate::new(
            types::STALLED,
            ConditionStatus::False,
            reasons::NOT_STALLED,
            m,
        )
    };
    match health {
        Health::Ready => [
            ConditionUpdate::new(types::READY, ConditionStatus::True, reason, message),
            not_stalled(""),
        ],
        Health::Progressing => [
            ConditionUpdate::new(
                types::READY,
                ConditionStatus::False,
                reason,
                message.clone(),
            ),
            not_stalled(&message),
        ],
        Health::Stalled => [
            ConditionUpdate::new(
                types::READY,
                ConditionStatus::False,
                reason,
                message.clone(),
            ),
            ConditionUpdate::new(types::STALLED, ConditionStatus::True, reason, message),
        ],
    }
}

/// The status of a condition, as in every Kubernetes API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = crate::common::without_description)]
pub enum ConditionStatus {
    /// The condition holds.
    #[serde(rename = "True")]
    True,
    /// The condition does not hold.
    #[serde(rename = "False")]
    False,
    /// The controller cannot tell.
    #[serde(rename = "Unknown")]
    Unknown,
}

impl ConditionStatus {
    /// The wire spelling (`True`, `False`, `Unknown`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl From<bool> for ConditionStatus {
    fn from(value: bool) -> Self {
        if value { Self::True } else { Self::False }
    }
}

impl fmt::Display for ConditionStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One observation about an object, in the Kubernetes condition convention
/// (the same fields as `metav1.Condition`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type in CamelCase, e.g. `Leased`, `Verified`. At most one condition per type.
    #[serde(rename = "type")]
    #[schemars(length(min = 1, max = 316))]
    pub type_: String,
    /// Whether the condition holds: `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// Machine-readable CamelCase reason for the last change, e.g. `LeaseExpired`.
    #[schemars(length(min = 1, max = 1024), regex(pattern = REASON_PATTERN))]
    pub reason: String,
    /// Human-readable detail about the last change; may be empty.
    #[schemars(length(max = 32768))]
    pub message: String,
    /// When `status` last changed. Recomputing a condition with the same status keeps it.
    pub last_transition_time: Time,
    /// The `metadata.generation` the condition was computed from; older than the object's
    /// generation means the condition may be stale.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
}

/// Pattern of a condition reason, the same as `metav1.Condition.reason`.
pub const REASON_PATTERN: &str = "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$";

/// What a pure condition computation decided; [`set_condition`] turns it into a
/// [`Condition`]. Type and reason are `'static` so that they come from [`types`] and
/// [`reasons`], not from ad-hoc strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConditionUpdate {
    /// The condition type, one of [`types`].
    pub type_: &'static str,
    /// The new status.
    pub status: ConditionStatus,
    /// The reason, one of [`reasons`].
    pub reason: &'static str,
    /// The human-readable message.
    pub message: String,
}

impl ConditionUpdate {
    /// A condition update of `type_` with the given status, reason and message.
    pub fn new(
        type_: &'static str,
        status: ConditionStatus,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// Merges `update` into `conditions` (keyed by type) and reports whether anything changed.
///
/// * A new type is appended with `lastTransitionTime = now`.
/// * An existing type keeps its `lastTransitionTime` when the status is unchanged, and gets
///   `now` when the status changed; reason, message and `observedGeneration` are always
///   overwritten.
/// * The order of the other conditions is preserved, so the output is deterministic.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    update: ConditionUpdate,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let ConditionUpdate {
        type_,
        status,
        reason,
        message,
    } = update;
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            let last_transition_time = if existing.status == status {
                existing.last_transition_time.clone()
            } else {
                Time(now)
            };
            let merged = Condition {
                type_: type_.to_owned(),
                status,
                reason: reason.to_owned(),
                message,
                last_transition_time,
                observed_generation,
            };
            let changed = *existing != merged;
            *existing = merged;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_owned(),
                status,
                reason: reason.to_owned(),
                message,
                last_transition_time: Time(now),
                observed_generation,
            });
            true
        }
    }
}

/// The condition of `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find_condition(conditions, type_).is_some_and(|c| c.status == ConditionStatus::True)
}
