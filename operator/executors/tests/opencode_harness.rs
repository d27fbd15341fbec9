//! The OpenCode reference harness (`harnesses/opencode/run.sh`) with the real
//! CLI inside the bubblewrap sandbox, reaching the deterministic model double
//! only through a real egress proxy and credential broker (issue 21).
//!
//! The double scripts the agent: write a file, then run a shell command that
//! tries another host through the proxy and dumps what the sandbox holds
//! (environment, every process's arguments and environment, its private
//! `/tmp` with OpenCode's state) into `/out/probe`, then stop. The test checks
//! that the API key reached the endpoint on every model request and appears
//! nowhere in what the sandbox held, that the other host was denied and
//! audited, and that the edit comes back as a bundle the validator accepts.
//!
//! Skipped with the reason when the CLI is not installed
//! (`scripts/install-agents.sh`) or proxied egress cannot run here, unless
//! `PROTOBOT_REQUIRE_AGENTS=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod proxied;

use std::path::PathBuf;

use protobot_jobsite::escalation::ModelFailure;
use protobot_model_double::{Scenario, Script, Step, ToolCall};
use protobot_repo::{
    bundle::collect_bundle,
    role::Role,
    validate::{Limits as BundleLimits, accept_bundle},
};
use proxied::harness::{Harness, HarnessKind, files_containing, hex_of};
use serde_json::json;

/// The OpenCode binary, or `None` after printing why the test is skipped.
fn opencode(test: &str) -> Option<PathBuf> {
    proxied::harness::agent_cli(test, "OpenCode", "PROTOBOT_OPENCODE", "opencode")
}

const WORK_ITEM: &str = "wi-opencode";
const GREET: &str = "echo hello\n";

/// The shell command the agent is told to run: another host through the
/// proxy, then a dump of everything the sandbox holds.
const PROBE: &str = r#"mkdir -p /out/probe
T=$(cat "$PROTOBOT_EGRESS_SESSION_TOKEN_FILE")
curl -sS -o /out/probe/other.body -w '%{http_code}' -H "X-Sandbox-Session-Token: $T" -H 'Content-Type: application/json' -d '{"model":"scripted","messages":[]}' "$PROTOBOT_EGRESS_PROXY/evil.example.invalid/v1/chat/completions" > /out/probe/other.code
env > /out/probe/env
for p in /proc/[0-9]*; do printf '%s: ' "$p"; tr '\0' ' ' < "$p/cmdline"; echo; done > /out/probe/cmdlines 2>/dev/null
for p in /proc/[0-9]*; do cat "$p/environ"; echo; done > /out/probe/environs 2>/dev/null
cp -a /tmp /out/probe/tmp 2>/dev/null
true"#;

fn script() -> Script {
    Script {
        scenarios: vec![Scenario {
            marker: format!("worker-b for {WORK_ITEM}"),
            failures: Vec::new(),
            steps: vec![
                Step::ToolCalls {
                    calls: vec![ToolCall {
                        name: "write".into(),
                        arguments: json!({"filePath": "/workspace/src/greet.sh", "content": GREET}),
                    }],
                },
                Step::ToolCalls {
                    calls: vec![ToolCall {
                        name: "bash".into(),
                        arguments: json!({"command": PROBE, "description": "probe the sandbox"}),
                    }],
                },
                Step::Text {
                    text: "Implemented REQ-GREET-00001 in src/greet.sh.".into(),
                },
            ],
        }],
    }
}

/// One harness run that exited 0, with what it ran against. `None` when
/// the test is skipped.
struct HarnessRun {
    harness: Harness,
    out: protobot_jobsite::executor::RunOutput,
}

/// OpenCode as `role` with `script` behind the proxy (`None`: skipped).
async fn prepare(test: &str, role: Role, script: Script) -> Option<Harness> {
    let cli = opencode(test)?;
    let kind = HarnessKind {
        test,
        folder: "opencode",
        cli,
        cli_env: "PROTOBOT_OPENCODE",
        model: "scripted",
        policy: proxied::POLICY,
        work_item: WORK_ITEM,
        task_model: None,
        env: Vec::new(),
    };
    proxied::harness::prepare(kind, role, script).await
}

