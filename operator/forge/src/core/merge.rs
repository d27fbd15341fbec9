//! What the merge API answered (`PUT /repos/{o}/{r}/pulls/{n}/merge` with `merge_method=merge`
//! and `sha` = the tested head), and what a refusal means for the lifecycle.
//!
//! GitHub documents 200 (merged), 405 (the merge cannot be performed: branch protection,
//! failing or missing required checks, a merge conflict, a modified head), 409 (`sha` given and
//! the head does not match), 422 (validation failed), 403 and 404. Rate limits and server
//! errors are the transport's ([`super::ratelimit`], retried or reported transient); this module
//! sees only the final answer.
//!
//! | answer | lifecycle |
//! | --- | --- |
//! | head moved (409, 405 "Head branch was modified", 405 "not up to date with the base branch") | [`LifecycleOutcome::Revalidate`]: back to building, merge the new default head in, rerun every gate |
//! | conflict (405 "not mergeable") | [`LifecycleOutcome::MergeConflict`]: the merge-conflict path |
//! | failing or expected required check (405) | [`LifecycleOutcome::Blocked`] with that check's reason |
//! | protection (405 reviews required, other 405, 403) | [`LifecycleOutcome::Blocked`] with GitHub's reason |
//! | 422, 404, a 200 that says "not merged" | [`LifecycleOutcome::Failed`]: a defect or misconfiguration, reported, never retried in a loop |

use http::StatusCode;

use super::{
    render::sanitize_line,
    wire::{DecodeError, MergeResult, decode, error_message},
};

/// Longest GitHub reason kept (sanitized) in a refusal.
const MAX_REASON: usize = 500;

/// Why GitHub refused the merge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MergeRefusal {
    /// The pull request's head is not the tested head any more.
    HeadMoved {
        /// GitHub's message (sanitized).
        message: String,
    },
    /// The head does not merge cleanly into the base.
    Conflict {
        /// GitHub's message (sanitized).
        message: String,
    },
    /// A required status check is failing or has not reported.
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
            MergeRefusal::Conflict { .. } => "conflict",
            MergeRefusal::RequiredCheck { .. } => "required-check",
            MergeRefusal::Protected { .. } => "protected",
            MergeRefusal::Invalid { .. } => "invalid",
        }
    }

    /// GitHub's (sanitized) reason.
    pub fn message(&self) -> &str {
        match self {
            MergeRefusal::HeadMoved { message }
            | MergeRefusal::Conflict { message }
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

/// Classifies the merge API's response. A 200 whose body does not decode is a
/// [`DecodeError`] (the merge may have happened: the caller verifies the default branch).
pub fn classify_merge(status: StatusCode, body: &[u8]) -> Result<MergeAnswer, DecodeError> {
    let message = || {
        sanitize_line(
            &error_message(body).unwrap_or_else(|| {
                status
                    .canonical_reason()
                    .unwrap_or("no reason given")
                    .to_string()
            }),
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
        StatusCode::METHOD_NOT_ALLOWED
            if lower.contains("head branch was modified") || lower.contains("not up to date") =>
        {
            MergeRefusal::HeadMoved { message }
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

/// What a refused merge means for the work item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LifecycleOutcome {
    /// The default branch or the head moved: back to building, revalidate, land again.
    Revalidate,
    /// The merge conflicts: the merge-conflict path (back to building).
    MergeConflict,
    /// A person must act (a failing check, protection): the item stops with this reason and
    /// an escalation issue says what to decide.
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

/// The lifecycle outcome of a refusal.
pub fn outcome(refusal: &MergeRefusal) -> LifecycleOutcome {
    match refusal {
        MergeRefusal::HeadMoved { .. } => LifecycleOutcome::Revalidate,
        MergeRefusal::Conflict { .. } => LifecycleOutcome::MergeConflict,
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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

    #[test]
    fn documented_refusals_map_to_their_lifecycle_outcomes() {
        let cases = [
            (
                409,
                "Head branch was modified. Review and try the merge again.",
                "head-moved",
            ),
            (
                405,
                "Head branch was modified. Review and try the merge again.",
                "head-moved",
            ),
            (
                405,
                "Head branch is not up to date with the base branch",
                "head-moved",
            ),
            (
                405,
                "Required status check \"ci/test\" is expected.",
                "required-check",
            ),
            (
                405,
                "2 of 3 required status checks have not succeeded: 1 failing.",
                "required-check",
            ),
            (405, "Pull Request is not mergeable", "conflict"),
            (
                405,
                "At least 1 approving review is required by reviewers with write access.",
                "protected",
            ),
            (403, "Resource not accessible by integration", "protected"),
            (422, "Validation Failed", "invalid"),
            (404, "Not Found", "invalid"),
        ];
        for (status, message, category) in cases {
            let r = refused(status, message);
            assert_eq!(r.category(), category, "{status} {message}");
            let o = outcome(&r);
            match category {
                "head-moved" => assert_eq!(o, LifecycleOutcome::Revalidate),
                "conflict" => assert_eq!(o, LifecycleOutcome::MergeConflict),
                "required-check" | "protected" => match o {
                    LifecycleOutcome::Blocked { reason } => {
                        assert!(reason.contains(message.trim_end_matches('.')), "{reason}")
                    }
                    other => panic!("{other:?}"),
                },
                _ => assert!(matches!(o, LifecycleOutcome::Failed { .. })),
            }
        }
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
    }
}
