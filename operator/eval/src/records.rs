//! Result records from a run's evidence, one per Job Site stage and one for
//! the Job Site stage as a whole (pure; `docs/evaluation.md` is the reference).
//!
//! The corpus schema knows three stages (`requirements`, `job-site`,
//! `end-to-end`); Worker A, Worker B, triage, inspection and merge are all
//! parts of its `job-site` stage. So every record here has `stage: job-site`,
//! `projection: job-site-input` (the Job Site starts from the golden
//! requirements) and `scores.job_site`; the Job Site stage a record scores is
//! in its `result_id` (`<fixture>-<stage>-<run>`), its summary, and the
//! `detail` of each failure (`worker-b: …`). What `visible_checks` counts
//! depends on the record:
//!
//! | record | visible checks (each passed or failed) |
//! | --- | --- |
//! | `job-site` | the fixture's worker-visible checks, run by the evaluator on the merged product |
//! | `worker-a` | per approved requirement: a test of the last gate verifies it and ran |
//! | `worker-b` | per test of the last gate: it passed |
//! | `triage` | per cycle: the decision agrees with the gate (pass exactly when every test passed and nothing failed to build) |
//! | `inspection` | per fixture check: the last inspection's verdict agrees with it (sealing while it fails is false readiness) |
//! | `merge` | the merge landed on the default branch; the merged tree is the inspected candidate |
//!
//! `holdout_checks` is 0/0/0 in every record: the fixture's holdout files are
//! evaluator-only and not part of the shared corpus, so none ran (each summary
//! says so). `failures` holds everything observed, recovered failures of
//! earlier cycles included; `critical_failures` those that decide the outcome,
//! and a record passes exactly when it has none.

use protobot_jobsite::{
    inspection::Verdict,
    ledger::Disposition,
    triage::{Status, TestResult},
};

use crate::{
    evidence::{CheckOutcome, GateEvidence, InspectionEvidence, JobSiteRun},
    schema::{
        CheckCounts, Environment, Failure, FailureCategory, Inputs, JobSiteScores, ModelRole,
        Projection, Reproducibility, ResultRecord, SCHEMA_VERSION, Scores, Stage, Trace,
        identifier_part,
    },
};

/// The Job Site stages a record can score.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobSiteStage {
    /// The whole Job Site stage.
    JobSite,
    /// Worker A (tests).
    WorkerA,
    /// Worker B (implementation).
    WorkerB,
    /// Triage.
    Triage,
    /// Inspection.
    Inspection,
    /// Merge.
    Merge,
}

impl JobSiteStage {
    /// Every stage, the whole first.
    pub const ALL: [JobSiteStage; 6] = [
        JobSiteStage::JobSite,
        JobSiteStage::WorkerA,
        JobSiteStage::WorkerB,
        JobSiteStage::Triage,
        JobSiteStage::Inspection,
        JobSiteStage::Merge,
    ];

    /// Its name in result ids and failure details.
    pub fn as_str(self) -> &'static str {
        match self {
            JobSiteStage::JobSite => "job-site",
            JobSiteStage::WorkerA => "worker-a",
            JobSiteStage::WorkerB => "worker-b",
            JobSiteStage::Triage => "triage",
            JobSiteStage::Inspection => "inspection",
            JobSiteStage::Merge => "merge",
        }
    }

    /// The model role whose model the stage used, if any.
    fn model_role(self) -> Option<ModelRole> {
        match self {
            JobSiteStage::WorkerA => Some(ModelRole::WorkerA),
            JobSiteStage::WorkerB => Some(ModelRole::WorkerB),
            JobSiteStage::Inspection => Some(ModelRole::Inspector),
            JobSiteStage::JobSite | JobSiteStage::Triage | JobSiteStage::Merge => None,
        }
    }
}

/// A stage's score before it becomes a record.
#[derive(Debug, Default)]
struct Scored {
    checks: Vec<bool>,
    summary: String,
    failures: Vec<Failure>,
    critical: Vec<Failure>,
}

impl Scored {
    fn fail(
        &mut self,
        critical: bool,
        category: FailureCategory,
        detail: String,
        evidence: String,
    ) {
        let f = Failure {
            category,
            stage: Some(Stage::JobSite),
            detail,
            evidence,
        };
        if critical {
            self.critical.push(f.clone());
        }
        self.failures.push(f);
    }
}

/// The result id of `stage` for `run`.
pub fn result_id(run: &JobSiteRun, stage: JobSiteStage) -> String {
    format!(
        "{}-{}-{}",
        identifier_part(&run.fixture.id),
        stage.as_str(),
        identifier_part(&run.run_id)
    )
}

