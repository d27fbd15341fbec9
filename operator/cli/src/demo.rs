//! `protobot demo`: the whole Job Site on one machine, on a bundled example.
//!
//! 1. Author the `cli-sync` example project (three EARS requirements for a
//!    small file-sync tool, `examples/cli-sync/`) in a local canonical
//!    repository with a bare `origin`, using ears-manager.
//! 2. Approve its change set the way a person does: merge the change-set
//!    branch into `main` with a merge commit and push.
//! 3. Register it: read the manifest at the merge commit, build the contract,
//!    `materialize` into the SQLite work store.
//! 4. Claim it and run the engine with the scripted Workers in the bubblewrap
//!    sandbox (or, only with `--insecure-no-sandbox` and no bubblewrap, as
//!    plain processes). Worker B's first attempt fails a test, so the demo
//!    shows a real triage cycle.
//! 5. Write the run's result records (`<dir>/results/`, or `protobot eval`'s
//!    `--out`): the fixture's visible checks on the merged product, a record per
//!    Job Site stage valid against the corpus's result schema, and `trace.json`
//!    from which they replay (crate::eval, docs/evaluation.md).
//! 6. Verify that `origin/main` contains the merge, bring the demo's working
//!    clone up to date (`git pull --ff-only`: the Job Site builds in a clone of
//!    its own, `<dir>/jobsite`, so it never moves a checked-out branch) and
//!    print the report.
//!
//! A demo stopped during authoring (before `contract.json` exists) restarts
//! cleanly in the same `--dir`; one stopped later resumes from its store.
//!
//! Exit status 0 only if the item is `completed` and `main` contains the merge.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
    time::Instant,
};

use clap::{Args, ValueEnum};
use jiff::{SignedDuration, Timestamp};
use protobot_demo::authoring::git;
use protobot_executors::{BubblewrapConfig, LocalExecutor};
use protobot_jobsite::{
    contract::{BuildContract, Intake, build},
    engine::{BuildReport, Engine, EngineConfig, WorkerClass},
    executor::Limits,
    lease::SystemClock,
    materializer::{Registration, read_facts},
    site::{JobSite, KnownContracts, SiteAction},
    triage::HeuristicTriage,
};
use protobot_lifecycle::{AuthorizationContext, Grant, Role, State};
use protobot_stores::{AdapterConfig, SqliteStore, WorkStore};
use serde::Serialize;

use protobot_demo::example::{INSPECTOR, INTEGRATION, PROJECT, WORKER_A, WORKER_B, author};

/// Report format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Progress and a summary for people.
    Human,
    /// The report as one JSON document on stdout.
    Json,
}

/// Arguments of `protobot demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Report format.
    #[arg(long, value_enum, default_value = "human")]
    pub output: Output,
    /// Where to create the demo's repositories and database (default: a new temporary directory, kept).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Run Workers as plain processes when bubblewrap is missing (unsafe; logged on every run).
    #[arg(long)]
    pub insecure_no_sandbox: bool,
    /// Workers A and B and the Inspector: the bundled scripted harnesses, or a real agent CLI,
    /// OpenCode (harnesses/opencode) or Claude Code (harnesses/claude-code), reaching a
    /// deterministic model endpoint only through the egress proxy (needs root and
    /// scripts/install-agents.sh).
    #[arg(long, value_enum, default_value = "scripted")]
    pub harness: Harness,
    /// The OpenCode binary for --harness opencode (default: .tools/agents/bin/opencode, else
    /// opencode on PATH).
    #[arg(long)]
    pub opencode: Option<PathBuf>,
    /// The Claude Code binary for --harness claude-code (default: .tools/agents/bin/claude,
    /// else claude on PATH).
    #[arg(long)]
    pub claude: Option<PathBuf>,
    /// The most the item may spend on priced model calls, in dollars (`"0.50"`): a spent
    /// budget stops the build before its next cycle with a question (docs/cost-and-review.md).
    /// Only agent harnesses spend.
    #[arg(long, value_name = "DOLLARS")]
    pub budget_per_item: Option<protobot_usage::Dollars>,
}

