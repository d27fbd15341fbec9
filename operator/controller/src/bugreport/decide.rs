//! The pure half of the BugReport pipeline: validate the spec, decide whether
//! the bug's facts must be read or were recorded before, compute the status the
//! BugReport should show, and the Events its transitions raise. Nothing here
//! touches the cluster or the clock (`now` is passed in).

use jiff::Timestamp;
use kube::runtime::events::{Event, EventType};
use protobot_api::{
    BugReportSpec, BugReportStatus, ConditionStatus, ConditionUpdate, LocalRef,
    bug_report::{RecordedBugFacts, RecordedImpact, SCOPES_LIMIT},
    change_set::{IMPACT_REQUIREMENTS_LIMIT, ImpactSummary},
    common::ChangeType,
    conditions::{Health, reasons, set_condition, summary, types},
};
use protobot_jobsite::contract::{
    BugFacts, BuildContract, Disposition, ImpactEntry, Intake, build,
};
use protobot_lifecycle::{Code, ResultEnvelope};

/// Longest bug ID (`spec.bugId`), as the CRD pattern allows.
const BUG_ID_MAX: usize = 63;
/// Longest requirement ID, as the CRD pattern allows.
const REQUIREMENT_ID_MAX: usize = 128;

/// A spec that passed [`validate`]: its lists trimmed, sorted and deduplicated,
/// the priority as the work item's snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Validated {
    /// The bug ID.
    pub bug_id: String,
    /// The violated requirement IDs (sorted, unique, at least one).
    pub violated: Vec<String>,
    /// The affected scopes (sorted, unique).
    pub scopes: Vec<String>,
    /// `low`, `normal`, `high`, `urgent` or empty.
    pub priority: String,
}

/// What the pipeline found.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The spec is malformed (the message names the field and the fix).
    Invalid(String),
    /// The Project is missing.
    ProjectNotFound(String),
    /// The repository cannot be read.
    RepositoryUnavailable(String),
    /// A violated requirement is not active at the default-branch head.
    UnknownRequirement(String),
    /// The spec no longer matches the facts recorded when the bug was materialized.
    FactsChanged(String),
    /// The facts were read and are about to be recorded (before materializing).
    Recorded {
        /// The facts.
        facts: Box<BugFacts>,
        /// Their contract.
        contract: Box<BuildContract>,
    },
    /// The WMS answered the materialize command.
    Materialized {
        /// The facts the contract was built from.
        facts: Box<BugFacts>,
        /// The contract.
        contract: Box<BuildContract>,
        /// The result envelope.
        result: Box<ResultEnvelope>,
    },
}

impl Outcome {
    /// The outcome as one word, for logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Invalid(_) => "invalid",
            Outcome::ProjectNotFound(_) => "project-not-found",
            Outcome::RepositoryUnavailable(_) => "repository-unavailable",
            Outcome::UnknownRequirement(_) => "unknown-requirement",
            Outcome::FactsChanged(_) => "facts-changed",
            Outcome::Recorded { .. } => "recorded",
            Outcome::Materialized { .. } => "materialized",
        }
    }
}

/// What to do about the bug's facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Nothing is recorded yet: read the facts at the head of the default branch.
    ReadFacts,
    /// The facts recorded earlier still match the spec: materialize them again
    /// (the same key, so the same work item).
    Reuse(Box<BugFacts>),
    /// The spec and the recorded facts disagree; nothing is materialized.
    FactsChanged(String),
}

