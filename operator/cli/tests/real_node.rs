#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Issue 31: pods on a real node (`scripts/kube-node up`), no simulated kubelet. The node's
//! containerd runs them with runc or gVisor; its kubelet enforces the image's user, the
//! security context, the RuntimeClass, init containers and cgroup limits; kube-router
//! enforces NetworkPolicies; CoreDNS serves cluster names. Images are built here
//! (`scripts/node-images`) and loaded into the node: the operator image holds this build's
//! binary.
//!
//! Skipped without a node (one line); `PROTOBOT_REQUIRE_NODE=1` (CI) makes that a failure.
//! The scenarios run one at a time (`.config/nextest.toml`, group `real-node`): the node has
//! two CPUs.

use std::time::Duration;

use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, PersistentVolume, Pod},
};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::json;

#[path = "support/real_node.rs"]
mod real_node;

#[path = "../../repo/tests/support/git_servers.rs"]
#[allow(dead_code)]
mod git_servers;

use git_servers::{GitServers, files_containing};
use protobot_api::{BuildWorkItem, ChangeSet, LifecycleState, Project};
use protobot_demo::example::{INTEGRATION, WORKER_A, WORKER_B, author};
use protobot_e2e::{create_object, worker_class};
use real_node::{GVISOR, NODE_IP, PodRecorder, RUNC, TestNamespace, load_images, node_or_skip};

/// A pod of the sandbox profiles' shape (restricted security context, no token) running
/// `script` in the Worker base image under `runtime_class`.
fn probe_pod(name: &str, image: &str, runtime_class: &str, script: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "runtimeClassName": runtime_class,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": "probe",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "securityContext": {
                    "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
                "resources": {
                    "requests": {"cpu": "50m", "memory": "64Mi"},
                    "limits": {"cpu": "500m", "memory": "256Mi"},
                },
            }],
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_run_in_gvisor_and_runc_as_the_profile_user_with_containerd_ids() {
    let Some(node) = node_or_skip("pods_run_in_gvisor_and_runc").await else {
        return;
    };
    println!(
        "node {} kubelet {} containerRuntimeVersion {}",
        node.name, node.kubelet, node.runtime
    );
    assert!(
        node.runtime.starts_with("containerd://"),
        "{}",
        node.runtime
    );
    let [worker] = <[String; 1]>::try_from(load_images(&["worker"])).unwrap();
    let ns = TestNamespace::create(&node.client, "real-node-pods").await;
    let pods = ns.pods();
    // gVisor's kernel answers `dmesg` with its own boot lines; runc shares the host kernel.
    let script = "id -u; id -g; uname -r; (dmesg 2>/dev/null || true) | head -3; touch /x 2>&1 || echo read-only";
    for class in [GVISOR, RUNC] {
        let name = format!("probe-{class}");
        pods.create(
            &PostParams::default(),
            &probe_pod(&name, &worker, class, script),
        )
        .await
        .unwrap();
        let pod = real_node::until_finished(&pods, &name, Duration::from_secs(180)).await;
        let log = real_node::logs(&pods, &name, "probe").await;
        println!("{class} pod:\n{log}");
        assert_eq!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded"),
            "{log}"
        );
        let ids = real_node::container_ids(&pod);
        assert!(
            ids.values().all(|id| id.starts_with("containerd://")),
            "{ids:?}"
        );
        let mut lines = log.lines();
        assert_eq!(lines.next(), Some("65532"), "the profile's uid: {log}");
        assert_eq!(lines.next(), Some("65532"), "the profile's gid: {log}");
        assert!(
            log.contains("read-only"),
            "the root filesystem is read-only: {log}"
        );
        let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
        if class == GVISOR {
            assert!(log.contains("gVisor"), "gVisor's kernel booted: {log}");
        } else {
            assert!(
                log.contains(host_kernel.trim()),
                "runc shares the host kernel: {log}"
            );
        }
    }
    ns.delete().await;
}

