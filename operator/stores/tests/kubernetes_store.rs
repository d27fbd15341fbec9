#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Kubernetes store as an operator sees it: items are real `BuildWorkItem`
//! objects whose typed status mirrors the ledger (what `kubectl get bwi`
//! shows), write conflicts and server errors are handled, and fencing tokens
//! survive a new store instance (an operator restart). Each failure is the
//! `StoreError` that says what happened: a failed API call, contention, a
//! ledger that does not decode, an object the store did not write.

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

/// A failed API server call ([`StoreError::Backend`], transient) caused by a `kube::Error`.
fn assert_backend_failure(err: &StoreError) {
    assert!(
        matches!(err, StoreError::Backend { .. }) && err.is_transient(),
        "{err}"
    );
    let source = std::error::Error::source(err).expect("a backend failure has a cause");
    assert!(
        source.downcast_ref::<kube::Error>().is_some(),
        "the cause is the API server's: {source:?}"
    );
}

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
    assert_backend_failure(&err);
    assert!(
        matches!(
            std::error::Error::source(&err).and_then(|s| s.downcast_ref::<kube::Error>()),
            Some(kube::Error::Api(status)) if status.code == 500
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("failed to write the status of work item wi-1"),
        "{err}"
    );
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
    assert_backend_failure(&err);
    assert!(
        err.to_string().contains("failed to list build work items"),
        "{err}"
    );
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
    assert_backend_failure(&err);
    let err = store.audit_events().await.unwrap_err();
    assert_backend_failure(&err);
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
    assert_backend_failure(&err);
    assert!(
        err.to_string().contains("failed to delete key claim"),
        "{err}"
    );
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

// === The typed status: conditions, transition times, every field, older statuses ===

fn job_site_with(actions: &[&str]) -> AuthorizationContext {
    AuthorizationContext {
        allowed_actions: actions.iter().map(|a| a.to_string()).collect(),
        ..job_site()
    }
}

fn fenced(operation: &str, version: u64, token: &str, key: &str) -> OperationEnvelope {
    OperationEnvelope {
        operation: operation.into(),
        expected_state: Some("building".into()),
        expected_contract_version: Some(version),
        fencing_token: token.into(),
        ..claim(key)
    }
}

async fn claimed(server: &ApiServer) -> (KubeStore, String) {
    let store = seeded(server).await;
    let r = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap();
    assert!(r.ok, "{:?}", r.error);
    let token = r.decision.unwrap().fencing_token_issued.unwrap();
    (store, token.into())
}

async fn status_of(server: &ApiServer, name: &str) -> protobot_api::BuildWorkItemStatus {
    let api: Api<BuildWorkItem> = Api::namespaced(server.client(), "default");
    api.get(name).await.unwrap().status.unwrap()
}

fn condition<'a>(
    status: &'a protobot_api::BuildWorkItemStatus,
    type_: &str,
) -> &'a protobot_api::Condition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {:?}", status.conditions))
}

#[tokio::test]
async fn a_renewal_keeps_the_leased_transition_time_and_moves_the_renew_time() {
    let server = server();
    let (store, token) = claimed(&server).await;
    let at_claim = status_of(&server, "wi-1").await;
    let later = now() + SignedDuration::from_mins(5);
    let r = store
        .execute(
            Some(&job_site_with(&["claim", "renew-lease"])),
            &fenced("renew-lease", 2, &token, "k2"),
            later,
        )
        .await
        .unwrap();
    assert!(r.ok, "{:?}", r.error);
    let status = status_of(&server, "wi-1").await;
    assert_eq!(status.contract_version, 3);
    let leased = condition(&status, "Leased");
    assert_eq!(leased.status, protobot_api::ConditionStatus::True);
    assert_eq!(
        leased.last_transition_time.0,
        now(),
        "a renewal is not a transition: the claim's time stays"
    );
    assert_eq!(leased.observed_generation, status.observed_generation);
    let lease = status.lease.clone().unwrap();
    assert_eq!(lease.acquire_time.0, now(), "acquired by the claim");
    assert_eq!(lease.renew_time.0, later, "renewed at the evaluation time");
    assert_eq!(lease.expires_at(), later + SignedDuration::from_mins(15));
    let versions: Vec<_> = status
        .contract_versions
        .iter()
        .map(|e| (e.version, e.command, e.time.0))
        .collect();
    assert_eq!(
        versions,
        vec![
            (2, protobot_api::common::LifecycleCommand::Claim, now()),
            (3, protobot_api::common::LifecycleCommand::RenewLease, later),
        ]
    );
    // The other conditions did not move either.
    for type_ in ["Blocked", "Stalled", "Ready"] {
        assert_eq!(
            condition(&status, type_).last_transition_time,
            condition(&at_claim, type_).last_transition_time,
            "{type_}"
        );
    }
}

