//! The Finding Ledger: append-only, idempotent finding events, the legal
//! finding state machine, and the Inspection Run seal rule.
//!
//! Inspectors never edit a shared report. The first create for a producer
//! idempotency key allocates the finding (or returns it); every later change is
//! an immutable event with its own idempotency key and the expected finding
//! version, so a lost response can be retried without duplicating a route, a
//! confirmation or a resolution. The ledger assigns a global sequence. A run
//! seals only when every required producer completed, every prior finding was
//! rechecked for the current candidate and every current finding is terminal;
//! sealing records the high-watermark and later events for that run are refused.
//!
//! This module is pure: the ledger is a value; a store persists it (or its
//! events) inside the same atomic write as the work-item transition it causes.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Derived finding status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingState {
    /// New; awaiting a disposition.
    Open,
    /// A Worker-actionable defect, routed through the sanitizer.
    Routed,
    /// Needs specification or impact work.
    Blocked,
    /// A dismissal awaiting an independent vote.
    ConfirmationPending,
    /// Votes disagree; a third independent Inspector decides.
    Disputed,
    /// An approved out-of-scope declaration awaits confirmation.
    ScopeExclusionPending,
    /// The subject may be gone from the candidate.
    ObsolescencePending,
    /// Terminal: fixed for the verified candidate.
    Resolved,
    /// Terminal: independently confirmed not a defect.
    DismissedConfirmed,
    /// Terminal: confirmed wholly inside an approved exclusion.
    ScopeExcludedConfirmed,
    /// Terminal: confirmed absent from the candidate with obligations intact.
    SupersededConfirmed,
}

impl FindingState {
    /// Whether the state is terminal (for the verified candidate).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            FindingState::Resolved
                | FindingState::DismissedConfirmed
                | FindingState::ScopeExcludedConfirmed
                | FindingState::SupersededConfirmed
        )
    }
}

/// Dispositions an Inspector may propose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Disposition {
    /// Route to the code Worker.
    ImplementationDefect,
    /// Route to the test Worker.
    TestDefect,
    /// Route to both.
    BothDefective,
    /// A mutation survivor the tests should kill: route to the test Worker.
    TestGap,
    /// An applicable requirement was omitted: block.
    OmittedApplicable,
    /// No approved requirement covers the behaviour: block.
    SpecGap,
    /// Not a defect: needs independent confirmation.
    NotADefect,
    /// Equivalent mutant: needs independent confirmation.
    Equivalent,
    /// The mutation tool misbehaved: needs independent confirmation.
    ToolingInvalid,
}

impl Disposition {
    /// Where an agreed disposition leads.
    pub fn destination(self) -> FindingState {
        match self {
            Disposition::ImplementationDefect
            | Disposition::TestDefect
            | Disposition::BothDefective
            | Disposition::TestGap => FindingState::Routed,
            Disposition::OmittedApplicable | Disposition::SpecGap => FindingState::Blocked,
            Disposition::NotADefect | Disposition::Equivalent | Disposition::ToolingInvalid => {
                FindingState::DismissedConfirmed
            }
        }
    }
}

/// The required fields of a new finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewFinding {
    /// Producer idempotency key (create-or-return identity).
    pub producer_key: String,
    /// Producer principal.
    pub producer: String,
    /// Producer version.
    pub producer_version: String,
    /// Inspection run.
    pub run_id: String,
    /// Category.
    pub category: String,
    /// Severity.
    pub severity: String,
    /// Stable subject fingerprint.
    pub subject: String,
    /// Requirement IDs (empty only with an explicit spec-gap scope).
    pub requirement_ids: Vec<String>,
    /// Spec-gap scope when no approved requirement exists.
    pub spec_gap_scope: Option<String>,
    /// Content-addressed evidence digests.
    pub evidence: Vec<String>,
}

/// A change to a finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Change {
    /// An Inspector proposes a disposition (from `open`).
    Propose {
        /// The disposition.
        disposition: Disposition,
    },
    /// An independent vote on a pending dismissal or a dispute.
    Vote {
        /// The voter's disposition.
        disposition: Disposition,
    },
    /// A rechecking Inspector resolved it for the current candidate.
    Resolve,
    /// It is back.
    Reopen,
    /// The subject seems gone from the candidate.
    ProposeObsolescence,
    /// A Mutation or Spec Conformance Inspector confirms obsolescence.
    ConfirmObsolescence {
        /// `mutation` or `spec-conformance`.
        inspector_kind: String,
    },
    /// An approved out-of-scope declaration covers it.
    ProposeScopeExclusion,
    /// A Mutation or Spec Conformance Inspector confirms (or rejects) the exclusion.
    ConfirmScopeExclusion {
        /// `mutation` or `spec-conformance`.
        inspector_kind: String,
        /// False rejects the exclusion (back to blocked).
        accepted: bool,
    },
    /// Binds a terminal result to the current run's candidate.
    RecheckPassed,
}

