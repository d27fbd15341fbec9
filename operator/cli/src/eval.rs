//! Result records of a Job Site run, and `protobot eval` (issue 21, docs/evaluation.md).
//!
//! The shell around `protobot_eval`: it reads what a run left on disk (the
//! engine's trace lines, each integration run's `results.json`, each
//! producer's `findings.jsonl`), the egress proxy's decision events (captured
//! from its `protobot::egress` tracing target) and the model endpoint's
//! request log, runs the fixture's executable visible checks on the merged
//! product in a sandbox, and writes `trace.json` (the bundle) and one record
//! per stage. Building the records is `protobot_eval::records::build`, pure.
//!
//! `protobot eval FIXTURE --out DIR` runs a corpus fixture end to end: only a
//! fixture the Job Site has a bundled example project for (`cli-sync`, whose
//! requirements must equal the example's); any other gets a structured
//! refusal (exit 2, one JSON object on stdout, one line on stderr).

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    sync::{Arc, Mutex, OnceLock},
    time::SystemTime,
};

use clap::Args;
use protobot_demo::example::{PROJECT, REQUIREMENTS, VISIBLE_CHECKS};
use protobot_eval::{
    evidence::{
        CheckOutcome, EgressDecision, GateEvidence, InspectionEvidence, JobSiteRun, ModelRequest,
        ProducerFindings,
    },
    fixture::{ExampleRequirement, Fixture, plan},
    records::build,
    schema::{
        Component, ComponentName, Environment, Mode, Model, ModelRole, ResultRecord, Setting,
        Trace, TraceKind, sha256_digest,
    },
};
use protobot_jobsite::{
    engine::InspectionReport,
    inspection::{ProducerKind, parse_report},
    triage::TestResult,
};
use serde::Deserialize;

/// The cli-sync fixture the demo's example is derived from, bundled.
pub const BUNDLED_FIXTURE: &[u8] =
    include_bytes!("../../../tests/fixtures/upstream/eval-corpus/examples/cli-sync/fixture.yaml");
/// Where the bundled fixture comes from.
pub const BUNDLED_ORIGIN: &str =
    "tests/fixtures/upstream/eval-corpus/examples/cli-sync/fixture.yaml (bundled)";

/// Arguments of `protobot eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// The corpus fixture (eval-corpus/examples/<id>/fixture.yaml).
    pub fixture: PathBuf,
    /// Where to write the records and trace.json (the run itself goes to DIR/run).
    #[arg(long)]
    pub out: PathBuf,
    /// Workers and Inspector: scripted, or a real agent CLI, OpenCode or Claude Code (as for
    /// `protobot demo`).
    #[arg(long, value_enum, default_value = "scripted")]
    pub harness: crate::demo::Harness,
    /// The OpenCode binary for --harness opencode.
    #[arg(long)]
    pub opencode: Option<PathBuf>,
    /// The Claude Code binary for --harness claude-code.
    #[arg(long)]
    pub claude: Option<PathBuf>,
    /// Run Workers (and the fixture's checks) as plain processes when bubblewrap is missing (unsafe).
    #[arg(long)]
    pub insecure_no_sandbox: bool,
}

/// The fixture a run is evaluated against.
#[derive(Clone, Debug)]
pub struct Target {
    /// The parsed fixture.
    pub fixture: Fixture,
    /// Where the records go.
    pub results: PathBuf,
}

/// The bundled fixture (its parse is checked by a test; a failure here is a defect of the binary).
pub fn bundled(results: PathBuf) -> Result<Target, protobot_eval::fixture::FixtureError> {
    Ok(Target {
        fixture: Fixture::parse(BUNDLED_FIXTURE, BUNDLED_ORIGIN)?,
        results,
    })
}

/// The example's requirements, as `plan` compares them.
pub fn example_requirements() -> Vec<ExampleRequirement<'static>> {
    REQUIREMENTS
        .iter()
        .map(|&(id, kind, text)| ExampleRequirement { id, kind, text })
        .collect()
}

// ---- the egress proxy's decisions, from its tracing events ----

/// The proxy's decisions seen in this process.
#[derive(Clone, Debug, Default)]
pub struct EgressAudit(Arc<Mutex<Vec<EgressDecision>>>);

static AUDIT: OnceLock<EgressAudit> = OnceLock::new();

impl EgressAudit {
    /// The capture of this process. It sees decisions once its [`EgressAudit::layer`] is part
    /// of the process's subscriber (`main` installs it for `demo`, `eval`, `run` and `retry`).
    pub fn global() -> EgressAudit {
        AUDIT.get_or_init(EgressAudit::default).clone()
    }

