//! The Job Site's `merging` stage through a GitHub pull request: [`GithubForge`] implements
//! `protobot_jobsite::landing::PullRequestForge` with [`GithubClient`] and the core's
//! decisions.
//!
//! `merge`: commit statuses on the tested head (building, integration and inspection passed,
//! merge pending), open or reuse the pull request (title and body rendered from the
//! inspection summary), merge it with `merge_method=merge` and `sha` = the tested head, and
//! map a refusal to its lifecycle outcome. A refusal that could hide a lost success (a
//! conflict or a rejected request) is checked against the pull request first: if it merged,
//! that merge is reported. `escalate`: open or update the work item's one issue.

use std::sync::Arc;

use futures::future::BoxFuture;
use protobot_jobsite::landing::{
    EscalationRequest, ForgeMerged, ForgeRefusal, PullRequestForge, PullRequestMerge,
};

use crate::{
    client::{ForgeError, GithubClient, PullState},
    core::{
        escalation::Escalation,
        merge::{LifecycleOutcome, MergeAnswer, MergeRefusal, outcome},
        render::{EvidenceLink, InspectionSummary, pull_request_body, pull_request_title},
        status::{Stage, StageState, status_body},
    },
};

/// GitHub as the Job Site's forge for one repository.
#[derive(Debug)]
pub struct GithubForge {
    client: Arc<GithubClient>,
    blob_base: String,
    work_item_url: Option<String>,
}

impl GithubForge {
    /// A forge over `client`. `web_base` is the repository's web URL
    /// (`https://github.com/acme/widgets`): evidence links point at its blobs at the tested
    /// head. `work_item_url` is a template with `{name}` for the BuildWorkItem's name (the work
    /// item id) that statuses and the pull request link to (`spec.forge.github.workItemUrl`), or
    /// `None`.
    pub fn new(
        client: Arc<GithubClient>,
        web_base: &str,
        work_item_url: Option<String>,
    ) -> GithubForge {
        GithubForge {
            client,
            blob_base: format!("{}/blob", web_base.trim_end_matches('/')),
            work_item_url,
        }
    }

    fn link(&self, id: &str) -> Option<String> {
        self.work_item_url
            .as_ref()
            .map(|t| t.replace("{name}", &crate::core::render::marker_safe(id)))
    }

    async fn status(&self, sha: &str, stage: Stage, state: StageState, text: &str, id: &str) {
        let link = self.link(id);
        let body = status_body(stage, state, text, link.as_deref());
        if let Err(error) = self.client.set_status(sha, &body).await {
            // Visibility only: a status that could not be written never changes the outcome.
            tracing::warn!(work_item = id, stage = stage.context(), %error, "failed to set a commit status");
        }
    }

