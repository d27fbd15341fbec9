//! Demand-driven loading for the Kubernetes store (pure).
//!
//! A lifecycle command touches a handful of shards — its work item, its
//! idempotency-key claim, a reservation claim, the fencing counter, perhaps a
//! dependency or an approval — so reading the whole project per command makes
//! a project of `n` items cost `O(n)` per command. Instead the store runs the
//! adapter on a [`Partial`] view that holds only the shards fetched so far and
//! records every read or write of a shard it does not know. When the run
//! missed anything, its result and writes are discarded, the missing shards
//! are fetched, and the (deterministic) run is repeated; each round learns at
//! least one shard, so the loop ends. Reads that enumerate (`records()`,
//! `submissions()`, `requests()`) ask for everything, which falls back to
//! listing the project.
//!
//! A loaded shard can refer to others that [`join`](super::shard::join) needs
//! to rebuild it faithfully (a key claim's home item, a homed reservation's
//! item, an item's approvals); [`join_dependencies`] names them, and the store
//! loads shard sets closed under it, so `split(join(loaded))` gives back every
//! loaded shard the command did not change.

use std::{
    cell::{Cell, RefCell},
    collections::{BTreeMap, BTreeSet},
};

use protobot_lifecycle::{
    ApprovalRecord, AuditEvent, IdempotencyEntry, Readiness, Reservation, Submission,
    WorkItemRecord,
};
use serde_json::Value;

use super::shard::{ItemShard, KeyClaim, Kind, ReservationClaim, ShardId};
use crate::{
    memory::WmsState,
    txn::{ChangeSetRecord, FindingRecord, RequestRecord, WmsTxn},
};

/// What a run still needs before its result can be trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    /// Nothing: the run saw every shard it touched.
    Nothing,
    /// These shards (each unknown when the run touched it).
    Shards(BTreeSet<ShardId>),
    /// The whole project (the run enumerated a family).
    Everything,
}

/// The shards a loaded shard's faithful join depends on.
pub fn join_dependencies(kind: Kind, value: &Value) -> Vec<ShardId> {
    match kind {
        Kind::Key => serde_json::from_value::<KeyClaim>(value.clone())
            .ok()
            .and_then(|c| c.home)
            .map(|h| vec![(Kind::Item, h)])
            .unwrap_or_default(),
        Kind::Reservation => serde_json::from_value::<ReservationClaim>(value.clone())
            .ok()
            .filter(|c| c.homed)
            .map(|c| vec![(Kind::Item, c.reservation.work_item_id)])
            .unwrap_or_default(),
        Kind::Approval => serde_json::from_value::<ApprovalRecord>(value.clone())
            .ok()
            .and_then(|a| a.work_item_id)
            .filter(|w| !w.is_empty())
            .map(|w| vec![(Kind::Item, w)])
            .unwrap_or_default(),
        Kind::Item => serde_json::from_value::<ItemShard>(value.clone())
            .map(|i| {
                i.approval_status
                    .into_keys()
                    .map(|a| (Kind::Approval, a))
                    .collect()
            })
            .unwrap_or_default(),
        Kind::Counter | Kind::ChangeSet | Kind::Request | Kind::Finding => Vec::new(),
    }
}

/// A transactional view over the shards loaded so far. Implements [`WmsTxn`]
/// by delegating to the joined state, noting every shard it was asked about
/// but does not know.
pub struct Partial<'a> {
    state: WmsState,
    known: &'a BTreeSet<ShardId>,
    everything_known: bool,
    misses: RefCell<BTreeSet<ShardId>>,
    wants_everything: Cell<bool>,
}

impl<'a> Partial<'a> {
    /// A view over `state` (joined from the shards in `known` that exist).
    /// With `everything_known`, the state is the whole project and nothing
    /// can be missed.
    pub fn new(
        state: WmsState,
        known: &'a BTreeSet<ShardId>,
        everything_known: bool,
    ) -> Partial<'a> {
        Partial {
            state,
            known,
            everything_known,
            misses: RefCell::new(BTreeSet::new()),
            wants_everything: Cell::new(false),
        }
    }

    /// The state after the run and what the run still needs.
    pub fn finish(self) -> (WmsState, Need) {
        let need = if self.wants_everything.get() {
            Need::Everything
        } else {
            let misses = self.misses.into_inner();
            if misses.is_empty() {
                Need::Nothing
            } else {
                Need::Shards(misses)
            }
        };
        (self.state, need)
    }

    fn knows(&self, kind: Kind, id: &str) -> bool {
        if self.everything_known {
            return true;
        }
        let shard = (kind, id.to_string());
        if self.known.contains(&shard) {
            return true;
        }
        self.misses.borrow_mut().insert(shard);
        false
    }

    fn enumerate(&self) {
        if !self.everything_known {
            self.wants_everything.set(true);
        }
    }

    /// An item's home is known when the item is known (present or absent).
    fn item_known(&self, id: &str) -> bool {
        id.is_empty() || self.knows(Kind::Item, id)
    }
}

