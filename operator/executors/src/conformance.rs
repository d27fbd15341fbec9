//! Local `jobsite-sandbox/v1` conformance (contract §2.14, report §2.15).
//!
//! [`run_conformance`] runs the checks of the contract that apply to a local
//! profile as real probes through the executor: shell scripts run inside the
//! sandbox against fixtures the suite plants on the host (a peer workspace,
//! the canonical repository, private integration state, sentinel
//! credentials, a loopback listener), plus host-side observation (`/proc`,
//! the scratch and output roots, the listener). Contract IDs are kept where
//! the local probe tests the same property; local-only checks use
//! `SB-LOCAL-*`. Checks that cannot apply to a local executor (per-path role
//! policy and PatchBundle validation, owned by the control plane; L7
//! allowlisted egress and the credential broker, which the local profile does
//! not provide) are not listed: their capabilities are reported unsupported
//! instead. No check is ever skipped.
//!
//! A report passes when it has checks, every check passed, and every
//! capability the profile requires is supported. The `local` profile (no
//! egress at all) requires `filesystem-isolation`, `git-isolation`,
//! `network-policy`, `lifecycle-cleanup`, `resource-limits` and
//! `audit-chain`; any other
//! profile requires all seven. This profile-scoped requirement is a local
//! reading of §2.2 (which disables autonomy for any unsupported capability):
//! the local profile refuses every run that would need the broker (egress)
//! unless the executor holds the proxy's session secret
//! ([`crate::BubblewrapConfig::egress`]). Such runs are tested by
//! `tests/egress.rs` against a real broker, not by these probes: the suite
//! is meant for an executor without egress (SB-NET-010 expects a refusal or
//! no network, and the audit check expects the network event to be a denial).

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::ErrorKind,
    net::TcpListener,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use protobot_jobsite::{
    executor::{
        Executor, ExecutorError, Limits, RunAudit, RunOutput, RunSpec, SandboxRole, Termination,
    },
    sandbox_audit::{self, SandboxAuditEvent, verify_audit_chain},
};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::{
    BROKER_TOKEN_SENTINEL, CONTRACT_VERSION,
    bubblewrap::{BubblewrapConfig, BubblewrapExecutor, LOCAL_PROFILE},
    procfs, rundir, tools,
};

/// The closed capability set of jobsite-sandbox/v1 (§2.2).
pub const ALL_CAPABILITIES: [&str; 7] = [
    "filesystem-isolation",
    "git-isolation",
    "network-policy",
    "credential-broker",
    "lifecycle-cleanup",
    "resource-limits",
    "audit-chain",
];

/// Capabilities the `local` profile requires (not `credential-broker`: the
/// probes do not drive the broker through the executor).
pub const LOCAL_REQUIRED_CAPABILITIES: [&str; 6] = [
    "filesystem-isolation",
    "git-isolation",
    "network-policy",
    "lifecycle-cleanup",
    "resource-limits",
    "audit-chain",
];

/// The work item every probe runs for (its audit events carry it).
pub const CONFORMANCE_WORK_ITEM: &str = "wi-conformance";
/// The trace every probe runs in (contract §2.14: `trace-jobsite-sandbox-v1`).
pub const CONFORMANCE_TRACE_ID: &str = "trace-jobsite-sandbox-v1";

/// The capabilities `profile` requires to pass.
pub fn required_capabilities(profile: &str) -> Vec<String> {
    let names: &[&str] = if profile == LOCAL_PROFILE {
        &LOCAL_REQUIRED_CAPABILITIES
    } else {
        &ALL_CAPABILITIES
    };
    names.iter().map(|s| (*s).to_owned()).collect()
}

/// Backend identity (`backend` in the report).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendIdentity {
    /// Backend name.
    pub name: String,
    /// Backend version.
    pub version: String,
}

/// One capability, supported or not (§2.2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// One of [`ALL_CAPABILITIES`].
    pub name: String,
    /// Whether the backend enforces it.
    pub supported: bool,
    /// How, or why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Capability {
    /// A supported capability.
    pub fn supported(name: &str, detail: impl Into<String>) -> Self {
        Capability {
            name: name.to_owned(),
            supported: true,
            detail: Some(detail.into()),
        }
    }

    /// An unsupported capability.
    pub fn unsupported(name: &str, detail: impl Into<String>) -> Self {
        Capability {
            name: name.to_owned(),
            supported: false,
            detail: Some(detail.into()),
        }
    }
}

/// One check result (§2.15 `checks[]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConformanceCheck {
    /// Contract ID (`SB-…`) or local ID (`SB-LOCAL-…`).
    pub id: String,
    /// What it checks.
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// Always false: checks are never skipped (kept for the report shape).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// What the probe observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The limits the suite configures by default (§2.8 JSON names; durations in
/// integer nanoseconds). `file_size_bytes` and `open_files` are the local
/// profile's limits in place of `writable_bytes` / `writable_files`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceLimitsReport {
    /// Wall clock, ns.
    pub wall_clock: u64,
    /// CPU time, ns.
    pub cpu: u64,
    /// Address space, bytes.
    pub memory_bytes: u64,
    /// Processes.
    pub process_count: u64,
    /// Largest file, bytes.
    pub file_size_bytes: u64,
    /// Open files.
    pub open_files: u64,
}

impl From<&Limits> for ResourceLimitsReport {
    fn from(l: &Limits) -> Self {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        ResourceLimitsReport {
            wall_clock: ns(l.wall_clock),
            cpu: ns(l.cpu),
            memory_bytes: l.memory_bytes,
            process_count: l.processes,
            file_size_bytes: l.file_size_bytes,
            open_files: l.open_files,
        }
    }
}

/// The contract's `ConformanceReport` (§2.15) plus the profile, its
/// capabilities and the capabilities it requires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConformanceReport {
    /// `jobsite-sandbox/v1`.
    pub contract_version: String,
    /// The profile the report is for (`local`).
    pub profile: String,
    /// Backend identity.
    pub backend: BackendIdentity,
    /// Projection policy version: 0, executors enforce no projection policy
    /// (the control plane builds projections and validates patches).
    pub policy_version: u32,
    /// Projection policy digest: empty for the same reason.
    pub policy_digest: String,
    /// Digests of approved network clients: none locally (no egress).
    pub executable_digests: BTreeMap<String, String>,
    /// The suite's default limits.
    pub resource_limits: ResourceLimitsReport,
    /// Every capability of the closed set, supported or not.
    pub capabilities: Vec<Capability>,
    /// The capabilities this profile needs supported.
    pub required_capabilities: Vec<String>,
    /// Check results.
    pub checks: Vec<ConformanceCheck>,
    /// Whether the report passes.
    pub passed: bool,
    /// Whether the Job Site may run autonomous work on this profile.
    pub autonomous_execution: bool,
    /// Why autonomy is disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_closed_reason: Option<String>,
    /// Last audit event digest: none, the local profile has no audit chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_head: Option<String>,
}

impl ConformanceReport {
    /// Whether the report passes: stated passed, at least one check, every
    /// check passed and none skipped, every required capability supported.
    pub fn passed(&self) -> bool {
        self.passed
            && self.autonomous_execution
            && !self.checks.is_empty()
            && self.checks.iter().all(|c| c.passed && !c.skipped)
            && self.missing_capabilities().is_empty()
    }

    /// The failed checks.
    pub fn failed_checks(&self) -> Vec<&ConformanceCheck> {
        self.checks
            .iter()
            .filter(|c| !c.passed || c.skipped)
            .collect()
    }

    /// Required capabilities that are missing or unsupported.
    pub fn missing_capabilities(&self) -> Vec<String> {
        self.required_capabilities
            .iter()
            .filter(|r| {
                !self
                    .capabilities
                    .iter()
                    .any(|c| &c.name == *r && c.supported)
            })
            .cloned()
            .collect()
    }

    /// Why the report does not pass (`None` when it passes).
    pub fn failure_reason(&self) -> Option<String> {
        if self.passed() {
            return None;
        }
        let missing = self.missing_capabilities();
        let failed: Vec<&str> = self.failed_checks().iter().map(|c| c.id.as_str()).collect();
        Some(if !missing.is_empty() {
            format!(
                "required capabilities unsupported: {}; autonomous execution disabled",
                missing.join(", ")
            )
        } else if !failed.is_empty() {
            format!(
                "conformance checks failed: {}; autonomous execution disabled",
                failed.join(", ")
            )
        } else {
            "the report has no passing checks; autonomous execution disabled".to_owned()
        })
    }
}

/// What the conformance suite needs from a backend beyond [`Executor`].
pub trait SandboxBackend: Executor {
    /// Backend name and version.
    fn identity(&self) -> BackendIdentity;
    /// Every capability of [`ALL_CAPABILITIES`], supported or not.
    fn capabilities(&self) -> Vec<Capability>;
    /// Where ephemeral run directories live (observed by the cleanup checks).
    fn scratch_root(&self) -> &Path;
    /// The egress proxy URL a probe run with egress is given, when the backend
    /// has the credential broker (`credential-broker` supported): the NET and
    /// CRED checks then run through it (SB-NET-001..010, SB-CRED-001..007)
    /// instead of the no-egress checks. `None` (the default): no broker.
    fn broker_probe_proxy(&self) -> Option<String> {
        None
    }
    /// What the backend sees, from where the suite runs, of a probe run started with
    /// `PROTOBOT_PROBE_MARKER=marker` (SB-LIFE-001: its processes before a cancel, none after).
    /// The default reads this host's `/proc`: the sandbox's processes are this host's.
    fn probe_processes(
        &self,
        marker: &str,
    ) -> impl std::future::Future<Output = ProbeProcesses> + Send {
        let count = procfs::pids_with_env(PROBE_MARKER_ENV, marker).len();
        async move { ProbeProcesses::Counted(count) }
    }
}

