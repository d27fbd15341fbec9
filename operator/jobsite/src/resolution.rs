//! The way out of `blocked` that continues the build: a person approves an
//! `impact-amendment` resolution of the blocked item; the Drafting Table role submits it and
//! the Materializer's `resolve-block` consumes it, which moves the item to
//! `ready-for-building` under a new contract version. Generic over the work store, so the
//! single-machine CLI (`protobot retry`) and tests resolve blocks the same way; every step is
//! a lifecycle operation evaluated by the rules, keyed for idempotency by the item's version.

use jiff::{SignedDuration, Timestamp};
use protobot_lifecycle::{
    ApprovalRecord, AuthorizationContext, Grant, OperationEnvelope, ResultEnvelope, Role, State,
    WorkItemRecord,
};
use protobot_stores::{ChangeSetRecord, Import, StoreError, WorkStore};

/// The resolution kind a retry records: the approved change set stands, the project around
/// it was amended.
pub const RETRY_KIND: &str = "impact-amendment";

/// How long the contexts of one resolution are valid.
pub const CONTEXT_TTL: SignedDuration = SignedDuration::from_hours(1);

/// Why a block was not resolved.
#[derive(Debug, thiserror::Error)]
pub enum ResolutionError {
    /// Only a blocked item is resolved.
    #[error("work item {id} is {state}, not blocked: `protobot run` continues it")]
    NotBlocked {
        /// The item.
        id: String,
        /// Its state.
        state: State,
    },
    /// The store failed a step (nothing after it was done; running the retry again resumes).
    #[error("failed to {step}")]
    Store {
        /// The step.
        step: String,
        /// Why.
        #[source]
        source: StoreError,
    },
    /// The rules refused a step.
    #[error("{what} was rejected: {code} ({message})")]
    Rejected {
        /// The step.
        what: &'static str,
        /// The rules' code.
        code: String,
        /// Their message.
        message: String,
    },
}

fn rejection(what: &'static str, result: &ResultEnvelope) -> ResolutionError {
    let (code, message) = result
        .error
        .as_ref()
        .map(|e| (e.code.as_str().to_owned(), e.message.clone()))
        .unwrap_or_else(|| ("unknown".into(), String::new()));
    ResolutionError::Rejected {
        what,
        code,
        message,
    }
}

/// Moves a blocked item to `ready-for-building` through a human-approved
/// `impact-amendment` resolution; returns the new contract version.
pub async fn resolve_block<S: WorkStore>(
    store: &S,
    project: &str,
    record: &WorkItemRecord,
    change_set: &str,
    human: &str,
    policy_version: &str,
    now: Timestamp,
) -> Result<u64, ResolutionError> {
    if record.state != State::Blocked {
        return Err(ResolutionError::NotBlocked {
            id: record.id.clone(),
            state: record.state,
        });
    }
    let version = record.contract_version;
    let id = &record.id;
    // The change set the resolution names, as registered by `protobot run`.
    store
        .import(Import::ChangeSet(ChangeSetRecord {
            id: change_set.to_owned(),
            revision: "merged".into(),
            priority: record.priority.clone(),
            build_work_item_id: id.clone(),
        }))
        .await
        .map_err(|source| ResolutionError::Store {
            step: format!("register change set {change_set}"),
            source,
        })?;
    let approval_id = format!("retry-{id}-v{version}");
    let digest = format!("retry:{id}:{version}:{human}");
    store
        .import(Import::Approval(ApprovalRecord {
            id: approval_id.clone(),
            approved_subject: human.to_owned(),
            delegated_principal: "materializer".into(),
            project_id: Some(project.to_owned()),
            work_item_id: Some(id.clone()),
            resolution_kind: Some(RETRY_KIND.into()),
            expected_state: Some(State::Blocked.as_str().into()),
            expected_contract_version: Some(version),
            change_set_id: Some(change_set.to_owned()),
            resolution_digest: digest.clone(),
            action: "resolve-block".into(),
            expires_at: Some(now + CONTEXT_TTL),
            status: "unused".into(),
            ..ApprovalRecord::default()
        }))
        .await
        .map_err(|source| ResolutionError::Store {
            step: "record your approval".into(),
            source,
        })?;
    let submit = OperationEnvelope {
        operation: "blocked-work.submit-resolution".into(),
        actor_context_ref: "protobot-retry".into(),
        work_item_id: id.clone(),
        expected_state: Some(State::Blocked.as_str().into()),
        expected_contract_version: Some(version),
        idempotency_key: format!("retry-submit-{id}-v{version}"),
        human_approval_id: approval_id.clone(),
        payload: Some(serde_json::json!({
            "resolution_kind": RETRY_KIND,
            "change_set_id": change_set,
            "approval_resolution_digest": digest,
            "human_approval_id": approval_id,
        })),
        ..OperationEnvelope::default()
    };
    let drafting = AuthorizationContext::new(Grant {
        project,
        role: Role::DraftingTable,
        subject: "drafting-table-local",
        actions: &["blocked-work.submit-resolution"],
        expires_at: now + CONTEXT_TTL,
        policy_version,
    });
    let submitted = store
        .execute(Some(&drafting), &submit, now)
        .await
        .map_err(|source| ResolutionError::Store {
            step: "submit the resolution".into(),
            source,
        })?;
    if !submitted.ok {
        return Err(rejection("the resolution submission", &submitted));
    }
    let submission = submitted
        .fields
        .get("resolution_submission_id")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned();
    let resolve = OperationEnvelope {
        operation: "resolve-block".into(),
        actor_context_ref: "protobot-retry".into(),
        work_item_id: id.clone(),
        expected_state: Some(State::Blocked.as_str().into()),
        expected_contract_version: Some(version),
        idempotency_key: format!("retry-resolve-{id}-v{version}"),
        human_approval_id: approval_id,
        payload: Some(serde_json::json!({
            "resolution_kind": RETRY_KIND,
            "resolution_submission_id": submission,
            "approval_resolution_digest": digest,
        })),
        ..OperationEnvelope::default()
    };
    let materializer = AuthorizationContext::new(Grant {
        project,
        role: Role::Materializer,
        subject: "materializer",
        actions: &["resolve-block"],
        expires_at: now + CONTEXT_TTL,
        policy_version,
    });
    let resolved = store
        .execute(Some(&materializer), &resolve, now)
        .await
        .map_err(|source| ResolutionError::Store {
            step: "resolve the block".into(),
            source,
        })?;
    if !resolved.ok {
        return Err(rejection("resolve-block", &resolved));
    }
    Ok(resolved
        .decision
        .as_ref()
        .and_then(|d| d.after)
        .map_or(version + 1, |a| a.contract_version))
}
