#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `KubeStore::with_item_cache` on the API server (the double, or a real cluster with
//! KUBECONFIG): once the watch cache has synced, `list` answers from it exactly what the
//! API list answers, reads no ledger of an item in a state it was not asked for, and
//! sees new writes once the watch delivers them.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use kube::{
    Api,
    api::{Patch, PatchParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use protobot_api::BuildWorkItem;
use protobot_e2e::{Cluster, timeout};
use protobot_jobsite::scripted::{LEASE, ids, world};
use protobot_lifecycle::State;
use protobot_stores::{
    AdapterConfig, Import, ItemFilter, KubeStore, WorkStore, kubernetes::item_name,
};

fn sorted(mut records: Vec<protobot_lifecycle::WorkItemRecord>) -> Vec<(String, State, u64)> {
    records.sort_by(|a, b| a.id.cmp(&b.id));
    records
        .into_iter()
        .map(|r| (r.id, r.state, r.contract_version))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synced_cache_lists_what_the_api_lists_and_skips_ledgers_it_was_not_asked_for() {
    let cluster = Cluster::connect("itemcache").await;
    let ns = cluster.namespace.clone();
    let config = AdapterConfig {
        materializer_subject: "m".into(),
        lease_seconds: LEASE,
    };
    let store = Arc::new(KubeStore::new(
        cluster.operator.clone(),
        &ns,
        "demo",
        config.clone(),
    ));
    let items = ids(3);
    let _w = world(store.clone(), &items).await;
    // Two finished items of the project's history.
    let template = store.get(&items[0]).await.unwrap().unwrap();
    for i in 0..2 {
        let mut done = template.clone();
        done.id = format!("wi-done-{i}");
        done.materialization_key = format!("demo/CS-DONE-{i}@{i:040x}");
        done.state = State::Completed;
        done.lease = None;
        done.owner = String::new();
        store.import(Import::Record(done)).await.unwrap();
    }

    let (reader, writer) = reflector::store::<BuildWorkItem>();
    let api: Api<BuildWorkItem> = Api::namespaced(cluster.operator.clone(), &ns);
    let watch = tokio::spawn(
        watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .applied_objects()
            .for_each(|_| async {}),
    );
    tokio::time::timeout(timeout(), reader.wait_until_ready())
        .await
        .expect("the cache never synced")
        .unwrap();
    let cached =
        KubeStore::new(cluster.operator.clone(), &ns, "demo", config).with_item_cache(reader);

    let unfinished = ItemFilter {
        states: vec![State::Waiting, State::ReadyForBuilding, State::Building],
    };
    for filter in [
        ItemFilter::default(),
        unfinished.clone(),
        ItemFilter::state(State::Completed),
    ] {
        assert_eq!(
            sorted(cached.list(&filter).await.unwrap()),
            sorted(store.list(&filter).await.unwrap()),
            "{filter:?}"
        );
    }
    assert_eq!(cached.list(&ItemFilter::default()).await.unwrap().len(), 5);

    // A finished item's ledger is not read for a list of unfinished ones: made unreadable,
    // it fails a full list from the cache but not the filtered one.
    let items_api: Api<BuildWorkItem> = Api::namespaced(cluster.client.clone(), &ns);
    items_api
        .patch_status(
            &item_name("wi-done-0"),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"ledger": "{not json"}})),
        )
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + timeout();
    loop {
        match cached.list(&ItemFilter::default()).await {
            Err(e) => {
                assert!(e.to_string().contains("wi-done-0"), "{e}");
                break;
            }
            Ok(_) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the cache never saw the write"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    let listed = cached.list(&unfinished).await.unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    watch.abort();
    cluster.cleanup().await;
}
