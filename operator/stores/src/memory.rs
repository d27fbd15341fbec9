//! The in-memory WorkStore: the whole project state behind one mutex. Each call
//! runs against a copy and the copy replaces the state only when the call
//! finishes, so a call is all-or-nothing. For tests and embedding; not durable.

use std::{collections::BTreeMap, sync::Mutex};

use jiff::Timestamp;
use protobot_lifecycle::{
    ApprovalRecord, AuditEvent, AuthorizationContext, IdempotencyEntry, OperationEnvelope,
    Readiness, Reservation, ResultEnvelope, Submission, WorkItemRecord,
};
use serde::{Deserialize, Serialize};

use crate::{
    Import, ItemFilter, Observation, StoreError, WorkStore,
    adapter::{self, AdapterConfig},
    observe,
    txn::{ChangeSetRecord, FindingRecord, RequestRecord, WmsTxn},
};

/// Everything a project's WMS holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WmsState {
    /// The project.
    pub project_id: String,
    /// Work items by id.
    pub records: BTreeMap<String, WorkItemRecord>,
    /// Idempotency entries by key.
    pub idempotency: BTreeMap<String, IdempotencyEntry>,
    /// Reservations by materialization key.
    pub reservations: BTreeMap<String, Reservation>,
    /// Observed readiness by item.
    pub observed_readiness: BTreeMap<String, Readiness>,
    /// Approvals by id.
    pub approvals: BTreeMap<String, ApprovalRecord>,
    /// Submissions by id.
    pub submissions: BTreeMap<String, Submission>,
    /// Change sets by id.
    pub change_sets: BTreeMap<String, ChangeSetRecord>,
    /// Requests by id.
    pub requests: BTreeMap<String, RequestRecord>,
    /// Findings by producer key.
    pub findings: BTreeMap<String, FindingRecord>,
    /// Named monotonic counters.
    pub counters: BTreeMap<String, u64>,
    /// The audit log.
    pub audit: Vec<AuditEvent>,
}

impl WmsState {
    /// An empty state for a project.
    pub fn new(project_id: &str) -> WmsState {
        WmsState {
            project_id: project_id.to_string(),
            ..WmsState::default()
        }
    }
}

impl WmsTxn for WmsState {
    fn project_id(&self) -> &str {
        &self.project_id
    }
    fn record(&self, id: &str) -> Option<WorkItemRecord> {
        self.records.get(id).cloned()
    }
    fn records(&self) -> Vec<WorkItemRecord> {
        self.records.values().cloned().collect()
    }
    fn idempotency(&self, key: &str) -> Option<IdempotencyEntry> {
        self.idempotency.get(key).cloned()
    }
    fn reservation(&self, key: &str) -> Option<Reservation> {
        self.reservations.get(key).cloned()
    }
    fn observed_readiness(&self, id: &str) -> Option<Readiness> {
        self.observed_readiness.get(id).cloned()
    }
    fn approval(&self, id: &str) -> Option<ApprovalRecord> {
        self.approvals.get(id).cloned()
    }
    fn submission(&self, id: &str) -> Option<Submission> {
        self.submissions.get(id).cloned()
    }
    fn submissions(&self) -> Vec<Submission> {
        self.submissions.values().cloned().collect()
    }
    fn change_set(&self, id: &str) -> Option<ChangeSetRecord> {
        self.change_sets.get(id).cloned()
    }
    fn request(&self, id: &str) -> Option<RequestRecord> {
        self.requests.get(id).cloned()
    }
    fn requests(&self) -> Vec<RequestRecord> {
        self.requests.values().cloned().collect()
    }
    fn finding(&self, producer_key: &str) -> Option<FindingRecord> {
        self.findings.get(producer_key).cloned()
    }
    fn next(&mut self, counter: &str) -> u64 {
        let c = self.counters.entry(counter.to_string()).or_insert(0);
        *c += 1;
        *c
    }
    fn peek(&self, counter: &str) -> u64 {
        self.counters.get(counter).copied().unwrap_or(0) + 1
    }
    fn put_record(&mut self, record: WorkItemRecord) {
        self.records.insert(record.id.clone(), record);
    }
    fn put_idempotency(&mut self, entry: IdempotencyEntry) {
        self.idempotency.insert(entry.key.clone(), entry);
    }
    fn put_reservation(&mut self, reservation: Reservation) {
        self.reservations
            .insert(reservation.materialization_key.clone(), reservation);
    }
    fn put_observed_readiness(&mut self, id: &str, readiness: Option<Readiness>) {
        match readiness {
            Some(r) => self.observed_readiness.insert(id.to_string(), r),
            None => self.observed_readiness.remove(id),
        };
    }
    fn put_approval(&mut self, approval: ApprovalRecord) {
        self.approvals.insert(approval.id.clone(), approval);
    }
    fn put_submission(&mut self, submission: Submission) {
        self.submissions.insert(submission.id.clone(), submission);
    }
    fn put_change_set(&mut self, change_set: ChangeSetRecord) {
        self.change_sets.insert(change_set.id.clone(), change_set);
    }
    fn put_request(&mut self, request: RequestRecord) {
        self.requests.insert(request.request_id.clone(), request);
    }
    fn put_finding(&mut self, finding: FindingRecord) {
        self.findings.insert(finding.producer_key.clone(), finding);
    }
    fn append_audit(&mut self, event: AuditEvent) {
        self.audit.push(event);
    }
}

