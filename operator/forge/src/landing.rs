//! The Job Site's `merging` stage through a GitHub pull request: [`GithubForge`] implements
//! `protobot_jobsite::landing::PullRequestForge` with [`GithubClient`] and the core's
//! decisions.
//!
//! `merge`: commit statuses on the tested head (building, integration and inspection passed,
//! merge pending), open or reuse the pull request (title and body rendered from the
//! inspection summary), merge it with `merge_method=merge` and `sha` = the tested head. After
//! a refusal the pull request is read again: if it merged (a lost answer), that merge is
//! reported; otherwise the core decides ([`crate::core::merge::after_refusal`]): a transient
//! answer is asked again (bounded, spaced), "Required status check … is expected" waits for
//! the tested head's checks ([`crate::core::merge::checks_step`]) while [`LandingWaits`]
//! shows the wait, and anything else settles to its lifecycle outcome. `escalate`: open or
//! update the work item's one issue.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use futures::future::BoxFuture;
use protobot_jobsite::landing::{
    EscalationRequest, ForgeMerged, ForgeRefusal, PullRequestForge, PullRequestMerge,
};

use crate::{
    client::{ForgeError, GithubClient, PullState},
    core::{
        escalation::Escalation,
        merge::{
            ChecksStep, LifecycleOutcome, MergeAnswer, MergePolicy, MergeStep, PullView,
            after_refusal, checks_step, checks_verdict, is_sha,
        },
        render::{
            EvidenceLink, InspectionSummary, pull_request_body, pull_request_title, sanitize_line,
        },
        status::{Stage, StageState, status_body},
    },
    metrics::ChecksWaitOutcome,
};

/// Most merge requests one landing sends (transient retries and merges after checks
/// reported), whatever the policy says.
const MAX_MERGE_ATTEMPTS: u32 = 50;

/// A landing waiting for the required checks of its tested head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChecksWait {
    /// The work item.
    pub work_item_id: String,
    /// Its pull request.
    pub pull_request: u64,
    /// The tested head the checks must report on.
    pub tested_head: String,
    /// The checks not reported yet (as GitHub names them; empty when it only counted them).
    pub pending: Vec<String>,
    /// When the wait started.
    pub since: jiff::Timestamp,
    /// When it gives up and escalates.
    pub deadline: Option<jiff::Timestamp>,
}

impl ChecksWait {
    /// One sanitized line for a person (a condition's message, a log line).
    pub fn message(&self) -> String {
        let checks = if self.pending.is_empty() {
            "the required status checks".to_string()
        } else {
            self.pending
                .iter()
                .map(|c| format!("\"{c}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let until = self
            .deadline
            .map(|d| format!(" until {d}"))
            .unwrap_or_default();
        sanitize_line(
            &format!(
                "waiting for {checks} to report on {} (pull request #{}){until}, then a person is asked",
                self.tested_head.chars().take(12).collect::<String>(),
                self.pull_request
            ),
            400,
        )
    }
}

/// The checks waits in progress, by work item: what the operator shows on each item while its
/// landing waits. Clones share one set.
#[derive(Clone, Debug, Default)]
pub struct LandingWaits(Arc<Mutex<BTreeMap<String, ChecksWait>>>);

impl LandingWaits {
    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<String, ChecksWait>) -> R) -> R {
        // A panic elsewhere while holding the lock leaves a usable map: recover it.
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut map)
    }

    /// Every wait in progress.
    pub fn current(&self) -> Vec<ChecksWait> {
        self.with(|m| m.values().cloned().collect())
    }

    /// The wait of `work_item_id`, if it waits.
    pub fn of(&self, work_item_id: &str) -> Option<ChecksWait> {
        self.with(|m| m.get(work_item_id).cloned())
    }

    pub(crate) fn set(&self, wait: ChecksWait) {
        self.with(|m| m.insert(wait.work_item_id.clone(), wait));
    }

    pub(crate) fn clear(&self, work_item_id: &str) {
        self.with(|m| m.remove(work_item_id));
    }
}

