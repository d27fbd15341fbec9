#![allow(clippy::unwrap_used, clippy::expect_used)]
//! GitOps registration: applying a `ChangeSet` or a `BugReport` manifest is all it takes.

use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use protobot_api::{BugReport, BuildWorkItem, ChangeSet, ChangeType, LifecycleState, Project};
use protobot_e2e::{Cluster, bwrap_installed, timeout};
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
    let (controller, _cache, change_sets) =
        registration(&cluster, protobot_e2e::LOCAL_REPOSITORIES);
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
    let (controller, _cache, change_sets) =
        registration(&cluster, protobot_e2e::LOCAL_REPOSITORIES);
    assert_eq!(
        condition(&change_sets, "Verified").await,
        ("False".into(), "MergeCommitNotFound".into())
    );
    assert_eq!(work_items(&cluster).await, 0, "no work item");
    controller.abort();
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_only_operator_reads_no_local_repository_for_a_change_set() {
    let cluster = Cluster::connect("local-refused").await;
    let (repo, merge) = spec_repo("cli-sync");
    apply(&cluster, repo.path(), &merge).await;
    // As deployed: without --allow-local-repositories.
    let (controller, cache, change_sets) = registration(&cluster, Default::default());
    assert_eq!(
        condition(&change_sets, "Verified").await,
        ("Unknown".into(), "RepositoryUnavailable".into())
    );
    let cs = change_sets.get("cs-00001").await.unwrap();
    let verified = cs
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Verified")
        .unwrap();
    assert!(
        verified.message.contains("--allow-local-repositories"),
        "{}",
        verified.message
    );
    // Nothing was read: no clone in the cache, no work item.
    let cloned: Vec<_> = walk(cache.path())
        .into_iter()
        .filter(|p| p.ends_with(".git"))
        .collect();
    assert!(cloned.is_empty(), "{cloned:?}");
    assert_eq!(work_items(&cluster).await, 0, "no work item");
    controller.abort();
    cluster.cleanup().await;
}

/// The ChangeSet controller started for the scenario's namespace under `policy`, with its
/// clone cache (kept until the scenario ends) and the namespace's ChangeSets.
fn registration(
    cluster: &Cluster,
    policy: protobot_controller::project::decide::RepositoryPolicy,
) -> (
    tokio::task::JoinHandle<()>,
    tempfile::TempDir,
    Api<ChangeSet>,
) {
    let cache = tempfile::tempdir().unwrap();
    let controller = tokio::spawn(protobot_controller::changeset::run_with(
        cluster.operator.clone(),
        Some(cluster.namespace.clone()),
        cache.path().to_path_buf(),
        policy,
    ));
    let change_sets = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    (controller, cache, change_sets)
}

/// How many BuildWorkItems the scenario's namespace holds.
async fn work_items(cluster: &Cluster) -> usize {
    let items: Api<BuildWorkItem> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    items.list(&Default::default()).await.unwrap().items.len()
}

/// Every path under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path.clone());
            }
            out.push(path);
        }
    }
    out
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
        cluster.operator.clone(),
        Some(cluster.namespace.clone()),
        cache.path().to_path_buf(),
        protobot_e2e::LOCAL_REPOSITORIES,
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
    assert_eq!(work_items(&cluster).await, 0, "no work item");
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
    ctx.repositories = protobot_e2e::LOCAL_REPOSITORIES;
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

// === BugReport: true bugs registered like change sets ===

fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

async fn create_bug(cluster: &Cluster, name: &str, bug_id: &str, violates: &[&str]) {
    let bugs: Api<BugReport> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let bug: BugReport = serde_json::from_value(json!({
        "apiVersion": "protobot.dev/v1alpha1", "kind": "BugReport",
        "metadata": {"name": name, "namespace": cluster.namespace},
        "spec": {
            "projectRef": {"name": "cli-sync"},
            "bugId": bug_id,
            "violatedRequirements": violates,
            "businessPriority": "high",
            "summary": "sync --dry-run writes files",
        },
    }))
    .unwrap();
    bugs.create(&PostParams::default(), &bug).await.unwrap();
}

