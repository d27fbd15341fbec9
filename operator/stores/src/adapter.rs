//! The WMS adapter: one entry point for all 30 operations of the adapter API.
//!
//! Lifecycle commands and `lifecycle.preflight` load their trusted inputs
//! through the transactional view, call the pure evaluator and write its
//! effects back; request-namespace, blocked-work and ledger operations are
//! handled by their own modules. Everything a call writes goes through one
//! [`WmsTxn`], which the backend commits atomically.

use std::collections::BTreeMap;

use jiff::Timestamp;
use protobot_lifecycle::{
    AuthorizationContext, Code, Command, FencingToken, Operation, OperationEnvelope, Rejection,
    ResultEnvelope, Role, Ruleset, State, context::unauthorized, evaluate_prepared, prepare,
};

use crate::{blocked_work, ledger, queries, requests, txn::WmsTxn};

/// Deployment settings the adapter needs.
#[derive(Clone, Debug)]
pub struct AdapterConfig {
    /// The Materializer's trusted subject (blocked-work submissions delegate to it).
    pub materializer_subject: String,
    /// Lease duration in seconds (0: the ruleset default of 15 minutes).
    pub lease_seconds: i64,
}

impl Default for AdapterConfig {
    fn default() -> Self {
        AdapterConfig {
            materializer_subject: "materializer".to_string(),
            lease_seconds: 0,
        }
    }
}

/// Non-lifecycle operations each role may call (§2.2). Lifecycle commands are
/// authorized by the evaluator's role families instead.
pub fn partition(role: Role) -> &'static [Operation] {
    use Operation as O;
    match role {
        Role::DraftingTable => &[
            O::RequestCreate,
            O::RequestRefine,
            O::RequestLinkChangeSet,
            O::RequestLinkBuildWorkItem,
            O::RequestGet,
            O::RequestQuery,
            O::WorkItemGet,
            O::WorkItemQuery,
            O::BlockedWorkQuery,
            O::LifecyclePreflight,
            O::BlockedWorkSubmitResolution,
            O::BlockedWorkAcknowledge,
        ],
        // Newer code and doc let a human maintainer link change sets too.
        Role::HumanMaintainer => &[O::RequestUpdatePriority, O::RequestLinkChangeSet],
        Role::JobSite => &[O::FindingCreate, O::LifecyclePreflight],
        Role::Materializer => &[O::LifecyclePreflight],
        Role::Reconciler => &[],
    }
}

/// Executes one adapter operation. `ctx` is `None` when the Gate could not
/// resolve the actor reference.
pub fn handle(
    txn: &mut dyn WmsTxn,
    cfg: &AdapterConfig,
    ctx: Option<&AuthorizationContext>,
    env: &OperationEnvelope,
    now: Timestamp,
) -> ResultEnvelope {
    let Some(operation) = Operation::parse(&env.operation) else {
        return ResultEnvelope::rejected(
            &env.operation,
            unauthorized("operation is not part of the adapter API")
                .with("required_action", env.operation.as_str()),
        );
    };
    let Some(ctx) = ctx else {
        return ResultEnvelope::rejected(
            operation.as_str(),
            unauthorized("actor context reference could not be resolved"),
        );
    };
    let rules = match Ruleset::v1() {
        Ok(r) => r,
        Err(e) => {
            return ResultEnvelope::rejected(
                operation.as_str(),
                Rejection::new(Code::WmsUnavailable, format!("ruleset unavailable: {e}")),
            );
        }
    };
    if operation.command().is_some() || operation == Operation::LifecyclePreflight {
        return lifecycle(txn, cfg, rules, ctx, env, now);
    }
    // Request namespace: partition, context validity, policy echo, then the handler.
    let role = match ctx.validate(txn.project_id(), Some(now)) {
        Ok(role) => role,
        Err(r) => return ResultEnvelope::rejected(operation.as_str(), r),
    };
    if !partition(role).contains(&operation) || !ctx.allows(operation.as_str()) {
        return ResultEnvelope::rejected(
            operation.as_str(),
            unauthorized("operation is outside the caller's partition")
                .with("required_action", operation.as_str())
                .with("policy_version", ctx.policy_version.as_str()),
        );
    }
    if let Err(r) = ctx.check_policy_echo(&env.policy_version) {
        return ResultEnvelope::rejected(operation.as_str(), r);
    }
    let call = Call {
        txn,
        cfg,
        ctx,
        env,
        now,
        operation,
    };
    match operation {
        Operation::RequestCreate
        | Operation::RequestRefine
        | Operation::RequestUpdatePriority
        | Operation::RequestLinkChangeSet
        | Operation::RequestLinkBuildWorkItem => requests::mutate(call),
        Operation::RequestGet
        | Operation::RequestQuery
        | Operation::WorkItemGet
        | Operation::WorkItemQuery
        | Operation::BlockedWorkQuery => queries::read(call),
        Operation::BlockedWorkSubmitResolution | Operation::BlockedWorkAcknowledge => {
            blocked_work::mutate(call)
        }
        Operation::FindingCreate => ledger::create(call),
        _ => ResultEnvelope::rejected(
            operation.as_str(),
            Rejection::new(Code::InvalidRequest, "operation has no handler")
                .with("field", "operation"),
        ),
    }
}

