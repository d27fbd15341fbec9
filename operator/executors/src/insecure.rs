//! [`InsecureProcessExecutor`]: runs the command as a plain local process with
//! NO isolation (`--insecure-no-sandbox`), and [`LocalExecutor`], which picks
//! the bubblewrap sandbox whenever `bwrap` exists.
//!
//! The insecure executor still copies the workspace, clears the environment,
//! applies rlimits through `prlimit`, enforces the wall clock and
//! cancellation by killing the process group, collects `/out` and removes
//! the copy, but the command can read and write anything the control plane
//! can, including credentials, and reach the network. It logs a loud warning
//! on every run, reports every capability unsupported, and therefore never
//! passes conformance: [`crate::ConformantExecutor`] refuses it. The command
//! finds its directories in `PROTOBOT_WORKSPACE`, `PROTOBOT_OUT` and
//! `PROTOBOT_TASK` (real host paths, not `/workspace`).

use std::{collections::BTreeMap, path::Path};

use protobot_jobsite::executor::{Executor, ExecutorError, RunOutput, RunSpec, Termination};
use tokio::{process::Command, sync::watch};

use crate::{
    bubblewrap::{BubblewrapConfig, BubblewrapExecutor, SANDBOX_PATH},
    conformance::{ALL_CAPABILITIES, BackendIdentity, Capability, SandboxBackend},
    rundir::{self, RunDir},
    supervise::{self, Ending},
    tools,
};

/// The profile name of the insecure executor.
pub const INSECURE_PROFILE: &str = "insecure-no-sandbox";

/// Plain-process executor without any isolation. Build it only on an explicit
/// operator request.
#[derive(Clone, Debug)]
pub struct InsecureProcessExecutor {
    scratch_root: std::path::PathBuf,
    output_root: std::path::PathBuf,
}

