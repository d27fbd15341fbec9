//! The Materializer's pure core: from an approved change set (or a true-bug
//! intake) to one complete, versioned build contract and the `materialize`
//! command that creates its work item.
//!
//! The shell reads the manifest at the merge commit through the spec store,
//! reruns impact and `check`, verifies `approved_merge`, resolves dependencies
//! against the WMS, and hands the facts here. Identity is deterministic: the
//! materialization key is `<project>/<change set>@<merge commit>` and the work
//! item id derives from it, so re-registering the same merge returns the same
//! item (create-or-return) while a new merge of the same change set is a new
//! logical item.

use std::collections::BTreeSet;

use protobot_lifecycle::{
    Command, CommandRequest, Dependency, LifecyclePayload, OperationEnvelope, Readiness,
    SourceContract, State,
};
use serde::{Deserialize, Serialize};

/// A requirement operation of the manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// New requirement.
    Add,
    /// Changed requirement.
    Revise,
    /// Retired requirement.
    Retire,
}

/// Reviewed impact disposition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Disposition {
    /// A delivery obligation.
    Applicable,
    /// Recorded with its rationale; no obligation.
    NotApplicable,
}

/// One impact assessment entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImpactEntry {
    /// Requirement.
    pub requirement_id: String,
    /// Disposition.
    pub disposition: Disposition,
    /// Why.
    pub rationale: String,
}

/// Assessment status from the rerun of impact analysis at the merge commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AssessmentStatus {
    /// Every candidate has a final entry against the current base.
    Complete,
    /// Entries are missing or malformed.
    Incomplete,
    /// The assessment was reviewed against another base or candidates moved.
    Stale,
}

/// What the Materializer learned about an approved change set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeSetFacts {
    /// Project.
    pub project_id: String,
    /// `CS-NNNNN`.
    pub change_set_id: String,
    /// The merge commit on the default branch (the spec commit).
    pub merge_commit: String,
    /// Requirement operations.
    pub operations: Vec<(Action, String)>,
    /// Interfaces the change touches.
    pub affected_interfaces: Vec<String>,
    /// Scopes the change touches.
    pub affected_scopes: Vec<String>,
    /// False: the change needs no implementation (omitted reservation).
    pub implementation_required: bool,
    /// Reviewed impact.
    pub impact: Vec<ImpactEntry>,
    /// Impact rerun at the merge commit.
    pub assessment_status: AssessmentStatus,
    /// `approved_merge` verified the merge commit is on the default branch.
    pub merged_on_default_branch: bool,
    /// `check` diagnostics at the merge commit (empty: valid).
    pub check_errors: Vec<String>,
    /// Requirement references that do not resolve.
    pub unresolved_references: Vec<String>,
    /// Build work items this one depends on.
    pub depends_on: Vec<String>,
    /// Business priority snapshot.
    pub priority: String,
    /// Test-catalog files verifying the changed requirements (at the merge commit).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub touched_paths: Vec<String>,
}

/// A true bug: violated requirements, no spec change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BugFacts {
    /// Project.
    pub project_id: String,
    /// Stable bug identity (tracker id).
    pub bug_id: String,
    /// The spec commit the bug is judged against.
    pub spec_commit: String,
    /// Requirements the current behaviour violates.
    pub violated_requirement_ids: Vec<String>,
    /// Where it shows.
    pub scopes: Vec<String>,
    /// Business priority snapshot.
    pub priority: String,
    /// Impact candidates of the violated requirements at the spec commit, all
    /// conservatively `applicable` (excluding one takes a reviewed change set).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub impact: Vec<ImpactEntry>,
    /// Test-catalog files verifying the violated requirements (at the spec commit).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub touched_paths: Vec<String>,
}

/// How work enters the Job Site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Intake {
    /// An approved, merged change set.
    ChangeSet(ChangeSetFacts),
    /// A true-bug intake (`change_type: contradicts`).
    Bug(BugFacts),
}

/// The complete, versioned build contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildContract {
    /// Deterministic work-item id (a valid Kubernetes object name).
    pub work_item_id: String,
    /// Stable identity of the logical item.
    pub materialization_key: String,
    /// The spec commit the contract is bound to.
    pub spec_commit: String,
    /// `undefined`, `changes` or `contradicts`.
    pub change_type: String,
    /// Requirements added or revised (or violated, for a bug).
    pub changed_requirement_ids: Vec<String>,
    /// Retired requirements (their tests are quarantined).
    pub retired_requirement_ids: Vec<String>,
    /// Every requirement the build must satisfy: changed plus applicable impact.
    pub applicable_requirement_ids: Vec<String>,
    /// The reviewed dispositions.
    pub impact: Vec<ImpactEntry>,
    /// False → the omitted reservation.
    pub implementation_required: bool,
    /// Readiness as the Materializer assessed it.
    pub readiness: Readiness,
    /// Build-work dependencies.
    pub dependencies: Vec<String>,
    /// Priority snapshot.
    pub priority: String,
    /// Declared scopes, for dispatch to keep overlapping work apart: the change
    /// set's `affected_scopes` (or the bug's), `interface:<id>` for each
    /// affected interface and `requirement:<id>` for each changed requirement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// Paths the build is expected to touch, for dispatch: the files of the test
    /// catalog entries that verify a changed (or violated) requirement.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
}

