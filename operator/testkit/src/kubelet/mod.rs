//! A simulated kubelet for one node: schedules unscheduled pods onto itself,
//! runs their containers through a [`ContainerExecutor`] with volumes mapped to
//! host directories (`persistentVolumeClaim` as a per-claim node directory,
//! `subPath` honoured), and reports phases, conditions, container states, exit
//! codes, restarts, `activeDeadlineSeconds` kills and graceful deletion.
//!
//! It runs against the in-process double ([`Kubelet::start_with`], working on its
//! store) or against any API server as a client ([`Kubelet::connect`]: it registers a
//! Node, binds the watched namespaces' unscheduled pods through `pods/binding`, writes
//! status through the status subresource and completes graceful deletions).
//!
//! Images are not pulled from anywhere: a node is given [`Images`] (files at paths, e.g.
//! the operator's image holding this build's `protobot`), and a container of a listed image
//! sees them; init containers run in order before the main ones, sharing `emptyDir`s with
//! them, and a failed container with `terminationMessagePolicy: FallbackToLogsOnError`
//! reports the end of its log as its termination message, as a node does.

mod backend;
mod env;
mod executor;
pub(crate) mod logs;
mod network;
mod pod;
mod volumes;

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use serde_json::Value;
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
};

mod bubblewrap;
pub use bubblewrap::BubblewrapContainerExecutor;
pub use env::expand;
pub use executor::{
    Confinement, ContainerExecutor, ContainerExit, ContainerLaunch, ExecFuture, ExecutorError,
    KillSignal, Mount, ProcessExecutor,
};
pub use network::{ContainerNetwork, Destination, NODE_ENDPOINT_ANNOTATION, allowed_destinations};
pub use volumes::Images;

use crate::{server::ApiServer, store::ObjectKey};

/// Directory of the kubelet's root holding `persistentVolumeClaim` volumes.
pub(crate) const CLAIMS_DIR: &str = "claims";
/// Directory of the kubelet's root holding the unpacked [`Images`].
const IMAGES_DIR: &str = "images";

/// Why a kubelet could not connect to an API server.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Its root directory could not be created.
    #[error("creating the kubelet's root directory: {0}")]
    Io(#[source] std::io::Error),
    /// The Node could not be registered.
    #[error("registering the Node: {0}")]
    Api(#[source] kube::Error),
    /// An image could not be unpacked under the kubelet's root.
    #[error("unpacking the node's images: {0}")]
    Image(String),
}

/// What a simulated node has and enforces beyond running containers with their volumes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeSpec {
    /// The node's container images.
    pub images: Images,
    /// Confine containers as a node does ([`Confinement`]): run them as their
    /// `runAsUser`/`runAsGroup` (when the kubelet runs as root), with a read-only root under
    /// `readOnlyRootFilesystem`, and each process's private memory capped at the container's
    /// memory limit, so that conformance probes measure what a real node enforces. Off (the
    /// default): containers run as the test's user, which scenarios sharing staged files with
    /// the operator under `--staging-ownership keep` rely on.
    pub enforce_pod_security: bool,
}

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
    /// Set by the pod's task as its last act, before it wakes the node loop. The loop
    /// reads this rather than `JoinHandle::is_finished`: a task that has woken the loop
    /// may not count as finished yet, and a loop that saw it unfinished would wait for
    /// a wake that never comes (a deleted pod then stays until something else changes).
    done: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl PodHandle {
    fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire) || self.task.is_finished()
    }
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
        Self::start_with_spec(server, executor, node_name, &NodeSpec::default())
    }

    /// [`Kubelet::start_with`] for a node as `spec` describes.
    pub fn start_with_spec(
        server: &ApiServer,
        executor: Arc<dyn ContainerExecutor>,
        node_name: &str,
        spec: &NodeSpec,
    ) -> std::io::Result<Self> {
        let root = Arc::new(node_root()?);
        let unpacked = spec
            .images
            .unpack(&root.path().join(IMAGES_DIR))
            .map_err(std::io::Error::other)?;
        let shared = server.shared().clone();
        shared.lock().kubelet_attached = true;
        Ok(Self::start_on(
            backend::Backend::Double(shared),
            executor,
            node_name,
            root,
            unpacked,
            spec.enforce_pod_security,
        ))
    }

    /// Start a kubelet that is a client of the API server behind `client`: it registers
    /// Node `node_name` and runs the pods of `namespaces` that no other node holds. Must
    /// be called inside a Tokio runtime. (It does not serve `pods/log`: an API server's
    /// log requests to this node fail, and callers see no log.)
    pub async fn connect(
        client: kube::Client,
        executor: Arc<dyn ContainerExecutor>,
        node_name: &str,
        namespaces: Vec<String>,
    ) -> Result<Self, ConnectError> {
        Self::connect_with(
            client,
            executor,
            node_name,
            namespaces,
            &NodeSpec::default(),
        )
        .await
    }

    /// [`Kubelet::connect`] for a node as `spec` describes.
    pub async fn connect_with(
        client: kube::Client,
        executor: Arc<dyn ContainerExecutor>,
        node_name: &str,
        namespaces: Vec<String>,
        spec: &NodeSpec,
    ) -> Result<Self, ConnectError> {
        let root = Arc::new(node_root().map_err(ConnectError::Io)?);
        let unpacked = spec
            .images
            .unpack(&root.path().join(IMAGES_DIR))
            .map_err(ConnectError::Image)?;
        let node = backend::ApiNode::connect(client, node_name, namespaces)
            .await
            .map_err(ConnectError::Api)?;
        Ok(Self::start_on(
            backend::Backend::Api(node),
            executor,
            node_name,
            root,
            unpacked,
            spec.enforce_pod_security,
        ))
    }

    fn start_on(
        backend: backend::Backend,
        executor: Arc<dyn ContainerExecutor>,
        node_name: &str,
        root: Arc<tempfile::TempDir>,
        images: volumes::Unpacked,
        enforce: bool,
    ) -> Self {
        let ctx = Arc::new(pod::NodeCtx {
            backend,
            executor,
            node_name: node_name.to_owned(),
            root: root.path().to_owned(),
            images,
            enforce,
            wake: Notify::new(),
        });
        let task = tokio::spawn(run(ctx));
        Self {
            task,
            node_name: node_name.to_owned(),
            _root: root,
        }
    }

    /// The node's own directory: pod directories (container logs, `emptyDir`s), claims and
    /// unpacked images. It lives as long as the kubelet.
    pub fn root_dir(&self) -> &std::path::Path {
        self._root.path()
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

/// The directory of pod `key` (uid `uid`) on the node: its logs and `emptyDir`s.
pub(crate) fn pod_dir(root: &std::path::Path, key: &ObjectKey, uid: &str) -> std::path::PathBuf {
    root.join(format!("{}_{}_{uid}", key.namespace, key.name))
}

/// Removes a deleted pod's volumes (its `emptyDir`s, the copies of its configMaps and
/// Secrets), as a node does; claims and host paths live elsewhere and stay. Its container logs
/// stay until the node goes, as a node keeps a deleted pod's logs for a while: tests read them
/// (e.g. to show a credential never reached a sandbox). Best effort: a leftover goes with the
/// node's root.
fn remove_pod_dir(root: &std::path::Path, key: &ObjectKey, uid: &str) {
    let _ = std::fs::remove_dir_all(pod_dir(root, key, uid).join("volumes"));
}

/// The node's directory, traversable by any user (containers of other users bind their
/// volumes from under it).
fn node_root() -> std::io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::Builder::new()
        .prefix("testkit-kubelet-")
        .tempdir()?;
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755))?;
    Ok(root)
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.pointer(pointer).and_then(Value::as_str)
}

