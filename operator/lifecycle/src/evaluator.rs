//! The pure validation-rules/v1 evaluator.
//!
//! `evaluate` takes one untrusted operation envelope, the trusted Gate context,
//! the trusted evaluation time and every trusted input the decision may use
//! (the current record, the idempotency entry under the request's key, the
//! materialization reservation, WMS observations, the approval and submission),
//! and returns the result envelope plus the *effects* a store must write
//! atomically. It reads no clock, no store and no network: the same inputs give
//! the same output.
//!
//! Check order (the first failing check is reported), merging the contract
//! order (§7, newest doc) with the reference adapter's sequence:
//! strict payload decode → context validity and scoping → target visibility
//! (`NOT_FOUND`, frozen under the key only for callers that would otherwise be
//! authorized) → role family, `allowed_actions`, refs, policy echo → missing
//! key → idempotency replay/conflict → materialization create-or-return →
//! resolve-block binding → terminal → live-lease contention → expected state →
//! expected version → Job Site fence → transition legality → preconditions.
//!
//! Where the contract's sources disagree (§20) the newest document wins:
//! 1. approval bindings must agree on both sides, including the change set
//!    (see `ApprovalRecord::check`);
//! 2. a Job Site `merge-conflict` needs no reconciliation evidence (only the
//!    reconciler row carries an evidence pair in the ruleset);
//! 3. a materialization source may name only `expected_merge.target`; any other
//!    tested-candidate field is `PRECONDITION_FAILED`, also on a replayed key;
//! 4. reconciler `merge-conflict` requires exactly `conflict`/`conflict`;
//! 5. the fence check (step 11) precedes transition legality, so a fenced Job
//!    Site command on an unleased item is `STALE_FENCING_TOKEN` (INV-04);
//! 6. `resolve-block` binding precedes the terminal and transition checks;
//! 7. every allowed transition bumps the version, `renew-lease` included;
//! 8. `merging` has no `renew-lease` row: a merge that outlives its lease is
//!    completed by the reconciler;
//! 9. `materialize` stores WMS-observed dependency states, never the payload's;
//! 10. preflight evaluates the stored record, like the reference adapter;
//! 11. messages and `failed_precondition` texts are informative only.
//!
//! Choices where the contract is silent: an absent `implementation_required`
//! means `true` (a source must opt out of implementation explicitly);
//! `revalidate` blocks on readiness failures only (incomplete dependencies are
//! what `waiting` means, not a block); releasing a lease also clears `owner`;
//! `merge-not-applied` and reconciler `merge-conflict` keep only the
//! materialized merge target, so all gates re-run after a fresh claim.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{
    approval::{ApprovalRecord, ApprovalUse, Submission},
    context::{AuthorizationContext, unauthorized},
    envelope::{
        Authority, Decision, DecisionOutcome, EnvelopeOutcome, IdempotencyStatus, LifecyclePayload,
        Mutation, OperationEnvelope, Rejection, ReservationSummary, ResultEnvelope, StateVersion,
    },
    fence::{FenceStatus, FencingToken},
    fingerprint,
    record::{
        CHANGE_TYPES, Dependency, Lease, MergeEnvelope, NamedRef, Readiness, Reconciliation,
        WorkItemRecord,
    },
    ruleset::{Destination, RULE_VERSION, Ruleset, TransitionRule},
    vocab::{Code, Command, Operation, Retry, Role, State},
};

/// A result frozen under an idempotency key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyEntry {
    /// The key (project scope).
    pub key: String,
    /// Fingerprint of the first request that used the key.
    pub fingerprint: String,
    /// Its result, replayed verbatim (as a replay) on an exact retry.
    pub result: ResultEnvelope,
}

/// A materialization reservation: the binding of a logical key to a source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reservation {
    /// The logical key.
    pub materialization_key: String,
    /// Project.
    pub project_id: String,
    /// Work-item identity the key is bound to.
    pub work_item_id: String,
    /// Fingerprint of the canonical source contract.
    pub source_fingerprint: String,
    /// `waiting`, `ready-for-building`, `blocked` or `omitted`.
    pub outcome: String,
    /// The original result, replayed for an equal source.
    pub result: ResultEnvelope,
}

/// One audit event per accepted mutation.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// Operation.
    pub operation: String,
    /// Trusted subject.
    pub subject: String,
    /// The approving human, for approval-bearing operations.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub authorized_human_subject: String,
    /// Request id, if any.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub request_id: String,
    /// Work item.
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub work_item_id: String,
    /// Idempotency key.
    pub idempotency_key: String,
    /// `allowed`, `omitted`, `applied`.
    pub outcome: String,
    /// Rule version.
    pub rule_version: String,
    /// The Gate's policy version.
    pub policy_version: String,
    /// Before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<StateVersion>,
    /// After.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<StateVersion>,
}

/// Trusted inputs for one decision. The evaluator never reads a store itself.
#[derive(Clone, Debug, Default)]
pub struct Inputs<'a> {
    /// The project the adapter serves.
    pub trusted_project: &'a str,
    /// Trusted evaluation time (missing → fail closed).
    pub now: Option<Timestamp>,
    /// The current record of the target, read in the writing transaction.
    pub record: Option<&'a WorkItemRecord>,
    /// The entry stored under the request's idempotency key, if any.
    pub idempotency: Option<&'a IdempotencyEntry>,
    /// The reservation under the request's materialization key, if any.
    pub reservation: Option<&'a Reservation>,
    /// WMS-observed readiness (refresh-dependencies, revalidate, refresh-active,
    /// resolve-block); the stored readiness is used when absent.
    pub observed_readiness: Option<&'a Readiness>,
    /// Live states of dependency records the WMS can see.
    pub dependency_states: BTreeMap<String, State>,
    /// The approval named by the request (resolve-block).
    pub approval: Option<&'a ApprovalRecord>,
    /// The submission named by the request or, for a preview, the active one.
    pub submission: Option<&'a Submission>,
    /// Live state of the planned dependency's build item (resolve-block
    /// add-requirement); `None` when the change set has no build item yet.
    pub planned_dependency_state: Option<State>,
    /// Lease duration in seconds (0 → the ruleset default).
    pub lease_seconds: i64,
    /// The token the store minted for a fence-issuing transition.
    pub next_fencing_token: Option<FencingToken>,
}