/// Every record of `run`, the whole Job Site stage first; `traces` are the
/// references to the run's trace bundle (it cannot name its own digest).
pub fn build(run: &JobSiteRun, traces: &[Trace]) -> Vec<ResultRecord> {
    JobSiteStage::ALL
        .iter()
        .map(|s| record(run, *s, traces))
        .collect()
}

/// The record of one stage.
pub fn record(run: &JobSiteRun, stage: JobSiteStage, traces: &[Trace]) -> ResultRecord {
    let scored = match stage {
        JobSiteStage::JobSite => job_site(run),
        JobSiteStage::WorkerA => worker_a(run),
        JobSiteStage::WorkerB => worker_b(run),
        JobSiteStage::Triage => triage(run),
        JobSiteStage::Inspection => inspection(run),
        JobSiteStage::Merge => merge(run),
    };
    let holdout = if run.holdout_assets.is_empty() {
        " The fixture lists no holdout checks.".to_owned()
    } else {
        format!(
            " Holdout checks not run: the fixture lists {} ({}), whose files are evaluator-only and not in the shared corpus.",
            run.holdout_assets.len(),
            run.holdout_assets.join(", ")
        )
    };
    let Environment {
        mode,
        hosted_cluster,
        external_service_credentials,
        models,
        components,
    } = &run.environment;
    let models = match stage {
        JobSiteStage::JobSite => models.clone(),
        other => models
            .iter()
            .filter(|m| Some(m.role) == other.model_role())
            .cloned()
            .collect(),
    };
    ResultRecord {
        schema_version: SCHEMA_VERSION,
        result_id: result_id(run, stage),
        fixture_id: run.fixture.id.clone(),
        corpus_revision: run.fixture.corpus_revision.clone(),
        run_id: run.run_id.clone(),
        recorded_at: run.recorded_at.clone(),
        stage: Stage::JobSite,
        reproducibility: Reproducibility {
            inputs: Inputs {
                fixture_id: run.fixture.id.clone(),
                corpus_revision: run.fixture.corpus_revision.clone(),
                fixture_digest: run.fixture.digest.clone(),
                projection: Projection::JobSiteInput,
            },
            environment: Environment {
                mode: *mode,
                hosted_cluster: *hosted_cluster,
                external_service_credentials: *external_service_credentials,
                models,
                components: components.clone(),
            },
        },
        scores: Scores {
            requirements: None,
            job_site: Some(JobSiteScores {
                pass: scored.critical.is_empty(),
                summary: format!("{}: {}{holdout}", stage.as_str(), scored.summary),
                visible_checks: CheckCounts::of(scored.checks.iter().copied()),
                holdout_checks: CheckCounts::default(),
            }),
            end_to_end: None,
        },
        failures: scored.failures,
        critical_failures: scored.critical,
        traces: traces.to_vec(),
    }
}

/// `trace.json#/<pointer>`: where in the bundle the evidence is.
fn at(pointer: impl std::fmt::Display) -> String {
    format!("trace.json#/{pointer}")
}

/// The last gate of the build (the one the merged candidate passed, when it merged).
fn last_gate(run: &JobSiteRun) -> Option<(usize, &GateEvidence)> {
    run.gates.iter().enumerate().next_back()
}

/// The gate of each cycle: the first integration run recorded for it.
fn cycle_gate(run: &JobSiteRun, cycle: u32) -> Option<(usize, &GateEvidence)> {
    run.gates.iter().enumerate().find(|(_, g)| g.cycle == cycle)
}

fn own(results: &[TestResult]) -> impl Iterator<Item = &TestResult> {
    results.iter().filter(|r| !r.baseline)
}

fn status_str(s: Status) -> &'static str {
    match s {
        Status::Pass => "passed",
        Status::Fail => "failed",
        Status::Error => "could not run",
    }
}

/// The decision of cycle `cycle` (`pass`, `implementation`, `test`, `both`, …).
fn decision_of(run: &JobSiteRun, cycle: u32) -> Option<&str> {
    run.cycles
        .iter()
        .find(|c| c.cycle == cycle)
        .map(|c| c.decision.as_str())
}

fn is_pass(decision: &str) -> bool {
    decision == "pass" || decision == "passed"
}

/// The inspection the merge was decided on: the last one.
fn last_inspection(run: &JobSiteRun) -> Option<(usize, &InspectionEvidence)> {
    run.inspections.iter().enumerate().next_back()
}

