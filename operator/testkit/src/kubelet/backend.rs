//! Where the simulated kubelet reads its node's pods and writes their status: the
//! in-process double's store, or any Kubernetes API server through a `kube::Client`
//! (the real kube-apiserver in the e2e loop). Everything the pod workers do goes
//! through [`Backend`], so the same node runs against both.

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

use crate::{server::Shared, store::ObjectKey};

/// The node's view of the cluster.
pub(crate) enum Backend {
    /// The in-process double: direct access to its store.
    Double(Arc<Shared>),
    /// Any API server, as a client.
    Api(ApiNode),
}

/// A kubelet that is a client of an API server: a reflector of the pods it may run,
/// and the client it binds pods and writes their status with.
pub(crate) struct ApiNode {
    client: Client,
    namespaces: Vec<String>,
    pods: reflector::Store<Pod>,
    changed: Arc<Notify>,
    watchers: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for ApiNode {
    fn drop(&mut self) {
        for w in &self.watchers {
            w.abort();
        }
    }
}

/// The objects (ConfigMaps, Secrets) a pod's environment and volumes read.
pub(crate) enum Lookup {
    /// Read from the double's store when asked.
    Double(Arc<Shared>),
    /// Fetched from the API server before the pod started, by (plural, name).
    Snapshot(HashMap<(String, String), Value>),
}

impl Lookup {
    /// The object `plural`/`name` in `namespace`, if it exists.
    pub fn object(&self, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        match self {
            Lookup::Double(shared) => {
                let key = ObjectKey {
                    group: String::new(),
                    plural: plural.to_owned(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                };
                shared.lock().object(&key).cloned()
            }
            Lookup::Snapshot(map) => map.get(&(plural.to_owned(), name.to_owned())).cloned(),
        }
    }
}

fn str_at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a str> {
    obj.pointer(pointer).and_then(Value::as_str)
}

/// Every (plural, name) of a ConfigMap or Secret the pod's volumes, `env` and `envFrom` name.
fn referenced(pod: &Value) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let mut push = |plural: &'static str, name: Option<&str>| {
        if let Some(n) = name.filter(|n| !n.is_empty()) {
            out.push((plural, n.to_owned()));
        }
    };
    for v in pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        push("configmaps", str_at(v, "/configMap/name"));
        push("secrets", str_at(v, "/secret/secretName"));
    }
    for list in ["initContainers", "containers"] {
        for c in pod
            .pointer(&format!("/spec/{list}"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            for from in c
                .get("envFrom")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                push("configmaps", str_at(from, "/configMapRef/name"));
                push("secrets", str_at(from, "/secretRef/name"));
            }
            for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
                push("configmaps", str_at(e, "/valueFrom/configMapKeyRef/name"));
                push("secrets", str_at(e, "/valueFrom/secretKeyRef/name"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

impl ApiNode {
    /// Registers `node_name` as a Ready Node and starts watching the pods of `namespaces`.
    pub async fn connect(
        client: Client,
        node_name: &str,
        namespaces: Vec<String>,
    ) -> Result<ApiNode, kube::Error> {
        register_node(&client, node_name).await?;
        let (reader, writer) = reflector::store();
        let changed = Arc::new(Notify::new());
        let mut watchers = Vec::new();
        // One reflector store fed by one watcher per namespace.
        let writer = Arc::new(tokio::sync::Mutex::new(writer));
        for ns in &namespaces {
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            let writer = writer.clone();
            let changed = changed.clone();
            watchers.push(tokio::spawn(async move {
                let mut events = watcher(api, watcher::Config::default())
                    .default_backoff()
                    .boxed();
                while let Some(event) = events.next().await {
                    match event {
                        Ok(event) => {
                            writer.lock().await.apply_watcher_event(&event);
                            changed.notify_waiters();
                            changed.notify_one();
                        }
                        Err(e) => tracing::warn!(error = %e, "simulated kubelet: watching pods"),
                    }
                }
            }));
        }
        Ok(ApiNode {
            client,
            namespaces,
            pods: reader,
            changed,
            watchers,
        })
    }

    /// The client the node talks to the API server with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn pods_in(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }
}

/// Creates (or refreshes) the Node object with a Ready condition and loopback addresses.
async fn register_node(client: &Client, name: &str) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "protobot.dev/simulated-kubelet": "true",
        }},
    }))
    .map_err(kube::Error::SerdeError)?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e),
    }
    let now = crate::store::now();
    let status = json!({"status": {
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "simulated kubelet is posting ready status",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
            "osImage": "protobot testkit", "containerRuntimeVersion": "bubblewrap://",
            "kubeletVersion": "testkit", "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": std::env::consts::ARCH,
        },
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

impl Backend {
    /// Every pod the node may see, with its key.
    pub async fn pods(&self) -> Vec<(ObjectKey, Value)> {
        match self {
            Backend::Double(shared) => {
                let state = shared.lock();
                state
                    .objects()
                    .filter(|(k, _)| k.group.is_empty() && k.plural == "pods")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            }
            Backend::Api(node) => node
                .pods
                .state()
                .iter()
                .filter_map(|p| {
                    let value = serde_json::to_value(p.as_ref()).ok()?;
                    let key = ObjectKey {
                        group: String::new(),
                        plural: "pods".into(),
                        namespace: str_at(&value, "/metadata/namespace")?.to_owned(),
                        name: str_at(&value, "/metadata/name")?.to_owned(),
                    };
                    node.namespaces
                        .contains(&key.namespace)
                        .then_some((key, value))
                })
                .collect(),
        }
    }

    /// A receiver that fires on the double's changes (`None` for an API server, whose
    /// changes come through [`Backend::changed`]).
    pub fn double_changes(&self) -> Option<watch::Receiver<u64>> {
        match self {
            Backend::Double(shared) => Some(shared.changed.subscribe()),
            Backend::Api(_) => None,
        }
    }

    /// Waits for a change of the API server's pods (never returns for the double).
    pub async fn changed(&self) {
        match self {
            Backend::Double(_) => std::future::pending().await,
            Backend::Api(node) => {
                // Boxed: the API calls' futures are large, and a pod worker awaits many of
                // these; inline they overflow a runtime thread's stack in debug builds.
                Box::pin(async move {
                    // A periodic wake as well: a missed notification must not stall the node.
                    let _ =
                        tokio::time::timeout(Duration::from_millis(500), node.changed.notified())
                            .await;
                })
                .await
            }
        }
    }

    /// Tells the double's watchers that something changed (no-op for an API server).
    pub fn notify(&self) {
        if let Backend::Double(shared) = self {
            shared.notify();
        }
    }

    /// The ConfigMaps and Secrets `pod` reads.
    pub async fn lookup(&self, pod: &Value) -> Lookup {
        match self {
            Backend::Double(shared) => Lookup::Double(shared.clone()),
            Backend::Api(node) => {
                // Boxed: the API calls' futures are large, and a pod worker awaits many of
                // these; inline they overflow a runtime thread's stack in debug builds.
                Box::pin(async move {
                    let ns = str_at(pod, "/metadata/namespace").unwrap_or("default");
                    let mut map = HashMap::new();
                    for (plural, name) in referenced(pod) {
                        let got = match plural {
                            "configmaps" => {
                                Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
                                    node.client.clone(),
                                    ns,
                                )
                                .get_opt(&name)
                                .await
                                .ok()
                                .flatten()
                                .and_then(|o| serde_json::to_value(o).ok())
                            }
                            _ => Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
                                node.client.clone(),
                                ns,
                            )
                            .get_opt(&name)
                            .await
                            .ok()
                            .flatten()
                            .and_then(|o| serde_json::to_value(o).ok()),
                        };
                        if let Some(v) = got {
                            map.insert((plural.to_owned(), name), v);
                        }
                    }
                    Lookup::Snapshot(map)
                })
                .await
            }
        }
    }

    /// Binds an unscheduled pod (same uid) to `node`; true when this call bound it.
    pub async fn bind(&self, key: &ObjectKey, uid: &str, node: &str) -> bool {
        match self {
            Backend::Double(shared) => {
                let mut state = shared.lock();
                let Some(mut pod) = state.object(key).cloned() else {
                    return false;
                };
                let bound = str_at(&pod, "/spec/nodeName").is_some_and(|n| !n.is_empty());
                if str_at(&pod, "/metadata/uid") != Some(uid) || bound {
                    // Gone, replaced, or bound by another kubelet meanwhile (first come).
                    return false;
                }
                pod["spec"]["nodeName"] = json!(node);
                let now = crate::store::now();
                pod["status"]["conditions"] = json!([{
                    "type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": now
                }]);
                state.internal_update(key, pod).is_some()
            }
            Backend::Api(api) => {
                // Boxed: the API calls' futures are large, and a pod worker awaits many of
                // these; inline they overflow a runtime thread's stack in debug builds.
                Box::pin(async move {
                    let binding = json!({
                        "apiVersion": "v1", "kind": "Binding",
                        "metadata": {"name": key.name, "uid": uid},
                        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                    });
                    match api
                        .pods_in(&key.namespace)
                        .create_subresource::<Value, Value>(
                            "binding",
                            &key.name,
                            &PostParams::default(),
                            &binding,
                        )
                        .await
                    {
                        Ok(_) => true,
                        Err(e) => {
                            tracing::debug!(pod = %key.name, error = %e, "simulated kubelet: bind");
                            false
                        }
                    }
                })
                .await
            }
        }
    }

    /// Applies `f` to the pod's status if the pod (same uid) still exists.
    pub async fn update_status(&self, key: &ObjectKey, uid: &str, f: impl Fn(&mut Value)) {
        match self {
            Backend::Double(shared) => {
                let mut state = shared.lock();
                let Some(mut pod) = state.object(key).cloned() else {
                    return;
                };
                if str_at(&pod, "/metadata/uid") != Some(uid) {
                    return;
                }
                if !pod.get("status").is_some_and(Value::is_object) {
                    pod["status"] = json!({});
                }
                if let Some(status) = pod.get_mut("status") {
                    f(status);
                }
                state.internal_update(key, pod);
                drop(state);
                shared.notify();
            }
            Backend::Api(api) => {
                // Boxed: the API calls' futures are large, and a pod worker awaits many of
                // these; inline they overflow a runtime thread's stack in debug builds.
                Box::pin(async move {
                let pods = api.pods_in(&key.namespace);
                // Optimistic concurrency: read, change, replace with the read's
                // resourceVersion; retry on conflict.
                for _ in 0..20 {
                    let Ok(Some(current)) = pods.get_opt(&key.name).await else {
                        return;
                    };
                    let Ok(mut pod) = serde_json::to_value(&current) else {
                        return;
                    };
                    if str_at(&pod, "/metadata/uid") != Some(uid) {
                        return;
                    }
                    if !pod.get("status").is_some_and(Value::is_object) {
                        pod["status"] = json!({});
                    }
                    if let Some(status) = pod.get_mut("status") {
                        f(status);
                    }
                    let Ok(pod) = serde_json::from_value::<Pod>(pod) else {
                        return;
                    };
                    match pods
                        .replace_status(&key.name, &PostParams::default(), &pod)
                        .await
                    {
                        Ok(_) => return,
                        Err(kube::Error::Api(s)) if s.code == 409 => continue,
                        Err(kube::Error::Api(s)) if s.code == 404 => return,
                        Err(e) => {
                            tracing::warn!(pod = %key.name, error = %e, "simulated kubelet: update pod status");
                            return;
                        }
                    }
                }
                })
                .await
            }
        }
    }

    /// The containers of a pod being deleted are gone: complete the deletion (the
    /// object goes once its finalizers are empty). True when something was written.
    pub async fn finish_deletion(&self, key: &ObjectKey, uid: &str) -> bool {
        match self {
            Backend::Double(shared) => {
                let mut state = shared.lock();
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
            Backend::Api(api) => {
                // Boxed: the API calls' futures are large, and a pod worker awaits many of
                // these; inline they overflow a runtime thread's stack in debug builds.
                Box::pin(async move {
                let params = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid.to_owned()),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match api.pods_in(&key.namespace).delete(&key.name, &params).await {
                    Ok(_) => true,
                    Err(kube::Error::Api(s)) if matches!(s.code, 404 | 409) => false,
                    Err(e) => {
                        tracing::warn!(pod = %key.name, error = %e, "simulated kubelet: finish deletion");
                        false
                    }
                }
                })
                .await
            }
        }
    }

    /// Tells the double where a container's log is (the double serves `pods/log` from it;
    /// an API server would ask the node, which this kubelet does not serve).
    pub fn set_log(&self, namespace: &str, pod: &str, container: &str, path: std::path::PathBuf) {
        if let Backend::Double(shared) = self {
            shared.set_log(namespace, pod, container, path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pods_references_are_its_config_maps_and_secrets() {
        let pod = json!({"spec": {
            "volumes": [{"name": "a", "configMap": {"name": "cm"}}, {"name": "b", "secret": {"secretName": "s"}}, {"name": "c", "emptyDir": {}}],
            "containers": [{"name": "x",
                "envFrom": [{"secretRef": {"name": "s2"}}],
                "env": [{"name": "E", "valueFrom": {"configMapKeyRef": {"name": "cm2", "key": "k"}}}]}],
        }});
        assert_eq!(
            referenced(&pod),
            vec![
                ("configmaps", "cm".to_owned()),
                ("configmaps", "cm2".to_owned()),
                ("secrets", "s".to_owned()),
                ("secrets", "s2".to_owned()),
            ]
        );
    }
}
