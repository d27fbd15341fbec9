#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Build contracts materialize through a real WorkStore: ready, blocked,
//! waiting and omitted outcomes, and create-or-return on re-registration.

use jiff::{SignedDuration, Timestamp};
use protobot_jobsite::contract::{
    Action, AssessmentStatus, ChangeSetFacts, Disposition, ImpactEntry, Intake, build,
};
use protobot_lifecycle::{AuthorizationContext, State};
use protobot_stores::{AdapterConfig, Import, MemoryStore, WorkStore};

const PROJECT: &str = "cli-sync";

fn now() -> Timestamp {
    "2026-09-18T12:00:00Z".parse().unwrap()
}

fn materializer() -> AuthorizationContext {
    AuthorizationContext {
        subject: "materializer-1".into(),
        role: "materializer".into(),
        project_id: PROJECT.into(),
        allowed_actions: vec!["materialize".into(), "refresh-dependencies".into()],
        allowed_refs: vec![format!("project:{PROJECT}")],
        expires_at: Some(now() + SignedDuration::from_hours(1)),
        policy_version: "wms-policy/v1".into(),
        ..AuthorizationContext::default()
    }
}

fn facts(cs: &str, merge: &str) -> ChangeSetFacts {
    ChangeSetFacts {
        touched_paths: vec![],
        project_id: PROJECT.into(),
        change_set_id: cs.into(),
        merge_commit: merge.into(),
        operations: vec![(Action::Add, "REQ-SYNC-001".into())],
        affected_interfaces: vec![],
        affected_scopes: vec![],
        implementation_required: true,
        impact: vec![ImpactEntry {
            requirement_id: "REQ-SYNC-002".into(),
            disposition: Disposition::Applicable,
            rationale: "same command".into(),
        }],
        assessment_status: AssessmentStatus::Complete,
        merged_on_default_branch: true,
        check_errors: vec![],
        unresolved_references: vec![],
        depends_on: vec![],
        priority: "normal".into(),
    }
}

async fn materialize(store: &MemoryStore, f: ChangeSetFacts) -> protobot_lifecycle::ResultEnvelope {
    let contract = build(&Intake::ChangeSet(f)).unwrap();
    let env = contract.materialize_envelope(PROJECT, "materializer");
    store
        .execute(Some(&materializer()), &env, now())
        .await
        .unwrap()
}

fn store() -> MemoryStore {
    MemoryStore::new(PROJECT, AdapterConfig::default())
}

#[tokio::test]
async fn an_approved_change_set_becomes_ready_and_re_registration_returns_it() {
    let store = store();
    let f = facts("CS-00001", &"a".repeat(40));
    let first = materialize(&store, f.clone()).await;
    assert!(first.ok, "{:?}", first.error);
    let id = first.fields["work_item_id"].as_str().unwrap().to_string();
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.contract_version),
        (State::ReadyForBuilding, 1)
    );
    let again = materialize(&store, f).await;
    assert!(
        again.decision.unwrap().replayed,
        "same registration replays"
    );
    assert_eq!(
        store.list(&Default::default()).await.unwrap().len(),
        1,
        "nothing duplicated"
    );
}

#[tokio::test]
async fn a_stale_assessment_blocks_and_an_unneeded_change_is_omitted() {
    let store = store();
    let mut stale = facts("CS-00002", &"b".repeat(40));
    stale.assessment_status = AssessmentStatus::Stale;
    let r = materialize(&store, stale).await;
    assert_eq!(r.decision.unwrap().after.unwrap().state, State::Blocked);
    let mut omitted = facts("CS-00003", &"c".repeat(40));
    omitted.implementation_required = false;
    let r = materialize(&store, omitted).await;
    let d = r.decision.unwrap();
    assert_eq!(d.outcome, protobot_lifecycle::DecisionOutcome::Omitted);
    assert_eq!(
        store.list(&Default::default()).await.unwrap().len(),
        1,
        "only the blocked item exists"
    );
}

#[tokio::test]
async fn an_unmerged_dependency_makes_the_item_wait() {
    let store = store();
    let mut dep = protobot_lifecycle::WorkItemRecord::new("wi-dep", PROJECT, State::Building, 3);
    dep.readiness = protobot_lifecycle::Readiness::complete();
    store.import(Import::Record(dep)).await.unwrap();
    let mut f = facts("CS-00004", &"d".repeat(40));
    f.depends_on = vec!["wi-dep".into()];
    let r = materialize(&store, f).await;
    assert_eq!(r.decision.unwrap().after.unwrap().state, State::Waiting);
    let mut moved = facts("CS-00004", &"e".repeat(40));
    moved.depends_on = vec!["wi-dep".into()];
    let r = materialize(&store, moved).await;
    assert!(
        r.ok,
        "a new merge of the same change set is a new logical item"
    );
}
