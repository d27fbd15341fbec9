#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The engine end to end on one machine: a real canonical repository with a
//! bare origin, the memory WorkStore, the bubblewrap sandbox and scripted
//! Workers. Worker B's first implementation fails Worker A's test, so the item
//! needs a real triage cycle before it is inspected, attested and merged.

use std::{path::Path, sync::Arc};

use jiff::{SignedDuration, Timestamp};
use protobot_executors::{BubblewrapConfig, BubblewrapExecutor};
use protobot_jobsite::{
    contract::BuildContract,
    engine::{Engine, EngineConfig, WorkerClass},
    executor::Limits,
    lease::{Claim, Held, SystemClock},
    testing::git,
    triage::HeuristicTriage,
};
use protobot_lifecycle::{
    AuthorizationContext, OperationEnvelope, Readiness, State, WorkItemRecord,
};
use protobot_stores::{AdapterConfig, Import, MemoryStore, WorkStore};

fn bwrap() -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("bwrap").is_file()));
    if !found {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
            "PROTOBOT_REQUIRE_BWRAP is set but bwrap is missing"
        );
        eprintln!("skipping: bubblewrap is not installed");
    }
    found
}

fn sh(script: &str) -> WorkerClass {
    WorkerClass {
        command: vec!["sh".into(), "-c".into(), script.into()],
        image: None,
        egress: false,
        tiers: Default::default(),
    }
}

const WORKER_A: &str = r#"set -e
# A class without tiers: the task names no model.
grep -Eq '"model": ?null' /task/task.json || { echo "the task names a model" >&2; exit 3; }
cd /workspace
mkdir -p tests
printf '%s\n' '. ./src/sync.sh' '[ "$(greet)" = hello ]' > tests/test_sync.sh
git add -A
git -c user.name=worker-a -c user.email=a@example.invalid commit -qm "tests for REQ-SYNC-001" || true
cp -a /workspace /out/worker"#;

const WORKER_B: &str = r#"set -e
# Its class maps t1 to model-t1: every attempt (t1, then t1 again) names it.
grep -q '"model-t1"' /task/task.json || { echo "the task names no model-t1" >&2; exit 3; }
cd /workspace
mkdir -p src
if grep -Eq '"cycle": ?1[,}]' /task/task.json; then word=helo; else word=hello; fi
printf 'greet() { echo %s; }\n' "$word" > src/sync.sh
git add -A
git -c user.name=worker-b -c user.email=b@example.invalid commit -qm "sync for REQ-SYNC-001" || true
cp -a /workspace /out/worker"#;

const INTEGRATION: &str = r#"cd /workspace
if sh tests/test_sync.sh; then s=pass; else s=fail; fi
printf '{"results":[{"test_id":"T-SYNC","requirement_ids":["REQ-SYNC-001"],"status":"%s","baseline":false}]}' "$s" > /out/results.json"#;

