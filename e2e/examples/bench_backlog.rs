//! `make bench`: what a project's history costs the Job Site (issue 17). Ten ready items
//! with instant scripted Workers are built by one replica through the Kubernetes work
//! store on the API double (served by a child process, not counted), once alone and once
//! beside 1,000 completed items; then twenty dispatches find nothing to do. Prints this
//! process's CPU seconds for both and the ratios (goal: within 2x).
//!
//! Run: `cargo run --release -p protobot-e2e --example bench_backlog [-- COMPLETED NEW]`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;

use kube::Client;
use protobot_jobsite::{
    builds::Builds,
    scripted::{LEASE, SiteOptions, ids, merges_on_main, site, world},
};
use protobot_lifecycle::State;
use protobot_stores::{AdapterConfig, Import, ItemFilter, KubeStore, WorkStore};

/// Idle dispatches measured after the build.
const IDLE_DISPATCHES: usize = 20;

fn cpu_seconds() -> f64 {
    // utime + stime, fields 14 and 15 of /proc/self/stat, in clock ticks (100 Hz).
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

/// CPU seconds to build `new` items, and for [`IDLE_DISPATCHES`] dispatches afterwards,
/// in a namespace holding `completed` finished items.
async fn measure(client: &Client, ns: &str, completed: usize, new: usize) -> (f64, f64) {
    let store = Arc::new(KubeStore::new(
        client.clone(),
        ns,
        "demo",
        AdapterConfig {
            materializer_subject: "m".into(),
            lease_seconds: LEASE,
        },
    ));
    let items = ids(new);
    let w = world(store.clone(), &items).await;
    if completed > 0 {
        // The history: copies of a registered item, finished long ago.
        let template = store.get(&items[0]).await.unwrap().unwrap();
        for i in 0..completed {
            let mut done = template.clone();
            done.id = format!("wi-done-{i:05}");
            done.materialization_key = format!("demo/CS-DONE-{i:05}@{:040x}", i);
            done.state = State::Completed;
            done.lease = None;
            done.owner = String::new();
            store.import(Import::Record(done)).await.unwrap();
        }
        let finished = store
            .list(&ItemFilter::state(State::Completed))
            .await
            .unwrap();
        assert_eq!(finished.len(), completed, "the history is in the store");
    }
    let replica = Arc::new(site(
        &w,
        SiteOptions {
            subject: "replica-1",
            inspector: false,
            capacity: Some(Arc::new(tokio::sync::Semaphore::new(8))),
            wip_limit: new,
            ..SiteOptions::default()
        },
    ));
    let cpu = cpu_seconds();
    let building = Arc::clone(&replica);
    tokio::spawn(async move { building.run_until_idle().await })
        .await
        .unwrap()
        .unwrap();
    let build_cpu = cpu_seconds() - cpu;
    assert_eq!(
        merges_on_main(&w.origin).len(),
        new,
        "every new item merged once"
    );
    let (builds, _finished) = Builds::new();
    let cpu = cpu_seconds();
    for _ in 0..IDLE_DISPATCHES {
        let actions = replica.dispatch(&builds, "demo").await.unwrap();
        assert!(actions.is_empty(), "nothing left to do: {actions:?}");
    }
    (build_cpu, cpu_seconds() - cpu)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if protobot_e2e::bench_double::serve_if_child().await {
        return;
    }
    let mut args = std::env::args().skip(1);
    let completed: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let new: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let (client, mut child) = protobot_e2e::bench_double::start().await;
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(client.clone());
    for ns in ["alone", "backlog"] {
        let body = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
        namespaces.create(&Default::default(), &body).await.unwrap();
    }
    let (alone_build, alone_idle) = measure(&client, "alone", 0, new).await;
    let (backlog_build, backlog_idle) = measure(&client, "backlog", completed, new).await;
    println!(
        "{new} new items through the Kubernetes store on the API double; {IDLE_DISPATCHES} idle dispatches after"
    );
    println!(
        "build:    alone {alone_build:.2} s CPU, beside {completed} completed {backlog_build:.2} s ({:.2}x, goal < 2x)",
        backlog_build / alone_build.max(0.01)
    );
    println!(
        "dispatch: alone {:.3} s CPU each, beside {completed} completed {:.3} s ({:.2}x)",
        alone_idle / IDLE_DISPATCHES as f64,
        backlog_idle / IDLE_DISPATCHES as f64,
        backlog_idle / alone_idle.max(0.01)
    );
    drop(child.stdin.take());
    let _ = child.wait();
}