/// What the store must write, atomically, after an authoritative decision.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Effects {
    /// The record after the command (`None`: unchanged).
    pub record: Option<WorkItemRecord>,
    /// A new reservation (materialize).
    pub reservation: Option<Reservation>,
    /// A result to freeze under the request's key.
    pub idempotency: Option<IdempotencyEntry>,
    /// Approval to mark `consumed`.
    pub consume_approval: Option<String>,
    /// Submission to mark `consumed`.
    pub consume_submission: Option<String>,
    /// The audit event.
    pub audit: Option<AuditEvent>,
}

/// The evaluator's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluation {
    /// The result envelope.
    pub result: ResultEnvelope,
    /// Writes to apply (all empty for reads, preflight and unrecorded rejections).
    pub effects: Effects,
}

/// A decoded, normalized lifecycle request (§4.2 normalization).
#[derive(Clone, Debug)]
pub struct Prepared {
    /// `lifecycle.preflight` or the command itself.
    pub operation: Operation,
    /// The evaluated (or previewed) command.
    pub command: Command,
    /// Target work item (materialize: `payload.work_item.id`).
    pub target: String,
    /// Materialization key (envelope, else payload, else source contract).
    pub materialization_key: String,
    /// Approval id (envelope wins).
    pub human_approval_id: String,
    /// The strict payload.
    pub payload: LifecyclePayload,
}

impl Prepared {
    /// The authority this request is evaluated with.
    pub fn authority(&self) -> Authority {
        if self.operation == Operation::LifecyclePreflight {
            Authority::Preflight
        } else {
            Authority::Authoritative
        }
    }

    /// Payload refs for the ref-subset check (§3 item 7), with the fields
    /// that name them (a Gate that grants refs one by one needs the field).
    pub fn named_payload_refs(&self, role: Option<Role>) -> Vec<NamedRef> {
        let envelope = match self.command {
            Command::Materialize => self
                .payload
                .work_item
                .as_ref()
                .and_then(|w| w.expected_merge.as_ref()),
            Command::BeginMerge => self.payload.merge_envelope.as_ref(),
            Command::RecordMerge if role != Some(Role::Reconciler) => {
                self.payload.merge_envelope.as_ref()
            }
            _ => None,
        };
        let mut refs = envelope.map(MergeEnvelope::named_refs).unwrap_or_default();
        refs.sort();
        refs.dedup();
        refs
    }

    /// Payload refs for the ref-subset check (§3 item 7).
    pub fn payload_refs(&self, role: Option<Role>) -> Vec<String> {
        let mut refs: Vec<String> = self
            .named_payload_refs(role)
            .into_iter()
            .map(|r| r.name)
            .collect();
        refs.sort();
        refs.dedup();
        refs
    }
}

/// Decodes and normalizes a lifecycle or preflight envelope.
///
/// Errors are `INVALID_REQUEST` (malformed payload, unknown field, unknown
/// previewed command) or `UNAUTHORIZED_ACTION` (an operation outside the
/// adapter API). Request-namespace operations are not lifecycle requests.
pub fn prepare(env: &OperationEnvelope) -> Result<Prepared, Rejection> {
    let Some(operation) = Operation::parse(&env.operation) else {
        return Err(unauthorized("operation is not part of the adapter API")
            .with("required_action", env.operation.as_str()));
    };
    let payload: LifecyclePayload = match &env.payload {
        None | Some(Value::Null) => LifecyclePayload::default(),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| {
            Rejection::new(Code::InvalidRequest, format!("payload is invalid: {e}"))
                .with("field", "payload")
                .with("reason", e.to_string())
        })?,
    };
    let command = if operation == Operation::LifecyclePreflight {
        let name = payload.operation.clone().unwrap_or_default();
        Command::parse(&name).ok_or_else(|| {
            Rejection::new(
                Code::InvalidRequest,
                "payload.operation must name a lifecycle command",
            )
            .with("field", "payload.operation")
            .with("reason", "unknown or missing lifecycle command")
        })?
    } else {
        let Some(c) = operation.command() else {
            return Err(Rejection::new(
                Code::InvalidRequest,
                format!("{} is not a lifecycle command", operation),
            )
            .with("field", "operation")
            .with("reason", "not evaluated by validation rules"));
        };
        if payload.operation.is_some() {
            return Err(Rejection::new(
                Code::InvalidRequest,
                "payload.operation is preflight-only",
            )
            .with("field", "payload.operation")
            .with("reason", "unknown field for this operation"));
        }
        c
    };
    let source = payload.work_item.as_ref();
    let target = if command == Command::Materialize && env.work_item_id.is_empty() {
        source.map(|w| w.id.clone()).unwrap_or_default()
    } else {
        env.work_item_id.clone()
    };
    let materialization_key = [
        env.materialization_key.as_str(),
        payload.materialization_key.as_str(),
        source.map(|w| w.materialization_key.as_str()).unwrap_or(""),
    ]
    .into_iter()
    .find(|k| !k.is_empty())
    .unwrap_or("")
    .to_string();
    let human_approval_id = if env.human_approval_id.is_empty() {
        payload.human_approval_id.clone()
    } else {
        env.human_approval_id.clone()
    };
    let mut payload = payload;
    payload.human_approval_id = human_approval_id.clone();
    Ok(Prepared {
        operation,
        command,
        target,
        materialization_key,
        human_approval_id,
        payload,
    })
}

/// Why evaluation stopped before a transition.
struct Stop {
    rejection: Rejection,
    before: Option<StateVersion>,
    /// Freeze the rejection under the idempotency key.
    record: bool,
}

impl Stop {
    fn new(rejection: Rejection, before: Option<StateVersion>) -> Stop {
        Stop {
            rejection,
            before,
            record: true,
        }
    }
}

/// Evaluates one lifecycle or preflight envelope.
pub fn evaluate(
    rules: &Ruleset,
    env: &OperationEnvelope,
    ctx: &AuthorizationContext,
    inputs: &Inputs<'_>,
) -> Evaluation {
    let prepared = match prepare(env) {
        Ok(p) => p,
        Err(rejection) => {
            return Evaluation {
                result: ResultEnvelope::rejected(&env.operation, rejection),
                effects: Effects::default(),
            };
        }
    };
    evaluate_prepared(rules, env, &prepared, ctx, inputs)
}

/// Evaluates an already prepared request (stores prepare first to know what to load).
pub fn evaluate_prepared(
    rules: &Ruleset,
    env: &OperationEnvelope,
    p: &Prepared,
    ctx: &AuthorizationContext,
    inputs: &Inputs<'_>,
) -> Evaluation {
    let eval = Evaluator {
        rules,
        env,
        p,
        ctx,
        inputs,
    };
    eval.run()
}

