//! The `WorkStore` port — the WMS adapter API surface the Job Site needs — its
//! backend-independent adapter logic, the in-memory backend, the SQLite backend
//! (feature `sqlite`, [`sqlite::SqliteStore`]) and the conformance suite every
//! backend must pass.
//!
//! A backend supplies storage and atomicity ([`txn::WmsTxn`] plus a commit);
//! the rules come from `protobot-lifecycle`, so every backend decides exactly
//! alike.

// Rejections are ordinary answers of the adapter, as large as successes; boxing
// them would only add allocations on a path that is as hot as the happy one.
#![allow(clippy::result_large_err)]

use std::future::Future;

use jiff::Timestamp;
use protobot_lifecycle::{
    ApprovalRecord, AuditEvent, AuthorizationContext, OperationEnvelope, Readiness, Reconciliation,
    ResultEnvelope, State, Submission, WorkItemRecord,
};

pub mod adapter;
mod blocked_work;
pub mod conformance;
#[cfg(feature = "golden")]
pub mod golden;
mod import;
#[cfg(feature = "kubernetes")]
pub mod kubernetes;
mod ledger;
pub mod maintainer;
pub mod memory;
mod namespace;
mod observe;
mod queries;
mod requests;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "golden")]
pub mod tour;
pub mod trace;
pub mod txn;

pub use adapter::AdapterConfig;
#[cfg(feature = "kubernetes")]
pub use kubernetes::KubeStore;
pub use memory::MemoryStore;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
pub use trace::{Mode, Traced, TracedStore};
pub use txn::{ChangeSetRecord, FindingRecord, RequestRecord};

/// The cause a [`StoreError`] carries: the backend's own error (a `kube::Error`, a
/// `rusqlite::Error`, a `serde_json::Error`, a task's `JoinError`…), for callers that
/// want to look closer ([`std::error::Error::source`], then `downcast_ref`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store call failed (as opposed to a rejected command, which is an
/// ordinary [`ResultEnvelope`]).
///
/// [`StoreError::is_transient`] sorts them for callers that retry: a failed backend
/// call and contention pass by themselves (the call did not commit, so the same call
/// with the same idempotency key may be sent again); a record the store cannot decode
/// and an object it did not write stay until a person acts; the others answer the call.
///
/// Every message includes the messages of its cause, so a caller that shows only the
/// message still says why; the cause itself is the error's `source`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A call to the backend (the API server, the SQLite database, the blocking pool)
    /// failed; the call did not commit (a write whose answer was lost may have: the
    /// same idempotency key then replays it). Transient.
    #[error(
        "work store unavailable: failed to {action}: {}; retry with the same idempotency key",
        chain(.source.as_ref())
    )]
    Backend {
        /// What the store was doing ("list build work items", "begin the execute
        /// transaction"…).
        action: String,
        /// The backend's error.
        #[source]
        source: BoxError,
    },
    /// Every attempt of the call lost a write conflict to another writer; the call did
    /// not commit. Transient.
    #[error(
        "work store unavailable: gave up after {attempts} write conflicts; the project is under heavy contention, retry with the same idempotency key"
    )]
    Contention {
        /// How many attempts conflicted.
        attempts: usize,
    },
    /// A stored record the store cannot decode: damaged, or written by something else.
    /// Retrying does not help; a person must repair, restore or remove it.
    #[error(
        "the work store cannot decode {record}: {}; it was damaged or written by something other than the work store: a person must fix it, restore it from a backup or delete it",
        chain(.source.as_ref())
    )]
    Undecodable {
        /// Which record, naming its object ("the ledger of BuildWorkItem wi-1", "the
        /// stored work item \"wi-1\"").
        record: String,
        /// Why it does not decode.
        #[source]
        source: BoxError,
    },
    /// An object in the store's place that the store did not write for this project: an
    /// object of the store's name that holds another id or shard, or a database of
    /// another project or of a newer build. Retrying does not help; a person must act
    /// as `remedy` says.
    #[error("{object} {conflict}; {remedy}")]
    Foreign {
        /// The object ("BuildWorkItem wi-1", "the work store database /var/lib/…").
        object: String,
        /// What it holds instead ("holds work item \"x\", not \"wi-1\"").
        conflict: String,
        /// Who wrote it instead, and what a person does about it ("… created by
        /// something other than the work store: rename or delete it").
        remedy: &'static str,
    },
    /// A previous panic poisoned the in-memory state.
    #[error("work store state is poisoned by an earlier panic; restart the process")]
    Poisoned,
    /// The observed object does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The observation is not valid for the object's current state.
    #[error("observation rejected: {0}")]
    ObservationRejected(String),
}

