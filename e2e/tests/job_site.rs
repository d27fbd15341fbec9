#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Job Site in the cluster: apply a `Project` and a `ChangeSet` for the
//! bundled example and the operator takes it the rest of the way — the
//! `BuildWorkItem` completes, its `InspectionRun` is sealed and `main` has the
//! merge with the item's `Work-Item:` trailer.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{Api, api::PostParams, runtime::WatchStreamExt};
use protobot_api::{BuildWorkItem, ChangeSet, InspectionRun, LifecycleState, Project};
use protobot_controller::jobsite::{Settings, run};
use protobot_e2e::{Cluster, timeout};
use protobot_executors::{BubblewrapConfig, LocalExecutor};
use protobot_jobsite::example::{INTEGRATION, WORKER_A, WORKER_B, author};
use serde_json::json;

fn bwrap() -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("bwrap").is_file()));
    if !found {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
            "PROTOBOT_REQUIRE_BWRAP is set but bwrap is missing"
        );
        eprintln!("skipping: bubblewrap is not installed");
    }
    found
}

fn class(script: &str) -> String {
    json!({"command": ["sh", "-c", script], "image": null}).to_string()
}

async fn create<K>(api: &Api<K>, body: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_change_set_is_built_inspected_and_merged_by_the_operator() {
    if !bwrap() {
        return;
    }
    let cluster = Cluster::connect("jobsite").await;
    let ns = cluster.namespace.clone();
    let tmp = tempfile::tempdir().unwrap();
    let (work, origin) = (tmp.path().join("work"), tmp.path().join("origin.git"));
    let merge = author(&work, &origin).unwrap();
    let client = cluster.client.clone();
    create(
        &Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cli-sync-workers", "namespace": ns},
            "data": {
                "worker-a": class(WORKER_A),
                "worker-b": class(WORKER_B),
                "integration": class(INTEGRATION),
            },
        }),
    )
    .await;
    create(
        &Api::<Project>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "cli-sync", "namespace": ns},
            "spec": {
                "repoUrl": format!("file://{}", origin.display()),
                "sandboxProfile": "local",
                "workerClassesRef": {"name": "cli-sync-workers"},
            },
        }),
    )
    .await;
    create(
        &Api::<ChangeSet>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "ChangeSet",
            "metadata": {"name": "cs-00001", "namespace": ns},
            "spec": {"projectRef": {"name": "cli-sync"}, "changeSetId": "CS-00001", "mergeCommit": merge},
        }),
    )
    .await;
    let registration = tokio::spawn(protobot_controller::changeset::run_with(
        client.clone(),
        Some(ns.clone()),
        tmp.path().join("registry"),
    ));
    let executor = Arc::new(LocalExecutor::new(
        BubblewrapConfig::under(&tmp.path().join("sandbox")),
        false,
    ));
    let job_site = tokio::spawn(run(
        client.clone(),
        Some(ns.clone()),
        Settings {
            identity: "protobot-0".into(),
            workdir: tmp.path().join("jobsite"),
            interval: Duration::from_millis(200),
            limits: Default::default(),
        },
        executor,
    ));
    // Registration names the work item; then the Job Site takes it to completed.
    let change_sets: Api<ChangeSet> = Api::namespaced(client.clone(), &ns);
    let registered = protobot_testkit::wait::until(
        &change_sets,
        "cs-00001",
        timeout(),
        |cs: Option<&ChangeSet>| {
            cs.and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.work_item_ref.is_some())
        },
    )
    .await
    .unwrap()
    .unwrap();
    let name = registered.status.unwrap().work_item_ref.unwrap().name;
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), &ns);
    let completed =
        protobot_testkit::wait::until(&items, &name, timeout() * 6, |i: Option<&BuildWorkItem>| {
            i.and_then(|i| i.status.as_ref())
                .is_some_and(|s| s.state == LifecycleState::Completed)
        })
        .await
        .unwrap_or_else(|e| panic!("{name} did not complete: {e}"))
        .unwrap();
    assert_eq!(
        items.list(&Default::default()).await.unwrap().items.len(),
        1,
        "exactly one work item"
    );
    let item = &completed;
    // Its inspection run is sealed and owned by the item.
    let runs: Api<InspectionRun> = Api::namespaced(client.clone(), &ns);
    let is_sealed = |r: &InspectionRun| r.status.as_ref().is_some_and(|s| s.sealed.is_some());
    let first_sealed = tokio::time::timeout(timeout(), async {
        let mut seen = kube::runtime::watcher(runs.clone(), Default::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(run)) = seen.next().await {
            if is_sealed(&run) {
                return Some(run);
            }
        }
        None
    })
    .await;
    assert!(
        matches!(first_sealed, Ok(Some(_))),
        "no sealed InspectionRun was published"
    );
    let runs = runs.list(&Default::default()).await.unwrap().items;
    let sealed: Vec<&InspectionRun> = runs.iter().filter(|r| is_sealed(r)).collect();
    assert_eq!(sealed.len(), 1, "{runs:?}");
    assert_eq!(
        sealed[0].spec.work_item_ref.name,
        kube::ResourceExt::name_any(item)
    );
    assert!(
        sealed[0]
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| o.iter().any(|o| o.kind == "BuildWorkItem"))
    );
    // main has exactly one merge, carrying the item's trailer.
    let log = std::process::Command::new("git")
        .args([
            "log",
            "--first-parent",
            "--merges",
            "--format=%(trailers:key=Work-Item,valueonly)",
            "main",
        ])
        .current_dir(&origin)
        .output()
        .unwrap();
    let trailers: Vec<String> = String::from_utf8(log.stdout)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    assert_eq!(
        trailers,
        std::slice::from_ref(&item.spec.work_item_id),
        "exactly one merge carries a Work-Item trailer: the item's"
    );
    job_site.abort();
    registration.abort();
    cluster.cleanup().await;
}