/// One stored event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Global ledger sequence.
    pub sequence: u64,
    /// Event idempotency key.
    pub key: String,
    /// The finding.
    pub finding_id: String,
    /// The run it was appended for.
    pub run_id: String,
    /// Actor principal.
    pub actor: String,
    /// What changed.
    pub change: Change,
    /// State after the event.
    pub state_after: FindingState,
}

/// A finding with its derived status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Stable id (`F-<sequence>`).
    pub id: String,
    /// The creating fields.
    pub fields: NewFinding,
    /// Current status.
    pub state: FindingState,
    /// Bumped by every event.
    pub version: u64,
    /// The disposition under consideration and who voted for what.
    pub votes: Vec<(String, Disposition)>,
    /// Who proposed the current disposition.
    pub proposer: String,
    /// Confirmations collected for obsolescence or scope exclusion.
    pub confirmations: BTreeSet<String>,
    /// Runs whose candidate this finding was rechecked for.
    pub rechecked_in: BTreeSet<String>,
}

/// Why an append was refused. Nothing is written on refusal.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum LedgerError {
    /// A required field is missing.
    #[error("finding is incomplete: {0} is required")]
    Incomplete(String),
    /// The producer key was used for different content.
    #[error("producer key {0} already names a different finding")]
    ProducerKeyConflict(String),
    /// The event key was used for a different event.
    #[error("event key {0} already names a different event")]
    EventKeyConflict(String),
    /// No such finding.
    #[error("finding {0} does not exist")]
    UnknownFinding(String),
    /// No such run.
    #[error("inspection run {0} does not exist")]
    UnknownRun(String),
    /// The run is sealed.
    #[error("inspection run {0} is sealed; later events are refused")]
    Sealed(String),
    /// The expected finding version is stale.
    #[error("finding {id} is at version {current}, not {expected}; re-read it")]
    StaleVersion {
        /// Finding.
        id: String,
        /// Caller's expectation.
        expected: u64,
        /// Current.
        current: u64,
    },
    /// The change is not legal from the current state.
    #[error("{change} is not legal for finding {id} in state {state:?}")]
    IllegalChange {
        /// Finding.
        id: String,
        /// State.
        state: FindingState,
        /// Change kind.
        change: String,
    },
    /// The actor may not make this change (e.g. confirming its own proposal).
    #[error("{actor} is not independent of an earlier vote on finding {id}")]
    NotIndependent {
        /// Finding.
        id: String,
        /// Actor.
        actor: String,
    },
    /// The run cannot seal yet.
    #[error("inspection run {run} cannot seal: {reason}")]
    NotSealable {
        /// Run.
        run: String,
        /// The first unmet condition.
        reason: String,
    },
}

/// An immutable Inspection Run manifest plus its progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// Run id.
    pub id: String,
    /// The candidate commit inspected.
    pub candidate: String,
    /// Required producers.
    pub required_producers: BTreeSet<String>,
    /// Prior findings that must be rechecked.
    pub recheck: BTreeSet<String>,
    /// Ledger sequence at start.
    pub sequence_at_start: u64,
    /// Producers that appended their completed event.
    pub completed: BTreeSet<String>,
    /// Seal: the high-watermark sequence.
    pub sealed_at: Option<u64>,
}

/// The ledger value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// Last assigned sequence.
    pub sequence: u64,
    /// Findings by id.
    pub findings: BTreeMap<String, Finding>,
    /// Producer key → finding id.
    pub producer_keys: BTreeMap<String, String>,
    /// Events by key.
    pub events: BTreeMap<String, Event>,
    /// Runs by id.
    pub runs: BTreeMap<String, Run>,
}

impl Ledger {
    fn next(&mut self) -> u64 {
        self.sequence += 1;
        self.sequence
    }

