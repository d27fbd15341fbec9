//! The WorkStore conformance suite: one set of scenarios every backend must
//! pass unchanged (memory, SQLite and Kubernetes all run it).
//!
//! Each scenario is a public async function taking a [`Harness`] around a fresh
//! store; [`workstore_conformance!`](crate::workstore_conformance) expands to one
//! `#[tokio::test]` per scenario for a backend factory. Scenario names carry the
//! case ids of `contracts/lifecycle.md` §22 (VR-xxx, INV-xx). Defaults follow
//! §22: project `fixture-project`, policy `wms-policy/v1`, evaluation time
//! 2026-09-18T12:00:00Z, 15-minute leases, complete readiness.
//!
//! This module is test support compiled into the library so other crates'
//! backends can run it; a failed expectation panics with the case id.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use protobot_lifecycle::{
    ApprovalRecord, AuthorizationContext, Code, Command, CommandRequest, Dependency, Lease,
    MergeEnvelope, OperationEnvelope, Readiness, Reconciliation, ResultEnvelope, Role, Ruleset,
    State, WorkItemRecord,
};
use serde_json::{Value, json};

use crate::{
    AdapterConfig, ChangeSetRecord, Import, Observation, StoreError, WorkStore, adapter::partition,
};

pub const PROJECT: &str = "fixture-project";
pub const POLICY: &str = "wms-policy/v1";
pub const MATERIALIZER: &str = "materializer-1";

/// The adapter configuration every conformance store is built with.
pub fn config() -> AdapterConfig {
    AdapterConfig {
        materializer_subject: MATERIALIZER.to_string(),
        lease_seconds: 900,
    }
}

pub fn eval_time() -> Timestamp {
    "2026-09-18T12:00:00Z".parse().unwrap()
}

/// Default subject per role.
pub fn subject(role: Role) -> &'static str {
    match role {
        Role::JobSite => "job-site-a",
        Role::Materializer => MATERIALIZER,
        Role::Reconciler => "reconciler-1",
        Role::HumanMaintainer => "human-maintainer-1",
        Role::DraftingTable => "agent-1",
    }
}

/// A fresh store plus the trusted clock and Gate of a scenario.
pub struct Harness<S> {
    pub store: Arc<S>,
    pub now: Timestamp,
}

impl<S: WorkStore + 'static> Harness<S> {
    pub fn new(store: S) -> Harness<S> {
        Harness {
            store: Arc::new(store),
            now: eval_time(),
        }
    }

    /// A valid context granting the role's family, its partition and preflight.
    pub fn ctx(&self, role: Role) -> AuthorizationContext {
        self.ctx_as(role, subject(role))
    }

    pub fn ctx_as(&self, role: Role, subject: &str) -> AuthorizationContext {
        let rules = Ruleset::v1().unwrap();
        let mut actions: Vec<String> = rules
            .family(role)
            .iter()
            .map(|c| c.as_str().to_string())
            .collect();
        actions.extend(partition(role).iter().map(|o| o.as_str().to_string()));
        actions.push("lifecycle.preflight".to_string());
        actions.sort();
        actions.dedup();
        AuthorizationContext {
            subject: subject.to_string(),
            role: role.as_str().to_string(),
            project_id: PROJECT.to_string(),
            allowed_actions: actions,
            allowed_refs: vec![
                format!("project:{PROJECT}"),
                "main".into(),
                "head-1".into(),
                "run-1".into(),
                "merge-1".into(),
            ],
            expires_at: Some(self.now + SignedDuration::from_hours(48)),
            policy_version: POLICY.to_string(),
            ..AuthorizationContext::default()
        }
    }

    pub async fn seed(&self, record: WorkItemRecord) {
        self.store.import(Import::Record(record)).await.unwrap();
    }

    pub async fn seed_approval(&self, approval: ApprovalRecord) {
        self.store.import(Import::Approval(approval)).await.unwrap();
    }

    pub async fn seed_change_set(&self, id: &str, build_item: &str) {
        let cs = ChangeSetRecord {
            id: id.into(),
            revision: "approved".into(),
            priority: "normal".into(),
            build_work_item_id: build_item.into(),
        };
        self.store.import(Import::ChangeSet(cs)).await.unwrap();
    }

    pub async fn observe(&self, id: &str, o: Observation) {
        self.store.observe(id, o).await.unwrap();
    }

    pub async fn run(&self, ctx: &AuthorizationContext, env: OperationEnvelope) -> ResultEnvelope {
        self.store.execute(Some(ctx), &env, self.now).await.unwrap()
    }

    pub async fn as_role(&self, role: Role, env: OperationEnvelope) -> ResultEnvelope {
        let ctx = self.ctx(role);
        self.run(&ctx, env).await
    }

    pub async fn record(&self, id: &str) -> WorkItemRecord {
        self.store
            .get(id)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("work item {id} missing"))
    }

    pub async fn audits(&self) -> usize {
        self.store.audit_events().await.unwrap().len()
    }

    pub async fn approval_status(&self, id: &str) -> String {
        self.store.approval(id).await.unwrap().unwrap().status
    }
}

// === fixtures ===

/// A record with complete readiness.
pub fn item(id: &str, state: State, version: u64) -> WorkItemRecord {
    let mut r = WorkItemRecord::new(id, PROJECT, state, version);
    r.readiness = Readiness::complete();
    r.materialization_key = format!("mk-{id}");
    r
}

/// `record` with a lease owned by `owner`, expiring `secs` after eval time.
pub fn leased(mut record: WorkItemRecord, owner: &str, token: &str, secs: i64) -> WorkItemRecord {
    record.owner = owner.into();
    record.lease = Some(Lease {
        owner: owner.into(),
        fencing_token: token.into(),
        expires_at: eval_time() + SignedDuration::from_secs(secs),
    });
    record
}

pub fn evidence(status: &str, git: &str) -> Option<Reconciliation> {
    Some(Reconciliation {
        status: status.into(),
        git_mutation: git.into(),
        merge_envelope: None,
    })
}

pub fn candidate(version: u64, merge_commit: &str) -> MergeEnvelope {
    MergeEnvelope {
        product_tree_digest: "sha256:tree".into(),
        inspection_run_id: "run-1".into(),
        integration_head: "head-1".into(),
        target: "main".into(),
        contract_version: version,
        merge_commit: merge_commit.into(),
    }
}

/// A lifecycle command envelope.
pub fn cmd(command: Command, id: &str, state: State, version: u64, key: &str) -> OperationEnvelope {
    OperationEnvelope::command(CommandRequest {
        command,
        actor_context_ref: "ref",
        work_item_id: id,
        expected_state: state,
        expected_contract_version: version,
        idempotency_key: key.into(),
    })
}

/// A preflight of `command` with extra payload fields.
pub fn preflight(
    command: Command,
    id: &str,
    state: State,
    version: u64,
    payload: Value,
) -> OperationEnvelope {
    let mut p = payload;
    p["operation"] = json!(command.as_str());
    OperationEnvelope {
        operation: "lifecycle.preflight".into(),
        actor_context_ref: "ref".into(),
        work_item_id: id.into(),
        expected_state: Some(state.as_str().into()),
        expected_contract_version: Some(version),
        payload: Some(p),
        ..OperationEnvelope::default()
    }
}

pub trait EnvelopeExt {
    fn fence(self, token: &str) -> Self;
    fn payload(self, payload: Value) -> Self;
    fn approval(self, id: &str) -> Self;
}

impl EnvelopeExt for OperationEnvelope {
    fn fence(mut self, token: &str) -> Self {
        self.fencing_token = token.into();
        self
    }
    fn payload(mut self, payload: Value) -> Self {
        self.payload = Some(payload);
        self
    }
    fn approval(mut self, id: &str) -> Self {
        self.human_approval_id = id.into();
        self
    }
}

/// A materialize envelope for `source` (a `payload.work_item` object).
pub fn materialize(key: &str, mkey: &str, source: Value) -> OperationEnvelope {
    OperationEnvelope {
        operation: "materialize".into(),
        actor_context_ref: "ref".into(),
        expected_state: Some("initial".into()),
        expected_contract_version: Some(0),
        idempotency_key: key.into(),
        materialization_key: mkey.into(),
        payload: Some(json!({"work_item": source})),
        ..OperationEnvelope::default()
    }
}

pub fn complete_readiness() -> Value {
    serde_json::to_value(Readiness::complete()).unwrap()
}

// === assertions ===

#[track_caller]
pub fn allowed(case: &str, r: &ResultEnvelope, state: State, version: u64) {
    assert!(r.ok, "{case}: expected allowed, got {:?}", r.error);
    let d = r
        .decision
        .as_ref()
        .unwrap_or_else(|| panic!("{case}: no decision"));
    let after = d.after.unwrap_or_else(|| panic!("{case}: no after"));
    assert_eq!(
        (after.state, after.contract_version),
        (state, version),
        "{case}: after"
    );
}

#[track_caller]
pub fn rejected(case: &str, r: &ResultEnvelope, code: Code) {
    assert!(!r.ok, "{case}: expected {code}, got ok");
    assert_eq!(r.code(), Some(code), "{case}: {:?}", r.error);
    assert_eq!(
        r.mutation,
        protobot_lifecycle::Mutation::None,
        "{case}: a rejection mutates nothing"
    );
}

#[track_caller]
pub fn preflight_rejected(case: &str, r: &ResultEnvelope, code: Code) {
    assert!(r.ok, "{case}: a preflight is always ok");
    assert_eq!(
        r.outcome,
        protobot_lifecycle::EnvelopeOutcome::Read,
        "{case}"
    );
    let d = r.decision.as_ref().unwrap();
    assert_eq!(
        d.rejection.as_ref().map(|x| x.code),
        Some(code),
        "{case}: {:?}",
        d.rejection
    );
}

fn fence_of(r: &ResultEnvelope) -> String {
    r.decision
        .as_ref()
        .and_then(|d| d.fencing_token_issued.clone())
        .map(String::from)
        .expect("a fence was issued")
}

fn detail<'a>(r: &'a ResultEnvelope, key: &str) -> &'a Value {
    &r.error.as_ref().unwrap().details[key]
}

// === VR cases ===

