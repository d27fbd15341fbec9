//! `protobot status`: the work items of a single-machine work store, with
//! their lifecycle state, contract version and lease holder.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use protobot_stores::{AdapterConfig, ItemFilter, SqliteStore, WorkStore};

use crate::demo::Output;

/// Arguments of `protobot status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The SQLite work store (the demo writes `<dir>/wms.sqlite`).
    #[arg(long)]
    pub store: PathBuf,
    /// The project the store serves.
    #[arg(long)]
    pub project: String,
    /// `human` (a table) or `json` (the records).
    #[arg(long, value_enum, default_value = "human")]
    pub output: Output,
}

/// Runs the command.
pub fn status(args: StatusArgs) -> ExitCode {
    if !args.store.is_file() {
        eprintln!(
            "protobot: unable to read {}: no such work store (run `protobot demo` or pass --store)",
            args.store.display()
        );
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("protobot: failed to start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let listed = runtime.block_on(async {
        let store = SqliteStore::open(&args.store, &args.project, AdapterConfig::default())?;
        store.list(&ItemFilter::default()).await
    });
    let items = match listed {
        Ok(items) => items,
        Err(e) => {
            eprintln!(
                "protobot: failed to read the work store {}: {e}",
                args.store.display()
            );
            return ExitCode::from(1);
        }
    };
    let text = if args.output == Output::Json {
        match serde_json::to_string_pretty(&items) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("protobot: failed to encode the work items: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        table(&items)
    };
    crate::output::print_line(&text)
}

/// The human table: one line per item, the block reason under a blocked one.
fn table(items: &[protobot_lifecycle::WorkItemRecord]) -> String {
    let mut lines = vec![format!(
        "{:<32} {:<20} {:>7}  HOLDER",
        "WORK ITEM", "STATE", "VERSION"
    )];
    for r in items {
        let holder = r.lease.as_ref().map(|l| l.owner.as_str()).unwrap_or("-");
        lines.push(format!(
            "{:<32} {:<20} {:>7}  {}",
            r.id,
            r.state.as_str(),
            r.contract_version,
            holder
        ));
        if !r.block_reason.is_empty() {
            lines.push(format!("  blocked: {}", r.block_reason));
        }
    }
    lines.join("\n")
}