/// Issue 31's acceptance. The chart installed with `helm install`: the operator Deployment
/// (two replicas of the image built here), the egress proxy, and the conformance Job (a
/// post-install hook) measuring the gVisor profile with probe pods on the node; the stored
/// report passes every required capability. Then a Project over HTTPS from a git server on
/// the node address and a ChangeSet: Worker A, Worker B and the Inspector run as gVisor pods
/// and the item lands on the served `main` exactly once. The credential is nowhere: not in
/// pod logs from the node, Events, objects or files.
#[tokio::test(flavor = "multi_thread")]
async fn helm_install_builds_a_change_set_with_gvisor_pods_on_the_real_node() {
    let Some(node) = node_or_skip("helm_install_on_the_real_node").await else {
        return;
    };
    // The repository, on an address pods reach (HTTPS on 443: the chart's operator
    // NetworkPolicy allows the API server's and HTTPS ports).
    let Some(servers) = GitServers::start_on(NODE_IP, 443) else {
        panic!("the git test servers are required on the real node");
    };
    let [operator, worker] = <[String; 2]>::try_from(load_images(&["operator", "worker"])).unwrap();
    let (repository, tag) = operator.rsplit_once(':').unwrap();
    let client = node.client.clone();
    let ns = TestNamespace::create(&client, "real-node-helm").await;
    // Cluster-scoped objects (ClusterRoles) carry the release's name: one per scenario, so a
    // failed run's leftovers never block the next install.
    let release = format!("pb{}", ns.name.rsplit('-').next().unwrap());
    let release = release.as_str();
    let recorder = PodRecorder::start(&client, &ns.name);

    // The platform: the staging claim's volume (a directory on the node) and the egress
    // Secrets the chart names.
    let (staging, pv_name) = real_node::staging_volume(&client, &ns.name).await;
    let mut session = [0u8; 48];
    for (i, b) in session.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37).wrapping_add(11);
    }
    protobot_e2e::create_secret(
        &client,
        &ns.name,
        "protobot-egress-session",
        [("secret".to_owned(), session.to_vec())].into(),
    )
    .await;
    protobot_e2e::create_secret(
        &client,
        &ns.name,
        "protobot-egress-credentials",
        Default::default(),
    )
    .await;

    let sets = [
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
        "image.pullPolicy=Never".to_owned(),
        "jobSite.sandboxProfile=gvisor".to_owned(),
        format!("jobSite.sandboxImage={worker}"),
        "egressProxy.enabled=true".to_owned(),
        "egressProxy.credentialsSecret=protobot-egress-credentials".to_owned(),
        "egressProxy.sessionSecret=protobot-egress-session".to_owned(),
    ];
    let mut args: Vec<String> = vec![
        "install".into(),
        release.into(),
        real_node::chart(),
        "--namespace".into(),
        ns.name.clone(),
        "--kubeconfig".into(),
        std::env::var("KUBECONFIG").unwrap(),
        "--wait".into(),
        "--timeout".into(),
        "15m".into(),
    ];
    for set in &sets {
        args.push("--set".into());
        args.push(set.clone());
    }
    let started = std::time::Instant::now();
    let out = real_node::helm(&args);
    let seen = recorder.seen();
    println!(
        "helm install ({:.0} s): {}{}",
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for pod in &seen {
        println!(
            "pod {} runtimeClass={:?} node={:?} phase={} containers={:?} terminated={:?}",
            pod.name, pod.runtime_class, pod.node, pod.phase, pod.container_ids, pod.terminated
        );
    }
    assert!(
        out.status.success(),
        "helm install failed (its output is above)"
    );

    // The operator: two replicas of the image built here, Running on the node. (A replica
    // may be briefly unready on a loaded node after the hook: wait for both, then say so.)
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns.name);
    let deployment_name = format!("{release}-protobot");
    let ready = protobot_testkit::wait::until(
        &deployments,
        &deployment_name,
        Duration::from_secs(180),
        |d: Option<&Deployment>| {
            d.and_then(|d| d.status.as_ref())
                .is_some_and(|s| s.ready_replicas == Some(2))
        },
    )
    .await;
    if !matches!(ready, Ok(Some(_))) {
        println!(
            "Deployment {deployment_name}: {:#?}\noperator logs:\n{}",
            deployments
                .get(&deployment_name)
                .await
                .ok()
                .and_then(|d| d.status),
            operator_logs(&client, &ns.name).await
        );
        panic!("the operator Deployment has not 2 ready replicas 180 s after helm install");
    }
    let operators = operator_pods(&client, &ns.name, &deployment_name).await;
    println!("operator pods: {operators:?}");
    assert_eq!(operators.len(), 2, "two operator pods Running");
    for (pod, node_name, ids) in &operators {
        assert_eq!(
            node_name.as_deref(),
            Some(node.name.as_str()),
            "{pod} runs on the node"
        );
        assert!(
            !ids.is_empty() && ids.iter().all(|id| id.starts_with("containerd://")),
            "{pod}'s containers run in containerd: {ids:?}"
        );
    }

    // The conformance Job's probes ran as gVisor pods, and the stored report passes.
    let probes: Vec<_> = seen
        .iter()
        .filter(|p| p.runtime_class.as_deref() == Some(GVISOR))
        .collect();
    assert!(
        !probes.is_empty(),
        "no gVisor pod ran (pods seen are listed above)"
    );
    // Every container that started has a containerd id (a probe cancelled before its
    // container started, SB-LIFE-001, has none), and probes ran their sandbox container.
    for p in &probes {
        assert!(
            p.container_ids
                .values()
                .all(|id| id.starts_with("containerd://")),
            "a probe container of {} not run by containerd: {:?}",
            p.name,
            p.container_ids
        );
    }
    let sandboxes = probes
        .iter()
        .filter(|p| p.container_ids.contains_key("sandbox"))
        .count();
    println!(
        "{} gVisor probe pods, {sandboxes} ran their sandbox container",
        probes.len()
    );
    assert!(
        sandboxes >= 20,
        "only {sandboxes} probes ran their sandbox container (pods seen are listed above)"
    );
    let report = Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .get("protobot-conformance-gvisor")
        .await
        .expect("the conformance Job stored its report");
    let report: serde_json::Value =
        serde_json::from_str(&report.data.unwrap()["report.json"]).unwrap();
    println!(
        "conformance report: {}",
        serde_json::to_string_pretty(&report).unwrap()
    );
    assert_eq!(report["profile"], "gvisor");
    let failed: Vec<_> = report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["passed"] != true)
        .map(|c| format!("{} {}", c["id"], c["detail"]))
        .collect();
    assert_eq!(
        report["passed"], true,
        "the conformance report fails: {failed:?} (the report is above)"
    );

    // The Project over HTTPS and a ChangeSet, as a person applies them.
    let tmp = tempfile::tempdir().unwrap();
    let (work, origin) = (tmp.path().join("author"), tmp.path().join("origin.git"));
    let merge = author(&work, &origin).unwrap();
    let pushed = std::process::Command::new("git")
        .args(["push", "-q", "--force"])
        .arg(&servers.bare)
        .arg("main:main")
        .current_dir(&origin)
        .output()
        .unwrap();
    assert!(pushed.status.success(), "{pushed:?}");
    let credential = servers.password.clone();
    protobot_e2e::create_secret(
        &client,
        &ns.name,
        "cli-sync-git",
        servers.https_secret(&servers.password),
    )
    .await;
    create_object(
        &Api::<ConfigMap>::namespaced(client.clone(), &ns.name),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cli-sync-workers", "namespace": ns.name},
            "data": {
                "worker-a": worker_class(WORKER_A),
                "worker-b": worker_class(WORKER_B),
                "integration": worker_class(INTEGRATION),
            },
        }),
    )
    .await;
    create_object(
        &Api::<Project>::namespaced(client.clone(), &ns.name),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "cli-sync", "namespace": ns.name},
            "spec": {
                "repoUrl": servers.https_url,
                "sandboxProfile": GVISOR,
                "workerClassesRef": {"name": "cli-sync-workers"},
                "credentialsSecretRef": {"name": "cli-sync-git"},
                // The shortest lease the CRD allows: the fault below waits for it to expire.
                "leaseDurationSeconds": 30,
            },
        }),
    )
    .await;
    create_object(
        &Api::<ChangeSet>::namespaced(client.clone(), &ns.name),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "ChangeSet",
            "metadata": {"name": "cs-00001", "namespace": ns.name},
            "spec": {"projectRef": {"name": "cli-sync"}, "changeSetId": "CS-00001", "mergeCommit": merge},
        }),
    )
    .await;
    let operator_logs = || operator_logs(&client, &ns.name);
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), &ns.name);
    let change_sets: Api<ChangeSet> = Api::namespaced(client.clone(), &ns.name);
    let started = std::time::Instant::now();
    let limit = Duration::from_secs(900);
    let registered =
        protobot_testkit::wait::until(&change_sets, "cs-00001", limit, |c: Option<&ChangeSet>| {
            c.and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.work_item_ref.is_some())
        })
        .await;
    let item_name = match registered {
        Ok(Some(cs)) => cs
            .status
            .and_then(|s| s.work_item_ref)
            .map(|r| r.name)
            .unwrap(),
        other => {
            println!("logs:\n{}", operator_logs().await);
            panic!("the ChangeSet was never registered ({other:?}); the logs are above")
        }
    };
    // The fault: the replica holding the item's lease dies mid-build — its pod deleted without
    // grace, as a node failure or an OOM kill would — while a Worker pod of the build runs.
    // The other replica recovers the lease when it expires and finishes the build.
    let building =
        protobot_testkit::wait::until(&items, &item_name, limit, |i: Option<&BuildWorkItem>| {
            i.and_then(|i| i.status.as_ref())
                .is_some_and(|s| s.state == LifecycleState::Building && s.owner.is_some())
        })
        .await;
    let Ok(Some(building)) = building else {
        println!("logs:\n{}", operator_logs().await);
        panic!("{item_name} was never claimed ({building:?}); the logs are above");
    };
    let victim = building.status.and_then(|s| s.owner).unwrap();
    let worker_running = {
        use futures::StreamExt;
        use kube::runtime::WatchStreamExt;
        let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
        let config = kube::runtime::watcher::Config::default().labels("protobot.dev/role=worker-a");
        let mut stream = kube::runtime::watcher(pods, config)
            .applied_objects()
            .boxed();
        tokio::time::timeout(Duration::from_secs(300), async {
            while let Some(Ok(pod)) = stream.next().await {
                if pod.status.and_then(|s| s.phase).as_deref() == Some("Running") {
                    return pod.metadata.name;
                }
            }
            None
        })
        .await
    };
    let Ok(Some(worker)) = worker_running else {
        panic!("no Worker A pod of {item_name} ran within 5 min ({worker_running:?})");
    };
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .delete(
            &victim,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("deleting the lease holder {victim}: {e}"));
    let killed = std::time::Instant::now();
    println!("killed the lease holder {victim} while {worker} ran");
    let completed = protobot_testkit::wait::until(
        &items,
        &item_name,
        limit.saturating_sub(started.elapsed()),
        |i: Option<&BuildWorkItem>| {
            i.and_then(|i| i.status.as_ref())
                .is_some_and(|s| s.state == LifecycleState::Completed)
        },
    )
    .await;
    let completed = match completed {
        Ok(Some(item)) => item,
        other => {
            let status = items.get(&item_name).await.ok().and_then(|i| i.status);
            println!(
                "its status: {status:#?}\npods seen: {:#?}\nlogs:\n{}",
                recorder.seen(),
                operator_logs().await
            );
            panic!(
                "{item_name} did not complete in 15 min ({other:?}); it is {:?} (status, pods and logs above)",
                status.map(|s| s.state)
            )
        }
    };
    println!(
        "item {} completed in {:.0} s, {:.0} s after its lease holder was killed",
        completed.spec.work_item_id,
        started.elapsed().as_secs_f64(),
        killed.elapsed().as_secs_f64()
    );
    // The victim claimed it; another replica finished it.
    let versions = completed
        .status
        .as_ref()
        .map(|s| s.contract_versions.clone())
        .unwrap_or_default();
    let transitions: Vec<_> = versions
        .iter()
        .map(|v| format!("{:?} → {:?} by {:?}", v.command, v.state, v.actor))
        .collect();
    println!("transitions: {transitions:#?}");
    assert!(
        versions.iter().any(
            |v| v.command == protobot_api::common::LifecycleCommand::Claim
                && v.actor.as_deref() == Some(victim.as_str())
        ),
        "the killed replica had claimed it: {transitions:?}"
    );
    assert!(
        versions
            .iter()
            .any(|v| v.command == protobot_api::common::LifecycleCommand::RecoverLease),
        "the lease was recovered, not waited out by the dead replica: {transitions:?}"
    );
    let last = versions.last().expect("the completed item has transitions");
    assert_eq!(last.state, LifecycleState::Completed, "{transitions:?}");
    assert_ne!(
        last.actor.as_deref(),
        Some(victim.as_str()),
        "the killed replica cannot have completed the item: {transitions:?}"
    );
    let merged = completed
        .status
        .as_ref()
        .and_then(|s| s.merge_commit.clone())
        .expect("the completed item names its merge commit");
    assert_eq!(servers.main_head().to_string(), merged);
    assert_eq!(
        protobot_e2e::work_item_trailers(&servers.bare),
        std::slice::from_ref(&completed.spec.work_item_id),
        "exactly one merge on the served main carries the item's trailer"
    );
    // Worker A, Worker B and the integration runner ran as gVisor pods on the node.
    let seen = recorder.seen();
    println!("pods seen: {seen:#?}");
    for role in ["worker-a", "worker-b", "integration-runner"] {
        let ran: Vec<_> = seen
            .iter()
            .filter(|p| p.role.as_deref() == Some(role))
            .collect();
        assert!(
            ran.iter()
                .any(|p| p.runtime_class.as_deref() == Some(GVISOR)
                    && p.container_ids
                        .values()
                        .any(|id| id.starts_with("containerd://"))),
            "no {role} pod ran in gVisor on the node (pods seen are listed above)"
        );
    }

    // The credential went nowhere: objects and Events, pod logs from the node, files.
    let needle = credential.as_bytes();
    let objects = protobot_e2e::readable_objects(&client, &ns.name).await;
    assert!(
        !objects.contains(&credential),
        "the credential is in an object or Event of the namespace"
    );
    let logs = operator_logs().await;
    assert!(
        !logs.contains(&credential),
        "the credential is in a pod's log"
    );
    // After each run the operator asked the proxies' headless admin Service for the run's
    // model usage (none here: a 404 each) through its NetworkPolicy.
    let unread: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("run usage not read"))
        .collect();
    assert!(
        unread.is_empty(),
        "the operator could not read runs' model usage from the egress proxies' admin Service: {unread:#?}"
    );
    // The staging volume, and on the node the pods' volumes and container logs.
    for dir in [
        staging.path(),
        std::path::Path::new("/var/lib/protobot-node/kubelet/pods"),
        std::path::Path::new("/var/lib/protobot-node/pod-logs"),
    ] {
        let found = files_containing(dir, needle);
        assert!(
            found.is_empty(),
            "the credential is in files on the node: {found:?}"
        );
    }

    job_site_metrics_on_a_real_prometheus(&client, &ns.name, release).await;

    let _ = real_node::helm(&[
        "uninstall".into(),
        release.into(),
        "--namespace".into(),
        ns.name.clone(),
        "--kubeconfig".into(),
        std::env::var("KUBECONFIG").unwrap(),
        "--wait".into(),
    ]);
    let _ = Api::<PersistentVolume>::all(client.clone())
        .delete(&pv_name, &DeleteParams::default())
        .await;
    drop(recorder);
    ns.delete().await;
}

