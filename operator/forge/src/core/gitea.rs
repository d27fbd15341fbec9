//! Gitea (and Forgejo, which keeps Gitea's API for these calls) as the forge: what its answers
//! mean, decided from typed values with no network and no clock.
//!
//! The decisions mirror GitHub's ([`super::merge`], [`super::approval`],
//! [`super::escalation`]) on Gitea's real answers, measured against Gitea 1.26:
//!
//! | answer to `POST …/pulls/{n}/merge` (`Do=merge`, `head_commit_id` = the tested head) | [`after_refusal`] |
//! | --- | --- |
//! | 200, empty body | merged: the merge commit is read from the pull request |
//! | 409 "head out of date" | the head is not the tested head: revalidate (retried while the branch still is the tested head and Gitea's view lags) |
//! | 409 "merge push out of date" | the base moved while Gitea merged: retried, then revalidate |
//! | 409 with a conflict body | merge conflict |
//! | 405 "Please try again later" | not mergeable yet (a conflict, or mergeability still being checked): retried, then the merge-conflict path when the pull request says it does not merge |
//! | 405 "Not all required status checks successful" | required contexts missing, pending or failing: wait for them on the tested head ([`checks_step`]), a failing one blocks |
//! | 405 "The head branch is behind the base branch" | revalidate |
//! | 405 approvals, requested changes, review requests, protected files, permission, WIP | blocked: a person acts |
//! | 405 "The PR is already merged" | the pull request is read again and its merge reported |
//! | 5xx | retried, then unavailable (a merge whose answer was lost is found on the re-read) |
//! | 404, 422, other | failed, reported |
//!
//! Every 405 and 409 is decided only after the pull request is read again: a 405 can hide a
//! moved head (a push after the tests makes "not mergeable" or "checks missing" about a commit
//! nobody tested), and a moved head always means revalidate.
//!
//! Other Gitea facts the shell relies on: the pull-request list ignores an unknown `head=`
//! filter (so [`pulls_of_branch`] filters what it lists); issue labels on create are ids
//! (names give 422: [`label_id`]); reviews say `REQUEST_CHANGES` and carry `dismissed`
//! ([`reviews_as_github`] maps them onto the approval check); a commit status's state is its
//! `status` field ([`combined_as_github`]).

use std::time::Duration;

use http::StatusCode;
use serde::Deserialize;

use super::{
    merge::{
        ChecksVerdict, LifecycleOutcome, MergePolicy, OWN_CONTEXT_PREFIX, PullView, checks_verdict,
    },
    render::sanitize_line,
    wire::{Account, CheckRuns, CombinedStatus, CommitStatus, PullRequest, Review, error_message},
};

/// Longest Gitea reason kept (sanitized) in a refusal.
const MAX_REASON: usize = 500;

/// Why Gitea refused the merge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GiteaRefusal {
    /// 409 "head out of date": the pull request's head is not `head_commit_id`.
    HeadOutOfDate {
        /// Gitea's message (sanitized).
        message: String,
    },
    /// 409 "merge push out of date": the base moved while Gitea pushed the merge.
    PushOutOfDate {
        /// Gitea's message (sanitized).
        message: String,
    },
    /// 409 with Gitea's conflict body (merge conflicts, unrelated histories).
    Conflict {
        /// What Gitea said (sanitized).
        message: String,
    },
    /// 405 "Please try again later": Gitea does not hold the pull request as mergeable (a
    /// conflict, or its check has not finished).
    NotMergeableYet {
        /// Gitea's message (sanitized).
        message: String,
    },
    /// 405 "Not all required status checks successful".
    ChecksNotSuccessful {
        /// Gitea's message (sanitized).
        message: String,
    },
    /// 405 "The head branch is behind the base branch" (`block_on_outdated_branch`).
    Behind {
        /// Gitea's message (sanitized).
        message: String,
    },
    /// 405 "The PR is already merged".
    AlreadyMerged,
    /// 405 or 409 for a rule a person must satisfy: approvals, requested changes, review
    /// requests, protected files, the identity may not merge, work in progress, a rejected push.
    Protected {
        /// Gitea's message (sanitized).
        message: String,
    },
    /// 5xx: Gitea could not answer (the merge may still have happened: the re-read decides).
    ServerError {
        /// Status.
        status: u16,
    },
    /// 404, 422 or another answer: a defect or misconfiguration.
    Invalid {
        /// Status.
        status: u16,
        /// Gitea's message (sanitized).
        message: String,
    },
}

