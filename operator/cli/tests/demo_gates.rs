//! Gates that mean something (issue 21): the bundled demo's scripted tests
//! (Worker A) and scripted Inspector cover every requirement's observable
//! behaviour, error paths included. Each wrong implementation below violates
//! one requirement; the tests must fail on it and the Inspector must report
//! it, naming the requirement, so an inspection cannot seal over it. The
//! fixture's executable visible check (VIS-CLI-00001) is held to the same
//! standard for the behaviour it checks.
//!
//! The scripts run as plain `sh` processes on a temporary workspace (the
//! paths `/workspace`, `/out` and `/task/task.json` of the sandbox are
//! overridden through PROTOBOT_WORKSPACE, PROTOBOT_OUT and PROTOBOT_TASK).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use protobot_demo::example::{INSPECTOR, VISIBLE_CHECKS, WORKER_A, WORKER_B};
use protobot_jobsite::inspection::{ProducerKind, parse_report};

struct Workspace {
    _tmp: tempfile::TempDir,
    ws: PathBuf,
    out: PathBuf,
    task: PathBuf,
}

fn sh(script: &str, w: &Workspace, cwd: &Path) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(cwd)
        .env("PROTOBOT_WORKSPACE", &w.ws)
        .env("PROTOBOT_OUT", &w.out)
        .env("PROTOBOT_TASK", &w.task)
        .output()
        .unwrap()
}

/// A workspace with Worker A's tests and Worker B's implementation (its
/// corrected one unless `first_attempt`), then `mutate` applied to src/sync.sh.
fn workspace(first_attempt: bool, mutate: &[(&str, &str)]) -> Workspace {
    let tmp = tempfile::tempdir().unwrap();
    let (ws, out) = (tmp.path().join("workspace"), tmp.path().join("out"));
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let task = tmp.path().join("task.json");
    let feedback = if first_attempt {
        r#"{"feedback": []}"#
    } else {
        r#"{"feedback": [{"recipient": "worker-b"}]}"#
    };
    std::fs::write(&task, feedback).unwrap();
    let w = Workspace {
        _tmp: tmp,
        ws: ws.clone(),
        out,
        task,
    };
    assert!(
        Command::new("git")
            .args(["init", "-q"])
            .current_dir(&ws)
            .status()
            .unwrap()
            .success()
    );
    // The copies to /out/worker are the harness's business, not the edits'.
    let edits = |s: &str| {
        s.lines()
            .filter(|l| !l.contains("/out/worker"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    for script in [WORKER_A, WORKER_B] {
        let o = sh(&edits(script), &w, &ws);
        assert!(o.status.success(), "{o:?}");
    }
    let path = ws.join("src/sync.sh");
    let mut tool = std::fs::read_to_string(&path).unwrap();
    for (from, to) in mutate {
        assert!(
            tool.contains(from),
            "the mutation {from:?} applies to\n{tool}"
        );
        tool = tool.replace(from, to);
    }
    std::fs::write(&path, tool).unwrap();
    w
}

/// Which of Worker A's tests fail.
fn failing_tests(w: &Workspace) -> Vec<&'static str> {
    ["test_dry_run", "test_apply", "test_refuse"]
        .into_iter()
        .filter(|t| !sh(&format!("sh tests/{t}.sh"), w, &w.ws).status.success())
        .collect()
}

/// The requirements of the Inspector's findings (parsed as the engine parses them).
fn inspector_flags(w: &Workspace) -> Vec<String> {
    let o = sh(INSPECTOR, w, &w.ws);
    assert!(o.status.success(), "{o:?}");
    let bytes = std::fs::read(w.out.join("findings.jsonl")).unwrap();
    let findings = parse_report("inspector", ProducerKind::Inspector, &bytes)
        .unwrap_or_else(|e| panic!("the findings are in the ledger's shape: {e}"));
    let mut reqs: Vec<String> = findings
        .into_iter()
        .flat_map(|f| f.requirement_ids)
        .collect();
    reqs.sort();
    reqs.dedup();
    reqs
}

fn visible_check(w: &Workspace) -> bool {
    let (_, script) = VISIBLE_CHECKS[0];
    sh(script, w, &w.ws).status.success()
}

const REFUSE: &str = r#"if [ ! -d "$dst" ]"#;

#[test]
fn the_corrected_implementation_passes_every_gate() {
    let w = workspace(false, &[]);
    assert_eq!(failing_tests(&w), Vec::<&str>::new());
    assert_eq!(
        inspector_flags(&w),
        Vec::<String>::new(),
        "a conformant candidate seals"
    );
    assert!(visible_check(&w));
}

#[test]
fn a_dry_run_that_copies_fails_the_tests_the_inspector_and_the_fixture_check() {
    let w = workspace(true, &[]);
    assert_eq!(failing_tests(&w), ["test_dry_run"]);
    assert_eq!(inspector_flags(&w), ["REQ-CLI-00001"]);
    assert!(!visible_check(&w));
}

/// The gap the issue named: refusing a bad destination on an apply only. The
/// demo's earlier tests and Inspector passed this implementation.
#[test]
fn a_dry_run_that_accepts_a_missing_destination_violates_the_error_path_and_is_reported() {
    let w = workspace(
        false,
        &[(REFUSE, r#"if [ "$dry" = no ] && [ ! -d "$dst" ]"#)],
    );
    assert_eq!(failing_tests(&w), ["test_refuse"]);
    assert_eq!(inspector_flags(&w), ["REQ-CLI-00003"]);
}

#[test]
fn creating_a_missing_destination_is_reported_against_the_refusal_requirement() {
    let w = workspace(
        false,
        &[(REFUSE, r#"mkdir -p "$dst" 2>/dev/null; if false"#)],
    );
    assert_eq!(failing_tests(&w), ["test_refuse"]);
    assert_eq!(inspector_flags(&w), ["REQ-CLI-00003"]);
}

#[test]
fn overwriting_a_file_destination_is_reported() {
    // Refuses a missing destination but writes the files into one that is a file.
    let w = workspace(
        false,
        &[(
            REFUSE,
            r#"if [ -f "$dst" ]; then cat "$src"/* > "$dst"; exit 0; fi; if [ ! -e "$dst" ]"#,
        )],
    );
    assert_eq!(failing_tests(&w), ["test_refuse"]);
    assert_eq!(inspector_flags(&w), ["REQ-CLI-00003"]);
}

#[test]
fn an_apply_that_copies_nothing_is_reported() {
    let w = workspace(false, &[(r#"cp -R "$src/." "$dst/""#, "true")]);
    assert_eq!(failing_tests(&w), ["test_apply"]);
    assert_eq!(inspector_flags(&w), ["REQ-CLI-00002"]);
}

#[test]
fn missing_tests_and_a_missing_tool_are_findings() {
    let w = workspace(false, &[]);
    std::fs::remove_file(w.ws.join("tests/test_refuse.sh")).unwrap();
    assert_eq!(inspector_flags(&w), ["REQ-CLI-00003"]);
    std::fs::remove_file(w.ws.join("src/sync.sh")).unwrap();
    assert_eq!(
        inspector_flags(&w),
        ["REQ-CLI-00001", "REQ-CLI-00002", "REQ-CLI-00003"]
    );
}
