//! The Job Site's `merging` stage through a Gitea pull request: [`GiteaForge`] implements
//! `protobot_jobsite::landing::PullRequestForge` with [`GiteaClient`] and the core's
//! decisions ([`crate::core::gitea`]).
//!
//! `merge`: commit statuses on the tested head, open or reuse the pull request, merge it with
//! `Do=merge` and `head_commit_id` = the tested head. Gitea answers 200 with an empty body, so
//! the merge commit is read from the pull request afterwards. After a refusal the pull request
//! (and, when its head differs, its branch) is read again before anything is decided: a merge
//! whose answer was lost is reported, a moved head revalidates, a transient answer is asked
//! again (bounded, spaced), "Not all required status checks successful" waits for the tested
//! head's required contexts (shown in [`LandingWaits`] like GitHub's), the rest settles.
//! `escalate`: open or update the work item's one issue.

use std::sync::Arc;

use futures::future::BoxFuture;
use protobot_jobsite::landing::{
    EscalationRequest, ForgeMerged, ForgeRefusal, PullRequestForge, PullRequestMerge,
};

use super::{GiteaClient, GiteaError, GiteaPull};
use crate::{
    core::{
        escalation::Escalation,
        gitea::{
            GiteaChecksStep, GiteaMergeAnswer, GiteaStep, after_refusal, checks_step,
            gitea_checks_verdict, required_contexts,
        },
        merge::{LifecycleOutcome, PullView, is_sha},
        render::{marker_safe, pull_request_body, pull_request_title},
        status::{Stage, StageState, status_body},
    },
    landing::{ChecksWait, LandingWaits, PASSED_STAGES, inspection_summary, settled_refusal},
    metrics::ChecksWaitOutcome,
};

/// Most merge requests one landing sends, whatever the policy says.
const MAX_MERGE_ATTEMPTS: u32 = 50;

/// Gitea as the Job Site's forge for one repository.
#[derive(Debug)]
pub struct GiteaForge {
    client: Arc<GiteaClient>,
    blob_base: String,
    work_item_url: Option<String>,
    waits: LandingWaits,
}

/// How a checks wait ended.
enum ChecksEnd {
    MergeAgain,
    Settled(LifecycleOutcome),
}

/// Clears a work item's wait however the wait ends.
struct WaitGuard<'a> {
    waits: &'a LandingWaits,
    work_item_id: &'a str,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.waits.clear(self.work_item_id);
    }
}

impl GiteaForge {
    /// A forge over `client`. `web_base` is the repository's web URL
    /// (`https://gitea.example/acme/widgets`): evidence links point at its blobs at the
    /// tested head. `work_item_url` has `{name}` for the work item's name, or is `None`.
    pub fn new(
        client: Arc<GiteaClient>,
        web_base: &str,
        work_item_url: Option<String>,
    ) -> GiteaForge {
        GiteaForge {
            client,
            blob_base: format!("{}/src/commit", web_base.trim_end_matches('/')),
            work_item_url,
            waits: LandingWaits::default(),
        }
    }

    /// The same forge, showing its checks waits in `waits`.
    pub fn with_waits(mut self, waits: LandingWaits) -> GiteaForge {
        self.waits = waits;
        self
    }

    /// The checks waits of this forge's landings.
    pub fn waits(&self) -> LandingWaits {
        self.waits.clone()
    }

    fn link(&self, id: &str) -> Option<String> {
        self.work_item_url
            .as_ref()
            .map(|t| t.replace("{name}", &marker_safe(id)))
    }

    async fn status(&self, sha: &str, stage: Stage, state: StageState, text: &str, id: &str) {
        let link = self.link(id);
        let body = status_body(stage, state, text, link.as_deref());
        if let Err(error) = self.client.set_status(sha, &body).await {
            // Visibility only: a status that could not be written never changes the outcome.
            tracing::warn!(work_item = id, stage = stage.context(), %error, "failed to set a commit status on Gitea");
        }
    }

    /// The merge commit of pull request `number` once Gitea reports it merged.
    async fn merged_commit(&self, number: u64) -> Option<String> {
        let pull = self.client.get_pull(number).await.ok()?;
        pull.merged_at
            .as_ref()
            .and(pull.merge_commit_sha)
            .filter(|s| is_sha(s))
    }

