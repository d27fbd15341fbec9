//! Delete: preconditions, finalizers and `deletionTimestamp`, propagation
//! policies (background, foreground, orphan), graceful pod deletion and
//! namespace termination (finished by `gc` and the kubelet).

use serde_json::{Value, json};

use crate::{
    error::ApiError,
    resources::ResourceType,
    store::{State, finalizers, meta_mut, meta_str, now, set_finalizers},
};

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

impl State {
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
        if let Some(generation) = meta.get("generation").and_then(Value::as_i64) {
            meta.insert("generation".to_owned(), json!(generation + 1));
        }
        if is_namespace {
            obj["status"] = json!({"phase": "Terminating"});
        }
        let stored = self.commit(key, obj);
        Ok((stored, false))
    }
}
