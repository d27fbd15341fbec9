//! End-to-end scenarios, written once and run in two places:
//! - against the in-process Kubernetes API double (`protobot-testkit`) in CI,
//!   where no cluster exists;
//! - against a real cluster when `KUBECONFIG` is set (the CRDs from `crds/`
//!   must be installed: `kubectl apply -f crds/`). Each scenario then runs in
//!   its own namespace with a random suffix, which is deleted afterwards unless
//!   `PROTOBOT_E2E_KEEP=1`.
//!
//! `PROTOBOT_E2E_REQUIRE_CLUSTER=1` turns a missing cluster into a failure, so
//! a pipeline that promised a cluster cannot silently fall back to the double.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

pub mod real;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};

/// Where a scenario runs.
pub struct Cluster {
    /// The scenario's own client: it sets up and inspects objects (an administrator on a
    /// real cluster).
    pub client: Client,
    /// The client the operator's controllers and Job Site run with. On a real cluster it
    /// authenticates as the chart's operator ServiceAccount, bound by the RBAC objects
    /// `helm template` renders from `charts/protobot` (applied by [`Cluster::connect`]), so a
    /// verb the chart does not grant fails the scenario. On the double it is `client`.
    pub operator: Client,
    /// What the API server refused the operator (real clusters only).
    pub refused: Option<protobot_controller::api_errors::ApiErrorSink>,
    /// The scenario's namespace.
    pub namespace: String,
    /// True against a real cluster.
    pub real: bool,
    // Keeps the in-process double alive for the scenario.
    _double: Option<protobot_testkit::server::ApiServer>,
}

/// The repository policy of scenarios that serve their repositories from the local
/// filesystem (an operator started with `--allow-local-repositories`).
pub const LOCAL_REPOSITORIES: protobot_controller::project::decide::RepositoryPolicy =
    protobot_controller::project::decide::RepositoryPolicy { allow_local: true };

/// A state gauge source with no items: what a scenario registers the operator's metrics with
/// when it does not read `protobot_work_items`.
pub struct NoCounts;

impl protobot_controller::metrics::StateCounts for NoCounts {
    fn counts(&self) -> Vec<(protobot_lifecycle::State, u64)> {
        Vec::new()
    }
}

/// Waits (bounded by [`timeout`]) until `controller` has finished `at_least` reconciles, as
/// `protobot_reconcile_duration_seconds{controller}` counts them; panics past the bound.
pub async fn until_reconciled(
    metrics: &protobot_controller::metrics::JobSiteMetrics,
    controller: &str,
    at_least: u64,
) {
    let done = || {
        metrics
            .reconcile_duration
            .with_label_values(&[controller])
            .get_sample_count()
    };
    let deadline = tokio::time::Instant::now() + timeout();
    while done() < at_least {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the {controller} controller finished {} reconciles, not {at_least}, within {:?}",
            done(),
            timeout()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// True when bubblewrap is on `PATH` (the local sandbox's scenarios run); else prints that
/// the scenario is skipped. With `PROTOBOT_REQUIRE_BWRAP` set, a missing bwrap fails instead.
pub fn bwrap_installed() -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("bwrap").is_file()));
    if !found {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
            "PROTOBOT_REQUIRE_BWRAP is set but bwrap is missing"
        );
        eprintln!("skipping: bubblewrap is not installed");
    }
    found
}

/// A worker-classes ConfigMap entry running `script` with `sh -c`, without an image.
pub fn worker_class(script: &str) -> String {
    serde_json::json!({"command": ["sh", "-c", script], "image": null}).to_string()
}

