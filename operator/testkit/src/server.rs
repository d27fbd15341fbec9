//! The public handle: [`ApiServer`] owns the store, fault registry and pod logs,
//! hands out real `kube::Client`s wired to an in-process tower [`ApiService`],
//! and registers CRDs and namespaces for tests.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    future::Future,
    path::PathBuf,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Response};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::{
    body::ResponseBody,
    error::{ApiError, TestkitError},
    faults::Faults,
    handler,
    managed::Scope,
    record::RecordedRequest,
    resources::{self, TypeRegistry},
    store::{ObjectKey, State, Writer},
};

/// Tunables of one server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Events kept for watch resumption; older resourceVersions get `410 Expired`.
    pub history_limit: usize,
    /// How often watches with `allowWatchBookmarks=true` get a `BOOKMARK`.
    pub bookmark_interval: Duration,
    /// Watch duration when the client sends no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// Namespaces that exist from the start.
    pub namespaces: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            history_limit: 1000,
            bookmark_interval: Duration::from_secs(1),
            default_watch_timeout: Duration::from_secs(1800),
            namespaces: ["default", "kube-system", "kube-public", "kube-node-lease"]
                .map(str::to_owned)
                .to_vec(),
        }
    }
}

type LogKey = (String, String, String);

/// State shared by the service, watch tasks and the kubelet.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<State>,
    /// Bumped after every write so watches wake up.
    pub changed: watch::Sender<u64>,
    /// Fault injection rules.
    pub faults: Faults,
    /// Tunables.
    pub config: ServerConfig,
    logs: Mutex<BTreeMap<LogKey, PathBuf>>,
    requests: Mutex<Vec<RecordedRequest>>,
}

impl Shared {
    /// Append to the request log.
    pub fn record(&self, req: RecordedRequest) {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(req);
    }

    /// Lock the state (a poisoned lock is recovered: tests report their own panics).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wake watchers after a write.
    pub fn notify(&self) {
        let rv = self.lock().resource_version();
        self.changed.send_replace(rv);
    }

    /// Record where a container's log file is.
    pub fn set_log(&self, namespace: &str, pod: &str, container: &str, path: PathBuf) {
        self.logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                (namespace.to_owned(), pod.to_owned(), container.to_owned()),
                path,
            );
    }

    /// Where a container's log is, and the container's name (the only
    /// container when `container` is `None`).
    pub fn pod_log_path(
        &self,
        namespace: &str,
        pod: &str,
        container: Option<&str>,
    ) -> Result<(PathBuf, String), ApiError> {
        let logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        let mut matching = logs.iter().filter(|((ns, p, c), _)| {
            ns == namespace && p == pod && container.is_none_or(|want| want == c)
        });
        match (matching.next(), matching.next()) {
            (Some(((_, _, c), path)), None) => Ok((path.clone(), c.clone())),
            (Some(_), Some(_)) => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {pod}"
            ))),
            (None, _) => Err(ApiError::bad_request(format!(
                "container {:?} in pod {pod:?} is waiting to start",
                container.unwrap_or("")
            ))),
        }
    }

    /// A container's log so far.
    pub fn pod_log(
        &self,
        namespace: &str,
        pod: &str,
        container: Option<&str>,
    ) -> Result<String, ApiError> {
        let (path, _) = self.pod_log_path(namespace, pod, container)?;
        std::fs::read_to_string(&path)
            .map_err(|e| ApiError::internal(format!("failed to read log: {e}")))
    }
}

/// The in-process Kubernetes API server double.
#[derive(Debug, Clone)]
pub struct ApiServer {
    shared: Arc<Shared>,
}

impl Default for ApiServer {
    fn default() -> Self {
        Self::new()
    }
}

impl ApiServer {
    /// A server with the default [`ServerConfig`].
    pub fn new() -> Self {
        Self::with_config(ServerConfig::default())
    }

    /// A server with explicit tunables.
    pub fn with_config(config: ServerConfig) -> Self {
        let mut state = State::new(config.history_limit);
        let rt_ns = state.types.lookup("", "v1", "namespaces").cloned();
        if let Some(rt) = rt_ns {
            for ns in &config.namespaces {
                let obj =
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                let writer = Writer {
                    manager: "testkit",
                    scope: Scope::Main {
                        status_subresource: true,
                    },
                    dry_run: false,
                    strict: false,
                };
                // Names come from the test's own config; a bad one is reported on first use.
                let _ = state.create(&rt, "v1", "", obj, &writer);
            }
        }
        let rv = state.resource_version();
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                changed: watch::Sender::new(rv),
                faults: Faults::default(),
                config,
                logs: Mutex::new(BTreeMap::new()),
                requests: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The shared state, for in-crate controllers (kubelet).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// A tower service speaking the Kubernetes HTTP API.
    pub fn service(&self) -> ApiService {
        ApiService {
            shared: self.shared.clone(),
        }
    }

    /// A real `kube::Client` whose default namespace is `default`.
    /// Must be called inside a Tokio runtime (the client spawns a buffer task).
    pub fn client(&self) -> kube::Client {
        self.client_in("default")
    }

    /// A real `kube::Client` with another default namespace.
    pub fn client_in(&self, default_namespace: &str) -> kube::Client {
        kube::Client::new(self.service(), default_namespace)
    }

    /// Serve the double over HTTP on 127.0.0.1 (a free port), for clients that
    /// need a URL or kubeconfig. Needs a Tokio runtime.
    pub async fn serve_http(&self) -> std::io::Result<crate::HttpServer> {
        crate::http::HttpServer::start(self.shared.clone()).await
    }

    /// Fault injection.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// The latest resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().resource_version()
    }

