//! Executor backends of protobot (ARCHITECTURE.md §4 and §7).
//!
//! The Job Site engine talks to one port, [`protobot_jobsite::executor::Executor`]:
//! run one sandboxed role and collect its `/out`. This crate holds the local
//! backends and the local half of the `jobsite-sandbox/v1` conformance suite:
//! - [`bubblewrap`]: [`BubblewrapExecutor`], the single-machine sandbox
//!   (mount, PID, network, IPC, UTS and user namespaces via `bwrap`; rlimits via
//!   `prlimit`; a dedicated uid per run when the control plane runs as root);
//! - [`egress`]: proxied egress for bubblewrap runs (a network namespace
//!   whose only reachable address is the egress proxy, and a signed session
//!   token), when the executor has the proxy's session secret and is root;
//! - [`insecure`]: [`InsecureProcessExecutor`], plain processes with no
//!   isolation, only ever built explicitly (`--insecure-no-sandbox`) and loudly
//!   logged on every run; [`LocalExecutor`] picks one of the two;
//! - [`conformance`]: [`run_conformance`] (real probes run through an executor,
//!   producing the contract's [`ConformanceReport`]) and
//!   [`ConformantExecutor`], which refuses to run a profile whose report fails;
//! - [`guest`]: the in-guest resource-limit supervisor (`protobot sandbox
//!   supervise`), which sets CPU-time, process, file-size and open-file rlimits
//!   on itself and execs the role's command inside a sandbox pod;
//! - [`reach`]: whether a per-run sandbox uid can reach the scratch root
//!   (checked before any work, with the directory that blocks it and the fix);
//! - [`procfs`]: the `/proc` scans used to prove that no process of a run
//!   survives it;
//! - [`tree`]: the file-tree primitives (sealed-workspace check, link-safe
//!   copy and `/out` collection, removal) shared with the Kubernetes
//!   executor's staging volume.
//!
//! No `unsafe` anywhere: resource limits are applied by executing the sandbox
//! through util-linux `prlimit` (and `setpriv` for the per-run uid) instead of a
//! `pre_exec` hook.

pub mod bubblewrap;
pub mod conformance;
pub mod egress;
pub mod guest;
pub mod insecure;
pub mod procfs;
pub mod reach;
mod rundir;
mod supervise;
mod tools;
pub mod tree;

pub use bubblewrap::{BubblewrapConfig, BubblewrapExecutor, SandboxIdentity};
pub use conformance::{
    BackendIdentity, Capability, ConformanceCheck, ConformanceReport, ConformantExecutor,
    PROBE_MARKER_ENV, ProbeProcesses, SandboxBackend, run_broker_checks, run_conformance,
};
pub use egress::LocalEgress;
pub use insecure::{InsecureProcessExecutor, LocalExecutor};

/// The sentinel credential of jobsite-sandbox/v1 (§2.6): it must never reach a
/// sandbox. A run whose command or environment contains it is refused.
pub const BROKER_TOKEN_SENTINEL: &str = "PROTOBOT-SANDBOX-BROKER-TOKEN";

/// The contract version the conformance suite implements (the one audit events carry).
pub use protobot_jobsite::sandbox_audit::CONTRACT_VERSION;