/// Creates the object `body` describes through `api`; panics when the API server refuses it.
pub async fn create_object<K>(api: &Api<K>, body: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

/// How long a scenario waits for any one condition.
pub fn timeout() -> Duration {
    if std::env::var_os("KUBECONFIG").is_some() {
        Duration::from_secs(120)
    } else {
        Duration::from_secs(20)
    }
}

impl Cluster {
    /// A real cluster when `KUBECONFIG` is set, else the API double. Logs go to
    /// the test output, filtered by `RUST_LOG` (default: warnings).
    pub async fn connect(scenario: &str) -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
        if std::env::var_os("KUBECONFIG").is_some() {
            let client = Client::try_default()
                .await
                .expect("KUBECONFIG is set but the cluster is unreachable");
            let (operator, refused) = real::prepare(&client)
                .await
                .unwrap_or_else(|e| panic!("preparing the cluster for e2e: {e}"));
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let namespace = format!("protobot-e2e-{scenario}-{nanos:x}");
            let ns: Namespace = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace},
            }))
            .unwrap();
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &ns)
                .await
                .expect("create the scenario namespace");
            real::grant_sandbox_rights(&client, &operator, &namespace)
                .await
                .unwrap_or_else(|e| panic!("granting the sandbox rights in {namespace}: {e}"));
            return Cluster {
                client,
                operator,
                refused: Some(refused),
                namespace,
                real: true,
                _double: None,
            };
        }
        assert!(
            std::env::var_os("PROTOBOT_E2E_REQUIRE_CLUSTER").is_none(),
            "PROTOBOT_E2E_REQUIRE_CLUSTER is set but KUBECONFIG is not: point KUBECONFIG at the cluster"
        );
        let double = protobot_testkit::server::ApiServer::new();
        double
            .register_crd_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../crds"))
            .expect("the generated CRDs register with the double");
        Cluster {
            client: double.client(),
            operator: double.client(),
            refused: None,
            namespace: "default".into(),
            real: false,
            _double: Some(double),
        }
    }

    /// The in-process double, when not on a real cluster (to start kubelets on it).
    pub fn double(&self) -> Option<&protobot_testkit::server::ApiServer> {
        self._double.as_ref()
    }

    /// Fails the scenario if the API server refused the operator any call (403): a verb
    /// the chart's RBAC does not grant, named with its resource and object. Then deletes a
    /// real cluster's scenario namespace (unless `PROTOBOT_E2E_KEEP=1`).
    pub async fn cleanup(self) {
        if let Some(sink) = &self.refused {
            let refused = sink.forbidden();
            assert!(
                refused.is_empty(),
                "the API server refused the operator's ServiceAccount (a verb charts/protobot/templates/rbac.yaml does not grant): {}",
                refused
                    .iter()
                    .map(|c| format!("{} {} ({})", c.verb, c.resource, c.object))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        if self.real && std::env::var_os("PROTOBOT_E2E_KEEP").is_none() {
            let _ = Api::<Namespace>::all(self.client.clone())
                .delete(&self.namespace, &DeleteParams::default())
                .await;
        }
    }
}

impl Drop for Cluster {
    /// A scenario that fails before [`Cluster::cleanup`] still says what the server refused
    /// the operator, beside its own failure.
    fn drop(&mut self) {
        if let Some(sink) = &self.refused {
            for c in sink.forbidden() {
                eprintln!(
                    "e2e: the API server refused the operator's ServiceAccount {} {} ({})",
                    c.verb, c.resource, c.object
                );
            }
        }
    }
}

/// A passing jobsite-sandbox/v1 conformance report for `profile`, for scenarios
/// only: the double (or the test cluster) stands in for a conformant deployment.
/// Never store it in a real deployment.
pub fn conformant_report(profile: &str) -> protobot_executors::ConformanceReport {
    use protobot_executors::{
        BackendIdentity, Capability, ConformanceCheck, ConformanceReport,
        conformance::{ALL_CAPABILITIES, ResourceLimitsReport},
    };
    ConformanceReport {
        contract_version: protobot_executors::CONTRACT_VERSION.into(),
        profile: profile.into(),
        backend: BackendIdentity {
            name: "testkit-kubelet".into(),
            version: "e2e".into(),
        },
        policy_version: 0,
        policy_digest: String::new(),
        executable_digests: Default::default(),
        resource_limits: ResourceLimitsReport::from(&protobot_jobsite::executor::Limits::default()),
        capabilities: ALL_CAPABILITIES
            .iter()
            .map(|c| Capability::supported(c, "the double stands in for a conformant deployment"))
            .collect(),
        required_capabilities: ALL_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect(),
        checks: vec![ConformanceCheck {
            id: "SB-FS-005".into(),
            name: "host paths denied".into(),
            passed: true,
            skipped: false,
            detail: Some("the double's kubelet binds only declared volumes".into()),
        }],
        passed: true,
        autonomous_execution: true,
        fail_closed_reason: None,
        audit_head: None,
    }
}

/// Waits until ChangeSet `change_set` in `namespace` names its work item (registration), then
/// until that item is `completed` (six times [`timeout`]); returns it. Panics with the item's
/// status when it does not complete.
pub async fn registered_item_completes(
    client: &Client,
    namespace: &str,
    change_set: &str,
) -> protobot_api::BuildWorkItem {
    use protobot_api::{BuildWorkItem, ChangeSet, LifecycleState};
    let change_sets: Api<ChangeSet> = Api::namespaced(client.clone(), namespace);
    let registered = protobot_testkit::wait::until(
        &change_sets,
        change_set,
        timeout(),
        |cs: Option<&ChangeSet>| {
            cs.and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.work_item_ref.is_some())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("ChangeSet {namespace}/{change_set} was not registered: {e}"))
    .and_then(|cs| cs.status)
    .and_then(|s| s.work_item_ref)
    .unwrap_or_else(|| panic!("ChangeSet {namespace}/{change_set} names no work item"));
    let name = registered.name;
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), namespace);
    let completed =
        protobot_testkit::wait::until(&items, &name, timeout() * 6, |i: Option<&BuildWorkItem>| {
            i.and_then(|i| i.status.as_ref())
                .is_some_and(|s| s.state == LifecycleState::Completed)
        })
        .await;
    match completed {
        Ok(Some(item)) => item,
        other => {
            let now = items.get(&name).await.ok().and_then(|i| i.status);
            panic!("{name} did not complete ({other:?}); its status: {now:#?}")
        }
    }
}