    fn open_run(&self, run_id: &str) -> Result<&Run, LedgerError> {
        let run = self
            .runs
            .get(run_id)
            .ok_or_else(|| LedgerError::UnknownRun(run_id.into()))?;
        if run.sealed_at.is_some() {
            return Err(LedgerError::Sealed(run_id.into()));
        }
        Ok(run)
    }

    /// Starts a run from its manifest (create-or-return by id).
    pub fn start_run(
        &mut self,
        id: &str,
        candidate: &str,
        producers: &[&str],
        recheck: &[&str],
    ) -> &Run {
        let sequence_at_start = self.sequence;
        self.runs.entry(id.to_string()).or_insert_with(|| Run {
            id: id.into(),
            candidate: candidate.into(),
            required_producers: producers.iter().map(|s| s.to_string()).collect(),
            recheck: recheck.iter().map(|s| s.to_string()).collect(),
            sequence_at_start,
            completed: BTreeSet::new(),
            sealed_at: None,
        })
    }

    /// Creates a finding, or returns the one stored under its producer key.
    pub fn create(&mut self, new: NewFinding) -> Result<&Finding, LedgerError> {
        for (name, value) in [
            ("producer_key", &new.producer_key),
            ("producer", &new.producer),
            ("run_id", &new.run_id),
            ("subject", &new.subject),
            ("category", &new.category),
            ("severity", &new.severity),
        ] {
            if value.trim().is_empty() {
                return Err(LedgerError::Incomplete(name.into()));
            }
        }
        if new.requirement_ids.is_empty() && new.spec_gap_scope.as_deref().is_none_or(str::is_empty)
        {
            return Err(LedgerError::Incomplete(
                "requirement_ids or spec_gap_scope".into(),
            ));
        }
        if let Some(id) = self.producer_keys.get(&new.producer_key).cloned() {
            let existing = self
                .findings
                .get(&id)
                .ok_or_else(|| LedgerError::UnknownFinding(id.clone()))?;
            if existing.fields != new {
                return Err(LedgerError::ProducerKeyConflict(new.producer_key));
            }
            return Ok(existing);
        }
        self.open_run(&new.run_id)?;
        let id = format!("F-{:06}", self.next());
        self.producer_keys
            .insert(new.producer_key.clone(), id.clone());
        let finding = Finding {
            id: id.clone(),
            fields: new,
            state: FindingState::Open,
            version: 1,
            votes: Vec::new(),
            proposer: String::new(),
            confirmations: BTreeSet::new(),
            rechecked_in: BTreeSet::new(),
        };
        Ok(self.findings.entry(id).or_insert(finding))
    }

    /// Records that a required producer finished (even when it found nothing).
    pub fn producer_completed(&mut self, run_id: &str, producer: &str) -> Result<(), LedgerError> {
        self.open_run(run_id)?;
        if let Some(run) = self.runs.get_mut(run_id) {
            run.completed.insert(producer.to_string());
        }
        Ok(())
    }

    /// Appends one event; an exact retry of `key` returns the stored event.
    pub fn append(
        &mut self,
        key: &str,
        run_id: &str,
        finding_id: &str,
        expected_version: u64,
        actor: &str,
        change: Change,
    ) -> Result<Event, LedgerError> {
        if let Some(e) = self.events.get(key) {
            if e.finding_id == finding_id
                && e.run_id == run_id
                && e.actor == actor
                && e.change == change
            {
                return Ok(e.clone());
            }
            return Err(LedgerError::EventKeyConflict(key.into()));
        }
        self.open_run(run_id)?;
        let finding = self
            .findings
            .get(finding_id)
            .ok_or_else(|| LedgerError::UnknownFinding(finding_id.into()))?;
        if finding.version != expected_version {
            return Err(LedgerError::StaleVersion {
                id: finding_id.into(),
                expected: expected_version,
                current: finding.version,
            });
        }
        let mut next = finding.clone();
        apply(&mut next, run_id, actor, &change)?;
        next.version += 1;
        let event = Event {
            sequence: self.next(),
            key: key.into(),
            finding_id: finding_id.into(),
            run_id: run_id.into(),
            actor: actor.into(),
            change,
            state_after: next.state,
        };
        self.findings.insert(finding_id.to_string(), next);
        self.events.insert(key.to_string(), event.clone());
        Ok(event)
    }