impl WmsTxn for Partial<'_> {
    fn project_id(&self) -> &str {
        &self.state.project_id
    }

    fn record(&self, id: &str) -> Option<WorkItemRecord> {
        self.item_known(id).then(|| self.state.record(id)).flatten()
    }

    fn records(&self) -> Vec<WorkItemRecord> {
        self.enumerate();
        self.state.records()
    }

    fn idempotency(&self, key: &str) -> Option<IdempotencyEntry> {
        // The claim names the home item; loading the claim loads its home.
        self.knows(Kind::Key, key)
            .then(|| self.state.idempotency(key))
            .flatten()
    }

    fn reservation(&self, key: &str) -> Option<Reservation> {
        self.knows(Kind::Reservation, key)
            .then(|| self.state.reservation(key))
            .flatten()
    }

    fn observed_readiness(&self, id: &str) -> Option<Readiness> {
        self.item_known(id)
            .then(|| self.state.observed_readiness(id))
            .flatten()
    }

    fn approval(&self, id: &str) -> Option<ApprovalRecord> {
        self.knows(Kind::Approval, id)
            .then(|| self.state.approval(id))
            .flatten()
    }

    fn submission(&self, id: &str) -> Option<Submission> {
        // Submissions live in their work item; without knowing which, only a
        // full load can say one does not exist.
        let found = self.state.submission(id);
        if found.is_none() {
            self.enumerate();
        }
        found
    }

    fn submissions(&self) -> Vec<Submission> {
        self.enumerate();
        self.state.submissions()
    }

    fn change_set(&self, id: &str) -> Option<ChangeSetRecord> {
        if id.is_empty() {
            return None;
        }
        self.knows(Kind::ChangeSet, id)
            .then(|| self.state.change_set(id))
            .flatten()
    }

    fn request(&self, id: &str) -> Option<RequestRecord> {
        self.knows(Kind::Request, id)
            .then(|| self.state.request(id))
            .flatten()
    }

    fn requests(&self) -> Vec<RequestRecord> {
        self.enumerate();
        self.state.requests()
    }

    fn finding(&self, producer_key: &str) -> Option<FindingRecord> {
        self.knows(Kind::Finding, producer_key)
            .then(|| self.state.finding(producer_key))
            .flatten()
    }

    fn next(&mut self, counter: &str) -> u64 {
        self.knows(Kind::Counter, counter);
        self.state.next(counter)
    }

    fn peek(&self, counter: &str) -> u64 {
        self.knows(Kind::Counter, counter);
        self.state.peek(counter)
    }

    fn put_record(&mut self, record: WorkItemRecord) {
        self.item_known(&record.id);
        self.state.put_record(record);
    }

    fn put_idempotency(&mut self, entry: IdempotencyEntry) {
        self.knows(Kind::Key, &entry.key);
        if let Some(target) = entry
            .result
            .fields
            .get("work_item_id")
            .and_then(Value::as_str)
        {
            self.item_known(target);
        }
        self.state.put_idempotency(entry);
    }

    fn put_reservation(&mut self, reservation: Reservation) {
        self.knows(Kind::Reservation, &reservation.materialization_key);
        self.item_known(&reservation.work_item_id);
        self.state.put_reservation(reservation);
    }

    fn put_observed_readiness(&mut self, id: &str, readiness: Option<Readiness>) {
        self.item_known(id);
        self.state.put_observed_readiness(id, readiness);
    }

    fn put_approval(&mut self, approval: ApprovalRecord) {
        self.knows(Kind::Approval, &approval.id);
        if let Some(w) = &approval.work_item_id {
            self.item_known(w);
        }
        self.state.put_approval(approval);
    }

    fn put_submission(&mut self, submission: Submission) {
        self.item_known(&submission.work_item_id);
        self.state.put_submission(submission);
    }

    fn put_change_set(&mut self, change_set: ChangeSetRecord) {
        self.knows(Kind::ChangeSet, &change_set.id);
        self.state.put_change_set(change_set);
    }

    fn put_request(&mut self, request: RequestRecord) {
        self.knows(Kind::Request, &request.request_id);
        self.state.put_request(request);
    }

    fn put_finding(&mut self, finding: FindingRecord) {
        self.knows(Kind::Finding, &finding.producer_key);
        self.state.put_finding(finding);
    }

    fn append_audit(&mut self, event: AuditEvent) {
        // Homed in its item when the item exists (then it is known: it was
        // loaded or put), else in its key claim.
        if !self.state.records.contains_key(&event.work_item_id) {
            self.item_known(&event.work_item_id);
            self.knows(Kind::Key, &event.idempotency_key);
        }
        self.state.append_audit(event);
    }
}

