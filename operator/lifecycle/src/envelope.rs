//! Wire shapes of one command: the untrusted operation envelope (§4.2), the
//! strict lifecycle payload, the validation-rules decision (§4.4) and the result
//! envelope every adapter operation answers with (§4.3).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    fence::FencingToken,
    record::{MergeEnvelope, SourceContract},
    vocab::{Code, Command, Retry, State},
};

/// The untrusted operation envelope. Unknown fields are rejected, except the
/// top-level `untrusted_actor`, which is accepted and ignored: a request can
/// never carry or widen its own authorization.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OperationEnvelope {
    /// One of the 30 adapter operations.
    pub operation: String,
    /// Opaque reference the Gate resolves to a trusted context.
    pub actor_context_ref: String,
    /// Optional echo of the Gate's policy version; any other value is rejected.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub policy_version: String,
    /// Request id (request namespace).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub request_id: String,
    /// Target work item.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub work_item_id: String,
    /// Expected request revision (request namespace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_request_revision: Option<u64>,
    /// Expected current state (`initial` for materialize).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_state: Option<String>,
    /// Expected current contract version (0 for materialize); required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_contract_version: Option<u64>,
    /// The caller's fencing token.
    #[serde(skip_serializing_if = "FencingToken::is_empty")]
    pub fencing_token: FencingToken,
    /// Gate approval id (overrides the payload's).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub human_approval_id: String,
    /// Per-command idempotency key (project scope).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub idempotency_key: String,
    /// Materialization key (materialize).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub materialization_key: String,
    /// Operation payload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// Ignored: requests never carry their own authority.
    #[serde(skip_serializing)]
    pub untrusted_actor: Option<Value>,
}

/// A lifecycle command as an in-process caller (the Job Site, the reconciler, the
/// maintainer tools, the stores' tests) means it: command and expected state are enums, so
/// the envelope [`OperationEnvelope::command`] builds always spells them as the evaluator
/// parses them. Named fields: the three strings cannot be swapped by position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandRequest<'a> {
    /// The command.
    pub command: Command,
    /// The reference the Gate (or the in-process caller) resolves to a context.
    pub actor_context_ref: &'a str,
    /// The target work item.
    pub work_item_id: &'a str,
    /// The state the caller read.
    pub expected_state: State,
    /// The contract version the caller read.
    pub expected_contract_version: u64,
    /// The per-command idempotency key.
    pub idempotency_key: String,
}

impl OperationEnvelope {
    /// The wire envelope of `request`, unfenced and without a payload (add them with
    /// [`OperationEnvelope::fenced`] and [`OperationEnvelope::with_payload`]).
    pub fn command(request: CommandRequest<'_>) -> OperationEnvelope {
        OperationEnvelope {
            operation: request.command.as_str().to_owned(),
            actor_context_ref: request.actor_context_ref.to_owned(),
            work_item_id: request.work_item_id.to_owned(),
            expected_state: Some(request.expected_state.as_str().to_owned()),
            expected_contract_version: Some(request.expected_contract_version),
            idempotency_key: request.idempotency_key,
            ..OperationEnvelope::default()
        }
    }

    /// The envelope presenting `fencing_token` (the one the claim's decision issued).
    pub fn fenced(mut self, fencing_token: FencingToken) -> OperationEnvelope {
        self.fencing_token = fencing_token;
        self
    }

    /// The envelope carrying the lifecycle `payload` in its wire form (fields at
    /// their defaults are left out, as the evaluator reads them back).
    pub fn with_payload(mut self, payload: &LifecyclePayload) -> OperationEnvelope {
        // Cannot fail: every field is a string, number, bool, timestamp string or a
        // struct of them, and no map has a non-string key.
        self.payload = serde_json::to_value(payload).ok();
        self
    }

    /// The command this envelope names, if it names one of the 16.
    pub fn lifecycle_command(&self) -> Option<Command> {
        Command::parse(&self.operation)
    }
}