/// True (after saying why) when a scenario whose sandbox pods need egress cannot run: it needs
/// a real API server (`KUBECONFIG`), and pod egress on the simulated node needs root and
/// bubblewrap. Panics instead when `PROTOBOT_E2E_REQUIRE_CLUSTER` or `PROTOBOT_REQUIRE_EGRESS`
/// says the missing part must be there.
pub fn skip_without_pod_egress(scenario: &str) -> bool {
    if std::env::var_os("KUBECONFIG").is_none() {
        assert!(
            std::env::var_os("PROTOBOT_E2E_REQUIRE_CLUSTER").is_none(),
            "PROTOBOT_E2E_REQUIRE_CLUSTER is set but KUBECONFIG is not"
        );
        eprintln!("skipping: the {scenario} scenario runs against a real API server (KUBECONFIG)");
        return true;
    }
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2).map(str::to_owned))
        == Some("0".into());
    let bwrap = protobot_testkit::BubblewrapContainerExecutor::from_path().is_some();
    if !root || !bwrap {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_EGRESS").is_none(),
            "PROTOBOT_REQUIRE_EGRESS is set, but pod egress on the simulated node needs root and bubblewrap"
        );
        eprintln!("skipping: pod egress on the simulated node needs root and bubblewrap");
        return true;
    }
    false
}

/// Creates Secret `namespace/name` with `data`; panics when the API server refuses it.
pub async fn create_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    data: std::collections::BTreeMap<String, Vec<u8>>,
) {
    use k8s_openapi::{ByteString, api::core::v1::Secret};
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        data: Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("create Secret {namespace}/{name}: {e}"));
}

/// The `Work-Item:` trailers of the merges on `main`'s first-parent history in the
/// repository at `repo` (bare or not), newest first: one per landed work item.
pub fn work_item_trailers(repo: &std::path::Path) -> Vec<String> {
    let out = std::process::Command::new("git")
        .args([
            "log",
            "--first-parent",
            "--merges",
            "--format=%(trailers:key=Work-Item,valueonly)",
            "main",
        ])
        .current_dir(repo)
        .output()
        .unwrap_or_else(|e| panic!("git log in {}: {e}", repo.display()));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Every object of `namespace` a user or a tool can read, but Secrets, as JSON: the
/// project's kinds with their status, ConfigMaps, Events (both APIs) and pods. Scenarios grep
/// it for credentials that must not be there.
pub async fn readable_objects(client: &Client, namespace: &str) -> String {
    use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Pod};
    use k8s_openapi::api::events::v1::Event;
    use protobot_api::{BugReport, BuildWorkItem, ChangeSet, InspectionRun, Project};
    let mut all = String::new();
    macro_rules! dump {
        ($($kind:ty),*) => {$(
            for o in Api::<$kind>::namespaced(client.clone(), namespace)
                .list(&Default::default())
                .await
                .unwrap_or_else(|e| panic!("list {} in {namespace}: {e}", stringify!($kind)))
                .items
            {
                all.push_str(&serde_json::to_string(&o).unwrap_or_default());
                all.push('\n');
            }
        )*};
    }
    dump!(
        Project,
        ChangeSet,
        BugReport,
        BuildWorkItem,
        InspectionRun,
        ConfigMap,
        Event,
        CoreEvent,
        Pod
    );
    all
}

