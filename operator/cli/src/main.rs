//! The `protobot` command-line interface: parses the command line and hands each command
//! family to its own module (`crd` generates the CustomResourceDefinitions, `rules` runs the
//! lifecycle evaluator). Failures print one line on stderr and exit with status 1.

use std::{error::Error as StdError, process::ExitCode};

use clap::{Parser, Subcommand};

mod crd;
mod demo;
mod egress;
mod operator;
mod repo;
mod rules;
mod run;
mod sandbox;
mod status;

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
    /// Run the whole Job Site on one machine on a bundled example project, then print the report.
    Demo(demo::DemoArgs),
    /// Build an approved change set of your own repository with your worker harness, on one machine.
    Run(run::RunArgs),
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
    /// Sandbox profiles: check one against the jobsite-sandbox/v1 contract.
    Sandbox {
        #[command(subcommand)]
        command: sandbox::SandboxCommand,
    },
    /// Run the egress proxy and credential broker sandboxes reach the network through.
    EgressProxy(egress::EgressProxyArgs),
    /// Inspect the validation-rules/v1 lifecycle evaluator.
    Rules {
        #[command(subcommand)]
        command: RulesCommand,
    },
}

#[derive(Debug, Subcommand)]
enum RulesCommand {
    /// Evaluate one lifecycle command read as JSON from stdin and print the result.
    Evaluate,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => demo::demo(args),
        Command::Run(args) => run::run(args),
        Command::Status(args) => status::status(args),
        Command::Operator(args) => operator::operator(args),
        Command::EgressProxy(args) => egress::egress_proxy(args),
        Command::Crd { command } => {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            match crd::run(command, &mut out) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => fail(&error),
            }
        }
        Command::Rules {
            command: RulesCommand::Evaluate,
        } => rules::run_evaluate(),
        Command::Projection {
            command: repo::ProjectionCommand::Export(args),
        } => repo::export(args),
        Command::Patch {
            command: repo::PatchCommand::Check(args),
        } => repo::check(args),
        Command::Sandbox {
            command: sandbox::SandboxCommand::Conformance(args),
        } => sandbox::conformance(args),
    }
}

/// Prints `error` and its sources as one line on stderr and returns exit status 1.
fn fail(error: &dyn StdError) -> ExitCode {
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
    fn one_line_joins_the_source_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("failed to write crds/x.yaml")]
        struct Outer(#[source] io::Error);
        let error = Outer(io::Error::other("disk full"));
        assert_eq!(one_line(&error), "failed to write crds/x.yaml: disk full");
    }
}