/// The environment variable that marks a probe run's processes (SB-LIFE-001).
pub const PROBE_MARKER_ENV: &str = "PROTOBOT_PROBE_MARKER";

/// A probe run's processes as a backend can see them (SB-LIFE-001).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeProcesses {
    /// Processes of this host carrying the probe's marker (bubblewrap; a simulated node).
    Counted(usize),
    /// The sandbox holding the run, whose processes live in a PID namespace or kernel the
    /// suite cannot see (a pod on a real node, measured from the conformance Job's pod):
    /// whether it is still there. Its end ends every process in it (the kubelet kills the
    /// pod's sandbox before the pod object goes).
    Sandbox {
        /// The sandbox exists.
        alive: bool,
    },
}

impl ProbeProcesses {
    /// The run's process tree is up: the four processes of the probe, or its sandbox.
    fn started(self) -> bool {
        match self {
            ProbeProcesses::Counted(n) => n >= 4,
            ProbeProcesses::Sandbox { alive } => alive,
        }
    }

    /// Nothing of the run is left.
    fn gone(self) -> bool {
        match self {
            ProbeProcesses::Counted(n) => n == 0,
            ProbeProcesses::Sandbox { alive } => !alive,
        }
    }
}

/// Refuses `report` for `profile` unless it is for that profile and passes.
pub fn ensure_conformant(report: &ConformanceReport, profile: &str) -> Result<(), ExecutorError> {
    if report.profile != profile {
        return Err(ExecutorError::ProfileNotConformant {
            profile: profile.to_owned(),
            reason: format!("the conformance report is for profile {:?}", report.profile),
        });
    }
    if report.contract_version != CONTRACT_VERSION {
        return Err(ExecutorError::ProfileNotConformant {
            profile: profile.to_owned(),
            reason: format!(
                "the report is for contract {:?}, not {CONTRACT_VERSION}",
                report.contract_version
            ),
        });
    }
    match report.failure_reason() {
        None => Ok(()),
        Some(reason) => Err(ExecutorError::ProfileNotConformant {
            profile: profile.to_owned(),
            reason,
        }),
    }
}

/// An executor that only exists with a passing conformance report for its
/// profile; it never falls back to a weaker one.
#[derive(Clone, Debug)]
pub struct ConformantExecutor<E> {
    inner: E,
    report: ConformanceReport,
}

impl<E: Executor> ConformantExecutor<E> {
    /// Wraps `inner` if `report` is for its profile and passes; otherwise
    /// [`ExecutorError::ProfileNotConformant`].
    pub fn new(inner: E, report: ConformanceReport) -> Result<Self, ExecutorError> {
        ensure_conformant(&report, inner.profile())?;
        Ok(ConformantExecutor { inner, report })
    }

    /// The report the executor was admitted with.
    pub fn report(&self) -> &ConformanceReport {
        &self.report
    }

    /// The wrapped executor.
    pub fn inner(&self) -> &E {
        &self.inner
    }
}

impl<E: SandboxBackend> ConformantExecutor<E> {
    /// Runs the conformance suite on `inner` for its own profile and wraps it
    /// if the report passes.
    pub async fn verify(inner: E) -> Result<Self, ExecutorError> {
        let report = run_conformance(&inner, inner.profile()).await;
        Self::new(inner, report)
    }
}

impl<E: Executor> Executor for ConformantExecutor<E> {
    fn profile(&self) -> &str {
        self.inner.profile()
    }

    fn admit(&self) -> Result<(), ExecutorError> {
        ensure_conformant(&self.report, self.inner.profile())?;
        self.inner.admit()
    }

    async fn run(
        &self,
        spec: RunSpec,
        cancel: watch::Receiver<bool>,
    ) -> Result<RunOutput, ExecutorError> {
        ensure_conformant(&self.report, self.inner.profile())?;
        self.inner.run(spec, cancel).await
    }
}

/// The limits probes run with unless a check sets its own.
fn probe_limits() -> Limits {
    Limits {
        wall_clock: Duration::from_secs(30),
        cpu: Duration::from_secs(30),
        memory_bytes: 1 << 30,
        processes: 64,
        file_size_bytes: 64 << 20,
        open_files: 256,
    }
}

/// Host-side fixtures the probes look for from inside.
struct Fixture {
    _dir: tempfile::TempDir,
    /// The projection given as `RunSpec::workspace` (the export directory).
    workspace: PathBuf,
    /// A projection with a remote, which must be refused.
    with_remote: PathBuf,
    /// A projection with alternates, which must be refused.
    with_alternates: PathBuf,
    /// The canonical repository.
    canonical: PathBuf,
    /// A peer Worker's directory.
    peer: PathBuf,
    /// Private integration state.
    integration: PathBuf,
    /// A fake peer run directory inside the scratch root.
    peer_scratch: PathBuf,
    /// Problems while building the fixture (reported in the affected checks).
    problems: Vec<String>,
}

/// A repository of the fixture with one commit on `main` holding `file`, built with libgit2:
/// the Job that measures a profile runs in the operator's image, which has no `git` program.
fn init_repo(dir: &Path, file: &str, body: &str) -> Result<git2::Repository, String> {
    let path = dir.join(file);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(|e| format!("create {}: {e}", parent.display()))?;
    }
    fs::write(&path, body).map_err(|e| format!("write {file}: {e}"))?;
    let failed = |what: &str, e: git2::Error| format!("{what} in {}: {e}", dir.display());
    let repo =
        git2::Repository::init_opts(dir, git2::RepositoryInitOptions::new().initial_head("main"))
            .map_err(|e| failed("git init", e))?;
    let tree = {
        let mut index = repo.index().map_err(|e| failed("git index", e))?;
        index
            .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
            .map_err(|e| failed("git add", e))?;
        index.write().map_err(|e| failed("git add", e))?;
        index
            .write_tree()
            .map_err(|e| failed("git write-tree", e))?
    };
    {
        let tree = repo.find_tree(tree).map_err(|e| failed("git commit", e))?;
        let who = git2::Signature::now("ProtoBot Fixture", "protobot-fixture@invalid")
            .map_err(|e| failed("git commit", e))?;
        repo.commit(Some("HEAD"), &who, &who, "synthetic root", &tree, &[])
            .map_err(|e| failed("git commit", e))?;
    }
    Ok(repo)
}

impl Fixture {
    fn create(scratch_root: &Path) -> Result<Fixture, String> {
        let dir = tempfile::Builder::new()
            .prefix("protobot-conformance-")
            .tempdir()
            .map_err(|e| format!("create the fixture directory: {e}"))?;
        let base = dir.path().to_path_buf();
        let nonce = tools::nonce();
        let mut problems = Vec::new();
        let workspace = base.join("export-worker-a");
        let with_remote = base.join("export-with-remote");
        let with_alternates = base.join("export-with-alternates");
        let canonical = base.join("canonical");
        let peer = base.join("peer-worker-b");
        let integration = base.join("integration");
        let peer_scratch = scratch_root.join(format!("run-peer-{nonce}"));
        let mut remote_repo = None;
        for (dir, file, body) in [
            (&workspace, "src/app_test.txt", "test: app returns 42\n"),
            (&with_remote, "src/app_test.txt", "x\n"),
            (&with_alternates, "src/app_test.txt", "x\n"),
            (&canonical, "src/app.txt", "implementation: 42\n"),
        ] {
            match init_repo(dir, file, body) {
                Ok(repo) if dir == &with_remote => remote_repo = Some(repo),
                Ok(_) => {}
                Err(e) => {
                    problems.push(e);
                    let _ = fs::create_dir_all(dir);
                }
            }
        }
        if let Some(repo) = remote_repo
            && let Err(e) = repo.remote("origin", &canonical.to_string_lossy())
        {
            problems.push(format!("git remote add origin: {e}"));
        }
        let alternates = with_alternates.join(".git/objects/info");
        let _ = fs::create_dir_all(&alternates);
        if let Err(e) = fs::write(
            alternates.join("alternates"),
            format!("{}/.git/objects\n", canonical.display()),
        ) {
            problems.push(format!("write alternates: {e}"));
        }
        let secret = format!("token={BROKER_TOKEN_SENTINEL}\n");
        for (dir, file) in [
            (&peer, "peer-secret.txt"),
            (&integration, "integration-state.txt"),
            (&canonical, ".git-credentials"),
            (&peer_scratch.join("workspace"), "secret.txt"),
        ] {
            if let Err(e) =
                fs::create_dir_all(dir).and_then(|()| fs::write(dir.join(file), &secret))
            {
                problems.push(format!("plant {}: {e}", dir.join(file).display()));
            }
        }
        Ok(Fixture {
            _dir: dir,
            workspace,
            with_remote,
            with_alternates,
            canonical,
            peer,
            integration,
            peer_scratch,
            problems,
        })
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = rundir::remove_tree(&self.peer_scratch);
    }
}

/// What a probe returned: the run and the files of its `/out`.
struct Outcome {
    output: RunOutput,
    files: BTreeMap<String, Vec<u8>>,
}

