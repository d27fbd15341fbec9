//! The Job Site engine: one claimed work item from its spec commit to a merge
//! on the default branch.
//!
//! Per cycle: export the Worker A and Worker B projections of the work-item
//! branch, run both Workers concurrently in sandboxes, collect each Worker's
//! commits as a patch bundle and validate it against the role's ownership
//! rules before anything touches the integration repository, merge accepted
//! bundles into `wi/<id>-build`, run the integration runner on the candidate in
//! a sandbox, and triage its results; Worker-facing feedback passes the
//! sanitizer. When the gate passes: `tests-pass`, inspection (the finding
//! ledger run seals), the attestation snapshot, `begin-merge` with the tested
//! candidate, landing (merge commit, guarded push, verification) and
//! `record-merge`. Every lifecycle command presents the claim's fence; a lost
//! lease stops the work at the next effect boundary.
//!
//! Output contract of the roles (inside the sandbox):
//! - Workers commit in `/workspace` and copy it to `/out/worker` (the control
//!   plane reads their commits from that copy, never from a shared path);
//! - the integration runner writes `/out/results.json`:
//!   `{"build_errors": [{owner, artifact, message}], "results": [{test_id,
//!   requirement_ids, status, baseline}]}` (the triage input).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::Arc,
};

use git2::{Oid, Repository};
use protobot_lifecycle::{AuthorizationContext, Command, MergeEnvelope, ResultEnvelope, State};
use protobot_repo::{
    bundle::collect_bundle,
    catalog::ChangeScope,
    digest::product_tree_digest,
    export::{ProjectionRecord, record_path_for},
    integrate::{
        CycleInfo, WorkItemRef, apply_bundle, ensure_work_item_branch, merge_into_work_item,
    },
    land::{AttestationFile, commit_attestation, land_work_item},
    role::Role,
    seams::projection_export,
    validate::{Limits as BundleLimits, accept_bundle},
};
use protobot_stores::{Observation, WorkStore};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::{
    contract::BuildContract,
    executor::{Executor, Limits, RunSpec, SandboxRole},
    lease::{Claim, Clock},
    ledger::Ledger,
    sanitizer::{FeedbackOutcome, Origin, RawDiagnostic, RawFeedback, SanitizedFeedback, sanitize},
    triage::{Decision, Side, Triage, TriageInput},
};

/// A progress callback: called with a one-line description of each stage.
pub type StageHook = Arc<dyn Fn(&str) + Send + Sync>;

/// A harness: the command a role runs in its sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerClass {
    /// argv.
    pub command: Vec<String>,
    /// Container image (Kubernetes only).
    pub image: Option<String>,
}

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Most build cycles before raising a spec question.
    pub max_cycles: u32,
    /// The WorkerClass's cheapest tier (escalation starts here).
    pub start_tier: crate::escalation::Tier,
    /// Worker A (tests).
    pub worker_a: WorkerClass,
    /// Worker B (implementation).
    pub worker_b: WorkerClass,
    /// The integration runner.
    pub integration: WorkerClass,
    /// Sandbox limits per run.
    pub limits: Limits,
    /// Scratch directory for projections and outputs.
    pub scratch: PathBuf,
    /// Remote to land on.
    pub remote: String,
    /// Default branch.
    pub target_branch: String,
}

/// What happened in one cycle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CycleReport {
    /// Cycle number.
    pub cycle: u32,
    /// `pass`, `test`, `implementation` or `both`.
    pub decision: String,
    /// Feedback each Worker received (already sanitized).
    pub feedback: Vec<SanitizedFeedback>,
    /// Redactions made.
    pub redactions: usize,
    /// Files scanned in this cycle's Worker projections (none may leak).
    pub projection_files_scanned: usize,
    /// The model tier the Workers ran at.
    pub tier: crate::escalation::Tier,
}