/// The logs of every pod of the namespace, each under its name.
async fn operator_logs(client: &kube::Client, namespace: &str) -> String {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace);
    let mut all = String::new();
    for p in pods.list(&Default::default()).await.unwrap().items {
        let name = p.metadata.name.unwrap_or_default();
        if let Ok(log) = pods.logs(&name, &Default::default()).await {
            all.push_str(&format!("--- {name}\n{log}\n"));
        }
    }
    all
}

/// The Running and Ready pods of `deployment` (by its selector), read from the API server now.
async fn running_pods(client: &kube::Client, namespace: &str, deployment: &str) -> Vec<Pod> {
    let d = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get(deployment)
        .await
        .unwrap_or_else(|e| panic!("Deployment {deployment}: {e}"));
    let selector = d
        .spec
        .selector
        .match_labels
        .unwrap_or_default()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        // Ready: serving (a replacement replica may be Running and not listening yet).
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .collect()
}

/// Each Running pod of `deployment`: its name, its node and the ids of its containers.
async fn operator_pods(
    client: &kube::Client,
    namespace: &str,
    deployment: &str,
) -> Vec<(String, Option<String>, Vec<String>)> {
    running_pods(client, namespace, deployment)
        .await
        .into_iter()
        .map(|p| {
            let ids = p
                .status
                .and_then(|s| s.container_statuses)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| c.container_id)
                .collect();
            (
                p.metadata.name.unwrap_or_default(),
                p.spec.and_then(|s| s.node_name),
                ids,
            )
        })
        .collect()
}