    /// Findings created in, or listed for recheck by, a run.
    pub fn current_findings(&self, run_id: &str) -> Vec<&Finding> {
        let recheck = self
            .runs
            .get(run_id)
            .map(|r| r.recheck.clone())
            .unwrap_or_default();
        self.findings
            .values()
            .filter(|f| f.fields.run_id == run_id || recheck.contains(&f.id))
            .collect()
    }

    /// Seals a run when every condition holds; records the high-watermark.
    pub fn seal(&mut self, run_id: &str) -> Result<u64, LedgerError> {
        let run = self.open_run(run_id)?.clone();
        let not = |reason: String| {
            Err(LedgerError::NotSealable {
                run: run_id.into(),
                reason,
            })
        };
        if let Some(p) = run
            .required_producers
            .iter()
            .find(|p| !run.completed.contains(*p))
        {
            return not(format!("producer {p} has not completed"));
        }
        for id in &run.recheck {
            let rechecked = self
                .findings
                .get(id)
                .is_some_and(|f| f.rechecked_in.contains(run_id));
            if !rechecked {
                return not(format!(
                    "prior finding {id} has no recheck for this candidate"
                ));
            }
        }
        if let Some(f) = self
            .current_findings(run_id)
            .into_iter()
            .find(|f| !f.state.is_terminal())
        {
            return not(format!("finding {} is {:?}", f.id, f.state));
        }
        let watermark = self.sequence;
        if let Some(r) = self.runs.get_mut(run_id) {
            r.sealed_at = Some(watermark);
        }
        Ok(watermark)
    }

    /// The deterministic JSONL snapshot of a run (one finding per line, by id).
    pub fn snapshot_jsonl(&self, run_id: &str) -> String {
        let mut out = String::new();
        for f in self.current_findings(run_id) {
            if let Ok(line) = serde_json::to_string(f) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        out
    }
}

fn illegal(f: &Finding, change: &Change) -> LedgerError {
    let name = serde_json::to_value(change)
        .ok()
        .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string))
        .unwrap_or_default();
    LedgerError::IllegalChange {
        id: f.id.clone(),
        state: f.state,
        change: name,
    }
}

/// The finding state machine.
fn apply(f: &mut Finding, run_id: &str, actor: &str, change: &Change) -> Result<(), LedgerError> {
    use FindingState as S;
    let not_independent = || LedgerError::NotIndependent {
        id: f.id.clone(),
        actor: actor.into(),
    };
    match (f.state, change) {
        (S::Open, Change::Propose { disposition }) => {
            f.proposer = actor.into();
            f.votes = vec![(actor.into(), *disposition)];
            f.state = match disposition.destination() {
                S::DismissedConfirmed => S::ConfirmationPending,
                other => other,
            };
        }
        (S::ConfirmationPending | S::Disputed, Change::Vote { disposition }) => {
            if f.votes.iter().any(|(who, _)| who == actor) {
                return Err(not_independent());
            }
            f.votes.push((actor.into(), *disposition));
            let agreed = f
                .votes
                .iter()
                .find(|(_, d)| f.votes.iter().filter(|(_, e)| e == d).count() >= 2);
            f.state = match agreed {
                Some((_, d)) => d.destination(),
                None => S::Disputed,
            };
        }
        (S::Routed | S::Blocked, Change::Resolve) => f.state = S::Resolved,
        (
            S::Routed
            | S::Blocked
            | S::Resolved
            | S::DismissedConfirmed
            | S::ScopeExcludedConfirmed
            | S::SupersededConfirmed,
            Change::Reopen,
        ) => {
            f.state = S::Open;
            f.votes.clear();
            f.confirmations.clear();
        }
        (S::Open | S::Routed | S::Blocked, Change::ProposeObsolescence) => {
            f.proposer = actor.into();
            f.confirmations.clear();
            f.state = S::ObsolescencePending;
        }
        (S::Blocked, Change::ProposeScopeExclusion) => {
            f.proposer = actor.into();
            f.confirmations.clear();
            f.state = S::ScopeExclusionPending;
        }
        (S::ObsolescencePending, Change::ConfirmObsolescence { inspector_kind }) => {
            confirm(f, actor, inspector_kind)?;
            if f.confirmations.len() == 2 {
                f.state = S::SupersededConfirmed;
            }
        }
        (
            S::ScopeExclusionPending,
            Change::ConfirmScopeExclusion {
                inspector_kind,
                accepted,
            },
        ) => {
            if !accepted {
                f.confirmations.clear();
                f.state = S::Blocked;
            } else {
                confirm(f, actor, inspector_kind)?;
                if f.confirmations.len() == 2 {
                    f.state = S::ScopeExcludedConfirmed;
                }
            }
        }
        (state, Change::RecheckPassed) if state.is_terminal() => {
            f.rechecked_in.insert(run_id.to_string());
        }
        _ => return Err(illegal(f, change)),
    }
    if f.state.is_terminal() && !matches!(change, Change::RecheckPassed) {
        // A terminal result reached in this run is bound to its candidate.
        f.rechecked_in.insert(run_id.to_string());
    }
    Ok(())
}