/// Findings of every inspection whose proposed disposition routes to `side`.
fn findings_for<'a>(
    run: &'a JobSiteRun,
    wanted: &'a [Disposition],
) -> impl Iterator<
    Item = (
        usize,
        &'a InspectionEvidence,
        &'a str,
        &'a protobot_jobsite::inspection::ReportedFinding,
    ),
> + 'a {
    run.inspections
        .iter()
        .enumerate()
        .flat_map(move |(i, ins)| {
            ins.producers.iter().flat_map(move |p| {
                p.findings
                    .iter()
                    .filter(|f| wanted.contains(&f.disposition))
                    .map(move |f| (i, ins, p.producer.as_str(), f))
            })
        })
}

fn sealed(ins: &InspectionEvidence) -> bool {
    matches!(ins.report.verdict, Verdict::Sealed { .. })
}

fn worker_a(run: &JobSiteRun) -> Scored {
    let mut s = Scored::default();
    let Some((g, gate)) = last_gate(run) else {
        s.fail(
            true,
            FailureCategory::ExecutionFailure,
            "worker-a: no integration run recorded, so no test of Worker A ever ran".into(),
            at("gates"),
        );
        s.summary = "no integration run recorded.".into();
        return s;
    };
    for req in &run.inputs.requirement_ids {
        let verified = own(&gate.results)
            .any(|r| r.requirement_ids.contains(req) && r.status != Status::Error);
        s.checks.push(verified);
        if !verified {
            s.fail(
                true,
                FailureCategory::VisibleCheckFailure,
                format!(
                    "worker-a: no test of the last gate (cycle {}) verifies {req} and runs",
                    gate.cycle
                ),
                at(format!("gates/{g}")),
            );
        }
    }
    // Cycles whose failures triage attributed to the tests.
    for c in &run.cycles {
        if matches!(c.decision.as_str(), "test" | "both") {
            s.fail(
                false,
                FailureCategory::VisibleCheckFailure,
                format!(
                    "worker-a, cycle {}: triage attributed the failing gate to the tests ({})",
                    c.cycle, c.decision
                ),
                at(format!("cycles/{}", c.cycle.saturating_sub(1))),
            );
        }
    }
    let test_findings = [
        Disposition::TestDefect,
        Disposition::TestGap,
        Disposition::BothDefective,
    ];
    let last = last_inspection(run).map(|(i, _)| i);
    let mut findings = Vec::new();
    for (i, ins, producer, f) in findings_for(run, &test_findings) {
        findings.push((
            Some(i) == last && !sealed(ins),
            format!(
                "worker-a: {producer} reported {} ({:?}) on {}: {}",
                f.subject,
                f.disposition,
                f.requirement_ids.join(", "),
                f.summary
            ),
            at(format!("inspections/{i}")),
        ));
    }
    for (critical, detail, evidence) in findings {
        s.fail(
            critical,
            FailureCategory::VisibleCheckFailure,
            detail,
            evidence,
        );
    }
    let tests = own(&gate.results).count();
    s.summary = format!(
        "{} of {} approved requirements verified by a test that ran in the last gate ({tests} tests, cycle {}).",
        s.checks.iter().filter(|c| **c).count(),
        run.inputs.requirement_ids.len(),
        gate.cycle
    );
    s
}

