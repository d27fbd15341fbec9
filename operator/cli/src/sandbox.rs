//! `protobot sandbox conformance --profile local`: runs the jobsite-sandbox/v1
//! checks that apply to the local (bubblewrap) profile through the real
//! executor and prints the ConformanceReport as JSON. Exits 0 only when the
//! report passes; the Job Site refuses to run work on a profile whose report
//! fails.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use protobot_executors::{BubblewrapConfig, LocalExecutor, run_conformance};

/// `protobot sandbox …`.
#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Check a sandbox profile against jobsite-sandbox/v1 and print the report.
    Conformance(ConformanceArgs),
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
