//! Records from run evidence: every stage attributed, the corpus's semantic
//! rules kept, the upstream example results readable with the same types, and
//! every record this file produces validated by the real `check-jsonschema`
//! against the upstream schema (which must also reject a broken record).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use protobot_eval::{
    evidence::JobSiteRun,
    records::{JobSiteStage, build, record, result_id},
    schema::{FailureCategory, ResultRecord, Trace, TraceKind},
    semantics::violations,
};
use serde_json::{Value, json};

fn upstream() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/upstream/eval-corpus")
}

/// A run like the demo's: cycle 1 fails a dry-run test (implementation), cycle 2
/// passes, the inspection seals, the merge lands, the fixture's check passes.
fn demo_like() -> Value {
    let test = |id: &str, req: &str, status: &str| json!({"test_id": id, "requirement_ids": [req], "status": status, "baseline": false});
    json!({
        "bundle_version": 1,
        "run_id": "demo-WI-CS-00001",
        "recorded_at": "2026-12-02T18:00:00Z",
        "fixture": {"id": "cli-sync", "corpus_revision": "v1", "digest": "sha256:b532e659c6314c51e099f8d30fbe8fc9dfdef7b5866099e99c4879358f5b53ab"},
        "environment": {
            "mode": "local", "hosted_cluster": false, "external_service_credentials": false,
            "models": [
                {"role": "worker-a", "name": "scripted", "settings": {"harness": "opencode", "requests": 3}},
                {"role": "worker-b", "name": "scripted", "settings": {"harness": "opencode", "requests": 6}}
            ],
            "components": [{"name": "job-site", "revision": "protobot-0.1.0"}, {"name": "eval-runner", "revision": "schema-v1"}]
        },
        "inputs": {"work_item_id": "WI-CS-00001", "requirement_ids": ["REQ-CLI-00001", "REQ-CLI-00002", "REQ-CLI-00003"], "contract": {}},
        "cycles": [
            {"cycle": 1, "decision": "implementation", "feedback": [], "redactions": 0, "projection_files_scanned": 9, "tier": "t1"},
            {"cycle": 2, "decision": "pass", "feedback": [], "redactions": 0, "projection_files_scanned": 9, "tier": "t1"}
        ],
        "gates": [
            {"cycle": 1, "run": "WI-c1-int", "build_errors": 0, "results": [
                test("test_dry_run", "REQ-CLI-00001", "fail"), test("test_apply", "REQ-CLI-00002", "pass"), test("test_refuse", "REQ-CLI-00003", "pass")]},
            {"cycle": 2, "run": "WI-c2-int", "build_errors": 0, "results": [
                test("test_dry_run", "REQ-CLI-00001", "pass"), test("test_apply", "REQ-CLI-00002", "pass"), test("test_refuse", "REQ-CLI-00003", "pass")]}
        ],
        "inspections": [{
            "report": {"run_id": "WI-ir-abc", "candidate": "abc", "product_tree_digest": "sha256:aa", "contract_version": 3,
                       "ledger_sequence_at_start": 0, "producers": ["inspector"], "findings": 0, "verdict": {"verdict": "sealed", "watermark": 2}},
            "producers": [{"producer": "inspector", "findings": []}]
        }],
        "outcome": {"state": "completed", "merge_commit": "m1", "main_contains_merge": true, "product_tree_digest": "sha256:aa", "error": null},
        "visible_checks": [{"id": "VIS-CLI-00001", "requirement_ids": ["REQ-CLI-00001"], "passed": true, "evidence": "exit 0"}],
        "holdout_assets": ["HO-CLI-00001"],
        "engine_trace": [],
        "egress": [],
        "model_requests": []
    })
}

fn run_of(v: Value) -> JobSiteRun {
    serde_json::from_value(v).expect("a valid bundle")
}

fn trace() -> Vec<Trace> {
    vec![Trace {
        kind: TraceKind::JobSite,
        uri: "trace.json".into(),
        digest: Some(format!("sha256:{}", "0".repeat(64))),
    }]
}

fn by_stage(records: &[ResultRecord], stage: JobSiteStage) -> &ResultRecord {
    records
        .iter()
        .find(|r| r.result_id.contains(&format!("-{}-", stage.as_str())))
        .expect("a record per stage")
}

fn pass(r: &ResultRecord) -> bool {
    r.scores.job_site.as_ref().expect("job-site scores").pass
}

