#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Job Site in the cluster: apply a `Project` and a `ChangeSet` for the
//! bundled example and the operator takes it the rest of the way — the
//! `BuildWorkItem` completes, its `InspectionRun` is sealed and `main` has the
//! merge with the item's `Work-Item:` trailer.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{Api, runtime::WatchStreamExt};
use protobot_api::{
    BuildWorkItem, ChangeSet, ConditionStatus, InspectionRun, LifecycleState, Project,
};
use protobot_controller::jobsite::{Settings, run};
use protobot_demo::example::{INTEGRATION, WORKER_A, WORKER_B, author};
use protobot_e2e::{Cluster, bwrap_installed, create_object, timeout, worker_class};
use protobot_executors::{BubblewrapConfig, LocalExecutor};
use serde_json::json;

#[path = "../../operator/repo/tests/support/git_servers.rs"]
#[allow(dead_code)]
mod git_servers;

use git_servers::{GitServers, files_containing};

/// A worker class whose runs may reach the egress proxy.
fn class_with_egress(script: &str) -> String {
    json!({"command": ["sh", "-c", script], "image": null, "egress": true}).to_string()
}

/// The egress proxy the pods scenario configures (never contacted: the
/// scripted workers need no network).
const EGRESS_PROXY: &str = "http://protobot-egress-proxy.protobot-system.svc:3128";

/// Where a scenario's repository is served from.
enum Served<'a> {
    /// A bare repository beside the test, as `file://` (the operator allows local
    /// repositories for this scenario only).
    Local,
    /// The loopback HTTPS (TLS, basic auth) or SSH server of `scripts/git-test-servers`,
    /// read and pushed with the credentials of a Secret the Project names.
    Remote(&'a GitServers, Transport),
}

/// How the operator reaches a [`Served::Remote`] repository.
#[derive(Clone, Copy, Debug)]
enum Transport {
    Https,
    Ssh,
}

/// Runs git in `dir`; panics with its output when it fails.
fn git(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Where a scenario's Project reads and lands: its `spec.repoUrl` and the Secret it
/// names (`spec.credentialsSecretRef`), if any.
struct ProjectRepo {
    url: String,
    secret: Option<String>,
}

/// The example's worker classes, Project and ChangeSet.
async fn apply_example(
    client: &kube::Client,
    ns: &str,
    repo: &ProjectRepo,
    merge: &str,
    sandbox_profile: &str,
    egress: bool,
) {
    let worker_b = if egress {
        class_with_egress(WORKER_B)
    } else {
        worker_class(WORKER_B)
    };
    create_object(
        &Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cli-sync-workers", "namespace": ns},
            "data": {
                "worker-a": worker_class(WORKER_A),
                "worker-b": worker_b,
                "integration": worker_class(INTEGRATION),
            },
        }),
    )
    .await;
    let mut spec = json!({
        "repoUrl": repo.url,
        "sandboxProfile": sandbox_profile,
        "workerClassesRef": {"name": "cli-sync-workers"},
    });
    if let Some(secret) = &repo.secret {
        spec["credentialsSecretRef"] = json!({"name": secret});
    }
    create_object(
        &Api::<Project>::namespaced(client.clone(), ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "cli-sync", "namespace": ns},
            "spec": spec,
        }),
    )
    .await;
    create_object(
        &Api::<ChangeSet>::namespaced(client.clone(), ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "ChangeSet",
            "metadata": {"name": "cs-00001", "namespace": ns},
            "spec": {"projectRef": {"name": "cli-sync"}, "changeSetId": "CS-00001", "mergeCommit": merge},
        }),
    )
    .await;
}