/// Which Workers A and B and Inspector the demo runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Harness {
    /// The bundled scripted Workers (examples/cli-sync/workers), no model.
    Scripted,
    /// OpenCode against the demo's model double, through the egress proxy.
    Opencode,
    /// Claude Code against the demo's model double (Anthropic Messages API), through the
    /// egress proxy.
    ClaudeCode,
}

#[derive(Debug, Serialize)]
struct Report {
    project: String,
    change_set: String,
    work_item: String,
    state: State,
    contract_version: u64,
    merge_commit: Option<String>,
    main_contains_merge: bool,
    product_tree_digest: Option<String>,
    cycles: Vec<protobot_jobsite::engine::CycleReport>,
    redactions: usize,
    findings: usize,
    inspections: Vec<protobot_jobsite::engine::InspectionReport>,
    stages: Vec<String>,
    evidence: Evidence,
    sandbox: String,
    harness: Harness,
    /// What the model endpoint saw (agent harnesses only).
    #[serde(skip_serializing_if = "Option::is_none")]
    model: Option<crate::demo_agents::ModelEvidence>,
    /// What the item's runs spent on model calls, as the egress proxy metered it (agent
    /// harnesses only).
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<UsageReport>,
    /// The result records written (docs/evaluation.md).
    results: crate::eval::Written,
    seconds: f64,
}

/// The item's usage ledger, summed per stage and in total.
#[derive(Debug, Serialize)]
struct UsageReport {
    by_stage: std::collections::BTreeMap<String, protobot_usage::Spend>,
    total: protobot_usage::Spend,
    /// The human lines (`protobot status` prints the same).
    #[serde(skip)]
    lines: Vec<String>,
}

impl UsageReport {
    fn of(ledger: &protobot_usage::UsageLedger) -> UsageReport {
        let summary = ledger.summary();
        UsageReport {
            by_stage: summary
                .by_stage
                .iter()
                .map(|(stage, spend)| (stage.as_str().to_owned(), *spend))
                .collect(),
            total: summary.total,
            lines: crate::status::usage_lines(ledger),
        }
    }
}

#[derive(Debug, Serialize)]
struct Evidence {
    workspace: PathBuf,
    origin: PathBuf,
    work_store: PathBuf,
    attestations: String,
}

