//! A scripted project for Job Site tests (feature `test-support`): a canonical
//! repository with a bare origin and one test/implementation pair per work item,
//! the in-process scripted roles (Worker A writes a test, Worker B an
//! implementation that can be wrong for the first cycles, an integration runner
//! that checks them, an Inspector that can object once), a manual clock, and a
//! Job Site builder over any work store. Used by the engine's pipeline tests and
//! the multi-replica scenarios on the Kubernetes store.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use jiff::{SignedDuration, Timestamp};
use protobot_lifecycle::{AuthorizationContext, Grant, Readiness, Role, State, WorkItemRecord};
use protobot_stores::{Import, WorkStore};

use crate::{
    contract::BuildContract,
    engine::{Engine, EngineConfig, FaultHook, Producer, WorkerClass},
    executor::SandboxRole,
    inspection::ProducerKind,
    lease::Clock,
    site::{JobSite, KnownContracts},
    testing::{InProcessExecutor, Script, ScriptRun, copy_tree, git},
    triage::HeuristicTriage,
};

pub const REQ: &str = "REQ-SYNC-001";
pub const LEASE: i64 = 900;

/// A clock tests move by hand.
#[derive(Clone)]
pub struct ManualClock(pub Arc<Mutex<Timestamp>>);

impl ManualClock {
    /// Moves the clock forward.
    pub fn advance(&self, secs: i64) {
        let mut t = self.0.lock().unwrap();
        *t += SignedDuration::from_secs(secs);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap()
    }
}

fn task(run: &ScriptRun<'_>) -> serde_json::Value {
    run.spec.task.clone()
}

fn commit_and_hand_back(run: &ScriptRun<'_>, who: &str) -> Result<i32, String> {
    let ws = run.workspace;
    git(ws, &["add", "-A"]);
    let status = git(ws, &["status", "--porcelain"]);
    if !status.is_empty() {
        git(
            ws,
            &[
                "-c",
                &format!("user.name={who}"),
                "-c",
                &format!("user.email={who}@example.invalid"),
                "commit",
                "-qm",
                &format!("{who} work"),
            ],
        );
    }
    copy_tree(ws, &run.out.join("worker")).map_err(|e| e.to_string())?;
    Ok(0)
}

/// How the scripted roles behave.
#[derive(Clone, Default)]
pub struct Behaviour {
    /// Worker B writes a wrong implementation for cycles up to this number.
    pub wrong_until_cycle: u32,
    /// The Inspector reports an implementation defect on the first inspection of each item.
    pub inspector_objects_once: bool,
    /// Worker B's first run fails as an executor error (transient).
    pub transient_first: bool,
    /// The mutation campaign reports a surviving mutant on its first run per item.
    pub mutant_survives_once: bool,
}

