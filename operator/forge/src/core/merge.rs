//! What the merge API answered (`PUT /repos/{o}/{r}/pulls/{n}/merge` with `merge_method=merge`
//! and `sha` = the tested head), which answers are transient, and what a settled refusal means
//! for the lifecycle.
//!
//! GitHub documents 200 (merged), 405 (the merge cannot be performed: branch protection,
//! failing or missing required checks, a merge conflict, a modified head or base), 409 (`sha`
//! given and the head does not match), 422 (validation failed), 403 and 404. Rate limits and
//! server errors are the transport's ([`super::ratelimit`]); this module sees only the answer.
//!
//! GitHub computes a pull request's head and mergeability in the background after every push
//! to either branch; several answers are that computation catching up, not a decision, and
//! succeed when asked again (GitHub's CLI and merge bots retry them):
//!
//! | answer | what it means | [`after_refusal`] |
//! | --- | --- | --- |
//! | 405 "Base branch was modified. Review and try the merge again." | the base moved while GitHub prepared the merge | retried (spaced), then revalidate |
//! | 409, 405 "Head branch was modified" | GitHub's head is not the `sha` sent | re-read the pull request: its head still the tested head → retried; else revalidate |
//! | 405 "not mergeable" | a conflict, or mergeability not computed yet | re-read: `mergeable: null` → retried; else the merge-conflict path |
//! | 405 "not up to date with the base branch" | the base really moved ("require branches to be up to date") | revalidate at once |
//! | 405 `Required status check "X" is expected.` | X has not reported on the tested head yet | wait for the required checks ([`checks_step`]) up to a deadline, then escalate once with what is pending |
//! | 405 "… is failing", "N of M required status checks have not succeeded" | a check failed | blocked: a person acts |
//! | 405 other (reviews, restrictions, merge method), 403 | branch protection | blocked: a person acts |
//! | 422, 404, a 200 that says "not merged" | a defect or misconfiguration | failed, reported |

use std::time::Duration;

use http::StatusCode;

use super::{
    render::sanitize_line,
    wire::{CheckRuns, CombinedStatus, DecodeError, MergeResult, decode, error_message},
};

/// Longest GitHub reason kept (sanitized) in a refusal.
const MAX_REASON: usize = 500;

/// Most check names read from one refusal message.
const MAX_NAMED_CHECKS: usize = 20;

/// Status contexts protobot writes itself (never a check to wait for: `protobot/merge` is
/// pending while it merges).
pub const OWN_CONTEXT_PREFIX: &str = "protobot/";

/// Why GitHub refused the merge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergeRefusal {
    /// The head GitHub holds is not the `sha` sent (409, 405 "Head branch was modified").
    HeadMoved {
        /// GitHub's message (sanitized).
        message: String,
    },
    /// The base moved while GitHub prepared the merge (405 "Base branch was modified"):
    /// transient.
    BaseModified {
        /// GitHub's message (sanitized).
        message: String,
    },
    /// The head is behind the base and the branch must be up to date before merging.
    NotUpToDate {
        /// GitHub's message (sanitized).
        message: String,
    },
    /// The head does not merge cleanly into the base (or mergeability is not computed yet).
    Conflict {
        /// GitHub's message (sanitized).
        message: String,
    },
    /// Required status checks have not reported on the head yet.
    ChecksPending {
        /// The checks GitHub named (may be empty when it only counted them).
        checks: Vec<String>,
        /// GitHub's message (sanitized).
        message: String,
    },
    /// A required status check is failing.
    RequiredCheck {
        /// GitHub's message (sanitized), naming the check.
        message: String,
    },
    /// Branch protection (required reviews, restrictions) or permissions refused it.
    Protected {
        /// GitHub's message (sanitized).
        message: String,
    },
    /// GitHub rejected the request itself (422, 404, or a 200 without a merge).
    Invalid {
        /// HTTP status.
        status: u16,
        /// GitHub's message (sanitized).
        message: String,
    },
}

