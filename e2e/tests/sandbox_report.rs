#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The sandbox conformance report is watched, not read once: storing a passing report in the
//! ConfigMap the profile names admits runs without a restart; replacing it with a failing one,
//! with one that does not parse, or deleting it refuses them again, each with its reason.
//! Against the real API server with the operator's ServiceAccount (or the double).

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use protobot_e2e::{Cluster, timeout};
use protobot_kube_executor::{
    KubeExecutorConfig, KubernetesExecutor, SandboxProfile, StagingVolume,
};
use serde_json::json;

const CONFIG_MAP: &str = "protobot-conformance-kata";

/// Waits (bounded) until the executor's admission answers as `admitted` says, and returns
/// the last answer's reason.
async fn until_admission(executor: &KubernetesExecutor, admitted: bool, what: &str) -> String {
    let answered = tokio::time::timeout(timeout(), async {
        loop {
            match executor.admit() {
                Ok(()) if admitted => return String::new(),
                Err(e) if !admitted => return e.to_string(),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await;
    answered.unwrap_or_else(|_| {
        panic!(
            "{what}: admission never became {admitted}: {:?}",
            executor.admit()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_replaced_or_deleted_report_admits_or_refuses_runs_without_a_restart() {
    let cluster = Cluster::connect("sandbox-report").await;
    let ns = cluster.namespace.clone();
    let tmp = tempfile::tempdir().unwrap();
    let config = KubeExecutorConfig::new(
        &ns,
        StagingVolume {
            claim_name: "protobot-staging".into(),
            mount_path: tmp.path().join("staging"),
        },
        tmp.path().join("collected"),
    );
    let profile = SandboxProfile::load(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../sandbox-profiles/kata.yaml"
    )))
    .unwrap();
    let executor =
        Arc::new(KubernetesExecutor::new(cluster.operator.clone(), config, profile, None).unwrap());
    let refused = executor.admit().unwrap_err().to_string();
    assert!(refused.contains(CONFIG_MAP), "{refused}");
    let watch = tokio::spawn(executor.as_ref().clone().watch_report());
    let maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), &ns);
    let report = |passed: bool| {
        let mut r = protobot_e2e::conformant_report("kata");
        r.passed = passed;
        serde_json::to_string(&r).unwrap()
    };
    // Stored: admitted.
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": CONFIG_MAP, "namespace": ns},
        "data": {"report.json": report(true)},
    }))
    .unwrap();
    maps.create(&PostParams::default(), &cm).await.unwrap();
    until_admission(&executor, true, "a passing report stored").await;
    // Replaced with a failing report: refused.
    let set = |json: String| {
        let maps = maps.clone();
        async move {
            maps.patch(
                CONFIG_MAP,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"report.json": json}})),
            )
            .await
            .unwrap();
        }
    };
    set(report(false)).await;
    let why = until_admission(&executor, false, "a failing report").await;
    assert!(why.contains("kata"), "{why}");
    // Passing again, then a report that does not parse: refused, saying there is none.
    set(report(true)).await;
    until_admission(&executor, true, "a passing report again").await;
    set("{not json".into()).await;
    let why = until_admission(&executor, false, "an unparsable report").await;
    assert!(why.contains("no conformance report"), "{why}");
    // Passing again, then deleted: refused.
    set(report(true)).await;
    until_admission(&executor, true, "a passing report once more").await;
    maps.delete(CONFIG_MAP, &DeleteParams::default())
        .await
        .unwrap();
    let why = until_admission(&executor, false, "the report deleted").await;
    assert!(why.contains(CONFIG_MAP), "{why}");
    watch.abort();
    cluster.cleanup().await;
}
