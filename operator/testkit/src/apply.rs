//! Server-side apply: merge an applied configuration into the live object for
//! one field manager, detect conflicts with other managers (reported by name),
//! honour `force`, and remove fields the manager stopped applying.

use serde_json::{Map, Value};

use crate::lists::{self, ListKind, ListTypes};
use crate::managed::{
    self, FieldSet, ManagedEntry, Scope, collides, display, get, owned_paths, read_entries,
    write_entries,
};

/// A field another manager owns with a different value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The other manager.
    pub manager: String,
    /// The field, rendered as `.spec.replicas`.
    pub field: String,
}

/// Restrict an applied object to what the scope may write (and ownable metadata).
fn scoped(applied: &Value, scope: Scope) -> Value {
    let mut out = Map::new();
    if let Some(map) = applied.as_object() {
        for (k, v) in map {
            if k == "metadata" {
                continue;
            }
            if scope.includes(k) {
                out.insert(k.clone(), v.clone());
            }
        }
        if let (Scope::Main { .. }, Some(meta)) = (scope, map.get("metadata")) {
            let mut m = Map::new();
            for k in ["labels", "annotations", "finalizers", "ownerReferences"] {
                if let Some(v) = meta.get(k) {
                    m.insert(k.to_owned(), v.clone());
                }
            }
            if !m.is_empty() {
                out.insert("metadata".to_owned(), Value::Object(m));
            }
        }
    }
    Value::Object(out)
}

/// Deep-merge maps; set and map lists merge element by element; scalars and
/// atomic lists are replaced.
fn merge_into(base: &mut Value, applied: &Value, path: &mut managed::Path, lt: &ListTypes) {
    match (base, applied) {
        (Value::Object(b), Value::Object(a)) => {
            for (k, v) in a {
                path.push(k.clone());
                match b.get_mut(k) {
                    Some(existing)
                        if (existing.is_object() && v.is_object())
                            || (existing.is_array() && v.is_array()) =>
                    {
                        merge_into(existing, v, path, lt)
                    }
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
                path.pop();
            }
        }
        (Value::Array(b), Value::Array(a)) => {
            let kind = lt.kind_at(path);
            if kind == ListKind::Atomic {
                *b = a.clone();
                return;
            }
            for item in a {
                let Some(seg) = lists::element_segment(&kind, item) else {
                    b.push(item.clone());
                    continue;
                };
                match lists::find_index(b, &seg) {
                    Some(i) if kind != ListKind::Set => {
                        path.push(seg);
                        if let Some(existing) = b.get_mut(i) {
                            merge_into(existing, item, path, lt);
                        }
                        path.pop();
                    }
                    Some(_) => {}
                    None => b.push(item.clone()),
                }
            }
        }
        (b, a) => *b = a.clone(),
    }
}

/// Inputs of one apply request.
#[derive(Debug, Clone, Copy)]
pub struct ApplyRequest<'a> {
    /// The applied configuration.
    pub applied: &'a Value,
    /// The `fieldManager` query parameter.
    pub manager: &'a str,
    /// The `force` query parameter.
    pub force: bool,
    /// Main resource or status subresource.
    pub scope: Scope,
    /// apiVersion recorded on the managedFields entry.
    pub api_version: &'a str,
    /// Timestamp recorded on the managedFields entry.
    pub now: &'a str,
    /// List semantics of the type.
    pub lists: &'a ListTypes,
}