struct Evaluator<'a> {
    rules: &'a Ruleset,
    env: &'a OperationEnvelope,
    p: &'a Prepared,
    ctx: &'a AuthorizationContext,
    inputs: &'a Inputs<'a>,
}

/// A successful transition.
struct Transition {
    record: Option<WorkItemRecord>,
    outcome: DecisionOutcome,
    after: Option<StateVersion>,
    fence: Option<FencingToken>,
    reservation: Option<(String, String)>,
    consume_approval: Option<String>,
    consume_submission: Option<String>,
    human: String,
}

impl Evaluator<'_> {
    fn preflight(&self) -> bool {
        self.p.authority() == Authority::Preflight
    }

    fn before(&self) -> Option<StateVersion> {
        match self.inputs.record {
            Some(r) => Some(StateVersion {
                state: r.state,
                contract_version: r.contract_version,
            }),
            None if self.p.command == Command::Materialize => Some(StateVersion {
                state: State::Initial,
                contract_version: 0,
            }),
            None => None,
        }
    }

    fn decision(&self, outcome: DecisionOutcome, before: Option<StateVersion>) -> Decision {
        Decision {
            outcome,
            replayed: false,
            authority: self.p.authority(),
            rule_version: RULE_VERSION.to_string(),
            policy_version: self.ctx.policy_version.clone(),
            operation: self.p.command.as_str().to_string(),
            before,
            after: None,
            materialization_reservation: None,
            fencing_token_issued: None,
            rejection: None,
        }
    }

    /// The lifecycle request fingerprint (§8): everything but the context expiry.
    fn fingerprint(&self) -> String {
        let mut actions = self.ctx.allowed_actions.clone();
        actions.sort();
        let mut refs = self.ctx.allowed_refs.clone();
        refs.sort();
        fingerprint::digest_value(&json!({
            "rule_version": RULE_VERSION,
            "operation": self.p.operation.as_str(),
            "command": self.p.command.as_str(),
            "project": self.inputs.trusted_project,
            "target": self.p.target,
            "materialization_key": self.p.materialization_key,
            "expected_state": self.env.expected_state,
            "expected_contract_version": self.env.expected_contract_version,
            "fencing_token": self.env.fencing_token,
            "payload": serde_json::to_value(&self.p.payload).unwrap_or(Value::Null),
            "payload_refs": self.p.payload_refs(self.ctx.parsed_role()),
            "context": {
                "subject": self.ctx.subject,
                "role": self.ctx.role,
                "project_id": self.ctx.project_id,
                "work_item_id": self.ctx.work_item_id,
                "change_set_id": self.ctx.change_set_id,
                "allowed_actions": actions,
                "allowed_refs": refs,
                "policy_version": self.ctx.policy_version,
            },
        }))
    }

    fn run(&self) -> Evaluation {
        let before = self.before();
        match self.steps() {
            Ok(Ok(t)) => self.allowed(t, before),
            Ok(Err(replay)) => {
                // A materialization replay binds the new command key to it (§9 iv);
                // a key replay writes nothing.
                let mut effects = Effects::default();
                if self.inputs.idempotency.is_none() && !self.preflight() {
                    effects.idempotency = Some(IdempotencyEntry {
                        key: self.env.idempotency_key.clone(),
                        fingerprint: self.fingerprint(),
                        result: replay.clone(),
                    });
                }
                Evaluation {
                    result: replay,
                    effects,
                }
            }
            Err(stop) => self.rejected(stop),
        }
    }

    fn rejected(&self, stop: Stop) -> Evaluation {
        let mut decision = self.decision(DecisionOutcome::Rejected, stop.before);
        decision.rejection = Some(stop.rejection.clone());
        if self.preflight() {
            let mut result = ResultEnvelope::read(self.p.operation.as_str(), "work-item");
            result.decision = Some(decision);
            return Evaluation {
                result,
                effects: Effects::default(),
            };
        }
        let mut result = ResultEnvelope::rejected(self.p.operation.as_str(), stop.rejection);
        result.resource = "work-item".to_string();
        result.decision = Some(decision);
        if !self.p.target.is_empty() {
            result = result.with("work_item_id", &self.p.target);
        }
        if self.p.command == Command::ResolveBlock
            && let Some(a) = self.inputs.approval
        {
            result = result.with("approval_status", &a.status);
        }
        let mut effects = Effects::default();
        if stop.record && !self.env.idempotency_key.is_empty() {
            effects.idempotency = Some(IdempotencyEntry {
                key: self.env.idempotency_key.clone(),
                fingerprint: self.fingerprint(),
                result: result.clone(),
            });
        }
        Evaluation { result, effects }
    }

    fn allowed(&self, t: Transition, before: Option<StateVersion>) -> Evaluation {
        let mut decision = self.decision(t.outcome, before);
        decision.after = t.after;
        decision.fencing_token_issued = t.fence.clone();
        let reservation = t
            .reservation
            .as_ref()
            .map(|(fp, outcome)| ReservationSummary {
                materialization_key: self.p.materialization_key.clone(),
                source_fingerprint: fp.clone(),
                outcome: outcome.clone(),
            });
        decision.materialization_reservation = reservation.clone();
        if self.preflight() {
            let mut result = ResultEnvelope::read(self.p.operation.as_str(), "work-item");
            result.decision = Some(decision);
            return Evaluation {
                result,
                effects: Effects::default(),
            };
        }
        let mut result = ResultEnvelope::applied(self.p.operation.as_str(), "work-item")
            .with("work_item_id", &self.p.target);
        if let Some(after) = t.after {
            result = result
                .with("work_item_state", after.state)
                .with("contract_version", after.contract_version);
        }
        if t.outcome == DecisionOutcome::Omitted {
            result = result.with("submission", "omitted");
        }
        if t.consume_approval.is_some() {
            result = result.with("approval_status", "consumed");
        }
        result.decision = Some(decision);
        let key = self.env.idempotency_key.clone();
        let audit = AuditEvent {
            operation: self.p.command.as_str().to_string(),
            subject: self.ctx.subject.clone(),
            authorized_human_subject: t.human.clone(),
            request_id: String::new(),
            work_item_id: self.p.target.clone(),
            idempotency_key: key.clone(),
            outcome: match t.outcome {
                DecisionOutcome::Omitted => "omitted",
                _ => "allowed",
            }
            .to_string(),
            rule_version: RULE_VERSION.to_string(),
            policy_version: self.ctx.policy_version.clone(),
            before,
            after: t.after,
        };
        let effects = Effects {
            record: t.record,
            reservation: reservation.map(|r| Reservation {
                materialization_key: r.materialization_key,
                project_id: self.inputs.trusted_project.to_string(),
                work_item_id: self.p.target.clone(),
                source_fingerprint: r.source_fingerprint,
                outcome: r.outcome,
                result: result.clone(),
            }),
            idempotency: Some(IdempotencyEntry {
                key,
                fingerprint: self.fingerprint(),
                result: result.clone(),
            }),
            consume_approval: t.consume_approval,
            consume_submission: t.consume_submission,
            audit: Some(audit),
        };
        Evaluation { result, effects }
    }

    /// Authorization of the role, actions, refs and policy echo (§3 items 6–9).
    fn authorize(&self, role: Role) -> Result<(), Rejection> {
        let action = self.p.operation.as_str();
        let deny = |why: &str| {
            Err(unauthorized(why)
                .with("required_action", action)
                .with(
                    "target_type",
                    if self.p.target.is_empty() {
                        "project"
                    } else {
                        "work-item"
                    },
                )
                .with("policy_version", self.ctx.policy_version.as_str()))
        };
        if self.preflight() {
            if !self.rules.may_preflight(role) {
                return deny("role may not preflight lifecycle commands");
            }
        } else if !self.rules.family(role).contains(&self.p.command) {
            return deny("command is outside the role's lifecycle family");
        }
        if !self.ctx.allows(action) {
            return deny("action is not in allowed_actions");
        }
        self.ctx.check_refs(&self.p.payload_refs(Some(role)))?;
        self.ctx.check_policy_echo(&self.env.policy_version)?;
        Ok(())
    }

    fn replay_or_conflict(&self, entry: &IdempotencyEntry) -> Result<ResultEnvelope, Stop> {
        let fp = self.fingerprint();
        if entry.fingerprint == fp {
            return Ok(entry.result.as_replay());
        }
        let rej = Rejection::new(
            Code::IdempotencyConflict,
            "idempotency key was used for a different request",
        )
        .with("conflict_kind", "request-fingerprint")
        .with("key_scope", "project")
        .with("request_fingerprint_digest", fp)
        .with("recorded_fingerprint_digest", entry.fingerprint.as_str());
        Err(Stop {
            rejection: rej,
            before: self.before(),
            record: false,
        })
    }

    /// Steps up to and including preconditions. `Ok(Err(env))` is a replay.
    fn steps(&self) -> Result<Result<Transition, ResultEnvelope>, Stop> {
        let before = self.before();
        let unrecorded = |rejection: Rejection| Stop {
            rejection,
            before,
            record: false,
        };
        // 1. context validity and scoping.
        let role = self
            .ctx
            .validate(self.inputs.trusted_project, self.inputs.now)
            .map_err(|r| {
                unrecorded(
                    r.with("required_action", self.p.operation.as_str())
                        .with("policy_version", self.ctx.policy_version.as_str()),
                )
            })?;
        let now = self.inputs.now.unwrap_or(Timestamp::UNIX_EPOCH);
        self.ctx
            .check_scope(&self.p.target, &self.p.payload.change_set_id)
            .map_err(unrecorded)?;

        // 2. target visibility.
        let record = self.inputs.record;
        if record.is_none() && self.p.command != Command::Materialize {
            let not_found =
                Rejection::new(Code::NotFound, "work item is not visible in this project")
                    .with("target_type", "work-item")
                    .with("visibility_scope", "project");
            let would_pass = self.authorize(role).is_ok();
            if would_pass && !self.preflight() && !self.env.idempotency_key.is_empty() {
                if let Some(entry) = self.inputs.idempotency {
                    return self.replay_or_conflict(entry).map(Err);
                }
                return Err(Stop {
                    rejection: not_found,
                    before: None,
                    record: true,
                });
            }
            return Err(Stop {
                rejection: not_found,
                before: None,
                record: false,
            });
        }

        // 3. role family, actions, refs, policy echo.
        self.authorize(role).map_err(unrecorded)?;
        if !self.preflight() && self.env.idempotency_key.is_empty() {
            return Err(unrecorded(
                Rejection::new(
                    Code::InvalidRequest,
                    "idempotency_key is required for mutations",
                )
                .with("field", "idempotency_key")
                .with("reason", "missing"),
            ));
        }

        // 4. idempotency replay or conflict.
        if !self.preflight()
            && let Some(entry) = self.inputs.idempotency
        {
            return self.replay_or_conflict(entry).map(Err);
        }

        // 5. materialization create-or-return.
        if self.p.command == Command::Materialize
            && !self.p.materialization_key.is_empty()
            && let Some(replay) = self.create_or_return(before)?
        {
            return Ok(Err(replay));
        }

        // 6. resolve-block binding.
        let mut binding = None;
        if self.p.command == Command::ResolveBlock && !self.preflight() {
            binding = Some(self.resolve_block_binding(role).map_err(unrecorded)?);
        }

        let current = before.unwrap_or(StateVersion {
            state: State::Initial,
            contract_version: 0,
        });
        // 7. terminal.
        if self.rules.is_terminal(current.state) {
            return Err(Stop::new(
                Rejection::new(Code::AlreadyTerminal, "work item is terminal")
                    .with("terminal_state", current.state.as_str())
                    .with("current_contract_version", current.contract_version),
                before,
            ));
        }
        // 8. live-lease contention.
        if self.p.command == Command::Claim
            && let Some(_lease) = record.and_then(|r| r.live_lease(now))
        {
            return Err(Stop::new(
                Rejection::new(Code::DuplicateClaim, "another owner holds a live lease")
                    .with("current_state", current.state.as_str())
                    .with("current_contract_version", current.contract_version)
                    .with("claim_status", "active"),
                before,
            ));
        }
        // 9. expected state.
        let expected_state = self.env.expected_state.clone().unwrap_or_default();
        if expected_state != current.state.as_str() {
            return Err(Stop::new(
                Rejection::new(
                    Code::StaleState,
                    "expected state differs from the current state",
                )
                .with("expected_state", expected_state)
                .with("current_state", current.state.as_str()),
                before,
            ));
        }
        // 10. expected version.
        if self.env.expected_contract_version != Some(current.contract_version) {
            return Err(Stop::new(
                Rejection::new(
                    Code::StaleContractVersion,
                    "expected contract version differs from the current version",
                )
                .with(
                    "expected_contract_version",
                    json!(self.env.expected_contract_version),
                )
                .with("current_contract_version", current.contract_version),
                before,
            ));
        }
        // 11. live fence (Job Site callers only).
        if role == Role::JobSite
            && self.rules.is_fenced_for_job_site(self.p.command)
            && let Some(status) =
                fence_status(record, &self.ctx.subject, &self.env.fencing_token, now)
        {
            return Err(Stop::new(
                Rejection::new(
                    Code::StaleFencingToken,
                    "fencing token is not the live fence",
                )
                .with("fence_status", status.as_str())
                .with("current_contract_version", current.contract_version),
                before,
            ));
        }
        // 12. transition legality.
        let rule = self.rules.rule(self.p.command, role).or_else(|| {
            self.rules
                .transitions()
                .iter()
                .find(|r| r.command == self.p.command)
        });
        let Some(rule) = rule.filter(|r| r.from.contains(&current.state)) else {
            let allowed: Vec<&str> = self
                .rules
                .allowed_operations(current.state)
                .iter()
                .map(|c| c.as_str())
                .collect();
            return Err(Stop::new(
                Rejection::new(
                    Code::InvalidTransition,
                    "command is not legal from the current state",
                )
                .with("operation", self.p.command.as_str())
                .with("current_state", current.state.as_str())
                .with("allowed_operations", allowed),
                before,
            ));
        };
        // 13. preconditions.
        self.apply(rule, record, current, now, binding)
            .map(Ok)
            .map_err(|r| Stop::new(r, before))
    }

    /// Materialization create-or-return (§9). `Ok(Some)` is a replay.
    fn create_or_return(
        &self,
        before: Option<StateVersion>,
    ) -> Result<Option<ResultEnvelope>, Stop> {
        let stop = |r: Rejection| Stop::new(r, before);
        let source_fp = self.source_fingerprint();
        if let Some(res) = self.inputs.reservation {
            if res.work_item_id != self.p.target || res.project_id != self.inputs.trusted_project {
                return Err(stop(precondition(
                    "materialization key is bound to another work item or project",
                    "materialization_key",
                )));
            }
            if self.source_has_candidate_fields() {
                return Err(stop(precondition(
                    "a materialization source may name only expected_merge.target",
                    "expected_merge",
                )));
            }
            if res.source_fingerprint != source_fp {
                return Err(stop(
                    Rejection::new(
                        Code::IdempotencyConflict,
                        "materialization key is bound to a different source",
                    )
                    .with("conflict_kind", "materialization-source")
                    .with("key_scope", "project")
                    .with("materialization_key", self.p.materialization_key.as_str())
                    .with("recorded_source_digest", res.source_fingerprint.as_str())
                    .retry(Retry::Reconcile),
                ));
            }
            return Ok(Some(res.result.as_replay()));
        }
        if self.inputs.record.is_some() {
            return Err(stop(
                Rejection::new(
                    Code::IdempotencyConflict,
                    "a work item with this id exists under another materialization key",
                )
                .with("conflict_kind", "materialization-source")
                .with("key_scope", "project")
                .with("materialization_key", self.p.materialization_key.as_str())
                .retry(Retry::Reconcile),
            ));
        }
        Ok(None)
    }

    fn source_has_candidate_fields(&self) -> bool {
        self.p
            .payload
            .work_item
            .as_ref()
            .and_then(|w| w.expected_merge.as_ref())
            .is_some_and(|m| m.has_candidate_fields())
    }

    fn effective_change_type(&self) -> String {
        let from_source = self
            .p
            .payload
            .work_item
            .as_ref()
            .map(|w| w.change_type.clone())
            .unwrap_or_default();
        if from_source.is_empty() {
            self.p.payload.change_type.clone()
        } else {
            from_source
        }
    }

    /// Fingerprint of the canonical source contract with mutable fields blanked.
    fn source_fingerprint(&self) -> String {
        let Some(w) = self.p.payload.work_item.as_ref() else {
            return fingerprint::digest_value(&Value::Null);
        };
        let project = if w.project_id.is_empty() {
            self.inputs.trusted_project
        } else {
            &w.project_id
        };
        let deps: Vec<&str> = w.dependencies.iter().map(|d| d.id.as_str()).collect();
        fingerprint::digest_value(&json!({
            "id": w.id,
            "project_id": project,
            "change_type": self.effective_change_type(),
            "implementation_required": w.implementation_required.unwrap_or(true),
            "readiness": w.readiness,
            "dependencies": deps,
            "expected_merge_target": w.expected_merge.as_ref().map(|m| m.target.clone()).unwrap_or_default(),
        }))
    }

    /// §12.5 binding; returns the approving human.
    fn resolve_block_binding(&self, role: Role) -> Result<Binding, Rejection> {
        let p = &self.p.payload;
        let deny = |why: &str| Err(unauthorized(why));
        if p.resolution_submission_id.is_empty()
            || self.p.human_approval_id.is_empty()
            || p.approval_resolution_digest.is_empty()
        {
            return deny(
                "resolve-block needs resolution_submission_id, human_approval_id and approval_resolution_digest",
            );
        }
        let Some(record) = self.inputs.record else {
            return deny("work item is not visible");
        };
        if record.active_resolution_submission_id != p.resolution_submission_id {
            return deny("submission is not the item's active submission");
        }
        let Some(sub) = self
            .inputs
            .submission
            .filter(|s| s.id == p.resolution_submission_id)
        else {
            return deny("submission does not exist");
        };
        if sub.status != "pending"
            || sub.work_item_id != record.id
            || sub.kind != p.resolution_kind
            || sub.approval_id != self.p.human_approval_id
            || sub.approval_digest != p.approval_resolution_digest
            || sub.approved_human_subject.trim().is_empty()
        {
            return deny("submission does not match the request");
        }
        let Some(approval) = self
            .inputs
            .approval
            .filter(|a| a.id == self.p.human_approval_id)
        else {
            return deny("approval does not exist");
        };
        if approval.approved_subject != sub.approved_human_subject {
            return deny("approval was given by another human than the submission recorded");
        }
        let change_set = if p.change_set_id.is_empty() {
            sub.change_set_id.as_str()
        } else {
            p.change_set_id.as_str()
        };
        let use_ = ApprovalUse {
            action: Command::ResolveBlock.as_str(),
            principal: &self.ctx.subject,
            digest: &p.approval_resolution_digest,
            project_id: Some(self.inputs.trusted_project),
            work_item_id: Some(&record.id),
            request_id: None,
            resolution_kind: Some(&p.resolution_kind),
            expected_state: self.env.expected_state.as_deref(),
            expected_contract_version: self.env.expected_contract_version,
            policy_version: Some(&self.ctx.policy_version),
            change_set_id: Some(change_set),
        };
        let _ = role;
        approval
            .check(&use_, self.inputs.now.unwrap_or(Timestamp::UNIX_EPOCH))
            .map_err(unauthorized)?;
        Ok(Binding {
            approval_id: approval.id.clone(),
            submission_id: sub.id.clone(),
            human: approval.approved_subject.clone(),
        })
    }

    fn lease_duration(&self) -> SignedDuration {
        let secs = if self.inputs.lease_seconds > 0 {
            self.inputs.lease_seconds
        } else {
            self.rules.default_lease_seconds()
        };
        SignedDuration::from_secs(secs)
    }

    fn mint(&self, now: Timestamp) -> Result<Lease, Rejection> {
        let Some(token) = self
            .inputs
            .next_fencing_token
            .clone()
            .filter(|t| !t.is_empty())
        else {
            return Err(precondition(
                "no fencing token was minted for a fence-issuing transition",
                "fencing_token",
            ));
        };
        let expires_at = now
            .checked_add(self.lease_duration())
            .map_err(|_| precondition("lease expiry is out of range", "lease"))?;
        Ok(Lease {
            owner: self.ctx.subject.clone(),
            fencing_token: token,
            expires_at,
        })
    }

    fn readiness(&self, record: &WorkItemRecord) -> Readiness {
        self.inputs
            .observed_readiness
            .cloned()
            .unwrap_or_else(|| record.readiness.clone())
    }

    fn observe(&self, deps: &[Dependency]) -> Vec<Dependency> {
        deps.iter()
            .map(|d| Dependency {
                id: d.id.clone(),
                state: if d.id.is_empty() {
                    State::Initial
                } else {
                    self.inputs
                        .dependency_states
                        .get(&d.id)
                        .copied()
                        .unwrap_or(State::Initial)
                },
            })
            .collect()
    }

    /// Preconditions and the record after the command.
    fn apply(
        &self,
        rule: &TransitionRule,
        record: Option<&WorkItemRecord>,
        current: StateVersion,
        now: Timestamp,
        binding: Option<Binding>,
    ) -> Result<Transition, Rejection> {
        if self.p.command == Command::Materialize {
            return self.materialize();
        }
        let Some(record) = record else {
            return Err(Rejection::new(
                Code::NotFound,
                "work item is not visible in this project",
            ));
        };
        let p = &self.p.payload;
        let mut next = record.clone();
        let mut fence = None;
        let mut release = false;
        let mut consume_approval = None;
        let mut consume_submission = None;
        let mut human = String::new();
        // Branch on the row's role: a preview by another role uses the row it previews.
        let role = rule.role;
        if let Some(evidence) = &rule.evidence {
            check_evidence(record, &evidence.status, &evidence.git_mutation)?;
        }
        let to: State = match self.p.command {
            Command::Materialize => State::Initial,
            Command::RefreshDependencies => {
                let readiness = self.readiness(record);
                let deps = self.observe(&record.dependencies);
                refresh_check(&readiness, &deps)?;
                next.readiness = readiness;
                next.dependencies = deps;
                State::ReadyForBuilding
            }
            Command::Revalidate => {
                let readiness = self.readiness(record);
                let Some(reason) = readiness_failure(&readiness) else {
                    return Err(precondition(
                        "revalidation found no unresolved condition",
                        "unresolved_condition",
                    ));
                };
                next.readiness = readiness;
                next.dependencies = self.observe(&record.dependencies);
                next.block_reason = reason;
                State::Blocked
            }
            Command::ResolveBlock => {
                self.resolution_refresh(record)?;
                let readiness = self.readiness(record);
                let deps = self.observe(&record.dependencies);
                refresh_check(&readiness, &deps)?;
                next.readiness = readiness;
                next.dependencies = deps;
                next.block_reason.clear();
                next.active_resolution_submission_id.clear();
                if let Some(b) = binding {
                    consume_approval = Some(b.approval_id);
                    consume_submission = Some(b.submission_id);
                    human = b.human;
                }
                State::ReadyForBuilding
            }
            Command::Claim => {
                refresh_check(&record.readiness, &record.dependencies)?;
                let lease = self.mint(now)?;
                fence = Some(lease.fencing_token.clone());
                next.owner = lease.owner.clone();
                next.lease = Some(lease);
                State::Building
            }
            Command::RenewLease => {
                let duration = self.lease_duration();
                if let Some(lease) = next.lease.as_mut() {
                    lease.expires_at = now
                        .checked_add(duration)
                        .map_err(|_| precondition("lease expiry is out of range", "lease"))?;
                }
                current.state
            }
            Command::TestsPass => {
                if !p.build_tests_passed {
                    return Err(precondition(
                        "tests-pass needs build_tests_passed",
                        "build_tests_passed",
                    ));
                }
                State::Inspecting
            }
            Command::RaiseSpecQuestion => {
                if p.question.trim().is_empty() {
                    return Err(precondition(
                        "raise-spec-question needs a question",
                        "question",
                    ));
                }
                next.block_reason = p.question.clone();
                release = true;
                State::Blocked
            }
            Command::RefreshActive => {
                let readiness = self.readiness(record);
                let deps = self.observe(&record.dependencies);
                let failure = refresh_check(&readiness, &deps).err();
                next.readiness = readiness;
                next.dependencies = deps;
                match failure {
                    None => {
                        let lease = self.mint(now)?;
                        fence = Some(lease.fencing_token.clone());
                        next.owner = lease.owner.clone();
                        next.lease = Some(lease);
                        State::Building
                    }
                    Some(rej) => {
                        next.block_reason = rej.message;
                        release = true;
                        State::Blocked
                    }
                }
            }
            Command::ReturnToBuilding => {
                if !p.in_contract_defect && !p.final_tests_failed {
                    return Err(precondition(
                        "return-to-building needs in_contract_defect or final_tests_failed",
                        "in_contract_defect",
                    ));
                }
                let lease = self.mint(now)?;
                fence = Some(lease.fencing_token.clone());
                next.owner = lease.owner.clone();
                next.lease = Some(lease);
                State::Building
            }
            Command::BeginMerge => {
                if !(record.inspection_run_sealed
                    && record.findings_terminal
                    && record.final_tests_passed)
                {
                    return Err(precondition("the WMS has not observed a sealed inspection with terminal findings and passing final tests", "inspection_evidence")
                        .with("required_evidence", json!(["inspection_run_sealed", "findings_terminal", "final_tests_passed"])));
                }
                let Some(env) = p.merge_envelope.clone() else {
                    return Err(precondition(
                        "begin-merge needs the tested-candidate merge_envelope",
                        "merge_envelope",
                    ));
                };
                let completes_under = next_version(current.contract_version)?;
                if env.product_tree_digest.is_empty()
                    || env.inspection_run_id.is_empty()
                    || env.integration_head.is_empty()
                    || env.target.is_empty()
                    || !env.merge_commit.is_empty()
                    || env.contract_version != completes_under
                {
                    return Err(precondition(
                        "merge_envelope must carry digest, inspection run, integration head and target, no merge commit, and the version the merge completes under",
                        "merge_envelope",
                    )
                    .with("required_contract_version", completes_under));
                }
                if let Some(t) = record
                    .expected_merge
                    .as_ref()
                    .map(|m| m.target.as_str())
                    .filter(|t| !t.is_empty())
                    && t != env.target
                {
                    return Err(precondition(
                        "merge target differs from the materialized target",
                        "merge_envelope.target",
                    ));
                }
                next.expected_merge = Some(env);
                State::Merging
            }
            Command::MergeConflict if role == Role::JobSite => {
                next.reconciliation = None;
                let lease = self.mint(now)?;
                fence = Some(lease.fencing_token.clone());
                next.owner = lease.owner.clone();
                next.lease = Some(lease);
                State::Building
            }
            Command::MergeConflict | Command::MergeNotApplied => {
                next.reconciliation = None;
                next.expected_merge = record
                    .expected_merge
                    .as_ref()
                    .map(|m| crate::record::MergeEnvelope {
                        target: m.target.clone(),
                        ..Default::default()
                    })
                    .filter(|m| !m.target.is_empty());
                release = true;
                State::ReadyForBuilding
            }
            Command::RecordMerge => {
                let candidate = if role == Role::Reconciler {
                    record
                        .reconciliation
                        .as_ref()
                        .and_then(|r| r.merge_envelope.clone())
                } else {
                    p.merge_envelope.clone()
                };
                envelope_matches(record, candidate.as_ref())?;
                if role != Role::Reconciler {
                    next.reconciliation = Some(Reconciliation {
                        status: "merge-recorded".to_string(),
                        git_mutation: "merged".to_string(),
                        merge_envelope: candidate,
                    });
                }
                release = true;
                State::Completed
            }
            Command::RecoverLease => {
                if record.live_lease(now).is_some() {
                    return Err(precondition("the lease is still live", "lease_expired"));
                }
                next.reconciliation = None;
                release = true;
                State::ReadyForBuilding
            }
            Command::Abandon => {
                if !p.cancellation_confirmed {
                    return Err(precondition(
                        "abandon needs cancellation_confirmed",
                        "cancellation_confirmed",
                    ));
                }
                release = true;
                State::Abandoned
            }
        };
        let legal = rule.to.iter().any(|d| match d {
            Destination::Same(_) => to == current.state,
            Destination::State(s) => *s == to,
        });
        if !legal {
            return Err(precondition(
                "the ruleset has no such destination",
                "destination",
            ));
        }
        if release {
            next.lease = None;
            next.owner.clear();
        }
        if to != current.state {
            next.state_since = self.inputs.now;
        }
        next.state = to;
        next.contract_version = next_version(current.contract_version)?;
        if !self.rules.keeps_inspection_evidence(to) {
            next.inspection_run_sealed = false;
            next.findings_terminal = false;
            next.final_tests_passed = false;
        }
        let after = StateVersion {
            state: to,
            contract_version: next.contract_version,
        };
        Ok(Transition {
            record: Some(next),
            outcome: DecisionOutcome::Allowed,
            after: Some(after),
            fence,
            reservation: None,
            consume_approval,
            consume_submission,
            human,
        })
    }

    /// §12.5 resolution-specific refresh (the preview uses the payload instead of a binding).
    fn resolution_refresh(&self, record: &WorkItemRecord) -> Result<(), Rejection> {
        let p = &self.p.payload;
        let sub = self
            .inputs
            .submission
            .filter(|s| s.id == record.active_resolution_submission_id);
        let (kind, change_set, confirmed) = match sub {
            Some(s) if !self.preflight() || p.resolution_submission_id == s.id => (
                s.kind.clone(),
                s.change_set_id.clone(),
                s.inspector_confirmed,
            ),
            _ => (p.resolution_kind.clone(), p.change_set_id.clone(), false),
        };
        match kind.as_str() {
            "add-requirement" => {
                if self.inputs.planned_dependency_state != Some(State::Completed) {
                    return Err(precondition(
                        &format!("planned dependency {change_set} build work is not completed"),
                        "planned_dependency",
                    )
                    .with("blocking_dependency", change_set.as_str()));
                }
                Ok(())
            }
            "out-of-scope" => {
                if !confirmed {
                    return Err(precondition(
                        "out-of-scope needs an independent Inspector confirmation",
                        "inspector_confirmation",
                    )
                    .with("required_evidence", "independent-inspector-confirmation"));
                }
                Ok(())
            }
            "impact-amendment" => Ok(()),
            _ => Err(precondition("unknown resolution kind", "resolution_kind")),
        }
    }

    fn materialize(&self) -> Result<Transition, Rejection> {
        if self.p.materialization_key.is_empty() {
            return Err(precondition(
                "materialize needs a materialization key",
                "materialization_key",
            ));
        }
        let Some(source) = self.p.payload.work_item.as_ref() else {
            return Err(precondition(
                "materialize needs the source contract payload.work_item",
                "work_item",
            ));
        };
        if source.id.is_empty() || source.id != self.p.target {
            return Err(precondition(
                "source contract id must equal the target work item",
                "work_item.id",
            ));
        }
        let project = if source.project_id.is_empty() {
            self.inputs.trusted_project
        } else {
            &source.project_id
        };
        if project != self.inputs.trusted_project {
            return Err(precondition(
                "source contract belongs to another project",
                "work_item.project_id",
            ));
        }
        let change_type = self.effective_change_type();
        if !CHANGE_TYPES.contains(&change_type.as_str()) {
            return Err(Rejection::new(
                Code::InvalidChangeType,
                "change type is not one of undefined, changes, contradicts",
            )
            .with("provided_type", change_type.as_str())
            .with("allowed_types", CHANGE_TYPES.to_vec()));
        }
        if let Some(flag) = source.readiness.contract_failure() {
            return Err(precondition(
                &format!("contract is incomplete: {flag} is false"),
                flag,
            ));
        }
        if self.source_has_candidate_fields() {
            return Err(precondition(
                "a materialization source may name only expected_merge.target",
                "expected_merge",
            ));
        }
        let fp = self.source_fingerprint();
        let implementation_required = source.implementation_required.unwrap_or(true);
        if !implementation_required {
            return Ok(Transition {
                record: None,
                outcome: DecisionOutcome::Omitted,
                after: None,
                fence: None,
                reservation: Some((fp, "omitted".to_string())),
                consume_approval: None,
                consume_submission: None,
                human: String::new(),
            });
        }
        let deps = self.observe(&source.dependencies);
        let (state, reason) = if let Some(reason) = source.readiness.blocker() {
            (State::Blocked, reason)
        } else if first_unsatisfied(&deps).is_some() {
            (State::Waiting, String::new())
        } else {
            (State::ReadyForBuilding, String::new())
        };
        let mut rec = WorkItemRecord::new(&source.id, project, state, 1);
        rec.materialization_key = self.p.materialization_key.clone();
        rec.change_type = change_type;
        rec.implementation_required = true;
        rec.priority = source.priority.clone();
        rec.dependencies = deps;
        rec.readiness = source.readiness.clone();
        rec.block_reason = reason;
        rec.state_since = self.inputs.now;
        rec.expected_merge = source
            .expected_merge
            .as_ref()
            .filter(|m| !m.target.is_empty())
            .map(|m| crate::record::MergeEnvelope {
                target: m.target.clone(),
                ..Default::default()
            });
        Ok(Transition {
            record: Some(rec),
            outcome: DecisionOutcome::Allowed,
            after: Some(StateVersion {
                state,
                contract_version: 1,
            }),
            fence: None,
            reservation: Some((fp, state.as_str().to_string())),
            consume_approval: None,
            consume_submission: None,
            human: String::new(),
        })
    }
}