pub async fn vr_001_claim_ready_item<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::ReadyForBuilding, 4)).await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(
                Command::Claim,
                "wi-1",
                State::ReadyForBuilding,
                4,
                "vr001-claim",
            ),
        )
        .await;
    allowed("VR-001", &r, State::Building, 5);
    let token = fence_of(&r);
    let rec = h.record("wi-1").await;
    assert_eq!(rec.lease.as_ref().unwrap().fencing_token, token);
    assert_eq!(rec.owner, "job-site-a");
    assert_eq!(
        rec.lease.unwrap().expires_at,
        h.now + SignedDuration::from_mins(15)
    );
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_002_preflight_is_advisory_and_active_owner_wins<S: WorkStore + 'static>(
    h: Harness<S>,
) {
    h.seed(item("wi-1", State::ReadyForBuilding, 4)).await;
    let r = h
        .as_role(
            Role::DraftingTable,
            preflight(
                Command::Claim,
                "wi-1",
                State::ReadyForBuilding,
                4,
                json!({}),
            ),
        )
        .await;
    assert!(
        r.ok && r.outcome == protobot_lifecycle::EnvelopeOutcome::Read,
        "VR-002a"
    );
    assert_eq!(r.mutation, protobot_lifecycle::Mutation::None);
    let d = r.decision.as_ref().unwrap();
    assert_eq!(d.authority, protobot_lifecycle::Authority::Preflight);
    assert_eq!(
        d.after.map(|a| (a.state, a.contract_version)),
        Some((State::Building, 5))
    );
    assert_eq!(h.audits().await, 0);
    assert_eq!(h.record("wi-1").await.state, State::ReadyForBuilding);
    let b = h.ctx_as(Role::JobSite, "job-site-b");
    allowed(
        "VR-002b setup",
        &h.run(
            &b,
            cmd(
                Command::Claim,
                "wi-1",
                State::ReadyForBuilding,
                4,
                "vr002-b",
            ),
        )
        .await,
        State::Building,
        5,
    );
    let r = h
        .as_role(
            Role::JobSite,
            cmd(
                Command::Claim,
                "wi-1",
                State::ReadyForBuilding,
                4,
                "vr002-loser",
            ),
        )
        .await;
    rejected("VR-002b", &r, Code::DuplicateClaim);
    assert_eq!(detail(&r, "claim_status"), "active");
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_003_claim_on_blocked_is_stale_state<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::Blocked, 4)).await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::Claim, "wi-1", State::ReadyForBuilding, 4, "vr003"),
        )
        .await;
    rejected("VR-003", &r, Code::StaleState);
    assert_eq!(detail(&r, "current_state"), "blocked");
    assert_eq!(h.record("wi-1").await, item("wi-1", State::Blocked, 4));
    assert_eq!(h.audits().await, 0);
}

pub async fn vr_004_stale_contract_version<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::ReadyForBuilding, 5)).await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::Claim, "wi-1", State::ReadyForBuilding, 4, "vr004"),
        )
        .await;
    rejected("VR-004", &r, Code::StaleContractVersion);
    assert_eq!(detail(&r, "current_contract_version"), 5);
    let mut missing = cmd(
        Command::Claim,
        "wi-1",
        State::ReadyForBuilding,
        5,
        "vr004-missing",
    );
    missing.expected_contract_version = None;
    rejected(
        "VR-004 missing version is stale",
        &h.as_role(Role::JobSite, missing).await,
        Code::StaleContractVersion,
    );
    assert_eq!(h.record("wi-1").await.contract_version, 5);
}

pub async fn vr_005_second_claimer_gets_duplicate_claim<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::ReadyForBuilding, 4)).await;
    let a = h.ctx_as(Role::JobSite, "job-site-a");
    let b = h.ctx_as(Role::JobSite, "job-site-b");
    allowed(
        "VR-005 a",
        &h.run(
            &a,
            cmd(
                Command::Claim,
                "wi-1",
                State::ReadyForBuilding,
                4,
                "vr005-a",
            ),
        )
        .await,
        State::Building,
        5,
    );
    rejected(
        "VR-005 b",
        &h.run(
            &b,
            cmd(
                Command::Claim,
                "wi-1",
                State::ReadyForBuilding,
                4,
                "vr005-b",
            ),
        )
        .await,
        Code::DuplicateClaim,
    );
    let rec = h.record("wi-1").await;
    assert_eq!(
        (rec.owner.as_str(), rec.contract_version),
        ("job-site-a", 5)
    );
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_006_roles_outside_the_family_are_unauthorized<S: WorkStore + 'static>(
    h: Harness<S>,
) {
    h.seed(item("wi-1", State::ReadyForBuilding, 4)).await;
    h.seed(item("wi-2", State::Merging, 4)).await;
    let r = h
        .as_role(
            Role::DraftingTable,
            cmd(
                Command::Claim,
                "wi-1",
                State::ReadyForBuilding,
                4,
                "vr006-claim",
            ),
        )
        .await;
    rejected("VR-006a", &r, Code::UnauthorizedAction);
    let r = h
        .as_role(
            Role::DraftingTable,
            cmd(Command::RecordMerge, "wi-2", State::Merging, 4, "vr006-rm"),
        )
        .await;
    rejected("VR-006b", &r, Code::UnauthorizedAction);
    // Exclusive families: an action granted outside the family still fails.
    let mut ctx = h.ctx(Role::Materializer);
    ctx.allowed_actions.push("claim".into());
    rejected(
        "VR-006 family",
        &h.run(
            &ctx,
            cmd(
                Command::Claim,
                "wi-1",
                State::ReadyForBuilding,
                4,
                "vr006-m",
            ),
        )
        .await,
        Code::UnauthorizedAction,
    );
    assert_eq!(h.audits().await, 0);
}

pub async fn vr_007_renew_with_an_old_fence_is_stale<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(leased(
        item("wi-1", State::Building, 4),
        "job-site-a",
        "fence-current",
        3600,
    ))
    .await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::RenewLease, "wi-1", State::Building, 4, "vr007").fence("fence-old"),
        )
        .await;
    rejected("VR-007", &r, Code::StaleFencingToken);
    assert_eq!(detail(&r, "fence_status"), "stale");
    assert_eq!(
        r.error.as_ref().unwrap().retry,
        protobot_lifecycle::Retry::Reconcile
    );
    let other = h.ctx_as(Role::JobSite, "job-site-b");
    let r = h
        .run(
            &other,
            cmd(Command::RenewLease, "wi-1", State::Building, 4, "vr007-b").fence("fence-current"),
        )
        .await;
    assert_eq!(detail(&r, "fence_status"), "owner-mismatch");
    assert_eq!(h.audits().await, 0);
}

pub async fn vr_008_identical_claim_replays<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::ReadyForBuilding, 4)).await;
    let env = cmd(
        Command::Claim,
        "wi-1",
        State::ReadyForBuilding,
        4,
        "vr008-claim",
    );
    let first = h.as_role(Role::JobSite, env.clone()).await;
    let again = h.as_role(Role::JobSite, env).await;
    allowed("VR-008", &again, State::Building, 5);
    assert_eq!(again.outcome, protobot_lifecycle::EnvelopeOutcome::Replayed);
    assert_eq!(again.mutation, protobot_lifecycle::Mutation::None);
    assert_eq!(
        again.idempotency,
        Some(protobot_lifecycle::IdempotencyStatus::Replayed)
    );
    assert!(again.decision.as_ref().unwrap().replayed);
    assert_eq!(fence_of(&again), fence_of(&first), "no new fence on replay");
    assert_eq!(h.record("wi-1").await.contract_version, 5);
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_009_key_reuse_on_another_item_conflicts<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-009-a", State::ReadyForBuilding, 4)).await;
    h.seed(item("wi-009-b", State::ReadyForBuilding, 4)).await;
    h.as_role(
        Role::JobSite,
        cmd(
            Command::Claim,
            "wi-009-a",
            State::ReadyForBuilding,
            4,
            "vr009-shared-key",
        ),
    )
    .await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(
                Command::Claim,
                "wi-009-b",
                State::ReadyForBuilding,
                4,
                "vr009-shared-key",
            ),
        )
        .await;
    rejected("VR-009", &r, Code::IdempotencyConflict);
    assert_eq!(detail(&r, "conflict_kind"), "request-fingerprint");
    assert_eq!(
        r.error.as_ref().unwrap().retry,
        protobot_lifecycle::Retry::NewKey
    );
    assert_eq!(h.record("wi-009-b").await.state, State::ReadyForBuilding);
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_010_results_never_replay_across_principals<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::ReadyForBuilding, 4)).await;
    let env = cmd(
        Command::Claim,
        "wi-1",
        State::ReadyForBuilding,
        4,
        "vr010-shared-key",
    );
    h.run(&h.ctx_as(Role::JobSite, "job-site-a"), env.clone())
        .await;
    let r = h.run(&h.ctx_as(Role::JobSite, "job-site-b"), env).await;
    rejected("VR-010", &r, Code::IdempotencyConflict);
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_011_and_041_claim_from_blocked_is_invalid<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::Blocked, 4)).await;
    h.seed(item("wi-2", State::Blocked, 7)).await;
    rejected(
        "VR-011",
        &h.as_role(
            Role::JobSite,
            cmd(Command::Claim, "wi-1", State::Blocked, 4, "vr011"),
        )
        .await,
        Code::InvalidTransition,
    );
    rejected(
        "VR-041",
        &h.as_role(
            Role::JobSite,
            cmd(Command::Claim, "wi-2", State::Blocked, 7, "vr041"),
        )
        .await,
        Code::InvalidTransition,
    );
    assert_eq!(h.audits().await, 0);
}

pub async fn vr_012_rejections_are_frozen_under_the_key<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::Waiting, 4)).await;
    let env = cmd(Command::Claim, "wi-1", State::Waiting, 4, "vr012");
    rejected(
        "VR-012a",
        &h.as_role(Role::JobSite, env.clone()).await,
        Code::InvalidTransition,
    );
    let again = h.as_role(Role::JobSite, env).await;
    assert!(!again.ok, "VR-012b: a replayed rejection stays ok:false");
    assert_eq!(again.code(), Some(Code::InvalidTransition));
    assert_eq!(again.outcome, protobot_lifecycle::EnvelopeOutcome::Replayed);
    assert!(again.decision.as_ref().unwrap().replayed);
    assert_eq!(h.audits().await, 0);
}

pub async fn vr_013_materialize_blocked_and_incomplete<S: WorkStore + 'static>(h: Harness<S>) {
    let mut readiness = Readiness::complete();
    readiness.impact_dispositioned = false;
    let r = h.as_role(Role::Materializer, materialize("vr013-materialize", "vr013-key", json!({"id": "wi-013", "change_type": "undefined", "implementation_required": true, "readiness": readiness}))).await;
    allowed("VR-013", &r, State::Blocked, 1);
    let rec = h.record("wi-013").await;
    assert!(
        rec.block_reason.contains("impact"),
        "block reason from the first readiness failure"
    );
    assert_eq!(rec.lease, None);
    let mut readiness = Readiness::complete();
    readiness.source_immutable = false;
    let r = h
        .as_role(
            Role::Materializer,
            materialize(
                "vr013b",
                "vr013b-key",
                json!({"id": "wi-013b", "change_type": "changes", "readiness": readiness}),
            ),
        )
        .await;
    rejected("VR-013B", &r, Code::PreconditionFailed);
    assert!(
        h.store.get("wi-013b").await.unwrap().is_none(),
        "VR-013B: no work item"
    );
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_014_dependency_completion_unblocks_waiting<S: WorkStore + 'static>(h: Harness<S>) {
    let mut dep = leased(
        item("wi-014-dependency", State::Merging, 9),
        "job-site-a",
        "fence-014",
        3600,
    );
    dep.expected_merge = Some(candidate(9, ""));
    h.seed(dep).await;
    let r = h.as_role(Role::Materializer, materialize("vr014-materialize", "vr014-key", json!({"id": "wi-014-target", "change_type": "undefined", "readiness": complete_readiness(), "dependencies": [{"id": "wi-014-dependency"}]}))).await;
    allowed("VR-014a", &r, State::Waiting, 1);
    assert_eq!(
        h.record("wi-014-target").await.dependencies[0].state,
        State::Merging
    );
    let rm = cmd(
        Command::RecordMerge,
        "wi-014-dependency",
        State::Merging,
        9,
        "vr014-rm",
    )
    .fence("fence-014")
    .payload(json!({"merge_envelope": candidate(9, "merge-1")}));
    allowed(
        "VR-014b",
        &h.as_role(Role::JobSite, rm).await,
        State::Completed,
        10,
    );
    let pre = h
        .as_role(
            Role::Materializer,
            preflight(
                Command::RefreshDependencies,
                "wi-014-target",
                State::Waiting,
                1,
                json!({}),
            ),
        )
        .await;
    let r = h
        .as_role(
            Role::Materializer,
            cmd(
                Command::RefreshDependencies,
                "wi-014-target",
                State::Waiting,
                1,
                "vr014-refresh",
            ),
        )
        .await;
    allowed("VR-014c", &r, State::ReadyForBuilding, 2);
    assert_eq!(
        pre.decision.unwrap().after,
        r.decision.unwrap().after,
        "VR-014c: preflight after = authoritative after"
    );
    assert_eq!(
        h.record("wi-014-target").await.dependencies[0].state,
        State::Completed
    );
    assert_eq!(h.audits().await, 3);
}

