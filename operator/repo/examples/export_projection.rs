//! `protobot projection export` without the CLI's dependencies: one export, its report as JSON
//! on stdout. For measuring an export's memory and time with a release build of this crate
//! alone (`/usr/bin/time -v`), where building the whole `protobot` binary is too slow:
//!
//! ```text
//! cargo build --release -p protobot-repo --example export_projection
//! /usr/bin/time -v target/release/examples/export_projection REPO AT ROLE DEST
//! ```
//!
//! `ROLE` is spelled as for the CLI (`A`, `B`, `inspector`); the change scope is empty.

use std::{path::PathBuf, process::ExitCode};

use protobot_repo::{catalog::ChangeScope, role::Role, seams};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [repo, at, role, dest] = args.as_slice() else {
        eprintln!("usage: export_projection REPO AT ROLE DEST");
        return ExitCode::from(2);
    };
    let role: Role = match role.parse() {
        Ok(role) => role,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match seams::projection_export(
        &PathBuf::from(repo),
        at,
        role,
        &PathBuf::from(dest),
        ChangeScope::default(),
    ) {
        Ok(report) => match serde_json::to_string_pretty(&report) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("failed to print the report: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
