#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Kubernetes store as an operator sees it: items are real `BuildWorkItem`
//! objects whose typed status mirrors the ledger (what `kubectl get bwi`
//! shows), write conflicts and server errors are handled, and fencing tokens
//! survive a new store instance (an operator restart).

use jiff::{SignedDuration, Timestamp};
use kube::Api;
use protobot_api::{BuildWorkItem, LifecycleState};
use protobot_lifecycle::{
    AuthorizationContext, OperationEnvelope, Readiness, State, WorkItemRecord,
};
use protobot_stores::{AdapterConfig, Import, KubeStore, StoreError, WorkStore};
use protobot_testkit::{
    faults::{FaultRule, Verb},
    server::ApiServer,
};

fn now() -> Timestamp {
    "2026-09-18T12:00:00Z".parse().unwrap()
}

fn server() -> ApiServer {
    let server = ApiServer::new();
    server
        .register_crd_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../crds"))
        .unwrap();
    server
}

fn job_site() -> AuthorizationContext {
    AuthorizationContext {
        subject: "job-site-a".into(),
        role: "job-site".into(),
        project_id: "demo".into(),
        allowed_actions: vec!["claim".into()],
        allowed_refs: vec!["project:demo".into()],
        expires_at: Some(now() + SignedDuration::from_hours(1)),
        policy_version: "v1".into(),
        ..AuthorizationContext::default()
    }
}

fn claim(key: &str) -> OperationEnvelope {
    OperationEnvelope {
        operation: "claim".into(),
        actor_context_ref: "job-site".into(),
        work_item_id: "wi-1".into(),
        expected_state: Some("ready-for-building".into()),
        expected_contract_version: Some(1),
        idempotency_key: key.into(),
        ..OperationEnvelope::default()
    }
}

async fn seeded(server: &ApiServer) -> KubeStore {
    let store = KubeStore::new(
        server.client(),
        "default",
        "demo",
        AdapterConfig {
            materializer_subject: "m".into(),
            lease_seconds: 900,
        },
    );
    let mut rec = WorkItemRecord::new("wi-1", "demo", State::ReadyForBuilding, 1);
    rec.readiness = Readiness::complete();
    store.import(Import::Record(rec)).await.unwrap();
    store
}

#[tokio::test]
async fn a_claim_shows_in_the_typed_status_and_the_leased_condition() {
    let server = server();
    let store = seeded(&server).await;
    let r = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap();
    assert!(r.ok, "{:?}", r.error);
    let api: Api<BuildWorkItem> = Api::namespaced(server.client(), "default");
    let item = api.get("wi-1").await.unwrap();
    assert_eq!(item.spec.work_item_id, "wi-1");
    let status = item.status.unwrap();
    assert_eq!(status.state, LifecycleState::Building);
    assert_eq!(status.contract_version, 2);
    let lease = status.lease.unwrap();
    assert_eq!(lease.holder, "job-site-a");
    assert_eq!(lease.duration_seconds, 900);
    assert_eq!(lease.expires_at(), now() + SignedDuration::from_mins(15));
    assert!(
        status.conditions.iter().any(|c| c.type_ == "Leased"),
        "Leased condition mirrored"
    );
    assert!(status.ledger.is_some());
}

