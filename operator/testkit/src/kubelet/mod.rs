//! A simulated kubelet for one node: schedules unscheduled pods onto itself,
//! runs their containers through a [`ContainerExecutor`] with volumes mapped to
//! host directories (`persistentVolumeClaim` as a per-claim node directory,
//! `subPath` honoured), and reports phases, conditions, container states, exit
//! codes, restarts, `activeDeadlineSeconds` kills and graceful deletion.
//!
//! It works directly on the store (as the real kubelet's status manager would
//! through the API), writing status as field manager `kubelet`.

mod env;
mod executor;
pub(crate) mod logs;
mod pod;
mod volumes;

use std::{collections::HashMap, sync::Arc};

use serde_json::{Value, json};
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
};

mod bubblewrap;
pub use bubblewrap::BubblewrapContainerExecutor;
pub use executor::{
    ContainerExecutor, ContainerExit, ContainerLaunch, ExecFuture, ExecutorError, KillSignal,
    Mount, ProcessExecutor,
};

use crate::{server::ApiServer, store::ObjectKey};

/// Directory of the kubelet's root holding `persistentVolumeClaim` volumes.
pub(crate) const CLAIMS_DIR: &str = "claims";

/// The default node name.
pub const NODE_NAME: &str = "testkit-node";

/// A running simulated kubelet; dropping it stops it and kills its containers.
#[derive(Debug)]
pub struct Kubelet {
    task: JoinHandle<()>,
    node_name: String,
    _root: Arc<tempfile::TempDir>,
}

struct PodHandle {
    uid: String,
    kill: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Kubelet {
    /// Start a kubelet running containers as local processes.
    /// Must be called inside a Tokio runtime.
    pub fn start(server: &ApiServer) -> std::io::Result<Self> {
        Self::start_with(server, Arc::new(ProcessExecutor), NODE_NAME)
    }

    /// Start a kubelet with another executor and node name.
    pub fn start_with(
        server: &ApiServer,
        executor: Arc<dyn ContainerExecutor>,
        node_name: &str,
    ) -> std::io::Result<Self> {
        let root = Arc::new(
            tempfile::Builder::new()
                .prefix("testkit-kubelet-")
                .tempdir()?,
        );
        let shared = server.shared().clone();
        shared.lock().kubelet_attached = true;
        let ctx = Arc::new(pod::NodeCtx {
            shared,
            executor,
            node_name: node_name.to_owned(),
            root: root.path().to_owned(),
            wake: Notify::new(),
        });
        let task = tokio::spawn(run(ctx));
        Ok(Self {
            task,
            node_name: node_name.to_owned(),
            _root: root,
        })
    }

    /// This kubelet's node name.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The host directory backing `persistentVolumeClaim` `claim` in
    /// `namespace` on this node (created now if absent): what a local-path
    /// provisioner would give the claim. Pods mounting the claim, with or
    /// without `subPath`, see this directory; tests use it as the volume as
    /// another process on the node (the operator) would mount it. It lives as
    /// long as the kubelet.
    pub fn claim_dir(&self, namespace: &str, claim: &str) -> std::io::Result<std::path::PathBuf> {
        let dir = volumes::claim_dir(&self._root.path().join(CLAIMS_DIR), namespace, claim);
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.pointer(pointer).and_then(Value::as_str)
}

async fn run(ctx: Arc<pod::NodeCtx>) {
    let mut changed = ctx.shared.changed.subscribe();
    let mut running: HashMap<ObjectKey, PodHandle> = HashMap::new();
    loop {
        changed.borrow_and_update();
        let pods: Vec<(ObjectKey, Value)> = {
            let state = ctx.shared.lock();
            state
                .objects()
                .filter(|(k, _)| k.group.is_empty() && k.plural == "pods")
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let mut wrote = false;
        for (key, pod) in &pods {
            let uid = str_at(pod, "/metadata/uid").unwrap_or("").to_owned();
            let node = str_at(pod, "/spec/nodeName").unwrap_or("");
            let deleting = pod.pointer("/metadata/deletionTimestamp").is_some();
            if node.is_empty() && !deleting {
                wrote |= schedule(&ctx, key, &uid);
                continue;
            }
            if node != ctx.node_name {
                continue;
            }
            let handle = running.get(key).filter(|h| h.uid == uid);
            if deleting {
                match handle {
                    Some(h) if !h.task.is_finished() => {
                        h.kill.send_replace(true);
                    }
                    _ => {
                        running.remove(key);
                        wrote |= finish_deletion(&ctx, key, &uid);
                    }
                }
                continue;
            }
            let phase = str_at(pod, "/status/phase").unwrap_or("Pending");
            if handle.is_none() && matches!(phase, "Pending") {
                let (kill_tx, kill) = KillSignal::new();
                let task = tokio::spawn(pod::run_pod(ctx.clone(), key.clone(), pod.clone(), kill));
                running.insert(
                    key.clone(),
                    PodHandle {
                        uid,
                        kill: kill_tx,
                        task,
                    },
                );
            }
        }
        // Pods removed (or replaced under the same name) get their containers killed.
        running.retain(|key, h| {
            let alive = pods
                .iter()
                .any(|(k, p)| k == key && str_at(p, "/metadata/uid") == Some(h.uid.as_str()));
            if !alive {
                h.kill.send_replace(true);
            }
            alive || !h.task.is_finished()
        });
        if wrote {
            ctx.shared.notify();
        }
        tokio::select! {
            r = changed.changed() => if r.is_err() { return },
            () = ctx.wake.notified() => {}
        }
    }
}

/// Bind an unscheduled pod to this node.
fn schedule(ctx: &pod::NodeCtx, key: &ObjectKey, uid: &str) -> bool {
    let mut state = ctx.shared.lock();
    let Some(mut pod) = state.object(key).cloned() else {
        return false;
    };
    let bound = str_at(&pod, "/spec/nodeName").is_some_and(|n| !n.is_empty());
    if str_at(&pod, "/metadata/uid") != Some(uid) || bound {
        // Gone, replaced, or bound by another kubelet meanwhile (bindings are first-come).
        return false;
    }
    pod["spec"]["nodeName"] = json!(ctx.node_name);
    let now = crate::store::now();
    pod["status"]["conditions"] = json!([{
        "type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now
    }]);
    state.internal_update(key, pod).is_some()
}

/// The containers are gone: complete a graceful deletion (the object goes once
/// its finalizers are empty).
fn finish_deletion(ctx: &pod::NodeCtx, key: &ObjectKey, uid: &str) -> bool {
    let mut state = ctx.shared.lock();
    let Some(mut pod) = state.object(key).cloned() else {
        return false;
    };
    if str_at(&pod, "/metadata/uid") != Some(uid)
        || pod
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            == Some(0)
    {
        return false;
    }
    pod["metadata"]["deletionGracePeriodSeconds"] = json!(0);
    state.internal_update(key, pod).is_some()
}
