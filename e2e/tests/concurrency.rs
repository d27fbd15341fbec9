#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! One Job Site replica with eight build slots and sixteen ready items whose scripted
//! Workers each take five seconds (the double, or a real cluster with KUBECONFIG): a pass
//! claims eight items, no more, and builds them at once, their Worker runs overlapping,
//! then the next pass takes the other eight; every item is merged exactly once and every
//! slot comes back. The wall-time ratio against one item alone is measured by
//! `make bench` (bench_operator), not asserted here.

use std::{sync::Arc, time::Duration};

use protobot_e2e::Cluster;
use protobot_jobsite::{
    builds::Builds,
    scripted::{LEASE, SiteOptions, ids, merges_on_main, site, world},
    site::SiteAction,
};
use protobot_lifecycle::State;
use protobot_stores::WorkStore;

const ITEMS: usize = 16;
const SLOTS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_build_slots_build_eight_items_at_once_and_all_sixteen_once() {
    let cluster = Cluster::connect("concurrency").await;
    let store = protobot_e2e::demo_store(&cluster);
    let items = ids(ITEMS);
    let w = world(store.clone(), &items).await;
    let slots = Arc::new(tokio::sync::Semaphore::new(SLOTS));
    let replica = Arc::new(site(
        &w,
        SiteOptions {
            subject: "replica-1",
            inspector: false,
            worker_delay: Some(Duration::from_secs(5)),
            capacity: Some(Arc::clone(&slots)),
            wip_limit: ITEMS,
            ..SiteOptions::default()
        },
    ));
    let first = {
        let site = replica.clone();
        tokio::spawn(async move { site.run_once().await })
            .await
            .unwrap()
            .unwrap()
    };
    let claimed = first
        .iter()
        .filter(|a| matches!(a, SiteAction::Claimed { .. }))
        .count();
    assert_eq!(
        claimed, SLOTS,
        "one pass claims as many items as there are slots: {first:?}"
    );
    let peak = replica.engine.executor.peak_in_flight();
    assert!(
        peak >= SLOTS,
        "the {SLOTS} builds ran their Workers at once (peak {peak} runs in flight)"
    );
    assert_eq!(slots.available_permits(), SLOTS, "every slot came back");
    let rest = {
        let site = replica.clone();
        tokio::spawn(async move { site.run_until_idle().await })
            .await
            .unwrap()
            .unwrap()
    };
    for action in first.iter().chain(&rest) {
        if let SiteAction::Failed {
            work_item_id,
            error,
        } = action
        {
            panic!("{work_item_id}: {error}");
        }
    }
    for id in &items {
        let record = store.get(id).await.unwrap().unwrap();
        assert_eq!(record.state, State::Completed, "{id}");
    }
    let merges = merges_on_main(&w.origin);
    assert_eq!(
        merges.len(),
        ITEMS,
        "each item merged exactly once: {merges:?}"
    );
    // Each landing moved main under the builds still in flight; they merged it in and
    // reran the integration gate, but their Workers' work stood: one Worker B run per
    // item, so the builds did not land one Worker cycle apart.
    let worker_b_runs = replica
        .engine
        .executor
        .runs()
        .iter()
        .filter(|r| r.role == protobot_jobsite::executor::SandboxRole::WorkerB)
        .count();
    assert_eq!(worker_b_runs, ITEMS, "Worker B reran after a landing race");
    assert_eq!(slots.available_permits(), SLOTS);
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_told_to_stop_mid_build_stops_at_a_boundary_and_another_completes_the_item_once()
{
    let cluster = Cluster::connect("shutdown").await;
    let store = protobot_e2e::demo_store(&cluster);
    let items = ids(1);
    let w = world(store.clone(), &items).await;
    let stop = protobot_jobsite::engine::StopSignal::new();
    let stopping = Arc::new(site(
        &w,
        SiteOptions {
            subject: "replica-1",
            inspector: false,
            worker_delay: Some(Duration::from_secs(3)),
            capacity: Some(Arc::new(tokio::sync::Semaphore::new(SLOTS))),
            stop: Some(stop.clone()),
            ..SiteOptions::default()
        },
    ));
    let pass = {
        let site = stopping.clone();
        tokio::spawn(async move { site.run_once().await })
    };
    // SIGTERM while Worker A runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while stopping.engine.executor.runs().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no Worker ever ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.raise();
    let actions = pass.await.unwrap().unwrap();
    let stopped = actions
        .iter()
        .any(|a| matches!(a, SiteAction::Failed { error, .. } if error.contains("shutting down")));
    assert!(stopped, "the build stopped at a boundary: {actions:?}");
    // A stopping Job Site claims nothing more.
    let again = {
        let site = stopping.clone();
        tokio::spawn(async move { site.run_once().await })
            .await
            .unwrap()
            .unwrap()
    };
    assert!(
        !again
            .iter()
            .any(|a| matches!(a, SiteAction::Claimed { .. })),
        "{again:?}"
    );
    let record = store.get(&items[0]).await.unwrap().unwrap();
    assert_eq!(record.state, State::Building);
    assert_eq!(
        record.owner, "replica-1",
        "the lease lapses, it is not taken over early"
    );
    // The lease lapses; another replica recovers the item and completes it once.
    w.clock.advance(LEASE + 1);
    let other = Arc::new(site(
        &w,
        SiteOptions {
            subject: "replica-2",
            inspector: false,
            ..SiteOptions::default()
        },
    ));
    let done = {
        let site = other.clone();
        tokio::spawn(async move { site.run_until_idle().await })
            .await
            .unwrap()
            .unwrap()
    };
    assert!(
        done.iter()
            .any(|a| matches!(a, SiteAction::RecoveredLease { .. })),
        "{done:?}"
    );
    assert_eq!(
        store.get(&items[0]).await.unwrap().unwrap().state,
        State::Completed
    );
    assert_eq!(merges_on_main(&w.origin).len(), 1, "merged exactly once");
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatch_returns_while_its_builds_run_and_the_next_fills_each_freed_slot() {
    const N: usize = 4;
    const DISPATCH_SLOTS: usize = 2;
    let cluster = Cluster::connect("dispatch").await;
    let store = protobot_e2e::demo_store(&cluster);
    let items = ids(N);
    let w = world(store.clone(), &items).await;
    let slots = Arc::new(tokio::sync::Semaphore::new(DISPATCH_SLOTS));
    let replica = Arc::new(site(
        &w,
        SiteOptions {
            subject: "replica-1",
            inspector: false,
            worker_delay: Some(Duration::from_secs(3)),
            capacity: Some(Arc::clone(&slots)),
            wip_limit: N,
            ..SiteOptions::default()
        },
    ));
    let (builds, mut finished) = Builds::new();
    let first = replica.dispatch(&builds, "demo").await.unwrap();
    let claimed: Vec<_> = first
        .iter()
        .filter_map(|a| match a {
            SiteAction::Claimed { work_item_id } => Some(work_item_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(claimed.len(), DISPATCH_SLOTS, "{first:?}");
    // The dispatch returned with its builds still running (each Worker takes 3 s).
    assert!(!first.iter().any(|a| matches!(a, SiteAction::Built { .. })));
    assert_eq!(builds.len(), DISPATCH_SLOTS);
    for id in &claimed {
        assert!(builds.is_running("demo", id));
    }
    // No free slot: the next dispatch claims nothing, and resumes none of the items
    // this replica holds, because they are building here.
    let second = replica.dispatch(&builds, "demo").await.unwrap();
    assert!(second.is_empty(), "{second:?}");
    assert_eq!(builds.len(), DISPATCH_SLOTS);

    // Each finished build frees a slot that the next dispatch fills, until every item
    // is done.
    let mut done = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(240);
    while done.len() < N {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let f = tokio::time::timeout(left, finished.recv())
            .await
            .unwrap_or_else(|_| panic!("only {done:?} finished"))
            .unwrap();
        match &f.action {
            SiteAction::Built { report } => assert_eq!(report.state, State::Completed),
            other => panic!("{}: {other:?}", f.work_item_id),
        }
        done.push(f.work_item_id);
        let next = replica.dispatch(&builds, "demo").await.unwrap();
        assert!(
            builds.len() <= DISPATCH_SLOTS,
            "never more builds than slots: {next:?}"
        );
    }
    builds.drained().await;
    done.sort();
    let mut expected = items.clone();
    expected.sort();
    assert_eq!(done, expected, "every item built once");
    assert_eq!(
        merges_on_main(&w.origin).len(),
        N,
        "each merged exactly once"
    );
    assert_eq!(
        slots.available_permits(),
        DISPATCH_SLOTS,
        "every slot came back"
    );
    cluster.cleanup().await;
}