/// Writes `records` as JSON files under a fresh folder of `target/` and returns them.
fn write(name: &str, records: &[ResultRecord]) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("eval-records")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    records
        .iter()
        .map(|r| {
            let p = dir.join(format!("{}.json", r.result_id));
            std::fs::write(&p, serde_json::to_vec_pretty(r).unwrap()).unwrap();
            p
        })
        .collect()
}

#[test]
fn a_green_run_passes_every_stage_with_its_own_checks() {
    let run = run_of(demo_like());
    let records = build(&run, &trace());
    assert_eq!(records.len(), 6);
    for r in &records {
        assert_eq!(violations(r), Vec::<String>::new(), "{}", r.result_id);
        assert!(pass(r), "{r:?}");
        assert_eq!(r.traces, trace());
    }
    let a = by_stage(&records, JobSiteStage::WorkerA);
    assert_eq!(a.result_id, "cli-sync-worker-a-demo-wi-cs-00001");
    assert_eq!(a.scores.job_site.as_ref().unwrap().visible_checks.total, 3);
    // Each stage's environment names only its own model.
    let models: Vec<_> = a
        .reproducibility
        .environment
        .models
        .iter()
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(models.len(), 1);
    assert!(
        by_stage(&records, JobSiteStage::Triage)
            .reproducibility
            .environment
            .models
            .is_empty()
    );
    // Worker B's recovered failure of cycle 1 is recorded, not critical.
    let b = by_stage(&records, JobSiteStage::WorkerB);
    assert_eq!(b.failures.len(), 1, "{:?}", b.failures);
    assert!(
        b.failures[0]
            .detail
            .starts_with("worker-b, cycle 1: test_dry_run"),
        "{:?}",
        b.failures
    );
    assert!(b.critical_failures.is_empty());
    let summary = &b.scores.job_site.as_ref().unwrap().summary;
    assert!(
        summary.contains("on cycle 2, after 1 rework cycles"),
        "{summary}"
    );
    assert!(
        summary.contains("HO-CLI-00001"),
        "holdouts are said to be unrun: {summary}"
    );
    let t = by_stage(&records, JobSiteStage::Triage)
        .scores
        .job_site
        .clone()
        .unwrap();
    assert_eq!((t.visible_checks.passed, t.visible_checks.total), (2, 2));
    assert!(
        t.summary.contains("1 of 1 rework attributions confirmed"),
        "{}",
        t.summary
    );
    assert_eq!(
        result_id(&run, JobSiteStage::JobSite),
        "cli-sync-job-site-demo-wi-cs-00001"
    );
    validate_with_check_jsonschema(&write("green", &records), true);
}

#[test]
fn an_inspection_that_seals_over_a_failing_check_is_false_readiness() {
    let mut v = demo_like();
    v["visible_checks"][0]["passed"] = json!(false);
    v["visible_checks"][0]["evidence"] = json!("exit 1\ndestination changed during a dry run");
    let records = build(&run_of(v.clone()), &trace());
    let ins = by_stage(&records, JobSiteStage::Inspection);
    assert!(!pass(ins));
    assert_eq!(
        ins.critical_failures[0].category,
        FailureCategory::FalseReadiness
    );
    assert!(
        ins.critical_failures[0].detail.contains("VIS-CLI-00001"),
        "{:?}",
        ins.critical_failures
    );
    let whole = by_stage(&records, JobSiteStage::JobSite);
    assert!(!pass(whole));
    assert!(
        whole
            .critical_failures
            .iter()
            .any(|f| f.category == FailureCategory::VisibleCheckFailure)
    );
    assert!(
        whole
            .critical_failures
            .iter()
            .any(|f| f.category == FailureCategory::FalseReadiness)
    );
    // The stages the check does not judge keep their own verdicts.
    assert!(pass(by_stage(&records, JobSiteStage::WorkerA)));
    assert!(pass(by_stage(&records, JobSiteStage::Merge)));
    // An inspection that reported the violated requirement is not blamed.
    v["inspections"][0]["producers"][0]["findings"] = json!([{
        "subject": "probe:dry-run-writes", "category": "conformance", "severity": "major",
        "requirement_ids": ["REQ-CLI-00001"], "disposition": "implementation-defect",
        "paths": ["src"], "summary": "a dry run wrote"
    }]);
    v["inspections"][0]["report"]["verdict"] = json!({"verdict": "rework", "routed": []});
    v["outcome"] = json!({"state": "blocked", "merge_commit": null, "main_contains_merge": false, "product_tree_digest": null, "error": "cycles exhausted"});
    let records2 = build(&run_of(v), &trace());
    assert!(pass(by_stage(&records2, JobSiteStage::Inspection)));
    let b = by_stage(&records2, JobSiteStage::WorkerB);
    assert!(
        !pass(b),
        "the unresolved implementation finding is Worker B's"
    );
    let merge = by_stage(&records2, JobSiteStage::Merge);
    assert_eq!(
        merge.critical_failures[0].category,
        FailureCategory::ExecutionFailure
    );
    assert!(
        merge.critical_failures[0]
            .detail
            .contains("cycles exhausted")
    );
    for r in records.iter().chain(&records2) {
        assert_eq!(violations(r), Vec::<String>::new(), "{}", r.result_id);
    }
    let mut files = write("false-readiness", &records);
    files.extend(write("blocked", &records2));
    validate_with_check_jsonschema(&files, true);
}