async fn run(ctx: Arc<pod::NodeCtx>) {
    let mut changed = ctx.backend.double_changes();
    let mut running: HashMap<ObjectKey, PodHandle> = HashMap::new();
    loop {
        if let Some(c) = changed.as_mut() {
            c.borrow_and_update();
        }
        let pods = ctx.backend.pods().await;
        let mut wrote = false;
        for (key, pod) in &pods {
            let uid = str_at(pod, "/metadata/uid").unwrap_or("").to_owned();
            let node = str_at(pod, "/spec/nodeName").unwrap_or("");
            let deleting = pod.pointer("/metadata/deletionTimestamp").is_some();
            if node.is_empty() && !deleting {
                wrote |= ctx.backend.bind(key, &uid, &ctx.node_name).await;
                continue;
            }
            if node != ctx.node_name {
                continue;
            }
            let handle = running.get(key).filter(|h| h.uid == uid);
            if deleting {
                match handle {
                    Some(h) if !h.finished() => {
                        h.kill.send_replace(true);
                    }
                    _ => {
                        running.remove(key);
                        wrote |= ctx.backend.finish_deletion(key, &uid).await;
                        remove_pod_dir(&ctx.root, key, &uid);
                    }
                }
                continue;
            }
            let phase = str_at(pod, "/status/phase").unwrap_or("Pending");
            if handle.is_none() && matches!(phase, "Pending") {
                let (kill_tx, kill) = KillSignal::new();
                let done = Arc::new(AtomicBool::new(false));
                let task = tokio::spawn({
                    let (ctx, key, pod, done) =
                        (ctx.clone(), key.clone(), pod.clone(), done.clone());
                    async move {
                        pod::run_pod(ctx.clone(), key, pod, kill).await;
                        done.store(true, Ordering::Release);
                        ctx.wake.notify_one();
                    }
                });
                running.insert(
                    key.clone(),
                    PodHandle {
                        uid,
                        kill: kill_tx,
                        done,
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
                if h.finished() {
                    remove_pod_dir(&ctx.root, key, &h.uid);
                }
            }
            alive || !h.finished()
        });
        if wrote {
            ctx.backend.notify();
        }
        match changed.as_mut() {
            Some(c) => tokio::select! {
                r = c.changed() => if r.is_err() { return },
                () = ctx.wake.notified() => {}
            },
            None => tokio::select! {
                () = ctx.backend.changed() => {}
                () = ctx.wake.notified() => {}
            },
        }
    }
}