/// The strict lifecycle payload; unknown fields are `INVALID_REQUEST`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LifecyclePayload {
    /// Previewed command (preflight only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<String>,
    /// The source contract (materialize).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_item: Option<SourceContract>,
    /// Materialization key fallback.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub materialization_key: String,
    /// Change type fallback.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub change_type: String,
    /// Change set (resolve-block; filled from the submission when missing).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub change_set_id: String,
    /// Approval id (the envelope's value wins).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub human_approval_id: String,
    /// Approval digest.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub approval_resolution_digest: String,
    /// `add-requirement`, `out-of-scope`, `impact-amendment`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resolution_kind: String,
    /// The active submission resolve-block consumes.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub resolution_submission_id: String,
    /// tests-pass: the building gate passed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub build_tests_passed: bool,
    /// raise-spec-question: the question.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub question: String,
    /// Ignored as authority (the WMS observes inspection itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inspection_run_sealed: Option<bool>,
    /// Ignored as authority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub findings_terminal: Option<bool>,
    /// Ignored as authority.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_tests_passed: Option<bool>,
    /// return-to-building: an in-contract defect was found.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub in_contract_defect: bool,
    /// return-to-building: final tests failed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub final_tests_failed: bool,
    /// abandon: the human confirmed cancellation.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cancellation_confirmed: bool,
    /// begin-merge / record-merge candidate envelope.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge_envelope: Option<MergeEnvelope>,
}

/// The payloads in-process callers send, one constructor per command that takes one
/// (the rest send [`LifecyclePayload::default`]).
impl LifecyclePayload {
    /// `tests-pass`: the building gate passed.
    pub fn tests_passed() -> LifecyclePayload {
        LifecyclePayload {
            build_tests_passed: true,
            ..LifecyclePayload::default()
        }
    }

    /// `raise-spec-question`: the question the item blocks on.
    pub fn question(question: impl Into<String>) -> LifecyclePayload {
        LifecyclePayload {
            question: question.into(),
            ..LifecyclePayload::default()
        }
    }

    /// `return-to-building`: inspection found an in-contract defect.
    pub fn in_contract_defect() -> LifecyclePayload {
        LifecyclePayload {
            in_contract_defect: true,
            ..LifecyclePayload::default()
        }
    }

    /// `return-to-building`: the final tests failed.
    pub fn final_tests_failed() -> LifecyclePayload {
        LifecyclePayload {
            final_tests_failed: true,
            ..LifecyclePayload::default()
        }
    }

    /// `begin-merge` (the tested candidate) and `record-merge` (with its merge commit).
    pub fn merge(envelope: MergeEnvelope) -> LifecyclePayload {
        LifecyclePayload {
            merge_envelope: Some(envelope),
            ..LifecyclePayload::default()
        }
    }

    /// `abandon`: a human confirmed the cancellation.
    pub fn cancellation_confirmed() -> LifecyclePayload {
        LifecyclePayload {
            cancellation_confirmed: true,
            ..LifecyclePayload::default()
        }
    }

    /// The refs this payload's merge envelope names (a Gate grants exactly these
    /// beside the project, §3 item 7).
    pub fn merge_refs(&self) -> Vec<String> {
        self.merge_envelope
            .as_ref()
            .map(MergeEnvelope::refs)
            .unwrap_or_default()
    }
}

/// Whether a decision is authoritative or an advisory preview.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Authority {
    /// Advisory (`lifecycle.preflight`).
    Preflight,
    /// The command itself.
    Authoritative,
}

/// Decision outcome.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecisionOutcome {
    /// The transition is (or would be) applied.
    Allowed,
    /// Rejected with a code.
    Rejected,
    /// Materialization: no implementation needed; a reservation is kept.
    Omitted,
}

/// State and contract version at one point.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateVersion {
    /// State (`initial` before a materialize).
    pub state: State,
    /// Contract version.
    pub contract_version: u64,
}

/// The reservation a materialization leaves under its key.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationSummary {
    /// The logical key.
    pub materialization_key: String,
    /// Digest of the canonical source contract.
    pub source_fingerprint: String,
    /// `waiting`, `ready-for-building`, `blocked` or `omitted`.
    pub outcome: String,
}

