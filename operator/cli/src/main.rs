//! The `protobot` command-line interface: parses the command line and hands each command
//! family to its own module (`crd` generates the CustomResourceDefinitions, `rules` runs the
//! lifecycle evaluator). Failures print one line on stderr and exit with status 1.

use std::{error::Error as StdError, process::ExitCode};

use clap::{Parser, Subcommand};

mod clone;
mod crd;
mod demo;
mod demo_agents;
mod egress;
mod eval;
mod harness;
mod inbox;
mod init;
mod lifecycle;
mod operator;
mod output;
mod repo;
mod rules;
mod run;
mod sandbox;
mod status;
mod telemetry;
mod wms;

/// protobot: the Job Site of ProtoBot as a Kubernetes operator.
#[derive(Debug, Parser)]
#[command(name = "protobot", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controllers against the cluster (in-cluster config or KUBECONFIG).
    Operator(operator::OperatorArgs),
    /// List the work items of a single-machine work store.
    Status(status::StatusArgs),
    /// What waits on a person in a single-machine work store (blocked questions, spent
    /// budgets), each with the command that moves it on.
    Inbox(inbox::InboxArgs),
    /// Run the whole Job Site on one machine on a bundled example project, then print the report.
    Demo(demo::DemoArgs),
    /// Run an evaluation-corpus fixture end to end and write its result records (result.schema.json v1).
    Eval(eval::EvalArgs),
    /// Build an approved change set of your own repository with your worker harness, on one machine.
    Run(run::RunArgs),
    /// Move a blocked work item on after fixing its cause on the default branch, then build it (same arguments as `run`).
    Retry(run::RunArgs),
    /// Abandon a work item (blocked or not yet merged): it ends `abandoned`, nothing is merged.
    Abandon(lifecycle::AbandonArgs),
    /// Prepare a repository for the Job Site: projection policy, test catalog and the docs ears-manager needs.
    Init(init::InitArgs),
    /// Generate the CustomResourceDefinitions of protobot.dev from the Rust types.
    Crd {
        #[command(subcommand)]
        command: crd::CrdCommand,
    },
    /// Role projections of a repository (deny-by-default views for Workers and Inspectors).
    Projection {
        #[command(subcommand)]
        command: repo::ProjectionCommand,
    },
    /// Validate Worker patch bundles before anything touches the integration repository.
    Patch {
        #[command(subcommand)]
        command: repo::PatchCommand,
    },
    /// Sandbox profiles: check one against the jobsite-sandbox/v1 contract; the in-guest
    /// resource-limit supervisor.
    Sandbox {
        #[command(subcommand)]
        command: sandbox::SandboxCommand,
    },
    /// Run the egress proxy and credential broker sandboxes reach the network through.
    EgressProxy(egress::EgressProxyArgs),
    /// Call the WMS Adapter API: one JSON operation envelope (or store read) in, one answer out.
    Wms(wms::WmsArgs),
    /// Inspect the validation-rules/v1 lifecycle evaluator.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
}

#[derive(Debug, Subcommand)]
enum RulesCommand {
    /// Evaluate one lifecycle command read as JSON from stdin and print the result.
    Evaluate {
        /// Also print the audit events the command produces (`"audit": {"count", "events"}`,
        /// each with its subject and authorized human subject).
        #[arg(long)]
        with_audit: bool,
    },
}

/// Invoked as `ears-manager` (a link to this binary): the spec store CLI,
/// exactly as the `ears-manager` binary of protobot-spec runs it. One
/// installed binary then gives both commands.
fn ears_manager() -> ExitCode {
    use std::io::Write;
    // Raw arguments: one that is not UTF-8 gets the usage envelope, not a panic.
    let raw: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let args: Vec<String> = raw
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let not_utf8 = raw.iter().position(|a| a.to_str().is_none());
    let cwd = std::env::current_dir().unwrap_or_else(|_| std::path::PathBuf::from("."));
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        if let Some(index) = not_utf8 {
            return protobot_spec::cli::non_utf8_argument(&args, index);
        }
        let mut stdin = std::io::stdin();
        let mut env = protobot_spec::cli::Env {
            cwd: &cwd,
            stdin: &mut stdin,
            faults: Default::default(),
        };
        protobot_spec::cli::run(&args, &mut env)
    }))
    .unwrap_or_else(|_| protobot_spec::cli::internal_failure(&args));
    let _ = std::io::stdout().write_all(ran.stdout.as_bytes());
    let _ = std::io::stderr().write_all(ran.stderr.as_bytes());
    ExitCode::from(u8::try_from(ran.status).unwrap_or(70))
}

