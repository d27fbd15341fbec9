//! Admission for every write: name, label and schema validation (422 with
//! causes), registry defaults on create, pod spec immutability, namespace
//! existence, and subresource isolation (what a main or status write may change).

use serde_json::{Value, json};

use crate::{
    error::{ApiError, Cause},
    managed::Scope,
    resources::{self, ResourceType},
    schema,
    store::{ObjectKey, State, meta_mut, meta_str, now},
};

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

impl State {
    pub(crate) fn check_namespace(
        &self,
        rt: &ResourceType,
        namespace: &str,
    ) -> Result<(), ApiError> {
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
    pub(crate) fn validate(
        &self,
        rt: &ResourceType,
        version: &str,
        obj: &mut Value,
        strict: bool,
    ) -> Result<(), ApiError> {
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
            let (errs, unknown) = schema::validate_reporting_unknown(obj, schema);
            if strict && !unknown.is_empty() {
                let fields: Vec<String> = unknown
                    .iter()
                    .map(|f| format!("unknown field {f:?}"))
                    .collect();
                return Err(ApiError::bad_request(format!(
                    "strict decoding error: {}",
                    fields.join(", ")
                )));
            }
            causes.extend(errs);
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
    pub(crate) fn defaults_on_create(rt: &ResourceType, obj: &mut Value) {
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
    pub(crate) fn generation_content(rt: &ResourceType, obj: &Value) -> Value {
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
    pub(crate) fn check_pod_update(
        rt: &ResourceType,
        old: &Value,
        new: &Value,
    ) -> Result<(), ApiError> {
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
    pub(crate) fn isolate(rt: &ResourceType, old: &Value, incoming: Value, scope: Scope) -> Value {
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

    pub(crate) fn check_kind(
        &self,
        rt: &ResourceType,
        version: &str,
        obj: &Value,
    ) -> Result<(), ApiError> {
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
