//! What a human maintainer does to one work item through the adapter,
//! shared by `protobot abandon` (single machine) and the operator (a
//! BugReport's abandon annotation): the trusted Git evidence is recorded as a
//! WMS observation, then the lifecycle command runs under the maintainer's
//! context, so the rules (states, evidence, audit) decide exactly as for any
//! other caller.

use jiff::Timestamp;
use protobot_lifecycle::{
    AuthorizationContext, Command, CommandRequest, LifecyclePayload, OperationEnvelope,
    Reconciliation, ResultEnvelope, WorkItemRecord,
};

use crate::{Observation, StoreError, WorkStore};

/// Why an abandon did not happen.
#[derive(Debug, thiserror::Error)]
pub enum AbandonError {
    /// Git shows the item's merge on the default branch: it is integrated and
    /// cannot be abandoned.
    #[error(
        "work item {work_item} is already merged on the default branch ({merge}); record the merge instead of abandoning it"
    )]
    Integrated {
        /// The item.
        work_item: String,
        /// The merge commit that landed it.
        merge: String,
    },
    /// The store failed; nothing is known to be written. When the failure is
    /// transient ([`StoreError::is_transient`]) retry: the command's idempotency key
    /// makes a retry safe.
    #[error("failed to abandon {work_item}: {source}")]
    Store {
        /// The item.
        work_item: String,
        /// Cause.
        #[source]
        source: StoreError,
    },
    /// The rules refused the command (for example `merging` can never be
    /// abandoned).
    #[error("abandon of {work_item} was rejected: {code} ({message})")]
    Rejected {
        /// The item.
        work_item: String,
        /// The stable rejection code.
        code: String,
        /// The rules' message.
        message: String,
    },
}

/// The `abandon` envelope for `record` as it is now (its idempotency key is
/// bound to the version, so a retry replays instead of abandoning twice).
pub fn abandon_envelope(record: &WorkItemRecord, actor_context_ref: &str) -> OperationEnvelope {
    OperationEnvelope::command(CommandRequest {
        command: Command::Abandon,
        actor_context_ref,
        work_item_id: &record.id,
        expected_state: record.state,
        expected_contract_version: record.contract_version,
        idempotency_key: format!("abandon-{}-v{}", record.id, record.contract_version),
    })
    .with_payload(&LifecyclePayload::cancellation_confirmed())
}

/// Abandons `record` as `ctx` (a human maintainer's context granting
/// `abandon`). `integrated` is what Git says: the merge that landed the item
/// on the default branch, if any. Returns the contract version after.
pub async fn abandon<S: WorkStore>(
    store: &S,
    ctx: &AuthorizationContext,
    record: &WorkItemRecord,
    actor_context_ref: &str,
    integrated: Option<String>,
    now: Timestamp,
) -> Result<u64, AbandonError> {
    if let Some(merge) = integrated {
        return Err(AbandonError::Integrated {
            work_item: record.id.clone(),
            merge,
        });
    }
    let store_error = |source| AbandonError::Store {
        work_item: record.id.clone(),
        source,
    };
    if !record.state.is_terminal() {
        store
            .observe(
                &record.id,
                Observation::Reconciliation(Reconciliation {
                    status: "not-integrated".into(),
                    git_mutation: "none".into(),
                    merge_envelope: None,
                }),
            )
            .await
            .map_err(store_error)?;
    }
    let env = abandon_envelope(record, actor_context_ref);
    let result = store
        .execute(Some(ctx), &env, now)
        .await
        .map_err(store_error)?;
    if !result.ok {
        return Err(rejected(&record.id, &result));
    }
    Ok(result
        .decision
        .as_ref()
        .and_then(|d| d.after)
        .map_or(record.contract_version + 1, |a| a.contract_version))
}

fn rejected(work_item: &str, result: &ResultEnvelope) -> AbandonError {
    let (code, message) = result
        .error
        .as_ref()
        .map(|e| (e.code.as_str().to_owned(), e.message.clone()))
        .unwrap_or_else(|| ("unknown".into(), String::new()));
    AbandonError::Rejected {
        work_item: work_item.to_string(),
        code,
        message,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use protobot_lifecycle::{Role, State};

    use super::*;
    use crate::{
        Import, MemoryStore,
        conformance::{self, Harness, item, leased},
    };

    fn harness() -> Harness<MemoryStore> {
        Harness {
            store: std::sync::Arc::new(MemoryStore::new(
                conformance::PROJECT,
                conformance::config(),
            )),
            now: conformance::eval_time(),
        }
    }

    #[tokio::test]
    async fn a_building_item_is_abandoned_once_and_a_retry_replays() {
        let h = harness();
        let record = leased(
            item("wi-1", State::Building, 4),
            "job-site-a",
            "fence-1",
            600,
        );
        h.store
            .import(Import::Record(record.clone()))
            .await
            .unwrap();
        let ctx = h.ctx(Role::HumanMaintainer);
        let after = abandon(&*h.store, &ctx, &record, "test", None, h.now)
            .await
            .unwrap();
        assert_eq!(after, 5);
        let stored = h.store.get("wi-1").await.unwrap().unwrap();
        assert_eq!(stored.state, State::Abandoned);
        assert_eq!(h.audits().await, 1);
        // The same call again (the record as first read) replays: no second event.
        assert_eq!(
            abandon(&*h.store, &ctx, &record, "test", None, h.now)
                .await
                .unwrap(),
            5
        );
        assert_eq!(h.audits().await, 1);
    }

    #[tokio::test]
    async fn an_integrated_or_merging_item_is_refused_and_nothing_changes() {
        let h = harness();
        let ready = item("wi-2", State::ReadyForBuilding, 3);
        h.store.import(Import::Record(ready.clone())).await.unwrap();
        let ctx = h.ctx(Role::HumanMaintainer);
        let e = abandon(&*h.store, &ctx, &ready, "test", Some("abc".into()), h.now)
            .await
            .unwrap_err();
        assert!(matches!(e, AbandonError::Integrated { .. }), "{e}");
        assert_eq!(
            h.store.get("wi-2").await.unwrap().unwrap().state,
            State::ReadyForBuilding
        );
        let merging = leased(
            item("wi-3", State::Merging, 8),
            "job-site-a",
            "fence-3",
            600,
        );
        h.store
            .import(Import::Record(merging.clone()))
            .await
            .unwrap();
        let e = abandon(&*h.store, &ctx, &merging, "test", None, h.now)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, AbandonError::Rejected { code, .. } if code == "INVALID_TRANSITION"),
            "{e}"
        );
        assert_eq!(
            h.store.get("wi-3").await.unwrap().unwrap().state,
            State::Merging
        );
        assert_eq!(h.audits().await, 0);
    }
}
