//! Field ownership for server-side apply: leaf field paths, their `FieldsV1`
//! encoding in `metadata.managedFields`, and the bookkeeping for non-apply
//! updates (changed fields move to the updater, as in the real server).
//!
//! Lists follow [`ListTypes`]: atomic lists are owned as a whole (the CRD
//! default), set and map lists element by element.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::lists::{self, ListKind, ListTypes};

/// A field path, e.g. `["spec", "replicas"]`.
pub type Path = Vec<String>;
/// The set of leaf paths a manager owns.
pub type FieldSet = BTreeSet<Path>;

/// Which part of an object a write is allowed to touch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main resource; `status` excluded when the type has a status subresource.
    Main {
        /// Whether the type has a status subresource.
        status_subresource: bool,
    },
    /// The `status` subresource.
    Status,
}

impl Scope {
    /// Whether a top-level key belongs to this scope.
    pub fn includes(self, key: &str) -> bool {
        match self {
            Scope::Status => key == "status",
            Scope::Main { status_subresource } => {
                !(matches!(key, "apiVersion" | "kind") || (status_subresource && key == "status"))
            }
        }
    }

    /// The `subresource` recorded on managedFields entries.
    pub fn subresource(self) -> Option<&'static str> {
        match self {
            Scope::Status => Some("status"),
            Scope::Main { .. } => None,
        }
    }
}

/// Metadata fields a manager can own.
const OWNABLE_METADATA: [&str; 4] = ["labels", "annotations", "finalizers", "ownerReferences"];

fn leaves(v: &Value, prefix: &mut Path, out: &mut FieldSet, lt: &ListTypes) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                prefix.push(k.clone());
                leaves(child, prefix, out, lt);
                prefix.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let kind = lt.kind_at(prefix);
            if kind == ListKind::Atomic {
                out.insert(prefix.clone());
                return;
            }
            for item in items {
                let Some(seg) = lists::element_segment(&kind, item) else {
                    // An element without its keys cannot be owned on its own.
                    out.insert(prefix.clone());
                    continue;
                };
                prefix.push(seg);
                leaves(item, prefix, out, lt);
                prefix.pop();
            }
        }
        _ => {
            out.insert(prefix.clone());
        }
    }
}

/// The ownable leaf paths of an object within a scope.
pub fn owned_paths(obj: &Value, scope: Scope, lt: &ListTypes) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(map) = obj.as_object() else {
        return out;
    };
    for (key, child) in map {
        if !scope.includes(key) {
            continue;
        }
        if key == "metadata" {
            if let Some(meta) = child.as_object() {
                for k in OWNABLE_METADATA {
                    if let Some(v) = meta.get(k) {
                        let mut prefix = vec!["metadata".to_owned(), k.to_owned()];
                        leaves(v, &mut prefix, &mut out, lt);
                    }
                }
            }
            continue;
        }
        let mut prefix = vec![key.clone()];
        leaves(child, &mut prefix, &mut out, lt);
    }
    out
}

fn step<'a>(cur: &'a Value, seg: &str) -> Option<&'a Value> {
    if lists::is_element(seg) {
        let items = cur.as_array()?;
        items.get(lists::find_index(items, seg)?)
    } else {
        cur.get(seg)
    }
}

fn step_mut<'a>(cur: &'a mut Value, seg: &str) -> Option<&'a mut Value> {
    if lists::is_element(seg) {
        let items = cur.as_array_mut()?;
        let i = lists::find_index(items, seg)?;
        items.get_mut(i)
    } else {
        cur.get_mut(seg)
    }
}

/// The value at a path (field names and list elements).
pub fn get<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, k| step(cur, k))
}

/// Remove the value at a path, and any maps or lists left empty on the way up.
pub fn remove(v: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = &mut *v;
    for k in parents {
        match step_mut(cur, k) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if lists::is_element(last) {
        if let Some(items) = cur.as_array_mut()
            && let Some(i) = lists::find_index(items, last)
        {
            items.remove(i);
        }
    } else if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
    let emptied = get(v, parents).is_some_and(|p| {
        p.as_object().is_some_and(Map::is_empty) || p.as_array().is_some_and(Vec::is_empty)
    });
    if !parents.is_empty() && emptied {
        remove(v, parents);
    }
}

/// Whether one path is a prefix of the other.
pub fn overlaps(a: &[String], b: &[String]) -> bool {
    let n = a.len().min(b.len());
    a[..n] == b[..n]
}

/// Whether two owned paths collide: the same path, or a prefix whose value is
/// atomic (a scalar or list) in one of `docs`. A manager owning a map field
/// (`f:data: {}`) does not collide with another owning a key inside it, as in
/// structured-merge-diff.
pub fn collides(a: &[String], b: &[String], docs: &[&Value]) -> bool {
    if a == b {
        return true;
    }
    if !overlaps(a, b) {
        return false;
    }
    let shorter = if a.len() < b.len() { a } else { b };
    docs.iter()
        .any(|d| get(d, shorter).is_some_and(|v| !v.is_object()))
}

/// Render a path as the API server does in conflict messages:
/// `.spec.replicas`, `.metadata.finalizers[="x"]`, `.spec.containers[name="a"].image`.
pub fn display(path: &[String]) -> String {
    path.iter().map(|k| lists::display_segment(k)).collect()
}

/// Leaf paths whose value differs between `old` and `new` (within a scope).
pub fn changed_paths(old: Option<&Value>, new: &Value, scope: Scope, lt: &ListTypes) -> FieldSet {
    let new_paths = owned_paths(new, scope, lt);
    let Some(old) = old else {
        return new_paths;
    };
    let old_paths = owned_paths(old, scope, lt);
    new_paths
        .iter()
        .filter(|p| get(old, p) != get(new, p))
        .chain(old_paths.iter().filter(|p| get(new, p).is_none()))
        .cloned()
        .collect()
}

/// Encode a field set as `FieldsV1` (`{"f:spec":{"f:replicas":{}}}`).
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for k in path {
            let entry = cur
                .entry(lists::fields_v1_key(k))
                .or_insert_with(|| Value::Object(Map::new()));
            match entry {
                Value::Object(m) => cur = m,
                _ => break,
            }
        }
    }
    Value::Object(root)
}

