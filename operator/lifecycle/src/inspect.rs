//! The evaluator's inspection seam behind `protobot rules evaluate`: one JSON
//! document in, `{"result", "record"}` out.
//!
//! Input fields (unknown fields are rejected, each error names its field):
//! - `record`: the work-item record in the §4.1 wire shape, or `null`;
//! - `operation`: the §4.2 operation envelope;
//! - `context`: the §3 trusted authorization context;
//! - `now`: the trusted evaluation time (RFC 3339);
//! - `idempotency`: stored results (`[{key, fingerprint, result}]`, optional);
//! - optional trusted inputs of §11: `project_id` (the trusted project; default:
//!   the record's, else the context's), `reservation`, `dependency_states`
//!   (`{id: state}`), `observed_readiness`, `approval`, `submission`,
//!   `planned_dependency_state`, `lease_seconds`, `next_fencing_token`
//!   (default: `fence-<id>-<next version>`).

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::{
    ApprovalRecord, AuthorizationContext, FencingToken, IdempotencyEntry, Inputs,
    OperationEnvelope, Readiness, Reservation, Ruleset, State, Submission, WorkItemRecord,
    evaluate,
};

const FIELDS: [&str; 15] = [
    "record",
    "operation",
    "context",
    "now",
    "idempotency",
    "project_id",
    "reservation",
    "dependency_states",
    "observed_readiness",
    "approval",
    "submission",
    "planned_dependency_state",
    "lease_seconds",
    "next_fencing_token",
    "comment",
];

/// A malformed input document: names the offending field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InputError {
    /// Not a JSON object.
    #[error("input is not a JSON object: {0}")]
    NotAnObject(String),
    /// A required field is missing.
    #[error("field `{0}` is required")]
    Missing(&'static str),
    /// A field has the wrong shape.
    #[error("field `{field}` is invalid: {reason}")]
    Invalid {
        /// The field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// A field this tool does not know.
    #[error("field `{0}` is not an input of rules evaluate")]
    Unknown(String),
    /// The embedded ruleset failed to load (a build defect).
    #[error("failed to load the ruleset: {0}")]
    Ruleset(String),
}

fn field<T: DeserializeOwned>(
    map: &Map<String, Value>,
    name: &'static str,
) -> Result<Option<T>, InputError> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| InputError::Invalid {
                field: name.to_string(),
                reason: one_line(&e.to_string()),
            }),
    }
}

fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// Evaluates one input document (see the module docs).
pub fn evaluate_document(text: &str) -> Result<Value, InputError> {
    Ok(evaluate_input(text)?.to_json(false))
}

/// [`evaluate_document`], with the audit events the command produced:
/// `"audit": {"count": n, "events": [...]}` (each event with its subject and
/// authorized human subject), the shape `protobot wms` answers with. A
/// rejection or a read produces none; an accepted mutation exactly one.
pub fn evaluate_document_with_audit(text: &str) -> Result<Value, InputError> {
    Ok(evaluate_input(text)?.to_json(true))
}

/// One evaluated document, typed.
struct Evaluated {
    evaluation: crate::Evaluation,
    /// The record after the command (unchanged: the input record).
    after: Option<WorkItemRecord>,
}

impl Evaluated {
    fn to_json(&self, with_audit: bool) -> Value {
        // `idempotency` is the entry a store would freeze under the key (null when
        // nothing is recorded); feed it back in `idempotency` to see a replay.
        let mut out = json!({
            "result": self.evaluation.result,
            "record": self.after,
            "idempotency": self.evaluation.effects.idempotency,
        });
        if with_audit {
            let events: Vec<&crate::AuditEvent> = self.evaluation.effects.audit.iter().collect();
            out["audit"] = json!({"count": events.len(), "events": events});
        }
        out
    }
}