impl Outcome {
    fn text(&self, name: &str) -> Option<String> {
        self.files
            .get(name)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    fn describe(&self) -> String {
        format!(
            "termination {:?}, elapsed {:?}, stderr {:?}",
            self.output.termination,
            self.output.elapsed,
            self.output
                .stderr_tail
                .chars()
                .take(300)
                .collect::<String>()
        )
    }
}

fn read_files(root: &Path, dir: &Path, files: &mut BTreeMap<String, Vec<u8>>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            read_files(root, &p, files);
        } else if let Ok(body) = fs::read(&p) {
            let rel = p
                .strip_prefix(root)
                .unwrap_or(&p)
                .to_string_lossy()
                .into_owned();
            files.insert(rel, body);
        }
    }
}

/// Runs probes and remembers their run ids for the cleanup check.
struct Prober<'a, E> {
    executor: &'a E,
    fixture: &'a Fixture,
    run_ids: Vec<String>,
}

impl<E: SandboxBackend> Prober<'_, E> {
    fn spec(&mut self, id: &str, script: &str, limits: Limits) -> RunSpec {
        let run_id = format!("conformance-{id}-{}", tools::nonce());
        self.run_ids.push(run_id.clone());
        RunSpec {
            run_id,
            role: SandboxRole::WorkerA,
            workspace: self.fixture.workspace.clone(),
            task: serde_json::json!({ "probe": id, "contract": CONTRACT_VERSION }),
            command: vec!["/bin/sh".into(), "-c".into(), script.into()],
            image: None,
            env: BTreeMap::from([("PROTOBOT_PROBE".to_owned(), id.to_owned())]),
            limits,
            egress_proxy: None,
            audit: RunAudit {
                work_item: CONFORMANCE_WORK_ITEM.to_owned(),
                cycle: 1,
                trace_id: CONFORMANCE_TRACE_ID.to_owned(),
            },
            attribution: Default::default(),
        }
    }

    async fn run_spec(
        &self,
        spec: RunSpec,
        cancel: watch::Receiver<bool>,
    ) -> Result<Outcome, String> {
        let output = self
            .executor
            .run(spec, cancel)
            .await
            .map_err(|e| format!("executor error: {e}"))?;
        let mut files = BTreeMap::new();
        read_files(&output.out_dir, &output.out_dir, &mut files);
        let _ = rundir::remove_tree(&output.out_dir);
        Ok(Outcome { output, files })
    }

    async fn run(&mut self, id: &str, script: &str, limits: Limits) -> Result<Outcome, String> {
        let spec = self.spec(id, script, limits);
        let (_tx, rx) = watch::channel(false);
        self.run_spec(spec, rx).await
    }
}

type CheckResult = (bool, String);

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.to_string_lossy().replace('\'', r"'\''"))
}

/// Script: every path must be absent and unwritable; prints offenders to /out/result.
fn invisible_script(paths: &[&Path]) -> String {
    let list: Vec<String> = paths.iter().map(|p| shell_quote(p)).collect();
    format!(
        r#"r=""
for p in {}; do
  if [ -e "$p" ]; then r="$r visible:$p"; fi
  if (echo x > "$p/protobot-probe") 2>/dev/null; then r="$r writable:$p"; fi
done
printf '%s' "$r" > /out/result"#,
        list.join(" ")
    )
}

async fn invisible_check<E: SandboxBackend>(
    p: &mut Prober<'_, E>,
    id: &str,
    paths: &[&Path],
) -> CheckResult {
    let script = invisible_script(paths);
    match p.run(id, &script, probe_limits()).await {
        Err(e) => (false, e),
        Ok(o) => {
            let result = o.text("result");
            let planted: Vec<String> = paths
                .iter()
                .filter(|d| d.join("protobot-probe").exists())
                .map(|d| d.display().to_string())
                .collect();
            let ok = o.output.termination == Termination::Exited { code: 0 }
                && result.as_deref() == Some("")
                && planted.is_empty();
            (
                ok,
                format!(
                    "offenders inside: {result:?}; host paths written: {planted:?}; {}",
                    o.describe()
                ),
            )
        }
    }
}

/// Runs the local conformance suite through `executor` and reports for `profile`.
pub async fn run_conformance<E: SandboxBackend>(executor: &E, profile: &str) -> ConformanceReport {
    let capabilities = executor.capabilities();
    let required = required_capabilities(profile);
    let mut report = ConformanceReport {
        contract_version: CONTRACT_VERSION.to_owned(),
        profile: profile.to_owned(),
        backend: executor.identity(),
        policy_version: 0,
        policy_digest: String::new(),
        executable_digests: BTreeMap::new(),
        resource_limits: ResourceLimitsReport::from(&probe_limits()),
        capabilities,
        required_capabilities: required,
        checks: Vec::new(),
        passed: false,
        autonomous_execution: false,
        fail_closed_reason: None,
        audit_head: None,
    };
    let missing = report.missing_capabilities();
    if !missing.is_empty() {
        let reason = format!("required capabilities unsupported: {}", missing.join(", "));
        report.checks.push(ConformanceCheck {
            id: "SB-FC-001".into(),
            name: "missing capability fails closed".into(),
            passed: true,
            skipped: false,
            detail: Some(reason.clone()),
        });
        report.fail_closed_reason = Some(format!("{reason}; autonomous execution disabled"));
        return report;
    }
    let fixture = match Fixture::create(executor.scratch_root()) {
        Ok(f) => f,
        Err(e) => {
            report.checks.push(ConformanceCheck {
                id: "SB-FC-001".into(),
                name: "conformance fixture could not be built: fails closed".into(),
                passed: false,
                skipped: false,
                detail: Some(e.clone()),
            });
            report.fail_closed_reason = Some(format!("{e}; autonomous execution disabled"));
            return report;
        }
    };
    let mut p = Prober {
        executor,
        fixture: &fixture,
        run_ids: Vec::new(),
    };
    let mut checks = Vec::new();
    let mut last = Instant::now();
    let mut push = |id: &str, name: &str, (passed, detail): CheckResult| {
        let took = last.elapsed();
        last = Instant::now();
        checks.push(ConformanceCheck {
            id: id.into(),
            name: name.into(),
            passed,
            skipped: false,
            detail: Some(format!("{detail} (probe took {} ms)", took.as_millis())),
        });
    };
    if !fixture.problems.is_empty() {
        tracing::warn!(problems = ?fixture.problems, "conformance fixture built with problems");
    }

    push(
        "SB-FS-001",
        "the role writes its /workspace",
        fs_001(&mut p).await,
    );
    push(
        "SB-LOCAL-001",
        "/out is collected into a control-plane-owned directory",
        local_001(&mut p).await,
    );
    push(
        "SB-FS-005",
        "host paths are read-only or absent; /tmp is private",
        fs_005(&mut p).await,
    );
    let (peer, peer_scratch) = (fixture.peer.clone(), fixture.peer_scratch.clone());
    let scratch = executor.scratch_root().to_path_buf();
    push(
        "SB-FS-006",
        "peer Worker directories are invisible",
        invisible_check(
            &mut p,
            "SB-FS-006",
            &[&peer, &peer_scratch.join("workspace"), &scratch],
        )
        .await,
    );
    push(
        "SB-FS-007",
        "canonical repository and export directory are invisible",
        invisible_check(
            &mut p,
            "SB-FS-007",
            &[&fixture.canonical, &fixture.workspace],
        )
        .await,
    );
    push(
        "SB-FS-008",
        "private Integration state is invisible",
        invisible_check(&mut p, "SB-FS-008", &[&fixture.integration]).await,
    );
    push(
        "SB-FS-009",
        "/task/task.json is readable and read-only",
        fs_009(&mut p).await,
    );
    push(
        "SB-GIT-003",
        "no remotes (and a workspace with a remote is refused)",
        git_003(&mut p).await,
    );
    push(
        "SB-GIT-004",
        "no alternates (and a workspace with alternates is refused)",
        git_004(&mut p).await,
    );
    push(
        "SB-GIT-005",
        "no reflogs in the workspace copy",
        git_005(&mut p).await,
    );
    push(
        "SB-GIT-006",
        "cannot fetch, clone, push or ls-remote the canonical repository",
        git_006(&mut p).await,
    );
    if let Some(proxy_url) = executor.broker_probe_proxy() {
        for (id, name, result) in broker_checks(&mut p, &proxy_url).await {
            push(id, name, result);
        }
    } else {
        push(
            "SB-NET-003",
            "unapproved destinations are unreachable",
            net_003(&mut p).await,
        );
        push(
            "SB-NET-004",
            "host loopback listener unreachable by direct IP",
            net_004(&mut p).await,
        );
        push("SB-NET-005", "no DNS resolution", net_005(&mut p).await);
        push(
            "SB-NET-007",
            "no route out of the sandbox (only lo)",
            net_007(&mut p).await,
        );
        push(
            "SB-NET-010",
            "default deny: a run asking for proxied egress gets none",
            net_010(&mut p).await,
        );
        push(
            "SB-CRED-001",
            "environment holds no credential, only allowlisted names",
            cred_001(&mut p).await,
        );
        push(
            "SB-CRED-002",
            "sentinel credential files on the host are not readable",
            cred_002(&mut p).await,
        );
        push(
            "SB-CRED-003",
            "a sentinel in arguments or environment is refused before execution",
            cred_003(&mut p).await,
        );
    }
    push(
        "SB-LIFE-001",
        "cancel kills the whole process tree",
        life_001(&mut p).await,
    );
    push(
        "SB-LIFE-004",
        "the next sandbox cannot recover prior state",
        life_004(&mut p).await,
    );
    push(
        "SB-LIM-001",
        "wall-clock limit ends the run and its processes",
        lim_001(&mut p).await,
    );
    push(
        "SB-LIM-002",
        "CPU-time limit ends the run",
        lim_002(&mut p).await,
    );
    push(
        "SB-LIM-003",
        "memory (address-space) limit denies oversize allocations",
        lim_003(&mut p).await,
    );
    push(
        "SB-LIM-004",
        "process-count limit contains a fork loop",
        lim_004(&mut p).await,
    );
    push(
        "SB-LIM-005",
        "file-size limit stops oversize writes",
        lim_005(&mut p).await,
    );
    push(
        "SB-LOCAL-002",
        "open-files limit denies extra descriptors",
        local_002(&mut p).await,
    );
    let audited = audited_session(&mut p).await;
    push(
        "SB-AUD-001",
        "a session leaves audit events",
        aud_001(&audited),
    );
    push(
        "SB-AUD-002",
        "the events form a valid hash chain",
        aud_002(&audited),
    );
    push(
        "SB-AUD-003",
        "a forged decision is detected",
        aud_003(&audited),
    );
    push(
        "SB-AUD-004",
        "every event is tied to the work item and trace of the run",
        aud_004(&audited),
    );
    push(
        "SB-AUD-005",
        "every event carries the backend identity and policy digest",
        aud_005(&audited, &report.backend),
    );
    let audit_head = audited
        .as_ref()
        .ok()
        .and_then(|events| events.last())
        .map(|e| e.event_digest.clone());
    push(
        "SB-FC-001",
        "a failing or foreign report is refused (no fallback)",
        fc_001(&report),
    );
    push(
        "SB-FC-002",
        "bubblewrap missing: runs refuse with an install hint",
        fc_002(&mut p).await,
    );
    push(
        "SB-FC-003",
        "enforcement continues after a denial",
        fc_003(&mut p).await,
    );
    // Last: every probe above must have left no ephemeral directory.
    push(
        "SB-LIFE-003",
        "ephemeral workspaces are removed after every run",
        life_003(&p),
    );

    report.checks = checks;
    report.audit_head = audit_head;
    report.passed = report.checks.iter().all(|c| c.passed);
    report.autonomous_execution = report.passed;
    report.fail_closed_reason = report.failure_reason();
    if report.fail_closed_reason.is_some() {
        report.passed = false;
        report.autonomous_execution = false;
    }
    report
}

