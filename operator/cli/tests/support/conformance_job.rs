#![allow(dead_code)]
//! The chart's sandbox conformance Job on the real kube-apiserver (`KUBECONFIG`), shared by
//! the scenarios that run it (`sandbox_conformance.rs`, `helm_install_acceptance.rs`): the
//! chart rendered with `helm template` for a scenario namespace as the sandbox namespace,
//! the platform a sandbox pod needs, the Job's rendered arguments run by this build's binary
//! as the Job's own ServiceAccount, and the simulated kubelet (bubblewrap) whose node holds
//! the chart's operator image, so that the supervisor's init container finds
//! `/usr/local/bin/protobot` (this build's binary) as it would in the image.
//!
//! What this does not exercise is the Job object itself (the job controller and a kubelet
//! mounting the pod's token): the process runs on this machine with the Job's arguments.

use std::{
    path::PathBuf,
    process::{Command, Output},
    sync::Arc,
};

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::{Api, Client};
use protobot_e2e::{Cluster, create_object, real};
use protobot_executors::ConformanceReport;
use serde_json::{Value, json};

/// The image probe pods run (the host's `/usr` under bubblewrap: /bin/sh and git).
pub const PROBE_IMAGE: &str = "registry.example.invalid/worker:e2e";
/// The operator's image as the scenarios render the chart; its `/usr/local/bin/protobot`
/// is this build's binary on the simulated node.
pub const OPERATOR_IMAGE: &str = "registry.example.invalid/protobot:e2e";
/// The profile every scenario measures.
pub const PROFILE: &str = "kata";
/// The report ConfigMap of that profile (its `spec.conformance.configMap`).
pub const REPORT_CONFIGMAP: &str = "protobot-conformance-kata";
/// Where the chart's operator image holds the protobot binary.
pub const IMAGE_BINARY: &str = "/usr/local/bin/protobot";

/// Whether the scenarios can run here: without `KUBECONFIG` they are skipped
/// (`PROTOBOT_E2E_REQUIRE_CLUSTER=1` makes that a failure, as CI's real-apiserver step sets it).
pub fn skip_without_cluster() -> bool {
    if std::env::var_os("KUBECONFIG").is_none() {
        assert!(
            std::env::var_os("PROTOBOT_E2E_REQUIRE_CLUSTER").is_none(),
            "PROTOBOT_E2E_REQUIRE_CLUSTER is set but KUBECONFIG is not"
        );
        eprintln!(
            "skipping: the conformance Job scenarios run against a real API server (KUBECONFIG)"
        );
        return true;
    }
    false
}

/// Bubblewrap for the simulated node, or `None` (skipped; a failure with
/// `PROTOBOT_REQUIRE_BWRAP`).
pub fn bubblewrap() -> Option<protobot_testkit::BubblewrapContainerExecutor> {
    let found = protobot_testkit::BubblewrapContainerExecutor::from_path();
    if found.is_none() {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
            "PROTOBOT_REQUIRE_BWRAP is set but bwrap is missing"
        );
        eprintln!("skipping: bubblewrap is not installed");
    }
    found
}

/// The chart rendered for `ns` as the sandbox namespace, with the probe and operator images.
pub fn rendering(ns: &str) -> Vec<Value> {
    rendering_with(ns, &[])
}

/// [`rendering`] with more `--set` values.
pub fn rendering_with(ns: &str, sets: &[String]) -> Vec<Value> {
    let mut all = vec![
        format!("jobSite.sandboxNamespace={ns}"),
        "jobSite.staging.create=false".into(),
        format!("jobSite.conformance.image={PROBE_IMAGE}"),
        format!("jobSite.sandboxImage={PROBE_IMAGE}"),
        format!(
            "image.repository={}",
            OPERATOR_IMAGE.trim_end_matches(":e2e")
        ),
        "image.tag=e2e".into(),
    ];
    all.extend_from_slice(sets);
    real::render_chart("protobot", &all).unwrap()
}

