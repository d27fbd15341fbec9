//! The transactional view every WorkStore backend offers the adapter, and the
//! WMS-owned records besides work items (requests, change sets, findings).
//!
//! The adapter (`crate::adapter`) reads through this view, asks the pure
//! evaluator for a decision, and writes the effects back through it. A backend
//! commits everything one call wrote as one atomic unit (a mutex for memory, a
//! database transaction for SQLite, one conditional object write for
//! Kubernetes) or nothing at all.

use protobot_lifecycle::{
    ApprovalRecord, AuditEvent, IdempotencyEntry, Readiness, Reservation, Submission,
    WorkItemRecord,
};
use serde::{Deserialize, Serialize};

/// A Drafting Table request (§14).
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RequestRecord {
    /// `request-NNN`.
    pub request_id: String,
    /// What is asked for.
    pub intent: String,
    /// Why.
    pub rationale: String,
    /// Creating subject.
    pub created_by: String,
    /// Owner.
    pub owner: String,
    /// Trimmed, de-duplicated, sorted.
    pub affected_interfaces: Vec<String>,
    /// Trimmed, de-duplicated, sorted.
    pub affected_scopes: Vec<String>,
    /// `undefined`, `changes`, `contradicts` (empty until refined).
    pub classification: String,
    /// `unrefined`, `refining`, `ready-for-dimensioning`, `closed`.
    pub refinement_state: String,
    /// `low`, `normal`, `high`, `urgent`.
    pub business_priority: String,
    /// Typed relationships to other requests.
    pub relationships: Vec<Relationship>,
    /// Linked change set.
    pub change_set_id: String,
    /// Linked build work item.
    pub build_work_item_id: String,
    /// Starts at 1; +1 per request mutation.
    pub request_revision: u64,
}

/// A relationship between two requests.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Relationship {
    /// `depends-on`, `conflicts-with`, `supersedes`, `related-to`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Another existing request.
    pub target: String,
}

/// A change set as the WMS knows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChangeSetRecord {
    /// `CS-NNNNN`.
    pub id: String,
    /// `proposed`, `approved`, `merged`, …
    pub revision: String,
    /// Priority inherited from its request.
    pub priority: String,
    /// The build work item materialized from it, if any.
    pub build_work_item_id: String,
}

/// One finding in the ledger.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FindingRecord {
    /// Global ledger sequence (assigned on create).
    pub sequence: u64,
    /// The producer's idempotency key: create-or-return identity.
    pub producer_key: String,
    /// Producer (Inspector id, mutation runner, …).
    pub producer: String,
    /// Inspection run.
    pub inspection_run_id: String,
    /// Work item.
    pub work_item_id: String,
    /// `open`, `accepted`, `rejected`, `fixed`, `waived` (terminal: all but open).
    pub state: String,
    /// Opaque finding body (schema owned by the Job Site).
    pub body: serde_json::Value,
}

/// Reads and writes of one atomic adapter call.
pub trait WmsTxn {
    /// The project this store serves.
    fn project_id(&self) -> &str;
    /// A work item by id.
    fn record(&self, id: &str) -> Option<WorkItemRecord>;
    /// Every work item of the project.
    fn records(&self) -> Vec<WorkItemRecord>;
    /// The entry under an idempotency key.
    fn idempotency(&self, key: &str) -> Option<IdempotencyEntry>;
    /// The reservation under a materialization key.
    fn reservation(&self, key: &str) -> Option<Reservation>;
    /// WMS-observed readiness of an item, if observed since its last refresh.
    fn observed_readiness(&self, id: &str) -> Option<Readiness>;
    /// An approval.
    fn approval(&self, id: &str) -> Option<ApprovalRecord>;
    /// A submission or acknowledgement.
    fn submission(&self, id: &str) -> Option<Submission>;
    /// Every submission (for per-item revision counters).
    fn submissions(&self) -> Vec<Submission>;
    /// A change set.
    fn change_set(&self, id: &str) -> Option<ChangeSetRecord>;
    /// A request.
    fn request(&self, id: &str) -> Option<RequestRecord>;
    /// Every request.
    fn requests(&self) -> Vec<RequestRecord>;
    /// A finding by producer key.
    fn finding(&self, producer_key: &str) -> Option<FindingRecord>;
    /// Increments and returns a named counter (`fence`, `request`, `submission`, …).
    /// Counters never go backwards, so minted ids stay unique across restarts.
    fn next(&mut self, counter: &str) -> u64;
    /// Peeks the next value of a counter without consuming it.
    fn peek(&self, counter: &str) -> u64;

    /// Writes a work item.
    fn put_record(&mut self, record: WorkItemRecord);
    /// Freezes a result under a key.
    fn put_idempotency(&mut self, entry: IdempotencyEntry);
    /// Stores a reservation.
    fn put_reservation(&mut self, reservation: Reservation);
    /// Stores (or clears) observed readiness.
    fn put_observed_readiness(&mut self, id: &str, readiness: Option<Readiness>);
    /// Writes an approval.
    fn put_approval(&mut self, approval: ApprovalRecord);
    /// Writes a submission.
    fn put_submission(&mut self, submission: Submission);
    /// Writes a change set.
    fn put_change_set(&mut self, change_set: ChangeSetRecord);
    /// Writes a request.
    fn put_request(&mut self, request: RequestRecord);
    /// Writes a finding.
    fn put_finding(&mut self, finding: FindingRecord);
    /// Appends an audit event.
    fn append_audit(&mut self, event: AuditEvent);
}