/// The in-memory backend.
#[derive(Debug)]
pub struct MemoryStore {
    cfg: AdapterConfig,
    state: Mutex<WmsState>,
}

impl MemoryStore {
    /// An empty store for one project.
    pub fn new(project_id: &str, cfg: AdapterConfig) -> MemoryStore {
        MemoryStore {
            cfg,
            state: Mutex::new(WmsState::new(project_id)),
        }
    }

    /// Runs `f` on a copy of the state and commits the copy when `f` returns `Ok`.
    fn transact<T>(
        &self,
        f: impl FnOnce(&mut WmsState) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut guard = self.state.lock().map_err(|_| StoreError::Poisoned)?;
        let mut copy = guard.clone();
        let out = f(&mut copy)?;
        *guard = copy;
        Ok(out)
    }

    fn read<T>(&self, f: impl FnOnce(&WmsState) -> T) -> Result<T, StoreError> {
        let guard = self.state.lock().map_err(|_| StoreError::Poisoned)?;
        Ok(f(&guard))
    }

    /// A snapshot of the whole state (tests, debugging).
    pub fn snapshot(&self) -> Result<WmsState, StoreError> {
        self.read(Clone::clone)
    }
}

impl crate::trace::TracedStore for MemoryStore {
    async fn execute_traced(
        &self,
        ctx: Option<&AuthorizationContext>,
        env: &OperationEnvelope,
        now: Timestamp,
        mode: crate::trace::Mode,
    ) -> Result<crate::trace::Traced, StoreError> {
        // A dry run's tap keeps every write in its overlay, so committing the
        // copy commits nothing.
        self.transact(|state| Ok(crate::trace::handle(state, &self.cfg, ctx, env, now, mode)))
    }
}

impl WorkStore for MemoryStore {
    fn project_id(&self) -> String {
        self.read(|s| s.project_id.clone()).unwrap_or_default()
    }

    async fn execute(
        &self,
        ctx: Option<&AuthorizationContext>,
        env: &OperationEnvelope,
        now: Timestamp,
    ) -> Result<ResultEnvelope, StoreError> {
        self.transact(|state| Ok(adapter::handle(state, &self.cfg, ctx, env, now)))
    }

    async fn get(&self, id: &str) -> Result<Option<WorkItemRecord>, StoreError> {
        self.read(|s| s.records.get(id).cloned())
    }

    async fn list(&self, filter: &ItemFilter) -> Result<Vec<WorkItemRecord>, StoreError> {
        self.read(|s| {
            s.records
                .values()
                .filter(|r| filter.matches(r))
                .cloned()
                .collect()
        })
    }

    async fn observe(&self, id: &str, observation: Observation) -> Result<(), StoreError> {
        self.transact(|state| observe::apply(state, id, observation))
    }

    async fn import(&self, import: Import) -> Result<(), StoreError> {
        self.transact(|state| {
            crate::import::apply(state, import);
            Ok(())
        })
    }

    async fn findings(&self, inspection_run_id: &str) -> Result<Vec<FindingRecord>, StoreError> {
        self.read(|s| {
            let mut out: Vec<FindingRecord> = s
                .findings
                .values()
                .filter(|f| f.inspection_run_id == inspection_run_id)
                .cloned()
                .collect();
            out.sort_by_key(|f| f.sequence);
            out
        })
    }

    async fn audit_events(&self) -> Result<Vec<AuditEvent>, StoreError> {
        self.read(|s| s.audit.clone())
    }

    async fn approval(&self, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        self.read(|s| s.approvals.get(id).cloned())
    }

    async fn submission(&self, id: &str) -> Result<Option<Submission>, StoreError> {
        self.read(|s| s.submissions.get(id).cloned())
    }

    async fn request(&self, id: &str) -> Result<Option<RequestRecord>, StoreError> {
        self.read(|s| s.requests.get(id).cloned())
    }
}
