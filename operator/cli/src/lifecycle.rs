//! `protobot retry` and `protobot abandon`: the ways out of `blocked`, both
//! through lifecycle commands evaluated by validation-rules/v1 (no internal
//! folder is ever edited by hand).
//!
//! - retry: you (the human maintainer at this machine) approve an
//!   `impact-amendment` resolution of the blocked item; the Drafting Table role
//!   submits it and the Materializer's `resolve-block` consumes it, which moves
//!   the item to `ready-for-building` under a new contract version. The Job
//!   Site's clone then restarts the work-item branch from the default branch
//!   as `origin` has it, so a fix there (a projection policy entry, a test
//!   catalog, a harness-facing file) is what the next cycle builds on, with a
//!   fresh cycle budget (the engine counts attempts since the block); the
//!   build then continues as `protobot run` does.
//! - abandon: the human maintainer's `abandon` (cancellation confirmed) ends
//!   the item as `abandoned`, not integrated; nothing is merged.

use std::{path::PathBuf, process::ExitCode};

use clap::Args;
use jiff::Timestamp;
// How long a context of `protobot abandon` is valid: as one of `protobot retry`.
use protobot_jobsite::resolution::CONTEXT_TTL;
use protobot_lifecycle::{AuthorizationContext, Grant, Role, State, WorkItemRecord};
use protobot_stores::{AdapterConfig, SqliteStore, WorkStore};

use crate::demo::Output;

/// The human at this machine, as approvals and audit events name them.
pub fn local_human() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .unwrap_or_default();
    let user = user.trim();
    if user.is_empty() {
        "local-maintainer".to_owned()
    } else {
        format!("local:{user}")
    }
}

/// Moves a blocked item to `ready-for-building` through a human-approved
/// `impact-amendment` resolution ([`protobot_jobsite::resolution::resolve_block`]); returns
/// the new contract version.
pub async fn resolve_block<S: WorkStore>(
    store: &S,
    project: &str,
    record: &WorkItemRecord,
    change_set: &str,
    human: &str,
    now: Timestamp,
) -> Result<u64, String> {
    protobot_jobsite::resolution::resolve_block(
        store,
        project,
        record,
        change_set,
        human,
        crate::wms::LOCAL_POLICY_VERSION,
        now,
    )
    .await
    .map_err(|e| {
        let mut text = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            text.push_str(&format!(": {c}"));
            cause = c.source();
        }
        text
    })
}

/// The human maintainer's `abandon` of one item. `integrated` is what Git
/// says: the merge that landed it on the default branch, if any. Abandon
/// needs the WMS to have observed `not-integrated` evidence; an item whose
/// merge landed is refused (`protobot run` records that merge instead).
pub async fn abandon_item<S: WorkStore>(
    store: &S,
    project: &str,
    record: &WorkItemRecord,
    human: &str,
    integrated: Option<String>,
    now: Timestamp,
) -> Result<u64, String> {
    let ctx = AuthorizationContext::new(Grant {
        project,
        role: Role::HumanMaintainer,
        subject: human,
        actions: &["abandon"],
        expires_at: Timestamp::now() + CONTEXT_TTL,
        policy_version: crate::wms::LOCAL_POLICY_VERSION,
    });
    protobot_stores::maintainer::abandon(store, &ctx, record, "protobot-abandon", integrated, now)
        .await
        .map_err(|e| match e {
            protobot_stores::maintainer::AbandonError::Integrated { work_item, merge } => format!(
                "work item {work_item} is already merged on the default branch ({merge}); `protobot run` records it as completed"
            ),
            other => other.to_string(),
        })
}

/// Arguments of `protobot abandon`.
#[derive(Debug, Args)]
pub struct AbandonArgs {
    /// The project's working clone `protobot run` built from.
    #[arg(long)]
    pub repo: PathBuf,
    /// The work item to abandon (as `protobot status` lists it).
    #[arg(long)]
    pub work_item: String,
    /// The SQLite work store (default: <repo>/.git/protobot/wms.sqlite).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// The default branch (where the project id is read).
    #[arg(long, default_value = "main")]
    pub default_branch: String,
    /// `human` or `json`.
    #[arg(long, value_enum, default_value = "human")]
    pub output: Output,
}

async fn abandon_inner(args: &AbandonArgs) -> Result<serde_json::Value, (u8, String)> {
    let repo = args
        .repo
        .canonicalize()
        .map_err(|e| (2, format!("repository {}: {e}", args.repo.display())))?;
    let store_path = args
        .store
        .clone()
        .unwrap_or_else(|| repo.join(".git").join("protobot").join("wms.sqlite"));
    if !store_path.exists() {
        return Err((
            2,
            format!(
                "no work store at {}: `protobot run` creates it (pass --store if you gave it one)",
                store_path.display()
            ),
        ));
    }
    let _lock = crate::run::lock(&store_path).map_err(|e| (2, e.to_string()))?;
    let project =
        crate::run::project_id_at(&repo, &args.default_branch).map_err(|e| (2, e.to_string()))?;
    let store = SqliteStore::open(
        &store_path,
        &project,
        AdapterConfig {
            materializer_subject: "materializer".into(),
            lease_seconds: 900,
        },
    )
    .map_err(|e| (1, e.to_string()))?;
    let record = store
        .get(&args.work_item)
        .await
        .map_err(|e| (1, e.to_string()))?
        .ok_or_else(|| {
            (
                2,
                format!(
                    "no work item {} in {}; `protobot status --store {} --project {project}` lists them",
                    args.work_item,
                    store_path.display(),
                    store_path.display()
                ),
            )
        })?;
    // Git's evidence: is the item's merge on origin's default branch?
    let clone = crate::clone::prepare(
        &repo,
        &store_path
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("clone"),
        &args.default_branch,
    )
    .map_err(|e| (1, e.to_string()))?;
    let integrated = git2::Repository::open(&clone.path)
        .map_err(|e| (1, format!("failed to open the Job Site's clone: {e}")))
        .and_then(|r| {
            protobot_repo::land::find_merge_by_trailer(&r, clone.origin_head, &record.id)
                .map_err(|e| (1, format!("failed to look for {}'s merge: {e}", record.id)))
        })?
        .map(|oid| oid.to_string());
    let version = abandon_item(
        &store,
        &project,
        &record,
        &local_human(),
        integrated,
        Timestamp::now(),
    )
    .await
    .map_err(|e| (1, e))?;
    // An abandoned item is never built again: what its cycles left goes (its trace stays).
    crate::run::remove_item_scratch(
        &store_path
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("scratch"),
        &record.id,
    );
    Ok(serde_json::json!({
        "work_item": record.id,
        "state": State::Abandoned,
        "previous_state": record.state,
        "contract_version": version,
    }))
}

/// Runs `protobot abandon`.
pub fn abandon(args: AbandonArgs) -> ExitCode {
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
    match runtime.block_on(abandon_inner(&args)) {
        Ok(report) => {
            let line = if args.output == Output::Json {
                report.to_string()
            } else {
                format!(
                    "work item {} is abandoned (was {}); nothing was merged",
                    report["work_item"].as_str().unwrap_or_default(),
                    report["previous_state"].as_str().unwrap_or("unknown")
                )
            };
            crate::output::print_line(&line)
        }
        Err((code, message)) => {
            eprintln!("protobot: {message}");
            ExitCode::from(code)
        }
    }
}