/// The arguments of the chart's container `container` of kind `kind` named `name`, as
/// rendered.
pub fn rendered_args(objects: &[Value], kind: &str, name: &str) -> Vec<String> {
    let object = objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("the chart renders {kind} {name}"));
    object["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The conformance Job's container arguments, as rendered.
pub fn job_args(objects: &[Value]) -> Vec<String> {
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
    assert_eq!(
        pod["containers"][0]["image"], OPERATOR_IMAGE,
        "the Job runs the operator's image"
    );
    pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The chart's sandbox-profiles ConfigMap, as rendered.
pub fn profiles_configmap(objects: &[Value]) -> &Value {
    objects
        .iter()
        .find(|o| {
            o["kind"] == "ConfigMap"
                && o["metadata"]["name"] == "protobot-protobot-sandbox-profiles"
        })
        .expect("the chart renders the sandbox profiles' ConfigMap")
}

/// The profile document as the chart's sandbox-profiles ConfigMap carries it.
pub fn chart_profile(objects: &[Value], profile: &str) -> String {
    profiles_configmap(objects)["data"][format!("{profile}.yaml")]
        .as_str()
        .expect("the chart's profiles ConfigMap carries the profile")
        .to_owned()
}

/// This machine's stand-ins for the Job pod's volumes.
pub struct Mounts {
    /// `/etc/protobot/sandbox-profiles` (the profiles' ConfigMap).
    pub profiles: PathBuf,
    /// `/var/lib/protobot/staging` (the staging claim: the node's directory for it).
    pub staging: PathBuf,
    /// `/var/lib/protobot/work` (an emptyDir).
    pub work: PathBuf,
}

/// Who runs the scenario's sandbox pods.
pub enum Node {
    /// No node: nothing may be scheduled (a failing preflight creates no pod).
    None,
    /// The simulated kubelet in bubblewrap, its node holding the chart's operator image.
    Bubblewrap(protobot_testkit::BubblewrapContainerExecutor),
}

/// One scenario's cluster, rendering, platform and Job identity.
pub struct Scenario {
    /// The cluster (administrator and operator clients, the scenario namespace).
    pub cluster: Cluster,
    /// The scenario namespace (also the sandbox namespace).
    pub ns: String,
    /// The chart's rendering for this namespace.
    pub objects: Vec<Value>,
    /// The conformance Job's arguments, as rendered.
    pub args: Vec<String>,
    /// The profile document as mounted into the Job (and the operator).
    pub profile: String,
    /// The Job's volumes on this machine.
    pub mounts: Mounts,
    /// A kubeconfig of the Job's ServiceAccount.
    pub kubeconfig: PathBuf,
    /// The simulated node, if any.
    pub kubelet: Option<protobot_testkit::Kubelet>,
    /// Scratch of the scenario (kubeconfigs, the Job's work directory, repositories).
    pub tmp: tempfile::TempDir,
}

impl Scenario {
    /// Connects, provides the platform (RuntimeClass `kata`, the sandbox ServiceAccount, the
    /// staging claim), renders the chart and writes the profile the Job reads, after
    /// `edit_profile` (the identity for the profile as installed).
    pub async fn prepare(
        name: &str,
        node: Node,
        edit_profile: impl FnOnce(String) -> String,
    ) -> Scenario {
        Self::prepare_with(name, node, &[], |p, _| edit_profile(p)).await
    }

    /// [`Scenario::prepare`] with more chart values (`--set`), `edit_profile` also given the
    /// scenario namespace.
    pub async fn prepare_with(
        name: &str,
        node: Node,
        sets: &[String],
        edit_profile: impl FnOnce(String, &str) -> String,
    ) -> Scenario {
        let cluster = Cluster::connect(name).await;
        let (client, ns) = (cluster.client.clone(), cluster.namespace.clone());
        protobot_e2e::sandbox_platform(&cluster, PROFILE).await;
        create_object(
            &Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns),
            json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "protobot-staging", "namespace": ns},
                "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
            }),
        )
        .await;
        let tmp = tempfile::tempdir().unwrap();
        let objects = rendering_with(&ns, sets);
        let args = job_args(&objects);
        assert!(
            args.contains(&format!("--sandbox-namespace={ns}")),
            "{args:?}"
        );
        assert!(
            args.contains(&"--succeed-when-stored".to_owned()),
            "{args:?}"
        );
        let profile = edit_profile(chart_profile(&objects, PROFILE), &ns);
        let kubelet = match node {
            Node::None => None,
            Node::Bubblewrap(bwrap) => Some(
                protobot_testkit::Kubelet::connect_with(
                    client.clone(),
                    Arc::new(bwrap),
                    &format!("node-{ns}"),
                    vec![ns.clone()],
                    &protobot_testkit::kubelet::NodeSpec {
                        images: protobot_testkit::kubelet::Images::new().with_file(
                            OPERATOR_IMAGE,
                            IMAGE_BINARY,
                            env!("CARGO_BIN_EXE_protobot"),
                        ),
                        // Probes measure what a node enforces: the profile's user, its
                        // read-only root, the memory limit.
                        enforce_pod_security: true,
                    },
                )
                .await
                .unwrap(),
            ),
        };
        let staging = match &kubelet {
            Some(kubelet) => kubelet.claim_dir(&ns, "protobot-staging").unwrap(),
            None => tmp.path().join("staging"),
        };
        let mounts = Mounts {
            profiles: tmp.path().join("profiles"),
            staging,
            work: tmp.path().join("work"),
        };
        for dir in [&mounts.profiles, &mounts.staging, &mounts.work] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(mounts.profiles.join(format!("{PROFILE}.yaml")), &profile).unwrap();
        let kubeconfig = tmp.path().join("conformance.kubeconfig");
        let account = real::conformance_service_account().unwrap();
        std::fs::write(
            &kubeconfig,
            real::service_account_kubeconfig(&client, &real::release_namespace(), &account)
                .await
                .unwrap(),
        )
        .unwrap();
        Scenario {
            cluster,
            ns,
            objects,
            args,
            profile,
            mounts,
            kubeconfig,
            kubelet,
            tmp,
        }
    }

    /// An executor configuration for the scenario's sandbox namespace and staging claim (the
    /// node's directory for it), collecting under the scenario's scratch.
    pub fn executor_config(&self) -> protobot_kube_executor::KubeExecutorConfig {
        protobot_kube_executor::KubeExecutorConfig::new(
            &self.ns,
            protobot_kube_executor::StagingVolume {
                claim_name: "protobot-staging".into(),
                mount_path: self.mounts.staging.clone(),
            },
            self.tmp.path().join("collected"),
        )
    }

    /// The administrator's client.
    pub fn client(&self) -> &Client {
        &self.cluster.client
    }

    /// Runs `args` (the Job's, or a variant) as the Job would, with this machine's paths in
    /// place of the pod's mounts.
    pub fn run_job(&self, args: &[String]) -> Output {
        let mapped: Vec<String> = args
            .iter()
            .map(|a| {
                if let Some(file) = a.strip_prefix("--profile-file=/etc/protobot/sandbox-profiles/")
                {
                    format!(
                        "--profile-file={}",
                        self.mounts.profiles.join(file).display()
                    )
                } else if a.starts_with("--staging-path=") {
                    format!("--staging-path={}", self.mounts.staging.display())
                } else if a.starts_with("--workdir=") {
                    format!("--workdir={}", self.mounts.work.display())
                } else {
                    a.clone()
                }
            })
            .collect();
        // The node runs pods as the profile's user: the Job's default (`auto`, which chowns
        // staged directories to that user as root, as in the chart's pod) is kept.
        Command::new(env!("CARGO_BIN_EXE_protobot"))
            .args(&mapped)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "warn,protobot_controller::api_errors=warn")
            .output()
            .unwrap()
    }

    /// The report stored in the profile's ConfigMap.
    pub async fn stored_report(&self) -> Option<ConformanceReport> {
        let maps: Api<ConfigMap> = Api::namespaced(self.client().clone(), &self.ns);
        let map = maps.get_opt(REPORT_CONFIGMAP).await.unwrap()?;
        let json = map.data?.remove("report.json")?;
        Some(serde_json::from_str(&json).unwrap())
    }

    /// Pods and NetworkPolicies left in the namespace.
    pub async fn leftovers(&self) -> (usize, usize) {
        use k8s_openapi::api::networking::v1::NetworkPolicy;
        let pods: Api<Pod> = Api::namespaced(self.client().clone(), &self.ns);
        let policies: Api<NetworkPolicy> = Api::namespaced(self.client().clone(), &self.ns);
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

    /// Stops the node and cleans the cluster up.
    pub async fn finish(self) {
        drop(self.kubelet);
        self.cluster.cleanup().await;
    }
}

/// The lines of the Job's stderr where the API server refused it a call.
pub fn refusals(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("refused") && l.contains("403"))
        .collect()
}