struct Binding {
    approval_id: String,
    submission_id: String,
    human: String,
}

/// The version a write produces; at `u64::MAX` there is none, and the write is rejected
/// (`PRECONDITION_FAILED`, `failed_precondition: contract_version_exhausted`) instead of
/// panicking (debug) or wrapping to 0 (release).
fn next_version(current: u64) -> Result<u64, Rejection> {
    current.checked_add(1).ok_or_else(|| {
        precondition(
            "the contract version is at its maximum (2^64 - 1) and cannot advance; the item cannot be written again",
            "contract_version_exhausted",
        )
        .with("contract_version", current)
    })
}

fn precondition(message: &str, failed: &str) -> Rejection {
    Rejection::new(Code::PreconditionFailed, message).with("failed_precondition", failed)
}

/// The fence status of a Job Site caller (§6), `None` when the fence is live:
/// [`FenceStatus::Missing`] without a lease, else the lease's own
/// [`Lease::refusal`] (expiry, owner, then [`Lease::admits`]).
pub fn fence_status(
    record: Option<&WorkItemRecord>,
    subject: &str,
    token: &FencingToken,
    now: Timestamp,
) -> Option<FenceStatus> {
    match record.and_then(|r| r.lease.as_ref()) {
        None => Some(FenceStatus::Missing),
        Some(lease) => lease.refusal(subject, token, now),
    }
}