fn kill_group(pid: u32) {
    // `kill` from procps/util-linux: no unsafe libc call needed.
    let _ = std::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

impl InsecureProcessExecutor {
    /// An insecure executor using the scratch and output roots of `config`
    /// (the rest of the configuration does not apply without a sandbox).
    pub fn new_without_sandbox(config: &BubblewrapConfig) -> Self {
        tracing::warn!(
            "INSECURE: an executor WITHOUT any sandbox was created (--insecure-no-sandbox)"
        );
        InsecureProcessExecutor {
            scratch_root: config.scratch_root.clone(),
            output_root: config.output_root.clone(),
        }
    }

    async fn run_unsandboxed(
        &self,
        spec: RunSpec,
        cancel: watch::Receiver<bool>,
    ) -> Result<RunOutput, ExecutorError> {
        tracing::warn!(
            run_id = spec.run_id,
            "INSECURE: running project code WITHOUT a sandbox (--insecure-no-sandbox): it can read credentials, \
             write anywhere this user can and reach the network; install bubblewrap"
        );
        tools::validate_spec(&spec)?;
        let run_id = spec.run_id.clone();
        let prlimit = tools::find_on_path("prlimit").ok_or_else(|| ExecutorError::Start {
            run_id: run_id.clone(),
            reason: "`prlimit` (util-linux) was not found; install util-linux to enforce resource limits".into(),
        })?;
        let name = format!("{}-{}", tools::safe_component(&run_id), tools::nonce());
        let (scratch, output) = (self.scratch_root.clone(), self.output_root.clone());
        let (source, task, dir_name) = (spec.workspace.clone(), spec.task.clone(), name.clone());
        let dir = tokio::task::spawn_blocking(move || {
            rundir::ensure_dir(&scratch, 0o711)?;
            rundir::ensure_dir(&output, 0o700)?;
            RunDir::create(&scratch, &dir_name, &source, &task, None)
        })
        .await
        .map_err(|e| ExecutorError::Start {
            run_id: run_id.clone(),
            reason: format!("preparing the run directory panicked: {e}"),
        })?
        .map_err(|e| ExecutorError::Start {
            run_id: run_id.clone(),
            reason: format!("preparing the workspace copy failed: {e}"),
        })?;

        let result = self.execute(&spec, &dir, &prlimit, &name, cancel).await;
        let root = dir.root.clone();
        let removed = tokio::task::spawn_blocking(move || rundir::remove_tree(&root)).await;
        let out = result?;
        match removed {
            Ok(Ok(())) => Ok(out),
            _ => Err(ExecutorError::Collect {
                run_id,
                reason: format!(
                    "removing the workspace copy {} failed; remove it by hand",
                    dir.root.display()
                ),
            }),
        }
    }

    async fn execute(
        &self,
        spec: &RunSpec,
        dir: &RunDir,
        prlimit: &Path,
        name: &str,
        cancel: watch::Receiver<bool>,
    ) -> Result<RunOutput, ExecutorError> {
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        env.insert("PATH".into(), SANDBOX_PATH.into());
        env.insert("HOME".into(), dir.workspace.to_string_lossy().into_owned());
        env.insert(
            "PROTOBOT_WORKSPACE".into(),
            dir.workspace.to_string_lossy().into_owned(),
        );
        env.insert(
            "PROTOBOT_OUT".into(),
            dir.out.to_string_lossy().into_owned(),
        );
        env.insert(
            "PROTOBOT_TASK".into(),
            dir.task_dir
                .join("task.json")
                .to_string_lossy()
                .into_owned(),
        );
        env.extend(spec.env.clone());
        let mut cmd = Command::new(prlimit);
        cmd.args(tools::prlimit_args(spec))
            .args(&spec.command)
            .env_clear()
            .envs(env)
            .current_dir(&dir.workspace)
            .process_group(0);
        let (termination, elapsed, stderr_tail) = if *cancel.borrow() {
            (
                Termination::Cancelled,
                std::time::Duration::ZERO,
                String::new(),
            )
        } else {
            let s = supervise::supervise(
                cmd,
                &spec.run_id,
                spec.limits.wall_clock,
                cancel,
                Some(Box::new(kill_group)),
            )
            .await?;
            let t = match s.ending {
                Ending::WallClock => Termination::LimitExceeded {
                    limit: "wall-clock".into(),
                },
                Ending::Cancelled => Termination::Cancelled,
                Ending::Exited(status) => supervise::direct_termination(status),
            };
            (t, s.elapsed, s.stderr_tail)
        };
        let out_dir = self.output_root.join(name);
        let (from, to) = (dir.out.clone(), out_dir.clone());
        let run_id = spec.run_id.clone();
        tokio::task::spawn_blocking(move || rundir::collect_out(&from, &to))
            .await
            .map_err(|e| ExecutorError::Collect {
                run_id: run_id.clone(),
                reason: format!("collecting the output panicked: {e}"),
            })?
            .map_err(|e| ExecutorError::Collect {
                run_id,
                reason: format!("copying the output failed: {e}"),
            })?;
        Ok(RunOutput {
            out_dir,
            termination,
            elapsed,
            stderr_tail,
            // No sandbox, so no sandbox audit: this mode claims no capability.
            audit: Vec::new(),
        })
    }
}

impl Executor for InsecureProcessExecutor {
    fn profile(&self) -> &str {
        INSECURE_PROFILE
    }

    async fn run(
        &self,
        spec: RunSpec,
        cancel: watch::Receiver<bool>,
    ) -> Result<RunOutput, ExecutorError> {
        self.run_unsandboxed(spec, cancel).await
    }
}

impl SandboxBackend for InsecureProcessExecutor {
    fn identity(&self) -> BackendIdentity {
        BackendIdentity {
            name: "protobot-insecure-process".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn capabilities(&self) -> Vec<Capability> {
        ALL_CAPABILITIES
            .iter()
            .map(|n| Capability::unsupported(n, "no sandbox (--insecure-no-sandbox)"))
            .collect()
    }

    fn scratch_root(&self) -> &Path {
        &self.scratch_root
    }
}

/// The local executor the CLI uses: the bubblewrap sandbox, or, only when
/// `bwrap` is missing and the operator said `--insecure-no-sandbox`, the
/// insecure process executor.
#[derive(Clone, Debug)]
pub enum LocalExecutor {
    /// The bubblewrap sandbox (refuses every run when `bwrap` is missing).
    Sandboxed(BubblewrapExecutor),
    /// No sandbox at all.
    Insecure(InsecureProcessExecutor),
}

impl LocalExecutor {
    /// Chooses the backend. With `bwrap` present the sandbox is always used,
    /// even when `insecure_no_sandbox` is set; without it, the insecure
    /// executor is built only when `insecure_no_sandbox` is set, otherwise
    /// runs refuse with an install hint.
    pub fn new(config: BubblewrapConfig, insecure_no_sandbox: bool) -> Self {
        let sandboxed = BubblewrapExecutor::new(config);
        match (sandboxed.bwrap_path(), insecure_no_sandbox) {
            (Some(_), true) => {
                tracing::info!(
                    "bubblewrap is available: --insecure-no-sandbox is ignored and runs are sandboxed"
                );
                LocalExecutor::Sandboxed(sandboxed)
            }
            (None, true) => LocalExecutor::Insecure(InsecureProcessExecutor::new_without_sandbox(
                sandboxed.config(),
            )),
            (_, false) => LocalExecutor::Sandboxed(sandboxed),
        }
    }
}

impl Executor for LocalExecutor {
    fn profile(&self) -> &str {
        match self {
            LocalExecutor::Sandboxed(e) => e.profile(),
            LocalExecutor::Insecure(e) => e.profile(),
        }
    }

    async fn run(
        &self,
        spec: RunSpec,
        cancel: watch::Receiver<bool>,
    ) -> Result<RunOutput, ExecutorError> {
        match self {
            LocalExecutor::Sandboxed(e) => e.run(spec, cancel).await,
            LocalExecutor::Insecure(e) => e.run(spec, cancel).await,
        }
    }
}

impl SandboxBackend for LocalExecutor {
    fn identity(&self) -> BackendIdentity {
        match self {
            LocalExecutor::Sandboxed(e) => e.identity(),
            LocalExecutor::Insecure(e) => e.identity(),
        }
    }

    fn capabilities(&self) -> Vec<Capability> {
        match self {
            LocalExecutor::Sandboxed(e) => e.capabilities(),
            LocalExecutor::Insecure(e) => e.capabilities(),
        }
    }

    fn scratch_root(&self) -> &Path {
        match self {
            LocalExecutor::Sandboxed(e) => e.scratch_root(),
            LocalExecutor::Insecure(e) => e.scratch_root(),
        }
    }
}