impl MergeRefusal {
    /// A stable label (metrics, traces).
    pub fn category(&self) -> &'static str {
        match self {
            MergeRefusal::HeadMoved { .. } => "head-moved",
            MergeRefusal::BaseModified { .. } => "base-modified",
            MergeRefusal::NotUpToDate { .. } => "not-up-to-date",
            MergeRefusal::Conflict { .. } => "conflict",
            MergeRefusal::ChecksPending { .. } => "checks-pending",
            MergeRefusal::RequiredCheck { .. } => "required-check",
            MergeRefusal::Protected { .. } => "protected",
            MergeRefusal::Invalid { .. } => "invalid",
        }
    }

    /// GitHub's (sanitized) reason.
    pub fn message(&self) -> &str {
        match self {
            MergeRefusal::HeadMoved { message }
            | MergeRefusal::BaseModified { message }
            | MergeRefusal::NotUpToDate { message }
            | MergeRefusal::Conflict { message }
            | MergeRefusal::ChecksPending { message, .. }
            | MergeRefusal::RequiredCheck { message }
            | MergeRefusal::Protected { message }
            | MergeRefusal::Invalid { message, .. } => message,
        }
    }
}

/// The merge API's final answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergeAnswer {
    /// Merged: GitHub's merge commit (still to be verified on the default branch).
    Merged {
        /// The merge commit.
        sha: String,
    },
    /// Refused.
    Refused(MergeRefusal),
}

/// The names between double quotes in `message` (`Required status check "ci/test" is
/// expected.`), without control characters, at most [`MAX_NAMED_CHECKS`] of 200 characters.
/// They are matched against contexts as they are and sanitized wherever they are shown.
fn quoted_names(message: &str) -> Vec<String> {
    message
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|n| {
            n.chars()
                .filter(|c| !c.is_control())
                .take(200)
                .collect::<String>()
        })
        .filter(|n| !n.trim().is_empty())
        .take(MAX_NAMED_CHECKS)
        .collect()
}

/// Classifies the merge API's response. A 200 whose body does not decode is a
/// [`DecodeError`] (the merge may have happened: the caller verifies the default branch).
pub fn classify_merge(status: StatusCode, body: &[u8]) -> Result<MergeAnswer, DecodeError> {
    let raw = error_message(body);
    let message = || {
        sanitize_line(
            raw.as_deref()
                .unwrap_or_else(|| status.canonical_reason().unwrap_or("no reason given")),
            MAX_REASON,
        )
    };
    if status == StatusCode::OK {
        let result: MergeResult = decode("merge the pull request", body)?;
        return Ok(if result.merged && is_sha(&result.sha) {
            MergeAnswer::Merged { sha: result.sha }
        } else {
            MergeAnswer::Refused(MergeRefusal::Invalid {
                status: status.as_u16(),
                message: message(),
            })
        });
    }
    let message = message();
    let lower = message.to_ascii_lowercase();
    let refusal = match status {
        StatusCode::CONFLICT => MergeRefusal::HeadMoved { message },
        StatusCode::METHOD_NOT_ALLOWED if lower.contains("base branch was modified") => {
            MergeRefusal::BaseModified { message }
        }
        StatusCode::METHOD_NOT_ALLOWED if lower.contains("head branch was modified") => {
            MergeRefusal::HeadMoved { message }
        }
        StatusCode::METHOD_NOT_ALLOWED if lower.contains("not up to date") => {
            MergeRefusal::NotUpToDate { message }
        }
        StatusCode::METHOD_NOT_ALLOWED
            if lower.contains("status check")
                && (lower.contains("expected") || lower.contains("in progress"))
                && !lower.contains("failing")
                && !lower.contains("not succeeded") =>
        {
            // Names come from the raw message: they must match the contexts exactly.
            let checks = quoted_names(raw.as_deref().unwrap_or_default());
            MergeRefusal::ChecksPending { checks, message }
        }
        StatusCode::METHOD_NOT_ALLOWED if lower.contains("status check") => {
            MergeRefusal::RequiredCheck { message }
        }
        StatusCode::METHOD_NOT_ALLOWED
            if lower.contains("not mergeable") || lower.contains("merge conflict") =>
        {
            MergeRefusal::Conflict { message }
        }
        StatusCode::METHOD_NOT_ALLOWED | StatusCode::FORBIDDEN => {
            MergeRefusal::Protected { message }
        }
        other => MergeRefusal::Invalid {
            status: other.as_u16(),
            message,
        },
    };
    Ok(MergeAnswer::Refused(refusal))
}