    /// Register every `CustomResourceDefinition` document in a (multi-document)
    /// YAML string, as `kubectl apply -f crds/` would. Returns the CRD names.
    pub fn register_crd_yaml(&self, yaml: &str) -> Result<Vec<String>, TestkitError> {
        let mut names = Vec::new();
        for doc in resources::parse_yaml_documents(yaml)? {
            if doc.get("kind").and_then(Value::as_str) != Some("CustomResourceDefinition") {
                continue;
            }
            resources::from_crd(&doc)?;
            let name = doc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            self.create_object(doc)?;
            names.push(name);
        }
        Ok(names)
    }

    /// Register every CRD in the `*.yaml`/`*.yml` files of a directory (e.g. the
    /// project's `crds/`), in file-name order. Returns the CRD names.
    pub fn register_crd_dir(
        &self,
        dir: impl AsRef<std::path::Path>,
    ) -> Result<Vec<String>, TestkitError> {
        let dir = dir.as_ref();
        let io = |source| TestkitError::Io {
            path: dir.to_owned(),
            source,
        };
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect();
        files.sort();
        let mut names = Vec::new();
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|source| TestkitError::Io {
                path: file.clone(),
                source,
            })?;
            names.extend(self.register_crd_yaml(&text)?);
        }
        Ok(names)
    }

    /// Register a typed CRD (e.g. from `CustomResourceExt::crd()`).
    pub fn register_crd(
        &self,
        crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    ) -> Result<String, TestkitError> {
        let value = serde_json::to_value(crd).map_err(|e| TestkitError::InvalidCrd {
            name: crd.metadata.name.clone().unwrap_or_default(),
            reason: e.to_string(),
        })?;
        let mut value = value;
        value["apiVersion"] = json!("apiextensions.k8s.io/v1");
        value["kind"] = json!("CustomResourceDefinition");
        resources::from_crd(&value)?;
        self.create_object(value)?;
        Ok(crd.metadata.name.clone().unwrap_or_default())
    }

    /// Create a namespace.
    pub fn create_namespace(&self, name: &str) -> Result<(), TestkitError> {
        self.create_object(
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        )
        .map(|_| ())
    }

    /// Create any object of a served type (by `apiVersion` and `kind`) as manager `testkit`.
    pub fn create_object(&self, obj: Value) -> Result<Value, TestkitError> {
        let api_version = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let what = format!(
            "{kind} {}",
            obj.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
        );
        let mut state = self.shared.lock();
        let rt = state
            .types
            .by_kind(&api_version, &kind)
            .cloned()
            .ok_or_else(|| TestkitError::Create {
                what: what.clone(),
                source: Box::new(ApiError::new(
                    404,
                    "NotFound",
                    format!("no type {api_version} {kind} is served"),
                )),
            })?;
        let (_, version) = resources::split_api_version(&api_version);
        let version = version.to_owned();
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_owned();
        let writer = Writer {
            manager: "testkit",
            scope: Scope::Main {
                status_subresource: rt.status_subresource,
            },
            dry_run: false,
            strict: false,
        };
        let created = state
            .create(&rt, &version, &ns, obj, &writer)
            .map_err(|source| TestkitError::Create {
                what,
                source: Box::new(source),
            })?;
        drop(state);
        self.shared.notify();
        Ok(created)
    }

    /// A stored object by group, plural, namespace (empty for cluster-scoped) and name.
    pub fn object(&self, group: &str, plural: &str, namespace: &str, name: &str) -> Option<Value> {
        let key = ObjectKey {
            group: group.to_owned(),
            plural: plural.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        self.shared.lock().object(&key).cloned()
    }

    /// Every resource request served so far, in order (discovery excluded).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Only the writes (create, update, patch, delete) served so far.
    pub fn writes(&self) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(RecordedRequest::is_write)
            .collect()
    }

    /// Forget the request log (e.g. after a test's setup).
    pub fn clear_requests(&self) {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The served types (for assertions on discovery).
    pub fn types(&self) -> TypeRegistry {
        self.shared.lock().types.clone()
    }
}

/// The tower `Service` behind [`ApiServer::client`].
#[derive(Debug, Clone)]
pub struct ApiService {
    shared: Arc<Shared>,
}

impl<B> tower_service::Service<Request<B>> for ApiService
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Display,
{
    type Response = Response<ResponseBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move { Ok(handler::handle(shared, req).await) })
    }
}
