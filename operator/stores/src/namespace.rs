//! Shared plumbing of the non-lifecycle mutations: the request fingerprint,
//! idempotency replay/conflict, freezing results and small rejection helpers.

use protobot_lifecycle::{
    AuditEvent, Code, IdempotencyEntry, RULE_VERSION, Rejection, ResultEnvelope, fingerprint,
};
use serde_json::{Value, json};

use crate::adapter::Call;

/// The request-namespace fingerprint: the envelope minus actor ref and key, the
/// decoded payload, and the context minus its expiry.
pub fn fingerprint(call: &Call<'_>, payload: &Value) -> String {
    let mut actions = call.ctx.allowed_actions.clone();
    actions.sort();
    let mut refs = call.ctx.allowed_refs.clone();
    refs.sort();
    let e = call.env;
    fingerprint::digest_value(&json!({
        "operation": e.operation,
        "policy_version": e.policy_version,
        "request_id": e.request_id,
        "work_item_id": e.work_item_id,
        "expected_request_revision": e.expected_request_revision,
        "expected_state": e.expected_state,
        "expected_contract_version": e.expected_contract_version,
        "fencing_token": e.fencing_token,
        "human_approval_id": e.human_approval_id,
        "materialization_key": e.materialization_key,
        "payload": payload,
        "context": {
            "subject": call.ctx.subject,
            "role": call.ctx.role,
            "project_id": call.ctx.project_id,
            "work_item_id": call.ctx.work_item_id,
            "change_set_id": call.ctx.change_set_id,
            "allowed_actions": actions,
            "allowed_refs": refs,
            "policy_version": call.ctx.policy_version,
        },
    }))
}

/// Requires a key, then replays or rejects a reused one. `Ok(None)`: first use.
pub fn check_key(call: &Call<'_>, fp: &str) -> Result<Option<ResultEnvelope>, ResultEnvelope> {
    let op = call.operation.as_str();
    if call.env.idempotency_key.is_empty() {
        return Err(ResultEnvelope::rejected(
            op,
            Rejection::new(
                Code::InvalidRequest,
                "idempotency_key is required for mutations",
            )
            .with("field", "idempotency_key")
            .with("reason", "missing"),
        ));
    }
    match call.txn.idempotency(&call.env.idempotency_key) {
        None => Ok(None),
        Some(entry) if entry.fingerprint == fp => Ok(Some(entry.result.as_replay())),
        Some(entry) => Err(ResultEnvelope::rejected(
            op,
            Rejection::new(
                Code::IdempotencyConflict,
                "idempotency key was used for a different request",
            )
            .with("conflict_kind", "request-fingerprint")
            .with("key_scope", "project")
            .with("request_fingerprint_digest", fp)
            .with("recorded_fingerprint_digest", entry.fingerprint),
        )),
    }
}

/// Freezes `result` under the call's key and returns it.
pub fn freeze(call: &mut Call<'_>, fp: &str, result: ResultEnvelope) -> ResultEnvelope {
    call.txn.put_idempotency(IdempotencyEntry {
        key: call.env.idempotency_key.clone(),
        fingerprint: fp.to_string(),
        result: result.clone(),
    });
    result
}

/// An `INVALID_REQUEST` naming the field.
pub fn invalid(field: &str, reason: &str) -> Rejection {
    Rejection::new(Code::InvalidRequest, format!("{field}: {reason}"))
        .with("field", field)
        .with("reason", reason)
}

/// A `NOT_FOUND` for a target type.
pub fn not_found(target_type: &str) -> Rejection {
    Rejection::new(
        Code::NotFound,
        format!("{target_type} is not visible in this project"),
    )
    .with("target_type", target_type)
    .with("visibility_scope", "project")
}

/// Decodes a payload object strictly into `T`.
pub fn decode<T: serde::de::DeserializeOwned + Default>(
    payload: &Option<Value>,
) -> Result<T, Rejection> {
    match payload {
        None | Some(Value::Null) => Ok(T::default()),
        Some(v) => {
            serde_json::from_value(v.clone()).map_err(|e| invalid("payload", &e.to_string()))
        }
    }
}

/// Appends the audit event of an accepted non-lifecycle mutation.
pub fn audit(call: &mut Call<'_>, request_id: &str, work_item_id: &str, human: &str) {
    let event = AuditEvent {
        operation: call.operation.as_str().to_string(),
        subject: call.ctx.subject.clone(),
        authorized_human_subject: human.to_string(),
        request_id: request_id.to_string(),
        work_item_id: work_item_id.to_string(),
        idempotency_key: call.env.idempotency_key.clone(),
        outcome: "applied".to_string(),
        rule_version: RULE_VERSION.to_string(),
        policy_version: call.ctx.policy_version.clone(),
        before: None,
        after: None,
    };
    call.txn.append_audit(event);
}