impl StoreError {
    /// A failed backend call: `action` says what was attempted ("list build work
    /// items"), `source` why it failed.
    pub fn backend(action: impl Into<String>, source: impl Into<BoxError>) -> StoreError {
        StoreError::Backend {
            action: action.into(),
            source: source.into(),
        }
    }

    /// A stored record that does not decode: `record` names it and its object.
    pub fn undecodable(record: impl Into<String>, source: impl Into<BoxError>) -> StoreError {
        StoreError::Undecodable {
            record: record.into(),
            source: source.into(),
        }
    }

    /// Whether the same call may succeed if simply sent again later (with the same
    /// idempotency key): true for [`StoreError::Backend`] and
    /// [`StoreError::Contention`], where the call did not commit. False when a person must
    /// act first ([`StoreError::Undecodable`], [`StoreError::Foreign`], a
    /// [`StoreError::Poisoned`] process to restart) and for the answers about the call
    /// itself ([`StoreError::NotFound`], [`StoreError::ObservationRejected`]).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Backend { .. } | StoreError::Contention { .. } => true,
            StoreError::Undecodable { .. }
            | StoreError::Foreign { .. }
            | StoreError::Poisoned
            | StoreError::NotFound(_)
            | StoreError::ObservationRejected(_) => false,
        }
    }
}

/// `err` followed by its source chain, `: `-separated (the cause in a
/// [`StoreError`]'s message).
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(source) = next {
        out.push_str(": ");
        out.push_str(&source.to_string());
        next = source.source();
    }
    out
}

/// A trusted WMS observation (never part of an operation envelope).
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    /// Fresh readiness for the next refresh command.
    Readiness(Readiness),
    /// Inspection evidence (only while `inspecting`).
    Inspection {
        /// The run sealed.
        inspection_run_sealed: bool,
        /// Every finding is terminal.
        findings_terminal: bool,
        /// Final tests passed.
        final_tests_passed: bool,
    },
    /// Git/WMS reconciliation evidence.
    Reconciliation(Reconciliation),
    /// An independent Inspector confirmed the active out-of-scope submission.
    InspectorConfirmation {
        /// The submission.
        submission_id: String,
    },
    /// A finished build attempt, fenced: accepted only from the holder of the live
    /// lease (`fencing_token`) while the item is `building` or `inspecting`. Same-cycle
    /// attempts replace each other, so a retried observation is idempotent.
    Attempt {
        /// The fence of the claim that ran the attempt.
        fencing_token: protobot_lifecycle::FencingToken,
        /// The attempt.
        attempt: protobot_lifecycle::AttemptRecord,
    },
    /// What one sandboxed run spent on model calls, as the Job Site read it back from the
    /// egress proxy, fenced like [`Observation::Attempt`]. Idempotent by run id: a run read
    /// again keeps the larger reading, never the sum ([`protobot_usage::UsageLedger`]).
    Usage {
        /// The fence of the claim that ran the run.
        fencing_token: protobot_lifecycle::FencingToken,
        /// The run's reading.
        run: protobot_usage::RunSpend,
    },
}

/// A trusted import (see `import.rs`).
#[allow(clippy::large_enum_variant)] // imports are rare; size does not matter
#[derive(Clone, Debug, PartialEq)]
pub enum Import {
    /// A work item restored or migrated as is.
    Record(WorkItemRecord),
    /// A Gate approval.
    Approval(ApprovalRecord),
    /// A registered change set.
    ChangeSet(ChangeSetRecord),
    /// A submission restored as is.
    Submission(Submission),
}

/// Which work items to list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ItemFilter {
    /// Only these states (empty: all).
    pub states: Vec<State>,
}

impl ItemFilter {
    /// Items in one state.
    pub fn state(state: State) -> ItemFilter {
        ItemFilter {
            states: vec![state],
        }
    }

    /// Whether `record` passes.
    pub fn matches(&self, record: &WorkItemRecord) -> bool {
        self.states.is_empty() || self.states.contains(&record.state)
    }
}

/// The WMS port of the Job Site. Every mutation goes through [`WorkStore::execute`]
/// and is evaluated by validation-rules/v1 inside the backend's atomic unit.
pub trait WorkStore: Send + Sync {
    /// The project this store serves.
    fn project_id(&self) -> String;