/// The scripted roles.
pub fn executor(root: &Path, b: Behaviour) -> InProcessExecutor {
    let worker_a: Script = Arc::new(|run| {
        let id = task(run)["work_item_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let path = run.workspace.join("tests").join(format!("{id}.sh"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "expect hello\n").unwrap();
        commit_and_hand_back(run, "worker-a")
    });
    let transient_done = Arc::new(AtomicUsize::new(0));
    let wrong_until = b.wrong_until_cycle;
    let transient_first = b.transient_first;
    let worker_b: Script = Arc::new(move |run| {
        if transient_first && transient_done.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err("simulated node failure".into());
        }
        let t = task(run);
        let id = t["work_item_id"].as_str().unwrap_or_default().to_string();
        let cycle = t["cycle"].as_u64().unwrap_or(1) as u32;
        let word = if cycle <= wrong_until {
            "helo"
        } else {
            "hello"
        };
        let path = run.workspace.join("src").join(format!("{id}.sh"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("echo {word}\n")).unwrap();
        commit_and_hand_back(run, "worker-b")
    });
    let integration: Script = Arc::new(|run| {
        let mut results = Vec::new();
        if let Ok(entries) = std::fs::read_dir(run.workspace.join("tests")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let Some(stem) = name.strip_suffix(".sh") else {
                    continue;
                };
                let src = std::fs::read_to_string(run.workspace.join("src").join(&name))
                    .unwrap_or_default();
                let pass = src.trim() == "echo hello";
                results.push(serde_json::json!({
                    "test_id": format!("T-{stem}"),
                    "requirement_ids": [REQ],
                    "status": if pass { "pass" } else { "fail" },
                    "baseline": false,
                }));
            }
        }
        std::fs::write(
            run.out.join("results.json"),
            serde_json::json!({ "results": results }).to_string(),
        )
        .unwrap();
        Ok(0)
    });
    let objected: Arc<Mutex<std::collections::BTreeSet<String>>> = Arc::default();
    let objects = b.inspector_objects_once;
    let inspector: Script = Arc::new(move |run| {
        let id = task(run)["work_item_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut lines = String::new();
        if objects && objected.lock().unwrap().insert(id.clone()) {
            lines = serde_json::json!({
                "subject": format!("src/{id}.sh:error-handling"),
                "category": "conformance",
                "severity": "major",
                "requirement_ids": [REQ],
                "disposition": "implementation-defect",
                "paths": [format!("src/{id}.sh"), format!("tests/{id}.sh")],
                "summary": "expected `hello` on stderr too; assertion at tests line 1",
            })
            .to_string();
            lines.push('\n');
        }
        std::fs::write(run.out.join("findings.jsonl"), lines).unwrap();
        Ok(0)
    });
    let survived: Arc<Mutex<std::collections::BTreeSet<String>>> = Arc::default();
    let survives = b.mutant_survives_once;
    let mutation: Script = Arc::new(move |run| {
        let id = task(run)["work_item_id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let survivors = if survives && survived.lock().unwrap().insert(id.clone()) {
            serde_json::json!([{
                "mutant_id": format!("{id}-m1"),
                "path": format!("src/{id}.sh"),
                "requirement_ids": [REQ],
                "description": "replaced `hello` with `hell`: no test failed",
            }])
        } else {
            serde_json::json!([])
        };
        std::fs::write(
            run.out.join("campaign.json"),
            serde_json::json!({ "survivors": survivors }).to_string(),
        )
        .unwrap();
        Ok(0)
    });
    InProcessExecutor::new(root)
        .with(SandboxRole::MutationRunner, mutation)
        .with(SandboxRole::WorkerA, worker_a)
        .with(SandboxRole::WorkerB, worker_b)
        .with(SandboxRole::IntegrationRunner, integration)
        .with(SandboxRole::Inspector, inspector)
}

/// A scripted project on a work store.
pub struct World<S> {
    _tmp: tempfile::TempDir,
    /// Scratch root (Job Site homes go here).
    pub root: PathBuf,
    /// The bare origin.
    pub origin: PathBuf,
    /// The work store.
    pub store: Arc<S>,
    /// The trusted clock every Job Site of this world uses.
    pub clock: ManualClock,
    /// The build contracts.
    pub contracts: Arc<KnownContracts>,
}

/// `wi-01`, `wi-02`, …
pub fn ids(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("wi-{i:02}")).collect()
}

