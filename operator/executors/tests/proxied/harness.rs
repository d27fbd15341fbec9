//! A reference harness (`harnesses/<name>/run.sh`) with its real agent CLI in
//! the bubblewrap sandbox, behind the proxy of [`super::start_with_policy`]:
//! what the OpenCode and Claude Code harness tests share.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use protobot_executors::{BubblewrapConfig, BubblewrapExecutor, LocalEgress};
use protobot_jobsite::{
    escalation::{MODEL_FAILURE_FILE, ModelFailure},
    executor::{Executor, Limits, RunOutput, RunSpec, SandboxRole, Termination},
};
use protobot_model_double::{Scenario, Script, Step, ToolCall};
use protobot_repo::{
    bundle::collect_bundle,
    catalog::ChangeScope,
    export::{ExportReport, ExportRequest, export_projection},
    role::Role,
    validate::{Limits as BundleLimits, accept_bundle},
};
use serde_json::json;
use tokio::sync::watch;

use super::Proxied;

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// An agent CLI (resolved through the install's symlink): `$env_var`, else
/// `.tools/agents/bin/<bin>`. `None` after printing why the test is skipped;
/// a panic when `PROTOBOT_REQUIRE_AGENTS` is set.
pub fn agent_cli(test: &str, name: &str, env_var: &str, bin: &str) -> Option<PathBuf> {
    let required = std::env::var_os("PROTOBOT_REQUIRE_AGENTS").is_some();
    let candidate = std::env::var_os(env_var)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/agents/bin").join(bin));
    match std::fs::canonicalize(&candidate) {
        Ok(path) if path.is_file() => Some(path),
        _ if required => panic!(
            "{test}: {name} is not installed at {} but PROTOBOT_REQUIRE_AGENTS is set; run scripts/install-agents.sh",
            candidate.display()
        ),
        _ => {
            eprintln!(
                "SKIPPED {test}: {name} is not installed at {} (run scripts/install-agents.sh, or set {env_var}); set PROTOBOT_REQUIRE_AGENTS=1 to make this a failure",
                candidate.display()
            );
            None
        }
    }
}

/// Every file under `dir` whose content contains `needle`.
pub fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                let bytes = std::fs::read(&path).unwrap();
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    found.push(path);
                }
            }
        }
    }
    found
}

/// Lower-case hex of `bytes` (a bundle change's `content_hex`).
pub fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What differs between the harnesses.
pub struct HarnessKind<'a> {
    /// The test's name (skip messages).
    pub test: &'a str,
    /// The folder under `harnesses/`.
    pub folder: &'a str,
    /// The agent CLI.
    pub cli: PathBuf,
    /// The harness's variable naming the CLI (`PROTOBOT_OPENCODE`).
    pub cli_env: &'a str,
    /// The class's `PROTOBOT_MODEL`.
    pub model: &'a str,
    /// The proxy's policy.
    pub policy: &'a str,
    /// The work item the task names (the double's scenarios key on it).
    pub work_item: &'a str,
    /// The tier's model the task names, which wins over `model`.
    pub task_model: Option<(&'a str, &'a str)>,
    /// More `NAME=value` settings of the class's command.
    pub env: Vec<String>,
}

/// A prepared harness: the proxy with its script, a projection of the
/// canonical repository for the role, and the sandbox; each [`Harness::run`]
/// is one Worker run on that projection.
pub struct Harness {
    /// The proxy and the double behind it.
    pub proxy: Proxied,
    /// The projection the harness works on.
    pub report: ExportReport,
    executor: BubblewrapExecutor,
    spec: RunSpec,
    _tmp: tempfile::TempDir,
}

/// Prepares `kind` as `role` with `script` behind the proxy; `None` when the
/// test is skipped (no bubblewrap or proxied egress here, and
/// `PROTOBOT_REQUIRE_AGENTS` unset).
pub async fn prepare(kind: HarnessKind<'_>, role: Role, script: Script) -> Option<Harness> {
    let test = kind.test;
    let required = std::env::var_os("PROTOBOT_REQUIRE_AGENTS").is_some();
    if !crate::common::bwrap_available(test) {
        assert!(
            !required,
            "{test}: PROTOBOT_REQUIRE_AGENTS is set but bubblewrap is unavailable"
        );
        return None;
    }
    if !super::egress_available(test) {
        assert!(
            !required,
            "{test}: PROTOBOT_REQUIRE_AGENTS is set but proxied egress is unavailable"
        );
        return None;
    }
    let proxy = super::start_with_policy(script, kind.policy).await;
    let tmp = tempfile::tempdir().unwrap();
    let repo = super::canonical(tmp.path());
    let report = export_projection(&ExportRequest {
        source_repo: repo,
        at: "refs/heads/main".into(),
        role,
        dest: tmp.path().join("projection"),
        scope: ChangeScope::default(),
    })
    .unwrap();

    let harness = std::fs::canonicalize(repo_root().join("harnesses").join(kind.folder)).unwrap();
    let mut config = BubblewrapConfig::under(&tmp.path().join("sandbox"));
    config.egress = Some(LocalEgress::new(proxy.secret.clone()));
    config.extra_ro_binds = vec![harness.clone(), kind.cli.parent().unwrap().to_path_buf()];
    let executor = BubblewrapExecutor::new(config);

    let mut spec = crate::common::spec(&report.dest, "true");
    spec.role = match role {
        Role::WorkerA => SandboxRole::WorkerA,
        _ => SandboxRole::WorkerB,
    };
    spec.task = json!({
        "role": spec.role.as_str(),
        "work_item_id": kind.work_item,
        "cycle": 1,
        "retry_budget": 3,
        "requirement_ids": ["REQ-GREET-00001"],
        "feedback": [],
    });
    if let Some((provider, model)) = kind.task_model {
        spec.task["model_tier"] = json!("t2");
        spec.task["model"] = json!({"provider": provider, "model": model});
    }
    spec.command = vec![
        "env".into(),
        format!("PROTOBOT_MODEL_HOST={}", super::MODEL_HOST),
        format!("PROTOBOT_MODEL={}", kind.model),
        format!("{}={}", kind.cli_env, kind.cli.display()),
    ];
    spec.command.extend(kind.env);
    spec.command.extend([
        "/bin/sh".into(),
        harness.join("run.sh").display().to_string(),
    ]);
    spec.egress_proxy = Some(proxy.proxy_url.clone());
    // The agent CLIs are Bun binaries that reserve a large address space up
    // front: the memory limit is an RLIMIT_AS, so it is generous here.
    spec.limits = Limits {
        wall_clock: Duration::from_secs(240),
        cpu: Duration::from_secs(240),
        memory_bytes: 64 << 30,
        processes: 1024,
        file_size_bytes: 256 << 20,
        open_files: 4096,
    };
    Some(Harness {
        proxy,
        report,
        executor,
        spec,
        _tmp: tmp,
    })
}

