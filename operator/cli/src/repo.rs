//! `protobot projection export` and `protobot patch check`: the repository
//! machinery's seams (`protobot_repo::seams`). Each prints its report as JSON
//! on stdout; `patch check` exits 1 when the bundle is rejected (every
//! violation is listed in the report), and both exit 1 with one line on stderr
//! when they cannot run at all.

use std::{collections::BTreeSet, io::Write, path::PathBuf, process::ExitCode};

use clap::{Args, Subcommand};
use protobot_repo::{catalog::ChangeScope, role::Role, seams, validate::Limits};

/// `protobot projection …`.
#[derive(Debug, Subcommand)]
pub enum ProjectionCommand {
    /// Export a role projection of a commit into a new repository with a synthetic root commit.
    Export(ExportArgs),
}

/// Arguments of `projection export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The role: `A` (tests), `B` (implementation) or `inspector`.
    #[arg(long)]
    pub role: Role,
    /// The source commit (a full commit id or a ref of the source repository).
    #[arg(long)]
    pub at: String,
    /// Requirements the work item revises (their tests are quarantined); repeatable.
    #[arg(long = "revised", value_name = "REQ")]
    pub revised: Vec<String>,
    /// Requirements the work item retires; repeatable.
    #[arg(long = "retired", value_name = "REQ")]
    pub retired: Vec<String>,
    /// Internal control surfaces the work item changes; repeatable.
    #[arg(long = "changed-surface", value_name = "SURFACE")]
    pub changed_surfaces: Vec<String>,
    /// The canonical repository.
    pub repo: PathBuf,
    /// Where the new projection repository is created (must not exist or be empty).
    pub dest: PathBuf,
}

/// `protobot patch …`.
#[derive(Debug, Subcommand)]
pub enum PatchCommand {
    /// Validate a Worker's patch bundle against the projection it was produced in.
    Check(CheckArgs),
}

/// Arguments of `patch check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The role the projection was exported for: `A` or `B`.
    #[arg(long)]
    pub role: Role,
    /// The projection directory (its control-plane record sits beside it).
    #[arg(long)]
    pub projection: PathBuf,
    /// The bundle file (PatchBundle JSON).
    pub bundle: PathBuf,
}

fn print_json<T: serde::Serialize>(value: &T) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)
        .map_err(|e| format!("failed to write the report: {e}"))?;
    writeln!(out).map_err(|e| format!("failed to write the report: {e}"))
}

fn fail(context: &str, error: impl std::fmt::Display) -> ExitCode {
    eprintln!(
        "protobot: {context}: {}",
        error.to_string().replace('\n', " ")
    );
    ExitCode::from(1)
}

/// Runs `projection export`.
pub fn export(args: ExportArgs) -> ExitCode {
    let set = |v: Vec<String>| v.into_iter().collect::<BTreeSet<_>>();
    let scope = ChangeScope {
        revised: set(args.revised),
        retired: set(args.retired),
        changed_control_surfaces: set(args.changed_surfaces),
        build_base: None,
    };
    match seams::projection_export(&args.repo, &args.at, args.role, &args.dest, scope) {
        Ok(report) => match print_json(&report) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail("projection export", e),
        },
        Err(e) => fail("failed to export the projection", e),
    }
}

/// Runs `patch check`.
pub fn check(args: CheckArgs) -> ExitCode {
    match seams::patch_check(
        &args.bundle,
        &args.projection,
        args.role,
        &Limits::default(),
    ) {
        Ok(report) => {
            if let Err(e) = print_json(&report) {
                return fail("patch check", e);
            }
            if report.accepted {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => fail("unable to check the bundle", e),
    }
}
