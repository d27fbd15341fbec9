#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `protobot sandbox conformance --profile kata` in a cluster, run as the chart's
//! conformance Job runs it: the arguments of the Job `helm template` renders, the profile as
//! the chart's ConfigMap carries it, and a token of the Job's own ServiceAccount under the
//! chart's RBAC, against the real kube-apiserver (`KUBECONFIG`) with the simulated kubelet
//! running the probe pods in bubblewrap.
//!
//! - With the platform in place (RuntimeClass, sandbox ServiceAccount, staging claim), the
//!   probes run as pods of the profile, the report is stored in the profile's ConfigMap, an
//!   operator's executor watching that ConfigMap admits or refuses runs as the report says,
//!   and no probe pod or NetworkPolicy is left behind.
//! - Without the RuntimeClass the report fails naming it, no pod is created, the report is
//!   still stored, and the Project's SandboxConformant condition (the operator process's
//!   Project controller) names what is missing.
//!
//! What this does not exercise is the Job object itself (the job controller and a kubelet
//! mounting the pod's token): the process runs on this machine with the Job's arguments.
//! Without `KUBECONFIG` the scenarios are skipped (`PROTOBOT_E2E_REQUIRE_CLUSTER=1` makes
//! that a failure, as CI's real-apiserver step sets it).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::{ConfigMap, PersistentVolumeClaim, Pod},
    networking::v1::NetworkPolicy,
};
use kube::{Api, Client};
use protobot_e2e::{Cluster, create_object, real};
use protobot_executors::ConformanceReport;
use serde_json::{Value, json};

/// The chart rendered for a scenario namespace as the sandbox namespace, with a probe image.
fn rendering(ns: &str) -> Vec<Value> {
    real::render_chart(
        "protobot",
        &[
            format!("jobSite.sandboxNamespace={ns}"),
            "jobSite.staging.create=false".into(),
            "jobSite.conformance.image=registry.example.invalid/worker:e2e".into(),
        ],
    )
    .unwrap()
}

/// The conformance Job's container arguments, as rendered.
fn job_args(objects: &[Value]) -> Vec<String> {
    let job = objects
        .iter()
        .find(|o| o["kind"] == "Job" && o["metadata"]["name"] == "protobot-protobot-conformance")
        .expect("the chart renders the conformance Job");
    assert_eq!(
        job["metadata"]["annotations"]["helm.sh/hook"], "post-install,post-upgrade",
        "the Job runs on every install and upgrade"
    );
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "protobot-protobot-conformance");
    pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The profile document as the chart's sandbox-profiles ConfigMap carries it.
fn chart_profile(objects: &[Value], profile: &str) -> String {
    objects
        .iter()
        .find(|o| {
            o["kind"] == "ConfigMap"
                && o["metadata"]["name"] == "protobot-protobot-sandbox-profiles"
        })
        .and_then(|o| o["data"][format!("{profile}.yaml")].as_str())
        .expect("the chart's profiles ConfigMap carries the profile")
        .to_owned()
}

/// Runs the Job's arguments, with this machine's paths in place of the pod's mounts.
fn run_as_the_job(args: &[String], kubeconfig: &Path, mounts: &Mounts) -> Output {
    let mapped: Vec<String> = args
        .iter()
        .map(|a| {
            if let Some(file) = a.strip_prefix("--profile-file=/etc/protobot/sandbox-profiles/") {
                format!("--profile-file={}", mounts.profiles.join(file).display())
            } else if a.starts_with("--staging-path=") {
                format!("--staging-path={}", mounts.staging.display())
            } else if a.starts_with("--workdir=") {
                format!("--workdir={}", mounts.work.display())
            } else {
                a.clone()
            }
        })
        .collect();
    Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args(&mapped)
        // The simulated kubelet runs containers as this test's uid, not the profile's.
        .args(["--staging-ownership", "keep"])
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "warn,protobot_controller::api_errors=warn")
        .output()
        .unwrap()
}

/// This machine's stand-ins for the Job pod's volumes.
struct Mounts {
    profiles: PathBuf,
    staging: PathBuf,
    work: PathBuf,
}

async fn stored_report(client: &Client, ns: &str, name: &str) -> Option<ConformanceReport> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let map = maps.get_opt(name).await.unwrap()?;
    let json = map.data?.remove("report.json")?;
    Some(serde_json::from_str(&json).unwrap())
}

async fn leftovers(client: &Client, ns: &str) -> (usize, usize) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    (
        pods.list(&Default::default()).await.unwrap().items.len(),
        policies
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len(),
    )
}

fn skip_without_cluster() -> bool {
    if std::env::var_os("KUBECONFIG").is_none() {
        assert!(
            std::env::var_os("PROTOBOT_E2E_REQUIRE_CLUSTER").is_none(),
            "PROTOBOT_E2E_REQUIRE_CLUSTER is set but KUBECONFIG is not"
        );
        eprintln!(
            "skipping: the conformance Job scenario runs against a real API server (KUBECONFIG)"
        );
        return true;
    }
    false
}

