//! What a Job Site did, made visible: metrics, each built item's `InspectionRun` objects
//! (owned by the item, [`inspection_runs`] pure), its time since registration when it
//! completed, and its Events ([`super::events`]).

use jiff::Timestamp;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use protobot_api::{BuildWorkItem, InspectionRun};
use protobot_jobsite::{
    builds::Finished, engine::BuildReport, inspection::Verdict, site::SiteAction,
};
use protobot_stores::kubernetes::item_name;

use super::{FIELD_MANAGER, Settings, events::publish_events};

/// What a Job Site did, made visible: metrics, each built item's inspection runs (objects
/// it owns) and its time since registration when it completed, and the items' Events.
pub(super) async fn publish(
    client: &Client,
    ns: &str,
    settings: &Settings,
    actions: &[SiteAction],
) {
    if let Some(metrics) = &settings.metrics {
        metrics.record_actions(actions);
    }
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), ns);
    for action in actions {
        let SiteAction::Built { report } = action else {
            continue;
        };
        let Ok(item) = items.get(&item_name(&report.work_item_id)).await else {
            continue;
        };
        publish_inspections(client, ns, &item, report).await;
        if let Some(metrics) = &settings.metrics
            && report.state == protobot_lifecycle::State::Completed
        {
            record_completion(metrics, &item);
        }
    }
    publish_events(client, ns, &settings.identity, actions).await;
}

/// The `InspectionRun` objects of a build (pure): one per run, owned by the item.
pub fn inspection_runs(item: &BuildWorkItem, report: &BuildReport) -> Vec<serde_json::Value> {
    let owner = item.controller_owner_ref(&());
    report
        .inspections
        .iter()
        .map(|run| {
            let name = item_name(&run.run_id);
            let sealed = match &run.verdict {
                Verdict::Sealed { watermark } => {
                    Some(serde_json::json!({"highWatermark": watermark, "at": Timestamp::now().to_string()}))
                }
                _ => None,
            };
            serde_json::json!({
                "apiVersion": "protobot.dev/v1alpha1",
                "kind": "InspectionRun",
                "metadata": {
                    "name": name,
                    "labels": {
                        "app.kubernetes.io/managed-by": "protobot",
                        // Work-item names may be up to 253 characters; a label value 63.
                        "protobot.dev/work-item": protobot_stores::kubernetes::label_value(&item.name_any()),
                    },
                    "ownerReferences": owner.iter().collect::<Vec<_>>(),
                },
                "spec": {
                    "workItemRef": {"name": item.name_any()},
                    "contractVersion": run.contract_version,
                    "candidateCommit": run.candidate,
                    "productTreeDigest": run.product_tree_digest,
                    "requiredProducers": run.producers,
                    "ledgerSequenceAtStart": run.ledger_sequence_at_start,
                },
                "status": {
                    // A list-map keyed by producer: one entry per producer, even if a
                    // report named one twice (the server refuses duplicate keys).
                    "producersCompleted": run.producers.iter().collect::<std::collections::BTreeSet<_>>().into_iter().map(|p| serde_json::json!({
                        "producer": p, "findings": run.findings, "completedTime": Timestamp::now().to_string(),
                    })).collect::<Vec<_>>(),
                    "sealed": sealed,
                },
            })
        })
        .collect()
}

/// `protobot_registration_to_completion_seconds` for an item this pass completed: from its
/// `BuildWorkItem`'s creation (registration) to now.
fn record_completion(metrics: &crate::metrics::JobSiteMetrics, item: &BuildWorkItem) {
    if let Some(registered) = &item.metadata.creation_timestamp {
        let took = Timestamp::now().duration_since(registered.0);
        metrics
            .registration_to_completion
            .observe(took.as_secs_f64().max(0.0));
    }
}

async fn publish_inspections(
    client: &Client,
    ns: &str,
    item: &BuildWorkItem,
    report: &BuildReport,
) {
    let runs: Api<InspectionRun> = Api::namespaced(client.clone(), ns);
    for body in inspection_runs(item, report) {
        let name = body["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut spec_only = body.clone();
        if let Some(o) = spec_only.as_object_mut() {
            o.remove("status");
        }
        let status = serde_json::json!({
            "apiVersion": "protobot.dev/v1alpha1",
            "kind": "InspectionRun",
            "status": body["status"],
        });
        // The spec is immutable (CEL `self == oldSelf` on each field): it is written once,
        // when the run is first published, and never applied again.
        let created = match runs.get_opt(&name).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => runs
                .patch(&name, &params, &Patch::Apply(&spec_only))
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        let written = match created {
            Ok(()) => runs
                .patch_status(&name, &params, &Patch::Apply(&status))
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        if let Err(e) = written {
            tracing::warn!(inspection_run = %name, error = %e, "could not publish the inspection run");
        }
    }
}

/// Publishes a finished build ([`publish`]) and logs what it did.
pub(super) async fn publish_finished(client: &Client, settings: &Settings, done: Finished) {
    let Some((ns, project)) = done.tag.split_once('/') else {
        return;
    };
    match &done.action {
        SiteAction::Built { report } => {
            tracing::info!(%project, work_item = %done.work_item_id, state = %report.state, "build finished")
        }
        other => {
            tracing::info!(%project, work_item = %done.work_item_id, action = ?other, "build stopped; the item backs off before it is resumed")
        }
    }
    publish(client, ns, settings, std::slice::from_ref(&done.action)).await;
}
