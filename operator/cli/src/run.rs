//! `protobot run`: the Job Site on one machine for your own project — an
//! approved change set in your repository, built by your worker harness.
//!
//! A true bug enters the same way with `--bug <id> --violates <REQ,…>`: no
//! change set, the violated requirements judged at the default branch's head,
//! `change_type: contradicts`; its facts are recorded next to the store so a
//! rerun rebuilds the same contract.
//!
//! The repository is a working clone whose `origin` is where the merge lands
//! (a bare repository or a remote the machine can push to). The Job Site
//! builds in a private clone next to the work store (`crate::clone`), never in
//! yours: your checked-out branch and work tree are left as they are, its
//! `int/` and `wi/` branches stay out of your branch namespace, and after the
//! run only your `origin/<branch>` tracking ref moves (`git pull --ff-only`
//! brings the merge in). The change set must be approved on `origin`. The harness
//! directory holds `worker-a.sh`, `worker-b.sh` and `integration.sh` (and
//! optionally `inspector.sh`), each run with `sh -c` inside the bubblewrap
//! sandbox under the execution contract of `docs/worker-harnesses.md`. State
//! lives in a SQLite work store (default `<repo>/.git/protobot/wms.sqlite`), so
//! a rerun after a crash or a kill resumes where the store says; one Job Site
//! runs per store at a time.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
};

use clap::Args;
use jiff::{SignedDuration, Timestamp};
use protobot_executors::LocalExecutor;
use protobot_jobsite::{
    contract::{Intake, build},
    engine::{Engine, EngineConfig, Producer, WorkerClass},
    inspection::ProducerKind,
    intake::IntakeFiles,
    lease::SystemClock,
    materializer::{BugIntake, Registration, read_bug_facts, read_facts},
    site::{JobSite, RegisteredContracts, SiteAction},
    triage::HeuristicTriage,
};
use protobot_lifecycle::{AuthorizationContext, Grant, Role, State};
use protobot_stores::{AdapterConfig, SqliteStore, WorkStore};

use crate::demo::Output;

/// Arguments of `protobot run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The project's working clone (its `origin` receives the merge).
    #[arg(long)]
    pub repo: PathBuf,
    /// The approved change set, e.g. `CS-00042`.
    #[arg(long, required_unless_present = "bug", conflicts_with = "bug")]
    pub change_set: Option<String>,
    /// A true bug instead of a change set: its tracker id, e.g. `GH-17`. It is
    /// judged against the head of the default branch when first registered;
    /// later runs with the same id resume that registration.
    #[arg(long, requires = "violates")]
    pub bug: Option<String>,
    /// With `--bug`: the requirement ids the current behaviour violates.
    #[arg(long, value_delimiter = ',', requires = "bug")]
    pub violates: Vec<String>,
    /// With `--bug`: the scopes where the bug shows.
    #[arg(long, value_delimiter = ',', requires = "bug")]
    pub scope: Vec<String>,
    /// Business priority of the work item: low, normal, high or urgent.
    #[arg(long, default_value = "normal", value_parser = ["low", "normal", "high", "urgent"])]
    pub priority: String,
    /// The change set's merge commit on the default branch (verified; default: found).
    #[arg(long)]
    pub merge_commit: Option<String>,
    /// Directory with worker-a.sh, worker-b.sh, integration.sh [and inspector.sh].
    #[arg(long)]
    pub harness: PathBuf,
    /// The SQLite work store (default: <repo>/.git/protobot/wms.sqlite).
    #[arg(long)]
    pub store: Option<PathBuf>,
    /// The default branch.
    #[arg(long, default_value = "main")]
    pub default_branch: String,
    /// Run the harness without a sandbox when bubblewrap is missing (logged loudly).
    #[arg(long)]
    pub insecure_no_sandbox: bool,
    /// `human` or `json`.
    #[arg(long, value_enum, default_value = "human")]
    pub output: Output,
}

/// `protobot run` or `protobot retry` (a run that first moves a blocked item
/// on through `crate::lifecycle::resolve_block`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Build, or resume, the item.
    Run,
    /// Resolve the item's block, then build it.
    Retry,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum RunError {
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Failed(String),
}