/// Decode `FieldsV1`; keys other than `f:` (such as `k:` list keys or `.`) are ignored.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn walk(v: &Value, prefix: &mut Path, out: &mut FieldSet) {
        let children: Vec<(String, &Value)> = v
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, c)| lists::segment_of_fields_v1_key(k).map(|s| (s, c)))
                    .collect()
            })
            .unwrap_or_default();
        if children.is_empty() {
            if !prefix.is_empty() {
                out.insert(prefix.clone());
            }
            return;
        }
        for (k, child) in children {
            prefix.push(k);
            walk(child, prefix, out);
            prefix.pop();
        }
    }
    let mut out = FieldSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagedEntry {
    /// Field manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// `status` for status-subresource writes.
    pub subresource: Option<String>,
    /// The apiVersion the fields were written at.
    pub api_version: String,
    /// When the entry last changed.
    pub time: String,
    /// The owned leaf paths.
    pub fields: FieldSet,
}

impl ManagedEntry {
    fn same_slot(&self, manager: &str, operation: &str, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == subresource
    }
}

/// Read the entries from `metadata.managedFields`.
pub fn read_entries(obj: &Value) -> Vec<ManagedEntry> {
    let Some(list) = obj
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    list.iter()
        .map(|e| {
            let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
            ManagedEntry {
                manager: s("manager"),
                operation: s("operation"),
                subresource: e
                    .get("subresource")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                api_version: s("apiVersion"),
                time: s("time"),
                fields: e.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
            }
        })
        .collect()
}

/// Write entries back, dropping empty ones and paths the object no longer has.
pub fn write_entries(obj: &mut Value, entries: Vec<ManagedEntry>) {
    let list: Vec<Value> = entries
        .into_iter()
        .map(|mut e| {
            e.fields.retain(|p| get(obj, p).is_some());
            e
        })
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if let Some(sub) = e.subresource {
                v["subresource"] = json!(sub);
            }
            v
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".to_owned(), Value::Array(list));
        }
    }
}

/// Record a non-apply write (create, update, patch) by `manager`: the fields it
/// changed move to its `Update` entry and leave every other manager.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    scope: Scope,
    api_version: &str,
    now: &str,
    lt: &ListTypes,
) {
    let changed = changed_paths(old, new, scope, lt);
    let mut entries = old.map(read_entries).unwrap_or_default();
    if changed.is_empty() {
        write_entries(new, entries);
        return;
    }
    let sub = scope.subresource();
    let docs: Vec<&Value> = old.into_iter().chain(std::iter::once(&*new)).collect();
    for e in entries.iter_mut() {
        if !e.same_slot(manager, "Update", sub) {
            e.fields
                .retain(|p| !changed.iter().any(|c| collides(p, c, &docs)));
        }
    }
    match entries
        .iter_mut()
        .find(|e| e.same_slot(manager, "Update", sub))
    {
        Some(e) => {
            e.fields.extend(changed);
            e.time = now.to_owned();
            e.api_version = api_version.to_owned();
        }
        None => entries.push(ManagedEntry {
            manager: manager.to_owned(),
            operation: "Update".to_owned(),
            subresource: sub.map(str::to_owned),
            api_version: api_version.to_owned(),
            time: now.to_owned(),
            fields: changed,
        }),
    }
    write_entries(new, entries);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Path {
        s.split('.').map(str::to_owned).collect()
    }

    #[test]
    fn fields_v1_round_trips() {
        let set: FieldSet = [
            p("spec.replicas"),
            p("spec.image"),
            p("metadata.labels.app"),
        ]
        .into_iter()
        .collect();
        let v = to_fields_v1(&set);
        assert_eq!(v["f:spec"]["f:replicas"], json!({}));
        assert_eq!(from_fields_v1(&v), set);
    }

    #[test]
    fn owned_paths_skip_system_metadata_and_isolated_status() {
        let obj = json!({
            "apiVersion": "v1", "kind": "X",
            "metadata": {"name": "a", "uid": "u", "labels": {"a": "b"}},
            "spec": {"x": 1, "list": [1, 2]},
            "status": {"ready": true}
        });
        let lt = ListTypes::default();
        let main = owned_paths(
            &obj,
            Scope::Main {
                status_subresource: true,
            },
            &lt,
        );
        let want: FieldSet = [p("metadata.labels.a"), p("spec.x"), p("spec.list")]
            .into_iter()
            .collect();
        assert_eq!(main, want);
        let status = owned_paths(&obj, Scope::Status, &lt);
        assert_eq!(status, [p("status.ready")].into_iter().collect());
    }
}