#[test]
fn missing_tests_and_a_wrong_triage_are_attributed_to_their_stage() {
    let mut v = demo_like();
    // Worker A wrote no test for REQ-CLI-00003; triage passed a failing gate.
    v["gates"][1]["results"] = json!([
        {"test_id": "test_dry_run", "requirement_ids": ["REQ-CLI-00001"], "status": "pass", "baseline": false},
        {"test_id": "test_apply", "requirement_ids": ["REQ-CLI-00002"], "status": "fail", "baseline": false}
    ]);
    let records = build(&run_of(v), &trace());
    let a = by_stage(&records, JobSiteStage::WorkerA);
    assert!(!pass(a));
    assert!(
        a.critical_failures[0].detail.contains("REQ-CLI-00003"),
        "{:?}",
        a.critical_failures
    );
    let t = by_stage(&records, JobSiteStage::Triage);
    assert!(!pass(t));
    assert!(
        t.critical_failures[0]
            .detail
            .contains("cycle 2: decided pass while the gate failed"),
        "{:?}",
        t.critical_failures
    );
    let b = by_stage(&records, JobSiteStage::WorkerB);
    assert!(!pass(b));
    assert!(b.critical_failures[0].detail.contains("test_apply"));
    assert!(pass(by_stage(&records, JobSiteStage::Merge)));
    assert!(!pass(by_stage(&records, JobSiteStage::JobSite)));
    for r in &records {
        assert_eq!(violations(r), Vec::<String>::new(), "{}", r.result_id);
    }
    validate_with_check_jsonschema(&write("attributed", &records), true);
}

#[test]
fn a_run_that_never_reached_a_gate_still_writes_valid_records() {
    let mut v = demo_like();
    for k in ["cycles", "gates", "inspections", "visible_checks"] {
        v[k] = json!([]);
    }
    v["outcome"] = json!({"state": "building", "merge_commit": null, "main_contains_merge": false, "product_tree_digest": null, "error": "worker-a failed: opencode exited with 2"});
    let records = build(&run_of(v), &trace());
    for r in &records {
        assert_eq!(violations(r), Vec::<String>::new(), "{}", r.result_id);
        assert_ne!(r.result_id, "");
    }
    assert!(!pass(by_stage(&records, JobSiteStage::JobSite)));
    assert!(
        pass(by_stage(&records, JobSiteStage::Triage)),
        "no decision, nothing wrong"
    );
    assert!(!pass(by_stage(&records, JobSiteStage::Inspection)));
    validate_with_check_jsonschema(&write("stopped", &records), true);
}

#[test]
fn the_same_bundle_replays_to_the_same_records() {
    let run = run_of(demo_like());
    let bytes = serde_json::to_vec(&run).unwrap();
    let again: JobSiteRun = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(build(&again, &trace()), build(&run, &trace()));
    // One stage alone, from the bundle alone.
    assert_eq!(
        record(&again, JobSiteStage::Triage, &[]),
        build(&run, &[])[3]
    );
    // An unknown field is not silently dropped.
    let mut v = demo_like();
    v["surprise"] = json!(1);
    assert!(serde_json::from_value::<JobSiteRun>(v).is_err());
}

