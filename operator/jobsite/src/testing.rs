//! Test support (feature `test-support`): a real project repository with
//! change sets authored by ears-manager (run in-process) and merged the way a
//! person merges a change-set pull request. Used by this crate's tests and by
//! the controller tests; never part of a production build.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use protobot_demo::authoring;

/// `authoring::git`, panicking on failure (tests).
pub fn git(dir: &std::path::Path, args: &[&str]) -> String {
    authoring::git(dir, args).unwrap_or_else(|e| panic!("{e}"))
}

/// `authoring::ears`, panicking on failure (tests).
pub fn ears(dir: &std::path::Path, args: &[&str]) -> serde_json::Value {
    authoring::ears(dir, args).unwrap_or_else(|e| panic!("{e}"))
}

/// A spec repository in a temp dir: change set `CS-00001` (one event-driven
/// requirement on interface `cli-main`) merged into `main` with a merge commit,
/// and `CS-00002` proposed but never merged. Returns the dir and the merge commit.
pub fn spec_repo(project_id: &str) -> (tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README.md"), format!("# {project_id}\n")).unwrap();
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::write(dir.join("docs/vision.md"), "# Vision\n").unwrap();
    std::fs::write(dir.join("docs/architecture.md"), "# Architecture\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "initial"]);
    let remote = format!("https://example.invalid/{project_id}.git");
    ears(
        dir,
        &[
            "project",
            "init",
            "--id",
            project_id,
            "--name",
            project_id,
            "--canonical-remote",
            &remote,
            "--review-mode",
            "single-player",
        ],
    );
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "project init"]);
    ears(
        dir,
        &[
            "change-set",
            "create",
            "--intent",
            "Sync command",
            "--affected-scope",
            "cli",
            "--implementation-required",
            "true",
            "--created",
            "2026-09-15T12:01:00Z",
        ],
    );
    ears(
        dir,
        &[
            "interface",
            "add",
            "--change-set",
            "CS-00001",
            "--id",
            "cli-main",
            "--name",
            "Sync CLI",
            "--type",
            "cli",
            "--spec-approach",
            "prose",
            "--created",
            "2026-09-15T12:02:00Z",
        ],
    );
    ears(
        dir,
        &[
            "change-set",
            "update",
            "--change-set",
            "CS-00001",
            "--affected-interface",
            "cli-main",
        ],
    );
    ears(
        dir,
        &[
            "requirement",
            "add",
            "--change-set",
            "CS-00001",
            "--id",
            "REQ-CLI-00001",
            "--type",
            "event-driven",
            "--text",
            "When the user runs sync, the CLI shall copy changed files.",
            "--interface",
            "cli-main",
            "--scope",
            "cli",
            "--verification-mode",
            "isolated-interface",
            "--provenance",
            "user-authored",
            "--created",
            "2026-09-15T12:03:00Z",
        ],
    );
    let branch = git(dir, &["branch", "--show-current"]);
    assert!(
        branch.starts_with("cs/"),
        "change-set create checked out {branch}"
    );
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "CS-00001: sync command"]);
    git(dir, &["checkout", "-q", "main"]);
    git(
        dir,
        &["merge", "-q", "--no-ff", "-m", "Merge CS-00001", &branch],
    );
    let merge = git(dir, &["rev-parse", "HEAD"]);
    ears(
        dir,
        &[
            "change-set",
            "create",
            "--intent",
            "Dry run",
            "--affected-scope",
            "cli",
            "--implementation-required",
            "true",
            "--created",
            "2026-09-15T13:00:00Z",
        ],
    );
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "CS-00002: dry run"]);
    git(dir, &["checkout", "-q", "main"]);
    (tmp, merge)
}

/// What a scripted role sees: its copied workspace, its `/out` folder and its task.
pub struct ScriptRun<'a> {
    /// The run.
    pub spec: &'a crate::executor::RunSpec,
    /// The run's private copy of the workspace (like `/workspace`).
    pub workspace: &'a std::path::Path,
    /// The output folder (like `/out`).
    pub out: &'a std::path::Path,
}

