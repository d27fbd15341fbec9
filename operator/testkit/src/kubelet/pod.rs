//! One pod's lifecycle on the node: volumes, init containers in order, main
//! containers in parallel with the pod's `restartPolicy`, the
//! `activeDeadlineSeconds` kill, and status reporting after every transition.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use serde_json::{Value, json};
use tokio::{
    sync::Notify,
    time::{Instant, sleep, sleep_until},
};

use super::{
    backend::{Backend, Lookup},
    executor::{Confinement, ContainerExecutor, ContainerLaunch, KillSignal, Mount},
};
use crate::store::{ObjectKey, now};

/// What the node's pod workers share.
pub(crate) struct NodeCtx {
    pub backend: Backend,
    pub executor: Arc<dyn ContainerExecutor>,
    pub node_name: String,
    pub root: PathBuf,
    /// The node's images, unpacked under `root`.
    pub images: super::volumes::Unpacked,
    /// Whether containers are confined as their security context and limits say
    /// ([`super::NodeSpec::enforce_pod_security`]).
    pub enforce: bool,
    /// Wakes the kubelet loop when a pod worker finishes.
    pub wake: Notify,
}

struct PodRun {
    ctx: Arc<NodeCtx>,
    pod: Value,
    key: ObjectKey,
    uid: String,
    volumes: BTreeMap<String, PathBuf>,
    log_dir: PathBuf,
    restart_policy: String,
    /// The ConfigMaps and Secrets the pod reads.
    lookup: Lookup,
    /// The pod's network, when a NetworkPolicy lets it reach a Service.
    network: Option<super::network::ContainerNetwork>,
}

/// Apply `f` to the pod's status if the pod (same uid) still exists.
async fn update_status(run: &PodRun, f: impl Fn(&mut Value)) {
    run.ctx.backend.update_status(&run.key, &run.uid, f).await;
}

fn set_condition(status: &mut Value, ty: &str, value: bool, reason: Option<&str>) {
    if !status.get("conditions").is_some_and(Value::is_array) {
        status["conditions"] = json!([]);
    }
    let Some(conds) = status.get_mut("conditions").and_then(Value::as_array_mut) else {
        return;
    };
    let value_str = if value { "True" } else { "False" };
    let mut cond = json!({"type": ty, "status": value_str, "lastProbeTime": null, "lastTransitionTime": now()});
    if let Some(r) = reason {
        cond["reason"] = json!(r);
    }
    match conds
        .iter_mut()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
    {
        Some(c) if c.get("status").and_then(Value::as_str) == Some(value_str) => {}
        Some(c) => *c = cond,
        None => conds.push(cond),
    }
}

fn set_container_status(status: &mut Value, init: bool, cs: Value) {
    let list = if init {
        "initContainerStatuses"
    } else {
        "containerStatuses"
    };
    if !status.get(list).is_some_and(Value::is_array) {
        status[list] = json!([]);
    }
    let Some(arr) = status.get_mut(list).and_then(Value::as_array_mut) else {
        return;
    };
    let name = cs.get("name").cloned();
    match arr.iter_mut().find(|c| c.get("name") == name.as_ref()) {
        Some(c) => *c = cs,
        None => arr.push(cs),
    }
}

