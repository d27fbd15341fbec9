//! `protobot demo --harness claude-code` (issue 21): the real Claude Code CLI as Workers A and
//! B and the Inspector in the sandbox, reaching the demo's model double (Anthropic Messages
//! API) only through the egress proxy, which injects the key. Needs root, bubblewrap and
//! `scripts/install-agents.sh`; skipped with the reason otherwise, unless
//! PROTOBOT_REQUIRE_AGENTS is set.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/usage.rs"]
mod usage;
use std::process::Command;

fn bwrap_available() -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("bwrap").is_file()))
        .unwrap_or(false)
}

#[test]
fn the_demo_with_claude_code_workers_merges_through_the_egress_proxy() {
    let claude =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/agents/bin/claude");
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    let missing = if !bwrap_available() {
        Some("bubblewrap is not installed")
    } else if !root {
        Some("the agent Workers' network namespace needs root")
    } else if !claude.exists() {
        Some("Claude Code is not installed (scripts/install-agents.sh)")
    } else {
        None
    };
    if let Some(why) = missing {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_AGENTS").is_none(),
            "PROTOBOT_REQUIRE_AGENTS is set but {why}"
        );
        eprintln!("skipping: {why}; set PROTOBOT_REQUIRE_AGENTS=1 to make this a failure");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let output = Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args([
            "demo",
            "--output",
            "json",
            "--harness",
            "claude-code",
            "--claude",
            claude.to_str().unwrap(),
            "--dir",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["state"], "completed");
    assert_eq!(report["main_contains_merge"], true);
    assert_eq!(report["harness"], "claude-code");
    let decisions: Vec<&str> = report["cycles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["decision"].as_str().unwrap())
        .collect();
    assert_eq!(decisions, ["implementation", "pass"], "{report}");
    // Worker A once, Worker B twice, the Inspector once, each a tool turn and a closing turn:
    // every request carried the key the broker injected, and the proxy allowed each one.
    let model = &report["model"];
    let requests = model["requests"].as_u64().unwrap();
    assert!(requests >= 8, "{model}");
    assert_eq!(
        model["with_injected_key"].as_u64(),
        Some(requests),
        "{model}"
    );
    assert_eq!(model["proxy_allowed"].as_u64(), Some(requests), "{model}");

    // Usage (issue 34): metered per stage, equal to the model double's own count.
    usage::assert_metered_equals_the_doubles_count(&report);
    assert_eq!(model["proxy_denied"].as_u64(), Some(0), "{model}");
    // The Inspector was Claude Code too: its run sealed with the probes' findings (none), and
    // the trace holds its model requests, each with the injected key, under its harness.
    let inspections = report["inspections"].as_array().unwrap();
    assert_eq!(inspections.len(), 1, "{report}");
    assert_eq!(inspections[0]["verdict"]["verdict"], "sealed", "{report}");
    let trace = std::fs::read_to_string(dir.join("results/trace.json")).unwrap();
    assert!(
        !trace.contains("demo-model-key-"),
        "the key is not in the trace"
    );
    let run: serde_json::Value = serde_json::from_str(&trace).unwrap();
    for role in ["worker-a", "worker-b", "inspector"] {
        let at_endpoint = run["model_requests"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["role"] == role && r["key_injected"] == true)
            .count();
        assert!(at_endpoint >= 2, "{role}: {}", run["model_requests"]);
        let settings = run["environment"]["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == role)
            .map(|m| m["settings"].clone())
            .unwrap();
        assert_eq!(settings["harness"], "claude-code", "{role}: {settings}");
    }
}

#[test]
fn a_missing_claude_binary_fails_the_demo_naming_the_flag() {
    if !bwrap_available() {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
            "PROTOBOT_REQUIRE_BWRAP is set but bwrap is not installed"
        );
        eprintln!("skipping: bubblewrap is not installed");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let output = Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args([
            "demo",
            "--harness",
            "claude-code",
            "--claude",
            "/nonexistent/claude",
            "--dir",
            dir.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("Claude Code was not found at /nonexistent/claude")
            && stderr.contains("--claude PATH"),
        "{stderr}"
    );
}