async fn fs_001<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let script = "echo ok > /workspace/probe-write && cat /workspace/probe-write > /out/fs001";
    match p.run("SB-FS-001", script, probe_limits()).await {
        Err(e) => (false, e),
        Ok(o) => {
            let source_untouched = !p.fixture.workspace.join("probe-write").exists();
            let ok = o.text("fs001").as_deref() == Some("ok\n") && source_untouched;
            (
                ok,
                format!(
                    "read back {:?}; export directory untouched: {source_untouched}; {}",
                    o.text("fs001"),
                    o.describe()
                ),
            )
        }
    }
}

async fn local_001<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let spec = p.spec(
        "SB-LOCAL-001",
        "mkdir -p /out/sub && printf payload > /out/sub/file",
        probe_limits(),
    );
    let (_tx, rx) = watch::channel(false);
    match p.executor.run(spec, rx).await {
        Err(e) => (false, format!("executor error: {e}")),
        Ok(out) => {
            let body = fs::read_to_string(out.out_dir.join("sub/file")).ok();
            let outside = !out.out_dir.starts_with(p.executor.scratch_root());
            let _ = rundir::remove_tree(&out.out_dir);
            let ok = body.as_deref() == Some("payload") && outside;
            (
                ok,
                format!(
                    "collected {body:?} at {} (outside scratch root: {outside})",
                    out.out_dir.display()
                ),
            )
        }
    }
}

async fn fs_005<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let marker = format!("protobot-probe-{}", tools::nonce());
    let script = format!(
        r#"r=""
for p in /etc/passwd /etc/protobot-probe /usr/protobot-probe /usr/bin/protobot-probe /protobot-probe /root/protobot-probe /var/tmp/protobot-probe /home/protobot-probe /task/protobot-probe /proc/protobot-probe /dev/protobot-probe /sys/protobot-probe; do
  if (echo x > "$p") 2>/dev/null; then r="$r writable:$p"; fi
done
for p in /root /home /var /opt /srv /mnt /media /boot /etc/shadow /etc/ssh /etc/sudoers; do
  if [ -e "$p" ]; then r="$r visible:$p"; fi
done
echo tmp > /tmp/{marker} || r="$r tmp-not-writable"
printf '%s' "$r" > /out/result"#
    );
    match p.run("SB-FS-005", &script, probe_limits()).await {
        Err(e) => (false, e),
        Ok(o) => {
            let host_marker = Path::new("/tmp").join(&marker);
            let leaked = host_marker.exists();
            let _ = fs::remove_file(&host_marker);
            let result = o.text("result");
            let ok = o.output.termination == (Termination::Exited { code: 0 })
                && result.as_deref() == Some("")
                && !leaked;
            (
                ok,
                format!(
                    "offenders inside: {result:?}; /tmp write reached the host: {leaked}; {}",
                    o.describe()
                ),
            )
        }
    }
}

async fn fs_009<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let script = r#"cat /task/task.json > /out/task.json
r=""
(echo x > /task/task.json) 2>/dev/null && r="$r task.json-writable"
(echo x > /task/new) 2>/dev/null && r="$r task-dir-writable"
printf '%s' "$r" > /out/result"#;
    match p.run("SB-FS-009", script, probe_limits()).await {
        Err(e) => (false, e),
        Ok(o) => {
            let task: Option<serde_json::Value> = o
                .files
                .get("task.json")
                .and_then(|b| serde_json::from_slice(b).ok());
            let read_ok = task
                .as_ref()
                .and_then(|t| t.get("probe"))
                .and_then(|v| v.as_str())
                == Some("SB-FS-009");
            let result = o.text("result");
            (
                read_ok && result.as_deref() == Some(""),
                format!(
                    "task read: {read_ok}; offenders: {result:?}; {}",
                    o.describe()
                ),
            )
        }
    }
}

async fn refused_workspace<E: SandboxBackend>(
    p: &mut Prober<'_, E>,
    id: &str,
    workspace: &Path,
    what: &str,
) -> (bool, String) {
    let mut spec = p.spec(id, "echo ran > /out/ran", probe_limits());
    spec.workspace = workspace.to_path_buf();
    let (_tx, rx) = watch::channel(false);
    match p.executor.run(spec, rx).await {
        Err(ExecutorError::Start { reason, .. }) if reason.contains(what) => {
            (true, format!("refused: {reason}"))
        }
        Err(e) => (false, format!("unexpected error: {e}")),
        Ok(o) => {
            let _ = rundir::remove_tree(&o.out_dir);
            (
                false,
                format!("a workspace with {what} was run ({:?})", o.termination),
            )
        }
    }
}

async fn git_003<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let script = "git remote > /out/remotes; echo $? > /out/rc";
    let inside = match p.run("SB-GIT-003", script, probe_limits()).await {
        Err(e) => (false, e),
        Ok(o) => (
            o.text("rc").as_deref() == Some("0\n") && o.text("remotes").as_deref() == Some(""),
            format!(
                "git remote rc {:?}, output {:?}",
                o.text("rc"),
                o.text("remotes")
            ),
        ),
    };
    let with_remote = p.fixture.with_remote.clone();
    let refused = refused_workspace(p, "SB-GIT-003", &with_remote, "remote").await;
    (
        inside.0 && refused.0,
        format!("{}; {}", inside.1, refused.1),
    )
}

async fn git_004<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let script = "if [ -e .git/objects/info/alternates ]; then echo present; fi > /out/alt; git rev-parse HEAD > /out/head";
    let inside = match p.run("SB-GIT-004", script, probe_limits()).await {
        Err(e) => (false, e),
        Ok(o) => (
            o.text("alt").as_deref() == Some("")
                && o.text("head").is_some_and(|h| h.trim().len() == 40),
            format!("alternates {:?}, HEAD {:?}", o.text("alt"), o.text("head")),
        ),
    };
    let with_alt = p.fixture.with_alternates.clone();
    let refused = refused_workspace(p, "SB-GIT-004", &with_alt, "alternates").await;
    (
        inside.0 && refused.0,
        format!("{}; {}", inside.1, refused.1),
    )
}

async fn git_005<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let host_has_logs = p.fixture.workspace.join(".git/logs").exists();
    let script = "for f in .git/logs .git/ORIG_HEAD .git/FETCH_HEAD .git/COMMIT_EDITMSG; do [ -e $f ] && echo $f; done > /out/logs; true";
    match p.run("SB-GIT-005", script, probe_limits()).await {
        Err(e) => (false, e),
        Ok(o) => (
            o.text("logs").as_deref() == Some(""),
            format!(
                "history metadata inside: {:?} (the export had reflogs: {host_has_logs})",
                o.text("logs")
            ),
        ),
    }
}

