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
//!
//! # Bounded item ledgers
//!
//! Every command on an item leaves a result (and usually an audit event) in
//! its ledger, and a long build renews its lease many times, so an item's
//! ledger would grow without bound towards the 1 MiB object limit. Each result
//! homed in an item gets a sequence number from the item (`next_seq`). When
//! more than [`ITEM_LEDGER_HIGH`] results are homed in an item, [`split`]
//! *archives* the oldest down to [`ITEM_LEDGER_LOW`]: each moves, with its
//! audit events, into its own key claim (which keeps `home` and `seq`), and
//! the item records `archived_below` (every sequence number under it lives in
//! a claim). A replay of an archived key still finds its result: the key's
//! claim is read first, and it holds it. The claims are written before the
//! item, so a crash between the two leaves the result in both places, which
//! [`join`] reads as one. A reader that read a claim just before it was
//! archived and the item just after sees neither copy; [`stale_claims`] names
//! such claims (sequence number under the item's `archived_below`, no result
//! in either) so the store reads them again.

use std::collections::{BTreeMap, BTreeSet};

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

/// An item ledger holding more results than this archives its oldest.
pub const ITEM_LEDGER_HIGH: usize = 64;
/// How many results an item keeps after archiving.
pub const ITEM_LEDGER_LOW: usize = 32;
/// An item ledger whose results serialize to more than this many bytes archives its
/// oldest until it fits: etcd refuses objects over 1.5 MiB, and a count alone does not
/// bound results that carry large payloads. The rest of the status (record, contract
/// mirror, conditions) stays well under the remaining half.
pub const ITEM_LEDGER_BYTES: usize = 768 * 1024;

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
    /// Sequence number of each result in `idempotency` (arrival order).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sequence: BTreeMap<String, u64>,
    /// The sequence number the next result homed here gets.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_seq: u64,
    /// Results with a lower sequence number were archived into their claims.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub archived_below: u64,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
