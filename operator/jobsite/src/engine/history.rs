//! The persisted attempt history, read back (pure): which attempts count since the last block,
//! the escalation a resumed build continues with, and the labels attempts are stored under.

use protobot_lifecycle::AttemptRecord;

use crate::{escalation::Escalation, escalation::Outcome, escalation::Tier, triage::Decision};

/// The attempt outcome that marks where an item was blocked.
pub const BLOCKED_OUTCOME: &str = "blocked";

/// The attempts after the last block marker (all of them when there is none).
pub fn since_last_block(attempts: &[AttemptRecord]) -> &[AttemptRecord] {
    match attempts.iter().rposition(|a| a.outcome == BLOCKED_OUTCOME) {
        Some(at) => &attempts[at + 1..],
        None => attempts,
    }
}

/// The attempt label of a transient executor failure (retried at the same tier).
pub(super) const TRANSIENT: &str = "transient";

/// Maps a persisted attempt outcome to its escalation class.
pub(super) fn outcome_of(label: &str) -> Outcome {
    if let Some(model) = crate::escalation::outcome_of_label(label) {
        return model;
    }
    match label {
        "passed" => Outcome::Succeeded,
        "rejected-inspection" => Outcome::RejectedInspection,
        TRANSIENT => Outcome::ExecutorError,
        _ => Outcome::FailedGate,
    }
}

/// Whether an attempt with this label was transient (an executor or model failure): the
/// next attempt repeats its cycle at the same tier, with the feedback it had.
pub(super) fn is_transient(label: &str) -> bool {
    label == TRANSIENT || crate::escalation::outcome_of_label(label).is_some()
}

pub(super) fn tier_label(tier: Tier) -> String {
    tier.as_str().to_owned()
}

pub(super) fn tier_from(label: &str) -> Tier {
    Tier::parse(label).unwrap_or(Tier::T1)
}

/// The escalation a restarted Job Site resumes with: the persisted attempts, replayed.
pub fn escalation_from(start: Tier, attempts: &[AttemptRecord]) -> Escalation {
    let mut escalation = Escalation::new(start);
    escalation.history = attempts
        .iter()
        .map(|a| crate::escalation::Attempt {
            tier: tier_from(&a.tier),
            outcome: outcome_of(&a.outcome),
        })
        .collect();
    escalation
}

pub(super) fn label_of(decision: &Decision) -> String {
    match decision {
        Decision::Pass => "passed".into(),
        Decision::Rework { fault, .. } => serde_json::to_value(fault)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
    }
}
