//! The `Executor` port: run one sandboxed role and collect its output
//! (ARCHITECTURE.md §4, the execution contract).
//!
//! A sandboxed role (Worker A, Worker B, integration runner, Inspector,
//! mutation runner) sees exactly one input tree and returns exactly one output
//! folder:
//! - in: `/workspace`, a git repository made for this run (synthetic root
//!   commit, own object database, no alternates, no remote, no credentials),
//!   and `/task/task.json` (role, requirements, interfaces, sanitized feedback,
//!   cycle, retry budget, model tier);
//! - out: `/out/` — `patch.bundle` (Workers), `results.json` (integration
//!   runner), `findings.jsonl` (Inspectors), `campaign.json` (mutation).
//!
//! Backends: Kubernetes pods from a sandbox profile, and local processes under
//! bubblewrap. A backend whose profile's conformance report is missing or
//! failing must refuse to run ([`ExecutorError::ProfileNotConformant`]); it never
//! falls back to a weaker profile. The trusted control plane builds the input,
//! validates what comes back and never executes project code itself.

use std::{collections::BTreeMap, future::Future, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

/// The sandboxed roles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxRole {
    /// Writes tests; sees specs and tests, never implementation.
    WorkerA,
    /// Writes implementation; sees specs and implementation, never tests.
    WorkerB,
    /// Builds the candidate and runs the active test catalog.
    IntegrationRunner,
    /// Reads the candidate (minus integration-only paths) and reports findings.
    Inspector,
    /// Runs a mutation campaign.
    MutationRunner,
}

impl SandboxRole {
    /// The wire name (as serialized): `worker-a`, `worker-b`, `integration-runner`,
    /// `inspector`, `mutation-runner`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxRole::WorkerA => "worker-a",
            SandboxRole::WorkerB => "worker-b",
            SandboxRole::IntegrationRunner => "integration-runner",
            SandboxRole::Inspector => "inspector",
            SandboxRole::MutationRunner => "mutation-runner",
        }
    }
}

/// Resource limits of one run. Every limit is enforced or the backend reports
/// the `resource-limits` capability unsupported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Wall clock (also capped by the lease).
    pub wall_clock: Duration,
    /// CPU time.
    pub cpu: Duration,
    /// Address-space / memory bytes.
    pub memory_bytes: u64,
    /// Processes (and threads) of the sandbox user.
    pub processes: u64,
    /// Largest file the run may write.
    pub file_size_bytes: u64,
    /// Open file descriptors.
    pub open_files: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            wall_clock: Duration::from_secs(600),
            cpu: Duration::from_secs(600),
            memory_bytes: 2 << 30,
            processes: 256,
            file_size_bytes: 256 << 20,
            open_files: 1024,
        }
    }
}

/// One run to execute.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    /// Unique and deterministic (work item, cycle, role, attempt): a retried
    /// run with the same id must not be executed twice concurrently.
    pub run_id: String,
    /// The role.
    pub role: SandboxRole,
    /// The repository to expose (copied, never bind-mounted writable) at `/workspace`.
    pub workspace: PathBuf,
    /// The task document written to `/task/task.json`.
    pub task: serde_json::Value,
    /// Harness command run inside the sandbox (from the WorkerClass).
    pub command: Vec<String>,
    /// Container image (Kubernetes backends; ignored locally).
    pub image: Option<String>,
    /// Non-secret environment.
    pub env: BTreeMap<String, String>,
    /// Limits.
    pub limits: Limits,
    /// Egress proxy URL, if the role may reach one; otherwise no network at all.
    pub egress_proxy: Option<String>,
    /// Who the run belongs to, for its audit events.
    #[serde(default)]
    pub audit: RunAudit,
    /// What its model calls are attributed to (its egress session carries it, and the
    /// proxy's meter and metrics read it from there).
    #[serde(default)]
    pub attribution: RunAttribution,
}

/// What a run's model usage is attributed to, besides its work item, role, run id and cycle
/// ([`RunAudit`]): the project, the build stage and the escalation tier (issue 34). The
/// executors put it into the run's egress session (`protobot_executors::egress::session_for`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAttribution {
    /// The project (empty when not known).
    #[serde(default)]
    pub project: String,
    /// The build stage (`None` for runs outside a build, e.g. conformance probes).
    #[serde(default)]
    pub stage: Option<protobot_usage::Stage>,
    /// The escalation tier its Workers run at (`None` outside build cycles).
    #[serde(default)]
    pub tier: Option<crate::escalation::Tier>,
}

