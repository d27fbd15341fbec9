//! `protobot sandbox …`:
//! - `conformance --profile local`: runs the jobsite-sandbox/v1 checks that apply
//!   to the local (bubblewrap) profile through the real executor and prints the
//!   ConformanceReport as JSON. Exits 0 only when the report passes; the Job Site
//!   refuses to run work on a profile whose report fails.
//! - `conformance --profile kata` (any cluster profile): checks the platform objects the
//!   profile's pods need, runs the same probes as pods of the profile in the cluster, prints
//!   the report and stores it in the profile's ConfigMap, where the operator watches it
//!   (the chart runs this as a Job on install and upgrade). Exits 0 when it passes, 1 when
//!   it fails or cannot be stored, 2 when nothing could be measured.
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
    /// The profile to check: `local` (bubblewrap on this machine), or a cluster profile
    /// (`kata`, `gvisor`, …), whose probes run as pods of the profile in the cluster
    /// KUBECONFIG (or the pod's service account) names.
    #[arg(long, default_value = "local")]
    pub profile: String,
    /// Check the unsandboxed process executor used when bubblewrap is missing
    /// (it never passes; this shows why). Local profile only.
    #[arg(long)]
    pub insecure_no_sandbox: bool,
    /// Cluster profiles: the profile document (default:
    /// /etc/protobot/sandbox-profiles/<profile>.yaml, where the chart mounts them).
    #[arg(long, value_name = "PATH")]
    pub profile_file: Option<PathBuf>,
    /// Cluster profiles: where the probe pods run, how they are staged and which egress proxy
    /// they reach, as for the operator's sandbox pods (the same flags as `protobot operator`).
    /// With --egress-proxy-url and --egress-session-secret, and a profile that allows egress,
    /// the credential-broker probes (SB-NET, SB-CRED) run as pods through the proxy, which must
    /// hold the probe rules (docs/egress-proxy.md); without them `credential-broker` is
    /// reported unsupported and the report fails closed.
    #[command(flatten)]
    pub sandbox: crate::operator::SandboxArgs,
    /// Cluster profiles: print the report only; do not store it in the profile's ConfigMap
    /// (the operator admits runs only on a stored passing report).
    #[arg(long)]
    pub no_store: bool,
    /// Cluster profiles: exit 0 once the report is measured and stored, passing or not (the
    /// chart's Job: a failing report refuses runs and shows on every Project's
    /// SandboxConformant condition; it does not fail the release).
    #[arg(long, conflicts_with = "no_store")]
    pub succeed_when_stored: bool,
}

/// Runs the command.
pub fn conformance(args: ConformanceArgs) -> ExitCode {
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
    let report = if args.profile == "local" {
        let executor = LocalExecutor::new(BubblewrapConfig::default(), args.insecure_no_sandbox);
        runtime.block_on(run_conformance(&executor, &args.profile))
    } else {
        if args.insecure_no_sandbox {
            eprintln!(
                "protobot: --insecure-no-sandbox applies to the local profile only; cluster profiles always run their probes as pods of the profile"
            );
            return ExitCode::from(2);
        }
        match runtime.block_on(cluster_conformance(&args)) {
            Ok(report) => report,
            Err(ClusterError { code, message }) => {
                eprintln!("protobot sandbox conformance: {message}");
                return ExitCode::from(code);
            }
        }
    };
    let stored = args.profile != "local" && !args.no_store;
    let status = if report.passed() || (stored && args.succeed_when_stored) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    };
    if stored && !report.passed() {
        eprintln!(
            "protobot sandbox conformance: profile {} does not pass{}: {}",
            args.profile,
            if stored { " (report stored)" } else { "" },
            report
                .fail_closed_reason
                .clone()
                .or_else(|| report.failure_reason())
                .unwrap_or_else(|| "a check failed".into())
        );
    }
    match serde_json::to_string_pretty(&report) {
        Ok(text) => crate::output::print_line_with(&text, status),
        Err(e) => {
            eprintln!("protobot: failed to encode the conformance report: {e}");
            ExitCode::from(1)
        }
    }
}

/// Why a cluster profile could not be measured or its report not stored.
struct ClusterError {
    /// Exit code: 2 when nothing ran (bad arguments, no profile, no cluster), 1 when the
    /// report could not be stored.
    code: u8,
    message: String,
}

fn refused(message: String) -> ClusterError {
    ClusterError { code: 2, message }
}

/// A cluster profile: the platform preflight and the suite's probes as pods of the profile,
/// then the report stored in the profile's ConfigMap (unless `--no-store`).
async fn cluster_conformance(
    args: &ConformanceArgs,
) -> Result<protobot_executors::ConformanceReport, ClusterError> {
    use protobot_kube_executor::{KubernetesExecutor, SandboxProfile, conformance};
    // Warnings (each 4xx from the API server names its verb and object) go to stderr; the
    // report alone goes to stdout.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .try_init();
    let path = args.profile_file.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "/etc/protobot/sandbox-profiles/{}.yaml",
            args.profile
        ))
    });
    let profile = SandboxProfile::load(&path).map_err(|e| refused(crate::one_line(&e)))?;
    if profile.name() != args.profile {
        return Err(refused(format!(
            "{} is profile {:?}, not {:?}: pass the document of profile {:?} with --profile-file",
            path.display(),
            profile.name(),
            args.profile,
            args.profile
        )));
    }
    let sink = protobot_controller::api_errors::ApiErrorSink::new();
    let client = protobot_controller::api_errors::infer_client(&sink)
        .await
        .map_err(|e| {
            refused(format!(
                "no cluster to measure profile {} in: {}; set KUBECONFIG, or run this as the chart's conformance Job",
                args.profile,
                crate::one_line(&e)
            ))
        })?;
    let mut config = args
        .sandbox
        .executor_config("conformance-collected")
        .await
        .map_err(|e| refused(crate::one_line(&e)))?;
    // Probe pods carry an instance of their own: an operator replica's garbage collection
    // never touches them, nor this one an operator's.
    config.instance = "conformance".into();
    let executor = KubernetesExecutor::for_conformance(client.clone(), config, profile)
        .map_err(|e| refused(crate::one_line(&e)))?;
    // Leftovers of an earlier measurement that was killed (its pods end at their deadline
    // anyway; this removes them and their staged directories now).
    if let Err(e) = executor.collect_garbage().await {
        tracing::warn!(error = %e, "could not collect the leftovers of an earlier measurement");
    }
    let report = conformance::measure(&client, &executor).await;
    if !args.no_store {
        conformance::store_report(&client, &executor, &report)
            .await
            .map_err(|e| ClusterError {
                code: 1,
                message: crate::one_line(&e),
            })?;
    }
    Ok(report)
}