fn containers(pod: &Value, list: &str) -> Vec<Value> {
    pod.pointer(&format!("/spec/{list}"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn container_status(
    c: &Value,
    uid: &str,
    restarts: u64,
    state: Value,
    last: Value,
    ready: bool,
) -> Value {
    let name = c.get("name").and_then(Value::as_str).unwrap_or("");
    json!({
        "name": name,
        "image": c.get("image").cloned().unwrap_or(json!("")),
        "imageID": "",
        "containerID": format!("testkit://{uid}/{name}"),
        "ready": ready,
        "started": state.get("running").is_some(),
        "restartCount": restarts,
        "state": state,
        "lastState": last,
    })
}

impl PodRun {
    fn launch(&self, c: &Value, env: Vec<(String, String)>) -> Result<ContainerLaunch, String> {
        let strs = |k: &str| -> Vec<String> {
            c.get(k)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        // As a real kubelet: `$(NAME)` in command and args is the container's variable, `$$`
        // a literal `$` (a command that means `$$` must say `$$$$`).
        let mut argv: Vec<String> = strs("command");
        argv.extend(strs("args"));
        let argv: Vec<String> = argv.iter().map(|a| super::env::expand(a, &env)).collect();
        let image = c.get("image").and_then(Value::as_str).unwrap_or("");
        // The image's own directories first: volumes mount over them, as on a node.
        let mut mounts: Vec<Mount> = self
            .ctx
            .images
            .get(image)
            .into_iter()
            .flatten()
            .map(|(container_path, host_path)| Mount {
                volume: String::new(),
                host_path: host_path.clone(),
                container_path: container_path.clone(),
                read_only: true,
            })
            .collect();
        for m in c
            .get("volumeMounts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (Some(volume), Some(container_path)) = (
                m.get("name").and_then(Value::as_str),
                m.get("mountPath").and_then(Value::as_str),
            ) else {
                continue;
            };
            let Some(dir) = self.volumes.get(volume) else {
                continue;
            };
            let sub = m.get("subPath").and_then(Value::as_str);
            mounts.push(Mount {
                host_path: super::volumes::sub_path(dir, sub)
                    .map_err(|e| format!("volume mount {volume} at {container_path}: {e}"))?,
                volume: volume.to_owned(),
                container_path: container_path.to_owned(),
                read_only: m.get("readOnly").and_then(Value::as_bool).unwrap_or(false),
            });
        }
        let network = self.network.clone();
        let name = c
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        Ok(ContainerLaunch {
            namespace: self.key.namespace.clone(),
            pod: self.key.name.clone(),
            log_path: self.log_dir.join(format!("{name}.log")),
            container: name,
            image: image.to_owned(),
            argv,
            env,
            working_dir: c
                .get("workingDir")
                .and_then(Value::as_str)
                .map(str::to_owned),
            mounts,
            confinement: if self.ctx.enforce {
                confinement(&self.pod, c)
            } else {
                Confinement::default()
            },
            network,
        })
    }

    fn should_restart(&self, init: bool, code: i32) -> bool {
        match self.restart_policy.as_str() {
            "Never" => false,
            "OnFailure" => code != 0,
            _ if init => code != 0,
            _ => true,
        }
    }

    /// Run one container (with restarts); returns its last exit code.
    async fn container(&self, c: Value, init: bool, mut kill: KillSignal) -> i32 {
        let launch =
            super::env::build(&self.lookup, &self.pod, &c).and_then(|env| self.launch(&c, env));
        let launch = match launch {
            Ok(launch) => launch,
            Err(message) => {
                // A real node retries; here the container waits until the pod is killed.
                update_status(self, |s| {
                    let waiting = json!({"waiting": {"reason": "CreateContainerConfigError", "message": message}});
                    set_container_status(
                        s,
                        init,
                        container_status(&c, &self.uid, 0, waiting, json!({}), false),
                    );
                }).await;
                kill.killed().await;
                return 137;
            }
        };
        self.ctx.backend.set_log(
            &self.key.namespace,
            &self.key.name,
            &launch.container,
            launch.log_path.clone(),
        );
        let mut restarts = 0u64;
        let mut last = json!({});
        loop {
            let started = now();
            update_status(self, |s| {
                let cs = container_status(
                    &c,
                    &self.uid,
                    restarts,
                    json!({"running": {"startedAt": started}}),
                    last.clone(),
                    !init,
                );
                set_container_status(s, init, cs);
                if !init {
                    // Running once at least one container runs, as on a real node.
                    s["phase"] = json!("Running");
                }
                if !init && all_running(s) {
                    set_condition(s, "ContainersReady", true, None);
                    set_condition(s, "Ready", true, None);
                }
            })
            .await;
            let (code, reason, message) =
                match self.ctx.executor.run(launch.clone(), kill.clone()).await {
                    Ok(exit) => (
                        exit.exit_code,
                        if exit.oom_killed {
                            "OOMKilled"
                        } else if exit.exit_code == 0 {
                            "Completed"
                        } else {
                            "Error"
                        },
                        None,
                    ),
                    Err(e) => (128, "StartError", Some(e.to_string())),
                };
            let mut terminated = json!({
                "exitCode": code, "reason": reason, "startedAt": started, "finishedAt": now(),
                "containerID": format!("testkit://{}/{}", self.uid, launch.container),
            });
            let message = message.or_else(|| {
                (code != 0
                    && c.get("terminationMessagePolicy").and_then(Value::as_str)
                        == Some("FallbackToLogsOnError"))
                .then(|| log_tail(&launch.log_path))
                .flatten()
            });
            if let Some(m) = message {
                terminated["message"] = json!(m);
            }
            let state = json!({"terminated": terminated});
            update_status(self, |s| {
                set_container_status(
                    s,
                    init,
                    container_status(&c, &self.uid, restarts, state.clone(), last.clone(), false),
                );
                if !init {
                    set_condition(s, "ContainersReady", false, Some("ContainersNotReady"));
                    set_condition(s, "Ready", false, Some("ContainersNotReady"));
                }
            })
            .await;
            if kill.is_killed() || !self.should_restart(init, code) {
                return code;
            }
            // Restart with a short, capped backoff (CrashLoopBackOff is 10 s..5 min on a real node).
            let backoff = Duration::from_millis(50u64 << restarts.min(5));
            tokio::select! {
                () = sleep(backoff) => {}
                () = kill.killed() => return code,
            }
            restarts += 1;
            last = state;
        }
    }
}

/// What a node enforces of container `c` of `pod`: its user (container, else pod
/// `securityContext`; only when this process may switch users, i.e. runs as root), a
/// read-only root, and its memory limit.
fn confinement(pod: &Value, c: &Value) -> Confinement {
    let id = |field: &str| {
        c.pointer(&format!("/securityContext/{field}"))
            .or_else(|| pod.pointer(&format!("/spec/securityContext/{field}")))
            .and_then(Value::as_u64)
            .and_then(|v| u32::try_from(v).ok())
    };
    let root = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    };
    let run_as = id("runAsUser")
        .filter(|_| root)
        .map(|uid| (uid, id("runAsGroup").unwrap_or(uid)));
    Confinement {
        run_as,
        read_only_root: c
            .pointer("/securityContext/readOnlyRootFilesystem")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        memory_limit: c
            .pointer("/resources/limits/memory")
            .and_then(Value::as_str)
            .and_then(quantity_bytes),
    }
}

/// Bytes of a memory quantity (`268435456`, `64Mi`, `1G`, …); `None` for other forms.
fn quantity_bytes(q: &str) -> Option<u64> {
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (digits, suffix) = q.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let unit: u64 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(unit)
}

/// What `terminationMessagePolicy: FallbackToLogsOnError` reports of a failed container: the
/// end of its log, at most 80 lines and 2,048 bytes (a node's limits); `None` when empty.
fn log_tail(path: &std::path::Path) -> Option<String> {
    const MAX_BYTES: usize = 2048;
    const MAX_LINES: usize = 80;
    let bytes = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(MAX_BYTES)..]);
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(MAX_LINES)..].join("\n");
    (!tail.trim().is_empty()).then_some(tail)
}