#[test]
fn the_upstream_example_results_read_with_these_types_and_keep_the_rules() {
    let dir = upstream().join("examples/results");
    let mut files = Vec::new();
    for name in [
        "requirements-cli-sync.yaml",
        "job-site-cli-sync.yaml",
        "end-to-end-cli-sync.yaml",
    ] {
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        let r: ResultRecord =
            serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(violations(&r), Vec::<String>::new(), "{name}");
        // Written back as JSON, it is still what the schema describes.
        let back: Value = serde_json::to_value(&r).unwrap();
        let original: Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(back, original, "{name}");
        files.push(path);
    }
    validate_with_check_jsonschema(&files, true);
}

#[test]
fn the_semantic_rules_refuse_what_the_contract_forbids() {
    let good = build(&run_of(demo_like()), &trace()).remove(0);
    let mut crit = good.clone();
    crit.critical_failures =
        vec![
            crit.failures
                .first()
                .cloned()
                .unwrap_or(protobot_eval::schema::Failure {
                    category: FailureCategory::ExecutionFailure,
                    stage: None,
                    detail: "x".into(),
                    evidence: "y".into(),
                }),
        ];
    assert!(violations(&crit)[0].contains("critical failures but a stage passes"));
    let mut counts = good.clone();
    counts
        .scores
        .job_site
        .as_mut()
        .unwrap()
        .visible_checks
        .total = 7;
    assert!(violations(&counts)[0].contains("is not 7"));
    let mut split = good.clone();
    split.reproducibility.inputs.fixture_id = "api-registry".into();
    assert!(violations(&split)[0].contains("differs"));
    let mut projection = good;
    projection.reproducibility.inputs.projection = protobot_eval::schema::Projection::EndToEnd;
    assert!(violations(&projection)[0].contains("needs projection"));
}

/// check-jsonschema rejects a record the schema forbids: the validation can fail.
#[test]
fn check_jsonschema_rejects_a_broken_record() {
    let mut v = serde_json::to_value(build(&run_of(demo_like()), &trace()).remove(0)).unwrap();
    // A job-site record carrying requirements scores, and a stage the schema does not know.
    v["scores"]["requirements"] = json!({"pass": true, "summary": "s", "metrics": {"coverage": 1, "applicability": 1, "implementability": 1}, "per_requirement": []});
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("eval-records/broken");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let gated = dir.join("gated.json");
    std::fs::write(&gated, serde_json::to_vec(&v).unwrap()).unwrap();
    let mut w = v.clone();
    w["scores"].as_object_mut().unwrap().remove("requirements");
    w["stage"] = json!("worker-b");
    let stage = dir.join("stage.json");
    std::fs::write(&stage, serde_json::to_vec(&w).unwrap()).unwrap();
    for file in [gated, stage] {
        validate_with_check_jsonschema(&[file], false);
    }
}

/// The pinned validator (`make tools-check-jsonschema`), or `None` when it is
/// not installed and PROTOBOT_REQUIRE_CHECK_JSONSCHEMA is unset (then the
/// test says it skipped the schema check; with the variable set it fails).
fn check_jsonschema() -> Option<PathBuf> {
    let path = std::env::var_os("PROTOBOT_CHECK_JSONSCHEMA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../.tools/check-jsonschema/bin/check-jsonschema")
        });
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var_os("PROTOBOT_REQUIRE_CHECK_JSONSCHEMA").is_none(),
        "PROTOBOT_REQUIRE_CHECK_JSONSCHEMA is set but {} is missing; run make tools-check-jsonschema",
        path.display()
    );
    eprintln!(
        "skipping the schema validation: {} is missing (make tools-check-jsonschema); set PROTOBOT_REQUIRE_CHECK_JSONSCHEMA=1 to make this a failure",
        path.display()
    );
    None
}

/// Runs check-jsonschema on `files` against the upstream result schema and
/// asserts it accepts them (`valid`) or rejects them.
fn validate_with_check_jsonschema(files: &[PathBuf], valid: bool) {
    let Some(tool) = check_jsonschema() else {
        return;
    };
    assert!(!files.is_empty());
    let out = Command::new(&tool)
        .arg("--schemafile")
        .arg(upstream().join("schema/result.schema.json"))
        .args(files)
        .output()
        .expect("check-jsonschema runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if valid {
        assert!(
            out.status.success(),
            "check-jsonschema refused {files:?}:\n{text}"
        );
    } else {
        assert_eq!(
            out.status.code(),
            Some(1),
            "check-jsonschema accepted {files:?}:\n{text}"
        );
        assert!(text.contains("Schema validation errors"), "{text}");
    }
}