/// Waits (through a watch, bounded) until the BugReport's status was computed
/// from `generation` and its condition `type_` settled (not `Pending`).
async fn settled_bug(api: &Api<BugReport>, name: &str, generation: i64, type_: &str) -> BugReport {
    let settled = |b: Option<&BugReport>| {
        b.and_then(|b| b.status.as_ref()).is_some_and(|s| {
            s.observed_generation == Some(generation)
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == type_ && c.reason != "Pending")
        })
    };
    protobot_testkit::wait::until(api, name, timeout(), settled)
        .await
        .unwrap()
        .unwrap()
}

fn bug_condition(bug: &BugReport, type_: &str) -> (String, String, String) {
    let c = bug
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap();
    (c.status.to_string(), c.reason.clone(), c.message.clone())
}

/// Edits the BugReport's spec (a merge patch) and returns the new generation.
async fn edit_bug(api: &Api<BugReport>, name: &str, spec: serde_json::Value) -> i64 {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "spec": spec })),
    )
    .await
    .unwrap()
    .metadata
    .generation
    .unwrap()
}

/// A scenario's namespace with the example project authored into
/// `<tmp>/origin.git` and its `Project` (`cli-sync`) applied.
async fn example_project(scenario: &str) -> (Cluster, tempfile::TempDir, std::path::PathBuf) {
    let cluster = Cluster::connect(scenario).await;
    let tmp = tempfile::tempdir().unwrap();
    let (work, origin) = (tmp.path().join("work"), tmp.path().join("origin.git"));
    protobot_demo::example::author(&work, &origin).unwrap();
    create_project(
        &cluster,
        "cli-sync",
        &format!("file://{}", origin.display()),
    )
    .await;
    (cluster, tmp, origin)
}

