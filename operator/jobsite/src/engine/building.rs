//! The `building` stage (the triage cycle): decides from the attempt history whether to reuse a
//! passed cycle, block after too many genuine failures, or run the next cycle at the escalated
//! tier; records each cycle's outcome as a fenced attempt and sends `tests-pass` on a pass.
//! Transient executor failures retry at the same tier.

use std::time::Instant;

use git2::Oid;
use protobot_lifecycle::{AttemptRecord, WorkItemRecord};
use protobot_repo::digest::product_tree_digest;
use protobot_stores::WorkStore;
use serde_json::json;
use tracing::Instrument;

use super::{
    Engine,
    effects::{Fenced, Item},
    error::{EngineError, git_err},
    history::{
        TRANSIENT, escalation_from, is_transient, label_of, outcome_of, since_last_block,
        tier_label,
    },
    report::{CycleReport, Progress},
};
use crate::{executor::Executor, lease::Claim, sanitizer::SanitizedFeedback, triage::Decision};

impl<S: WorkStore, E: Executor> Engine<S, E> {
    pub(super) async fn building(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        record: &WorkItemRecord,
        progress: &mut Progress,
    ) -> Result<(), EngineError> {
        let attempts = &record.attempts;
        let head = self.head(item).await?;
        // Resume: the last cycle passed and the product is unchanged since (a crash
        // before tests-pass), or changed only by the default branch merged into it (a
        // landing race that sent the item back: after a passed cycle nothing but the
        // revalidation merges of `inspecting` adds to the work-item branch). Either way
        // the Workers' work stands; `inspecting` merges the moved branch in and reruns the
        // integration gate on the merged tree before anything lands.
        let passed = attempts.last().filter(|a| a.outcome == "passed");
        let unchanged = match passed.and_then(|a| Oid::from_str(&a.candidate_commit).ok()) {
            Some(candidate) => {
                item.git(move |repo| {
                    let before = product_tree_digest(repo, candidate).ok();
                    let now = product_tree_digest(repo, head)
                        .map_err(git_err("compute the product tree digest"))?;
                    // The candidate may not be in this clone (another Job Site built it):
                    // then nothing is known about it and the cycle runs.
                    let absorbed_main = head != candidate
                        && repo.graph_descendant_of(head, candidate).unwrap_or(false);
                    Ok(before == Some(now) || absorbed_main)
                })
                .await?
            }
            None => false,
        };
        if let Some(last) = passed.filter(|_| unchanged) {
            self.stage(&format!(
                "building: cycle {} already passed on this candidate; resuming at tests-pass",
                last.cycle
            ));
            self.command(claim, Fenced::TestsPass).await?;
            return Ok(());
        }
        // Only the attempts since the item was last blocked count: a
        // resolved block (`protobot retry`) starts a fresh budget.
        let recent = since_last_block(attempts);
        let genuine = recent
            .iter()
            .filter(|a| outcome_of(&a.outcome).is_genuine_failure())
            .count();
        // The item's model budget: a spent one stops the build before the next cycle spends
        // more. `protobot retry` after raising it moves the item on (its ledger is kept).
        if let Some(budget) = &self.config.item_budget
            && let Err(stop) = budget.check(&record.usage.summary())
        {
            let next = attempts.last().map_or(1, |a| a.cycle + 1);
            tracing::warn!(work_item = item.id, limit = %stop.budget.limit, spent = %stop.spent.total, "the item's model budget is spent; raising a spec question");
            self.record_block_marker(claim, item, next).await?;
            return self
                .raise_question(claim, stop.question("protobot retry"))
                .await;
        }
        if genuine >= self.config.max_cycles as usize {
            let next = attempts.last().map_or(1, |a| a.cycle + 1);
            self.record_block_marker(claim, item, next).await?;
            return self
                .raise_question(
                    claim,
                    format!(
                        "no passing candidate after {genuine} cycles (last triage: {} fault){}; the trace {} says what failed in each cycle. Fix the cause (tests, implementation, harness or requirements) on the default branch, then run `protobot retry` (or `protobot abandon`)",
                        attempts
                            .iter()
                            .rev()
                            .find(|a| outcome_of(&a.outcome).is_genuine_failure())
                            .map_or("build", |a| a.outcome.as_str()),
                        progress
                            .last_cause
                            .as_deref()
                            .map(|c| format!(": {c}"))
                            .unwrap_or_default(),
                        self.config
                            .scratch
                            .join("traces")
                            .join(format!("{}.jsonl", item.id))
                            .display()
                    ),
                )
                .await;
        }
        let escalation = escalation_from(self.config.start_tier, recent);
        let cycle = match attempts.last() {
            Some(a) if is_transient(&a.outcome) => a.cycle,
            Some(a) => a.cycle + 1,
            None => 1,
        };
        let feedback: Vec<SanitizedFeedback> = attempts
            .iter()
            .rev()
            .find(|a| !is_transient(&a.outcome))
            .and_then(|a| serde_json::from_value(a.feedback.clone()).ok())
            .unwrap_or_default();
        let tier = escalation.current_tier();
        let started = Instant::now();
        let attempt_started = self.clock.now();
        let cycle_span =
            tracing::info_span!("cycle", work_item = item.id, cycle, tier = tier.as_str(),);
        match Box::pin(self.cycle(claim, item, cycle, tier, genuine as u32, &feedback))
            .instrument(cycle_span)
            .await
        {
            Ok((gate, scanned)) => {
                progress.model_failures.clear();
                progress.last_cause = gate.cause.clone();
                let label = label_of(&gate.decision);
                self.trace(
                    item.id,
                    "cycle",
                    Some(cycle),
                    json!({"tier": tier, "feedback_in": feedback.len()}),
                    json!({"decision": label, "redactions": gate.redactions}),
                    started,
                );
                progress.cycles.push(CycleReport {
                    cycle,
                    decision: if label == "passed" {
                        "pass".into()
                    } else {
                        label.clone()
                    },
                    feedback: gate.feedback.clone(),
                    redactions: gate.redactions,
                    projection_files_scanned: scanned,
                    tier,
                });
                let candidate = self.head(item).await?.to_string();
                self.record_attempt(
                    claim,
                    item,
                    AttemptRecord {
                        cycle,
                        tier: tier_label(tier),
                        outcome: label.clone(),
                        candidate_commit: candidate,
                        feedback: serde_json::to_value(&gate.feedback).unwrap_or_default(),
                        started_at: Some(attempt_started),
                        finished_at: self.clock.now(),
                    },
                )
                .await?;
                if gate.decision == Decision::Pass {
                    self.command(claim, Fenced::TestsPass).await?;
                } else {
                    let _exclusive = claim.exclusive().await;
                    crate::lease::renew_once(
                        self.store.as_ref(),
                        &self.context,
                        claim,
                        self.clock.as_ref(),
                    )
                    .await?;
                }
                Ok(())
            }
            Err(EngineError::PolicyGap { reason }) => {
                self.record_block_marker(claim, item, cycle).await?;
                self.raise_question(claim, reason).await
            }
            Err(EngineError::Executor(
                e @ (crate::executor::ExecutorError::Start { .. }
                | crate::executor::ExecutorError::Collect { .. }),
            )) => {
                // Transient: retried at the same tier, never escalated. (A
                // non-conformant profile is not transient: it stops the build.)
                progress.transient += 1;
                tracing::warn!(work_item = item.id, cycle, error = %e, "transient executor failure");
                let transient = Transient {
                    cycle,
                    tier,
                    label: TRANSIENT,
                    error: e.to_string(),
                    started,
                    attempt_started,
                };
                self.record_transient(claim, item, progress, &feedback, transient)
                    .await?;
                if progress.transient > self.config.transient_retries {
                    return Err(EngineError::Executor(e));
                }
                Ok(())
            }
            Err(EngineError::Model { role, failure }) => {
                // The model failed, not the agent: a transient failure (timeout, 429, 5xx,
                // connection) is retried on the same tier after its class's backoff, its
                // budget counted from the persisted attempts; any other answer stops the
                // build without escalating.
                let (Some(outcome), Some(label)) = (failure.outcome(), failure.attempt_label())
                else {
                    return Err(EngineError::Model { role, failure });
                };
                let mut next = crate::escalation::Escalation {
                    start: tier,
                    history: std::mem::take(&mut progress.model_failures),
                };
                let retry = next.record(outcome);
                progress.model_failures = next.history;
                let delay = match retry {
                    crate::escalation::Next::Retry { after, .. } => after,
                    _ => return Err(EngineError::Model { role, failure }),
                };
                tracing::warn!(work_item = item.id, cycle, role, %failure, ?delay, "transient model failure; retrying on the same tier");
                let transient = Transient {
                    cycle,
                    tier,
                    label,
                    error: format!("the {role}'s model request {failure}"),
                    started,
                    attempt_started,
                };
                self.record_transient(claim, item, progress, &feedback, transient)
                    .await?;
                self.back_off(claim, delay.min(self.config.model_retry_delay_cap))
                    .await?;
                Ok(())
            }
            Err(other) => Err(other),
        }
    }

