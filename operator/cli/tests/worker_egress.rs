#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Issue 21's cluster acceptance: a Worker class with egress reaches its model endpoint
//! only through the egress proxy, on the real kube-apiserver (`KUBECONFIG`) with the
//! simulated kubelet running the operator's pods in bubblewrap.
//!
//! The example Project's Worker B class says `"egress": true`; its scripted harness (shell
//! and curl, no agent CLI) first asks the model (the deterministic model double, started
//! here on loopback) for a completion through `$PROTOBOT_EGRESS_PROXY` with its session
//! token, then asks another host, then tries a direct connection, then does the example's
//! work. The proxy is the real broker on loopback behind the `protobot-egress-proxy`
//! Service the run's NetworkPolicy allows (the simulated node relays the pod to it,
//! docs/real-apiserver.md), holding the API key as its only copy.
//!
//! Asserted: the item completes; the endpoint saw every model request with the key, and
//! only through the proxy; the other host was denied and audited with the work item; no
//! direct connection got out; and the key is in no file the pods or the operator wrote
//! (their environment and arguments as the pod saw them, dumped by the harness, included),
//! no pod log, no log line of this process, and no object or Event of the namespace.
//! Needs root (the pod's network namespace), bubblewrap and curl; skipped without a
//! cluster unless `PROTOBOT_E2E_REQUIRE_CLUSTER=1`, and without root unless
//! `PROTOBOT_REQUIRE_EGRESS=1`.

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::{ConfigMap, PersistentVolumeClaim, Service},
    events::v1::Event,
    networking::v1::NetworkPolicy,
};
use kube::{Api, Client};
use protobot_api::{BuildWorkItem, ChangeSet, InspectionRun, Project};
use protobot_controller::jobsite::{Settings, run};
use protobot_demo::example::{INTEGRATION, WORKER_A, WORKER_B, author};
use protobot_e2e::{Cluster, create_object, worker_class};
use protobot_egress::{
    Broker, Credential, CredentialStore, EgressMetrics, EgressPolicy, Limits, SessionRegistry,
    SessionSecret, Upstream, server::serve,
};
use protobot_kube_executor::{
    KubeExecutorConfig, KubernetesExecutor, SandboxProfile, StagingOwnership, StagingVolume,
};
use protobot_model_double::{ModelDouble, Script};
use serde_json::json;
use tokio::net::TcpListener;

/// The API key only the broker holds.
const API_KEY: &str = "sk-protobot-cluster-egress-4d1e9a7c";
const MODEL_HOST: &str = "model.example.invalid";
const OTHER_HOST: &str = "evil.example.invalid";
const SECRET: &[u8] = b"protobot-worker-egress-session-secret-0123";

/// Worker B may POST chat completions to the model host with the `model` credential.
const POLICY: &str = r#"
rules:
  - role: worker-b
    destination: model.example.invalid
    method: POST
    path: /v1/chat/completions
    credential: model
"#;

/// Worker B's harness before the example's work: the model through the proxy (must
/// answer), another host through the proxy (must be denied), a direct connection (must
/// fail); its environment and command line are dumped into /out and its log.
const MODEL_CALL: &str = r#"
T=$(cat "$PROTOBOT_EGRESS_SESSION_TOKEN_FILE")
body='{"model":"scripted","messages":[{"role":"user","content":"implement sync WORKER-EGRESS"}]}'
code=$(curl -sS -o /tmp/model.json -w '%{http_code}' -H "X-Sandbox-Session-Token: $T" \
  -H 'Content-Type: application/json' -d "$body" "$PROTOBOT_EGRESS_PROXY/model.example.invalid/v1/chat/completions")
