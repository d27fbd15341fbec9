//! The `protobot crd` commands as a user runs them: the real binary, its stdout, stderr and
//! exit status (0 on success; 1 with a one-line `protobot: failed to …` message on failure).

// Helpers outside `#[test]` functions are test code too; a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/usage.rs"]
mod usage;
use std::process::{Command, Output};

#[path = "support/check_jsonschema.rs"]
mod check_jsonschema;

fn protobot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn crd_print_writes_every_crd_to_stdout() {
    let output = protobot(&["crd", "print"]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let kinds: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("    kind: "))
        .collect();
    assert_eq!(
        kinds,
        [
            "Project",
            "ChangeSet",
            "BugReport",
            "BuildWorkItem",
            "InspectionRun"
        ]
    );
    assert_eq!(stdout.matches("kind: CustomResourceDefinition").count(), 5);
    assert!(output.stderr.is_empty());
}

#[test]
fn crd_write_prints_the_written_paths() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("crds");
    let output = protobot(&["crd", "write", target.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let printed: Vec<&str> = stdout.lines().collect();
    assert_eq!(printed.len(), 5);
    for path in printed {
        assert!(path.starts_with(target.to_str().unwrap()), "{path}");
        assert!(std::path::Path::new(path).is_file(), "{path}");
    }
}

#[test]
fn crd_write_failure_exits_1_with_one_line_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, "x").unwrap();
    let output = protobot(&["crd", "write", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("protobot: failed to write the CRDs into "),
        "{stderr}"
    );
    assert!(stderr.contains(file.to_str().unwrap()), "{stderr}");
}

fn rules_evaluate(stdin: &str) -> Output {
    rules_evaluate_with(&[], stdin)
}

fn rules_evaluate_with(flags: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args(["rules", "evaluate"])
        .args(flags)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn example_claim() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/rules/claim.json"
    );
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn rules_evaluate_with_audit_prints_the_events_the_command_produces() {
    let output = rules_evaluate_with(&["--with-audit"], &example_claim());
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let example: serde_json::Value = serde_json::from_str(&example_claim()).unwrap();
    assert_eq!(out["result"]["ok"], true, "{out}");
    assert_eq!(out["audit"]["count"], 1, "{out}");
    let event = &out["audit"]["events"][0];
    assert_eq!(event["operation"], "claim");
    assert_eq!(
        event["subject"], example["context"]["subject"],
        "the trusted actor"
    );
    assert_eq!(event["outcome"], "allowed");
    // Without the flag the answer is as before.
    let plain: serde_json::Value =
        serde_json::from_slice(&rules_evaluate(&example_claim()).stdout).unwrap();
    assert!(plain.get("audit").is_none());
    assert_eq!(plain["result"], out["result"]);
}

#[test]
fn rules_evaluate_claims_the_readme_example() {
    let output = rules_evaluate(&example_claim());
    assert!(output.status.success(), "{output:?}");
    let out: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(out["result"]["ok"], true);
    assert_eq!(
        out["result"]["decision"]["rule_version"],
        "validation-rules/v1"
    );
    assert_eq!(out["record"]["state"], "building");
    assert_eq!(out["record"]["contract_version"], 4);
    assert_eq!(out["record"]["lease"]["owner"], "job-site-a");
}

#[test]
fn rules_evaluate_reports_a_rejection_as_a_normal_answer() {
    let input = example_claim().replace(
        "\"expected_contract_version\": 3",
        "\"expected_contract_version\": 2",
    );
    let output = rules_evaluate(&input);
    assert!(output.status.success(), "{output:?}");
    let out: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(out["result"]["error"]["code"], "STALE_CONTRACT_VERSION");
    assert_eq!(out["record"]["state"], "ready-for-building");
}