impl GiteaRefusal {
    /// A stable label (metrics, logs).
    pub fn category(&self) -> &'static str {
        match self {
            GiteaRefusal::HeadOutOfDate { .. } => "head-moved",
            GiteaRefusal::PushOutOfDate { .. } => "base-modified",
            GiteaRefusal::Conflict { .. } => "conflict",
            GiteaRefusal::NotMergeableYet { .. } => "not-mergeable-yet",
            GiteaRefusal::ChecksNotSuccessful { .. } => "checks-not-successful",
            GiteaRefusal::Behind { .. } => "not-up-to-date",
            GiteaRefusal::AlreadyMerged => "already-merged",
            GiteaRefusal::Protected { .. } => "protected",
            GiteaRefusal::ServerError { .. } => "server-error",
            GiteaRefusal::Invalid { .. } => "invalid",
        }
    }

    /// Gitea's message (sanitized).
    pub fn message(&self) -> &str {
        match self {
            GiteaRefusal::HeadOutOfDate { message }
            | GiteaRefusal::PushOutOfDate { message }
            | GiteaRefusal::Conflict { message }
            | GiteaRefusal::NotMergeableYet { message }
            | GiteaRefusal::ChecksNotSuccessful { message }
            | GiteaRefusal::Behind { message }
            | GiteaRefusal::Protected { message }
            | GiteaRefusal::Invalid { message, .. } => message,
            GiteaRefusal::AlreadyMerged => "the pull request is already merged",
            GiteaRefusal::ServerError { .. } => "Gitea answered a server error",
        }
    }
}

/// What the merge request answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GiteaMergeAnswer {
    /// 200 (Gitea's body is empty: the merge commit is read from the pull request).
    Merged,
    /// Refused.
    Refused(GiteaRefusal),
}

/// Classifies the merge request's answer.
pub fn classify_merge(status: StatusCode, body: &[u8]) -> GiteaMergeAnswer {
    if status.is_success() {
        return GiteaMergeAnswer::Merged;
    }
    if status.is_server_error() {
        return GiteaMergeAnswer::Refused(GiteaRefusal::ServerError {
            status: status.as_u16(),
        });
    }
    let raw = error_message(body);
    let message = sanitize_line(
        raw.as_deref()
            .unwrap_or_else(|| status.canonical_reason().unwrap_or("no reason given")),
        MAX_REASON,
    );
    let lower = message.to_ascii_lowercase();
    let refusal = match status {
        StatusCode::CONFLICT if lower.contains("head out of date") => {
            GiteaRefusal::HeadOutOfDate { message }
        }
        StatusCode::CONFLICT if lower.contains("push out of date") => {
            GiteaRefusal::PushOutOfDate { message }
        }
        StatusCode::CONFLICT if lower.contains("pushrejected") || lower.contains("rejected") => {
            GiteaRefusal::Protected { message }
        }
        // Gitea serializes its conflict error as is: no `message`, fields such as `Style`.
        StatusCode::CONFLICT => GiteaRefusal::Conflict {
            message: if raw.is_some() {
                message
            } else {
                "the pull request does not merge cleanly".to_string()
            },
        },
        StatusCode::METHOD_NOT_ALLOWED if lower.contains("try again later") => {
            GiteaRefusal::NotMergeableYet { message }
        }
        StatusCode::METHOD_NOT_ALLOWED if lower.contains("status check") => {
            GiteaRefusal::ChecksNotSuccessful { message }
        }
        StatusCode::METHOD_NOT_ALLOWED if lower.contains("behind the base") => {
            GiteaRefusal::Behind { message }
        }
        StatusCode::METHOD_NOT_ALLOWED if lower.contains("already merged") => {
            GiteaRefusal::AlreadyMerged
        }
        StatusCode::METHOD_NOT_ALLOWED | StatusCode::FORBIDDEN => {
            GiteaRefusal::Protected { message }
        }
        other => GiteaRefusal::Invalid {
            status: other.as_u16(),
            message,
        },
    };
    GiteaMergeAnswer::Refused(refusal)
}

