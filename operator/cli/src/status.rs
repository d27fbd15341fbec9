//! `protobot status`: the work items of a single-machine work store, with
//! their lifecycle state, contract version and lease holder, and under an item
//! whose runs made model calls, the tokens and cost per stage (issue 34).

use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use protobot_stores::{AdapterConfig, ItemFilter, SqliteStore, WorkStore};

use crate::demo::Output;

/// Arguments of `protobot status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Which store and project.
    #[command(flatten)]
    pub store: StoreArgs,
    /// `human` (a table) or `json` (the records).
    #[arg(long, value_enum, default_value = "human")]
    pub output: Output,
}

/// The single-machine work store a reading command opens (`protobot status`, `protobot inbox`).
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Your clone, as `protobot run` takes it: the store is
    /// `<repo>/.git/protobot/wms.sqlite` and the project the one
    /// `.protobot/project.yaml` declares on the branch checked out (default:
    /// the current directory, unless `--store` is given).
    #[arg(long)]
    pub repo: Option<PathBuf>,
    /// The SQLite work store (the demo writes `<dir>/wms.sqlite`).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// The project the store serves (default with `--repo`: the repository's).
    #[arg(long)]
    pub project: Option<String>,
}

impl StoreArgs {
    /// The store and project: `--store`/`--project` as given, else derived from `--repo` (or
    /// the current directory).
    pub fn resolve(&self) -> Result<(PathBuf, String), String> {
        let args = self;
        let repo = args.repo.clone().unwrap_or_else(|| PathBuf::from("."));
        let store = match &args.store {
            Some(store) => store.clone(),
            None => repo.join(".git").join("protobot").join("wms.sqlite"),
        };
        if !store.is_file() {
            return Err(format!(
                "unable to read {}: no such work store (`protobot run --repo REPO …` creates it in REPO/.git/protobot; for a demo pass `--store DIR/wms.sqlite --project cli-sync`)",
                store.display()
            ));
        }
        let project = match &args.project {
            Some(project) => project.clone(),
            None => {
                let branch = git2::Repository::open(&repo)
                    .ok()
                    .and_then(|r| r.head().ok().and_then(|h| h.shorthand().ok().map(str::to_owned)))
                    .ok_or_else(|| {
                        format!(
                            "{} has no branch checked out to read the project id from: pass --project ID",
                            repo.display()
                        )
                    })?;
                crate::run::project_id_at(&repo, &branch)
                    .map_err(|e| format!("{e}; or pass --project ID"))?
            }
        };
        Ok((store, project))
    }
}

/// The work items of the store `args` names, sorted by id, with the store's path and project;
/// on failure the message is printed and the exit code returned (2: no such store, 1: it
/// could not be read).
pub(crate) fn read_items(
    args: &StoreArgs,
) -> Result<(PathBuf, String, Vec<protobot_lifecycle::WorkItemRecord>), ExitCode> {
    let (store_path, project) = args.resolve().map_err(|e| {
        eprintln!("protobot: {e}");
        ExitCode::from(2)
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("protobot: failed to start the async runtime: {e}");
            ExitCode::from(1)
        })?;
    let listed = runtime.block_on(async {
        let store = SqliteStore::open(&store_path, &project, AdapterConfig::default())?;
        store.list(&ItemFilter::default()).await
    });
    match listed {
        Ok(items) => Ok((store_path, project, items)),
        Err(e) => {
            eprintln!(
                "protobot: failed to read the work store {}: {e}",
                store_path.display()
            );
            Err(ExitCode::from(1))
        }
    }
}

/// Runs the command.
pub fn status(args: StatusArgs) -> ExitCode {
    let items = match read_items(&args.store) {
        Ok((_, _, items)) => items,
        Err(code) => return code,
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
        // A block reason outlives its block in the record; only a blocked item shows it.
        if r.state == protobot_lifecycle::State::Blocked && !r.block_reason.is_empty() {
            lines.push(format!("  blocked: {}", r.block_reason));
        }
        lines.extend(usage_lines(&r.usage));
    }
    lines.join("\n")
}

/// The item's model usage, one line per stage and the total (none before a model call).
pub(crate) fn usage_lines(ledger: &protobot_usage::UsageLedger) -> Vec<String> {
    if ledger.is_empty() {
        return Vec::new();
    }
    let summary = ledger.summary();
    summary
        .by_stage
        .iter()
        .map(|(stage, spend)| format!("  {:<12} {spend}", stage.as_str()))
        .chain(std::iter::once(format!(
            "  {:<12} {}",
            "total", summary.total
        )))
        .collect()
}

#[cfg(test)]
mod tests {
    use protobot_lifecycle::{State, WorkItemRecord};
    use protobot_usage::{RunSpend, Spend, Stage, TokenCounts};

    use super::*;

    #[test]
    fn an_item_that_spent_shows_tokens_and_cost_per_stage_and_one_that_did_not_shows_none() {
        let mut spent = WorkItemRecord::new("wi-1", "p", State::Completed, 9);
        for (run, stage, input, unpriced) in [
            ("wi-1-c1-a", Stage::WorkerA, 1200, 0),
            ("wi-1-c1-b", Stage::WorkerB, 800, 1),
        ] {
            spent.usage.record(RunSpend {
                run_id: run.into(),
                stage,
                tier: "t1".into(),
                spend: Spend {
                    calls: 2,
                    tokens: TokenCounts {
                        input,
                        output: 100,
                        ..TokenCounts::default()
                    },
                    cost_microdollars: input,
                    unpriced_calls: unpriced,
                    ..Spend::default()
                },
            });
        }
        let idle = WorkItemRecord::new("wi-2", "p", State::ReadyForBuilding, 1);
        let text = table(&[spent, idle]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + 1 + 3 + 1, "{text}");
        assert!(lines[2].starts_with("  worker-a"), "{text}");
        assert!(
            lines[2].contains("1200 tokens in") && lines[2].ends_with("$0.001200"),
            "{text}"
        );
        assert!(
            lines[3].starts_with("  worker-b") && lines[3].contains("cost unknown"),
            "{text}"
        );
        assert!(
            lines[4].starts_with("  total") && lines[4].contains("2000 tokens in"),
            "{text}"
        );
        assert!(
            lines[4].contains("cost unknown"),
            "one unpriced call makes the total unknown: {text}"
        );
        assert!(lines[5].starts_with("wi-2"), "{text}");
    }
}