/// The `host:port` of each Running pod of `deployment` (by its selector), at `port`.
async fn pod_targets(
    client: &kube::Client,
    namespace: &str,
    deployment: &str,
    port: u16,
) -> Vec<String> {
    running_pods(client, namespace, deployment)
        .await
        .into_iter()
        .filter_map(|p| p.status?.pod_ip)
        .map(|ip| format!("{ip}:{port}"))
        .collect()
}

/// Every `expr` of a Grafana dashboard's JSON, in order.
fn dashboard_queries(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", serde_json::Value::String(expr)) => out.push(expr.clone()),
                    _ => dashboard_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| dashboard_queries(v, out)),
        _ => {}
    }
}

/// A real Prometheus on the host scrapes the operator's replicas and the egress proxy by pod
/// IP through the chart's NetworkPolicies (as a Prometheus in the cluster would), evaluates the
/// chart's rules as the chart renders them, and answers every query of the shipped dashboard
/// without an error; the one item the scenario built shows as completed once, though every
/// replica reports it, and the recording rule carries it.
async fn job_site_metrics_on_a_real_prometheus(
    client: &kube::Client,
    namespace: &str,
    release: &str,
) {
    use real_node::{Prometheus, ScrapeJob};
    let fullname = format!("{release}-protobot");
    // Both replicas serve again (one was killed mid-build and replaced).
    let ready = protobot_testkit::wait::until(
        &Api::<Deployment>::namespaced(client.clone(), namespace),
        &fullname,
        Duration::from_secs(180),
        |d: Option<&Deployment>| {
            d.and_then(|d| d.status.as_ref())
                .is_some_and(|s| s.ready_replicas == Some(2))
        },
    )
    .await;
    assert!(
        matches!(ready, Ok(Some(_))),
        "the operator Deployment has not 2 ready replicas again: {ready:?}"
    );
    let operators = pod_targets(client, namespace, &fullname, 8080).await;
    let proxies = pod_targets(client, namespace, &format!("{fullname}-egress-proxy"), 9090).await;
    assert_eq!(operators.len(), 2, "two operator replicas: {operators:?}");
    assert_eq!(proxies.len(), 1, "one egress proxy: {proxies:?}");
    let rendered = real_node::helm(&[
        "template".into(),
        release.into(),
        real_node::chart(),
        "--namespace".into(),
        namespace.into(),
        "--set".into(),
        "metrics.prometheusRule.enabled=true".into(),
        "--show-only".into(),
        "templates/prometheusrule.yaml".into(),
    ]);
    assert!(
        rendered.status.success(),
        "{}",
        String::from_utf8_lossy(&rendered.stderr)
    );
    let rendered = String::from_utf8(rendered.stdout).unwrap();
    // The PrometheusRule's spec is a rules file (as `make test-alerts` reads it).
    let rules: String = rendered
        .split_once("\nspec:\n")
        .map(|(_, spec)| spec)
        .unwrap_or_default()
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("  ").unwrap_or(l)))
        .collect();
    assert!(rules.starts_with("groups:"), "{rendered}");
    let prometheus = Prometheus::start(
        &[
            ScrapeJob {
                job: fullname.clone(),
                targets: operators.clone(),
            },
            ScrapeJob {
                job: format!("{fullname}-egress-proxy"),
                targets: proxies,
            },
        ],
        &rules,
    );
    let wait_for = |what: &str, expr: &str, ok: &dyn Fn(&[serde_json::Value]) -> bool| {
        let started = std::time::Instant::now();
        loop {
            let result = prometheus.query(expr);
            if result.as_deref().is_ok_and(ok) {
                return result.unwrap();
            }
            assert!(
                started.elapsed() < Duration::from_secs(180),
                "{what}: `{expr}` answered {result:?} for 180 s"
            );
            #[expect(
                clippy::disallowed_methods,
                reason = "a scrape or rule evaluation has no notification: the query is polled, paced at 500 ms, bounded at 180 s"
            )]
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    let value = |s: &serde_json::Value| s["value"][1].as_str().unwrap_or("").to_owned();
    wait_for("every target scraped", "up", &|r| {
        r.len() == 3 && r.iter().all(|s| value(s) == "1")
    });
    // Every panel query of every dashboard, its variables set to "all" as Grafana does.
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/protobot/dashboards");
    let mut queries = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for path in &files {
        let dashboard: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        dashboard_queries(&dashboard, &mut queries);
    }
    let queries: Vec<String> = queries
        .iter()
        .map(|q| q.replace("$namespace", ".*").replace("$project", ".*"))
        .collect();
    assert!(queries.len() >= 30, "{queries:?}");
    // The items-by-state panel counts each completed item once across the two replicas (after
    // the recording rule's first evaluation): as many as the API server holds (the operator
    // watches every namespace; a failed earlier run may have left its items behind).
    let expected = Api::<BuildWorkItem>::all(client.clone())
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|i| {
            i.status
                .as_ref()
                .is_some_and(|s| s.state == LifecycleState::Completed)
        })
        .count()
        .to_string();
    let items_by_state = queries
        .iter()
        .find(|q| q.starts_with("sum by (state) (namespace_job_state:protobot_work_items:max"))
        .expect("the overview has an items-by-state panel");
    let by_state = wait_for(
        "items by state, once across replicas",
        items_by_state,
        &|r| r.iter().any(|s| s["metric"]["state"] == "completed"),
    );
    let completed: Vec<_> = by_state
        .iter()
        .filter(|s| s["metric"]["state"] == "completed")
        .map(value)
        .collect();
    assert_eq!(
        completed,
        std::slice::from_ref(&expected),
        "the dashboard counts each completed item once: {by_state:?}"
    );
    let recorded = wait_for(
        "the recording rule",
        "namespace_job_state:protobot_work_items:max{state=\"completed\"}",
        &|r| !r.is_empty(),
    );
    assert_eq!(value(&recorded[0]), expected, "{recorded:?}");
    // Each replica publishes its build slots (the chart's default, 8 each).
    let slots = wait_for(
        "build slots per replica",
        "sum(protobot_build_slots{state=\"total\"})",
        &|r| !r.is_empty(),
    );
    assert_eq!(value(&slots[0]), "16", "two replicas of 8 slots: {slots:?}");
    // rate() and increase() need two samples of a series in their range: wait until every
    // target was scraped three times.
    wait_for(
        "three scrapes of every target",
        "count_over_time(up[5m]) >= 3",
        &|r| r.len() == 3,
    );
    // Every query parses and answers; one without a series must be over a family this
    // scenario has no event for (no model call, no forge), and nothing else.
    let mut refused = Vec::new();
    let mut empty = Vec::new();
    for q in &queries {
        match prometheus.query(q) {
            Err(e) => refused.push(format!("{q}: {e}")),
            Ok(series) if series.is_empty() => empty.push(q.clone()),
            Ok(_) => {}
        }
    }
    assert!(
        refused.is_empty(),
        "dashboard queries Prometheus refused: {refused:#?}"
    );
    let unexplained: Vec<_> = empty
        .iter()
        .filter(|q| !q.contains("protobot_model_") && !q.contains("protobot_forge_"))
        .collect();
    assert!(
        unexplained.is_empty(),
        "dashboard queries without data after a build: {unexplained:#?}"
    );
    println!(
        "Prometheus scraped {} operator replicas and the egress proxy: {} dashboards, {} panel queries evaluated, {} with data, {} without (model calls and forge: none in this scenario)",
        operators.len(),
        files.len(),
        queries.len(),
        queries.len() - empty.len(),
        empty.len()
    );
}