/// Clears a work item's wait however the wait ends (an error included).
struct WaitGuard<'a> {
    waits: &'a LandingWaits,
    work_item_id: &'a str,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        self.waits.clear(self.work_item_id);
    }
}

/// How a checks wait ended.
enum ChecksEnd {
    MergeAgain,
    Settled(LifecycleOutcome),
}

/// GitHub as the Job Site's forge for one repository.
#[derive(Debug)]
pub struct GithubForge {
    client: Arc<GithubClient>,
    blob_base: String,
    work_item_url: Option<String>,
    waits: LandingWaits,
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
            waits: LandingWaits::default(),
        }
    }

    /// The same forge, showing its checks waits in `waits` (shared with the operator, which
    /// keeps one per Project across passes).
    pub fn with_waits(mut self, waits: LandingWaits) -> GithubForge {
        self.waits = waits;
        self
    }

    /// The checks waits of this forge's landings.
    pub fn waits(&self) -> LandingWaits {
        self.waits.clone()
    }

    fn policy(&self) -> MergePolicy {
        self.client.settings().merge
    }

    /// Waits for `required` (all reported checks when empty) on the tested head, from `since`
    /// (the first "is expected" of this landing). Every poll reads the combined status and
    /// the check runs; the wait is visible in [`LandingWaits`] (and on the `protobot/merge`
    /// status) until it ends.
    async fn await_checks(
        &self,
        request: &PullRequestMerge,
        number: u64,
        required: &[String],
        since: (tokio::time::Instant, jiff::Timestamp),
    ) -> Result<ChecksEnd, ForgeRefusal> {
        let id = request.work_item_id.as_str();
        let sha = request.tested_head.as_str();
        let policy = self.policy();
        let _guard = WaitGuard {
            waits: &self.waits,
            work_item_id: id,
        };
        let deadline = jiff::SignedDuration::try_from(policy.checks_deadline)
            .ok()
            .and_then(|d| since.1.checked_add(d).ok());
        let mut announced = false;
        loop {
            let combined = self.client.combined_status(sha).await.map_err(refusal_of)?;
            let runs = self.client.check_runs(sha).await.map_err(refusal_of)?;
            let verdict = checks_verdict(required, &combined, &runs);
            let (end, outcome) = match checks_step(&policy, &verdict, since.0.elapsed()) {
                ChecksStep::Poll(wait) => {
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
                        tracing::info!(work_item = id, pull_request = number, pending = ?verdict.pending, "waiting for required checks of the tested head");
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
                ChecksStep::MergeAgain => (ChecksEnd::MergeAgain, ChecksWaitOutcome::Reported),
                ChecksStep::Failing(o) => (ChecksEnd::Settled(o), ChecksWaitOutcome::Failing),
                ChecksStep::Escalate(o) => (ChecksEnd::Settled(o), ChecksWaitOutcome::Deadline),
            };
            if let Some(m) = self.client.metrics() {
                m.checks_wait_ended(outcome);
            }
            return Ok(end);
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
        let policy = self.policy();
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
            // The pull request as GitHub holds it now: merged by an attempt whose answer was
            // lost, its head, whether mergeability is computed.
            let pull = self.client.get_pull(number).await.ok();
            if let Some(merge_commit) = pull
                .as_ref()
                .filter(|p| p.merged_at.is_some())
                .and_then(|p| p.merge_commit_sha.clone())
                .filter(|s| is_sha(s))
            {
                return Ok(ForgeMerged {
                    pull_request: number,
                    merge_commit,
                });
            }
            let mut view = pull.map(|p| PullView {
                head_sha: p.head.sha,
                branch_head: None,
                mergeable: p.mergeable,
            });
            if let Some(v) = view.as_mut().filter(|v| v.head_sha != sha) {
                // GitHub's pull request lags behind pushes; the branch does not.
                v.branch_head = self
                    .client
                    .branch_head(&request.head_branch)
                    .await
                    .ok()
                    .flatten();
            }
            let step = if attempts >= MAX_MERGE_ATTEMPTS {
                MergeStep::Settle(crate::core::merge::outcome(&refusal))
            } else {
                after_refusal(&policy, &refusal, view.as_ref(), sha, retries)
            };
            match step {
                MergeStep::RetryAfter(wait) => {
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
                        "GitHub's answer is transient; asking again"
                    );
                    tokio::time::sleep(wait).await;
                }
                MergeStep::AwaitChecks(required) => {
                    let since = *checks_since.get_or_insert_with(|| {
                        (tokio::time::Instant::now(), jiff::Timestamp::now())
                    });
                    if checks_reported {
                        // The checks had reported and GitHub still expects one: give it a
                        // poll's time to catch up before reading them again.
                        let left = policy.checks_deadline.saturating_sub(since.0.elapsed());
                        tokio::time::sleep(policy.checks_poll.min(left)).await;
                    }
                    match self.await_checks(request, number, &required, since).await? {
                        ChecksEnd::MergeAgain => checks_reported = true,
                        ChecksEnd::Settled(outcome) => break (refusal, outcome),
                    }
                }
                MergeStep::Settle(outcome) => break (refusal, outcome),
            }
        };
        tracing::info!(
            work_item = id,
            pull_request = number,
            refusal = refusal.category(),
            "GitHub refused the merge"
        );
        let (mapped, state, shown) = settled_refusal(number, settled, refusal.message(), retries);
        self.status(sha, Stage::Merge, state, &shown, id).await;
        Err(mapped)
    }
}