/// A harness script as a worker class: run by its path (the harness directory
/// is mounted read-only at the same path), under its `#!` interpreter or `sh`
/// (`crate::harness::script_command`).
fn read_harness(dir: &Path, name: &str, run_at: &Path) -> Result<Option<WorkerClass>, RunError> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(script) => Ok(Some(WorkerClass {
            command: crate::harness::script_command(&run_at.join(name), &script),
            image: None,
            egress: false,
            tiers: Default::default(),
            prices: Default::default(),
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RunError::Input(format!(
            "cannot read the harness script {}: {e}",
            path.display()
        ))),
    }
}

fn required(dir: &Path, name: &str, run_at: &Path) -> Result<WorkerClass, RunError> {
    read_harness(dir, name, run_at)?.ok_or_else(|| {
        RunError::Input(format!(
            "the harness directory {} has no {name}; see docs/worker-harnesses.md",
            dir.display()
        ))
    })
}

/// The project id the spec store declares on the default branch.
pub(crate) fn project_id_at(repo: &Path, branch: &str) -> Result<String, RunError> {
    let bad = |what: String| {
        RunError::Input(format!(
            "{} is not a protobot project on {branch}: {what}",
            repo.display()
        ))
    };
    let git = protobot_spec::git::Git::discover(repo).map_err(|f| bad(f.message))?;
    let head = git2::Repository::open(repo)
        .and_then(|r| r.refname_to_id(&format!("refs/heads/{branch}")))
        .map_err(|e| bad(e.to_string()))?;
    let vfs = git.commit_vfs(head).map_err(|f| bad(f.message))?;
    let snapshot = protobot_spec::snapshot::open(vfs).map_err(|f| bad(f.message))?;
    snapshot
        .project
        .project
        .map(|p| p.id)
        .filter(|id| !id.is_empty())
        .ok_or_else(|| bad("project.yaml has no project id".into()))
}

/// Locks the work store's directory itself (flock on the directory), so no
/// lock file is left behind; released when the returned handle drops.
pub(crate) fn lock(store: &Path) -> Result<std::fs::File, RunError> {
    let dir = store.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .map_err(|e| RunError::Input(format!("cannot create {}: {e}", dir.display())))?;
    let file = std::fs::File::open(dir)
        .map_err(|e| RunError::Input(format!("cannot lock {}: {e}", dir.display())))?;
    file.try_lock().map_err(|_| {
        RunError::Input(format!(
            "another protobot process is running on the work store in {}",
            dir.display()
        ))
    })?;
    Ok(file)
}