/// The Job's account's kubeconfig, written into `dir`.
async fn job_kubeconfig(client: &Client, dir: &Path) -> PathBuf {
    let account = real::conformance_service_account().unwrap();
    let path = dir.join("conformance.kubeconfig");
    std::fs::write(
        &path,
        real::service_account_kubeconfig(client, &real::release_namespace(), &account)
            .await
            .unwrap(),
    )
    .unwrap();
    path
}

fn staging_claim(ns: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "protobot-staging", "namespace": ns},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    })
}

fn refusals(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("refused") && l.contains("403"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_job_measures_the_profile_in_pods_and_stores_the_report_the_operator_watches()
 {
    if skip_without_cluster() {
        return;
    }
    let Some(bwrap) = protobot_testkit::BubblewrapContainerExecutor::from_path() else {
        assert!(std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none());
        eprintln!("skipping: bubblewrap is not installed");
        return;
    };
    let cluster = Cluster::connect("conformance-job").await;
    let (client, ns) = (cluster.client.clone(), cluster.namespace.clone());
    protobot_e2e::sandbox_platform(&cluster, "kata").await;
    create_object(
        &Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns),
        staging_claim(&ns),
    )
    .await;
    let kubelet = protobot_testkit::Kubelet::connect(
        client.clone(),
        Arc::new(bwrap),
        &format!("node-{ns}"),
        vec![ns.clone()],
    )
    .await
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let objects = rendering(&ns);
    let args = job_args(&objects);
    assert!(
        args.contains(&format!("--sandbox-namespace={ns}")),
        "{args:?}"
    );
    assert!(
        args.contains(&"--succeed-when-stored".to_owned()),
        "{args:?}"
    );
    // The profile as installed; its supervisor binary (the operator image's
    // /usr/local/bin/protobot) is this build's binary on this machine's "node".
    let profile = chart_profile(&objects, "kata").replace(
        "binaryPath: /usr/local/bin/protobot",
        &format!("binaryPath: {}", env!("CARGO_BIN_EXE_protobot")),
    );
    let mounts = Mounts {
        profiles: tmp.path().join("profiles"),
        staging: kubelet.claim_dir(&ns, "protobot-staging").unwrap(),
        work: tmp.path().join("work"),
    };
    std::fs::create_dir_all(&mounts.profiles).unwrap();
    std::fs::write(mounts.profiles.join("kata.yaml"), &profile).unwrap();
    let kubeconfig = job_kubeconfig(&client, tmp.path()).await;

    let out = run_as_the_job(&args, &kubeconfig, &mounts);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "the Job's process failed ({}): {stderr}",
        out.status
    );
    assert!(
        refusals(&stderr).is_empty(),
        "the Job's RBAC refused a call: {stderr}"
    );
    let printed: ConformanceReport = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not a report ({e}): {stderr}"));
    let stored = stored_report(&client, &ns, "protobot-conformance-kata")
        .await
        .expect("the report is stored in the profile's ConfigMap");
    assert_eq!(stored, printed, "the stored report is the printed one");
    assert_eq!(stored.profile, "kata");
    assert_eq!(stored.backend.name, "protobot-kubernetes");
    for id in ["SB-K8S-001", "SB-K8S-002", "SB-K8S-003", "SB-K8S-004"] {
        let check = stored.checks.iter().find(|c| c.id == id).unwrap();
        assert!(check.passed, "preflight {id} failed: {check:?}");
    }
    // The measured verdict, whatever it is, is what an operator's executor acts on.
    let executor = protobot_kube_executor::KubernetesExecutor::new(
        cluster.operator.clone(),
        protobot_kube_executor::KubeExecutorConfig::new(
            &ns,
            protobot_kube_executor::StagingVolume {
                claim_name: "protobot-staging".into(),
                mount_path: mounts.staging.clone(),
            },
            tmp.path().join("collected"),
        ),
        protobot_kube_executor::SandboxProfile::parse(&profile, "kata.yaml").unwrap(),
        protobot_kube_executor::read_report_configmap(
            cluster.operator.clone(),
            &ns,
            &protobot_kube_executor::SandboxProfile::parse(&profile, "kata.yaml").unwrap(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        protobot_jobsite::executor::Executor::admit(&executor).is_ok(),
        stored.passed(),
        "admission follows the stored report: {:?}",
        stored.failure_reason()
    );
    // Which capabilities this deployment lacks is measured, never assumed: the suite fails
    // closed on exactly the unsupported ones, or ran its probes as pods.
    let missing = stored.missing_capabilities();
    if missing.is_empty() {
        assert!(
            stored.checks.iter().any(|c| c.id == "SB-FS-001"),
            "with every capability the probes ran: {:?}",
            stored.checks.iter().map(|c| &c.id).collect::<Vec<_>>()
        );
        assert!(
            stored.passed(),
            "the probes ran in pods of the profile and one failed: {:?}",
            stored.failed_checks()
        );
    } else {
        assert_eq!(missing, ["credential-broker"], "{:?}", stored.capabilities);
        assert!(
            stored
                .fail_closed_reason
                .as_deref()
                .unwrap()
                .contains("credential-broker")
        );
    }
    assert_eq!(
        leftovers(&client, &ns).await,
        (0, 0),
        "no probe pod or NetworkPolicy is left behind"
    );
    drop(kubelet);
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_runtime_class_the_profile_fails_naming_it_and_the_project_says_so() {
    if skip_without_cluster() {
        return;
    }
    let cluster = Cluster::connect("conformance-missing").await;
    let (client, ns) = (cluster.client.clone(), cluster.namespace.clone());
    protobot_e2e::sandbox_platform(&cluster, "kata").await;
    create_object(
        &Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns),
        staging_claim(&ns),
    )
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let objects = rendering(&ns);
    let args = job_args(&objects);
    // A runtime no node of this cluster has (RuntimeClasses are cluster-wide: a name of its own).
    let runtime = format!("kata-absent-{}", &ns[ns.len().saturating_sub(8)..]);
    let profile = chart_profile(&objects, "kata").replace(
        "runtimeClassName: kata",
        &format!("runtimeClassName: {runtime}"),
    );
    let mounts = Mounts {
        profiles: tmp.path().join("profiles"),
        staging: tmp.path().join("staging"),
        work: tmp.path().join("work"),
    };
    std::fs::create_dir_all(&mounts.profiles).unwrap();
    std::fs::create_dir_all(&mounts.staging).unwrap();
    std::fs::write(mounts.profiles.join("kata.yaml"), &profile).unwrap();
    let kubeconfig = job_kubeconfig(&client, tmp.path()).await;

    let out = run_as_the_job(&args, &kubeconfig, &mounts);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "a stored failing report does not fail the Job ({}): {stderr}",
        out.status
    );
    assert!(
        stderr.contains(&format!("RuntimeClass {runtime} does not exist")),
        "the Job's log names what is missing: {stderr}"
    );
    let stored = stored_report(&client, &ns, "protobot-conformance-kata")
        .await
        .expect("a failing report is stored too");
    assert!(!stored.passed());
    let failed: Vec<&str> = stored
        .failed_checks()
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(failed, ["SB-K8S-001"], "{:?}", stored.checks);
    assert!(
        stored
            .fail_closed_reason
            .as_deref()
            .unwrap()
            .contains(&format!("RuntimeClass {runtime} does not exist")),
        "{:?}",
        stored.fail_closed_reason
    );
    assert!(
        stored.capabilities.iter().all(|c| !c.supported),
        "nothing was measured, so nothing is claimed: {:?}",
        stored.capabilities
    );
    assert_eq!(
        leftovers(&client, &ns).await,
        (0, 0),
        "no probe pod was created"
    );

    // Without --succeed-when-stored (a person at a terminal), a failing report exits 1.
    let strict: Vec<String> = args
        .iter()
        .filter(|a| *a != "--succeed-when-stored")
        .cloned()
        .collect();
    let out = run_as_the_job(&strict, &kubeconfig, &mounts);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The operator's Project controller reads the stored report and names what is missing.
    let origin = tmp.path().join("origin.git");
    protobot_jobsite::example::author(&tmp.path().join("author"), &origin).unwrap();
    let operator_kubeconfig = tmp.path().join("operator.kubeconfig");
    std::fs::write(
        &operator_kubeconfig,
        real::operator_kubeconfig(&client).await.unwrap(),
    )
    .unwrap();
    create_object(
        &Api::<protobot_api::Project>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "cli-sync", "namespace": ns},
            "spec": {"repoUrl": format!("file://{}", origin.display()), "sandboxProfile": "kata"},
        }),
    )
    .await;
    let log = tmp.path().join("operator.log");
    let mut operator = Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args([
            "operator",
            "--namespace",
            &ns,
            "--no-job-site",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .arg("--sandbox-profile")
        .arg(mounts.profiles.join("kata.yaml"))
        .args(["--sandbox-namespace", &ns, "--allow-local-repositories"])
        .env("KUBECONFIG", &operator_kubeconfig)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(tmp.path().join("operator.err")).unwrap())
        .spawn()
        .unwrap();
    let projects: Api<protobot_api::Project> = Api::namespaced(client.clone(), &ns);
    let condition = tokio::time::timeout(protobot_e2e::timeout(), async {
        loop {
            let project = projects.get("cli-sync").await.unwrap();
            if let Some(c) = project.status.as_ref().and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| {
                        c.type_ == "SandboxConformant"
                            && c.status == protobot_api::ConditionStatus::False
                    })
                    .cloned()
            }) && c.message.contains("SB-K8S-001")
            {
                return c;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let _ = operator.kill();
    let _ = operator.wait();
    let condition = condition.unwrap_or_else(|_| {
        panic!(
            "the Project never named the failing check: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    assert!(
        condition
            .message
            .contains(&format!("RuntimeClass {runtime} does not exist")),
        "the condition names the missing RuntimeClass: {}",
        condition.message
    );
    cluster.cleanup().await;
}
