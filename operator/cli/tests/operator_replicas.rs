#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Two `protobot operator` processes against the real kube-apiserver (`KUBECONFIG`), each
//! authenticated as the chart's operator ServiceAccount under the chart's RBAC, with the
//! simulated kubelet running their sandbox pods in bubblewrap:
//!
//! - while both replicas watch one BuildWorkItem, each one's `protobot_work_items` counts
//!   one item (it describes the cluster) and the chart's recording rule, `max by (state)`
//!   over the replicas, counts one item, not two;
//! - SIGTERM to the replica building the item: the process exits within its grace period,
//!   its lease lapses, and the other replica completes the item, merged exactly once.
//!
//! Without `KUBECONFIG` the scenario is skipped (`PROTOBOT_E2E_REQUIRE_CLUSTER=1` makes that
//! a failure, as CI's real-apiserver step sets it).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::Arc,
    time::{Duration, Instant},
};

use kube::{Api, api::ResourceExt};
use protobot_api::{BuildWorkItem, ChangeSet, LifecycleState, Project};
use protobot_demo::example::{INTEGRATION, WORKER_A, WORKER_B, author};
use protobot_e2e::{Cluster, create_object, worker_class};
use serde_json::json;
#[path = "support/admin_http.rs"]
mod admin_http;

use admin_http::get;

/// How long the building replica gets on SIGTERM (`--shutdown-grace-seconds`).
const GRACE: Duration = Duration::from_secs(10);
/// The Project's lease (the CRD's minimum): how long the other replica waits at most.
const LEASE_SECONDS: u32 = 30;

/// A replica: its process (killed on drop) and where it logs and serves.
struct Replica {
    child: Child,
    admin: String,
    log: PathBuf,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `protobot operator` as replica `identity`.
fn start_replica(
    identity: &str,
    ns: &str,
    kubeconfig: &Path,
    staging: &Path,
    dir: &Path,
) -> Replica {
    let admin = format!("127.0.0.1:{}", free_port());
    let log = dir.join(format!("{identity}.log"));
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args([
            "operator",
            "--namespace",
            ns,
            "--admin-addr",
            &admin,
            "--identity",
            identity,
        ])
        .args(["--log", "info,protobot_controller=debug"])
        .arg("--sandbox-profile")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../sandbox-profiles/kata.yaml"
        ))
        .args(["--sandbox-namespace", ns])
        .arg("--workdir")
        .arg(dir.join(identity))
        .arg("--staging-path")
        .arg(staging)
        .args(["--sandbox-image", "registry.example.invalid/worker:e2e"])
        .arg("--allow-local-repositories")
        // The simulated kubelet runs containers as this test's uid, not the profile's.
        .args(["--staging-ownership", "keep"])
        .args(["--shutdown-grace-seconds", &GRACE.as_secs().to_string()])
        .env("KUBECONFIG", kubeconfig)
        // The process logs JSON lines to stdout; errors to stderr: both into one file.
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    Replica { child, admin, log }
}

async fn until_ready(replica: &Replica) {
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some((200, _)) = get(&replica.admin, "/readyz").await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        ready.is_ok(),
        "replica at {} never became ready: {}",
        replica.admin,
        std::fs::read_to_string(&replica.log).unwrap_or_default()
    );
}

