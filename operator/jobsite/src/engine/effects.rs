//! The engine's effects, each behind one function: effect boundaries (where a shutdown or a fault
//! injection stops the build), trace lines, fenced lifecycle commands, attempt observations,
//! sandboxed runs through the Executor, and git work on the integration repository (always on the
//! blocking pool through [`RepoFolder`], never holding a git handle across an await).

use std::{collections::BTreeSet, path::Path, time::Instant};

use git2::{Oid, Repository};
use protobot_lifecycle::{AttemptRecord, Command, LifecyclePayload, MergeEnvelope, ResultEnvelope};
use protobot_repo::{
    catalog::ChangeScope, digest::product_tree_digest, export::ProjectionRecord,
    export::record_path_for, integrate::WorkItemRef, role::Role, seams::projection_export,
};
use protobot_stores::{Observation, WorkStore};
use serde_json::json;
use tracing::Instrument;

use super::{
    Engine,
    config::{StopSignal, WorkerClass, egress_for},
    error::{EngineError, git_err},
    report::TraceEvent,
};
use crate::{
    contract::BuildContract,
    escalation::{ModelChoice, Tier},
    executor::{Executor, RunSpec, SandboxRole},
    landing::Landing,
    lease::Claim,
    repo_folder::RepoFolder,
    sanitizer::SanitizedFeedback,
    triage::Side,
};

/// A fenced lifecycle command of the engine with its typed payload: the command and
/// what it carries cannot disagree.
pub(super) enum Fenced {
    /// `tests-pass`: the building gate passed.
    TestsPass,
    /// `raise-spec-question`: the item blocks on `question`.
    RaiseSpecQuestion { question: String },
    /// `return-to-building`: inspection found an in-contract defect.
    InContractDefect,
    /// `return-to-building`: the final tests failed.
    FinalTestsFailed,
    /// `begin-merge` with the tested candidate.
    BeginMerge(MergeEnvelope),
    /// `merge-conflict`: the default branch moved past the candidate.
    MergeConflict,
    /// `record-merge` with the verified merge commit.
    RecordMerge(MergeEnvelope),
}

impl Fenced {
    fn command(&self) -> Command {
        match self {
            Fenced::TestsPass => Command::TestsPass,
            Fenced::RaiseSpecQuestion { .. } => Command::RaiseSpecQuestion,
            Fenced::InContractDefect | Fenced::FinalTestsFailed => Command::ReturnToBuilding,
            Fenced::BeginMerge(_) => Command::BeginMerge,
            Fenced::MergeConflict => Command::MergeConflict,
            Fenced::RecordMerge(_) => Command::RecordMerge,
        }
    }

    fn payload(self) -> LifecyclePayload {
        match self {
            Fenced::TestsPass => LifecyclePayload::tests_passed(),
            Fenced::RaiseSpecQuestion { question } => LifecyclePayload::question(question),
            Fenced::InContractDefect => LifecyclePayload::in_contract_defect(),
            Fenced::FinalTestsFailed => LifecyclePayload::final_tests_failed(),
            Fenced::BeginMerge(envelope) | Fenced::RecordMerge(envelope) => {
                LifecyclePayload::merge(envelope)
            }
            Fenced::MergeConflict => LifecyclePayload::default(),
        }
    }
}

/// The task document of one sandboxed run (`/task/task.json`, the executor port's
/// `RunSpec::task`), typed here and written as JSON only at the port.
#[derive(serde::Serialize)]
#[serde(untagged)]
pub(super) enum Task<'a> {
    /// Worker A or Worker B in one build cycle.
    Worker {
        role: Side,
        work_item_id: &'a str,
        cycle: u32,
        retry_budget: u32,
        model_tier: Tier,
        model: Option<&'a ModelChoice>,
        requirement_ids: &'a [String],
        /// Only this Worker's own sanitized feedback.
        feedback: Vec<&'a SanitizedFeedback>,
    },
    /// An Inspector or a mutation campaign on the sealed candidate.
    Producer {
        role: SandboxRole,
        work_item_id: &'a str,
        inspection_run_id: &'a str,
        candidate: &'a str,
        requirement_ids: &'a [String],
    },
    /// The integration runner on a candidate.
    Integration { role: SandboxRole, cycle: u32 },
}

