//! Executing an adapter operation from outside the process: the audit events
//! the call produced, and a dry run that answers what the rules would decide
//! while writing nothing.
//!
//! Pure core: [`Tap`] wraps a backend's transactional view. It passes reads
//! through and records every audit event appended; in [`Mode::DryRun`] it also
//! keeps every write in an overlay it reads back from, so the adapter sees its
//! own effects (an idempotency entry, a bumped counter) exactly as it would in
//! a real call, and the backend's view is left untouched. The backends
//! ([`TracedStore`]) run the tap inside the same atomic unit as
//! [`WorkStore::execute`] and, on a dry run, do not commit.

use std::{collections::BTreeMap, future::Future};

use jiff::Timestamp;
use protobot_lifecycle::{
    ApprovalRecord, AuditEvent, AuthorizationContext, IdempotencyEntry, OperationEnvelope,
    Readiness, Reservation, ResultEnvelope, Submission, WorkItemRecord,
};

use crate::{
    StoreError, WorkStore,
    adapter::{self, AdapterConfig},
    txn::{ChangeSetRecord, FindingRecord, RequestRecord, WmsTxn},
};

/// Whether a traced call writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Evaluate and commit, like [`WorkStore::execute`].
    #[default]
    Apply,
    /// Evaluate against the current state and commit nothing.
    DryRun,
}

/// The answer of a traced call.
#[derive(Clone, Debug, PartialEq)]
pub struct Traced {
    /// The result envelope, exactly as [`WorkStore::execute`] answers (on a dry
    /// run: as it would answer now).
    pub result: ResultEnvelope,
    /// The audit events this call appended (on a dry run: would append), in order.
    pub audit: Vec<AuditEvent>,
    /// The mode the call ran in.
    pub mode: Mode,
}

/// A backend that can run an adapter operation traced (audit events returned)
/// and as a dry run.
pub trait TracedStore: WorkStore {
    /// Executes one adapter operation like [`WorkStore::execute`], returning the
    /// audit events it appended; with [`Mode::DryRun`] nothing is written.
    fn execute_traced(
        &self,
        ctx: Option<&AuthorizationContext>,
        env: &OperationEnvelope,
        now: Timestamp,
        mode: Mode,
    ) -> impl Future<Output = Result<Traced, StoreError>> + Send;
}

/// Runs the adapter on `txn` through a [`Tap`] (the shared body of every backend).
pub fn handle(
    txn: &mut dyn WmsTxn,
    cfg: &AdapterConfig,
    ctx: Option<&AuthorizationContext>,
    env: &OperationEnvelope,
    now: Timestamp,
    mode: Mode,
) -> Traced {
    let mut tap = Tap::new(txn, mode);
    let result = adapter::handle(&mut tap, cfg, ctx, env, now);
    Traced {
        result,
        audit: tap.audit,
        mode,
    }
}

/// Writes kept back from the backend on a dry run.
#[derive(Debug, Default)]
struct Overlay {
    records: BTreeMap<String, WorkItemRecord>,
    idempotency: BTreeMap<String, IdempotencyEntry>,
    reservations: BTreeMap<String, Reservation>,
    observed: BTreeMap<String, Option<Readiness>>,
    approvals: BTreeMap<String, ApprovalRecord>,
    submissions: BTreeMap<String, Submission>,
    change_sets: BTreeMap<String, ChangeSetRecord>,
    requests: BTreeMap<String, RequestRecord>,
    findings: BTreeMap<String, FindingRecord>,
    counters: BTreeMap<String, u64>,
}

/// A transactional view that records audit events and, on a dry run, keeps
/// every write in an overlay.
pub struct Tap<'a> {
    inner: &'a mut dyn WmsTxn,
    overlay: Option<Overlay>,
    audit: Vec<AuditEvent>,
}