/// Why the demo could not finish.
#[derive(Debug, thiserror::Error)]
enum DemoError {
    #[error(transparent)]
    Example(#[from] protobot_demo::example::ExampleError),
    #[error("failed to prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to read the approved change set: {0}")]
    Materialize(#[from] protobot_jobsite::materializer::MaterializeError),
    #[error("failed to build the contract: {0}")]
    Contract(#[from] protobot_jobsite::contract::ContractError),
    #[error("work store: {0}")]
    Store(#[from] protobot_stores::StoreError),
    #[error("{command} was rejected: {code}")]
    Rejected { command: &'static str, code: String },
    #[error("the build stopped: {0}")]
    Engine(#[from] protobot_jobsite::engine::EngineError),
    #[error("unable to run the agent CLI as the Workers: {0}")]
    Agents(#[from] crate::demo_agents::AgentError),
    #[error("failed to write the result records to {path}: {source}")]
    Results {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The demo's policy version, which every context it grants speaks for.
const POLICY_VERSION: &str = "protobot-demo/v1";

async fn run(
    args: &DemoArgs,
    root: &Path,
    progress: protobot_jobsite::engine::StageHook,
    target: &crate::eval::Target,
) -> Result<Report, DemoError> {
    let started = Instant::now();
    let audit = crate::eval::EgressAudit::global();
    let egress_seen = audit.decisions().len();
    let (work, origin, db) = (
        root.join("work"),
        root.join("origin.git"),
        root.join("wms.sqlite"),
    );
    let contract_file = root.join("contract.json");
    let resuming = contract_file.exists();
    let contract: BuildContract = if resuming {
        progress("resuming: the work store and repositories of an earlier run are here");
        let bytes = std::fs::read(&contract_file).map_err(|source| DemoError::Io {
            path: contract_file.clone(),
            source,
        })?;
        serde_json::from_slice(&bytes).map_err(|e| DemoError::Io {
            path: contract_file.clone(),
            source: std::io::Error::other(e),
        })?
    } else {
        // Stopped during authoring: nothing was registered yet, so start over.
        for partial in [&work, &origin] {
            if partial.exists() {
                progress(&format!(
                    "restarting: removing {} left by a demo stopped during authoring",
                    partial.display()
                ));
                std::fs::remove_dir_all(partial).map_err(|source| DemoError::Io {
                    path: partial.clone(),
                    source,
                })?;
            }
        }
        progress("authoring: cli-sync project and change set CS-00001 with ears-manager");
        let merge = author(&work, &origin)?;
        progress(&format!(
            "approved: CS-00001 merged into main as {}",
            &merge[..12]
        ));
        let registration = Registration {
            project_id: PROJECT.into(),
            change_set_id: "CS-00001".into(),
            merge_commit: Some(merge.clone()),
            default_branch: "main".into(),
            depends_on: vec![],
            priority: "normal".into(),
        };
        let facts = read_facts(&work, &registration)?;
        let contract = build(&Intake::ChangeSet(facts))?;
        // Written before materializing: a rerun after a kill rebuilds nothing.
        let json = serde_json::to_vec_pretty(&contract).unwrap_or_default();
        std::fs::write(&contract_file, json).map_err(|source| DemoError::Io {
            path: contract_file.clone(),
            source,
        })?;
        contract
    };
    // The Job Site's own clone: its int/ and wi/ branches and the landed
    // merge never touch the working clone `work`.
    let jobsite = crate::clone::prepare(&work, &root.join("jobsite"), "main")
        .map_err(|e| DemoError::Io {
            path: root.join("jobsite"),
            source: std::io::Error::other(e.to_string()),
        })?
        .path;
    let store = Arc::new(SqliteStore::open(
        &db,
        PROJECT,
        AdapterConfig {
            materializer_subject: "materializer".into(),
            lease_seconds: 900,
        },
    )?);
    // Every context of the demo: its project, its policy, two hours; `main` granted
    // beside the project.
    let grant = Grant {
        project: PROJECT,
        role: Role::Materializer,
        subject: "materializer",
        actions: &["materialize"],
        expires_at: Timestamp::now() + SignedDuration::from_hours(2),
        policy_version: POLICY_VERSION,
    };
    let materializer = AuthorizationContext::new(grant).with_refs(["main"]);
    let result = store
        .execute(
            Some(&materializer),
            &contract.materialize_envelope(PROJECT, "materializer"),
            Timestamp::now(),
        )
        .await?;
    let state = result
        .decision
        .as_ref()
        .and_then(|d| d.after)
        .map(|a| a.state);
    if !result.ok || (!resuming && state != Some(State::ReadyForBuilding)) {
        return Err(DemoError::Rejected {
            command: "materialize",
            code: result
                .code()
                .map(|c| c.as_str().to_string())
                .unwrap_or_else(|| match state {
                    Some(s) => format!("the item is {s}, not ready-for-building"),
                    None => "no resulting state".into(),
                }),
        });
    }
    progress(&format!(
        "materialized: {} ready-for-building ({} requirements)",
        contract.work_item_id,
        contract.applicable_requirement_ids.len()
    ));
    let job_site = AuthorizationContext::new(Grant {
        role: Role::JobSite,
        subject: "job-site-local",
        actions: protobot_jobsite::site::JOB_SITE_ACTIONS,
        expires_at: Timestamp::now() + SignedDuration::from_hours(2),
        ..grant
    })
    .with_refs(["main"]);
    let agents = match args.harness {
        Harness::Scripted => None,
        Harness::Opencode => {
            let opencode = crate::demo_agents::find_opencode(args.opencode.as_deref())?;
            progress(&format!(
                "Workers A and B and the Inspector: OpenCode ({}) through the egress proxy",
                opencode.display()
            ));
            Some(crate::demo_agents::start(root, &opencode, &contract.work_item_id).await?)
        }
        Harness::ClaudeCode => {
            let agent = crate::demo_agents::Agent::ClaudeCode;
            let claude = crate::demo_agents::find_agent(agent, args.claude.as_deref())?;
            progress(&format!(
                "Workers A and B and the Inspector: Claude Code ({}) through the egress proxy",
                claude.display()
            ));
            Some(
                crate::demo_agents::start_agent(root, agent, &claude, &contract.work_item_id)
                    .await?,
            )
        }
    };
    let (mut sandbox_config, _) = sandbox_config(&root.join("sandbox"), args.insecure_no_sandbox)
        .map_err(|reason| DemoError::Rejected {
        command: "demo",
        code: reason,
    })?;
    if let Some(a) = &agents {
        sandbox_config.egress = Some(a.egress.clone());
        sandbox_config
            .extra_ro_binds
            .extend(a.binds.iter().cloned());
    }
    let executor = LocalExecutor::new(sandbox_config, args.insecure_no_sandbox);
    if agents.is_some() && matches!(executor, LocalExecutor::Insecure(_)) {
        return Err(DemoError::Rejected {
            command: "demo --harness",
            code: "the agent Workers reach their model only through the sandbox's egress; install bubblewrap (no --insecure-no-sandbox)".into(),
        });
    }
    let sandbox = match &executor {
        LocalExecutor::Sandboxed(_) => "bubblewrap",
        LocalExecutor::Insecure(_) => "none (--insecure-no-sandbox)",
    };
    let stages = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let recorder = {
        let stages = Arc::clone(&stages);
        let progress = Arc::clone(&progress);
        Arc::new(move |s: &str| {
            if let Ok(mut v) = stages.lock() {
                v.push(s.to_string());
            }
            progress(s);
        }) as protobot_jobsite::engine::StageHook
    };
    let sh = |script: &str| WorkerClass {
        command: vec!["sh".into(), "-c".into(), script.into()],
        image: None,
        egress: false,
        tiers: Default::default(),
        prices: Default::default(),
    };
    let engine = Engine {
        store: store.clone(),
        executor: Arc::new(executor),
        clock: Arc::new(SystemClock),
        triage: Arc::new(HeuristicTriage),
        context: job_site,
        config: EngineConfig {
            max_cycles: 3,
            transient_retries: 3,
            start_tier: protobot_jobsite::escalation::Tier::T1,
            worker_a: agents
                .as_ref()
                .map_or_else(|| sh(WORKER_A), |a| a.worker_a.clone()),
            worker_b: agents
                .as_ref()
                .map_or_else(|| sh(WORKER_B), |a| a.worker_b.clone()),
            integration: sh(INTEGRATION),
            producers: vec![protobot_jobsite::engine::Producer {
                name: "inspector".into(),
                kind: protobot_jobsite::inspection::ProducerKind::Inspector,
                class: agents
                    .as_ref()
                    .map_or_else(|| sh(INSPECTOR), |a| a.inspector.clone()),
            }],
            // OpenCode and Claude Code (Bun) reserve a large address space up front and the memory
            // limit is an RLIMIT_AS.
            limits: match &agents {
                Some(_) => Limits {
                    memory_bytes: 64 << 30,
                    processes: 1024,
                    open_files: 4096,
                    ..Limits::default()
                },
                None => Limits::default(),
            },
            scratch: root.join("scratch"),
            remote: "origin".into(),
            target_branch: "main".into(),
            egress_proxy: agents.as_ref().map(|a| a.proxy_url.clone()),
            landing: Default::default(),
            model_retry_delay_cap: protobot_jobsite::engine::DEFAULT_MODEL_RETRY_DELAY_CAP,
            item_budget: args
                .budget_per_item
                .map(|limit| protobot_usage::ItemBudget {
                    limit,
                    set_in: "--budget-per-item".into(),
                }),
        },
        on_stage: Some(recorder),
        faults: None,
        stop: None,
        usage: agents.as_ref().map(|a| {
            Arc::new(protobot_executors::egress::MeterUsage(a.meter.clone()))
                as Arc<dyn protobot_jobsite::usage::UsageSource>
        }),
    };
    let site = JobSite {
        engine: Arc::new(engine),
        reconciler: AuthorizationContext::new(Grant {
            role: Role::Reconciler,
            subject: "reconciler-local",
            actions: protobot_jobsite::site::RECONCILER_ACTIONS,
            expires_at: Timestamp::now() + SignedDuration::from_hours(2),
            ..grant
        })
        .with_refs(["main"]),
        contracts: Arc::new(KnownContracts(
            [(contract.work_item_id.clone(), contract.clone())]
                .into_iter()
                .collect(),
        )),
        repo_dir: jobsite,
        wip_limit: 1,
        materializer: Some(
            AuthorizationContext::new(Grant {
                actions: protobot_jobsite::site::REFRESH_ACTIONS,
                expires_at: Timestamp::now() + SignedDuration::from_hours(2),
                ..grant
            })
            .with_refs(["main"]),
        ),
        capacity: None,
    };
    // Claims the item, or — after a kill — adopts the lease this Job Site still
    // holds (or recovers an expired one) and resumes where the store says.
    let actions = site
        .run_until_idle()
        .await
        .map_err(|e| DemoError::Rejected {
            command: "job site",
            code: e.to_string(),
        })?;
    let mut cycles = Vec::new();
    let mut built: Option<BuildReport> = None;
    // A stopped build still writes its result records; the error comes after.
    let mut stopped: Option<String> = None;
    for action in actions {
        match action {
            SiteAction::Built { report } => {
                cycles.extend(report.cycles.iter().cloned());
                built = Some(*report);
            }
            SiteAction::Failed { error, .. } | SiteAction::MergeUnverified { error, .. } => {
                stopped.get_or_insert(error);
            }
            other => progress(&format!("job site: {}", describe(&other))),
        }
    }
    let record = store.get(&contract.work_item_id).await?;
    let merge_commit = built
        .as_ref()
        .and_then(|r| r.merge_commit.clone())
        .or_else(|| {
            git(
                &origin,
                &[
                    "log",
                    "-1",
                    "--merges",
                    "--first-parent",
                    "--format=%H",
                    "main",
                ],
            )
            .ok()
        });
    let report = BuildReport {
        work_item_id: contract.work_item_id.clone(),
        state: record.as_ref().map(|r| r.state).unwrap_or(State::Building),
        cycles,
        inspections: built
            .as_ref()
            .map(|r| r.inspections.clone())
            .unwrap_or_default(),
        revalidations: built.as_ref().map(|r| r.revalidations).unwrap_or_default(),
        merge_commit,
        product_tree_digest: built.as_ref().and_then(|r| r.product_tree_digest.clone()),
        block_reason: built.as_ref().and_then(|r| r.block_reason.clone()),
        lease_renewals: built.as_ref().map(|r| r.lease_renewals).unwrap_or_default(),
        usage: built.as_ref().map(|r| r.usage.clone()).unwrap_or_default(),
    };
    let contains = match &report.merge_commit {
        Some(m) => git(&origin, &["merge-base", "--is-ancestor", m, "main"]).is_ok(),
        None => false,
    };
    if contains {
        // The working clone is the demo's own: bring its main (and work tree) up to date.
        if let Err(e) = git(&work, &["pull", "-q", "--ff-only", "origin", "main"]) {
            progress(&format!(
                "note: {} was not fast-forwarded: {e}",
                work.display()
            ));
        }
    }
    progress(&format!(
        "{}: {}",
        report.state,
        report.merge_commit.as_deref().unwrap_or("no merge")
    ));
    // The result records: the fixture's checks on the merged product, then one record per stage.
    let state_now = record.as_ref().map(|r| r.state).unwrap_or(report.state);
    let visible_checks = if contains {
        progress("evaluating: the fixture's visible checks on the merged product (sandboxed)");
        crate::eval::visible_checks(
            &target.fixture,
            &origin,
            "main",
            &root.join("eval"),
            matches!(sandbox, "none (--insecure-no-sandbox)"),
        )
    } else {
        Vec::new()
    };
    let model_requests = agents
        .as_ref()
        .map(|a| a.model_requests(&contract.work_item_id))
        .unwrap_or_default();
    let models = match &agents {
        Some(_) => crate::eval::agent_models(
            "scripted",
            match args.harness {
                Harness::ClaudeCode => "claude-code",
                // Scripted runs no agent: `agents` is None.
                Harness::Opencode | Harness::Scripted => "opencode",
            },
            &model_requests,
        ),
        None => Vec::new(),
    };
    let out_root = root.join("sandbox/out");
    let now = Timestamp::now();
    let evidence = protobot_eval::evidence::JobSiteRun {
        bundle_version: protobot_eval::evidence::BUNDLE_VERSION,
        run_id: format!("{}-{}", contract.work_item_id, now.as_second()),
        recorded_at: protobot_eval::semantics::timestamp(now),
        fixture: protobot_eval::evidence::FixtureRef {
            id: target.fixture.id.clone(),
            corpus_revision: target.fixture.corpus_revision.clone(),
            digest: target.fixture.digest.clone(),
        },
        environment: crate::eval::environment(models),
        inputs: protobot_eval::evidence::RunInputs {
            work_item_id: contract.work_item_id.clone(),
            requirement_ids: contract.applicable_requirement_ids.clone(),
            contract: serde_json::to_value(&contract).unwrap_or_default(),
        },
        cycles: report.cycles.clone(),
        gates: crate::eval::gates(&out_root, &contract.work_item_id),
        inspections: crate::eval::inspections(&out_root, &report.inspections),
        outcome: protobot_eval::evidence::Outcome {
            state: state_now.to_string(),
            merge_commit: report.merge_commit.clone(),
            main_contains_merge: contains,
            product_tree_digest: report.product_tree_digest.clone(),
            error: stopped.clone().or_else(|| report.block_reason.clone()),
        },
        visible_checks,
        holdout_assets: target
            .fixture
            .holdout_assets
            .iter()
            .map(|a| a.id.clone())
            .collect(),
        engine_trace: protobot_jobsite::engine::read_trace(
            &root.join("scratch"),
            &contract.work_item_id,
        ),
        egress: audit.decisions().into_iter().skip(egress_seen).collect(),
        model_requests,
    };
    let results =
        crate::eval::write(&target.results, &evidence).map_err(|source| DemoError::Results {
            path: target.results.clone(),
            source,
        })?;
    progress(&format!(
        "results: {} records in {} ({} pass)",
        results.records.len(),
        results.dir.display(),
        results.records.iter().filter(|r| r.pass).count()
    ));
    if let Some(code) = stopped {
        return Err(DemoError::Rejected {
            command: "build",
            code,
        });
    }
    let redactions = report.cycles.iter().map(|c| c.redactions).sum();
    let usage = agents
        .as_ref()
        .and(record.as_ref())
        .map(|r| UsageReport::of(&r.usage));
    let stages = stages.lock().map(|s| s.clone()).unwrap_or_default();
    Ok(Report {
        project: PROJECT.into(),
        change_set: "CS-00001".into(),
        work_item: contract.work_item_id.clone(),
        state: record.as_ref().map(|r| r.state).unwrap_or(report.state),
        contract_version: record.map(|r| r.contract_version).unwrap_or_default(),
        merge_commit: report.merge_commit.clone(),
        main_contains_merge: contains,
        product_tree_digest: report.product_tree_digest.clone(),
        redactions,
        findings: report.inspections.iter().map(|i| i.findings).sum(),
        inspections: report.inspections.clone(),
        cycles: report.cycles,
        stages,
        evidence: Evidence {
            workspace: root.to_path_buf(),
            origin,
            work_store: db,
            attestations: format!(
                ".protobot/attestations/{}/ (on main)",
                contract.work_item_id
            ),
        },
        sandbox: sandbox.into(),
        harness: args.harness,
        model: agents
            .as_ref()
            .map(crate::demo_agents::AgentWorkers::evidence),
        usage,
        results,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The sandbox configuration for runs staged under `base`, decided before any
/// work. With a dedicated uid per run (a root control plane), that uid must be
/// able to reach the scratch root where each run is staged; under a directory
/// closed to others (`mktemp -d` makes one) it cannot. Runs are then staged
/// under the system's temporary directory instead (the same folder for the
/// same `base`), and the note says so; when that is closed too, the error
/// names the directory and the fix.
pub(crate) fn sandbox_config(
    base: &Path,
    insecure_no_sandbox: bool,
) -> Result<(BubblewrapConfig, Option<String>), String> {
    use std::hash::{Hash, Hasher};
    let mut config = BubblewrapConfig::under(base);
    if insecure_no_sandbox || !protobot_executors::reach::per_run_uid_applies() {
        return Ok((config, None));
    }
    let Err(blocked) = protobot_executors::reach::check_reachable(&config.scratch_root) else {
        return Ok((config, None));
    };
    let mut hasher = std::hash::DefaultHasher::new();
    std::path::absolute(base)
        .unwrap_or_else(|_| base.to_path_buf())
        .hash(&mut hasher);
    let fallback = std::env::temp_dir().join(format!("protobot-sandbox-{:016x}", hasher.finish()));
    match protobot_executors::reach::check_reachable(&fallback) {
        Ok(()) => {
            let note = format!(
                "the sandbox's uid cannot enter {} (mode {:04o}), so sandbox runs are staged under {} instead",
                blocked.blocking.display(),
                blocked.mode,
                fallback.display()
            );
            config.scratch_root = fallback;
            Ok((config, Some(note)))
        }
        Err(_) => Err(blocked.to_string()),
    }
}

/// Why Workers cannot run here (bubblewrap missing and no explicit insecure
/// mode), as the one line to print before any work; `None` when they can.
pub(crate) fn sandbox_refusal(insecure_no_sandbox: bool, command: &str) -> Option<String> {
    let found = protobot_executors::BubblewrapExecutor::new(BubblewrapConfig::default())
        .bwrap_path()
        .is_some();
    (!found && !insecure_no_sandbox).then(|| {
        format!(
            "protobot: bubblewrap (the Workers' sandbox) is not installed: run `sudo apt-get install -y bubblewrap`, then run protobot {command} again (or pass --insecure-no-sandbox to run Workers as plain processes)"
        )
    })
}

/// One line for a Job Site action, for people.
fn describe(action: &SiteAction) -> String {
    match action {
        SiteAction::RecoveredLease { work_item_id } => {
            format!("{work_item_id}: recovered an expired lease (back to ready-for-building)")
        }
        SiteAction::RecordedMerge {
            work_item_id,
            merge_commit,
        } => format!("{work_item_id}: recorded the landed merge {merge_commit}"),
        SiteAction::MergeNotApplied { work_item_id } => {
            format!("{work_item_id}: a merge that never landed was returned to ready-for-building")
        }
        SiteAction::Built { report } => {
            format!("{}: built ({})", report.work_item_id, report.state)
        }
        SiteAction::Claimed { work_item_id } => format!("{work_item_id}: claimed"),
        SiteAction::LostClaim { work_item_id, code } => {
            format!("{work_item_id}: claim refused ({code})")
        }
        SiteAction::DependenciesRefreshed { work_item_id } => {
            format!("{work_item_id}: dependencies completed, ready-for-building")
        }
        SiteAction::Revalidated {
            work_item_id,
            reason,
        } => format!("{work_item_id}: blocked: {reason}"),
        SiteAction::Failed {
            work_item_id,
            error,
        }
        | SiteAction::MergeUnverified {
            work_item_id,
            error,
        } => format!("{work_item_id}: the build stopped: {error}"),
    }
}

fn lock_dir(root: &Path) -> std::io::Result<std::fs::File> {
    std::fs::create_dir_all(root)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.join(".protobot-demo.lock"))?;
    file.try_lock().map_err(|e| match e {
        std::fs::TryLockError::WouldBlock => {
            std::io::Error::other("the directory is locked by another protobot process")
        }
        std::fs::TryLockError::Error(e) => e,
    })?;
    Ok(file)
}

/// Runs `protobot demo`.
pub fn demo(args: DemoArgs) -> ExitCode {
    demo_with(args, None)
}

/// Runs the demo evaluated against `target` (`protobot eval`), or against the
/// bundled cli-sync fixture with the records in `<dir>/results`.
pub fn demo_with(args: DemoArgs, target: Option<crate::eval::Target>) -> ExitCode {
    let root = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::temp_dir().join(format!(
            "protobot-demo-{}-{}",
            std::process::id(),
            Timestamp::now().as_second()
        )),
    };
    // A demo directory holds the demo's lock file from its first moment on.
    let earlier_run =
        root.join("contract.json").exists() || root.join(".protobot-demo.lock").exists();
    if root.exists()
        && !earlier_run
        && std::fs::read_dir(&root)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        eprintln!(
            "protobot: unable to run the demo in {}: the directory is not empty and holds no earlier demo run to resume; pass an empty or new --dir",
            root.display()
        );
        return ExitCode::from(2);
    }
    // Refuse before any work (authoring, approval) when Workers could not run.
    if let Some(refusal) = sandbox_refusal(args.insecure_no_sandbox, "demo") {
        eprintln!("{refusal}");
        return ExitCode::from(2);
    }
    match sandbox_config(&root.join("sandbox"), args.insecure_no_sandbox) {
        Ok((_, Some(note))) if args.output == Output::Human => eprintln!("protobot: note: {note}"),
        Ok(_) => {}
        Err(reason) => {
            eprintln!("protobot: {reason}");
            return ExitCode::from(2);
        }
    }
    // One Job Site per work store: the lock makes adopting our own lease after a
    // kill safe (no other live process can hold it under the same identity).
    let _lock = match lock_dir(&root) {
        Ok(lock) => lock,
        Err(e) => {
            eprintln!(
                "protobot: unable to run the demo in {}: {e}; is another demo running there?",
                root.display()
            );
            return ExitCode::from(2);
        }
    };
    let human = args.output == Output::Human;
    let progress: protobot_jobsite::engine::StageHook = Arc::new(move |s: &str| {
        if human {
            eprintln!("  ▸ {s}");
        }
    });
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
    if human {
        eprintln!(
            "protobot demo: the Job Site on one machine ({})",
            root.display()
        );
    }
    let target = match target {
        Some(t) => t,
        None => match crate::eval::bundled(root.join("results")) {
            Ok(t) => t,
            Err(e) => {
                eprintln!(
                    "protobot: the bundled fixture does not parse (a defect of this binary): {e}"
                );
                return ExitCode::from(1);
            }
        },
    };
    match runtime.block_on(run(&args, &root, progress, &target)) {
        Ok(report) => {
            let ok = report.state == State::Completed && report.main_contains_merge;
            let text = if human {
                let mut lines = vec![format!(
                    "work item      {} ({}, contract version {})",
                    report.work_item, report.state, report.contract_version
                )];
                for c in &report.cycles {
                    lines.push(format!(
                        "cycle {}        {} ({} redactions)",
                        c.cycle, c.decision, c.redactions
                    ));
                }
                lines.push(format!("findings       {}", report.findings));
                lines.push(format!(
                    "merge commit   {}",
                    report.merge_commit.as_deref().unwrap_or("-")
                ));
                lines.push(format!("main contains  {}", report.main_contains_merge));
                lines.push(format!("sandbox        {}", report.sandbox));
                lines.push(format!(
                    "results        {} ({} records, {} pass; trace.json replays them)",
                    report.results.dir.display(),
                    report.results.records.len(),
                    report.results.records.iter().filter(|r| r.pass).count()
                ));
                if let Some(m) = &report.model {
                    lines.push(format!(
                        "model          {} requests, {} with the key the broker injected (proxy: {} allowed, {} denied)",
                        m.requests, m.with_injected_key, m.proxy_allowed, m.proxy_denied
                    ));
                    lines.push(format!(
                        "model double   {} answers reported {} tokens in, {} out (its own count)",
                        m.served.answers, m.served.input_tokens, m.served.output_tokens
                    ));
                }
                if let Some(usage) = &report.usage {
                    lines.push(format!(
                        "usage          metered by the egress proxy, priced at the demo's {}",
                        crate::demo_agents::demo_price_note()
                    ));
                    lines.extend(usage.lines.iter().cloned());
                }
                lines.push(format!(
                    "evidence       {} (origin: {}, store: {})",
                    report.evidence.attestations,
                    report.evidence.origin.display(),
                    report.evidence.work_store.display()
                ));
                lines.push(format!("time           {:.1}s", report.seconds));
                lines.join("\n")
            } else {
                match serde_json::to_string_pretty(&report) {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("protobot: failed to encode the report: {e}");
                        return ExitCode::from(1);
                    }
                }
            };
            let status = if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            };
            crate::output::print_line_with(&text, status)
        }
        Err(e) => {
            eprintln!("protobot: demo failed: {e}");
            ExitCode::from(1)
        }
    }
}
