//! The object store: objects as `serde_json::Value` keyed by (group, plural,
//! namespace, name), a global monotonically increasing `resourceVersion`, a bounded
//! event history for watches, and every write rule of the real registry
//! (preconditions, status isolation, generation, finalizers, validation).
//! Garbage collection lives in [`crate::gc`] and runs after each write.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use serde_json::{Map, Value, json};

use crate::{
    apply::{self, ApplyRequest},
    error::{ApiError, Cause},
    managed::{self, Scope},
    resources::{self, ResourceType, TypeRegistry},
    schema,
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

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
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

/// How dependents are treated on delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    /// Owner goes now; the garbage collector deletes dependents.
    #[default]
    Background,
    /// Owner waits (finalizer `foregroundDeletion`) until blocking dependents are gone.
    Foreground,
    /// Dependents lose their owner reference (finalizer `orphan`).
    Orphan,
}

/// Options of a delete request.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `propagationPolicy`.
    pub propagation: Option<Propagation>,
    /// `gracePeriodSeconds`.
    pub grace_period_seconds: Option<i64>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
}

/// How a patch body is interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/strategic-merge-patch+json`, approximated by a merge patch.
    StrategicMerge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply {
        /// `force=true`.
        force: bool,
    },
}

static UID_SEQ: AtomicU64 = AtomicU64::new(1);

/// The current time as the API server renders it (RFC 3339, seconds).
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn new_uid() -> String {
    let seq = UID_SEQ.fetch_add(1, Ordering::Relaxed);
    format!("7e57c1a0-0000-4000-8000-{seq:012x}")
}

