//! How a project's WMS state is sharded over Kubernetes objects (pure).
//!
//! Everything one lifecycle command changes is homed in the status of the
//! work item it targets — the record, the idempotency results of commands on
//! it, its reservation, observed readiness, its blocked-work submissions, the
//! status of approvals bound to it, and its audit tail — so a command is one
//! conditional status write. What has no work item gets its own object:
//! - a *key claim* per idempotency key (created once, never changed), so a key
//!   reused on another item is detected across shards; it holds the frozen
//!   result itself when no work item exists (`NOT_FOUND`, request operations);
//! - a *reservation claim* per materialization key, binding the key to one
//!   work item before that item is created; it holds the result of an
//!   `omitted` materialization;
//! - approvals as the Gate imported them, change sets, requests, findings and
//!   counters.
//!
//! [`split`] maps a state to shard values and [`join`] maps them back; a
//! store diffs the shards before and after a call and writes only what moved,
//! the home work item last (its status write is the commit point).

use std::collections::BTreeMap;

use protobot_lifecycle::{
    ApprovalRecord, AuditEvent, IdempotencyEntry, Readiness, Reservation, Submission,
    WorkItemRecord,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    memory::WmsState,
    txn::{ChangeSetRecord, FindingRecord, RequestRecord},
};

/// Kinds of shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Named counters (written first).
    Counter,
    /// Idempotency-key claims.
    Key,
    /// Materialization-key claims.
    Reservation,
    /// Gate approvals as imported.
    Approval,
    /// Registered change sets.
    ChangeSet,
    /// Drafting Table requests.
    Request,
    /// Ledger findings.
    Finding,
    /// Work items (written last: the commit point).
    Item,
}

impl Kind {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Key => "key",
            Kind::Reservation => "reservation",
            Kind::Approval => "approval",
            Kind::ChangeSet => "change-set",
            Kind::Request => "request",
            Kind::Finding => "finding",
            Kind::Item => "item",
        }
    }

    /// Parses a label value.
    pub fn parse(s: &str) -> Option<Kind> {
        [
            Kind::Counter,
            Kind::Key,
            Kind::Reservation,
            Kind::Approval,
            Kind::ChangeSet,
            Kind::Request,
            Kind::Finding,
            Kind::Item,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }

    /// Claims are created once and never rewritten.
    pub fn is_claim(self) -> bool {
        matches!(self, Kind::Key | Kind::Reservation)
    }
}

/// Everything homed at one work item.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ItemShard {
    /// The record.
    pub record: Option<WorkItemRecord>,
    /// Results of commands on this item, by key.
    pub idempotency: BTreeMap<String, IdempotencyEntry>,
    /// The reservation that created it.
    pub reservation: Option<Reservation>,
    /// Readiness observed since the last refresh.
    pub observed_readiness: Option<Readiness>,
    /// Its blocked-work submissions.
    pub submissions: BTreeMap<String, Submission>,
    /// Current status of approvals bound to it.
    pub approval_status: BTreeMap<String, String>,
    /// Its audit events, oldest first.
    pub audit: Vec<AuditEvent>,
}

/// An idempotency-key claim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyClaim {
    /// The key.
    pub key: String,
    /// Fingerprint of its first request.
    pub fingerprint: String,
    /// The work item holding the result, if any.
    pub home: Option<String>,
    /// The result, when no work item holds it.
    pub entry: Option<IdempotencyEntry>,
    /// Audit events of an unhomed mutation.
    pub audit: Vec<AuditEvent>,
}

/// A materialization-key claim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReservationClaim {
    /// The reservation (its `result` is kept only when no work item exists).
    pub reservation: Reservation,
    /// Whether the bound work item holds the full reservation.
    pub homed: bool,
}

/// Shard identity: kind and the WMS id it holds.
pub type ShardId = (Kind, String);

fn to_value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn target_of(entry: &IdempotencyEntry) -> Option<&str> {
    entry
        .result
        .fields
        .get("work_item_id")
        .and_then(Value::as_str)
}

