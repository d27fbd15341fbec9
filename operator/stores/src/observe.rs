//! Trusted WMS observations (§11): readiness, inspection evidence,
//! reconciliation evidence, independent Inspector confirmation, and the Job
//! Site's fenced attempts and run usage. They are
//! written by trusted controllers, never through an operation envelope, and
//! never change `contract_version`.

use protobot_lifecycle::State;

use crate::{Observation, StoreError, txn::WmsTxn};

/// Applies one observation to item `id`.
pub fn apply(txn: &mut dyn WmsTxn, id: &str, observation: Observation) -> Result<(), StoreError> {
    match observation {
        Observation::InspectorConfirmation { submission_id } => {
            let mut s = txn
                .submission(&submission_id)
                .ok_or_else(|| StoreError::NotFound(format!("submission {submission_id}")))?;
            let active = txn
                .record(id)
                .map(|r| r.active_resolution_submission_id)
                .unwrap_or_default();
            if s.status != "pending" || s.kind != "out-of-scope" || s.id != active {
                return Err(StoreError::ObservationRejected(
                    "inspector confirmation applies only to the active pending out-of-scope submission"
                        .to_string(),
                ));
            }
            s.inspector_confirmed = true;
            s.revision += 1;
            txn.put_submission(s);
            Ok(())
        }
        other => {
            let mut record = txn
                .record(id)
                .ok_or_else(|| StoreError::NotFound(format!("work item {id}")))?;
            match other {
                Observation::Readiness(r) => {
                    txn.put_observed_readiness(id, Some(r));
                    return Ok(());
                }
                Observation::Inspection {
                    inspection_run_sealed,
                    findings_terminal,
                    final_tests_passed,
                } => {
                    if record.state != State::Inspecting {
                        return Err(StoreError::ObservationRejected(format!(
                            "inspection evidence is observed only while inspecting (item is {})",
                            record.state
                        )));
                    }
                    record.inspection_run_sealed = inspection_run_sealed;
                    record.findings_terminal = findings_terminal;
                    record.final_tests_passed = final_tests_passed;
                }
                Observation::Reconciliation(r) => record.reconciliation = Some(r),
                Observation::Usage { fencing_token, run } => {
                    if !builds(&record, &fencing_token) {
                        return Err(StoreError::ObservationRejected(format!(
                            "run usage is recorded only by the holder of the live lease while building or inspecting (item is {}); the claim is stale",
                            record.state
                        )));
                    }
                    record.usage.record(run);
                }
                Observation::Attempt {
                    fencing_token,
                    attempt,
                } => {
                    if !builds(&record, &fencing_token) {
                        return Err(StoreError::ObservationRejected(format!(
                            "a build attempt is recorded only by the holder of the live lease while building or inspecting (item is {}); the claim is stale",
                            record.state
                        )));
                    }
                    record.attempts.retain(|a| a.cycle != attempt.cycle);
                    record.attempts.push(attempt);
                    record.attempts.sort_by_key(|a| a.cycle);
                    let excess = record
                        .attempts
                        .len()
                        .saturating_sub(protobot_lifecycle::ATTEMPTS_KEPT);
                    record.attempts.drain(..excess);
                }
                Observation::InspectorConfirmation { .. } => {}
            }
            txn.put_record(record);
            Ok(())
        }
    }
}

/// Whether `fencing_token` holds the live lease of `record` while it is being built or
/// inspected: who may record the Job Site's attempts and run usage.
fn builds(
    record: &protobot_lifecycle::WorkItemRecord,
    fencing_token: &protobot_lifecycle::FencingToken,
) -> bool {
    let fenced = record
        .lease
        .as_ref()
        .is_some_and(|l| l.admits(fencing_token));
    fenced && matches!(record.state, State::Building | State::Inspecting)
}
