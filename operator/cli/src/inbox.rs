//! `protobot inbox`: everything on one machine's work store that waits on a person, each with
//! the one command that moves it on (issue 34, item 6).
//!
//! What waits: an item `blocked` on a spec question (the Job Site could not go on without a
//! decision) and an item whose model budget is spent (also `blocked`, with the budget's
//! question). Pure core: [`entries`] turns records into [`Entry`]s; the shell reads the store
//! and prints them.

use std::{
    fmt,
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::Args;
use protobot_lifecycle::{State, WorkItemRecord};
use serde::Serialize;

use crate::demo::Output;

/// Arguments of `protobot inbox` (the store and project as `protobot status` finds them).
#[derive(Debug, Args)]
pub struct InboxArgs {
    /// Which store and project.
    #[command(flatten)]
    pub store: crate::status::StoreArgs,
    /// `human` (one block per entry) or `json`.
    #[arg(long, value_enum, default_value = "human")]
    pub output: Output,
}

/// Why an entry waits on a person.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Waiting {
    /// A spec, impact or policy question.
    Question,
    /// The item's model budget is spent.
    Budget,
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Waiting::Question => "question",
            Waiting::Budget => "budget spent",
        })
    }
}

/// One thing waiting on a person.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// Why it waits.
    pub waiting: Waiting,
    /// The work item.
    pub work_item: String,
    /// What the person must decide (the block reason, as recorded).
    pub question: String,
    /// The command that moves it on once decided.
    pub next: String,
    /// The other way out.
    pub or: String,
}

/// Where the retry commands point: the user's clone and the harness it builds with.
#[derive(Clone, Debug)]
pub struct Commands {
    /// The clone (`--repo`).
    pub repo: PathBuf,
    /// The harness `protobot run` last used on this store, if known.
    pub harness: Option<PathBuf>,
}

/// What in `records` waits on a person, by item id.
pub fn entries(project: &str, records: &[WorkItemRecord], commands: &Commands) -> Vec<Entry> {
    let mut out: Vec<Entry> = records
        .iter()
        .filter(|r| r.state == State::Blocked)
        .map(|r| {
            let waiting = if protobot_usage::budget::is_budget_question(&r.block_reason) {
                Waiting::Budget
            } else {
                Waiting::Question
            };
            let repo = commands.repo.display();
            let harness = commands
                .harness
                .as_ref()
                .map_or_else(|| "HARNESS".to_owned(), |h| h.display().to_string());
            let target = match change_set_of(project, &r.materialization_key) {
                Some(cs) => format!("--change-set {cs}"),
                None => "--change-set CHANGE_SET".to_owned(),
            };
            let first = match waiting {
                Waiting::Budget => {
                    "raise the budget (--budget-per-item) or simplify the requirement"
                }
                Waiting::Question => "fix the cause on the default branch and push it",
            };
            Entry {
                waiting,
                work_item: r.id.clone(),
                question: if r.block_reason.is_empty() {
                    "(no reason recorded)".to_owned()
                } else {
                    r.block_reason.clone()
                },
                next: format!(
                    "{first}, then `protobot retry --repo {repo} {target} --harness {harness}`"
                ),
                or: format!("`protobot abandon --repo {repo} --work-item {}`", r.id),
            }
        })
        .collect();
    out.sort_by(|a, b| a.work_item.cmp(&b.work_item));
    out
}

/// The change set of an item of `project` materialized from one
/// ([`protobot_jobsite::site::parse_materialization_key`]).
fn change_set_of<'a>(project: &str, key: &'a str) -> Option<&'a str> {
    protobot_jobsite::site::parse_materialization_key(key)
        .filter(|(of, _, _)| *of == project)
        .map(|(_, change_set, _)| change_set)
}

/// The human text: one block per entry, or a line saying nothing waits.
pub fn text(entries: &[Entry]) -> String {
    if entries.is_empty() {
        return "nothing waits on a person".to_owned();
    }
    let mut lines = Vec::new();
    for e in entries {
        lines.push(format!("{}  [{}]", e.work_item, e.waiting));
        lines.push(format!("  {}", e.question));
        lines.push(format!("  next: {}", e.next));
        lines.push(format!("  or:   {}", e.or));
    }
    lines.join("\n")
}

/// The file beside the store where `protobot run` notes the harness it builds with.
fn harness_note(store: &Path) -> PathBuf {
    store.with_file_name("harness")
}

