//! The integration gate: the candidate is built and tested in a sandbox, triage decides who is at
//! fault, and each Worker's feedback passes the sanitizer.

use std::{path::Path, time::Instant};

use protobot_repo::{
    export::ProjectionRecord, export::record_path_for, manifest::PathClass, role::Role,
};
use protobot_stores::WorkStore;
use serde::Deserialize;
use serde_json::json;
use tracing::Instrument;

use super::{
    Engine,
    effects::{Item, RunName, Task},
    error::{EngineError, git_err},
    history::label_of,
};
use crate::{
    executor::Executor, executor::SandboxRole, lease::Claim, sanitizer::FeedbackOutcome,
    sanitizer::RawDiagnostic, sanitizer::RawFeedback, sanitizer::SanitizedFeedback,
    sanitizer::sanitize, triage::Decision, triage::Refusal, triage::Side, triage::TriageInput,
};

#[derive(Debug, Default, Deserialize)]
pub(super) struct Results {
    #[serde(default)]
    pub(super) build_errors: Vec<crate::triage::BuildError>,
    #[serde(default)]
    pub(super) results: Vec<crate::triage::TestResult>,
}

/// What a gate (an integration run plus triage) decided.
pub(super) struct Gate {
    pub(super) decision: Decision,
    pub(super) feedback: Vec<SanitizedFeedback>,
    pub(super) redactions: usize,
    /// Why it did not pass, for people ([`crate::triage::describe_gate_failure`]).
    pub(super) cause: Option<String>,
}