#[tokio::test]
async fn a_spec_question_writes_blocked_stalled_and_not_ready() {
    let server = server();
    let (store, token) = claimed(&server).await;
    let later = now() + SignedDuration::from_mins(1);
    let mut env = fenced("raise-spec-question", 2, &token, "k2");
    env.payload = Some(serde_json::json!({"question": "which timeout applies?"}));
    let r = store
        .execute(
            Some(&job_site_with(&["claim", "raise-spec-question"])),
            &env,
            later,
        )
        .await
        .unwrap();
    assert!(r.ok, "{:?}", r.error);
    let status = status_of(&server, "wi-1").await;
    assert_eq!(status.state, LifecycleState::Blocked);
    assert_eq!(
        status.block_reason.as_deref(),
        Some("which timeout applies?")
    );
    let blocked = condition(&status, "Blocked");
    assert_eq!(blocked.status, protobot_api::ConditionStatus::True);
    assert_eq!(blocked.reason, "BlockRecorded");
    assert_eq!(blocked.message, "which timeout applies?");
    assert_eq!(blocked.last_transition_time.0, later);
    let stalled = condition(&status, "Stalled");
    assert_eq!(stalled.status, protobot_api::ConditionStatus::True);
    let ready = condition(&status, "Ready");
    assert_eq!(
        (ready.status, ready.reason.as_str()),
        (protobot_api::ConditionStatus::False, "Blocked")
    );
    // The lease was released: no lease, Leased=False from the question's time.
    assert!(status.lease.is_none());
    assert!(status.owner.is_none());
    let leased = condition(&status, "Leased");
    assert_eq!(
        (leased.status, leased.reason.as_str()),
        (protobot_api::ConditionStatus::False, "NotLeased")
    );
    assert_eq!(leased.last_transition_time.0, later);
}

#[tokio::test]
async fn fencing_tokens_are_fence_n_from_the_projects_counter() {
    // What the CRD (`status.lease.fencingToken`) and docs/kubernetes-work-store.md say.
    let server = server();
    let (store, first) = claimed(&server).await;
    let mut rec = WorkItemRecord::new("wi-2", "demo", State::ReadyForBuilding, 1);
    rec.readiness = Readiness::complete();
    store.import(Import::Record(rec)).await.unwrap();
    let mut env = claim("k2");
    env.work_item_id = "wi-2".into();
    let second = store
        .execute(Some(&job_site()), &env, now())
        .await
        .unwrap()
        .decision
        .unwrap()
        .fencing_token_issued
        .map(String::from)
        .unwrap();
    let n = |token: &str| -> u64 {
        token
            .strip_prefix("fence-")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{token:?} is not fence-<n>"))
    };
    assert!(
        n(&second) > n(&first),
        "one counter per project: {first} then {second}"
    );
    assert_eq!(
        status_of(&server, "wi-2")
            .await
            .lease
            .unwrap()
            .fencing_token,
        second
    );
}

