#![allow(dead_code)]
//! The real node (`scripts/kube-node up`: containerd, runc, gVisor, the kubelet, kube-proxy,
//! kube-router, CoreDNS) as the judge of pod-shaped behaviour: its presence check, the
//! images built here (`scripts/node-images`), and what a scenario reads back from pods.
//!
//! Without a node the scenarios skip with one line; `PROTOBOT_REQUIRE_NODE=1` (CI) makes
//! that a failure naming what is missing.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod},
    node::v1::RuntimeClass,
};
use kube::{
    Api, Client,
    api::{DeleteParams, LogParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

/// The address pods reach the node's host services at (the bridge's gateway).
pub const NODE_IP: &str = "10.244.0.1";
/// The RuntimeClass of the gVisor profile.
pub const GVISOR: &str = "gvisor";
/// The runc RuntimeClass (comparison only: no sandbox profile may use it).
pub const RUNC: &str = "runc";

/// The node a scenario runs on.
pub struct RealNode {
    /// The administrator's client.
    pub client: Client,
    /// The node's name.
    pub name: String,
    /// `status.nodeInfo.containerRuntimeVersion` (`containerd://2.4.2`).
    pub runtime: String,
    /// `status.nodeInfo.kubeletVersion`.
    pub kubelet: String,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The node, or `None` with one line saying why the scenario is skipped (a panic naming what
/// is missing under `PROTOBOT_REQUIRE_NODE`).
pub async fn node_or_skip(scenario: &str) -> Option<RealNode> {
    let required = std::env::var_os("PROTOBOT_REQUIRE_NODE").is_some();
    let missing = |why: String| {
        assert!(
            !required,
            "PROTOBOT_REQUIRE_NODE is set but {scenario} cannot run: {why}"
        );
        eprintln!("skipping {scenario}: {why} (scripts/kube-node up starts a real node)");
        None
    };
    if std::env::var_os("KUBECONFIG").is_none() {
        return missing("KUBECONFIG is not set".into());
    }
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => return missing(format!("no client from KUBECONFIG: {e}")),
    };
    let nodes = match Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await
    {
        Ok(n) => n.items,
        Err(e) => return missing(format!("cannot list nodes: {e}")),
    };
    // The real node: Ready, its runtime containerd (a simulated kubelet's node reports none).
    let ready = nodes.into_iter().find(|n| {
        let status = n.status.as_ref();
        status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            && status
                .and_then(|s| s.node_info.as_ref())
                .is_some_and(|i| i.container_runtime_version.starts_with("containerd://"))
    });
    let Some(node) = ready else {
        return missing("the cluster has no Ready node run by containerd".into());
    };
    let classes = Api::<RuntimeClass>::all(client.clone());
    for class in [GVISOR, RUNC] {
        if classes.get_opt(class).await.ok().flatten().is_none() {
            return missing(format!("RuntimeClass {class} does not exist"));
        }
    }
    let info = node.status.and_then(|s| s.node_info);
    Some(RealNode {
        client,
        name: node.metadata.name.unwrap_or_default(),
        runtime: info
            .as_ref()
            .map(|i| i.container_runtime_version.clone())
            .unwrap_or_default(),
        kubelet: info.map(|i| i.kubelet_version).unwrap_or_default(),
    })
}

/// Builds (or reuses) and loads images into the node: `operator` (this build's binary),
/// `worker`, `opencode`. Returns their references, in order.
pub fn load_images(names: &[&str]) -> Vec<String> {
    let out = Command::new(repo_root().join("scripts/node-images"))
        .arg("load")
        .args(names)
        .env("PROTOBOT_IMAGE_BINARY", env!("CARGO_BIN_EXE_protobot"))
        .output()
        .expect("scripts/node-images runs");
    assert!(
        out.status.success(),
        "scripts/node-images load {names:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let refs: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(refs.len(), names.len(), "one reference per image: {refs:?}");
    refs
}

/// A namespace of the scenario, deleted on [`TestNamespace::delete`].
pub struct TestNamespace {
    pub client: Client,
    pub name: String,
}

impl TestNamespace {
    pub async fn create(client: &Client, prefix: &str) -> TestNamespace {
        let name = format!("{prefix}-{:08x}", rand_suffix());
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
            )
            .await
            .unwrap();
        TestNamespace {
            client: client.clone(),
            name,
        }
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    pub async fn delete(self) {
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}

fn rand_suffix() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    nanos ^ std::process::id().rotate_left(16)
}

/// Waits until the pod has finished (`Succeeded` or `Failed`) and returns it.
pub async fn until_finished(pods: &Api<Pod>, name: &str, limit: Duration) -> Pod {
    let finished = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
    };
    match protobot_testkit::wait::until(pods, name, limit, finished).await {
        Ok(Some(pod)) => pod,
        other => panic!(
            "pod {name} did not finish within {limit:?} ({other:?}): {:#?}",
            pods.get(name).await.ok().and_then(|p| p.status)
        ),
    }
}

/// A volume for the staging claim `protobot-staging` of `namespace`: a directory on the node
/// (mode 0777: the operator and the sandboxes write it as 65532) and a hostPath
/// PersistentVolume bound to that claim. Returns the directory (removed on drop) and the
/// volume's name.
pub async fn staging_volume(client: &Client, namespace: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::Builder::new()
        .prefix("protobot-staging-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let name = format!("{namespace}-staging");
    Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": "20Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Delete",
                    "storageClassName": "",
                    "hostPath": {"path": dir.path(), "type": "Directory"},
                    "claimRef": {"namespace": namespace, "name": "protobot-staging"},
                },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    (dir, name)
}

/// What a namespace needs before the Kubernetes executor's sandbox pods can run in it: the
/// staging claim `protobot-staging` bound to a fresh [`staging_volume`], and the sandbox
/// service account. Returns the staging directory (removed on drop) and the volume's name
/// (delete it at the end: volumes are cluster-wide).
pub async fn sandbox_namespace(client: &Client, namespace: &str) -> (tempfile::TempDir, String) {
    let (staging, pv_name) = staging_volume(client, namespace).await;
    protobot_e2e::create_object(
        &Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
            client.clone(),
            namespace,
        ),
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "protobot-staging", "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv_name,
                     "resources": {"requests": {"storage": "1Gi"}}},
        }),
    )
    .await;
    protobot_e2e::create_object(
        &Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), namespace),
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "protobot-sandbox", "namespace": namespace}}),
    )
    .await;
    (staging, pv_name)
}