/// origin (bare) and a working clone with the projection manifest and test catalog.
fn canonical(root: &Path) -> (std::path::PathBuf, String) {
    let origin = root.join("origin.git");
    let work = root.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(
        root,
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            origin.to_str().unwrap(),
        ],
    );
    git(&work, &["init", "-q", "-b", "main"]);
    let write = |p: &str, c: &str| {
        let path = work.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, c).unwrap();
    };
    write(
        ".protobot/projection.yaml",
        "version: 1\npaths:\n  - path: docs/\n    class: shared\n  - path: src/\n    class: implementation\n  - path: tests/\n    class: test\n  - path: .protobot/projection.yaml\n    class: shared\n  - path: .protobot/test-catalog.jsonl\n    class: shared\n",
    );
    write(
        ".protobot/test-catalog.jsonl",
        "{\"test_id\":\"T-SYNC\",\"paths\":[\"tests/test_sync.sh\"],\"verifies\":[\"REQ-SYNC-001\"]}\n",
    );
    write(
        "docs/spec.md",
        "REQ-SYNC-001: When the user runs greet, the CLI shall print hello.\n",
    );
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "spec"]);
    git(
        &work,
        &["remote", "add", "origin", origin.to_str().unwrap()],
    );
    git(&work, &["push", "-q", "origin", "main"]);
    let head = git(&work, &["rev-parse", "HEAD"]);
    (work, head)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_item_is_built_through_a_triage_cycle_and_merged() {
    if !bwrap() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (work, spec_commit) = canonical(tmp.path());
    let store = Arc::new(MemoryStore::new(
        "demo",
        AdapterConfig {
            materializer_subject: "m".into(),
            lease_seconds: 900,
        },
    ));
    let mut record = WorkItemRecord::new("wi-demo", "demo", State::ReadyForBuilding, 1);
    record.readiness = Readiness::complete();
    store.import(Import::Record(record)).await.unwrap();
    let context = AuthorizationContext {
        subject: "job-site-1".into(),
        role: "job-site".into(),
        project_id: "demo".into(),
        allowed_actions: [
            "claim",
            "renew-lease",
            "tests-pass",
            "raise-spec-question",
            "begin-merge",
            "record-merge",
            "return-to-building",
            "merge-conflict",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        allowed_refs: vec!["project:demo".into(), "main".into()],
        expires_at: Some(Timestamp::now() + SignedDuration::from_hours(1)),
        policy_version: "v1".into(),
        ..AuthorizationContext::default()
    };
    let claim_env = OperationEnvelope {
        operation: "claim".into(),
        actor_context_ref: "job-site".into(),
        work_item_id: "wi-demo".into(),
        expected_state: Some("ready-for-building".into()),
        expected_contract_version: Some(1),
        idempotency_key: "claim".into(),
        ..OperationEnvelope::default()
    };
    let claimed = store
        .execute(Some(&context), &claim_env, Timestamp::now())
        .await
        .unwrap();
    let d = claimed.decision.clone().unwrap();
    let claim = Claim::new(Held {
        work_item_id: "wi-demo".into(),
        fencing_token: d.fencing_token_issued.unwrap(),
        state: State::Building,
        contract_version: 2,
    });
    let contract = BuildContract {
        work_item_id: "wi-demo".into(),
        materialization_key: "demo/CS-00001".into(),
        spec_commit,
        change_type: "undefined".into(),
        changed_requirement_ids: vec!["REQ-SYNC-001".into()],
        retired_requirement_ids: vec![],
        applicable_requirement_ids: vec!["REQ-SYNC-001".into()],
        impact: vec![],
        implementation_required: true,
        readiness: Readiness::complete(),
        dependencies: vec![],
        priority: "normal".into(),
        scopes: vec![],
        paths: vec![],
    };
    let ctx = context.clone();
    let engine = Engine {
        store: store.clone(),
        executor: Arc::new(BubblewrapExecutor::new(BubblewrapConfig::default())),
        clock: Arc::new(SystemClock),
        triage: Arc::new(HeuristicTriage),
        context: ctx,
        config: EngineConfig {
            max_cycles: 3,
            transient_retries: 3,
            start_tier: protobot_jobsite::escalation::Tier::T1,
            worker_a: sh(WORKER_A),
            worker_b: WorkerClass {
                tiers: protobot_jobsite::escalation::TierModels::from_value(serde_json::json!({
                    "t1": {"provider": "openai", "model": "model-t1"},
                    "t3": {"provider": "openai", "model": "model-t3"},
                }))
                .unwrap(),
                ..sh(WORKER_B)
            },
            integration: sh(INTEGRATION),
            producers: Vec::new(),
            limits: Limits::default(),
            scratch: tmp.path().join("scratch"),
            remote: "origin".into(),
            target_branch: "main".into(),
            egress_proxy: None,
            landing: Default::default(),
        },
        on_stage: None,
        faults: None,
        stop: None,
    };
    let report = match engine.build(&claim, &contract, &work).await {
        Ok(r) => r,
        Err(e) => panic!("build failed: {e}"),
    };
    assert_eq!(report.state, State::Completed, "{report:?}");
    let decisions: Vec<&str> = report.cycles.iter().map(|c| c.decision.as_str()).collect();
    assert_eq!(
        decisions,
        ["implementation", "pass"],
        "one real triage cycle"
    );
    let fb = &report.cycles[0].feedback[0];
    assert_eq!(fb.requirement_ids, ["REQ-SYNC-001"]);
    assert!(
        !serde_json::to_string(fb).unwrap().contains("helo"),
        "no implementation output crosses to a Worker"
    );
    let merge = report.merge_commit.unwrap();
    let origin_main = git(&tmp.path().join("origin.git"), &["rev-parse", "main"]);
    assert_eq!(origin_main, merge, "origin's main is the merge");
    let message = git(
        &tmp.path().join("origin.git"),
        &["log", "-1", "--format=%B", "main"],
    );
    assert!(message.contains("Work-Item: wi-demo"), "{message}");
    let parents = git(
        &tmp.path().join("origin.git"),
        &["log", "-1", "--format=%P", "main"],
    );
    assert_eq!(
        parents.split_whitespace().count(),
        2,
        "a merge commit, never a fast-forward"
    );
    let rec = store.get("wi-demo").await.unwrap().unwrap();
    assert_eq!(rec.state, State::Completed);
    assert_eq!(
        rec.reconciliation
            .unwrap()
            .merge_envelope
            .unwrap()
            .merge_commit,
        merge
    );
}

#[test]
fn a_projection_holding_a_forbidden_path_stops_the_build() {
    use protobot_jobsite::engine::{EngineError, scan_projection};
    use protobot_repo::{catalog::ChangeScope, role::Role, seams::projection_export};
    let tmp = tempfile::tempdir().unwrap();
    let (work, head) = canonical(tmp.path());
    std::fs::create_dir_all(work.join("src")).unwrap();
    std::fs::write(work.join("src/secret.sh"), "echo implementation\n").unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "implementation"]);
    let _ = head;
    let dest = tmp.path().join("a");
    projection_export(&work, "main", Role::WorkerA, &dest, ChangeScope::default()).unwrap();
    assert!(
        scan_projection(&dest, Role::WorkerA).unwrap() > 0,
        "the clean export passes the scan"
    );
    // Simulate an exporter bug: an implementation file lands in Worker A's tree.
    std::fs::create_dir_all(dest.join("src")).unwrap();
    std::fs::write(dest.join("src/secret.sh"), "echo implementation\n").unwrap();
    match scan_projection(&dest, Role::WorkerA) {
        Err(EngineError::ProjectionLeak { path, .. }) => assert_eq!(path, "src/secret.sh"),
        other => panic!("expected a leak, got {other:?}"),
    }
}