/// Applies the example's Project, worker classes and ChangeSet, runs the
/// registration controller and the Job Site with `executor`, and checks the
/// item completes with one sealed InspectionRun and one merge on main.
async fn scenario<E: protobot_jobsite::executor::Executor + 'static>(
    cluster: &Cluster,
    tmp: &tempfile::TempDir,
    executor: Arc<E>,
    sandbox_profile: &str,
    egress_proxy: Option<&str>,
    served: Served<'_>,
) -> BuildWorkItem {
    let ns = cluster.namespace.clone();
    let (work, origin) = (tmp.path().join("work"), tmp.path().join("origin.git"));
    let merge = author(&work, &origin).unwrap();
    let client = cluster.client.clone();
    // Where the Project reads and lands, and the bare repository behind it on disk.
    let (repo, landed_in) = match served {
        Served::Local => (
            ProjectRepo {
                url: format!("file://{}", origin.display()),
                secret: None,
            },
            origin.clone(),
        ),
        Served::Remote(servers, transport) => {
            // The example's history becomes the served repository's.
            git(
                &origin,
                &[
                    "push",
                    "-q",
                    "--force",
                    &servers.bare.display().to_string(),
                    "main:main",
                ],
            );
            let secret = "cli-sync-git";
            let (url, data) = match transport {
                Transport::Https => (
                    servers.https_url.clone(),
                    servers.https_secret(&servers.password),
                ),
                Transport::Ssh => (
                    servers.ssh_url.clone(),
                    servers.ssh_secret(&servers.known_hosts),
                ),
            };
            protobot_e2e::create_secret(&client, &ns, secret, data).await;
            (
                ProjectRepo {
                    url,
                    secret: Some(secret.to_owned()),
                },
                servers.bare.clone(),
            )
        }
    };
    apply_example(
        &client,
        &ns,
        &repo,
        &merge,
        sandbox_profile,
        egress_proxy.is_some(),
    )
    .await;
    // The operator's metrics, as it registers them.
    let registry = prometheus::Registry::new();
    let metrics = protobot_controller::metrics::JobSiteMetrics::register(
        &registry,
        Arc::new(protobot_e2e::NoCounts),
    )
    .unwrap();
    // The operator's controllers run as the chart's ServiceAccount.
    let operator = cluster.operator.clone();
    // The Project controller (which also installs the process's credential source: Secrets
    // read through the operator's client, once per git operation). Local repositories are
    // allowed only where the scenario serves one.
    let mut project_ctx =
        protobot_controller::project::Context::new(operator.clone(), tmp.path().join("projects"));
    project_ctx.repositories = protobot_controller::project::decide::RepositoryPolicy {
        allow_local: repo.secret.is_none(),
    };
    let repositories = project_ctx.repositories;
    let projects = tokio::spawn(protobot_controller::project::run_context(
        Some(ns.clone()),
        Arc::new(project_ctx),
    ));
    let registration = tokio::spawn(protobot_controller::changeset::run_metered(
        operator.clone(),
        Some(ns.clone()),
        tmp.path().join("registry"),
        repositories,
        Some(metrics.clone()),
    ));
    let inspection_runs = tokio::spawn(protobot_controller::inspectionrun::run_metered(
        operator.clone(),
        Some(ns.clone()),
        Some(metrics.clone()),
    ));
    let job_site = tokio::spawn(run(
        operator.clone(),
        Some(ns.clone()),
        Settings {
            identity: "protobot-0".into(),
            workdir: tmp.path().join("jobsite"),
            interval: Duration::from_millis(200),
            limits: Default::default(),
            egress_proxy: egress_proxy.map(str::to_owned),
            // Every pass, for claims of any age: the scenario deletes its finished item.
            claim_sweeps: protobot_controller::jobsite::ClaimSweeps::new(
                Duration::ZERO,
                Duration::ZERO,
            ),
            metrics: Some(metrics.clone()),
            repositories,
            ..Settings::new("protobot-0", tmp.path().join("jobsite"), 8)
        },
        executor,
    ));
    // Registration names the work item; then the Job Site takes it to completed.
    let completed = protobot_e2e::registered_item_completes(&client, &ns, "cs-00001").await;
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), &ns);
    let name = completed.metadata.name.clone().unwrap();
    assert_eq!(
        items.list(&Default::default()).await.unwrap().items.len(),
        1,
        "exactly one work item"
    );
    let item = &completed;
    // Its inspection run is sealed and owned by the item.
    let runs: Api<InspectionRun> = Api::namespaced(client.clone(), &ns);
    // Sealed by the Job Site, and said so by the InspectionRun controller's
    // conditions.
    let is_sealed = |r: &InspectionRun| {
        r.status.as_ref().is_some_and(|s| {
            s.sealed.is_some()
                && ["ProducersComplete", "Sealed"].iter().all(|t| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == *t && c.status == ConditionStatus::True)
                })
        })
    };
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
        .current_dir(&landed_in)
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
    // Its status shows the cycles for humans: Worker B's first attempt failed a test.
    let outcomes: Vec<String> = item
        .status
        .as_ref()
        .unwrap()
        .cycles
        .iter()
        .map(|c| {
            serde_json::to_value(c.outcome)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(outcomes, ["implementation-fault", "passed"]);
    // Transitions are reported as Kubernetes Events on the item; a finished item
    // no longer carries the unfinished-work finalizer.
    // Events are published when the Job Site's pass ends, after the status write
    // the wait above saw: wait for the event (bounded) rather than list once.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let item_name = kube::ResourceExt::name_any(item);
    let is_completed = |e: &k8s_openapi::api::events::v1::Event| {
        e.reason.as_deref() == Some("Completed")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(item_name.as_str())
    };
    let completed_event = tokio::time::timeout(timeout(), async {
        let mut seen = kube::runtime::watcher(events.clone(), Default::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(event)) = seen.next().await {
            if is_completed(&event) {
                return true;
            }
        }
        false
    })
    .await;
    let reported = events.list(&Default::default()).await.unwrap().items;
    assert!(
        matches!(completed_event, Ok(true)) && reported.iter().any(is_completed),
        "no Completed event for the item: {:?}",
        reported.iter().map(|e| &e.reason).collect::<Vec<_>>()
    );
    let finalized =
        protobot_testkit::wait::until(&items, &name, timeout(), |i: Option<&BuildWorkItem>| {
            i.is_some_and(|i| {
                !kube::ResourceExt::finalizers(i)
                    .iter()
                    .any(|f| f == protobot_controller::jobsite::FINALIZER)
            })
        })
        .await;
    assert!(
        matches!(finalized, Ok(Some(_))),
        "the finalizer stayed on a completed item"
    );
    // The passes were counted: a claim, one merge, an item that took two cycles.
    assert!(metrics.claims.with_label_values(&["allowed"]).get() >= 1);
    assert_eq!(metrics.merges.with_label_values(&["merged"]).get(), 1);
    assert_eq!(metrics.triage_cycles.get_sample_count(), 1);
    assert!((metrics.triage_cycles.get_sample_sum() - 2.0).abs() < f64::EPSILON);
    assert_eq!(metrics.registration_to_completion.get_sample_count(), 1);
    // The project's Job Site is kept between dispatches: its clone is fetched when the Job
    // Site is built, when an item arrives or a build stops with an error, not on every
    // dispatch: ten more dispatches (one every 200 ms here) fetch nothing.
    let fetches = || metrics.repository_fetches.with_label_values(&["ok"]).get();
    let dispatches = || {
        metrics
            .reconcile_duration
            .with_label_values(&["buildworkitem"])
            .get_sample_count()
    };
    let (fetched, dispatched) = (fetches(), dispatches());
    assert!(fetched >= 1, "the clone was fetched");
    tokio::time::timeout(timeout(), async {
        while dispatches() < dispatched + 10 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the dispatcher stopped dispatching");
    assert_eq!(
        fetches(),
        fetched,
        "an idle dispatch fetched the repository"
    );
    // A reconcile is timed when it returns, which can be just after the writes
    // waited for above (the Job Site's pass goes on to its claim sweep).
    for controller in ["changeset", "inspectionrun", "buildworkitem"] {
        let timed = || {
            metrics
                .reconcile_duration
                .with_label_values(&[controller])
                .get_sample_count()
        };
        let counted = tokio::time::timeout(timeout(), async {
            while timed() == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(counted.is_ok(), "no {controller} reconcile was timed");
    }
    // Deleting the finished item takes its idempotency-key claims with it (the
    // Job Site's claim sweep); nothing else of the project goes.
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), &ns);
    let work_item_id = item.spec.work_item_id.clone();
    let claims_of_item = || async {
        let listed = maps
            .list(&kube::api::ListParams::default().labels("protobot.dev/wms-kind=key"))
            .await
            .unwrap()
            .items;
        listed
            .iter()
            .filter(|cm| {
                cm.data
                    .as_ref()
                    .and_then(|d| d.get("value"))
                    .and_then(|v| serde_json::from_str::<serde_json::Value>(v).ok())
                    .is_some_and(|v| v["home"] == serde_json::json!(work_item_id))
            })
            .count()
    };
    let reservations = || async {
        maps.list(&kube::api::ListParams::default().labels("protobot.dev/wms-kind=reservation"))
            .await
            .unwrap()
            .items
            .len()
    };
    assert!(claims_of_item().await > 0, "the build left key claims");
    let reserved = reservations().await;
    items
        .delete(&name, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    let swept = tokio::time::timeout(timeout() * 2, async {
        while claims_of_item().await > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(swept.is_ok(), "the deleted item's key claims stayed");
    // Owner garbage collection (the kube-controller-manager's on a real server): the
    // item's InspectionRuns and sandbox pods go with it.
    let item_uid = kube::ResourceExt::uid(item).unwrap_or_default();
    let owned_by_item = |refs: Option<
        &Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>,
    >| { refs.is_some_and(|o| o.iter().any(|o| o.uid == item_uid)) };
    let runs_api: Api<InspectionRun> = Api::namespaced(client.clone(), &ns);
    let pods_api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let collected = tokio::time::timeout(timeout() * 2, async {
        loop {
            let runs = runs_api.list(&Default::default()).await.unwrap().items;
            let pods = pods_api.list(&Default::default()).await.unwrap().items;
            if !runs
                .iter()
                .any(|r| owned_by_item(r.metadata.owner_references.as_ref()))
                && !pods
                    .iter()
                    .any(|p| owned_by_item(p.metadata.owner_references.as_ref()))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        collected.is_ok(),
        "the deleted item's InspectionRuns or pods were not garbage-collected"
    );
    assert_eq!(
        reservations().await,
        reserved,
        "reservations are kept: the change set must not materialize again"
    );
    // The Project controller read the repository through the same Secret.
    let projects_api: Api<Project> = Api::namespaced(client.clone(), &ns);
    let reachable = protobot_testkit::wait::until(
        &projects_api,
        "cli-sync",
        timeout(),
        |p: Option<&Project>| condition_is(p, "RepoReachable", "True"),
    )
    .await;
    assert!(
        matches!(reachable, Ok(Some(_))),
        "the Project never reported RepoReachable=True: {:?}",
        projects_api
            .get("cli-sync")
            .await
            .ok()
            .and_then(|p| p.status)
    );
    job_site.abort();
    registration.abort();
    inspection_runs.abort();
    projects.abort();
    completed
}

/// Whether the Project reports condition `type_` with `status`.
fn condition_is(project: Option<&Project>, type_: &str, status: &str) -> bool {
    project.and_then(|p| p.status.as_ref()).is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status.to_string() == status)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_work_item_cannot_disappear() {
    let cluster = Cluster::connect("finalizer").await;
    let ns = cluster.namespace.clone();
    let client = cluster.client.clone();
    let tmp = tempfile::tempdir().unwrap();
    let (work, origin) = (tmp.path().join("work"), tmp.path().join("origin.git"));
    let merge = author(&work, &origin).unwrap();
    let repo = ProjectRepo {
        url: format!("file://{}", origin.display()),
        secret: None,
    };
    apply_example(&client, &ns, &repo, &merge, "local", false).await;
    let registration = tokio::spawn(protobot_controller::changeset::run_with(
        cluster.operator.clone(),
        Some(ns.clone()),
        tmp.path().join("registry"),
        protobot_e2e::LOCAL_REPOSITORIES,
    ));
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
    // A Job Site whose executor refuses claims nothing but still guards the item.
    let refusing = Arc::new(
        protobot_jobsite::testing::InProcessExecutor::new(&tmp.path().join("runs"))
            .refusing("no conformance report"),
    );
    let settings = Settings {
        identity: "protobot-0".into(),
        workdir: tmp.path().join("jobsite"),
        interval: Duration::from_millis(200),
        limits: Default::default(),
        egress_proxy: None,
        claim_sweeps: Default::default(),
        metrics: None,
        repositories: protobot_e2e::LOCAL_REPOSITORIES,
        ..Settings::new("protobot-0", tmp.path().join("jobsite"), 8)
    };
    let job_site = tokio::spawn(run(
        cluster.operator.clone(),
        Some(ns.clone()),
        settings,
        refusing,
    ));
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), &ns);
    let item =
        protobot_testkit::wait::until(&items, &name, timeout(), |i: Option<&BuildWorkItem>| {
            i.is_some_and(|i| {
                kube::ResourceExt::finalizers(i)
                    .iter()
                    .any(|f| f == protobot_controller::jobsite::FINALIZER)
            })
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        item.status.as_ref().unwrap().state,
        LifecycleState::ReadyForBuilding
    );
    assert!(
        kube::ResourceExt::finalizers(&item)
            .iter()
            .any(|f| f == protobot_controller::jobsite::FINALIZER),
        "{:?}",
        item.metadata.finalizers
    );
    items.delete(&name, &Default::default()).await.unwrap();
    let still = items.get(&name).await.unwrap();
    assert!(
        still.metadata.deletion_timestamp.is_some(),
        "deletion is pending, not done, while the work is unfinished"
    );
    job_site.abort();
    registration.abort();
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_change_set_is_built_inspected_and_merged_by_the_operator() {
    if !bwrap_installed() {
        return;
    }
    let cluster = Cluster::connect("jobsite").await;
    let tmp = tempfile::tempdir().unwrap();
    let executor = Arc::new(LocalExecutor::new(
        BubblewrapConfig::under(&tmp.path().join("sandbox")),
        false,
    ));
    scenario(&cluster, &tmp, executor, "local", None, Served::Local).await;
    cluster.cleanup().await;
}

/// The same scenario with every role in a pod from the `kata` sandbox profile,
/// run by the double's kubelet in bubblewrap. The double stands in for a
/// conformant Kata deployment: its conformance report is given, not measured
/// (the suite itself fails closed on this backend, see protobot-kube-executor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_runs_every_role_in_pods_from_the_sandbox_profile() {
    use k8s_openapi::api::core::v1::Pod;
    use protobot_kube_executor::{
        KubeExecutorConfig, KubernetesExecutor, SandboxProfile, StagingOwnership, StagingVolume,
    };
    let Some(bwrap) = protobot_testkit::BubblewrapContainerExecutor::from_path() else {
        assert!(std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none());
        eprintln!("skipping: bubblewrap is not installed");
        return;
    };
    let cluster = Cluster::connect("jobsite-pods").await;
    let ns = cluster.namespace.clone();
    // The node: the double's kubelet, or on a real API server a simulated kubelet that is
    // its client (it registers a Node, binds this namespace's pods and reports their
    // status). Either way the staging claim is a node directory this test shares with
    // the pods, as an in-cluster operator shares the claim.
    let kubelet = match cluster.double() {
        Some(double) => {
            protobot_testkit::Kubelet::start_with(double, Arc::new(bwrap), "sandbox-node").unwrap()
        }
        None => {
            protobot_e2e::sandbox_platform(&cluster, "kata").await;
            protobot_testkit::Kubelet::connect(
                cluster.client.clone(),
                Arc::new(bwrap),
                &format!("node-{ns}"),
                vec![ns.clone()],
            )
            .await
            .unwrap()
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let mut config = KubeExecutorConfig::new(
        &ns,
        StagingVolume {
            claim_name: "protobot-staging".into(),
            mount_path: kubelet.claim_dir(&ns, "protobot-staging").unwrap(),
        },
        tmp.path().join("collected"),
    );
    config.default_image = Some("registry.example.invalid/worker:e2e".into());
    // The double's kubelet runs containers as this test's uid.
    config.staging_ownership = StagingOwnership::Keep;
    // As the operator configures it: a run's pod is owned by its BuildWorkItem.
    config.work_item_owner = Some(protobot_kube_executor::WorkItemOwner {
        api_version: "protobot.dev/v1alpha1".into(),
        kind: "BuildWorkItem".into(),
        plural: "buildworkitems".into(),
        name_of: protobot_stores::kubernetes::item_name,
    });
    // Worker B's class asks for egress: its runs get a session token.
    config.egress_session_secret = Some(protobot_egress::SessionSecret::new(vec![1u8; 32]));
    let profile = SandboxProfile::load(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../sandbox-profiles/kata.yaml"
    )))
    .unwrap();
    let report = protobot_e2e::conformant_report("kata");
    let executor = Arc::new(
        KubernetesExecutor::new(cluster.operator.clone(), config, profile, Some(report)).unwrap(),
    );
    // Record every pod the operator creates.
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    let seen = Arc::new(std::sync::Mutex::new(Vec::<Pod>::new()));
    let recorder = {
        let seen = seen.clone();
        tokio::spawn(
            kube::runtime::watcher(pods, Default::default())
                .applied_objects()
                .for_each(move |p| {
                    if let Ok(p) = p {
                        seen.lock().unwrap().push(p);
                    }
                    async {}
                }),
        )
    };
    scenario(
        &cluster,
        &tmp,
        executor,
        "kata",
        Some(EGRESS_PROXY),
        Served::Local,
    )
    .await;
    recorder.abort();
    let seen = seen.lock().unwrap().clone();
    let mut roles = std::collections::BTreeSet::new();
    assert!(!seen.is_empty(), "the operator created no pods");
    for pod in &seen {
        let spec = pod.spec.as_ref().unwrap();
        let name = kube::ResourceExt::name_any(pod);
        assert_eq!(spec.runtime_class_name.as_deref(), Some("kata"), "{name}");
        assert_eq!(spec.automount_service_account_token, Some(false), "{name}");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"), "{name}");
        assert!(
            spec.active_deadline_seconds.is_some_and(|d| d > 0),
            "{name}"
        );
        for c in &spec.containers {
            let sc = c.security_context.as_ref().unwrap();
            assert_eq!(sc.run_as_non_root, Some(true), "{name}");
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{name}");
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{name}");
            let limits = c
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .unwrap();
            assert!(
                limits.contains_key("memory") && limits.contains_key("cpu"),
                "{name}"
            );
        }
        assert!(
            pod.metadata
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|o| o.kind == "BuildWorkItem")),
            "{name} is not owned by its BuildWorkItem"
        );
        let role = kube::ResourceExt::labels(pod)
            .get("protobot.dev/role")
            .cloned()
            .unwrap_or_default();
        // Only Worker B's class asks for egress: only its pods get the proxy.
        let env: std::collections::BTreeMap<String, String> = spec.containers[0]
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect();
        if role == "worker-b" {
            assert_eq!(
                env.get("PROTOBOT_EGRESS_PROXY").map(String::as_str),
                Some(EGRESS_PROXY),
                "{name}"
            );
            assert_eq!(
                env.get("PROTOBOT_EGRESS_SESSION_TOKEN_FILE")
                    .map(String::as_str),
                Some("/task/egress-session-token"),
                "{name}"
            );
        } else {
            assert!(
                env.keys().all(|k| !k.starts_with("PROTOBOT_EGRESS")),
                "{name} ({role}) got egress: {env:?}"
            );
        }
        roles.insert(role);
    }
    for role in ["worker-a", "worker-b", "integration-runner"] {
        assert!(roles.contains(role), "no {role} pod in {roles:?}");
    }
    drop(kubelet);
    cluster.cleanup().await;
}

/// The chart installed for one namespace (`watchNamespace`) with its sandbox pods in
/// another (`jobSite.sandboxNamespace`, the staging claim made by the administrator in both,
/// here one node directory): the operator's ServiceAccount holds only what that rendering
/// grants (a Role in each namespace, no ClusterRole over the project's kinds), and the item
/// is built with every pod in the sandbox namespace. Real API server only: on the double
/// RBAC is not enforced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_namespace_install_builds_with_its_pods_in_a_separate_sandbox_namespace() {
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use protobot_kube_executor::{
        KubeExecutorConfig, KubernetesExecutor, SandboxProfile, StagingOwnership, StagingVolume,
    };
    if std::env::var_os("KUBECONFIG").is_none() {
        eprintln!("skipping: the topology needs a real API server (RBAC)");
        return;
    }
    let Some(bwrap) = protobot_testkit::BubblewrapContainerExecutor::from_path() else {
        assert!(std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none());
        eprintln!("skipping: bubblewrap is not installed");
        return;
    };
    let mut cluster = Cluster::connect("topology").await;
    let ns = cluster.namespace.clone();
    let sandboxes = format!("{ns}-sandboxes");
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": sandboxes}})).unwrap();
    Api::<Namespace>::all(cluster.client.clone())
        .create(&Default::default(), &namespace)
        .await
        .unwrap();
    // A release of its own, so the default release's ClusterRole grants it nothing.
    let release = format!("topo{}", &ns[ns.len().saturating_sub(7)..]);
    let (operator, refused) = protobot_e2e::real::prepare_release(
        &cluster.client,
        &release,
        &[
            format!("watchNamespace={ns}"),
            format!("jobSite.sandboxNamespace={sandboxes}"),
            "jobSite.staging.create=false".into(),
        ],
        &ns,
    )
    .await
    .unwrap();
    // It really is confined: no BuildWorkItems in another namespace, no pods in the watched
    // one, pods in the sandbox one (asked of the API server's authorizer, as the account).
    let account = format!(
        "system:serviceaccount:{}:{release}-protobot",
        protobot_e2e::real::release_namespace()
    );
    for (verb, group, resource, namespace, allowed) in [
        ("list", "protobot.dev", "buildworkitems", "default", false),
        ("list", "protobot.dev", "buildworkitems", ns.as_str(), true),
        ("create", "", "pods", ns.as_str(), false),
        ("create", "", "pods", sandboxes.as_str(), true),
        (
            "create",
            "protobot.dev",
            "buildworkitems",
            sandboxes.as_str(),
            false,
        ),
    ] {
        let review: k8s_openapi::api::authorization::v1::SubjectAccessReview =
            serde_json::from_value(json!({
                "spec": {"user": account, "groups": ["system:serviceaccounts"],
                         "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                                "namespace": namespace}},
            }))
            .unwrap();
        let answer = Api::<k8s_openapi::api::authorization::v1::SubjectAccessReview>::all(
            cluster.client.clone(),
        )
        .create(&Default::default(), &review)
        .await
        .unwrap();
        assert_eq!(
            answer.status.map(|s| s.allowed),
            Some(allowed),
            "{verb} {resource} in {namespace}"
        );
    }
    cluster.operator = operator.clone();
    cluster.refused = Some(refused);
    protobot_e2e::sandbox_platform(&cluster, "kata").await;
    let kubelet = protobot_testkit::Kubelet::connect(
        cluster.client.clone(),
        Arc::new(bwrap),
        &format!("node-{ns}"),
        vec![sandboxes.clone()],
    )
    .await
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut config = KubeExecutorConfig::new(
        &sandboxes,
        StagingVolume {
            claim_name: "protobot-staging".into(),
            mount_path: kubelet.claim_dir(&sandboxes, "protobot-staging").unwrap(),
        },
        tmp.path().join("collected"),
    );
    config.default_image = Some("registry.example.invalid/worker:e2e".into());
    config.staging_ownership = StagingOwnership::Keep;
    // As `protobot operator` configures it here: no owner lookup (an owner reference
    // cannot cross namespaces).
    config.work_item_owner = None;
    config.egress_session_secret = Some(protobot_egress::SessionSecret::new(vec![1u8; 32]));
    let profile = SandboxProfile::load(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../sandbox-profiles/kata.yaml"
    )))
    .unwrap();
    let executor = Arc::new(
        KubernetesExecutor::new(
            operator,
            config,
            profile,
            Some(protobot_e2e::conformant_report("kata")),
        )
        .unwrap(),
    );
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &sandboxes);
    let seen = Arc::new(std::sync::Mutex::new(
        std::collections::BTreeSet::<String>::new(),
    ));
    let recorder = {
        let seen = seen.clone();
        tokio::spawn(
            kube::runtime::watcher(pods, Default::default())
                .applied_objects()
                .for_each(move |p| {
                    if let Ok(p) = p {
                        let role = kube::ResourceExt::labels(&p)
                            .get("protobot.dev/role")
                            .cloned()
                            .unwrap_or_default();
                        seen.lock().unwrap().insert(role);
                    }
                    async {}
                }),
        )
    };
    scenario(
        &cluster,
        &tmp,
        executor,
        "kata",
        Some(EGRESS_PROXY),
        Served::Local,
    )
    .await;
    recorder.abort();
    let roles = seen.lock().unwrap().clone();
    for role in ["worker-a", "worker-b", "integration-runner"] {
        assert!(
            roles.contains(role),
            "no {role} pod in {sandboxes}: {roles:?}"
        );
    }
    let project_pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    assert!(
        project_pods
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no sandbox pod in the project's namespace"
    );
    drop(kubelet);
    let _ = Api::<Namespace>::all(cluster.client.clone())
        .delete(&sandboxes, &Default::default())
        .await;
    cluster.cleanup().await;
}

/// Every log line of this test process, as the operator would print them (each test runs
/// in a process of its own under nextest, so the buffer holds only this scenario's).
static LOGS: std::sync::LazyLock<std::sync::Mutex<Vec<u8>>> =
    std::sync::LazyLock::new(Default::default);

struct Tee;

impl std::io::Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap().extend_from_slice(buf);
        std::io::stderr().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Captures every log line of the operator's crates at debug level (before
/// [`Cluster::connect`], whose own subscriber then stays out).
fn capture_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "warn,protobot_controller=debug,protobot_jobsite=debug,protobot_repo=debug,protobot_stores=debug,protobot_executors=debug",
        ))
        .with_writer(|| Tee)
        .try_init();
}

