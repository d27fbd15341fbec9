//! The object store: objects as `serde_json::Value` keyed by (group, plural,
//! namespace, name), a global monotonically increasing `resourceVersion`, and a
//! bounded event history for watches. The write rules live in `write`
//! (create/replace/patch/apply), `delete` and `admission` (validation, defaults,
//! isolation); garbage collection in `gc`, which runs after each write.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use serde_json::{Map, Value, json};

pub use crate::{
    delete::{DeleteOptions, Propagation},
    write::{PatchKind, Writer},
};
use crate::{
    error::ApiError,
    resources::{ResourceType, TypeRegistry},
    selector::{FieldSelector, LabelSelector},
};

/// Identity of a stored object. Objects are stored once per group/plural (at the
/// storage version) and converted on the way out, like a CRD with `conversion: None`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// API group.
    pub group: String,
    /// Plural resource name.
    pub plural: String,
    /// Namespace; empty for cluster-scoped objects.
    pub namespace: String,
    /// Object name.
    pub name: String,
}

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// `ADDED`
    Added,
    /// `MODIFIED`
    Modified,
    /// `DELETED`
    Deleted,
}

/// One change in the history.
#[derive(Debug, Clone)]
pub struct Event {
    /// The resourceVersion this change produced.
    pub rv: u64,
    /// Which object changed.
    pub key: ObjectKey,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (the last state for `DELETED`).
    pub object: Value,
    /// The object before the change, for selector transitions.
    pub old: Option<Value>,
}

static UID_SEQ: AtomicU64 = AtomicU64::new(1);

/// The current time as the API server renders it (RFC 3339, seconds).
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

pub(crate) fn new_uid() -> String {
    let seq = UID_SEQ.fetch_add(1, Ordering::Relaxed);
    format!("7e57c1a0-0000-4000-8000-{seq:012x}")
}

pub(crate) fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = UID_SEQ
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

pub(crate) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        // Unreachable: the branch above guarantees an object.
        _ => unreachable_metadata(),
    }
}

#[allow(clippy::panic)]
fn unreachable_metadata() -> ! {
    panic!("metadata was just set to an object")
}

/// `metadata.finalizers` as strings.
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn set_finalizers(obj: &mut Value, fins: &[String]) {
    let meta = meta_mut(obj);
    if fins.is_empty() {
        meta.remove("finalizers");
    } else {
        meta.insert("finalizers".to_owned(), json!(fins));
    }
}

/// The state behind the server's lock.
#[derive(Debug)]
pub struct State {
    pub(crate) rv: u64,
    /// Served types.
    pub types: TypeRegistry,
    pub(crate) objects: BTreeMap<ObjectKey, Value>,
    pub(crate) history: VecDeque<Arc<Event>>,
    pub(crate) history_limit: usize,
    pub(crate) compacted_rv: u64,
    /// Whether a simulated kubelet finishes graceful pod deletions.
    pub kubelet_attached: bool,
    /// What the garbage collector needs to know without scanning every object.
    pub(crate) gc_index: crate::gc::GcIndex,
}