fn is_id(s: &str, max: usize) -> bool {
    let mut chars = s.chars();
    s.len() <= max
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn normalized(items: &[String]) -> Vec<String> {
    let set: std::collections::BTreeSet<String> = items
        .iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    set.into_iter().collect()
}

/// Checks what the CRD schema checks (the API server may be older than the
/// schema, and the double enforces less) and normalizes the lists the way
/// `protobot run --bug` does, so both register the same facts.
pub fn validate(spec: &BugReportSpec) -> Result<Validated, String> {
    if !is_id(&spec.bug_id, BUG_ID_MAX) {
        return Err(format!(
            "spec.bugId {:?} is not a bug ID: use a letter followed by up to 62 letters, digits, '.', '_' or '-', e.g. GH-17",
            spec.bug_id
        ));
    }
    let violated = normalized(&spec.violated_requirements);
    if violated.is_empty() {
        return Err(
            "spec.violatedRequirements is empty: name at least one approved requirement the behaviour violates"
                .into(),
        );
    }
    if let Some(bad) = violated.iter().find(|r| !is_id(r, REQUIREMENT_ID_MAX)) {
        return Err(format!(
            "spec.violatedRequirements names {bad:?}, which is not a requirement ID (e.g. REQ-CLI-00001)"
        ));
    }
    if violated.len() > IMPACT_REQUIREMENTS_LIMIT as usize {
        return Err(format!(
            "spec.violatedRequirements names {} requirements; at most {IMPACT_REQUIREMENTS_LIMIT} are allowed",
            violated.len()
        ));
    }
    let scopes = normalized(&spec.affected_scopes);
    if scopes.len() > SCOPES_LIMIT as usize {
        return Err(format!(
            "spec.affectedScopes names {} scopes; at most {SCOPES_LIMIT} are allowed",
            scopes.len()
        ));
    }
    Ok(Validated {
        bug_id: spec.bug_id.clone(),
        violated,
        scopes,
        priority: spec
            .business_priority
            .map(|p| p.as_str().to_string())
            .unwrap_or_default(),
    })
}

/// The facts a recorded status holds, for the project and bug they belong to.
pub fn bug_facts(project: &str, bug_id: &str, recorded: &RecordedBugFacts) -> BugFacts {
    BugFacts {
        project_id: project.to_string(),
        bug_id: bug_id.to_string(),
        spec_commit: recorded.spec_commit.clone(),
        violated_requirement_ids: recorded.violated_requirements.clone(),
        scopes: recorded.affected_scopes.clone(),
        priority: recorded.priority.clone(),
        impact: recorded
            .impact
            .iter()
            .map(|i| ImpactEntry {
                requirement_id: i.requirement_id.clone(),
                disposition: Disposition::Applicable,
                rationale: i.rationale.clone(),
            })
            .collect(),
        touched_paths: recorded.touched_paths.clone(),
    }
}

/// What the status records of `facts` (whose contract is `contract`).
pub fn recorded_facts(facts: &BugFacts, contract: &BuildContract) -> RecordedBugFacts {
    RecordedBugFacts {
        spec_commit: contract.spec_commit.clone(),
        materialization_key: contract.materialization_key.clone(),
        work_item_id: contract.work_item_id.clone(),
        violated_requirements: normalized(&facts.violated_requirement_ids),
        affected_scopes: normalized(&facts.scopes),
        priority: facts.priority.clone(),
        impact: facts
            .impact
            .iter()
            .map(|e| RecordedImpact {
                requirement_id: e.requirement_id.clone(),
                rationale: e.rationale.clone(),
            })
            .collect(),
        touched_paths: facts.touched_paths.clone(),
    }
}

/// Whether to read the facts, reuse the recorded ones, or refuse a changed spec.
/// A bug is registered once: the recorded facts keep their spec commit, so a
/// reconcile after the default branch moved finds the same work item.
pub fn plan(project: &str, spec: &Validated, recorded: Option<&RecordedBugFacts>) -> Plan {
    let Some(recorded) = recorded else {
        return Plan::ReadFacts;
    };
    let (was_violated, was_scopes) = (
        normalized(&recorded.violated_requirements),
        normalized(&recorded.affected_scopes),
    );
    if was_violated != spec.violated || was_scopes != spec.scopes {
        return Plan::FactsChanged(format!(
            "bug {} was materialized at {} violating {} (scopes [{}]); the spec now names {} (scopes [{}]). Restore the spec, or report the new facts under another bug ID",
            spec.bug_id,
            recorded.spec_commit,
            was_violated.join(","),
            was_scopes.join(","),
            spec.violated.join(","),
            spec.scopes.join(","),
        ));
    }
    let facts = bug_facts(project, &spec.bug_id, recorded);
    match build(&Intake::Bug(facts.clone())) {
        Ok(c) if c.materialization_key == recorded.materialization_key => {
            Plan::Reuse(Box::new(facts))
        }
        Ok(c) => Plan::FactsChanged(format!(
            "the recorded facts of bug {} rebuild under key {}, not the recorded {}; delete the BugReport and apply it again",
            spec.bug_id, c.materialization_key, recorded.materialization_key
        )),
        Err(e) => Plan::FactsChanged(format!(
            "the recorded facts of bug {} do not make a contract ({e}); delete the BugReport and apply it again",
            spec.bug_id
        )),
    }
}

fn impact_summary(contract: &BuildContract) -> ImpactSummary {
    ImpactSummary {
        change_type: ChangeType::Contradicts,
        implementation_required: contract.implementation_required,
        changed_requirements: contract.changed_requirement_ids.clone(),
        applicable_requirements: contract.applicable_requirement_ids.clone(),
        dependencies: contract.dependencies.clone(),
    }
}

/// The status a BugReport should have after `outcome`, starting from `current`.
pub fn status(
    current: Option<&BugReportStatus>,
    outcome: &Outcome,
    generation: Option<i64>,
    now: Timestamp,
) -> BugReportStatus {
    let mut s = current.cloned().unwrap_or_default();
    s.observed_generation = generation;
    let mut updates = Vec::new();
    let pending = |why: &str| {
        ConditionUpdate::new(
            types::MATERIALIZED,
            ConditionStatus::False,
            reasons::PENDING,
            why.to_string(),
        )
    };
    let not_valid = |reason, m: &String| {
        ConditionUpdate::new(types::VALID, ConditionStatus::False, reason, m.clone())
    };
    // A refused spec leaves an existing work item in place: its Materialized
    // condition stays as it was.
    let unless_materialized =
        |s: &BugReportStatus, why: &str| s.work_item_ref.is_none().then(|| pending(why));
    // `Ready`/`Stalled` (docs/gitops.md): a missing Project or an unreadable repository can
    // arrive by themselves; a malformed spec, an inactive requirement, changed facts or a key
    // bound to another source wait for someone to edit the BugReport.
    let health = match outcome {
        Outcome::Invalid(m) => {
            updates.push(not_valid(reasons::SPEC_INVALID, m));
            updates.extend(unless_materialized(&s, "waiting for a valid spec"));
            (Health::Stalled, reasons::SPEC_INVALID, m.clone())
        }
        Outcome::ProjectNotFound(m) => {
            updates.push(not_valid(reasons::PROJECT_NOT_FOUND, m));
            updates.extend(unless_materialized(&s, "waiting for the Project"));
            (Health::Progressing, reasons::PROJECT_NOT_FOUND, m.clone())
        }
        Outcome::RepositoryUnavailable(m) => {
            updates.push(ConditionUpdate::new(
                types::VALID,
                ConditionStatus::Unknown,
                reasons::REPOSITORY_UNAVAILABLE,
                m.clone(),
            ));
            updates.extend(unless_materialized(&s, "waiting for the repository"));
            (
                Health::Progressing,
                reasons::REPOSITORY_UNAVAILABLE,
                m.clone(),
            )
        }
        Outcome::UnknownRequirement(m) => {
            updates.push(not_valid(reasons::UNKNOWN_REQUIREMENT, m));
            updates.extend(unless_materialized(&s, "waiting for active requirements"));
            (Health::Stalled, reasons::UNKNOWN_REQUIREMENT, m.clone())
        }
        Outcome::FactsChanged(m) => {
            updates.push(not_valid(reasons::FACTS_CHANGED, m));
            updates.extend(unless_materialized(&s, "waiting for the recorded facts"));
            (Health::Stalled, reasons::FACTS_CHANGED, m.clone())
        }
        Outcome::Recorded { facts, contract } => {
            record(&mut s, facts, contract, &mut updates);
            let m = "facts recorded; materializing";
            updates.push(pending(m));
            (Health::Progressing, reasons::PENDING, m.to_string())
        }
        Outcome::Materialized {
            facts,
            contract,
            result,
        } => {
            record(&mut s, facts, contract, &mut updates);
            match (result.ok, result.code()) {
                (true, _) => {
                    let name = protobot_stores::kubernetes::item_name(&contract.work_item_id);
                    s.work_item_ref = Some(LocalRef::new(name.clone()));
                    let m = format!("BuildWorkItem {name}");
                    updates.push(ConditionUpdate::new(
                        types::MATERIALIZED,
                        ConditionStatus::True,
                        reasons::WORK_ITEM_CREATED,
                        m.clone(),
                    ));
                    (Health::Ready, reasons::WORK_ITEM_CREATED, m)
                }
                (false, Some(Code::IdempotencyConflict)) => {
                    let m = format!(
                        "the materialization key {} is bound to a different source; report the bug under another bug ID",
                        contract.materialization_key
                    );
                    updates.push(ConditionUpdate::new(
                        types::MATERIALIZED,
                        ConditionStatus::False,
                        reasons::SOURCE_CONFLICT,
                        m.clone(),
                    ));
                    (Health::Stalled, reasons::SOURCE_CONFLICT, m)
                }
                (false, code) => {
                    let m = format!(
                        "materialize was rejected: {}",
                        code.map(|c| c.as_str()).unwrap_or("unknown")
                    );
                    updates.push(pending(&m));
                    (Health::Progressing, reasons::PENDING, m)
                }
            }
        }
    };
    let (health, reason, message) = health;
    updates.extend(summary(health, reason, message));
    for u in updates {
        set_condition(&mut s.conditions, u, generation, now);
    }
    s
}

fn record(
    s: &mut BugReportStatus,
    facts: &BugFacts,
    contract: &BuildContract,
    updates: &mut Vec<ConditionUpdate>,
) {
    s.recorded_facts = Some(recorded_facts(facts, contract));
    s.impact = Some(impact_summary(contract));
    updates.push(ConditionUpdate::new(
        types::VALID,
        ConditionStatus::True,
        reasons::REQUIREMENTS_ACTIVE,
        format!(
            "{} active on the default branch at {}",
            contract.changed_requirement_ids.join(", "),
            contract.spec_commit
        ),
    ));
}

/// The Events of the transitions from `before` to `after`: one per `Valid` or
/// `Materialized` condition whose status or reason changed (`Pending` is not news;
/// `Ready` and `Stalled` only summarize those two). `True` is Normal, anything else
/// a Warning; the reason is the condition's, the note its message.
pub fn events(before: Option<&BugReportStatus>, after: &BugReportStatus) -> Vec<Event> {
    let old = |type_: &str| {
        before
            .and_then(|b| b.conditions.iter().find(|c| c.type_ == type_))
            .map(|c| (c.status, c.reason.clone()))
    };
    after
        .conditions
        .iter()
        .filter(|c| c.type_ == types::VALID || c.type_ == types::MATERIALIZED)
        .filter(|c| c.reason != reasons::PENDING)
        .filter(|c| old(&c.type_) != Some((c.status, c.reason.clone())))
        .map(|c| Event {
            type_: if c.status == ConditionStatus::True {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason: c.reason.clone(),
            note: Some(c.message.clone()),
            action: if c.type_ == types::MATERIALIZED {
                "Materialize".into()
            } else {
                "Validate".into()
            },
            secondary: None,
        })
        .collect()
}

/// Finalizer on every BugReport: its status holds the only record of the
/// bug's facts, which the Job Site needs to rebuild the item's contract, so
/// the report stays until its work item is finished (or never existed).
pub const FINALIZER: &str = "protobot.dev/bug-facts";

/// Whether a BugReport being deleted may go: its work item (`None`: none was
/// materialized, or it is gone) is finished.
pub fn may_release(work_item_state: Option<protobot_api::LifecycleState>) -> bool {
    work_item_state.is_none_or(protobot_api::LifecycleState::is_terminal)
}

/// Annotation on a BugReport: `"true"` abandons its unfinished work item when
/// the report is deleted (through the lifecycle `abandon` command, after Git
/// shows the item's merge is not on the default branch), so a GitOps delete
/// (`argocd app delete`, a pruned Kustomization) is never blocked for good.
/// Who may set it is who may patch BugReports in the namespace.
pub const ABANDON_ANNOTATION: &str = "protobot.dev/abandon-work-item";

/// Whether `annotations` ask for the item to be abandoned on deletion.
pub fn abandon_requested(annotations: &std::collections::BTreeMap<String, String>) -> bool {
    annotations
        .get(ABANDON_ANNOTATION)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// The trusted context the operator abandons a deleted BugReport's item
/// with: a human maintainer whose subject names the annotated report, so the
/// audit event says where the decision came from.
pub fn abandon_context(
    ns: &str,
    bug_name: &str,
    project: &str,
    now: Timestamp,
) -> protobot_lifecycle::AuthorizationContext {
    protobot_lifecycle::AuthorizationContext::new(protobot_lifecycle::Grant {
        project,
        role: protobot_lifecycle::Role::HumanMaintainer,
        subject: &format!("bugreport-annotation:{ns}/{bug_name}"),
        actions: &["abandon"],
        // At the end of time, no time left (fails closed).
        expires_at: now
            .checked_add(jiff::SignedDuration::from_secs(60))
            .unwrap_or(now),
        policy_version: crate::changeset::POLICY_VERSION,
    })
}

/// The Event after the annotation abandoned the item.
pub fn abandoned_on_deletion(work_item: &str) -> kube::runtime::events::Event {
    kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: "WorkItemAbandoned".into(),
        note: Some(format!(
            "work item {work_item} was abandoned ({ABANDON_ANNOTATION}=true) and this report is released"
        )),
        action: "Finalize".into(),
        secondary: None,
    }
}

/// The Event when the annotation could not abandon the item (merged, merging,
/// or the repository is unreachable): the report stays, and why.
pub fn abandon_refused(work_item: &str, why: &str) -> kube::runtime::events::Event {
    kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Warning,
        reason: "AbandonRefused".into(),
        note: Some(format!(
            "work item {work_item} was not abandoned: {why}; the report stays until the item is finished"
        )),
        action: "Finalize".into(),
        secondary: None,
    }
}

/// The Event saying why a BugReport being deleted is still there.
pub fn deletion_waits(work_item: Option<&str>) -> kube::runtime::events::Event {
    kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: "DeletionWaitsForWorkItem".into(),
        note: Some(format!(
            "kept until work item {} is completed or abandoned: its contract is rebuilt from the facts on this report (annotate {ABANDON_ANNOTATION}=true to abandon it)",
            work_item.unwrap_or("-")
        )),
        action: "Finalize".into(),
        secondary: None,
    }
}