/// Every object of the scenario's namespace a user or a tool can read, but Secrets, as JSON.
async fn readable_objects(client: &kube::Client, ns: &str) -> String {
    use k8s_openapi::api::{core::v1::ConfigMap, events::v1::Event};
    let mut all = String::new();
    macro_rules! dump {
        ($kind:ty) => {
            for o in Api::<$kind>::namespaced(client.clone(), ns)
                .list(&Default::default())
                .await
                .unwrap()
                .items
            {
                all.push_str(&serde_json::to_string(&o).unwrap());
            }
        };
    }
    dump!(Project);
    dump!(ChangeSet);
    dump!(BuildWorkItem);
    dump!(InspectionRun);
    dump!(ConfigMap);
    dump!(Event);
    all
}

/// The Job Site on a Project whose repository is served over `transport` by a real
/// server on loopback, with the credentials of a Secret read through the API server:
/// registration, the Job Site and the Project controller fetch with it, the merge lands
/// on the served repository's `main`, and the credential is in no log line, Event,
/// status, trace or file the operator wrote.
async fn remote_scenario(transport: Transport, scenario_name: &str) {
    if !bwrap_installed() {
        return;
    }
    capture_logs();
    let Some(servers) = GitServers::start() else {
        return;
    };
    let cluster = Cluster::connect(scenario_name).await;
    let tmp = tempfile::tempdir().unwrap();
    let executor = Arc::new(LocalExecutor::new(
        BubblewrapConfig::under(&tmp.path().join("sandbox")),
        false,
    ));
    let completed = scenario(
        &cluster,
        &tmp,
        executor,
        "local",
        None,
        Served::Remote(&servers, transport),
    )
    .await;
    // The merge is on the served repository's main (scenario checked its trailer).
    let merge = completed
        .status
        .as_ref()
        .and_then(|s| s.merge_commit.clone())
        .expect("the completed item names its merge commit");
    assert_eq!(servers.main_head().to_string(), merge);
    // The credential went nowhere.
    let credential: &[u8] = match transport {
        Transport::Https => servers.password.as_bytes(),
        // A line from the middle of the private key's body.
        Transport::Ssh => servers
            .ssh_key
            .lines()
            .nth(2)
            .expect("an OpenSSH key has a body")
            .as_bytes(),
    };
    assert!(credential.len() >= 16, "a credential too short to grep for");
    let objects = readable_objects(&cluster.client, &cluster.namespace).await
        + &serde_json::to_string(&completed).unwrap();
    assert!(
        !objects
            .as_bytes()
            .windows(credential.len())
            .any(|w| w == credential),
        "the credential is in an object of the namespace"
    );
    let logs = LOGS.lock().unwrap().clone();
    assert!(!logs.is_empty(), "no log line was captured");
    assert!(
        !logs.windows(credential.len()).any(|w| w == credential),
        "the credential is in a log line"
    );
    let on_disk = files_containing(tmp.path(), credential);
    assert!(
        on_disk.is_empty(),
        "the credential is in files the operator wrote: {on_disk:?}"
    );
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_on_an_https_repository_is_built_and_landed_with_its_secret() {
    remote_scenario(Transport::Https, "remote-https").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_on_an_ssh_repository_is_built_and_landed_with_its_secret() {
    remote_scenario(Transport::Ssh, "remote-ssh").await;
}

/// A Secret with a wrong password: the Project says which Secret the server refused, and
/// registration materializes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_credential_is_reported_on_the_project_naming_its_secret() {
    capture_logs();
    let Some(servers) = GitServers::start() else {
        return;
    };
    let cluster = Cluster::connect("remote-wrong").await;
    let (client, ns) = (cluster.client.clone(), cluster.namespace.clone());
    let wrong = "not-the-password-0123456789";
    protobot_e2e::create_secret(&client, &ns, "cli-sync-git", servers.https_secret(wrong)).await;
    let repo = ProjectRepo {
        url: servers.https_url.clone(),
        secret: Some("cli-sync-git".into()),
    };
    let main = servers.main_head().to_string();
    apply_example(&client, &ns, &repo, &main, "local", false).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut ctx =
        protobot_controller::project::Context::new(cluster.operator.clone(), tmp.path().into());
    ctx.repositories = Default::default();
    let projects = tokio::spawn(protobot_controller::project::run_context(
        Some(ns.clone()),
        Arc::new(ctx),
    ));
    let api: Api<Project> = Api::namespaced(client.clone(), &ns);
    let refused =
        protobot_testkit::wait::until(&api, "cli-sync", timeout(), |p: Option<&Project>| {
            condition_is(p, "RepoReachable", "False")
        })
        .await
        .unwrap()
        .unwrap();
    let condition = refused
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "RepoReachable")
        .unwrap();
    assert!(
        condition.message.contains("cli-sync-git"),
        "the condition does not name the Secret: {condition:?}"
    );
    projects.abort();
    let objects = readable_objects(&client, &ns).await;
    assert!(
        !objects.contains(wrong),
        "the wrong password is in an object"
    );
    let logs = String::from_utf8_lossy(&LOGS.lock().unwrap()).into_owned();
    assert!(!logs.contains(wrong), "the wrong password is in a log line");
    assert!(files_containing(tmp.path(), wrong.as_bytes()).is_empty());
    cluster.cleanup().await;
}