    /// Executes one adapter operation for a trusted context (`None`: the actor
    /// reference did not resolve) at trusted time `now`.
    fn execute(
        &self,
        ctx: Option<&AuthorizationContext>,
        env: &OperationEnvelope,
        now: Timestamp,
    ) -> impl Future<Output = Result<ResultEnvelope, StoreError>> + Send;

    /// One work item.
    fn get(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<WorkItemRecord>, StoreError>> + Send;

    /// Work items passing `filter`, sorted by id.
    fn list(
        &self,
        filter: &ItemFilter,
    ) -> impl Future<Output = Result<Vec<WorkItemRecord>, StoreError>> + Send;

    /// Records a trusted observation.
    fn observe(
        &self,
        id: &str,
        observation: Observation,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Imports a trusted record.
    fn import(&self, import: Import) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Findings of one inspection run, by ledger sequence.
    fn findings(
        &self,
        inspection_run_id: &str,
    ) -> impl Future<Output = Result<Vec<FindingRecord>, StoreError>> + Send;

    /// The audit log: every event once, in order within each work item. The
    /// Kubernetes store reads events item by item and keeps an event without
    /// a work item (request operations) with its idempotency key, so across
    /// items, and among events without an item, its order is by name rather
    /// than by time; the memory and SQLite stores keep one timeline.
    fn audit_events(&self) -> impl Future<Output = Result<Vec<AuditEvent>, StoreError>> + Send;

    /// One approval.
    fn approval(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<ApprovalRecord>, StoreError>> + Send;

    /// One submission.
    fn submission(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<Submission>, StoreError>> + Send;

    /// One request.
    fn request(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<RequestRecord>, StoreError>> + Send;
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    fn io(message: &str) -> std::io::Error {
        std::io::Error::other(message.to_string())
    }

    fn every_variant() -> Vec<StoreError> {
        vec![
            StoreError::backend("list build work items", io("connection refused")),
            StoreError::Contention { attempts: 64 },
            StoreError::undecodable("the ledger of BuildWorkItem wi-1", io("expected value")),
            StoreError::Foreign {
                object: "BuildWorkItem wi-1".into(),
                conflict: "holds work item \"x\", not \"wi-1\"".into(),
                remedy: "an object of that name was created by something other than the work store: rename or delete it",
            },
            StoreError::Poisoned,
            StoreError::NotFound("work item wi-1".into()),
            StoreError::ObservationRejected("not inspecting".into()),
        ]
    }

    #[test]
    fn only_backend_failures_and_contention_are_transient() {
        let transient: Vec<bool> = every_variant()
            .iter()
            .map(StoreError::is_transient)
            .collect();
        assert_eq!(
            transient,
            [true, true, false, false, false, false, false],
            "backend, contention | undecodable, foreign, poisoned, not found, rejected"
        );
    }

    #[test]
    fn every_message_says_what_to_do() {
        let advice = [
            "retry with the same idempotency key",
            "retry with the same idempotency key",
            "a person must fix it, restore it from a backup or delete it",
            "rename or delete it",
            "restart the process",
            "not found: work item wi-1",
            "observation rejected: not inspecting",
        ];
        for (err, advice) in every_variant().iter().zip(advice) {
            let message = err.to_string();
            assert!(message.contains(advice), "{message}");
        }
    }

    #[test]
    fn the_cause_is_in_the_message_and_is_the_source() {
        // A two-level cause: the message carries the whole chain, the source is typed.
        let inner = io("disk I/O error");
        let outer = std::io::Error::other(Wrapped(inner));
        let err = StoreError::backend("begin the execute transaction", outer);
        assert_eq!(
            err.to_string(),
            "work store unavailable: failed to begin the execute transaction: wrapped: disk I/O error; retry with the same idempotency key"
        );
        let source = err.source().expect("a backend failure has a source");
        assert!(source.downcast_ref::<std::io::Error>().is_some());

        let decode = serde_json::from_str::<serde_json::Value>("{truncated").unwrap_err();
        let err = StoreError::undecodable("the ledger of BuildWorkItem wi-1", decode);
        assert!(
            err.to_string()
                .starts_with("the work store cannot decode the ledger of BuildWorkItem wi-1: key must be a string"),
            "{err}"
        );
        assert!(
            err.source()
                .and_then(|s| s.downcast_ref::<serde_json::Error>())
                .is_some()
        );
        assert!(StoreError::Contention { attempts: 1 }.source().is_none());
    }

    #[derive(Debug, thiserror::Error)]
    #[error("wrapped")]
    struct Wrapped(#[source] std::io::Error);
}
