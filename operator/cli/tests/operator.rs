#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `protobot operator` as a process against the API double over loopback HTTP
//! (a kubeconfig, like a real cluster): `/readyz` turns ready once the caches
//! synced, and `/metrics` and `/healthz` answer.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

#[path = "support/admin_http.rs"]
mod admin_http;

use admin_http::get;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_becomes_ready_and_serves_metrics() {
    let server = protobot_testkit::server::ApiServer::new();
    server
        .register_crd_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../crds"))
        .unwrap();
    let http = server.serve_http().await.unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    std::fs::write(&kubeconfig, http.kubeconfig_yaml()).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let _operator = Killed(
        Command::new(env!("CARGO_BIN_EXE_protobot"))
            .args([
                "operator",
                "--namespace",
                "default",
                "--admin-addr",
                &addr,
                "--identity",
                "protobot-test-0",
                "--sandbox-profile",
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../../sandbox-profiles/kata.yaml"
                ),
                "--workdir",
                tmp.path().join("work").to_str().unwrap(),
                "--staging-path",
                tmp.path().join("staging").to_str().unwrap(),
            ])
            .env("KUBECONFIG", &kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ready = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let Some((200, _)) = get(&addr, "/readyz").await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(ready.is_ok(), "the operator never became ready");
    let (status, body) = get(&addr, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(
        body.contains("protobot_work_items{state=\"ready-for-building\"} 0"),
        "{body}"
    );
    assert_eq!(get(&addr, "/healthz").await.unwrap().0, 200);
}

#[test]
fn the_operator_refuses_to_start_a_job_site_without_a_valid_sandbox_profile() {
    let tmp = tempfile::tempdir().unwrap();
    let profile = tmp.path().join("weak.yaml");
    std::fs::write(&profile, "apiVersion: nope\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args([
            "operator",
            "--identity",
            "protobot-test-0",
            "--sandbox-profile",
            profile.to_str().unwrap(),
        ])
        .env("KUBECONFIG", tmp.path().join("missing-kubeconfig"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot start the Job Site") && stderr.contains("--no-job-site"),
        "{stderr}"
    );
}
