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

use std::{process::Command, time::Duration};

use kube::Api;
use protobot_e2e::{create_object, real};
use serde_json::json;

#[path = "support/conformance_job.rs"]
mod conformance_job;

use conformance_job::{Node, PROFILE, Scenario, bubblewrap, refusals, skip_without_cluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_job_measures_the_profile_in_pods_and_stores_the_report_the_operator_watches()
 {
    if skip_without_cluster() {
        return;
    }
    let Some(bwrap) = bubblewrap() else { return };
    // The profile exactly as installed: its supervisor is the chart's operator image, which
    // the simulated node holds with this build's binary at /usr/local/bin/protobot.
    let s = Scenario::prepare("conformance-job", Node::Bubblewrap(bwrap), |p| p).await;
    let out = s.run_job(&s.args);
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
    let printed: protobot_executors::ConformanceReport = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not a report ({e}): {stderr}"));
    let stored = s
        .stored_report()
        .await
        .expect("the report is stored in the profile's ConfigMap");
    assert_eq!(stored, printed, "the stored report is the printed one");
    assert_eq!(stored.profile, PROFILE);
    assert_eq!(stored.backend.name, "protobot-kubernetes");
    for id in ["SB-K8S-001", "SB-K8S-002", "SB-K8S-003", "SB-K8S-004"] {
        let check = stored.checks.iter().find(|c| c.id == id).unwrap();
        assert!(check.passed, "preflight {id} failed: {check:?}");
    }
    let limits = stored
        .capabilities
        .iter()
        .find(|c| c.name == "resource-limits")
        .unwrap();
    assert!(
        limits.supported,
        "the profile configures the supervisor: {limits:?}"
    );
    // The measured verdict, whatever it is, is what an operator's executor acts on.
    let profile = protobot_kube_executor::SandboxProfile::parse(&s.profile, "kata.yaml").unwrap();
    let executor = protobot_kube_executor::KubernetesExecutor::new(
        s.cluster.operator.clone(),
        s.executor_config(),
        profile.clone(),
        protobot_kube_executor::read_report_configmap(s.cluster.operator.clone(), &s.ns, &profile)
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
        s.leftovers().await,
        (0, 0),
        "no probe pod or NetworkPolicy is left behind"
    );
    s.finish().await;
}

/// The suite's probes as pods of the profile as installed, supervisor included, without the
/// credential-broker requirement (the requirement set of the suite's `local` profile, the
/// only one that leaves it out): every probe passes through pods on a node that enforces the
/// profile's user, read-only root and memory limit, every SB-LIM check among them (without
/// that enforcement SB-FS-005, SB-LIM-003 and SB-LIM-004 fail). This report is never stored:
/// the profile's own report (above) still fails closed on credential-broker until its probes
/// run through pods and the egress proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_probe_passes_in_pods_of_the_installed_profile_with_its_supervisor() {
    if skip_without_cluster() {
        return;
    }
    let Some(bwrap) = bubblewrap() else { return };
    let s = Scenario::prepare("conformance-probes", Node::Bubblewrap(bwrap), |p| p).await;
    let profile = protobot_kube_executor::SandboxProfile::parse(&s.profile, "kata.yaml").unwrap();
    let mut config = s.executor_config();
    config.default_image = Some(conformance_job::PROBE_IMAGE.into());
    // The node runs probe pods as the profile's user: staged directories are chowned to it.
    config.staging_ownership = protobot_kube_executor::StagingOwnership::Auto;
    config.instance = "conformance".into();
    // As the Job's ServiceAccount, with the chart's RBAC, on a thread with a stack as deep as
    // the CLI's main thread (the suite's futures overflow a test thread's 2 MiB).
    let kubeconfig = s.kubeconfig.clone();
    let measured = std::thread::Builder::new()
        .stack_size(32 << 20)
        .spawn(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    let job_client = kube::Client::try_from(
                        kube::Config::from_custom_kubeconfig(
                            kube::config::Kubeconfig::read_from(&kubeconfig).unwrap(),
                            &Default::default(),
                        )
                        .await
                        .unwrap(),
                    )
                    .unwrap();
                    let executor = protobot_kube_executor::KubernetesExecutor::for_conformance(
                        job_client, config, profile,
                    )
                    .unwrap();
                    let supervisor = executor.supervisor().map(|sup| sup.image);
                    let report = protobot_executors::run_conformance(
                        &executor,
                        protobot_executors::bubblewrap::LOCAL_PROFILE,
                    )
                    .await;
                    (supervisor, report)
                })
        })
        .unwrap();
    let (supervisor, report) = tokio::task::spawn_blocking(move || measured.join().unwrap())
        .await
        .unwrap();
    assert_eq!(
        supervisor,
        Some(conformance_job::OPERATOR_IMAGE.to_owned()),
        "the chart writes the operator's image into the profile's supervisor"
    );
    // The capabilities are the executor's own account (credential-broker among them, as
    // the executor reports it); only the requirement set differs from the profile's.
    let limits = report
        .capabilities
        .iter()
        .find(|c| c.name == "resource-limits")
        .unwrap();
    assert!(limits.supported, "{:?}", report.capabilities);
    let ids: Vec<&str> = report.checks.iter().map(|c| c.id.as_str()).collect();
    for id in [
        "SB-FS-001",
        "SB-LIM-001",
        "SB-LIM-002",
        "SB-LIM-003",
        "SB-LIM-004",
        "SB-LIM-005",
    ] {
        assert!(ids.contains(&id), "{id} did not run: {ids:?}");
    }
    // Every probe passes through pods of the profile, the network and credential probes
    // included (they run here; what the profile's own report lacks is the credential
    // broker's probes through pods and the egress proxy).
    let failed: Vec<String> = report
        .failed_checks()
        .iter()
        .map(|c| format!("{}: {}", c.id, c.detail.as_deref().unwrap_or("")))
        .collect();
    assert!(
        failed.is_empty(),
        "probes failed in pods of the profile: {failed:#?}"
    );
    assert_eq!(
        s.leftovers().await,
        (0, 0),
        "no probe pod or NetworkPolicy is left behind"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_runtime_class_the_profile_fails_naming_it_and_the_project_says_so() {
    if skip_without_cluster() {
        return;
    }
    // A runtime no node of this cluster has (RuntimeClasses are cluster-wide: a name of its own).
    let runtime = format!("kata-absent-{:x}", std::process::id());
    let s = Scenario::prepare("conformance-missing", Node::None, |p| {
        p.replace(
            "runtimeClassName: kata",
            &format!("runtimeClassName: {runtime}"),
        )
    })
    .await;
    let (client, ns) = (s.client().clone(), s.ns.clone());
    let out = s.run_job(&s.args);
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
    let stored = s
        .stored_report()
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
    assert_eq!(s.leftovers().await, (0, 0), "no probe pod was created");

    // Without --succeed-when-stored (a person at a terminal), a failing report exits 1.
    let strict: Vec<String> = s
        .args
        .iter()
        .filter(|a| *a != "--succeed-when-stored")
        .cloned()
        .collect();
    let out = s.run_job(&strict);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The operator's Project controller reads the stored report and names what is missing.
    let tmp = s.tmp.path();
    let origin = tmp.join("origin.git");
    protobot_demo::example::author(&tmp.join("author"), &origin).unwrap();
    let operator_kubeconfig = tmp.join("operator.kubeconfig");
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
    let log = tmp.join("operator.log");
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
        .arg(s.mounts.profiles.join("kata.yaml"))
        .args(["--sandbox-namespace", &ns, "--allow-local-repositories"])
        .env("KUBECONFIG", &operator_kubeconfig)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(tmp.join("operator.err")).unwrap())
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
    s.finish().await;
}