    /// The pull request as Gitea holds it now, with its branch read when its head is not
    /// the tested head (Gitea updates a pull request's head in the background after a push).
    async fn view(&self, number: u64, head_branch: &str, sha: &str) -> Option<PullView> {
        let pull = self.client.get_pull(number).await.ok()?;
        let mut view = PullView {
            head_sha: pull.head.sha,
            branch_head: None,
            mergeable: pull.mergeable,
        };
        if view.head_sha != sha {
            view.branch_head = self.client.branch_head(head_branch).await.ok().flatten();
        }
        Some(view)
    }

    /// Waits for the required contexts of the tested head from `since`.
    async fn await_checks(
        &self,
        request: &PullRequestMerge,
        number: u64,
        since: (tokio::time::Instant, jiff::Timestamp),
    ) -> Result<ChecksEnd, ForgeRefusal> {
        let id = request.work_item_id.as_str();
        let sha = request.tested_head.as_str();
        let policy = self.client.settings().merge;
        let _guard = WaitGuard {
            waits: &self.waits,
            work_item_id: id,
        };
        let deadline = jiff::SignedDuration::try_from(policy.checks_deadline)
            .ok()
            .and_then(|d| since.1.checked_add(d).ok());
        // The required contexts when the identity may read the protection; else the server
        // decides and every reported context counts.
        let required = match self.client.protections().await {
            Ok(Some(rules)) => required_contexts(&rules, &request.base_branch),
            _ => None,
        };
        let mut announced = false;
        loop {
            let combined = self.client.combined_status(sha).await.map_err(refusal_of)?;
            let verdict = gitea_checks_verdict(required.as_deref(), &combined);
            let (end, outcome) = match checks_step(&policy, &verdict, since.0.elapsed()) {
                GiteaChecksStep::Poll(wait) => {
                    let wait_now = ChecksWait {
                        work_item_id: id.to_string(),
                        pull_request: number,
                        tested_head: sha.to_string(),
                        pending: verdict.pending.clone(),
                        since: since.1,
                        deadline,
                    };
                    if !announced {
                        announced = true;
                        tracing::info!(work_item = id, pull_request = number, pending = ?verdict.pending, "waiting for Gitea's required status checks of the tested head");
                        self.status(
                            sha,
                            Stage::Merge,
                            StageState::Pending,
                            &wait_now.message(),
                            id,
                        )
                        .await;
                    }
                    self.waits.set(wait_now);
                    tokio::time::sleep(wait).await;
                    continue;
                }
                GiteaChecksStep::MergeAgain => (ChecksEnd::MergeAgain, ChecksWaitOutcome::Reported),
                GiteaChecksStep::Failing(o) => (ChecksEnd::Settled(o), ChecksWaitOutcome::Failing),
                GiteaChecksStep::Escalate(o) => {
                    (ChecksEnd::Settled(o), ChecksWaitOutcome::Deadline)
                }
            };
            if let Some(m) = self.client.metrics() {
                m.checks_wait_ended(outcome);
            }
            return Ok(end);
        }
    }