/// The lexicographically smallest dependency that is not `completed`.
pub fn first_unsatisfied(deps: &[Dependency]) -> Option<String> {
    deps.iter()
        .filter(|d| d.id.is_empty() || d.state != State::Completed)
        .map(|d| d.id.clone())
        .min()
}

fn readiness_failure(r: &Readiness) -> Option<String> {
    if let Some(flag) = r.contract_failure() {
        return Some(format!("{flag}: contract is incomplete"));
    }
    r.blocker()
}

/// Contract, blocker and dependency checks of a refresh.
fn refresh_check(readiness: &Readiness, deps: &[Dependency]) -> Result<(), Rejection> {
    if let Some(reason) = readiness_failure(readiness) {
        return Err(precondition(&reason, "readiness"));
    }
    if let Some(dep) = first_unsatisfied(deps) {
        return Err(precondition(
            &format!("dependency {dep:?} is not completed"),
            "dependencies",
        )
        .with("blocking_dependency", dep));
    }
    Ok(())
}

fn check_evidence(
    record: &WorkItemRecord,
    status: &str,
    git_mutation: &str,
) -> Result<(), Rejection> {
    let ok = record
        .reconciliation
        .as_ref()
        .is_some_and(|r| r.status == status && r.git_mutation == git_mutation);
    if ok {
        Ok(())
    } else {
        Err(precondition(
            "the WMS has not observed the required reconciliation evidence",
            "reconciliation",
        )
        .with(
            "required_evidence",
            json!({"status": status, "git_mutation": git_mutation}),
        ))
    }
}