impl State {
    /// Empty state with the built-in types and a bounded history.
    pub fn new(history_limit: usize) -> Self {
        Self {
            rv: 1,
            types: TypeRegistry::with_builtins(),
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted_rv: 0,
            kubelet_attached: false,
            gc_index: crate::gc::GcIndex::default(),
        }
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// The newest resourceVersion no longer in the watch history.
    pub fn compacted_rv(&self) -> u64 {
        self.compacted_rv
    }

    /// Events with a resourceVersion above `after` for one group/plural, or 410
    /// when `after` is older than the retained history.
    pub fn events_since(
        &self,
        after: u64,
        group: &str,
        plural: &str,
    ) -> Result<Vec<Arc<Event>>, ApiError> {
        if after < self.compacted_rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {after} ({})",
                self.compacted_rv + 1
            )));
        }
        Ok(self
            .history
            .iter()
            .filter(|e| e.rv > after && e.key.group == group && e.key.plural == plural)
            .cloned()
            .collect())
    }

    /// The stored object, if any.
    pub fn object(&self, key: &ObjectKey) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Every stored object with its key.
    pub fn objects(&self) -> impl Iterator<Item = (&ObjectKey, &Value)> {
        self.objects.iter()
    }

    pub(crate) fn key(rt: &ResourceType, namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            group: rt.group.clone(),
            plural: rt.plural.clone(),
            namespace: if rt.namespaced {
                namespace.to_owned()
            } else {
                String::new()
            },
            name: name.to_owned(),
        }
    }

    /// Look an object up by type and name.
    pub fn get(&self, rt: &ResourceType, namespace: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&Self::key(rt, namespace, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// Matching objects in key order, and the list resourceVersion.
    pub fn list(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> (Vec<(ObjectKey, Value)>, u64) {
        let items = self
            .objects
            .iter()
            .filter(|(k, _)| k.group == rt.group && k.plural == rt.plural)
            .filter(|(k, _)| namespace.is_none_or(|ns| k.namespace == ns))
            .filter(|(_, v)| labels.matches(v) && fields.matches(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        (items, self.rv)
    }

    pub(crate) fn record(
        &mut self,
        key: ObjectKey,
        kind: EventType,
        object: Value,
        old: Option<Value>,
    ) {
        self.history.push_back(Arc::new(Event {
            rv: self.rv,
            key,
            kind,
            object,
            old,
        }));
        while self.history.len() > self.history_limit {
            if let Some(e) = self.history.pop_front() {
                self.compacted_rv = e.rv;
            }
        }
    }

    /// Persist `obj` under `key` with a new resourceVersion and record the event.
    pub(crate) fn commit(&mut self, key: ObjectKey, mut obj: Value) -> Value {
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".to_owned(), json!(self.rv.to_string()));
        let old = self.objects.insert(key.clone(), obj.clone());
        self.gc_index.stored(&key, old.as_ref(), &obj);
        let kind = if old.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(key, kind, obj.clone(), old);
        obj
    }

    /// Remove an object for good, recording `DELETED`.
    pub fn remove(&mut self, key: &ObjectKey) -> Option<Value> {
        let mut obj = self.objects.remove(key)?;
        self.gc_index.removed(key, &obj);
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".to_owned(), json!(self.rv.to_string()));
        if key.group == "apiextensions.k8s.io" && key.plural == "customresourcedefinitions" {
            self.unregister_crd(&obj);
        }
        self.record(key.clone(), EventType::Deleted, obj.clone(), None);
        Some(obj)
    }

    fn unregister_crd(&mut self, crd: &Value) {
        let (Some(group), Some(plural)) = (
            crd.pointer("/spec/group").and_then(Value::as_str),
            crd.pointer("/spec/names/plural").and_then(Value::as_str),
        ) else {
            return;
        };
        let (group, plural) = (group.to_owned(), plural.to_owned());
        self.types.remove(&group, &plural);
        let keys: Vec<ObjectKey> = self
            .objects
            .keys()
            .filter(|k| k.group == group && k.plural == plural)
            .cloned()
            .collect();
        for k in keys {
            self.remove(&k);
        }
    }

    /// Internal write used by controllers inside the double (kubelet, GC):
    /// replaces the stored object as is, bumping the resourceVersion.
    pub fn internal_update(&mut self, key: &ObjectKey, obj: Value) -> Option<Value> {
        let current = self.objects.get(key)?;
        if *current == obj {
            // Nothing changed: no new resourceVersion, no watch event.
            return Some(obj);
        }
        let stored = self.commit(key.clone(), obj);
        crate::gc::collect(self);
        Some(stored)
    }

    /// Replace a stored object without running the garbage collector.
    pub fn internal_update_no_gc(&mut self, key: &ObjectKey, obj: Value) -> Option<Value> {
        let current = self.objects.get(key)?;
        if *current == obj {
            return Some(obj);
        }
        Some(self.commit(key.clone(), obj))
    }

    /// Look up the type of a stored object key.
    pub fn type_of(&self, key: &ObjectKey) -> Option<ResourceType> {
        self.types
            .all()
            .find(|t| t.group == key.group && t.plural == key.plural)
            .cloned()
    }
}