#[tokio::test]
async fn a_write_conflict_is_retried_against_fresh_objects() {
    let server = server();
    let store = seeded(&server).await;
    server.faults().inject(
        FaultRule::on(Verb::Update)
            .resource("buildworkitems")
            .status(409)
            .times(2),
    );
    let r = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap();
    assert!(r.ok, "{:?}", r.error);
    let rec = store.get("wi-1").await.unwrap().unwrap();
    assert_eq!(
        rec.contract_version, 2,
        "claimed exactly once despite the retries"
    );
    assert_eq!(store.audit_events().await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_server_error_is_unavailable_and_writes_no_transition() {
    let server = server();
    let store = seeded(&server).await;
    server.faults().inject(
        FaultRule::on(Verb::Update)
            .resource("buildworkitems")
            .status(500)
            .times(1),
    );
    let err = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    assert_eq!(
        store.get("wi-1").await.unwrap().unwrap().state,
        State::ReadyForBuilding
    );
    // The same key then applies once.
    let r = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap();
    assert!(r.ok && !r.decision.unwrap().replayed);
}

#[tokio::test]
async fn fencing_tokens_survive_a_restart() {
    let server = server();
    let first = seeded(&server).await;
    let t1 = first
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap()
        .decision
        .unwrap()
        .fencing_token_issued
        .unwrap();
    // A new store instance (operator restart) on another item of the same project.
    let second = KubeStore::new(server.client(), "default", "demo", AdapterConfig::default());
    let mut rec = WorkItemRecord::new("wi-2", "demo", State::ReadyForBuilding, 1);
    rec.readiness = Readiness::complete();
    second.import(Import::Record(rec)).await.unwrap();
    let mut env = claim("k2");
    env.work_item_id = "wi-2".into();
    let t2 = second
        .execute(Some(&job_site()), &env, now())
        .await
        .unwrap()
        .decision
        .unwrap()
        .fencing_token_issued
        .unwrap();
    assert_ne!(t1, t2);
}

#[tokio::test]
async fn commands_read_only_the_objects_they_touch() {
    // With every list failing, commands on an item still work: they fetch
    // their shards by name, so their cost does not grow with the project.
    let server = server();
    let store = seeded(&server).await;
    for n in 2..=20 {
        let mut rec = WorkItemRecord::new(&format!("wi-{n}"), "demo", State::ReadyForBuilding, 1);
        rec.readiness = Readiness::complete();
        store.import(Import::Record(rec)).await.unwrap();
    }
    server
        .faults()
        .inject(FaultRule::on(Verb::List).status(500));
    let r = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap();
    assert!(r.ok, "{:?}", r.error);
    let replay = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap();
    assert!(
        replay.decision.unwrap().replayed,
        "the key is found by name"
    );
    let mut other = claim("k1");
    other.work_item_id = "wi-2".into();
    let reused = store
        .execute(Some(&job_site()), &other, now())
        .await
        .unwrap();
    assert!(!reused.ok, "a key reused on another item conflicts");
    assert_eq!(
        store.get("wi-1").await.unwrap().unwrap().state,
        State::Building
    );
    assert_eq!(
        store.get("wi-2").await.unwrap().unwrap().state,
        State::ReadyForBuilding
    );
    // Calls that enumerate do list, and say so when they cannot.
    let err = store
        .list(&protobot_stores::ItemFilter::default())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    server.faults().clear();
    assert_eq!(
        store
            .list(&protobot_stores::ItemFilter::default())
            .await
            .unwrap()
            .len(),
        20
    );
}

#[tokio::test]
async fn enumerating_work_items_lists_items_and_never_the_key_claims() {
    // One key claim per command accumulates forever; the Job Site lists work
    // items on every pass, so those lists must not read the claims.
    let server = server();
    let store = seeded(&server).await;
    for n in 0..30 {
        let r = store
            .execute(Some(&job_site()), &claim(&format!("k{n}")), now())
            .await
            .unwrap();
        assert!(r.ok || n > 0, "{:?}", r.error);
    }
    server.clear_requests();
    server
        .faults()
        .inject(FaultRule::on(Verb::List).resource("configmaps").status(500));
    let items = store
        .list(&protobot_stores::ItemFilter::default())
        .await
        .unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].state, State::Building);
    assert_eq!(store.submission("none").await.unwrap(), None);
    let lists: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::List)
        .map(|r| r.plural.clone())
        .collect();
    assert!(
        lists.iter().all(|p| p == "buildworkitems") && !lists.is_empty(),
        "{lists:?}"
    );
    // Findings are ConfigMaps: that read lists them (by kind) and says so when
    // it cannot; so does the audit trail, which needs everything.
    let err = store.findings("run-1").await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    let err = store.audit_events().await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    server.faults().clear();
    assert!(store.findings("run-1").await.unwrap().is_empty());
    let claims = store
        .audit_events()
        .await
        .unwrap()
        .iter()
        .filter(|e| e.idempotency_key.starts_with('k'))
        .count();
    assert!(claims >= 1, "the claim's audit event is still read");
}

async fn key_claims(server: &ApiServer) -> usize {
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(server.client(), "default");
    maps.list(&kube::api::ListParams::default().labels("protobot.dev/wms-kind=key"))
        .await
        .unwrap()
        .items
        .len()
}