/// A project with one work item per id, ready for building in `store`.
pub async fn world<S: WorkStore>(store: Arc<S>, items: &[String]) -> World<S> {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    let origin = root.join("origin.git");
    let seed = root.join("seed");
    std::fs::create_dir_all(&seed).unwrap();
    git(
        &root,
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            origin.to_str().unwrap(),
        ],
    );
    git(&seed, &["init", "-q", "-b", "main"]);
    let write = |p: &str, c: &str| {
        let path = seed.join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, c).unwrap();
    };
    write(
        ".protobot/projection.yaml",
        "version: 1\npaths:\n  - path: docs/\n    class: shared\n  - path: src/\n    class: implementation\n  - path: tests/\n    class: test\n  - path: .protobot/projection.yaml\n    class: shared\n  - path: .protobot/test-catalog.jsonl\n    class: shared\n",
    );
    let catalog: String = items
        .iter()
        .map(|id| {
            format!("{{\"test_id\":\"T-{id}\",\"paths\":[\"tests/{id}.sh\"],\"verifies\":[\"{REQ}\"]}}\n")
        })
        .collect();
    write(".protobot/test-catalog.jsonl", &catalog);
    write(
        "docs/spec.md",
        "REQ-SYNC-001: When the user runs greet, the CLI shall print hello.\n",
    );
    git(&seed, &["add", "-A"]);
    git(
        &seed,
        &[
            "-c",
            "user.name=maintainer",
            "-c",
            "user.email=m@example.invalid",
            "commit",
            "-qm",
            "spec",
        ],
    );
    git(&seed, &["push", "-q", origin.to_str().unwrap(), "main"]);
    let spec_commit = git(&seed, &["rev-parse", "HEAD"]);
    let mut contracts = BTreeMap::new();
    let mut records = Vec::new();
    for (n, id) in items.iter().enumerate() {
        let mut record = WorkItemRecord::new(id, "demo", State::ReadyForBuilding, 1);
        record.readiness = Readiness::complete();
        record.priority = if n % 5 == 0 { "high" } else { "normal" }.into();
        records.push(record);
        contracts.insert(
            id.clone(),
            BuildContract {
                work_item_id: id.clone(),
                materialization_key: format!("demo/{id}"),
                spec_commit: spec_commit.clone(),
                change_type: "undefined".into(),
                changed_requirement_ids: vec![REQ.into()],
                retired_requirement_ids: vec![],
                applicable_requirement_ids: vec![REQ.into()],
                impact: vec![],
                implementation_required: true,
                readiness: Readiness::complete(),
                dependencies: vec![],
                priority: "normal".into(),
                scopes: vec![],
                paths: vec![],
            },
        );
    }
    for record in records {
        store.import(Import::Record(record)).await.unwrap();
    }
    World {
        _tmp: tmp,
        root,
        origin,
        store,
        clock: ManualClock(Arc::new(Mutex::new(Timestamp::now()))),
        contracts: Arc::new(KnownContracts(contracts)),
    }
}

pub use crate::site::JOB_SITE_ACTIONS;

/// How to build a Job Site.
pub struct SiteOptions {
    /// Its trusted subject.
    pub subject: &'static str,
    /// How its scripted roles behave.
    pub behaviour: Behaviour,
    /// Fault injection.
    pub faults: Option<FaultHook>,
    /// Whether an Inspector producer runs.
    pub inspector: bool,
    /// Whether a mutation campaign runs as a second producer.
    pub mutation: bool,
    /// Genuine cycles before a spec question.
    pub max_cycles: u32,
    /// Reuse this Job Site home (its integration clone) instead of cloning anew.
    pub home: Option<PathBuf>,
    /// How long each Worker A and Worker B run takes (none: at once).
    pub worker_delay: Option<std::time::Duration>,
    /// Build slots (none: one build at a time); see [`JobSite::capacity`].
    pub capacity: Option<Arc<tokio::sync::Semaphore>>,
    /// The project's WIP limit.
    pub wip_limit: usize,
    /// Raised to shut the Job Site down (see [`Engine::stop`]).
    pub stop: Option<crate::engine::StopSignal>,
    /// Where run usage is read back from ([`Engine::usage`]); when set, every class asks
    /// for egress (through a proxy URL nothing listens on: the in-process executor makes no
    /// connection) and prices model `priced` at $1 / $2 per million input / output tokens.
    pub usage: Option<Arc<dyn crate::usage::UsageSource>>,
    /// The item budget ([`EngineConfig::item_budget`]).
    pub item_budget: Option<protobot_usage::ItemBudget>,
}

impl Default for SiteOptions {
    fn default() -> Self {
        SiteOptions {
            subject: "js-1",
            behaviour: Behaviour::default(),
            faults: None,
            inspector: true,
            mutation: false,
            max_cycles: 4,
            home: None,
            worker_delay: None,
            capacity: None,
            wip_limit: 1,
            stop: None,
            usage: None,
            item_budget: None,
        }
    }
}

/// A Job Site with its own clone of the origin.
pub fn site<S: WorkStore + 'static>(w: &World<S>, o: SiteOptions) -> JobSite<S, InProcessExecutor> {
    site_on(w, w.store.clone(), o)
}