async fn run_inner(args: &RunArgs, mode: Mode) -> Result<serde_json::Value, RunError> {
    // Scripts run by their path, mounted at the same place: an absolute one.
    let harness = args.harness.canonicalize().map_err(|e| {
        RunError::Input(format!(
            "the harness directory {}: {e}; see docs/worker-harnesses.md",
            args.harness.display()
        ))
    })?;
    let repo = args
        .repo
        .canonicalize()
        .map_err(|e| RunError::Input(format!("repository {}: {e}", args.repo.display())))?;
    let store_path = args
        .store
        .clone()
        .unwrap_or_else(|| repo.join(".git").join("protobot").join("wms.sqlite"));
    let control_plane = std::path::absolute(store_path.parent().unwrap_or(Path::new(".")))
        .unwrap_or_else(|_| store_path.clone());
    let needs = match std::fs::read_to_string(harness.join("sandbox")) {
        Ok(text) => crate::harness::parse_sandbox(&text, &control_plane)
            .map_err(|e| RunError::Input(format!("{}: {e}", harness.join("sandbox").display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Default::default(),
        Err(e) => {
            return Err(RunError::Input(format!(
                "cannot read {}: {e}",
                harness.join("sandbox").display()
            )));
        }
    };
    for path in &needs.paths {
        if !path.is_dir() {
            return Err(RunError::Input(format!(
                "{}: `path {}` is not a directory on this machine; fix the line or create it",
                harness.join("sandbox").display(),
                path.display()
            )));
        }
    }
    if control_plane.starts_with(&harness) {
        return Err(RunError::Input(format!(
            "the harness directory {} holds the work store {}: keep the harness outside the repository's .git",
            harness.display(),
            control_plane.display()
        )));
    }
    let scratch = store_path
        .parent()
        .unwrap_or(Path::new("."))
        .join("scratch");
    // Before any work: the sandbox's uid must reach where runs are staged.
    let (sandbox_config, note) =
        crate::demo::sandbox_config(&scratch.join("sandbox"), args.insecure_no_sandbox)
            .map_err(RunError::Input)?;
    if args.output == Output::Human
        && let Some(note) = &note
    {
        eprintln!("protobot: note: {note}");
    }
    // One protobot process per work store from here on: the staged harness and the
    // store are this run's.
    let _lock = lock(&store_path)?;
    // The scripts run from a read-only copy of the harness staged beside the
    // runs, where the sandbox's uid can reach it (a harness under a private
    // home would be out of its reach); toolchain paths cannot be copied, so
    // they must be reachable themselves.
    let staged = sandbox_config.scratch_root.join(".harness");
    for name in ["worker-a.sh", "worker-b.sh", "integration.sh"] {
        if !harness.join(name).is_file() {
            return Err(RunError::Input(format!(
                "the harness directory {} has no {name}; see docs/worker-harnesses.md",
                harness.display()
            )));
        }
    }
    let worker_a = required(&harness, "worker-a.sh", &staged)?;
    let worker_b = required(&harness, "worker-b.sh", &staged)?;
    let integration = required(&harness, "integration.sh", &staged)?;
    let inspector = read_harness(&harness, "inspector.sh", &staged)?;
    if !args.insecure_no_sandbox && protobot_executors::reach::per_run_uid_applies() {
        for path in &needs.paths {
            protobot_executors::reach::check_reachable(path).map_err(|e| {
                RunError::Input(format!(
                    "{}: `path {}`: {e}",
                    harness.join("sandbox").display(),
                    path.display()
                ))
            })?;
        }
    }
    crate::harness::stage(&harness, &staged).map_err(|e| {
        RunError::Failed(format!(
            "failed to stage the harness {} at {}: {e}",
            harness.display(),
            staged.display()
        ))
    })?;
    let user_clone = repo;
    let prepared = crate::clone::prepare(
        &user_clone,
        &store_path.parent().unwrap_or(Path::new(".")).join("clone"),
        &args.default_branch,
    )
    .map_err(|e| match e {
        crate::clone::CloneError::Git { .. } => RunError::Failed(e.to_string()),
        _ => RunError::Input(e.to_string()),
    })?;
    let repo = prepared.path.clone();
    let unpushed_hint = |message: String| {
        if prepared.local_differs {
            format!(
                "{message} (protobot builds what origin has, and your local {branch} differs from origin/{branch}: push the approval first with `git push origin {branch}`)",
                branch = args.default_branch
            )
        } else {
            message
        }
    };
    // The project id is the one the repository's spec store declares.
    let project_id = project_id_at(&repo, &args.default_branch)
        .map_err(|e| RunError::Input(unpushed_hint(e.to_string())))?;
    let intakes = IntakeFiles::new(
        store_path
            .parent()
            .unwrap_or(Path::new("."))
            .join("intakes"),
    );
    let contract = match (&args.change_set, &args.bug) {
        (Some(change_set), _) => {
            let registration = Registration {
                project_id: project_id.clone(),
                change_set_id: change_set.clone(),
                merge_commit: args.merge_commit.clone(),
                default_branch: args.default_branch.clone(),
                depends_on: vec![],
                priority: args.priority.clone(),
            };
            let facts = read_facts(&repo, &registration)
                .map_err(|e| RunError::Input(unpushed_hint(e.to_string())))?;
            // Checked before anything is registered: an approved change set whose impact
            // assessment is not reviewed would only ever block.
            if let Some(refusal) = impact_refusal(&facts, &args.default_branch) {
                return Err(RunError::Input(refusal));
            }
            build(&Intake::ChangeSet(facts)).map_err(|e| RunError::Input(e.to_string()))?
        }
        (None, Some(bug)) => {
            let sorted = |v: &[String]| -> Vec<String> {
                let set: std::collections::BTreeSet<String> =
                    v.iter().map(|s| s.trim().to_string()).collect();
                set.into_iter().filter(|s| !s.is_empty()).collect()
            };
            let (violates, scopes) = (sorted(&args.violates), sorted(&args.scope));
            // A bug is registered once: a later run resumes the first registration.
            let facts = match intakes
                .find(&project_id, bug)
                .map_err(|e| RunError::Failed(e.to_string()))?
            {
                Some(f)
                    if sorted(&f.violated_requirement_ids) == violates
                        && sorted(&f.scopes) == scopes =>
                {
                    f
                }
                Some(f) => {
                    return Err(RunError::Input(format!(
                        "bug {bug} was registered at {} violating {} (scopes: {}); a report with other requirements or scopes needs another bug id",
                        f.spec_commit,
                        f.violated_requirement_ids.join(","),
                        if f.scopes.is_empty() {
                            "none".to_owned()
                        } else {
                            f.scopes.join(",")
                        }
                    )));
                }
                None => read_bug_facts(
                    &repo,
                    &BugIntake {
                        project_id: project_id.clone(),
                        bug_id: bug.clone(),
                        violated_requirement_ids: violates,
                        scopes,
                        default_branch: args.default_branch.clone(),
                        priority: args.priority.clone(),
                    },
                )
                .map_err(|e| RunError::Input(e.to_string()))?,
            };
            // Recorded before materializing, so a restart can rebuild the contract.
            intakes.record(&facts).map_err(|e| match e {
                protobot_jobsite::intake::IntakeError::Io { .. } => RunError::Failed(e.to_string()),
                _ => RunError::Input(e.to_string()),
            })?
        }
        (None, None) => {
            return Err(RunError::Input(
                "name a --change-set or a --bug to build".into(),
            ));
        }
    };
    let store = Arc::new(
        SqliteStore::open(
            &store_path,
            &project_id,
            AdapterConfig {
                materializer_subject: "materializer".into(),
                lease_seconds: 900,
            },
        )
        .map_err(|e| RunError::Failed(e.to_string()))?,
    );
    // `protobot inbox` prints the retry command with the harness this clone builds with.
    crate::inbox::remember_harness(&store_path, &harness);
    // Every context of the run: its project, the local policy, twelve hours.
    let grant = Grant {
        project: &project_id,
        role: Role::Materializer,
        subject: "materializer",
        actions: &["materialize"],
        expires_at: Timestamp::now() + SignedDuration::from_hours(12),
        policy_version: crate::wms::LOCAL_POLICY_VERSION,
    };
    let materializer = AuthorizationContext::new(grant);
    let result = store
        .execute(
            Some(&materializer),
            &contract.materialize_envelope(&project_id, "materializer"),
            Timestamp::now(),
        )
        .await
        .map_err(|e| RunError::Failed(e.to_string()))?;
    if !result.ok {
        return Err(RunError::Failed(format!(
            "materialize was rejected: {}",
            result.code().map(|c| c.as_str()).unwrap_or("unknown")
        )));
    }
    let mut retried = None;
    if mode == Mode::Retry {
        let record = store
            .get(&contract.work_item_id)
            .await
            .map_err(|e| RunError::Failed(e.to_string()))?
            .ok_or_else(|| {
                RunError::Failed(format!("work item {} vanished", contract.work_item_id))
            })?;
        let Some(change_set) = args.change_set.as_deref() else {
            return Err(RunError::Input(format!(
                "retry resolves a change set's block; a bug's item ({}) can only be abandoned: `protobot abandon --repo {} --work-item {}`, then report the bug under a new id",
                record.id,
                user_clone.display(),
                record.id
            )));
        };
        let version = crate::lifecycle::resolve_block(
            store.as_ref(),
            &project_id,
            &record,
            change_set,
            &crate::lifecycle::local_human(),
            Timestamp::now(),
        )
        .await
        .map_err(RunError::Input)?;
        // The next cycle starts afresh from the default branch as origin has
        // it now: the blocked attempts' commits are dropped from the
        // work-item branch (internal to the Job Site's clone; nothing of it
        // was merged), so a fix there is what the Workers see.
        let wi = protobot_repo::integrate::WorkItemRef {
            id: record.id.clone(),
            slug: "build".into(),
        };
        git2::Repository::open(&repo)
            .and_then(|clone| {
                clone
                    .reference(
                        &wi.branch_ref(),
                        prepared.origin_head,
                        true,
                        "protobot retry: restart from the default branch",
                    )
                    .map(|_| ())
            })
            .map_err(|e| {
                RunError::Failed(format!(
                    "failed to restart {} from origin/{}: {e}",
                    wi.branch_ref(),
                    args.default_branch
                ))
            })?;
        if args.output == Output::Human {
            eprintln!(
                "  ▸ retry: {} resolved (contract version {version}); building on origin/{} at {}",
                record.id,
                args.default_branch,
                &prepared.origin_head.to_string()[..12]
            );
        }
        retried = Some(version);
    }
    let mut config = EngineConfig::new(worker_a, worker_b, integration, scratch.clone());
    config.target_branch = args.default_branch.clone();
    let inspected = inspector.is_some();
    if let Some(class) = inspector {
        config.producers = vec![Producer {
            name: "inspector".into(),
            kind: ProducerKind::Inspector,
            class,
        }];
    } else if args.output == Output::Human {
        eprintln!(
            "protobot: warning: {} has no inspector.sh: an item is inspected by no one before it merges (its Inspection Run seals with zero producers and zero findings)",
            harness.display()
        );
    }
    let mut sandbox_config = sandbox_config;
    sandbox_config.extra_ro_binds.push(staged.clone());
    sandbox_config
        .extra_ro_binds
        .extend(needs.paths.iter().cloned());
    let executor = LocalExecutor::new(sandbox_config, args.insecure_no_sandbox);
    // Before the first cycle: what the integration needs exists in the sandbox.
    preflight(
        &executor,
        &crate::harness::required_commands(&config.integration.command, &needs),
        &scratch,
        &harness,
    )
    .await?;
    let human = args.output == Output::Human;
    let engine = Engine {
        store: store.clone(),
        executor: Arc::new(executor),
        clock: Arc::new(SystemClock),
        triage: Arc::new(HeuristicTriage),
        context: AuthorizationContext::new(Grant {
            role: Role::JobSite,
            subject: "job-site-local",
            actions: protobot_jobsite::site::JOB_SITE_ACTIONS,
            expires_at: Timestamp::now() + SignedDuration::from_hours(12),
            ..grant
        }),
        config,
        on_stage: Some(Arc::new(move |s: &str| {
            if human {
                eprintln!("  ▸ {s}");
            }
        })),
        faults: None,
        stop: None,
        usage: None,
    };
    let site = JobSite {
        engine: Arc::new(engine),
        reconciler: AuthorizationContext::new(Grant {
            role: Role::Reconciler,
            subject: "reconciler-local",
            actions: protobot_jobsite::site::RECONCILER_ACTIONS,
            expires_at: Timestamp::now() + SignedDuration::from_hours(12),
            ..grant
        }),
        contracts: Arc::new(
            RegisteredContracts::new(repo.clone(), &args.default_branch).with_bug_intakes(intakes),
        ),
        repo_dir: repo,
        wip_limit: 1,
        materializer: Some(AuthorizationContext::new(Grant {
            actions: protobot_jobsite::site::REFRESH_ACTIONS,
            expires_at: Timestamp::now() + SignedDuration::from_hours(12),
            ..grant
        })),
        capacity: None,
    };
    let actions = site
        .run_until_idle()
        .await
        .map_err(|e| RunError::Failed(e.to_string()))?;
    for a in &actions {
        if let SiteAction::Failed {
            work_item_id,
            error,
        }
        | SiteAction::MergeUnverified {
            work_item_id,
            error,
        } = a
        {
            let state = store
                .get(work_item_id)
                .await
                .ok()
                .flatten()
                .map_or_else(|| "unknown".to_owned(), |r| r.state.to_string());
            return Err(RunError::Failed(stopped_message(
                error,
                work_item_id,
                &state,
                &scratch.join("traces").join(format!("{work_item_id}.jsonl")),
                args,
                &user_clone,
            )));
        }
    }
    let record = store
        .get(&contract.work_item_id)
        .await
        .map_err(|e| RunError::Failed(e.to_string()))?;
    if let Some(r) = &record
        && matches!(r.state, State::Completed | State::Abandoned)
    {
        remove_item_scratch(&scratch, &r.id);
    }
    let built = actions.iter().find_map(|a| match a {
        SiteAction::Built { report } => Some(report.clone()),
        _ => None,
    });
    // Your clone: only its remote-tracking ref moves, as `git fetch` would.
    let tracking = crate::clone::sync_tracking_ref(&user_clone, &args.default_branch)
        .map(|oid| oid.to_string())
        .map_err(|e| {
            tracing::warn!(
                "failed to update origin/{} in your clone: {e}",
                args.default_branch
            )
        })
        .ok();
    Ok(serde_json::json!({
        "project": project_id,
        "change_set": args.change_set,
        "bug": args.bug,
        "change_type": contract.change_type,
        "work_item": contract.work_item_id,
        "state": record.as_ref().map(|r| r.state),
        "contract_version": record.as_ref().map(|r| r.contract_version),
        "attempts": record.as_ref().map(|r| r.attempts.clone()).unwrap_or_default(),
        "block_reason": record.as_ref().map(|r| r.block_reason.clone()).filter(|b| !b.is_empty()),
        "merge_commit": built.as_ref().and_then(|b| b.merge_commit.clone()),
        "cycles": built.as_ref().map(|b| b.cycles.clone()).unwrap_or_default(),
        "work_store": store_path,
        "traces": scratch.join("traces"),
        "job_site_clone": prepared.path,
        "retried_at_contract_version": retried,
        "inspectors": if inspected { 1 } else { 0 },
        "your_clone": {
            "path": user_clone,
            "tracking_ref": format!("origin/{}", args.default_branch),
            "tracking_head": tracking,
        },
    }))
}

/// Why an approved change set cannot be built because its impact assessment is
/// not reviewed (what `ears-manager check` says at its merge commit), and the
/// way on: a follow-up change set that restates its requirements with the
/// reviewed assessment. `None` when the assessment is complete. Pure.
fn impact_refusal(
    facts: &protobot_jobsite::contract::ChangeSetFacts,
    branch: &str,
) -> Option<String> {
    use protobot_jobsite::contract::{Action, AssessmentStatus};
    let why = match facts.assessment_status {
        AssessmentStatus::Complete => return None,
        AssessmentStatus::Incomplete => "incomplete",
        AssessmentStatus::Stale => "stale (reviewed against another base)",
    };
    let restated: Vec<&str> = facts
        .operations
        .iter()
        .filter(|(action, _)| *action != Action::Retire)
        .map(|(_, id)| id.as_str())
        .collect();
    let detail = format!(
        " (`ears-manager impact --change-set {cs} --at {merge}` lists the requirements it had to review{})",
        if facts.check_errors.is_empty() {
            String::new()
        } else {
            format!("; check: {}", facts.check_errors.join("; "))
        },
        cs = facts.change_set_id,
        merge = facts.merge_commit,
    );
    Some(format!(
        "change set {cs} was approved (merge {merge}) with an {why} impact assessment{detail}. The Job Site builds a change set only with a reviewed assessment, and an approved change set is not edited again. Way on: a follow-up change set with the review: on {branch}, `ears-manager change-set create …`, then for {reqs} `ears-manager requirement update --change-set CS-NEW --id REQ-… --text \"<its current text>\"`, `ears-manager --output json impact --change-set CS-NEW > impact.json` (fill in each candidate's disposition and rationale), `ears-manager change-set update --change-set CS-NEW --impact-file impact.json`, `ears-manager check --change-set CS-NEW`; merge and push it, then `protobot run --change-set CS-NEW` (docs/getting-started.md, \"When check says the impact assessment is incomplete\"). Run `ears-manager check` before merging a change set",
        cs = facts.change_set_id,
        merge = facts.merge_commit,
        reqs = if restated.is_empty() {
            "each requirement it changes".to_owned()
        } else {
            restated.join(", ")
        },
    ))
}

/// Runs the probe of [`crate::harness::probe_command`] in the sandbox and
/// refuses, naming what is missing and how to provide it.
async fn preflight(
    executor: &LocalExecutor,
    commands: &[String],
    scratch: &Path,
    harness: &Path,
) -> Result<(), RunError> {
    use protobot_jobsite::executor::{Executor, RunSpec, SandboxRole, Termination};
    if commands.is_empty() {
        return Ok(());
    }
    let dir = scratch.join("preflight");
    let _ = std::fs::remove_dir_all(&dir);
    let workspace = dir.join("workspace");
    git2::Repository::init(&workspace).map_err(|e| {
        RunError::Failed(format!(
            "failed to prepare the sandbox check in {}: {e}",
            workspace.display()
        ))
    })?;
    let spec = RunSpec {
        run_id: format!("preflight-{}", std::process::id()),
        role: SandboxRole::IntegrationRunner,
        workspace,
        task: serde_json::json!({"role": "preflight"}),
        command: crate::harness::probe_command(commands),
        image: None,
        env: Default::default(),
        limits: Default::default(),
        egress_proxy: None,
        audit: Default::default(),
        attribution: Default::default(),
    };
    let (_stop, cancel) = tokio::sync::watch::channel(false);
    let out = executor.run(spec, cancel).await.map_err(|e| {
        RunError::Failed(format!(
            "the sandbox check before the first cycle could not run: {e}"
        ))
    });
    let _ = std::fs::remove_dir_all(&dir);
    let out = out?;
    if out.termination == (Termination::Exited { code: 0 }) {
        return Ok(());
    }
    let missing = crate::harness::missing_from(&out.stderr_tail);
    if missing.is_empty() {
        return Err(RunError::Failed(format!(
            "the sandbox check before the first cycle failed ({:?}): {}",
            out.termination,
            protobot_jobsite::triage::sanitized_stderr_tail(&out.stderr_tail)
        )));
    }
    Err(RunError::Input(format!(
        "the sandbox has no {}: the integration needs {} (its interpreter or a `requires` line of {}). The sandbox holds the system /usr, the harness directory and the `path` lines of that file: add a `path /dir` line for the directory that holds {} (a venv, a toolchain), or install it under /usr; docs/worker-harnesses.md",
        missing.join(", "),
        if missing.len() == 1 { "it" } else { "them" },
        harness.join("sandbox").display(),
        if missing.len() == 1 { "it" } else { "each" },
    )))
}

/// Removes what a finished item's build left under `scratch`: its cycles'
/// projections and the collected `/out` folders of its runs (the trace stays,
/// in `scratch/traces`). A completed or abandoned item is never built again; a
/// blocked one keeps its scratch (what its last cycle saw explains the block).
pub(crate) fn remove_item_scratch(scratch: &Path, work_item_id: &str) {
    let prefix = format!("{work_item_id}-");
    for dir in [scratch.to_path_buf(), scratch.join("sandbox").join("out")] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let path = entry.path();
                let _ = if path.is_dir() {
                    std::fs::remove_dir_all(&path)
                } else {
                    std::fs::remove_file(&path)
                };
            }
        }
    }
}

