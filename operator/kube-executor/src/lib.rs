//! The Kubernetes `Executor` (ARCHITECTURE.md §4): each sandboxed run is a Pod
//! built from a sandbox profile (`sandbox-profiles/*.yaml`), fenced by its own
//! NetworkPolicy, and admitted only with a passing `jobsite-sandbox/v1`
//! conformance report for that profile.
//!
//! Module map: [`profile`] (parse and validate profile documents), [`names`]
//! (run id → DNS-1123 name), [`manifest`] (pure Pod and NetworkPolicy
//! construction), [`status`] (pure pod status → [`Termination`](protobot_jobsite::executor::Termination)), [`staging`]
//! (input in, output out, on the staging volume), [`executor`]
//! ([`KubernetesExecutor`]: the run pipeline and garbage collection),
//! [`config`].
//!
//! # Input and output: the staging volume
//!
//! The sandbox must get its input and give back its output without any
//! credential or route to the integration repository. The design used here is
//! a **staging volume**: a PersistentVolumeClaim that the operator mounts
//! (at [`StagingVolume::mount_path`]) and that nothing else mounts whole.
//! For each run the operator copies the projection and writes the task
//! document into `runs/<instance>/<run name>/{workspace,task/task.json,out}`;
//! the pod mounts only those three sub-paths (`/task` read-only), so it sees
//! neither other runs nor the operator's state; after the pod is gone the
//! operator copies `out` (regular files and directories only) into a
//! directory outside the volume and removes the run's directory.
//!
//! Why not the alternatives: an init container fetching input and a courier
//! sidecar shipping output need a per-run token and a reachable endpoint in the
//! operator, i.e. an ingress route *into* the control plane from the sandbox's
//! network; `kubectl cp`-style exec copies need `pods/exec` RBAC for the
//! operator and a `tar` in every worker image, and exec into a Kata guest is
//! slow. The staging volume needs neither: the sandbox's NetworkPolicy can
//! deny all ingress and all egress but the proxy. Its cost is a
//! ReadWriteMany claim (or ReadWriteOnce with sandboxes pinned to the
//! operator's node) and the uid rule of [`StagingOwnership`].
//!
//! # Limits and termination
//!
//! `RunSpec::limits.wall_clock` → `activeDeadlineSeconds` (rounded up) and an
//! executor-side deadline of wall clock + [`KubeExecutorConfig::start_allowance`]
//! (the pod deadline only counts once a node has accepted the pod);
//! `memory_bytes` → the container's memory request and limit (refused above
//! the profile's `maxMemory`); CPU and ephemeral storage come from the
//! profile. `cpu` time, `processes`, `file_size_bytes` and `open_files` have
//! no pod field: when the profile configures `spec.supervisor` (and an image is
//! known: the profile's, or [`KubeExecutorConfig::supervisor_image`]), an init
//! container copies the protobot binary into an `emptyDir` and the role's command
//! runs through `protobot sandbox supervise` (`protobot_executors::guest`), which
//! sets those rlimits in the guest; only then is `resource-limits` reported
//! supported. Exit codes 152/153 of a supervised pod are the CPU-time and
//! file-size limits.
//! Pod status maps to [`Termination`](protobot_jobsite::executor::Termination): a terminated container's exit code →
//! `Exited`, its signal → `Signaled`, `OOMKilled` → `LimitExceeded{memory}`,
//! pod reason `DeadlineExceeded` (or the executor deadline) →
//! `LimitExceeded{wall-clock}`, eviction for ephemeral storage →
//! `LimitExceeded{writable-disk}`; `cancel` turning true deletes the pod →
//! `Cancelled`. Containers that can never start are an
//! [`ExecutorError::Start`](protobot_jobsite::executor::ExecutorError::Start).
//!
//! # Conformance
//!
//! The report is given at construction ([`KubernetesExecutor::new`]), read by
//! the caller from the ConfigMap the profile names ([`read_report_configmap`])
//! or from a file ([`read_report_file`]), and kept current by
//! [`KubernetesExecutor::watch_report`], which the operator runs: a report
//! stored, replaced or deleted admits or refuses later runs without a restart. Every run checks it first; a missing
//! report, a report for another profile or contract, one that does not pass,
//! or one in which a capability the profile requires is unsupported refuses
//! the run before any object or directory exists.
//!
//! The executor also implements `protobot_executors::SandboxBackend`, with an
//! honest capability list: `credential-broker` is supported only when the
//! profile allows egress and the executor holds the egress proxy's URL and
//! session secret (the suite's SB-NET/SB-CRED checks then run as a pod through
//! that proxy, see [`conformance`]); `resource-limits` (CPU time, processes,
//! file size, open files) only with the in-guest supervisor (`spec.supervisor`).
//! Each run's pod lifecycle is mapped onto a sandbox audit chain, so
//! `audit-chain` is supported. Without them `run_conformance` through it fails
//! closed and the executor stays refused.
//!
//! # Leftovers
//!
//! Objects are found by label, never by memory: if the operator dies or a
//! run's future is dropped mid-run, its pod, NetworkPolicy and staged
//! directory remain (the pod still ends at its `activeDeadlineSeconds`) until
//! [`KubernetesExecutor::collect_garbage`] removes everything of its
//! `instance` whose run is not live in this process, or Kubernetes collects
//! them with the owner reference.

pub mod config;
pub mod conformance;
pub mod executor;
pub mod manifest;
pub mod names;
pub mod profile;
pub mod staging;
pub mod status;

pub use config::{KubeExecutorConfig, StagingOwnership, StagingVolume, WorkItemOwner};
pub use executor::{
    ConfigError, GcError, GcReport, KubernetesExecutor, ReportError, read_report_configmap,
    read_report_file,
};
pub use names::run_name;
pub use profile::{ProfileError, SandboxProfile};
