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
    executor::{Executor, ExecutorError, Limits, RunOutput, RunSpec, SandboxRole},
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
        prices: Default::default(),
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

/// One claimed work item over the canonical repository, ready to build.
struct Setup {
    tmp: tempfile::TempDir,
    work: std::path::PathBuf,
    store: Arc<MemoryStore>,
    claim: Claim,
    contract: BuildContract,
    context: AuthorizationContext,
}

async fn setup() -> Setup {
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
    Setup {
        tmp,
        work,
        store,
        claim,
        contract,
        context,
    }
}

/// The engine over `s` with the scripted Workers, running them through `executor`.
fn engine<E: Executor>(s: &Setup, executor: E) -> Engine<MemoryStore, E> {
    Engine {
        store: s.store.clone(),
        executor: Arc::new(executor),
        clock: Arc::new(SystemClock),
        triage: Arc::new(HeuristicTriage),
        context: s.context.clone(),
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
            scratch: s.tmp.path().join("scratch"),
            remote: "origin".into(),
            target_branch: "main".into(),
            egress_proxy: None,
            landing: Default::default(),
            // Retries after a transient model failure do not wait in tests.
            model_retry_delay_cap: std::time::Duration::ZERO,
            item_budget: None,
        },
        on_stage: None,
        faults: None,
        stop: None,
        usage: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_item_is_built_through_a_triage_cycle_and_merged() {
    if !bwrap() {
        return;
    }
    let s = setup().await;
    let engine = engine(&s, BubblewrapExecutor::new(BubblewrapConfig::default()));
    let (tmp, work, store, claim, contract) = (&s.tmp, &s.work, &s.store, &s.claim, &s.contract);
    let report = match engine.build(claim, contract, work).await {
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

/// The bubblewrap sandbox, where Worker B's harness runs as if its model were out: its first
/// `outages` runs execute a script that writes `report` to `/out/model-failure.json` and
/// exits 1 (what a harness does when its model request fails), later runs the real harness.
struct ModelOutage {
    sandbox: BubblewrapExecutor,
    outages: std::sync::atomic::AtomicU32,
    report: &'static str,
}

impl ModelOutage {
    fn new(outages: u32, report: &'static str) -> Self {
        Self {
            sandbox: BubblewrapExecutor::new(BubblewrapConfig::default()),
            outages: outages.into(),
            report,
        }
    }
}

impl Executor for ModelOutage {
    fn profile(&self) -> &str {
        self.sandbox.profile()
    }

    async fn run(
        &self,
        mut spec: RunSpec,
        cancel: tokio::sync::watch::Receiver<bool>,
    ) -> Result<RunOutput, ExecutorError> {
        use std::sync::atomic::Ordering::SeqCst;
        let out = spec.role == SandboxRole::WorkerB
            && self
                .outages
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if out {
            spec.command = vec![
                "sh".into(),
                "-c".into(),
                format!(
                    "printf '%s' '{}' > /out/model-failure.json; echo 'model request failed' >&2; exit 1",
                    self.report
                ),
            ];
        }
        self.sandbox.run(spec, cancel).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_model_is_retried_on_the_same_tier_and_the_item_completes() {
    if !bwrap() {
        return;
    }
    let s = setup().await;
    let rate_limited = engine(&s, ModelOutage::new(2, r#"{"status": 429}"#));
    let report = match rate_limited.build(&s.claim, &s.contract, &s.work).await {
        Ok(r) => r,
        Err(e) => panic!("build failed: {e}"),
    };
    assert_eq!(
        rate_limited
            .executor
            .outages
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "both outages were met"
    );
    assert_eq!(report.state, State::Completed, "{report:?}");
    let decisions: Vec<&str> = report.cycles.iter().map(|c| c.decision.as_str()).collect();
    assert_eq!(
        decisions,
        [
            "model-rate-limit",
            "model-rate-limit",
            "implementation",
            "pass"
        ],
        "two 429s retried within cycle 1, then the real triage cycle"
    );
    let record = s.store.get("wi-demo").await.unwrap().unwrap();
    let attempts: Vec<(u32, &str, &str)> = record
        .attempts
        .iter()
        .map(|a| (a.cycle, a.tier.as_str(), a.outcome.as_str()))
        .collect();
    assert_eq!(
        attempts,
        [(1, "t1", "implementation"), (2, "t1", "passed")],
        "a cycle's retries after a model outage keep its cycle and tier (the store keeps its last attempt): a model outage never escalates"
    );
    // Worker B's class maps t1 to model-t1; its script checks every real attempt names it.
    assert!(
        report.cycles.iter().all(|c| c.tier.as_str() == "t1"),
        "{report:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_keeps_timing_out_stops_the_build_after_its_class_budget() {
    if !bwrap() {
        return;
    }
    let s = setup().await;
    let timing_out = engine(&s, ModelOutage::new(u32::MAX, r#"{"error": "timeout"}"#));
    let err = timing_out
        .build(&s.claim, &s.contract, &s.work)
        .await
        .expect_err("a model that never answers cannot complete a build");
    assert!(
        matches!(
            err,
            protobot_jobsite::engine::EngineError::Model {
                role: "worker-b",
                failure: protobot_jobsite::escalation::ModelFailure::Timeout,
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("protobot retry"), "{err}");
    let runs = u32::MAX
        - timing_out
            .executor
            .outages
            .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(runs, 4, "one run and the timeout class's three retries");
    let record = s.store.get("wi-demo").await.unwrap().unwrap();
    let attempts: Vec<(u32, &str, &str)> = record
        .attempts
        .iter()
        .map(|a| (a.cycle, a.tier.as_str(), a.outcome.as_str()))
        .collect();
    assert_eq!(
        attempts,
        [(1, "t1", "model-timeout")],
        "the timeouts are persisted as cycle 1's transient attempt"
    );
    assert_eq!(record.state, State::Building, "the item is left to retry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_model_request_stops_the_build_without_escalating_and_a_malformed_report_is_the_harness_s_failure()
 {
    if !bwrap() {
        return;
    }
    let s = setup().await;
    let refused = engine(&s, ModelOutage::new(1, r#"{"status": 401}"#));
    let err = refused
        .build(&s.claim, &s.contract, &s.work)
        .await
        .expect_err("a 401 from the model stops the build");
    assert!(
        matches!(
            err,
            protobot_jobsite::engine::EngineError::Model {
                failure: protobot_jobsite::escalation::ModelFailure::Status(401),
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("not transient"), "{err}");
    let record = s.store.get("wi-demo").await.unwrap().unwrap();
    assert!(
        record
            .attempts
            .iter()
            .all(|a| !a.outcome.starts_with("model-")),
        "a refusal is not recorded as a retryable attempt: {:?}",
        record.attempts
    );

    // A report that is not one of the two shapes is not trusted: the Worker's failure is
    // its harness's own.
    let s = setup().await;
    let malformed = engine(&s, ModelOutage::new(1, r#"{"status": "soon"}"#));
    let err = malformed
        .build(&s.claim, &s.contract, &s.work)
        .await
        .expect_err("a failed Worker without a readable report fails the build");
    assert!(
        matches!(
            err,
            protobot_jobsite::engine::EngineError::Output {
                role: "worker-b",
                ..
            }
        ),
        "{err:?}"
    );
}