/// A TCP server on loopback that accepts connections and never answers: a repository
/// host that hangs every fetch. Dropping it closes every connection it holds.
struct BlackHole {
    addr: std::net::SocketAddr,
    held: Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl BlackHole {
    fn start() -> BlackHole {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let held = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (h, s) = (held.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                // Once dropped, every new connection is closed at once (an answer, if a
                // rude one), so no fetch hangs past the scenario.
                if !s.load(std::sync::atomic::Ordering::Relaxed) {
                    h.lock().unwrap().push(stream);
                }
            }
        });
        BlackHole { addr, held, stop }
    }

    /// Connections accepted and still held open.
    fn held(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for s in self.held.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// A second Project in the namespace whose repository host accepts connections and never
/// answers: its fetches hang while the example project is registered, built, inspected and
/// merged as if it were alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_project_whose_repository_hangs_does_not_hold_up_another_project() {
    if !bwrap_installed() {
        return;
    }
    let cluster = Cluster::connect("hung-repo").await;
    let hole = BlackHole::start();
    let (client, ns) = (cluster.client.clone(), cluster.namespace.clone());
    create_object(
        &Api::<Project>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "stalled", "namespace": ns},
            "spec": {
                "repoUrl": format!("https://{}/team/stalled.git", hole.addr),
                "sandboxProfile": "local",
            },
        }),
    )
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let executor = Arc::new(LocalExecutor::new(
        BubblewrapConfig::under(&tmp.path().join("sandbox")),
        false,
    ));
    scenario(&cluster, &tmp, executor, "local", None, Served::Local).await;
    // The stalled project's fetches were in flight the whole time, and it is not Ready.
    assert!(
        hole.held() >= 1,
        "nothing ever connected to the stalled project's repository host"
    );
    let stalled = Api::<Project>::namespaced(client.clone(), &ns)
        .get("stalled")
        .await
        .unwrap();
    assert!(
        !condition_is(Some(&stalled), "Ready", "True"),
        "the stalled project is Ready: {:?}",
        stalled.status
    );
    // Closing the connections ends the hung fetches (before the runtime waits for them).
    drop(hole);
    cluster.cleanup().await;
}

