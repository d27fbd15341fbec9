//! Controllers that run inside the store after every write, until nothing changes:
//! finalization (remove objects whose `deletionTimestamp` is set and whose
//! finalizers are empty), owner-reference garbage collection (background,
//! foreground with `blockOwnerDeletion`, orphan) and namespace termination.
//!
//! The real garbage collector is asynchronous; this one runs synchronously under
//! the store lock, which is a stricter (earlier) version of "eventually".
//!
//! While nothing is being deleted, the only thing that can need collecting is
//! an object whose owners are all gone, and only objects written since the
//! last run (or whose owner was just removed) can have become one: the
//! [`GcIndex`] tracks those, live uids and deleting objects, so a write costs
//! the same on a store of ten objects and of ten thousand. Anything deleting
//! falls back to scanning every object until the store is quiet again.

use std::collections::{BTreeSet, HashMap};

use serde_json::{Value, json};

use crate::store::{DeleteOptions, ObjectKey, State, finalizers};

const MAX_ROUNDS: usize = 1000;

fn uid(obj: &Value) -> Option<&str> {
    obj.pointer("/metadata/uid").and_then(Value::as_str)
}

fn deleting(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp").is_some()
}

fn owner_refs(obj: &Value) -> Vec<Value> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn owner_uids(obj: &Value) -> Vec<String> {
    owner_refs(obj)
        .iter()
        .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// Incrementally maintained facts the collector's quiet-store fast path needs.
#[derive(Debug, Default)]
pub(crate) struct GcIndex {
    /// Live uids and the object holding each.
    uids: HashMap<String, ObjectKey>,
    /// Objects with a `deletionTimestamp`.
    deleting: BTreeSet<ObjectKey>,
    /// Objects by the uid of each of their owners.
    dependents: HashMap<String, BTreeSet<ObjectKey>>,
    /// Objects whose owners may all be gone.
    dirty: BTreeSet<ObjectKey>,
}

impl GcIndex {
    fn forget(&mut self, key: &ObjectKey, obj: &Value) {
        if let Some(u) = uid(obj)
            && self.uids.get(u) == Some(key)
        {
            self.uids.remove(u);
        }
        self.deleting.remove(key);
        for owner in owner_uids(obj) {
            if let Some(deps) = self.dependents.get_mut(&owner) {
                deps.remove(key);
                if deps.is_empty() {
                    self.dependents.remove(&owner);
                }
            }
        }
    }

    /// `key` now holds `obj` (it held `old`).
    pub(crate) fn stored(&mut self, key: &ObjectKey, old: Option<&Value>, obj: &Value) {
        if let Some(old) = old {
            self.forget(key, old);
        }
        if let Some(u) = uid(obj) {
            self.uids.insert(u.to_owned(), key.clone());
        }
        if deleting(obj) {
            self.deleting.insert(key.clone());
        }
        let owners = owner_uids(obj);
        for owner in &owners {
            self.dependents
                .entry(owner.clone())
                .or_default()
                .insert(key.clone());
        }
        if !owners.is_empty() {
            self.dirty.insert(key.clone());
        }
    }

    /// `key` (which held `obj`) is gone: its dependents may be orphans now.
    pub(crate) fn removed(&mut self, key: &ObjectKey, obj: &Value) {
        self.forget(key, obj);
        self.dirty.remove(key);
        if let Some(u) = uid(obj)
            && let Some(deps) = self.dependents.get(u)
        {
            self.dirty.extend(deps.iter().cloned());
        }
    }
}

/// The quiet-store fast path: an object written since the last run whose
/// owners are all gone.
fn next_orphan(state: &mut State) -> Option<Action> {
    while let Some(key) = state.gc_index.dirty.pop_first() {
        let Some(obj) = state.object(&key) else {
            continue;
        };
        let owners = owner_uids(obj);
        if !deleting(obj)
            && !owners.is_empty()
            && owners
                .iter()
                .all(|u| !state.gc_index.uids.contains_key(u.as_str()))
        {
            return Some(Action::Delete(key));
        }
    }
    None
}

/// One change the collector wants to make.
enum Action {
    Remove(ObjectKey),
    Delete(ObjectKey),
    Update(ObjectKey, Value),
}

fn without_finalizer(obj: &Value, finalizer: &str) -> Value {
    let mut out = obj.clone();
    let fins: Vec<String> = finalizers(obj)
        .into_iter()
        .filter(|f| f != finalizer)
        .collect();
    if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        if fins.is_empty() {
            meta.remove("finalizers");
        } else {
            meta.insert("finalizers".to_owned(), json!(fins));
        }
    }
    out
}