/// Whether `s` is a 40-hex commit id.
pub fn is_sha(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// What a settled refusal means for the work item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LifecycleOutcome {
    /// The default branch or the head moved: back to building, revalidate, land again.
    Revalidate,
    /// The merge conflicts: the merge-conflict path (back to building).
    MergeConflict,
    /// A person must act (a failing check, protection, checks that never reported): the item
    /// stops with this reason and an escalation issue says what to decide.
    Blocked {
        /// The reason, naming the check or the rule.
        reason: String,
    },
    /// GitHub rejected the request itself: a defect or misconfiguration, reported.
    Failed {
        /// What GitHub said.
        reason: String,
    },
}

fn shown(names: &[String]) -> String {
    if names.is_empty() {
        return "(GitHub did not name them)".to_string();
    }
    names
        .iter()
        .map(|n| format!("\"{}\"", sanitize_line(n, 100)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The lifecycle outcome of a refusal once no retry or wait is left.
pub fn outcome(refusal: &MergeRefusal) -> LifecycleOutcome {
    match refusal {
        MergeRefusal::HeadMoved { .. }
        | MergeRefusal::BaseModified { .. }
        | MergeRefusal::NotUpToDate { .. } => LifecycleOutcome::Revalidate,
        MergeRefusal::Conflict { .. } => LifecycleOutcome::MergeConflict,
        MergeRefusal::ChecksPending { checks, message } => LifecycleOutcome::Blocked {
            reason: format!(
                "GitHub refused the merge: required status checks {} did not report on the tested head ({message}); make the check run on this commit (is its CI configured for the pull request?), then run `protobot retry`",
                shown(checks)
            ),
        },
        MergeRefusal::RequiredCheck { message } => LifecycleOutcome::Blocked {
            reason: format!(
                "GitHub refused the merge: a required status check did not pass ({message}); fix the check or the candidate, then run `protobot retry`"
            ),
        },
        MergeRefusal::Protected { message } => LifecycleOutcome::Blocked {
            reason: format!(
                "GitHub refused the merge under branch protection ({message}); satisfy the rule (for example an approving review of the pull request) or grant the Job Site's identity the bypass, then run `protobot retry`"
            ),
        },
        MergeRefusal::Invalid { status, message } => LifecycleOutcome::Failed {
            reason: format!("GitHub rejected the merge request ({status}: {message})"),
        },
    }
}

/// How the landing retries transient answers and waits for required checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergePolicy {
    /// Transient refusals retried per landing attempt (base modified, a head GitHub has not
    /// caught up with, mergeability not computed yet).
    pub transient_retries: u32,
    /// The wait before the first retry; it doubles with each further one.
    pub first_wait: Duration,
    /// The longest wait between two retries.
    pub max_wait: Duration,
    /// How long required checks may take to report on the tested head before a person is
    /// asked. Keep it under the work item's lease (15 minutes by default): `merging` takes no
    /// renewals.
    pub checks_deadline: Duration,
    /// How often the checks of the tested head are read while waiting.
    pub checks_poll: Duration,
}

impl Default for MergePolicy {
    fn default() -> Self {
        MergePolicy {
            transient_retries: 4,
            first_wait: Duration::from_secs(2),
            max_wait: Duration::from_secs(30),
            checks_deadline: Duration::from_secs(10 * 60),
            checks_poll: Duration::from_secs(20),
        }
    }
}

impl MergePolicy {
    /// The wait before transient retry `attempt` (0-based): `first_wait` doubled per
    /// attempt, at most `max_wait`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(16)).unwrap_or(u32::MAX);
        self.first_wait.saturating_mul(factor).min(self.max_wait)
    }
}

/// The pull request as re-read after a refusal (`GET …/pulls/{n}`), and its head branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullView {
    /// Its head commit as GitHub holds it now (it lags behind a push).
    pub head_sha: String,
    /// The head branch's ref (`GET …/git/ref/heads/{branch}`: current at once after a push),
    /// read when `head_sha` is not the tested head; `None` when not read or unreadable.
    pub branch_head: Option<String>,
    /// `mergeable`: `None` while GitHub is still computing it.
    pub mergeable: Option<bool>,
}

