#![allow(clippy::unwrap_used, clippy::expect_used)]
//! GitOps registration end to end against the API double: applying a
//! `ChangeSet` manifest that names an approved merge is all it takes for a
//! `BuildWorkItem` to appear; a wrong merge commit is reported on the
//! ChangeSet and materializes nothing.

use std::time::Duration;

use kube::{Api, api::PostParams};
use protobot_api::{BuildWorkItem, ChangeSet, LifecycleState, Project};
use protobot_jobsite::testing::spec_repo;
use protobot_testkit::server::ApiServer;
use serde_json::json;

fn server() -> ApiServer {
    let server = ApiServer::new();
    server
        .register_crd_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../crds"))
        .unwrap();
    server
}

async fn apply(server: &ApiServer, repo: &std::path::Path, merge: &str) {
    let client = server.client();
    let projects: Api<Project> = Api::namespaced(client.clone(), "default");
    let project: Project = serde_json::from_value(json!({
        "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
        "metadata": {"name": "cli-sync", "namespace": "default"},
        "spec": {"repoUrl": format!("file://{}", repo.display()), "sandboxProfile": "local"},
    }))
    .unwrap();
    projects
        .create(&PostParams::default(), &project)
        .await
        .unwrap();
    let change_sets: Api<ChangeSet> = Api::namespaced(client, "default");
    let cs: ChangeSet = serde_json::from_value(json!({
        "apiVersion": "protobot.dev/v1alpha1", "kind": "ChangeSet",
        "metadata": {"name": "cs-00001", "namespace": "default"},
        "spec": {"projectRef": {"name": "cli-sync"}, "changeSetId": "CS-00001", "mergeCommit": merge},
    }))
    .unwrap();
    change_sets
        .create(&PostParams::default(), &cs)
        .await
        .unwrap();
}

/// Waits (through a watch, bounded) until the ChangeSet has a settled `type_`
/// condition, and returns its status and reason.
async fn condition(api: &Api<ChangeSet>, type_: &str) -> (String, String) {
    let settled = |cs: Option<&ChangeSet>| {
        cs.and_then(|cs| cs.status.as_ref())
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
            .is_some_and(|c| c.reason != "Pending")
    };
    let cs = protobot_testkit::wait::until(api, "cs-00001", Duration::from_secs(20), settled)
        .await
        .unwrap()
        .unwrap();
    let c = cs
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
        .unwrap();
    (
        serde_json::to_value(c.status)
            .unwrap()
            .as_str()
            .unwrap()
            .to_string(),
        c.reason,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_change_set_materializes_a_ready_build_work_item() {
    let (repo, merge) = spec_repo("cli-sync");
    let server = server();
    apply(&server, repo.path(), &merge).await;
    let controller = tokio::spawn(protobot_controller::changeset::run(
        server.client(),
        Some("default".into()),
    ));
    let change_sets: Api<ChangeSet> = Api::namespaced(server.client(), "default");
    assert_eq!(
        condition(&change_sets, "Materialized").await,
        ("True".into(), "WorkItemCreated".into())
    );
    let cs = change_sets.get("cs-00001").await.unwrap();
    let status = cs.status.unwrap();
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Verified" && c.reason == "MergeCommitVerified")
    );
    let item_name = status.work_item_ref.unwrap().name;
    let items: Api<BuildWorkItem> = Api::namespaced(server.client(), "default");
    let item = items.get(&item_name).await.unwrap();
    assert_eq!(item.status.unwrap().state, LifecycleState::ReadyForBuilding);
    assert_eq!(
        status.impact.unwrap().applicable_requirements,
        ["REQ-CLI-00001"]
    );
    assert_eq!(
        items.list(&Default::default()).await.unwrap().items.len(),
        1,
        "exactly one work item"
    );
    controller.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_merge_commit_is_reported_and_materializes_nothing() {
    let (repo, _merge) = spec_repo("cli-sync");
    let server = server();
    apply(&server, repo.path(), &"a".repeat(40)).await;
    let controller = tokio::spawn(protobot_controller::changeset::run(
        server.client(),
        Some("default".into()),
    ));
    let change_sets: Api<ChangeSet> = Api::namespaced(server.client(), "default");
    assert_eq!(
        condition(&change_sets, "Verified").await,
        ("False".into(), "MergeCommitNotFound".into())
    );
    let items: Api<BuildWorkItem> = Api::namespaced(server.client(), "default");
    assert!(
        items
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    controller.abort();
}