/// What a stopped build prints: the error, the state the item is left in, its
/// trace, and the next command for that state. A build stops with its lease
/// held (`building`, `inspecting`, `merging`): running the same command again
/// resumes it; `abandon` drops it.
fn stopped_message(
    error: &str,
    work_item_id: &str,
    state: &str,
    trace: &Path,
    args: &RunArgs,
    user_clone: &Path,
) -> String {
    let target = match (&args.change_set, &args.bug) {
        (Some(cs), _) => format!("--change-set {cs}"),
        (None, Some(bug)) => format!("--bug {bug}"),
        (None, None) => String::new(),
    };
    let next = if state == "blocked" {
        format!(
            "fix the cause on {branch} and push it, then `protobot retry --repo {repo} {target} --harness {harness}`",
            branch = args.default_branch,
            repo = user_clone.display(),
            harness = args.harness.display(),
        )
    } else {
        format!(
            "fix the cause, then run `protobot run --repo {repo} {target} --harness {harness}` again: it resumes the item where it stopped (the Job Site adopts the lease it holds)",
            repo = user_clone.display(),
            harness = args.harness.display(),
        )
    };
    format!(
        "the build stopped: {error}\nwork item {work_item_id} is {state}; trace: {trace}\nnext: {next}; or drop it with `protobot abandon --repo {repo} --work-item {work_item_id}`",
        trace = trace.display(),
        repo = user_clone.display(),
    )
}

