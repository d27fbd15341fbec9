//! Worker A and Worker B: one cycle exports each Worker's projection of the work-item branch,
//! runs both Workers concurrently in sandboxes, and imports each Worker's patch bundle only after
//! it passes its role's ownership rules; refusals become that Worker's feedback. Then the
//! integration gate.

use std::time::Instant;

use protobot_repo::{
    bundle::collect_bundle, export::ProjectionRecord, export::record_path_for,
    integrate::CycleInfo, integrate::apply_bundle, integrate::merge_into_work_item,
    manifest::PathClass, role::Role, validate::Limits as BundleLimits, validate::accept_bundle,
};
use protobot_stores::WorkStore;
use serde_json::json;
use tracing::Instrument;

use super::{
    Engine,
    effects::{Item, RunName, Task},
    error::{EngineError, git_err},
    history::tier_label,
    integration::Gate,
};
use crate::{
    escalation::Tier, executor::Executor, executor::SandboxRole, lease::Claim, sanitizer::Origin,
    sanitizer::RawDiagnostic, sanitizer::SanitizedFeedback, triage::Side,
};

impl<S: WorkStore, E: Executor> Engine<S, E> {
    /// One build cycle: Workers, bundles, integration gate.
    pub(super) async fn cycle(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        cycle: u32,
        tier: Tier,
        genuine_so_far: u32,
        feedback: &[SanitizedFeedback],
    ) -> Result<(Gate, usize), EngineError> {
        let id = item.id;
        self.stage(&format!(
            "building: cycle {cycle} (tier {}): exporting projections, running Worker A and Worker B in sandboxes",
            tier_label(tier)
        ));
        let head = self.head(item).await?.to_string();
        let dir = self.config.scratch.join(format!("{id}-c{cycle}"));
        // A rerun of this cycle (after a crash) starts from clean projections.
        let _ = std::fs::remove_dir_all(&dir);
        let (pa, pb) = (dir.join("projection-a"), dir.join("projection-b"));
        let scanned = item
            .export(
                "export the Worker A projection",
                &head,
                Role::WorkerA,
                &pa,
                true,
            )
            .await?
            + item
                .export(
                    "export the Worker B projection",
                    &head,
                    Role::WorkerB,
                    &pb,
                    true,
                )
                .await?;
        let budget = self.config.max_cycles.saturating_sub(genuine_so_far + 1);
        let task = |side: Side| {
            let class = match side {
                Side::Tests => &self.config.worker_a,
                Side::Implementation => &self.config.worker_b,
            };
            Task::Worker {
                role: side,
                work_item_id: id,
                cycle,
                retry_budget: budget,
                model_tier: tier,
                model: class.tiers.model_for(tier),
                requirement_ids: &item.contract.applicable_requirement_ids,
                feedback: feedback.iter().filter(|f| f.recipient == side).collect(),
            }
        };
        // One span per stage (docs/tracing.md); the two Workers run at once.
        let stage = |name: &'static str| match name {
            "worker_a" => tracing::info_span!("stage.worker_a", work_item = id, cycle),
            _ => tracing::info_span!("stage.worker_b", work_item = id, cycle),
        };
        let (out_a, out_b) = tokio::join!(
            self.run_role(
                claim,
                SandboxRole::WorkerA,
                &self.config.worker_a,
                &pa,
                task(Side::Tests),
                RunName::new(format!("{id}-c{cycle}-a"), cycle),
            )
            .instrument(stage("worker_a")),
            self.run_role(
                claim,
                SandboxRole::WorkerB,
                &self.config.worker_b,
                &pb,
                task(Side::Implementation),
                RunName::new(format!("{id}-c{cycle}-b"), cycle),
            )
            .instrument(stage("worker_b")),
        );
        let (out_a, out_b) = (out_a?, out_b?);
        let mut raw_for: Vec<(Side, Vec<RawDiagnostic>)> = Vec::new();
        let decision_text = if cycle == 1 { "initial" } else { "rework" };
        for (side, role, proj, out) in [
            (Side::Tests, Role::WorkerA, &pa, out_a),
            (Side::Implementation, Role::WorkerB, &pb, out_b),
        ] {
            let record = ProjectionRecord::read(&record_path_for(proj))
                .map_err(git_err("read the projection record"))?;
            let worker_repo = out.out_dir.join("worker");
            // Worker output is untrusted: a refusal or failure anywhere on the import path
            // (collection, apply, merge) ends this cycle for that Worker with a sanitized
            // reason (a stable category, never the Worker's text) and counts against the
            // retry budget; it never stops the build with the lease held.
            let refused = |stage: &str, category: &str| {
                (
                    side,
                    vec![RawDiagnostic {
                        artifact: String::new(),
                        origin: Origin::Build,
                        message: format!("{stage}: {category}"),
                    }],
                )
            };
            let bundle = match collect_bundle(&worker_repo, &record, &BundleLimits::default()) {
                Ok(bundle) => bundle,
                Err(e) => {
                    tracing::warn!(work_item = id, cycle, role = role.as_str(), category = e.category(), error = %e, "worker output refused");
                    raw_for.push(refused("output-refused", e.category()));
                    continue;
                }
            };
            if bundle.commits.is_empty() {
                // The Worker changed nothing this cycle.
                continue;
            }
            match accept_bundle(bundle, &record, &BundleLimits::default()) {
                Ok(accepted) => {
                    let info = CycleInfo {
                        cycle,
                        triage_decision: decision_text.into(),
                        when: self.now_secs(),
                    };
                    claim.check()?;
                    let wi = item.wi.clone();
                    let imported = item
                        .git(move |repo| {
                            Ok(apply_bundle(repo, &accepted, &wi, &info)
                                .map_err(|e| ("apply-failed", e.category(), e.to_string()))
                                .and_then(|applied| {
                                    merge_into_work_item(repo, &wi, &applied, &accepted, &info)
                                        .map(drop)
                                        .map_err(|e| ("merge-failed", e.category(), e.to_string()))
                                }))
                        })
                        .await?;
                    if let Err((stage, category, error)) = imported {
                        // A lost lease is not the Worker's fault.
                        claim.check()?;
                        tracing::warn!(
                            work_item = id,
                            cycle,
                            role = role.as_str(),
                            category,
                            error,
                            "worker output failed to import"
                        );
                        raw_for.push(refused(stage, category));
                        continue;
                    }
                    self.boundary(id, &format!("after:import-{}-{cycle}", role.as_str()))?;
                }
                Err(report) => {
                    let refused: Vec<crate::triage::RefusedPath> = report
                        .violations
                        .iter()
                        .filter_map(|v| {
                            v.path.as_ref().map(|path| crate::triage::RefusedPath {
                                path: path.clone(),
                                class: record.manifest.classify(path).map(PathClass::as_str),
                                code: serde_json::to_value(v.code)
                                    .ok()
                                    .and_then(|c| c.as_str().map(str::to_string))
                                    .unwrap_or_default(),
                            })
                        })
                        .collect();
                    self.stage(&format!(
                        "building: cycle {cycle}: {}",
                        crate::triage::describe_refusal(side, &refused)
                    ));
                    self.trace(
                        id,
                        "refused-patch",
                        Some(cycle),
                        json!({"role": role.as_str()}),
                        json!({"violations": report.violations}),
                        Instant::now(),
                    );
                    if let Some(reason) = crate::triage::policy_gap(side, &refused) {
                        return Err(EngineError::PolicyGap { reason });
                    }
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
                    raw_for.push((side, diags));
                }
            }
        }
        let gate = Box::pin(self.gate(claim, item, cycle, &dir, budget, raw_for)).await?;
        Ok((gate, scanned))
    }
}
