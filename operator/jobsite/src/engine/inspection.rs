//! The `inspecting` stage: pre-merge revalidation against the current default branch, then the
//! Inspection Run (every producer through the Executor, findings into the ledger), which seals,
//! sends the candidate back with sanitized feedback, or blocks.

use std::{collections::BTreeSet, time::Instant};

use protobot_lifecycle::{AttemptRecord, WorkItemRecord};
use protobot_repo::{
    integrate::IntegrateError, integrate::refresh_work_item, land::fetch_remote_branch, role::Role,
};
use protobot_stores::{Observation, WorkStore};
use serde_json::json;

use super::{
    Engine,
    effects::{Fenced, Item, RunName, Task},
    error::{EngineError, git_err},
    history::{escalation_from, label_of, outcome_of, since_last_block, tier_label},
    report::{CycleReport, InspectionReport, Progress},
};
use crate::{
    executor::Executor, executor::SandboxRole, inspection::ProducerKind, inspection::RoutedFinding,
    inspection::Verdict, inspection::carried_over, inspection::parse_report,
    inspection::record_run, lease::Claim, ledger::Disposition, sanitizer::FeedbackOutcome,
    sanitizer::Origin, sanitizer::RawDiagnostic, sanitizer::RawFeedback,
    sanitizer::SanitizedFeedback, triage::Decision, triage::Fault, triage::Side,
};