/// What the landing does next after a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GiteaStep {
    /// Ask again after this wait.
    RetryAfter(Duration),
    /// Wait for the required status contexts of the tested head.
    AwaitChecks,
    /// Gitea could not answer, retries spent: nothing merged, resume later.
    Unavailable,
    /// Nothing left to retry: this is the outcome.
    Settle(LifecycleOutcome),
}

/// The lifecycle outcome of a refusal once no retry or wait is left.
pub fn outcome(refusal: &GiteaRefusal, pull: Option<&PullView>) -> LifecycleOutcome {
    match refusal {
        GiteaRefusal::HeadOutOfDate { .. }
        | GiteaRefusal::PushOutOfDate { .. }
        | GiteaRefusal::Behind { .. } => LifecycleOutcome::Revalidate,
        GiteaRefusal::Conflict { .. } => LifecycleOutcome::MergeConflict,
        // Still not mergeable after the retries: a conflict when Gitea says the pull request
        // does not merge, else revalidate (the merge is tried again from a fresh candidate).
        GiteaRefusal::NotMergeableYet { .. } => match pull {
            Some(p) if p.mergeable == Some(false) => LifecycleOutcome::MergeConflict,
            _ => LifecycleOutcome::Revalidate,
        },
        GiteaRefusal::ChecksNotSuccessful { message } => LifecycleOutcome::Blocked {
            reason: format!(
                "Gitea refused the merge: required status checks did not succeed on the tested head ({message}); fix the check or the candidate, then run `protobot retry`"
            ),
        },
        GiteaRefusal::Protected { message } => LifecycleOutcome::Blocked {
            reason: format!(
                "Gitea refused the merge under branch protection ({message}); satisfy the rule (for example an approving review of the pull request, or merge rights for the Job Site's identity), then run `protobot retry`"
            ),
        },
        GiteaRefusal::AlreadyMerged => LifecycleOutcome::Failed {
            reason:
                "Gitea says the pull request is already merged but does not report its merge commit"
                    .to_string(),
        },
        GiteaRefusal::ServerError { status } => LifecycleOutcome::Failed {
            reason: format!("Gitea kept answering {status} to the merge"),
        },
        GiteaRefusal::Invalid { status, message } => LifecycleOutcome::Failed {
            reason: format!("Gitea rejected the merge request ({status}: {message})"),
        },
    }
}

/// The next step after `refusal`, given the pull request read again after it (`None` when it
/// could not be read) and how many transient retries this landing already made.
///
/// A head that moved (the pull request's and its branch's both differ from the tested head)
/// settles every refusal as revalidate, whatever Gitea said.
pub fn after_refusal(
    policy: &MergePolicy,
    refusal: &GiteaRefusal,
    pull: Option<&PullView>,
    tested_head: &str,
    retries_made: u32,
) -> GiteaStep {
    let retry = || {
        (retries_made < policy.transient_retries)
            .then(|| GiteaStep::RetryAfter(policy.backoff(retries_made)))
    };
    let settle = || GiteaStep::Settle(outcome(refusal, pull));
    let moved = pull.is_some_and(|p| !p.head_is(tested_head));
    if moved && !matches!(refusal, GiteaRefusal::Invalid { .. }) {
        return GiteaStep::Settle(LifecycleOutcome::Revalidate);
    }
    match refusal {
        GiteaRefusal::HeadOutOfDate { .. } => match pull {
            // The branch is the tested head; Gitea's pull request had not caught up.
            Some(_) => retry().unwrap_or_else(settle),
            None => settle(),
        },
        GiteaRefusal::PushOutOfDate { .. } | GiteaRefusal::NotMergeableYet { .. } => {
            retry().unwrap_or_else(settle)
        }
        GiteaRefusal::ServerError { .. } => retry().unwrap_or(GiteaStep::Unavailable),
        GiteaRefusal::ChecksNotSuccessful { .. } => GiteaStep::AwaitChecks,
        GiteaRefusal::Conflict { .. }
        | GiteaRefusal::Behind { .. }
        | GiteaRefusal::AlreadyMerged
        | GiteaRefusal::Protected { .. }
        | GiteaRefusal::Invalid { .. } => settle(),
    }
}