/// Runs `protobot run` (or, with [`Mode::Retry`], `protobot retry`).
pub fn run(args: RunArgs, mode: Mode) -> ExitCode {
    let command = if mode == Mode::Run { "run" } else { "retry" };
    if let Some(refusal) = crate::demo::sandbox_refusal(args.insecure_no_sandbox, command) {
        eprintln!("{refusal}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("protobot: failed to start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run_inner(&args, mode)) {
        Ok(report) => {
            let completed = report["state"] == serde_json::json!(State::Completed);
            let text = if args.output == Output::Json {
                report.to_string()
            } else {
                human_report(&report, &args)
            };
            let status = if completed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            };
            crate::output::print_line_with(&text, status)
        }
        Err(RunError::Input(e)) => {
            eprintln!("protobot: {e}");
            ExitCode::from(2)
        }
        Err(RunError::Failed(e)) => {
            eprintln!("protobot: {e}");
            ExitCode::from(1)
        }
    }
}

/// The human report: the outcome, and for a blocked item its reason and the
/// two ways on.
fn human_report(report: &serde_json::Value, args: &RunArgs) -> String {
    let text = |key: &str| report[key].as_str().unwrap_or_default().to_owned();
    let mut lines = vec![format!(
        "work item {} is {} (merge {})",
        text("work_item"),
        report["state"].as_str().unwrap_or("unknown"),
        report["merge_commit"].as_str().unwrap_or("none")
    )];
    // A block reason outlives its block in the record: only a blocked item shows it.
    if report["state"] == serde_json::json!(State::Blocked)
        && let Some(reason) = report["block_reason"].as_str()
    {
        lines.push(format!("blocked: {reason}"));
        if let Some(traces) = report["traces"].as_str() {
            lines.push(format!("trace: {traces}/{}.jsonl", text("work_item")));
        }
        let target = match (&args.change_set, &args.bug) {
            (Some(cs), _) => format!("--change-set {cs}"),
            (None, Some(bug)) => format!("--bug {bug}"),
            (None, None) => String::new(),
        };
        lines.push(format!(
            "next: fix the cause on {branch} and push it, then `protobot retry --repo {repo} {target} --harness {harness}`; or drop the item with `protobot abandon --repo {repo} --work-item {wi}`",
            branch = args.default_branch,
            repo = args.repo.display(),
            harness = args.harness.display(),
            wi = text("work_item"),
        ));
    }
    if report["state"] == serde_json::json!(State::Completed) {
        if report["inspectors"] == serde_json::json!(0) {
            lines.push(
                "warning: merged without inspection: the harness has no inspector.sh (docs/worker-harnesses.md)"
                    .into(),
            );
        }
        lines.push(format!(
            "your clone is untouched; `git pull --ff-only` brings the merge into {}",
            args.default_branch
        ));
    }
    lines.join("\n")
}