async fn git_006<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let canon = shell_quote(&p.fixture.canonical);
    let script = format!(
        r#"r=""
git status --porcelain >/dev/null 2>&1 || r="$r git-unusable"
git fetch {canon} 2>/dev/null && r="$r fetch"
git -c protocol.file.allow=always fetch {canon} 2>/dev/null && r="$r fetch-file-allowed"
git ls-remote {canon} >/dev/null 2>&1 && r="$r ls-remote"
git clone -q {canon} /tmp/clone 2>/dev/null && r="$r clone"
git push {canon} HEAD:refs/heads/protobot-probe 2>/dev/null && r="$r push"
git --git-dir={canon}/.git cat-file -t HEAD >/dev/null 2>&1 && r="$r git-dir"
printf '%s' "$r" > /out/result"#
    );
    match p.run("SB-GIT-006", &script, probe_limits()).await {
        Err(e) => (false, e),
        Ok(o) => {
            let pushed = p
                .fixture
                .canonical
                .join(".git/refs/heads/protobot-probe")
                .exists();
            let result = o.text("result");
            (
                result.as_deref() == Some("") && !pushed,
                format!("succeeded inside: {result:?}; pushed ref on host: {pushed}"),
            )
        }
    }
}

async fn net_003<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let script = r#"r=""
for d in 192.0.2.1/443 198.51.100.7/80 1.1.1.1/53 10.0.0.1/8443; do
  timeout 5 bash -c "exec 3<>/dev/tcp/$d" 2>/dev/null && r="$r connected:$d"
done
bash -c 'exit 0' || r="$r no-bash"
printf '%s' "$r" > /out/result"#;
    match p.run("SB-NET-003", script, probe_limits()).await {
        Err(e) => (false, e),
        Ok(o) => {
            let result = o.text("result");
            (
                result.as_deref() == Some(""),
                format!("reachable: {result:?}; {}", o.describe()),
            )
        }
    }
}

/// Listeners on the host's loopback (IPv4 and, when available, IPv6).
fn loopback_listeners() -> Result<Vec<TcpListener>, String> {
    let v4 = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| format!("bind a host loopback listener: {e}"))?;
    let mut all = vec![v4];
    if let Ok(v6) = TcpListener::bind("[::1]:0") {
        all.push(v6);
    }
    for l in &all {
        l.set_nonblocking(true)
            .map_err(|e| format!("set the listener non-blocking: {e}"))?;
    }
    Ok(all)
}

fn connect_script(listeners: &[TcpListener]) -> String {
    let mut s = String::from("r=\"\"\n");
    for l in listeners {
        if let Ok(addr) = l.local_addr() {
            let (ip, port) = (addr.ip(), addr.port());
            s.push_str(&format!(
                "timeout 5 bash -c 'exec 3<>/dev/tcp/{ip}/{port}' 2>/dev/null && r=\"$r connected:{ip}:{port}\"\n"
            ));
        }
    }
    s.push_str("bash -c 'exit 0' || r=\"$r no-bash\"\nprintf '%s' \"$r\" > /out/result");
    s
}

fn accepted_any(listeners: &[TcpListener]) -> bool {
    listeners
        .iter()
        .any(|l| !matches!(l.accept(), Err(e) if e.kind() == ErrorKind::WouldBlock))
}

async fn net_004<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let listeners = match loopback_listeners() {
        Ok(l) => l,
        Err(e) => return (false, e),
    };
    match p
        .run("SB-NET-004", &connect_script(&listeners), probe_limits())
        .await
    {
        Err(e) => (false, e),
        Ok(o) => {
            let result = o.text("result");
            let accepted = accepted_any(&listeners);
            (
                result.as_deref() == Some("") && !accepted,
                format!(
                    "connected inside: {result:?}; host listener accepted a connection: {accepted}"
                ),
            )
        }
    }
}

async fn net_005<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let script = r#"r=""
getent hosts example.com >/dev/null 2>&1 && r="$r resolved:example.com"
getent hosts localhost.localdomain >/dev/null 2>&1 && r="$r resolved:localhost.localdomain"
r="$r$(awk '$1 == "nameserver" && $2 !~ /^(127\.|::1$)/ {printf " resolver:%s", $2}' /etc/resolv.conf 2>/dev/null)"
printf '%s' "$r" > /out/result"#;
    match p.run("SB-NET-005", script, probe_limits()).await {
        Err(e) => (false, e),
        Ok(o) => {
            let result = o.text("result");
            (
                result.as_deref() == Some(""),
                format!("offenders: {result:?}"),
            )
        }
    }
}

async fn net_007<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let script = "tail -n +2 /proc/net/route > /out/routes; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' > /out/ifaces; cat /proc/net/ipv6_route > /out/routes6 2>/dev/null; true";
    match p.run("SB-NET-007", script, probe_limits()).await {
        Err(e) => (false, e),
        Ok(o) => {
            let routes = o.text("routes").unwrap_or_else(|| "<missing>".into());
            let ifaces = o.text("ifaces").unwrap_or_default();
            let routes6 = o.text("routes6").unwrap_or_default();
            let v6_out: Vec<&str> = routes6
                .lines()
                .filter(|l| !l.trim_end().ends_with(" lo"))
                .collect();
            let ok = routes.trim().is_empty() && ifaces.trim() == "lo" && v6_out.is_empty();
            (
                ok,
                format!(
                    "IPv4 routes {routes:?}; interfaces {ifaces:?}; IPv6 routes off lo {v6_out:?}"
                ),
            )
        }
    }
}

async fn net_010<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let listeners = match loopback_listeners() {
        Ok(l) => l,
        Err(e) => return (false, e),
    };
    let mut spec = p.spec("SB-NET-010", &connect_script(&listeners), probe_limits());
    let proxy = listeners
        .first()
        .and_then(|l| l.local_addr().ok())
        .map(|a| format!("http://{a}"));
    spec.egress_proxy = proxy;
    let (_tx, rx) = watch::channel(false);
    match p.run_spec(spec, rx).await {
        Err(e) if e.contains("egress") => (true, format!("refused: {e}")),
        Err(e) => (false, e),
        Ok(o) => {
            let result = o.text("result");
            let accepted = accepted_any(&listeners);
            (
                result.as_deref() == Some("") && !accepted,
                format!(
                    "ran without network; connected inside: {result:?}; proxy/listener reached: {accepted}"
                ),
            )
        }
    }
}

async fn cred_001<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let parent_has = std::env::vars_os().any(|(k, v)| {
        k.to_string_lossy().contains(BROKER_TOKEN_SENTINEL)
            || v.to_string_lossy().contains(BROKER_TOKEN_SENTINEL)
    });
    match p
        .run(
            "SB-CRED-001",
            "cat /proc/$$/environ > /out/environ",
            probe_limits(),
        )
        .await
    {
        Err(e) => (false, e),
        Ok(o) => {
            let raw = o.files.get("environ").cloned().unwrap_or_default();
            let vars: Vec<String> = raw
                .split(|b| *b == 0)
                .filter(|kv| !kv.is_empty())
                .map(|kv| String::from_utf8_lossy(kv).into_owned())
                .collect();
            let names: BTreeSet<String> = vars
                .iter()
                .map(|kv| kv.split('=').next().unwrap_or("").to_owned())
                .collect();
            let allowed: BTreeSet<&str> = [
                "PATH",
                "HOME",
                "PWD",
                "PROTOBOT_WORKSPACE",
                "PROTOBOT_OUT",
                "PROTOBOT_TASK",
                "PROTOBOT_PROBE",
            ]
            .into();
            let extra: Vec<&String> = names
                .iter()
                .filter(|n| !allowed.contains(n.as_str()))
                .collect();
            let leaked = vars.iter().any(|kv| kv.contains(BROKER_TOKEN_SENTINEL));
            let ok =
                !vars.is_empty() && names.contains("PROTOBOT_PROBE") && extra.is_empty() && !leaked;
            (
                ok,
                format!(
                    "sandbox env names {names:?}; not allowlisted {extra:?}; sentinel inside: {leaked}; parent env holds the sentinel: {parent_has}"
                ),
            )
        }
    }
}

async fn cred_002<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    // The sentinel is assembled inside: it must never appear in an argument.
    let control = format!("/tmp/control-{}", tools::nonce());
    let script = format!(
        r#"s="PROTOBOT-SANDBOX-"; s="${{s}}BROKER-TOKEN"
printf '%s' "$s" > {control}
grep -rlsF "$s" /workspace /task /tmp /etc /root /home /var /opt /srv /mnt /run /work /proc/self/environ > /out/hits 2>/dev/null
true"#
    );
    match p.run("SB-CRED-002", &script, probe_limits()).await {
        Err(e) => (false, e),
        Ok(o) => {
            let hits = o.text("hits").unwrap_or_default();
            let hits: Vec<&str> = hits.lines().collect();
            let ok = hits == [control.as_str()];
            (
                ok,
                format!(
                    "files holding the sentinel inside (only the probe's own control file may): {hits:?}"
                ),
            )
        }
    }
}

async fn cred_003<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let arg = p.spec(
        "SB-CRED-003",
        &format!("echo {BROKER_TOKEN_SENTINEL} > /out/x"),
        probe_limits(),
    );
    let mut env = p.spec("SB-CRED-003", "env > /out/x", probe_limits());
    env.env
        .insert("API_TOKEN".into(), BROKER_TOKEN_SENTINEL.into());
    let mut details = Vec::new();
    let mut ok = true;
    for (what, spec) in [("argument", arg), ("environment", env)] {
        let (_tx, rx) = watch::channel(false);
        match p.executor.run(spec, rx).await {
            Err(ExecutorError::Start { reason, .. }) if reason.contains("sandbox.denied") => {
                details.push(format!("{what}: refused"));
            }
            Err(e) => {
                ok = false;
                details.push(format!("{what}: unexpected error {e}"));
            }
            Ok(o) => {
                ok = false;
                let _ = rundir::remove_tree(&o.out_dir);
                details.push(format!("{what}: executed ({:?})", o.termination));
            }
        }
    }
    (ok, details.join("; "))
}

