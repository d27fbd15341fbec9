//! `make bench`: what a project's history costs the Job Site (issue 17). Ten ready items
//! with instant scripted Workers are built by one replica through the Kubernetes work
//! store on the API double (served by a child process, not counted), once alone and once
//! beside 1,000 completed items; then twenty dispatches find nothing to do, first listing
//! through the API, then reading the watch cache as the operator's dispatches do
//! (`KubeStore::with_item_cache`). Prints this process's CPU seconds and the ratios (goal:
//! within 2x).
//!
//! Run: `cargo run --release -p protobot-e2e --example bench_backlog [-- COMPLETED NEW]`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;

use futures::StreamExt;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, reflector, watcher},
};
use protobot_api::BuildWorkItem;
use protobot_jobsite::{
    builds::Builds,
    scripted::{LEASE, SiteOptions, ids, merges_on_main, site, site_on, world},
};
use protobot_lifecycle::State;
use protobot_stores::{AdapterConfig, Import, ItemFilter, KubeStore, WorkStore};

/// Idle dispatches measured after the build, listing through the API.
const IDLE_DISPATCHES: usize = 20;
/// Idle dispatches measured reading the watch cache (cheap: more of them, so the CPU
/// clock's 10 ms ticks resolve them).
const CACHED_DISPATCHES: usize = 1_000;

/// The Kubernetes store of the project `demo` in `ns`.
fn demo_store(client: &Client, ns: &str) -> KubeStore {
    KubeStore::new(
        client.clone(),
        ns,
        "demo",
        AdapterConfig {
            materializer_subject: "m".into(),
            lease_seconds: LEASE,
        },
    )
}

/// One replica with eight build slots, no Inspector, `new` items in progress at most.
fn options(new: usize) -> SiteOptions {
    SiteOptions {
        subject: "replica-1",
        inspector: false,
        capacity: Some(Arc::new(tokio::sync::Semaphore::new(8))),
        wip_limit: new,
        ..SiteOptions::default()
    }
}

/// CPU seconds to build `new` items, and for [`IDLE_DISPATCHES`] dispatches afterwards
/// listing through the API and reading the watch cache, in a namespace holding
/// `completed` finished items.
async fn measure(client: &Client, ns: &str, completed: usize, new: usize) -> (f64, f64, f64) {
    let store = Arc::new(demo_store(client, ns));
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
    let replica = Arc::new(site(&w, options(new)));
    let cpu = protobot_e2e::bench::cpu_seconds();
    let building = Arc::clone(&replica);
    tokio::spawn(async move { building.run_until_idle().await })
        .await
        .unwrap()
        .unwrap();
    let build_cpu = protobot_e2e::bench::cpu_seconds() - cpu;
    assert_eq!(
        merges_on_main(&w.origin).len(),
        new,
        "every new item merged once"
    );
    let (builds, _finished) = Builds::new();
    let cpu = protobot_e2e::bench::cpu_seconds();
    for _ in 0..IDLE_DISPATCHES {
        let actions = replica.dispatch(&builds, "demo").await.unwrap();
        assert!(actions.is_empty(), "nothing left to do: {actions:?}");
    }
    let listed_cpu = protobot_e2e::bench::cpu_seconds() - cpu;

    // The operator's way: the items come from its watch cache.
    let (reader, writer) = reflector::store::<BuildWorkItem>();
    let watch = tokio::spawn(
        watcher(
            Api::<BuildWorkItem>::namespaced(client.clone(), ns),
            watcher::Config::default(),
        )
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .for_each(|_| async {}),
    );
    reader.wait_until_ready().await.unwrap();
    let cached = Arc::new(demo_store(client, ns).with_item_cache(reader));
    let from_cache = Arc::new(site_on(&w, cached, options(new)));
    let cpu = protobot_e2e::bench::cpu_seconds();
    for _ in 0..CACHED_DISPATCHES {
        let actions = from_cache.dispatch(&builds, "demo").await.unwrap();
        assert!(actions.is_empty(), "nothing left to do: {actions:?}");
    }
    let cached_cpu = protobot_e2e::bench::cpu_seconds() - cpu;
    watch.abort();
    (build_cpu, listed_cpu, cached_cpu)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if protobot_e2e::bench::serve_if_child().await {
        return;
    }
    let mut args = std::env::args().skip(1);
    let completed: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000);
    let new: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10);
    let (client, mut child) = protobot_e2e::bench::start().await;
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(client.clone());
    for ns in ["alone", "backlog"] {
        let body = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
        namespaces.create(&Default::default(), &body).await.unwrap();
    }
    let (alone_build, alone_idle, alone_cached) = measure(&client, "alone", 0, new).await;
    let (backlog_build, backlog_idle, backlog_cached) =
        measure(&client, "backlog", completed, new).await;
    println!(
        "{new} new items through the Kubernetes store on the API double; idle dispatches after"
    );
    println!(
        "build:    alone {alone_build:.2} s CPU, beside {completed} completed {backlog_build:.2} s ({:.2}x, goal < 2x)",
        backlog_build / alone_build.max(0.01)
    );
    let ms = |cpu: f64, n: usize| cpu * 1000.0 / n as f64;
    println!(
        "dispatch, listing through the API: alone {:.3} ms CPU each, beside {completed} completed {:.3} ms ({:.2}x)",
        ms(alone_idle, IDLE_DISPATCHES),
        ms(backlog_idle, IDLE_DISPATCHES),
        backlog_idle / alone_idle.max(0.01)
    );
    println!(
        "dispatch, from the watch cache:    alone {:.3} ms CPU each, beside {completed} completed {:.3} ms ({:.2}x, goal < 2x)",
        ms(alone_cached, CACHED_DISPATCHES),
        ms(backlog_cached, CACHED_DISPATCHES),
        backlog_cached / alone_cached.max(0.01)
    );
    drop(child.stdin.take());
    let _ = child.wait();
}