/// §10 envelope match against the stored `expected_merge` at the current version.
fn envelope_matches(
    record: &WorkItemRecord,
    candidate: Option<&crate::record::MergeEnvelope>,
) -> Result<(), Rejection> {
    let fail = |why: &str| Err(precondition(why, "merge_envelope"));
    let Some(expected) = record.expected_merge.as_ref() else {
        return fail("no expected merge is recorded");
    };
    let Some(c) = candidate else {
        return fail("no merge envelope was presented");
    };
    if c.product_tree_digest.is_empty()
        || c.inspection_run_id.is_empty()
        || c.integration_head.is_empty()
        || c.target.is_empty()
        || c.merge_commit.is_empty()
    {
        return fail("merge envelope is incomplete");
    }
    if c.contract_version != record.contract_version
        || c.product_tree_digest != expected.product_tree_digest
        || c.inspection_run_id != expected.inspection_run_id
        || c.integration_head != expected.integration_head
        || c.target != expected.target
        || c.contract_version != expected.contract_version
    {
        return fail("merge envelope does not match the expected merge");
    }
    Ok(())
}

impl EnvelopeOutcome {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EnvelopeOutcome::Read => "read",
            EnvelopeOutcome::Applied => "applied",
            EnvelopeOutcome::Replayed => "replayed",
            EnvelopeOutcome::Rejected => "rejected",
        }
    }
}

impl Mutation {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mutation::None => "none",
            Mutation::Applied => "applied",
            Mutation::Unknown => "unknown",
            Mutation::NotApplicable => "not-applicable",
        }
    }
}

impl IdempotencyStatus {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            IdempotencyStatus::New => "new",
            IdempotencyStatus::Replayed => "replayed",
        }
    }
}