impl<S: WorkStore, E: Executor> Engine<S, E> {
    /// The integration gate on the current work-item head: build and test it in a
    /// sandbox, triage, and build each Worker's sanitized feedback.
    pub(super) async fn gate(
        &self,
        claim: &Claim,
        item: &Item<'_>,
        cycle: u32,
        dir: &Path,
        budget: u32,
        rejected: Vec<(Side, Vec<RawDiagnostic>)>,
    ) -> Result<Gate, EngineError> {
        let id = item.id;
        self.stage(&format!(
            "building: cycle {cycle}: integration run on the candidate"
        ));
        let started = Instant::now();
        // The stage's span covers the export and the integration run (docs/tracing.md).
        let span = tracing::info_span!("stage.integration_gate", work_item = id, cycle);
        let candidate = self.head(item).await?.to_string();
        let pi = dir.join("integration");
        let _ = std::fs::remove_dir_all(&pi);
        item.export(
            "export the integration tree",
            &candidate,
            Role::Inspector,
            &pi,
            false,
        )
        .instrument(span.clone())
        .await?;
        let manifest = ProjectionRecord::read(&record_path_for(&pi))
            .map_err(git_err("read the projection record"))?
            .manifest;
        let out = self
            .run_role(
                claim,
                SandboxRole::IntegrationRunner,
                &self.config.integration,
                &pi,
                Task::Integration {
                    role: SandboxRole::IntegrationRunner,
                    cycle,
                },
                RunName::new(
                    format!(
                        "{id}-c{cycle}-int-{}",
                        &candidate[..12.min(candidate.len())]
                    ),
                    cycle,
                ),
            )
            .instrument(span.clone())
            .await?;
        drop(span);
        let results: Results = match std::fs::read(out.out_dir.join("results.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| EngineError::Output {
                role: "integration-runner",
                reason: e.to_string(),
            })?,
            Err(e) => {
                return Err(EngineError::Output {
                    role: "integration-runner",
                    reason: format!(
                        "no results.json ({e}); {}",
                        crate::triage::harness_failure(&out.termination, &out.stderr_tail)
                            .unwrap_or_else(|| "the harness exited 0".into())
                    ),
                });
            }
        };
        // Triage is pure and synchronous: its span is entered until the gate returns.
        let triage = tracing::info_span!(
            "stage.triage",
            work_item = id,
            cycle,
            decision = tracing::field::Empty,
            redactions = tracing::field::Empty,
        )
        .entered();
        let input = TriageInput {
            build_errors: results.build_errors,
            results: results.results,
        };
        let refused_text: Vec<String> = rejected
            .iter()
            .map(|(side, diags)| {
                let paths: Vec<&str> = diags
                    .iter()
                    .filter(|d| !d.artifact.is_empty())
                    .map(|d| d.artifact.as_str())
                    .collect();
                format!(
                    "{}'s output was refused ({})",
                    match side {
                        Side::Tests => "worker-a",
                        Side::Implementation => "worker-b",
                    },
                    if paths.is_empty() {
                        diags
                            .iter()
                            .map(|d| d.message.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    } else {
                        paths.join(", ")
                    }
                )
            })
            .collect();
        let refusals: Vec<(Side, Refusal)> = rejected
            .iter()
            .map(|(side, diags)| {
                let not_imported = diags.iter().any(|d| {
                    ["output-refused:", "apply-failed:", "merge-failed:"]
                        .iter()
                        .any(|stage| d.message.starts_with(stage))
                });
                (
                    *side,
                    if not_imported {
                        Refusal::NotImported
                    } else {
                        Refusal::Paths
                    },
                )
            })
            .collect();
        let decision =
            crate::triage::gate_decision(self.triage.decide(&input), &refusals, &item.approved);
        if decision == Decision::Pass && !refusals.is_empty() {
            self.stage(&format!(
                "building: cycle {cycle}: every test passed; the refused output of {} is left out and the candidate stands",
                refusals
                    .iter()
                    .map(|(side, _)| match side {
                        Side::Tests => "worker-a",
                        Side::Implementation => "worker-b",
                    })
                    .collect::<Vec<_>>()
                    .join(" and ")
            ));
        }
        let mut feedback = Vec::new();
        let mut redactions = 0;
        if let Decision::Rework { fault, assignments } = &decision {
            for a in assignments {
                let diagnostics = rejected
                    .iter()
                    .find(|(s, _)| *s == a.side)
                    .map(|(_, d)| d.clone())
                    .unwrap_or_default();
                let raw = RawFeedback {
                    recipient: a.side,
                    outcome: FeedbackOutcome::Fail,
                    fault: Some(*fault),
                    retry_budget: budget,
                    requirement_ids: a.requirement_ids.iter().cloned().collect(),
                    reason: a.reason.clone(),
                    diagnostics,
                };
                let (record, n) = self.sanitized(&raw, item, &manifest);
                redactions += n;
                feedback.push(record);
            }
        }
        let label = label_of(&decision);
        triage.record("decision", label.as_str());
        triage.record("redactions", redactions);
        let cause = (decision != Decision::Pass)
            .then(|| crate::triage::describe_gate_failure(&input, &refused_text, &out.stderr_tail))
            .flatten();
        self.trace(
            id,
            "gate",
            Some(cycle),
            json!({"candidate": candidate, "results": input.results.len(), "build_errors": input.build_errors.len(), "rejected_bundles": rejected.len()}),
            json!({"decision": label, "redactions": redactions, "cause": cause, "results": input.results, "build_errors": input.build_errors}),
            started,
        );
        if let Some(cause) = &cause {
            self.stage(&format!("building: cycle {cycle}: {cause}"));
        }
        self.stage(&format!(
            "building: cycle {cycle}: triage → {} ({redactions} redactions in Worker feedback)",
            if label == "passed" { "pass" } else { &label }
        ));
        Ok(Gate {
            decision,
            feedback,
            redactions,
            cause,
        })
    }

    pub(super) fn sanitized(
        &self,
        raw: &RawFeedback,
        item: &Item<'_>,
        manifest: &protobot_repo::manifest::ProjectionManifest,
    ) -> (SanitizedFeedback, usize) {
        let side = raw.recipient;
        let owned = |path: &str| {
            matches!(
                (side, manifest.classify(path)),
                (Side::Tests, Some(PathClass::Test))
                    | (Side::Implementation, Some(PathClass::Implementation))
            )
        };
        let record = sanitize(raw, &item.approved, &owned);
        let n = record.redactions.len();
        (record.sanitized, n)
    }
}