/// `protobot_work_items` samples of one scrape, by state.
async fn work_items(replica: &Replica) -> BTreeMap<String, u64> {
    let (status, body) = get(&replica.admin, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    body.lines()
        .filter_map(|l| l.strip_prefix("protobot_work_items{state=\""))
        .filter_map(|rest| {
            let (state, value) = rest.split_once("\"} ")?;
            Some((state.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The chart's recording rule `max by (state) (protobot_work_items)` over the replicas'
/// scrapes (charts/protobot/alerts/protobot.rules.yaml).
fn max_by_state(scrapes: &[BTreeMap<String, u64>]) -> BTreeMap<String, u64> {
    let mut max = BTreeMap::<String, u64>::new();
    for scrape in scrapes {
        for (state, n) in scrape {
            let m = max.entry(state.clone()).or_default();
            *m = (*m).max(*n);
        }
    }
    max
}

/// The lease holder and state of the item, from its status.
fn holder(item: &BuildWorkItem) -> (Option<String>, Option<LifecycleState>) {
    let status = item.status.as_ref();
    (
        status
            .and_then(|s| s.lease.as_ref())
            .map(|l| l.holder.clone()),
        status.map(|s| s.state),
    )
}

fn merges_with_trailer(origin: &Path) -> Vec<String> {
    let out = Command::new("git")
        .args([
            "log",
            "--first-parent",
            "--merges",
            "--format=%(trailers:key=Work-Item,valueonly)",
            "main",
        ])
        .current_dir(origin)
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operator_processes_count_one_item_once_and_a_sigtermed_replica_hands_its_build_over() {
    if std::env::var_os("KUBECONFIG").is_none() {
        assert!(
            std::env::var_os("PROTOBOT_E2E_REQUIRE_CLUSTER").is_none(),
            "PROTOBOT_E2E_REQUIRE_CLUSTER is set but KUBECONFIG is not"
        );
        eprintln!("skipping: the replicas scenario runs against a real API server (KUBECONFIG)");
        return;
    }
    let Some(bwrap) = protobot_testkit::BubblewrapContainerExecutor::from_path() else {
        assert!(std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none());
        eprintln!("skipping: bubblewrap is not installed");
        return;
    };
    let cluster = Cluster::connect("process-replicas").await;
    let (client, ns) = (cluster.client.clone(), cluster.namespace.clone());
    // The platform: RuntimeClass, the sandbox ServiceAccount, a node (the simulated kubelet),
    // and the profile's conformance report (stands in for a conformant Kata deployment).
    protobot_e2e::sandbox_platform(&cluster, "kata").await;
    let kubelet = protobot_testkit::Kubelet::connect(
        client.clone(),
        Arc::new(bwrap),
        &format!("node-{ns}"),
        vec![ns.clone()],
    )
    .await
    .unwrap();
    let staging = kubelet.claim_dir(&ns, "protobot-staging").unwrap();
    create_object(
        &Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "protobot-conformance-kata", "namespace": ns},
            "data": {"report.json": serde_json::to_string(&protobot_e2e::conformant_report("kata")).unwrap()},
        }),
    )
    .await;
    // The project: Worker A takes long enough for a SIGTERM to land mid-build.
    let tmp = tempfile::tempdir().unwrap();
    let (work, origin) = (tmp.path().join("work"), tmp.path().join("origin.git"));
    let merge = author(&work, &origin).unwrap();
    create_object(
        &Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cli-sync-workers", "namespace": ns},
            "data": {
                "worker-a": worker_class(&format!("sleep 6\n{WORKER_A}")),
                "worker-b": worker_class(WORKER_B),
                "integration": worker_class(INTEGRATION),
            },
        }),
    )
    .await;
    create_object(
        &Api::<Project>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "cli-sync", "namespace": ns},
            "spec": {
                "repoUrl": format!("file://{}", origin.display()),
                "sandboxProfile": "kata",
                "workerClassesRef": {"name": "cli-sync-workers"},
                "leaseDurationSeconds": LEASE_SECONDS,
            },
        }),
    )
    .await;
    let kubeconfig = tmp.path().join("operator.kubeconfig");
    std::fs::write(
        &kubeconfig,
        protobot_e2e::real::operator_kubeconfig(&client)
            .await
            .unwrap(),
    )
    .unwrap();
    // Replica 1 alone, so that it is the one that claims.
    let mut first = start_replica("replica-1", &ns, &kubeconfig, &staging, tmp.path());
    until_ready(&first).await;
    create_object(
        &Api::<ChangeSet>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "ChangeSet",
            "metadata": {"name": "cs-00001", "namespace": ns},
            "spec": {"projectRef": {"name": "cli-sync"}, "changeSetId": "CS-00001", "mergeCommit": merge},
        }),
    )
    .await;
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), &ns);
    let timeout = protobot_e2e::timeout();
    let claimed = tokio::time::timeout(timeout, async {
        loop {
            if let Some(item) = items.list(&Default::default()).await.unwrap().items.pop()
                && holder(&item) == (Some("replica-1".into()), Some(LifecycleState::Building))
            {
                return item;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "replica-1 never claimed the item: {}",
            std::fs::read_to_string(&first.log).unwrap_or_default()
        )
    });
    let name = claimed.name_any();
    // Replica 2 joins; both count the one item, once each, and the recording rule once.
    let second = start_replica("replica-2", &ns, &kubeconfig, &staging, tmp.path());
    until_ready(&second).await;
    let scrapes = [work_items(&first).await, work_items(&second).await];
    for (scrape, replica) in scrapes.iter().zip(["replica-1", "replica-2"]) {
        assert_eq!(
            scrape.values().sum::<u64>(),
            1,
            "{replica} counts the cluster's one item: {scrape:?}"
        );
        assert_eq!(scrape.get("building"), Some(&1), "{replica}: {scrape:?}");
    }
    let aggregated = max_by_state(&scrapes);
    assert_eq!(
        aggregated.values().sum::<u64>(),
        1,
        "max by (state) over the replicas counts one item: {aggregated:?}"
    );
    // SIGTERM to the builder, mid-build: it exits within its grace period.
    let item = items.get(&name).await.unwrap();
    assert_eq!(
        holder(&item),
        (Some("replica-1".into()), Some(LifecycleState::Building)),
        "the SIGTERM must land mid-build"
    );
    let pid = first.child.id().to_string();
    let terminated = Instant::now();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let exited = tokio::time::timeout(GRACE + Duration::from_secs(5), async {
        loop {
            if let Some(status) = first.child.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let log = std::fs::read_to_string(&first.log).unwrap_or_default();
    let status = exited.unwrap_or_else(|_| {
        panic!(
            "replica-1 still runs {:?} after SIGTERM (grace {GRACE:?}): {log}",
            terminated.elapsed()
        )
    });
    assert!(status.success(), "replica-1 exited with {status}: {log}");
    assert!(
        log.contains("shutting down: claiming no more work"),
        "replica-1 did not log its drain: {log}"
    );
    // Replica 2 resumes the item once the lease lapses and completes it: one merge on main.
    let completed = protobot_testkit::wait::until(
        &items,
        &name,
        timeout * 3 + Duration::from_secs(u64::from(LEASE_SECONDS)),
        |i: Option<&BuildWorkItem>| {
            i.and_then(|i| i.status.as_ref())
                .is_some_and(|s| s.state == LifecycleState::Completed)
        },
    )
    .await;
    let completed = match completed {
        Ok(Some(item)) => item,
        other => panic!(
            "the item did not complete after the handover ({other:?}); replica-2: {}",
            std::fs::read_to_string(&second.log).unwrap_or_default()
        ),
    };
    assert_eq!(
        merges_with_trailer(&origin),
        std::slice::from_ref(&completed.spec.work_item_id),
        "exactly one merge carries the item's trailer"
    );
    let audit = completed.status.as_ref().unwrap();
    assert!(
        audit.lease.as_ref().is_none_or(|l| l.holder != "replica-1"),
        "replica-1 still holds the completed item: {audit:?}"
    );
    // Neither process was refused a call by the chart's RBAC.
    drop(second);
    for replica in ["replica-1", "replica-2"] {
        let log = std::fs::read_to_string(tmp.path().join(format!("{replica}.log"))).unwrap();
        let refused: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("\"status\":403"))
            .collect();
        assert!(refused.is_empty(), "{replica} was refused: {refused:#?}");
    }
    drop(kubelet);
    cluster.cleanup().await;
}
