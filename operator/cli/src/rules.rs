//! `protobot rules evaluate`: the lifecycle evaluator's inspection tool (wired by the lifecycle work).

use std::process::ExitCode;

/// Placeholder until the lifecycle work wires the evaluator: reports that the command is
/// unavailable and exits with status 2.
pub fn run_evaluate() -> ExitCode {
    eprintln!("rules evaluate is not available in this build");
    ExitCode::from(2)
}
