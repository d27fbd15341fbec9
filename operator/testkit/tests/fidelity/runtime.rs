//! kube-runtime against the double, unchanged: `watcher` through a dropped
//! connection, and a trivial `Controller` that reconciles ConfigMaps.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
    runtime::{
        Controller,
        controller::Action,
        watcher::{self, Event},
    },
};
use serde_json::json;

use crate::support::{await_condition, cms, config_map, server, within};

#[tokio::test]
async fn watcher_recovers_from_a_dropped_connection_without_losing_objects() {
    let server = server();
    let api = cms(&server);
    let mut events = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
    api.create(&PostParams::default(), &config_map("w-1", &[]))
        .await
        .unwrap();
    let mut seen = BTreeSet::new();
    within("w-1", async {
        while !seen.contains("w-1") {
            if let Some(Ok(Event::Apply(c) | Event::InitApply(c))) = events.next().await {
                seen.insert(c.metadata.name.unwrap());
            }
        }
    })
    .await;
    server.faults().drop_watches();
    api.create(&PostParams::default(), &config_map("w-2", &[]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &config_map("w-3", &[]))
        .await
        .unwrap();
    within("w-2 and w-3 after the drop", async {
        while !(seen.contains("w-2") && seen.contains("w-3")) {
            match events.next().await {
                Some(Ok(Event::Apply(c) | Event::InitApply(c))) => {
                    seen.insert(c.metadata.name.unwrap());
                }
                Some(_) => {}
                None => panic!("watcher ended"),
            }
        }
    })
    .await;
}

#[derive(Debug, thiserror::Error)]
#[error("failed to patch configmap {name}")]
struct ReconcileError {
    name: String,
    #[source]
    source: kube::Error,
}

async fn reconcile(cm: Arc<ConfigMap>, api: Arc<Api<ConfigMap>>) -> Result<Action, ReconcileError> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let patch = json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
        "data": {"reconciled": "true"}
    });
    api.patch(
        &name,
        &PatchParams::apply("testkit-controller"),
        &Patch::Apply(patch),
    )
    .await
    .map_err(|source| ReconcileError {
        name: name.clone(),
        source,
    })?;
    Ok(Action::await_change())
}

fn error_policy(_: Arc<ConfigMap>, _: &ReconcileError, _: Arc<Api<ConfigMap>>) -> Action {
    Action::requeue(Duration::from_millis(50))
}

#[tokio::test]
async fn a_trivial_controller_reconciles_against_the_double() {
    let server = server();
    let api = cms(&server);
    // The first reconcile patch fails once: the controller must retry.
    server.faults().inject(
        protobot_testkit::FaultRule::on(protobot_testkit::Verb::Patch)
            .resource("configmaps")
            .status(500)
            .times(1),
    );
    let ctx = Arc::new(api.clone());
    let controller = Controller::new(api.clone(), watcher::Config::default())
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {});
    let handle = tokio::spawn(controller);
    api.create(&PostParams::default(), &config_map("ctl-1", &[]))
        .await
        .unwrap();
    api.create(&PostParams::default(), &config_map("ctl-2", &[]))
        .await
        .unwrap();
    for name in ["ctl-1", "ctl-2"] {
        await_condition(
            name,
            || api.get(name),
            |r| {
                r.as_ref().is_ok_and(|c| {
                    c.data
                        .as_ref()
                        .is_some_and(|d| d.get("reconciled").is_some())
                })
            },
        )
        .await
        .unwrap();
    }
    handle.abort();
}
