//! Request-namespace mutations (§14): create, refine (human approval),
//! update-priority (human only), link a change set, link a build work item.
//! None of them touches a work item's `contract_version`; a failure leaves no
//! partial request, link or priority event.

use protobot_lifecycle::{
    ApprovalUse, Code, Operation, Rejection, ResultEnvelope, context::unauthorized,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::{
    adapter::Call,
    namespace::{audit, check_key, decode, fingerprint, freeze, invalid, not_found},
    txn::{Relationship, RequestRecord},
};

const PRIORITIES: [&str; 4] = ["low", "normal", "high", "urgent"];
const CLASSIFICATIONS: [&str; 3] = ["undefined", "changes", "contradicts"];
const REFINEMENT_STATES: [&str; 4] = ["unrefined", "refining", "ready-for-dimensioning", "closed"];
const RELATIONSHIPS: [&str; 4] = ["depends-on", "conflicts-with", "supersedes", "related-to"];

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct CreatePayload {
    intent: String,
    rationale: String,
    affected_interfaces: Vec<String>,
    affected_scopes: Vec<String>,
    owner: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RefinePayload {
    intent: Option<String>,
    rationale: Option<String>,
    classification: Option<String>,
    refinement_state: Option<String>,
    owner: Option<String>,
    affected_interfaces: Option<Vec<String>>,
    affected_scopes: Option<Vec<String>>,
    relationships: Option<Vec<Relationship>>,
    human_approval_id: String,
    approval_refinement_digest: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct PriorityPayload {
    business_priority: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct LinkChangeSetPayload {
    change_set_id: String,
    target_revision: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct LinkWorkItemPayload {
    build_work_item_id: String,
}

/// Trims, drops empties, de-duplicates and sorts.
fn normalize(items: &[String]) -> Vec<String> {
    let mut out: Vec<String> = items
        .iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    out.sort();
    out.dedup();
    out
}

fn semantic_key(r: &RequestRecord) -> (String, Vec<String>, Vec<String>) {
    (
        r.intent.trim().to_lowercase(),
        r.affected_interfaces.clone(),
        r.affected_scopes.clone(),
    )
}

/// Dispatches one request mutation.
pub fn mutate(mut call: Call<'_>) -> ResultEnvelope {
    match run(&mut call) {
        Ok(r) | Err(r) => r,
    }
}

fn run(call: &mut Call<'_>) -> Result<ResultEnvelope, ResultEnvelope> {
    let op = call.operation.as_str();
    let reject = |r: Rejection| ResultEnvelope::rejected(op, r);
    let payload_value = call.env.payload.clone().unwrap_or(serde_json::Value::Null);
    let fp = fingerprint(call, &payload_value);
    if let Some(replay) = check_key(call, &fp)? {
        return Ok(replay);
    }
    // Past the key check every outcome is frozen under the key.
    let outcome = match call.operation {
        Operation::RequestCreate => create(call),
        Operation::RequestRefine => refine(call),
        Operation::RequestUpdatePriority => update_priority(call),
        Operation::RequestLinkChangeSet => link_change_set(call),
        _ => link_work_item(call),
    };
    let result = outcome.unwrap_or_else(reject);
    Ok(freeze(call, &fp, result))
}

fn create(call: &mut Call<'_>) -> Result<ResultEnvelope, Rejection> {
    let p: CreatePayload = decode(&call.env.payload)?;
    if p.intent.trim().is_empty() {
        return Err(invalid("intent", "must not be blank"));
    }
    if p.rationale.trim().is_empty() {
        return Err(invalid("rationale", "must not be blank"));
    }
    let mut request = RequestRecord {
        intent: p.intent.trim().to_string(),
        rationale: p.rationale.trim().to_string(),
        created_by: call.ctx.subject.clone(),
        owner: p.owner.trim().to_string(),
        affected_interfaces: normalize(&p.affected_interfaces),
        affected_scopes: normalize(&p.affected_scopes),
        refinement_state: "unrefined".to_string(),
        business_priority: "normal".to_string(),
        request_revision: 1,
        ..RequestRecord::default()
    };
    if let Some(dup) = call
        .txn
        .requests()
        .iter()
        .find(|r| semantic_key(r) == semantic_key(&request))
    {
        return Err(
            Rejection::new(Code::DuplicateRequest, "an equivalent request exists")
                .with("request_id", dup.request_id.as_str()),
        );
    }
    request.request_id = format!("request-{:03}", call.txn.next("request"));
    let id = request.request_id.clone();
    call.txn.put_request(request);
    audit(call, &id, "", "");
    Ok(ResultEnvelope::applied(call.operation.as_str(), "request")
        .with("request_id", &id)
        .with("request_revision", 1))
}

/// Loads the request and checks its expected revision.
fn current_request(call: &Call<'_>) -> Result<RequestRecord, Rejection> {
    let Some(request) = call.txn.request(&call.env.request_id) else {
        return Err(not_found("request"));
    };
    if call.env.expected_request_revision != Some(request.request_revision) {
        return Err(Rejection::new(
            Code::StaleRequestRevision,
            "expected request revision differs",
        )
        .with(
            "expected_request_revision",
            json!(call.env.expected_request_revision),
        )
        .with("current_request_revision", request.request_revision));
    }
    Ok(request)
}

fn refine(call: &mut Call<'_>) -> Result<ResultEnvelope, Rejection> {
    let mut request = current_request(call)?;
    let p: RefinePayload = decode(&call.env.payload)?;
    if let Some(c) = p.classification.as_deref() {
        if !CLASSIFICATIONS.contains(&c) {
            return Err(invalid(
                "classification",
                "must be undefined, changes or contradicts",
            ));
        }
        request.classification = c.to_string();
    }
    if let Some(s) = p.refinement_state.as_deref() {
        if !REFINEMENT_STATES.contains(&s) {
            return Err(invalid("refinement_state", "unknown refinement state"));
        }
        request.refinement_state = s.to_string();
    }
    if let Some(rels) = &p.relationships {
        let mut seen = std::collections::BTreeSet::new();
        for rel in rels {
            if !RELATIONSHIPS.contains(&rel.kind.as_str()) {
                return Err(invalid("relationships.type", "unknown relationship type"));
            }
            if rel.target == request.request_id || call.txn.request(&rel.target).is_none() {
                return Err(invalid(
                    "relationships.target",
                    "must name another existing request",
                ));
            }
            if !seen.insert(rel.clone()) {
                return Err(invalid("relationships", "duplicate relationship"));
            }
        }
        request.relationships = seen.into_iter().collect();
    }
    if let Some(v) = p.intent.as_deref() {
        if v.trim().is_empty() {
            return Err(invalid("intent", "must not be blank"));
        }
        request.intent = v.trim().to_string();
    }
    if let Some(v) = p.rationale.as_deref() {
        if v.trim().is_empty() {
            return Err(invalid("rationale", "must not be blank"));
        }
        request.rationale = v.trim().to_string();
    }
    if let Some(v) = p.owner.as_deref() {
        request.owner = v.trim().to_string();
    }
    if let Some(v) = &p.affected_interfaces {
        request.affected_interfaces = normalize(v);
    }
    if let Some(v) = &p.affected_scopes {
        request.affected_scopes = normalize(v);
    }
    // The approval binds the request, the caller and the digest. The newest doc
    // wants the digest to be a canonical digest of the post-refinement content;
    // no algorithm is published (§20.12), so the Gate's digest is compared as given.
    let approval_id = if call.env.human_approval_id.is_empty() {
        p.human_approval_id.clone()
    } else {
        call.env.human_approval_id.clone()
    };
    if approval_id.is_empty() || p.approval_refinement_digest.is_empty() {
        return Err(unauthorized(
            "request.refine needs a human approval and its digest",
        ));
    }
    let Some(mut approval) = call.txn.approval(&approval_id) else {
        return Err(unauthorized("approval does not exist"));
    };
    let project = call.txn.project_id().to_string();
    approval
        .check(
            &ApprovalUse {
                action: "request.refine",
                principal: &call.ctx.subject,
                digest: &p.approval_refinement_digest,
                project_id: Some(&project),
                request_id: Some(&request.request_id),
                policy_version: Some(&call.ctx.policy_version),
                ..ApprovalUse::default()
            },
            call.now,
        )
        .map_err(unauthorized)?;
    let key = semantic_key(&request);
    if let Some(dup) = call
        .txn
        .requests()
        .iter()
        .find(|r| r.request_id != request.request_id && semantic_key(r) == key)
    {
        return Err(
            Rejection::new(Code::DuplicateRequest, "an equivalent request exists")
                .with("request_id", dup.request_id.as_str()),
        );
    }
    request.request_revision += 1;
    let human = approval.approved_subject.clone();
    approval.status = "consumed".to_string();
    call.txn.put_approval(approval);
    let (id, rev) = (request.request_id.clone(), request.request_revision);
    call.txn.put_request(request);
    audit(call, &id, "", &human);
    Ok(ResultEnvelope::applied(call.operation.as_str(), "request")
        .with("request_id", &id)
        .with("request_revision", rev)
        .with("approval_status", "consumed"))
}

fn update_priority(call: &mut Call<'_>) -> Result<ResultEnvelope, Rejection> {
    let mut request = current_request(call)?;
    let p: PriorityPayload = decode(&call.env.payload)?;
    if !PRIORITIES.contains(&p.business_priority.as_str()) {
        return Err(invalid(
            "business_priority",
            "must be low, normal, high or urgent",
        ));
    }
    let mut change_set = None;
    if !request.change_set_id.is_empty() {
        change_set = Some(
            call.txn
                .change_set(&request.change_set_id)
                .ok_or_else(|| not_found("change-set"))?,
        );
    }
    let mut item = None;
    if !request.build_work_item_id.is_empty() {
        item = Some(
            call.txn
                .record(&request.build_work_item_id)
                .ok_or_else(|| not_found("work-item"))?,
        );
    }
    request.business_priority = p.business_priority.clone();
    request.request_revision += 1;
    let mut result = ResultEnvelope::applied(call.operation.as_str(), "request")
        .with("request_id", &request.request_id)
        .with("request_revision", request.request_revision)
        .with("audit_event", "priority-updated");
    if let Some(mut cs) = change_set {
        cs.priority = p.business_priority.clone();
        result = result.with("linked_change_set_priority", &cs.priority);
        call.txn.put_change_set(cs);
    }
    let mut item_id = String::new();
    if let Some(mut wi) = item {
        // A priority snapshot is not a lifecycle transition: the version stays.
        wi.priority = p.business_priority.clone();
        result = result
            .with("linked_work_item_priority", &wi.priority)
            .with("work_item_state", wi.state)
            .with("contract_version", wi.contract_version);
        item_id = wi.id.clone();
        call.txn.put_record(wi);
    }
    let id = request.request_id.clone();
    call.txn.put_request(request);
    let subject = call.ctx.subject.clone();
    audit(call, &id, &item_id, &subject);
    Ok(result)
}

fn link_change_set(call: &mut Call<'_>) -> Result<ResultEnvelope, Rejection> {
    let mut request = current_request(call)?;
    let p: LinkChangeSetPayload = decode(&call.env.payload)?;
    if p.change_set_id.trim().is_empty() {
        return Err(invalid("change_set_id", "must not be blank"));
    }
    let Some(mut cs) = call.txn.change_set(&p.change_set_id) else {
        return Err(not_found("change-set"));
    };
    if !request.change_set_id.is_empty() {
        return Err(invalid(
            "change_set_id",
            "request is already linked to a change set",
        ));
    }
    if !p.target_revision.is_empty() && p.target_revision != cs.revision {
        return Err(invalid("target_revision", "change set revision differs"));
    }
    if cs.revision != "proposed" && cs.revision != "approved" {
        return Err(invalid(
            "change_set_id",
            "change set is not proposed or approved",
        ));
    }
    request.change_set_id = cs.id.clone();
    request.request_revision += 1;
    cs.priority = request.business_priority.clone();
    call.txn.put_change_set(cs.clone());
    let (id, rev) = (request.request_id.clone(), request.request_revision);
    call.txn.put_request(request);
    audit(call, &id, "", "");
    Ok(ResultEnvelope::applied(call.operation.as_str(), "request")
        .with("request_id", &id)
        .with("request_revision", rev)
        .with("link", json!({"change_set_id": cs.id})))
}

fn link_work_item(call: &mut Call<'_>) -> Result<ResultEnvelope, Rejection> {
    let mut request = current_request(call)?;
    let p: LinkWorkItemPayload = decode(&call.env.payload)?;
    if p.build_work_item_id.trim().is_empty() {
        return Err(invalid("build_work_item_id", "must not be blank"));
    }
    let Some(mut item) = call.txn.record(&p.build_work_item_id) else {
        return Err(not_found("work-item"));
    };
    if !request.build_work_item_id.is_empty() {
        return Err(invalid(
            "build_work_item_id",
            "request is already linked to a work item",
        ));
    }
    request.build_work_item_id = item.id.clone();
    request.request_revision += 1;
    item.priority = request.business_priority.clone();
    let item_id = item.id.clone();
    call.txn.put_record(item);
    let (id, rev) = (request.request_id.clone(), request.request_revision);
    call.txn.put_request(request);
    audit(call, &id, &item_id, "");
    Ok(ResultEnvelope::applied(call.operation.as_str(), "request")
        .with("request_id", &id)
        .with("request_revision", rev)
        .with("link", json!({"build_work_item_id": item_id})))
}