/// One confirmation per inspector kind, never by the proposer.
fn confirm(f: &mut Finding, actor: &str, kind: &str) -> Result<(), LedgerError> {
    if actor == f.proposer {
        return Err(LedgerError::NotIndependent {
            id: f.id.clone(),
            actor: actor.into(),
        });
    }
    if kind != "mutation" && kind != "spec-conformance" {
        return Err(LedgerError::IllegalChange {
            id: f.id.clone(),
            state: f.state,
            change: format!("confirm by {kind}"),
        });
    }
    f.confirmations.insert(kind.to_string());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new(key: &str, run: &str) -> NewFinding {
        NewFinding {
            producer_key: key.into(),
            producer: "inspector-a".into(),
            producer_version: "1".into(),
            run_id: run.into(),
            category: "conformance".into(),
            severity: "major".into(),
            subject: format!("subject-{key}"),
            requirement_ids: vec!["REQ-1".into()],
            spec_gap_scope: None,
            evidence: vec!["sha256:e".into()],
        }
    }

    fn ledger() -> Ledger {
        let mut l = Ledger::default();
        l.start_run("run-1", "c1", &["inspector-a", "inspector-b"], &[]);
        l
    }

    #[test]
    fn create_is_create_or_return_by_producer_key() {
        let mut l = ledger();
        let id = l.create(new("k1", "run-1")).unwrap().id.clone();
        assert_eq!(l.create(new("k1", "run-1")).unwrap().id, id);
        let mut other = new("k1", "run-1");
        other.severity = "minor".into();
        assert_eq!(
            l.create(other),
            Err(LedgerError::ProducerKeyConflict("k1".into()))
        );
        assert_eq!(l.findings.len(), 1);
        let mut missing = new("k2", "run-1");
        missing.requirement_ids.clear();
        assert!(matches!(l.create(missing), Err(LedgerError::Incomplete(_))));
    }

    #[test]
    fn events_are_idempotent_and_versioned() {
        let mut l = ledger();
        let id = l.create(new("k1", "run-1")).unwrap().id.clone();
        let propose = Change::Propose {
            disposition: Disposition::ImplementationDefect,
        };
        let e1 = l
            .append("e1", "run-1", &id, 1, "inspector-a", propose.clone())
            .unwrap();
        assert_eq!(e1.state_after, FindingState::Routed);
        let retry = l
            .append("e1", "run-1", &id, 1, "inspector-a", propose)
            .unwrap();
        assert_eq!(retry, e1, "a lost response retries without a second event");
        assert_eq!(l.findings[&id].version, 2);
        assert!(matches!(
            l.append("e2", "run-1", &id, 1, "inspector-b", Change::Resolve),
            Err(LedgerError::StaleVersion { .. })
        ));
        assert!(matches!(
            l.append("e1", "run-1", &id, 2, "inspector-b", Change::Resolve),
            Err(LedgerError::EventKeyConflict(_))
        ));
    }

    #[test]
    fn dismissals_need_an_independent_matching_vote() {
        let mut l = ledger();
        let id = l.create(new("k1", "run-1")).unwrap().id.clone();
        l.append(
            "p",
            "run-1",
            &id,
            1,
            "inspector-a",
            Change::Propose {
                disposition: Disposition::NotADefect,
            },
        )
        .unwrap();
        assert_eq!(l.findings[&id].state, FindingState::ConfirmationPending);
        let self_vote = l.append(
            "v0",
            "run-1",
            &id,
            2,
            "inspector-a",
            Change::Vote {
                disposition: Disposition::NotADefect,
            },
        );
        assert!(
            matches!(self_vote, Err(LedgerError::NotIndependent { .. })),
            "no confirming your own proposal"
        );
        l.append(
            "v1",
            "run-1",
            &id,
            2,
            "inspector-b",
            Change::Vote {
                disposition: Disposition::TestDefect,
            },
        )
        .unwrap();
        assert_eq!(l.findings[&id].state, FindingState::Disputed);
        l.append(
            "v2",
            "run-1",
            &id,
            3,
            "inspector-c",
            Change::Vote {
                disposition: Disposition::TestDefect,
            },
        )
        .unwrap();
        assert_eq!(
            l.findings[&id].state,
            FindingState::Routed,
            "two matching votes decide: the tie-breaker routes"
        );
    }

    #[test]
    fn spec_gaps_block_and_exclusions_need_two_kinds_of_confirmation() {
        let mut l = ledger();
        let id = l.create(new("k1", "run-1")).unwrap().id.clone();
        l.append(
            "p",
            "run-1",
            &id,
            1,
            "inspector-a",
            Change::Propose {
                disposition: Disposition::SpecGap,
            },
        )
        .unwrap();
        assert_eq!(l.findings[&id].state, FindingState::Blocked);
        l.append(
            "x",
            "run-1",
            &id,
            2,
            "inspector-a",
            Change::ProposeScopeExclusion,
        )
        .unwrap();
        l.append(
            "c1",
            "run-1",
            &id,
            3,
            "mutation-1",
            Change::ConfirmScopeExclusion {
                inspector_kind: "mutation".into(),
                accepted: true,
            },
        )
        .unwrap();
        assert_eq!(l.findings[&id].state, FindingState::ScopeExclusionPending);
        l.append(
            "c2",
            "run-1",
            &id,
            4,
            "spec-1",
            Change::ConfirmScopeExclusion {
                inspector_kind: "spec-conformance".into(),
                accepted: true,
            },
        )
        .unwrap();
        assert_eq!(l.findings[&id].state, FindingState::ScopeExcludedConfirmed);
    }

    #[test]
    fn illegal_changes_are_refused_and_change_nothing() {
        let mut l = ledger();
        let id = l.create(new("k1", "run-1")).unwrap().id.clone();
        let before = l.clone();
        assert!(matches!(
            l.append("r", "run-1", &id, 1, "inspector-b", Change::Resolve),
            Err(LedgerError::IllegalChange { .. })
        ));
        assert_eq!(l, before);
    }

    #[test]
    fn a_run_seals_only_when_complete_and_then_refuses_events() {
        let mut l = ledger();
        let id = l.create(new("k1", "run-1")).unwrap().id.clone();
        assert!(
            matches!(l.seal("run-1"), Err(LedgerError::NotSealable { .. })),
            "producers pending"
        );
        l.producer_completed("run-1", "inspector-a").unwrap();
        l.producer_completed("run-1", "inspector-b").unwrap();
        let err = l.seal("run-1").unwrap_err();
        assert!(
            err.to_string().contains(&id),
            "an open finding blocks the seal: {err}"
        );
        l.append(
            "p",
            "run-1",
            &id,
            1,
            "inspector-a",
            Change::Propose {
                disposition: Disposition::ImplementationDefect,
            },
        )
        .unwrap();
        l.append("r", "run-1", &id, 2, "inspector-b", Change::Resolve)
            .unwrap();
        let watermark = l.seal("run-1").unwrap();
        assert_eq!(watermark, l.sequence);
        assert_eq!(
            l.append("late", "run-1", &id, 3, "inspector-b", Change::Reopen),
            Err(LedgerError::Sealed("run-1".into()))
        );
        assert_eq!(l.snapshot_jsonl("run-1").lines().count(), 1);
    }

    #[test]
    fn a_later_run_needs_a_recheck_of_prior_findings() {
        let mut l = ledger();
        let id = l.create(new("k1", "run-1")).unwrap().id.clone();
        l.append(
            "p",
            "run-1",
            &id,
            1,
            "inspector-a",
            Change::Propose {
                disposition: Disposition::TestDefect,
            },
        )
        .unwrap();
        l.append("r", "run-1", &id, 2, "inspector-b", Change::Resolve)
            .unwrap();
        l.start_run("run-2", "c2", &[], &[&id]);
        let err = l.seal("run-2").unwrap_err();
        assert!(err.to_string().contains("recheck"), "{err}");
        l.append("rc", "run-2", &id, 3, "inspector-b", Change::RecheckPassed)
            .unwrap();
        assert!(
            l.seal("run-2").is_ok(),
            "a resolution from an older candidate needs its recheck"
        );
    }
}