impl<'a> Tap<'a> {
    /// A tap over `inner`.
    pub fn new(inner: &'a mut dyn WmsTxn, mode: Mode) -> Tap<'a> {
        Tap {
            inner,
            overlay: (mode == Mode::DryRun).then(Overlay::default),
            audit: Vec::new(),
        }
    }

    /// The audit events appended so far.
    pub fn audit(&self) -> &[AuditEvent] {
        &self.audit
    }
}

/// The overlay's value for `key` if it holds one, else the backend's.
fn layered<T: Clone>(
    overlay: Option<&BTreeMap<String, T>>,
    key: &str,
    base: impl FnOnce() -> Option<T>,
) -> Option<T> {
    match overlay.and_then(|m| m.get(key)) {
        Some(v) => Some(v.clone()),
        None => base(),
    }
}

/// The backend's list with the overlay's values replacing or adding by key.
fn merged<T: Clone>(
    base: Vec<T>,
    overlay: Option<&BTreeMap<String, T>>,
    key: impl Fn(&T) -> String,
) -> Vec<T> {
    let Some(overlay) = overlay else {
        return base;
    };
    let mut all: BTreeMap<String, T> = base.into_iter().map(|v| (key(&v), v)).collect();
    all.extend(overlay.iter().map(|(k, v)| (k.clone(), v.clone())));
    all.into_values().collect()
}

impl WmsTxn for Tap<'_> {
    fn project_id(&self) -> &str {
        self.inner.project_id()
    }
    fn record(&self, id: &str) -> Option<WorkItemRecord> {
        layered(self.overlay.as_ref().map(|o| &o.records), id, || {
            self.inner.record(id)
        })
    }
    fn records(&self) -> Vec<WorkItemRecord> {
        merged(
            self.inner.records(),
            self.overlay.as_ref().map(|o| &o.records),
            |r| r.id.clone(),
        )
    }
    fn idempotency(&self, key: &str) -> Option<IdempotencyEntry> {
        layered(self.overlay.as_ref().map(|o| &o.idempotency), key, || {
            self.inner.idempotency(key)
        })
    }
    fn reservation(&self, key: &str) -> Option<Reservation> {
        layered(self.overlay.as_ref().map(|o| &o.reservations), key, || {
            self.inner.reservation(key)
        })
    }
    fn observed_readiness(&self, id: &str) -> Option<Readiness> {
        match self.overlay.as_ref().and_then(|o| o.observed.get(id)) {
            Some(v) => v.clone(),
            None => self.inner.observed_readiness(id),
        }
    }
    fn approval(&self, id: &str) -> Option<ApprovalRecord> {
        layered(self.overlay.as_ref().map(|o| &o.approvals), id, || {
            self.inner.approval(id)
        })
    }
    fn submission(&self, id: &str) -> Option<Submission> {
        layered(self.overlay.as_ref().map(|o| &o.submissions), id, || {
            self.inner.submission(id)
        })
    }
    fn submissions(&self) -> Vec<Submission> {
        merged(
            self.inner.submissions(),
            self.overlay.as_ref().map(|o| &o.submissions),
            |s| s.id.clone(),
        )
    }
    fn change_set(&self, id: &str) -> Option<ChangeSetRecord> {
        layered(self.overlay.as_ref().map(|o| &o.change_sets), id, || {
            self.inner.change_set(id)
        })
    }
    fn request(&self, id: &str) -> Option<RequestRecord> {
        layered(self.overlay.as_ref().map(|o| &o.requests), id, || {
            self.inner.request(id)
        })
    }
    fn requests(&self) -> Vec<RequestRecord> {
        merged(
            self.inner.requests(),
            self.overlay.as_ref().map(|o| &o.requests),
            |r| r.request_id.clone(),
        )
    }
    fn finding(&self, producer_key: &str) -> Option<FindingRecord> {
        layered(
            self.overlay.as_ref().map(|o| &o.findings),
            producer_key,
            || self.inner.finding(producer_key),
        )
    }
    fn next(&mut self, counter: &str) -> u64 {
        match self.overlay.as_mut() {
            None => self.inner.next(counter),
            Some(o) => {
                let value = match o.counters.get(counter) {
                    Some(c) => c + 1,
                    None => self.inner.peek(counter),
                };
                o.counters.insert(counter.to_string(), value);
                value
            }
        }
    }
    fn peek(&self, counter: &str) -> u64 {
        match self.overlay.as_ref().and_then(|o| o.counters.get(counter)) {
            Some(c) => c + 1,
            None => self.inner.peek(counter),
        }
    }
    fn put_record(&mut self, record: WorkItemRecord) {
        match self.overlay.as_mut() {
            Some(o) => {
                o.records.insert(record.id.clone(), record);
            }
            None => self.inner.put_record(record),
        }
    }
    fn put_idempotency(&mut self, entry: IdempotencyEntry) {
        match self.overlay.as_mut() {
            Some(o) => {
                o.idempotency.insert(entry.key.clone(), entry);
            }
            None => self.inner.put_idempotency(entry),
        }
    }
    fn put_reservation(&mut self, reservation: Reservation) {
        match self.overlay.as_mut() {
            Some(o) => {
                o.reservations
                    .insert(reservation.materialization_key.clone(), reservation);
            }
            None => self.inner.put_reservation(reservation),
        }
    }
    fn put_observed_readiness(&mut self, id: &str, readiness: Option<Readiness>) {
        match self.overlay.as_mut() {
            Some(o) => {
                o.observed.insert(id.to_string(), readiness);
            }
            None => self.inner.put_observed_readiness(id, readiness),
        }
    }
    fn put_approval(&mut self, approval: ApprovalRecord) {
        match self.overlay.as_mut() {
            Some(o) => {
                o.approvals.insert(approval.id.clone(), approval);
            }
            None => self.inner.put_approval(approval),
        }
    }
    fn put_submission(&mut self, submission: Submission) {
        match self.overlay.as_mut() {
            Some(o) => {
                o.submissions.insert(submission.id.clone(), submission);
            }
            None => self.inner.put_submission(submission),
        }
    }
    fn put_change_set(&mut self, change_set: ChangeSetRecord) {
        match self.overlay.as_mut() {
            Some(o) => {
                o.change_sets.insert(change_set.id.clone(), change_set);
            }
            None => self.inner.put_change_set(change_set),
        }
    }
    fn put_request(&mut self, request: RequestRecord) {
        match self.overlay.as_mut() {
            Some(o) => {
                o.requests.insert(request.request_id.clone(), request);
            }
            None => self.inner.put_request(request),
        }
    }
    fn put_finding(&mut self, finding: FindingRecord) {
        match self.overlay.as_mut() {
            Some(o) => {
                o.findings.insert(finding.producer_key.clone(), finding);
            }
            None => self.inner.put_finding(finding),
        }
    }
    fn append_audit(&mut self, event: AuditEvent) {
        if self.overlay.is_none() {
            self.inner.append_audit(event.clone());
        }
        self.audit.push(event);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::memory::WmsState;

    #[test]
    fn a_dry_run_reads_its_own_writes_and_leaves_the_backend_untouched() {
        let mut base = WmsState::new("p");
        base.next("fence");
        let mut tap = Tap::new(&mut base, Mode::DryRun);
        assert_eq!(tap.next("fence"), 2);
        assert_eq!(tap.next("fence"), 3);
        assert_eq!(tap.peek("fence"), 4);
        tap.put_record(WorkItemRecord::new(
            "wi-1",
            "p",
            protobot_lifecycle::State::Waiting,
            1,
        ));
        assert!(tap.record("wi-1").is_some());
        assert_eq!(tap.records().len(), 1);
        tap.put_observed_readiness("wi-1", None);
        assert_eq!(tap.observed_readiness("wi-1"), None);
        tap.append_audit(AuditEvent {
            operation: "claim".into(),
            subject: "s".into(),
            authorized_human_subject: String::new(),
            request_id: String::new(),
            work_item_id: "wi-1".into(),
            idempotency_key: "k".into(),
            outcome: "allowed".into(),
            rule_version: "validation-rules/v1".into(),
            policy_version: "p/v1".into(),
            before: None,
            after: None,
        });
        assert_eq!(tap.audit().len(), 1);
        assert_eq!(base.peek("fence"), 2, "the counter did not move");
        assert!(base.records.is_empty(), "no record was written");
        assert!(base.audit.is_empty(), "no audit event was appended");
    }

    #[test]
    fn an_applied_call_passes_writes_through_and_still_reports_the_audit() {
        let mut base = WmsState::new("p");
        let mut tap = Tap::new(&mut base, Mode::Apply);
        assert_eq!(tap.next("fence"), 1);
        tap.put_record(WorkItemRecord::new(
            "wi-1",
            "p",
            protobot_lifecycle::State::Waiting,
            1,
        ));
        assert_eq!(base.peek("fence"), 2);
        assert!(base.records.contains_key("wi-1"));
    }
}