pub async fn vr_015_tests_pass_then_begin_merge<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(leased(
        item("wi-1", State::Building, 4),
        "job-site-a",
        "fence-015",
        3600,
    ))
    .await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::TestsPass, "wi-1", State::Building, 4, "vr015a")
                .fence("fence-015")
                .payload(json!({"build_tests_passed": true})),
        )
        .await;
    allowed("VR-015a", &r, State::Inspecting, 5);
    h.observe(
        "wi-1",
        Observation::Inspection {
            inspection_run_sealed: true,
            findings_terminal: true,
            final_tests_passed: true,
        },
    )
    .await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::BeginMerge, "wi-1", State::Inspecting, 5, "vr015b")
                .fence("fence-015")
                .payload(json!({"merge_envelope": candidate(6, "")})),
        )
        .await;
    allowed("VR-015b", &r, State::Merging, 6);
    let rec = h.record("wi-1").await;
    assert_eq!(rec.expected_merge, Some(candidate(6, "")));
    assert_eq!(
        rec.lease.unwrap().fencing_token,
        "fence-015",
        "the lease becomes the merge fence"
    );
    assert_eq!(h.audits().await, 2);
}

pub async fn vr_016_job_site_merge_conflict_reissues_the_fence<S: WorkStore + 'static>(
    h: Harness<S>,
) {
    h.seed(leased(
        item("wi-1", State::Merging, 9),
        "job-site-a",
        "fence-016",
        3600,
    ))
    .await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::MergeConflict, "wi-1", State::Merging, 9, "vr016").fence("fence-016"),
        )
        .await;
    allowed("VR-016", &r, State::Building, 10);
    let token = fence_of(&r);
    assert_ne!(token, "fence-016");
    let old = h
        .as_role(
            Role::JobSite,
            cmd(
                Command::RenewLease,
                "wi-1",
                State::Building,
                10,
                "vr016-old",
            )
            .fence("fence-016"),
        )
        .await;
    rejected("VR-016 old fence", &old, Code::StaleFencingToken);
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_017_merge_not_applied_returns_to_ready<S: WorkStore + 'static>(h: Harness<S>) {
    let mut rec = leased(
        item("wi-1", State::Merging, 9),
        "job-site-a",
        "fence-017",
        3600,
    );
    rec.reconciliation = evidence("not-applied", "none");
    h.seed(rec).await;
    let r = h
        .as_role(
            Role::Reconciler,
            cmd(Command::MergeNotApplied, "wi-1", State::Merging, 9, "vr017"),
        )
        .await;
    allowed("VR-017", &r, State::ReadyForBuilding, 10);
    assert!(r.decision.unwrap().fencing_token_issued.is_none());
    assert_eq!(h.record("wi-1").await.lease, None);
}

pub async fn vr_018_record_merge_replays_after_completion<S: WorkStore + 'static>(h: Harness<S>) {
    let mut rec = leased(
        item("wi-1", State::Merging, 9),
        "job-site-a",
        "fence-018",
        3600,
    );
    rec.expected_merge = Some(candidate(9, ""));
    h.seed(rec).await;
    let env = cmd(
        Command::RecordMerge,
        "wi-1",
        State::Merging,
        9,
        "vr018-record-merge",
    )
    .fence("fence-018")
    .payload(json!({"merge_envelope": candidate(9, "merge-1")}));
    allowed(
        "VR-018 first",
        &h.as_role(Role::JobSite, env.clone()).await,
        State::Completed,
        10,
    );
    let again = h.as_role(Role::JobSite, env).await;
    allowed("VR-018", &again, State::Completed, 10);
    assert!(again.decision.unwrap().replayed);
    let rec = h.record("wi-1").await;
    assert_eq!(
        rec.reconciliation.unwrap().merge_envelope,
        Some(candidate(9, "merge-1"))
    );
    assert_eq!(rec.lease, None);
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_019_terminal_items_reject_everything<S: WorkStore + 'static>(h: Harness<S>) {
    for (id, state) in [("wi-c", State::Completed), ("wi-a", State::Abandoned)] {
        h.seed(item(id, state, 9)).await;
        let r = h
            .as_role(
                Role::JobSite,
                cmd(Command::Claim, id, state, 9, &format!("vr019-{id}")),
            )
            .await;
        rejected("VR-019", &r, Code::AlreadyTerminal);
        assert_eq!(
            r.error.as_ref().unwrap().retry,
            protobot_lifecycle::Retry::Never
        );
        assert_eq!(detail(&r, "terminal_state"), state.as_str());
    }
    assert_eq!(h.audits().await, 0);
}

pub async fn vr_020_refresh_active_reissues_the_fence<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(leased(
        item("wi-1", State::Building, 4),
        "job-site-a",
        "fence-020-old",
        3600,
    ))
    .await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::RefreshActive, "wi-1", State::Building, 4, "vr020a")
                .fence("fence-020-old"),
        )
        .await;
    allowed("VR-020a", &r, State::Building, 5);
    assert_ne!(fence_of(&r), "fence-020-old");
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::RenewLease, "wi-1", State::Building, 5, "vr020b").fence("fence-020-old"),
        )
        .await;
    rejected("VR-020b", &r, Code::StaleFencingToken);
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_020_refresh_active_blocks_on_a_failed_refresh<S: WorkStore + 'static>(
    h: Harness<S>,
) {
    h.seed(leased(
        item("wi-1", State::Inspecting, 4),
        "job-site-a",
        "fence-1",
        3600,
    ))
    .await;
    let mut readiness = Readiness::complete();
    readiness.unresolved_reasons = vec!["interface changed upstream".into()];
    h.observe("wi-1", Observation::Readiness(readiness)).await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(
                Command::RefreshActive,
                "wi-1",
                State::Inspecting,
                4,
                "vr020c",
            )
            .fence("fence-1"),
        )
        .await;
    allowed("9b refresh-active -> blocked", &r, State::Blocked, 5);
    assert!(r.decision.unwrap().fencing_token_issued.is_none());
    let rec = h.record("wi-1").await;
    assert_eq!(rec.lease, None);
    assert_eq!(rec.block_reason, "interface changed upstream");
}

pub async fn vr_021_return_to_building_reissues_the_fence<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(leased(
        item("wi-1", State::Inspecting, 4),
        "job-site-a",
        "fence-021-old",
        3600,
    ))
    .await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(
                Command::ReturnToBuilding,
                "wi-1",
                State::Inspecting,
                4,
                "vr021a",
            )
            .fence("fence-021-old")
            .payload(json!({"in_contract_defect": true})),
        )
        .await;
    allowed("VR-021a", &r, State::Building, 5);
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::RenewLease, "wi-1", State::Building, 5, "vr021b").fence("fence-021-old"),
        )
        .await;
    rejected("VR-021b", &r, Code::StaleFencingToken);
    assert_eq!(h.audits().await, 1);
}

fn submit(
    id: &str,
    version: u64,
    approval: Option<&str>,
    payload: Value,
    key: &str,
) -> OperationEnvelope {
    let mut env = OperationEnvelope {
        operation: "blocked-work.submit-resolution".into(),
        actor_context_ref: "ref".into(),
        work_item_id: id.into(),
        expected_state: Some("blocked".into()),
        expected_contract_version: Some(version),
        idempotency_key: key.into(),
        payload: Some(payload),
        ..OperationEnvelope::default()
    };
    if let Some(a) = approval {
        env.human_approval_id = a.into();
    }
    env
}

pub async fn vr_022_submission_needs_a_real_approval<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::Blocked, 7)).await;
    let payload =
        json!({"resolution_kind": "out-of-scope", "approval_resolution_digest": "vr022-digest"});
    rejected(
        "VR-022-missing",
        &h.as_role(
            Role::DraftingTable,
            submit("wi-1", 7, None, payload.clone(), "vr022a"),
        )
        .await,
        Code::UnauthorizedAction,
    );
    rejected(
        "VR-022-forged",
        &h.as_role(
            Role::DraftingTable,
            submit("wi-1", 7, Some("forged-approval"), payload, "vr022b"),
        )
        .await,
        Code::UnauthorizedAction,
    );
    assert_eq!(h.record("wi-1").await, item("wi-1", State::Blocked, 7));
    assert_eq!(h.audits().await, 0);
}

/// A resolve-block approval bound to everything the contract lets it bind.
pub fn resolution_approval(
    id: &str,
    item: &str,
    kind: &str,
    change_set: Option<&str>,
    human: &str,
) -> ApprovalRecord {
    ApprovalRecord {
        id: id.into(),
        approved_subject: human.into(),
        delegated_principal: MATERIALIZER.into(),
        project_id: Some(PROJECT.into()),
        work_item_id: Some(item.into()),
        resolution_kind: Some(kind.into()),
        expected_state: Some("blocked".into()),
        expected_contract_version: Some(7),
        policy_version: Some(POLICY.into()),
        change_set_id: change_set.map(str::to_string),
        resolution_digest: format!("{id}-digest"),
        action: "resolve-block".into(),
        expires_at: Some(eval_time() + SignedDuration::from_hours(24)),
        status: "unused".into(),
        ..ApprovalRecord::default()
    }
}

fn resolve(id: &str, approval: &str, kind: &str, submission: &str, key: &str) -> OperationEnvelope {
    cmd(Command::ResolveBlock, id, State::Blocked, 7, key)
        .approval(approval)
        .payload(json!({
            "resolution_kind": kind,
            "resolution_submission_id": submission,
            "approval_resolution_digest": format!("{approval}-digest"),
        }))
}

/// Seeds blocked `wi-1` v7 and an accepted submission; returns its id.
async fn accepted_submission<S: WorkStore + 'static>(
    h: &Harness<S>,
    approval: ApprovalRecord,
    kind: &str,
    change_set: Option<&str>,
) -> String {
    let id = approval.id.clone();
    h.seed_approval(approval).await;
    let mut payload =
        json!({"resolution_kind": kind, "approval_resolution_digest": format!("{id}-digest")});
    if let Some(cs) = change_set {
        payload["change_set_id"] = json!(cs);
    }
    let r = h
        .as_role(
            Role::DraftingTable,
            submit("wi-1", 7, Some(&id), payload, &format!("submit-{id}")),
        )
        .await;
    assert!(r.ok, "submission of {id} accepted: {:?}", r.error);
    assert_eq!(r.fields["approval_status"], "unused");
    r.fields["resolution_submission_id"]
        .as_str()
        .unwrap()
        .to_string()
}