/// The Kubernetes executor's configuration for `namespace`, staging under `staging` (the
/// claim of [`real_node::sandbox_namespace`]), running `image`.
fn executor_config(
    namespace: &str,
    staging: &std::path::Path,
    image: String,
) -> protobot_kube_executor::KubeExecutorConfig {
    let mut config = protobot_kube_executor::KubeExecutorConfig::new(
        namespace,
        protobot_kube_executor::StagingVolume {
            claim_name: "protobot-staging".into(),
            mount_path: staging.to_path_buf(),
        },
        staging.join("collected"),
    );
    config.default_image = Some(image);
    config
}

/// The shipped gVisor profile.
fn gvisor_profile() -> protobot_kube_executor::SandboxProfile {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sandbox-profiles/gvisor.yaml"),
    )
    .unwrap();
    protobot_kube_executor::SandboxProfile::parse(&text, "gvisor.yaml").unwrap()
}

/// Faults a run meets on a real node, read by the executor's own reading of the pod
/// (`status::outcome`): a command over its memory limit is killed by the kernel's cgroup
/// (runc) or inside the sandbox (gVisor) and must end as the memory limit, never as a plain
/// exit or signal the Job Site would triage as the Worker's bug; a run past its wall clock
/// ends as the wall-clock limit; a plain exit keeps its code.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_over_its_memory_or_its_deadline_ends_as_that_limit_on_the_node() {
    use protobot_jobsite::executor::{Limits, RunSpec, SandboxRole, Termination};
    use protobot_kube_executor::{
        manifest,
        status::{PodOutcome, outcome},
    };

    let Some(node) = node_or_skip("limits_on_the_real_node").await else {
        return;
    };
    let [worker] = <[String; 1]>::try_from(load_images(&["worker"])).unwrap();
    let client = node.client.clone();
    let ns = TestNamespace::create(&client, "real-node-limits").await;
    let (staging, pv_name) = real_node::sandbox_namespace(&client, &ns.name).await;
    let config = executor_config(&ns.name, staging.path(), worker);
    let pods = ns.pods();
    let memory = |limit: &str| Termination::LimitExceeded {
        limit: limit.into(),
    };
    // `tail` keeps a line without a newline in memory: /dev/zero has none.
    let cases: [(&str, &str, u64, u64, Termination); 3] = [
        ("oom", "tail /dev/zero", 64 << 20, 120, memory("memory")),
        ("deadline", "sleep 600", 256 << 20, 5, memory("wall-clock")),
        (
            "exit",
            "exit 3",
            256 << 20,
            120,
            Termination::Exited { code: 3 },
        ),
    ];
    let mut seen = Vec::new();
    // The executor builds gVisor (or Kata) pods only (a runc profile is refused as
    // insufficient); the same pod under runc is the control: the kernel's cgroup, not gVisor,
    // kills it there.
    let profile = gvisor_profile();
    for runtime in [GVISOR, RUNC] {
        for (case, script, memory_bytes, wall_secs, expected) in &cases {
            let spec = RunSpec {
                run_id: format!("limits-{runtime}-{case}"),
                role: SandboxRole::WorkerB,
                workspace: staging.path().join("unused"),
                task: json!({}),
                command: vec!["/bin/bash".into(), "-c".into(), (*script).into()],
                image: None,
                env: Default::default(),
                limits: Limits {
                    wall_clock: Duration::from_secs(*wall_secs),
                    memory_bytes: *memory_bytes,
                    ..Limits::default()
                },
                egress_proxy: None,
                audit: Default::default(),
                attribution: Default::default(),
            };
            let mut pod = manifest::build_pod(&profile, &config, &spec, None).unwrap();
            if let Some(spec) = pod.spec.as_mut() {
                spec.runtime_class_name = Some(runtime.to_owned());
            }
            let name = pod.metadata.name.clone().unwrap();
            pods.create(&PostParams::default(), &pod).await.unwrap();
            let ended = |p: Option<&Pod>| p.is_some_and(|p| outcome(p) != PodOutcome::Pending);
            let pod = protobot_testkit::wait::until(&pods, &name, Duration::from_secs(240), ended)
                .await
                .ok()
                .flatten()
                .unwrap_or_else(|| panic!("{runtime}/{case}: the run did not end"));
            let got = outcome(&pod);
            let terminated = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .and_then(|c| c.state.as_ref())
                .and_then(|s| s.terminated.as_ref())
                .map(|t| (t.exit_code, t.signal, t.reason.clone()));
            println!("{runtime}/{case}: {got:?} (terminated: {terminated:?})");
            seen.push((runtime, *case, got, expected.clone()));
            let _ = pods.delete(&name, &DeleteParams::default()).await;
        }
    }
    for (runtime, case, got, expected) in &seen {
        assert_eq!(
            got,
            &PodOutcome::Ended(expected.clone()),
            "{runtime}/{case} (every outcome is printed above)"
        );
    }
    let _ = Api::<PersistentVolume>::all(client.clone())
        .delete(&pv_name, &DeleteParams::default())
        .await;
    ns.delete().await;
}