/// Why a contract could not be built (bad registration input, not a block).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    /// A field is malformed.
    #[error("invalid registration: {field} {reason}")]
    Invalid {
        /// Field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

fn is_hex40(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn kube_safe(s: &str) -> String {
    let mut out: String = s
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    while out.contains("--") {
        out = out.replace("--", "-");
    }
    out.trim_matches('-').chars().take(40).collect()
}

fn sorted(items: impl IntoIterator<Item = String>) -> Vec<String> {
    items
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Builds the contract.
pub fn build(intake: &Intake) -> Result<BuildContract, ContractError> {
    match intake {
        Intake::ChangeSet(f) => from_change_set(f),
        Intake::Bug(b) => from_bug(b),
    }
}

fn from_change_set(f: &ChangeSetFacts) -> Result<BuildContract, ContractError> {
    let invalid = |field, reason: &str| {
        Err(ContractError::Invalid {
            field,
            reason: reason.to_string(),
        })
    };
    if f.project_id.trim().is_empty() {
        return invalid("project_id", "must not be empty");
    }
    let Some(number) = f
        .change_set_id
        .strip_prefix("CS-")
        .filter(|n| n.len() >= 5 && n.bytes().all(|b| b.is_ascii_digit()))
    else {
        return invalid("change_set_id", "must look like CS-00042");
    };
    if !is_hex40(&f.merge_commit) {
        return invalid("merge_commit", "must be a full 40-hex commit id");
    }
    let merge = f.merge_commit.to_ascii_lowercase();
    let changed = sorted(
        f.operations
            .iter()
            .filter(|(a, _)| *a != Action::Retire)
            .map(|(_, id)| id.clone()),
    );
    let retired = sorted(
        f.operations
            .iter()
            .filter(|(a, _)| *a == Action::Retire)
            .map(|(_, id)| id.clone()),
    );
    let only_adds = f.operations.iter().all(|(a, _)| *a == Action::Add);
    let applicable = sorted(
        changed.iter().cloned().chain(
            f.impact
                .iter()
                .filter(|e| e.disposition == Disposition::Applicable)
                .map(|e| e.requirement_id.clone()),
        ),
    );
    let mut unresolved = Vec::new();
    if !f.merged_on_default_branch {
        unresolved.push("merge commit is not on the default branch".to_string());
    }
    let readiness = Readiness {
        contract_complete: !f.operations.is_empty() || !f.impact.is_empty(),
        source_immutable: f.merged_on_default_branch,
        specification_validated: f.check_errors.is_empty(),
        requirement_references_valid: f.unresolved_references.is_empty(),
        pipeline_entry_satisfied: f.merged_on_default_branch,
        impact_dispositioned: f.assessment_status == AssessmentStatus::Complete,
        policy_compatible: true,
        unresolved_reasons: Vec::new(),
    };
    let scopes = sorted(
        f.affected_scopes
            .iter()
            .cloned()
            .chain(
                f.affected_interfaces
                    .iter()
                    .map(|i| format!("interface:{i}")),
            )
            .chain(changed.iter().map(|r| format!("requirement:{r}"))),
    );
    Ok(BuildContract {
        work_item_id: format!("wi-cs-{number}-{}", &merge[..10]),
        materialization_key: format!("{}/{}@{merge}", f.project_id, f.change_set_id),
        spec_commit: merge,
        change_type: if only_adds { "undefined" } else { "changes" }.to_string(),
        changed_requirement_ids: changed,
        retired_requirement_ids: retired,
        applicable_requirement_ids: applicable,
        impact: f.impact.clone(),
        implementation_required: f.implementation_required,
        readiness,
        dependencies: sorted(f.depends_on.iter().cloned()),
        priority: f.priority.clone(),
        scopes,
        paths: sorted(f.touched_paths.iter().cloned()),
    })
}

fn from_bug(b: &BugFacts) -> Result<BuildContract, ContractError> {
    let invalid = |field, reason: &str| {
        Err(ContractError::Invalid {
            field,
            reason: reason.to_string(),
        })
    };
    if b.project_id.trim().is_empty() {
        return invalid("project_id", "must not be empty");
    }
    let slug = kube_safe(&b.bug_id);
    if slug.is_empty() {
        return invalid("bug_id", "must contain letters or digits");
    }
    if !is_hex40(&b.spec_commit) {
        return invalid("spec_commit", "must be a full 40-hex commit id");
    }
    if b.violated_requirement_ids.is_empty() {
        return invalid(
            "violated_requirement_ids",
            "a true bug names the requirements it violates",
        );
    }
    if b.impact
        .iter()
        .any(|e| e.disposition != Disposition::Applicable)
    {
        return invalid(
            "impact",
            "a true bug marks every impact candidate applicable; exclusions need a reviewed impact change set",
        );
    }
    let spec = b.spec_commit.to_ascii_lowercase();
    let violated = sorted(b.violated_requirement_ids.iter().cloned());
    let applicable = sorted(
        violated
            .iter()
            .cloned()
            .chain(b.impact.iter().map(|e| e.requirement_id.clone())),
    );
    let scopes = sorted(
        b.scopes
            .iter()
            .cloned()
            .chain(violated.iter().map(|r| format!("requirement:{r}"))),
    );
    Ok(BuildContract {
        work_item_id: format!("wi-bug-{slug}-{}", &spec[..10]),
        materialization_key: format!("{}/bug:{}@{spec}", b.project_id, b.bug_id),
        spec_commit: spec,
        change_type: "contradicts".to_string(),
        changed_requirement_ids: violated.clone(),
        retired_requirement_ids: Vec::new(),
        applicable_requirement_ids: applicable,
        impact: b.impact.clone(),
        implementation_required: true,
        // No spec change: Dimensioning is skipped, the spec commit is already merged.
        readiness: Readiness::complete(),
        dependencies: Vec::new(),
        priority: b.priority.clone(),
        scopes,
        paths: sorted(b.touched_paths.iter().cloned()),
    })
}

impl BuildContract {
    /// The source contract (`payload.work_item`) of the `materialize` command.
    pub fn source(&self, project_id: &str) -> SourceContract {
        SourceContract {
            id: self.work_item_id.clone(),
            project_id: project_id.to_string(),
            materialization_key: self.materialization_key.clone(),
            change_type: self.change_type.clone(),
            implementation_required: Some(self.implementation_required),
            priority: self.priority.clone(),
            dependencies: self
                .dependencies
                .iter()
                .map(|d| Dependency {
                    id: d.clone(),
                    state: State::Initial,
                })
                .collect(),
            readiness: self.readiness.clone(),
            ..SourceContract::default()
        }
    }

    /// The `materialize` envelope. The command key is distinct from the
    /// materialization key (a retry of the same registration reuses it).
    pub fn materialize_envelope(&self, project_id: &str, actor_ref: &str) -> OperationEnvelope {
        let mut envelope = OperationEnvelope::command(CommandRequest {
            command: Command::Materialize,
            actor_context_ref: actor_ref,
            work_item_id: &self.work_item_id,
            expected_state: State::Initial,
            expected_contract_version: 0,
            idempotency_key: format!("materialize:{}", self.materialization_key),
        })
        .with_payload(&LifecyclePayload {
            work_item: Some(self.source(project_id)),
            ..LifecyclePayload::default()
        });
        envelope
            .materialization_key
            .clone_from(&self.materialization_key);
        envelope
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MERGE: &str = "1A2B3C4D5E6F708192A3B4C5D6E7F80910111213";

    pub(crate) fn facts() -> ChangeSetFacts {
        ChangeSetFacts {
            touched_paths: vec![],
            project_id: "cli-sync".into(),
            change_set_id: "CS-00042".into(),
            merge_commit: MERGE.into(),
            operations: vec![
                (Action::Add, "REQ-SYNC-003".into()),
                (Action::Add, "REQ-SYNC-001".into()),
            ],
            affected_interfaces: vec!["IF-CLI".into()],
            affected_scopes: vec![],
            implementation_required: true,
            impact: vec![
                ImpactEntry {
                    requirement_id: "REQ-SYNC-002".into(),
                    disposition: Disposition::Applicable,
                    rationale: "shares the CLI".into(),
                },
                ImpactEntry {
                    requirement_id: "REQ-LOG-001".into(),
                    disposition: Disposition::NotApplicable,
                    rationale: "logging untouched".into(),
                },
            ],
            assessment_status: AssessmentStatus::Complete,
            merged_on_default_branch: true,
            check_errors: vec![],
            unresolved_references: vec![],
            depends_on: vec![],
            priority: "high".into(),
        }
    }

    #[test]
    fn identity_is_deterministic_and_kubernetes_safe() {
        let c = build(&Intake::ChangeSet(facts())).unwrap();
        assert_eq!(c.work_item_id, "wi-cs-00042-1a2b3c4d5e");
        assert_eq!(
            c.materialization_key,
            format!("cli-sync/CS-00042@{}", MERGE.to_lowercase())
        );
        assert_eq!(
            build(&Intake::ChangeSet(facts())).unwrap(),
            c,
            "same registration, same contract"
        );
    }

    #[test]
    fn applicable_requirements_are_changed_plus_applicable_impact() {
        let c = build(&Intake::ChangeSet(facts())).unwrap();
        assert_eq!(c.changed_requirement_ids, ["REQ-SYNC-001", "REQ-SYNC-003"]);
        assert_eq!(
            c.applicable_requirement_ids,
            ["REQ-SYNC-001", "REQ-SYNC-002", "REQ-SYNC-003"]
        );
        assert_eq!(c.change_type, "undefined");
        assert!(c.readiness.contract_failure().is_none() && c.readiness.blocker().is_none());
    }

    #[test]
    fn revisions_and_retirements_are_changes() {
        let mut f = facts();
        f.operations.push((Action::Retire, "REQ-OLD-001".into()));
        let c = build(&Intake::ChangeSet(f)).unwrap();
        assert_eq!(c.change_type, "changes");
        assert_eq!(c.retired_requirement_ids, ["REQ-OLD-001"]);
        assert!(
            !c.applicable_requirement_ids
                .contains(&"REQ-OLD-001".to_string())
        );
    }

    #[test]
    fn readiness_reflects_the_facts() {
        let mut f = facts();
        f.assessment_status = AssessmentStatus::Stale;
        assert!(
            !build(&Intake::ChangeSet(f.clone()))
                .unwrap()
                .readiness
                .impact_dispositioned
        );
        f.merged_on_default_branch = false;
        let r = build(&Intake::ChangeSet(f.clone())).unwrap().readiness;
        assert!(!r.source_immutable && !r.pipeline_entry_satisfied);
        f.check_errors = vec!["ears.pattern".into()];
        assert!(
            !build(&Intake::ChangeSet(f))
                .unwrap()
                .readiness
                .specification_validated
        );
    }

    #[test]
    fn bad_registrations_are_refused_with_the_field() {
        let mut f = facts();
        f.merge_commit = "main".into();
        assert_eq!(
            build(&Intake::ChangeSet(f)),
            Err(ContractError::Invalid {
                field: "merge_commit",
                reason: "must be a full 40-hex commit id".into()
            })
        );
        let mut f = facts();
        f.change_set_id = "42".into();
        assert!(matches!(
            build(&Intake::ChangeSet(f)),
            Err(ContractError::Invalid {
                field: "change_set_id",
                ..
            })
        ));
    }

    #[test]
    fn a_true_bug_is_contradicts_with_the_violated_requirements() {
        let bug = BugFacts {
            touched_paths: vec!["tests/sync_test.sh".into()],
            project_id: "cli-sync".into(),
            bug_id: "GH#17 sync deletes".into(),
            spec_commit: MERGE.into(),
            violated_requirement_ids: vec!["REQ-SYNC-002".into()],
            scopes: vec!["sync".into()],
            priority: "urgent".into(),
            impact: vec![ImpactEntry {
                requirement_id: "REQ-SYNC-003".into(),
                disposition: Disposition::Applicable,
                rationale: "relationship:depends-on:REQ-SYNC-002".into(),
            }],
        };
        let c = build(&Intake::Bug(bug.clone())).unwrap();
        assert_eq!(c.change_type, "contradicts");
        assert_eq!(c.work_item_id, "wi-bug-gh-17-sync-deletes-1a2b3c4d5e");
        assert_eq!(c.changed_requirement_ids, ["REQ-SYNC-002"]);
        assert_eq!(
            c.applicable_requirement_ids,
            ["REQ-SYNC-002", "REQ-SYNC-003"]
        );
        assert_eq!(c.scopes, ["requirement:REQ-SYNC-002", "sync"]);
        assert_eq!(c.paths, ["tests/sync_test.sh"]);
        let mut excluded = bug.clone();
        excluded.impact[0].disposition = Disposition::NotApplicable;
        assert!(
            build(&Intake::Bug(excluded)).is_err(),
            "a bug cannot exclude a candidate"
        );
        let mut none = bug;
        none.violated_requirement_ids.clear();
        assert!(build(&Intake::Bug(none)).is_err());
    }
}
