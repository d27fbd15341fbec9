#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Three Job Site replicas against one Kubernetes work store (the double, or a
//! real cluster with KUBECONFIG) and fifty change sets: claims are
//! compare-and-swap on BuildWorkItem status, so every item is claimed once and
//! merged once without leader election. One replica is killed mid-build: after
//! its lease expires another replica recovers the item and finishes it, and
//! the killed replica's writes are all rejected when it comes back.

use std::sync::Arc;

use protobot_e2e::Cluster;
use protobot_jobsite::{
    lease::{Claim, Held},
    scripted::{LEASE, SiteOptions, ids, merges_on_main, site, world},
    site::SiteAction,
};
use protobot_lifecycle::State;
use protobot_stores::{AdapterConfig, ItemFilter, KubeStore, WorkStore};

const ITEMS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_claim_and_merge_fifty_change_sets_once_and_survive_a_killed_replica() {
    let cluster = Cluster::connect("replicas").await;
    let store = protobot_e2e::demo_store(&cluster);
    let items = ids(ITEMS);
    let w = world(store.clone(), &items).await;
    // replica-3 dies right after its first tests-pass, holding a lease.
    let killed = Arc::new(site(
        &w,
        SiteOptions {
            subject: "replica-3",
            inspector: false,
            faults: Some(Arc::new(|b: &str| b == "after:tests-pass")),
            ..SiteOptions::default()
        },
    ));
    let survivors: Vec<_> = ["replica-1", "replica-2"]
        .into_iter()
        .map(|subject| {
            let mut replica = site(
                &w,
                SiteOptions {
                    subject,
                    inspector: false,
                    ..SiteOptions::default()
                },
            );
            // The Project's default WIP limit: it counts every replica's active
            // items, including the one the killed replica holds until its lease expires.
            replica.wip_limit = protobot_api::project::DEFAULT_WIP_LIMIT as usize;
            Arc::new(replica)
        })
        .collect();
    // The killed replica: one pass, interrupted mid-build, then it is gone.
    let victim = {
        let site = killed.clone();
        tokio::spawn(async move { site.run_once().await })
    };
    let first = victim.await.unwrap().unwrap();
    let (victim_item, _) = first
        .iter()
        .find_map(|a| match a {
            SiteAction::Failed {
                work_item_id,
                error,
            } if error.contains("interrupted") => Some((work_item_id.clone(), error.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("replica-3 was not killed mid-build: {first:?}"));
    let victim_record = store.get(&victim_item).await.unwrap().unwrap();
    assert_eq!(victim_record.state, State::Inspecting);
    let stale = Claim::new(Held {
        work_item_id: victim_item.clone(),
        fencing_token: victim_record.lease.clone().unwrap().fencing_token,
        state: victim_record.state,
        contract_version: victim_record.contract_version,
    });
    // The survivors race over everything else until only the victim's item is left.
    let drive = |rounds: usize| {
        let handles: Vec<_> = survivors
            .iter()
            .map(|s| {
                let site = s.clone();
                tokio::spawn(async move {
                    let mut completed = 0usize;
                    for _ in 0..rounds {
                        let actions = site.run_once().await.unwrap();
                        let idle = actions.is_empty();
                        for a in actions {
                            match a {
                                SiteAction::Failed {
                                    error,
                                    work_item_id,
                                } => {
                                    panic!("{work_item_id}: {error}")
                                }
                                SiteAction::Built { report }
                                    if report.state == State::Completed =>
                                {
                                    completed += 1
                                }
                                _ => {}
                            }
                        }
                        if idle {
                            break;
                        }
                    }
                    completed
                })
            })
            .collect();
        handles
    };
    let mut completed = 0;
    for h in drive(ITEMS * 2) {
        completed += h.await.unwrap();
    }
    assert_eq!(completed, ITEMS - 1, "every item but the killed replica's");
    assert_eq!(
        store.get(&victim_item).await.unwrap().unwrap().state,
        State::Inspecting,
        "the killed replica's item waits for its lease to expire"
    );
    // The lease expires; a survivor recovers the item and finishes it.
    w.clock.advance(LEASE + 1);
    let mut recovered = 0;
    for h in drive(4) {
        recovered += h.await.unwrap();
    }
    assert_eq!(recovered, 1);
    let all = store.list(&ItemFilter::default()).await.unwrap();
    assert_eq!(all.len(), ITEMS);
    assert!(
        all.iter()
            .all(|r| r.state == State::Completed && r.lease.is_none())
    );
    assert_eq!(
        merges_on_main(&w.origin),
        items,
        "each item merged exactly once"
    );
    let audit = store.audit_events().await.unwrap();
    for id in &items {
        let claims = audit
            .iter()
            .filter(|e| e.operation == "claim" && &e.work_item_id == id && e.outcome == "allowed")
            .count();
        let expected = if *id == victim_item { 2 } else { 1 };
        assert_eq!(claims, expected, "{id} was claimed {claims} times");
    }
    // The killed replica comes back with its old claim: every write is refused.
    let before = store.audit_events().await.unwrap().len();
    let contract = w.contracts.0[&victim_item].clone();
    let repo = killed.repo_dir.clone();
    let engine = killed.engine.clone();
    let resumed = tokio::spawn(async move { engine.build(&stale, &contract, &repo).await })
        .await
        .unwrap();
    assert!(resumed.is_err(), "{resumed:?}");
    let after = store.audit_events().await.unwrap();
    assert!(after[before..].iter().all(|e| e.outcome != "allowed"));
    assert_eq!(merges_on_main(&w.origin), items);
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_cache_counts_items_by_state_and_keeps_no_ledger() {
    use protobot_controller::{
        metrics::StateCounts,
        operator::{CachedStates, state_cache},
    };
    use protobot_lifecycle::{Readiness, WorkItemRecord};
    use protobot_stores::Import;
    let cluster = Cluster::connect("state-cache").await;
    let store = KubeStore::new(
        cluster.operator.clone(),
        &cluster.namespace,
        "cache",
        AdapterConfig::default(),
    );
    for (n, state) in [
        State::ReadyForBuilding,
        State::ReadyForBuilding,
        State::Blocked,
        State::Completed,
    ]
    .into_iter()
    .enumerate()
    {
        let mut rec = WorkItemRecord::new(&format!("wi-cache-{n}"), "cache", state, 3);
        rec.readiness = Readiness::complete();
        store.import(Import::Record(rec)).await.unwrap();
    }
    let items: kube::Api<protobot_api::BuildWorkItem> =
        kube::Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let full = items.get("wi-cache-0").await.unwrap();
    assert!(
        full.status.as_ref().unwrap().ledger.is_some(),
        "the store keeps its ledger in the status"
    );
    let (reader, reflect) = state_cache(items);
    let reflect = tokio::spawn(reflect);
    // Ready means the initial list is in: every item created above.
    tokio::time::timeout(protobot_e2e::timeout(), reader.wait_until_ready())
        .await
        .expect("the cache syncs")
        .unwrap();
    assert_eq!(reader.state().len(), 4);
    let counts = CachedStates(reader.clone()).counts();
    assert_eq!(
        counts,
        vec![
            (State::ReadyForBuilding, 2),
            (State::Blocked, 1),
            (State::Completed, 1),
        ]
    );
    for item in reader.state() {
        let status = item.status.as_ref().unwrap();
        assert!(status.ledger.is_none() && status.conditions.is_empty());
        assert!(item.metadata.managed_fields.is_none());
        assert!(!item.spec.work_item_id.is_empty());
    }
    reflect.abort();
    cluster.cleanup().await;
}