fn worker_b(run: &JobSiteRun) -> Scored {
    let mut s = Scored::default();
    let Some((last, gate)) = last_gate(run) else {
        s.fail(
            true,
            FailureCategory::ExecutionFailure,
            "worker-b: no integration run recorded, so Worker B's implementation was never tested"
                .into(),
            at("gates"),
        );
        s.summary = "no integration run recorded.".into();
        return s;
    };
    for (g, earlier) in run.gates.iter().enumerate().take(last) {
        let decision = decision_of(run, earlier.cycle).unwrap_or("unknown");
        if !matches!(decision, "implementation" | "both") {
            continue;
        }
        for r in own(&earlier.results).filter(|r| r.status != Status::Pass) {
            s.fail(
                false,
                FailureCategory::VisibleCheckFailure,
                format!(
                    "worker-b, cycle {}: {} ({}) {}; triage: {decision}",
                    earlier.cycle,
                    r.test_id,
                    r.requirement_ids.join(", "),
                    status_str(r.status)
                ),
                at(format!("gates/{g}")),
            );
        }
    }
    for r in own(&gate.results) {
        let passed = r.status == Status::Pass;
        s.checks.push(passed);
        if !passed {
            s.fail(
                true,
                FailureCategory::VisibleCheckFailure,
                format!(
                    "worker-b: {} ({}) {} in the last gate (cycle {})",
                    r.test_id,
                    r.requirement_ids.join(", "),
                    status_str(r.status),
                    gate.cycle
                ),
                at(format!("gates/{last}")),
            );
        }
    }
    if gate.build_errors > 0 {
        s.fail(
            true,
            FailureCategory::VisibleCheckFailure,
            format!(
                "worker-b: {} build errors in the last gate",
                gate.build_errors
            ),
            at(format!("gates/{last}")),
        );
    }
    let impl_findings = [
        Disposition::ImplementationDefect,
        Disposition::BothDefective,
    ];
    let last_ins = last_inspection(run).map(|(i, _)| i);
    let mut findings = Vec::new();
    for (i, ins, producer, f) in findings_for(run, &impl_findings) {
        findings.push((
            Some(i) == last_ins && !sealed(ins),
            format!(
                "worker-b: {producer} reported {} ({:?}) on {}: {}",
                f.subject,
                f.disposition,
                f.requirement_ids.join(", "),
                f.summary
            ),
            at(format!("inspections/{i}")),
        ));
    }
    for (critical, detail, evidence) in findings {
        s.fail(
            critical,
            FailureCategory::VisibleCheckFailure,
            detail,
            evidence,
        );
    }
    let first_green = run
        .cycles
        .iter()
        .find(|c| is_pass(&c.decision))
        .map(|c| c.cycle);
    s.summary = format!(
        "{} of {} tests passed in the last gate (cycle {}); {}.",
        s.checks.iter().filter(|c| **c).count(),
        s.checks.len(),
        gate.cycle,
        match first_green {
            Some(1) => "passed the independent tests on the first cycle".to_owned(),
            Some(n) => format!(
                "passed the independent tests on cycle {n}, after {} rework cycles",
                n - 1
            ),
            None => "never passed the independent tests".to_owned(),
        }
    );
    s
}

fn triage(run: &JobSiteRun) -> Scored {
    let mut s = Scored::default();
    let mut reworks = 0;
    let mut confirmed = 0;
    for (i, c) in run.cycles.iter().enumerate() {
        if c.decision == "transient" {
            continue;
        }
        let Some((g, gate)) = cycle_gate(run, c.cycle) else {
            s.fail(
                true,
                FailureCategory::ExecutionFailure,
                format!(
                    "triage, cycle {}: decided {} but no integration run of the cycle is recorded",
                    c.cycle, c.decision
                ),
                at(format!("cycles/{i}")),
            );
            s.checks.push(false);
            continue;
        };
        let green = gate.build_errors == 0
            && own(&gate.results).next().is_some()
            && own(&gate.results).all(|r| r.status == Status::Pass);
        let agrees = is_pass(&c.decision) == green;
        s.checks.push(agrees);
        if !agrees {
            s.fail(
                true,
                FailureCategory::VisibleCheckFailure,
                format!(
                    "triage, cycle {}: decided {} while the gate {}",
                    c.cycle,
                    c.decision,
                    if green { "passed" } else { "failed" }
                ),
                at(format!("gates/{g}")),
            );
        }
        if !is_pass(&c.decision) {
            reworks += 1;
            // Confirmed by the fix: the next cycle's gate passes.
            if run
                .cycles
                .get(i + 1)
                .is_some_and(|next| is_pass(&next.decision))
            {
                confirmed += 1;
            }
        }
    }
    let decisions: Vec<String> = run
        .cycles
        .iter()
        .map(|c| format!("{}={}", c.cycle, c.decision))
        .collect();
    s.summary = format!(
        "{} of {} cycle decisions agree with their gate (cycles: {}); {confirmed} of {reworks} rework attributions confirmed by the next cycle passing.",
        s.checks.iter().filter(|c| **c).count(),
        s.checks.len(),
        if decisions.is_empty() {
            "none".to_owned()
        } else {
            decisions.join(", ")
        }
    );
    s
}