// === required status contexts ===

/// One commit status as Gitea reports it (`status`, not GitHub's `state`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct GiteaStatus {
    /// The context.
    pub context: String,
    /// `pending`, `success`, `error`, `failure`, `warning`.
    pub status: String,
}

/// `GET /repos/{o}/{r}/commits/{ref}/status`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct GiteaCombinedStatus {
    /// The latest status per context.
    #[serde(default)]
    pub statuses: Option<Vec<GiteaStatus>>,
}

/// A branch protection rule (`GET /repos/{o}/{r}/branch_protections`; needs repository admin).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct GiteaProtection {
    /// The branch name or glob it protects (`rule_name`, older: `branch_name`).
    #[serde(default)]
    pub rule_name: String,
    /// Older servers name the branch here.
    #[serde(default)]
    pub branch_name: String,
    /// Whether status checks are required.
    #[serde(default)]
    pub enable_status_check: bool,
    /// The required contexts (globs).
    #[serde(default)]
    pub status_check_contexts: Option<Vec<String>>,
}

/// Gitea's combined status in GitHub's shape (`warning` counts as passed, as Gitea counts it
/// for protection).
pub fn combined_as_github(combined: &GiteaCombinedStatus) -> CombinedStatus {
    CombinedStatus {
        statuses: combined
            .statuses
            .iter()
            .flatten()
            .map(|s| CommitStatus {
                context: s.context.clone(),
                state: if s.status == "warning" {
                    "success".to_string()
                } else {
                    s.status.clone()
                },
            })
            .collect(),
    }
}

/// Whether `name` matches the glob `pattern` (`*` any run of characters; Gitea's required
/// contexts are globs).
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

/// The required contexts for `branch` from the protection rules (`None`: no rule requires
/// status checks there, or none could be read).
pub fn required_contexts(rules: &[GiteaProtection], branch: &str) -> Option<Vec<String>> {
    let rule = rules.iter().find(|r| {
        let name = if r.rule_name.is_empty() {
            &r.branch_name
        } else {
            &r.rule_name
        };
        glob_matches(name, branch)
    })?;
    if !rule.enable_status_check {
        return None;
    }
    let contexts: Vec<String> = rule
        .status_check_contexts
        .iter()
        .flatten()
        .filter(|c| !c.starts_with(OWN_CONTEXT_PREFIX))
        .cloned()
        .collect();
    (!contexts.is_empty()).then_some(contexts)
}

/// Where the required contexts stand on the tested head. `required` (globs) as the protection
/// names them, or `None` when it could not be read (then every reported context but protobot's
/// own counts, and an empty set is pending: Gitea said a required one is missing).
pub fn gitea_checks_verdict(
    required: Option<&[String]>,
    combined: &GiteaCombinedStatus,
) -> ChecksVerdict {
    let as_github = combined_as_github(combined);
    let runs = CheckRuns::default();
    match required {
        Some(patterns) => {
            // Each pattern is satisfied by the contexts it matches (a pattern nothing matches
            // yet is pending under its own name).
            let mut verdict = ChecksVerdict::default();
            for pattern in patterns {
                let names: Vec<String> = as_github
                    .statuses
                    .iter()
                    .filter(|s| glob_matches(pattern, &s.context))
                    .map(|s| s.context.clone())
                    .collect();
                if names.is_empty() {
                    verdict.pending.push(pattern.clone());
                    continue;
                }
                let v = checks_verdict(&names, &as_github, &runs);
                verdict.succeeded.extend(v.succeeded);
                verdict.pending.extend(v.pending);
                verdict.failing.extend(v.failing);
            }
            verdict
        }
        None => {
            let mut v = checks_verdict(&[], &as_github, &runs);
            if v.succeeded.is_empty() && v.pending.is_empty() && v.failing.is_empty() {
                v.pending
                    .push("(the contexts branch protection requires)".to_string());
            }
            v
        }
    }
}

/// What the landing does while Gitea waits for required contexts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GiteaChecksStep {
    /// Every awaited context passed (or none is known to be pending): merge again.
    MergeAgain,
    /// Still pending: read the statuses again after this wait.
    Poll(Duration),
    /// A required context failed: a person acts.
    Failing(LifecycleOutcome),
    /// The deadline passed with contexts still pending: escalate once, naming them.
    Escalate(LifecycleOutcome),
}