/// A rejection: stable code, human message, structured details, retry hint.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    /// Stable code.
    pub code: Code,
    /// Human-readable; not contractual.
    pub message: String,
    /// Structured details (contractual keys per code).
    #[serde(default)]
    pub details: BTreeMap<String, Value>,
    /// What the client should do.
    pub retry: Retry,
}

impl Rejection {
    /// A rejection with the code's default retry hint.
    pub fn new(code: Code, message: impl Into<String>) -> Rejection {
        Rejection {
            code,
            message: message.into(),
            details: BTreeMap::new(),
            retry: code.default_retry(),
        }
    }

    /// Adds a detail.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Rejection {
        self.details.insert(key.to_string(), value.into());
        self
    }

    /// Overrides the retry hint.
    pub fn retry(mut self, retry: Retry) -> Rejection {
        self.retry = retry;
        self
    }
}

/// The validation-rules decision (§4.4).
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Allowed, rejected or omitted.
    pub outcome: DecisionOutcome,
    /// True when this is a stored decision replayed under an idempotency key.
    pub replayed: bool,
    /// Preflight or authoritative.
    pub authority: Authority,
    /// Always `validation-rules/v1`.
    pub rule_version: String,
    /// The Gate's policy version (never the caller's).
    pub policy_version: String,
    /// The evaluated command.
    pub operation: String,
    /// State before (absent for `NOT_FOUND`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<StateVersion>,
    /// State after (null on rejection and on omitted).
    pub after: Option<StateVersion>,
    /// Materialization reservation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub materialization_reservation: Option<ReservationSummary>,
    /// The fresh fencing token, only to the new owner.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing_token_issued: Option<FencingToken>,
    /// The rejection, when rejected.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejection: Option<Rejection>,
}

/// `read`, `applied`, `replayed` or `rejected`.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EnvelopeOutcome {
    /// A read or a preflight.
    Read,
    /// A new mutation.
    Applied,
    /// A stored result replayed.
    Replayed,
    /// Rejected.
    Rejected,
}

/// `none`, `applied`, `unknown` or `not-applicable`.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mutation {
    /// Nothing changed.
    None,
    /// The write happened.
    Applied,
    /// The write's outcome is unknown.
    Unknown,
    /// No adapter call was made.
    NotApplicable,
}

/// `new` or `replayed`.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdempotencyStatus {
    /// First use of the key.
    New,
    /// Stored result replayed.
    Replayed,
}

/// A sanitized work-item projection returned by queries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkItemView {
    /// Id.
    pub id: String,
    /// Canonical state.
    pub state: State,
    /// Lease owner.
    pub owner: String,
    /// Sorted dependency ids.
    pub dependencies: Vec<String>,
    /// Priority snapshot.
    pub priority: String,
    /// Contract version.
    pub contract_version: u64,
    /// Linked request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Linked change set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change_set_id: Option<String>,
    /// blocked-work.query: `undefined-behavior` or `unresolved-precondition`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_kind: Option<String>,
    /// blocked-work.query: always `review-resolution`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_action: Option<String>,
    /// blocked-work.query: the five user choices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolution_options: Option<Vec<String>>,
}

/// The result envelope of every adapter operation (§4.3).
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultEnvelope {
    /// False only for rejections (a preflight is always `ok`).
    pub ok: bool,
    /// The operation answered.
    pub operation: String,
    /// Read, applied, replayed, rejected.
    pub outcome: EnvelopeOutcome,
    /// `work-item`, `request`, `submission`, `project`.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub resource: String,
    /// Advisory diagnostics.
    #[serde(default)]
    pub diagnostics: Vec<Value>,
    /// What was written.
    pub mutation: Mutation,
    /// Key status (mutations only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idempotency: Option<IdempotencyStatus>,
    /// The rejection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Rejection>,
    /// The nested validation-rules decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// Other operation-specific fields (`request_id`, `request_revision`,
    /// `approval_status`, `submission`, `items`, `planned_dependency`, …).
    #[serde(flatten)]
    pub fields: BTreeMap<String, Value>,
}