fn inspection(run: &JobSiteRun) -> Scored {
    let mut s = Scored::default();
    let Some((i, ins)) = last_inspection(run) else {
        s.fail(
            true,
            FailureCategory::ExecutionFailure,
            "inspection: no inspection run recorded".into(),
            at("inspections"),
        );
        s.summary = "no inspection run recorded.".into();
        return s;
    };
    let findings: Vec<_> = ins
        .producers
        .iter()
        .flat_map(|p| p.findings.iter())
        .collect();
    for check in &run.visible_checks {
        let flagged = findings.iter().any(|f| {
            f.requirement_ids
                .iter()
                .any(|r| check.requirement_ids.contains(r))
        });
        let agrees = check.passed || !sealed(ins) || flagged;
        s.checks.push(agrees);
        if !agrees {
            s.fail(
                true,
                FailureCategory::FalseReadiness,
                format!(
                    "inspection: run {} sealed with no finding on {} while the fixture's check {} fails on the merged product",
                    ins.report.run_id,
                    check.requirement_ids.join(", "),
                    check.id
                ),
                at(format!("inspections/{i}")),
            );
        }
    }
    let runs: Vec<String> = run
        .inspections
        .iter()
        .map(|r| {
            format!(
                "{} {} with {} findings",
                r.report.run_id,
                match &r.report.verdict {
                    Verdict::Sealed { .. } => "sealed",
                    Verdict::Rework { .. } => "sent back for rework",
                    Verdict::Blocked { .. } => "blocked",
                },
                r.producers.iter().map(|p| p.findings.len()).sum::<usize>()
            )
        })
        .collect();
    s.summary = format!(
        "{} of {} fixture checks agree with the last inspection's verdict; runs: {}.",
        s.checks.iter().filter(|c| **c).count(),
        s.checks.len(),
        runs.join("; ")
    );
    s
}

fn merge(run: &JobSiteRun) -> Scored {
    let mut s = Scored::default();
    let o = &run.outcome;
    let landed = o.state == "completed" && o.merge_commit.is_some() && o.main_contains_merge;
    s.checks.push(landed);
    if !landed {
        s.fail(
            true,
            FailureCategory::ExecutionFailure,
            format!(
                "merge: the work item is {} and {}{}",
                o.state,
                match (&o.merge_commit, o.main_contains_merge) {
                    (Some(m), false) => format!("the default branch does not contain {m}"),
                    (Some(_), true) => "its merge is on the default branch".to_owned(),
                    (None, _) => "nothing was merged".to_owned(),
                },
                o.error
                    .as_deref()
                    .map(|e| format!(": {e}"))
                    .unwrap_or_default()
            ),
            at("outcome"),
        );
    }
    if let (Some(merged), Some((i, ins))) = (&o.product_tree_digest, last_inspection(run)) {
        let same = *merged == ins.report.product_tree_digest;
        s.checks.push(same);
        if !same {
            s.fail(
                true,
                FailureCategory::ExecutionFailure,
                format!(
                    "merge: the attested product tree {merged} is not the tree inspection run {} inspected ({})",
                    ins.report.run_id, ins.report.product_tree_digest
                ),
                at(format!("inspections/{i}")),
            );
        }
    }
    s.summary = format!(
        "{}{}.",
        match &o.merge_commit {
            Some(m) if landed => format!("merged as {m} on the default branch"),
            _ => format!("not merged ({})", o.state),
        },
        o.product_tree_digest
            .as_deref()
            .map(|d| format!(", product tree {d}"))
            .unwrap_or_default()
    );
    s
}

fn job_site(run: &JobSiteRun) -> Scored {
    let mut s = Scored::default();
    for check in &run.visible_checks {
        s.checks.push(check.passed);
        if !check.passed {
            s.fail(
                true,
                FailureCategory::VisibleCheckFailure,
                format!(
                    "job-site: the fixture's check {} ({}) fails on the merged product",
                    check.id,
                    check.requirement_ids.join(", ")
                ),
                format!("{} ({})", at("visible_checks"), short(&check.evidence)),
            );
        }
    }
    // The run's outcome is decided by every stage: their critical failures are its own.
    for stage in &JobSiteStage::ALL[1..] {
        let part = match stage {
            JobSiteStage::WorkerA => worker_a(run),
            JobSiteStage::WorkerB => worker_b(run),
            JobSiteStage::Triage => triage(run),
            JobSiteStage::Inspection => inspection(run),
            JobSiteStage::Merge | JobSiteStage::JobSite => merge(run),
        };
        s.critical.extend(part.critical.iter().cloned());
        s.failures.extend(part.failures);
    }
    let passed = run.visible_checks.iter().filter(|c| c.passed).count();
    s.summary = format!(
        "the work item is {}; {passed} of {} fixture checks passed on the merged product; {} cycles, {} inspection runs.",
        run.outcome.state,
        run.visible_checks.len(),
        run.cycles.len(),
        run.inspections.len()
    );
    if run.visible_checks.is_empty() {
        s.summary
            .push_str(" No fixture check ran on a merged product.");
    }
    s
}

fn short(evidence: &str) -> String {
    let line = evidence.lines().last().unwrap_or_default();
    if line.is_empty() {
        "no output".into()
    } else {
        line.chars().take(200).collect()
    }
}

/// Whether every check of `checks` passed (none ran counts as not passed).
pub fn all_passed(checks: &[CheckOutcome]) -> bool {
    !checks.is_empty() && checks.iter().all(|c| c.passed)
}