impl Harness {
    /// One run of the harness (a run id of its own, as the Job Site's retry
    /// of the same cycle has).
    pub async fn run(&self) -> RunOutput {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut spec = self.spec.clone();
        spec.run_id = format!("{}-r{n}", spec.run_id);
        let (_tx, rx) = watch::channel(false);
        self.executor.run(spec, rx).await.unwrap()
    }

    /// [`Self::run`], which must exit 0.
    pub async fn run_ok(&self) -> RunOutput {
        let out = self.run().await;
        assert_eq!(
            out.termination,
            Termination::Exited { code: 0 },
            "{}",
            out.stderr_tail
        );
        out
    }
}

impl Harness {
    /// The paths the accepted bundle of `out` changes (a refused bundle panics).
    pub fn bundle_paths(&self, out: &RunOutput) -> Vec<String> {
        let record = &self.report.record;
        let bundle = collect_bundle(
            &out.out_dir.join("worker"),
            record,
            &BundleLimits::default(),
        )
        .unwrap();
        let accepted = accept_bundle(bundle, record, &BundleLimits::default())
            .unwrap_or_else(|r| panic!("the bundle was refused: {r:?}"));
        accepted
            .bundle()
            .commits
            .iter()
            .flat_map(|c| c.changes.iter().map(|ch| ch.path.clone()))
            .collect()
    }

    /// A brief outage the CLI rides out with its own retries: the run exits 0, writes no
    /// model-failure report, the double answered `failures` failures, and the bundle
    /// changes `paths`.
    pub async fn assert_rides_out(&self, failures: usize, paths: &[&str]) {
        let out = self.run_ok().await;
        assert_eq!(self.proxy.double.failures_answered(), failures);
        assert!(!out.out_dir.join(MODEL_FAILURE_FILE).exists());
        assert_eq!(self.bundle_paths(&out), paths);
    }

    /// An outage longer than the CLI's own retries: the run exits 2 with a model-failure
    /// report the Job Site reads as `expected`, transient under `label`, and brings no
    /// bundle; once the outage ends, the same run again (the Job Site's retry of the
    /// cycle) succeeds with a bundle changing `paths`. Returns how many failures the
    /// double answered to the failed run.
    pub async fn assert_reports_outage_then_recovers(
        &self,
        expected: ModelFailure,
        label: &str,
        paths: &[&str],
    ) -> usize {
        let failed = self.run().await;
        assert_eq!(
            failed.termination,
            Termination::Exited { code: 2 },
            "{}",
            failed.stderr_tail
        );
        let answered = self.proxy.double.failures_answered();
        let report = std::fs::read(failed.out_dir.join(MODEL_FAILURE_FILE)).unwrap_or_else(|e| {
            panic!(
                "no {MODEL_FAILURE_FILE} ({e}); stderr: {}",
                failed.stderr_tail
            )
        });
        let failure = ModelFailure::from_report(&report).unwrap();
        assert_eq!(failure, expected);
        assert_eq!(failure.attempt_label(), Some(label));
        assert!(
            failed.stderr_tail.contains("its model request failed"),
            "{}",
            failed.stderr_tail
        );
        assert!(
            !failed.out_dir.join("worker").exists(),
            "no bundle from a failed run"
        );

        self.proxy.double.end_outage();
        let retried = self.run_ok().await;
        assert!(!retried.out_dir.join(MODEL_FAILURE_FILE).exists());
        assert_eq!(self.bundle_paths(&retried), paths);
        assert_eq!(self.proxy.double.failures_answered(), answered);
        answered
    }
}

/// Worker B's scenario for `work_item`: one tool call (`write`, the CLI's way of creating
/// `src/greet.sh`), then a closing text, after the model answers `failures` first.
pub fn one_edit_after_outage(work_item: &str, write: ToolCall, failures: Vec<u16>) -> Script {
    Script {
        scenarios: vec![Scenario {
            marker: format!("worker-b for {work_item}"),
            failures,
            steps: vec![
                Step::ToolCalls { calls: vec![write] },
                Step::Text {
                    text: "Implemented REQ-GREET-00001 in src/greet.sh.".into(),
                },
            ],
        }],
    }
}