[ "$code" = 200 ] || { echo "the model did not answer through the proxy: $code $(cat /tmp/model.json)" >&2; exit 3; }
grep -q chat.completion /tmp/model.json || { echo "not a completion: $(cat /tmp/model.json)" >&2; exit 3; }
code=$(curl -sS -o /tmp/other.json -w '%{http_code}' -H "X-Sandbox-Session-Token: $T" \
  -H 'Content-Type: application/json' -d "$body" "$PROTOBOT_EGRESS_PROXY/evil.example.invalid/v1/chat/completions")
[ "$code" = 403 ] || { echo "another host was not denied: $code" >&2; exit 4; }
if curl -sS --max-time 5 http://192.0.2.1/ >/dev/null 2>&1; then echo "a direct connection got out" >&2; exit 5; fi
mkdir -p /out/egress-probe
cat /proc/$$/environ > /out/egress-probe/environ
cat /proc/$$/cmdline > /out/egress-probe/cmdline
tr '\0' '\n' < /proc/$$/environ >&2
"#;

/// Every log line of this test process (one process per test under nextest).
static LOGS: std::sync::LazyLock<Mutex<Vec<u8>>> = std::sync::LazyLock::new(Default::default);

struct Tee;

impl std::io::Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap().extend_from_slice(buf);
        std::io::stderr().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn capture_logs() {
    let _ = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "warn,protobot::egress=info,protobot_egress=debug,protobot_controller=debug,protobot_jobsite=debug,protobot_executors=debug,protobot_kube_executor=debug",
        ))
        .with_writer(|| Tee)
        .try_init();
}

fn skip() -> bool {
    protobot_e2e::skip_without_pod_egress("Worker egress")
}

/// The broker in front of the double: (its address, its metrics).
async fn proxy(double: &ModelDouble) -> (SocketAddr, EgressMetrics) {
    let upstream: HashMap<String, SocketAddr> = [
        (MODEL_HOST.to_owned(), double.addr()),
        (OTHER_HOST.to_owned(), double.addr()),
    ]
    .into();
    let metrics = EgressMetrics::register(&prometheus::Registry::new()).unwrap();
    let broker = Broker::new(
        EgressPolicy::from_yaml(POLICY, "<worker egress policy>").unwrap(),
        CredentialStore::from_pairs([("model", Credential::new(API_KEY))]),
        SessionRegistry::new(SessionSecret::new(SECRET.to_vec())),
        Upstream::plaintext_for_tests(upstream),
        metrics.clone(),
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
    (addr, metrics)
}

/// Files under `dir` holding `needle`, and how many files were read.
fn files_holding(dir: &Path, needle: &[u8]) -> (Vec<String>, usize) {
    let mut hits = Vec::new();
    let mut read = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(p);
            } else if meta.is_file()
                && let Ok(body) = std::fs::read(&p)
            {
                read += 1;
                if body.windows(needle.len()).any(|w| w == needle) {
                    hits.push(p.display().to_string());
                }
            }
        }
    }
    (hits, read)
}