/// What a platform team provides before sandbox pods of `runtime_class` can run in a real
/// cluster's scenario namespace: the RuntimeClass (the RuntimeClass admission plugin refuses
/// pods naming a missing one) and the sandbox ServiceAccount the profile names (the
/// ServiceAccount admission plugin refuses pods whose account does not exist). Idempotent.
pub async fn sandbox_platform(cluster: &Cluster, runtime_class: &str) {
    use k8s_openapi::api::{core::v1::ServiceAccount, node::v1::RuntimeClass};
    let classes: Api<RuntimeClass> = Api::all(cluster.client.clone());
    let class: RuntimeClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": runtime_class}, "handler": runtime_class,
    }))
    .unwrap();
    match classes.create(&PostParams::default(), &class).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create RuntimeClass {runtime_class}: {e}"),
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let account: ServiceAccount = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "protobot-sandbox"}, "automountServiceAccountToken": false,
    }))
    .unwrap();
    match accounts.create(&PostParams::default(), &account).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create ServiceAccount protobot-sandbox: {e}"),
    }
}

/// The credential name the conformance probe broker ([`start_probe_broker`]) holds the
/// suite's sentinel under (the one `protobot egress-proxy --conformance-probe` uses).
pub const PROBE_CREDENTIAL: &str = protobot_egress::probe::PROBE_CREDENTIAL;

/// A real egress proxy and credential broker (`protobot_egress::Broker`, as `protobot
/// egress-proxy` serves it) on a loopback port, deciding by `policy` with `secret` as the
/// session secret, holding the suite's sentinel (`BROKER_TOKEN_SENTINEL`) as credential
/// [`PROBE_CREDENTIAL`], and reaching the conformance probe upstream
/// (`protobot_egress::probe::serve_upstream`) for the probe host and the unapproved one
/// over plain HTTP. `protobot_egress::probe::probe_policy("worker-a", PROBE_CREDENTIAL)` is
/// the policy the broker checks pass with. Runs until the runtime ends.
pub async fn start_probe_broker(
    secret: &protobot_egress::SessionSecret,
    policy: &str,
) -> std::net::SocketAddr {
    use protobot_egress::{
        Broker, Credential, CredentialStore, EgressMetrics, EgressPolicy, Limits, SessionRegistry,
        Upstream, probe, server::serve,
    };
    use tokio::net::TcpListener;
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = upstream.local_addr().unwrap();
    let sentinel = protobot_executors::BROKER_TOKEN_SENTINEL;
    tokio::spawn(probe::serve_upstream(upstream, sentinel.to_owned()));
    let routes = [
        (probe::PROBE_HOST.to_owned(), upstream_addr),
        (probe::UNAPPROVED_HOST.to_owned(), upstream_addr),
    ];
    let broker = Broker::new(
        EgressPolicy::from_yaml(policy, "<probe policy>").unwrap(),
        CredentialStore::from_pairs([(PROBE_CREDENTIAL, Credential::new(sentinel))]),
        SessionRegistry::new(secret.clone()),
        Upstream::plaintext_for_tests(routes.into()),
        EgressMetrics::register(&prometheus::Registry::new()).unwrap(),
        Limits::default(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        move |req| {
            let broker = broker.clone();
            async move { broker.handle(req).await }
        },
        std::future::pending(),
    ));
    addr
}

/// Creates the egress proxy's Service (`protobot-egress-proxy`, selecting the proxy pods'
/// label as the chart's does, port 3128) in the scenario namespace, with the simulated
/// node's endpoint annotation pointing at `endpoint` (a proxy the test runs on loopback),
/// and returns the URL sandbox pods reach it by: its cluster IP (their NetworkPolicy denies
/// DNS, so a name would not resolve; on the double, which allocates none, loopback).
pub async fn egress_proxy_service(cluster: &Cluster, endpoint: std::net::SocketAddr) -> String {
    use k8s_openapi::api::core::v1::Service;
    let ns = &cluster.namespace;
    let services = Api::<Service>::namespaced(cluster.client.clone(), ns);
    create_object(
        &services,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "protobot-egress-proxy", "namespace": ns, "annotations": {
                protobot_testkit::kubelet::NODE_ENDPOINT_ANNOTATION: endpoint.to_string()}},
            "spec": {"selector": {"app.kubernetes.io/name": "protobot-egress-proxy"},
                     "ports": [{"name": "proxy", "port": 3128, "targetPort": 3128}]},
        }),
    )
    .await;
    let ip = services
        .get("protobot-egress-proxy")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.cluster_ip)
        .filter(|ip| !ip.is_empty() && ip != "None")
        .unwrap_or_else(|| "127.0.0.1".to_owned());
    format!("http://{ip}:3128")
}