pub async fn vr_023_add_requirement_resolution_end_to_end<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::Blocked, 7)).await;
    h.seed(item("vr023-dependency", State::Completed, 3)).await;
    h.seed_change_set("CS-023", "vr023-dependency").await;
    let sub = accepted_submission(
        &h,
        resolution_approval(
            "vr023-approval",
            "wi-1",
            "add-requirement",
            Some("CS-023"),
            "human-023",
        ),
        "add-requirement",
        Some("CS-023"),
    )
    .await;
    assert_eq!(
        h.record("wi-1").await.contract_version,
        7,
        "a submission is not a transition"
    );
    let r = h
        .as_role(
            Role::Materializer,
            resolve("wi-1", "vr023-approval", "add-requirement", &sub, "vr023b"),
        )
        .await;
    allowed("VR-023b", &r, State::ReadyForBuilding, 8);
    assert_eq!(r.fields["approval_status"], "consumed");
    assert_eq!(h.approval_status("vr023-approval").await, "consumed");
    assert_eq!(
        h.store.submission(&sub).await.unwrap().unwrap().status,
        "consumed"
    );
    let rec = h.record("wi-1").await;
    assert!(rec.active_resolution_submission_id.is_empty() && rec.block_reason.is_empty());
    let audits = h.store.audit_events().await.unwrap();
    assert_eq!(audits.len(), 2);
    assert_eq!(audits[1].authorized_human_subject, "human-023");
}

pub async fn vr_024_materialization_create_or_return<S: WorkStore + 'static>(h: Harness<S>) {
    let source =
        json!({"id": "wi-024", "change_type": "undefined", "readiness": complete_readiness()});
    allowed(
        "VR-024a",
        &h.as_role(
            Role::Materializer,
            materialize("vr024-command-1", "vr024-logical-key", source.clone()),
        )
        .await,
        State::ReadyForBuilding,
        1,
    );
    let r = h
        .as_role(
            Role::Materializer,
            materialize("vr024-command-2", "vr024-logical-key", source.clone()),
        )
        .await;
    allowed("VR-024b", &r, State::ReadyForBuilding, 1);
    assert!(r.decision.as_ref().unwrap().replayed);
    // The new command key is bound to the replay.
    let again = h
        .as_role(
            Role::Materializer,
            materialize("vr024-command-2", "vr024-logical-key", source.clone()),
        )
        .await;
    assert!(again.decision.unwrap().replayed);
    let mut other = source.clone();
    other["id"] = json!("wi-024-other");
    rejected(
        "VR-024c",
        &h.as_role(
            Role::Materializer,
            materialize("vr024-command-3", "vr024-logical-key", other),
        )
        .await,
        Code::PreconditionFailed,
    );
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_025_changed_source_conflicts<S: WorkStore + 'static>(h: Harness<S>) {
    let source = json!({"id": "wi-025", "change_type": "undefined", "readiness": complete_readiness(), "priority": "normal"});
    h.as_role(
        Role::Materializer,
        materialize("vr025-command-1", "vr025-logical-key", source.clone()),
    )
    .await;
    let mut priority_only = source.clone();
    priority_only["priority"] = json!("urgent");
    let r = h
        .as_role(
            Role::Materializer,
            materialize("vr025-priority", "vr025-logical-key", priority_only),
        )
        .await;
    assert!(r.ok, "priority alone is not a conflict");
    let mut changed = source.clone();
    changed["readiness"]["policy_compatible"] = json!(false);
    let r = h
        .as_role(
            Role::Materializer,
            materialize("vr025-command-2", "vr025-logical-key", changed),
        )
        .await;
    rejected("VR-025", &r, Code::IdempotencyConflict);
    assert_eq!(detail(&r, "conflict_kind"), "materialization-source");
    assert_eq!(
        r.error.as_ref().unwrap().retry,
        protobot_lifecycle::Retry::Reconcile
    );
    let mut target = source;
    target["expected_merge"] = json!({"target": "main"});
    rejected(
        "VR-025 target",
        &h.as_role(
            Role::Materializer,
            materialize("vr025-command-3", "vr025-logical-key", target),
        )
        .await,
        Code::IdempotencyConflict,
    );
    assert_eq!(h.record("wi-025").await.contract_version, 1);
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_026_recover_an_expired_lease<S: WorkStore + 'static>(h: Harness<S>) {
    let mut rec = leased(
        item("wi-1", State::Building, 9),
        "job-site-old",
        "fence-x",
        -1,
    );
    rec.reconciliation = evidence("lease-recovered", "none");
    h.seed(rec).await;
    let r = h
        .as_role(
            Role::Reconciler,
            cmd(Command::RecoverLease, "wi-1", State::Building, 9, "vr026"),
        )
        .await;
    allowed("VR-026", &r, State::ReadyForBuilding, 10);
    assert!(r.decision.unwrap().fencing_token_issued.is_none());
    let rec = h.record("wi-1").await;
    assert_eq!(rec.lease, None);
    assert_eq!(
        rec.reconciliation, None,
        "VR-051: stale evidence is not reusable"
    );
}

pub async fn vr_027_abandon_unintegrated_work<S: WorkStore + 'static>(h: Harness<S>) {
    let mut rec = leased(
        item("wi-1", State::Building, 9),
        "job-site-a",
        "fence-1",
        3600,
    );
    rec.reconciliation = evidence("not-integrated", "none");
    h.seed(rec).await;
    let r = h
        .as_role(
            Role::HumanMaintainer,
            cmd(Command::Abandon, "wi-1", State::Building, 9, "vr027")
                .payload(json!({"cancellation_confirmed": true})),
        )
        .await;
    allowed("VR-027", &r, State::Abandoned, 10);
    assert_eq!(h.record("wi-1").await.lease, None);
}

pub async fn vr_028_029_invalid_contexts_fail_closed<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::ReadyForBuilding, 4)).await;
    type Mutate = fn(&mut AuthorizationContext);
    let cases: [(&str, Mutate); 9] = [
        ("VR-028-missing-subject", |c| c.subject.clear()),
        ("VR-028-missing-project", |c| c.project_id.clear()),
        ("VR-028-other-project", |c| c.project_id = "other".into()),
        ("VR-028-unknown-role", |c| c.role = "worker".into()),
        ("VR-028-expired", |c| c.expires_at = Some(eval_time())),
        ("VR-029-empty-actions", |c| c.allowed_actions.clear()),
        ("VR-029-wildcard-action", |c| {
            c.allowed_actions = vec!["*".into()]
        }),
        ("VR-029-wildcard-ref", |c| {
            c.allowed_refs = vec![" ALL ".into()]
        }),
        ("VR-028-no-policy", |c| c.policy_version.clear()),
    ];
    for (i, (case, mutate)) in cases.iter().enumerate() {
        let mut ctx = h.ctx(Role::JobSite);
        mutate(&mut ctx);
        let r = h
            .run(
                &ctx,
                cmd(
                    Command::Claim,
                    "wi-1",
                    State::ReadyForBuilding,
                    4,
                    &format!("vr028-{i}"),
                ),
            )
            .await;
        rejected(case, &r, Code::UnauthorizedAction);
    }
    let mut env = cmd(
        Command::Claim,
        "wi-1",
        State::ReadyForBuilding,
        4,
        "vr029-downgrade",
    );
    env.policy_version = "wms-policy/older".into();
    rejected(
        "VR-029-policy-downgrade",
        &h.as_role(Role::JobSite, env).await,
        Code::UnauthorizedAction,
    );
    let r = h
        .store
        .execute(
            None,
            &cmd(
                Command::Claim,
                "wi-1",
                State::ReadyForBuilding,
                4,
                "vr029-noref",
            ),
            h.now,
        )
        .await
        .unwrap();
    rejected("unresolvable actor reference", &r, Code::UnauthorizedAction);
    assert_eq!(
        h.record("wi-1").await,
        item("wi-1", State::ReadyForBuilding, 4)
    );
    assert_eq!(h.audits().await, 0);
    let mut env = cmd(
        Command::Claim,
        "wi-1",
        State::ReadyForBuilding,
        4,
        "vr029-exact",
    );
    env.policy_version = POLICY.into();
    let r = h.as_role(Role::JobSite, env).await;
    allowed("VR-029-policy-echo-exact", &r, State::Building, 5);
    assert_eq!(r.decision.unwrap().policy_version, POLICY);
}

pub async fn vr_030_to_032_resolve_block_binding_failures<S: WorkStore + 'static>(h: Harness<S>) {
    type Mutate = fn(&mut ApprovalRecord);
    let cases: [(&str, Mutate); 6] = [
        ("VR-030-cross-item", |a| {
            a.work_item_id = Some("wi-other".into())
        }),
        ("VR-030-wrong-kind", |a| {
            a.resolution_kind = Some("out-of-scope".into())
        }),
        ("VR-031-expired", |a| a.expires_at = Some(eval_time())),
        ("VR-031-revoked", |a| a.status = "revoked".into()),
        ("VR-031-consumed", |a| a.status = "consumed".into()),
        ("VR-031-digest-mismatch", |a| {
            a.resolution_digest = "other-digest".into()
        }),
    ];
    h.seed(item("wi-1", State::Blocked, 7)).await;
    h.seed_change_set("CS-1", "").await;
    let sub = accepted_submission(
        &h,
        resolution_approval("ap-1", "wi-1", "impact-amendment", Some("CS-1"), "human-1"),
        "impact-amendment",
        Some("CS-1"),
    )
    .await;
    let good = h.store.approval("ap-1").await.unwrap().unwrap();
    for (i, (case, mutate)) in cases.iter().enumerate() {
        let mut a = good.clone();
        mutate(&mut a);
        h.seed_approval(a).await;
        let r = h
            .as_role(
                Role::Materializer,
                resolve(
                    "wi-1",
                    "ap-1",
                    "impact-amendment",
                    &sub,
                    &format!("vr030-{i}"),
                ),
            )
            .await;
        rejected(case, &r, Code::UnauthorizedAction);
        assert_eq!(h.record("wi-1").await.state, State::Blocked, "{case}");
    }
    h.seed_approval(good).await;
    for (case, field) in [
        ("VR-032-missing-approval-id", "approval"),
        ("VR-032-missing-digest", "approval_resolution_digest"),
        ("VR-032-missing-submission-id", "resolution_submission_id"),
    ] {
        let mut env = resolve(
            "wi-1",
            "ap-1",
            "impact-amendment",
            &sub,
            &format!("vr032-{field}"),
        );
        if field == "approval" {
            env.human_approval_id.clear();
        } else if let Some(p) = env.payload.as_mut() {
            p.as_object_mut().unwrap().remove(field);
        }
        rejected(
            case,
            &h.as_role(Role::Materializer, env).await,
            Code::UnauthorizedAction,
        );
    }
    assert_eq!(h.approval_status("ap-1").await, "unused");
    assert_eq!(h.record("wi-1").await.contract_version, 7);
    assert_eq!(h.audits().await, 1, "only the submission was audited");
}

