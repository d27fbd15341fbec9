//! The adapter tour: one sequence that calls every operation of the WMS
//! Adapter API at least once, rejections included (a duplicate request, a
//! forged fencing token, a missing object, an operation outside the caller's
//! role family), over seeds that make each call meaningful. The tour is how a
//! transport is shown to carry the adapter unchanged: `protobot wms`
//! (`operator/cli/tests/wms.rs`) and the operator's HTTP endpoint
//! (`e2e/tests/wms_api.rs`) each drive it and compare every answer with the
//! library's on a store seeded alike.
//!
//! A step's `fencing_token` of [`FENCE`] stands for the token the last call
//! issued; the driver substitutes it.
//!
//! Test support compiled into the library (feature `golden`); a malformed
//! step is a defect of this file and panics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use protobot_lifecycle::{Command as Cmd, OperationEnvelope, Readiness, Role, State};
use serde_json::{Value, json};

use crate::{
    ChangeSetRecord, Import, Observation, StoreError, WorkStore,
    conformance::{self, EnvelopeExt, cmd, evidence, item, leased, materialize},
};

/// The placeholder for the fencing token the previous step issued.
pub const FENCE: &str = "$FENCE";

/// The records and change set every store of the tour starts from.
pub fn seeds() -> Vec<Import> {
    let mut waiting = item("wi-wait", State::Waiting, 2);
    waiting.dependencies = vec![protobot_lifecycle::Dependency {
        id: "wi-done".into(),
        state: State::Completed,
    }];
    let mut blocked = item("wi-blocked", State::Blocked, 6);
    blocked.block_reason = "undefined-behavior: the sync direction is unspecified".into();
    vec![
        Import::Record(item("wi-ready", State::ReadyForBuilding, 3)),
        Import::Record(waiting),
        Import::Record(item("wi-done", State::Completed, 5)),
        Import::Record(blocked),
        Import::Record(leased(
            item("wi-stale", State::Building, 4),
            "job-site-b",
            "fence-old",
            -60,
        )),
        Import::Record(leased(
            item("wi-merging", State::Merging, 8),
            "job-site-b",
            "fence-merge",
            600,
        )),
        Import::ChangeSet(ChangeSetRecord {
            id: "CS-00001".into(),
            revision: "proposed".into(),
            ..ChangeSetRecord::default()
        }),
    ]
}

/// Seeds `store` for the tour: [`seeds`], then the trusted WMS observations the
/// reconciler steps read (never part of an envelope).
pub async fn seed<S: WorkStore>(store: &S) -> Result<(), StoreError> {
    for import in seeds() {
        store.import(import).await?;
    }
    store
        .observe(
            "wi-stale",
            Observation::Reconciliation(evidence("lease-recovered", "none").unwrap()),
        )
        .await?;
    store
        .observe(
            "wi-merging",
            Observation::Reconciliation(evidence("not-applied", "none").unwrap()),
        )
        .await?;
    Ok(())
}

