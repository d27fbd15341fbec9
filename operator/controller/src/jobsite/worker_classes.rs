//! A project's harnesses: the worker-classes `ConfigMap` its `spec.workerClassesRef` names,
//! read from the API ([`read_worker_classes`]) and parsed ([`worker_classes`], pure).

use std::collections::BTreeMap;

use kube::{Api, Client, ResourceExt};
use protobot_api::Project;
use protobot_jobsite::{
    engine::{Producer, WorkerClass},
    inspection::ProducerKind,
};
use serde::Deserialize;

use super::ProjectError;

/// The harnesses of a project: the `ConfigMap` named by `spec.workerClassesRef`,
/// keys `worker-a`, `worker-b`, `integration` (each `{"command": [...], "image": ...}`)
/// and optionally `inspectors` (a list of `{"name", "kind", "class"}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerClasses {
    /// Worker A.
    pub worker_a: WorkerClass,
    /// Worker B.
    pub worker_b: WorkerClass,
    /// Integration runner.
    pub integration: WorkerClass,
    /// Inspection producers.
    pub producers: Vec<Producer>,
}

#[derive(Deserialize)]
struct ProducerEntry {
    name: String,
    kind: ProducerKind,
    class: WorkerClass,
}

/// Parses the worker-classes `ConfigMap` data (pure).
pub fn worker_classes(
    project: &str,
    data: &BTreeMap<String, String>,
) -> Result<WorkerClasses, ProjectError> {
    let bad = |reason: String| ProjectError::WorkerClasses {
        project: project.into(),
        reason,
    };
    let class = |key: &str| -> Result<WorkerClass, ProjectError> {
        let raw = data
            .get(key)
            .ok_or_else(|| bad(format!("key {key} is missing")))?;
        let class: WorkerClass =
            serde_json::from_str(raw).map_err(|e| bad(format!("key {key}: {e}")))?;
        if class.command.is_empty() {
            return Err(bad(format!("key {key}: command is empty")));
        }
        Ok(class)
    };
    let producers = match data.get("inspectors") {
        None => Vec::new(),
        Some(raw) => serde_json::from_str::<Vec<ProducerEntry>>(raw)
            .map_err(|e| bad(format!("key inspectors: {e}")))?
            .into_iter()
            .map(|p| Producer {
                name: p.name,
                kind: p.kind,
                class: p.class,
            })
            .collect(),
    };
    Ok(WorkerClasses {
        worker_a: class("worker-a")?,
        worker_b: class("worker-b")?,
        integration: class("integration")?,
        producers,
    })
}

/// The project's worker classes and their ConfigMap's resourceVersion.
pub(super) async fn read_worker_classes(
    client: &Client,
    project: &Project,
) -> Result<(WorkerClasses, Option<String>), ProjectError> {
    let name = project.name_any();
    let ns = project.namespace().unwrap_or_default();
    let Some(r) = &project.spec.worker_classes_ref else {
        return Err(ProjectError::WorkerClasses {
            project: name,
            reason: "spec.workerClassesRef is not set".into(),
        });
    };
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &ns);
    let map = maps
        .get_opt(&r.name)
        .await
        .map_err(|source| ProjectError::Api {
            project: name.clone(),
            source,
        })?
        .ok_or_else(|| ProjectError::WorkerClasses {
            project: name.clone(),
            reason: format!("ConfigMap {} does not exist", r.name),
        })?;
    let version = map.metadata.resource_version.clone();
    Ok((
        worker_classes(&name, &map.data.unwrap_or_default())?,
        version,
    ))
}