impl PullView {
    /// Whether the head is `tested_head`, by the pull request or, when GitHub's view of it
    /// lags, by the branch.
    pub fn head_is(&self, tested_head: &str) -> bool {
        self.head_sha == tested_head || self.branch_head.as_deref() == Some(tested_head)
    }
}

/// What the landing does next after a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergeStep {
    /// GitHub is catching up: ask again after this wait.
    RetryAfter(Duration),
    /// Wait for these required checks (empty: whichever GitHub requires) on the tested head.
    AwaitChecks(Vec<String>),
    /// Nothing left to retry: this is the outcome.
    Settle(LifecycleOutcome),
}

/// The next step after `refusal`, given the pull request re-read after it (`None` when it
/// could not be read) and how many transient retries this landing already made.
pub fn after_refusal(
    policy: &MergePolicy,
    refusal: &MergeRefusal,
    pull: Option<&PullView>,
    tested_head: &str,
    retries_made: u32,
) -> MergeStep {
    let retry = || {
        if retries_made < policy.transient_retries {
            Some(MergeStep::RetryAfter(policy.backoff(retries_made)))
        } else {
            None
        }
    };
    let settle = || MergeStep::Settle(outcome(refusal));
    match refusal {
        MergeRefusal::BaseModified { .. } => retry().unwrap_or_else(settle),
        MergeRefusal::HeadMoved { .. } => match pull {
            // The head still is the tested head (GitHub's pull request says so, or its view
            // lags and the branch says so): nobody pushed, GitHub had not caught up.
            Some(p) if p.head_is(tested_head) => retry().unwrap_or_else(settle),
            _ => settle(),
        },
        MergeRefusal::Conflict { .. } => match pull {
            Some(p) if p.head_is(tested_head) && p.mergeable.is_none() => {
                retry().unwrap_or_else(settle)
            }
            _ => settle(),
        },
        MergeRefusal::ChecksPending { checks, .. } => MergeStep::AwaitChecks(checks.clone()),
        MergeRefusal::NotUpToDate { .. }
        | MergeRefusal::RequiredCheck { .. }
        | MergeRefusal::Protected { .. }
        | MergeRefusal::Invalid { .. } => settle(),
    }
}

/// Where a check stands on one commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckState {
    /// Not reported, queued or running.
    Pending,
    /// Passed (a status `success`; a check run `success`, `neutral` or `skipped`).
    Succeeded,
    /// Failed (`failure`, `error`; `cancelled`, `timed_out`, `action_required`, `stale`).
    Failed,
}

fn status_state(state: &str) -> CheckState {
    match state {
        "success" => CheckState::Succeeded,
        "failure" | "error" => CheckState::Failed,
        _ => CheckState::Pending,
    }
}

fn run_state(status: &str, conclusion: Option<&str>) -> CheckState {
    if status != "completed" {
        return CheckState::Pending;
    }
    match conclusion {
        Some("success" | "neutral" | "skipped") => CheckState::Succeeded,
        Some(_) => CheckState::Failed,
        None => CheckState::Pending,
    }
}

/// The checks of the tested head as the combined status and the check runs report them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChecksVerdict {
    /// Reported and passed.
    pub succeeded: Vec<String>,
    /// Not reported or still running.
    pub pending: Vec<String>,
    /// Reported and failed.
    pub failing: Vec<String>,
}