    async fn land(&self, request: &PullRequestMerge) -> Result<ForgeMerged, ForgeRefusal> {
        let id = request.work_item_id.as_str();
        let sha = request.tested_head.as_str();
        for (stage, text) in PASSED_STAGES {
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
        let summary = inspection_summary(request, self.link(id));
        let title = pull_request_title(&summary);
        let body = pull_request_body(&summary, &self.blob_base);
        let number = match self
            .client
            .open_or_reuse_pull(&request.head_branch, &request.base_branch, &title, &body)
            .await
            .map_err(refusal_of)?
        {
            GiteaPull::Merged {
                number,
                merge_commit,
            } => {
                return Ok(ForgeMerged {
                    pull_request: number,
                    merge_commit,
                });
            }
            GiteaPull::Open { number } => number,
        };
        let (commit_title, commit_message) = request
            .merge_message
            .split_once("\n\n")
            .unwrap_or((request.merge_message.as_str(), ""));
        let policy = self.client.settings().merge;
        let mut retries = 0u32;
        let mut attempts = 0u32;
        let mut checks_since: Option<(tokio::time::Instant, jiff::Timestamp)> = None;
        let mut checks_reported = false;
        let (refusal, settled) = loop {
            attempts += 1;
            let answer = self
                .client
                .merge_pull(number, sha, commit_title, commit_message)
                .await
                .map_err(refusal_of)?;
            let refusal = match answer {
                GiteaMergeAnswer::Merged => {
                    // 200 with an empty body: the merge commit is the pull request's.
                    let Some(merge_commit) = self.merged_commit(number).await else {
                        return Err(ForgeRefusal::Unavailable {
                            reason: format!(
                                "Gitea answered 200 to merging pull request #{number} but does not report it merged yet; the next pass reads it again"
                            ),
                        });
                    };
                    self.status(sha, Stage::Merge, StageState::Success, "merged", id)
                        .await;
                    return Ok(ForgeMerged {
                        pull_request: number,
                        merge_commit,
                    });
                }
                GiteaMergeAnswer::Refused(refusal) => refusal,
            };
            // A merge whose answer was lost (or "already merged") is reported as merged.
            if let Some(merge_commit) = self.merged_commit(number).await {
                return Ok(ForgeMerged {
                    pull_request: number,
                    merge_commit,
                });
            }
            let view = self.view(number, &request.head_branch, sha).await;
            let step = if attempts >= MAX_MERGE_ATTEMPTS {
                GiteaStep::Settle(crate::core::gitea::outcome(&refusal, view.as_ref()))
            } else {
                after_refusal(&policy, &refusal, view.as_ref(), sha, retries)
            };
            match step {
                GiteaStep::RetryAfter(wait) => {
                    retries += 1;
                    if let Some(m) = self.client.metrics() {
                        m.merge_retried(refusal.category());
                    }
                    tracing::info!(
                        work_item = id,
                        pull_request = number,
                        refusal = refusal.category(),
                        retry = retries,
                        wait_secs = wait.as_secs(),
                        "Gitea's answer is transient; asking again"
                    );
                    tokio::time::sleep(wait).await;
                }
                GiteaStep::AwaitChecks => {
                    let since = *checks_since.get_or_insert_with(|| {
                        (tokio::time::Instant::now(), jiff::Timestamp::now())
                    });
                    if checks_reported {
                        // The contexts passed and Gitea still refused: give it a poll's time
                        // before reading them again (or escalate at the deadline).
                        let left = policy.checks_deadline.saturating_sub(since.0.elapsed());
                        tokio::time::sleep(policy.checks_poll.min(left)).await;
                    }
                    match self.await_checks(request, number, since).await? {
                        ChecksEnd::MergeAgain => checks_reported = true,
                        ChecksEnd::Settled(outcome) => break (refusal, outcome),
                    }
                }
                GiteaStep::Unavailable => {
                    return Err(ForgeRefusal::Unavailable {
                        reason: format!(
                            "pull request #{number}: {} (asked {} times); the next pass tries again",
                            refusal.message(),
                            retries + 1
                        ),
                    });
                }
                GiteaStep::Settle(outcome) => break (refusal, outcome),
            }
        };
        tracing::info!(
            work_item = id,
            pull_request = number,
            refusal = refusal.category(),
            "Gitea refused the merge"
        );
        let (mapped, state, shown) = settled_refusal(number, settled, refusal.message(), retries);
        self.status(sha, Stage::Merge, state, &shown, id).await;
        Err(mapped)
    }
}

/// A Gitea failure as a refusal: transient ones are `Unavailable` (nothing merged; resume
/// later), the rest `Failed` with the message (which names no secret).
fn refusal_of(error: GiteaError) -> ForgeRefusal {
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

impl PullRequestForge for GiteaForge {
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
                    tracing::info!(work_item = %request.work_item_id, issue = number, "Gitea escalation issue up to date");
                })
                .map_err(|e| e.to_string())
        })
    }

    fn describe(&self) -> String {
        format!("gitea {}", self.client.repository())
    }
}