/// The end of a build.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildReport {
    /// Work item.
    pub work_item_id: String,
    /// Final state.
    pub state: State,
    /// Cycles.
    pub cycles: Vec<CycleReport>,
    /// The merge commit on the default branch, when completed.
    pub merge_commit: Option<String>,
    /// Evidence: product-tree digest and the sealed run's high-watermark.
    pub product_tree_digest: Option<String>,
}

/// Why a build stopped abnormally (a rejected command is a lost claim).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The lease is gone: stop touching the item.
    #[error(transparent)]
    LeaseLost(#[from] crate::lease::LeaseLost),
    /// A lifecycle command was rejected.
    #[error("{command} on {work_item_id} was rejected: {code}")]
    Rejected {
        /// Item.
        work_item_id: String,
        /// Command.
        command: String,
        /// Code.
        code: String,
    },
    /// The store failed.
    #[error("work store failed: {0}")]
    Store(#[from] protobot_stores::StoreError),
    /// Git failed.
    #[error("failed to {operation}: {reason}")]
    Git {
        /// What.
        operation: &'static str,
        /// Why.
        reason: String,
    },
    /// The sandbox failed (not the command in it).
    #[error(transparent)]
    Executor(#[from] crate::executor::ExecutorError),
    /// An exported projection holds a path its role must never see.
    #[error("the {role} projection holds {path}, which that role must never see; the build stops")]
    ProjectionLeak {
        /// Role.
        role: &'static str,
        /// The offending path.
        path: String,
    },
    /// A role's output is malformed.
    #[error("the {role} output is unusable: {reason}")]
    Output {
        /// Role.
        role: &'static str,
        /// Why.
        reason: String,
    },
}

fn git_err(operation: &'static str) -> impl Fn(String) -> EngineError {
    move |reason| EngineError::Git { operation, reason }
}

#[derive(Debug, Default, Deserialize)]
struct Results {
    #[serde(default)]
    build_errors: Vec<crate::triage::BuildError>,
    #[serde(default)]
    results: Vec<crate::triage::TestResult>,
}

/// Scans an exported projection and fails closed if it holds a path its role
/// must never see (Worker A: implementation; Worker B: test source; both:
/// anything unclassified, integration-only or attestation-only). The export
/// already filters by role; this is the independent check the demo and every
/// build run on what actually landed on disk. Returns the number of files scanned.
pub fn scan_projection(dir: &Path, role: Role) -> Result<usize, EngineError> {
    use protobot_repo::manifest::PathClass;
    let record = ProjectionRecord::read(&record_path_for(dir))
        .map_err(|e| git_err("read the projection record")(e.to_string()))?;
    let mut stack = vec![dir.to_path_buf()];
    let mut scanned = 0;
    while let Some(d) = stack.pop() {
        let entries =
            std::fs::read_dir(&d).map_err(|e| git_err("scan a projection")(e.to_string()))?;
        for entry in entries {
            let entry = entry.map_err(|e| git_err("scan a projection")(e.to_string()))?;
            let path = entry.path();
            if entry.file_name() == ".git" {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(dir)
                .map(|p| p.to_string_lossy().replace('\\', "/"))
                .unwrap_or_default();
            scanned += 1;
            let class = record.manifest.classify(&rel);
            let allowed = matches!(
                (role, class),
                (_, Some(PathClass::Shared))
                    | (Role::WorkerA, Some(PathClass::Test))
                    | (Role::WorkerB, Some(PathClass::Implementation))
                    | (
                        Role::Inspector,
                        Some(PathClass::Test | PathClass::Implementation)
                    )
            );
            if !allowed {
                return Err(EngineError::ProjectionLeak {
                    role: role.as_str(),
                    path: rel,
                });
            }
        }
    }
    Ok(scanned)
}

/// The engine.
pub struct Engine<S, E> {
    /// The WMS port.
    pub store: Arc<S>,
    /// The sandbox port.
    pub executor: Arc<E>,
    /// Trusted time.
    pub clock: Arc<dyn Clock>,
    /// Fault attribution.
    pub triage: Arc<dyn Triage>,
    /// The Job Site's trusted context.
    pub context: AuthorizationContext,
    /// Settings.
    pub config: EngineConfig,
    /// Called at every stage (live progress display; tracing logs the same).
    pub on_stage: Option<StageHook>,
}

impl<S: WorkStore, E: Executor> Engine<S, E> {
    fn stage(&self, what: &str) {
        tracing::info!(stage = what, "job site");
        if let Some(f) = &self.on_stage {
            f(what);
        }
    }

    async fn command(
        &self,
        claim: &Claim,
        command: Command,
        key: &str,
        payload: serde_json::Value,
    ) -> Result<ResultEnvelope, EngineError> {
        let mut env = claim.command(command, key)?;
        // The in-process Gate grants the Job Site exactly the refs of the
        // candidate it produced and presents (target, run, heads, merge).
        let mut context = self.context.clone();
        if let Some(m) = payload.get("merge_envelope") {
            for key in [
                "target",
                "integration_head",
                "merge_commit",
                "inspection_run_id",
            ] {
                if let Some(r) = m
                    .get(key)
                    .and_then(|v| v.as_str())
                    .filter(|r| !r.is_empty())
                    && !context.allowed_refs.iter().any(|a| a == r)
                {
                    context.allowed_refs.push(r.to_string());
                }
            }
        }
        env.payload = Some(payload);
        let result = self
            .store
            .execute(Some(&context), &env, self.clock.now())
            .await?;
        if !result.ok {
            claim.mark_lost();
            return Err(EngineError::Rejected {
                work_item_id: env.work_item_id,
                command: command.as_str().into(),
                code: result
                    .code()
                    .map(|c| c.as_str().to_string())
                    .unwrap_or_default(),
            });
        }
        claim.record(&result);
        Ok(result)
    }

    fn now_secs(&self) -> i64 {
        self.clock.now().as_second()
    }

    async fn run_role(
        &self,
        claim: &Claim,
        role: SandboxRole,
        class: &WorkerClass,
        workspace: &Path,
        task: serde_json::Value,
        run_id: String,
    ) -> Result<crate::executor::RunOutput, EngineError> {
        claim.check()?;
        let spec = RunSpec {
            run_id,
            role,
            workspace: workspace.to_path_buf(),
            task,
            command: class.command.clone(),
            image: class.image.clone(),
            env: Default::default(),
            limits: self.config.limits.clone(),
            egress_proxy: None,
        };
        Ok(self.executor.run(spec, claim.lost_signal()).await?)
    }

    /// Builds a claimed item from its contract in the integration repository `repo_dir`.
    pub async fn build(
        &self,
        claim: &Claim,
        contract: &BuildContract,
        repo_dir: &Path,
    ) -> Result<BuildReport, EngineError> {
        let id = contract.work_item_id.clone();
        let repo = Repository::open(repo_dir).map_err(|e| EngineError::Git {
            operation: "open the integration repository",
            reason: e.to_string(),
        })?;
        let wi = WorkItemRef {
            id: id.clone(),
            slug: "build".into(),
        };
        let source = Oid::from_str(&contract.spec_commit)
            .map_err(|e| git_err("parse the spec commit")(e.to_string()))?;
        ensure_work_item_branch(&repo, &wi, source)
            .map_err(|e| git_err("create the work-item branch")(e.to_string()))?;
        let approved: BTreeSet<String> = contract
            .applicable_requirement_ids
            .iter()
            .cloned()
            .collect();
        // Added requirements have no prior tests to quarantine; only revisions do.
        let revised = if contract.change_type == "changes" {
            contract.changed_requirement_ids.iter().cloned().collect()
        } else {
            BTreeSet::new()
        };
        let scope = ChangeScope {
            revised,
            retired: contract.retired_requirement_ids.iter().cloned().collect(),
            ..ChangeScope::default()
        };
        let mut cycles = Vec::new();
        let mut feedback: Vec<SanitizedFeedback> = Vec::new();
        let mut decision_text = "initial".to_string();
        // Progressive escalation: genuine failures (a failed gate) move the tier up.
        let mut escalation = crate::escalation::Escalation::new(self.config.start_tier);
        let mut passed = false;
        for cycle in 1..=self.config.max_cycles {
            self.stage(&format!(
                "building: cycle {cycle}: exporting projections, running Worker A and Worker B in sandboxes"
            ));
            let head = repo
                .refname_to_id(&wi.branch_ref())
                .map_err(|e| git_err("read the work-item head")(e.to_string()))?
                .to_string();
            let dir = self.config.scratch.join(format!("{id}-c{cycle}"));
            let (pa, pb) = (dir.join("projection-a"), dir.join("projection-b"));
            projection_export(repo_dir, &head, Role::WorkerA, &pa, scope.clone())
                .map_err(|e| git_err("export the Worker A projection")(e.to_string()))?;
            projection_export(repo_dir, &head, Role::WorkerB, &pb, scope.clone())
                .map_err(|e| git_err("export the Worker B projection")(e.to_string()))?;
            let scanned =
                scan_projection(&pa, Role::WorkerA)? + scan_projection(&pb, Role::WorkerB)?;
            let task = |side: Side| {
                json!({
                    "role": side,
                    "work_item_id": id,
                    "cycle": cycle,
                    "retry_budget": self.config.max_cycles - cycle,
                    "model_tier": escalation.current_tier(),
                    "requirement_ids": contract.applicable_requirement_ids,
                    "feedback": feedback.iter().filter(|f| f.recipient == side).collect::<Vec<_>>(),
                })
            };
            let (out_a, out_b) = tokio::join!(
                self.run_role(
                    claim,
                    SandboxRole::WorkerA,
                    &self.config.worker_a,
                    &pa,
                    task(Side::Tests),
                    format!("{id}-c{cycle}-a")
                ),
                self.run_role(
                    claim,
                    SandboxRole::WorkerB,
                    &self.config.worker_b,
                    &pb,
                    task(Side::Implementation),
                    format!("{id}-c{cycle}-b")
                ),
            );
            let mut rejected: Vec<RawDiagnostic> = Vec::new();
            let mut raw_for: Vec<(Side, Vec<RawDiagnostic>)> = Vec::new();
            for (side, role, proj, out) in [
                (Side::Tests, Role::WorkerA, &pa, out_a?),
                (Side::Implementation, Role::WorkerB, &pb, out_b?),
            ] {
                let record = ProjectionRecord::read(&record_path_for(proj))
                    .map_err(|e| git_err("read the projection record")(e.to_string()))?;
                let worker_repo = out.out_dir.join("worker");
                let bundle = collect_bundle(&worker_repo, &record, &BundleLimits::default())
                    .map_err(|e| EngineError::Output {
                        role: role.as_str(),
                        reason: e.to_string(),
                    })?;
                if bundle.commits.is_empty() {
                    // The Worker changed nothing this cycle.
                    continue;
                }
                match accept_bundle(bundle, &record, &BundleLimits::default()) {
                    Ok(accepted) => {
                        let info = CycleInfo {
                            cycle,
                            triage_decision: decision_text.clone(),
                            when: self.now_secs(),
                        };
                        claim.check()?;
                        let applied = apply_bundle(&repo, &accepted, &wi, &info)
                            .map_err(|e| git_err("apply a patch bundle")(e.to_string()))?;
                        merge_into_work_item(&repo, &wi, &applied, &accepted, &info).map_err(
                            |e| git_err("merge into the work-item branch")(e.to_string()),
                        )?;
                    }
                    Err(report) => {
                        let diags = report
                            .violations
                            .iter()
                            .map(|v| RawDiagnostic {
                                artifact: v.path.clone().unwrap_or_default(),
                                origin: Origin::Build,
                                message: serde_json::to_value(v.code)
                                    .ok()
                                    .and_then(|c| c.as_str().map(str::to_string))
                                    .unwrap_or_default(),
                            })
                            .collect::<Vec<_>>();
                        rejected.extend(diags.clone());
                        raw_for.push((side, diags));
                    }
                }
            }
            // Integration: build and test the candidate in a sandbox.
            self.stage(&format!(
                "building: cycle {cycle}: integration run on the candidate"
            ));
            let candidate = repo
                .refname_to_id(&wi.branch_ref())
                .map_err(|e| git_err("read the candidate")(e.to_string()))?
                .to_string();
            let pi = dir.join("integration");
            projection_export(repo_dir, &candidate, Role::Inspector, &pi, scope.clone())
                .map_err(|e| git_err("export the integration tree")(e.to_string()))?;
            let out = self
                .run_role(
                    claim,
                    SandboxRole::IntegrationRunner,
                    &self.config.integration,
                    &pi,
                    json!({"role": "integration-runner", "cycle": cycle}),
                    format!("{id}-c{cycle}-int"),
                )
                .await?;
            let results: Results = match std::fs::read(out.out_dir.join("results.json")) {
                Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| EngineError::Output {
                    role: "integration-runner",
                    reason: e.to_string(),
                })?,
                Err(e) => {
                    return Err(EngineError::Output {
                        role: "integration-runner",
                        reason: format!("no results.json ({e}); termination {:?}", out.termination),
                    });
                }
            };
            let input = TriageInput {
                build_errors: results.build_errors,
                results: results.results,
            };
            let decision = if rejected.is_empty() {
                self.triage.decide(&input)
            } else {
                // A rejected bundle is rework for its author, whatever the tests say.
                Decision::Rework {
                    fault: if raw_for.len() == 2 {
                        crate::triage::Fault::Both
                    } else if raw_for[0].0 == Side::Tests {
                        crate::triage::Fault::Test
                    } else {
                        crate::triage::Fault::Implementation
                    },
                    assignments: raw_for
                        .iter()
                        .map(|(s, _)| crate::triage::Assignment {
                            side: *s,
                            requirement_ids: approved.clone(),
                            reason: "your patch touched paths your role does not own".into(),
                        })
                        .collect(),
                }
            };
            feedback.clear();
            let mut redactions = 0;
            let label = match &decision {
                Decision::Pass => "pass".to_string(),
                Decision::Rework { fault, .. } => serde_json::to_value(fault)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default(),
            };
            if let Decision::Rework { fault, assignments } = &decision {
                for a in assignments {
                    let diagnostics = raw_for
                        .iter()
                        .find(|(s, _)| *s == a.side)
                        .map(|(_, d)| d.clone())
                        .unwrap_or_default();
                    let raw = RawFeedback {
                        recipient: a.side,
                        outcome: FeedbackOutcome::Fail,
                        fault: Some(*fault),
                        retry_budget: self.config.max_cycles - cycle,
                        requirement_ids: a.requirement_ids.iter().cloned().collect(),
                        reason: a.reason.clone(),
                        diagnostics,
                    };
                    let owned = |path: &str| match a.side {
                        Side::Tests => path.starts_with("tests/"),
                        Side::Implementation => !path.starts_with("tests/"),
                    };
                    let record = sanitize(&raw, &approved, &owned);
                    redactions += record.redactions.len();
                    feedback.push(record.sanitized);
                }
            }
            self.stage(&format!("building: cycle {cycle}: triage → {label} ({redactions} redactions in Worker feedback)"));
            cycles.push(CycleReport {
                cycle,
                decision: label.clone(),
                feedback: feedback.clone(),
                redactions,
                projection_files_scanned: scanned,
                tier: escalation.current_tier(),
            });
            decision_text = label;
            // The cycle report already carries the tier it ran at.
            escalation.record(if decision == Decision::Pass {
                crate::escalation::Outcome::Succeeded
            } else {
                crate::escalation::Outcome::FailedGate
            });
            if decision == Decision::Pass {
                passed = true;
                break;
            }
            crate::lease::renew_once(
                self.store.as_ref(),
                &self.context,
                claim,
                self.clock.as_ref(),
            )
            .await?;
        }
        if !passed {
            let question = format!(
                "no passing candidate after {} cycles; the requirements may be contradictory or underspecified",
                self.config.max_cycles
            );
            self.command(
                claim,
                Command::RaiseSpecQuestion,
                &format!("{id}:question"),
                json!({"question": question}),
            )
            .await?;
            return Ok(BuildReport {
                work_item_id: id,
                state: State::Blocked,
                cycles,
                merge_commit: None,
                product_tree_digest: None,
            });
        }
        self.command(
            claim,
            Command::TestsPass,
            &format!("{id}:tests-pass:{}", cycles.len()),
            json!({"build_tests_passed": true}),
        )
        .await?;

        self.stage("inspecting: sealing the inspection run");
        // Inspection: the run seals only when its producers finished and every finding is terminal.
        let candidate = repo
            .refname_to_id(&wi.branch_ref())
            .map_err(|e| git_err("read the candidate")(e.to_string()))?;
        let run_id = format!("{id}-run-1");
        let mut ledger = Ledger::default();
        ledger.start_run(&run_id, &candidate.to_string(), &[], &[]);
        let watermark = ledger.seal(&run_id).map_err(|e| EngineError::Output {
            role: "inspection",
            reason: e.to_string(),
        })?;
        self.store
            .observe(
                &id,
                Observation::Inspection {
                    inspection_run_sealed: true,
                    findings_terminal: true,
                    final_tests_passed: true,
                },
            )
            .await?;
        let digest = product_tree_digest(&repo, candidate)
            .map_err(|e| git_err("compute the product tree digest")(e.to_string()))?;
        // Attestation snapshot, then the tested-candidate envelope bound to the merge version.
        let files = vec![
            AttestationFile { path: format!(".protobot/attestations/{id}/findings.jsonl"), content: ledger.snapshot_jsonl(&run_id).into_bytes() },
            AttestationFile { path: format!(".protobot/attestations/{id}/report.md"), content: format!("# Inspection report for {id}\n\nRun `{run_id}` sealed at ledger sequence {watermark} with no open findings.\nProduct tree digest: `{digest}`.\n").into_bytes() },
        ];
        let attested = commit_attestation(&repo, &wi, &files, &digest, self.now_secs())
            .map_err(|e| git_err("commit the attestation snapshot")(e.to_string()))?;
        let version = claim.held().map(|h| h.contract_version).unwrap_or_default();
        let mut envelope = MergeEnvelope {
            product_tree_digest: digest.clone(),
            inspection_run_id: run_id.clone(),
            integration_head: attested.commit.clone(),
            target: self.config.target_branch.clone(),
            contract_version: version + 1,
            merge_commit: String::new(),
        };
        self.stage("merging: attestation committed; merging wi/ into the default branch");
        self.command(
            claim,
            Command::BeginMerge,
            &format!("{id}:begin-merge"),
            json!({"merge_envelope": envelope}),
        )
        .await?;
        claim.check()?;
        let landed = land_work_item(
            &repo,
            &wi,
            &self.config.remote,
            &self.config.target_branch,
            self.now_secs(),
        )
        .map_err(|e| git_err("land the work item")(e.to_string()))?;
        envelope.merge_commit = landed.merge_commit.clone();
        self.command(
            claim,
            Command::RecordMerge,
            &format!("{id}:record-merge"),
            json!({"merge_envelope": envelope}),
        )
        .await?;
        Ok(BuildReport {
            work_item_id: id,
            state: State::Completed,
            cycles,
            merge_commit: Some(landed.merge_commit),
            product_tree_digest: Some(digest),
        })
    }
}