async fn bug_controller(cluster: &Cluster, cache: &std::path::Path) -> tokio::task::JoinHandle<()> {
    tokio::spawn(protobot_controller::bugreport::run_with(
        cluster.operator.clone(),
        Some(cluster.namespace.clone()),
        cache.to_path_buf(),
        protobot_e2e::LOCAL_REPOSITORIES,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_bug_report_materializes_one_bug_work_item_and_reapplying_it_is_idempotent() {
    let (cluster, tmp, origin) = example_project("bug-report").await;
    let work = tmp.path().join("work");
    let head = git(&origin, &["rev-parse", "refs/heads/main"]);
    create_bug(&cluster, "gh-1", "GH-1", &["REQ-CLI-00001"]).await;
    let controller = bug_controller(&cluster, &tmp.path().join("cache")).await;
    let bugs: Api<BugReport> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let items: Api<BuildWorkItem> = Api::namespaced(cluster.client.clone(), &cluster.namespace);

    // Applied: Valid, facts recorded at the default-branch head, one work item.
    let bug = settled_bug(&bugs, "gh-1", 1, "Materialized").await;
    assert_eq!(
        bug_condition(&bug, "Materialized").0,
        "True",
        "{:?}",
        bug.status
    );
    assert_eq!(bug_condition(&bug, "Materialized").1, "WorkItemCreated");
    let (valid, reason, message) = bug_condition(&bug, "Valid");
    assert_eq!(
        (valid.as_str(), reason.as_str()),
        ("True", "RequirementsActive")
    );
    assert!(
        message.contains("REQ-CLI-00001") && message.contains(&head),
        "{message}"
    );
    let status = bug.status.clone().unwrap();
    let facts = status.recorded_facts.clone().unwrap();
    assert_eq!(facts.spec_commit, head);
    assert_eq!(
        facts.materialization_key,
        format!("cli-sync/bug:GH-1@{head}")
    );
    assert_eq!(facts.violated_requirements, ["REQ-CLI-00001"]);
    assert_eq!(facts.priority, "high");
    // Every impact candidate is applicable, the violated requirement first of all.
    let impact = status.impact.clone().unwrap();
    assert_eq!(impact.change_type, ChangeType::Contradicts);
    assert!(
        impact
            .applicable_requirements
            .contains(&"REQ-CLI-00001".to_string())
    );
    for candidate in &facts.impact {
        assert!(
            impact
                .applicable_requirements
                .contains(&candidate.requirement_id),
            "{candidate:?} is not applicable"
        );
    }
    let name = status.work_item_ref.clone().unwrap().name;
    assert!(name.starts_with("wi-bug-gh-1-"), "{name}");
    let item = items.get(&name).await.unwrap();
    assert_eq!(item.spec.change_type, ChangeType::Contradicts);
    assert_eq!(item.spec.change_set_ref, None);
    assert_eq!(item.spec.materialization_key, facts.materialization_key);
    assert_eq!(
        item.status.as_ref().unwrap().state,
        LifecycleState::ReadyForBuilding
    );

    // The in-cluster Job Site rebuilds the bug's contract from the BugReport
    // statuses alone (no intake directory, no read of the moved branch).
    let intakes =
        protobot_controller::jobsite::recorded_bug_intakes("cli-sync", std::slice::from_ref(&bug));
    let contracts = protobot_jobsite::site::RegisteredContracts::new(work.clone(), "main")
        .with_bug_intakes(intakes);
    let mut record = protobot_lifecycle::WorkItemRecord::new(
        &item.spec.work_item_id,
        "cli-sync",
        protobot_lifecycle::State::ReadyForBuilding,
        1,
    );
    record.materialization_key = item.spec.materialization_key.clone();
    let contract = protobot_jobsite::site::ContractSource::contract(&contracts, &record).unwrap();
    assert_eq!(contract.change_type, "contradicts");
    assert_eq!(contract.spec_commit, head);
    assert_eq!(
        contract.applicable_requirement_ids,
        impact.applicable_requirements
    );

    // Re-applied after the default branch moved: the recorded facts are reused,
    // so it is the same key, the same item, and nothing new.
    git(&work, &["commit", "-q", "--allow-empty", "-m", "unrelated"]);
    git(&work, &["push", "-q", "origin", "main"]);
    assert_ne!(git(&origin, &["rev-parse", "refs/heads/main"]), head);
    let generation = edit_bug(
        &bugs,
        "gh-1",
        json!({"summary": "sync --dry-run writes files (seen again)"}),
    )
    .await;
    assert!(generation > 1);
    let again = settled_bug(&bugs, "gh-1", generation, "Materialized").await;
    let again_status = again.status.clone().unwrap();
    assert_eq!(again_status.work_item_ref, status.work_item_ref);
    assert_eq!(again_status.recorded_facts, status.recorded_facts);
    assert_eq!(bug_condition(&again, "Materialized").1, "WorkItemCreated");
    assert_eq!(
        items.list(&Default::default()).await.unwrap().items.len(),
        1
    );

    // Changed facts are refused on status; the existing item stays the only one.
    let generation = edit_bug(
        &bugs,
        "gh-1",
        json!({"violatedRequirements": ["REQ-CLI-00002"]}),
    )
    .await;
    let changed =
        protobot_testkit::wait::until(&bugs, "gh-1", timeout(), |b: Option<&BugReport>| {
            b.and_then(|b| b.status.as_ref()).is_some_and(|s| {
                s.observed_generation == Some(generation)
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Valid" && c.reason == "FactsChanged")
            })
        })
        .await
        .unwrap()
        .unwrap();
    let (valid, _, message) = bug_condition(&changed, "Valid");
    assert_eq!(valid, "False");
    assert!(
        message.contains("another bug ID") && message.contains("REQ-CLI-00002"),
        "{message}"
    );
    assert_eq!(
        changed.status.as_ref().unwrap().work_item_ref,
        status.work_item_ref
    );
    assert_eq!(
        changed.status.as_ref().unwrap().recorded_facts,
        status.recorded_facts
    );
    assert_eq!(
        items.list(&Default::default()).await.unwrap().items.len(),
        1
    );
    controller.abort();
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bug_report_naming_an_unknown_requirement_is_reported_and_materializes_nothing() {
    let (cluster, tmp, _origin) = example_project("bug-unknown").await;
    create_bug(&cluster, "gh-2", "GH-2", &["REQ-CLI-09999"]).await;
    let controller = bug_controller(&cluster, &tmp.path().join("cache")).await;
    let bugs: Api<BugReport> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let bug = settled_bug(&bugs, "gh-2", 1, "Valid").await;
    let (valid, reason, message) = bug_condition(&bug, "Valid");
    assert_eq!(
        (valid.as_str(), reason.as_str()),
        ("False", "UnknownRequirement")
    );
    assert!(
        message.contains("REQ-CLI-09999") && message.contains("not an active requirement"),
        "{message}"
    );
    assert_eq!(
        bug_condition(&bug, "Materialized"),
        (
            "False".into(),
            "Pending".into(),
            "waiting for active requirements".into()
        )
    );
    let status = bug.status.unwrap();
    assert_eq!((status.work_item_ref, status.recorded_facts), (None, None));
    assert_eq!(work_items(&cluster).await, 0, "no work item");
    controller.abort();
    cluster.cleanup().await;
}

/// The whole way in the cluster: a BugReport is materialized by its controller
/// and the in-cluster Job Site builds the item to `completed` from the facts
/// recorded on the BugReport's status, merging it into `main` with the bug item's
/// `Work-Item:` trailer. (The example's scripted workers implement every
/// requirement whatever the contract names, so this proves the plumbing, not
/// the workers' judgment.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_bug_report_is_built_to_completed_by_the_in_cluster_job_site() {
    use protobot_demo::example::{INTEGRATION, WORKER_A, WORKER_B};
    if !bwrap_installed() {
        return;
    }
    let cluster = Cluster::connect("bug-built").await;
    let (client, ns) = (cluster.client.clone(), cluster.namespace.clone());
    let tmp = tempfile::tempdir().unwrap();
    let (work, origin) = (tmp.path().join("work"), tmp.path().join("origin.git"));
    protobot_demo::example::author(&work, &origin).unwrap();
    let class = |script: &str| json!({"command": ["sh", "-c", script], "image": null}).to_string();
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &ns);
    maps.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cli-sync-workers", "namespace": ns},
            "data": {
                "worker-a": class(WORKER_A),
                "worker-b": class(WORKER_B),
                "integration": class(INTEGRATION),
            },
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let projects: Api<Project> = Api::namespaced(client.clone(), &ns);
    projects
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
                "metadata": {"name": "cli-sync", "namespace": ns},
                "spec": {
                    "repoUrl": format!("file://{}", origin.display()),
                    "sandboxProfile": "local",
                    "workerClassesRef": {"name": "cli-sync-workers"},
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    create_bug(&cluster, "gh-1", "GH-1", &["REQ-CLI-00001"]).await;
    let registration = bug_controller(&cluster, &tmp.path().join("registry")).await;
    let job_site = tokio::spawn(protobot_controller::jobsite::run(
        cluster.operator.clone(),
        Some(ns.clone()),
        protobot_controller::jobsite::Settings {
            identity: "protobot-0".into(),
            workdir: tmp.path().join("jobsite"),
            interval: std::time::Duration::from_millis(200),
            limits: Default::default(),
            egress_proxy: None,
            claim_sweeps: Default::default(),
            metrics: None,
            repositories: protobot_e2e::LOCAL_REPOSITORIES,
            ..protobot_controller::jobsite::Settings::new(
                "protobot-0",
                tmp.path().join("jobsite"),
                8,
            )
        },
        std::sync::Arc::new(protobot_executors::LocalExecutor::new(
            protobot_executors::BubblewrapConfig::under(&tmp.path().join("sandbox")),
            false,
        )),
    ));
    let bugs: Api<BugReport> = Api::namespaced(client.clone(), &ns);
    let bug = settled_bug(&bugs, "gh-1", 1, "Materialized").await;
    let name = bug.status.unwrap().work_item_ref.unwrap().name;
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), &ns);
    let completed =
        protobot_testkit::wait::until(&items, &name, timeout() * 6, |i: Option<&BuildWorkItem>| {
            i.and_then(|i| i.status.as_ref())
                .is_some_and(|s| s.state == LifecycleState::Completed)
        })
        .await;
    let item = match completed {
        Ok(Some(item)) => item,
        other => {
            let now = items.get(&name).await.ok().and_then(|i| i.status);
            panic!("{name} did not complete ({other:?}); its status: {now:#?}")
        }
    };
    assert_eq!(item.spec.change_type, ChangeType::Contradicts);
    let trailers = git(
        &origin,
        &[
            "log",
            "--first-parent",
            "--merges",
            "--format=%(trailers:key=Work-Item,valueonly)",
            "main",
        ],
    );
    let trailers: Vec<&str> = trailers
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(
        trailers,
        [item.spec.work_item_id.as_str()],
        "exactly one merge, the bug item's"
    );
    assert_eq!(
        items.list(&Default::default()).await.unwrap().items.len(),
        1
    );
    job_site.abort();
    registration.abort();
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_project_registers_change_sets_merged_since_its_baseline() {
    // The alternative to GitOps manifests: the Project polls its default branch.
    let cluster = Cluster::connect("poll").await;
    let ns = cluster.namespace.clone();
    let (repo, merge) = spec_repo("cli-sync");
    let before_merge = git(repo.path(), &["rev-parse", &format!("{merge}^1")]);
    let url = format!("file://{}", repo.path().display());
    let projects: Api<Project> = Api::namespaced(cluster.client.clone(), &ns);
    for (name, polling) in [
        ("cli-sync", json!({"sinceCommit": before_merge})),
        ("cli-sync-now", json!({})),
    ] {
        let project: Project = serde_json::from_value(json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"repoUrl": url, "sandboxProfile": "local", "pollApprovedChangeSets": polling},
        }))
        .unwrap();
        projects
            .create(&PostParams::default(), &project)
            .await
            .unwrap();
    }
    let cache = tempfile::tempdir().unwrap();
    let project_controller = tokio::spawn(protobot_controller::project::run_with(
        cluster.operator.clone(),
        Some(ns.clone()),
        cache.path().join("projects"),
        protobot_e2e::LOCAL_REPOSITORIES,
    ));
    let registration = tokio::spawn(protobot_controller::changeset::run_with(
        cluster.operator.clone(),
        Some(ns.clone()),
        cache.path().join("registry"),
        protobot_e2e::LOCAL_REPOSITORIES,
    ));
    // The change set merged after sinceCommit is registered, owned by its
    // Project, and materialized like an applied manifest.
    let change_sets: Api<ChangeSet> = Api::namespaced(cluster.client.clone(), &ns);
    let registered = protobot_testkit::wait::until(
        &change_sets,
        "cli-sync-cs-00001",
        timeout(),
        |cs: Option<&ChangeSet>| {
            cs.and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.work_item_ref.is_some())
        },
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(registered.spec.change_set_id, "CS-00001");
    assert_eq!(registered.spec.merge_commit, merge);
    assert!(
        registered
            .metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| o
                .iter()
                .any(|o| o.kind == "Project" && o.name == "cli-sync"))
    );
    let items: Api<BuildWorkItem> = Api::namespaced(cluster.client.clone(), &ns);
    let item = items
        .get(&registered.status.unwrap().work_item_ref.unwrap().name)
        .await
        .unwrap();
    assert_eq!(item.status.unwrap().state, LifecycleState::ReadyForBuilding);
    // Without sinceCommit, polling counts from the head it first saw: the
    // history (CS-00001, merged before) is not registered again.
    let main_head = git(repo.path(), &["rev-parse", "refs/heads/main"]);
    let baseline = protobot_testkit::wait::until(
        &projects,
        "cli-sync-now",
        timeout(),
        |p: Option<&Project>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.poll_baseline.is_some())
        },
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(
        baseline.status.unwrap().poll_baseline.as_deref(),
        Some(main_head.as_str())
    );
    assert!(
        change_sets
            .get_opt("cli-sync-now-cs-00001")
            .await
            .unwrap()
            .is_none()
    );
    project_controller.abort();
    registration.abort();
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_bug_report_stays_until_its_work_item_is_finished() {
    // Its status is the only record of the facts the item's contract is
    // rebuilt from, so it must outlive an unfinished item.
    let (cluster, tmp, _origin) = example_project("bug-finalizer").await;
    create_bug(&cluster, "gh-2", "GH-2", &["REQ-CLI-00001"]).await;
    let controller = bug_controller(&cluster, &tmp.path().join("cache")).await;
    let bugs: Api<BugReport> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let bug = settled_bug(&bugs, "gh-2", 1, "Materialized").await;
    assert!(
        bug.metadata.finalizers.as_ref().is_some_and(|f| f
            .iter()
            .any(|f| f == protobot_controller::bugreport::decide::FINALIZER)),
        "{:?}",
        bug.metadata
    );
    let item_name = bug.status.unwrap().work_item_ref.unwrap().name;
    bugs.delete("gh-2", &Default::default()).await.unwrap();
    // The item is ready for building, not finished: the report stays.
    let terminating =
        protobot_testkit::wait::until(&bugs, "gh-2", timeout(), |b: Option<&BugReport>| {
            b.is_some_and(|b| b.metadata.deletion_timestamp.is_some())
        })
        .await
        .unwrap();
    assert!(
        terminating.is_some(),
        "the report is kept while its item is unfinished"
    );
    // The controller decided to keep it (its Event says why), and it is still there.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let waited = tokio::time::timeout(timeout(), async {
        use futures::StreamExt;
        use kube::runtime::WatchStreamExt;
        let mut seen = kube::runtime::watcher(events.clone(), Default::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(event)) = seen.next().await {
            if event.reason.as_deref() == Some("DeletionWaitsForWorkItem") {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(waited, Ok(true)),
        "no DeletionWaitsForWorkItem event"
    );
    assert!(bugs.get_opt("gh-2").await.unwrap().is_some(), "kept");
    // Once the item is finished, the report goes.
    let items: Api<BuildWorkItem> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    items
        .patch_status(
            &item_name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"state": "completed"}})),
        )
        .await
        .unwrap();
    // The controller looks again every 30 s; an edit of the report's labels
    // wakes it sooner.
    bugs.patch(
        "gh-2",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"labels": {"example.com/poke": "1"}}})),
    )
    .await
    .unwrap();
    let gone = protobot_testkit::wait::until(&bugs, "gh-2", timeout(), |b: Option<&BugReport>| {
        b.is_none()
    })
    .await
    .unwrap();
    assert!(gone.is_none(), "released once the item finished");
    controller.abort();
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotated_bug_report_abandons_its_unfinished_item_when_deleted() {
    // The way out for GitOps deletes: `protobot.dev/abandon-work-item: "true"`.
    let (cluster, tmp, _origin) = example_project("bug-abandon").await;
    create_bug(&cluster, "gh-3", "GH-3", &["REQ-CLI-00001"]).await;
    let controller = bug_controller(&cluster, &tmp.path().join("cache")).await;
    let bugs: Api<BugReport> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let bug = settled_bug(&bugs, "gh-3", 1, "Materialized").await;
    let item_name = bug.status.unwrap().work_item_ref.unwrap().name;
    bugs.patch(
        "gh-3",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {
            protobot_controller::bugreport::decide::ABANDON_ANNOTATION: "true"}}})),
    )
    .await
    .unwrap();
    bugs.delete("gh-3", &Default::default()).await.unwrap();
    let gone = protobot_testkit::wait::until(&bugs, "gh-3", timeout(), |b: Option<&BugReport>| {
        b.is_none()
    })
    .await
    .unwrap();
    assert!(gone.is_none(), "released once its item was abandoned");
    let items: Api<BuildWorkItem> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let item = items.get(&item_name).await.unwrap();
    assert_eq!(
        item.status.map(|s| s.state),
        Some(protobot_api::LifecycleState::Abandoned),
        "abandoned through the lifecycle, not deleted"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let abandoned = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .any(|e| e.reason.as_deref() == Some("WorkItemAbandoned"));
    assert!(abandoned, "the Event says what happened");
    controller.abort();
    cluster.cleanup().await;
}

