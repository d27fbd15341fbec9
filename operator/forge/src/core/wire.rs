//! The parts of GitHub's REST responses the Job Site reads, as typed values.
//!
//! Responses are untrusted input: only the fields listed here are read, unknown fields are
//! ignored, and a body that does not fit is a [`DecodeError`] naming the operation, never a
//! panic or a default.

use serde::Deserialize;

/// A response body did not have the documented shape.
#[derive(Debug, thiserror::Error)]
#[error(
    "failed to read GitHub's answer to {operation}: {source}; the API base URL may not point at a GitHub REST API (check spec.forge.github.apiBaseUrl)"
)]
pub struct DecodeError {
    /// The operation.
    pub operation: &'static str,
    /// What did not fit.
    #[source]
    pub source: serde_json::Error,
}

/// Decodes `body` as `T`.
pub fn decode<T: for<'de> Deserialize<'de>>(
    operation: &'static str,
    body: &[u8],
) -> Result<T, DecodeError> {
    serde_json::from_slice(body).map_err(|source| DecodeError { operation, source })
}

/// GitHub's error body (`{"message": …, "documentation_url": …}`); the message when the body
/// has one.
pub fn error_message(body: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct ErrorBody {
        message: Option<String>,
    }
    serde_json::from_slice::<ErrorBody>(body)
        .ok()
        .and_then(|b| b.message)
}

/// A user or app account.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Account {
    /// Login.
    pub login: String,
}

/// A repository as a pull request's head or base names it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct RepoRef {
    /// `owner/name`.
    pub full_name: String,
}

/// A pull request's head or base.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Branch {
    /// Branch name (`ref`).
    #[serde(rename = "ref")]
    pub name: String,
    /// Commit.
    pub sha: String,
    /// Repository (absent when a fork was deleted).
    pub repo: Option<RepoRef>,
}

/// A pull request.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct PullRequest {
    /// Number.
    pub number: u64,
    /// `open` or `closed`.
    pub state: String,
    /// When it was merged (`null` when it was not).
    pub merged_at: Option<String>,
    /// The merge commit GitHub made (or the test merge while open).
    pub merge_commit_sha: Option<String>,
    /// Head.
    pub head: Branch,
    /// Base.
    pub base: Branch,
    /// Author.
    pub user: Option<Account>,
    /// Web page.
    #[serde(default)]
    pub html_url: String,
    /// Whether it merges cleanly; `null` while GitHub computes it (after a push to either
    /// branch), and in listings.
    #[serde(default)]
    pub mergeable: Option<bool>,
}

/// A pull-request review.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Review {
    /// Reviewer (`null` for a deleted account).
    pub user: Option<Account>,
    /// `APPROVED`, `CHANGES_REQUESTED`, `COMMENTED`, `DISMISSED`, `PENDING`.
    pub state: String,
    /// The commit reviewed.
    pub commit_id: Option<String>,
}

/// The merge API's success body.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct MergeResult {
    /// The merge commit.
    pub sha: String,
    /// Always true on 200.
    pub merged: bool,
}

/// An issue (escalations).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Issue {
    /// Number.
    pub number: u64,
    /// `open` or `closed`.
    pub state: String,
    /// Body (`null` when empty).
    pub body: Option<String>,
    /// Present when the "issue" is a pull request (the issues API lists both).
    pub pull_request: Option<serde_json::Value>,
}

/// One status of the combined status.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct CommitStatus {
    /// The context (`ci/test`).
    pub context: String,
    /// `pending`, `success`, `failure` or `error`.
    pub state: String,
}

/// `GET /repos/{o}/{r}/commits/{ref}/status`: the latest status of each context.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct CombinedStatus {
    /// One per context.
    #[serde(default)]
    pub statuses: Vec<CommitStatus>,
}

/// One check run.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct CheckRun {
    /// The check's name (what branch protection requires).
    pub name: String,
    /// `queued`, `in_progress`, `completed` (and `waiting`, `requested`, `pending`).
    pub status: String,
    /// Set once completed: `success`, `failure`, `neutral`, `cancelled`, `skipped`,
    /// `timed_out`, `action_required`, `stale`.
    pub conclusion: Option<String>,
}

/// `GET /repos/{o}/{r}/commits/{ref}/check-runs`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct CheckRuns {
    /// The runs (one page of 100).
    #[serde(default)]
    pub check_runs: Vec<CheckRun>,
}

/// `GET /repos/{o}/{r}/git/ref/heads/{branch}`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct GitRef {
    /// What it points at.
    pub object: GitObject,
}

/// A ref's target.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct GitObject {
    /// The commit.
    pub sha: String,
}

/// `GET /repos/{o}/{r}/compare/{base}...{head}`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Comparison {
    /// `identical`, `ahead`, `behind` or `diverged`.
    pub status: String,
}

/// `POST /app/installations/{id}/access_tokens`.
#[derive(Deserialize)]
pub struct InstallationToken {
    /// The token (kept only in memory, wrapped at once).
    pub token: String,
    /// Expiry, RFC 3339.
    pub expires_at: String,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn malformed_bodies_are_errors_that_name_the_operation() {
        let e = decode::<PullRequest>("list pull requests", b"<html>").unwrap_err();
        assert!(e.to_string().contains("list pull requests"), "{e}");
        let e = decode::<MergeResult>("merge", br#"{"sha": 5}"#).unwrap_err();
        assert!(e.to_string().contains("merge"), "{e}");
        assert_eq!(error_message(b"not json"), None);
        assert_eq!(
            error_message(br#"{"message":"Not Found","documentation_url":"x"}"#).as_deref(),
            Some("Not Found")
        );
    }
}