impl SandboxRole {
    /// The build stage a run of this role belongs to.
    pub fn stage(self) -> protobot_usage::Stage {
        match self {
            SandboxRole::WorkerA => protobot_usage::Stage::WorkerA,
            SandboxRole::WorkerB => protobot_usage::Stage::WorkerB,
            SandboxRole::IntegrationRunner => protobot_usage::Stage::Integration,
            SandboxRole::Inspector | SandboxRole::MutationRunner => {
                protobot_usage::Stage::Inspection
            }
        }
    }
}

/// The identity a run's sandbox audit events carry
/// ([`crate::sandbox_audit::SandboxAuditEvent`]). Only the work-item ID: no other WMS data.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAudit {
    /// The work item.
    pub work_item: String,
    /// The build cycle (0 outside build cycles).
    pub cycle: u32,
    /// The trace the run belongs to (the Job Site logs it with the run).
    pub trace_id: String,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Termination {
    /// The command exited.
    Exited {
        /// Exit code.
        code: i32,
    },
    /// Killed by a signal.
    Signaled {
        /// Signal number.
        signal: i32,
    },
    /// A limit ended it (`wall-clock`, `lease`, `cpu`, `memory`, …).
    LimitExceeded {
        /// Which limit.
        limit: String,
    },
    /// Cancelled (lease lost, shutdown).
    Cancelled,
}

/// What a run returned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOutput {
    /// The collected `/out` folder (owned by the control plane after the run).
    pub out_dir: PathBuf,
    /// How it ended.
    pub termination: Termination,
    /// Wall time used.
    pub elapsed: Duration,
    /// Last bytes of stderr, for the private evaluation record only (never
    /// forwarded to a Worker).
    pub stderr_tail: String,
    /// The session's sandbox audit chain (private Job Site evidence; empty when the backend
    /// does not report the `audit-chain` capability).
    #[serde(default)]
    pub audit: Vec<crate::sandbox_audit::SandboxAuditEvent>,
}

/// Executor failures (as opposed to a command that ran and failed).
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The profile has no passing conformance report: refuse, never fall back.
    #[error(
        "sandbox profile {profile} is not conformant ({reason}); run `protobot sandbox conformance` and fix the failing checks"
    )]
    ProfileNotConformant {
        /// Profile name.
        profile: String,
        /// Why.
        reason: String,
    },
    /// No node has room for a run's pod (the node-room check of a replica in a cluster,
    /// `crate::capacity::node_room`): claim nothing until one has. Never returned by `run`.
    #[error("no room for a run's pod: {reason}")]
    NoRoom {
        /// Why (a `crate::capacity::Starved`, which says what to do).
        reason: String,
    },
    /// The sandbox could not be prepared or started.
    #[error("failed to start sandbox for run {run_id}: {reason}")]
    Start {
        /// Run.
        run_id: String,
        /// Why.
        reason: String,
    },
    /// Output could not be collected.
    #[error("failed to collect the output of run {run_id}: {reason}")]
    Collect {
        /// Run.
        run_id: String,
        /// Why.
        reason: String,
    },
}

/// The Executor port.
pub trait Executor: Send + Sync {
    /// The sandbox profile name this executor enforces.
    fn profile(&self) -> &str;

    /// Whether runs are admitted right now ([`ExecutorError::ProfileNotConformant`]
    /// when the profile's conformance report is missing or failing). A Job Site
    /// claims no work while its executor refuses, so nothing waits on a lease
    /// that cannot make progress.
    fn admit(&self) -> Result<(), ExecutorError> {
        Ok(())
    }

    /// Runs one role to completion, a limit, or cancellation (`cancel` turning
    /// true, e.g. when the lease is lost); kills the whole process tree on exit.
    fn run(
        &self,
        spec: RunSpec,
        cancel: tokio::sync::watch::Receiver<bool>,
    ) -> impl Future<Output = Result<RunOutput, ExecutorError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_s_name_is_its_serialized_name() {
        for role in [
            SandboxRole::WorkerA,
            SandboxRole::WorkerB,
            SandboxRole::IntegrationRunner,
            SandboxRole::Inspector,
            SandboxRole::MutationRunner,
        ] {
            assert_eq!(
                serde_json::to_value(role).ok(),
                Some(serde_json::Value::String(role.as_str().to_owned()))
            );
        }
    }
}