    /// The tracing layer that records `protobot::egress` events into this capture.
    pub(crate) fn layer(&self) -> AuditLayer {
        AuditLayer(self.clone())
    }

    /// Every decision so far, in order.
    pub fn decisions(&self) -> Vec<EgressDecision> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

/// Records `protobot::egress` events into an [`EgressAudit`].
pub(crate) struct AuditLayer(EgressAudit);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for AuditLayer {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if event.metadata().target() != "protobot::egress" {
            return;
        }
        let mut visitor = Fields(EgressDecision::default());
        event.record(&mut visitor);
        if let Ok(mut v) = (self.0).0.lock() {
            v.push(visitor.0);
        }
    }
}

struct Fields(EgressDecision);

impl Fields {
    fn set(&mut self, name: &str, value: String) {
        let d = &mut self.0;
        match name {
            "work_item" => d.work_item = value,
            "role" => d.role = value,
            "trace_id" => d.trace_id = value,
            "destination" => d.destination = value,
            "method" => d.method = value,
            "path" => d.path = value,
            "outcome" => d.outcome = value,
            "reason" => d.reason = value,
            _ => {}
        }
    }
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.set(field.name(), value.to_owned());
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        if field.name() == "status" {
            self.0.status = u16::try_from(value).unwrap_or(u16::MAX);
        }
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        if field.name() == "status" {
            self.0.status = u16::try_from(value).unwrap_or(u16::MAX);
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.set(field.name(), format!("{value:?}"));
    }
}

// ---- what the run left on disk ----

#[derive(Debug, Default, Deserialize)]
struct Results {
    #[serde(default)]
    build_errors: Vec<serde_json::Value>,
    #[serde(default)]
    results: Vec<TestResult>,
}

/// The executor's name for a run id (`tools::safe_component`, without its length cap).
fn safe(run_id: &str) -> String {
    run_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The collected `/out` folders under `out_root` whose name starts with `prefix`, oldest first.
fn out_dirs(out_root: &Path, prefix: &str) -> Vec<(String, PathBuf)> {
    let mut found: Vec<(SystemTime, String, PathBuf)> = std::fs::read_dir(out_root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let modified = e.metadata().and_then(|m| m.modified()).ok()?;
            name.starts_with(prefix).then(|| (modified, name, e.path()))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, n, p)| (n, p)).collect()
}

/// Every integration run of `work_item` (`<wi>-c<cycle>-int-<candidate>`), in the order they ran.
pub fn gates(out_root: &Path, work_item: &str) -> Vec<GateEvidence> {
    let prefix = format!("{}-c", safe(work_item));
    out_dirs(out_root, &prefix)
        .into_iter()
        .filter_map(|(name, path)| {
            let rest = name.strip_prefix(&prefix)?;
            let (cycle, tail) = rest.split_once("-int-")?;
            let cycle: u32 = cycle.parse().ok()?;
            let bytes = std::fs::read(path.join("results.json")).ok()?;
            let results: Results = serde_json::from_slice(&bytes).ok()?;
            let run = format!(
                "{prefix}{cycle}-int-{}",
                tail.rsplit_once('-').map_or(tail, |(c, _)| c)
            );
            Some(GateEvidence {
                cycle,
                run,
                results: results.results,
                build_errors: results.build_errors.len(),
            })
        })
        .collect()
}

/// What each producer of each inspection run reported (its last `findings.jsonl`).
pub fn inspections(out_root: &Path, reports: &[InspectionReport]) -> Vec<InspectionEvidence> {
    reports
        .iter()
        .map(|report| InspectionEvidence {
            report: report.clone(),
            producers: report
                .producers
                .iter()
                .map(|producer| {
                    let prefix = format!("{}-", safe(&format!("{}-{producer}", report.run_id)));
                    let findings = out_dirs(out_root, &prefix)
                        .last()
                        .and_then(|(_, p)| std::fs::read(p.join("findings.jsonl")).ok())
                        .and_then(|b| parse_report(producer, ProducerKind::Inspector, &b).ok())
                        .unwrap_or_default();
                    ProducerFindings {
                        producer: producer.clone(),
                        findings,
                    }
                })
                .collect(),
        })
        .collect()
}

// ---- the fixture's checks on the merged product ----