fn pending_pod_kill(key: &ObjectKey, obj: &Value) -> bool {
    key.group.is_empty()
        && key.plural == "pods"
        && obj
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            > 0
}

fn next_action(state: &State) -> Option<Action> {
    let live_uids: BTreeSet<&str> = state.objects().filter_map(|(_, o)| uid(o)).collect();
    for (key, obj) in state.objects() {
        if !deleting(obj) {
            // Background collection: every owner is gone.
            let owners = owner_uids(obj);
            if !owners.is_empty() && owners.iter().all(|u| !live_uids.contains(u.as_str())) {
                return Some(Action::Delete(key.clone()));
            }
            continue;
        }
        let fins = finalizers(obj);
        let is_ns = key.group.is_empty() && key.plural == "namespaces";
        if is_ns {
            let contents: Vec<&ObjectKey> = state
                .objects()
                .map(|(k, _)| k)
                .filter(|k| k.namespace == key.name)
                .collect();
            if let Some(k) = contents
                .iter()
                .find(|k| state.object(k).is_some_and(|o| !deleting(o)))
            {
                return Some(Action::Delete((*k).clone()));
            }
            let spec_fins = obj
                .pointer("/spec/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty());
            if contents.is_empty() && spec_fins {
                let mut out = obj.clone();
                out["spec"]["finalizers"] = json!([]);
                return Some(Action::Update(key.clone(), out));
            }
            if !contents.is_empty() || spec_fins {
                continue;
            }
        }
        if fins.is_empty() {
            if pending_pod_kill(key, obj) {
                continue;
            }
            return Some(Action::Remove(key.clone()));
        }
        let Some(owner_uid) = uid(obj) else { continue };
        let dependents: Vec<(&ObjectKey, &Value)> = state
            .objects()
            .filter(|(_, o)| owner_uids(o).iter().any(|u| u == owner_uid))
            .collect();
        if fins.iter().any(|f| f == "orphan") {
            if let Some((k, dep)) = dependents.first() {
                let mut out = (*dep).clone();
                let refs: Vec<Value> = owner_refs(dep)
                    .into_iter()
                    .filter(|r| r.get("uid").and_then(Value::as_str) != Some(owner_uid))
                    .collect();
                if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
                    if refs.is_empty() {
                        meta.remove("ownerReferences");
                    } else {
                        meta.insert("ownerReferences".to_owned(), json!(refs));
                    }
                }
                return Some(Action::Update((*k).clone(), out));
            }
            return Some(Action::Update(
                key.clone(),
                without_finalizer(obj, "orphan"),
            ));
        }
        if fins.iter().any(|f| f == "foregroundDeletion") {
            if let Some((k, _)) = dependents.iter().find(|(_, d)| !deleting(d)) {
                return Some(Action::Delete((*k).clone()));
            }
            let blocking = dependents.iter().any(|(_, d)| {
                owner_refs(d).iter().any(|r| {
                    r.get("uid").and_then(Value::as_str) == Some(owner_uid)
                        && r.get("blockOwnerDeletion").and_then(Value::as_bool) == Some(true)
                })
            });
            if !blocking {
                return Some(Action::Update(
                    key.clone(),
                    without_finalizer(obj, "foregroundDeletion"),
                ));
            }
        }
    }
    None
}

/// Run the collector to a fixed point.
pub fn collect(state: &mut State) {
    for _ in 0..MAX_ROUNDS {
        let action = if state.gc_index.deleting.is_empty() {
            next_orphan(state)
        } else {
            // A full scan sees every orphan too.
            let action = next_action(state);
            if action.is_none() {
                state.gc_index.dirty.clear();
            }
            action
        };
        let Some(action) = action else {
            return;
        };
        match action {
            Action::Remove(key) => {
                state.remove(&key);
            }
            Action::Update(key, obj) => {
                state.internal_update_no_gc(&key, obj);
            }
            Action::Delete(key) => {
                let Some(rt) = state.type_of(&key) else {
                    state.remove(&key);
                    continue;
                };
                let opts = DeleteOptions {
                    grace_period_seconds: Some(0),
                    ..DeleteOptions::default()
                };
                if state
                    .delete_no_gc(&rt, &key.namespace, &key.name, &opts)
                    .is_err()
                {
                    state.remove(&key);
                }
            }
        }
    }
    tracing::warn!("testkit garbage collector did not converge in {MAX_ROUNDS} rounds");
}