pub async fn vr_033_resolve_block_replay_does_not_recheck_the_approval<S: WorkStore + 'static>(
    h: Harness<S>,
) {
    h.seed(item("wi-1", State::Blocked, 7)).await;
    h.seed_change_set("CS-1", "").await;
    let sub = accepted_submission(
        &h,
        resolution_approval("ap-1", "wi-1", "impact-amendment", Some("CS-1"), "human-1"),
        "impact-amendment",
        Some("CS-1"),
    )
    .await;
    let env = resolve("wi-1", "ap-1", "impact-amendment", &sub, "vr033-resolve");
    allowed(
        "VR-033 first",
        &h.as_role(Role::Materializer, env.clone()).await,
        State::ReadyForBuilding,
        8,
    );
    let r = h.as_role(Role::Materializer, env).await;
    allowed("VR-033", &r, State::ReadyForBuilding, 8);
    assert!(r.decision.unwrap().replayed);
    assert_eq!(h.audits().await, 2);
}

pub async fn vr_034_038_reconciler_merge_conflict<S: WorkStore + 'static>(h: Harness<S>) {
    let mut rec = item("wi-1", State::Merging, 9);
    rec.reconciliation = evidence("conflict", "conflict");
    h.seed(rec).await;
    let forged = json!({"merge_envelope": {"target": "forged", "contract_version": 999}});
    let r = h
        .as_role(
            Role::Reconciler,
            cmd(Command::MergeConflict, "wi-1", State::Merging, 9, "vr034").payload(forged),
        )
        .await;
    allowed("VR-034/VR-038", &r, State::ReadyForBuilding, 10);
    assert!(r.decision.unwrap().fencing_token_issued.is_none());
    assert_eq!(
        h.record("wi-1").await.reconciliation,
        None,
        "evidence cleared"
    );
}

pub async fn vr_035_reconciled_record_merge_uses_observed_evidence<S: WorkStore + 'static>(
    h: Harness<S>,
) {
    for (id, payload) in [
        ("wi-empty", json!({})),
        (
            "wi-forged",
            json!({"merge_envelope": {"target": "forged", "contract_version": 999, "merge_commit": "evil"}}),
        ),
    ] {
        let mut rec = item(id, State::Merging, 9);
        rec.expected_merge = Some(candidate(9, ""));
        rec.reconciliation = Some(Reconciliation {
            status: "merge-recorded".into(),
            git_mutation: "merged".into(),
            merge_envelope: Some(candidate(9, "merge-035")),
        });
        h.seed(rec).await;
        let env = cmd(
            Command::RecordMerge,
            id,
            State::Merging,
            9,
            &format!("vr035-{id}"),
        )
        .payload(payload);
        allowed(
            "VR-035",
            &h.as_role(Role::Reconciler, env.clone()).await,
            State::Completed,
            10,
        );
        assert!(
            h.as_role(Role::Reconciler, env)
                .await
                .decision
                .unwrap()
                .replayed,
            "VR-035 retry replays"
        );
        let stored = h.record(id).await.reconciliation.unwrap();
        assert_eq!(
            stored.merge_envelope,
            Some(candidate(9, "merge-035")),
            "the observed envelope, not the payload"
        );
    }
    assert_eq!(h.audits().await, 2);
}

pub async fn vr_036_fenced_merge_commands_need_the_live_fence<S: WorkStore + 'static>(
    h: Harness<S>,
) {
    let mut rec = leased(
        item("wi-1", State::Merging, 9),
        "job-site-a",
        "fence-036",
        3600,
    );
    rec.expected_merge = Some(candidate(9, ""));
    h.seed(rec).await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::MergeConflict, "wi-1", State::Merging, 9, "vr036a"),
        )
        .await;
    rejected(
        "VR-036-merge-conflict-missing-fence",
        &r,
        Code::StaleFencingToken,
    );
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::RecordMerge, "wi-1", State::Merging, 9, "vr036b")
                .fence("fence-old")
                .payload(json!({"merge_envelope": candidate(9, "merge-1")})),
        )
        .await;
    rejected(
        "VR-036-record-merge-stale-fence",
        &r,
        Code::StaleFencingToken,
    );
    assert_eq!(h.audits().await, 0);
}

pub async fn vr_037_mismatched_evidence_is_a_failed_precondition<S: WorkStore + 'static>(
    h: Harness<S>,
) {
    for (i, command) in [
        Command::MergeConflict,
        Command::MergeNotApplied,
        Command::RecordMerge,
    ]
    .into_iter()
    .enumerate()
    {
        let id = format!("wi-{i}");
        let mut rec = item(&id, State::Merging, 9);
        rec.expected_merge = Some(candidate(9, ""));
        rec.reconciliation = evidence("conflict", "none");
        h.seed(rec.clone()).await;
        let r = h
            .as_role(
                Role::Reconciler,
                cmd(command, &id, State::Merging, 9, &format!("vr037-{i}")),
            )
            .await;
        rejected(&format!("VR-037-{command}"), &r, Code::PreconditionFailed);
        assert_eq!(h.record(&id).await, rec, "record unchanged");
    }
    assert_eq!(h.audits().await, 0);
}

pub async fn vr_039_omitted_materialization<S: WorkStore + 'static>(h: Harness<S>) {
    let source = json!({"id": "wi-039", "change_type": "changes", "implementation_required": false, "readiness": complete_readiness()});
    let r = h
        .as_role(
            Role::Materializer,
            materialize("vr039-command-1", "vr039-logical-key", source.clone()),
        )
        .await;
    assert!(
        r.ok && r.outcome == protobot_lifecycle::EnvelopeOutcome::Applied,
        "VR-039a"
    );
    let d = r.decision.as_ref().unwrap();
    assert_eq!(d.outcome, protobot_lifecycle::DecisionOutcome::Omitted);
    assert_eq!(d.after, None);
    assert_eq!(
        d.materialization_reservation.as_ref().unwrap().outcome,
        "omitted"
    );
    assert_eq!(r.fields["submission"], "omitted");
    assert!(
        h.store.get("wi-039").await.unwrap().is_none(),
        "no work item"
    );
    let r = h
        .as_role(
            Role::Materializer,
            materialize("vr039-command-2", "vr039-logical-key", source.clone()),
        )
        .await;
    assert!(
        r.decision.as_ref().unwrap().replayed && r.mutation == protobot_lifecycle::Mutation::None,
        "VR-039b"
    );
    let mut other = source;
    other["priority"] = json!("high");
    other["readiness"]["policy_compatible"] = json!(false);
    rejected(
        "VR-039c",
        &h.as_role(
            Role::Materializer,
            materialize("vr039-command-3", "vr039-logical-key", other),
        )
        .await,
        Code::IdempotencyConflict,
    );
    assert!(h.store.get("wi-039").await.unwrap().is_none());
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_040_wrong_evidence_blocks_recovery_and_abandon<S: WorkStore + 'static>(
    h: Harness<S>,
) {
    let mut a = leased(item("wi-a", State::Building, 9), "job-site-old", "f", -1);
    a.reconciliation = evidence("lease-recovered", "conflict");
    let mut b = item("wi-b", State::Building, 9);
    b.reconciliation = evidence("not-integrated", "merged");
    h.seed(a.clone()).await;
    h.seed(b.clone()).await;
    rejected(
        "VR-040-recover-lease",
        &h.as_role(
            Role::Reconciler,
            cmd(Command::RecoverLease, "wi-a", State::Building, 9, "vr040a"),
        )
        .await,
        Code::PreconditionFailed,
    );
    rejected(
        "VR-040-abandon",
        &h.as_role(
            Role::HumanMaintainer,
            cmd(Command::Abandon, "wi-b", State::Building, 9, "vr040b")
                .payload(json!({"cancellation_confirmed": true})),
        )
        .await,
        Code::PreconditionFailed,
    );
    assert_eq!((h.record("wi-a").await, h.record("wi-b").await), (a, b));
    let mut live = leased(item("wi-c", State::Building, 9), "job-site-a", "f", 3600);
    live.reconciliation = evidence("lease-recovered", "none");
    h.seed(live).await;
    rejected(
        "recover-lease on a live lease",
        &h.as_role(
            Role::Reconciler,
            cmd(Command::RecoverLease, "wi-c", State::Building, 9, "vr040c"),
        )
        .await,
        Code::PreconditionFailed,
    );
}

pub async fn vr_042_approval_principal_and_human_must_match<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::Blocked, 7)).await;
    h.seed_change_set("CS-1", "").await;
    let sub = accepted_submission(
        &h,
        resolution_approval(
            "ap-1",
            "wi-1",
            "impact-amendment",
            Some("CS-1"),
            "human-042",
        ),
        "impact-amendment",
        Some("CS-1"),
    )
    .await;
    let good = h.store.approval("ap-1").await.unwrap().unwrap();
    let mut a = good.clone();
    a.delegated_principal = "another-materializer".into();
    h.seed_approval(a).await;
    rejected(
        "VR-042-delegated-principal",
        &h.as_role(
            Role::Materializer,
            resolve("wi-1", "ap-1", "impact-amendment", &sub, "vr042a"),
        )
        .await,
        Code::UnauthorizedAction,
    );
    let mut a = good;
    a.approved_subject = "different-human".into();
    h.seed_approval(a).await;
    rejected(
        "VR-042-approved-human",
        &h.as_role(
            Role::Materializer,
            resolve("wi-1", "ap-1", "impact-amendment", &sub, "vr042b"),
        )
        .await,
        Code::UnauthorizedAction,
    );
    assert_eq!(h.approval_status("ap-1").await, "unused");
}

pub async fn vr_043_only_the_active_submission_resolves<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::Blocked, 7)).await;
    h.seed_change_set("CS-1", "").await;
    let first = accepted_submission(
        &h,
        resolution_approval("ap-1", "wi-1", "impact-amendment", Some("CS-1"), "human-1"),
        "impact-amendment",
        Some("CS-1"),
    )
    .await;
    let _second = accepted_submission(
        &h,
        resolution_approval("ap-2", "wi-1", "impact-amendment", Some("CS-1"), "human-1"),
        "impact-amendment",
        Some("CS-1"),
    )
    .await;
    assert_eq!(h.approval_status("ap-1").await, "revoked");
    assert_eq!(
        h.store.submission(&first).await.unwrap().unwrap().status,
        "superseded"
    );
    rejected(
        "VR-043-superseded",
        &h.as_role(
            Role::Materializer,
            resolve("wi-1", "ap-1", "impact-amendment", &first, "vr043a"),
        )
        .await,
        Code::UnauthorizedAction,
    );
    rejected(
        "VR-043-non-active-id",
        &h.as_role(
            Role::Materializer,
            resolve(
                "wi-1",
                "ap-2",
                "impact-amendment",
                "vr043-other-submission",
                "vr043b",
            ),
        )
        .await,
        Code::UnauthorizedAction,
    );
    assert_eq!(h.audits().await, 2);
}