/// Runs each of the fixture's visible checks on `branch` of the bare
/// repository `origin`, extracted under `work`, each in a bubblewrap sandbox
/// without network (as a plain process only with `insecure`).
pub fn visible_checks(
    fixture: &Fixture,
    origin: &Path,
    branch: &str,
    work: &Path,
    insecure: bool,
) -> Vec<CheckOutcome> {
    let product = work.join("product");
    let _ = std::fs::remove_dir_all(work);
    let extracted = std::fs::create_dir_all(&product)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            let tar = work.join("product.tar");
            let archive = Command::new("git")
                .arg("--git-dir")
                .arg(origin)
                .args(["archive", "--format=tar", "-o"])
                .arg(&tar)
                .arg(branch)
                .output()
                .map_err(|e| e.to_string())?;
            if !archive.status.success() {
                return Err(String::from_utf8_lossy(&archive.stderr).into_owned());
            }
            let untar = Command::new("tar")
                .arg("-xf")
                .arg(&tar)
                .arg("-C")
                .arg(&product)
                .output()
                .map_err(|e| e.to_string())?;
            if untar.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&untar.stderr).into_owned())
            }
        });
    fixture
        .visible_checks
        .iter()
        .map(|check| {
            let outcome = |passed, evidence: String| CheckOutcome {
                id: check.id.clone(),
                requirement_ids: check.requirement_ids.clone(),
                passed,
                evidence,
            };
            if let Err(e) = &extracted {
                return outcome(
                    false,
                    format!("the merged product could not be extracted: {e}"),
                );
            }
            let Some(&(_, script)) = VISIBLE_CHECKS.iter().find(|(id, _)| *id == check.id) else {
                return outcome(
                    false,
                    format!(
                        "no executable form of {} is bundled with this protobot, so it did not run",
                        check.id
                    ),
                );
            };
            let mut cmd = if insecure {
                let mut c = Command::new("timeout");
                c.arg("120");
                c
            } else {
                let mut c = Command::new("timeout");
                c.args([
                    "120",
                    "bwrap",
                    "--ro-bind",
                    "/",
                    "/",
                    "--dev",
                    "/dev",
                    "--proc",
                    "/proc",
                    "--tmpfs",
                    "/tmp",
                    "--ro-bind",
                ])
                .arg(&product)
                .arg(&product)
                .args(["--unshare-all", "--die-with-parent", "--chdir"])
                .arg(&product);
                c
            };
            cmd.args(["sh", "-c", script]).current_dir(&product);
            match cmd.output() {
                Ok(o) => {
                    let text = format!(
                        "{}{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    );
                    let tail: Vec<&str> = text.lines().rev().take(5).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    outcome(
                        o.status.success(),
                        format!("exit status {:?}; {}", o.status.code(), tail.join(" | ")),
                    )
                }
                Err(e) => outcome(false, format!("the check could not start: {e}")),
            }
        })
        .collect()
}

// ---- the environment and the records ----

/// The environment of a local run: the models per role (none for scripted roles).
pub fn environment(models: Vec<Model>) -> Environment {
    let revision = format!("protobot {}", env!("CARGO_PKG_VERSION"));
    let component = |name| Component {
        name,
        revision: revision.clone(),
        version: None,
    };
    Environment {
        mode: Mode::Local,
        hosted_cluster: false,
        external_service_credentials: false,
        models,
        components: vec![
            component(ComponentName::JobSite),
            component(ComponentName::EarsManager),
            component(ComponentName::ValidationRules),
            component(ComponentName::WmsAdapter),
            component(ComponentName::SourceControlManager),
            Component {
                name: ComponentName::EvalRunner,
                revision,
                version: Some("result-schema-v1".into()),
            },
        ],
    }
}

/// The models of an agent run: the endpoint's model for each role, with how many requests it got.
pub fn agent_models(model: &str, harness: &str, requests: &[ModelRequest]) -> Vec<Model> {
    [
        (ModelRole::WorkerA, "worker-a"),
        (ModelRole::WorkerB, "worker-b"),
        (ModelRole::Inspector, "inspector"),
    ]
    .into_iter()
    .map(|(role, name)| {
        let n = requests
            .iter()
            .filter(|r| r.role.as_deref() == Some(name))
            .count();
        Model {
            role,
            name: model.to_owned(),
            settings: [
                ("harness".to_owned(), Setting::Text(harness.to_owned())),
                (
                    "endpoint".to_owned(),
                    Setting::Text("protobot-model-double (deterministic)".into()),
                ),
                (
                    "requests".to_owned(),
                    Setting::Integer(i64::try_from(n).unwrap_or(i64::MAX)),
                ),
            ]
            .into_iter()
            .collect(),
        }
    })
    .collect()
}

/// What [`write`] wrote.
#[derive(Debug, serde::Serialize)]
pub struct Written {
    /// The folder.
    pub dir: PathBuf,
    /// The trace bundle.
    pub trace: PathBuf,
    /// Each record's file and whether it passed.
    pub records: Vec<RecordFile>,
}