/// One session for the audit checks: a run that reaches its wall-clock limit, so its chain
/// holds open, the network decision, exec, limit and cleanup events.
async fn audited_session<E: SandboxBackend>(
    p: &mut Prober<'_, E>,
) -> Result<Vec<SandboxAuditEvent>, String> {
    let mut limits = probe_limits();
    limits.wall_clock = Duration::from_millis(300);
    let outcome = p.run("SB-AUD", "sleep 30", limits).await?;
    Ok(outcome.output.audit)
}

fn aud_001(audited: &Result<Vec<SandboxAuditEvent>, String>) -> CheckResult {
    match audited {
        Err(e) => (false, e.clone()),
        Ok(events) => {
            let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
            let covered = [
                sandbox_audit::event_type::OPEN,
                sandbox_audit::event_type::NETWORK,
                sandbox_audit::event_type::EXEC,
                sandbox_audit::event_type::LIMIT,
                sandbox_audit::event_type::CLEANUP,
            ]
            .iter()
            .all(|t| types.contains(t));
            let limit_configured = events
                .iter()
                .filter(|e| e.event_type == sandbox_audit::event_type::LIMIT)
                .all(|e| !e.limit_configured.is_empty());
            (
                covered && limit_configured,
                format!(
                    "{} events: {types:?}; limit events carry limit_configured: {limit_configured}",
                    events.len()
                ),
            )
        }
    }
}

fn aud_002(audited: &Result<Vec<SandboxAuditEvent>, String>) -> CheckResult {
    match audited {
        Err(e) => (false, e.clone()),
        Ok(events) if events.is_empty() => (false, "no events to verify".into()),
        Ok(events) => match verify_audit_chain(events) {
            Ok(()) => (true, format!("{} events verify", events.len())),
            Err(e) => (false, e.to_string()),
        },
    }
}

fn aud_003(audited: &Result<Vec<SandboxAuditEvent>, String>) -> CheckResult {
    match audited {
        Err(e) => (false, e.clone()),
        Ok(events) if events.is_empty() => (false, "no events to forge".into()),
        Ok(events) => {
            let mut forged = events.clone();
            forged[0].decision = "forged".into();
            match verify_audit_chain(&forged) {
                Err(e) => (true, format!("forged copy rejected: {e}")),
                Ok(()) => (false, "a forged decision verified".into()),
            }
        }
    }
}

fn aud_004(audited: &Result<Vec<SandboxAuditEvent>, String>) -> CheckResult {
    match audited {
        Err(e) => (false, e.clone()),
        Ok(events) => {
            let tied = !events.is_empty()
                && events.iter().all(|e| {
                    e.work_item == CONFORMANCE_WORK_ITEM
                        && e.trace_id == CONFORMANCE_TRACE_ID
                        && e.contract_version == sandbox_audit::CONTRACT_VERSION
                });
            (
                tied,
                format!(
                    "work item {CONFORMANCE_WORK_ITEM}, trace {CONFORMANCE_TRACE_ID} and contract version on every event: {tied}"
                ),
            )
        }
    }
}

fn aud_005(
    audited: &Result<Vec<SandboxAuditEvent>, String>,
    backend: &BackendIdentity,
) -> CheckResult {
    match audited {
        Err(e) => (false, e.clone()),
        Ok(events) => {
            let identified = !events.is_empty()
                && events.iter().all(|e| {
                    e.backend_name == backend.name
                        && e.backend_version == backend.version
                        && e.policy_digest.starts_with("sha256:")
                });
            // The local profile has no egress, so its only network event is the denial; the
            // contract's accepted-network clause applies to profiles with the broker.
            (
                identified,
                format!(
                    "backend {} {} and a policy digest on every event: {identified}",
                    backend.name, backend.version
                ),
            )
        }
    }
}

async fn life_001<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let marker = tools::nonce();
    let mut spec = p.spec(
        "SB-LIFE-001",
        "sleep 300 & sleep 300 & (sleep 300 &) ; sleep 300",
        probe_limits(),
    );
    spec.limits.wall_clock = Duration::from_secs(120);
    spec.env.insert(PROBE_MARKER_ENV.into(), marker.clone());
    let (tx, rx) = watch::channel(false);
    let run = p.executor.run(spec, rx);
    let executor = p.executor;
    // Polls the backend's view every 10 ms until `want` holds or `limit` passes.
    let observe = |limit: Duration, want: fn(ProbeProcesses) -> bool| {
        let marker = marker.clone();
        async move {
            let start = Instant::now();
            loop {
                let seen = executor.probe_processes(&marker).await;
                if want(seen) || start.elapsed() >= limit {
                    return (want(seen), seen);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let driver = async {
        let (started, seen) = observe(Duration::from_secs(60), ProbeProcesses::started).await;
        let at = Instant::now();
        let _ = tx.send(true);
        (started, seen, at)
    };
    let (result, (started, seen, cancelled_at)) = tokio::join!(run, driver);
    let took = cancelled_at.elapsed();
    let (gone, _) = observe(Duration::from_secs(5), ProbeProcesses::gone).await;
    match result {
        Err(e) => (false, format!("executor error: {e}")),
        Ok(o) => {
            let _ = rundir::remove_tree(&o.out_dir);
            let ok = started
                && o.termination == Termination::Cancelled
                && took < Duration::from_secs(5)
                && gone;
            (
                ok,
                format!(
                    "seen before cancel: {seen:?}; ended {:?} {took:?} after cancel; no survivors: {gone}",
                    o.termination
                ),
            )
        }
    }
}

async fn life_004<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let n = tools::nonce();
    let write = format!(
        "echo prior > /workspace/leftover-{n} && echo prior > /tmp/leftover-{n} && echo prior > /out/leftover-{n}"
    );
    let first = p.run("SB-LIFE-004", &write, probe_limits()).await;
    let read = format!(
        r#"r=""
for f in /workspace/leftover-{n} /tmp/leftover-{n} /out/leftover-{n}; do [ -e "$f" ] && r="$r $f"; done
printf '%s' "$r" > /out/result"#
    );
    let second = p.run("SB-LIFE-004", &read, probe_limits()).await;
    let on_host = p.fixture.workspace.join(format!("leftover-{n}")).exists();
    match (first, second) {
        (Ok(a), Ok(b)) => {
            let wrote = a.output.termination == Termination::Exited { code: 0 };
            let result = b.text("result");
            (
                wrote && result.as_deref() == Some("") && !on_host,
                format!(
                    "first run wrote: {wrote}; seen by the next run: {result:?}; reached the export: {on_host}"
                ),
            )
        }
        (a, b) => (false, format!("runs failed: {:?} / {:?}", a.err(), b.err())),
    }
}

fn life_003<E: SandboxBackend>(p: &Prober<'_, E>) -> CheckResult {
    let prefixes: Vec<String> = p
        .run_ids
        .iter()
        .map(|id| format!("run-{}-", tools::safe_component(id)))
        .collect();
    let left: Vec<String> = fs::read_dir(p.executor.scratch_root())
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| prefixes.iter().any(|pre| name.starts_with(pre.as_str())))
                .collect()
        })
        .unwrap_or_default();
    (
        left.is_empty() && !prefixes.is_empty(),
        format!(
            "{} runs checked (including cancelled and killed ones); left behind: {left:?}",
            prefixes.len()
        ),
    )
}

async fn limited_run<E: SandboxBackend>(
    p: &mut Prober<'_, E>,
    id: &str,
    script: &str,
    limits: Limits,
) -> Result<(Outcome, bool), String> {
    let marker = tools::nonce();
    let mut spec = p.spec(id, script, limits);
    spec.env
        .insert("PROTOBOT_PROBE_MARKER".into(), marker.clone());
    let (_tx, rx) = watch::channel(false);
    let o = p.run_spec(spec, rx).await?;
    let gone = procfs::wait_until(Duration::from_secs(5), || {
        procfs::pids_with_env("PROTOBOT_PROBE_MARKER", &marker).is_empty()
    })
    .await;
    Ok((o, gone))
}

async fn lim_001<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let limits = Limits {
        wall_clock: Duration::from_secs(1),
        ..probe_limits()
    };
    match limited_run(p, "SB-LIM-001", "sleep 60 & sleep 60", limits).await {
        Err(e) => (false, e),
        Ok((o, gone)) => {
            let ok = o.output.termination
                == (Termination::LimitExceeded {
                    limit: "wall-clock".into(),
                })
                && o.output.elapsed < Duration::from_secs(10)
                && gone;
            (
                ok,
                format!(
                    "limit_configured 1s; {}; no survivors: {gone}",
                    o.describe()
                ),
            )
        }
    }
}

async fn lim_002<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let limits = Limits {
        cpu: Duration::from_secs(1),
        ..probe_limits()
    };
    match limited_run(p, "SB-LIM-002", "while :; do :; done", limits).await {
        Err(e) => (false, e),
        Ok((o, gone)) => {
            let ok = o.output.termination
                == (Termination::LimitExceeded {
                    limit: "cpu".into(),
                })
                && gone;
            (ok, format!("limit_configured 1s CPU; {}", o.describe()))
        }
    }
}

async fn lim_003<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let limits = Limits {
        memory_bytes: 64 << 20,
        ..probe_limits()
    };
    let script = "dd if=/dev/zero of=/dev/null bs=1M count=1 2>/dev/null && echo ok > /out/small
