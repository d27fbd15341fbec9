//! The wire shapes of the WMS Adapter API as `protobot wms` and the operator's
//! HTTP endpoint speak it, and the one function both call to answer a request.
//!
//! A request is either an adapter operation (the untrusted §4.2 operation
//! envelope, unchanged) or a [`StoreRead`] (a trusted read of what the library
//! offers beside the adapter: a full work-item record, a request record, a
//! submission, an inspection run's findings, the audit log). An answer wraps
//! the library's [`ResultEnvelope`] as is, plus the audit events the call
//! produced and the trusted actor it ran as, so conformance can be checked from
//! outside the process.
//!
//! Pure except [`answer`], which calls the store port.

use jiff::Timestamp;
use protobot_lifecycle::{
    AuditEvent, AuthorizationContext, OperationEnvelope, ResultEnvelope, Submission, WorkItemRecord,
};
use protobot_stores::{FindingRecord, Mode, RequestRecord, StoreError, TracedStore};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One request: an adapter operation or a store read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
// One request per call, parsed once and moved, never stored in bulk: boxing would only add
// an allocation.
#[allow(clippy::large_enum_variant)]
pub enum WmsRequest {
    /// A store read (the object has a `read` field).
    Read(StoreRead),
    /// An adapter operation: the untrusted operation envelope of contracts/lifecycle.md §4.2.
    Operation(OperationEnvelope),
}

/// A read of what the work store holds beside the adapter's own
/// `request.get`/`work-item.get`/`blocked-work.query` (which are operations and
/// answer sanitized projections under the caller's partition).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "read", rename_all = "kebab-case", deny_unknown_fields)]
pub enum StoreRead {
    /// The full work-item record (§4.1), lease and fencing token included.
    WorkItem {
        /// Work-item id.
        id: String,
    },
    /// A request record (§14), with its current revision.
    Request {
        /// Request id (`request-NNN`).
        id: String,
    },
    /// A blocked-work submission or acknowledgement (§12), with its status.
    Submission {
        /// Submission id.
        id: String,
    },
    /// The findings of one inspection run, by ledger sequence (§16).
    Findings {
        /// Inspection run id.
        inspection_run_id: String,
    },
    /// The whole audit log (§17), oldest first.
    AuditLog,
}

impl StoreRead {
    /// The kind's wire name (`work-item`, `request`, …): the HTTP endpoint's
    /// authorization subresource.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreRead::WorkItem { .. } => "work-item",
            StoreRead::Request { .. } => "request",
            StoreRead::Submission { .. } => "submission",
            StoreRead::Findings { .. } => "findings",
            StoreRead::AuditLog => "audit-log",
        }
    }
}

/// Why a request document is unusable (answered before any store call).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    /// Not one JSON object (or a key appears twice).
    #[error(
        "the request is not one JSON object: {0}; send one operation envelope or one {{\"read\": …}} object"
    )]
    NotJson(String),
    /// The object does not have the shape of an operation envelope.
    #[error(
        "the operation envelope is invalid: {0}; see docs/wms-api.md for its fields (a request never carries its own authorization)"
    )]
    Envelope(String),
    /// The object does not have the shape of a store read.
    #[error(
        "the store read is invalid: {0}; `read` is one of work-item, request, submission, findings, audit-log"
    )]
    Read(String),
}

impl WmsRequest {
    /// Parses one request document strictly: one JSON object, no duplicate
    /// keys, no unknown fields (the envelope's `untrusted_actor` is accepted and
    /// ignored, as the contract says).
    pub fn parse(text: &str) -> Result<WmsRequest, RequestError> {
        let doc = protobot_lifecycle::strict::parse_document(text)
            .map_err(|e| RequestError::NotJson(e.to_string()))?;
        WmsRequest::from_value(doc)
    }

    /// [`WmsRequest::parse`] for an already parsed document.
    pub fn from_value(doc: Value) -> Result<WmsRequest, RequestError> {
        let Value::Object(map) = &doc else {
            return Err(RequestError::NotJson(format!("found {}", kind_of(&doc))));
        };
        if map.contains_key("read") {
            serde_json::from_value(doc)
                .map(WmsRequest::Read)
                .map_err(|e| RequestError::Read(e.to_string()))
        } else {
            serde_json::from_value(doc)
                .map(WmsRequest::Operation)
                .map_err(|e| RequestError::Envelope(e.to_string()))
        }
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The trusted identity a call ran as (from the caller's configuration or
/// the API server's TokenReview, never from the request).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Actor {
    /// The trusted subject.
    pub subject: String,
    /// The trusted role.
    pub role: String,
    /// The Gate's policy version.
    pub policy_version: String,
}

impl Actor {
    /// The actor of a trusted context.
    pub fn of(ctx: &AuthorizationContext) -> Actor {
        Actor {
            subject: ctx.subject.clone(),
            role: ctx.role.clone(),
            policy_version: ctx.policy_version.clone(),
        }
    }
}

/// The audit events one call produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AuditReport {
    /// How many (exactly one per accepted mutation, none for rejections,
    /// replays, reads and preflight: §17).
    pub count: usize,
    /// The events, each with its subject and authorized human subject.
    pub events: Vec<AuditEvent>,
}

/// The answer to an adapter operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OperationAnswer {
    /// True when nothing was written (the answer is what the rules would decide now).
    pub dry_run: bool,
    /// The trusted actor the call ran as.
    pub actor: Actor,
    /// The library's result envelope (§4.3), unchanged; a rejection is an
    /// ordinary envelope with its stable code.
    pub result: ResultEnvelope,
    /// The audit events the call appended (on a dry run: would append).
    pub audit: AuditReport,
}