fn is_zero(n: &u64) -> bool {
    *n == 0
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
    /// Audit events of an unhomed mutation, or of an archived one.
    pub audit: Vec<AuditEvent>,
    /// The result's sequence number in its home item (see the module docs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

impl KeyClaim {
    /// Whether the claim holds the result of a command on its home item
    /// (archived there from the item's ledger).
    pub fn is_archived(&self) -> bool {
        self.home.is_some() && self.entry.is_some()
    }
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

fn previous_claim(previous: &BTreeMap<ShardId, Value>, key: &str) -> Option<KeyClaim> {
    previous
        .get(&(Kind::Key, key.to_string()))
        .and_then(|v| serde_json::from_value::<KeyClaim>(v.clone()).ok())
}

fn previous_item(previous: &BTreeMap<ShardId, Value>, id: &str) -> Option<ItemShard> {
    previous
        .get(&(Kind::Item, id.to_string()))
        .and_then(|v| serde_json::from_value::<ItemShard>(v.clone()).ok())
}

/// Gives the results homed in one item their sequence numbers (old ones keep
/// theirs; new ones follow in key order) and archives the oldest when there
/// are more than [`ITEM_LEDGER_HIGH`]. Returns the archived keys with their
/// sequence numbers.
fn sequence_item(item: &mut ItemShard, previous: Option<&ItemShard>) -> Vec<(String, u64)> {
    let (old, mut next_seq, mut archived_below) = previous
        .map(|p| (p.sequence.clone(), p.next_seq, p.archived_below))
        .unwrap_or_default();
    let mut sequence = BTreeMap::new();
    for key in item.idempotency.keys() {
        if let Some(n) = old.get(key) {
            sequence.insert(key.clone(), *n);
        }
    }
    for key in item.idempotency.keys() {
        if !sequence.contains_key(key) {
            sequence.insert(key.clone(), next_seq);
            next_seq += 1;
        }
    }
    let mut archived = Vec::new();
    if sequence.len() > ITEM_LEDGER_HIGH {
        let mut by_age: Vec<(u64, String)> =
            sequence.iter().map(|(k, n)| (*n, k.clone())).collect();
        by_age.sort();
        for (n, key) in by_age.into_iter().take(sequence.len() - ITEM_LEDGER_LOW) {
            sequence.remove(&key);
            archived_below = archived_below.max(n + 1);
            archived.push((key, n));
        }
    }
    // Then by bytes: oldest first, until what is kept fits (the newest always stays).
    let size = |key: &str| {
        item.idempotency
            .get(key)
            .and_then(|e| serde_json::to_vec(e).ok())
            .map_or(0, |b| b.len() + key.len())
    };
    let mut kept_bytes: usize = sequence.keys().map(|k| size(k)).sum();
    if kept_bytes > ITEM_LEDGER_BYTES {
        let mut by_age: Vec<(u64, String)> =
            sequence.iter().map(|(k, n)| (*n, k.clone())).collect();
        by_age.sort();
        let last = by_age.len().saturating_sub(1);
        for (n, key) in by_age.into_iter().take(last) {
            if kept_bytes <= ITEM_LEDGER_BYTES {
                break;
            }
            kept_bytes = kept_bytes.saturating_sub(size(&key));
            sequence.remove(&key);
            archived_below = archived_below.max(n + 1);
            archived.push((key, n));
        }
    }
    item.sequence = sequence;
    item.next_seq = next_seq;
    item.archived_below = archived_below;
    archived
}

/// Splits a state into shard values. `previous` (the shards as loaded) keeps
/// the imported status of approvals whose current status lives in an item,
/// the sequence numbers of item ledgers, and results already frozen or
/// archived in their claims where they are.
pub fn split(state: &WmsState, previous: &BTreeMap<ShardId, Value>) -> BTreeMap<ShardId, Value> {
    let mut items: BTreeMap<String, ItemShard> = BTreeMap::new();
    for (id, r) in &state.records {
        items.entry(id.clone()).or_default().record = Some(r.clone());
    }
    let homed = |id: &str| state.records.contains_key(id);
    let mut out: BTreeMap<ShardId, Value> = BTreeMap::new();
    let mut keys: BTreeMap<String, KeyClaim> = BTreeMap::new();
    for (key, e) in &state.idempotency {
        // A result already in its claim stays there: a result first frozen in
        // its claim (no work item existed then) because moving it would take
        // two writes that could be torn apart, an archived one because its
        // item has let it go.
        let claimed = previous_claim(previous, key).filter(|c| c.entry.is_some());
        let home = match &claimed {
            Some(c) => c.home.clone(),
            None => target_of(e).filter(|t| homed(t)).map(str::to_string),
        };
        let entry = if claimed.is_some() || home.is_none() {
            Some(e.clone())
        } else {
            items
                .entry(home.clone().unwrap_or_default())
                .or_default()
                .idempotency
                .insert(key.clone(), e.clone());
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
                seq: claimed.and_then(|c| c.seq),
            },
        );
    }
    for (id, item) in &mut items {
        if item.record.is_none() {
            continue;
        }
        let archived = sequence_item(item, previous_item(previous, id).as_ref());
        for (key, n) in archived {
            if let (Some(e), Some(claim)) = (item.idempotency.remove(&key), keys.get_mut(&key)) {
                claim.entry = Some(e);
                claim.seq = Some(n);
            }
        }
        for (key, n) in &item.sequence {
            if let Some(claim) = keys.get_mut(key) {
                claim.seq = Some(*n);
            }
        }
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
        match keys.get_mut(&e.idempotency_key) {
            // An archived command's events go with its result.
            Some(k) if k.is_archived() && k.home.as_deref() == Some(e.work_item_id.as_str()) => {
                k.audit.push(e.clone());
            }
            _ if homed(&e.work_item_id) => items
                .entry(e.work_item_id.clone())
                .or_default()
                .audit
                .push(e.clone()),
            Some(k) => k.audit.push(e.clone()),
            None => {}
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

/// The claims among the shards that were read just before their result was
/// archived while their home item was read just after (see the module docs):
/// the store must read them again.
pub fn stale_claims(shards: &BTreeMap<ShardId, Value>) -> Vec<ShardId> {
    let mut stale = Vec::new();
    for ((kind, key), v) in shards {
        if *kind != Kind::Key {
            continue;
        }
        let Ok(claim) = serde_json::from_value::<KeyClaim>(v.clone()) else {
            continue;
        };
        let (Some(home), None) = (&claim.home, &claim.entry) else {
            continue;
        };
        let Some(item) = shards
            .get(&(Kind::Item, home.clone()))
            .and_then(|v| serde_json::from_value::<ItemShard>(v.clone()).ok())
        else {
            continue;
        };
        // A claim from before sequence numbers counts as the oldest.
        if !item.idempotency.contains_key(key) && claim.seq.unwrap_or(0) < item.archived_below {
            stale.push((Kind::Key, key.clone()));
        }
    }
    stale
}

/// Key claims the split moved a result into that must have been read before
/// they can be written (claims are written with a `resourceVersion`
/// precondition, and only when read).
pub fn archive_targets(shards: &BTreeMap<ShardId, Value>) -> BTreeSet<ShardId> {
    shards
        .iter()
        .filter(|((kind, _), v)| {
            *kind == Kind::Key
                && serde_json::from_value::<KeyClaim>((*v).clone()).is_ok_and(|c| c.is_archived())
        })
        .map(|(id, _)| id.clone())
        .collect()
}

/// Why loaded shards could not be joined: one of them does not decode.
#[derive(Debug, thiserror::Error)]
#[error("failed to decode the {kind:?} shard {id}")]
pub struct JoinError {
    /// Kind.
    pub kind: Kind,
    /// Id.
    pub id: String,
    /// Why.
    #[source]
    pub source: serde_json::Error,
}

fn decode<T: serde::de::DeserializeOwned>(kind: Kind, id: &str, v: &Value) -> Result<T, JoinError> {
    serde_json::from_value(v.clone()).map_err(|source| JoinError {
        kind,
        id: id.to_string(),
        source,
    })
}

/// Joins loaded shards into one state.
pub fn join(project_id: &str, shards: &BTreeMap<ShardId, Value>) -> Result<WmsState, JoinError> {
    let mut s = WmsState::new(project_id);
    let mut overrides: BTreeMap<String, String> = BTreeMap::new();
    // Per item: its archived events (by sequence number), then its ledger's tail.
    let mut item_audit: BTreeMap<String, Vec<AuditEvent>> = BTreeMap::new();
    let mut archived_audit: BTreeMap<String, Vec<(u64, Vec<AuditEvent>)>> = BTreeMap::new();
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
                item_audit.insert(id.clone(), item.audit);
            }
            Kind::Key => {
                let claim: KeyClaim = decode(*kind, id, v)?;
                let archived = claim.is_archived();
                if let Some(e) = claim.entry {
                    s.idempotency.entry(e.key.clone()).or_insert(e);
                }
                match claim.home {
                    Some(home) if archived => archived_audit
                        .entry(home)
                        .or_default()
                        .push((claim.seq.unwrap_or(0), claim.audit)),
                    _ => key_audit.extend(claim.audit),
                }
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
    let mut homes: BTreeSet<String> = item_audit.keys().cloned().collect();
    homes.extend(archived_audit.keys().cloned());
    for home in homes {
        let tail = item_audit.remove(&home).unwrap_or_default();
        if let Some(mut archived) = archived_audit.remove(&home) {
            // A crash between archiving a result and rewriting its item leaves
            // its events in both: the item's copy counts.
            let in_tail: BTreeSet<&str> = tail.iter().map(|e| e.idempotency_key.as_str()).collect();
            archived.sort_by_key(|(n, _)| *n);
            for (_, events) in archived {
                s.audit.extend(
                    events
                        .into_iter()
                        .filter(|e| !in_tail.contains(e.idempotency_key.as_str())),
                );
            }
        }
        s.audit.extend(tail);
    }
    s.audit.extend(key_audit);
    Ok(s)
}

#[cfg(test)]
pub(crate) mod tests {
    use protobot_lifecycle::State;
    use serde_json::Value;

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

    fn command(state: &mut WmsState, item: &str, n: usize) -> String {
        let key = format!("renew-{n:04}");
        let mut result = protobot_lifecycle::ResultEnvelope::read("renew-lease", "work-item");
        result
            .fields
            .insert("work_item_id".into(), Value::from(item.to_string()));
        state.idempotency.insert(
            key.clone(),
            IdempotencyEntry {
                key: key.clone(),
                fingerprint: format!("fp-{n}"),
                result,
            },
        );
        state.audit.push(AuditEvent {
            operation: "renew-lease".into(),
            subject: "job-site-a".into(),
            authorized_human_subject: String::new(),
            request_id: String::new(),
            work_item_id: item.into(),
            idempotency_key: key.clone(),
            outcome: "applied".into(),
            rule_version: "validation-rules/v1".into(),
            policy_version: "v1".into(),
            before: None,
            after: None,
        });
        key
    }

    fn one_item() -> WmsState {
        let mut state = WmsState::new("p");
        state.records.insert(
            "wi-1".into(),
            WorkItemRecord::new("wi-1", "p", State::Building, 2),
        );
        state
    }

    fn item_of(shards: &BTreeMap<ShardId, Value>) -> ItemShard {
        serde_json::from_value(shards[&(Kind::Item, "wi-1".to_string())].clone()).unwrap()
    }

    fn claim_of(shards: &BTreeMap<ShardId, Value>, key: &str) -> KeyClaim {
        serde_json::from_value(shards[&(Kind::Key, key.to_string())].clone()).unwrap()
    }

    #[test]
    fn an_item_ledger_stays_bounded_and_what_it_archives_joins_back() {
        let mut shards = split(&one_item(), &BTreeMap::new());
        let mut archived_total = 0;
        for n in 0..300 {
            // What a store does per command: join what it read, run, split.
            let mut state = join("p", &shards).unwrap();
            let before_len = state.audit.len();
            let key = command(&mut state, "wi-1", n);
            let next = split(&state, &shards);
            let item = item_of(&next);
            assert!(item.idempotency.len() <= ITEM_LEDGER_HIGH, "after {n}");
            assert!(item.audit.len() <= ITEM_LEDGER_HIGH, "after {n}");
            assert_eq!(item.sequence.len(), item.idempotency.len());
            // Only the item, the new claim and archived claims change.
            let changed: Vec<&ShardId> = next
                .iter()
                .filter(|(id, v)| shards.get(*id) != Some(*v))
                .map(|(id, _)| id)
                .collect();
            let archived_now = changed.len() - 2;
            assert!(
                archived_now == 0 || archived_now == ITEM_LEDGER_HIGH + 1 - ITEM_LEDGER_LOW,
                "step {n} rewrote {changed:?}"
            );
            assert!(changed.contains(&&(Kind::Key, key.clone())));
            archived_total += archived_now;
            let back = join("p", &next).unwrap();
            assert_eq!(back.idempotency, state.idempotency, "after {n}");
            assert_eq!(back.audit, state.audit, "events keep their order after {n}");
            assert_eq!(back.audit.len(), before_len + 1);
            shards = next;
        }
        assert!(archived_total > 200, "{archived_total} archived");
        let item = item_of(&shards);
        let oldest = claim_of(&shards, "renew-0000");
        assert!(oldest.is_archived());
        assert_eq!(oldest.seq, Some(0));
        assert_eq!(oldest.audit.len(), 1, "its event went with it");
        assert!(oldest.seq.unwrap() < item.archived_below);
        assert_eq!(item.next_seq, 300);
        // A read-only pass over the final state rewrites nothing.
        assert_eq!(split(&join("p", &shards).unwrap(), &shards), shards);
    }

    #[test]
    fn an_item_ledger_of_large_results_stays_within_its_byte_budget() {
        // Few results, each large: the count bound alone would keep them all and the
        // BuildWorkItem would outgrow etcd's object limit.
        let mut shards = split(&one_item(), &BTreeMap::new());
        for n in 0..40 {
            let mut state = join("p", &shards).unwrap();
            let key = command(&mut state, "wi-1", n);
            if let Some(e) = state.idempotency.get_mut(&key) {
                e.result
                    .fields
                    .insert("payload".into(), Value::from("x".repeat(100 * 1024)));
            }
            let next = split(&state, &shards);
            let item = item_of(&next);
            let bytes = serde_json::to_vec(&item.idempotency).unwrap().len();
            assert!(
                bytes <= ITEM_LEDGER_BYTES + 4096,
                "after {n}: {bytes} bytes kept"
            );
            assert!(
                item.idempotency.contains_key(&key),
                "the newest result stays"
            );
            let back = join("p", &next).unwrap();
            assert_eq!(
                back.idempotency, state.idempotency,
                "nothing is lost after {n}"
            );
            shards = next;
        }
        assert!(claim_of(&shards, "renew-0000").is_archived());
    }

    #[test]
    fn a_crash_between_archiving_and_the_item_write_loses_and_repeats_nothing() {
        let mut shards = split(&one_item(), &BTreeMap::new());
        for n in 0..ITEM_LEDGER_HIGH {
            let mut state = join("p", &shards).unwrap();
            command(&mut state, "wi-1", n);
            shards = split(&state, &shards);
        }
        let mut state = join("p", &shards).unwrap();
        command(&mut state, "wi-1", ITEM_LEDGER_HIGH);
        let archived = split(&state, &shards);
        // Claims are written first: the new ones landed, the item write did not.
        let mut torn = shards.clone();
        for (id, v) in &archived {
            if id.0 == Kind::Key {
                torn.insert(id.clone(), v.clone());
            }
        }
        let joined = join("p", &torn).unwrap();
        let before = join("p", &shards).unwrap();
        assert_eq!(
            joined.idempotency, before.idempotency,
            "the command did not commit"
        );
        assert_eq!(joined.audit, before.audit, "no event twice, none lost");
        // The next write (here: a read-only pass) finishes the archiving
        // without touching the claims again.
        let retried = split(&joined, &torn);
        assert_eq!(item_of(&retried).idempotency.len(), ITEM_LEDGER_LOW - 1);
        for (id, v) in &retried {
            if id.0 == Kind::Key && torn.contains_key(id) {
                assert_eq!(&torn[id], v, "claim {id:?} rewritten");
            }
        }
    }

    #[test]
    fn a_claim_read_before_its_result_was_archived_is_stale() {
        let mut shards = split(&one_item(), &BTreeMap::new());
        for n in 0..=ITEM_LEDGER_HIGH {
            let mut state = join("p", &shards).unwrap();
            command(&mut state, "wi-1", n);
            let next = split(&state, &shards);
            if n < ITEM_LEDGER_HIGH {
                shards = next;
                continue;
            }
            // Old claim, archived item: the reader must read the claim again.
            let mut torn = next.clone();
            let key = (Kind::Key, "renew-0000".to_string());
            torn.insert(key.clone(), shards[&key].clone());
            assert_eq!(stale_claims(&torn), vec![key.clone()]);
            assert!(stale_claims(&next).is_empty(), "fresh claims are not stale");
            assert!(stale_claims(&shards).is_empty(), "nothing archived yet");
            // A claim from before sequence numbers counts as the oldest.
            let mut legacy = claim_of(&shards, "renew-0000");
            legacy.seq = None;
            torn.insert(key.clone(), to_value(&legacy));
            assert_eq!(stale_claims(&torn), vec![key.clone()]);
            // A claim whose result is still in the item is never stale.
            let live = (Kind::Key, format!("renew-{:04}", ITEM_LEDGER_HIGH - 1));
            let mut unsequenced = claim_of(&next, &live.1);
            unsequenced.seq = None;
            torn.insert(live, to_value(&unsequenced));
            assert_eq!(stale_claims(&torn), vec![key]);
            assert_eq!(
                archive_targets(&next).len(),
                ITEM_LEDGER_HIGH + 1 - ITEM_LEDGER_LOW
            );
        }
    }
}
