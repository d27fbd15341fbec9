//! Read operations (§14): requests, sanitized work-item projections and the
//! blocked-work list. Reads never write and never need a key.

use protobot_lifecycle::{
    Operation, Rejection, ResultEnvelope, State, WorkItemRecord, WorkItemView,
};
use serde_json::{Map, Value};

use crate::{
    adapter::Call,
    namespace::{invalid, not_found},
    txn::RequestRecord,
};

/// The five choices offered for every blocked item.
pub const RESOLUTION_OPTIONS: [&str; 5] = [
    "add-requirement",
    "out-of-scope",
    "impact-amendment",
    "defer",
    "acknowledge",
];

/// Answers one read.
pub fn read(call: Call<'_>) -> ResultEnvelope {
    let op = call.operation.as_str();
    run(&call).unwrap_or_else(|r| ResultEnvelope::rejected(op, r))
}

fn filters(call: &Call<'_>, allowed: &[&str]) -> Result<Map<String, Value>, Rejection> {
    let map = match &call.env.payload {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => return Err(invalid("payload", "must be an object of filters")),
    };
    for (k, v) in &map {
        if !allowed.contains(&k.as_str()) {
            return Err(invalid(k, "unknown filter"));
        }
        if !v.is_string() {
            return Err(invalid(k, "filter values are strings"));
        }
    }
    Ok(map)
}

fn matches(map: &Map<String, Value>, key: &str, pred: impl Fn(&str) -> bool) -> bool {
    map.get(key).and_then(Value::as_str).is_none_or(pred)
}

/// A sanitized projection: no credentials, raw output, findings or backend labels.
pub fn view(record: &WorkItemRecord, requests: &[RequestRecord]) -> WorkItemView {
    let mut deps: Vec<String> = record.dependencies.iter().map(|d| d.id.clone()).collect();
    deps.sort();
    let request = requests.iter().find(|r| r.build_work_item_id == record.id);
    WorkItemView {
        id: record.id.clone(),
        state: record.state,
        owner: record.owner.clone(),
        dependencies: deps,
        priority: record.priority.clone(),
        contract_version: record.contract_version,
        request_id: request.map(|r| r.request_id.clone()),
        change_set_id: request
            .map(|r| r.change_set_id.clone())
            .filter(|s| !s.is_empty()),
        reason_kind: None,
        next_action: None,
        resolution_options: None,
    }
}

fn run(call: &Call<'_>) -> Result<ResultEnvelope, Rejection> {
    let op = call.operation.as_str();
    let requests = call.txn.requests();
    match call.operation {
        Operation::RequestGet => {
            let id = if call.env.request_id.is_empty() {
                filters(call, &["request_id"])?
                    .get("request_id")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            } else {
                call.env.request_id.clone()
            };
            let r = call.txn.request(&id).ok_or_else(|| not_found("request"))?;
            Ok(ResultEnvelope::read(op, "request")
                .with("request_id", &r.request_id)
                .with("request_revision", r.request_revision)
                .with("request", &r))
        }
        Operation::RequestQuery => {
            let f = filters(
                call,
                &[
                    "refinement_state",
                    "owner",
                    "business_priority",
                    "interface",
                    "scope",
                    "relationship",
                ],
            )?;
            let mut out: Vec<&RequestRecord> = requests
                .iter()
                .filter(|r| matches(&f, "refinement_state", |v| r.refinement_state == v))
                .filter(|r| matches(&f, "owner", |v| r.owner == v))
                .filter(|r| matches(&f, "business_priority", |v| r.business_priority == v))
                .filter(|r| {
                    matches(&f, "interface", |v| {
                        r.affected_interfaces.iter().any(|i| i == v)
                    })
                })
                .filter(|r| matches(&f, "scope", |v| r.affected_scopes.iter().any(|i| i == v)))
                .filter(|r| {
                    matches(&f, "relationship", |v| {
                        r.relationships.iter().any(|x| x.kind == v)
                    })
                })
                .collect();
            out.sort_by(|a, b| a.request_id.cmp(&b.request_id));
            Ok(ResultEnvelope::read(op, "request").with("requests", out))
        }
        Operation::WorkItemGet => {
            let r = call
                .txn
                .record(&call.env.work_item_id)
                .ok_or_else(|| not_found("work-item"))?;
            Ok(ResultEnvelope::read(op, "work-item")
                .with("work_item_id", &r.id)
                .with("items", vec![view(&r, &requests)]))
        }
        Operation::WorkItemQuery => {
            let f = filters(call, &["state", "owner", "dependency", "priority"])?;
            if let Some(s) = f.get("state").and_then(Value::as_str)
                && State::parse(s).is_none()
            {
                return Err(invalid("state", "not a lifecycle state"));
            }
            let mut items: Vec<WorkItemView> = call
                .txn
                .records()
                .iter()
                .filter(|r| matches(&f, "state", |v| r.state.as_str() == v))
                .filter(|r| matches(&f, "owner", |v| r.owner == v))
                .filter(|r| {
                    matches(&f, "dependency", |v| {
                        r.dependencies.iter().any(|d| d.id == v)
                    })
                })
                .filter(|r| matches(&f, "priority", |v| r.priority == v))
                .map(|r| view(r, &requests))
                .collect();
            items.sort_by(|a, b| a.id.cmp(&b.id));
            Ok(ResultEnvelope::read(op, "work-item").with("items", items))
        }
        _ => {
            filters(call, &[])?;
            let mut items: Vec<WorkItemView> = call
                .txn
                .records()
                .iter()
                .filter(|r| r.state == State::Blocked)
                .map(|r| {
                    let mut v = view(r, &requests);
                    v.reason_kind = Some(
                        if r.block_reason.to_lowercase().contains("undefined") {
                            "undefined-behavior"
                        } else {
                            "unresolved-precondition"
                        }
                        .to_string(),
                    );
                    v.next_action = Some("review-resolution".to_string());
                    v.resolution_options =
                        Some(RESOLUTION_OPTIONS.iter().map(|s| s.to_string()).collect());
                    v
                })
                .collect();
            items.sort_by(|a, b| a.id.cmp(&b.id));
            Ok(ResultEnvelope::read(op, "work-item").with("items", items))
        }
    }
}