/// A run's id (unique and deterministic) and the build cycle it belongs to (0 for
/// inspection runs).
pub(super) struct RunName {
    pub(super) run_id: String,
    pub(super) cycle: u32,
}

impl RunName {
    pub(super) fn new(run_id: String, cycle: u32) -> Self {
        Self { run_id, cycle }
    }
}

pub(super) struct Item<'a> {
    pub(super) id: &'a str,
    pub(super) landing: &'a Landing,
    pub(super) contract: &'a BuildContract,
    /// The integration repository: every git operation runs through it, on the blocking
    /// pool (no git handle lives across an await, so the build's future is `Send`).
    pub(super) repo: RepoFolder,
    pub(super) wi: WorkItemRef,
    pub(super) scope: ChangeScope,
    pub(super) approved: BTreeSet<String>,
}

impl Item<'_> {
    /// Runs `work` on the integration repository (blocking pool, one at a time per folder).
    pub(super) async fn git<T, F>(&self, work: F) -> Result<T, EngineError>
    where
        T: Send + 'static,
        F: FnOnce(&Repository) -> Result<T, EngineError> + Send + 'static,
    {
        self.repo
            .repo(work)
            .await
            .map_err(git_err("run git on the integration repository"))?
    }

    /// Exports the `role` projection of `at` into `dest` and scans it, off the runtime.
    pub(super) async fn export(
        &self,
        operation: &'static str,
        at: &str,
        role: Role,
        dest: &Path,
        scan: bool,
    ) -> Result<usize, EngineError> {
        let (at, dest, scope) = (at.to_string(), dest.to_path_buf(), self.scope.clone());
        self.repo
            .path(move |dir| {
                projection_export(dir, &at, role, &dest, scope).map_err(git_err(operation))?;
                if scan {
                    scan_projection(&dest, role)
                } else {
                    Ok(0)
                }
            })
            .await
            .map_err(git_err(operation))?
    }
}