/// One non-lifecycle call, passed to the namespace handlers.
pub struct Call<'a> {
    /// The transactional view.
    pub txn: &'a mut dyn WmsTxn,
    /// Deployment settings.
    pub cfg: &'a AdapterConfig,
    /// The validated trusted context.
    pub ctx: &'a AuthorizationContext,
    /// The envelope.
    pub env: &'a OperationEnvelope,
    /// Trusted time.
    pub now: Timestamp,
    /// The operation.
    pub operation: Operation,
}

fn lifecycle(
    txn: &mut dyn WmsTxn,
    cfg: &AdapterConfig,
    rules: &Ruleset,
    ctx: &AuthorizationContext,
    env: &OperationEnvelope,
    now: Timestamp,
) -> ResultEnvelope {
    let prepared = match prepare(env) {
        Ok(p) => p,
        Err(r) => return ResultEnvelope::rejected(&env.operation, r),
    };
    let record = txn.record(&prepared.target);
    let idempotency = if env.idempotency_key.is_empty() {
        None
    } else {
        txn.idempotency(&env.idempotency_key)
    };
    let reservation =
        if prepared.command == Command::Materialize && !prepared.materialization_key.is_empty() {
            txn.reservation(&prepared.materialization_key)
        } else {
            None
        };
    let observed = txn.observed_readiness(&prepared.target);
    let deps: Vec<String> = match (prepared.command, &record) {
        (Command::Materialize, _) => prepared
            .payload
            .work_item
            .as_ref()
            .map(|w| w.dependencies.iter().map(|d| d.id.clone()).collect())
            .unwrap_or_default(),
        (_, Some(r)) => r.dependencies.iter().map(|d| d.id.clone()).collect(),
        _ => Vec::new(),
    };
    let dependency_states: BTreeMap<String, State> = deps
        .iter()
        .filter(|id| !id.is_empty())
        .filter_map(|id| txn.record(id).map(|r| (id.clone(), r.state)))
        .collect();
    let approval = if prepared.human_approval_id.is_empty() {
        None
    } else {
        txn.approval(&prepared.human_approval_id)
    };
    let submission_id = if prepared.payload.resolution_submission_id.is_empty() {
        record
            .as_ref()
            .map(|r| r.active_resolution_submission_id.clone())
            .unwrap_or_default()
    } else {
        prepared.payload.resolution_submission_id.clone()
    };
    let submission = if submission_id.is_empty() {
        None
    } else {
        txn.submission(&submission_id)
    };
    // The planned dependency of an add-requirement resolution: the build item of
    // the submission's change set (or, for a preview, of the payload's).
    let planned_change_set = match (&submission, prepared.payload.change_set_id.is_empty()) {
        (Some(s), true) => s.change_set_id.clone(),
        _ => prepared.payload.change_set_id.clone(),
    };
    let planned_dependency_state = txn
        .change_set(&planned_change_set)
        .filter(|cs| !cs.build_work_item_id.is_empty())
        .and_then(|cs| txn.record(&cs.build_work_item_id))
        .map(|r| r.state);
    let next_fencing_token = Some(FencingToken::mint(txn.peek("fence")));
    let inputs = protobot_lifecycle::Inputs {
        trusted_project: txn.project_id(),
        now: Some(now),
        record: record.as_ref(),
        idempotency: idempotency.as_ref(),
        reservation: reservation.as_ref(),
        observed_readiness: observed.as_ref(),
        dependency_states,
        approval: approval.as_ref(),
        submission: submission.as_ref(),
        planned_dependency_state,
        lease_seconds: cfg.lease_seconds,
        next_fencing_token,
    };
    let evaluation = evaluate_prepared(rules, env, &prepared, ctx, &inputs);
    let effects = evaluation.effects;
    let issued = evaluation
        .result
        .decision
        .as_ref()
        .is_some_and(|d| d.fencing_token_issued.is_some() && !d.replayed);
    if issued && effects.record.is_some() {
        txn.next("fence");
    }
    if let Some(r) = effects.record {
        // A refresh consumed the observation: the next one must be fresh.
        if observed.is_some() && r.readiness == observed.clone().unwrap_or_default() {
            txn.put_observed_readiness(&r.id, None);
        }
        txn.put_record(r);
    }
    if let Some(res) = effects.reservation {
        txn.put_reservation(res);
    }
    if let Some(id) = effects.consume_approval
        && let Some(mut a) = txn.approval(&id)
    {
        a.status = "consumed".to_string();
        txn.put_approval(a);
    }
    if let Some(id) = effects.consume_submission
        && let Some(mut s) = txn.submission(&id)
    {
        s.status = "consumed".to_string();
        txn.put_submission(s);
    }
    if let Some(audit) = effects.audit {
        txn.append_audit(audit);
    }
    if let Some(entry) = effects.idempotency {
        txn.put_idempotency(entry);
    }
    evaluation.result
}