/// [`site`] over `store`, another handle on the world's items (a watch-cached Kubernetes
/// store, say).
pub fn site_on<S: WorkStore + 'static, T: WorkStore + 'static>(
    w: &World<S>,
    store: Arc<T>,
    o: SiteOptions,
) -> JobSite<T, InProcessExecutor> {
    let home = o
        .home
        .clone()
        .unwrap_or_else(|| w.root.join(format!("{}-{}", o.subject, uuidish())));
    let clone = home.join("repo");
    if !clone.exists() {
        std::fs::create_dir_all(&home).unwrap();
        git(
            &home,
            &[
                "clone",
                "-q",
                w.origin.to_str().unwrap(),
                clone.to_str().unwrap(),
            ],
        );
    }
    let now = w.clock.now();
    let metered = o.usage.is_some();
    let class = || WorkerClass {
        command: vec!["scripted".into()],
        image: None,
        egress: metered,
        tiers: Default::default(),
        prices: if metered {
            protobot_usage::PriceTable(
                [(
                    "priced".to_owned(),
                    protobot_usage::ModelPrice {
                        input: protobot_usage::PerMillion(1_000_000),
                        output: protobot_usage::PerMillion(2_000_000),
                        ..Default::default()
                    },
                )]
                .into_iter()
                .collect(),
            )
        } else {
            Default::default()
        },
    };
    let mut config = EngineConfig::new(class(), class(), class(), home.join("scratch"));
    if metered {
        config.egress_proxy = Some("http://egress.invalid:3128".into());
    }
    config.max_cycles = o.max_cycles;
    config.item_budget = o.item_budget.clone();
    if o.inspector {
        config.producers.push(Producer {
            name: "inspector-1".into(),
            kind: ProducerKind::Inspector,
            class: class(),
        });
    }
    if o.mutation {
        config.producers.push(Producer {
            name: "mutation-1".into(),
            kind: ProducerKind::Mutation,
            class: class(),
        });
    }
    let mut roles = executor(&home.join("runs"), o.behaviour);
    if let Some(delay) = o.worker_delay {
        roles = roles
            .with_run_delay(SandboxRole::WorkerA, delay)
            .with_run_delay(SandboxRole::WorkerB, delay);
    }
    // Every context of a scripted site: project `demo`, policy `v1`, valid for a day,
    // `main` granted beside the project.
    let grant = Grant {
        project: "demo",
        role: Role::Materializer,
        subject: "materializer-1",
        actions: crate::site::REFRESH_ACTIONS,
        expires_at: now + SignedDuration::from_hours(24),
        policy_version: "v1",
    };
    let engine = Engine {
        store,
        executor: Arc::new(roles),
        clock: Arc::new(w.clock.clone()),
        triage: Arc::new(HeuristicTriage),
        context: AuthorizationContext::new(Grant {
            role: Role::JobSite,
            subject: o.subject,
            actions: JOB_SITE_ACTIONS,
            ..grant
        })
        .with_refs(["main"]),
        config,
        on_stage: None,
        faults: o.faults,
        stop: o.stop,
        usage: o.usage,
    };
    JobSite {
        engine: Arc::new(engine),
        reconciler: AuthorizationContext::new(Grant {
            role: Role::Reconciler,
            subject: "reconciler-1",
            actions: crate::site::RECONCILER_ACTIONS,
            ..grant
        })
        .with_refs(["main"]),
        contracts: w.contracts.clone(),
        repo_dir: clone,
        wip_limit: o.wip_limit,
        materializer: Some(AuthorizationContext::new(grant).with_refs(["main"])),
        capacity: o.capacity,
    }
}

fn uuidish() -> u64 {
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::SeqCst) as u64
}

/// Merge commits on origin's main first-parent history, by Work-Item trailer.
pub fn merges_on_main(origin: &Path) -> Vec<String> {
    let log = git(
        origin,
        &[
            "log",
            "--first-parent",
            "--merges",
            "--format=%(trailers:key=Work-Item,valueonly)",
            "main",
        ],
    );
    let mut ids: Vec<String> = log
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    ids.sort();
    ids
}