/// Notes `harness` beside `store` for the commands `protobot inbox` prints. Best effort: a
/// note that cannot be written leaves `HARNESS` in them.
pub fn remember_harness(store: &Path, harness: &Path) {
    if let Err(e) = std::fs::write(harness_note(store), harness.as_os_str().as_encoded_bytes()) {
        tracing::debug!(error = %e, "could not note the harness for protobot inbox");
    }
}

fn remembered_harness(store: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(harness_note(store)).ok()?;
    let path = PathBuf::from(text.trim());
    path.is_dir().then_some(path)
}

/// Runs the command.
pub fn inbox(args: InboxArgs) -> ExitCode {
    let (store_path, project, records) = match crate::status::read_items(&args.store) {
        Ok(read) => read,
        Err(code) => return code,
    };
    let repo = args
        .store
        .repo
        .clone()
        .unwrap_or_else(|| PathBuf::from("."));
    let commands = Commands {
        repo: std::path::absolute(&repo).unwrap_or(repo),
        harness: remembered_harness(&store_path),
    };
    let found = entries(&project, &records, &commands);
    let out = if args.output == Output::Json {
        match serde_json::to_string_pretty(&found) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("protobot: failed to encode the inbox: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        text(&found)
    };
    crate::output::print_line(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocked(id: &str, key: &str, reason: &str) -> WorkItemRecord {
        let mut r = WorkItemRecord::new(id, "shop", State::Blocked, 7);
        r.materialization_key = key.into();
        r.block_reason = reason.into();
        r
    }

    fn commands() -> Commands {
        Commands {
            repo: PathBuf::from("/home/u/shop"),
            harness: Some(PathBuf::from("/home/u/harness")),
        }
    }

    #[test]
    fn blocked_items_wait_with_the_command_that_moves_each_on() {
        let records = [
            WorkItemRecord::new("wi-a", "shop", State::Completed, 9),
            blocked(
                "wi-c",
                "shop/CS-00002@a876d589fa3bbde5c08b6cfff94945b02ca0ef0a",
                "the item's model budget of $0.5 (--budget-per-item) is spent: $0.510000 in 9 calls (worker-b $0.510000). Either …",
            ),
            blocked(
                "wi-b",
                "shop/CS-00001@0f0e6ba92cbbd4e2a1c2b1f0f3c6a7e0d1b2c3d4",
                "no passing candidate after 3 cycles",
            ),
            WorkItemRecord::new("wi-d", "shop", State::Building, 3),
        ];
        let found = entries("shop", &records, &commands());
        assert_eq!(
            found
                .iter()
                .map(|e| (e.work_item.as_str(), e.waiting))
                .collect::<Vec<_>>(),
            [("wi-b", Waiting::Question), ("wi-c", Waiting::Budget)]
        );
        assert_eq!(
            found[0].next,
            "fix the cause on the default branch and push it, then `protobot retry --repo /home/u/shop --change-set CS-00001 --harness /home/u/harness`"
        );
        assert!(
            found[1]
                .next
                .starts_with("raise the budget (--budget-per-item)"),
            "{found:?}"
        );
        assert!(found[1].next.contains("--change-set CS-00002"), "{found:?}");
        assert_eq!(
            found[1].or,
            "`protobot abandon --repo /home/u/shop --work-item wi-c`"
        );
        let human = text(&found);
        assert!(
            human.starts_with("wi-b  [question]\n  no passing candidate"),
            "{human}"
        );
        assert!(human.contains("wi-c  [budget spent]"), "{human}");
    }

    #[test]
    fn nothing_blocked_says_so_and_unknown_parts_are_named_not_guessed() {
        assert_eq!(
            text(&entries("shop", &[], &commands())),
            "nothing waits on a person"
        );
        let odd = [blocked("wi-x", "other/CS-1@abc", "")];
        let found = entries(
            "shop",
            &odd,
            &Commands {
                repo: PathBuf::from("/r"),
                harness: None,
            },
        );
        assert_eq!(found[0].question, "(no reason recorded)");
        assert!(
            found[0]
                .next
                .contains("--change-set CHANGE_SET --harness HARNESS"),
            "{found:?}"
        );
        for key in [
            "shop/CS 1@a",
            "shop/@a",
            "shop/CS-1",
            "shopx/CS-1@a",
            "shop/a/b@c",
        ] {
            assert_eq!(change_set_of("shop", key), None, "{key}");
        }
        assert_eq!(
            change_set_of(
                "shop",
                "shop/CS-00001@a876d589fa3bbde5c08b6cfff94945b02ca0ef0a"
            ),
            Some("CS-00001")
        );
    }
}