/// Where `required` stand on the tested head (a context of the combined status or a check
/// run's name). With `required` empty (GitHub counted checks without naming them), every
/// check reported on the head but protobot's own counts. A check reported by both (or by
/// several runs) takes its best state: a run re-requested after a failure that passed counts
/// as passed.
pub fn checks_verdict(
    required: &[String],
    combined: &CombinedStatus,
    runs: &CheckRuns,
) -> ChecksVerdict {
    let mut seen: Vec<(String, CheckState)> = Vec::new();
    let mut note = |name: &str, state: CheckState| {
        if name.starts_with(OWN_CONTEXT_PREFIX) {
            return;
        }
        match seen.iter_mut().find(|(n, _)| n == name) {
            Some((_, s)) => {
                *s = match (*s, state) {
                    (CheckState::Succeeded, _) | (_, CheckState::Succeeded) => {
                        CheckState::Succeeded
                    }
                    (CheckState::Pending, _) | (_, CheckState::Pending) => CheckState::Pending,
                    _ => CheckState::Failed,
                }
            }
            None => seen.push((name.to_string(), state)),
        }
    };
    for status in &combined.statuses {
        note(&status.context, status_state(&status.state));
    }
    for run in &runs.check_runs {
        note(&run.name, run_state(&run.status, run.conclusion.as_deref()));
    }
    let wanted: Vec<(String, CheckState)> = if required.is_empty() {
        seen
    } else {
        required
            .iter()
            .map(|name| {
                let state = seen
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(CheckState::Pending, |(_, s)| *s);
                (name.clone(), state)
            })
            .collect()
    };
    let mut verdict = ChecksVerdict::default();
    for (name, state) in wanted {
        match state {
            CheckState::Succeeded => verdict.succeeded.push(name),
            CheckState::Pending => verdict.pending.push(name),
            CheckState::Failed => verdict.failing.push(name),
        }
    }
    verdict
}

/// What the landing does while waiting for required checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChecksStep {
    /// Every awaited check passed: merge again.
    MergeAgain,
    /// Still pending: read the checks again after this wait.
    Poll(Duration),
    /// A check failed: a person acts.
    Failing(LifecycleOutcome),
    /// The deadline passed with checks still pending: escalate once, naming them.
    Escalate(LifecycleOutcome),
}

