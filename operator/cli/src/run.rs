//! `protobot run`: the Job Site on one machine for your own project — an
//! approved change set in your repository, built by your worker harness.
//!
//! A true bug enters the same way with `--bug <id> --violates <REQ,…>`: no
//! change set, the violated requirements judged at the default branch's head,
//! `change_type: contradicts`; its facts are recorded next to the store so a
//! rerun rebuilds the same contract.
//!
//! The repository is a working clone whose `origin` is where the merge lands
//! (a bare repository or a remote the machine can push to). The harness
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
use protobot_executors::{BubblewrapConfig, LocalExecutor};
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
use protobot_lifecycle::{AuthorizationContext, State};
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

#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Failed(String),
}

fn read_harness(dir: &Path, name: &str) -> Result<Option<WorkerClass>, RunError> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(script) => Ok(Some(WorkerClass {
            command: vec!["sh".into(), "-c".into(), script],
            image: None,
            egress: false,
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RunError::Input(format!(
            "cannot read the harness script {}: {e}",
            path.display()
        ))),
    }
}

fn required(dir: &Path, name: &str) -> Result<WorkerClass, RunError> {
    read_harness(dir, name)?.ok_or_else(|| {
        RunError::Input(format!(
            "the harness directory {} has no {name}; see docs/worker-harnesses.md",
            dir.display()
        ))
    })
}

fn context(project: &str, role: &str, subject: &str, actions: &[&str]) -> AuthorizationContext {
    AuthorizationContext {
        subject: subject.into(),
        role: role.into(),
        project_id: project.into(),
        allowed_actions: actions.iter().map(|s| s.to_string()).collect(),
        allowed_refs: vec![format!("project:{project}")],
        expires_at: Some(Timestamp::now() + SignedDuration::from_hours(12)),
        policy_version: "protobot-local/v1".into(),
        ..AuthorizationContext::default()
    }
}

/// The project id the spec store declares on the default branch.
fn project_id_at(repo: &Path, branch: &str) -> Result<String, RunError> {
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

fn lock(store: &Path) -> Result<std::fs::File, RunError> {
    let dir = store.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .map_err(|e| RunError::Input(format!("cannot create {}: {e}", dir.display())))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(".protobot-run.lock"))
        .map_err(|e| RunError::Input(format!("cannot lock {}: {e}", dir.display())))?;
    file.try_lock().map_err(|_| {
        RunError::Input(format!(
            "another protobot process is running on the work store in {}",
            dir.display()
        ))
    })?;
    Ok(file)
}

async fn run_inner(args: &RunArgs) -> Result<serde_json::Value, RunError> {
    let worker_a = required(&args.harness, "worker-a.sh")?;
    let worker_b = required(&args.harness, "worker-b.sh")?;
    let integration = required(&args.harness, "integration.sh")?;
    let inspector = read_harness(&args.harness, "inspector.sh")?;
    let repo = args
        .repo
        .canonicalize()
        .map_err(|e| RunError::Input(format!("repository {}: {e}", args.repo.display())))?;
    let store_path = args
        .store
        .clone()
        .unwrap_or_else(|| repo.join(".git").join("protobot").join("wms.sqlite"));
    let _lock = lock(&store_path)?;
    // The project id is the one the repository's spec store declares.
    let project_id = project_id_at(&repo, &args.default_branch)?;
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
            let facts =
                read_facts(&repo, &registration).map_err(|e| RunError::Input(e.to_string()))?;
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
                        "bug {bug} was registered at {} violating {} (scopes {:?}); a report with other requirements or scopes needs another bug id",
                        f.spec_commit,
                        f.violated_requirement_ids.join(","),
                        f.scopes
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
    let materializer = context(
        &project_id,
        "materializer",
        "materializer",
        &["materialize"],
    );
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
    let scratch = store_path
        .parent()
        .unwrap_or(Path::new("."))
        .join("scratch");
    let mut config = EngineConfig::new(worker_a, worker_b, integration, scratch.clone());
    config.target_branch = args.default_branch.clone();
    if let Some(class) = inspector {
        config.producers = vec![Producer {
            name: "inspector".into(),
            kind: ProducerKind::Inspector,
            class,
        }];
    }
    let executor = LocalExecutor::new(
        BubblewrapConfig::under(&scratch.join("sandbox")),
        args.insecure_no_sandbox,
    );
    let human = args.output == Output::Human;
    let engine = Engine {
        store: store.clone(),
        executor: Arc::new(executor),
        clock: Arc::new(SystemClock),
        triage: Arc::new(HeuristicTriage),
        context: context(
            &project_id,
            "job-site",
            "job-site-local",
            protobot_jobsite::site::JOB_SITE_ACTIONS,
        ),
        config,
        on_stage: Some(Arc::new(move |s: &str| {
            if human {
                eprintln!("  ▸ {s}");
            }
        })),
        faults: None,
    };
    let site = JobSite {
        engine: Arc::new(engine),
        reconciler: context(
            &project_id,
            "reconciler",
            "reconciler-local",
            protobot_jobsite::site::RECONCILER_ACTIONS,
        ),
        contracts: Arc::new(
            RegisteredContracts::new(repo.clone(), &args.default_branch).with_bug_intakes(intakes),
        ),
        repo_dir: repo,
        wip_limit: 1,
        materializer: Some(context(
            &project_id,
            "materializer",
            "materializer",
            protobot_jobsite::site::REFRESH_ACTIONS,
        )),
    };
    let actions = site
        .run_until_idle()
        .await
        .map_err(|e| RunError::Failed(e.to_string()))?;
    for a in &actions {
        if let SiteAction::Failed { error, .. } = a {
            return Err(RunError::Failed(format!("the build stopped: {error}")));
        }
    }
    let record = store
        .get(&contract.work_item_id)
        .await
        .map_err(|e| RunError::Failed(e.to_string()))?;
    let built = actions.iter().find_map(|a| match a {
        SiteAction::Built { report } => Some(report.clone()),
        _ => None,
    });
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
    }))
}

/// Runs `protobot run`.
pub fn run(args: RunArgs) -> ExitCode {
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
    match runtime.block_on(run_inner(&args)) {
        Ok(report) => {
            let completed = report["state"] == serde_json::json!(State::Completed);
            if args.output == Output::Json {
                println!("{report}");
            } else {
                println!(
                    "work item {} is {} (merge {})",
                    report["work_item"].as_str().unwrap_or_default(),
                    report["state"].as_str().unwrap_or("unknown"),
                    report["merge_commit"].as_str().unwrap_or("none")
                );
                if let Some(reason) = report["block_reason"].as_str() {
                    println!("blocked: {reason}");
                }
            }
            if completed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
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