#[test]
fn rules_evaluate_exits_2_naming_the_malformed_field() {
    let input = example_claim().replace("\"now\": \"2026-09-18T12:00:00Z\"", "\"now\": \"noon\"");
    let output = rules_evaluate(&input);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("`now`"), "{stderr}");
    let output = rules_evaluate("not json");
    assert_eq!(output.status.code(), Some(2));
}

fn git(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "T")
        .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
        .env("GIT_COMMITTER_NAME", "T")
        .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A canonical repository with shared, implementation and test paths.
fn canonical() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let write = |p: &str, c: &str| {
        let path = dir.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, c).unwrap();
    };
    write(
        ".protobot/projection.yaml",
        "version: 1\npaths:\n  - path: docs/\n    class: shared\n  - path: src/\n    class: implementation\n  - path: tests/\n    class: test\n  - path: .protobot/projection.yaml\n    class: shared\n",
    );
    write("docs/spec.md", "# spec\n");
    write("src/lib.rs", "pub fn answer() -> u32 { 42 }\n");
    write("tests/answer.rs", "#[test] fn t() {}\n");
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "initial"]);
    tmp
}

#[test]
fn projection_export_and_patch_check_guard_the_worker_boundary() {
    let canonical = canonical();
    let work = tempfile::tempdir().unwrap();
    let dest = work.path().join("worker-b");
    let repo = canonical.path().to_str().unwrap();
    let output = protobot(&[
        "projection",
        "export",
        "--role",
        "B",
        "--at",
        "main",
        repo,
        dest.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "{output:?}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["role"], "worker-b");
    assert!(dest.join("src/lib.rs").exists());
    assert!(
        !dest.join("tests").exists(),
        "Worker B never sees test source"
    );

    // Worker B writes a test file: the bundle must be rejected, naming the rule.
    std::fs::create_dir_all(dest.join("tests")).unwrap();
    std::fs::write(dest.join("tests/peek.rs"), "// peek\n").unwrap();
    git(&dest, &["add", "-A"]);
    git(&dest, &["commit", "-q", "-m", "peek"]);
    let record = protobot_repo::export::ProjectionRecord::read(
        &protobot_repo::export::record_path_for(&dest),
    )
    .unwrap();
    let bundle = protobot_repo::bundle::collect_bundle(
        &dest,
        &record,
        &protobot_repo::validate::Limits::default(),
    )
    .unwrap();
    let bundle_path = work.path().join("patch.bundle");
    std::fs::write(&bundle_path, bundle.to_json().unwrap()).unwrap();
    let output = protobot(&[
        "patch",
        "check",
        "--role",
        "B",
        "--projection",
        dest.to_str().unwrap(),
        bundle_path.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let checked: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(checked["accepted"], false);
    assert_eq!(checked["violations"][0]["code"], "not-writable-by-role");

    let output = protobot(&[
        "patch",
        "check",
        "--role",
        "B",
        "--projection",
        dest.to_str().unwrap(),
        "/nonexistent.bundle",
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    assert_eq!(String::from_utf8(output.stderr).unwrap().lines().count(), 1);
}

fn bwrap_available() -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join("bwrap").is_file()))
        .unwrap_or(false)
}

#[test]
fn sandbox_conformance_passes_for_the_local_profile() {
    if !bwrap_available() {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
            "PROTOBOT_REQUIRE_BWRAP is set but bwrap is not installed"
        );
        eprintln!("skipping: bubblewrap is not installed (apt-get install bubblewrap)");
        return;
    }
    let output = protobot(&["sandbox", "conformance", "--profile", "local"]);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(output.status.success(), "{report}");
    assert_eq!(report["contract_version"], "jobsite-sandbox/v1");
    assert_eq!(report["passed"], true);
}

#[test]
fn sandbox_conformance_refuses_profiles_it_cannot_check_here() {
    let output = protobot(&["sandbox", "conformance", "--profile", "kata"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(output.stdout.is_empty());
}

#[test]
fn the_demo_builds_the_example_through_a_triage_cycle_and_merges_it() {
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
    let output = protobot(&["demo", "--output", "json", "--dir", dir.to_str().unwrap()]);
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["state"], "completed");
    assert_eq!(report["main_contains_merge"], true);
    assert_eq!(report["sandbox"], "bubblewrap");
    let decisions: Vec<&str> = report["cycles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["decision"].as_str().unwrap())
        .collect();
    assert_eq!(
        decisions,
        ["implementation", "pass"],
        "Worker B's first attempt fails, triage routes it back"
    );
    // The scripted Inspector ran through the sandbox and its run sealed.
    let inspections = report["inspections"].as_array().unwrap();
    assert_eq!(inspections.len(), 1, "{report}");
    assert_eq!(
        inspections[0]["producers"],
        serde_json::json!(["inspector"])
    );
    assert_eq!(inspections[0]["verdict"]["verdict"], "sealed");
    assert_eq!(
        report["findings"], 0,
        "the corrected tool shows every probed behaviour"
    );
    // Result records, one per stage, all passing, valid against the corpus schema, and
    // rebuilt identically from trace.json alone.
    let results = dir.join("results");
    assert_eq!(report["results"]["dir"], results.to_str().unwrap());
    let records = check_jsonschema::records_in(&results);
    assert_eq!(records.len(), 6, "{records:?}");
    check_jsonschema::validate(&records);
    for r in report["results"]["records"].as_array().unwrap() {
        assert_eq!(r["pass"], true, "{r}");
    }
    assert_replays(&results);
    let worker_b: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            records
                .iter()
                .find(|p| p.to_str().unwrap().contains("-worker-b-"))
                .unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(
        worker_b["failures"][0]["detail"]
            .as_str()
            .unwrap()
            .starts_with("worker-b, cycle 1: test_dry_run (REQ-CLI-00001) failed"),
        "{worker_b}"
    );
    let job_site: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            records
                .iter()
                .find(|p| p.to_str().unwrap().contains("-job-site-"))
                .unwrap(),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        job_site["scores"]["job_site"]["visible_checks"],
        serde_json::json!({"passed": 1, "failed": 0, "total": 1}),
        "VIS-CLI-00001 ran on the merged product: {job_site}"
    );
    let feedback = report["cycles"][0]["feedback"].to_string();
    assert!(feedback.contains("REQ-CLI-00001"), "{feedback}");
    assert!(
        !feedback.contains("tests/") && !feedback.contains("cp -R"),
        "no test paths or code cross to Worker B: {feedback}"
    );
    // The merge is really on origin's main, with its Work-Item trailer.
    let origin = dir.join("origin.git");
    let merge = report["merge_commit"].as_str().unwrap();
    let log = Command::new("git")
        .args(["log", "-1", "--format=%H %P%n%B", "main"])
        .current_dir(&origin)
        .output()
        .unwrap();
    let log = String::from_utf8(log.stdout).unwrap();
    assert!(log.starts_with(merge), "{log}");
    assert_eq!(
        log.lines().next().unwrap().split_whitespace().count(),
        3,
        "a merge commit has two parents"
    );
    assert!(
        log.contains(&format!(
            "Work-Item: {}",
            report["work_item"].as_str().unwrap()
        )),
        "{log}"
    );
    // `protobot status` reads the same store.
    let store = dir.join("wms.sqlite");
    let status = protobot(&[
        "status",
        "--store",
        store.to_str().unwrap(),
        "--project",
        "cli-sync",
    ]);
    assert!(status.status.success(), "{status:?}");
    let table = String::from_utf8(status.stdout).unwrap();
    assert!(
        table.lines().nth(1).unwrap().contains("completed"),
        "{table}"
    );
    let missing = protobot(&[
        "status",
        "--store",
        "/nonexistent/wms.sqlite",
        "--project",
        "cli-sync",
    ]);
    assert_eq!(missing.status.code(), Some(2));
    // A second run in the same directory resumes a finished item: nothing to do,
    // still exactly one merge.
    let again = protobot(&["demo", "--output", "json", "--dir", dir.to_str().unwrap()]);
    assert!(again.status.success(), "{again:?}");
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again["state"], "completed");
    assert_eq!(merges_on_main(&origin), 1);
    // A directory holding something else is refused.
    let foreign = tmp.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("notes.txt"), "mine").unwrap();
    let refused = protobot(&["demo", "--dir", foreign.to_str().unwrap()]);
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(
        std::fs::read_dir(&foreign).unwrap().count(),
        1,
        "a refused run changes nothing"
    );
}

/// The records in `dir` are exactly what `trace.json` rebuilds (offline replay).
fn assert_replays(dir: &std::path::Path) {
    let bundle = std::fs::read(dir.join("trace.json")).unwrap();
    let run: protobot_eval::evidence::JobSiteRun = serde_json::from_slice(&bundle).unwrap();
    let traces = [protobot_eval::schema::Trace {
        kind: protobot_eval::schema::TraceKind::JobSite,
        uri: "trace.json".into(),
        digest: Some(protobot_eval::schema::sha256_digest(&bundle)),
    }];
    for record in protobot_eval::records::build(&run, &traces) {
        let written: protobot_eval::schema::ResultRecord = serde_json::from_slice(
            &std::fs::read(dir.join(format!("{}.json", record.result_id))).unwrap(),
        )
        .unwrap();
        assert_eq!(written, record);
        assert_eq!(
            protobot_eval::semantics::violations(&record),
            Vec::<String>::new()
        );
    }
}

fn merges_on_main(origin: &std::path::Path) -> usize {
    let log = Command::new("git")
        .args([
            "log",
            "--first-parent",
            "--merges",
            "--format=%(trailers:key=Work-Item,valueonly)",
            "main",
        ])
        .current_dir(origin)
        .output()
        .unwrap();
    String::from_utf8(log.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// `protobot demo --harness opencode` (issue 21): the real OpenCode CLI as Workers A and B in
/// the sandbox, reaching the demo's model double only through the egress proxy, which
/// injects the key. Needs root, bubblewrap and `scripts/install-agents.sh`; skipped with the
/// reason otherwise, unless PROTOBOT_REQUIRE_AGENTS is set.
#[test]
fn the_demo_with_opencode_workers_merges_through_the_egress_proxy() {
    let opencode =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.tools/agents/bin/opencode");
    let root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    let missing = if !bwrap_available() {
        Some("bubblewrap is not installed")
    } else if !root {
        Some("the agent Workers' network namespace needs root")
    } else if !opencode.exists() {
        Some("OpenCode is not installed (scripts/install-agents.sh)")
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
    let output = protobot(&[
        "demo",
        "--output",
        "json",
        "--harness",
        "opencode",
        "--opencode",
        opencode.to_str().unwrap(),
        "--dir",
        dir.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["state"], "completed");
    assert_eq!(report["main_contains_merge"], true);
    assert_eq!(report["harness"], "opencode");
    let decisions: Vec<&str> = report["cycles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["decision"].as_str().unwrap())
        .collect();
    assert_eq!(decisions, ["implementation", "pass"], "{report}");
    // Worker A once, Worker B twice, the Inspector once, each at least a tool turn and a
    // closing turn (plus OpenCode's title requests): every one carried the key the broker
    // injected.
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
    // The Inspector was OpenCode too: its run sealed with the probes' findings (none).
    let inspections = report["inspections"].as_array().unwrap();
    assert_eq!(inspections.len(), 1, "{report}");
    assert_eq!(inspections[0]["verdict"]["verdict"], "sealed", "{report}");
    // The records are schema-valid, replay, and the trace holds the model requests' metadata
    // from the proxy's audit, per role, without the key.
    let results = dir.join("results");
    let records = check_jsonschema::records_in(&results);
    assert_eq!(records.len(), 6, "{records:?}");
    check_jsonschema::validate(&records);
    assert_replays(&results);
    let bundle = std::fs::read_to_string(results.join("trace.json")).unwrap();
    assert!(
        !bundle.contains("demo-model-key-"),
        "the key is not in the trace"
    );
    let run: serde_json::Value = serde_json::from_str(&bundle).unwrap();
    for role in ["worker-a", "worker-b", "inspector"] {
        let allowed = run["egress"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["role"] == role
                    && d["outcome"] == "allowed"
                    && d["destination"] == "model.protobot-demo.invalid"
            })
            .count();
        assert!(
            allowed >= 2,
            "{role}: {allowed} allowed model requests in the proxy's audit: {}",
            run["egress"]
        );
        let at_endpoint = run["model_requests"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["role"] == role && r["key_injected"] == true)
            .count();
        assert!(at_endpoint >= 2, "{role}: {}", run["model_requests"]);
    }
    let inspector_model = run["environment"]["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "inspector")
        .cloned()
        .unwrap();
    assert_eq!(inspector_model["settings"]["harness"], "opencode");
}

/// Issue 32: `protobot demo --dir "$(mktemp -d)/d"`. `mktemp -d` makes a
/// 0700 directory, which a per-run sandbox uid cannot enter; the demo stages
/// its runs where the sandbox can reach and completes (or, when it cannot run
/// per-run uids, never needed to).
#[test]
fn a_demo_under_a_private_directory_completes_and_says_where_runs_are_staged() {
    use std::os::unix::fs::PermissionsExt;
    if !bwrap_available() {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
            "PROTOBOT_REQUIRE_BWRAP is set but bwrap is not installed"
        );
        eprintln!("skipping: bubblewrap is not installed");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let private = tmp.path().join("mktemp");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    let dir = private.join("d");
    let output = protobot(&["demo", "--dir", dir.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "{}\n{stderr}",
        String::from_utf8_lossy(&output.stdout)
    );
    let root = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m));
    if root.ok() == Some(0) {
        assert!(stderr.contains("staged under"), "{stderr}");
        assert!(stderr.contains(private.to_str().unwrap()), "{stderr}");
    }
    assert_eq!(merges_on_main(&dir.join("origin.git")), 1);
}

#[test]
fn a_demo_killed_mid_build_resumes_from_its_store_and_merges_once() {
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
    let mut child = Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args(["demo", "--dir", dir.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Kill it as cycle 2 starts: cycle 1's attempt is durable in the store by then.
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut killed_mid_build = false;
    for line in std::io::BufRead::lines(stderr) {
        let Ok(line) = line else { break };
        if line.contains("building: cycle 2") {
            child.kill().unwrap();
            killed_mid_build = true;
            break;
        }
    }
    child.wait().unwrap();
    assert!(
        killed_mid_build,
        "the demo finished or stalled before its first cycle ended"
    );
    let origin = dir.join("origin.git");
    assert_eq!(merges_on_main(&origin), 0, "killed before merging");
    let rerun = protobot(&["demo", "--output", "json", "--dir", dir.to_str().unwrap()]);
    assert!(
        rerun.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&rerun.stdout),
        String::from_utf8_lossy(&rerun.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&rerun.stdout).unwrap();
    assert_eq!(report["state"], "completed");
    assert_eq!(report["main_contains_merge"], true);
    assert_eq!(
        merges_on_main(&origin),
        1,
        "exactly one merge after the resume"
    );
    // The resumed run did not start over: it continued after the recorded cycle.
    let first = report["cycles"][0]["cycle"].as_u64().unwrap_or(1);
    assert!(first >= 2, "resumed at cycle {first}: {report}");
}

#[test]
fn protobot_run_builds_a_change_set_of_your_repository_with_your_harness() {
    if !bwrap_available() {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
            "PROTOBOT_REQUIRE_BWRAP is set but bwrap is not installed"
        );
        eprintln!("skipping: bubblewrap is not installed");
        return;
    }
    use protobot_demo::example::{INTEGRATION, WORKER_A, WORKER_B, author};
    let tmp = tempfile::tempdir().unwrap();
    let (work, origin) = (tmp.path().join("work"), tmp.path().join("origin.git"));
    author(&work, &origin).unwrap();
    let harness = tmp.path().join("harness");
    std::fs::create_dir_all(&harness).unwrap();
    std::fs::write(harness.join("worker-a.sh"), WORKER_A).unwrap();
    std::fs::write(harness.join("integration.sh"), INTEGRATION).unwrap();
    let run = |cs: &str| {
        protobot(&[
            "run",
            "--repo",
            work.to_str().unwrap(),
            "--change-set",
            cs,
            "--harness",
            harness.to_str().unwrap(),
            "--output",
            "json",
        ])
    };
    // A harness without worker-b.sh is refused before anything is touched.
    let missing = run("CS-00001");
    assert_eq!(missing.status.code(), Some(2), "{missing:?}");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("worker-b.sh"));
    assert!(!work.join(".git/protobot/wms.sqlite").exists());
    std::fs::write(harness.join("worker-b.sh"), WORKER_B).unwrap();
    // A change set that was never approved is refused.
    let unknown = run("CS-00009");
    assert_eq!(unknown.status.code(), Some(2), "{unknown:?}");
    let ok = run("CS-00001");
    assert!(
        ok.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&ok.stdout),
        String::from_utf8_lossy(&ok.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(report["state"], "completed");
    let outcomes: Vec<&str> = report["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["implementation", "passed"], "{report}");
    assert_eq!(merges_on_main(&origin), 1);
    // A rerun resumes a finished item: nothing more happens.
    let again = run("CS-00001");
    assert!(again.status.success(), "{again:?}");
    assert_eq!(merges_on_main(&origin), 1);

    // A regression lands on main: dry runs copy again (violating REQ-CLI-00001).
    git(&work, &["fetch", "-q", "origin"]);
    git(&work, &["checkout", "-q", "main"]);
    git(&work, &["reset", "-q", "--hard", "origin/main"]);
    let sync = work.join("src/sync.sh");
    let fixed = std::fs::read_to_string(&sync).unwrap();
    let broken = fixed.replace("then exit 0; fi", "then :; fi");
    assert_ne!(broken, fixed, "the regression changes the script");
    std::fs::write(&sync, broken).unwrap();
    git(&work, &["commit", "-qam", "refactor sync (regression)"]);
    git(&work, &["push", "-q", "origin", "main"]);
    let bug = |id: &str, violates: &str| {
        protobot(&[
            "run",
            "--repo",
            work.to_str().unwrap(),
            "--bug",
            id,
            "--violates",
            violates,
            "--harness",
            harness.to_str().unwrap(),
            "--output",
            "json",
        ])
    };
    // A bug must name an approved requirement.
    let unknown = bug("GH-2", "REQ-CLI-09999");
    assert_eq!(unknown.status.code(), Some(2), "{unknown:?}");
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("REQ-CLI-09999"));
    let fixed_run = bug("GH-1", "REQ-CLI-00001");
    assert!(
        fixed_run.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&fixed_run.stdout),
        String::from_utf8_lossy(&fixed_run.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&fixed_run.stdout).unwrap();
    assert_eq!(report["state"], "completed", "{report}");
    assert_eq!(report["change_type"], "contradicts");
    assert!(
        report["work_item"]
            .as_str()
            .unwrap()
            .starts_with("wi-bug-gh-1-"),
        "{report}"
    );
    assert_eq!(merges_on_main(&origin), 2, "the fix merged");
    // Running the same bug again resumes its registration (main has moved since).
    let again = bug("GH-1", "REQ-CLI-00001");
    assert!(again.status.success(), "{again:?}");
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again["work_item"], report["work_item"]);
    assert_eq!(merges_on_main(&origin), 2);
    // The same bug id with other requirements is refused.
    let other = bug("GH-1", "REQ-CLI-00002");
    assert_eq!(other.status.code(), Some(2), "{other:?}");
}

#[test]
fn egress_proxy_refuses_a_bad_policy_with_one_line_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "rules:\n  - destination: 127.0.0.1\n    method: GET\n    path: /v2/allowed\n",
    )
    .unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef").unwrap();
    let sessions = dir.path().join("sessions.yaml");
    std::fs::write(&sessions, "sessions: []\n").unwrap();
    let output = protobot(&[
        "egress-proxy",
        "--listen=127.0.0.1:0",
        "--admin-listen=127.0.0.1:0",
        "--policy",
        policy.to_str().unwrap(),
        "--credentials-dir",
        dir.path().to_str().unwrap(),
        "--sessions",
        sessions.to_str().unwrap(),
        "--session-secret",
        secret.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("protobot: invalid egress policy ")
            && stderr.contains("rules[0].destination"),
        "{stderr}"
    );
    // Nothing was started: no startup event on stdout.
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(!stdout.contains("egress proxy started"), "{stdout}");
}

#[test]
fn without_bubblewrap_the_demo_and_run_refuse_before_any_work_with_the_command_to_run() {
    let tmp = tempfile::tempdir().unwrap();
    let empty_path = tmp.path().join("no-tools");
    std::fs::create_dir_all(&empty_path).unwrap();
    let dir = tmp.path().join("demo");
    let demo = Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args(["demo", "--dir", dir.to_str().unwrap()])
        .env("PATH", &empty_path)
        .output()
        .unwrap();
    assert_eq!(demo.status.code(), Some(2), "{demo:?}");
    let stderr = String::from_utf8_lossy(&demo.stderr);
    assert!(
        stderr.contains("sudo apt-get install -y bubblewrap"),
        "{stderr}"
    );
    assert!(!dir.exists(), "nothing was authored: {}", dir.display());
    let run = Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args([
            "run",
            "--repo",
            ".",
            "--change-set",
            "CS-00001",
            "--harness",
            ".",
        ])
        .env("PATH", &empty_path)
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(2), "{run:?}");
    assert!(String::from_utf8_lossy(&run.stderr).contains("protobot run again"));
}

#[test]
fn status_prints_json_with_output_json_and_a_closed_pipe_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let store = tmp.path().join("wms.sqlite");
    // An empty store: `status` lists nothing, in either format.
    protobot_stores::SqliteStore::open(&store, "p", protobot_stores::AdapterConfig::default())
        .unwrap();
    let json = protobot(&[
        "status",
        "--store",
        store.to_str().unwrap(),
        "--project",
        "p",
        "--output",
        "json",
    ]);
    assert!(json.status.success(), "{json:?}");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&json.stdout).unwrap(),
        serde_json::json!([])
    );
    let old = protobot(&[
        "status",
        "--store",
        store.to_str().unwrap(),
        "--project",
        "p",
        "--json",
    ]);
    assert_eq!(
        old.status.code(),
        Some(2),
        "--json is gone: one convention, --output json"
    );
    // A reader that is gone before anything is written (`| head` after its
    // lines, `| true`): no panic, status 0, nothing on stderr.
    for args in [
        format!(
            "status --store '{}' --project p --output json",
            store.display()
        ),
        "crd print".to_owned(),
    ] {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "(sleep 0.3; exec '{}' {args}) | true; echo \"${{PIPESTATUS[0]}}\"",
                env!("CARGO_BIN_EXE_protobot")
            ))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args}: {stderr}");
        assert_eq!(stderr.trim(), "", "{args}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0", "{args}");
    }
}