pub async fn vr_044_046_planned_dependency_must_complete<S: WorkStore + 'static>(h: Harness<S>) {
    let mut blocked = item("wi-1", State::Blocked, 7);
    blocked.dependencies = vec![Dependency {
        id: "existing-dependency".into(),
        state: State::Completed,
    }];
    h.seed(blocked).await;
    h.seed(item("existing-dependency", State::Completed, 2))
        .await;
    let mut planned = item("wi-046-planned", State::Merging, 9);
    planned.expected_merge = Some(candidate(9, ""));
    planned.reconciliation = Some(Reconciliation {
        status: "merge-recorded".into(),
        git_mutation: "merged".into(),
        merge_envelope: Some(candidate(9, "merge-046")),
    });
    h.seed(planned).await;
    h.seed_change_set("CS-046", "wi-046-planned").await;
    let sub = accepted_submission(
        &h,
        resolution_approval("ap-1", "wi-1", "add-requirement", Some("CS-046"), "human-1"),
        "add-requirement",
        Some("CS-046"),
    )
    .await;
    let r = h
        .as_role(
            Role::Materializer,
            resolve(
                "wi-1",
                "ap-1",
                "add-requirement",
                &sub,
                "vr046-resolve-before-completion",
            ),
        )
        .await;
    rejected("VR-044/VR-046a", &r, Code::PreconditionFailed);
    assert_eq!(detail(&r, "blocking_dependency"), "CS-046");
    assert_eq!(r.fields["approval_status"], "unused");
    let rec = h.record("wi-1").await;
    assert_eq!(
        rec.dependencies.len(),
        1,
        "the planned dependency is never copied onto the item"
    );
    allowed(
        "VR-046b",
        &h.as_role(
            Role::Reconciler,
            cmd(
                Command::RecordMerge,
                "wi-046-planned",
                State::Merging,
                9,
                "vr046b",
            ),
        )
        .await,
        State::Completed,
        10,
    );
    let r = h
        .as_role(
            Role::Materializer,
            resolve(
                "wi-1",
                "ap-1",
                "add-requirement",
                &sub,
                "vr046-resolve-after-completion",
            ),
        )
        .await;
    allowed("VR-046c", &r, State::ReadyForBuilding, 8);
    assert_eq!(h.approval_status("ap-1").await, "consumed");
    assert_eq!(h.audits().await, 3);
}

pub async fn vr_045_preflight_after_matches_authoritative<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(leased(
        item("wi-1", State::Building, 4),
        "job-site-a",
        "fence-045",
        3600,
    ))
    .await;
    let pre = h
        .as_role(
            Role::JobSite,
            preflight(
                Command::TestsPass,
                "wi-1",
                State::Building,
                4,
                json!({"build_tests_passed": true}),
            )
            .fence("fence-045"),
        )
        .await;
    let auth = h
        .as_role(
            Role::JobSite,
            cmd(Command::TestsPass, "wi-1", State::Building, 4, "vr045a")
                .fence("fence-045")
                .payload(json!({"build_tests_passed": true})),
        )
        .await;
    assert_eq!(
        pre.decision.as_ref().unwrap().after,
        auth.decision.as_ref().unwrap().after,
        "VR-045a"
    );
    let pre = h
        .as_role(
            Role::JobSite,
            preflight(Command::RenewLease, "wi-1", State::Inspecting, 5, json!({}))
                .fence("fence-045"),
        )
        .await;
    assert_eq!(
        pre.decision
            .as_ref()
            .unwrap()
            .after
            .map(|a| (a.state, a.contract_version)),
        Some((State::Inspecting, 6)),
        "VR-045b"
    );
    let auth = h
        .as_role(
            Role::JobSite,
            cmd(Command::RenewLease, "wi-1", State::Inspecting, 5, "vr045b").fence("fence-045"),
        )
        .await;
    allowed(
        "VR-045b renew bumps the version",
        &auth,
        State::Inspecting,
        6,
    );
    assert_eq!(h.audits().await, 2);
}

pub async fn vr_047_payload_change_type_fills_the_contract<S: WorkStore + 'static>(h: Harness<S>) {
    let mut env = materialize(
        "vr047-command-1",
        "vr047-materialization-key",
        json!({"id": "wi-047", "change_type": "", "readiness": complete_readiness()}),
    );
    env.payload.as_mut().unwrap()["change_type"] = json!("undefined");
    allowed(
        "VR-047 first",
        &h.as_role(Role::Materializer, env.clone()).await,
        State::ReadyForBuilding,
        1,
    );
    assert_eq!(h.record("wi-047").await.change_type, "undefined");
    env.idempotency_key = "vr047-command-2".into();
    let r = h.as_role(Role::Materializer, env).await;
    assert!(r.decision.unwrap().replayed, "VR-047");
    let bad = materialize(
        "vr047-bad",
        "vr047-other",
        json!({"id": "wi-047b", "change_type": "feature", "readiness": complete_readiness()}),
    );
    let r = h.as_role(Role::Materializer, bad).await;
    rejected("INVALID_CHANGE_TYPE", &r, Code::InvalidChangeType);
    assert_eq!(detail(&r, "provided_type"), "feature");
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_048_payload_refs_must_be_in_scope<S: WorkStore + 'static>(h: Harness<S>) {
    let mut rec = leased(
        item("wi-1", State::Merging, 9),
        "job-site-a",
        "fence-049",
        3600,
    );
    rec.expected_merge = Some(candidate(9, ""));
    h.seed(rec).await;
    for missing in ["main", "head-1", "merge-1", "run-1"] {
        let mut ctx = h.ctx(Role::JobSite);
        ctx.allowed_refs.retain(|r| r != missing);
        let env = cmd(
            Command::RecordMerge,
            "wi-1",
            State::Merging,
            9,
            &format!("vr048-{missing}"),
        )
        .fence("fence-049")
        .payload(json!({"merge_envelope": candidate(9, "merge-1")}));
        rejected(
            &format!("VR-048-unscoped-{missing}"),
            &h.run(&ctx, env).await,
            Code::UnauthorizedAction,
        );
    }
    let mut ctx = h.ctx(Role::JobSite);
    ctx.allowed_refs.retain(|r| r != "head-1");
    let r = h
        .run(
            &ctx,
            preflight(
                Command::RecordMerge,
                "wi-1",
                State::Merging,
                9,
                json!({"merge_envelope": candidate(9, "merge-1")}),
            )
            .fence("fence-049"),
        )
        .await;
    preflight_rejected("VR-048-preflight-unscoped", &r, Code::UnauthorizedAction);
    let mut ctx = h.ctx(Role::Materializer);
    ctx.allowed_refs = vec![format!("project:{PROJECT}")];
    let source = json!({"id": "wi-048", "change_type": "undefined", "readiness": complete_readiness(), "expected_merge": {"target": "main"}});
    rejected(
        "VR-048-materialize-unscoped-target",
        &h.run(&ctx, materialize("vr048-m1", "vr048-key", source.clone()))
            .await,
        Code::UnauthorizedAction,
    );
    allowed(
        "VR-048-materialize-scoped-target",
        &h.as_role(
            Role::Materializer,
            materialize("vr048-m2", "vr048-key", source),
        )
        .await,
        State::ReadyForBuilding,
        1,
    );
    assert_eq!(
        h.record("wi-048").await.expected_merge.unwrap().target,
        "main"
    );
    let tested = json!({"id": "wi-048b", "change_type": "undefined", "readiness": complete_readiness(), "expected_merge": {"target": "main", "integration_head": "head-1", "inspection_run_id": "run-1", "product_tree_digest": "z"}});
    rejected(
        "VR-048-materialize-tested-candidate-fields",
        &h.as_role(
            Role::Materializer,
            materialize("vr048-m3", "vr048b-key", tested),
        )
        .await,
        Code::PreconditionFailed,
    );
    assert_eq!(h.record("wi-1").await.state, State::Merging);
}

pub async fn vr_049_an_unnamed_dependency_is_never_satisfied<S: WorkStore + 'static>(
    h: Harness<S>,
) {
    let source = json!({"id": "wi-049", "change_type": "undefined", "readiness": complete_readiness(), "dependencies": [{"id": "", "state": "completed"}]});
    allowed(
        "VR-049a",
        &h.as_role(
            Role::Materializer,
            materialize("vr049a", "vr049-key", source),
        )
        .await,
        State::Waiting,
        1,
    );
    let r = h
        .as_role(
            Role::Materializer,
            cmd(
                Command::RefreshDependencies,
                "wi-049",
                State::Waiting,
                1,
                "vr049b",
            ),
        )
        .await;
    rejected("VR-049b", &r, Code::PreconditionFailed);
    assert_eq!(h.record("wi-049").await.contract_version, 1);
    assert_eq!(h.audits().await, 1);
}

pub async fn vr_050_approval_must_bind_the_same_change_set<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::Blocked, 7)).await;
    h.seed_change_set("CS-1", "").await;
    let sub = accepted_submission(
        &h,
        resolution_approval("ap-1", "wi-1", "impact-amendment", Some("CS-1"), "human-1"),
        "impact-amendment",
        Some("CS-1"),
    )
    .await;
    for (i, cs) in [Some("CS-other"), None].into_iter().enumerate() {
        let mut a = h.store.approval("ap-1").await.unwrap().unwrap();
        a.change_set_id = cs.map(str::to_string);
        h.seed_approval(a).await;
        let r = h
            .as_role(
                Role::Materializer,
                resolve(
                    "wi-1",
                    "ap-1",
                    "impact-amendment",
                    &sub,
                    &format!("vr050-{i}"),
                ),
            )
            .await;
        rejected("VR-050", &r, Code::UnauthorizedAction);
        assert_eq!(r.fields["approval_status"], "unused");
    }
}

pub async fn vr_052_053_materialize_ignores_caller_evidence<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("dep", State::Blocked, 3)).await;
    let source = json!({
        "id": "wi-052", "change_type": "undefined", "readiness": complete_readiness(),
        "inspection_run_sealed": true, "findings_terminal": true, "final_tests_passed": true,
        "reconciliation": {"status": "merge-recorded", "git_mutation": "merged"},
        "owner": "intruder", "lease": {"owner": "intruder", "fencing_token": "x", "expires_at": "2030-01-01T00:00:00Z"},
    });
    allowed(
        "VR-052",
        &h.as_role(
            Role::Materializer,
            materialize("vr052", "vr052-key", source),
        )
        .await,
        State::ReadyForBuilding,
        1,
    );
    let rec = h.record("wi-052").await;
    assert!(!rec.inspection_run_sealed && !rec.findings_terminal && !rec.final_tests_passed);
    assert_eq!(
        (rec.reconciliation, rec.lease, rec.owner.as_str()),
        (None, None, "")
    );
    let source = json!({"id": "wi-053", "change_type": "undefined", "readiness": complete_readiness(), "dependencies": [{"id": "dep", "state": "completed"}]});
    allowed(
        "VR-053",
        &h.as_role(
            Role::Materializer,
            materialize("vr053", "vr053-key", source),
        )
        .await,
        State::Waiting,
        1,
    );
    assert_eq!(
        h.record("wi-053").await.dependencies[0].state,
        State::Blocked
    );
}

pub async fn vr_054_rework_clears_inspection_evidence<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(leased(
        item("wi-1", State::Inspecting, 4),
        "job-site-a",
        "fence-1",
        3600,
    ))
    .await;
    h.observe(
        "wi-1",
        Observation::Inspection {
            inspection_run_sealed: true,
            findings_terminal: true,
            final_tests_passed: true,
        },
    )
    .await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(
                Command::ReturnToBuilding,
                "wi-1",
                State::Inspecting,
                4,
                "vr054a",
            )
            .fence("fence-1")
            .payload(json!({"final_tests_failed": true})),
        )
        .await;
    let token = fence_of(&r);
    h.as_role(
        Role::JobSite,
        cmd(Command::TestsPass, "wi-1", State::Building, 5, "vr054b")
            .fence(&token)
            .payload(json!({"build_tests_passed": true})),
    )
    .await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::BeginMerge, "wi-1", State::Inspecting, 6, "vr054c")
                .fence(&token)
                .payload(json!({"merge_envelope": candidate(7, "")})),
        )
        .await;
    rejected("VR-054", &r, Code::PreconditionFailed);
    assert!(
        h.store
            .observe("wi-2", Observation::Readiness(Readiness::complete()))
            .await
            .is_err(),
        "observing an unknown item fails"
    );
}