/// Splits a state into shard values. `previous` (the shards as loaded) keeps
/// the imported status of approvals whose current status lives in an item.
pub fn split(state: &WmsState, previous: &BTreeMap<ShardId, Value>) -> BTreeMap<ShardId, Value> {
    let mut items: BTreeMap<String, ItemShard> = BTreeMap::new();
    for (id, r) in &state.records {
        items.entry(id.clone()).or_default().record = Some(r.clone());
    }
    let homed = |id: &str| state.records.contains_key(id);
    let mut out: BTreeMap<ShardId, Value> = BTreeMap::new();
    let mut keys: BTreeMap<String, KeyClaim> = BTreeMap::new();
    for (key, e) in &state.idempotency {
        // A result first frozen in its claim (no work item existed then) stays
        // there: moving it would take two writes that could be torn apart.
        let frozen_in_claim = previous
            .get(&(Kind::Key, key.clone()))
            .and_then(|v| serde_json::from_value::<KeyClaim>(v.clone()).ok())
            .is_some_and(|c| c.entry.is_some());
        let home = target_of(e)
            .filter(|t| homed(t) && !frozen_in_claim)
            .map(str::to_string);
        if let Some(h) = &home {
            items
                .entry(h.clone())
                .or_default()
                .idempotency
                .insert(key.clone(), e.clone());
        }
        let entry = if home.is_none() {
            Some(e.clone())
        } else {
            None
        };
        keys.insert(
            key.clone(),
            KeyClaim {
                key: key.clone(),
                fingerprint: e.fingerprint.clone(),
                home,
                entry,
                audit: Vec::new(),
            },
        );
    }
    for (mkey, r) in &state.reservations {
        let is_homed = homed(&r.work_item_id);
        let mut claim = r.clone();
        if is_homed {
            items.entry(r.work_item_id.clone()).or_default().reservation = Some(r.clone());
            // The claim binds the key; the result lives with the item.
            claim.result = protobot_lifecycle::ResultEnvelope::read("materialize", "work-item");
        }
        out.insert(
            (Kind::Reservation, mkey.clone()),
            to_value(&ReservationClaim {
                reservation: claim,
                homed: is_homed,
            }),
        );
    }
    for (id, r) in &state.observed_readiness {
        if homed(id) {
            items.entry(id.clone()).or_default().observed_readiness = Some(r.clone());
        }
    }
    for (id, s) in &state.submissions {
        items
            .entry(s.work_item_id.clone())
            .or_default()
            .submissions
            .insert(id.clone(), s.clone());
    }
    for (id, a) in &state.approvals {
        let bound = a.work_item_id.as_deref().filter(|w| homed(w));
        let mut base = a.clone();
        if let Some(w) = bound {
            items
                .entry(w.to_string())
                .or_default()
                .approval_status
                .insert(id.clone(), a.status.clone());
            let previous_status = previous
                .get(&(Kind::Approval, id.clone()))
                .and_then(|v| serde_json::from_value::<ApprovalRecord>(v.clone()).ok())
                .map(|p| p.status);
            if let Some(s) = previous_status {
                base.status = s;
            }
        }
        out.insert((Kind::Approval, id.clone()), to_value(&base));
    }
    for e in &state.audit {
        if homed(&e.work_item_id) {
            items
                .entry(e.work_item_id.clone())
                .or_default()
                .audit
                .push(e.clone());
        } else if let Some(k) = keys.get_mut(&e.idempotency_key) {
            k.audit.push(e.clone());
        }
    }
    for (key, claim) in keys {
        out.insert((Kind::Key, key), to_value(&claim));
    }
    for (id, c) in &state.change_sets {
        out.insert((Kind::ChangeSet, id.clone()), to_value(c));
    }
    for (id, r) in &state.requests {
        out.insert((Kind::Request, id.clone()), to_value(r));
    }
    for (id, f) in &state.findings {
        out.insert((Kind::Finding, id.clone()), to_value(f));
    }
    for (name, n) in &state.counters {
        out.insert((Kind::Counter, name.clone()), Value::from(*n));
    }
    for (id, item) in items {
        // Submissions of an item that does not exist (cannot happen through the
        // adapter) are dropped rather than invented into a work item.
        if item.record.is_some() {
            out.insert((Kind::Item, id), to_value(&item));
        }
    }
    out
}

/// Why loaded shards could not be joined.
#[derive(Debug, thiserror::Error)]
#[error("failed to decode the {kind:?} shard {id}: {reason}")]
pub struct JoinError {
    /// Kind.
    pub kind: Kind,
    /// Id.
    pub id: String,
    /// Why.
    pub reason: String,
}

fn decode<T: serde::de::DeserializeOwned>(kind: Kind, id: &str, v: &Value) -> Result<T, JoinError> {
    serde_json::from_value(v.clone()).map_err(|e| JoinError {
        kind,
        id: id.to_string(),
        reason: e.to_string(),
    })
}