fn shown(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("\"{}\"", sanitize_line(n, 100)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The next step of a checks wait that started `waited` ago.
pub fn checks_step(
    policy: &MergePolicy,
    verdict: &ChecksVerdict,
    waited: Duration,
) -> GiteaChecksStep {
    if !verdict.failing.is_empty() {
        return GiteaChecksStep::Failing(LifecycleOutcome::Blocked {
            reason: format!(
                "Gitea refused the merge: required status checks {} failed on the tested head; fix the check or the candidate, then run `protobot retry`",
                shown(&verdict.failing)
            ),
        });
    }
    if verdict.pending.is_empty() {
        return GiteaChecksStep::MergeAgain;
    }
    if waited >= policy.checks_deadline {
        return GiteaChecksStep::Escalate(LifecycleOutcome::Blocked {
            reason: format!(
                "Gitea refused the merge: required status checks {} did not report success on the tested head within {} s; make the check run on this commit (is its CI configured for the pull request?), then run `protobot retry`",
                shown(&verdict.pending),
                policy.checks_deadline.as_secs()
            ),
        });
    }
    let left = policy.checks_deadline.saturating_sub(waited);
    GiteaChecksStep::Poll(policy.checks_poll.min(left))
}

// === pull requests, reviews, labels ===

/// The pull requests of `head` → `base` in `repository` among `listed` (Gitea ignores a
/// `head=` filter it does not know: the list holds every pull request).
pub fn pulls_of_branch<'a>(
    listed: &'a [PullRequest],
    repository: &str,
    head: &str,
    base: &str,
) -> Vec<&'a PullRequest> {
    listed
        .iter()
        .filter(|p| {
            p.head.name == head
                && p.base.name == base
                && p.head
                    .repo
                    .as_ref()
                    .is_some_and(|r| r.full_name.eq_ignore_ascii_case(repository))
        })
        .collect()
}

/// A pull-request review as Gitea reports it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct GiteaReview {
    /// Reviewer (`null` for a deleted account).
    pub user: Option<Account>,
    /// `APPROVED`, `REQUEST_CHANGES`, `COMMENT`, `PENDING`, `REQUEST_REVIEW`.
    pub state: String,
    /// The commit reviewed.
    #[serde(default)]
    pub commit_id: Option<String>,
    /// Dismissed by a maintainer.
    #[serde(default)]
    pub dismissed: bool,
}

/// Gitea's reviews in GitHub's vocabulary, for [`super::approval::check_reviews`]:
/// `REQUEST_CHANGES` is `CHANGES_REQUESTED`, a dismissed review is `DISMISSED`, review
/// requests are not reviews.
pub fn reviews_as_github(reviews: &[GiteaReview]) -> Vec<Review> {
    reviews
        .iter()
        .filter(|r| r.state != "REQUEST_REVIEW")
        .map(|r| Review {
            user: r.user.clone(),
            state: if r.dismissed {
                "DISMISSED".to_string()
            } else if r.state == "REQUEST_CHANGES" {
                "CHANGES_REQUESTED".to_string()
            } else {
                r.state.clone()
            },
            commit_id: r.commit_id.clone(),
        })
        .collect()
}

/// A repository label.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct GiteaLabel {
    /// Id (what issue creation takes).
    pub id: u64,
    /// Name.
    pub name: String,
}

/// The id of the label named `name` (Gitea takes ids on issue create: a name gives 422).
pub fn label_id(labels: &[GiteaLabel], name: &str) -> Option<u64> {
    labels.iter().find(|l| l.name == name).map(|l| l.id)
}

/// `GET /repos/{o}/{r}/branches/{branch}`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct GiteaBranch {
    /// The branch's head commit.
    pub commit: GiteaBranchCommit,
}