/// Points the Service [`egress_proxy_service`] made at another `endpoint`.
pub async fn route_egress_proxy(cluster: &Cluster, endpoint: std::net::SocketAddr) {
    use k8s_openapi::api::core::v1::Service;
    let patch = serde_json::json!({"metadata": {"annotations": {
        protobot_testkit::kubelet::NODE_ENDPOINT_ANNOTATION: endpoint.to_string()
    }}});
    Api::<Service>::namespaced(cluster.client.clone(), &cluster.namespace)
        .patch(
            "protobot-egress-proxy",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
}

/// A sandbox profile document (`sandbox-profiles/*.yaml` text) whose egress proxy is in
/// `namespace` (the bundled profiles name `protobot-system`).
pub fn profile_with_proxy_in(text: &str, namespace: &str) -> String {
    text.replace(
        "kubernetes.io/metadata.name: protobot-system",
        &format!("kubernetes.io/metadata.name: {namespace}"),
    )
}

/// What the benchmarks (`make bench`) share: this process's CPU time, and the API double
/// served by a child process of the benchmark itself, so the double's CPU is not counted
/// as the operator's.
pub mod bench {
    use std::{io::Read, process::Stdio};

    /// This process's CPU seconds so far: utime + stime, fields 14 and 15 of
    /// `/proc/self/stat`, in clock ticks (100 Hz).
    pub fn cpu_seconds() -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (ticks(11) + ticks(12)) / 100.0
    }

    use kube::{
        Client,
        config::{KubeConfigOptions, Kubeconfig},
    };

    /// The argument that makes a benchmark binary serve the double.
    pub const SERVE: &str = "--serve";

    /// In the child (its first argument is [`SERVE`]): serves the double over HTTP, prints
    /// its kubeconfig on one line and returns when stdin closes; `false` in the parent.
    pub async fn serve_if_child() -> bool {
        if std::env::args().nth(1).as_deref() != Some(SERVE) {
            return false;
        }
        let server = protobot_testkit::ApiServer::new();
        server
            .register_crd_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../crds"))
            .expect("the CRDs register with the API double");
        let http = server
            .serve_http()
            .await
            .expect("the API double serves HTTP");
        println!("{}", http.kubeconfig_yaml().replace('\n', "\\n"));
        let _ = tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        })
        .await;
        true
    }

    /// Starts this binary as the double's child and connects to it; the double stops when
    /// the returned child's stdin is dropped.
    pub async fn start() -> (Client, std::process::Child) {
        let mut child =
            std::process::Command::new(std::env::current_exe().expect("the benchmark's own path"))
                .arg(SERVE)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start the API double");
        let mut line = String::new();
        {
            use std::io::BufRead;
            let mut out = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
            out.read_line(&mut line).expect("the double's kubeconfig");
        }
        let yaml = line.trim_end().replace("\\n", "\n");
        let kubeconfig = Kubeconfig::from_yaml(&yaml).expect("the double's kubeconfig parses");
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .expect("the double's kubeconfig is usable");
        (
            Client::try_from(config).expect("a client for the double"),
            child,
        )
    }
}

/// The work store of the scripted scenarios' project `demo` in the cluster's namespace, as
/// the operator's identity (leases of [`protobot_jobsite::scripted::LEASE`]).
pub fn demo_store(cluster: &Cluster) -> std::sync::Arc<protobot_stores::KubeStore> {
    std::sync::Arc::new(protobot_stores::KubeStore::new(
        cluster.operator.clone(),
        &cluster.namespace,
        "demo",
        protobot_stores::AdapterConfig {
            materializer_subject: "m".into(),
            lease_seconds: protobot_jobsite::scripted::LEASE,
        },
    ))
}
