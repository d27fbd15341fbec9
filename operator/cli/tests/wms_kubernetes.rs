#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The upstream drafting-table golden fixture replayed line for line through
//! `protobot wms --store kubernetes:NAMESPACE/PROJECT` against a real
//! kube-apiserver (`scripts/kube-test-env up`; KUBECONFIG with rights on the
//! protobot.dev CRDs, installed from `crds/` by `protobot_e2e::real::prepare`).
//! Skipped without KUBECONFIG unless `PROTOBOT_E2E_REQUIRE_CLUSTER=1`. Runs in
//! its own namespace, deleted afterwards unless `PROTOBOT_E2E_KEEP=1`.

use std::{
    io::Write,
    path::PathBuf,
    process::{Command, Stdio},
    time::{SystemTime, UNIX_EPOCH},
};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, GroupVersionKind, PostParams},
    discovery::ApiResource,
};
use protobot_stores::{
    KubeStore, WorkStore,
    golden::{FIXTURE, Fixture, verify_digest},
};
use serde_json::{Value, json};

fn wms(args: &[&str], request: &str) -> Value {
    let mut child = Command::new(env!("CARGO_BIN_EXE_protobot"))
        .arg("wms")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "protobot wms failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafting_table_wms_golden_replays_line_for_line_through_the_binary_on_kubernetes() {
    if std::env::var_os("KUBECONFIG").is_none() {
        assert!(
            std::env::var_os("PROTOBOT_E2E_REQUIRE_CLUSTER").is_none(),
            "PROTOBOT_E2E_REQUIRE_CLUSTER is set but KUBECONFIG is not"
        );
        eprintln!("wms_kubernetes: skipped (needs a real API server: set KUBECONFIG)");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/upstream");
    let raw = std::fs::read(dir.join(FIXTURE)).unwrap();
    let sources = std::fs::read_to_string(dir.join("SOURCES")).unwrap();
    if let Err(e) = verify_digest(&sources, FIXTURE, &raw) {
        panic!("{e}");
    }
    let golden = Fixture::parse(&raw).unwrap();
    let client = Client::try_default()
        .await
        .expect("KUBECONFIG names a reachable cluster");
    // The CRDs (and the chart's RBAC), as every real-apiserver scenario installs them: CI's
    // control plane is fresh, and this test may run first.
    protobot_e2e::real::prepare(&client)
        .await
        .unwrap_or_else(|e| panic!("preparing the cluster: {e}"));
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let ns = format!("protobot-wms-golden-{nanos:x}");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let gvk = GroupVersionKind::gvk("protobot.dev", "v1alpha1", "Project");
    let projects: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(&gvk, "projects"),
    );
    let project: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
        "metadata": {"name": golden.project_id, "namespace": ns},
        "spec": {"repoUrl": "https://git.example/fixture.git", "sandboxProfile": "kata"},
    }))
    .unwrap();
    projects
        .create(&PostParams::default(), &project)
        .await
        .expect("create the fixture's Project");
    let store = KubeStore::new(
        client.clone(),
        &ns,
        &golden.project_id,
        golden.adapter_config(),
    );
    golden.seed(&store).await.unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let mut identities = std::collections::BTreeMap::new();
    for (actor, c) in golden.lines[0]["fake_gate_contexts"].as_object().unwrap() {
        let file = tmp.path().join(format!("{actor}.json"));
        std::fs::write(&file, c.to_string()).unwrap();
        identities.insert(actor.clone(), file);
    }
    let store_arg = format!("kubernetes:{ns}/{}", golden.project_id);
    let now = golden.now.to_string();
    let materializer = golden.adapter_config().materializer_subject;
    let mut replayed = 0;
    for step in golden.steps().unwrap() {
        let (Some(env), Some(expected)) = (&step.envelope, &step.expected) else {
            continue;
        };
        let mut request = serde_json::to_value(env).unwrap();
        if let Some(forged) = step.raw.get("untrusted_actor") {
            request["untrusted_actor"] = forged.clone();
        }
        let identity = identities[&env.actor_context_ref]
            .to_str()
            .unwrap()
            .to_string();
        let got = wms(
            &[
                "--store",
                &store_arg,
                "--identity",
                &identity,
                "--now",
                &now,
                "--materializer-subject",
                &materializer,
                "--lease-seconds",
                "900",
            ],
            &request.to_string(),
        );
        if let Err(diffs) = protobot_stores::golden::compare(&step.step, expected, &got["result"]) {
            panic!("line {}: {}\n({got})", step.line, diffs.join("\n"));
        }
        let mutated = got["result"]["mutation"] == "applied";
        assert_eq!(
            got["audit"]["count"],
            u64::from(mutated),
            "{}: audit count",
            step.step
        );
        replayed += 1;
    }
    assert_eq!(
        replayed, 43,
        "every operation record with a result was replayed"
    );
    let request = store.request("request-001").await.unwrap().unwrap();
    assert_eq!(
        (request.request_revision, request.business_priority.as_str()),
        (6, "urgent")
    );
    assert_eq!(
        store
            .submission("resolution-submission-001")
            .await
            .unwrap()
            .unwrap()
            .status,
        "superseded"
    );
    if std::env::var_os("PROTOBOT_E2E_KEEP").is_none() {
        let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    }
}
