#![allow(clippy::unwrap_used, clippy::expect_used)]
//! GitOps registration: applying a `ChangeSet` manifest is all it takes.

use kube::{Api, api::PostParams};
use protobot_api::{BuildWorkItem, ChangeSet, LifecycleState, Project};
use protobot_e2e::{Cluster, timeout};
use protobot_jobsite::testing::spec_repo;
use serde_json::json;

async fn apply(cluster: &Cluster, repo: &std::path::Path, merge: &str) {
    let ns = cluster.namespace.as_str();
    let projects: Api<Project> = Api::namespaced(cluster.client.clone(), ns);
    let project: Project = serde_json::from_value(json!({
        "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
        "metadata": {"name": "cli-sync", "namespace": ns},
        "spec": {"repoUrl": format!("file://{}", repo.display()), "sandboxProfile": "local"},
    }))
    .unwrap();
    projects
        .create(&PostParams::default(), &project)
        .await
        .unwrap();
    let change_sets: Api<ChangeSet> = Api::namespaced(cluster.client.clone(), ns);
    let cs: ChangeSet = serde_json::from_value(json!({
        "apiVersion": "protobot.dev/v1alpha1", "kind": "ChangeSet",
        "metadata": {"name": "cs-00001", "namespace": ns},
        "spec": {"projectRef": {"name": "cli-sync"}, "changeSetId": "CS-00001", "mergeCommit": merge},
    }))
    .unwrap();
    change_sets
        .create(&PostParams::default(), &cs)
        .await
        .unwrap();
}