/// Shards of `loaded` whose join dependencies are not yet in `known`.
pub fn unmet_dependencies(
    loaded: &BTreeMap<ShardId, Value>,
    known: &BTreeSet<ShardId>,
) -> BTreeSet<ShardId> {
    loaded
        .iter()
        .flat_map(|((kind, _), v)| join_dependencies(*kind, v))
        .filter(|d| !d.1.is_empty() && !known.contains(d))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubernetes::shard::{join, split};

    fn closure(
        all: &BTreeMap<ShardId, Value>,
        mut known: BTreeSet<ShardId>,
    ) -> BTreeMap<ShardId, Value> {
        loop {
            let loaded: BTreeMap<ShardId, Value> = all
                .iter()
                .filter(|(id, _)| known.contains(*id))
                .map(|(id, v)| (id.clone(), v.clone()))
                .collect();
            let more = unmet_dependencies(&loaded, &known);
            if more.is_empty() {
                return loaded;
            }
            known.extend(more);
        }
    }

    #[tokio::test]
    async fn every_closed_subset_splits_back_to_itself() {
        let state = crate::kubernetes::shard::tests::lived_in_state().await;
        let all = split(&state, &BTreeMap::new());
        let kinds: BTreeSet<Kind> = all.keys().map(|(k, _)| *k).collect();
        assert!(
            kinds.len() >= 5,
            "the scenario touches many shard kinds: {kinds:?}"
        );
        // Start from each single shard and from each pair of shards: the
        // closure joined and split again must reproduce every loaded shard.
        let ids: Vec<ShardId> = all.keys().cloned().collect();
        let mut seeds: Vec<BTreeSet<ShardId>> =
            ids.iter().map(|i| BTreeSet::from([i.clone()])).collect();
        for (n, a) in ids.iter().enumerate() {
            for b in ids.iter().skip(n + 1).step_by(3) {
                seeds.push(BTreeSet::from([a.clone(), b.clone()]));
            }
        }
        for seed in seeds {
            let loaded = closure(&all, seed.clone());
            let joined = join(&state.project_id, &loaded).unwrap();
            let again = split(&joined, &loaded);
            for (id, v) in &loaded {
                assert_eq!(again.get(id), Some(v), "{id:?} changed (seed {seed:?})");
            }
        }
    }

    #[test]
    fn unknown_reads_and_writes_are_misses_and_enumerations_want_everything() {
        let known = BTreeSet::from([(Kind::Item, "wi-1".to_string())]);
        let mut view = Partial::new(WmsState::new("p"), &known, false);
        assert!(view.record("wi-1").is_none());
        assert!(view.idempotency("k").is_none());
        view.peek("fence");
        view.put_record(WorkItemRecord::new(
            "wi-2",
            "p",
            protobot_lifecycle::State::Waiting,
            1,
        ));
        let (_, need) = view.finish();
        assert_eq!(
            need,
            Need::Shards(BTreeSet::from([
                (Kind::Counter, "fence".to_string()),
                (Kind::Key, "k".to_string()),
                (Kind::Item, "wi-2".to_string()),
            ]))
        );
        let view = Partial::new(WmsState::new("p"), &known, false);
        view.records();
        assert_eq!(view.finish().1, Need::Everything);
        let view = Partial::new(WmsState::new("p"), &known, true);
        view.records();
        assert!(view.idempotency("k").is_none());
        assert_eq!(view.finish().1, Need::Nothing);
    }
}
