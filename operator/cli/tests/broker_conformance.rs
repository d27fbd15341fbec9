#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The credential broker measured through pods (issues 18 and 21): the Kubernetes
//! conformance measurement (`protobot sandbox conformance --profile kata` with
//! `--egress-proxy-url`) runs the jobsite-sandbox/v1 SB-NET and SB-CRED checks as a pod of
//! the profile that reaches the egress proxy only through its NetworkPolicy, on the real
//! kube-apiserver (`KUBECONFIG`) with the simulated kubelet running pods in bubblewrap.
//!
//! The proxy is `protobot_egress::Broker` on a loopback port, behind a Service whose
//! endpoint the simulated node relays to (`kubelet::NODE_ENDPOINT_ANNOTATION`), with the
//! probe policy and the probe upstream of `protobot_egress::probe`:
//! - a real broker passes every NET and CRED check, and the executor reports
//!   `credential-broker` supported;
//! - a broker whose rules inject no credential fails SB-NET-001 and SB-CRED-004;
//! - a "proxy" that forwards anything (a direct IP included) fails SB-NET-004;
//! - without a proxy URL the capability stays unsupported and no broker probe runs.
//!
//! The profile here has no in-guest supervisor (the simulated node cannot run its init
//! container yet), so `resource-limits` is unsupported and the report fails closed on it;
//! the broker checks are measured regardless. Needs root (the pod's network namespace),
//! bubblewrap, `ip`, `nsenter` and `curl`; skipped without a cluster unless
//! `PROTOBOT_E2E_REQUIRE_CLUSTER=1`, and without root unless `PROTOBOT_REQUIRE_EGRESS=1`.

use std::{net::SocketAddr, sync::Arc};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use protobot_e2e::{Cluster, create_object};
use protobot_egress::{SessionSecret, probe};
use protobot_executors::{ConformanceReport, SandboxBackend};
use protobot_kube_executor::{
    KubeExecutorConfig, KubernetesExecutor, SandboxProfile, StagingOwnership, StagingVolume,
    conformance,
};
use serde_json::json;
use tokio::net::TcpListener;

const SECRET: &[u8] = b"protobot-broker-conformance-secret-0123456789";

fn skip() -> bool {
    protobot_e2e::skip_without_pod_egress("broker")
}

/// A real broker deciding by `policy`.
async fn broker(policy: &str) -> SocketAddr {
    protobot_e2e::start_probe_broker(&SessionSecret::new(SECRET.to_vec()), policy).await
}

/// A "proxy" that answers every request as if the upstream had: it allows anything,
/// direct IPs included.
async fn open_proxy() -> SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16 * 1024];
                let _ = conn.read(&mut buf).await;
                let body = format!("{} auth=Bearer [redacted]\n", probe::OK_PAYLOAD);
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            });
        }
    });
    addr
}

struct Scenario {
    cluster: Cluster,
    kubelet: protobot_testkit::Kubelet,
    profile: SandboxProfile,
    /// Its document.
    profile_text: String,
    /// The URL sandboxes reach the proxy Service by.
    proxy_url: String,
    tmp: tempfile::TempDir,
}

impl Scenario {
    async fn prepare() -> Scenario {
        let cluster = Cluster::connect("broker").await;
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
        // The proxy's Service; each measurement points it at its own proxy.
        let proxy_url =
            protobot_e2e::egress_proxy_service(&cluster, "127.0.0.1:9".parse().unwrap()).await;
        let kubelet = protobot_testkit::Kubelet::connect(
            client,
            Arc::new(protobot_testkit::BubblewrapContainerExecutor::from_path().unwrap()),
            &format!("node-{ns}"),
            vec![ns.clone()],
        )
        .await
        .unwrap();
        // The bundled profile, its proxy in the scenario namespace, without the supervisor.
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
        assert!(profile.spec().supervisor.is_none());
        Scenario {
            cluster,
            kubelet,
            profile,
            profile_text: text,
            proxy_url,
            tmp: tempfile::tempdir().unwrap(),
        }
    }