/// The finalizers with ours added (`None`: already there).
pub fn with_finalizer(finalizers: &[String]) -> Option<Vec<String>> {
    if finalizers.iter().any(|f| f == FINALIZER) {
        return None;
    }
    let mut out = finalizers.to_vec();
    out.push(FINALIZER.to_owned());
    Some(out)
}

/// The finalizers with ours removed (`None`: it was not there).
pub fn without_finalizer(finalizers: &[String]) -> Option<Vec<String>> {
    finalizers.iter().any(|f| f == FINALIZER).then(|| {
        finalizers
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect()
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use protobot_api::{BusinessPriority, Condition, conditions::find_condition};

    use super::*;

    const HEAD: &str = "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d";

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn spec(violates: &[&str], scopes: &[&str]) -> BugReportSpec {
        BugReportSpec {
            project_ref: LocalRef::new("cli-sync"),
            bug_id: "GH-17".into(),
            violated_requirements: violates.iter().map(|s| s.to_string()).collect(),
            affected_scopes: scopes.iter().map(|s| s.to_string()).collect(),
            business_priority: Some(BusinessPriority::High),
            summary: None,
        }
    }

    /// What `read_bug_facts` returns for [`spec`] at [`HEAD`].
    fn facts() -> BugFacts {
        BugFacts {
            project_id: "cli-sync".into(),
            bug_id: "GH-17".into(),
            spec_commit: HEAD.into(),
            violated_requirement_ids: vec!["REQ-CLI-00001".into()],
            scopes: vec!["cli".into()],
            priority: "high".into(),
            impact: vec![ImpactEntry {
                requirement_id: "REQ-CLI-00002".into(),
                disposition: Disposition::Applicable,
                rationale: "shares cli-main".into(),
            }],
            touched_paths: vec!["tests/test_dry_run.sh".into()],
        }
    }

    fn contract() -> BuildContract {
        build(&Intake::Bug(facts())).unwrap()
    }

    fn materialized(conflict: bool) -> Outcome {
        let result = if conflict {
            ResultEnvelope::rejected(
                "materialize",
                protobot_lifecycle::Rejection::new(Code::IdempotencyConflict, "other source"),
            )
        } else {
            ResultEnvelope::applied("materialize", "work-item")
        };
        Outcome::Materialized {
            facts: Box::new(facts()),
            contract: Box::new(contract()),
            result: Box::new(result),
        }
    }

    fn find<'a>(s: &'a BugReportStatus, type_: &str) -> &'a Condition {
        find_condition(&s.conditions, type_).unwrap()
    }

    fn is<'a>(s: &'a BugReportStatus, type_: &str) -> (ConditionStatus, &'a str) {
        let c = find(s, type_);
        (c.status, c.reason.as_str())
    }

    #[test]
    fn a_valid_spec_is_normalized_like_protobot_run_bug() {
        let v = validate(&spec(
            &[" REQ-CLI-00002", "REQ-CLI-00001", "REQ-CLI-00002", ""],
            &["cli", "cli"],
        ))
        .unwrap();
        assert_eq!(v.violated, ["REQ-CLI-00001", "REQ-CLI-00002"]);
        assert_eq!(v.scopes, ["cli"]);
        assert_eq!((v.bug_id.as_str(), v.priority.as_str()), ("GH-17", "high"));
        let mut none = spec(&["REQ-CLI-00001"], &[]);
        none.business_priority = None;
        assert_eq!(validate(&none).unwrap().priority, "");
    }

    #[test]
    fn an_invalid_spec_names_the_field_and_waits_for_a_change() {
        let mut bad_id = spec(&["REQ-CLI-00001"], &[]);
        bad_id.bug_id = "17 spaces".into();
        let err = validate(&bad_id).unwrap_err();
        assert!(err.starts_with("spec.bugId"), "{err}");
        let err = validate(&spec(&[" ", ""], &[])).unwrap_err();
        assert!(
            err.starts_with("spec.violatedRequirements is empty"),
            "{err}"
        );
        let err = validate(&spec(&["REQ CLI"], &[])).unwrap_err();
        assert!(err.contains("\"REQ CLI\""), "{err}");
        let too_long = "B".repeat(64);
        let mut long_id = spec(&["REQ-CLI-00001"], &[]);
        long_id.bug_id = too_long;
        assert!(validate(&long_id).is_err());

        let s = status(
            None,
            &Outcome::Invalid(err),
            Some(2),
            t("2026-11-30T09:00:00Z"),
        );
        assert_eq!(
            is(&s, types::VALID),
            (ConditionStatus::False, reasons::SPEC_INVALID)
        );
        assert_eq!(is(&s, types::MATERIALIZED).1, reasons::PENDING);
        assert_eq!(find(&s, types::VALID).observed_generation, Some(2));
        assert_eq!(s.observed_generation, Some(2));
        assert_eq!((s.work_item_ref, s.recorded_facts), (None, None));
    }

    #[test]
    fn an_unknown_requirement_is_reported_and_records_nothing() {
        let s = status(
            None,
            &Outcome::UnknownRequirement(
                "bug GH-17 names REQ-CLI-09999, which is not active".into(),
            ),
            Some(1),
            t("2026-11-30T09:00:00Z"),
        );
        assert_eq!(
            is(&s, types::VALID),
            (ConditionStatus::False, reasons::UNKNOWN_REQUIREMENT)
        );
        assert!(find(&s, types::VALID).message.contains("REQ-CLI-09999"));
        assert_eq!(
            is(&s, types::MATERIALIZED),
            (ConditionStatus::False, reasons::PENDING)
        );
        assert_eq!((s.work_item_ref, s.recorded_facts), (None, None));
        let events = events(
            None,
            &status(
                None,
                &Outcome::UnknownRequirement("x".into()),
                Some(1),
                t("2026-11-30T09:00:00Z"),
            ),
        );
        assert_eq!(events.len(), 1, "Pending raises no event");
        assert_eq!(events[0].type_, EventType::Warning);
        assert_eq!(events[0].reason, reasons::UNKNOWN_REQUIREMENT);
    }

    #[test]
    fn facts_are_recorded_before_materializing_and_round_trip() {
        let recorded = recorded_facts(&facts(), &contract());
        assert_eq!(recorded.spec_commit, HEAD);
        assert_eq!(
            recorded.materialization_key,
            format!("cli-sync/bug:GH-17@{HEAD}")
        );
        assert_eq!(recorded.work_item_id, contract().work_item_id);
        assert_eq!(bug_facts("cli-sync", "GH-17", &recorded), facts());
        let s = status(
            None,
            &Outcome::Recorded {
                facts: Box::new(facts()),
                contract: Box::new(contract()),
            },
            Some(1),
            t("2026-11-30T09:00:00Z"),
        );
        assert_eq!(s.recorded_facts, Some(recorded));
        assert_eq!(
            is(&s, types::VALID),
            (ConditionStatus::True, reasons::REQUIREMENTS_ACTIVE)
        );
        assert_eq!(is(&s, types::MATERIALIZED).1, reasons::PENDING);
        assert_eq!(s.work_item_ref, None);
    }

    #[test]
    fn a_materialized_bug_names_its_work_item_and_a_replay_changes_nothing() {
        let at = t("2026-11-30T09:00:00Z");
        let first = status(None, &materialized(false), Some(1), at);
        let name = protobot_stores::kubernetes::item_name(&contract().work_item_id);
        assert_eq!(first.work_item_ref, Some(LocalRef::new(name.clone())));
        assert_eq!(
            is(&first, types::MATERIALIZED),
            (ConditionStatus::True, reasons::WORK_ITEM_CREATED)
        );
        let impact = first.impact.clone().unwrap();
        assert_eq!(impact.change_type, ChangeType::Contradicts);
        assert_eq!(impact.changed_requirements, ["REQ-CLI-00001"]);
        assert_eq!(
            impact.applicable_requirements,
            ["REQ-CLI-00001", "REQ-CLI-00002"]
        );
        let raised = events(None, &first);
        let reasons_raised: Vec<&str> = raised.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(
            reasons_raised,
            [reasons::REQUIREMENTS_ACTIVE, reasons::WORK_ITEM_CREATED]
        );
        assert!(raised.iter().all(|e| e.type_ == EventType::Normal));

        // Already materialized: the plan reuses the recorded facts (same key,
        // same item) and the status does not move, so nothing is written or raised.
        let validated = validate(&spec(&["REQ-CLI-00001"], &["cli"])).unwrap();
        let plan = plan("cli-sync", &validated, first.recorded_facts.as_ref());
        assert_eq!(plan, Plan::Reuse(Box::new(facts())));
        let again = status(
            Some(&first),
            &materialized(false),
            Some(1),
            t("2026-11-30T10:00:00Z"),
        );
        assert_eq!(again, first);
        assert!(events(Some(&first), &again).is_empty());
    }

    #[test]
    fn nothing_recorded_means_read_the_facts() {
        let validated = validate(&spec(&["REQ-CLI-00001"], &[])).unwrap();
        assert_eq!(plan("cli-sync", &validated, None), Plan::ReadFacts);
    }

    #[test]
    fn changed_facts_are_refused_and_the_existing_item_is_kept() {
        let at = t("2026-11-30T09:00:00Z");
        let first = status(None, &materialized(false), Some(1), at);
        let recorded = first.recorded_facts.as_ref();
        for (violates, scopes) in [
            (&["REQ-CLI-00002"][..], &["cli"][..]),
            (&["REQ-CLI-00001", "REQ-CLI-00002"][..], &["cli"][..]),
            (&["REQ-CLI-00001"][..], &[][..]),
        ] {
            let validated = validate(&spec(violates, scopes)).unwrap();
            let Plan::FactsChanged(why) = plan("cli-sync", &validated, recorded) else {
                panic!("{violates:?} {scopes:?} was not refused");
            };
            assert!(
                why.contains(HEAD) && why.contains("another bug ID"),
                "{why}"
            );
        }
        // Order and duplicates are not a change.
        let same = validate(&spec(&["REQ-CLI-00001", "REQ-CLI-00001"], &[" cli"])).unwrap();
        assert!(matches!(plan("cli-sync", &same, recorded), Plan::Reuse(_)));

        let refused = status(
            Some(&first),
            &Outcome::FactsChanged("changed".into()),
            Some(2),
            t("2026-11-30T10:00:00Z"),
        );
        assert_eq!(
            is(&refused, types::VALID),
            (ConditionStatus::False, reasons::FACTS_CHANGED)
        );
        assert_eq!(
            is(&refused, types::MATERIALIZED),
            (ConditionStatus::True, reasons::WORK_ITEM_CREATED),
            "the work item still exists"
        );
        assert_eq!(refused.work_item_ref, first.work_item_ref);
        assert_eq!(refused.recorded_facts, first.recorded_facts);
        let raised = events(Some(&first), &refused);
        assert_eq!(raised.len(), 1);
        assert_eq!(
            (raised[0].type_, raised[0].reason.as_str()),
            (EventType::Warning, reasons::FACTS_CHANGED)
        );
    }

    #[test]
    fn recorded_facts_that_do_not_rebuild_under_their_key_are_refused() {
        let mut recorded = recorded_facts(&facts(), &contract());
        recorded.materialization_key = "cli-sync/bug:GH-17@elsewhere".into();
        let validated = validate(&spec(&["REQ-CLI-00001"], &["cli"])).unwrap();
        let Plan::FactsChanged(why) = plan("cli-sync", &validated, Some(&recorded)) else {
            panic!("a forged key was reused");
        };
        assert!(why.contains("rebuild under key"), "{why}");
    }

    #[test]
    fn a_key_bound_to_another_source_is_a_source_conflict() {
        let s = status(
            None,
            &materialized(true),
            Some(1),
            t("2026-11-30T09:00:00Z"),
        );
        assert_eq!(
            is(&s, types::MATERIALIZED),
            (ConditionStatus::False, reasons::SOURCE_CONFLICT)
        );
        assert_eq!(s.work_item_ref, None);
    }

    #[test]
    fn a_report_stays_while_its_work_item_is_unfinished() {
        use protobot_api::LifecycleState as S;
        assert!(may_release(None), "nothing was materialized");
        for done in [S::Completed, S::Abandoned] {
            assert!(may_release(Some(done)), "{done:?}");
        }
        for live in [
            S::Waiting,
            S::ReadyForBuilding,
            S::Building,
            S::Inspecting,
            S::Blocked,
            S::Merging,
        ] {
            assert!(!may_release(Some(live)), "{live:?}");
        }
    }

    #[test]
    fn only_the_annotation_set_to_true_asks_for_abandon_and_its_context_names_the_report() {
        let mut a = std::collections::BTreeMap::new();
        assert!(!abandon_requested(&a));
        a.insert(ABANDON_ANNOTATION.to_string(), "false".to_string());
        assert!(!abandon_requested(&a));
        a.insert(ABANDON_ANNOTATION.to_string(), " True ".to_string());
        assert!(abandon_requested(&a));
        let now: Timestamp = "2026-12-01T00:00:00Z".parse().unwrap();
        let ctx = abandon_context("team-a", "gh-2", "shop", now);
        assert_eq!(ctx.subject, "bugreport-annotation:team-a/gh-2");
        assert_eq!(
            ctx.validate("shop", Some(now)),
            Ok(protobot_lifecycle::Role::HumanMaintainer)
        );
        assert_eq!(ctx.allowed_actions, ["abandon"]);
    }

    #[test]
    fn the_finalizer_is_added_and_removed_once_keeping_others() {
        let others = vec!["example.com/other".to_string()];
        let added = with_finalizer(&others).unwrap();
        assert_eq!(added, ["example.com/other", FINALIZER]);
        assert_eq!(with_finalizer(&added), None);
        assert_eq!(without_finalizer(&added).unwrap(), others);
        assert_eq!(without_finalizer(&others), None);
    }

    #[test]
    fn ready_and_stalled_summarize_valid_and_materialized() {
        let now = t("2026-09-18T12:00:00Z");
        fn health_of(s: &BugReportStatus) -> ((ConditionStatus, &str), ConditionStatus) {
            (is(s, types::READY), is(s, types::STALLED).0)
        }
        let made = status(None, &materialized(false), Some(1), now);
        assert_eq!(
            health_of(&made),
            (
                (ConditionStatus::True, reasons::WORK_ITEM_CREATED),
                ConditionStatus::False
            )
        );
        let conflict = status(None, &materialized(true), Some(1), now);
        assert_eq!(
            health_of(&conflict),
            (
                (ConditionStatus::False, reasons::SOURCE_CONFLICT),
                ConditionStatus::True
            )
        );
        for (outcome, reason) in [
            (
                Outcome::Invalid("spec.bugId is empty".into()),
                reasons::SPEC_INVALID,
            ),
            (
                Outcome::UnknownRequirement("REQ-X".into()),
                reasons::UNKNOWN_REQUIREMENT,
            ),
            (
                Outcome::FactsChanged("scopes".into()),
                reasons::FACTS_CHANGED,
            ),
        ] {
            let s = status(Some(&made), &outcome, Some(2), now);
            assert_eq!(
                health_of(&s),
                ((ConditionStatus::False, reason), ConditionStatus::True),
                "{outcome:?}"
            );
        }
        for (outcome, reason) in [
            (
                Outcome::ProjectNotFound("cli-sync".into()),
                reasons::PROJECT_NOT_FOUND,
            ),
            (
                Outcome::RepositoryUnavailable("timeout".into()),
                reasons::REPOSITORY_UNAVAILABLE,
            ),
        ] {
            let s = status(None, &outcome, Some(1), now);
            assert_eq!(
                health_of(&s),
                ((ConditionStatus::False, reason), ConditionStatus::False),
                "{outcome:?}"
            );
        }
        // The summary conditions are not Events of their own.
        let reasons_of: Vec<String> = events(None, &made).into_iter().map(|e| e.reason).collect();
        assert_eq!(
            reasons_of,
            [reasons::REQUIREMENTS_ACTIVE, reasons::WORK_ITEM_CREATED],
            "Valid and Materialized only, never the summary conditions"
        );
    }
}
