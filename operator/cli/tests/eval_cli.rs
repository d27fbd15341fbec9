//! `protobot eval FIXTURE --out DIR` (issue 21): a corpus fixture end to end, its result
//! records written and valid against the corpus's result schema (check-jsonschema), and a
//! structured refusal for the fixtures this Job Site cannot build.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/check_jsonschema.rs"]
mod check_jsonschema;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

fn fixture(id: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/upstream/eval-corpus/examples")
        .join(id)
        .join("fixture.yaml")
}

fn protobot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args(args)
        .output()
        .unwrap()
}

fn bwrap_available() -> bool {
    Command::new("bwrap")
        .args(["--ro-bind", "/", "/", "--unshare-all", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn eval_runs_the_cli_sync_fixture_end_to_end_and_writes_valid_records() {
    if !bwrap_available() {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
            "PROTOBOT_REQUIRE_BWRAP is set but bwrap cannot run"
        );
        eprintln!("skipping: bubblewrap is not installed");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("results");
    let f = fixture("cli-sync");
    let run = protobot(&["eval", f.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert!(
        run.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(report["state"], "completed");
    let records = check_jsonschema::records_in(&out);
    let names: Vec<String> = records
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for stage in [
        "job-site",
        "worker-a",
        "worker-b",
        "triage",
        "inspection",
        "merge",
    ] {
        assert!(
            names
                .iter()
                .any(|n| n.starts_with(&format!("cli-sync-{stage}-"))),
            "{stage} in {names:?}"
        );
    }
    check_jsonschema::validate(&records);
    let digest = protobot_eval::schema::sha256_digest(&std::fs::read(&f).unwrap());
    for path in &records {
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        assert_eq!(r["fixture_id"], "cli-sync");
        assert_eq!(
            r["reproducibility"]["inputs"]["fixture_digest"],
            digest.as_str()
        );
        assert_eq!(
            r["reproducibility"]["inputs"]["projection"],
            "job-site-input"
        );
        assert_eq!(r["scores"]["job_site"]["pass"], true, "{r}");
        assert_eq!(r["traces"][0]["uri"], "trace.json");
    }
    // The run itself is kept beside the records.
    assert!(out.join("run/origin.git").exists());
}

#[test]
fn eval_refuses_fixtures_it_has_no_example_project_for_with_a_structured_answer() {
    for id in ["api-registry", "web-status"] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("results");
        let f = fixture(id);
        let run = protobot(&["eval", f.to_str().unwrap(), "--out", out.to_str().unwrap()]);
        assert_eq!(run.status.code(), Some(2), "{run:?}");
        let answer: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
        assert_eq!(answer["fixture"], id);
        assert_eq!(answer["runnable"], false);
        assert_eq!(answer["category"], "no-example-project");
        assert_eq!(answer["runnable_fixtures"], serde_json::json!(["cli-sync"]));
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(id), "{stderr}");
        assert!(!out.exists(), "a refused fixture writes nothing");
    }
}

#[test]
fn eval_refuses_a_missing_or_malformed_fixture_or_one_that_differs_from_the_example() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("results");
    let missing = protobot(&[
        "eval",
        "/nonexistent/fixture.yaml",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(missing.status.code(), Some(2));
    let answer: serde_json::Value = serde_json::from_slice(&missing.stdout).unwrap();
    assert_eq!(answer["category"], "fixture-unreadable");
    let bad = tmp.path().join("bad.yaml");
    std::fs::write(&bad, "fixture_id: [").unwrap();
    let malformed = protobot(&[
        "eval",
        bad.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(malformed.status.code(), Some(2));
    let answer: serde_json::Value = serde_json::from_slice(&malformed.stdout).unwrap();
    assert_eq!(answer["category"], "fixture-unreadable");
    // The cli-sync fixture with a requirement changed is not what the example builds.
    let changed = tmp.path().join("changed.yaml");
    let text = std::fs::read_to_string(fixture("cli-sync"))
        .unwrap()
        .replace(
            "shall copy the planned files",
            "shall move the planned files",
        );
    std::fs::write(&changed, text).unwrap();
    let mismatch = protobot(&[
        "eval",
        changed.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(mismatch.status.code(), Some(2));
    let answer: serde_json::Value = serde_json::from_slice(&mismatch.stdout).unwrap();
    assert_eq!(answer["category"], "example-mismatch", "{answer}");
    assert!(
        answer["reason"].as_str().unwrap().contains("REQ-CLI-00002"),
        "{answer}"
    );
    assert!(!out.exists());
}