dd if=/dev/zero of=/dev/null bs=256M count=1 2>/out/big-err && echo ok > /out/big
true";
    match limited_run(p, "SB-LIM-003", script, limits).await {
        Err(e) => (false, e),
        Ok((o, _)) => {
            let ok = o.text("small").is_some() && o.text("big").is_none();
            (
                ok,
                format!(
                    "limit_configured 64 MiB; 1 MiB buffer ok: {}; 256 MiB buffer ok: {}; {:?}",
                    o.text("small").is_some(),
                    o.text("big").is_some(),
                    o.text("big-err").unwrap_or_default().trim()
                ),
            )
        }
    }
}

async fn lim_004<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let limits = Limits {
        processes: 16,
        ..probe_limits()
    };
    let script = "i=0; while [ $i -lt 200 ]; do sleep 60 & i=$((i+1)); echo $i > /out/count; done";
    match limited_run(p, "SB-LIM-004", script, limits).await {
        Err(e) => (false, e),
        Ok((o, gone)) => {
            let count: u64 = o
                .text("count")
                .and_then(|c| c.trim().parse().ok())
                .unwrap_or(0);
            let ok = count > 0 && count <= 16 && gone;
            (
                ok,
                format!(
                    "limit_configured 16; background processes started before fork failed: {count}; no survivors: {gone}; {}",
                    o.describe()
                ),
            )
        }
    }
}

async fn lim_005<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let limits = Limits {
        file_size_bytes: 1 << 20,
        ..probe_limits()
    };
    match limited_run(
        p,
        "SB-LIM-005",
        "exec dd if=/dev/zero of=/out/big bs=64K count=64",
        limits,
    )
    .await
    {
        Err(e) => (false, e),
        Ok((o, _)) => {
            let size = o.files.get("big").map(Vec::len);
            let ok = o.output.termination
                == (Termination::LimitExceeded {
                    limit: "file-size".into(),
                })
                && size.is_some_and(|s| s <= 1 << 20);
            (
                ok,
                format!(
                    "limit_configured 1 MiB; file written: {size:?} bytes; {}",
                    o.describe()
                ),
            )
        }
    }
}

async fn local_002<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let limits = Limits {
        open_files: 32,
        ..probe_limits()
    };
    let script = r#"bash -c 'i=0; while [ $i -lt 100 ]; do exec {fd}</dev/null || break; i=$((i+1)); done; echo $i > /out/opened' 2>/dev/null"#;
    match limited_run(p, "SB-LOCAL-002", script, limits).await {
        Err(e) => (false, e),
        Ok((o, _)) => {
            let opened: u64 = o
                .text("opened")
                .and_then(|c| c.trim().parse().ok())
                .unwrap_or(0);
            (
                opened > 0 && opened < 32,
                format!("limit_configured 32; extra descriptors opened: {opened}"),
            )
        }
    }
}