impl<S: WorkStore, E: Executor> Engine<S, E> {
    pub(super) async fn inspecting(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        record: &WorkItemRecord,
        progress: &mut Progress,
    ) -> Result<(), EngineError> {
        let id = item.id;
        let next_cycle = record.attempts.last().map_or(1, |a| a.cycle + 1);
        let recent = since_last_block(&record.attempts);
        let genuine = recent
            .iter()
            .filter(|a| outcome_of(&a.outcome).is_genuine_failure())
            .count() as u32;
        let budget = self.config.max_cycles.saturating_sub(genuine + 1);
        let tier = escalation_from(self.config.start_tier, recent).current_tier();
        let attempt_started = self.clock.now();
        // Pre-merge revalidation: merge the current default branch in; when it
        // moved, every gate reruns on the refreshed candidate.
        let started = Instant::now();
        let remote_ref = format!("refs/heads/{}", self.config.target_branch);
        let (remote, wi, now) = (self.config.remote.clone(), item.wi.clone(), self.now_secs());
        let refreshed = item
            .git(move |repo| {
                let main = fetch_remote_branch(repo, &remote, &remote_ref)
                    .map_err(git_err("fetch the default branch"))?;
                Ok(main.map(|main| (main, refresh_work_item(repo, &wi, main, now))))
            })
            .await?;
        if let Some((main, refreshed)) = refreshed {
            match refreshed {
                Ok(refresh) => {
                    self.trace(
                        id,
                        "revalidation",
                        None,
                        json!({"default_head": main.to_string()}),
                        json!({"merged_in": refresh.merge_commit}),
                        started,
                    );
                    if refresh.merge_commit.is_some() {
                        progress.revalidations += 1;
                        self.boundary(id, "after:revalidation-merge")?;
                        self.stage("inspecting: the default branch moved; merged it in, rerunning the integration gate");
                        let dir = self
                            .config
                            .scratch
                            .join(format!("{id}-revalidate-{}", progress.revalidations));
                        let gate =
                            Box::pin(self.gate(claim, item, next_cycle, &dir, budget, Vec::new()))
                                .await?;
                        if gate.decision != Decision::Pass {
                            let label = label_of(&gate.decision);
                            progress.cycles.push(CycleReport {
                                cycle: next_cycle,
                                decision: label.clone(),
                                feedback: gate.feedback.clone(),
                                redactions: gate.redactions,
                                projection_files_scanned: 0,
                                tier,
                            });
                            self.record_attempt(
                                claim,
                                item,
                                AttemptRecord {
                                    cycle: next_cycle,
                                    tier: tier_label(tier),
                                    outcome: label,
                                    candidate_commit: self.head(item).await?.to_string(),
                                    feedback: serde_json::to_value(&gate.feedback)
                                        .unwrap_or_default(),
                                    started_at: Some(attempt_started),
                                    finished_at: self.clock.now(),
                                },
                            )
                            .await?;
                            self.command(claim, Fenced::FinalTestsFailed).await?;
                            return Ok(());
                        }
                    }
                }
                Err(e @ IntegrateError::MergeConflict { .. }) => {
                    return self
                        .raise_question(
                            claim,
                            format!(
                                "the work-item branch conflicts with {}: {e}",
                                self.config.target_branch
                            ),
                        )
                        .await;
                }
                Err(e) => return Err(git_err("merge the default branch in")(e)),
            }
        }
        // The Inspection Run on the (possibly refreshed) candidate.
        let head = self.head(item).await?;
        let candidate = head.to_string();
        let run_id = format!("{id}-ir-{}", &candidate[..12.min(candidate.len())]);
        self.stage(&format!(
            "inspecting: inspection run {run_id} with {} producer(s)",
            self.config.producers.len()
        ));
        let started = Instant::now();
        let mut reports = Vec::new();
        if !self.config.producers.is_empty() {
            let dir = self.config.scratch.join(&run_id);
            let pi = dir.join("inspector");
            let _ = std::fs::remove_dir_all(&pi);
            item.export(
                "export the Inspector projection",
                &candidate,
                Role::Inspector,
                &pi,
                true,
            )
            .await?;
            for producer in &self.config.producers {
                let (role, file) = match producer.kind {
                    ProducerKind::Inspector => (SandboxRole::Inspector, "findings.jsonl"),
                    ProducerKind::Mutation => (SandboxRole::MutationRunner, "campaign.json"),
                };
                let out = self
                    .run_role(
                        claim,
                        role,
                        &producer.class,
                        &pi,
                        Task::Producer {
                            role,
                            work_item_id: id,
                            inspection_run_id: &run_id,
                            candidate: &candidate,
                            requirement_ids: &item.contract.applicable_requirement_ids,
                        },
                        RunName::new(format!("{run_id}-{}", producer.name), 0),
                    )
                    .await?;
                let bytes =
                    std::fs::read(out.out_dir.join(file)).map_err(|e| EngineError::Output {
                        role: "inspector",
                        reason: format!(
                            "{} wrote no {file} ({e}); termination {:?}",
                            producer.name, out.termination
                        ),
                    })?;
                let findings =
                    parse_report(&producer.name, producer.kind, &bytes).map_err(|e| {
                        EngineError::Output {
                            role: "inspector",
                            reason: e.to_string(),
                        }
                    })?;
                reports.push((producer.name.clone(), findings));
            }
        }
        let prior = std::mem::take(&mut progress.prior_findings);
        let sequence_at_start = progress.ledger.sequence;
        let candidate_digest = self.digest(item, head).await?;
        let verdict = record_run(&mut progress.ledger, &run_id, &candidate, &reports, &prior)
            .map_err(|e| EngineError::Output {
                role: "inspection",
                reason: e.to_string(),
            })?;
        let findings = progress.ledger.current_findings(&run_id).len();
        self.trace(
            id,
            "inspection",
            None,
            json!({"run_id": run_id, "candidate": candidate, "producers": reports.iter().map(|(p, f)| json!({"producer": p, "findings": f.len()})).collect::<Vec<_>>(), "recheck": prior}),
            serde_json::to_value(&verdict).unwrap_or_default(),
            started,
        );
        progress.inspections.push(InspectionReport {
            run_id: run_id.clone(),
            candidate: candidate.clone(),
            product_tree_digest: candidate_digest,
            contract_version: claim.held().map(|h| h.contract_version).unwrap_or_default(),
            ledger_sequence_at_start: sequence_at_start,
            producers: reports.iter().map(|(p, _)| p.clone()).collect(),
            findings,
            verdict: verdict.clone(),
        });
        match verdict {
            Verdict::Sealed { watermark } => {
                self.store
                    .observe(
                        id,
                        Observation::Inspection {
                            inspection_run_sealed: true,
                            findings_terminal: true,
                            final_tests_passed: true,
                        },
                    )
                    .await?;
                self.boundary(id, "after:observe-inspection")?;
                Box::pin(self.attest_and_begin_merge(claim, item, &run_id, watermark, progress))
                    .await
            }
            Verdict::Rework { routed } => {
                let (feedback, redactions) = self.finding_feedback(item, &routed, budget).await?;
                self.stage(&format!(
                    "inspecting: {} finding(s) routed back to the Workers ({redactions} redactions)",
                    routed.len()
                ));
                progress.prior_findings = carried_over(&progress.ledger, &run_id);
                progress.cycles.push(CycleReport {
                    cycle: next_cycle,
                    decision: "rejected-inspection".into(),
                    feedback: feedback.clone(),
                    redactions,
                    projection_files_scanned: 0,
                    tier,
                });
                self.record_attempt(
                    claim,
                    item,
                    AttemptRecord {
                        cycle: next_cycle,
                        tier: tier_label(tier),
                        outcome: "rejected-inspection".into(),
                        candidate_commit: candidate,
                        feedback: serde_json::to_value(&feedback).unwrap_or_default(),
                        started_at: Some(attempt_started),
                        finished_at: self.clock.now(),
                    },
                )
                .await?;
                self.command(claim, Fenced::InContractDefect).await?;
                Ok(())
            }
            Verdict::Blocked { reason } => self.raise_question(claim, reason).await,
        }
    }