/// The sandbox's NetworkPolicy, enforced by the node: a pod built by the Kubernetes executor
/// (`manifest::build_pod`, the gVisor profile) connects to a listener on the node address and
/// to the cluster DNS over TCP. Without the run's NetworkPolicy (and without the supervisor)
/// both connect (the control: the probe can see a connection); with it
/// (`manifest::build_network_policy`) and the in-guest supervisor neither does, from the
/// command's first instant: the supervisor starts the command only once the policy is in force
/// (kube-router programs it after the pod started).
#[tokio::test(flavor = "multi_thread")]
async fn the_runs_network_policy_refuses_a_direct_connection_and_dns_on_the_node() {
    use protobot_jobsite::executor::{Limits, RunSpec, SandboxRole};
    use protobot_kube_executor::manifest;

    let Some(node) = node_or_skip("network_policy_on_the_real_node").await else {
        return;
    };
    let [operator, worker] = <[String; 2]>::try_from(load_images(&["operator", "worker"])).unwrap();
    let client = node.client.clone();
    let ns = TestNamespace::create(&client, "real-node-netpol").await;
    let listener = std::net::TcpListener::bind((NODE_IP, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            if stream.is_ok() {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    // The staging claim the pod mounts (its sub-paths are created by the kubelet).
    let (staging, pv_name) = real_node::sandbox_namespace(&client, &ns.name).await;
    let profile = gvisor_profile();
    let config = executor_config(&ns.name, staging.path(), worker);
    // Once at the container's start, and again 3 s later: kube-router programs a new pod's
    // policy from its pod watch, after the pod started (the early line shows that window);
    // the verdict is the later one.
    let probe = format!(
        "r=''; timeout 5 bash -c 'exec 3<>/dev/tcp/{NODE_IP}/{port}' 2>/dev/null && r=\"$r direct\"; \
         timeout 5 bash -c 'exec 3<>/dev/tcp/{NODE_IP}/53' 2>/dev/null && r=\"$r dns\""
    );
    let script = format!("{probe}; echo \"early:$r\"; sleep 3; {probe}; echo \"result:$r\"");
    let pods = ns.pods();
    let mut outcomes = Vec::new();
    for with_policy in [false, true] {
        let spec = RunSpec {
            run_id: format!("netpol-{with_policy}"),
            role: SandboxRole::WorkerB,
            workspace: staging.path().join("unused"),
            task: json!({}),
            command: vec!["/bin/bash".into(), "-c".into(), script.clone()],
            image: None,
            env: Default::default(),
            limits: Limits {
                wall_clock: Duration::from_secs(120),
                memory_bytes: 256 << 20,
                ..Limits::default()
            },
            egress_proxy: None,
            audit: Default::default(),
            attribution: Default::default(),
        };
        let mut config = config.clone();
        if with_policy {
            config.supervisor_image = Some(operator.clone());
            let policy = manifest::build_network_policy(&profile, &config, &spec, None);
            Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(
                client.clone(),
                &ns.name,
            )
            .create(&PostParams::default(), &policy)
            .await
            .unwrap();
        }
        let pod = manifest::build_pod(&profile, &config, &spec, None).unwrap();
        let name = pod.metadata.name.clone().unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        let done = real_node::until_finished(&pods, &name, Duration::from_secs(180)).await;
        let log = real_node::logs(&pods, &name, manifest::CONTAINER).await;
        println!(
            "NetworkPolicy {}: {} ({:?})",
            if with_policy { "present" } else { "absent" },
            log.trim(),
            done.status.and_then(|s| s.phase)
        );
        outcomes.push(log);
    }
    let verdict = |log: &str| {
        log.lines()
            .find_map(|l| l.strip_prefix("result:"))
            .map(str::trim)
            .unwrap_or("<no result line>")
            .to_owned()
    };
    assert_eq!(
        verdict(&outcomes[0]),
        "direct dns",
        "without the policy the pod reaches the node and its DNS (the control): {}",
        outcomes[0]
    );
    assert_eq!(
        verdict(&outcomes[1]),
        "",
        "the run's NetworkPolicy refuses a direct connection and DNS: {}",
        outcomes[1]
    );
    let early = outcomes[1]
        .lines()
        .find_map(|l| l.strip_prefix("early:"))
        .map(str::trim);
    assert_eq!(
        early,
        Some(""),
        "the supervised command starts only once the policy is in force: {}",
        outcomes[1]
    );
    println!(
        "connections the host listener accepted: {}",
        accepted.load(std::sync::atomic::Ordering::SeqCst)
    );
    let _ = Api::<PersistentVolume>::all(client.clone())
        .delete(&pv_name, &DeleteParams::default())
        .await;
    ns.delete().await;
}