fn main() -> ExitCode {
    let invoked_as = std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()));
    if invoked_as.as_deref() == Some("ears-manager") {
        return ears_manager();
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => with_telemetry(|| demo::demo(args)),
        Command::Eval(args) => with_telemetry(|| eval::eval(args)),
        Command::Run(args) => with_telemetry(|| run::run(args, run::Mode::Run)),
        Command::Retry(args) => with_telemetry(|| run::run(args, run::Mode::Retry)),
        Command::Abandon(args) => lifecycle::abandon(args),
        Command::Init(args) => init::init(args),
        Command::Status(args) => status::status(args),
        Command::Inbox(args) => inbox::inbox(args),
        Command::Operator(args) => operator::operator(args),
        Command::EgressProxy(args) => egress::egress_proxy(args),
        Command::Wms(args) => wms::wms(args),
        Command::Crd { command } => {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            match crd::run(command, &mut out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => fail(&error),
            }
        }
        Command::Rules {
            command: RulesCommand::Evaluate { with_audit },
        } => rules::run_evaluate(with_audit),
        Command::Projection {
            command: repo::ProjectionCommand::Export(args),
        } => repo::export(args),
        Command::Patch {
            command: repo::PatchCommand::Check(args),
        } => repo::check(args),
        Command::Sandbox { command } => sandbox::run(command),
    }
}

/// Runs a single-machine build command under its tracing subscriber: the egress decisions its
/// result records use, and OTLP export when `OTEL_EXPORTER_OTLP_*` asks for it (docs/tracing.md),
/// flushed before the process exits.
fn with_telemetry(command: impl FnOnce() -> ExitCode) -> ExitCode {
    let telemetry = telemetry::init_command(eval::EgressAudit::global().layer());
    let code = command();
    telemetry.shutdown();
    code
}

/// Whether `error` (or a source of it) is a closed pipe on stdout: the reader
/// (`| head`) has what it wanted, so the command ends quietly.
fn is_broken_pipe(error: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return true;
        }
        current = e.source();
    }
    false
}

/// Prints `error` and its sources as one line on stderr and returns exit
/// status 1 (0, silently, for a closed pipe).
fn fail(error: &(dyn StdError + 'static)) -> ExitCode {
    if is_broken_pipe(error) {
        return ExitCode::SUCCESS;
    }
    eprintln!("protobot: {}", one_line(error));
    ExitCode::from(1)
}

/// `error: source: source …` on one line.
fn one_line(error: &dyn StdError) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use std::io;

    use clap::CommandFactory;

    use super::*;

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_closed_pipe_anywhere_in_the_chain_is_quiet_and_other_errors_are_not() {
        #[derive(Debug, thiserror::Error)]
        #[error("failed to write to stdout")]
        struct Outer(#[source] io::Error);
        assert!(is_broken_pipe(&Outer(io::Error::from(
            io::ErrorKind::BrokenPipe
        ))));
        assert!(!is_broken_pipe(&Outer(io::Error::other("disk full"))));
        assert_eq!(
            fail(&Outer(io::Error::from(io::ErrorKind::BrokenPipe))),
            ExitCode::SUCCESS
        );
    }

    #[test]
    fn one_line_joins_the_source_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("failed to write crds/x.yaml")]
        struct Outer(#[source] io::Error);
        let error = Outer(io::Error::other("disk full"));
        assert_eq!(one_line(&error), "failed to write crds/x.yaml: disk full");
    }
}