/// A branch's head commit.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct GiteaBranchCommit {
    /// Its id.
    pub id: String,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::core::wire::{Branch, RepoRef};

    fn repo_ref(full_name: &str) -> RepoRef {
        RepoRef {
            full_name: full_name.to_string(),
        }
    }

    const TESTED: &str = "1111111111111111111111111111111111111111";
    const OTHER: &str = "2222222222222222222222222222222222222222";

    fn refused(status: u16, body: &str) -> GiteaRefusal {
        match classify_merge(StatusCode::from_u16(status).unwrap(), body.as_bytes()) {
            GiteaMergeAnswer::Refused(r) => r,
            GiteaMergeAnswer::Merged => panic!("{status} {body} read as merged"),
        }
    }

    fn view(head: &str, mergeable: bool) -> PullView {
        PullView {
            head_sha: head.into(),
            branch_head: None,
            mergeable: Some(mergeable),
        }
    }

    fn policy() -> MergePolicy {
        MergePolicy {
            transient_retries: 2,
            first_wait: Duration::from_secs(1),
            max_wait: Duration::from_secs(4),
            checks_deadline: Duration::from_secs(60),
            checks_poll: Duration::from_secs(10),
        }
    }

    #[test]
    fn each_gitea_merge_answer_is_classified_as_gitea_gives_it() {
        assert_eq!(
            classify_merge(StatusCode::OK, b""),
            GiteaMergeAnswer::Merged
        );
        let msg = |m: &str| format!(r#"{{"message":"{m}","url":"https://x/api/swagger"}}"#);
        assert!(matches!(
            refused(409, &msg("head out of date")),
            GiteaRefusal::HeadOutOfDate { .. }
        ));
        assert!(matches!(
            refused(409, &msg("merge push out of date")),
            GiteaRefusal::PushOutOfDate { .. }
        ));
        assert!(matches!(
            refused(
                409,
                r#"{"Style":"merge","StdOut":"","StdErr":"CONFLICT","Err":{}}"#
            ),
            GiteaRefusal::Conflict { .. }
        ));
        assert!(matches!(
            refused(405, &msg("Please try again later")),
            GiteaRefusal::NotMergeableYet { .. }
        ));
        assert!(matches!(
            refused(405, &msg("Not all required status checks successful")),
            GiteaRefusal::ChecksNotSuccessful { .. }
        ));
        assert!(matches!(
            refused(405, &msg("The head branch is behind the base branch")),
            GiteaRefusal::Behind { .. }
        ));
        assert_eq!(
            refused(405, &msg("The PR is already merged")),
            GiteaRefusal::AlreadyMerged
        );
        for m in [
            "Does not have enough approvals",
            "There are requested changes",
            "User not allowed to merge PR",
        ] {
            assert!(
                matches!(refused(405, &msg(m)), GiteaRefusal::Protected { .. }),
                "{m}"
            );
        }
        assert_eq!(refused(500, ""), GiteaRefusal::ServerError { status: 500 });
        assert!(matches!(
            refused(422, &msg("[Do]: Required")),
            GiteaRefusal::Invalid { status: 422, .. }
        ));
    }

    #[test]
    fn a_405_over_a_moved_head_revalidates_whatever_it_says() {
        for refusal in [
            refused(405, r#"{"message":"Please try again later"}"#),
            refused(
                405,
                r#"{"message":"Not all required status checks successful"}"#,
            ),
            refused(405, r#"{"message":"Does not have enough approvals"}"#),
            refused(409, r#"{"message":"head out of date"}"#),
        ] {
            assert_eq!(
                after_refusal(&policy(), &refusal, Some(&view(OTHER, true)), TESTED, 0),
                GiteaStep::Settle(LifecycleOutcome::Revalidate),
                "{refusal:?}"
            );
        }
    }

    #[test]
    fn head_out_of_date_while_the_branch_is_the_tested_head_is_retried_then_revalidates() {
        let r = refused(409, r#"{"message":"head out of date"}"#);
        let lagging = PullView {
            head_sha: OTHER.into(),
            branch_head: Some(TESTED.into()),
            mergeable: Some(true),
        };
        assert_eq!(
            after_refusal(&policy(), &r, Some(&lagging), TESTED, 0),
            GiteaStep::RetryAfter(Duration::from_secs(1))
        );
        assert_eq!(
            after_refusal(&policy(), &r, Some(&lagging), TESTED, 2),
            GiteaStep::Settle(LifecycleOutcome::Revalidate)
        );
        // Unreadable pull request: believe the 409.
        assert_eq!(
            after_refusal(&policy(), &r, None, TESTED, 0),
            GiteaStep::Settle(LifecycleOutcome::Revalidate)
        );
    }

    #[test]
    fn please_try_again_later_is_transient_then_a_conflict_when_gitea_says_it_does_not_merge() {
        let r = refused(405, r#"{"message":"Please try again later"}"#);
        assert_eq!(
            after_refusal(&policy(), &r, Some(&view(TESTED, false)), TESTED, 0),
            GiteaStep::RetryAfter(Duration::from_secs(1))
        );
        assert_eq!(
            after_refusal(&policy(), &r, Some(&view(TESTED, false)), TESTED, 1),
            GiteaStep::RetryAfter(Duration::from_secs(2))
        );
        assert_eq!(
            after_refusal(&policy(), &r, Some(&view(TESTED, false)), TESTED, 2),
            GiteaStep::Settle(LifecycleOutcome::MergeConflict)
        );
        assert_eq!(
            after_refusal(&policy(), &r, Some(&view(TESTED, true)), TESTED, 2),
            GiteaStep::Settle(LifecycleOutcome::Revalidate)
        );
    }

    #[test]
    fn checks_wait_protection_blocks_and_server_errors_end_unavailable() {
        let same = view(TESTED, true);
        assert_eq!(
            after_refusal(
                &policy(),
                &refused(
                    405,
                    r#"{"message":"Not all required status checks successful"}"#
                ),
                Some(&same),
                TESTED,
                9
            ),
            GiteaStep::AwaitChecks
        );
        let GiteaStep::Settle(LifecycleOutcome::Blocked { reason }) = after_refusal(
            &policy(),
            &refused(405, r#"{"message":"Does not have enough approvals"}"#),
            Some(&same),
            TESTED,
            0,
        ) else {
            panic!("approvals did not block")
        };
        assert!(reason.contains("enough approvals") && reason.contains("protobot retry"));
        let e = refused(500, "");
        assert!(matches!(
            after_refusal(&policy(), &e, Some(&same), TESTED, 0),
            GiteaStep::RetryAfter(_)
        ));
        assert_eq!(
            after_refusal(&policy(), &e, Some(&same), TESTED, 2),
            GiteaStep::Unavailable
        );
        assert_eq!(
            after_refusal(
                &policy(),
                &refused(409, r#"{"Style":"merge"}"#),
                Some(&same),
                TESTED,
                0
            ),
            GiteaStep::Settle(LifecycleOutcome::MergeConflict)
        );
        assert_eq!(
            after_refusal(
                &policy(),
                &refused(
                    405,
                    r#"{"message":"The head branch is behind the base branch"}"#
                ),
                Some(&same),
                TESTED,
                0
            ),
            GiteaStep::Settle(LifecycleOutcome::Revalidate)
        );
    }

    fn combined(pairs: &[(&str, &str)]) -> GiteaCombinedStatus {
        GiteaCombinedStatus {
            statuses: Some(
                pairs
                    .iter()
                    .map(|(c, s)| GiteaStatus {
                        context: (*c).into(),
                        status: (*s).into(),
                    })
                    .collect(),
            ),
        }
    }

    #[test]
    fn required_contexts_are_globs_missing_ones_pending_failing_ones_block() {
        let rules = vec![GiteaProtection {
            rule_name: "main".into(),
            branch_name: String::new(),
            enable_status_check: true,
            status_check_contexts: Some(vec!["ci/*".into(), "protobot/merge".into()]),
        }];
        let required = required_contexts(&rules, "main").unwrap();
        assert_eq!(required, vec!["ci/*".to_string()]);
        assert_eq!(required_contexts(&rules, "develop"), None);
        let missing =
            gitea_checks_verdict(Some(&required), &combined(&[("protobot/merge", "pending")]));
        assert_eq!(missing.pending, vec!["ci/*".to_string()]);
        let p = policy();
        assert!(matches!(
            checks_step(&p, &missing, Duration::from_secs(5)),
            GiteaChecksStep::Poll(d) if d == Duration::from_secs(10)
        ));
        let GiteaChecksStep::Escalate(LifecycleOutcome::Blocked { reason }) =
            checks_step(&p, &missing, Duration::from_secs(60))
        else {
            panic!("no escalation at the deadline")
        };
        assert!(
            reason.contains("\"ci/*\"") && reason.contains("60 s"),
            "{reason}"
        );
        let passed = gitea_checks_verdict(Some(&required), &combined(&[("ci/test", "success")]));
        assert_eq!(
            checks_step(&p, &passed, Duration::ZERO),
            GiteaChecksStep::MergeAgain
        );
        let failed = gitea_checks_verdict(Some(&required), &combined(&[("ci/test", "failure")]));
        assert!(matches!(
            checks_step(&p, &failed, Duration::ZERO),
            GiteaChecksStep::Failing(LifecycleOutcome::Blocked { reason }) if reason.contains("\"ci/test\"")
        ));
        // Protection unreadable: nothing reported is pending, a warning passes.
        let unknown = gitea_checks_verdict(None, &GiteaCombinedStatus::default());
        assert_eq!(unknown.pending.len(), 1);
        let warned = gitea_checks_verdict(None, &combined(&[("lint", "warning")]));
        assert_eq!(warned.succeeded, vec!["lint".to_string()]);
    }

    #[test]
    fn globs_match_like_gitea_required_contexts() {
        assert!(glob_matches("ci/test", "ci/test"));
        assert!(!glob_matches("ci/test", "ci/test2"));
        assert!(glob_matches("ci/*", "ci/test"));
        assert!(glob_matches("*", "anything"));
        assert!(glob_matches("a*b*c", "a-x-b-y-c"));
        assert!(!glob_matches("a*b*c", "a-x-c"));
        assert!(!glob_matches("ab*ba", "aba"));
    }

    fn pull(number: u64, head: &str, base: &str, repo: &str) -> PullRequest {
        PullRequest {
            number,
            state: "open".into(),
            merged_at: None,
            merge_commit_sha: None,
            head: Branch {
                name: head.into(),
                sha: TESTED.into(),
                repo: Some(repo_ref(repo)),
            },
            base: Branch {
                name: base.into(),
                sha: OTHER.into(),
                repo: Some(repo_ref("acme/widgets")),
            },
            user: None,
            html_url: String::new(),
            mergeable: Some(true),
        }
    }

    #[test]
    fn the_pull_list_is_filtered_here_since_gitea_ignores_the_head_filter() {
        let listed = vec![
            pull(1, "wi/WI-1-a", "main", "acme/widgets"),
            pull(2, "wi/WI-2-b", "main", "acme/widgets"),
            pull(3, "wi/WI-1-a", "release", "acme/widgets"),
            pull(4, "wi/WI-1-a", "main", "mallory/widgets"),
        ];
        let found = pulls_of_branch(&listed, "acme/widgets", "wi/WI-1-a", "main");
        assert_eq!(found.iter().map(|p| p.number).collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn gitea_reviews_read_as_the_approval_check_expects() {
        let r = |login: &str, state: &str, dismissed: bool| GiteaReview {
            user: Some(Account {
                login: login.into(),
            }),
            state: state.into(),
            commit_id: Some(TESTED.into()),
            dismissed,
        };
        let mapped = reviews_as_github(&[
            r("ann", "APPROVED", false),
            r("bob", "REQUEST_CHANGES", false),
            r("cid", "APPROVED", true),
            r("dee", "REQUEST_REVIEW", false),
        ]);
        let states: Vec<(&str, &str)> = mapped
            .iter()
            .map(|m| (m.user.as_ref().unwrap().login.as_str(), m.state.as_str()))
            .collect();
        assert_eq!(
            states,
            vec![
                ("ann", "APPROVED"),
                ("bob", "CHANGES_REQUESTED"),
                ("cid", "DISMISSED")
            ]
        );
    }

    #[test]
    fn labels_are_sent_as_ids() {
        let labels = vec![
            GiteaLabel {
                id: 7,
                name: "bug".into(),
            },
            GiteaLabel {
                id: 9,
                name: "protobot-escalation".into(),
            },
        ];
        assert_eq!(label_id(&labels, "protobot-escalation"), Some(9));
        assert_eq!(label_id(&labels, "absent"), None);
    }
}