/// The container's log.
pub async fn logs(pods: &Api<Pod>, name: &str, container: &str) -> String {
    pods.logs(
        name,
        &LogParams {
            container: Some(container.to_owned()),
            ..LogParams::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("logs of {name}/{container}: {e}"))
}

/// The container ids of a pod's containers (init containers too), by container name.
pub fn container_ids(pod: &Pod) -> BTreeMap<String, String> {
    let status = pod.status.as_ref();
    status
        .and_then(|s| s.container_statuses.clone())
        .unwrap_or_default()
        .into_iter()
        .chain(
            status
                .and_then(|s| s.init_container_statuses.clone())
                .unwrap_or_default(),
        )
        .filter_map(|c| Some((c.name, c.container_id?)))
        .collect()
}

/// What a pod ran as, seen by a watch while a scenario runs.
#[derive(Clone, Debug)]
pub struct SeenPod {
    pub name: String,
    /// The sandbox role label (`protobot.dev/role`), on sandbox pods.
    pub role: Option<String>,
    pub runtime_class: Option<String>,
    pub container_ids: BTreeMap<String, String>,
    pub node: Option<String>,
    pub phase: String,
    /// `reason` of terminated containers (`OOMKilled`, `Error`, `Completed`).
    pub terminated: BTreeMap<String, String>,
}

/// Records every pod of a namespace while it lives (the probe pods of a conformance run are
/// deleted when they finish): name → the last state seen.
pub struct PodRecorder {
    seen: Arc<Mutex<BTreeMap<String, SeenPod>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodRecorder {
    pub fn start(client: &Client, namespace: &str) -> PodRecorder {
        use futures::StreamExt;
        let seen: Arc<Mutex<BTreeMap<String, SeenPod>>> = Arc::default();
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(pods, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Some(event) = stream.next().await {
                let Ok(pod) = event else { continue };
                let name = pod.metadata.name.clone().unwrap_or_default();
                let status = pod.status.clone().unwrap_or_default();
                let terminated = status
                    .container_statuses
                    .iter()
                    .flatten()
                    .chain(status.init_container_statuses.iter().flatten())
                    .filter_map(|c| {
                        let t = c.state.as_ref()?.terminated.as_ref()?;
                        Some((c.name.clone(), t.reason.clone().unwrap_or_default()))
                    })
                    .collect();
                let entry = SeenPod {
                    name: name.clone(),
                    role: pod
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("protobot.dev/role").cloned()),
                    runtime_class: pod.spec.as_ref().and_then(|s| s.runtime_class_name.clone()),
                    container_ids: container_ids(&pod),
                    node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                    phase: status.phase.unwrap_or_default(),
                    terminated,
                };
                let mut seen = sink.lock().unwrap();
                let merged = match seen.remove(&name) {
                    // Keep ids and reasons a later event (a deletion) no longer carries.
                    Some(mut old) => {
                        old.container_ids.extend(entry.container_ids);
                        old.terminated.extend(entry.terminated);
                        old.phase = entry.phase;
                        old.node = entry.node.or(old.node);
                        old
                    }
                    None => entry,
                };
                seen.insert(name, merged);
            }
        });
        PodRecorder { seen, task }
    }

    pub fn seen(&self) -> Vec<SeenPod> {
        self.seen.lock().unwrap().values().cloned().collect()
    }
}