/// A role implemented in Rust: returns the exit code, or an executor failure.
pub type Script = std::sync::Arc<dyn Fn(&ScriptRun<'_>) -> Result<i32, String> + Send + Sync>;

/// The in-process test Executor: each role is a Rust closure over a private copy
/// of the workspace, with the same input/output contract as the sandboxes. It is
/// a test harness only — it isolates nothing — and records every run it was given.
pub struct InProcessExecutor {
    root: std::path::PathBuf,
    scripts: std::collections::BTreeMap<crate::executor::SandboxRole, Script>,
    runs: std::sync::Mutex<Vec<crate::executor::RunSpec>>,
    counter: std::sync::atomic::AtomicU64,
    refusal: Option<String>,
    delay: std::collections::BTreeMap<crate::executor::SandboxRole, std::time::Duration>,
    in_flight: std::sync::atomic::AtomicUsize,
    peak: std::sync::atomic::AtomicUsize,
}

/// Counts a run in flight while it lives.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl InProcessExecutor {
    /// An executor writing run folders under `root`.
    pub fn new(root: &std::path::Path) -> InProcessExecutor {
        InProcessExecutor {
            root: root.to_path_buf(),
            scripts: Default::default(),
            runs: Default::default(),
            counter: Default::default(),
            refusal: None,
            delay: Default::default(),
            in_flight: Default::default(),
            peak: Default::default(),
        }
    }

    /// Every run of `role` takes at least `delay` (a Worker that thinks), waited
    /// asynchronously: concurrent builds overlap their runs.
    pub fn with_run_delay(
        mut self,
        role: crate::executor::SandboxRole,
        delay: std::time::Duration,
    ) -> Self {
        self.delay.insert(role, delay);
        self
    }

    /// The most runs that were in flight at once so far.
    pub fn peak_in_flight(&self) -> usize {
        self.peak.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// An executor whose profile is not conformant: it admits nothing.
    pub fn refusing(mut self, reason: &str) -> Self {
        self.refusal = Some(reason.to_string());
        self
    }

    /// Sets the script of `role`.
    pub fn with(mut self, role: crate::executor::SandboxRole, script: Script) -> Self {
        self.scripts.insert(role, script);
        self
    }

    /// Every run so far.
    pub fn runs(&self) -> Vec<crate::executor::RunSpec> {
        self.runs.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// Copies a directory tree (regular files and directories only).
pub fn copy_tree(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

impl crate::executor::Executor for InProcessExecutor {
    fn profile(&self) -> &str {
        "in-process-test"
    }

    fn admit(&self) -> Result<(), crate::executor::ExecutorError> {
        match &self.refusal {
            None => Ok(()),
            Some(reason) => Err(crate::executor::ExecutorError::ProfileNotConformant {
                profile: "in-process-test".into(),
                reason: reason.clone(),
            }),
        }
    }

    async fn run(
        &self,
        spec: crate::executor::RunSpec,
        cancel: tokio::sync::watch::Receiver<bool>,
    ) -> Result<crate::executor::RunOutput, crate::executor::ExecutorError> {
        use crate::executor::{ExecutorError, RunOutput, Termination};
        if let Ok(mut runs) = self.runs.lock() {
            runs.push(spec.clone());
        }
        let audit = |termination: &Termination| {
            crate::sandbox_audit::session_chain(&crate::sandbox_audit::SessionRecord {
                backend_name: "in-process-test",
                backend_version: env!("CARGO_PKG_VERSION"),
                profile: "in-process-test",
                spec: &spec,
                termination: Some(termination),
                cleanup: Ok(()),
            })
            .into_events()
        };
        if *cancel.borrow() {
            return Ok(RunOutput {
                out_dir: self.root.clone(),
                termination: Termination::Cancelled,
                elapsed: std::time::Duration::ZERO,
                stderr_tail: String::new(),
                audit: audit(&Termination::Cancelled),
            });
        }
        let now_in_flight = self
            .in_flight
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        let _in_flight = InFlight(&self.in_flight);
        self.peak
            .fetch_max(now_in_flight, std::sync::atomic::Ordering::SeqCst);
        if let Some(delay) = self.delay.get(&spec.role) {
            let mut cancel = cancel.clone();
            tokio::select! {
                () = tokio::time::sleep(*delay) => {}
                _ = cancel.wait_for(|c| *c) => {}
            }
        }
        let n = self
            .counter
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = self.root.join(format!("{}-{n}", spec.run_id));
        let (workspace, out) = (dir.join("workspace"), dir.join("out"));
        let start = |reason: String| ExecutorError::Start {
            run_id: spec.run_id.clone(),
            reason,
        };
        copy_tree(&spec.workspace, &workspace).map_err(|e| start(e.to_string()))?;
        std::fs::create_dir_all(&out).map_err(|e| start(e.to_string()))?;
        let script = self
            .scripts
            .get(&spec.role)
            .ok_or_else(|| start(format!("no script for role {:?}", spec.role)))?;
        let began = std::time::Instant::now();
        let code = script(&ScriptRun {
            spec: &spec,
            workspace: &workspace,
            out: &out,
        })
        .map_err(start)?;
        let termination = Termination::Exited { code };
        Ok(RunOutput {
            out_dir: out,
            audit: audit(&termination),
            termination,
            elapsed: began.elapsed(),
            stderr_tail: String::new(),
        })
    }
}

/// Writes change sets `CS-<id>` for `ids` on `base`, each adding one event-driven
/// requirement `REQ-CLI-<id>` on a scope of its own, and recomputes the store digests in
/// `.protobot/project.yaml` (a flood of independent change sets, as `ears-manager check`
/// accepts them).
pub fn write_change_sets(dir: &std::path::Path, base: &str, ids: std::ops::RangeInclusive<usize>) {
    let (sets, reqs) = (".protobot/change-sets", ".protobot/requirements");
    std::fs::create_dir_all(dir.join(sets)).unwrap();
    std::fs::create_dir_all(dir.join(reqs)).unwrap();
    for i in ids {
        let id = format!("{i:05}");
        std::fs::write(
            dir.join(format!("{sets}/cs-{id}.yaml")),
            format!(
                "# managed by ears-manager; do not edit by hand\nid: CS-{id}\nbase_commit: {base}\nintent: Item {i}\noperations:\n  - action: add\n    requirement_id: REQ-CLI-{id}\naffected_interfaces: []\naffected_scopes:\n  - s{id}\nimplementation_required: true\nimpact_assessment_base_commit: {base}\ncreated: \"2026-09-15T12:01:00Z\"\n"
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join(format!("{reqs}/REQ-CLI-{id}.yaml")),
            format!(
                "# managed by ears-manager; do not edit by hand\nid: REQ-CLI-{id}\ntype: event-driven\ntext: When the user runs item {i}, the CLI shall print {i}.\napplies_to:\n  scopes:\n    - s{id}\nverification:\n  mode: isolated-interface\nprovenance: user-authored\ncreated: \"2026-09-15T12:03:00Z\"\nstatus: active\n"
            ),
        )
        .unwrap();
    }
    let digest = |store: &str| {
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.join(store))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    format!("{store}/{}", e.file_name().to_string_lossy()),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        files.sort();
        protobot_spec::digest::store_digest(files.iter().map(|(p, b)| (p.as_str(), b.as_slice())))
            .unwrap()
    };
    let config = dir.join(".protobot/project.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    let rewritten: String = text
        .lines()
        .map(|l| {
            if l.starts_with("  requirements: sha256:") {
                format!("  requirements: {}", digest(reqs))
            } else if l.starts_with("  change_sets: sha256:") {
                format!("  change_sets: {}", digest(sets))
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    std::fs::write(&config, rewritten + "\n").unwrap();
}

/// A project repository (`flood`, single-player review) whose `main` merged change sets
/// `CS-00001`..`CS-<n>` in one merge commit, each adding one requirement on a scope of its
/// own ([`write_change_sets`]), checked valid by `ears-manager check`. Returns the merge
/// commit.
pub fn flood_repo(dir: &std::path::Path, n: usize) -> String {
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README.md"), "# flood\n").unwrap();
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::write(dir.join("docs/vision.md"), "# Vision\n").unwrap();
    std::fs::write(dir.join("docs/architecture.md"), "# Architecture\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "initial"]);
    ears(
        dir,
        &[
            "project",
            "init",
            "--id",
            "flood",
            "--name",
            "flood",
            "--canonical-remote",
            "https://example.invalid/flood.git",
            "--review-mode",
            "single-player",
        ],
    );
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "project init"]);
    let base = git(dir, &["rev-parse", "HEAD"]);
    git(dir, &["checkout", "-q", "-b", "cs/flood"]);
    write_change_sets(dir, &base, 1..=n);
    let check = ears(dir, &["check"]);
    assert_eq!(check["data"]["valid"], true, "{check}");
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", &format!("{n} change sets")]);
    git(dir, &["checkout", "-q", "main"]);
    git(
        dir,
        &[
            "merge",
            "-q",
            "--no-ff",
            "-m",
            "Merge the flood",
            "cs/flood",
        ],
    );
    git(dir, &["rev-parse", "HEAD"])
}
