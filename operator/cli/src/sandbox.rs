//! `protobot sandbox …`:
//! - `conformance --profile local`: runs the jobsite-sandbox/v1 checks that apply
//!   to the local (bubblewrap) profile through the real executor and prints the
//!   ConformanceReport as JSON. Exits 0 only when the report passes; the Job Site
//!   refuses to run work on a profile whose report fails.
//! - `supervise --cpu-seconds N --processes N --file-size-bytes N --open-files N --
//!   CMD…`: the in-guest resource-limit supervisor ([`protobot_executors::guest`]):
//!   sets the rlimits on itself and execs the command; 125 when a limit cannot be
//!   set, 126/127 when the command cannot be executed or does not exist.
//! - `install-supervisor --to PATH`: copies this binary to `PATH` (mode 0755); the
//!   init container of a sandbox pod runs it to put the supervisor into the pod's
//!   `emptyDir`, with no shell or `cp` needed in the image.

use std::{ffi::OsString, path::PathBuf, process::ExitCode};

use clap::{Args, Subcommand};
use protobot_executors::{
    BubblewrapConfig, LocalExecutor,
    guest::{self, GuestLimits},
    run_conformance,
};

/// `protobot sandbox …`.
#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Check a sandbox profile against jobsite-sandbox/v1 and print the report.
    Conformance(ConformanceArgs),
    /// Set CPU-time, process, file-size and open-file limits on this process, then
    /// execute the command after `--` (the in-guest supervisor of sandbox pods).
    Supervise(SuperviseArgs),
    /// Copy this binary to a path (the sandbox pod's init container delivers the
    /// supervisor with it).
    InstallSupervisor(InstallArgs),
}

/// Arguments of `sandbox supervise`.
#[derive(Debug, Args)]
pub struct SuperviseArgs {
    /// CPU seconds (RLIMIT_CPU: SIGXCPU at N, SIGKILL at N+1).
    #[arg(long, value_name = "N")]
    pub cpu_seconds: Option<u64>,
    /// Processes of the sandbox user (RLIMIT_NPROC).
    #[arg(long, value_name = "N")]
    pub processes: Option<u64>,
    /// Largest file in bytes (RLIMIT_FSIZE).
    #[arg(long, value_name = "N")]
    pub file_size_bytes: Option<u64>,
    /// Open file descriptors (RLIMIT_NOFILE).
    #[arg(long, value_name = "N")]
    pub open_files: Option<u64>,
    /// The command and its arguments.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Arguments of `sandbox install-supervisor`.
#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Where to put the binary (its directory must exist, e.g. an emptyDir mount).
    #[arg(long, value_name = "PATH")]
    pub to: PathBuf,
}

/// Runs a `sandbox` subcommand.
pub fn run(command: SandboxCommand) -> ExitCode {
    match command {
        SandboxCommand::Conformance(args) => conformance(args),
        SandboxCommand::Supervise(args) => supervise(args),
        SandboxCommand::InstallSupervisor(args) => install_supervisor(args),
    }
}

/// `sandbox supervise`: returns only when the command did not run, or with its
/// status when the supervisor is PID 1.
pub fn supervise(args: SuperviseArgs) -> ExitCode {
    let limits = GuestLimits {
        cpu_seconds: args.cpu_seconds,
        processes: args.processes,
        file_size_bytes: args.file_size_bytes,
        open_files: args.open_files,
    };
    match guest::supervise(&limits, &args.command) {
        Ok(status) => ExitCode::from(status),
        Err(e) => {
            eprintln!("protobot sandbox supervise: {}", crate::one_line(&e));
            ExitCode::from(e.exit_code())
        }
    }
}

/// `sandbox install-supervisor`.
pub fn install_supervisor(args: InstallArgs) -> ExitCode {
    match guest::install_self(&args.to) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "protobot sandbox install-supervisor: {}",
                crate::one_line(&e)
            );
            ExitCode::from(1)
        }
    }
}

/// Arguments of `sandbox conformance`.
#[derive(Debug, Args)]
pub struct ConformanceArgs {
    /// The profile to check (`local` on one machine).
    #[arg(long, default_value = "local")]
    pub profile: String,
    /// Check the unsandboxed process executor used when bubblewrap is missing
    /// (it never passes; this shows why).
    #[arg(long)]
    pub insecure_no_sandbox: bool,
}

/// Runs the command.
pub fn conformance(args: ConformanceArgs) -> ExitCode {
    if args.profile != "local" {
        eprintln!(
            "protobot: unable to check profile `{}` here: only the local profile runs on this machine; cluster profiles are checked by the operator",
            args.profile
        );
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("protobot: failed to start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let executor = LocalExecutor::new(BubblewrapConfig::default(), args.insecure_no_sandbox);
    let report = runtime.block_on(run_conformance(&executor, &args.profile));
    let status = if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    };
    match serde_json::to_string_pretty(&report) {
        Ok(text) => crate::output::print_line_with(&text, status),
        Err(e) => {
            eprintln!("protobot: failed to encode the conformance report: {e}");
            ExitCode::from(1)
        }
    }
}