    /// Worker feedback for routed findings, through the sanitizer.
    pub(super) async fn finding_feedback(
        &self,
        item: &Item<'_>,
        routed: &[RoutedFinding],
        budget: u32,
    ) -> Result<(Vec<SanitizedFeedback>, usize), EngineError> {
        let head = self.head(item).await?;
        let manifest = item
            .git(move |repo| {
                let tree = repo
                    .find_commit(head)
                    .and_then(|c| c.tree())
                    .map_err(git_err("read the candidate tree"))?;
                let listed = protobot_repo::tree::list_files(repo, &tree)
                    .map_err(git_err("list the candidate tree"))?;
                protobot_repo::export::load_manifest(repo, &listed)
                    .map_err(git_err("read the projection manifest"))
            })
            .await?;
        let mut out = Vec::new();
        let mut redactions = 0;
        for side in [Side::Tests, Side::Implementation] {
            let mine: Vec<&RoutedFinding> = routed
                .iter()
                .filter(|r| match r.disposition {
                    Disposition::TestDefect | Disposition::TestGap => side == Side::Tests,
                    Disposition::BothDefective => true,
                    _ => side == Side::Implementation,
                })
                .collect();
            if mine.is_empty() {
                continue;
            }
            let raw = RawFeedback {
                recipient: side,
                outcome: FeedbackOutcome::Fail,
                fault: Some(if side == Side::Tests {
                    Fault::Test
                } else {
                    Fault::Implementation
                }),
                retry_budget: budget,
                requirement_ids: mine
                    .iter()
                    .flat_map(|r| r.requirement_ids.iter().cloned())
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect(),
                reason: "inspection found a defect in your part of the candidate".into(),
                diagnostics: mine
                    .iter()
                    .flat_map(|r| {
                        r.paths.iter().map(|p| RawDiagnostic {
                            artifact: p.clone(),
                            origin: Origin::Inspection,
                            message: r.category.clone(),
                        })
                    })
                    .collect(),
            };
            let (f, n) = self.sanitized(&raw, item, &manifest);
            redactions += n;
            out.push(f);
        }
        Ok((out, redactions))
    }
}