/// GitOps tools apply a ChangeSet and its Project in either order: a ChangeSet applied first
/// reports `Verified=False ProjectNotFound`, and the Project's arrival alone (no edit of the
/// ChangeSet, no timer) registers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_set_applied_before_its_project_is_registered_when_the_project_arrives() {
    let cluster = Cluster::connect("gitops-order").await;
    let (repo, merge) = spec_repo("cli-sync");
    let registry = prometheus::Registry::new();
    let metrics = protobot_controller::metrics::JobSiteMetrics::register(
        &registry,
        std::sync::Arc::new(protobot_e2e::NoCounts),
    )
    .unwrap();
    let cache = tempfile::tempdir().unwrap();
    let controller = tokio::spawn(protobot_controller::changeset::run_metered(
        cluster.operator.clone(),
        Some(cluster.namespace.clone()),
        cache.path().to_path_buf(),
        protobot_e2e::LOCAL_REPOSITORIES,
        Some(metrics.clone()),
    ));
    let change_sets: Api<ChangeSet> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let cs: ChangeSet = serde_json::from_value(json!({
        "apiVersion": "protobot.dev/v1alpha1", "kind": "ChangeSet",
        "metadata": {"name": "cs-00001", "namespace": cluster.namespace},
        "spec": {"projectRef": {"name": "cli-sync"}, "changeSetId": "CS-00001", "mergeCommit": merge},
    }))
    .unwrap();
    change_sets
        .create(&PostParams::default(), &cs)
        .await
        .unwrap();
    assert_eq!(
        condition(&change_sets, "Verified").await,
        ("False".into(), "ProjectNotFound".into())
    );
    assert_eq!(
        work_items(&cluster).await,
        0,
        "no work item without a Project"
    );
    // The reconcile its own status write triggers has run too, so only the Project's arrival
    // can register the ChangeSet.
    protobot_e2e::until_reconciled(&metrics, "changeset", 2).await;
    create_project(
        &cluster,
        "cli-sync",
        &format!("file://{}", repo.path().display()),
    )
    .await;
    let materialized = protobot_testkit::wait::until(
        &change_sets,
        "cs-00001",
        timeout(),
        |cs: Option<&ChangeSet>| {
            cs.and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.work_item_ref.is_some())
        },
    )
    .await;
    assert!(
        matches!(materialized, Ok(Some(_))),
        "the Project's arrival did not register the ChangeSet: {:?}",
        change_sets
            .get("cs-00001")
            .await
            .ok()
            .and_then(|c| c.status)
    );
    assert_eq!(work_items(&cluster).await, 1, "exactly one work item");
    controller.abort();
    cluster.cleanup().await;
}

