//! Blocked-work submissions and acknowledgements (§12.3, §12.4). Neither is a
//! lifecycle transition: no validation-rules decision, no state or version
//! change. A submission verifies its approval without consuming it (the
//! Materializer's `resolve-block` consumes it later); an acknowledgement
//! consumes its approval in the same write.

use protobot_lifecycle::{
    ApprovalUse, Code, Operation, Rejection, ResultEnvelope, State, Submission, WorkItemRecord,
    context::unauthorized,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::{
    adapter::Call,
    namespace::{audit, check_key, decode, fingerprint, freeze, invalid, not_found},
};

const SUBMISSION_KINDS: [&str; 3] = ["add-requirement", "out-of-scope", "impact-amendment"];

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct SubmitPayload {
    resolution_kind: String,
    change_set_id: String,
    approval_resolution_digest: String,
    human_approval_id: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct AckPayload {
    reason: String,
    approval_resolution_digest: String,
    human_approval_id: String,
}

/// Dispatches a submission or an acknowledgement.
pub fn mutate(mut call: Call<'_>) -> ResultEnvelope {
    let op = call.operation.as_str();
    let payload = call.env.payload.clone().unwrap_or(serde_json::Value::Null);
    let fp = fingerprint(&call, &payload);
    match check_key(&call, &fp) {
        Ok(Some(replay)) => return replay,
        Ok(None) => {}
        Err(rejected) => return rejected,
    }
    let outcome = if call.operation == Operation::BlockedWorkSubmitResolution {
        submit(&mut call)
    } else {
        acknowledge(&mut call)
    };
    let result = outcome.unwrap_or_else(|r| ResultEnvelope::rejected(op, r));
    freeze(&mut call, &fp, result)
}

/// Target exists, expected state and version, item blocked (§12.3 order).
fn blocked_target(call: &Call<'_>) -> Result<WorkItemRecord, Rejection> {
    let Some(item) = call.txn.record(&call.env.work_item_id) else {
        return Err(not_found("work-item"));
    };
    let expected = call.env.expected_state.clone().unwrap_or_default();
    if expected != item.state.as_str() {
        return Err(Rejection::new(
            Code::StaleState,
            "expected state differs from the current state",
        )
        .with("expected_state", expected)
        .with("current_state", item.state.as_str()));
    }
    if call.env.expected_contract_version != Some(item.contract_version) {
        return Err(Rejection::new(
            Code::StaleContractVersion,
            "expected contract version differs",
        )
        .with(
            "expected_contract_version",
            json!(call.env.expected_contract_version),
        )
        .with("current_contract_version", item.contract_version));
    }
    if item.state != State::Blocked {
        return Err(
            Rejection::new(Code::InvalidTransition, "work item is not blocked")
                .with("operation", call.operation.as_str())
                .with("current_state", item.state.as_str()),
        );
    }
    Ok(item)
}

fn approval_id(call: &Call<'_>, payload_id: &str) -> String {
    if call.env.human_approval_id.is_empty() {
        payload_id.to_string()
    } else {
        call.env.human_approval_id.clone()
    }
}

fn submit(call: &mut Call<'_>) -> Result<ResultEnvelope, Rejection> {
    let mut item = blocked_target(call)?;
    let p: SubmitPayload = decode(&call.env.payload)?;
    if !SUBMISSION_KINDS.contains(&p.resolution_kind.as_str()) {
        return Err(invalid(
            "resolution_kind",
            "must be add-requirement, out-of-scope or impact-amendment",
        ));
    }
    let needs_change_set = p.resolution_kind != "out-of-scope";
    if needs_change_set && p.change_set_id.trim().is_empty() {
        return Err(invalid(
            "change_set_id",
            "required for this resolution kind",
        ));
    }
    let approval_id = approval_id(call, &p.human_approval_id);
    if approval_id.is_empty() || p.approval_resolution_digest.is_empty() {
        return Err(unauthorized(
            "a resolution needs a human approval and its digest",
        ));
    }
    let change_set = if p.change_set_id.is_empty() {
        None
    } else {
        Some(
            call.txn
                .change_set(&p.change_set_id)
                .ok_or_else(|| not_found("change-set"))?,
        )
    };
    let Some(approval) = call.txn.approval(&approval_id) else {
        return Err(unauthorized("approval does not exist"));
    };
    let project = call.txn.project_id().to_string();
    let expected_state = call.env.expected_state.clone();
    approval
        .check(
            &ApprovalUse {
                action: "resolve-block",
                principal: &call.cfg.materializer_subject,
                digest: &p.approval_resolution_digest,
                project_id: Some(&project),
                work_item_id: Some(&item.id),
                resolution_kind: Some(&p.resolution_kind),
                expected_state: expected_state.as_deref(),
                expected_contract_version: call.env.expected_contract_version,
                policy_version: Some(&call.ctx.policy_version),
                change_set_id: Some(&p.change_set_id),
                ..ApprovalUse::default()
            },
            call.now,
        )
        .map_err(unauthorized)?;

    let revision = call
        .txn
        .submissions()
        .iter()
        .filter(|s| s.work_item_id == item.id && s.kind != "acknowledge")
        .map(|s| s.revision)
        .max()
        .unwrap_or(0)
        + 1;
    let id = format!(
        "resolution-submission-{:03}",
        call.txn.next("resolution-submission")
    );
    let mut result = ResultEnvelope::applied(call.operation.as_str(), "submission")
        .with("submission", "accepted")
        .with("approval_status", "unused")
        .with("resolution_submission_id", &id)
        .with("resolution_submission_revision", revision)
        .with("work_item_id", &item.id)
        .with("work_item_state", item.state)
        .with("contract_version", item.contract_version);
    // Supersede the prior pending submission; revoke its approval unless reused.
    if let Some(mut prior) = call
        .txn
        .submission(&item.active_resolution_submission_id)
        .filter(|s| s.status == "pending")
    {
        prior.status = "superseded".to_string();
        result = result
            .with("prior_resolution_submission_id", &prior.id)
            .with("prior_submission_status", "superseded");
        if prior.approval_id != approval_id {
            if let Some(mut old) = call.txn.approval(&prior.approval_id) {
                old.status = "revoked".to_string();
                result = result.with("prior_approval_status", "revoked");
                call.txn.put_approval(old);
            }
        } else {
            result = result.with("prior_approval_status", "unused");
        }
        call.txn.put_submission(prior);
    }
    if p.resolution_kind == "add-requirement" {
        let complete = change_set
            .as_ref()
            .filter(|cs| !cs.build_work_item_id.is_empty())
            .and_then(|cs| call.txn.record(&cs.build_work_item_id))
            .is_some_and(|r| r.state == State::Completed);
        result = result.with(
            "planned_dependency",
            json!({"change_set_id": p.change_set_id, "status": if complete { "complete" } else { "incomplete" }}),
        );
    }
    call.txn.put_submission(Submission {
        id: id.clone(),
        work_item_id: item.id.clone(),
        kind: p.resolution_kind.clone(),
        change_set_id: p.change_set_id.clone(),
        approval_id: approval_id.clone(),
        approval_digest: p.approval_resolution_digest.clone(),
        approved_human_subject: approval.approved_subject.clone(),
        status: "pending".to_string(),
        revision,
        inspector_confirmed: false,
    });
    item.active_resolution_submission_id = id;
    let item_id = item.id.clone();
    call.txn.put_record(item);
    audit(call, "", &item_id, &approval.approved_subject);
    Ok(result)
}

fn acknowledge(call: &mut Call<'_>) -> Result<ResultEnvelope, Rejection> {
    let item = blocked_target(call)?;
    let p: AckPayload = decode(&call.env.payload)?;
    let approval_id = approval_id(call, &p.human_approval_id);
    // The reference reports a blank reason as unauthorized, not invalid (§20.13).
    if p.reason.trim().is_empty() {
        return Err(unauthorized("an acknowledgement needs a non-blank reason"));
    }
    if approval_id.is_empty() || p.approval_resolution_digest.is_empty() {
        return Err(unauthorized(
            "an acknowledgement needs a human approval and its digest",
        ));
    }
    let Some(mut approval) = call.txn.approval(&approval_id) else {
        return Err(unauthorized("approval does not exist"));
    };
    let project = call.txn.project_id().to_string();
    let expected_state = call.env.expected_state.clone();
    approval
        .check(
            &ApprovalUse {
                action: "blocked-work.acknowledge",
                principal: &call.ctx.subject,
                digest: &p.approval_resolution_digest,
                project_id: Some(&project),
                work_item_id: Some(&item.id),
                expected_state: expected_state.as_deref(),
                expected_contract_version: call.env.expected_contract_version,
                policy_version: Some(&call.ctx.policy_version),
                ..ApprovalUse::default()
            },
            call.now,
        )
        .map_err(unauthorized)?;
    let human = approval.approved_subject.clone();
    approval.status = "consumed".to_string();
    call.txn.put_approval(approval);
    let id = format!("acknowledgement-{:03}", call.txn.next("acknowledgement"));
    call.txn.put_submission(Submission {
        id: id.clone(),
        work_item_id: item.id.clone(),
        kind: "acknowledge".to_string(),
        change_set_id: String::new(),
        approval_id,
        approval_digest: p.approval_resolution_digest.clone(),
        approved_human_subject: human.clone(),
        status: "consumed".to_string(),
        revision: 1,
        inspector_confirmed: false,
    });
    audit(call, "", &item.id, &human);
    Ok(
        ResultEnvelope::applied(call.operation.as_str(), "submission")
            .with("approval_status", "consumed")
            .with("resolution_submission_id", &id)
            .with("resolution_submission_revision", 1)
            .with("work_item_id", &item.id)
            .with("work_item_state", item.state)
            .with("contract_version", item.contract_version),
    )
}