impl Drop for PodRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs `helm` with the chart of this repository (the `HELM` binary, else `.tools/helm`).
pub fn helm(args: &[String]) -> std::process::Output {
    let helm = std::env::var_os("HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/helm"));
    Command::new(&helm)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", helm.display()))
}

/// The chart's directory.
pub fn chart() -> String {
    repo_root().join("charts/protobot").display().to_string()
}

/// A real Prometheus server on loopback (the binary of Debian's `prometheus` package, unpacked
/// into `.tools` by `scripts/install-promtool.sh`), scraping fixed targets every second and
/// evaluating a rules file. Stopped on drop.
pub struct Prometheus {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

/// One scrape job of [`Prometheus::start`]: its `job` label and its `host:port` targets.
pub struct ScrapeJob {
    /// The `job` label (the chart's rules select the operator by it).
    pub job: String,
    /// `host:port` of each target.
    pub targets: Vec<String>,
}

impl Prometheus {
    /// Starts Prometheus scraping `jobs` every second with `rules` (a Prometheus rules file,
    /// may be empty) and waits until it answers.
    pub fn start(jobs: &[ScrapeJob], rules: &str) -> Prometheus {
        let binary =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/prometheus");
        assert!(
            binary.is_file(),
            "{} is missing: run scripts/install-promtool.sh .tools (it unpacks promtool and prometheus)",
            binary.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut config = String::from(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\nrule_files: [rules.yaml]\nscrape_configs:\n",
        );
        for job in jobs {
            config.push_str(&format!(
                "  - job_name: {:?}\n    static_configs: [{{targets: {:?}}}]\n",
                job.job, job.targets
            ));
        }
        std::fs::write(dir.path().join("prometheus.yaml"), config).unwrap();
        let rules = if rules.trim().is_empty() {
            "groups: []\n"
        } else {
            rules
        };
        std::fs::write(dir.path().join("rules.yaml"), rules).unwrap();
        let child = std::process::Command::new(&binary)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yaml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
        let prometheus = Prometheus {
            child,
            port,
            _dir: dir,
        };
        let started = std::time::Instant::now();
        while prometheus.get("/-/ready").is_none() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "Prometheus did not get ready in 60 s: {}",
                std::fs::read_to_string(prometheus._dir.path().join("prometheus.log"))
                    .unwrap_or_default()
            );
            #[expect(clippy::disallowed_methods, reason = "Prometheus offers no readiness notification: polled, paced at 250 ms, bounded at 60 s")]
            std::thread::sleep(Duration::from_millis(250));
        }
        prometheus
    }

    fn get(&self, path: &str) -> Option<String> {
        let out = std::process::Command::new("curl")
            .args(["-sf", &format!("http://127.0.0.1:{}{path}", self.port)])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `/api/v1/query` of `expr`: Ok(the `data.result` array) or Err(Prometheus' error).
    pub fn query(&self, expr: &str) -> Result<Vec<serde_json::Value>, String> {
        let out = std::process::Command::new("curl")
            .args([
                "-s",
                "--get",
                "--data-urlencode",
                &format!("query={expr}"),
                &format!("http://127.0.0.1:{}/api/v1/query", self.port),
            ])
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("{e}: {}", String::from_utf8_lossy(&out.stdout)))?;
        if answer["status"] != "success" {
            return Err(answer.to_string());
        }
        Ok(answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
