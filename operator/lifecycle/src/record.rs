//! The work-item record (WMS-owned, backend-neutral) in its §4.1 wire shape, and
//! the materialization source contract a `materialize` payload carries.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::{
    fence::{FenceStatus, FencingToken},
    vocab::State,
};

/// Change types a work item may carry.
pub const CHANGE_TYPES: [&str; 3] = ["undefined", "changes", "contradicts"];

/// An execution lease. Lease time comes from the trusted evaluation clock only.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    /// The trusted subject that holds the lease.
    pub owner: String,
    /// Opaque token minted by the WMS; every side effect presents it.
    pub fencing_token: FencingToken,
    /// The lease is live while `now < expires_at`.
    #[serde(with = "crate::strict::timestamp")]
    #[cfg_attr(feature = "schemars", schemars(with = "String"))]
    pub expires_at: Timestamp,
}

impl Lease {
    /// A lease is live strictly before its expiry.
    pub fn is_live(&self, now: Timestamp) -> bool {
        now < self.expires_at
    }

    /// The one fence check: whether `token` is this lease's fence. Every fenced
    /// write presents its token here: the evaluator's Job Site commands (through
    /// [`Lease::refusal`]) and the store's fenced observations. The empty token
    /// (none presented) is never admitted.
    pub fn admits(&self, token: &FencingToken) -> bool {
        !token.is_empty() && *token == self.fencing_token
    }

    /// Why this lease refuses `holder` presenting `token` at `now` (§6, checked in
    /// the contract's order: expiry, owner, token), `None` when the fence is live.
    pub fn refusal(
        &self,
        holder: &str,
        token: &FencingToken,
        now: Timestamp,
    ) -> Option<FenceStatus> {
        if !self.is_live(now) {
            Some(FenceStatus::Expired)
        } else if self.owner != holder {
            Some(FenceStatus::OwnerMismatch)
        } else if !self.admits(token) {
            Some(FenceStatus::Stale)
        } else {
            None
        }
    }
}

/// A build-work dependency with its state as the WMS observed it.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dependency {
    /// The dependency's work-item id (an empty id can never be satisfied).
    #[serde(default)]
    pub id: String,
    /// Observed state; `initial` when the WMS cannot see the record.
    #[serde(default = "initial_state")]
    pub state: State,
}

fn initial_state() -> State {
    State::Initial
}

/// Readiness flags: five contract-level flags, two blocker flags and open reasons.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Readiness {
    /// The contract has every required part.
    pub contract_complete: bool,
    /// The source commit is immutable (merged).
    pub source_immutable: bool,
    /// The specification validated.
    pub specification_validated: bool,
    /// Every requirement reference resolves.
    pub requirement_references_valid: bool,
    /// The pipeline entry criteria are met.
    pub pipeline_entry_satisfied: bool,
    /// Every impacted artifact has a disposition.
    pub impact_dispositioned: bool,
    /// Project policy accepts the change.
    pub policy_compatible: bool,
    /// Human-readable reasons that keep the item from being built.
    pub unresolved_reasons: Vec<String>,
}

impl Readiness {
    /// Every flag true and no unresolved reason.
    pub fn complete() -> Readiness {
        Readiness {
            contract_complete: true,
            source_immutable: true,
            specification_validated: true,
            requirement_references_valid: true,
            pipeline_entry_satisfied: true,
            impact_dispositioned: true,
            policy_compatible: true,
            unresolved_reasons: Vec::new(),
        }
    }

    /// The first failing contract-level flag, if any.
    pub fn contract_failure(&self) -> Option<&'static str> {
        [
            (self.contract_complete, "contract_complete"),
            (self.source_immutable, "source_immutable"),
            (self.specification_validated, "specification_validated"),
            (
                self.requirement_references_valid,
                "requirement_references_valid",
            ),
            (self.pipeline_entry_satisfied, "pipeline_entry_satisfied"),
        ]
        .into_iter()
        .find(|(ok, _)| !ok)
        .map(|(_, name)| name)
    }

    /// The first blocker, as a block reason.
    pub fn blocker(&self) -> Option<String> {
        if !self.impact_dispositioned {
            return Some("impact_dispositioned: impact is not dispositioned".to_string());
        }
        if !self.policy_compatible {
            return Some("policy_compatible: policy is not compatible".to_string());
        }
        self.unresolved_reasons
            .iter()
            .find(|r| !r.trim().is_empty())
            .cloned()
    }
}

/// The tested-candidate merge envelope.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MergeEnvelope {
    /// Digest of every path that can affect build, execution or packaging.
    pub product_tree_digest: String,
    /// The sealed inspection run.
    pub inspection_run_id: String,
    /// The tested integration head.
    pub integration_head: String,
    /// The branch the merge lands on.
    pub target: String,
    /// The contract version the merge completes under.
    pub contract_version: u64,
    /// The merge commit (only in completion evidence).
    pub merge_commit: String,
}