    fn executor(&self, proxy_url: Option<String>) -> KubernetesExecutor {
        let ns = &self.cluster.namespace;
        let mut config = KubeExecutorConfig::new(
            ns,
            StagingVolume {
                claim_name: "protobot-staging".into(),
                mount_path: self.kubelet.claim_dir(ns, "protobot-staging").unwrap(),
            },
            self.tmp.path().join("collected"),
        );
        config.default_image = Some("registry.example.invalid/worker:e2e".into());
        config.staging_ownership = StagingOwnership::Keep;
        config.instance = "conformance".into();
        config.egress_session_secret = Some(SessionSecret::new(SECRET.to_vec()));
        config.egress_proxy_url = proxy_url;
        KubernetesExecutor::for_conformance(
            self.cluster.client.clone(),
            config,
            self.profile.clone(),
        )
        .unwrap()
    }

    async fn measure(&self, proxy: SocketAddr) -> ConformanceReport {
        protobot_e2e::route_egress_proxy(&self.cluster, proxy).await;
        let executor = self.executor(Some(self.proxy_url.clone()));
        conformance::measure(&self.cluster.client, &executor).await
    }
}

fn broker_ids() -> Vec<String> {
    (1..=10)
        .map(|n| format!("SB-NET-{n:03}"))
        .chain((1..=7).map(|n| format!("SB-CRED-{n:03}")))
        .collect()
}

fn failed_broker_checks(report: &ConformanceReport) -> Vec<String> {
    let ids = broker_ids();
    let present: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| ids.contains(&c.id))
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(
        present.len(),
        ids.len(),
        "every broker check is in the report: {present:?}"
    );
    report
        .checks
        .iter()
        .filter(|c| ids.contains(&c.id) && !c.passed)
        .map(|c| format!("{}: {}", c.id, c.detail.as_deref().unwrap_or("")))
        .collect()
}

fn failed_ids(report: &ConformanceReport) -> Vec<String> {
    failed_broker_checks(report)
        .iter()
        .map(|f| f.split(':').next().unwrap().to_owned())
        .collect()
}

/// The conformance suite's futures are deep in a debug build: the scenario runs on a thread
/// with an 8 MiB stack (a test thread has 2 MiB; it overflowed once a run spec grew).
#[test]
fn the_broker_checks_run_as_pods_through_the_proxy_and_fail_for_a_broken_broker() {
    std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_stack_size(8 << 20)
                .enable_all()
                .build()
                .unwrap()
                .block_on(broker_checks_through_the_proxy())
        })
        .unwrap()
        .join()
        .unwrap();
}

async fn broker_checks_through_the_proxy() {
    if skip() {
        return;
    }
    let s = Scenario::prepare().await;

    // Without a proxy URL: unsupported with the reason, and no broker probe runs.
    let bare = s.executor(None);
    let cap = bare
        .capabilities()
        .into_iter()
        .find(|c| c.name == "credential-broker")
        .unwrap();
    assert!(!cap.supported, "{cap:?}");
    assert!(
        cap.detail
            .as_deref()
            .unwrap()
            .contains("--egress-proxy-url"),
        "{cap:?}"
    );
    assert_eq!(bare.broker_probe_proxy(), None);

    // A real broker: every NET and CRED check passes through the pod.
    let good = broker(&probe::probe_policy(
        "worker-a",
        protobot_e2e::PROBE_CREDENTIAL,
    ))
    .await;
    let report = s.measure(good).await;
    let cap = report
        .capabilities
        .iter()
        .find(|c| c.name == "credential-broker")
        .unwrap();
    assert!(cap.supported, "{cap:?}");
    assert_eq!(
        failed_broker_checks(&report),
        Vec::<String>::new(),
        "a real broker passes every NET and CRED check"
    );

    // Only the supervisor is missing here, and the report says so.
    assert_eq!(report.missing_capabilities(), ["resource-limits"]);
    assert!(!report.passed());

    // A broker that injects nothing: the allowed request gets the upstream's 401.
    let no_credential =
        probe::probe_policy("worker-a", "probe").replace("    credential: probe\n", "");
    let report = s.measure(broker(&no_credential).await).await;
    assert_eq!(
        failed_ids(&report),
        ["SB-NET-001", "SB-CRED-004", "SB-CRED-006"],
        "{:#?}",
        failed_broker_checks(&report)
    );

    // A proxy that forwards anything, a direct IP included.
    let report = s.measure(open_proxy().await).await;
    let failed = failed_ids(&report);
    assert!(
        failed.contains(&"SB-NET-004".to_owned()),
        "a proxy that allows a direct IP fails SB-NET-004: {failed:?}"
    );

    drop(s.kubelet);
    s.cluster.cleanup().await;
}