/// Apply to `base` (the live object, or a skeleton when creating). Returns the
/// merged object with updated `managedFields`, or the conflicts.
pub fn apply(base: &Value, req: ApplyRequest<'_>) -> Result<Value, Vec<Conflict>> {
    let sub = req.scope.subresource();
    let applied = scoped(req.applied, req.scope);
    let new_set: FieldSet = owned_paths(
        &applied,
        Scope::Main {
            status_subresource: false,
        },
        req.lists,
    );
    let mut entries = read_entries(base);
    let is_mine = |e: &ManagedEntry| {
        e.manager == req.manager && e.operation == "Apply" && e.subresource.as_deref() == sub
    };

    let mut conflicts = Vec::new();
    let mut conflicting: Vec<(usize, managed::Path)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.manager == req.manager {
            continue;
        }
        for q in &e.fields {
            for p in new_set.iter().filter(|p| collides(p, q, &[&applied, base])) {
                let longer = if p.len() >= q.len() { p } else { q };
                if get(&applied, longer) != get(base, longer) {
                    conflicting.push((i, q.clone()));
                    let c = Conflict {
                        manager: e.manager.clone(),
                        field: display(p),
                    };
                    if !conflicts.contains(&c) {
                        conflicts.push(c);
                    }
                }
            }
        }
    }
    if !conflicts.is_empty() && !req.force {
        return Err(conflicts);
    }
    for (i, q) in conflicting {
        if let Some(e) = entries.get_mut(i) {
            e.fields.remove(&q);
        }
    }

    let mut out = base.clone();
    let previous: FieldSet = entries
        .iter()
        .find(|e| is_mine(e))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    for dropped in previous.difference(&new_set) {
        let owned_elsewhere = entries
            .iter()
            .filter(|e| !is_mine(e))
            .any(|e| e.fields.iter().any(|q| collides(q, dropped, &[base])));
        if !owned_elsewhere {
            managed::remove(&mut out, dropped);
        }
    }
    merge_into(&mut out, &applied, &mut Vec::new(), req.lists);

    match entries.iter_mut().find(|e| is_mine(e)) {
        Some(e) => {
            // Re-applying the same configuration changes nothing, not even the
            // timestamp: a no-op apply must not produce a new resourceVersion.
            if e.fields != new_set || e.api_version != req.api_version {
                e.time = req.now.to_owned();
            }
            e.fields = new_set;
            e.api_version = req.api_version.to_owned();
        }
        None => entries.push(ManagedEntry {
            manager: req.manager.to_owned(),
            operation: "Apply".to_owned(),
            subresource: sub.map(str::to_owned),
            api_version: req.api_version.to_owned(),
            time: req.now.to_owned(),
            fields: new_set,
        }),
    }
    write_entries(&mut out, entries);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    static LT: ListTypes = ListTypes::empty();

    #[test]
    fn two_managers_apply_their_own_finalizers_without_conflict() {
        let base = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"}});
        let a = json!({"metadata": {"finalizers": ["a.example/x"]}});
        let obj = apply(&base, req(&a, "alice", false)).unwrap();
        let b = json!({"metadata": {"finalizers": ["b.example/y"]}});
        let obj = apply(&obj, req(&b, "bob", false)).unwrap();
        assert_eq!(
            obj["metadata"]["finalizers"],
            json!(["a.example/x", "b.example/y"])
        );
        // alice drops hers: only hers goes.
        let none = json!({"metadata": {}});
        let obj = apply(&obj, req(&none, "alice", false)).unwrap();
        assert_eq!(obj["metadata"]["finalizers"], json!(["b.example/y"]));
    }

    fn req<'a>(applied: &'a Value, manager: &'a str, force: bool) -> ApplyRequest<'a> {
        ApplyRequest {
            applied,
            manager,
            force,
            scope: Scope::Main {
                status_subresource: true,
            },
            api_version: "v1",
            now: "2026-01-01T00:00:00Z",
            lists: &LT,
        }
    }

    #[test]
    fn second_manager_conflicts_then_forces_and_takes_ownership() {
        let base = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"}});
        let a = json!({"spec": {"replicas": 1, "image": "x"}});
        let obj = apply(&base, req(&a, "alice", false)).unwrap();
        let b = json!({"spec": {"replicas": 2}});
        let err = apply(&obj, req(&b, "bob", false)).unwrap_err();
        assert_eq!(
            err,
            vec![Conflict {
                manager: "alice".into(),
                field: ".spec.replicas".into()
            }]
        );
        // Same value: shared ownership, no conflict.
        let same = json!({"spec": {"replicas": 1}});
        assert!(apply(&obj, req(&same, "bob", false)).is_ok());
        let forced = apply(&obj, req(&b, "bob", true)).unwrap();
        assert_eq!(forced["spec"]["replicas"], 2);
        let alice = read_entries(&forced)
            .into_iter()
            .find(|e| e.manager == "alice")
            .unwrap();
        assert!(
            !alice
                .fields
                .contains(&vec!["spec".to_owned(), "replicas".to_owned()])
        );
    }

    #[test]
    fn owning_an_empty_map_does_not_conflict_with_keys_inside_it() {
        let mut base =
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {}});
        crate::managed::record_update(
            None,
            &mut base,
            "creator",
            Scope::Main {
                status_subresource: false,
            },
            "v1",
            "t",
            &ListTypes::default(),
        );
        let a = json!({"data": {"k": "v"}});
        let out = apply(&base, req(&a, "ctrl", false)).unwrap();
        assert_eq!(out["data"]["k"], "v");
    }

    #[test]
    fn reapplying_the_same_configuration_keeps_managed_fields_identical() {
        let base = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"}});
        let a = json!({"spec": {"replicas": 1}});
        let first = apply(&base, req(&a, "alice", false)).unwrap();
        let later = ApplyRequest {
            now: "2030-01-01T00:00:00Z",
            ..req(&a, "alice", false)
        };
        assert_eq!(apply(&first, later).unwrap(), first);
    }

    #[test]
    fn fields_no_longer_applied_are_removed_unless_someone_else_owns_them() {
        let base = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"}});
        let a = json!({"spec": {"replicas": 1, "image": "x"}});
        let obj = apply(&base, req(&a, "alice", false)).unwrap();
        let a2 = json!({"spec": {"replicas": 1}});
        let obj = apply(&obj, req(&a2, "alice", false)).unwrap();
        assert!(obj["spec"].get("image").is_none());
    }
}