/// The field of a merge envelope that names a ref (§3 item 7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RefField {
    /// `target`: the branch the merge lands on.
    Target,
    /// `integration_head`: the tested integration commit.
    IntegrationHead,
    /// `merge_commit`: the merge commit.
    MergeCommit,
    /// `inspection_run_id`: the sealed inspection run.
    InspectionRunId,
}

impl RefField {
    /// The field's name in the envelope.
    pub fn as_str(self) -> &'static str {
        match self {
            RefField::Target => "target",
            RefField::IntegrationHead => "integration_head",
            RefField::MergeCommit => "merge_commit",
            RefField::InspectionRunId => "inspection_run_id",
        }
    }
}

/// One ref a payload names, with the field that names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedRef {
    /// The field.
    pub field: RefField,
    /// The ref as written.
    pub name: String,
}

impl MergeEnvelope {
    /// Non-empty refs this envelope names, with their fields.
    pub fn named_refs(&self) -> Vec<NamedRef> {
        [
            (RefField::Target, &self.target),
            (RefField::IntegrationHead, &self.integration_head),
            (RefField::MergeCommit, &self.merge_commit),
            (RefField::InspectionRunId, &self.inspection_run_id),
        ]
        .into_iter()
        .filter(|(_, name)| !name.is_empty())
        .map(|(field, name)| NamedRef {
            field,
            name: name.clone(),
        })
        .collect()
    }

    /// Non-empty refs this envelope names, for the ref-subset check (§3.7).
    pub fn refs(&self) -> Vec<String> {
        self.named_refs().into_iter().map(|r| r.name).collect()
    }

    /// Whether it asserts any tested-candidate field beyond `target`.
    pub fn has_candidate_fields(&self) -> bool {
        !self.product_tree_digest.is_empty()
            || !self.inspection_run_id.is_empty()
            || !self.integration_head.is_empty()
            || !self.merge_commit.is_empty()
            || self.contract_version != 0
    }
}

/// Reconciliation evidence, written only by trusted WMS/Git observation.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Reconciliation {
    /// `conflict`, `not-applied`, `merge-recorded`, `lease-recovered`, `not-integrated`.
    pub status: String,
    /// `none`, `conflict`, `merged`.
    pub git_mutation: String,
    /// Required for `merge-recorded`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge_envelope: Option<MergeEnvelope>,
}

/// The work-item record (§4.1).
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkItemRecord {
    /// Work-item id.
    pub id: String,
    /// Owning project.
    pub project_id: String,
    /// Lifecycle state (never `initial`).
    pub state: State,
    /// Bumped by exactly one on every allowed transition.
    pub contract_version: u64,
    /// Stable identity of the logical item.
    #[serde(default)]
    pub materialization_key: String,
    /// `undefined`, `changes` or `contradicts`.
    #[serde(default)]
    pub change_type: String,
    /// False only for omitted reservations (never stored as a record).
    #[serde(default = "yes")]
    pub implementation_required: bool,
    /// Snapshot of the human business priority.
    #[serde(default)]
    pub priority: String,
    /// Current lease owner (empty when unleased).
    #[serde(default)]
    pub owner: String,
    /// The execution lease, if any.
    #[serde(default)]
    pub lease: Option<Lease>,
    /// Build-work dependencies with observed states.
    #[serde(default)]
    pub dependencies: Vec<Dependency>,
    /// Readiness as last refreshed.
    #[serde(default)]
    pub readiness: Readiness,
    /// Why the item is blocked.
    #[serde(default)]
    pub block_reason: String,
    /// The single active blocked-work submission.
    #[serde(default)]
    pub active_resolution_submission_id: String,
    /// WMS-observed: the inspection run sealed.
    #[serde(default)]
    pub inspection_run_sealed: bool,
    /// WMS-observed: every finding terminal.
    #[serde(default)]
    pub findings_terminal: bool,
    /// WMS-observed: final tests passed.
    #[serde(default)]
    pub final_tests_passed: bool,
    /// The merge the item will complete with (`target` from materialization,
    /// the full candidate from `begin-merge`).
    #[serde(default)]
    pub expected_merge: Option<MergeEnvelope>,
    /// Reconciliation evidence (trusted observation only).
    #[serde(default)]
    pub reconciliation: Option<Reconciliation>,
    /// The Job Site's build attempts, oldest first (at most [`ATTEMPTS_KEPT`]): a
    /// restarted Job Site replays them to resume at the right cycle and model tier.
    /// Written only by a fenced trusted observation; never part of a command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptRecord>,
    /// What the item's sandboxed runs spent on model calls, read back from the egress
    /// proxy after each run (issue 34): bounded and idempotent by run id
    /// ([`protobot_usage::UsageLedger`]). Written only by a fenced trusted observation;
    /// never part of a command.
    #[serde(default, skip_serializing_if = "protobot_usage::UsageLedger::is_empty")]
    pub usage: protobot_usage::UsageLedger,
    /// When the item entered its current state (trusted clock): dispatch takes
    /// older ready items first. `None` on records written before it was kept.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::strict::timestamp_option"
    )]
    #[cfg_attr(feature = "schemars", schemars(with = "Option<String>"))]
    pub state_since: Option<Timestamp>,
}

