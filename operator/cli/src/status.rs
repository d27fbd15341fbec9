//! `protobot status`: the work items of a single-machine work store, with
//! their lifecycle state, contract version and lease holder.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use protobot_stores::{AdapterConfig, ItemFilter, SqliteStore, WorkStore};

/// Arguments of `protobot status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The SQLite work store (the demo writes `<dir>/wms.sqlite`).
    #[arg(long)]
    pub store: PathBuf,
    /// The project the store serves.
    #[arg(long)]
    pub project: String,
    /// Print the records as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
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
    if args.json {
        match serde_json::to_string_pretty(&items) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("protobot: failed to encode the work items: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        println!(
            "{:<32} {:<20} {:>7}  HOLDER",
            "WORK ITEM", "STATE", "VERSION"
        );
        for r in &items {
            let holder = r.lease.as_ref().map(|l| l.owner.as_str()).unwrap_or("-");
            println!(
                "{:<32} {:<20} {:>7}  {}",
                r.id,
                r.state.as_str(),
                r.contract_version,
                holder
            );
        }
    }
    ExitCode::SUCCESS
}