fn random_suffix() -> String {
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

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
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

fn set_finalizers(obj: &mut Value, fins: &[String]) {
    let meta = meta_mut(obj);
    if fins.is_empty() {
        meta.remove("finalizers");
    } else {
        meta.insert("finalizers".to_owned(), json!(fins));
    }
}

/// Apply an RFC 6902 patch the way the API server's JSON-patch library does:
/// a `test` for `null` succeeds on a missing path (kube-runtime's `finalizer()`
/// relies on this to add the first finalizer).
fn apply_json_patch(doc: &mut Value, ops: &json_patch::Patch) -> Result<(), ApiError> {
    for op in ops.iter() {
        if let json_patch::PatchOperation::Test(t) = op
            && t.value.is_null()
            && doc.pointer(t.path.as_str()).is_none()
        {
            continue;
        }
        json_patch::patch(doc, std::slice::from_ref(op)).map_err(|e| {
            ApiError::new(
                422,
                "Invalid",
                format!("the server rejected our request due to an error in our request: {e}"),
            )
        })?;
    }
    Ok(())
}

/// Whether `name` is a lowercase RFC 1123 subdomain.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The state behind the server's lock.
#[derive(Debug)]
pub struct State {
    rv: u64,
    /// Served types.
    pub types: TypeRegistry,
    objects: BTreeMap<ObjectKey, Value>,
    history: VecDeque<Arc<Event>>,
    history_limit: usize,
    compacted_rv: u64,
    /// Whether a simulated kubelet finishes graceful pod deletions.
    pub kubelet_attached: bool,
}

/// Who writes and how.
#[derive(Debug, Clone)]
pub struct Writer<'a> {
    /// Field manager for managedFields.
    pub manager: &'a str,
    /// Main resource or status subresource.
    pub scope: Scope,
    /// `dryRun=All`: validate and compute, but do not persist.
    pub dry_run: bool,
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

    fn key(rt: &ResourceType, namespace: &str, name: &str) -> ObjectKey {
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

    fn record(&mut self, key: ObjectKey, kind: EventType, object: Value, old: Option<Value>) {
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
    fn commit(&mut self, key: ObjectKey, mut obj: Value) -> Value {
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".to_owned(), json!(self.rv.to_string()));
        let old = self.objects.insert(key.clone(), obj.clone());
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

    fn check_namespace(&self, rt: &ResourceType, namespace: &str) -> Result<(), ApiError> {
        if !rt.namespaced {
            return Ok(());
        }
        let ns_key = ObjectKey {
            group: String::new(),
            plural: "namespaces".to_owned(),
            namespace: String::new(),
            name: namespace.to_owned(),
        };
        match self.objects.get(&ns_key) {
            None => Err(ApiError::new(
                404,
                "NotFound",
                format!("namespaces \"{namespace}\" not found"),
            )),
            Some(ns) if ns.pointer("/metadata/deletionTimestamp").is_some() => Err(ApiError::new(
                403,
                "Forbidden",
                format!(
                    "{} is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
                    rt.qualified()
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    /// Validate a custom resource (prune, default, check) or the name of any object.
    fn validate(&self, rt: &ResourceType, version: &str, obj: &mut Value) -> Result<(), ApiError> {
        let name = meta_str(obj, "name").unwrap_or("").to_owned();
        let mut causes = Vec::new();
        if !valid_name(&name) {
            causes.push(Cause {
                reason: "FieldValueInvalid".to_owned(),
                message: format!(
                    "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
                field: "metadata.name".to_owned(),
            });
        }
        causes.extend(crate::objectmeta::check(rt, obj));
        if let Some(schema) = rt
            .schemas
            .get(version)
            .or_else(|| rt.schemas.values().next())
        {
            causes.extend(schema::validate(obj, schema));
        }
        if rt.group == "apiextensions.k8s.io"
            && rt.plural == "customresourcedefinitions"
            && let Err(e) = resources::from_crd(obj)
        {
            causes.push(Cause {
                reason: "FieldValueInvalid".to_owned(),
                message: format!("Invalid value: {e}"),
                field: "spec".to_owned(),
            });
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(rt, &name, causes))
        }
    }

    /// Defaults the real registry applies on create for some built-in kinds.
    fn defaults_on_create(rt: &ResourceType, obj: &mut Value) {
        match (rt.group.as_str(), rt.plural.as_str()) {
            ("", "pods") => {
                if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                    for (k, v) in [
                        ("restartPolicy", json!("Always")),
                        ("terminationGracePeriodSeconds", json!(30)),
                        ("dnsPolicy", json!("ClusterFirst")),
                        ("schedulerName", json!("default-scheduler")),
                    ] {
                        spec.entry(k).or_insert(v);
                    }
                }
                obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
            }
            ("", "namespaces") => {
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
                obj["status"] = json!({"phase": "Active"});
            }
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                obj["status"] = json!({"conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now()},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now()}
                ]});
            }
            _ => {}
        }
    }

    /// The content that bumps `generation` when it changes.
    fn generation_content(rt: &ResourceType, obj: &Value) -> Value {
        let mut v = obj.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            if rt.status_subresource {
                m.remove("status");
            }
        }
        v
    }

    /// Fields of a pod spec that may change after creation.
    fn check_pod_update(rt: &ResourceType, old: &Value, new: &Value) -> Result<(), ApiError> {
        if !(rt.group.is_empty() && rt.plural == "pods") {
            return Ok(());
        }
        let strip = |v: &Value| {
            let mut spec = v.get("spec").cloned().unwrap_or(Value::Null);
            if let Some(m) = spec.as_object_mut() {
                m.remove("activeDeadlineSeconds");
                m.remove("tolerations");
                for list in ["containers", "initContainers"] {
                    if let Some(cs) = m.get_mut(list).and_then(Value::as_array_mut) {
                        for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                            c.remove("image");
                        }
                    }
                }
            }
            spec
        };
        if strip(old) == strip(new) {
            return Ok(());
        }
        let name = meta_str(new, "name").unwrap_or("");
        Err(ApiError::invalid(
            rt,
            name,
            vec![Cause {
                reason: "FieldValueForbidden".to_owned(),
                message: "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations)".to_owned(),
                field: "spec".to_owned(),
            }],
        ))
    }

    /// Merge a write into the old object according to the scope: a main-resource
    /// write keeps the old status (when isolated) and system metadata; a status
    /// write keeps everything but status.
    fn isolate(rt: &ResourceType, old: &Value, incoming: Value, scope: Scope) -> Value {
        match scope {
            Scope::Status => {
                let mut out = old.clone();
                match incoming.get("status") {
                    Some(s) => out["status"] = s.clone(),
                    None => {
                        if let Some(m) = out.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                out
            }
            Scope::Main { .. } => {
                let mut out = incoming;
                if rt.status_subresource {
                    match old.get("status") {
                        Some(s) => out["status"] = s.clone(),
                        None => {
                            if let Some(m) = out.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                let old_meta = old.get("metadata").cloned().unwrap_or_else(|| json!({}));
                let meta = meta_mut(&mut out);
                for k in [
                    "name",
                    "namespace",
                    "uid",
                    "creationTimestamp",
                    "generation",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "managedFields",
                    "resourceVersion",
                ] {
                    match old_meta.get(k) {
                        Some(v) => {
                            meta.insert(k.to_owned(), v.clone());
                        }
                        None => {
                            meta.remove(k);
                        }
                    }
                }
                out
            }
        }
    }

    /// Create an object (POST).
    pub fn create(
        &mut self,
        rt: &ResourceType,
        version: &str,
        namespace: &str,
        mut obj: Value,
        writer: &Writer<'_>,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        self.check_kind(rt, version, &obj)?;
        obj["apiVersion"] = json!(rt.api_version(rt.storage_version()));
        obj["kind"] = json!(rt.kind);
        let body_ns = meta_str(&obj, "namespace").map(str::to_owned);
        if rt.namespaced {
            if let Some(body_ns) = body_ns.filter(|b| !b.is_empty() && b != namespace) {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({namespace})"
                )));
            }
            meta_mut(&mut obj).insert("namespace".to_owned(), json!(namespace));
        } else {
            meta_mut(&mut obj).remove("namespace");
        }
        if meta_str(&obj, "name").is_none_or(str::is_empty) {
            match meta_str(&obj, "generateName") {
                Some(prefix) => {
                    let name = format!("{prefix}{}", random_suffix());
                    meta_mut(&mut obj).insert("name".to_owned(), json!(name));
                }
                None => {
                    return Err(ApiError::invalid(
                        rt,
                        "",
                        vec![Cause {
                            reason: "FieldValueRequired".to_owned(),
                            message: "Required value: name or generateName is required".to_owned(),
                            field: "metadata.name".to_owned(),
                        }],
                    ));
                }
            }
        }
        let name = meta_str(&obj, "name").unwrap_or("").to_owned();
        self.check_namespace(rt, namespace)?;
        let key = Self::key(rt, namespace, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(rt, &name));
        }
        if rt.status_subresource
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        Self::defaults_on_create(rt, &mut obj);
        let meta = meta_mut(&mut obj);
        for k in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            meta.remove(k);
        }
        if !writer.manager.is_empty() {
            meta.remove("managedFields");
        }
        meta.insert("uid".to_owned(), json!(new_uid()));
        meta.insert("creationTimestamp".to_owned(), json!(now()));
        meta.insert("generation".to_owned(), json!(1));
        self.validate(rt, version, &mut obj)?;
        let api_version = rt.api_version(version);
        if !matches!(writer.manager, "") {
            managed::record_update(
                None,
                &mut obj,
                writer.manager,
                Scope::Main {
                    status_subresource: false,
                },
                &api_version,
                &now(),
                &rt.list_types(version),
            );
        }
        if writer.dry_run {
            return Ok(obj);
        }
        self.register_if_crd(rt, &obj);
        Ok(self.commit(key, obj))
    }

    fn register_if_crd(&mut self, rt: &ResourceType, obj: &Value) {
        if rt.group == "apiextensions.k8s.io"
            && rt.plural == "customresourcedefinitions"
            && let Ok(t) = resources::from_crd(obj)
        {
            self.types.insert(t);
        }
    }

    fn check_kind(&self, rt: &ResourceType, version: &str, obj: &Value) -> Result<(), ApiError> {
        if let Some(kind) = obj.get("kind").and_then(Value::as_str)
            && kind != rt.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({}) of {}",
                rt.kind,
                rt.api_version(version)
            )));
        }
        Ok(())
    }

    /// Replace an object (PUT), on the main resource or the status subresource.
    pub fn replace(
        &mut self,
        rt: &ResourceType,
        version: &str,
        namespace: &str,
        name: &str,
        obj: Value,
        writer: &Writer<'_>,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        }
        self.check_kind(rt, version, &obj)?;
        if let Some(body_name) = meta_str(&obj, "name")
            && body_name != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let old = self.get(rt, namespace, name)?;
        if let Some(rv) = meta_str(&obj, "resourceVersion").filter(|rv| !rv.is_empty())
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(rt, name));
        }
        self.write(rt, version, old, obj, writer, false)
    }

    /// Patch an object (PATCH) of any kind, on the main resource or the status subresource.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        rt: &ResourceType,
        version: &str,
        namespace: &str,
        name: &str,
        kind: PatchKind,
        body: Value,
        writer: &Writer<'_>,
    ) -> Result<Value, ApiError> {
        let existing = self.get(rt, namespace, name);
        if let PatchKind::Apply { force } = kind {
            return self.server_side_apply(
                rt,
                version,
                namespace,
                name,
                existing.ok(),
                body,
                force,
                writer,
            );
        }
        let old = existing?;
        let mut patched = old.clone();
        match kind {
            PatchKind::Merge | PatchKind::StrategicMerge => json_patch::merge(&mut patched, &body),
            PatchKind::Json => {
                let ops: json_patch::Patch = serde_json::from_value(body.clone())
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                apply_json_patch(&mut patched, &ops)?;
            }
            PatchKind::Apply { .. } => {}
        }
        if let Some(rv) = body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(rt, name));
        }
        self.write(rt, version, old, patched, writer, false)
    }

    #[allow(clippy::too_many_arguments)]
    fn server_side_apply(
        &mut self,
        rt: &ResourceType,
        version: &str,
        namespace: &str,
        name: &str,
        existing: Option<Value>,
        body: Value,
        force: bool,
        writer: &Writer<'_>,
    ) -> Result<Value, ApiError> {
        if writer.manager.is_empty() {
            return Err(ApiError::bad_request(
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            ));
        }
        if let Some(body_name) = meta_str(&body, "name")
            && body_name != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let api_version = rt.api_version(version);
        let creating = existing.is_none();
        if creating && writer.scope == Scope::Status {
            // Apply to the status of an object that does not exist: nothing to attach it to.
            return Err(ApiError::not_found(rt, name));
        }
        let base = existing.clone().unwrap_or_else(|| {
            let mut meta = json!({"name": name});
            if rt.namespaced {
                meta["namespace"] = json!(namespace);
            }
            json!({"apiVersion": api_version, "kind": rt.kind, "metadata": meta})
        });
        if let Some(rv) = meta_str(&body, "resourceVersion")
            && Some(rv) != meta_str(&base, "resourceVersion")
        {
            return Err(ApiError::conflict(rt, name));
        }
        let scope = if creating {
            Scope::Main {
                status_subresource: rt.status_subresource,
            }
        } else {
            writer.scope
        };
        let merged = apply::apply(
            &base,
            ApplyRequest {
                applied: &body,
                manager: writer.manager,
                force,
                scope,
                api_version: &api_version,
                now: &now(),
                lists: &rt.list_types(version),
            },
        )
        .map_err(|conflicts| {
            let n = conflicts.len();
            let lines: Vec<String> = conflicts
                .iter()
                .map(|c| format!("conflict with \"{}\": {}", c.manager, c.field))
                .collect();
            let message = if n == 1 {
                format!("Apply failed with 1 conflict: {}", lines.join(""))
            } else {
                format!("Apply failed with {n} conflicts: {}", lines.join("\n"))
            };
            let causes = conflicts
                .iter()
                .map(|c| Cause {
                    reason: "FieldManagerConflict".to_owned(),
                    message: format!("conflict with \"{}\"", c.manager),
                    field: c.field.clone(),
                })
                .collect();
            ApiError::new(409, "Conflict", message).with_causes(causes)
        })?;
        match existing {
            // The merged object already carries the manager's Apply entry.
            None => self.create(
                rt,
                version,
                namespace,
                merged,
                &Writer {
                    manager: "",
                    ..writer.clone()
                },
            ),
            Some(old) => self.write(rt, version, old, merged, writer, true),
        }
    }

    /// The shared update path: isolation, finalizer rules, validation, generation,
    /// managedFields, no-op detection, commit, then finalization and GC.
    fn write(
        &mut self,
        rt: &ResourceType,
        version: &str,
        old: Value,
        incoming: Value,
        writer: &Writer<'_>,
        applied: bool,
    ) -> Result<Value, ApiError> {
        let name = meta_str(&old, "name").unwrap_or("").to_owned();
        let namespace = meta_str(&old, "namespace").unwrap_or("").to_owned();
        let applied_fields = incoming.pointer("/metadata/managedFields").cloned();
        let mut new = Self::isolate(rt, &old, incoming, writer.scope);
        new["apiVersion"] = json!(rt.api_version(rt.storage_version()));
        new["kind"] = json!(rt.kind);
        if applied {
            // Apply computed managedFields itself; isolate() restored the old ones.
            let meta = meta_mut(&mut new);
            match applied_fields {
                Some(mf) => meta.insert("managedFields".to_owned(), mf),
                None => meta.remove("managedFields"),
            };
        }
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            let before = finalizers(&old);
            if let Some(added) = finalizers(&new).into_iter().find(|f| !before.contains(f)) {
                return Err(ApiError::invalid(
                    rt,
                    &name,
                    vec![Cause {
                        reason: "FieldValueForbidden".to_owned(),
                        message: format!(
                            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{added:?}}}"
                        ),
                        field: "metadata.finalizers".to_owned(),
                    }],
                ));
            }
        }
        Self::check_pod_update(rt, &old, &new)?;
        self.validate(rt, version, &mut new)?;
        if Self::generation_content(rt, &old) != Self::generation_content(rt, &new) {
            let generation = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            meta_mut(&mut new).insert("generation".to_owned(), json!(generation + 1));
        }
        let strip_mf = |v: &Value| {
            let mut v = v.clone();
            if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("managedFields");
            }
            v
        };
        let unchanged = strip_mf(&old) == strip_mf(&new);
        if !applied {
            new = self.finish_managed_fields(rt, version, &old, new, writer);
        }
        if unchanged && (!applied || managed::read_entries(&old) == managed::read_entries(&new)) {
            return Ok(old);
        }
        if writer.dry_run {
            return Ok(new);
        }
        let key = Self::key(rt, &namespace, &name);
        self.register_if_crd(rt, &new);
        let stored = self.commit(key.clone(), new);
        crate::gc::collect(self);
        Ok(self.objects.get(&key).cloned().unwrap_or(stored))
    }

    fn finish_managed_fields(
        &self,
        rt: &ResourceType,
        version: &str,
        old: &Value,
        mut new: Value,
        writer: &Writer<'_>,
    ) -> Value {
        if writer.manager.is_empty() {
            return new;
        }
        let scope = match writer.scope {
            Scope::Main { .. } => Scope::Main {
                status_subresource: rt.status_subresource,
            },
            Scope::Status => Scope::Status,
        };
        managed::record_update(
            Some(old),
            &mut new,
            writer.manager,
            scope,
            &rt.api_version(version),
            &now(),
            &rt.list_types(version),
        );
        new
    }

    /// Delete an object (DELETE): finalizers and propagation policy may turn this
    /// into setting `deletionTimestamp`. Returns the object and whether it is gone.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<(Value, bool), ApiError> {
        let (obj, _) = self.delete_no_gc(rt, namespace, name, opts)?;
        crate::gc::collect(self);
        let key = Self::key(rt, namespace, name);
        Ok(match self.objects.get(&key) {
            Some(o) => (o.clone(), false),
            None => (obj, true),
        })
    }

    /// [`State::delete`] without running the garbage collector afterwards.
    pub fn delete_no_gc(
        &mut self,
        rt: &ResourceType,
        namespace: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<(Value, bool), ApiError> {
        let key = Self::key(rt, namespace, name);
        let old = self.get(rt, namespace, name)?;
        if let Some(uid) = &opts.uid
            && Some(uid.as_str()) != meta_str(&old, "uid")
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    rt.qualified(),
                    meta_str(&old, "uid").unwrap_or("")
                ),
            ));
        }
        if let Some(rv) = &opts.resource_version
            && Some(rv.as_str()) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    rt.qualified(),
                    meta_str(&old, "resourceVersion").unwrap_or("")
                ),
            ));
        }
        let mut fins = finalizers(&old);
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            if rt.group.is_empty() && rt.plural == "pods" && opts.grace_period_seconds == Some(0) {
                let mut obj = old.clone();
                meta_mut(&mut obj).insert("deletionGracePeriodSeconds".to_owned(), json!(0));
                let stored = self.commit(key, obj);
                return Ok((stored, false));
            }
            return Ok((old, false));
        }
        match opts.propagation {
            Some(Propagation::Foreground) if !fins.iter().any(|f| f == "foregroundDeletion") => {
                fins.push("foregroundDeletion".to_owned());
            }
            Some(Propagation::Orphan) if !fins.iter().any(|f| f == "orphan") => {
                fins.push("orphan".to_owned());
            }
            _ => {}
        }
        let is_pod = rt.group.is_empty() && rt.plural == "pods";
        let graceful_pod = is_pod
            && old
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty())
            && opts.grace_period_seconds != Some(0);
        let is_namespace = rt.group.is_empty() && rt.plural == "namespaces";
        if fins.is_empty() && !graceful_pod && !is_namespace {
            let gone = self.remove(&key).unwrap_or(old);
            return Ok((gone, true));
        }
        let mut obj = old.clone();
        set_finalizers(&mut obj, &fins);
        let grace = if graceful_pod {
            opts.grace_period_seconds
                .or_else(|| {
                    old.pointer("/spec/terminationGracePeriodSeconds")
                        .and_then(Value::as_i64)
                })
                .unwrap_or(30)
        } else {
            0
        };
        let meta = meta_mut(&mut obj);
        meta.insert("deletionTimestamp".to_owned(), json!(now()));
        meta.insert("deletionGracePeriodSeconds".to_owned(), json!(grace));
        let generation = meta.get("generation").and_then(Value::as_i64).unwrap_or(1);
        meta.insert("generation".to_owned(), json!(generation + 1));
        if is_namespace {
            obj["status"] = json!({"phase": "Terminating"});
        }
        let stored = self.commit(key, obj);
        Ok((stored, false))
    }

    /// Internal write used by controllers inside the double (kubelet, GC):
    /// replaces the stored object as is, bumping the resourceVersion.
    pub fn internal_update(&mut self, key: &ObjectKey, obj: Value) -> Option<Value> {
        if !self.objects.contains_key(key) {
            return None;
        }
        let stored = self.commit(key.clone(), obj);
        crate::gc::collect(self);
        Some(stored)
    }

    /// Replace a stored object without running the garbage collector.
    pub fn internal_update_no_gc(&mut self, key: &ObjectKey, obj: Value) -> Option<Value> {
        if !self.objects.contains_key(key) {
            return None;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_rfc1123_subdomains() {
        assert!(valid_name("a-b.c1"));
        assert!(!valid_name("A"));
        assert!(!valid_name("-a"));
        assert!(!valid_name(""));
    }
}