/// Scans an exported projection and fails closed if it holds a path its role
/// must never see (Worker A: implementation; Worker B: test source; both:
/// anything unclassified, integration-only or attestation-only; the Inspector:
/// anything unclassified or integration-only). The export
/// already filters by role; this is the independent check the demo and every
/// build run on what actually landed on disk. Returns the number of files scanned.
pub fn scan_projection(dir: &Path, role: Role) -> Result<usize, EngineError> {
    use protobot_repo::manifest::PathClass;
    let record = ProjectionRecord::read(&record_path_for(dir))
        .map_err(git_err("read the projection record"))?;
    let mut stack = vec![dir.to_path_buf()];
    let mut scanned = 0;
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(git_err("scan a projection"))?;
        for entry in entries {
            let entry = entry.map_err(git_err("scan a projection"))?;
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
                        Some(
                            PathClass::Test
                                | PathClass::Implementation
                                | PathClass::AttestationOnly
                        )
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

impl<S: WorkStore, E: Executor> Engine<S, E> {
    pub(super) fn stage(&self, what: &str) {
        tracing::info!(stage = what, "job site");
        if let Some(f) = &self.on_stage {
            f(what);
        }
    }

    /// Whether the process is shutting down (the engine stops at its next boundary).
    pub fn stopping(&self) -> bool {
        self.stop.as_ref().is_some_and(StopSignal::is_raised)
    }

    /// A named effect boundary: traced, and where a shutdown or fault injection may stop
    /// the engine.
    pub(crate) fn boundary(&self, id: &str, name: &str) -> Result<(), EngineError> {
        tracing::debug!(work_item = id, boundary = name, "effect boundary");
        if self.stopping() {
            tracing::info!(
                work_item = id,
                boundary = name,
                "stopping at an effect boundary: shutting down"
            );
            return Err(EngineError::ShuttingDown {
                boundary: name.to_string(),
            });
        }
        if self.faults.as_ref().is_some_and(|f| f(name)) {
            tracing::warn!(
                work_item = id,
                boundary = name,
                "interrupted by fault injection"
            );
            return Err(EngineError::Interrupted {
                boundary: name.to_string(),
            });
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn trace(
        &self,
        id: &str,
        stage: &str,
        cycle: Option<u32>,
        inputs: serde_json::Value,
        decision: serde_json::Value,
        started: Instant,
    ) {
        let event = TraceEvent {
            at: self.clock.now(),
            work_item_id: id.to_string(),
            stage: stage.to_string(),
            cycle,
            inputs,
            decision,
            duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        };
        tracing::info!(
            target: "protobot::trace",
            work_item = id,
            stage,
            cycle,
            duration_ms = event.duration_ms,
            decision = %event.decision,
            "trace"
        );
        let dir = self.config.scratch.join("traces");
        let line = serde_json::to_string(&event).unwrap_or_default();
        let written = std::fs::create_dir_all(&dir).and_then(|()| {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(format!("{id}.jsonl")))?;
            writeln!(f, "{line}")
        });
        if let Err(e) = written {
            tracing::warn!(work_item = id, error = %e, "could not write the trace file");
        }
    }

    /// Sends `fenced` under `claim`: the claim's envelope (its fence and current
    /// expectations) with the command's typed payload, as the Job Site's context
    /// granted the refs of the candidate it presents.
    pub(super) async fn command(
        &self,
        claim: &Claim,
        fenced: Fenced,
    ) -> Result<ResultEnvelope, EngineError> {
        let command = fenced.command();
        let payload = fenced.payload();
        let _exclusive = claim.exclusive().await;
        let held = claim.check()?;
        // Keys are derived from the version the command moves from: a retry after a
        // lost response replays, a later command at a new version is a new key.
        let key = format!(
            "{}:{}:v{}",
            held.work_item_id,
            command.as_str(),
            held.contract_version
        );
        let env = claim.command(command, &key)?.with_payload(&payload);
        // The in-process Gate grants the Job Site exactly the refs of the
        // candidate it produced and presents (target, run, heads, merge).
        let refs = payload.merge_refs();
        let context = self
            .context
            .clone()
            .with_refs(refs.iter().map(String::as_str));
        let started = Instant::now();
        // An effect: one span per fenced lifecycle command (docs/tracing.md).
        let span = tracing::info_span!(
            "effect.command",
            work_item = %env.work_item_id,
            command = command.as_str(),
            expected_version = held.contract_version,
            ok = tracing::field::Empty,
            code = tracing::field::Empty,
        );
        let result = self
            .store
            .execute(Some(&context), &env, self.clock.now())
            .instrument(span.clone())
            .await?;
        span.record("ok", result.ok);
        if let Some(code) = result.code() {
            span.record("code", code.as_str());
        }
        self.trace(
            &env.work_item_id,
            "command",
            None,
            json!({"command": command.as_str(), "expected_version": held.contract_version}),
            json!({"ok": result.ok, "code": result.code().map(|c| c.as_str().to_string())}),
            started,
        );
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
        self.boundary(&env.work_item_id, &format!("after:{}", command.as_str()))?;
        Ok(result)
    }

    pub(super) fn now_secs(&self) -> i64 {
        self.clock.now().as_second()
    }

    pub(super) async fn run_role(
        &self,
        claim: &Claim,
        role: SandboxRole,
        class: &WorkerClass,
        workspace: &Path,
        task: Task<'_>,
        RunName { run_id, cycle }: RunName,
    ) -> Result<crate::executor::RunOutput, EngineError> {
        let work_item = claim.check()?.work_item_id;
        let attribution = crate::executor::RunAttribution {
            project: self.context.project_id.clone(),
            stage: Some(role.stage()),
            tier: match &task {
                Task::Worker { model_tier, .. } => Some(*model_tier),
                Task::Producer { .. } | Task::Integration { .. } => None,
            },
        };
        let task = serde_json::to_value(&task).map_err(|source| EngineError::Task {
            run_id: run_id.clone(),
            source,
        })?;
        let egress_proxy = match egress_for(class, self.config.egress_proxy.as_deref()) {
            Ok(proxy) => proxy,
            Err(reason) => {
                return Err(crate::executor::ExecutorError::Start { run_id, reason }.into());
            }
        };
        let spec = RunSpec {
            run_id: run_id.clone(),
            role,
            workspace: workspace.to_path_buf(),
            task,
            command: class.command.clone(),
            image: class.image.clone(),
            env: Default::default(),
            limits: self.config.limits.clone(),
            egress_proxy,
            audit: crate::executor::RunAudit {
                work_item: work_item.clone(),
                cycle,
                trace_id: run_id.clone(),
            },
            attribution,
        };
        let metered = spec.egress_proxy.is_some();
        let tier = spec.attribution.tier;
        let started = Instant::now();
        // Boxed, like every stage below: no future nests another's whole state, so polling
        // a build needs no more stack than a runtime thread has.
        // One span per sandbox run, a child of its stage's span (docs/tracing.md). Its id is
        // also the egress session's trace id, which the proxy's model-call spans carry.
        let span = tracing::info_span!(
            "sandbox.run",
            work_item = %work_item,
            run_id = %run_id,
            role = role.as_str(),
            cycle,
            termination = tracing::field::Empty,
        );
        let out = Box::pin(self.executor.run(spec, claim.lost_signal()))
            .instrument(span.clone())
            .await;
        match &out {
            Ok(out) => span.record("termination", tracing::field::debug(&out.termination)),
            Err(_) => span.record("termination", "error"),
        };
        // A run that failed or was cancelled spent all the same.
        if metered {
            Box::pin(self.record_usage(claim, &work_item, &run_id, role, tier, class)).await;
        }
        let out = out?;
        let failure = crate::triage::harness_failure(&out.termination, &out.stderr_tail);
        // The chain itself stays private; its head ties the session to this trace.
        self.trace(
            &work_item,
            "sandbox",
            (cycle > 0).then_some(cycle),
            json!({"run_id": run_id, "role": role}),
            json!({
                "termination": out.termination,
                "audit_events": out.audit.len(),
                "audit_head": out.audit.last().map(|e| e.event_digest.as_str()),
                "stderr_tail": failure.as_ref().map(|_| crate::triage::sanitized_stderr_tail(&out.stderr_tail)),
            }),
            started,
        );
        // A Worker that did not exit 0 failed, even when it committed: its
        // output is never imported.
        if let (Some(reason), SandboxRole::WorkerA | SandboxRole::WorkerB) = (failure, role) {
            // A run cancelled because the lease was lost reports that instead.
            claim.check()?;
            // A harness that stopped because its model failed says so in /out.
            if let Some(failure) = model_failure(&out.out_dir, &work_item, role) {
                return Err(EngineError::Model {
                    role: role.as_str(),
                    failure,
                });
            }
            return Err(EngineError::Output {
                role: role.as_str(),
                reason,
            });
        }
        Ok(out)
    }

    /// Reads back what run `run_id` spent on model calls ([`Engine::usage`]), prices it with
    /// `class`'s prices (the proxy's own for a model they do not name) and records it on the
    /// item, fenced and idempotent by run id. Never fails the build: a source that cannot be
    /// read or a store that refuses is a warning, and the item's usage misses this run.
    async fn record_usage(
        &self,
        claim: &Claim,
        work_item: &str,
        run_id: &str,
        role: SandboxRole,
        tier: Option<Tier>,
        class: &WorkerClass,
    ) {
        let Some(source) = &self.usage else {
            return;
        };
        let reading = match source.run_usage(run_id).await {
            Ok(Some(reading)) => reading,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(work_item, run_id, error = %error_chain(&error), "run usage not read");
                return;
            }
        };
        let Ok(held) = claim.check() else {
            return;
        };
        let run = protobot_usage::RunSpend {
            run_id: run_id.to_owned(),
            stage: role.stage(),
            tier: tier.map(|t| t.as_str().to_owned()).unwrap_or_default(),
            spend: protobot_usage::Spend::of_run(&reading, &class.prices),
        };
        let observed = self
            .store
            .observe(
                work_item,
                Observation::Usage {
                    fencing_token: held.fencing_token,
                    run,
                },
            )
            .await;
        if let Err(error) = observed {
            tracing::warn!(work_item, run_id, error = %error_chain(&error), "run usage not recorded on the item");
        }
    }

    pub(super) async fn record_attempt(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        attempt: AttemptRecord,
    ) -> Result<(), EngineError> {
        let held = claim.check()?;
        let cycle = attempt.cycle;
        let started = Instant::now();
        let summary = json!({"outcome": attempt.outcome, "tier": attempt.tier});
        self.store
            .observe(
                item.id,
                Observation::Attempt {
                    fencing_token: held.fencing_token,
                    attempt,
                },
            )
            .await
            .map_err(|e| {
                claim.mark_lost();
                EngineError::Store(e)
            })?;
        // Written after the store accepted it: an `attempt` trace line means durable.
        self.trace(item.id, "attempt", Some(cycle), json!({}), summary, started);
        self.boundary(item.id, &format!("after:attempt-{cycle}"))
    }

    pub(super) async fn head(&self, item: &Item<'_>) -> Result<Oid, EngineError> {
        let branch = item.wi.branch_ref();
        item.git(move |repo| {
            repo.refname_to_id(&branch)
                .map_err(git_err("read the work-item head"))
        })
        .await
    }

    pub(super) async fn digest(&self, item: &Item<'_>, commit: Oid) -> Result<String, EngineError> {
        item.git(move |repo| {
            product_tree_digest(repo, commit).map_err(git_err("compute the product tree digest"))
        })
        .await
    }
}

/// The model failure a failed Worker's harness reported in `out_dir`
/// (`escalation::MODEL_FAILURE_FILE`), if it wrote a readable one. The file comes from the
/// sandbox: only a regular file (no link) of at most `MAX_MODEL_FAILURE_BYTES` is read, and a
/// malformed one is logged and ignored (the failure then counts as the harness's own).
fn model_failure(
    out_dir: &Path,
    work_item: &str,
    role: SandboxRole,
) -> Option<crate::escalation::ModelFailure> {
    use crate::escalation::{MAX_MODEL_FAILURE_BYTES, MODEL_FAILURE_FILE, ModelFailure};
    let path = out_dir.join(MODEL_FAILURE_FILE);
    let meta = std::fs::symlink_metadata(&path).ok()?;
    let report = if !meta.file_type().is_file() {
        Err("it is not a regular file".to_owned())
    } else if meta.len() > MAX_MODEL_FAILURE_BYTES {
        Err(format!(
            "it has {} bytes, more than the {MAX_MODEL_FAILURE_BYTES} read",
            meta.len()
        ))
    } else {
        std::fs::read(&path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| ModelFailure::from_report(&bytes).map_err(|e| e.to_string()))
    };
    match report {
        Ok(failure) => Some(failure),
        Err(why) => {
            tracing::warn!(work_item, role = role.as_str(), %why, "ignoring the harness's model-failure report");
            None
        }
    }
}

/// `error` and its sources, `: `-separated, for one log field.
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