fn all_running(status: &Value) -> bool {
    status
        .get("containerStatuses")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().all(|c| c.pointer("/state/running").is_some()))
}

/// Why a pod's containers stopped.
enum Outcome {
    Finished(Vec<i32>),
    InitFailed,
    Deadline,
    Killed,
}

/// Run a pod to completion (or until killed); the caller wakes the kubelet loop after.
pub(crate) async fn run_pod(
    ctx: Arc<NodeCtx>,
    key: ObjectKey,
    pod: Value,
    mut external_kill: KillSignal,
) {
    let uid = pod
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let pod_dir = super::pod_dir(&ctx.root, &key, &uid);
    let log_dir = pod_dir.join("logs");
    let restart_policy = pod
        .pointer("/spec/restartPolicy")
        .and_then(Value::as_str)
        .unwrap_or("Always")
        .to_owned();
    let mut run = PodRun {
        ctx: ctx.clone(),
        pod: pod.clone(),
        key,
        uid,
        volumes: BTreeMap::new(),
        log_dir: log_dir.clone(),
        restart_policy,
        lookup: ctx.backend.lookup(&pod).await,
        network: None,
    };
    let prepared = std::fs::create_dir_all(&log_dir)
        .map_err(|e| format!("failed to create pod directory: {e}"))
        .and_then(|()| {
            super::volumes::prepare(
                &run.lookup,
                &pod,
                &pod_dir,
                &ctx.root.join(super::CLAIMS_DIR),
            )
        });
    // The pod's network namespace and relays live as long as this function.
    let mut _network = None;
    let prepared = match prepared {
        Ok(v) => super::network::prepare(&ctx.backend, &pod, &run.uid)
            .await
            .map(|net| {
                run.network = net.as_ref().map(super::network::PodNetwork::container);
                _network = net;
                v
            }),
        Err(e) => Err(e),
    };
    match prepared {
        Ok(v) => run.volumes = v,
        Err(message) => {
            update_status(&run, |s| {
                for c in containers(&pod, "containers") {
                    let waiting = json!({"waiting": {"reason": "CreateContainerConfigError", "message": message}});
                    set_container_status(
                        s,
                        false,
                        container_status(&c, &run.uid, 0, waiting, json!({}), false),
                    );
                }
            }).await;
            return;
        }
    }
    let inits = containers(&pod, "initContainers");
    let mains = containers(&pod, "containers");
    update_status(&run, |s| {
        s["phase"] = json!("Pending");
        s["startTime"] = json!(now());
        s["hostIP"] = json!("127.0.0.1");
        s["podIP"] = json!("127.0.0.1");
        set_condition(
            s,
            "Initialized",
            inits.is_empty(),
            (!inits.is_empty()).then_some("ContainersNotInitialized"),
        );
        set_condition(s, "Ready", false, Some("ContainersNotReady"));
        set_condition(s, "ContainersReady", false, Some("ContainersNotReady"));
        for c in &inits {
            let waiting = json!({"waiting": {"reason": "PodInitializing"}});
            set_container_status(
                s,
                true,
                container_status(c, &run.uid, 0, waiting, json!({}), false),
            );
        }
        for c in &mains {
            let waiting = json!({"waiting": {"reason": if inits.is_empty() { "ContainerCreating" } else { "PodInitializing" }}});
            set_container_status(
                s,
                false,
                container_status(c, &run.uid, 0, waiting, json!({}), false),
            );
        }
    }).await;
    let deadline = pod
        .pointer("/spec/activeDeadlineSeconds")
        .and_then(Value::as_u64)
        .map(|s| Instant::now() + Duration::from_secs(s));
    let (kill_tx, kill) = KillSignal::new();
    let run = Arc::new(run);
    let work = {
        let run = run.clone();
        let kill = kill.clone();
        async move {
            for c in inits {
                let code = run.container(c, true, kill.clone()).await;
                if code != 0 {
                    return Outcome::InitFailed;
                }
            }
            update_status(&run, |s| {
                set_condition(s, "Initialized", true, None);
            })
            .await;
            let futs = mains
                .into_iter()
                .map(|c| run.container(c, false, kill.clone()));
            Outcome::Finished(futures::future::join_all(futs).await)
        }
    };
    tokio::pin!(work);
    let deadline_sleep = async {
        match deadline {
            Some(d) => sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline_sleep);
    let outcome = tokio::select! {
        o = &mut work => o,
        () = &mut deadline_sleep => {
            kill_tx.send_replace(true);
            let _ = (&mut work).await;
            Outcome::Deadline
        }
        () = external_kill.killed() => {
            kill_tx.send_replace(true);
            let _ = (&mut work).await;
            Outcome::Killed
        }
    };
    match outcome {
        Outcome::Finished(codes) => {
            update_status(&run, |s| {
                let ok = codes.iter().all(|c| *c == 0);
                s["phase"] = json!(if ok { "Succeeded" } else { "Failed" });
                let reason = if ok { "PodCompleted" } else { "PodFailed" };
                set_condition(s, "Ready", false, Some(reason));
                set_condition(s, "ContainersReady", false, Some(reason));
            })
            .await
        }
        Outcome::InitFailed => {
            update_status(&run, |s| {
                s["phase"] = json!("Failed");
                set_condition(s, "Ready", false, Some("PodFailed"));
            })
            .await
        }
        Outcome::Deadline => {
            update_status(&run, |s| {
                s["phase"] = json!("Failed");
                s["reason"] = json!("DeadlineExceeded");
                s["message"] =
                    json!("Pod was active on the node longer than the specified deadline");
                set_condition(s, "Ready", false, Some("PodFailed"));
            })
            .await
        }
        Outcome::Killed => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::{os::unix::fs::PermissionsExt, sync::Arc, time::Duration};

    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};
    use serde_json::json;

    use crate::{
        kubelet::{
            BubblewrapContainerExecutor, ContainerExecutor, Images, Kubelet, NodeSpec,
            ProcessExecutor,
        },
        server::ApiServer,
    };

    /// A tool that installs itself (as the supervisor's init container does) and greets.
    const TOOL: &str = "#!/bin/sh\nset -e\ncase \"$1\" in\n  install) cp \"$0\" \"$2\" ;;\n  greet) echo \"greetings from the image\" > \"$2\" ;;\n  *) echo \"unknown mode $1\" >&2; exit 4 ;;\nesac\n";
    const IMAGE: &str = "registry.example.invalid/tools:1";
    const TOOL_PATH: &str = "/usr/local/bin/protobot-testkit-tool";

    async fn finished(api: &Api<Pod>, name: &str) -> Pod {
        let done = |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
        };
        crate::until(api, name, Duration::from_secs(30), done)
            .await
            .unwrap()
            .unwrap()
    }

    fn pod(name: &str, install: serde_json::Value, out: &std::path::Path) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "volumes": [
                    {"name": "tools", "emptyDir": {}},
                    {"name": "out", "hostPath": {"path": out}},
                ],
                "initContainers": [{
                    "name": "install", "image": IMAGE, "command": install,
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "volumeMounts": [{"name": "tools", "mountPath": "/tools"}],
                }],
                "containers": [{
                    "name": "main", "image": "registry.example.invalid/worker:1",
                    "command": ["/tools/tool", "greet", "/out/greeting"],
                    "volumeMounts": [
                        {"name": "tools", "mountPath": "/tools", "readOnly": true},
                        {"name": "out", "mountPath": "/out"},
                    ],
                }],
            },
        }))
        .unwrap()
    }

    /// An init container of an image the node holds installs the image's tool into an
    /// emptyDir, the main container (another image) runs it from there; a failing init
    /// container fails the pod, its main container never runs, and its status carries the
    /// end of its log.
    async fn init_containers_deliver_an_images_binary(executor: Arc<dyn ContainerExecutor>) {
        let tmp = tempfile::tempdir().unwrap();
        let tool = tmp.path().join("tool");
        std::fs::write(&tool, TOOL).unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = tmp.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        let server = ApiServer::new();
        let spec = NodeSpec {
            images: Images::new().with_file(IMAGE, TOOL_PATH, &tool),
            ..NodeSpec::default()
        };
        let kubelet = Kubelet::start_with_spec(&server, executor, "node", &spec).unwrap();
        let api: Api<Pod> = Api::default_namespaced(server.client());

        api.create(
            &PostParams::default(),
            &pod(
                "delivered",
                json!([TOOL_PATH, "install", "/tools/tool"]),
                &out,
            ),
        )
        .await
        .unwrap();
        let done = finished(&api, "delivered").await;
        let status = done.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Succeeded"), "{status:#?}");
        assert_eq!(
            std::fs::read_to_string(out.join("greeting")).unwrap(),
            "greetings from the image\n"
        );
        // Deleted, the pod's volumes go (the emptyDir holding the installed copy) and its
        // container logs stay, as on a node.
        let uid = done.metadata.uid.clone().unwrap();
        let dir = kubelet.root_dir().join(format!("default_delivered_{uid}"));
        assert!(dir.join("volumes").join("tools").join("tool").is_file());
        api.delete("delivered", &Default::default()).await.unwrap();
        let gone = tokio::time::timeout(Duration::from_secs(30), async {
            while dir.join("volumes").exists() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(gone.is_ok(), "the deleted pod's volumes stayed: {dir:?}");
        assert!(
            dir.join("logs").is_dir(),
            "the deleted pod's logs went with its volumes"
        );

        api.create(
            &PostParams::default(),
            &pod(
                "refused",
                json!(["sh", "-c", "echo cannot install the tool >&2; exit 3"]),
                &out,
            ),
        )
        .await
        .unwrap();
        let done = finished(&api, "refused").await;
        let status = done.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let init = &status.init_container_statuses.as_ref().unwrap()[0];
        let terminated = init.state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(terminated.exit_code, 3);
        assert_eq!(
            terminated.message.as_deref(),
            Some("cannot install the tool"),
            "{init:#?}"
        );
        let main = &status.container_statuses.as_ref().unwrap()[0];
        assert!(
            main.state.as_ref().unwrap().terminated.is_none(),
            "the main container ran after a failed init container: {main:#?}"
        );
    }

    #[test]
    fn memory_quantities_are_bytes() {
        assert_eq!(super::quantity_bytes("268435456"), Some(268_435_456));
        assert_eq!(super::quantity_bytes("64Mi"), Some(64 << 20));
        assert_eq!(super::quantity_bytes("1G"), Some(1_000_000_000));
        assert_eq!(super::quantity_bytes("1.5Gi"), None);
        assert_eq!(super::quantity_bytes("Mi"), None);
    }

    #[tokio::test]
    async fn processes_run_an_images_binary_delivered_by_an_init_container() {
        init_containers_deliver_an_images_binary(Arc::new(ProcessExecutor)).await;
    }

    #[tokio::test]
    async fn sandboxes_run_an_images_binary_delivered_by_an_init_container() {
        let Some(bwrap) = BubblewrapContainerExecutor::from_path() else {
            assert!(
                std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
                "PROTOBOT_REQUIRE_BWRAP is set but bwrap is missing"
            );
            eprintln!("skipping: bubblewrap is not installed");
            return;
        };
        init_containers_deliver_an_images_binary(Arc::new(bwrap)).await;
    }
}
