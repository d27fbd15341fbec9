#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The lease keeper against a real WorkStore, on paused tokio time: renewals at
//! a third of the lease carry the version forward, and a lease taken away stops
//! the work at the next effect boundary.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use jiff::{SignedDuration, Timestamp};
use protobot_jobsite::lease::{Claim, Clock, Held, LeaseLost, keep_alive, renew_once};
use protobot_lifecycle::{
    AuthorizationContext, Code, Command, OperationEnvelope, Readiness, Reconciliation, State,
    WorkItemRecord,
};
use protobot_stores::{AdapterConfig, Import, MemoryStore, Observation, WorkStore};
use tokio::sync::watch;

const PROJECT: &str = "p";

struct ManualClock(Mutex<Timestamp>);

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap()
    }
}

impl ManualClock {
    fn advance(&self, d: Duration) {
        let mut t = self.0.lock().unwrap();
        *t = t.checked_add(SignedDuration::try_from(d).unwrap()).unwrap();
    }
}

fn ctx(role: &str, subject: &str, actions: &[&str]) -> AuthorizationContext {
    AuthorizationContext {
        subject: subject.into(),
        role: role.into(),
        project_id: PROJECT.into(),
        allowed_actions: actions.iter().map(|s| s.to_string()).collect(),
        allowed_refs: vec![format!("project:{PROJECT}")],
        expires_at: Some("2030-01-01T00:00:00Z".parse().unwrap()),
        policy_version: "v1".into(),
        ..AuthorizationContext::default()
    }
}

async fn claimed() -> (
    Arc<MemoryStore>,
    Arc<ManualClock>,
    Claim,
    AuthorizationContext,
) {
    let store = Arc::new(MemoryStore::new(
        PROJECT,
        AdapterConfig {
            materializer_subject: "m".into(),
            lease_seconds: 900,
        },
    ));
    let mut rec = WorkItemRecord::new("wi-1", PROJECT, State::ReadyForBuilding, 1);
    rec.readiness = Readiness::complete();
    store.import(Import::Record(rec)).await.unwrap();
    let clock = Arc::new(ManualClock(Mutex::new(
        "2026-09-18T12:00:00Z".parse().unwrap(),
    )));
    let js = ctx(
        "job-site",
        "job-site-a",
        &["claim", "renew-lease", "tests-pass"],
    );
    let env = OperationEnvelope {
        operation: "claim".into(),
        actor_context_ref: "job-site".into(),
        work_item_id: "wi-1".into(),
        expected_state: Some("ready-for-building".into()),
        expected_contract_version: Some(1),
        idempotency_key: "claim-1".into(),
        ..OperationEnvelope::default()
    };
    let r = store.execute(Some(&js), &env, clock.now()).await.unwrap();
    let d = r.decision.clone().unwrap();
    let claim = Claim::new(Held {
        work_item_id: "wi-1".into(),
        fencing_token: d.fencing_token_issued.unwrap(),
        state: State::Building,
        contract_version: d.after.unwrap().contract_version,
    });
    (store, clock, claim, js)
}

#[tokio::test]
async fn renewals_carry_the_version_and_extend_the_lease() {
    let (store, clock, claim, js) = claimed().await;
    clock.advance(Duration::from_secs(300));
    renew_once(store.as_ref(), &js, &claim, clock.as_ref())
        .await
        .unwrap();
    let rec = store.get("wi-1").await.unwrap().unwrap();
    assert_eq!(rec.contract_version, 3);
    assert_eq!(
        claim.held().unwrap().contract_version,
        3,
        "the claim follows the version"
    );
    assert_eq!(
        rec.lease.unwrap().expires_at,
        clock.now() + SignedDuration::from_mins(15)
    );
    // The engine's own commands also move the claim forward.
    let env = claim.command(Command::TestsPass, "tp-1").unwrap();
    let env = OperationEnvelope {
        payload: Some(serde_json::json!({"build_tests_passed": true})),
        ..env
    };
    let r = store.execute(Some(&js), &env, clock.now()).await.unwrap();
    claim.record(&r);
    assert_eq!(claim.held().unwrap().state, State::Inspecting);
    renew_once(store.as_ref(), &js, &claim, clock.as_ref())
        .await
        .unwrap();
    assert_eq!(
        store.get("wi-1").await.unwrap().unwrap().contract_version,
        5
    );
}

#[tokio::test(start_paused = true)]
async fn the_keeper_renews_at_a_third_of_the_lease_until_stopped() {
    let (store, clock, claim, js) = claimed().await;
    let (stop_tx, stop_rx) = watch::channel(false);
    let keeper = tokio::spawn(keep_alive(
        store.clone(),
        js,
        claim.clone(),
        clock.clone(),
        Duration::from_secs(900),
        stop_rx,
    ));
    for _ in 0..3 {
        clock.advance(Duration::from_secs(300));
        tokio::time::sleep(Duration::from_secs(301)).await;
    }
    let rec = store.get("wi-1").await.unwrap().unwrap();
    assert_eq!(rec.contract_version, 5, "three renewals in 15 minutes");
    assert!(
        rec.lease.unwrap().expires_at > clock.now(),
        "the lease never lapsed"
    );
    stop_tx.send(true).unwrap();
    assert_eq!(keeper.await.unwrap(), Ok(()));
    assert!(!*claim.lost_signal().borrow());
    assert_eq!(
        claim.renewals(),
        protobot_jobsite::lease::LeaseRenewals {
            renewed: 3,
            failed: 0
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_taken_away_stops_the_work() {
    let (store, clock, claim, js) = claimed().await;
    let (_stop_tx, stop_rx) = watch::channel(false);
    let mut lost = claim.lost_signal();
    let keeper = tokio::spawn(keep_alive(
        store.clone(),
        js,
        claim.clone(),
        clock.clone(),
        Duration::from_secs(900),
        stop_rx,
    ));
    // A human abandons the item while the Job Site holds it.
    store
        .observe(
            "wi-1",
            Observation::Reconciliation(Reconciliation {
                status: "not-integrated".into(),
                git_mutation: "none".into(),
                merge_envelope: None,
            }),
        )
        .await
        .unwrap();
    let human = ctx("human-maintainer", "alice", &["abandon"]);
    let env = OperationEnvelope {
        operation: "abandon".into(),
        actor_context_ref: "human".into(),
        work_item_id: "wi-1".into(),
        expected_state: Some("building".into()),
        expected_contract_version: Some(2),
        idempotency_key: "abandon-1".into(),
        payload: Some(serde_json::json!({"cancellation_confirmed": true})),
        ..OperationEnvelope::default()
    };
    assert!(
        store
            .execute(Some(&human), &env, clock.now())
            .await
            .unwrap()
            .ok
    );
    clock.advance(Duration::from_secs(300));
    tokio::time::timeout(Duration::from_secs(400), lost.changed())
        .await
        .unwrap()
        .unwrap();
    assert!(*lost.borrow(), "the executor's cancel signal flipped");
    let err = keeper.await.unwrap().unwrap_err();
    assert_eq!(
        err,
        LeaseLost::Rejected {
            work_item_id: "wi-1".into(),
            code: Code::AlreadyTerminal
        }
    );
    assert!(claim.check().is_err(), "the next effect boundary refuses");
    assert!(claim.command(Command::TestsPass, "x").is_err());
}