fn evaluate_input(text: &str) -> Result<Evaluated, InputError> {
    let doc: Value = crate::strict::parse_document(text)
        .map_err(|e| InputError::NotAnObject(one_line(&e.to_string())))?;
    let Value::Object(map) = doc else {
        return Err(InputError::NotAnObject(
            "expected {\"record\", \"operation\", \"context\", \"now\"}".into(),
        ));
    };
    if let Some(unknown) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(InputError::Unknown(unknown.clone()));
    }
    let record: Option<WorkItemRecord> = field(&map, "record")?;
    if let Some(r) = &record
        && r.state == State::Initial
    {
        return Err(InputError::Invalid {
            field: "record.state".into(),
            reason: "initial is input-only and never stored; pass \"record\": null".into(),
        });
    }
    let operation: OperationEnvelope =
        field(&map, "operation")?.ok_or(InputError::Missing("operation"))?;
    let context: AuthorizationContext =
        field(&map, "context")?.ok_or(InputError::Missing("context"))?;
    let now: String = field(&map, "now")?.ok_or(InputError::Missing("now"))?;
    let now: Timestamp =
        crate::strict::parse_timestamp(&now).map_err(|reason| InputError::Invalid {
            field: "now".into(),
            reason: one_line(&reason),
        })?;
    let idempotency: Vec<IdempotencyEntry> = field(&map, "idempotency")?.unwrap_or_default();
    let project: String = field(&map, "project_id")?
        .or_else(|| record.as_ref().map(|r| r.project_id.clone()))
        .unwrap_or_else(|| context.project_id.clone());
    let reservation: Option<Reservation> = field(&map, "reservation")?;
    let dependency_states: BTreeMap<String, State> =
        field(&map, "dependency_states")?.unwrap_or_default();
    let observed: Option<Readiness> = field(&map, "observed_readiness")?;
    let approval: Option<ApprovalRecord> = field(&map, "approval")?;
    let submission: Option<Submission> = field(&map, "submission")?;
    let planned: Option<State> = field(&map, "planned_dependency_state")?;
    let lease_seconds: i64 = field(&map, "lease_seconds")?.unwrap_or(0);
    if lease_seconds < 0 {
        return Err(InputError::Invalid {
            field: "lease_seconds".into(),
            reason: format!(
                "{lease_seconds} is negative; pass a positive number of seconds, or omit it for the ruleset's default"
            ),
        });
    }
    let next_fencing_token: Option<FencingToken> =
        field::<FencingToken>(&map, "next_fencing_token")?.or_else(|| {
            let (id, v) = record
                .as_ref()
                .map_or((operation.work_item_id.as_str(), 0), |r| {
                    (r.id.as_str(), r.contract_version)
                });
            // At u64::MAX there is no next version: no token, and the evaluator rejects.
            v.checked_add(1)
                .map(|next| FencingToken::from(format!("fence-{id}-{next}")))
        });
    let entry = idempotency
        .iter()
        .find(|e| !operation.idempotency_key.is_empty() && e.key == operation.idempotency_key);
    let rules = Ruleset::v1().map_err(|e| InputError::Ruleset(e.to_string()))?;
    let inputs = Inputs {
        trusted_project: &project,
        now: Some(now),
        record: record.as_ref(),
        idempotency: entry,
        reservation: reservation.as_ref(),
        observed_readiness: observed.as_ref(),
        dependency_states,
        approval: approval.as_ref(),
        submission: submission.as_ref(),
        planned_dependency_state: planned,
        lease_seconds,
        next_fencing_token,
    };
    let evaluation = evaluate(rules, &operation, &context, &inputs);
    let after = evaluation.effects.record.clone().or(record);
    Ok(Evaluated { evaluation, after })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_audit_an_accepted_command_carries_its_one_event_and_a_rejection_none() {
        let out = evaluate_document_with_audit(&input(json!({}))).unwrap();
        assert_eq!(out["result"]["ok"], true, "{out}");
        assert_eq!(out["audit"]["count"], 1, "{out}");
        let event = &out["audit"]["events"][0];
        assert_eq!(event["operation"], "claim");
        assert_eq!(event["subject"], "job-site-a", "the trusted subject: {out}");
        assert!(
            event["authorized_human_subject"]
                .as_str()
                .unwrap_or("")
                .is_empty(),
            "a claim has no human subject: {event}"
        );
        let plain = evaluate_document(&input(json!({}))).unwrap();
        assert!(plain.get("audit").is_none(), "only asked for");
        let late =
            evaluate_document_with_audit(&input(json!({"now": "2026-09-20T12:00:00Z"}))).unwrap();
        assert_eq!(late["result"]["ok"], false, "{late}");
        assert_eq!(late["audit"], json!({"count": 0, "events": []}));
    }

    fn input(extra: Value) -> String {
        let mut doc = json!({
            "record": {"id": "wi-1", "project_id": "p", "state": "ready-for-building", "contract_version": 4,
                       "readiness": Readiness::complete()},
            "operation": {"operation": "claim", "actor_context_ref": "js", "work_item_id": "wi-1",
                          "expected_state": "ready-for-building", "expected_contract_version": 4,
                          "idempotency_key": "k1"},
            "context": {"subject": "job-site-a", "role": "job-site", "project_id": "p",
                        "allowed_actions": ["claim"], "allowed_refs": ["project:p"],
                        "expires_at": "2026-09-19T12:00:00Z", "policy_version": "wms-policy/v1"},
            "now": "2026-09-18T12:00:00Z",
        });
        if let (Value::Object(d), Value::Object(e)) = (&mut doc, extra) {
            d.extend(e);
        }
        doc.to_string()
    }

    #[test]
    fn a_claim_is_evaluated_and_the_record_after_is_returned() {
        let out = evaluate_document(&input(json!({}))).unwrap();
        assert_eq!(out["result"]["ok"], true);
        assert_eq!(
            out["result"]["decision"]["after"],
            json!({"state": "building", "contract_version": 5})
        );
        assert_eq!(out["record"]["state"], "building");
        assert_eq!(out["record"]["lease"]["fencing_token"], "fence-wi-1-5");
        assert_eq!(out["record"]["lease"]["expires_at"], "2026-09-18T12:15:00Z");
    }

    #[test]
    fn a_rejection_returns_the_record_unchanged() {
        let out = evaluate_document(&input(json!({"now": "2026-09-20T12:00:00Z"}))).unwrap();
        assert_eq!(out["result"]["error"]["code"], "UNAUTHORIZED_ACTION");
        assert_eq!(out["record"]["state"], "ready-for-building");
        assert_eq!(out["record"]["contract_version"], 4);
    }

    #[test]
    fn a_stored_result_replays() {
        let first = evaluate_document(&input(json!({}))).unwrap();
        let stored = json!([first["idempotency"]]);
        let out = evaluate_document(&input(json!({"idempotency": stored.clone()}))).unwrap();
        assert_eq!(out["result"]["outcome"], "replayed");
        assert_eq!(out["result"]["decision"]["replayed"], true);
        assert_eq!(
            out["record"]["state"], "ready-for-building",
            "a replay writes nothing"
        );
        let mut other = stored;
        other[0]["fingerprint"] = json!("sha256:deadbeef");
        let out = evaluate_document(&input(json!({"idempotency": other}))).unwrap();
        assert_eq!(
            out["result"]["error"]["code"], "IDEMPOTENCY_CONFLICT",
            "a different fingerprint conflicts"
        );
    }

    #[test]
    fn malformed_inputs_name_the_field() {
        assert_eq!(
            evaluate_document("[]").unwrap_err(),
            InputError::NotAnObject(
                "expected {\"record\", \"operation\", \"context\", \"now\"}".into()
            )
        );
        let err = evaluate_document(&input(json!({"now": "yesterday"}))).unwrap_err();
        assert!(
            matches!(&err, InputError::Invalid { field, .. } if field == "now"),
            "{err}"
        );
        let err = evaluate_document(&input(json!({"surprise": 1}))).unwrap_err();
        assert_eq!(err, InputError::Unknown("surprise".into()));
        let err =
            evaluate_document(r#"{"record": null, "context": {}, "now": "2026-09-18T12:00:00Z"}"#)
                .unwrap_err();
        assert_eq!(err, InputError::Missing("operation"));
        let err = evaluate_document(&input(json!({"record": {"id": "x"}}))).unwrap_err();
        assert!(
            matches!(&err, InputError::Invalid { field, .. } if field == "record"),
            "{err}"
        );
        let err = evaluate_document(&input(
            json!({"operation": {"operation": "claim", "bogus": true}}),
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("`operation`") && err.to_string().contains("bogus"),
            "{err}"
        );
    }

    /// Issue #16: the version counter at its maximum (the claim would mint `u64::MAX + 1`)
    /// is a rejection, never a panic (debug) or a wrap to 0 (release).
    #[test]
    fn a_contract_version_at_u64_max_is_rejected_not_wrapped() {
        let at_max = json!({"record": {"id": "wi-1", "project_id": "p", "state": "ready-for-building",
            "contract_version": u64::MAX, "readiness": Readiness::complete()},
            "operation": {"operation": "claim", "actor_context_ref": "js", "work_item_id": "wi-1",
                "expected_state": "ready-for-building", "expected_contract_version": u64::MAX,
                "idempotency_key": "k1"}});
        for extra in [at_max.clone(), {
            let mut v = at_max.clone();
            v["next_fencing_token"] = json!("fence-wi-1-x");
            v
        }] {
            let out = evaluate_document(&input(extra)).unwrap();
            assert_eq!(out["result"]["ok"], false, "{out}");
            assert_eq!(
                out["result"]["error"]["code"], "PRECONDITION_FAILED",
                "{out}"
            );
            assert_eq!(out["record"]["contract_version"], u64::MAX);
        }
    }

    /// Issue #16: duplicate keys, at the top and nested, are refused (the last would win
    /// silently).
    #[test]
    fn duplicate_json_keys_are_refused() {
        let doc = input(json!({}));
        let dup_top = doc.replacen('{', r#"{"now": "2020-01-01T00:00:00Z", "#, 1);
        assert!(
            matches!(evaluate_document(&dup_top), Err(InputError::NotAnObject(e)) if e.contains("duplicate key"))
        );
        let dup_nested = doc.replacen(
            r#""operation":{"#,
            r#""operation":{"operation":"abandon","#,
            1,
        );
        assert_ne!(dup_nested, doc, "the fixture has the shape the test edits");
        assert!(evaluate_document(&dup_nested).is_err());
    }

    /// Issue #16: a `:60` seconds field is refused wherever a timestamp is read (jiff would
    /// read it as `:59`).
    #[test]
    fn leap_second_timestamps_are_refused() {
        let doc = input(json!({}));
        let err = evaluate_document(&input(json!({"now": "2026-09-18T23:59:60Z"}))).unwrap_err();
        assert!(
            matches!(&err, InputError::Invalid { field, .. } if field == "now"),
            "{err}"
        );
        let mut ctx = serde_json::from_str::<Value>(&doc).unwrap()["context"].clone();
        ctx["expires_at"] = json!("2026-09-19T23:59:60Z");
        let err = evaluate_document(&input(json!({"context": ctx}))).unwrap_err();
        assert!(
            matches!(&err, InputError::Invalid { field, .. } if field == "context"),
            "{err}"
        );
    }

    /// Issue #16: a negative lease length is refused, not silently replaced by the default.
    #[test]
    fn a_negative_lease_length_is_refused() {
        let err = evaluate_document(&input(json!({"lease_seconds": -900}))).unwrap_err();
        assert!(
            matches!(&err, InputError::Invalid { field, .. } if field == "lease_seconds"),
            "{err}"
        );
        assert!(evaluate_document(&input(json!({"lease_seconds": 60}))).is_ok());
    }
}
