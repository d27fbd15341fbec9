#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Pod networking on the simulated node (issue 21): a pod whose NetworkPolicy
//! allows TCP to the egress proxy's Service reaches that Service at its cluster
//! IP and nothing else — names, direct connections and DNS fail at
//! once — while a pod without such a policy has no network at all. Needs
//! root, bubblewrap, `ip`, `nsenter` and `curl`; skipped with the reason
//! otherwise, unless `PROTOBOT_REQUIRE_EGRESS=1`, which fails it.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::{Namespace, Pod, Service},
    networking::v1::NetworkPolicy,
};
use kube::api::{Api, PostParams};
use protobot_testkit::{
    BubblewrapContainerExecutor, Kubelet, kubelet::NODE_ENDPOINT_ANNOTATION, server::ApiServer,
};
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

fn missing() -> Option<String> {
    if BubblewrapContainerExecutor::from_path().is_none() {
        return Some("bubblewrap is not installed".into());
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0");
    if !root {
        return Some("pod egress on the simulated node needs root (ip netns)".into());
    }
    for tool in ["ip", "nsenter", "curl", "getent"] {
        let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .any(|d| d.join(tool).is_file());
        if !found {
            return Some(format!("`{tool}` is not installed"));
        }
    }
    None
}

fn available(test: &str) -> bool {
    let Some(why) = missing() else { return true };
    assert!(
        std::env::var_os("PROTOBOT_REQUIRE_EGRESS").is_none(),
        "{test}: {why}, but PROTOBOT_REQUIRE_EGRESS is set"
    );
    eprintln!("SKIPPED {test}: {why}; set PROTOBOT_REQUIRE_EGRESS=1 to make this a failure");
    false
}

/// A stand-in for the proxy: answers every request with `proxied <request line>`
/// and records the request lines.
async fn fake_proxy() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let record = record.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                let line = req.lines().next().unwrap_or("").to_owned();
                record.lock().unwrap().push(line.clone());
                let body = format!("proxied {line}\n");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    (port, seen)
}

async fn finished(api: &Api<Pod>, name: &str) -> (String, Option<i32>) {
    let done = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
    };
    let p = protobot_testkit::until(api, name, Duration::from_secs(60), done)
        .await
        .unwrap()
        .unwrap();
    let s = p.status.unwrap();
    let code = s.container_statuses.as_ref().and_then(|cs| {
        cs[0]
            .state
            .as_ref()?
            .terminated
            .as_ref()
            .map(|t| t.exit_code)
    });
    (s.phase.unwrap(), code)
}

/// What a pod with egress checks: the proxy answers at its cluster IP; its name
/// does not resolve (the policy denies DNS, as in a cluster); the host's
/// loopback, another address, another port of the cluster IP and DNS do not
/// answer, and fail at once. Each failure exits with its own code.
const WITH_EGRESS: &str = r#"
curl -sS --max-time 10 http://10.96.0.17:3128/by-ip | grep -q '^proxied GET /by-ip' || exit 11
curl -sS --max-time 5 http://protobot-egress-proxy.sys.svc:3128/by-name; [ $? = 6 ] || exit 10
curl -sS --max-time 5 "http://127.0.0.1:$PROXY_PORT/host-loopback"; [ $? = 7 ] || exit 12
curl -sS --max-time 5 http://192.0.2.1/other; [ $? = 7 ] || exit 13
curl -sS --max-time 5 http://10.96.0.17:8080/other-port; [ $? = 7 ] || exit 14
getent hosts example.com && exit 15
curl -sS --max-time 5 https://example.com/; [ $? = 6 ] || exit 16
exit 0
"#;

/// What a pod without egress checks: nothing answers, not even the proxy.
const WITHOUT_EGRESS: &str = r#"
curl -sS --max-time 5 http://10.96.0.17:3128/denied && exit 20
curl -sS --max-time 5 "http://127.0.0.1:$PROXY_PORT/denied" && exit 21
exit 0
"#;

fn pod(name: &str, run: &str, script: &str, proxy_port: u16) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"protobot.dev/run": run}},
        "spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "none", "command": ["sh", "-c", script],
                            "env": [{"name": "PROXY_PORT", "value": proxy_port.to_string()}]}]}
    }))
    .unwrap()
}

/// The policy the Kubernetes executor writes for a run: deny all ingress and
/// egress except, with `proxy`, TCP 3128 to the proxy's pods in `sys`.
fn policy(run: &str, proxy: bool) -> NetworkPolicy {
    let egress = if proxy {
        json!([{"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "sys"}},
                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "protobot-egress-proxy"}}}],
                "ports": [{"protocol": "TCP", "port": 3128}]}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": format!("np-{run}")},
        "spec": {"podSelector": {"matchLabels": {"protobot.dev/run": run}},
                 "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": egress}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_reaches_only_the_service_its_network_policy_allows() {
    if !available("a_pod_reaches_only_the_service_its_network_policy_allows") {
        return;
    }
    let (proxy_port, seen) = fake_proxy().await;
    let server = ApiServer::new();
    let exec = BubblewrapContainerExecutor::from_path().unwrap();
    let _kubelet = Kubelet::start_with(&server, Arc::new(exec), "egress-node").unwrap();
    let client = server.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let sys: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sys"}
    }))
    .unwrap();
    namespaces
        .create(&PostParams::default(), &sys)
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "sys");
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "protobot-egress-proxy",
                     "annotations": {NODE_ENDPOINT_ANNOTATION: format!("127.0.0.1:{proxy_port}")}},
        "spec": {"selector": {"app.kubernetes.io/name": "protobot-egress-proxy"},
                 "clusterIP": "10.96.0.17",
                 "ports": [{"name": "proxy", "port": 3128, "targetPort": 3128, "protocol": "TCP"}]}
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let policies: Api<NetworkPolicy> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client);
    let pp = PostParams::default();
    policies.create(&pp, &policy("with", true)).await.unwrap();
    policies
        .create(&pp, &policy("without", false))
        .await
        .unwrap();

    pods.create(&pp, &pod("with-egress", "with", WITH_EGRESS, proxy_port))
        .await
        .unwrap();
    assert_eq!(
        finished(&pods, "with-egress").await,
        ("Succeeded".into(), Some(0)),
        "the pod with egress: exit 11 = the proxy did not answer at its cluster IP, 10 and 12..16 = something else did"
    );
    assert_eq!(
        *seen.lock().unwrap(),
        vec!["GET /by-ip HTTP/1.1"],
        "only the request to the Service's cluster IP reached the proxy"
    );

    pods.create(
        &pp,
        &pod("no-egress", "without", WITHOUT_EGRESS, proxy_port),
    )
    .await
    .unwrap();
    assert_eq!(
        finished(&pods, "no-egress").await,
        ("Succeeded".into(), Some(0)),
        "the pod without egress reached something (20: the proxy's Service, 21: the host)"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "the pod without egress reached the proxy"
    );
}