/// Waits (through a watch, bounded) for a settled condition; returns (status, reason).
async fn condition(api: &Api<ChangeSet>, type_: &str) -> (String, String) {
    let settled = |cs: Option<&ChangeSet>| {
        cs.and_then(|cs| cs.status.as_ref())
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
            .is_some_and(|c| c.reason != "Pending")
    };
    let cs = protobot_testkit::wait::until(api, "cs-00001", timeout(), settled)
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
async fn an_applied_change_set_materializes_one_ready_build_work_item() {
    let cluster = Cluster::connect("gitops").await;
    let (repo, merge) = spec_repo("cli-sync");
    apply(&cluster, repo.path(), &merge).await;
    let cache = tempfile::tempdir().unwrap();
    let controller = tokio::spawn(protobot_controller::changeset::run_with(
        cluster.client.clone(),
        Some(cluster.namespace.clone()),
        cache.path().to_path_buf(),
    ));
    let change_sets: Api<ChangeSet> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    assert_eq!(
        condition(&change_sets, "Materialized").await,
        ("True".into(), "WorkItemCreated".into())
    );
    let status = change_sets.get("cs-00001").await.unwrap().status.unwrap();
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Verified" && c.reason == "MergeCommitVerified")
    );
    let items: Api<BuildWorkItem> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let item = items
        .get(&status.work_item_ref.unwrap().name)
        .await
        .unwrap();
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
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_merge_commit_is_reported_and_materializes_nothing() {
    let cluster = Cluster::connect("wrong-merge").await;
    let (repo, _merge) = spec_repo("cli-sync");
    apply(&cluster, repo.path(), &"a".repeat(40)).await;
    let cache = tempfile::tempdir().unwrap();
    let controller = tokio::spawn(protobot_controller::changeset::run_with(
        cluster.client.clone(),
        Some(cluster.namespace.clone()),
        cache.path().to_path_buf(),
    ));
    let change_sets: Api<ChangeSet> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    assert_eq!(
        condition(&change_sets, "Verified").await,
        ("False".into(), "MergeCommitNotFound".into())
    );
    let items: Api<BuildWorkItem> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    assert!(
        items
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    controller.abort();
    cluster.cleanup().await;
}

async fn create_project(cluster: &Cluster, name: &str, repo_url: &str) {
    create_project_on(cluster, name, repo_url, "local").await;
}

async fn create_project_on(cluster: &Cluster, name: &str, repo_url: &str, profile: &str) {
    let projects: Api<Project> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let project: Project = serde_json::from_value(json!({
        "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
        "metadata": {"name": name, "namespace": cluster.namespace},
        "spec": {"repoUrl": repo_url, "sandboxProfile": profile},
    }))
    .unwrap();
    projects
        .create(&PostParams::default(), &project)
        .await
        .unwrap();
}

/// Waits (through a watch, bounded) until the Project's `Ready` condition is reported.
async fn observed_project(api: &Api<Project>, name: &str) -> protobot_api::ProjectStatus {
    let reported = |p: Option<&Project>| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready"))
    };
    protobot_testkit::wait::until(api, name, timeout(), reported)
        .await
        .unwrap()
        .unwrap()
        .status
        .unwrap()
}

fn project_condition(status: &protobot_api::ProjectStatus, type_: &str) -> (String, String) {
    let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
    (c.status.to_string(), c.reason.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_project_controller_reports_the_repository_and_its_configuration() {
    let cluster = Cluster::connect("project-status").await;
    let (repo, _merge) = spec_repo("cli-sync");
    let main_head = std::process::Command::new("git")
        .args(["rev-parse", "refs/heads/main"])
        .current_dir(repo.path())
        .output()
        .unwrap();
    let main_head = String::from_utf8(main_head.stdout)
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(main_head.len(), 40);
    let missing = tempfile::tempdir()
        .unwrap()
        .path()
        .join("no-such-repository");
    create_project(
        &cluster,
        "cli-sync",
        &format!("file://{}", repo.path().display()),
    )
    .await;
    create_project(
        &cluster,
        "missing",
        &format!("file://{}", missing.display()),
    )
    .await;
    let cache = tempfile::tempdir().unwrap();
    let controller = tokio::spawn(protobot_controller::project::run_with(
        cluster.client.clone(),
        Some(cluster.namespace.clone()),
        cache.path().to_path_buf(),
    ));
    let projects: Api<Project> = Api::namespaced(cluster.client.clone(), &cluster.namespace);

    // A reachable repository with a valid spec store.
    let good = observed_project(&projects, "cli-sync").await;
    assert_eq!(good.repo_reachable, Some(true));
    assert_eq!(
        good.default_branch_head.as_deref(),
        Some(main_head.as_str())
    );
    assert!(good.head_observed_time.is_some());
    assert_eq!(good.project_config_valid, Some(true));
    assert_eq!(
        project_condition(&good, "RepoReachable"),
        ("True".into(), "Passed".into())
    );
    assert_eq!(
        project_condition(&good, "ProjectConfigValid"),
        ("True".into(), "Passed".into())
    );
    // The test operator knows no conformance report: Unknown, never a faked pass,
    // so the project is not Ready.
    assert_eq!(
        project_condition(&good, "SandboxConformant"),
        ("Unknown".into(), "CheckError".into())
    );
    assert_eq!(good.sandbox_conformance, None);
    assert_eq!(
        project_condition(&good, "Ready"),
        ("False".into(), "NotReady".into())
    );

    // A repository that does not exist: reported, with a message, and nothing else.
    let bad = observed_project(&projects, "missing").await;
    assert_eq!(bad.repo_reachable, Some(false));
    assert_eq!(
        project_condition(&bad, "RepoReachable"),
        ("False".into(), "RepositoryUnavailable".into())
    );
    let message = &bad
        .conditions
        .iter()
        .find(|c| c.type_ == "RepoReachable")
        .unwrap()
        .message;
    assert!(
        message.contains("no-such-repository does not exist"),
        "{message}"
    );
    assert_eq!(bad.default_branch_head, None);
    assert_eq!(bad.head_observed_time, None);
    assert_eq!(bad.project_config_valid, None);
    assert_eq!(
        project_condition(&bad, "ProjectConfigValid").0,
        "Unknown",
        "the configuration was not read"
    );
    assert_eq!(project_condition(&bad, "Ready").0, "False");
    // The healthy project's status is untouched by the broken one.
    let good_again = projects.get("cli-sync").await.unwrap().status.unwrap();
    assert_eq!(good_again.default_branch_head, good.default_branch_head);
    assert_eq!(good_again.repo_reachable, Some(true));
    // The Project controller only observes: it materializes nothing.
    let items: Api<BuildWorkItem> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    assert!(
        items
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    controller.abort();
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_project_controller_reads_each_profiles_conformance_report() {
    let cluster = Cluster::connect("project-conformance").await;
    let (repo, _merge) = spec_repo("cli-sync");
    let url = format!("file://{}", repo.path().display());
    // kata has a passing report stored where its profile says; gvisor has none.
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let report = serde_json::to_string(&protobot_e2e::conformant_report("kata")).unwrap();
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "protobot-conformance-kata", "namespace": cluster.namespace},
            "data": {"report.json": report},
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    create_project_on(&cluster, "on-kata", &url, "kata").await;
    create_project_on(&cluster, "on-gvisor", &url, "gvisor").await;
    create_project_on(&cluster, "on-nothing", &url, "no-such-profile").await;
    let cache = tempfile::tempdir().unwrap();
    let mut ctx = protobot_controller::project::Context::new(
        cluster.client.clone(),
        cache.path().to_path_buf(),
    );
    ctx.profiles = Some(protobot_controller::project::ProfileReports {
        dir: std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../sandbox-profiles"),
        namespace: cluster.namespace.clone(),
    });
    let controller = tokio::spawn(protobot_controller::project::run_context(
        Some(cluster.namespace.clone()),
        std::sync::Arc::new(ctx),
    ));
    let projects: Api<Project> = Api::namespaced(cluster.client.clone(), &cluster.namespace);

    let kata = observed_project(&projects, "on-kata").await;
    assert_eq!(
        project_condition(&kata, "SandboxConformant"),
        ("True".into(), "Passed".into())
    );
    let summary = kata.sandbox_conformance.clone().unwrap();
    assert!(summary.passed && summary.profile == "kata" && summary.checks_passed == 1);
    assert_eq!(project_condition(&kata, "Ready").0, "True", "{kata:?}");

    // No report stored: the Job Site would refuse, so the condition says False.
    let gvisor = observed_project(&projects, "on-gvisor").await;
    assert_eq!(project_condition(&gvisor, "SandboxConformant").0, "False");
    assert_eq!(gvisor.sandbox_conformance, None);
    assert_eq!(project_condition(&gvisor, "Ready").0, "False");

    // A profile the operator does not have: Unknown, with the path it looked at.
    let nothing = observed_project(&projects, "on-nothing").await;
    let (status, _) = project_condition(&nothing, "SandboxConformant");
    assert_eq!(status, "Unknown");
    let message = &nothing
        .conditions
        .iter()
        .find(|c| c.type_ == "SandboxConformant")
        .unwrap()
        .message;
    assert!(message.contains("no-such-profile.yaml"), "{message}");
    controller.abort();
    cluster.cleanup().await;
}
