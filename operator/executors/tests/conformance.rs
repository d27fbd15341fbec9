//! The local jobsite-sandbox/v1 conformance suite, run for real through the
//! bubblewrap executor: it passes here, a deliberately weakened executor
//! fails the checks it weakens, and non-conformant profiles are refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use protobot_executors::{
    BubblewrapConfig, BubblewrapExecutor, ConformantExecutor, InsecureProcessExecutor,
    run_conformance,
};
use protobot_jobsite::executor::{Executor, ExecutorError, Termination};
use tokio::sync::watch;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_conformance_report_passes_on_this_machine() {
    if !common::bwrap_available("local_conformance_report_passes_on_this_machine") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ex = common::executor(tmp.path());
    let report = run_conformance(&ex, "local").await;
    let json = serde_json::to_string_pretty(&report).unwrap();
    println!("{json}");
    for c in report.failed_checks() {
        eprintln!("FAILED {} {}: {:?}", c.id, c.name, c.detail);
    }
    assert!(
        report.passed(),
        "the local conformance report must pass:\n{json}"
    );
    assert_eq!(report.contract_version, "jobsite-sandbox/v1");
    assert!(report.autonomous_execution);
    assert!(report.checks.len() >= 30, "{} checks", report.checks.len());
    assert!(
        report
            .checks
            .iter()
            .all(|c| !c.skipped && c.detail.is_some())
    );
    let mut ids: Vec<&str> = report.checks.iter().map(|c| c.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), report.checks.len(), "check ids are unique");
    // The capability list is the closed set, each reported, never omitted.
    assert_eq!(report.capabilities.len(), 7);
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    for field in [
        "contract_version",
        "backend",
        "policy_version",
        "policy_digest",
        "executable_digests",
        "resource_limits",
        "checks",
        "passed",
        "autonomous_execution",
    ] {
        assert!(value.get(field).is_some(), "report field {field}");
    }
    assert!(
        common::entries(&tmp.path().join("scratch")).is_empty(),
        "scratch left: {:?}",
        common::entries(&tmp.path().join("scratch"))
    );
    // The audit checks ran and passed, and the head of their session is reported.
    for id in [
        "SB-AUD-001",
        "SB-AUD-002",
        "SB-AUD-003",
        "SB-AUD-004",
        "SB-AUD-005",
    ] {
        assert!(
            report.checks.iter().any(|c| c.id == id && c.passed),
            "{id} missing or failed"
        );
    }
    assert!(
        report
            .audit_head
            .as_deref()
            .is_some_and(|h| h.starts_with("sha256:")),
        "{:?}",
        report.audit_head
    );

    // Admitted with its passing report, the executor runs work.
    let conformant = ConformantExecutor::new(ex, report).unwrap();
    let ws = common::projection(tmp.path());
    let (_tx, rx) = watch::channel(false);
    let out = conformant
        .run(common::spec(&ws, "echo admitted > /out/ok"), rx)
        .await
        .unwrap();
    assert_eq!(out.termination, Termination::Exited { code: 0 });
    assert_eq!(
        std::fs::read_to_string(out.out_dir.join("ok")).unwrap(),
        "admitted\n"
    );
    // Every run returns its sealed audit chain.
    protobot_jobsite::sandbox_audit::verify_audit_chain(&out.audit).unwrap();
    assert_eq!(
        out.audit.last().map(|e| e.event_type.as_str()),
        Some("sandbox.cleanup")
    );
    assert!(out.audit.iter().all(|e| e.work_item == "wi-test"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_executor_with_host_tmp_and_network_fails_the_relevant_checks() {
    if !common::bwrap_available(
        "broken_executor_with_host_tmp_and_network_fails_the_relevant_checks",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut config = BubblewrapConfig::under(tmp.path());
    // Deliberately broken: host /tmp writable inside, and the host network.
    config.extra_bwrap_args = ["--bind", "/tmp", "/tmp", "--share-net"]
        .map(String::from)
        .to_vec();
    let broken = BubblewrapExecutor::new(config);
    let report = run_conformance(&broken, "local").await;
    let failed: Vec<&str> = report
        .failed_checks()
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    assert!(!report.passed());
    assert!(!report.autonomous_execution);
    assert!(
        report
            .fail_closed_reason
            .as_deref()
            .unwrap()
            .contains("autonomous execution disabled")
    );
    for id in [
        "SB-FS-005",
        "SB-FS-006",
        "SB-FS-007",
        "SB-FS-008",
        "SB-NET-004",
        "SB-NET-007",
        "SB-CRED-002",
    ] {
        assert!(
            failed.contains(&id),
            "{id} must fail for the broken executor; failed: {failed:?}"
        );
    }
    // Checks the breakage does not touch still pass: the suite does not stop at the first failure.
    for id in ["SB-LIM-001", "SB-LIM-004", "SB-LIFE-001", "SB-CRED-001"] {
        assert!(
            !failed.contains(&id),
            "{id} should still pass; failed: {failed:?}"
        );
    }
    match ConformantExecutor::new(broken, report) {
        Err(ExecutorError::ProfileNotConformant { profile, reason }) => {
            assert_eq!(profile, "local");
            assert!(reason.contains("SB-FS-005"), "{reason}");
        }
        other => panic!(
            "a failing report must be refused, got {:?}",
            other.map(|_| ())
        ),
    }
}

#[tokio::test]
async fn insecure_executor_never_passes_conformance() {
    let tmp = tempfile::tempdir().unwrap();
    let insecure =
        InsecureProcessExecutor::new_without_sandbox(&BubblewrapConfig::under(tmp.path()));
    let report = run_conformance(&insecure, "local").await;
    assert!(!report.passed());
    assert!(report.capabilities.iter().all(|c| !c.supported));
    assert_eq!(report.checks.len(), 1);
    assert_eq!(report.checks[0].id, "SB-FC-001");
    let err = ConformantExecutor::new(insecure, report).expect_err("refused");
    assert!(
        matches!(err, ExecutorError::ProfileNotConformant { .. }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_admits_the_bubblewrap_executor() {
    if !common::bwrap_available("verify_admits_the_bubblewrap_executor") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let admitted = ConformantExecutor::verify(common::executor(tmp.path())).await;
    let admitted = admitted.expect("conformance passes");
    assert!(admitted.report().passed());
    assert_eq!(admitted.profile(), "local");
}
