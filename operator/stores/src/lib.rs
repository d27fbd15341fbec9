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

/// Why a store call failed (as opposed to a rejected command, which is an
/// ordinary [`ResultEnvelope`]).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend could not be reached or failed mid-call; nothing was written.
    #[error("work store unavailable: {0}")]
    Unavailable(String),
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
