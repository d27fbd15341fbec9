//! The Finding Ledger append (`finding.create`, Job Site only): create-or-return
//! by the producer's idempotency key, a global sequence, and append-only state
//! events. The finding schema belongs to the Job Site; the ledger stores it opaque.

use protobot_lifecycle::{Code, Rejection, ResultEnvelope};
use serde::{Deserialize, Serialize};

use crate::{
    adapter::Call,
    namespace::{check_key, decode, fingerprint, freeze, invalid, not_found},
    txn::FindingRecord,
};

/// Finding states; everything but `open` is terminal.
pub const FINDING_STATES: [&str; 5] = ["open", "accepted", "rejected", "fixed", "waived"];

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct CreatePayload {
    producer_key: String,
    producer: String,
    inspection_run_id: String,
    state: String,
    body: serde_json::Value,
}

/// Appends one finding, or returns the one already stored under its producer key.
pub fn create(mut call: Call<'_>) -> ResultEnvelope {
    let op = call.operation.as_str();
    let payload = call.env.payload.clone().unwrap_or(serde_json::Value::Null);
    let fp = fingerprint(&call, &payload);
    match check_key(&call, &fp) {
        Ok(Some(replay)) => return replay,
        Ok(None) => {}
        Err(rejected) => return rejected,
    }
    let result = run(&mut call).unwrap_or_else(|r| ResultEnvelope::rejected(op, r));
    freeze(&mut call, &fp, result)
}

fn run(call: &mut Call<'_>) -> Result<ResultEnvelope, Rejection> {
    let p: CreatePayload = decode(&call.env.payload)?;
    if p.producer_key.trim().is_empty() {
        return Err(invalid("producer_key", "must not be blank"));
    }
    if p.producer.trim().is_empty() || p.inspection_run_id.trim().is_empty() {
        return Err(invalid(
            "producer",
            "producer and inspection_run_id are required",
        ));
    }
    let state = if p.state.is_empty() {
        "open".to_string()
    } else {
        p.state.clone()
    };
    if !FINDING_STATES.contains(&state.as_str()) {
        return Err(invalid("state", "unknown finding state"));
    }
    if call.txn.record(&call.env.work_item_id).is_none() {
        return Err(not_found("work-item"));
    }
    if let Some(existing) = call.txn.finding(&p.producer_key) {
        let same = existing.producer == p.producer
            && existing.inspection_run_id == p.inspection_run_id
            && existing.work_item_id == call.env.work_item_id
            && existing.body == p.body;
        if !same {
            return Err(Rejection::new(
                Code::IdempotencyConflict,
                "producer key names another finding",
            )
            .with("conflict_kind", "finding-producer-key"));
        }
        return Ok(ResultEnvelope::read(call.operation.as_str(), "finding")
            .with("finding", &existing)
            .with("sequence", existing.sequence));
    }
    let finding = FindingRecord {
        sequence: call.txn.next("finding"),
        producer_key: p.producer_key,
        producer: p.producer,
        inspection_run_id: p.inspection_run_id,
        work_item_id: call.env.work_item_id.clone(),
        state,
        body: p.body,
    };
    call.txn.put_finding(finding.clone());
    Ok(ResultEnvelope::applied(call.operation.as_str(), "finding")
        .with("sequence", finding.sequence)
        .with("finding", &finding))
}