/// A status with every field the CRD documents set, nested ones included.
fn full_status() -> protobot_api::BuildWorkItemStatus {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use protobot_api::{
        Lease,
        build_work_item::{
            CompletionEvidence, ContractVersionEntry, CycleOutcome, CycleRecord, DependencyStatus,
            GitMutation, MergeEnvelope, Readiness as StatusReadiness, Reconciliation,
            ReconciliationStatus, StageUsage, TierUsage, UsageAmount, UsageStage, UsageStatus,
        },
        common::{LifecycleCommand, ModelTier},
    };
    let at = |s: i64| Time(now() + SignedDuration::from_secs(s));
    let envelope = MergeEnvelope {
        product_tree_digest: "sha256:tree".into(),
        inspection_run_id: "ir-1".into(),
        integration_head: "b".repeat(40),
        target: "main".into(),
        contract_version: 8,
        merge_commit: Some("c".repeat(40)),
    };
    let mut status = protobot_api::BuildWorkItemStatus::materialized(LifecycleState::Completed);
    status.contract_version = 9;
    status.contract_versions = vec![ContractVersionEntry {
        version: 9,
        command: LifecycleCommand::RecordMerge,
        state: LifecycleState::Completed,
        actor: Some("job-site-a".into()),
        idempotency_key: Some("k9".into()),
        time: at(9),
    }];
    status.owner = Some("job-site-a".into());
    status.lease = Some(Lease {
        holder: "job-site-a".into(),
        fencing_token: "fence-3".into(),
        acquire_time: at(1),
        renew_time: at(2),
        duration_seconds: 900,
    });
    status.readiness = Some(StatusReadiness {
        contract_complete: true,
        source_immutable: true,
        specification_validated: true,
        requirement_references_valid: true,
        pipeline_entry_satisfied: true,
        impact_dispositioned: true,
        policy_compatible: true,
        unresolved_reasons: vec!["none left".into()],
    });
    status.dependencies = vec![DependencyStatus {
        id: "wi-0".into(),
        state: Some(LifecycleState::Completed),
    }];
    status.block_reason = Some("an old question".into());
    status.active_resolution_submission_id = Some("sub-1".into());
    status.inspection_run_sealed = true;
    status.findings_terminal = true;
    status.final_tests_passed = true;
    status.expected_merge = Some(envelope.clone());
    status.reconciliation = Some(Reconciliation {
        status: ReconciliationStatus::MergeRecorded,
        git_mutation: GitMutation::Merged,
        merge_envelope: Some(envelope.clone()),
        observed_time: Some(at(8)),
    });
    status.branch = Some("wi/wi-1-build".into());
    status.cycles = vec![CycleRecord {
        cycle: 1,
        tier: ModelTier::T2,
        outcome: CycleOutcome::Passed,
        candidate_commit: Some("b".repeat(40)),
        start_time: at(3),
        end_time: Some(at(4)),
    }];
    status.escalation_tier = Some(ModelTier::T2);
    status.candidate_commit = Some("b".repeat(40));
    status.merge_commit = Some("c".repeat(40));
    status.completion = Some(CompletionEvidence {
        merge_envelope: envelope,
        verified_on_target: true,
        completed_time: at(9),
    });
    status.observed_generation = Some(1);
    let spent = UsageAmount {
        calls: 3,
        calls_without_usage: 1,
        input_tokens: 1000,
        output_tokens: 300,
        cache_read_tokens: 400,
        cache_write_tokens: 50,
        reasoning_tokens: 100,
        cost_microdollars: Some(4200),
        unpriced_calls: 0,
        cost: "$0.004200".into(),
    };
    status.usage = Some(UsageStatus {
        runs: 2,
        total: spent.clone(),
        stages: vec![StageUsage {
            stage: UsageStage::WorkerB,
            spent: spent.clone(),
        }],
        tiers: vec![TierUsage {
            tier: ModelTier::T2,
            spent,
        }],
    });
    status.ledger = Some("{}".into());
    status.mirror_conditions(Some(1), now());
    status
}

/// Every property path of a structural schema (`a.b`, `a[].b`), with the schema's own
/// maps (`x-kubernetes-preserve-unknown-fields`) as leaves.
fn schema_paths(schema: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
        for (key, sub) in props {
            let path = format!("{prefix}.{key}");
            out.push(path.clone());
            schema_paths(sub, &path, out);
        }
    }
    if let Some(items) = schema.get("items") {
        schema_paths(items, &format!("{prefix}[]"), out);
    }
}

fn has_path(value: &serde_json::Value, path: &str) -> bool {
    let mut current = vec![value];
    for part in path.trim_start_matches('.').split('.') {
        let (key, each) = match part.strip_suffix("[]") {
            Some(key) => (key, true),
            None => (part, false),
        };
        let mut next = Vec::new();
        for v in current {
            let Some(child) = v.get(key) else { continue };
            if each {
                next.extend(child.as_array().into_iter().flatten());
            } else {
                next.push(child);
            }
        }
        current = next;
    }
    !current.is_empty()
}