pub async fn vr_055_not_found_results_are_keyed<S: WorkStore + 'static>(h: Harness<S>) {
    let claim = |id: &str, key: &str| cmd(Command::Claim, id, State::ReadyForBuilding, 1, key);
    rejected(
        "VR-055-1",
        &h.as_role(Role::JobSite, claim("X", "K")).await,
        Code::NotFound,
    );
    rejected(
        "VR-055-2",
        &h.as_role(Role::JobSite, claim("Y", "K")).await,
        Code::IdempotencyConflict,
    );
    let r = h.as_role(Role::JobSite, claim("X", "K")).await;
    assert_eq!(
        (r.code(), r.outcome),
        (
            Some(Code::NotFound),
            protobot_lifecycle::EnvelopeOutcome::Replayed
        ),
        "VR-055-3"
    );
    h.seed(item("X", State::ReadyForBuilding, 1)).await;
    h.seed(item("Z", State::ReadyForBuilding, 1)).await;
    let r = h.as_role(Role::JobSite, claim("X", "K")).await;
    assert_eq!(
        (r.code(), r.outcome),
        (
            Some(Code::NotFound),
            protobot_lifecycle::EnvelopeOutcome::Replayed
        ),
        "VR-055-4"
    );
    assert_eq!(h.record("X").await.state, State::ReadyForBuilding);
    rejected(
        "VR-055-5",
        &h.as_role(Role::JobSite, claim("Z", "K")).await,
        Code::IdempotencyConflict,
    );
    allowed(
        "VR-055-7",
        &h.as_role(Role::JobSite, claim("X", "K2")).await,
        State::Building,
        2,
    );
    rejected(
        "VR-055-unauthorized",
        &h.as_role(Role::DraftingTable, claim("W", "K3")).await,
        Code::NotFound,
    );
    allowed(
        "VR-055-unauthorized key untouched",
        &h.as_role(Role::JobSite, claim("Z", "K3")).await,
        State::Building,
        2,
    );
}

// === INV cases ===

pub async fn inv_01_to_10_invalid_transitions<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("waiting", State::Waiting, 4)).await;
    h.seed(item("blocked", State::Blocked, 4)).await;
    h.seed(leased(
        item("ready-leased", State::ReadyForBuilding, 4),
        "job-site-a",
        "f",
        3600,
    ))
    .await;
    h.seed(item("ready", State::ReadyForBuilding, 4)).await;
    h.seed(leased(
        item("building", State::Building, 4),
        "job-site-b",
        "f",
        3600,
    ))
    .await;
    h.seed(leased(
        item("inspecting", State::Inspecting, 4),
        "job-site-b",
        "f",
        3600,
    ))
    .await;
    h.seed(leased(
        item("mine-building", State::Building, 4),
        "job-site-a",
        "f",
        3600,
    ))
    .await;
    h.seed(leased(
        item("mine-inspecting", State::Inspecting, 4),
        "job-site-a",
        "f",
        3600,
    ))
    .await;
    h.seed(item("merging", State::Merging, 4)).await;
    h.seed(item("completed", State::Completed, 4)).await;
    h.seed(item("abandoned", State::Abandoned, 4)).await;
    let js = Role::JobSite;
    let cases: Vec<(&str, Role, OperationEnvelope, Code)> = vec![
        (
            "INV-01",
            js,
            cmd(Command::Claim, "waiting", State::ReadyForBuilding, 4, "i1"),
            Code::StaleState,
        ),
        (
            "INV-01b",
            js,
            cmd(Command::Claim, "blocked", State::ReadyForBuilding, 4, "i1b"),
            Code::StaleState,
        ),
        (
            "INV-02",
            js,
            cmd(Command::Claim, "waiting", State::Waiting, 4, "i2"),
            Code::InvalidTransition,
        ),
        (
            "INV-02b",
            js,
            cmd(Command::Claim, "blocked", State::Blocked, 4, "i2b"),
            Code::InvalidTransition,
        ),
        (
            "INV-03",
            js,
            cmd(Command::Claim, "building", State::Building, 4, "i3"),
            Code::DuplicateClaim,
        ),
        (
            "INV-03b",
            js,
            cmd(Command::Claim, "inspecting", State::Inspecting, 4, "i3b"),
            Code::DuplicateClaim,
        ),
        (
            "INV-04",
            js,
            cmd(
                Command::ReturnToBuilding,
                "blocked",
                State::Blocked,
                4,
                "i4",
            )
            .payload(json!({"in_contract_defect": true})),
            Code::StaleFencingToken,
        ),
        (
            "INV-05",
            Role::Reconciler,
            cmd(
                Command::RecordMerge,
                "ready",
                State::ReadyForBuilding,
                4,
                "i5",
            ),
            Code::InvalidTransition,
        ),
        (
            "INV-05b",
            js,
            cmd(
                Command::TestsPass,
                "ready-leased",
                State::ReadyForBuilding,
                4,
                "i5b",
            )
            .fence("f")
            .payload(json!({"build_tests_passed": true})),
            Code::InvalidTransition,
        ),
        (
            "INV-06",
            js,
            cmd(
                Command::BeginMerge,
                "mine-building",
                State::Building,
                4,
                "i6",
            )
            .fence("f"),
            Code::InvalidTransition,
        ),
        (
            "INV-07",
            js,
            cmd(
                Command::RecordMerge,
                "mine-inspecting",
                State::Inspecting,
                4,
                "i7",
            )
            .fence("f"),
            Code::InvalidTransition,
        ),
        (
            "INV-08",
            Role::HumanMaintainer,
            cmd(Command::Abandon, "merging", State::Merging, 4, "i8")
                .payload(json!({"cancellation_confirmed": true})),
            Code::InvalidTransition,
        ),
        (
            "INV-09",
            js,
            cmd(Command::Claim, "completed", State::Completed, 4, "i9"),
            Code::AlreadyTerminal,
        ),
        (
            "INV-09b",
            js,
            cmd(Command::RenewLease, "abandoned", State::Abandoned, 4, "i9b"),
            Code::AlreadyTerminal,
        ),
        (
            "INV-10",
            js,
            cmd(
                Command::RenewLease,
                "mine-building",
                State::Building,
                4,
                "i10",
            ),
            Code::StaleFencingToken,
        ),
    ];
    for (case, role, env, code) in cases {
        rejected(case, &h.as_role(role, env).await, code);
    }
    assert_eq!(h.audits().await, 0);
}

// === concurrency, leases, ledger, observations ===

/// 16 Job Sites race for one ready item: exactly one wins; the rest lose with
/// `DUPLICATE_CLAIM` or a stale expectation, and the record moved exactly once.
pub async fn sixteen_racing_claims_have_exactly_one_winner<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-race", State::ReadyForBuilding, 1)).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = Arc::clone(&h.store);
        let ctx = h.ctx_as(Role::JobSite, &format!("job-site-{i:02}"));
        let now = h.now;
        tasks.push(tokio::spawn(async move {
            let env = cmd(
                Command::Claim,
                "wi-race",
                State::ReadyForBuilding,
                1,
                &format!("race-{i}"),
            );
            store.execute(Some(&ctx), &env, now).await.unwrap()
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        if r.ok {
            winners.push(r);
        } else {
            let code = r.code().unwrap();
            assert!(
                matches!(
                    code,
                    Code::DuplicateClaim | Code::StaleState | Code::StaleContractVersion
                ),
                "a losing claim got {code}"
            );
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim wins");
    let rec = h.record("wi-race").await;
    assert_eq!((rec.state, rec.contract_version), (State::Building, 2));
    assert_eq!(rec.lease.unwrap().fencing_token, fence_of(&winners[0]));
    assert_eq!(h.audits().await, 1);
}

/// After expiry and `recover-lease`, the old holder's token is dead even when
/// it refreshes its expectations.
pub async fn old_fence_is_rejected_after_lease_recovery<S: WorkStore + 'static>(mut h: Harness<S>) {
    h.seed(item("wi-1", State::ReadyForBuilding, 1)).await;
    let a = h.ctx_as(Role::JobSite, "job-site-a");
    let b = h.ctx_as(Role::JobSite, "job-site-b");
    let old = fence_of(
        &h.run(
            &a,
            cmd(
                Command::Claim,
                "wi-1",
                State::ReadyForBuilding,
                1,
                "a-claim",
            ),
        )
        .await,
    );
    let renewed = h
        .run(
            &a,
            cmd(Command::RenewLease, "wi-1", State::Building, 2, "a-renew").fence(&old),
        )
        .await;
    allowed("renew", &renewed, State::Building, 3);
    h.now += SignedDuration::from_mins(16);
    let r = h
        .run(
            &a,
            cmd(Command::RenewLease, "wi-1", State::Building, 3, "a-late").fence(&old),
        )
        .await;
    rejected("renew after expiry", &r, Code::StaleFencingToken);
    assert_eq!(detail(&r, "fence_status"), "expired");
    h.observe(
        "wi-1",
        Observation::Reconciliation(Reconciliation {
            status: "lease-recovered".into(),
            git_mutation: "none".into(),
            merge_envelope: None,
        }),
    )
    .await;
    allowed(
        "recover",
        &h.as_role(
            Role::Reconciler,
            cmd(Command::RecoverLease, "wi-1", State::Building, 3, "recover"),
        )
        .await,
        State::ReadyForBuilding,
        4,
    );
    let r = h
        .run(
            &a,
            cmd(
                Command::TestsPass,
                "wi-1",
                State::ReadyForBuilding,
                4,
                "a-zombie",
            )
            .fence(&old)
            .payload(json!({"build_tests_passed": true})),
        )
        .await;
    rejected("old token after recovery", &r, Code::StaleFencingToken);
    let fresh = fence_of(
        &h.run(
            &b,
            cmd(
                Command::Claim,
                "wi-1",
                State::ReadyForBuilding,
                4,
                "b-claim",
            ),
        )
        .await,
    );
    assert_ne!(fresh, old, "fencing tokens are never reused");
    let r = h
        .run(
            &a,
            cmd(Command::TestsPass, "wi-1", State::Building, 5, "a-zombie-2")
                .fence(&old)
                .payload(json!({"build_tests_passed": true})),
        )
        .await;
    rejected(
        "old token against the new owner",
        &r,
        Code::StaleFencingToken,
    );
    assert_eq!(detail(&r, "fence_status"), "owner-mismatch");
    assert_eq!(h.record("wi-1").await.owner, "job-site-b");
}

pub async fn inspection_is_observed_only_while_inspecting<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::Building, 2)).await;
    let err = h
        .store
        .observe(
            "wi-1",
            Observation::Inspection {
                inspection_run_sealed: true,
                findings_terminal: true,
                final_tests_passed: true,
            },
        )
        .await;
    assert!(
        err.is_err(),
        "inspection evidence outside inspecting is refused"
    );
    assert!(!h.record("wi-1").await.inspection_run_sealed);
    h.observe("wi-1", Observation::Readiness(Readiness::complete()))
        .await;
    assert_eq!(
        h.record("wi-1").await.contract_version,
        2,
        "observations never bump the version"
    );
}