/// One written record.
#[derive(Debug, serde::Serialize)]
pub struct RecordFile {
    /// Its result id.
    pub result_id: String,
    /// Its file.
    pub path: PathBuf,
    /// `scores.job_site.pass`.
    pub pass: bool,
}

/// Writes `run` as `dir/trace.json` and its records as `dir/<result_id>.json`.
pub fn write(dir: &Path, run: &JobSiteRun) -> std::io::Result<Written> {
    std::fs::create_dir_all(dir)?;
    let bundle = serde_json::to_vec_pretty(run).map_err(std::io::Error::other)?;
    let trace = dir.join("trace.json");
    std::fs::write(&trace, &bundle)?;
    let traces = [Trace {
        kind: TraceKind::JobSite,
        uri: "trace.json".into(),
        digest: Some(sha256_digest(&bundle)),
    }];
    let records: Vec<ResultRecord> = build(run, &traces);
    let mut files = Vec::new();
    for r in &records {
        let path = dir.join(format!("{}.json", r.result_id));
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?,
        )?;
        files.push(RecordFile {
            result_id: r.result_id.clone(),
            path,
            pass: r.scores.job_site.as_ref().is_some_and(|s| s.pass),
        });
    }
    Ok(Written {
        dir: dir.to_path_buf(),
        trace,
        records: files,
    })
}

// ---- protobot eval ----

/// One refusal, as a structured answer.
fn refuse(fixture: &str, category: &str, reason: &str) -> ExitCode {
    let answer = serde_json::json!({
        "fixture": fixture,
        "runnable": false,
        "category": category,
        "reason": reason,
        "runnable_fixtures": [PROJECT],
    });
    eprintln!("protobot: unable to evaluate {fixture}: {reason}");
    crate::output::print_line_with(&answer.to_string(), ExitCode::from(2))
}

/// Runs `protobot eval`.
pub fn eval(args: EvalArgs) -> ExitCode {
    let origin = args.fixture.display().to_string();
    let bytes = match std::fs::read(&args.fixture) {
        Ok(b) => b,
        Err(e) => {
            return refuse(
                &origin,
                "fixture-unreadable",
                &format!("failed to read {origin}: {e}"),
            );
        }
    };
    let fixture = match Fixture::parse(&bytes, &origin) {
        Ok(f) => f,
        Err(e) => return refuse(&origin, e.category(), &e.to_string()),
    };
    if let Err(e) = plan(&fixture, PROJECT, &example_requirements()) {
        return refuse(&fixture.id, e.category(), &e.to_string());
    }
    let target = Target {
        fixture,
        results: args.out.clone(),
    };
    crate::demo::demo_with(
        crate::demo::DemoArgs {
            output: crate::demo::Output::Json,
            dir: Some(args.out.join("run")),
            insecure_no_sandbox: args.insecure_no_sandbox,
            harness: args.harness,
            opencode: args.opencode,
            claude: args.claude,
            budget_per_item: None,
        },
        Some(target),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_fixture_is_the_example_the_demo_builds() {
        let t = bundled(PathBuf::from("r")).unwrap();
        assert_eq!(t.fixture.id, PROJECT);
        assert_eq!(plan(&t.fixture, PROJECT, &example_requirements()), Ok(()));
        for check in &t.fixture.visible_checks {
            assert!(
                VISIBLE_CHECKS.iter().any(|(id, _)| *id == check.id),
                "{} has an executable form",
                check.id
            );
        }
    }

    #[test]
    fn the_executor_names_are_matched() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        for (i, (name, body)) in [
            ("WI-1-c1-int-abcdef123456-0a1b", r#"{"results":[{"test_id":"t","requirement_ids":["REQ-A-00001"],"status":"fail","baseline":false}]}"#),
            ("WI-1-c2-int-bcdef1234567-0a1c", r#"{"results":[],"build_errors":[{"owner":"worker-b","artifact":"a","message":"m"}]}"#),
            ("WI-1-c1-a-0a1d", "{}"),
            ("WI-10-c1-int-x-1", "not json"),
        ]
        .into_iter()
        .enumerate()
        {
            std::fs::create_dir_all(out.join(name)).unwrap();
            std::fs::write(out.join(name).join("results.json"), body).unwrap();
            // Oldest first: the order the runs happened in.
            let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i as u64);
            std::fs::File::open(out.join(name)).unwrap().set_modified(at).unwrap();
        }
        let g = gates(out, "WI-1");
        assert_eq!(g.len(), 2, "{g:?}");
        assert_eq!((g[0].cycle, g[0].results.len()), (1, 1));
        assert_eq!(g[0].run, "WI-1-c1-int-abcdef123456");
        assert_eq!((g[1].cycle, g[1].build_errors), (2, 1));
    }
}