/// A BugReport applied before its Project reports `Valid=False ProjectNotFound`; the
/// Project's arrival alone registers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bug_report_applied_before_its_project_is_registered_when_the_project_arrives() {
    let cluster = Cluster::connect("bug-order").await;
    let tmp = tempfile::tempdir().unwrap();
    let (work, origin) = (tmp.path().join("work"), tmp.path().join("origin.git"));
    protobot_demo::example::author(&work, &origin).unwrap();
    create_bug(&cluster, "gh-1", "GH-1", &["REQ-CLI-00001"]).await;
    let registry = prometheus::Registry::new();
    let metrics = protobot_controller::metrics::JobSiteMetrics::register(
        &registry,
        std::sync::Arc::new(protobot_e2e::NoCounts),
    )
    .unwrap();
    let controller = tokio::spawn(protobot_controller::bugreport::run_metered(
        cluster.operator.clone(),
        Some(cluster.namespace.clone()),
        tmp.path().join("cache"),
        protobot_e2e::LOCAL_REPOSITORIES,
        Some(metrics.clone()),
    ));
    let bugs: Api<BugReport> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let bug = settled_bug(&bugs, "gh-1", 1, "Valid").await;
    let (status, reason, _) = bug_condition(&bug, "Valid");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ProjectNotFound")
    );
    // The reconcile its own status write triggers has run too, so only the Project's arrival
    // can register the BugReport.
    protobot_e2e::until_reconciled(&metrics, "bugreport", 2).await;
    assert_eq!(
        work_items(&cluster).await,
        0,
        "no work item without a Project"
    );
    create_project(
        &cluster,
        "cli-sync",
        &format!("file://{}", origin.display()),
    )
    .await;
    let materialized =
        protobot_testkit::wait::until(&bugs, "gh-1", timeout(), |b: Option<&BugReport>| {
            b.and_then(|b| b.status.as_ref())
                .is_some_and(|s| s.work_item_ref.is_some())
        })
        .await;
    assert!(
        matches!(materialized, Ok(Some(_))),
        "the Project's arrival did not register the BugReport: {:?}",
        bugs.get("gh-1").await.ok().and_then(|b| b.status)
    );
    assert_eq!(work_items(&cluster).await, 1, "exactly one work item");
    controller.abort();
    cluster.cleanup().await;
}