/// What a store read found.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum ReadValue {
    /// A work-item record, if it exists.
    WorkItem(Option<Box<WorkItemRecord>>),
    /// A request record, if it exists.
    Request(Option<RequestRecord>),
    /// A submission, if it exists.
    Submission(Option<Submission>),
    /// Findings by ledger sequence.
    Findings(Vec<FindingRecord>),
    /// The audit log.
    AuditLog(Vec<AuditEvent>),
}

/// The answer to a store read.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ReadAnswer {
    /// The read's kind (`work-item`, `request`, `submission`, `findings`, `audit-log`).
    pub read: String,
    /// False when the named object does not exist (lists are always found).
    pub found: bool,
    /// The object (null when not found): the §4.1 work-item record, the §14
    /// request record, the §12 submission, a list of findings or of audit events.
    pub value: ReadValue,
}

/// The answer to a [`WmsRequest`].
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum WmsAnswer {
    /// An operation's answer.
    Operation(OperationAnswer),
    /// A read's answer.
    Read(ReadAnswer),
}

/// Answers one request against `store` at trusted time `now`. An operation
/// runs as `ctx` (the caller's trusted context); a read needs none.
pub async fn answer<S: TracedStore>(
    store: &S,
    ctx: &AuthorizationContext,
    request: &WmsRequest,
    now: Timestamp,
    mode: Mode,
) -> Result<WmsAnswer, StoreError> {
    match request {
        WmsRequest::Operation(env) => operate(store, ctx, env, now, mode)
            .await
            .map(WmsAnswer::Operation),
        WmsRequest::Read(read) => self::read(store, read).await.map(WmsAnswer::Read),
    }
}

/// Executes one adapter operation as `ctx`.
pub async fn operate<S: TracedStore>(
    store: &S,
    ctx: &AuthorizationContext,
    env: &OperationEnvelope,
    now: Timestamp,
    mode: Mode,
) -> Result<OperationAnswer, StoreError> {
    let traced = store.execute_traced(Some(ctx), env, now, mode).await?;
    Ok(OperationAnswer {
        dry_run: traced.mode == Mode::DryRun,
        actor: Actor::of(ctx),
        result: traced.result,
        audit: AuditReport {
            count: traced.audit.len(),
            events: traced.audit,
        },
    })
}

/// Answers one store read.
pub async fn read<S: TracedStore>(store: &S, read: &StoreRead) -> Result<ReadAnswer, StoreError> {
    let (found, value) = match read {
        StoreRead::WorkItem { id } => {
            let r = store.get(id).await?;
            (r.is_some(), ReadValue::WorkItem(r.map(Box::new)))
        }
        StoreRead::Request { id } => {
            let r = store.request(id).await?;
            (r.is_some(), ReadValue::Request(r))
        }
        StoreRead::Submission { id } => {
            let r = store.submission(id).await?;
            (r.is_some(), ReadValue::Submission(r))
        }
        StoreRead::Findings { inspection_run_id } => (
            true,
            ReadValue::Findings(store.findings(inspection_run_id).await?),
        ),
        StoreRead::AuditLog => (true, ReadValue::AuditLog(store.audit_events().await?)),
    };
    Ok(ReadAnswer {
        read: read.kind().to_string(),
        found,
        value,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_document_with_read_is_a_read_and_anything_else_an_envelope() {
        assert_eq!(
            WmsRequest::parse(r#"{"read": "submission", "id": "s-1"}"#).unwrap(),
            WmsRequest::Read(StoreRead::Submission { id: "s-1".into() })
        );
        assert_eq!(
            WmsRequest::parse(r#"{"read": "audit-log"}"#).unwrap(),
            WmsRequest::Read(StoreRead::AuditLog)
        );
        let WmsRequest::Operation(env) =
            WmsRequest::parse(r#"{"operation": "request.get", "request_id": "r"}"#).unwrap()
        else {
            panic!("an envelope")
        };
        assert_eq!(env.operation, "request.get");
    }

    #[test]
    fn context_fields_in_a_request_are_refused_and_untrusted_actor_is_ignored() {
        // A request can never carry its own authority: the context's fields are not envelope fields.
        for field in ["subject", "role", "allowed_actions", "context"] {
            let doc = format!(r#"{{"operation": "claim", "{field}": "x"}}"#);
            assert!(
                matches!(WmsRequest::parse(&doc), Err(RequestError::Envelope(_))),
                "{field}"
            );
        }
        let WmsRequest::Operation(env) = WmsRequest::parse(
            r#"{"operation": "claim", "untrusted_actor": {"role": "human-maintainer"}}"#,
        )
        .unwrap() else {
            panic!("an envelope")
        };
        assert_eq!(
            serde_json::to_value(&env).unwrap()["untrusted_actor"],
            Value::Null
        );
    }

    #[test]
    fn unusable_documents_are_errors_naming_what_is_wrong() {
        assert!(matches!(
            WmsRequest::parse("[]"),
            Err(RequestError::NotJson(_))
        ));
        assert!(matches!(
            WmsRequest::parse("{} {}"),
            Err(RequestError::NotJson(_))
        ));
        assert!(matches!(
            WmsRequest::parse(r#"{"operation": "a", "operation": "b"}"#),
            Err(RequestError::NotJson(_))
        ));
        assert!(matches!(
            WmsRequest::parse(r#"{"read": "secrets"}"#),
            Err(RequestError::Read(_))
        ));
        assert!(matches!(
            WmsRequest::parse(r#"{"read": "request", "id": "r", "extra": 1}"#),
            Err(RequestError::Read(_))
        ));
    }
}