/// The stages a landing item has passed, as the commit statuses say before the merge.
pub(crate) const PASSED_STAGES: [(Stage, &str); 3] = [
    (Stage::Building, "tests and implementation passed"),
    (Stage::Integration, "build and active test catalog passed"),
    (
        Stage::Inspection,
        "inspection sealed, every finding terminal",
    ),
];

/// What the pull request says about the item it lands: the engine's summary of `request`
/// and the link to the item (`work_item_url`). One for every forge.
pub(crate) fn inspection_summary(
    request: &PullRequestMerge,
    work_item_url: Option<String>,
) -> InspectionSummary {
    InspectionSummary {
        work_item_id: request.work_item_id.clone(),
        change_set_id: request.summary.change_set_id.clone(),
        tested_head: request.tested_head.clone(),
        product_tree_digest: request.summary.product_tree_digest.clone(),
        inspection_run_id: request.summary.inspection_run_id.clone(),
        findings: request.summary.findings,
        cycles: request.summary.cycles,
        work_item_url,
        evidence: request
            .summary
            .evidence
            .iter()
            .map(|(label, target)| EvidenceLink {
                label: label.clone(),
                target: target.clone(),
            })
            .collect(),
    }
}

/// What a settled merge refusal means for the Job Site and what the merge status says: the
/// lifecycle outcome the core decided for pull request `number` (refused with `message`, after
/// `retries` retries) as the engine's refusal, the merge stage's state (pending while the item
/// revalidates or meets a conflict, failure otherwise) and its text. One mapping for every
/// forge.
pub(crate) fn settled_refusal(
    number: u64,
    settled: LifecycleOutcome,
    message: &str,
    retries: u32,
) -> (ForgeRefusal, StageState, String) {
    let asked = if retries > 0 {
        format!(" (asked {} times)", retries + 1)
    } else {
        String::new()
    };
    let mapped = match settled {
        LifecycleOutcome::Revalidate => ForgeRefusal::HeadMoved {
            reason: format!("pull request #{number}: {message}{asked}"),
        },
        LifecycleOutcome::MergeConflict => ForgeRefusal::Conflict {
            reason: format!("pull request #{number}: {message}{asked}"),
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
    let shown = match &mapped {
        ForgeRefusal::Blocked { reason } => reason.clone(),
        _ => message.to_owned(),
    };
    (mapped, state, shown)
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