async fn run_harness(test: &str, role: Role, script: Script) -> Option<HarnessRun> {
    let harness = prepare(test, role, script).await?;
    let out = harness.run_ok().await;
    Some(HarnessRun { harness, out })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_as_worker_b_reaches_the_model_only_through_the_proxy_and_never_holds_the_key() {
    let Some(HarnessRun { harness, out }) =
        run_harness("opencode_harness_worker_b", Role::WorkerB, script()).await
    else {
        return;
    };
    let (proxy, report) = (&harness.proxy, &harness.report);
    let o = &out.out_dir;

    // Every model request reached the endpoint with the broker's key, for the
    // allowed host only.
    let seen = proxy.double.requests();
    let tooled: Vec<_> = seen
        .iter()
        .filter(|r| {
            r.body
                .get("tools")
                .is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()))
        })
        .collect();
    assert!(
        tooled.len() >= 3,
        "three scripted turns: {} requests",
        seen.len()
    );
    for r in &seen {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {}", proxied::API_KEY).as_str())
        );
        assert_eq!(r.header("host"), Some(proxied::MODEL_HOST), "{r:?}");
        assert!(r.headers.keys().all(|k| !k.starts_with("x-sandbox")));
    }

    // The agent's attempt to reach another host was denied and audited.
    let tool_results: Vec<_> = seen
        .iter()
        .flat_map(|r| r.body["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .collect();
    let other = std::fs::read_to_string(o.join("probe/other.code"))
        .unwrap_or_else(|e| panic!("the probe did not run ({e}); tool results: {tool_results:?}"));
    assert_eq!(
        other.trim(),
        "403",
        "{:?}",
        std::fs::read_to_string(o.join("probe/other.body"))
    );
    let audit = proxied::audited(proxied::OTHER_HOST);
    assert!(
        audit
            .iter()
            .any(|l| l.contains("no-matching-rule") && l.contains(WORK_ITEM)),
        "{audit:?}"
    );
    assert!(proxy.decisions("denied") >= 1);

    // The key is nowhere in what the sandbox held: its environment, every
    // process's arguments and environment, its /tmp (OpenCode's state and
    // configuration), the workspace, or the harness's stderr.
    let env = std::fs::read_to_string(o.join("probe/env")).unwrap();
    assert!(env.contains("PROTOBOT_EGRESS_SESSION_TOKEN_FILE=/task/egress-session-token"));
    let cmdlines = std::fs::read_to_string(o.join("probe/cmdlines")).unwrap();
    assert!(
        cmdlines.contains("opencode"),
        "the process list was captured: {cmdlines}"
    );
    let configs: Vec<_> = files_containing(&o.join("probe/tmp"), b"X-Sandbox-Session-Token")
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "opencode.json"))
        .collect();
    assert_eq!(
        configs.len(),
        1,
        "OpenCode's configuration was captured: {configs:?}"
    );
    let config = std::fs::read_to_string(&configs[0]).unwrap();
    assert!(
        config.contains("{file:/task/egress-session-token}") && !config.contains("apiKey"),
        "the token is read from its file and no key is configured: {config}"
    );
    let leaked = files_containing(o, proxied::API_KEY.as_bytes());
    assert!(
        leaked.is_empty(),
        "the API key reached the sandbox: {leaked:?}"
    );
    assert!(!out.stderr_tail.contains(proxied::API_KEY));

    // The agent's edit comes back as a bundle the validator accepts.
    let bundle =
        collect_bundle(&o.join("worker"), &report.record, &BundleLimits::default()).unwrap();
    let accepted = accept_bundle(bundle, &report.record, &BundleLimits::default())
        .unwrap_or_else(|r| panic!("the bundle was refused: {r:?}"));
    let changes: Vec<_> = accepted
        .bundle()
        .commits
        .iter()
        .flat_map(|c| c.changes.iter())
        .collect();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].path, "src/greet.sh");
    assert_eq!(
        changes[0].content_hex.as_deref(),
        Some(hex_of(GREET.as_bytes()).as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_as_worker_a_gets_the_test_instructions_and_its_tests_come_back_validated() {
    let test_file = "test \"$(sh src/greet.sh)\" = hello || exit 1\ntest -z \"$(sh src/greet.sh extra 2>/dev/null)\" || exit 1\n";
    let script = Script {
        scenarios: vec![Scenario {
            marker: format!("worker-a for {WORK_ITEM}"),
            failures: Vec::new(),
            steps: vec![Step::ToolCalls {
                calls: vec![ToolCall {
                    name: "write".into(),
                    arguments: json!({"filePath": "/workspace/tests/greet_args.sh", "content": test_file}),
                }],
            }],
        }],
    };
    let Some(HarnessRun { harness, out }) =
        run_harness("opencode_harness_worker_a", Role::WorkerA, script).await
    else {
        return;
    };
    let (proxy, report) = (&harness.proxy, &harness.report);
    // The prompt carried Worker A's instructions and the task's requirement.
    let seen = proxy.double.requests();
    let prompt = seen
        .iter()
        .flat_map(|r| r.body["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "user")
        .map(|m| m.to_string())
        .find(|t| t.contains("protobot task: worker-a for"))
        .expect("the harness's prompt reached the model");
    assert!(
        prompt.contains("You are Worker A. Write automated tests"),
        "{prompt}"
    );
    assert!(prompt.contains("REQ-GREET-00001"), "{prompt}");
    assert!(!prompt.contains("You are Worker B"));
    // Worker A never sees the implementation, and its test comes back accepted.
    assert!(!report.dest.join("src/README").exists());
    assert_eq!(harness.bundle_paths(&out), ["tests/greet_args.sh"]);
}

/// Creating `src/greet.sh`, after the model answers `failures` first.
fn greet_with_outage(failures: Vec<u16>) -> Script {
    let write = ToolCall {
        name: "write".into(),
        arguments: json!({"filePath": "/workspace/src/greet.sh", "content": GREET}),
    };
    proxied::harness::one_edit_after_outage(WORK_ITEM, write, failures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_rides_out_a_brief_model_outage_with_its_own_retries() {
    let test = "opencode_harness_brief_outage";
    let Some(harness) = prepare(test, Role::WorkerB, greet_with_outage(vec![429, 503])).await
    else {
        return;
    };
    harness.assert_rides_out(2, &["src/greet.sh"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_reports_an_outage_it_cannot_ride_out_and_the_job_sites_retry_succeeds() {
    let test = "opencode_harness_long_outage";
    let Some(harness) = prepare(test, Role::WorkerB, greet_with_outage(vec![429; 64])).await else {
        return;
    };
    // A rate limit: retried by the Job Site on the same tier after a backoff.
    let answered = harness
        .assert_reports_outage_then_recovers(
            ModelFailure::Status(429),
            "model-rate-limit",
            &["src/greet.sh"],
        )
        .await;
    assert!(
        (2..64).contains(&answered),
        "OpenCode retried, then gave up: {answered} failures answered"
    );
}