/// The next step of a checks wait that started `waited` ago.
pub fn checks_step(policy: &MergePolicy, verdict: &ChecksVerdict, waited: Duration) -> ChecksStep {
    if !verdict.failing.is_empty() {
        return ChecksStep::Failing(LifecycleOutcome::Blocked {
            reason: format!(
                "GitHub refused the merge: required status checks {} failed on the tested head; fix the check or the candidate, then run `protobot retry`",
                shown(&verdict.failing)
            ),
        });
    }
    if verdict.pending.is_empty() {
        return ChecksStep::MergeAgain;
    }
    if waited >= policy.checks_deadline {
        return ChecksStep::Escalate(LifecycleOutcome::Blocked {
            reason: format!(
                "GitHub refused the merge: required status checks {} had not reported on the tested head after {} s; make them run on this commit (or fix what keeps them queued), then run `protobot retry`",
                shown(&verdict.pending),
                policy.checks_deadline.as_secs()
            ),
        });
    }
    ChecksStep::Poll(policy.checks_poll.min(policy.checks_deadline - waited))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::core::wire::{CheckRun, CommitStatus};

    fn refused(status: u16, message: &str) -> MergeRefusal {
        let body = serde_json::json!({"message": message, "documentation_url": "https://docs.github.com/rest"});
        match classify_merge(
            StatusCode::from_u16(status).unwrap(),
            body.to_string().as_bytes(),
        )
        .unwrap()
        {
            MergeAnswer::Refused(r) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    const TESTED: &str = "1234567890123456789012345678901234567890";

    fn view(head: &str, mergeable: Option<bool>) -> PullView {
        PullView {
            head_sha: head.to_string(),
            branch_head: None,
            mergeable,
        }
    }

    #[test]
    fn a_merged_answer_carries_the_merge_commit() {
        let sha = "a".repeat(40);
        let body = format!(
            r#"{{"sha":"{sha}","merged":true,"message":"Pull Request successfully merged"}}"#
        );
        assert_eq!(
            classify_merge(StatusCode::OK, body.as_bytes()).unwrap(),
            MergeAnswer::Merged { sha }
        );
        // "merged": false, or a sha that is not one, is not a merge.
        let body = r#"{"sha":"zz","merged":true,"message":"?"}"#;
        assert!(matches!(
            classify_merge(StatusCode::OK, body.as_bytes()).unwrap(),
            MergeAnswer::Refused(MergeRefusal::Invalid { status: 200, .. })
        ));
        assert!(classify_merge(StatusCode::OK, b"{").is_err());
    }

    /// GitHub's documented answers, each with what the landing does first (with the pull
    /// request re-read as still holding the tested head, mergeability known) and what it
    /// settles on once nothing is left to retry.
    #[test]
    fn documented_refusals_map_to_their_first_step_and_settled_outcome() {
        let policy = MergePolicy::default();
        let head = view(TESTED, Some(true));
        let cases: [(u16, &str, &str, &str, &str); 12] = [
            (
                409,
                "Head branch was modified. Review and try the merge again.",
                "head-moved",
                "retry",
                "revalidate",
            ),
            (
                405,
                "Head branch was modified. Review and try the merge again.",
                "head-moved",
                "retry",
                "revalidate",
            ),
            (
                405,
                "Base branch was modified. Review and try the merge again.",
                "base-modified",
                "retry",
                "revalidate",
            ),
            (
                405,
                "Head branch is not up to date with the base branch",
                "not-up-to-date",
                "revalidate",
                "revalidate",
            ),
            (
                405,
                "Required status check \"ci/test\" is expected.",
                "checks-pending",
                "await",
                "blocked",
            ),
            (
                405,
                "2 of 2 required status checks are expected.",
                "checks-pending",
                "await",
                "blocked",
            ),
            (
                405,
                "Required status check \"ci/test\" is failing.",
                "required-check",
                "blocked",
                "blocked",
            ),
            (
                405,
                "2 of 3 required status checks have not succeeded: 1 failing.",
                "required-check",
                "blocked",
                "blocked",
            ),
            (
                405,
                "Pull Request is not mergeable",
                "conflict",
                "conflict",
                "conflict",
            ),
            (
                405,
                "At least 1 approving review is required by reviewers with write access.",
                "protected",
                "blocked",
                "blocked",
            ),
            (
                403,
                "Resource not accessible by integration",
                "protected",
                "blocked",
                "blocked",
            ),
            (422, "Validation Failed", "invalid", "failed", "failed"),
        ];
        let kind = |step: &MergeStep| match step {
            MergeStep::RetryAfter(_) => "retry",
            MergeStep::AwaitChecks(_) => "await",
            MergeStep::Settle(o) => settled(o),
        };
        fn settled(o: &LifecycleOutcome) -> &'static str {
            match o {
                LifecycleOutcome::Revalidate => "revalidate",
                LifecycleOutcome::MergeConflict => "conflict",
                LifecycleOutcome::Blocked { .. } => "blocked",
                LifecycleOutcome::Failed { .. } => "failed",
            }
        }
        for (status, message, category, first, last) in cases {
            let r = refused(status, message);
            assert_eq!(r.category(), category, "{status} {message}");
            let step = after_refusal(&policy, &r, Some(&head), TESTED, 0);
            assert_eq!(kind(&step), first, "{status} {message}: {step:?}");
            assert_eq!(settled(&outcome(&r)), last, "{status} {message}");
            if let LifecycleOutcome::Blocked { reason } = outcome(&r)
                && category != "checks-pending"
            {
                assert!(reason.contains(message.trim_end_matches('.')), "{reason}");
            }
        }
        assert_eq!(
            refused(
                405,
                "Required status checks \"ci/test\" and \"lint\" are expected."
            ),
            MergeRefusal::ChecksPending {
                checks: vec!["ci/test".into(), "lint".into()],
                message: "Required status checks \"ci/test\" and \"lint\" are expected.".into()
            }
        );
        assert_eq!(
            refused(404, "Not Found").category(),
            "invalid",
            "a 404 is not a refusal to wait out"
        );
    }

    #[test]
    fn transient_answers_are_retried_a_bounded_number_of_times_with_growing_waits() {
        let policy = MergePolicy::default();
        let base = refused(
            405,
            "Base branch was modified. Review and try the merge again.",
        );
        let waits: Vec<MergeStep> = (0..=policy.transient_retries)
            .map(|made| after_refusal(&policy, &base, None, TESTED, made))
            .collect();
        assert_eq!(
            waits,
            vec![
                MergeStep::RetryAfter(Duration::from_secs(2)),
                MergeStep::RetryAfter(Duration::from_secs(4)),
                MergeStep::RetryAfter(Duration::from_secs(8)),
                MergeStep::RetryAfter(Duration::from_secs(16)),
                MergeStep::Settle(LifecycleOutcome::Revalidate),
            ]
        );
        // The spacing is capped, never overflows.
        assert_eq!(policy.backoff(u32::MAX), policy.max_wait);
    }

    #[test]
    fn a_moved_head_is_retried_only_while_github_still_holds_the_tested_head() {
        let policy = MergePolicy::default();
        let moved = refused(
            409,
            "Head branch was modified. Review and try the merge again.",
        );
        // GitHub's head is the tested one: its view lagged; ask again.
        assert!(matches!(
            after_refusal(&policy, &moved, Some(&view(TESTED, None)), TESTED, 0),
            MergeStep::RetryAfter(_)
        ));
        // GitHub's pull request still shows the previous head, the branch the tested one:
        // GitHub is behind the push.
        let lagging = PullView {
            branch_head: Some(TESTED.to_string()),
            ..view(&"8".repeat(40), None)
        };
        assert!(matches!(
            after_refusal(&policy, &moved, Some(&lagging), TESTED, 0),
            MergeStep::RetryAfter(_)
        ));
        // Someone pushed another head: revalidate at once.
        assert_eq!(
            after_refusal(
                &policy,
                &moved,
                Some(&view(&"9".repeat(40), Some(true))),
                TESTED,
                0
            ),
            MergeStep::Settle(LifecycleOutcome::Revalidate)
        );
        // The pull request could not be read: nothing says GitHub is catching up.
        assert_eq!(
            after_refusal(&policy, &moved, None, TESTED, 0),
            MergeStep::Settle(LifecycleOutcome::Revalidate)
        );
        // A conflict is retried only while mergeability is still being computed.
        let conflict = refused(405, "Pull Request is not mergeable");
        assert!(matches!(
            after_refusal(&policy, &conflict, Some(&view(TESTED, None)), TESTED, 0),
            MergeStep::RetryAfter(_)
        ));
        assert_eq!(
            after_refusal(
                &policy,
                &conflict,
                Some(&view(TESTED, Some(false))),
                TESTED,
                0
            ),
            MergeStep::Settle(LifecycleOutcome::MergeConflict)
        );
    }

    fn combined(pairs: &[(&str, &str)]) -> CombinedStatus {
        CombinedStatus {
            statuses: pairs
                .iter()
                .map(|(c, s)| CommitStatus {
                    context: c.to_string(),
                    state: s.to_string(),
                })
                .collect(),
        }
    }

    fn runs(items: &[(&str, &str, Option<&str>)]) -> CheckRuns {
        CheckRuns {
            check_runs: items
                .iter()
                .map(|(n, s, c)| CheckRun {
                    name: n.to_string(),
                    status: s.to_string(),
                    conclusion: c.map(str::to_string),
                })
                .collect(),
        }
    }

    #[test]
    fn the_verdict_reads_statuses_and_check_runs_of_the_tested_head() {
        let required = vec!["ci/test".to_string(), "build".to_string()];
        // Nothing reported yet: both pending.
        let v = checks_verdict(&required, &combined(&[]), &runs(&[]));
        assert_eq!(v.pending, required);
        // A status and a check run, one still running.
        let v = checks_verdict(
            &required,
            &combined(&[("ci/test", "success"), ("protobot/merge", "pending")]),
            &runs(&[("build", "in_progress", None)]),
        );
        assert_eq!(
            (v.succeeded, v.pending),
            (vec!["ci/test".to_string()], vec!["build".to_string()])
        );
        // A re-run that passed after a failure passes; a cancelled run fails.
        let v = checks_verdict(
            &required,
            &combined(&[("ci/test", "failure"), ("ci/test", "success")]),
            &runs(&[("build", "completed", Some("cancelled"))]),
        );
        assert_eq!(
            (v.succeeded, v.failing),
            (vec!["ci/test".to_string()], vec!["build".to_string()])
        );
        // Unnamed: every reported check but protobot's own.
        let v = checks_verdict(
            &[],
            &combined(&[("protobot/merge", "pending"), ("lint", "pending")]),
            &runs(&[("build", "completed", Some("skipped"))]),
        );
        assert_eq!(
            (v.succeeded, v.pending),
            (vec!["build".to_string()], vec!["lint".to_string()])
        );
    }

    #[test]
    fn a_checks_wait_merges_polls_escalates_at_the_deadline_or_stops_on_a_failure() {
        let policy = MergePolicy::default();
        let pending = ChecksVerdict {
            pending: vec!["ci/test".into()],
            ..ChecksVerdict::default()
        };
        assert_eq!(
            checks_step(&policy, &pending, Duration::ZERO),
            ChecksStep::Poll(policy.checks_poll)
        );
        // The last poll ends at the deadline, not after it.
        let near = policy.checks_deadline - Duration::from_secs(5);
        assert_eq!(
            checks_step(&policy, &pending, near),
            ChecksStep::Poll(Duration::from_secs(5))
        );
        match checks_step(&policy, &pending, policy.checks_deadline) {
            ChecksStep::Escalate(LifecycleOutcome::Blocked { reason }) => {
                assert!(reason.contains("\"ci/test\""), "{reason}");
                assert!(reason.contains("protobot retry"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let passed = ChecksVerdict {
            succeeded: vec!["ci/test".into()],
            ..ChecksVerdict::default()
        };
        assert_eq!(checks_step(&policy, &passed, near), ChecksStep::MergeAgain);
        let failing = ChecksVerdict {
            failing: vec!["ci/test".into()],
            pending: vec!["lint".into()],
            ..ChecksVerdict::default()
        };
        assert!(matches!(
            checks_step(&policy, &failing, Duration::ZERO),
            ChecksStep::Failing(LifecycleOutcome::Blocked { .. })
        ));
    }

    #[test]
    fn a_refusal_without_a_json_body_still_has_a_reason_and_is_sanitized() {
        let r = match classify_merge(StatusCode::METHOD_NOT_ALLOWED, b"<html>oops</html>").unwrap()
        {
            MergeAnswer::Refused(r) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(r.message(), "Method Not Allowed");
        let r = refused(
            405,
            "Required status check \"x\" is expected @admins fixes #1\n[skip ci]",
        );
        assert!(!r.message().contains("@admins "), "{}", r.message());
        assert!(!r.message().contains("[skip ci]"), "{}", r.message());
        assert!(!r.message().contains('\n'));
        // A hostile check name is shown sanitized in the reason a person reads.
        let r = refused(
            405,
            "Required status check \"@admins\n<!-- x\" is expected.",
        );
        match outcome(&r) {
            LifecycleOutcome::Blocked { reason } => {
                assert!(!reason.contains("<!--"), "{reason}");
                assert!(!reason.contains('\n'), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