fn fc_001(partial: &ConformanceReport) -> CheckResult {
    let mut failing = partial.clone();
    failing.checks = vec![ConformanceCheck {
        id: "SB-FS-005".into(),
        name: "host paths".into(),
        passed: false,
        skipped: false,
        detail: None,
    }];
    failing.passed = true; // a report claiming success with a failed check
    failing.autonomous_execution = true;
    let mut foreign = partial.clone();
    foreign.checks = vec![ConformanceCheck {
        id: "SB-FS-001".into(),
        name: "x".into(),
        passed: true,
        skipped: false,
        detail: None,
    }];
    foreign.passed = true;
    foreign.autonomous_execution = true;
    foreign.profile = "some-other-profile".into();
    let mut skipped = foreign.clone();
    skipped.profile = partial.profile.clone();
    skipped.checks[0].skipped = true;
    let results = [
        (
            "failed check",
            ensure_conformant(&failing, &partial.profile),
        ),
        (
            "foreign profile",
            ensure_conformant(&foreign, &partial.profile),
        ),
        (
            "skipped check",
            ensure_conformant(&skipped, &partial.profile),
        ),
    ];
    let ok = results
        .iter()
        .all(|(_, r)| matches!(r, Err(ExecutorError::ProfileNotConformant { .. })));
    let detail = results
        .iter()
        .map(|(what, r)| {
            format!(
                "{what}: {}",
                if r.is_err() { "refused" } else { "ACCEPTED" }
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    (ok, detail)
}

async fn fc_002<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => return (false, format!("create a temporary directory: {e}")),
    };
    let mut config = BubblewrapConfig::under(dir.path());
    config.bwrap = Some(dir.path().join("no-such-bwrap"));
    let missing = BubblewrapExecutor::new(config);
    let spec = p.spec("SB-FC-002", "echo ran > /out/ran", probe_limits());
    let (_tx, rx) = watch::channel(false);
    match missing.run(spec, rx).await {
        Err(ExecutorError::Start { reason, .. }) if reason.contains("apt-get install") => {
            (true, format!("refused: {reason}"))
        }
        Err(e) => (false, format!("unexpected error: {e}")),
        Ok(o) => (
            false,
            format!("ran without bubblewrap: {:?}", o.termination),
        ),
    }
}

async fn fc_003<E: SandboxBackend>(p: &mut Prober<'_, E>) -> CheckResult {
    let script = r#"r=""
(echo x > /etc/passwd) 2>/dev/null && r="$r first"
(echo x > /usr/protobot-second) 2>/dev/null && r="$r second"
printf '%s' "$r" > /out/result"#;
    let mut details = Vec::new();
    let mut ok = true;
    for _ in 0..2 {
        match p.run("SB-FC-003", script, probe_limits()).await {
            Err(e) => {
                ok = false;
                details.push(e);
            }
            Ok(o) => {
                let r = o.text("result");
                ok &= r.as_deref() == Some("");
                details.push(format!("writes that succeeded: {r:?}"));
            }
        }
    }
    (ok, details.join("; "))
}

// ---------------------------------------------------------------------------
// Credential-broker checks: SB-NET-001..010 and SB-CRED-001..007 through the
// egress proxy (profiles whose backend offers one, see
// `SandboxBackend::broker_probe_proxy`).

/// Digest sent by the SB-NET-002 probe without a matching attestation.
const UNATTESTED_DIGEST: &str =
    "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// The one probe run of the broker checks: every request through the proxy,
/// the direct connections, DNS and the credential search, each result in /out.
fn broker_script(listeners: &[TcpListener]) -> String {
    use protobot_egress::probe::{PROBE_HOST, UNAPPROVED_HOST};
    let mut s = format!(
        r#"T=$(cat "$PROTOBOT_EGRESS_SESSION_TOKEN_FILE" 2>/dev/null)
P="$PROTOBOT_EGRESS_PROXY"
H={PROBE_HOST}
req() {{ n=$1; shift; curl -gsS --max-time 20 -D "/out/$n.headers" -o "/out/$n.body" -w '%{{http_code}}' "$@" > "/out/$n.code" 2>"/out/$n.err"; }}
tok() {{ n=$1; shift; req "$n" -H "X-Sandbox-Session-Token: $T" "$@"; }}
tok allowed "$P/$H/v2/allowed"
tok unapproved "$P/{UNAPPROVED_HOST}/v2/allowed"
tok ip4 "$P/127.0.0.1/v2/allowed"
tok ip6 "$P/[::1]/v2/allowed"
tok short "$P/127.1/v2/allowed"
tok dns "$P/dns-tunnel.invalid/v2/allowed"
tok redirect "$P/$H/v2/redirect"
tok raw --request-target "tcp://$H:443/" "$P/"
tok port "$P/$H:8443/v2/allowed"
tok plain --request-target "http://$H/v2/allowed" "$P/"
tok bypass "$P/$H/tls-bypass"
tok post -X POST -d x "$P/$H/v2/allowed"
tok digest -H "X-Sandbox-Exec-Digest: {UNATTESTED_DIGEST}" "$P/$H/v2/allowed"
req unauth "$P/$H/v2/allowed"
tok ownauth -H "Authorization: Bearer probe-own-credential" "$P/$H/v2/allowed"
r=""
"#
    );
    for l in listeners {
        if let Ok(addr) = l.local_addr() {
            let (ip, port) = (addr.ip(), addr.port());
            s.push_str(&format!(
                "timeout 5 bash -c 'exec 3<>/dev/tcp/{ip}/{port}' 2>/dev/null && r=\"$r connected:{ip}:{port}\"\n"
            ));
        }
    }
    s.push_str(
        r#"for d in 192.0.2.1/443 198.51.100.7/80 1.1.1.1/53; do
  timeout 5 bash -c "exec 3<>/dev/tcp/$d" 2>/dev/null && r="$r connected:$d"
done
bash -c 'exit 0' || r="$r no-bash"
printf '%s' "$r" > /out/direct
r=""
getent hosts example.com >/dev/null 2>&1 && r="$r resolved:example.com"
r="$r$(awk '$1 == "nameserver" && $2 !~ /^(127\.|::1$)/ {printf " resolver:%s", $2}' /etc/resolv.conf 2>/dev/null)"
printf '%s' "$r" > /out/dns-direct
cat /proc/$$/environ > /out/environ
s="PROTOBOT-SANDBOX-"; s="${s}BROKER-TOKEN"
grep -rlsF "$s" /workspace /task /tmp /etc /root /home /var /opt /srv /mnt /run /proc/self/environ > /out/hits 2>/dev/null
true"#,
    );
    s
}

/// What the broker answered one probe request.
struct Answer {
    code: String,
    body: String,
    headers: String,
}

impl Answer {
    fn of(o: &Outcome, name: &str) -> Answer {
        Answer {
            code: o
                .text(&format!("{name}.code"))
                .unwrap_or_else(|| "<none>".into()),
            body: o.text(&format!("{name}.body")).unwrap_or_default(),
            headers: o.text(&format!("{name}.headers")).unwrap_or_default(),
        }
    }

    /// A 403 from the proxy with `reason`.
    fn denied(&self, reason: &str) -> bool {
        self.code == "403" && self.body.contains(&format!("\"reason\":\"{reason}\""))
    }

    fn describe(&self, name: &str) -> String {
        let body: String = self.body.chars().take(160).collect();
        format!("{name}: {} {body:?}", self.code)
    }
}

/// The broker checks' (id, name, result), in contract order.
async fn broker_checks<E: SandboxBackend>(
    p: &mut Prober<'_, E>,
    proxy_url: &str,
) -> Vec<(&'static str, &'static str, CheckResult)> {
    let listeners = match loopback_listeners() {
        Ok(l) => l,
        Err(e) => return vec![("SB-NET-001", "the broker probes could run", (false, e))],
    };
    let mut spec = p.spec("SB-NET", &broker_script(&listeners), probe_limits());
    spec.egress_proxy = Some(proxy_url.to_owned());
    let (_tx, rx) = watch::channel(false);
    let outcome = match p.run_spec(spec, rx).await {
        Ok(o) => o,
        Err(e) => {
            let why = format!("the probe run with egress through {proxy_url} failed: {e}");
            return vec![("SB-NET-001", "approved request allowed", (false, why))];
        }
    };
    let o = &outcome;
    let a = |n: &str| Answer::of(o, n);
    let sentinel = BROKER_TOKEN_SENTINEL;
    let mut checks = Vec::new();

    let allowed = a("allowed");
    let ok_payload = protobot_egress::probe::OK_PAYLOAD;
    checks.push((
        "SB-NET-001",
        "approved request allowed through the proxy",
        (
            allowed.code == "200"
                && allowed.body.contains(ok_payload)
                && !allowed.body.contains(sentinel),
            format!("{}; {}", allowed.describe("allowed"), o.describe()),
        ),
    ));
    let digest = a("digest");
    checks.push((
        "SB-NET-002",
        "an executable identity the broker cannot verify is denied",
        (
            digest.denied("executable-attestation-invalid"),
            digest.describe("unattested digest"),
        ),
    ));
    let unapproved = a("unapproved");
    checks.push((
        "SB-NET-003",
        "unapproved destination denied",
        (
            unapproved.denied("no-matching-rule"),
            unapproved.describe("evil.example.invalid"),
        ),
    ));
    let direct = o.text("direct").unwrap_or_else(|| "<missing>".into());
    let accepted = accepted_any(&listeners);
    let ips: Vec<Answer> = ["ip4", "ip6", "short"].iter().map(|n| a(n)).collect();
    checks.push((
        "SB-NET-004",
        "direct IPs denied by the proxy and unreachable from the sandbox",
        (
            ips.iter().all(|x| x.denied("direct-ip")) && direct.is_empty() && !accepted,
            format!(
                "{}; {}; {}; direct connections made: {direct:?}; host listener accepted one: {accepted}",
                ips[0].describe("127.0.0.1"),
                ips[1].describe("[::1]"),
                ips[2].describe("127.1")
            ),
        ),
    ));
    let dns = a("dns");
    let dns_direct = o.text("dns-direct").unwrap_or_else(|| "<missing>".into());
    checks.push((
        "SB-NET-005",
        "DNS tunnelling denied; no resolver in the sandbox",
        (
            dns.denied("dns") && dns_direct.is_empty(),
            format!(
                "{}; in the sandbox: {dns_direct:?}",
                dns.describe("dns-tunnel.invalid")
            ),
        ),
    ));
    let redirect = a("redirect");
    checks.push((
        "SB-NET-006",
        "upstream redirects are denials",
        (
            redirect.denied("upstream-redirect")
                && !redirect.headers.to_ascii_lowercase().contains("location:"),
            redirect.describe("/v2/redirect"),
        ),
    ));
    let raw = a("raw");
    checks.push((
        "SB-NET-007",
        "raw sockets denied",
        (
            raw.denied("raw-socket") && direct.is_empty(),
            format!(
                "{}; direct connections made: {direct:?}",
                raw.describe("tcp://")
            ),
        ),
    ));
    let port = a("port");
    checks.push((
        "SB-NET-008",
        "alternate port denied",
        (port.denied("alternate-port"), port.describe(":8443")),
    ));
    let (plain, bypass) = (a("plain"), a("bypass"));
    checks.push((
        "SB-NET-009",
        "plaintext and TLS bypass denied",
        (
            plain.denied("plaintext-http") && bypass.denied("tls-bypass"),
            format!(
                "{}; {}",
                plain.describe("http://"),
                bypass.describe("/tls-bypass")
            ),
        ),
    ));
    let post = a("post");
    checks.push((
        "SB-NET-010",
        "default deny: a method no rule allows",
        (post.denied("no-matching-rule"), post.describe("POST")),
    ));

    let raw_env = o.files.get("environ").cloned().unwrap_or_default();
    let vars: Vec<String> = raw_env
        .split(|b| *b == 0)
        .filter(|kv| !kv.is_empty())
        .map(|kv| String::from_utf8_lossy(kv).into_owned())
        .collect();
    let names: BTreeSet<String> = vars
        .iter()
        .map(|kv| kv.split('=').next().unwrap_or("").to_owned())
        .collect();
    let extra: Vec<&String> = names
        .iter()
        .filter(|n| {
            !n.starts_with("PROTOBOT_")
                && !["PATH", "HOME", "PWD", "HOSTNAME", "TMPDIR", "SHLVL", "_"]
                    .contains(&n.as_str())
        })
        .collect();
    let leaked = vars.iter().any(|kv| kv.contains(sentinel));
    checks.push((
        "SB-CRED-001",
        "environment holds no credential, only allowlisted names",
        (
            names.contains("PROTOBOT_EGRESS_SESSION_TOKEN_FILE") && extra.is_empty() && !leaked,
            format!("env names {names:?}; not allowlisted {extra:?}; credential inside: {leaked}"),
        ),
    ));
    let hits = o.text("hits").unwrap_or_else(|| "<missing>".into());
    checks.push((
        "SB-CRED-002",
        "the broker's credential is in no file of the sandbox",
        (hits.is_empty(), format!("files holding it: {hits:?}")),
    ));
    checks.push((
        "SB-CRED-003",
        "a sentinel in arguments or environment is refused before execution",
        cred_003(p).await,
    ));
    // The upstream echoes the Authorization it received; the broker must scrub it.
    let scrubbed = allowed.body.contains("[redacted]");
    checks.push((
        "SB-CRED-004",
        "the injected credential is stripped from responses",
        (
            allowed.code == "200"
                && scrubbed
                && !allowed.body.contains(sentinel)
                && !allowed.headers.contains(sentinel),
            format!(
                "{}; credential echoed and redacted: {scrubbed}",
                allowed.describe("allowed")
            ),
        ),
    ));
    let audit_text = serde_json::to_string(&o.output.audit).unwrap_or_default();
    checks.push((
        "SB-CRED-005",
        "the credential is in no audit event",
        (
            !o.output.audit.is_empty() && !audit_text.contains(sentinel),
            format!(
                "{} events; credential inside: {}",
                o.output.audit.len(),
                audit_text.contains(sentinel)
            ),
        ),
    ));
    let (unauth, ownauth) = (a("unauth"), a("ownauth"));
    checks.push((
        "SB-CRED-006",
        "the credential is injected only after authorization",
        (
            unauth.code == "401" && ownauth.denied("caller-authorization") && allowed.code == "200",
            format!(
                "{}; {}; {}",
                unauth.describe("no session token"),
                ownauth.describe("own Authorization"),
                allowed.describe("authorized")
            ),
        ),
    ));
    let everywhere: Vec<&String> = o
        .files
        .iter()
        .filter(|(_, body)| {
            body.windows(sentinel.len())
                .any(|w| w == sentinel.as_bytes())
        })
        .map(|(name, _)| name)
        .collect();
    checks.push((
        "SB-CRED-007",
        "the credential is in no output or log of the run",
        (
            everywhere.is_empty() && !o.output.stderr_tail.contains(sentinel),
            format!(
                "/out files holding it: {everywhere:?}; in the log: {}",
                o.output.stderr_tail.contains(sentinel)
            ),
        ),
    ));
    checks
}

/// Runs only the credential-broker checks through `executor` with egress
/// through `proxy_url`: for a report whose other probes could not run (a
/// missing capability), so it still says what the broker does.
pub async fn run_broker_checks<E: SandboxBackend>(
    executor: &E,
    proxy_url: &str,
) -> Vec<ConformanceCheck> {
    let fixture = match Fixture::create(executor.scratch_root()) {
        Ok(f) => f,
        Err(e) => {
            return vec![ConformanceCheck {
                id: "SB-NET-001".into(),
                name: "the broker probes could run".into(),
                passed: false,
                skipped: false,
                detail: Some(e),
            }];
        }
    };
    let mut p = Prober {
        executor,
        fixture: &fixture,
        run_ids: Vec::new(),
    };
    broker_checks(&mut p, proxy_url)
        .await
        .into_iter()
        .map(|(id, name, (passed, detail))| ConformanceCheck {
            id: id.into(),
            name: name.into(),
            passed,
            skipped: false,
            detail: Some(detail),
        })
        .collect()
}
