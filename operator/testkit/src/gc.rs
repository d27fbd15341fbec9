//! Controllers that run inside the store after every write, until nothing changes:
//! finalization (remove objects whose `deletionTimestamp` is set and whose
//! finalizers are empty), owner-reference garbage collection (background,
//! foreground with `blockOwnerDeletion`, orphan) and namespace termination.
//!
//! The real garbage collector is asynchronous; this one runs synchronously under
//! the store lock, which is a stricter (earlier) version of "eventually".

use std::collections::BTreeSet;

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
        let Some(action) = next_action(state) else {
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