#[tokio::test]
async fn key_claims_of_a_deleted_work_item_are_collected_once_old_enough() {
    let server = server();
    let store = seeded(&server).await;
    let mut other = WorkItemRecord::new("wi-2", "demo", State::ReadyForBuilding, 1);
    other.readiness = Readiness::complete();
    store.import(Import::Record(other)).await.unwrap();
    let mut on_other = claim("k2");
    on_other.work_item_id = "wi-2".into();
    for op in [claim("k1"), on_other.clone()] {
        let r = store.execute(Some(&job_site()), &op, now()).await.unwrap();
        assert!(r.ok, "{:?}", r.error);
    }
    assert_eq!(key_claims(&server).await, 2);
    // Nothing is orphaned while every item exists.
    let later = jiff::Timestamp::now() + SignedDuration::from_hours(2);
    let hour = std::time::Duration::from_secs(3600);
    let swept = store.collect_orphaned_claims(later, hour).await.unwrap();
    assert_eq!(swept.deleted + swept.too_young, 0, "{swept:?}");

    // An administrator deletes the first item (finished, in real life).
    let items: Api<BuildWorkItem> = Api::namespaced(server.client(), "default");
    items
        .delete("wi-1", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    // Too young: a command may sit between its claim and its item's creation.
    let swept = store
        .collect_orphaned_claims(jiff::Timestamp::now(), hour)
        .await
        .unwrap();
    assert_eq!((swept.deleted, swept.too_young), (0, 1), "{swept:?}");
    // A failing delete says so and removes nothing.
    server.faults().inject(
        FaultRule::on(Verb::Delete)
            .resource("configmaps")
            .status(500),
    );
    let err = store
        .collect_orphaned_claims(later, hour)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
    server.faults().clear();
    assert_eq!(key_claims(&server).await, 2);

    let swept = store.collect_orphaned_claims(later, hour).await.unwrap();
    assert_eq!((swept.deleted, swept.too_young), (1, 0), "{swept:?}");
    assert_eq!(key_claims(&server).await, 1);
    // The other item's key still replays; the deleted item's key is evaluated afresh.
    let replay = store
        .execute(Some(&job_site()), &on_other, now())
        .await
        .unwrap();
    assert!(replay.decision.unwrap().replayed);
    let again = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap();
    assert!(!again.ok, "the item is gone");
    assert!(!again.decision.is_some_and(|d| d.replayed));
    // Idempotent: a second sweep finds nothing more of wi-1's.
    let swept = store.collect_orphaned_claims(later, hour).await.unwrap();
    assert_eq!(swept.deleted, 0, "{swept:?}");
}

fn ledger_of(item: &BuildWorkItem) -> serde_json::Value {
    serde_json::from_str(item.status.as_ref().unwrap().ledger.as_deref().unwrap()).unwrap()
}

#[tokio::test]
async fn a_long_build_keeps_its_ledger_bounded_and_every_old_key_replays() {
    // A build renews its lease many times; each renewal leaves a result and
    // an audit event. The item keeps the newest; older ones move to their key
    // claims, where replays still find them.
    let server = server();
    let store = seeded(&server).await;
    let job_site = || AuthorizationContext {
        allowed_actions: vec!["claim".into(), "renew-lease".into()],
        ..job_site()
    };
    let claimed = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap();
    let fence = claimed.decision.unwrap().fencing_token_issued.unwrap();
    let renew = |n: u64| OperationEnvelope {
        operation: "renew-lease".into(),
        actor_context_ref: "job-site".into(),
        work_item_id: "wi-1".into(),
        expected_state: Some("building".into()),
        expected_contract_version: Some(2 + n),
        idempotency_key: format!("renew-{n}"),
        fencing_token: fence.clone(),
        ..OperationEnvelope::default()
    };
    let mut first = None;
    let renewals = 150;
    for n in 0..renewals {
        let r = store
            .execute(Some(&job_site()), &renew(n), now())
            .await
            .unwrap();
        assert!(r.ok, "renewal {n}: {:?}", r.error);
        if n == 0 {
            first = Some(r);
        }
    }
    let api: Api<BuildWorkItem> = Api::namespaced(server.client(), "default");
    let item = api.get("wi-1").await.unwrap();
    let ledger = ledger_of(&item);
    let results = ledger["idempotency"].as_object().unwrap().len();
    let events = ledger["audit"].as_array().unwrap().len();
    assert!(
        results <= 64 && events <= 64,
        "{results} results, {events} events"
    );
    assert!(
        ledger["archived_below"].as_u64().unwrap() > 64,
        "older results were archived: {ledger}"
    );
    // Every command is still accounted for, once, in order.
    let audit = store.audit_events().await.unwrap();
    assert_eq!(audit.len() as u64, renewals + 1);
    assert_eq!(audit[0].idempotency_key, "k1");
    assert_eq!(audit[1].idempotency_key, "renew-0");
    assert_eq!(
        audit.last().unwrap().idempotency_key,
        format!("renew-{}", renewals - 1)
    );
    // The oldest renewal replays its original result instead of renewing again.
    let replay = store
        .execute(Some(&job_site()), &renew(0), now())
        .await
        .unwrap();
    let replayed = replay.decision.clone().unwrap();
    assert!(replayed.replayed, "{replay:?}");
    let original = first.unwrap().decision.unwrap();
    assert_eq!(replayed.after, original.after);
    assert_eq!(
        store.get("wi-1").await.unwrap().unwrap().contract_version,
        2 + renewals,
        "the replay changed nothing"
    );
    // Reusing an archived key with another request is still a conflict.
    let mut other = renew(0);
    other.expected_contract_version = Some(2 + renewals);
    let reused = store
        .execute(Some(&job_site()), &other, now())
        .await
        .unwrap();
    assert!(
        !reused.ok,
        "an archived key reused with a new fingerprint conflicts"
    );
}