    async fn land(&self, request: &PullRequestMerge) -> Result<ForgeMerged, ForgeRefusal> {
        let id = request.work_item_id.as_str();
        let sha = request.tested_head.as_str();
        for (stage, text) in [
            (Stage::Building, "tests and implementation passed"),
            (Stage::Integration, "build and active test catalog passed"),
            (
                Stage::Inspection,
                "inspection sealed, every finding terminal",
            ),
        ] {
            self.status(sha, stage, StageState::Success, text, id).await;
        }
        self.status(
            sha,
            Stage::Merge,
            StageState::Pending,
            "merging through the pull request",
            id,
        )
        .await;
        let summary = InspectionSummary {
            work_item_id: id.to_string(),
            change_set_id: request.summary.change_set_id.clone(),
            tested_head: sha.to_string(),
            product_tree_digest: request.summary.product_tree_digest.clone(),
            inspection_run_id: request.summary.inspection_run_id.clone(),
            findings: request.summary.findings,
            cycles: request.summary.cycles,
            work_item_url: self.link(id),
            evidence: request
                .summary
                .evidence
                .iter()
                .map(|(label, target)| EvidenceLink {
                    label: label.clone(),
                    target: target.clone(),
                })
                .collect(),
        };
        let title = pull_request_title(&summary);
        let body = pull_request_body(&summary, &self.blob_base);
        let pull = self
            .client
            .open_or_reuse_pull(&request.head_branch, &request.base_branch, &title, &body)
            .await
            .map_err(refusal_of)?;
        let number = match pull {
            PullState::Merged {
                number,
                merge_commit,
            } => {
                return Ok(ForgeMerged {
                    pull_request: number,
                    merge_commit,
                });
            }
            PullState::Open { number, .. } => number,
        };
        let (commit_title, commit_message) = request
            .merge_message
            .split_once("\n\n")
            .unwrap_or((request.merge_message.as_str(), ""));
        let answer = self
            .client
            .merge_pull(number, sha, commit_title, commit_message)
            .await
            .map_err(refusal_of)?;
        let refusal = match answer {
            MergeAnswer::Merged { sha: merge_commit } => {
                self.status(sha, Stage::Merge, StageState::Success, "merged", id)
                    .await;
                return Ok(ForgeMerged {
                    pull_request: number,
                    merge_commit,
                });
            }
            MergeAnswer::Refused(refusal) => refusal,
        };
        if matches!(
            refusal,
            MergeRefusal::Conflict { .. } | MergeRefusal::Invalid { .. }
        ) && let Ok(PullState::Merged {
            number,
            merge_commit,
        }) = self
            .client
            .open_or_reuse_pull(&request.head_branch, &request.base_branch, &title, &body)
            .await
        {
            // An earlier attempt merged it and its answer was lost.
            return Ok(ForgeMerged {
                pull_request: number,
                merge_commit,
            });
        }
        tracing::info!(
            work_item = id,
            pull_request = number,
            refusal = refusal.category(),
            "GitHub refused the merge"
        );
        let mapped = match outcome(&refusal) {
            LifecycleOutcome::Revalidate => ForgeRefusal::HeadMoved {
                reason: format!("pull request #{number}: {}", refusal.message()),
            },
            LifecycleOutcome::MergeConflict => ForgeRefusal::Conflict {
                reason: format!("pull request #{number}: {}", refusal.message()),
            },
            LifecycleOutcome::Blocked { reason } => ForgeRefusal::Blocked {
                reason: format!("pull request #{number}: {reason}"),
            },
            LifecycleOutcome::Failed { reason } => ForgeRefusal::Failed {
                reason: format!("pull request #{number}: {reason}"),
            },
        };
        let state = match mapped {
            ForgeRefusal::HeadMoved { .. } | ForgeRefusal::Conflict { .. } => StageState::Pending,
            _ => StageState::Failure,
        };
        self.status(sha, Stage::Merge, state, refusal.message(), id)
            .await;
        Err(mapped)
    }
}

/// A GitHub failure as a refusal: transient ones are `Unavailable` (nothing merged; resume
/// later), the rest `Failed` with the message (which names no secret).
fn refusal_of(error: ForgeError) -> ForgeRefusal {
    if error.is_transient() {
        ForgeRefusal::Unavailable {
            reason: error.to_string(),
        }
    } else {
        ForgeRefusal::Failed {
            reason: error.to_string(),
        }
    }
}

impl PullRequestForge for GithubForge {
    fn merge<'a>(
        &'a self,
        request: &'a PullRequestMerge,
    ) -> BoxFuture<'a, Result<ForgeMerged, ForgeRefusal>> {
        Box::pin(self.land(request))
    }

    fn escalate<'a>(&'a self, request: &'a EscalationRequest) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let escalation = Escalation {
                work_item_id: request.work_item_id.clone(),
                reason: request.reason.clone(),
                decision: request.decision.clone(),
                work_item_url: self.link(&request.work_item_id),
            };
            self.client
                .escalate(&escalation)
                .await
                .map(|number| {
                    tracing::info!(work_item = %request.work_item_id, issue = number, "escalation issue up to date");
                })
                .map_err(|e| e.to_string())
        })
    }

    fn describe(&self) -> String {
        format!("github {}", self.client.repository())
    }
}
