//! Writes: create, replace (main and status), merge / strategic / JSON patch
//! and server-side apply, through one update path that applies admission,
//! generation, managedFields and no-op detection before committing.

use serde_json::{Value, json};

use crate::{
    apply::{self, ApplyRequest},
    error::{ApiError, Cause},
    managed::{self, Scope},
    resources::{self, ResourceType},
    store::{State, finalizers, meta_mut, meta_str, new_uid, now, random_suffix},
};

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

/// Who writes and how.
#[derive(Debug, Clone)]
pub struct Writer<'a> {
    /// Field manager for managedFields.
    pub manager: &'a str,
    /// Main resource or status subresource.
    pub scope: Scope,
    /// `dryRun=All`: validate and compute, but do not persist.
    pub dry_run: bool,
    /// `fieldValidation=Strict`: unknown fields are a 400 instead of being pruned.
    pub strict: bool,
}

impl State {
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
        if rt.tracks_generation() {
            meta.insert("generation".to_owned(), json!(1));
        } else {
            meta.remove("generation");
        }
        self.validate(rt, version, &mut obj, writer.strict)?;
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

    pub(crate) fn register_if_crd(&mut self, rt: &ResourceType, obj: &Value) {
        if rt.group == "apiextensions.k8s.io"
            && rt.plural == "customresourcedefinitions"
            && let Ok(t) = resources::from_crd(obj)
        {
            self.types.insert(t);
        }
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
        self.validate(rt, version, &mut new, writer.strict)?;
        if rt.tracks_generation()
            && Self::generation_content(rt, &old) != Self::generation_content(rt, &new)
        {
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
}
