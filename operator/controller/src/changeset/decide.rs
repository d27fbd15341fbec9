//! The pure half of the ChangeSet pipeline: from what happened to the status
//! the ChangeSet should show. Conditions keep `lastTransitionTime` when their
//! status does not change; `now` is passed in.

use jiff::Timestamp;
use protobot_api::{
    ChangeSetStatus, ConditionStatus, ConditionUpdate, LocalRef,
    change_set::{
        ApprovingPullRequest, ImpactSummary, MaterializationOutcome, MaterializationReservation,
    },
    common::ChangeType,
    conditions::{Health, reasons, set_condition, summary, types},
};
use protobot_jobsite::contract::BuildContract;
use protobot_lifecycle::{Code, ResultEnvelope};

/// What the pipeline found.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The Project is missing.
    ProjectNotFound(String),
    /// The repository cannot be read.
    RepositoryUnavailable(String),
    /// The change set is not merged on the default branch (or the commit differs).
    NotVerified(String),
    /// The manifest is missing or the contract could not be built.
    ManifestInvalid(String),
    /// The Project's forge refused the merge as an approval (docs/forge-github.md §1): no
    /// approving pull request made it, another commit did, or several qualify.
    NotApproved {
        /// The Source Control Manager's code: `NOT_APPROVED`, `MERGE_COMMIT_MISMATCH`,
        /// `AMBIGUOUS_PULL_REQUEST` (also the condition's reason).
        code: &'static str,
        /// What the forge found and what to do.
        message: String,
    },
    /// The Project's forge could not be asked (unreachable, rate-limited, its Secret
    /// missing or refused): retried, never taken as a refusal.
    ForgeUnavailable(String),
    /// The WMS answered the materialize command.
    Materialized {
        /// The contract.
        contract: Box<BuildContract>,
        /// The result envelope.
        result: Box<ResultEnvelope>,
        /// The pull request the forge confirmed as the approval (Projects with a forge).
        approval: Option<ApprovingPullRequest>,
    },
}

impl Outcome {
    /// The outcome as one word, for logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::ProjectNotFound(_) => "project-not-found",
            Outcome::RepositoryUnavailable(_) => "repository-unavailable",
            Outcome::NotVerified(_) => "not-verified",
            Outcome::ManifestInvalid(_) => "manifest-invalid",
            Outcome::NotApproved { .. } => "not-approved",
            Outcome::ForgeUnavailable(_) => "forge-unavailable",
            Outcome::Materialized { .. } => "materialized",
        }
    }
}

/// `Verified` reason while the forge cannot be asked whether the merge is approved.
pub const FORGE_UNAVAILABLE: &str = "ForgeUnavailable";

fn change_type(s: &str) -> ChangeType {
    match s {
        "changes" => ChangeType::Changes,
        "contradicts" => ChangeType::Contradicts,
        _ => ChangeType::Undefined,
    }
}

fn reservation_outcome(s: &str) -> Option<MaterializationOutcome> {
    match s {
        "waiting" => Some(MaterializationOutcome::Waiting),
        "ready-for-building" => Some(MaterializationOutcome::ReadyForBuilding),
        "blocked" => Some(MaterializationOutcome::Blocked),
        "omitted" => Some(MaterializationOutcome::Omitted),
        _ => None,
    }
}