impl ResultEnvelope {
    /// A rejected envelope for a rejection outside the evaluator (no decision).
    pub fn rejected(operation: &str, rejection: Rejection) -> ResultEnvelope {
        ResultEnvelope {
            ok: false,
            operation: operation.to_string(),
            outcome: EnvelopeOutcome::Rejected,
            resource: String::new(),
            diagnostics: Vec::new(),
            mutation: Mutation::None,
            idempotency: None,
            error: Some(rejection),
            decision: None,
            fields: BTreeMap::new(),
        }
    }

    /// A successful read.
    pub fn read(operation: &str, resource: &str) -> ResultEnvelope {
        ResultEnvelope {
            ok: true,
            operation: operation.to_string(),
            outcome: EnvelopeOutcome::Read,
            resource: resource.to_string(),
            diagnostics: Vec::new(),
            mutation: Mutation::None,
            idempotency: None,
            error: None,
            decision: None,
            fields: BTreeMap::new(),
        }
    }

    /// A new, applied mutation.
    pub fn applied(operation: &str, resource: &str) -> ResultEnvelope {
        ResultEnvelope {
            outcome: EnvelopeOutcome::Applied,
            mutation: Mutation::Applied,
            idempotency: Some(IdempotencyStatus::New),
            ..ResultEnvelope::read(operation, resource)
        }
    }

    /// Adds an operation-specific field.
    pub fn with(mut self, key: &str, value: impl Serialize) -> ResultEnvelope {
        if let Ok(v) = serde_json::to_value(value) {
            self.fields.insert(key.to_string(), v);
        }
        self
    }

    /// This stored result as a replay: `outcome:replayed`, `mutation:none`,
    /// `idempotency:replayed`, `decision.replayed:true`; `ok` unchanged.
    pub fn as_replay(&self) -> ResultEnvelope {
        let mut out = self.clone();
        out.outcome = EnvelopeOutcome::Replayed;
        out.mutation = Mutation::None;
        out.idempotency = Some(IdempotencyStatus::Replayed);
        if let Some(d) = out.decision.as_mut() {
            d.replayed = true;
        }
        out
    }

    /// The rejection code, if rejected (directly or in a nested preflight decision).
    pub fn code(&self) -> Option<Code> {
        self.error.as_ref().map(|e| e.code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn renew() -> CommandRequest<'static> {
        CommandRequest {
            command: Command::RenewLease,
            actor_context_ref: "job-site",
            work_item_id: "wi-1",
            expected_state: State::Inspecting,
            expected_contract_version: 4,
            idempotency_key: "wi-1:renew:v4".into(),
        }
    }

    #[test]
    fn a_command_request_spells_its_command_and_state_as_the_evaluator_reads_them() {
        for &command in Command::ALL {
            for &state in State::ALL {
                let env = OperationEnvelope::command(CommandRequest {
                    command,
                    expected_state: state,
                    ..renew()
                });
                assert_eq!(env.lifecycle_command(), Some(command));
                assert_eq!(
                    env.expected_state.as_deref().and_then(State::parse),
                    Some(state)
                );
            }
        }
    }

    #[test]
    fn a_command_envelope_is_unfenced_until_fenced_and_survives_the_wire() {
        let env = OperationEnvelope::command(renew());
        assert_eq!(env.fencing_token, "");
        assert_eq!(env.payload, None);
        let env = env
            .fenced(FencingToken::from("fence-3"))
            .with_payload(&LifecyclePayload::question("q"));
        let wire = serde_json::to_value(&env).unwrap_or_default();
        assert_eq!(
            wire,
            serde_json::json!({
                "operation": "renew-lease",
                "actor_context_ref": "job-site",
                "work_item_id": "wi-1",
                "expected_state": "inspecting",
                "expected_contract_version": 4,
                "fencing_token": "fence-3",
                "idempotency_key": "wi-1:renew:v4",
                "payload": {"question": "q"},
            })
        );
        let back: OperationEnvelope = serde_json::from_value(wire).unwrap_or_default();
        assert_eq!(back, env);
    }

    #[test]
    fn an_operation_that_is_not_a_command_names_none() {
        let env = OperationEnvelope {
            operation: "request.get".into(),
            ..OperationEnvelope::default()
        };
        assert_eq!(env.lifecycle_command(), None);
    }
}
