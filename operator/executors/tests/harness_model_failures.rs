//! The reference harnesses' model-failure reports (issue 21): when the agent
//! CLI stops because its model request failed, the harness writes
//! `/out/model-failure.json` in the shape the Job Site reads, so the run is
//! retried on the same tier (429, 5xx, timeouts, connections) or the build
//! stops naming the status (401…), instead of counting as the agent's failure.
//!
//! Each case runs the real `run.sh` on the host with a stand-in CLI that
//! prints what the real CLI printed in that situation (recorded in
//! `tests/harness_failures/`, see its README) and exits 1. The harness tests
//! with the real CLIs in the sandbox cover the HTTP statuses end to end; this
//! covers every shape, timeouts and refused connections included.
//!
//! Needs `jq` and `git` (the harnesses' own requirements); skipped with the
//! reason without them, unless `PROTOBOT_REQUIRE_AGENTS=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use protobot_jobsite::escalation::{MODEL_FAILURE_FILE, ModelFailure};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tools_available(test: &str) -> bool {
    let missing: Vec<&str> = ["jq", "git"]
        .into_iter()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("PROTOBOT_REQUIRE_AGENTS").is_none(),
        "{test}: PROTOBOT_REQUIRE_AGENTS is set but {missing:?} are missing"
    );
    eprintln!(
        "SKIPPED {test}: the harnesses need {missing:?}; set PROTOBOT_REQUIRE_AGENTS=1 to make this a failure"
    );
    false
}

/// What one harness run left behind.
struct Outcome {
    code: Option<i32>,
    stderr: String,
    report: Option<Vec<u8>>,
}

/// Runs `harnesses/<folder>/run.sh` as Worker B with a stand-in CLI (set
/// through `cli_env`) that prints `stdout` and exits 1.
fn run_with_cli_output(folder: &str, cli_env: &str, stdout: &[u8]) -> Outcome {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (workspace, out, state) = (dir.join("workspace"), dir.join("out"), dir.join("tmp"));
    for d in [&workspace, &out, &state] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(dir.join("printed"), stdout).unwrap();
    let cli = dir.join("agent");
    std::fs::write(
        &cli,
        format!(
            "#!/bin/sh\ncat '{}'\necho 'the model request failed' >&2\nexit 1\n",
            dir.join("printed").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cli, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        dir.join("task.json"),
        r#"{"role": "worker-b", "work_item_id": "wi-failures", "cycle": 1, "requirement_ids": ["REQ-1"], "feedback": []}"#,
    )
    .unwrap();
    std::fs::write(dir.join("token"), "session-token").unwrap();
    let output = Command::new("/bin/sh")
        .arg(repo_root().join("harnesses").join(folder).join("run.sh"))
        .env("PROTOBOT_TASK", dir.join("task.json"))
        .env("PROTOBOT_WORKSPACE", &workspace)
        .env("PROTOBOT_OUT", &out)
        .env("TMPDIR", &state)
        .env("PROTOBOT_EGRESS_PROXY", "http://127.0.0.1:9")
        .env("PROTOBOT_EGRESS_SESSION_TOKEN_FILE", dir.join("token"))
        .env("PROTOBOT_MODEL_HOST", "model.example.invalid")
        .env("PROTOBOT_MODEL", "scripted")
        .env(cli_env, &cli)
        .output()
        .unwrap();
    Outcome {
        code: output.status.code(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        report: std::fs::read(out.join(MODEL_FAILURE_FILE)).ok(),
    }
}

fn recorded(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/harness_failures")
            .join(name),
    )
    .unwrap()
}

/// Checks that the harness failed (exit 2) and reported `expected`.
fn assert_reported(outcome: &Outcome, expected: ModelFailure) {
    assert_eq!(outcome.code, Some(2), "{}", outcome.stderr);
    let report = outcome
        .report
        .as_ref()
        .unwrap_or_else(|| panic!("no {MODEL_FAILURE_FILE}; stderr: {}", outcome.stderr));
    assert_eq!(ModelFailure::from_report(report), Ok(expected));
    assert!(
        outcome.stderr.contains("its model request failed"),
        "{}",
        outcome.stderr
    );
}

#[test]
fn opencode_reports_statuses_timeouts_and_refused_connections() {
    if !tools_available("opencode_model_failures") {
        return;
    }
    let run = |file: &str| run_with_cli_output("opencode", "PROTOBOT_OPENCODE", &recorded(file));
    assert_reported(&run("opencode-429.jsonl"), ModelFailure::Status(429));
    assert_reported(&run("opencode-timeout.jsonl"), ModelFailure::Timeout);
    assert_reported(&run("opencode-connection.jsonl"), ModelFailure::Connection);
    // A 401 is reported too: the Job Site stops the build naming it.
    let unauthorized = String::from_utf8(recorded("opencode-429.jsonl"))
        .unwrap()
        .replace("\"statusCode\":429", "\"statusCode\":401");
    assert_reported(
        &run_with_cli_output("opencode", "PROTOBOT_OPENCODE", unauthorized.as_bytes()),
        ModelFailure::Status(401),
    );
}

#[test]
fn claude_code_reports_statuses_timeouts_and_refused_connections() {
    if !tools_available("claude_code_model_failures") {
        return;
    }
    let run = |file: &str| run_with_cli_output("claude-code", "PROTOBOT_CLAUDE", &recorded(file));
    assert_reported(&run("claude-529.json"), ModelFailure::Status(529));
    assert_reported(&run("claude-timeout.json"), ModelFailure::Timeout);
    assert_reported(&run("claude-connection.json"), ModelFailure::Connection);
}

#[test]
fn a_failure_that_is_not_the_models_writes_no_report() {
    if !tools_available("harness_non_model_failures") {
        return;
    }
    // The agent failed on its own (a tool crashed, nothing from the model API),
    // printed nothing, or printed something that is not its JSON: the Job Site
    // must count the run as the agent's failure, so no report is written.
    let opencode_own = br#"{"type":"error","timestamp":1,"sessionID":"s","error":{"name":"UnknownError","data":{"message":"the edit tool crashed"}}}
"#;
    let claude_own = br#"{"type":"result","subtype":"error_max_turns","is_error":true,"terminal_reason":"max_turns","api_error_status":null,"result":"stopped"}"#;
    for (folder, env, printed) in [
        ("opencode", "PROTOBOT_OPENCODE", &opencode_own[..]),
        ("opencode", "PROTOBOT_OPENCODE", b""),
        (
            "opencode",
            "PROTOBOT_OPENCODE",
            b"not json {\"statusCode\": 429}\n",
        ),
        ("claude-code", "PROTOBOT_CLAUDE", &claude_own[..]),
        ("claude-code", "PROTOBOT_CLAUDE", b""),
        ("claude-code", "PROTOBOT_CLAUDE", b"<html>502</html>"),
    ] {
        let outcome = run_with_cli_output(folder, env, printed);
        assert_eq!(outcome.code, Some(2), "{folder}: {}", outcome.stderr);
        assert!(
            outcome.report.is_none(),
            "{folder} reported a model failure for {:?}",
            String::from_utf8_lossy(printed)
        );
        assert!(!outcome.stderr.contains("its model request failed"));
    }
}