/// Joins loaded shards into one state.
pub fn join(project_id: &str, shards: &BTreeMap<ShardId, Value>) -> Result<WmsState, JoinError> {
    let mut s = WmsState::new(project_id);
    let mut overrides: BTreeMap<String, String> = BTreeMap::new();
    let mut item_audit: Vec<AuditEvent> = Vec::new();
    let mut key_audit: Vec<AuditEvent> = Vec::new();
    for ((kind, id), v) in shards {
        match kind {
            Kind::Item => {
                let item: ItemShard = decode(*kind, id, v)?;
                let Some(record) = item.record else { continue };
                s.records.insert(id.clone(), record);
                s.idempotency.extend(item.idempotency);
                if let Some(r) = item.reservation {
                    s.reservations.insert(r.materialization_key.clone(), r);
                }
                if let Some(r) = item.observed_readiness {
                    s.observed_readiness.insert(id.clone(), r);
                }
                s.submissions.extend(item.submissions);
                overrides.extend(item.approval_status);
                item_audit.extend(item.audit);
            }
            Kind::Key => {
                let claim: KeyClaim = decode(*kind, id, v)?;
                if let Some(e) = claim.entry {
                    s.idempotency.entry(e.key.clone()).or_insert(e);
                }
                key_audit.extend(claim.audit);
            }
            Kind::Reservation => {
                let claim: ReservationClaim = decode(*kind, id, v)?;
                // A homed claim's item carries the full reservation; a claim whose
                // item was never created (crash before the commit point) is ignored.
                if !claim.homed {
                    s.reservations
                        .entry(id.clone())
                        .or_insert(claim.reservation);
                }
            }
            Kind::Approval => {
                let a: ApprovalRecord = decode(*kind, id, v)?;
                s.approvals.insert(id.clone(), a);
            }
            Kind::ChangeSet => {
                s.change_sets
                    .insert(id.clone(), decode::<ChangeSetRecord>(*kind, id, v)?);
            }
            Kind::Request => {
                s.requests
                    .insert(id.clone(), decode::<RequestRecord>(*kind, id, v)?);
            }
            Kind::Finding => {
                s.findings
                    .insert(id.clone(), decode::<FindingRecord>(*kind, id, v)?);
            }
            Kind::Counter => {
                s.counters.insert(id.clone(), decode::<u64>(*kind, id, v)?);
            }
        }
    }
    for (id, status) in overrides {
        if let Some(a) = s.approvals.get_mut(&id) {
            a.status = status;
        }
    }
    // A key claimed but whose home item holds no entry yet (crash between the
    // claim and the commit point) contributes nothing: the retry evaluates afresh.
    s.audit = item_audit;
    s.audit.extend(key_audit);
    Ok(s)
}

#[cfg(test)]
pub(crate) mod tests {
    use protobot_lifecycle::State;

    use super::*;
    use crate::{AdapterConfig, Import, MemoryStore, WorkStore};

    /// The state after the conformance scenario that touches the most record families.
    pub(crate) async fn lived_in_state() -> WmsState {
        let store = std::sync::Arc::new(MemoryStore::new(
            crate::conformance::PROJECT,
            crate::conformance::config(),
        ));
        let h = crate::conformance::Harness {
            store: store.clone(),
            now: crate::conformance::eval_time(),
        };
        crate::conformance::vr_023_add_requirement_resolution_end_to_end(h).await;
        store.snapshot().unwrap()
    }

    #[tokio::test]
    async fn split_then_join_is_the_identity_on_a_lived_in_state() {
        let state = lived_in_state().await;
        let shards = split(&state, &BTreeMap::new());
        let back = join(&state.project_id, &shards).unwrap();
        assert_eq!(back.records, state.records);
        assert_eq!(back.idempotency, state.idempotency);
        assert_eq!(back.reservations, state.reservations);
        assert_eq!(back.approvals, state.approvals);
        assert_eq!(back.submissions, state.submissions);
        assert_eq!(back.change_sets, state.change_sets);
        assert_eq!(back.counters, state.counters);
        assert_eq!(back.audit.len(), state.audit.len());
        assert!(
            shards.keys().any(|(k, _)| *k == Kind::Key),
            "every key is claimed"
        );
    }

    #[tokio::test]
    async fn an_approval_consumed_by_an_item_keeps_its_imported_base() {
        let store = MemoryStore::new("p", AdapterConfig::default());
        let mut rec = WorkItemRecord::new("wi-1", "p", State::Blocked, 7);
        rec.readiness = Readiness::complete();
        store.import(Import::Record(rec)).await.unwrap();
        let approval = ApprovalRecord {
            id: "ap-1".into(),
            work_item_id: Some("wi-1".into()),
            status: "unused".into(),
            ..ApprovalRecord::default()
        };
        store.import(Import::Approval(approval)).await.unwrap();
        let before = split(&store.snapshot().unwrap(), &BTreeMap::new());
        let mut state = store.snapshot().unwrap();
        if let Some(a) = state.approvals.get_mut("ap-1") {
            a.status = "consumed".into();
        }
        let after = split(&state, &before);
        assert_eq!(
            after[&(Kind::Approval, "ap-1".to_string())],
            before[&(Kind::Approval, "ap-1".to_string())],
            "the approval object is not rewritten"
        );
        assert_ne!(
            after[&(Kind::Item, "wi-1".to_string())],
            before[&(Kind::Item, "wi-1".to_string())],
            "the item carries the consumption"
        );
        assert_eq!(
            join("p", &after).unwrap().approvals["ap-1"].status,
            "consumed"
        );
    }
}