#[tokio::test]
async fn every_documented_status_field_round_trips_through_a_write_and_a_read() {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(BuildWorkItem::crd()).unwrap();
    let schema = crd
        .pointer("/spec/versions/0/schema/openAPIV3Schema/properties/status")
        .unwrap();
    let mut paths = Vec::new();
    schema_paths(schema, "", &mut paths);
    let full = full_status();
    let written = serde_json::to_value(&full).unwrap();
    let missing: Vec<_> = paths.iter().filter(|p| !has_path(&written, p)).collect();
    assert!(
        missing.is_empty(),
        "the test's status leaves documented fields unset: {missing:?}"
    );

    // Through the API (the double prunes what the schema does not declare and validates
    // the rest, as kube-apiserver does) and back through the store's own read.
    let server = server();
    let store = seeded(&server).await;
    let api: Api<BuildWorkItem> = Api::namespaced(server.client(), "default");
    let mut object = api.get("wi-1").await.unwrap();
    let ledger = object.status.as_ref().unwrap().ledger.clone();
    object.status = Some(protobot_api::BuildWorkItemStatus {
        ledger: ledger.clone(),
        ..full.clone()
    });
    let pp = kube::api::PostParams::default();
    api.replace_status("wi-1", &pp, &object).await.unwrap();
    let raw = server
        .object("protobot.dev", "buildworkitems", "default", "wi-1")
        .unwrap();
    let read = protobot_stores::kubernetes::status::PreviousStatus::decode(raw.get("status"));
    assert_eq!(
        read,
        protobot_stores::kubernetes::status::PreviousStatus::Typed(Box::new(
            protobot_api::BuildWorkItemStatus { ledger, ..full }
        ))
    );
    // The store still reads its record from that object.
    assert_eq!(
        store.get("wi-1").await.unwrap().unwrap().state,
        State::ReadyForBuilding
    );
}

/// The BuildWorkItem CRD with a status schema that keeps whatever it is given, standing
/// for the schema an older version stored its objects under (etcd keeps an object as it
/// was written; kube-apiserver validates only on writes).
fn permissive_crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    let mut crd = serde_json::to_value(BuildWorkItem::crd()).unwrap();
    *crd.pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/status")
        .unwrap() = serde_json::json!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    });
    serde_json::from_value(crd).unwrap()
}