    /// Records a transient attempt (it keeps its cycle, tier and feedback) and traces it.
    async fn record_transient(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        progress: &mut Progress,
        feedback: &[SanitizedFeedback],
        t: Transient,
    ) -> Result<(), EngineError> {
        self.trace(
            item.id,
            "cycle",
            Some(t.cycle),
            json!({"tier": t.tier}),
            json!({"decision": t.label, "error": t.error}),
            t.started,
        );
        progress.cycles.push(CycleReport {
            cycle: t.cycle,
            decision: t.label.into(),
            feedback: feedback.to_vec(),
            redactions: 0,
            projection_files_scanned: 0,
            tier: t.tier,
        });
        self.record_attempt(
            claim,
            item,
            AttemptRecord {
                cycle: t.cycle,
                tier: tier_label(t.tier),
                outcome: t.label.into(),
                candidate_commit: String::new(),
                feedback: serde_json::to_value(feedback).unwrap_or_default(),
                started_at: Some(t.attempt_started),
                finished_at: self.clock.now(),
            },
        )
        .await
    }

    /// Waits `delay` before a retry, ending early when the lease is lost (then an error) or
    /// the Job Site is stopping (the next effect boundary stops the build).
    async fn back_off(&self, claim: &Claim, delay: std::time::Duration) -> Result<(), EngineError> {
        let mut left = delay;
        let mut lost = claim.lost_signal();
        while !left.is_zero() && !self.stop.as_ref().is_some_and(|s| s.is_raised()) {
            let step = left.min(std::time::Duration::from_millis(250));
            tokio::select! {
                _ = tokio::time::sleep(step) => {}
                changed = lost.changed() => if changed.is_err() { break },
            }
            claim.check()?;
            left = left.saturating_sub(step);
        }
        claim.check()?;
        Ok(())
    }
}

/// A transient attempt to record.
struct Transient {
    cycle: u32,
    tier: crate::escalation::Tier,
    label: &'static str,
    error: String,
    started: Instant,
    attempt_started: jiff::Timestamp,
}