/// A free loopback port (bound, then released for the child to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `protobot egress-proxy --conformance-probe` with an empty policy and no credentials of
/// its own, started as a process; returns it once it serves (its "egress proxy started"
/// log line; a proxy that exits first fails the test) and its address.
fn proxy_process(dir: &std::path::Path) -> (std::process::Child, SocketAddr) {
    use std::io::BufRead;
    std::fs::write(dir.join("policy.yaml"), "rules: []\n").unwrap();
    std::fs::create_dir_all(dir.join("credentials")).unwrap();
    std::fs::write(dir.join("secret"), SECRET).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args(["egress-proxy", "--conformance-probe", "--log", "info"])
        .arg(format!("--listen={addr}"))
        .arg(format!("--admin-listen=127.0.0.1:{}", free_port()))
        .arg(format!("--policy={}", dir.join("policy.yaml").display()))
        .arg(format!(
            "--credentials-dir={}",
            dir.join("credentials").display()
        ))
        .arg(format!("--session-secret={}", dir.join("secret").display()))
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Its log is JSON lines on stdout.
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    loop {
        let line = lines
            .next()
            .expect("the proxy exited before it served")
            .unwrap();
        assert!(!line.contains("not started"), "{line}");
        if line.contains("egress proxy started") {
            assert!(line.contains("\"conformance_probe\":true"), "{line}");
            break;
        }
    }
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, addr)
}

/// The deployed proxy's own binary, measured by `protobot sandbox conformance --profile kata
/// --egress-proxy-url … --egress-session-secret …`: every NET and CRED check passes through
/// the probe pod, and only the missing supervisor fails the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_conformance_command_measures_the_egress_proxy_binary_through_pods() {
    if skip() {
        return;
    }
    let s = Scenario::prepare().await;
    let ns = s.cluster.namespace.clone();
    let (mut proxy, addr) = proxy_process(s.tmp.path());
    protobot_e2e::route_egress_proxy(&s.cluster, addr).await;
    let profile_file = s.tmp.path().join("kata.yaml");
    std::fs::write(&profile_file, &s.profile_text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args(["sandbox", "conformance", "--profile", "kata", "--no-store"])
        .arg(format!("--profile-file={}", profile_file.display()))
        .arg(format!("--sandbox-namespace={ns}"))
        .arg(format!(
            "--staging-path={}",
            s.kubelet
                .claim_dir(&ns, "protobot-staging")
                .unwrap()
                .display()
        ))
        .args(["--staging-ownership", "keep"])
        .arg("--sandbox-image=registry.example.invalid/worker:e2e")
        .arg(format!("--workdir={}", s.tmp.path().join("work").display()))
        .arg(format!("--egress-proxy-url={}", s.proxy_url))
        .arg(format!(
            "--egress-session-secret={}",
            s.tmp.path().join("secret").display()
        ))
        .output()
        .unwrap();
    let _ = proxy.kill();
    let _ = proxy.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: ConformanceReport = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not a report ({e}): {stderr}"));
    assert_eq!(
        failed_broker_checks(&report),
        Vec::<String>::new(),
        "the proxy binary passes every NET and CRED check: {stderr}"
    );
    assert_eq!(report.missing_capabilities(), ["resource-limits"]);
    assert_eq!(out.status.code(), Some(1), "a failing report exits 1");
    drop(s.kubelet);
    s.cluster.cleanup().await;
}