/// Writes `status` as the item's raw status (beside its current ledger).
async fn write_raw_status(server: &ApiServer, mut status: serde_json::Value) {
    use kube::api::{ApiResource, DynamicObject};
    let api: Api<DynamicObject> = Api::namespaced_with(
        server.client(),
        "default",
        &ApiResource::erase::<BuildWorkItem>(&()),
    );
    let mut object = api.get("wi-1").await.unwrap();
    status["ledger"] = object.data["status"]["ledger"].clone();
    object.data["status"] = status;
    api.replace_status("wi-1", &kube::api::PostParams::default(), &object)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_status_written_by_the_previous_version_is_read_and_its_times_kept() {
    // What the previous version's hand-built mirror wrote for a claimed item (the lease
    // renewTime derived from the expiry, a Leased condition without observedGeneration, no
    // Blocked/Stalled/Ready): it decodes, and the next write keeps the Leased transition.
    let server = server();
    let (store, token) = claimed(&server).await;
    write_raw_status(
        &server,
        serde_json::json!({
            "state": "building",
            "contractVersion": 2,
            "inspectionRunSealed": false,
            "findingsTerminal": false,
            "finalTestsPassed": false,
            "owner": "job-site-a",
            "lease": {
                "holder": "job-site-a",
                "fencingToken": token,
                "acquireTime": now().to_string(),
                "renewTime": now().to_string(),
                "durationSeconds": 900,
            },
            "conditions": [{
                "type": "Leased",
                "status": "True",
                "reason": "LeaseHeld",
                "message": "held by job-site-a",
                "lastTransitionTime": now().to_string(),
            }],
        }),
    )
    .await;
    let later = now() + SignedDuration::from_mins(5);
    let r = store
        .execute(
            Some(&job_site_with(&["claim", "renew-lease"])),
            &fenced("renew-lease", 2, &token, "k2"),
            later,
        )
        .await
        .unwrap();
    assert!(r.ok, "{:?}", r.error);
    let status = status_of(&server, "wi-1").await;
    assert_eq!(
        condition(&status, "Leased").last_transition_time.0,
        now(),
        "the old Leased transition time is kept"
    );
    assert_eq!(status.lease.as_ref().unwrap().acquire_time.0, now());
    assert_eq!(
        status.lease.as_ref().unwrap().expires_at(),
        later + SignedDuration::from_mins(15)
    );
    assert_eq!(condition(&status, "Ready").reason, "InProgress");
}

#[tokio::test]
async fn a_status_this_version_cannot_decode_is_rebuilt_from_the_ledger() {
    let server = ApiServer::new();
    server.register_crd(&permissive_crd()).unwrap();
    let (store, token) = claimed(&server).await;
    // A mirror in a shape this version does not know (a tier name and a lease without a
    // holder, as an older schema might have allowed).
    write_raw_status(
        &server,
        serde_json::json!({
            "state": "building",
            "contractVersion": 2,
            "lease": {"fencingToken": token, "renewTime": "yesterday"},
            "cycles": [{"cycle": 1, "tier": "premium", "outcome": "passed"}],
            "fenceCounter": 7,
        }),
    )
    .await;
    // Reads do not fail on it.
    let rec = store.get("wi-1").await.unwrap().unwrap();
    assert_eq!(rec.state, State::Building);
    assert_eq!(store.list(&Default::default()).await.unwrap().len(), 1);
    // The next command's write replaces it with a status built from the record.
    let later = now() + SignedDuration::from_mins(5);
    let r = store
        .execute(
            Some(&job_site_with(&["claim", "renew-lease"])),
            &fenced("renew-lease", 2, &token, "k2"),
            later,
        )
        .await
        .unwrap();
    assert!(r.ok, "{:?}", r.error);
    let raw = server
        .object("protobot.dev", "buildworkitems", "default", "wi-1")
        .unwrap();
    let status: protobot_api::BuildWorkItemStatus =
        serde_json::from_value(raw["status"].clone()).expect("the rewritten status decodes");
    assert_eq!(status.contract_version, 3);
    assert!(status.cycles.is_empty(), "the record holds no attempts");
    assert!(raw["status"].get("fenceCounter").is_none());
    let lease = status.lease.as_ref().unwrap();
    assert_eq!(lease.holder, "job-site-a");
    assert_eq!(lease.renew_time.0, later);
    assert_eq!(condition(&status, "Leased").last_transition_time.0, later);
}

// === failures: contention, and what needs a person ===

#[tokio::test]
async fn write_conflicts_without_end_are_contention() {
    let server = server();
    let store = seeded(&server).await;
    server.faults().inject(
        FaultRule::on(Verb::Update)
            .resource("buildworkitems")
            .status(409),
    );
    let err = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Contention { attempts }
                if attempts == protobot_stores::kubernetes::MAX_ATTEMPTS
        ),
        "{err}"
    );
    assert!(err.is_transient());
    assert!(
        err.to_string()
            .contains("retry with the same idempotency key"),
        "{err}"
    );
    assert_eq!(
        store.get("wi-1").await.unwrap().unwrap().state,
        State::ReadyForBuilding,
        "no attempt committed"
    );
    // Once the contention is over, the same key applies once.
    server.faults().clear();
    let r = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap();
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(
        store.get("wi-1").await.unwrap().unwrap().contract_version,
        2
    );
}

#[tokio::test]
async fn a_build_work_item_the_store_did_not_write_is_a_foreign_object() {
    let server = server();
    let store = seeded(&server).await;
    // Someone copies wi-1 under the name of wi-2: the object named wi-2 holds wi-1.
    let api: Api<BuildWorkItem> = Api::namespaced(server.client(), "default");
    let mut copy = api.get("wi-1").await.unwrap();
    copy.metadata = kube::api::ObjectMeta {
        name: Some("wi-2".into()),
        ..kube::api::ObjectMeta::default()
    };
    copy.status = None;
    api.create(&kube::api::PostParams::default(), &copy)
        .await
        .unwrap();

    let err = store.get("wi-2").await.unwrap_err();
    match &err {
        StoreError::Foreign {
            object, conflict, ..
        } => {
            assert_eq!(object, "BuildWorkItem wi-2");
            assert_eq!(conflict, "holds work item \"wi-1\", not \"wi-2\"");
        }
        other => panic!("expected a foreign object, got {other:?}"),
    }
    assert!(!err.is_transient());
    assert!(err.to_string().ends_with("rename or delete it"), "{err}");
    // A command on wi-2 fails alike and writes nothing.
    let mut on_other = claim("k2");
    on_other.work_item_id = "wi-2".into();
    let err = store
        .execute(Some(&job_site()), &on_other, now())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
    assert!(api.get("wi-2").await.unwrap().status.is_none());
}