/// Slug of the one integration branch a work item is built on: `wi/<id>-build`.
pub const BUILD_BRANCH_SLUG: &str = "build";

/// The integration branch of a work item, `wi/<id>-build` (without `refs/heads/`): the
/// Job Site builds and lands there, and the store names it in the item's status.
pub fn integration_branch(work_item_id: &str) -> String {
    format!("wi/{work_item_id}-{BUILD_BRANCH_SLUG}")
}

/// How many attempts a work item keeps (the oldest are dropped first).
pub const ATTEMPTS_KEPT: usize = 32;

/// One finished build or inspection attempt of a work item.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttemptRecord {
    /// Cycle number, from 1; a later attempt with the same number replaces it.
    pub cycle: u32,
    /// Model tier the Workers ran at (`t1`..`t4`).
    pub tier: String,
    /// `passed`, `test`, `implementation`, `both`, `rejected-inspection` or `transient`.
    pub outcome: String,
    /// The candidate commit the attempt produced or inspected.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub candidate_commit: String,
    /// Sanitized Worker feedback the next cycle starts from (already allowlisted).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub feedback: serde_json::Value,
    /// When the attempt started (trusted clock), when known.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::strict::timestamp_option"
    )]
    #[cfg_attr(feature = "schemars", schemars(with = "Option<String>"))]
    pub started_at: Option<Timestamp>,
    /// When the attempt ended (trusted clock).
    #[serde(with = "crate::strict::timestamp")]
    #[cfg_attr(feature = "schemars", schemars(with = "String"))]
    pub finished_at: Timestamp,
}

fn yes() -> bool {
    true
}

impl WorkItemRecord {
    /// A bare record in `state` at `version`, for tests and seeding.
    pub fn new(id: &str, project_id: &str, state: State, contract_version: u64) -> Self {
        WorkItemRecord {
            id: id.to_string(),
            project_id: project_id.to_string(),
            state,
            contract_version,
            materialization_key: String::new(),
            change_type: "undefined".to_string(),
            implementation_required: true,
            priority: String::new(),
            owner: String::new(),
            lease: None,
            dependencies: Vec::new(),
            readiness: Readiness::default(),
            block_reason: String::new(),
            active_resolution_submission_id: String::new(),
            inspection_run_sealed: false,
            findings_terminal: false,
            final_tests_passed: false,
            expected_merge: None,
            reconciliation: None,
            attempts: Vec::new(),
            usage: Default::default(),
            state_since: None,
        }
    }

    /// The live lease at `now`, if any.
    pub fn live_lease(&self, now: Timestamp) -> Option<&Lease> {
        self.lease.as_ref().filter(|l| l.is_live(now))
    }
}

/// The source contract a `materialize` payload carries (`payload.work_item`).
/// Mutable fields are accepted and discarded: the WMS owns them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SourceContract {
    /// Work-item identity (the materialize target).
    pub id: String,
    /// Project; empty means the trusted project.
    pub project_id: String,
    /// Discarded.
    pub state: Option<String>,
    /// Discarded.
    pub contract_version: Option<u64>,
    /// Fallback for the materialization key.
    pub materialization_key: String,
    /// Change type; the payload's `change_type` fills it in when empty.
    pub change_type: String,
    /// Absent means true.
    pub implementation_required: Option<bool>,
    /// Priority snapshot (not part of the source fingerprint).
    pub priority: String,
    /// Discarded.
    pub owner: Option<String>,
    /// Discarded.
    pub lease: Option<Lease>,
    /// Declared dependencies (states are re-observed by the WMS).
    pub dependencies: Vec<Dependency>,
    /// Readiness as assessed by the Materializer.
    pub readiness: Readiness,
    /// Discarded.
    pub block_reason: Option<String>,
    /// Discarded.
    pub active_resolution_submission_id: Option<String>,
    /// Discarded (never authority).
    pub inspection_run_sealed: Option<bool>,
    /// Discarded (never authority).
    pub findings_terminal: Option<bool>,
    /// Discarded (never authority).
    pub final_tests_passed: Option<bool>,
    /// Only `target` may be named.
    pub expected_merge: Option<MergeEnvelope>,
    /// Discarded (never authority).
    pub reconciliation: Option<Reconciliation>,
}
