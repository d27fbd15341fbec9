//! `make bench`: the operator's cost on the API double, measured in the operator
//! process only (the double runs in a child process and is not counted).
//!
//! 1. 1,000 change sets are materialized and claimed through the Kubernetes
//!    work store: the CPU seconds this process spent (goal < 10 s).
//! 2. 10,000 `BuildWorkItem`s in total, cached by the operator's reflector
//!    ([`state_cache`](protobot_controller::operator::state_cache), which feeds the
//!    work-items-by-state collector): the resident set once the cache synced and
//!    the process's peak (goal < 64 MiB, judged on the peak).
//!
//! Run: `cargo run --release -p protobot-e2e --example bench_operator [-- CLAIMED TOTAL]`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::Instant;

use jiff::{SignedDuration, Timestamp};
use kube::{Api, Client};
use protobot_api::BuildWorkItem;
use protobot_controller::{metrics::StateCounts, operator::CachedStates};
use protobot_jobsite::contract::BuildContract;
use protobot_lifecycle::{AuthorizationContext, OperationEnvelope, Readiness, State};
use protobot_stores::{AdapterConfig, KubeStore, WorkStore};

fn status_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

fn context(role: &str, subject: &str, action: &str) -> AuthorizationContext {
    AuthorizationContext {
        subject: subject.into(),
        role: role.into(),
        project_id: "bench".into(),
        allowed_actions: vec![action.into()],
        allowed_refs: vec!["project:bench".into()],
        expires_at: Some(Timestamp::now() + SignedDuration::from_hours(4)),
        policy_version: "bench".into(),
        ..AuthorizationContext::default()
    }
}

fn contract(i: usize) -> BuildContract {
    BuildContract {
        work_item_id: format!("wi-bench-{i:05}"),
        materialization_key: format!("bench/CS-{i:05}@{:040x}", i),
        spec_commit: format!("{:040x}", i),
        change_type: "undefined".into(),
        changed_requirement_ids: vec![format!("REQ-B-{i:05}")],
        retired_requirement_ids: vec![],
        applicable_requirement_ids: vec![format!("REQ-B-{i:05}")],
        impact: vec![],
        implementation_required: true,
        readiness: Readiness::complete(),
        dependencies: vec![],
        priority: "normal".into(),
        scopes: vec![],
        paths: vec![],
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if protobot_e2e::bench::serve_if_child().await {
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let claimed: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let total: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    if std::env::var_os("KUBECONFIG").is_some() {
        return real(claimed, total).await;
    }
    let (client, mut child) = protobot_e2e::bench::start().await;
    measure(client, "default", "the API double", claimed, total).await;
    drop(child.stdin.take());
    let _ = child.wait();
}

/// The same figures against `KUBECONFIG`'s real API server (the CRDs and the chart's RBAC
/// installed as for the e2e scenarios; the store runs as the chart's ServiceAccount), in a
/// namespace of its own that is deleted afterwards.
async fn real(claimed: usize, total: usize) {
    let admin = Client::try_default().await.expect("KUBECONFIG's cluster");
    let version = admin
        .apiserver_version()
        .await
        .expect("the server's version");
    let (operator, _refused) = protobot_e2e::real::prepare(&admin)
        .await
        .expect("prepare the cluster");
    let ns = format!(
        "protobot-bench-{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    );
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin.clone());
    let body: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    namespaces.create(&Default::default(), &body).await.unwrap();
    let label = format!("kube-apiserver {}", version.git_version);
    measure(operator, &ns, &label, claimed, total).await;
    let _ = namespaces.delete(&ns, &Default::default()).await;
}

async fn measure(client: Client, ns: &str, on: &str, claimed: usize, total: usize) {
    let store = KubeStore::new(
        client.clone(),
        ns,
        "bench",
        AdapterConfig {
            materializer_subject: "materializer".into(),
            lease_seconds: 900,
        },
    );
    let materializer = context("materializer", "materializer", "materialize");
    let job_site = context("job-site", "bench-site", "claim");
    let cpu0 = protobot_e2e::bench::cpu_seconds();
    let wall = Instant::now();
    for i in 0..claimed {
        let c = contract(i);
        let r = store
            .execute(
                Some(&materializer),
                &c.materialize_envelope("bench", "m"),
                Timestamp::now(),
            )
            .await
            .unwrap();
        assert!(r.ok, "materialize {i}: {:?}", r.code());
        let claim = OperationEnvelope {
            operation: "claim".into(),
            actor_context_ref: "job-site".into(),
            work_item_id: c.work_item_id.clone(),
            expected_state: Some("ready-for-building".into()),
            expected_contract_version: Some(1),
            idempotency_key: format!("claim:{}", c.work_item_id),
            ..OperationEnvelope::default()
        };
        let r = store
            .execute(Some(&job_site), &claim, Timestamp::now())
            .await
            .unwrap();
        assert!(r.ok, "claim {i}: {:?}", r.code());
    }
    let cpu = protobot_e2e::bench::cpu_seconds() - cpu0;
    println!(
        "operator on {on}: {claimed} change sets materialized and claimed: {cpu:.2} s CPU in {:.1} s wall (goal < 10 s CPU) {}",
        wall.elapsed().as_secs_f64(),
        if cpu < 10.0 { "MET" } else { "NOT MET" }
    );
    for i in claimed..total {
        let c = contract(i);
        store
            .execute(
                Some(&materializer),
                &c.materialize_envelope("bench", "m"),
                Timestamp::now(),
            )
            .await
            .unwrap();
    }
    let rss_before = status_kib("VmRSS:");
    // The operator's own cache (pruned objects) and its by-state collector.
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), ns);
    let (reader, reflect) = protobot_controller::operator::state_cache(items);
    let reflect = tokio::spawn(reflect);
    reader.wait_until_ready().await.unwrap();
    while reader.state().len() < total {
        tokio::task::yield_now().await;
    }
    let counts = CachedStates(reader.clone()).counts();
    let count = |s: State| counts.iter().find(|(k, _)| *k == s).map_or(0, |(_, n)| *n);
    assert_eq!(count(State::Building), claimed as u64, "{counts:?}");
    assert_eq!(
        count(State::ReadyForBuilding),
        (total - claimed) as u64,
        "{counts:?}"
    );
    let rss = status_kib("VmRSS:");
    let peak = status_kib("VmHWM:");
    println!(
        "operator on {on}: {} BuildWorkItems cached: RSS {:.1} MiB (was {:.1} MiB before the cache), peak {:.1} MiB (goal < 64 MiB) {}",
        reader.state().len(),
        rss as f64 / 1024.0,
        rss_before as f64 / 1024.0,
        peak as f64 / 1024.0,
        if peak < 64 * 1024 { "MET" } else { "NOT MET" }
    );
    reflect.abort();
}