/// The tour's steps: who calls and what, in order.
pub fn steps() -> Vec<(Role, OperationEnvelope)> {
    let dt = Role::DraftingTable;
    let env = |v: Value| -> OperationEnvelope { serde_json::from_value(v).unwrap() };
    let mut readiness = serde_json::to_value(Readiness::complete()).unwrap();
    readiness["impact_dispositioned"] = json!(false);
    vec![
        (
            dt,
            env(
                json!({"operation": "request.create", "actor_context_ref": "dt", "idempotency_key": "rc-1",
            "payload": {"intent": "Show sync status", "rationale": "Users cannot see progress", "affected_interfaces": ["cli"], "affected_scopes": ["status"]}}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "request.create", "actor_context_ref": "dt", "idempotency_key": "rc-1",
            "payload": {"intent": "Show sync status", "rationale": "Users cannot see progress", "affected_interfaces": ["cli"], "affected_scopes": ["status"]}}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "request.create", "actor_context_ref": "dt", "idempotency_key": "rc-2",
            "payload": {"intent": " show SYNC status ", "rationale": "again", "affected_interfaces": ["cli"], "affected_scopes": ["status"]}}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "request.get", "actor_context_ref": "dt", "request_id": "request-001"}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "request.query", "actor_context_ref": "dt", "payload": {"refinement_state": "unrefined"}}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "request.refine", "actor_context_ref": "dt", "request_id": "request-001", "expected_request_revision": 1,
            "idempotency_key": "rf-1", "payload": {"classification": "undefined"}}),
            ),
        ),
        (
            Role::HumanMaintainer,
            env(
                json!({"operation": "request.update-priority", "actor_context_ref": "hm", "request_id": "request-001",
            "expected_request_revision": 1, "idempotency_key": "up-1", "payload": {"business_priority": "high"}}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "request.update-priority", "actor_context_ref": "dt", "request_id": "request-001",
            "expected_request_revision": 2, "idempotency_key": "up-2", "payload": {"business_priority": "low"}}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "request.link-change-set", "actor_context_ref": "dt", "request_id": "request-001",
            "expected_request_revision": 2, "idempotency_key": "lc-1", "payload": {"change_set_id": "CS-00001", "target_revision": "proposed"}}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "request.link-build-work-item", "actor_context_ref": "dt", "request_id": "request-001",
            "expected_request_revision": 3, "idempotency_key": "lw-1", "payload": {"build_work_item_id": "wi-ready"}}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "request.link-build-work-item", "actor_context_ref": "dt", "request_id": "request-001",
            "expected_request_revision": 4, "idempotency_key": "lw-2", "payload": {"build_work_item_id": "wi-nowhere"}}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "work-item.get", "actor_context_ref": "dt", "work_item_id": "wi-ready"}),
            ),
        ),
        (
            dt,
            env(json!({"operation": "work-item.query", "actor_context_ref": "dt"})),
        ),
        (
            dt,
            env(json!({"operation": "blocked-work.query", "actor_context_ref": "dt"})),
        ),
        (
            dt,
            conformance::preflight(
                Cmd::Claim,
                "wi-ready",
                State::ReadyForBuilding,
                3,
                json!({}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "blocked-work.submit-resolution", "actor_context_ref": "dt", "work_item_id": "wi-blocked",
            "human_approval_id": "no-such-approval", "idempotency_key": "sr-1", "payload": {"resolution_kind": "out-of-scope"}}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "blocked-work.acknowledge", "actor_context_ref": "dt", "work_item_id": "wi-blocked",
            "human_approval_id": "no-such-approval", "idempotency_key": "ak-1"}),
            ),
        ),
        (
            Role::Materializer,
            materialize(
                "mat-1",
                "mk-new",
                json!({"id": "wi-new", "change_type": "undefined", "implementation_required": true, "readiness": readiness}),
            ),
        ),
        (
            Role::Materializer,
            cmd(
                Cmd::RefreshDependencies,
                "wi-wait",
                State::Waiting,
                2,
                "rd-1",
            ),
        ),
        (
            Role::Materializer,
            cmd(
                Cmd::Revalidate,
                "wi-wait",
                State::ReadyForBuilding,
                3,
                "rv-1",
            ),
        ),
        (
            Role::Materializer,
            cmd(Cmd::ResolveBlock, "wi-blocked", State::Blocked, 6, "rb-1")
                .approval("no-such-approval"),
        ),
        (
            dt,
            cmd(Cmd::Claim, "wi-ready", State::ReadyForBuilding, 3, "cl-dt"),
        ),
        (
            Role::JobSite,
            cmd(Cmd::Claim, "wi-ready", State::ReadyForBuilding, 3, "cl-1"),
        ),
        (
            Role::JobSite,
            cmd(Cmd::Claim, "wi-ready", State::ReadyForBuilding, 3, "cl-1"),
        ),
        (
            Role::JobSite,
            cmd(Cmd::RenewLease, "wi-ready", State::Building, 4, "rl-1").fence(FENCE),
        ),
        (
            Role::JobSite,
            cmd(Cmd::RenewLease, "wi-ready", State::Building, 4, "rl-2").fence("fence-forged"),
        ),
        (
            Role::JobSite,
            cmd(Cmd::RefreshActive, "wi-ready", State::Building, 4, "ra-1").fence(FENCE),
        ),
        (
            Role::JobSite,
            cmd(Cmd::TestsPass, "wi-ready", State::Building, 4, "tp-1")
                .fence(FENCE)
                .payload(json!({"build_tests_passed": true})),
        ),
        (
            Role::JobSite,
            cmd(
                Cmd::ReturnToBuilding,
                "wi-ready",
                State::Inspecting,
                5,
                "rtb-1",
            )
            .fence(FENCE)
            .payload(json!({"in_contract_defect": true})),
        ),
        (
            Role::JobSite,
            cmd(
                Cmd::RaiseSpecQuestion,
                "wi-ready",
                State::Building,
                6,
                "rq-1",
            )
            .fence(FENCE)
            .payload(json!({"question": "Which side wins a conflict?"})),
        ),
        (
            Role::JobSite,
            cmd(Cmd::BeginMerge, "wi-ready", State::Inspecting, 5, "bm-1").fence(FENCE),
        ),
        (
            Role::JobSite,
            cmd(Cmd::MergeConflict, "wi-merging", State::Merging, 8, "mc-1").fence("fence-forged"),
        ),
        (
            Role::Reconciler,
            cmd(
                Cmd::MergeNotApplied,
                "wi-merging",
                State::Merging,
                8,
                "mna-1",
            ),
        ),
        (
            Role::JobSite,
            cmd(Cmd::RecordMerge, "wi-merging", State::Merging, 8, "rm-1").fence("fence-forged"),
        ),
        (
            Role::Reconciler,
            cmd(Cmd::RecoverLease, "wi-stale", State::Building, 4, "rcl-1"),
        ),
        (
            Role::HumanMaintainer,
            cmd(Cmd::Abandon, "wi-blocked", State::Blocked, 6, "ab-1")
                .payload(json!({"cancellation_confirmed": true})),
        ),
        (
            Role::JobSite,
            env(
                json!({"operation": "finding.create", "actor_context_ref": "js", "work_item_id": "wi-ready", "idempotency_key": "fc-1",
            "payload": {"producer_key": "inspector-1/run-1/1", "producer": "inspector-1", "inspection_run_id": "run-1", "state": "open", "body": {"note": "x"}}}),
            ),
        ),
        (
            dt,
            env(
                json!({"operation": "schedule", "actor_context_ref": "dt", "idempotency_key": "sch-1"}),
            ),
        ),
    ]
}