/// A dispatch that fails is visible where a user looks: the runner logs it and publishes it
/// as a Warning Event (`ReconcileFailed`) on the Project, saying what to do; the project
/// backs off and is dispatched again once the cause is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_dispatch_is_a_warning_event_on_its_project() {
    let cluster = Cluster::connect("dispatch-event").await;
    let (client, ns) = (cluster.client.clone(), cluster.namespace.clone());
    let tmp = tempfile::tempdir().unwrap();
    create_object(
        &Api::<Project>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "no-workers", "namespace": ns},
            "spec": {
                "repoUrl": format!("file://{}", tmp.path().join("origin.git").display()),
                "sandboxProfile": "local",
                "workerClassesRef": {"name": "missing-workers"},
            },
        }),
    )
    .await;
    let settings = Settings {
        interval: Duration::from_millis(200),
        repositories: protobot_e2e::LOCAL_REPOSITORIES,
        ..Settings::new("protobot-0", tmp.path().join("jobsite"), 1)
    };
    let stop = settings.stop.clone();
    let executor = Arc::new(protobot_jobsite::testing::InProcessExecutor::new(
        &tmp.path().join("runs"),
    ));
    let job_site = tokio::spawn(run(
        cluster.operator.clone(),
        Some(ns.clone()),
        settings,
        executor,
    ));
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), &ns);
    let seen = tokio::time::timeout(timeout(), async {
        loop {
            let listed = events.list(&Default::default()).await.unwrap().items;
            if let Some(e) = listed.into_iter().find(|e| {
                e.reason.as_deref() == Some("ReconcileFailed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("no-workers")
            }) {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("no ReconcileFailed Event on the Project");
    assert_eq!(seen.type_.as_deref(), Some("Warning"));
    assert_eq!(
        seen.regarding.as_ref().and_then(|r| r.kind.as_deref()),
        Some("Project")
    );
    assert_eq!(
        seen.reporting_controller.as_deref(),
        Some("protobot-buildworkitem")
    );
    let note = seen.note.unwrap_or_default();
    assert!(
        note.contains("ConfigMap missing-workers does not exist")
            && note.contains("create the ConfigMap named by spec.workerClassesRef"),
        "the Event says what is wrong and what to do: {note}"
    );
    stop.raise();
    tokio::time::timeout(timeout(), job_site)
        .await
        .expect("the Job Site stops when asked")
        .unwrap();
    cluster.cleanup().await;
}