#[tokio::test]
async fn a_ledger_that_does_not_decode_needs_a_person_and_nothing_is_written() {
    use kube::api::{ApiResource, DynamicObject};
    let server = server();
    let store = seeded(&server).await;
    let raw: Api<DynamicObject> = Api::namespaced_with(
        server.client(),
        "default",
        &ApiResource::erase::<BuildWorkItem>(&()),
    );
    let mut object = raw.get("wi-1").await.unwrap();
    object.data["status"]["ledger"] = serde_json::json!("{\"record\": truncated");
    let damaged = raw
        .replace_status("wi-1", &kube::api::PostParams::default(), &object)
        .await
        .unwrap();

    let err = store.get("wi-1").await.unwrap_err();
    match &err {
        StoreError::Undecodable { record, source } => {
            assert_eq!(record, "the ledger of BuildWorkItem wi-1");
            assert!(
                source.downcast_ref::<serde_json::Error>().is_some(),
                "{source:?}"
            );
        }
        other => panic!("expected an undecodable record, got {other:?}"),
    }
    assert!(!err.is_transient());
    assert!(
        err.to_string()
            .contains("a person must fix it, restore it from a backup or delete it"),
        "{err}"
    );
    let err = store.list(&Default::default()).await.unwrap_err();
    assert!(matches!(err, StoreError::Undecodable { .. }), "{err}");
    let err = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Undecodable { .. }), "{err}");
    assert_eq!(
        raw.get("wi-1").await.unwrap().metadata.resource_version,
        damaged.metadata.resource_version,
        "nothing was written"
    );
}

#[tokio::test]
async fn a_shard_config_map_changed_by_someone_else_is_named_by_its_object() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let server = server();
    let store = seeded(&server).await;
    let r = store
        .execute(Some(&job_site()), &claim("k1"), now())
        .await
        .unwrap();
    assert!(r.ok, "{:?}", r.error);
    let mut other = WorkItemRecord::new("wi-2", "demo", State::ReadyForBuilding, 1);
    other.readiness = Readiness::complete();
    store.import(Import::Record(other)).await.unwrap();
    let mut on_other = claim("k2");
    on_other.work_item_id = "wi-2".into();

    // The claim's fence comes from the project's counters; rewrite them by hand.
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let rewrite = |id: Option<&'static str>, value: &'static str| {
        let maps = maps.clone();
        async move {
            let counters = maps
                .list(&kube::api::ListParams::default().labels("protobot.dev/wms-kind=counter"))
                .await
                .unwrap()
                .items;
            assert!(!counters.is_empty());
            for mut cm in counters {
                let data = cm.data.get_or_insert_with(Default::default);
                data.insert("value".into(), value.into());
                if let Some(id) = id {
                    data.insert("id".into(), id.into());
                }
                let name = cm.metadata.name.clone().unwrap();
                maps.replace(&name, &kube::api::PostParams::default(), &cm)
                    .await
                    .unwrap();
            }
        }
    };

    // JSON, but not a counter: the join names the shard and its ConfigMap.
    rewrite(None, "\"seven\"").await;
    let err = store
        .execute(Some(&job_site()), &on_other, now())
        .await
        .unwrap_err();
    match &err {
        StoreError::Undecodable { record, .. } => assert!(
            record.starts_with("the counter shard")
                && record.contains(" in config map pbw-counter-"),
            "{record}"
        ),
        other => panic!("expected an undecodable record, got {other:?}"),
    }
    assert!(!err.is_transient());

    // A counter of another id under this counter's name: a foreign object.
    rewrite(Some("another-counter"), "7").await;
    let err = store
        .execute(Some(&job_site()), &on_other, now())
        .await
        .unwrap_err();
    match &err {
        StoreError::Foreign {
            object,
            conflict,
            remedy,
        } => {
            assert!(object.starts_with("config map pbw-counter-"), "{object}");
            assert!(
                conflict.starts_with("does not hold the counter shard"),
                "{conflict}"
            );
            assert!(
                remedy.ends_with("delete it only if the project is being rebuilt"),
                "{remedy}"
            );
        }
        other => panic!("expected a foreign object, got {other:?}"),
    }
    assert!(!err.is_transient());
    assert_eq!(
        store.get("wi-2").await.unwrap().unwrap().state,
        State::ReadyForBuilding,
        "nothing was claimed"
    );
}