/// Every object of the namespace a user or tool can read (Secrets aside), as JSON.
async fn readable_objects(client: &Client, ns: &str) -> String {
    let mut all = String::new();
    macro_rules! dump {
        ($kind:ty) => {
            for o in Api::<$kind>::namespaced(client.clone(), ns)
                .list(&Default::default())
                .await
                .unwrap()
                .items
            {
                all.push_str(&serde_json::to_string(&o).unwrap());
            }
        };
    }
    dump!(Project);
    dump!(ChangeSet);
    dump!(BuildWorkItem);
    dump!(InspectionRun);
    dump!(ConfigMap);
    dump!(Event);
    dump!(Service);
    dump!(NetworkPolicy);
    dump!(k8s_openapi::api::core::v1::Pod);
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_class_with_egress_reaches_its_model_only_through_the_proxy() {
    if skip() {
        return;
    }
    capture_logs();
    let cluster = Cluster::connect("worker-egress").await;
    let (client, ns) = (cluster.client.clone(), cluster.namespace.clone());
    protobot_e2e::sandbox_platform(&cluster, "kata").await;
    create_object(
        &Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "protobot-staging", "namespace": ns},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        }),
    )
    .await;
    let double = ModelDouble::start(
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        Script::default(),
    )
    .unwrap();
    let (proxy_addr, metrics) = proxy(&double).await;
    // The proxy's Service, as the chart renders it; the simulated node relays to the
    // broker on loopback.
    let proxy_url = protobot_e2e::egress_proxy_service(&cluster, proxy_addr).await;
    let kubelet = protobot_testkit::Kubelet::connect(
        client.clone(),
        Arc::new(protobot_testkit::BubblewrapContainerExecutor::from_path().unwrap()),
        &format!("node-{ns}"),
        vec![ns.clone()],
    )
    .await
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let staging = kubelet.claim_dir(&ns, "protobot-staging").unwrap();
    let mut config = KubeExecutorConfig::new(
        &ns,
        StagingVolume {
            claim_name: "protobot-staging".into(),
            mount_path: staging.clone(),
        },
        tmp.path().join("collected"),
    );
    config.default_image = Some("registry.example.invalid/worker:e2e".into());
    config.staging_ownership = StagingOwnership::Keep;
    config.egress_session_secret = Some(SessionSecret::new(SECRET.to_vec()));
    config.egress_proxy_url = Some(proxy_url.clone());
    // The bundled profile with its proxy in the scenario namespace (and no supervisor: the
    // simulated node cannot run its init container yet); the double's report stands in
    // for a conformant deployment, as in the job_site pods scenario.
    let text = include_str!("../../../sandbox-profiles/kata.yaml")
        .replace(
            "kubernetes.io/metadata.name: protobot-system",
            &format!("kubernetes.io/metadata.name: {ns}"),
        )
        .replace(
            "  supervisor:\n    binaryPath: /usr/local/bin/protobot\n",
            "",
        );
    let profile = SandboxProfile::parse(&text, "kata.yaml").unwrap();
    let executor = Arc::new(
        KubernetesExecutor::new(
            cluster.operator.clone(),
            config,
            profile,
            Some(protobot_e2e::conformant_report("kata")),
        )
        .unwrap(),
    );

    // The example Project, its classes (Worker B with egress and the model call) and ChangeSet.
    let (work, origin) = (tmp.path().join("work"), tmp.path().join("origin.git"));
    let merge = author(&work, &origin).unwrap();
    let worker_b = json!({
        "command": ["sh", "-c", format!("set -e\n{MODEL_CALL}\n{WORKER_B}")],
        "image": null, "egress": true,
    })
    .to_string();
    create_object(
        &Api::<ConfigMap>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cli-sync-workers", "namespace": ns},
            "data": {"worker-a": worker_class(WORKER_A), "worker-b": worker_b,
                     "integration": worker_class(INTEGRATION)},
        }),
    )
    .await;
    create_object(
        &Api::<Project>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "cli-sync", "namespace": ns},
            "spec": {"repoUrl": format!("file://{}", origin.display()), "sandboxProfile": "kata",
                     "workerClassesRef": {"name": "cli-sync-workers"}},
        }),
    )
    .await;
    create_object(
        &Api::<ChangeSet>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "ChangeSet",
            "metadata": {"name": "cs-00001", "namespace": ns},
            "spec": {"projectRef": {"name": "cli-sync"}, "changeSetId": "CS-00001", "mergeCommit": merge},
        }),
    )
    .await;

    // The operator's controllers, as the job_site scenarios run them.
    let operator = cluster.operator.clone();
    let mut project_ctx =
        protobot_controller::project::Context::new(operator.clone(), tmp.path().join("projects"));
    project_ctx.repositories =
        protobot_controller::project::decide::RepositoryPolicy { allow_local: true };
    let repositories = project_ctx.repositories;
    let projects = tokio::spawn(protobot_controller::project::run_context(
        Some(ns.clone()),
        Arc::new(project_ctx),
    ));
    let registration = tokio::spawn(protobot_controller::changeset::run_metered(
        operator.clone(),
        Some(ns.clone()),
        tmp.path().join("registry"),
        repositories,
        None,
    ));
    let inspection_runs = tokio::spawn(protobot_controller::inspectionrun::run_metered(
        operator.clone(),
        Some(ns.clone()),
        None,
    ));
    let job_site = tokio::spawn(run(
        operator.clone(),
        Some(ns.clone()),
        Settings {
            interval: Duration::from_millis(200),
            egress_proxy: Some(proxy_url.clone()),
            claim_sweeps: protobot_controller::jobsite::ClaimSweeps::new(
                Duration::ZERO,
                Duration::ZERO,
            ),
            repositories,
            ..Settings::new("protobot-0", tmp.path().join("jobsite"), 8)
        },
        executor,
    ));

    let item = protobot_e2e::registered_item_completes(&client, &ns, "cs-00001").await;
    for task in [job_site, registration, inspection_runs, projects] {
        task.abort();
    }

    // The endpoint saw the key, on every model request, and only the proxy's requests.
    let seen = double.requests();
    assert!(
        !seen.is_empty(),
        "the model endpoint saw no request from Worker B"
    );
    for r in &seen {
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {API_KEY}").as_str()),
            "{r:?}"
        );
        assert_eq!(r.header("host"), Some(MODEL_HOST));
        assert!(
            r.headers.keys().all(|k| !k.starts_with("x-sandbox")),
            "{r:?}"
        );
    }
    let allowed = metrics.decisions.with_label_values(&["allowed"]).get();
    let denied = metrics.decisions.with_label_values(&["denied"]).get();
    assert_eq!(
        allowed,
        u64::try_from(seen.len()).unwrap(),
        "every allowed request reached the endpoint"
    );
    assert_eq!(
        denied, allowed,
        "one denial (the other host) per model call"
    );
    // The other host was denied and audited, naming the work item.
    let logs = String::from_utf8_lossy(&LOGS.lock().unwrap()).into_owned();
    let audited: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("egress decision") && l.contains(OTHER_HOST))
        .collect();
    assert!(!audited.is_empty(), "the denial was not audited");
    for line in &audited {
        assert!(
            line.contains("no-matching-rule") && line.contains(&item.spec.work_item_id),
            "{line}"
        );
    }

    // The key never reached the sandbox or anything the operator wrote or shows.
    let key = API_KEY.as_bytes();
    let kubelet_root = staging.ancestors().nth(3).unwrap().to_path_buf();
    let (hits, read) = files_holding(&kubelet_root, key);
    assert!(
        hits.is_empty(),
        "the key is in files of the node (pod logs, staged /task, /workspace, /out): {hits:?}"
    );
    assert!(
        read > 0,
        "no pod file was read at {}",
        kubelet_root.display()
    );
    let (hits, _) = files_holding(tmp.path(), key);
    assert!(
        hits.is_empty(),
        "the key is in files the operator wrote: {hits:?}"
    );
    // The harness's dump of its environment and command line exists (so the search above
    // read what the pod saw) and holds the proxy and token variables, not the key.
    let (dumps, _) = files_holding(tmp.path(), b"PROTOBOT_EGRESS_SESSION_TOKEN_FILE=");
    let (logged, _) = files_holding(&kubelet_root, b"PROTOBOT_EGRESS_SESSION_TOKEN_FILE=");
    assert!(
        !dumps.is_empty() && !logged.is_empty(),
        "Worker B's environment dump is missing from /out ({dumps:?}) or its log ({logged:?})"
    );
    assert!(!logs.contains(API_KEY), "a log line holds the key");
    let objects = readable_objects(&client, &ns).await;
    assert!(
        !objects.contains(API_KEY),
        "an object or Event of the namespace holds the key"
    );

    drop(kubelet);
    cluster.cleanup().await;
}
