#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The BuildWorkItem controller (`protobot_controller::build_items`) on the API server (the
//! double, or a real cluster with KUBECONFIG), running as the operator's identity: it puts
//! the unfinished-work finalizer on each item, wakes the item's project dispatcher while the
//! item is ready, and takes the finalizer off once the item is completed, item by item.

use std::{sync::Arc, time::Duration};

use kube::{Api, ResourceExt};
use protobot_api::BuildWorkItem;
use protobot_controller::{
    build_items::{ItemContext, run},
    jobsite::FINALIZER,
};
use protobot_e2e::{Cluster, timeout};
use protobot_jobsite::{
    builds::Builds,
    scripted::{SiteOptions, ids, merges_on_main, site, world},
};
use protobot_stores::kubernetes::item_name;

async fn until<F: Fn(&BuildWorkItem) -> bool>(
    items: &Api<BuildWorkItem>,
    name: &str,
    what: &str,
    ok: F,
) {
    let deadline = std::time::Instant::now() + timeout();
    loop {
        let item = items.get(name).await.unwrap();
        if ok(&item) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name}: {what}; finalizers {:?}, state {:?}",
            item.metadata.finalizers,
            item.status.as_ref().map(|s| s.state)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_item_is_guarded_until_it_completes_and_a_ready_one_wakes_its_project() {
    let cluster = Cluster::connect("items").await;
    let ns = cluster.namespace.clone();
    let store = protobot_e2e::demo_store(&cluster);
    let items = ids(2);
    let w = world(store.clone(), &items).await;

    let (builds, _finished) = Builds::new();
    let (wake, mut woken) = tokio::sync::mpsc::unbounded_channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = tokio::spawn(run(
        cluster.operator.clone(),
        Some(ns.clone()),
        ItemContext::new(
            cluster.operator.clone(),
            "replica-1".into(),
            builds,
            wake,
            None,
        ),
        async move {
            let _ = stopped.await;
        },
    ));

    // A ready item wakes its project's dispatcher.
    let key = tokio::time::timeout(timeout(), woken.recv())
        .await
        .expect("no wake-up for the ready items")
        .unwrap();
    assert_eq!(key, (ns.clone(), "demo".to_owned()));

    // Every unfinished item gets the finalizer.
    let api: Api<BuildWorkItem> = Api::namespaced(cluster.client.clone(), &ns);
    for id in &items {
        until(
            &api,
            &item_name(id),
            "no finalizer on an unfinished item",
            |i| i.finalizers().iter().any(|f| f == FINALIZER),
        )
        .await;
    }

    // Built to completion by a Job Site: the finalizer comes off each, and nothing else.
    let replica = Arc::new(site(
        &w,
        SiteOptions {
            subject: "replica-1",
            inspector: false,
            capacity: Some(Arc::new(tokio::sync::Semaphore::new(2))),
            wip_limit: 2,
            ..SiteOptions::default()
        },
    ));
    tokio::spawn(async move { replica.run_until_idle().await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(merges_on_main(&w.origin).len(), items.len());
    for id in &items {
        until(
            &api,
            &item_name(id),
            "the finalizer stayed on a completed item",
            |i| !i.finalizers().iter().any(|f| f == FINALIZER),
        )
        .await;
    }

    let _ = stop.send(());
    tokio::time::timeout(timeout(), controller)
        .await
        .expect("the controller did not stop when told to")
        .unwrap();
    cluster.cleanup().await;
}