fn attempt(cycle: u32, outcome: &str) -> protobot_lifecycle::AttemptRecord {
    protobot_lifecycle::AttemptRecord {
        cycle,
        tier: "t1".into(),
        outcome: outcome.into(),
        candidate_commit: String::new(),
        feedback: Value::Null,
        started_at: None,
        finished_at: eval_time(),
    }
}

pub async fn attempts_are_fenced_idempotent_and_bounded<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(leased(
        item("wi-1", State::Building, 2),
        "js",
        "fence-1",
        60,
    ))
    .await;
    let observe = |token: &str, a: protobot_lifecycle::AttemptRecord| {
        h.store.observe(
            "wi-1",
            Observation::Attempt {
                fencing_token: token.into(),
                attempt: a,
            },
        )
    };
    let stale = observe("fence-0", attempt(1, "test")).await;
    assert!(
        matches!(stale, Err(StoreError::ObservationRejected(_))),
        "a stale fence cannot record an attempt: {stale:?}"
    );
    assert!(h.record("wi-1").await.attempts.is_empty());
    observe("fence-1", attempt(1, "test")).await.unwrap();
    observe("fence-1", attempt(1, "implementation"))
        .await
        .unwrap();
    let rec = h.record("wi-1").await;
    assert_eq!(
        rec.attempts.len(),
        1,
        "a retried cycle replaces its attempt"
    );
    assert_eq!(rec.attempts[0].outcome, "implementation");
    assert_eq!(
        rec.contract_version, 2,
        "observations never bump the version"
    );
    for cycle in 2..=40 {
        observe("fence-1", attempt(cycle, "test")).await.unwrap();
    }
    let rec = h.record("wi-1").await;
    assert_eq!(rec.attempts.len(), protobot_lifecycle::ATTEMPTS_KEPT);
    assert_eq!(rec.attempts.first().map(|a| a.cycle), Some(9));
    assert_eq!(rec.attempts.last().map(|a| a.cycle), Some(40));
    h.seed(item("wi-2", State::ReadyForBuilding, 1)).await;
    let unleased = h
        .store
        .observe(
            "wi-2",
            Observation::Attempt {
                fencing_token: protobot_lifecycle::FencingToken::default(),
                attempt: attempt(1, "test"),
            },
        )
        .await;
    assert!(unleased.is_err(), "an unleased item takes no attempts");
}

/// Issue 34: the Job Site's reading of a run's model usage is fenced like an attempt,
/// idempotent by run id (a re-read keeps the larger reading, never the sum), summed per stage
/// and tier, survives the backend's round trip, and never bumps the contract version.
pub async fn run_usage_is_fenced_idempotent_and_summed<S: WorkStore + 'static>(h: Harness<S>) {
    use protobot_usage::{RunSpend, Spend, Stage, TokenCounts};
    h.seed(leased(
        item("wi-1", State::Building, 2),
        "js",
        "fence-1",
        60,
    ))
    .await;
    let reading = |run: &str, stage: Stage, calls: u64, input: u64| RunSpend {
        run_id: run.into(),
        stage,
        tier: "t1".into(),
        spend: Spend {
            calls,
            tokens: TokenCounts {
                input,
                ..TokenCounts::default()
            },
            cost_microdollars: input * 2,
            ..Spend::default()
        },
    };
    let observe = |token: &str, run: RunSpend| {
        h.store.observe(
            "wi-1",
            Observation::Usage {
                fencing_token: token.into(),
                run,
            },
        )
    };
    let stale = observe("fence-0", reading("wi-1-c1-a", Stage::WorkerA, 1, 10)).await;
    assert!(
        matches!(stale, Err(StoreError::ObservationRejected(_))),
        "a stale fence cannot record usage: {stale:?}"
    );
    assert!(h.record("wi-1").await.usage.is_empty());
    observe("fence-1", reading("wi-1-c1-a", Stage::WorkerA, 1, 10))
        .await
        .unwrap();
    observe("fence-1", reading("wi-1-c1-a", Stage::WorkerA, 2, 30))
        .await
        .unwrap();
    observe("fence-1", reading("wi-1-c1-a", Stage::WorkerA, 2, 30))
        .await
        .unwrap();
    observe("fence-1", reading("wi-1-c1-b", Stage::WorkerB, 1, 5))
        .await
        .unwrap();
    let rec = h.record("wi-1").await;
    assert_eq!(
        rec.contract_version, 2,
        "observations never bump the version"
    );
    let summary = rec.usage.summary();
    assert_eq!(summary.runs, 2, "one entry per run id");
    assert_eq!(summary.total.calls, 3);
    assert_eq!(summary.total.tokens.input, 35, "re-reads are not added");
    assert_eq!(summary.by_stage[&Stage::WorkerA].tokens.input, 30);
    assert_eq!(summary.by_tier["t1"].cost_microdollars, 70);
    h.seed(item("wi-2", State::ReadyForBuilding, 1)).await;
    let unleased = h
        .store
        .observe(
            "wi-2",
            Observation::Usage {
                fencing_token: protobot_lifecycle::FencingToken::default(),
                run: reading("wi-2-c1-a", Stage::WorkerA, 1, 1),
            },
        )
        .await;
    assert!(unleased.is_err(), "an unleased item takes no usage");
}

fn finding(id: &str, key: &str, body: Value) -> OperationEnvelope {
    OperationEnvelope {
        operation: "finding.create".into(),
        actor_context_ref: "ref".into(),
        work_item_id: id.into(),
        idempotency_key: key.into(),
        payload: Some(
            json!({"producer_key": "inspector-1/f-1", "producer": "inspector-1", "inspection_run_id": "run-1", "body": body}),
        ),
        ..OperationEnvelope::default()
    }
}

pub async fn findings_are_created_once_per_producer_key<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::Inspecting, 5)).await;
    let r = h
        .as_role(
            Role::JobSite,
            finding("wi-1", "f-a", json!({"summary": "missing null check"})),
        )
        .await;
    assert!(r.ok, "{:?}", r.error);
    assert_eq!(r.fields["sequence"], 1);
    let r = h
        .as_role(
            Role::JobSite,
            finding("wi-1", "f-b", json!({"summary": "missing null check"})),
        )
        .await;
    assert_eq!(
        (r.ok, r.fields["sequence"].clone()),
        (true, json!(1)),
        "same producer key returns the stored finding"
    );
    let r = h
        .as_role(
            Role::JobSite,
            finding("wi-1", "f-c", json!({"summary": "something else"})),
        )
        .await;
    rejected(
        "producer key reuse with another body",
        &r,
        Code::IdempotencyConflict,
    );
    rejected(
        "drafting table may not append",
        &h.as_role(Role::DraftingTable, finding("wi-1", "f-d", json!({})))
            .await,
        Code::UnauthorizedAction,
    );
    assert_eq!(h.store.findings("run-1").await.unwrap().len(), 1);
}

pub async fn malformed_payloads_are_invalid_requests<S: WorkStore + 'static>(h: Harness<S>) {
    h.seed(item("wi-1", State::ReadyForBuilding, 4)).await;
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::Claim, "wi-1", State::ReadyForBuilding, 4, "bad")
                .payload(json!({"surprise": 1})),
        )
        .await;
    rejected("unknown payload field", &r, Code::InvalidRequest);
    let r = h
        .as_role(
            Role::JobSite,
            cmd(Command::Claim, "wi-1", State::ReadyForBuilding, 4, ""),
        )
        .await;
    rejected("missing idempotency key", &r, Code::InvalidRequest);
    let mut env = cmd(Command::Claim, "wi-1", State::ReadyForBuilding, 4, "sched");
    env.operation = "schedule".into();
    rejected(
        "schedule is not an operation",
        &h.as_role(Role::JobSite, env).await,
        Code::UnauthorizedAction,
    );
    assert_eq!(h.record("wi-1").await.state, State::ReadyForBuilding);
}

/// Expands to one `#[tokio::test]` per conformance scenario for a backend.
///
/// `$make` is an async factory `|project: String, cfg: AdapterConfig| async { store }`.
#[macro_export]
macro_rules! workstore_conformance {
    ($make:expr) => {
        $crate::workstore_conformance!(@cases $make;
            vr_001_claim_ready_item,
            vr_002_preflight_is_advisory_and_active_owner_wins,
            vr_003_claim_on_blocked_is_stale_state,
            vr_004_stale_contract_version,
            vr_005_second_claimer_gets_duplicate_claim,
            vr_006_roles_outside_the_family_are_unauthorized,
            vr_007_renew_with_an_old_fence_is_stale,
            vr_008_identical_claim_replays,
            vr_009_key_reuse_on_another_item_conflicts,
            vr_010_results_never_replay_across_principals,
            vr_011_and_041_claim_from_blocked_is_invalid,
            vr_012_rejections_are_frozen_under_the_key,
            vr_013_materialize_blocked_and_incomplete,
            vr_014_dependency_completion_unblocks_waiting,
            vr_015_tests_pass_then_begin_merge,
            vr_016_job_site_merge_conflict_reissues_the_fence,
            vr_017_merge_not_applied_returns_to_ready,
            vr_018_record_merge_replays_after_completion,
            vr_019_terminal_items_reject_everything,
            vr_020_refresh_active_reissues_the_fence,
            vr_020_refresh_active_blocks_on_a_failed_refresh,
            vr_021_return_to_building_reissues_the_fence,
            vr_022_submission_needs_a_real_approval,
            vr_023_add_requirement_resolution_end_to_end,
            vr_024_materialization_create_or_return,
            vr_025_changed_source_conflicts,
            vr_026_recover_an_expired_lease,
            vr_027_abandon_unintegrated_work,
            vr_028_029_invalid_contexts_fail_closed,
            vr_030_to_032_resolve_block_binding_failures,
            vr_033_resolve_block_replay_does_not_recheck_the_approval,
            vr_034_038_reconciler_merge_conflict,
            vr_035_reconciled_record_merge_uses_observed_evidence,
            vr_036_fenced_merge_commands_need_the_live_fence,
            vr_037_mismatched_evidence_is_a_failed_precondition,
            vr_039_omitted_materialization,
            vr_040_wrong_evidence_blocks_recovery_and_abandon,
            vr_042_approval_principal_and_human_must_match,
            vr_043_only_the_active_submission_resolves,
            vr_044_046_planned_dependency_must_complete,
            vr_045_preflight_after_matches_authoritative,
            vr_047_payload_change_type_fills_the_contract,
            vr_048_payload_refs_must_be_in_scope,
            vr_049_an_unnamed_dependency_is_never_satisfied,
            vr_050_approval_must_bind_the_same_change_set,
            vr_052_053_materialize_ignores_caller_evidence,
            vr_054_rework_clears_inspection_evidence,
            vr_055_not_found_results_are_keyed,
            inv_01_to_10_invalid_transitions,
            sixteen_racing_claims_have_exactly_one_winner,
            old_fence_is_rejected_after_lease_recovery,
            inspection_is_observed_only_while_inspecting,
            attempts_are_fenced_idempotent_and_bounded,
            run_usage_is_fenced_idempotent_and_summed,
            findings_are_created_once_per_producer_key,
            malformed_payloads_are_invalid_requests,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $case() {
                let make = $make;
                let store = make(
                    $crate::conformance::PROJECT.to_string(),
                    $crate::conformance::config(),
                ).await;
                $crate::conformance::$case($crate::conformance::Harness::new(store)).await;
            }
        )*
    };
}