/// The status a ChangeSet should have after `outcome`, starting from `current`.
pub fn status(
    current: Option<&ChangeSetStatus>,
    outcome: &Outcome,
    generation: Option<i64>,
    now: Timestamp,
) -> ChangeSetStatus {
    let mut s = current.cloned().unwrap_or_default();
    s.observed_generation = generation;
    let mut set = |u: ConditionUpdate| {
        set_condition(&mut s.conditions, u, generation, now);
    };
    let pending = |why: &str| {
        ConditionUpdate::new(
            types::MATERIALIZED,
            ConditionStatus::False,
            reasons::PENDING,
            why.to_string(),
        )
    };
    // `Ready`/`Stalled` (docs/gitops.md): a missing Project, an unreadable repository or a
    // merge not on the default branch yet can arrive by themselves; an invalid manifest or a
    // key bound to another source cannot.
    let health = match outcome {
        Outcome::ProjectNotFound(m) => {
            set(ConditionUpdate::new(
                types::VERIFIED,
                ConditionStatus::False,
                reasons::PROJECT_NOT_FOUND,
                m.clone(),
            ));
            set(pending("waiting for verification"));
            (Health::Progressing, reasons::PROJECT_NOT_FOUND, m.clone())
        }
        Outcome::RepositoryUnavailable(m) => {
            set(ConditionUpdate::new(
                types::VERIFIED,
                ConditionStatus::Unknown,
                reasons::REPOSITORY_UNAVAILABLE,
                m.clone(),
            ));
            set(pending("waiting for verification"));
            (
                Health::Progressing,
                reasons::REPOSITORY_UNAVAILABLE,
                m.clone(),
            )
        }
        Outcome::NotVerified(m) => {
            set(ConditionUpdate::new(
                types::VERIFIED,
                ConditionStatus::False,
                reasons::MERGE_COMMIT_NOT_FOUND,
                m.clone(),
            ));
            set(pending("waiting for verification"));
            (
                Health::Progressing,
                reasons::MERGE_COMMIT_NOT_FOUND,
                m.clone(),
            )
        }
        Outcome::ManifestInvalid(m) => {
            set(ConditionUpdate::new(
                types::VERIFIED,
                ConditionStatus::False,
                reasons::MANIFEST_INVALID,
                m.clone(),
            ));
            set(pending("waiting for a valid manifest"));
            (
                Health::Stalled,
                reasons::MANIFEST_INVALID,
                format!("{m}; fix the change-set manifest in a new merge and register that merge"),
            )
        }
        Outcome::NotApproved { code, message } => {
            set(ConditionUpdate::new(
                types::VERIFIED,
                ConditionStatus::False,
                code,
                message.clone(),
            ));
            set(pending("waiting for an approved merge"));
            // A later approval does not change a merge that was made without one.
            (
                Health::Stalled,
                *code,
                format!("{message}; register a merge an approving pull request made"),
            )
        }
        Outcome::ForgeUnavailable(m) => {
            set(ConditionUpdate::new(
                types::VERIFIED,
                ConditionStatus::Unknown,
                FORGE_UNAVAILABLE,
                m.clone(),
            ));
            set(pending("waiting for verification"));
            (Health::Progressing, FORGE_UNAVAILABLE, m.clone())
        }
        Outcome::Materialized {
            contract,
            result,
            approval,
        } => {
            let verified = match approval {
                Some(pr) => format!(
                    "merged on the default branch as {}, approved by pull request #{}",
                    contract.spec_commit, pr.number
                ),
                None => format!("merged on the default branch as {}", contract.spec_commit),
            };
            set(ConditionUpdate::new(
                types::VERIFIED,
                ConditionStatus::True,
                reasons::MERGE_COMMIT_VERIFIED,
                verified,
            ));
            s.approval = approval.clone();
            s.impact = Some(ImpactSummary {
                change_type: change_type(&contract.change_type),
                implementation_required: contract.implementation_required,
                changed_requirements: contract.changed_requirement_ids.clone(),
                applicable_requirements: contract.applicable_requirement_ids.clone(),
                dependencies: contract.dependencies.clone(),
            });
            let decision = result.decision.as_ref();
            if let Some(r) = decision.and_then(|d| d.materialization_reservation.as_ref())
                && let Some(o) = reservation_outcome(&r.outcome)
            {
                s.reservation = Some(MaterializationReservation {
                    materialization_key: r.materialization_key.clone(),
                    source_fingerprint: r.source_fingerprint.clone(),
                    outcome: o,
                });
            }
            let omitted =
                decision.is_some_and(|d| d.outcome == protobot_lifecycle::DecisionOutcome::Omitted);
            match (result.ok, result.code()) {
                (true, _) if omitted => {
                    s.work_item_ref = None;
                    let m = "no implementation required; reservation kept";
                    set(ConditionUpdate::new(
                        types::MATERIALIZED,
                        ConditionStatus::True,
                        reasons::OMITTED,
                        m,
                    ));
                    (Health::Ready, reasons::OMITTED, m.to_string())
                }
                (true, _) => {
                    let name = protobot_stores::kubernetes::item_name(&contract.work_item_id);
                    s.work_item_ref = Some(LocalRef::new(name.clone()));
                    let m = format!("BuildWorkItem {name}");
                    set(ConditionUpdate::new(
                        types::MATERIALIZED,
                        ConditionStatus::True,
                        reasons::WORK_ITEM_CREATED,
                        m.clone(),
                    ));
                    (Health::Ready, reasons::WORK_ITEM_CREATED, m)
                }
                (false, Some(Code::IdempotencyConflict)) => {
                    let m = "the materialization key is bound to a different source; register a new merge";
                    set(ConditionUpdate::new(
                        types::MATERIALIZED,
                        ConditionStatus::False,
                        reasons::SOURCE_CONFLICT,
                        m,
                    ));
                    (Health::Stalled, reasons::SOURCE_CONFLICT, m.to_string())
                }
                (false, code) => {
                    let m = format!(
                        "materialize was rejected: {}",
                        code.map(|c| c.as_str()).unwrap_or("unknown")
                    );
                    set(pending(&m));
                    (Health::Progressing, reasons::PENDING, m)
                }
            }
        }
    };
    let (health, reason, message) = health;
    for u in summary(health, reason, message) {
        set(u);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn find<'a>(s: &'a ChangeSetStatus, type_: &str) -> &'a protobot_api::Condition {
        s.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn an_unverified_change_set_waits_with_the_reason() {
        let s = status(
            None,
            &Outcome::NotVerified("not merged".into()),
            Some(3),
            t("2026-09-18T12:00:00Z"),
        );
        let v = find(&s, types::VERIFIED);
        assert_eq!(
            (v.status, v.reason.as_str()),
            (ConditionStatus::False, reasons::MERGE_COMMIT_NOT_FOUND)
        );
        assert_eq!(v.observed_generation, Some(3));
        assert_eq!(find(&s, types::MATERIALIZED).reason, reasons::PENDING);
        assert_eq!(s.work_item_ref, None);
    }

    #[test]
    fn a_forge_refusal_is_verified_false_with_its_code_and_an_unreachable_forge_is_unknown() {
        let now = t("2026-09-18T12:00:00Z");
        for code in [
            "NOT_APPROVED",
            "MERGE_COMMIT_MISMATCH",
            "AMBIGUOUS_PULL_REQUEST",
        ] {
            let s = status(
                None,
                &Outcome::NotApproved {
                    code,
                    message: format!("refused: {code}"),
                },
                Some(2),
                now,
            );
            let v = find(&s, types::VERIFIED);
            assert_eq!(
                (v.status, v.reason.as_str()),
                (ConditionStatus::False, code)
            );
            assert_eq!(find(&s, types::MATERIALIZED).status, ConditionStatus::False);
            assert_eq!(find(&s, types::STALLED).status, ConditionStatus::True);
            assert_eq!(s.work_item_ref, None);
        }
        let s = status(
            None,
            &Outcome::ForgeUnavailable("GitHub answered 503".into()),
            Some(2),
            now,
        );
        let v = find(&s, types::VERIFIED);
        assert_eq!(
            (v.status, v.reason.as_str()),
            (ConditionStatus::Unknown, FORGE_UNAVAILABLE)
        );
        assert_eq!(find(&s, types::STALLED).status, ConditionStatus::False);
        assert_eq!(s.work_item_ref, None);
    }

    #[test]
    fn an_unchanged_outcome_keeps_the_transition_time() {
        let first = status(
            None,
            &Outcome::ProjectNotFound("p".into()),
            Some(1),
            t("2026-09-18T12:00:00Z"),
        );
        let again = status(
            Some(&first),
            &Outcome::ProjectNotFound("p".into()),
            Some(1),
            t("2026-09-18T13:00:00Z"),
        );
        assert_eq!(first, again, "a repeated reconcile writes nothing new");
        let moved = status(
            Some(&first),
            &Outcome::NotVerified("n".into()),
            Some(2),
            t("2026-09-18T14:00:00Z"),
        );
        assert_eq!(
            find(&moved, types::VERIFIED).last_transition_time.0,
            t("2026-09-18T12:00:00Z"),
            "False → False keeps its time"
        );
        assert_eq!(
            find(&moved, types::VERIFIED).reason,
            reasons::MERGE_COMMIT_NOT_FOUND
        );
    }

    fn contract() -> BuildContract {
        use protobot_jobsite::contract::{BugFacts, Intake, build};
        build(&Intake::Bug(BugFacts {
            project_id: "cli-sync".into(),
            bug_id: "GH-17".into(),
            spec_commit: "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d".into(),
            violated_requirement_ids: vec!["REQ-CLI-00001".into()],
            scopes: vec!["cli".into()],
            priority: "high".into(),
            impact: Vec::new(),
            touched_paths: Vec::new(),
        }))
        .unwrap()
    }

    fn materialized(result: ResultEnvelope) -> Outcome {
        Outcome::Materialized {
            contract: Box::new(contract()),
            result: Box::new(result),
            approval: None,
        }
    }

    #[test]
    fn the_approving_pull_request_is_recorded_and_named_in_verified() {
        let now = t("2026-09-18T12:00:00Z");
        let pr = ApprovingPullRequest {
            number: 42,
            url: "https://github.example/acme/cli-sync/pull/42".into(),
            merge_commit: "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d".into(),
            approvers: vec!["rita".into()],
        };
        let approved = Outcome::Materialized {
            contract: Box::new(contract()),
            result: Box::new(ResultEnvelope::applied("materialize", "work-item")),
            approval: Some(pr.clone()),
        };
        let s = status(None, &approved, Some(1), now);
        assert_eq!(s.approval.as_ref(), Some(&pr));
        let verified = find(&s, types::VERIFIED);
        assert_eq!(verified.status, ConditionStatus::True);
        assert!(
            verified.message.contains("pull request #42"),
            "{}",
            verified.message
        );
        // A Project without a forge records none; a later pass keeps what was recorded only
        // when it saw the approval again.
        let plain = status(
            None,
            &materialized(ResultEnvelope::applied("materialize", "work-item")),
            Some(1),
            now,
        );
        assert_eq!(plain.approval, None);
        assert!(
            !find(&plain, types::VERIFIED)
                .message
                .contains("pull request")
        );
        let again = status(
            Some(&s),
            &materialized(ResultEnvelope::applied("materialize", "work-item")),
            Some(1),
            now,
        );
        assert_eq!(again.approval, None);
    }

    fn summary_of(s: &ChangeSetStatus) -> (ConditionStatus, &str, ConditionStatus) {
        let ready = find(s, types::READY);
        (
            ready.status,
            ready.reason.as_str(),
            find(s, types::STALLED).status,
        )
    }

    #[test]
    fn ready_and_stalled_summarize_verified_and_materialized() {
        let now = t("2026-09-18T12:00:00Z");
        let made = status(
            None,
            &materialized(ResultEnvelope::applied("materialize", "work-item")),
            Some(1),
            now,
        );
        assert_eq!(
            summary_of(&made),
            (
                ConditionStatus::True,
                reasons::WORK_ITEM_CREATED,
                ConditionStatus::False
            )
        );
        let conflict = status(
            None,
            &materialized(ResultEnvelope::rejected(
                "materialize",
                protobot_lifecycle::Rejection::new(Code::IdempotencyConflict, "other source"),
            )),
            Some(1),
            now,
        );
        assert_eq!(
            summary_of(&conflict),
            (
                ConditionStatus::False,
                reasons::SOURCE_CONFLICT,
                ConditionStatus::True
            )
        );
        let invalid = status(
            None,
            &Outcome::ManifestInvalid("no manifest".into()),
            Some(1),
            now,
        );
        assert_eq!(
            summary_of(&invalid),
            (
                ConditionStatus::False,
                reasons::MANIFEST_INVALID,
                ConditionStatus::True
            )
        );
        assert!(find(&invalid, types::STALLED).message.contains("new merge"));
        for (outcome, reason) in [
            (
                Outcome::NotVerified("not merged".into()),
                reasons::MERGE_COMMIT_NOT_FOUND,
            ),
            (
                Outcome::ProjectNotFound("p".into()),
                reasons::PROJECT_NOT_FOUND,
            ),
            (
                Outcome::RepositoryUnavailable("r".into()),
                reasons::REPOSITORY_UNAVAILABLE,
            ),
        ] {
            let s = status(None, &outcome, Some(1), now);
            assert_eq!(
                summary_of(&s),
                (ConditionStatus::False, reason, ConditionStatus::False),
                "{outcome:?}"
            );
        }
        // Ready after waiting: the transition time moves once.
        let later = t("2026-09-18T12:10:00Z");
        let waited = status(None, &Outcome::NotVerified("n".into()), Some(1), now);
        let done = status(
            Some(&waited),
            &materialized(ResultEnvelope::applied("materialize", "work-item")),
            Some(1),
            later,
        );
        assert_eq!(find(&done, types::READY).last_transition_time.0, later);
        assert_eq!(
            find(&done, types::STALLED).last_transition_time.0,
            now,
            "False → False"
        );
    }
}
