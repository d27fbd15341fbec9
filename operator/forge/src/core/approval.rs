//! Is this pull request an approved merge of change set X under review mode M?
//!
//! The Source Control Manager's `approved_merge` asks the host for "the change set's merged
//! pull request (base = default, head = `<prefix><nnnnn>-<slug>` in the canonical repo, never a
//! fork)": none → `NOT_APPROVED`, a different merge commit → `MERGE_COMMIT_MISMATCH`. This
//! module makes that decision from the pull requests GitHub lists for the merge commit
//! (`GET /repos/{o}/{r}/commits/{sha}/pulls`) and the chosen pull request's reviews. Under
//! `multi-player` review at least one reviewer other than the author must have approved the
//! merged head and no reviewer's latest review may request changes; under `single-player` the
//! merge itself is the approval (the contributor merges their own pull request).
//!
//! [`ApprovedPullRequest`] is a proof type: only [`approved_merge`] makes one.

use std::collections::BTreeMap;

use super::{
    coordinates::RepoCoordinates,
    wire::{PullRequest, Review},
};

/// The project's declared review mode (`.protobot/project.yaml` `repository.review_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReviewMode {
    /// The contributor merges their own pull request; no reviewer is required.
    SinglePlayer,
    /// A reviewer other than the author approves the merged head.
    MultiPlayer,
}

/// What the registration claims: change set, merge commit and where it merged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalClaim {
    /// `CS-NNNNN`.
    pub change_set_id: String,
    /// The merge commit on the default branch.
    pub merge_commit: String,
    /// The default branch.
    pub default_branch: String,
    /// The change-set branch prefix (the project's `branch_prefix`, e.g. `cs/`).
    pub branch_prefix: String,
    /// The canonical repository.
    pub repository: RepoCoordinates,
    /// The review mode.
    pub review_mode: ReviewMode,
}

/// Why a change set is not an approved merge (codes of the SCM contract).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalRefusal {
    /// The change-set id is not `CS-NNNNN`.
    #[error("unable to check approval: `{0}` is not a change-set id (CS-NNNNN)")]
    InvalidRequest(String),
    /// No merged pull request of the change set's branch into the default branch, from the
    /// canonical repository, made this merge commit.
    #[error(
        "change set {change_set_id} is not approved: no pull request from {expected_head}… in {repository} was merged into {default_branch} as {merge_commit}"
    )]
    NotApproved {
        /// Change set.
        change_set_id: String,
        /// The expected head-branch prefix.
        expected_head: String,
        /// Repository.
        repository: String,
        /// Default branch.
        default_branch: String,
        /// Claimed merge commit.
        merge_commit: String,
    },
    /// The change set's pull request merged as another commit.
    #[error(
        "change set {change_set_id} was merged by pull request #{number} as {actual}, not {claimed}; reconcile the registration with the default branch"
    )]
    MergeCommitMismatch {
        /// Change set.
        change_set_id: String,
        /// Pull request.
        number: u64,
        /// Its merge commit.
        actual: String,
        /// The claimed one.
        claimed: String,
    },
    /// More than one pull request qualifies.
    #[error(
        "change set {change_set_id} has several merged pull requests ({numbers:?}) for one merge commit; a person must say which one approved it"
    )]
    Ambiguous {
        /// Change set.
        change_set_id: String,
        /// The pull requests.
        numbers: Vec<u64>,
    },
    /// The pull request merged without the reviews the review mode requires.
    #[error(
        "change set {change_set_id}: pull request #{number} merged without the approval multi-player review requires ({why}); a later approval does not change the merge: revert and merge again with an approving review, or declare review_mode single-player"
    )]
    ReviewMissing {
        /// Change set.
        change_set_id: String,
        /// Pull request.
        number: u64,
        /// What was missing.
        why: String,
    },
}

impl ApprovalRefusal {
    /// The SCM failure code.
    pub fn code(&self) -> &'static str {
        match self {
            ApprovalRefusal::InvalidRequest(_) => "INVALID_REQUEST",
            ApprovalRefusal::NotApproved { .. } | ApprovalRefusal::ReviewMissing { .. } => {
                "NOT_APPROVED"
            }
            ApprovalRefusal::MergeCommitMismatch { .. } => "MERGE_COMMIT_MISMATCH",
            ApprovalRefusal::Ambiguous { .. } => "AMBIGUOUS_PULL_REQUEST",
        }
    }
}

/// Proof that a change set's merge commit came from an approved pull request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovedPullRequest {
    number: u64,
    merge_commit: String,
    approvers: Vec<String>,
    html_url: String,
}

impl ApprovedPullRequest {
    /// Pull request number.
    pub fn number(&self) -> u64 {
        self.number
    }
    /// The verified merge commit.
    pub fn merge_commit(&self) -> &str {
        &self.merge_commit
    }
    /// Who approved (empty under single-player review).
    pub fn approvers(&self) -> &[String] {
        &self.approvers
    }
    /// The pull request's page.
    pub fn html_url(&self) -> &str {
        &self.html_url
    }
}

/// The `<nnnnn>` of `CS-<nnnnn>`.
fn change_set_number(id: &str) -> Option<&str> {
    let n = id.strip_prefix("CS-")?;
    (n.len() == 5 && n.chars().all(|c| c.is_ascii_digit())).then_some(n)
}

/// Step 1: the one merged pull request of the change set that made `claim.merge_commit`.
pub fn select_merged_pull<'a>(
    claim: &ApprovalClaim,
    pulls: &'a [PullRequest],
) -> Result<&'a PullRequest, ApprovalRefusal> {
    let Some(number) = change_set_number(&claim.change_set_id) else {
        return Err(ApprovalRefusal::InvalidRequest(claim.change_set_id.clone()));
    };
    let head_prefix = format!("{}{number}-", claim.branch_prefix);
    let canonical = claim.repository.to_string();
    let of_change_set: Vec<&PullRequest> = pulls
        .iter()
        .filter(|p| {
            p.merged_at.is_some()
                && p.base.name == claim.default_branch
                && p.head.name.starts_with(&head_prefix)
                && p.head.name.len() > head_prefix.len()
                && p.head
                    .repo
                    .as_ref()
                    .is_some_and(|r| r.full_name.eq_ignore_ascii_case(&canonical))
                && p.base
                    .repo
                    .as_ref()
                    .is_some_and(|r| r.full_name.eq_ignore_ascii_case(&canonical))
        })
        .collect();
    let matching: Vec<&PullRequest> = of_change_set
        .iter()
        .copied()
        .filter(|p| p.merge_commit_sha.as_deref() == Some(claim.merge_commit.as_str()))
        .collect();
    match matching.as_slice() {
        [one] => Ok(one),
        [] => match of_change_set.first() {
            Some(other) => Err(ApprovalRefusal::MergeCommitMismatch {
                change_set_id: claim.change_set_id.clone(),
                number: other.number,
                actual: other.merge_commit_sha.clone().unwrap_or_default(),
                claimed: claim.merge_commit.clone(),
            }),
            None => Err(ApprovalRefusal::NotApproved {
                change_set_id: claim.change_set_id.clone(),
                expected_head: head_prefix,
                repository: canonical,
                default_branch: claim.default_branch.clone(),
                merge_commit: claim.merge_commit.clone(),
            }),
        },
        many => Err(ApprovalRefusal::Ambiguous {
            change_set_id: claim.change_set_id.clone(),
            numbers: many.iter().map(|p| p.number).collect(),
        }),
    }
}

/// Step 2: the reviews the review mode requires. Each reviewer's latest deciding review
/// counts (`APPROVED`, `CHANGES_REQUESTED`, `DISMISSED`; comments and pending reviews do not
/// decide); the author's own reviews never count; an approval counts only for the merged head.
pub fn check_reviews(
    claim: &ApprovalClaim,
    pull: &PullRequest,
    reviews: &[Review],
) -> Result<ApprovedPullRequest, ApprovalRefusal> {
    let proof = |approvers: Vec<String>| ApprovedPullRequest {
        number: pull.number,
        merge_commit: claim.merge_commit.clone(),
        approvers,
        html_url: pull.html_url.clone(),
    };
    if claim.review_mode == ReviewMode::SinglePlayer {
        return Ok(proof(Vec::new()));
    }
    let author = pull.user.as_ref().map(|u| u.login.as_str());
    let mut latest: BTreeMap<&str, &Review> = BTreeMap::new();
    for review in reviews {
        let Some(login) = review.user.as_ref().map(|u| u.login.as_str()) else {
            continue;
        };
        if Some(login) == author {
            continue;
        }
        if matches!(
            review.state.as_str(),
            "APPROVED" | "CHANGES_REQUESTED" | "DISMISSED"
        ) {
            latest.insert(login, review);
        }
    }
    let missing = |why: String| ApprovalRefusal::ReviewMissing {
        change_set_id: claim.change_set_id.clone(),
        number: pull.number,
        why,
    };
    let blocking: Vec<&str> = latest
        .iter()
        .filter(|(_, r)| r.state == "CHANGES_REQUESTED")
        .map(|(login, _)| *login)
        .collect();
    if !blocking.is_empty() {
        return Err(missing(format!(
            "changes requested by {}",
            blocking.join(", ")
        )));
    }
    let approvers: Vec<String> = latest
        .iter()
        .filter(|(_, r)| {
            r.state == "APPROVED" && r.commit_id.as_deref() == Some(pull.head.sha.as_str())
        })
        .map(|(login, _)| (*login).to_string())
        .collect();
    if approvers.is_empty() {
        let stale = latest.values().any(|r| r.state == "APPROVED");
        return Err(missing(if stale {
            format!(
                "the approvals are of an earlier head, not the merged head {}",
                pull.head.sha
            )
        } else {
            "no reviewer other than the author approved".to_string()
        }));
    }
    Ok(proof(approvers))
}

/// Both steps: the approved pull request behind `claim`, or why there is none.
pub fn approved_merge(
    claim: &ApprovalClaim,
    pulls: &[PullRequest],
    reviews_of: impl FnOnce(&PullRequest) -> Vec<Review>,
) -> Result<ApprovedPullRequest, ApprovalRefusal> {
    let pull = select_merged_pull(claim, pulls)?;
    let reviews = reviews_of(pull);
    check_reviews(claim, pull, &reviews)
}

/// How often a registration re-asks GitHub for the pull request of a fresh merge commit.
///
/// GitHub associates a merge commit with its pull request in the background: right after a
/// merge, `GET …/commits/{sha}/pulls` can list nothing. A `NOT_APPROVED` read from an empty
/// association is asked again (spaced) before it is believed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReaskPolicy {
    /// Extra lookups after the first.
    pub reasks: u32,
    /// The wait before the first; doubled for each further one.
    pub first_wait: std::time::Duration,
}

impl Default for ReaskPolicy {
    fn default() -> Self {
        ReaskPolicy {
            reasks: 3,
            first_wait: std::time::Duration::from_secs(2),
        }
    }
}

/// Whether to ask again after lookup `asked` (1-based) found `pulls` and decided `decision`,
/// and after which wait: only a `NOT_APPROVED` from a merge commit no pull request is
/// associated with yet (no merged pull request lists it as its merge commit), within the
/// policy's budget. Any other answer is final.
pub fn reask_after(
    policy: &ReaskPolicy,
    claim: &ApprovalClaim,
    pulls: &[PullRequest],
    decision: &Result<&PullRequest, ApprovalRefusal>,
    asked: u32,
) -> Option<std::time::Duration> {
    let unassociated = !pulls.iter().any(|p| {
        p.merged_at.is_some() && p.merge_commit_sha.as_deref() == Some(&claim.merge_commit)
    });
    match decision {
        Err(ApprovalRefusal::NotApproved { .. }) if unassociated && asked <= policy.reasks => {
            let factor = 1u32
                .checked_shl(asked.saturating_sub(1).min(8))
                .unwrap_or(256);
            Some(policy.first_wait.saturating_mul(factor))
        }
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::core::wire::{Account, Branch, RepoRef};

    const MERGE: &str = "1111111111111111111111111111111111111111";
    const HEAD: &str = "2222222222222222222222222222222222222222";

    fn claim(mode: ReviewMode) -> ApprovalClaim {
        ApprovalClaim {
            change_set_id: "CS-00042".into(),
            merge_commit: MERGE.into(),
            default_branch: "main".into(),
            branch_prefix: "cs/".into(),
            repository: RepoCoordinates::new("acme", "widgets").unwrap(),
            review_mode: mode,
        }
    }

    fn pull(number: u64, head: &str, repo: &str, merge: &str) -> PullRequest {
        PullRequest {
            number,
            state: "closed".into(),
            merged_at: Some("2026-12-01T00:00:00Z".into()),
            merge_commit_sha: Some(merge.into()),
            head: Branch {
                name: head.into(),
                sha: HEAD.into(),
                repo: Some(RepoRef {
                    full_name: repo.into(),
                }),
            },
            base: Branch {
                name: "main".into(),
                sha: "3".repeat(40),
                repo: Some(RepoRef {
                    full_name: "acme/widgets".into(),
                }),
            },
            user: Some(Account {
                login: "author".into(),
            }),
            html_url: format!("https://github.com/acme/widgets/pull/{number}"),
            mergeable: None,
        }
    }

    fn review(login: &str, state: &str, commit: &str) -> Review {
        Review {
            user: Some(Account {
                login: login.into(),
            }),
            state: state.into(),
            commit_id: Some(commit.into()),
        }
    }

    #[test]
    fn the_merged_change_set_pull_request_is_selected() {
        let pulls = vec![
            pull(7, "feature/x", "acme/widgets", MERGE),
            pull(9, "cs/00042-add-sync", "acme/widgets", MERGE),
        ];
        assert_eq!(
            select_merged_pull(&claim(ReviewMode::SinglePlayer), &pulls)
                .unwrap()
                .number,
            9
        );
    }

    #[test]
    fn forks_unmerged_and_other_change_sets_are_not_approvals() {
        let c = claim(ReviewMode::SinglePlayer);
        let mut open = pull(1, "cs/00042-x", "acme/widgets", MERGE);
        open.merged_at = None;
        let refused = [
            vec![pull(1, "cs/00042-x", "mallory/widgets", MERGE)],
            vec![open],
            vec![pull(1, "cs/00043-x", "acme/widgets", MERGE)],
            vec![pull(1, "cs/00042-", "acme/widgets", MERGE)],
            vec![],
        ];
        for pulls in refused {
            let e = select_merged_pull(&c, &pulls).unwrap_err();
            assert_eq!(e.code(), "NOT_APPROVED", "{e}");
        }
    }

    #[test]
    fn another_merge_commit_is_a_mismatch_and_two_are_ambiguous() {
        let c = claim(ReviewMode::SinglePlayer);
        let other = "9".repeat(40);
        let e =
            select_merged_pull(&c, &[pull(3, "cs/00042-x", "acme/widgets", &other)]).unwrap_err();
        assert_eq!(e.code(), "MERGE_COMMIT_MISMATCH");
        assert!(e.to_string().contains(&other), "{e}");
        let two = [
            pull(3, "cs/00042-x", "acme/widgets", MERGE),
            pull(4, "cs/00042-y", "acme/widgets", MERGE),
        ];
        assert_eq!(
            select_merged_pull(&c, &two).unwrap_err().code(),
            "AMBIGUOUS_PULL_REQUEST"
        );
        let mut bad = c.clone();
        bad.change_set_id = "CS-42".into();
        assert_eq!(
            select_merged_pull(&bad, &two).unwrap_err().code(),
            "INVALID_REQUEST"
        );
    }

    #[test]
    fn single_player_needs_no_review() {
        let p = pull(9, "cs/00042-x", "acme/widgets", MERGE);
        let proof = check_reviews(&claim(ReviewMode::SinglePlayer), &p, &[]).unwrap();
        assert_eq!((proof.number(), proof.merge_commit()), (9, MERGE));
        assert!(proof.approvers().is_empty());
    }

    #[test]
    fn multi_player_needs_a_current_approval_by_someone_else() {
        let c = claim(ReviewMode::MultiPlayer);
        let p = pull(9, "cs/00042-x", "acme/widgets", MERGE);
        let ok = check_reviews(&c, &p, &[review("rita", "APPROVED", HEAD)]).unwrap();
        assert_eq!(ok.approvers(), ["rita".to_string()]);

        let cases: [(&[Review], &str); 4] = [
            (&[], "no reviewer"),
            (&[review("author", "APPROVED", HEAD)], "no reviewer"),
            (
                &[
                    review("rita", "APPROVED", HEAD),
                    review("sam", "CHANGES_REQUESTED", HEAD),
                ],
                "changes requested by sam",
            ),
            (
                &[
                    review("rita", "APPROVED", HEAD),
                    review("rita", "DISMISSED", HEAD),
                ],
                "no reviewer",
            ),
        ];
        for (reviews, why) in cases {
            let e = check_reviews(&c, &p, reviews).unwrap_err();
            assert!(e.to_string().contains(why), "{why}: {e}");
            assert_eq!(e.code(), "NOT_APPROVED");
        }
        let stale =
            check_reviews(&c, &p, &[review("rita", "APPROVED", &"0".repeat(40))]).unwrap_err();
        assert!(stale.to_string().contains("earlier head"), "{stale}");
        // A later approval supersedes the reviewer's own earlier request for changes, and a
        // comment decides nothing.
        let ok = check_reviews(
            &c,
            &p,
            &[
                review("sam", "CHANGES_REQUESTED", HEAD),
                review("sam", "APPROVED", HEAD),
                review("sam", "COMMENTED", HEAD),
            ],
        )
        .unwrap();
        assert_eq!(ok.approvers(), ["sam".to_string()]);
    }

    #[test]
    fn a_merge_commit_without_an_associated_pull_request_is_asked_again_a_bounded_number_of_times()
    {
        let policy = ReaskPolicy::default();
        let c = claim(ReviewMode::SinglePlayer);
        let none: Vec<PullRequest> = Vec::new();
        let decided = select_merged_pull(&c, &none);
        assert_eq!(
            decided.as_ref().map_err(ApprovalRefusal::code),
            Err("NOT_APPROVED")
        );
        let waits: Vec<Option<u64>> = (1..=policy.reasks + 1)
            .map(|asked| reask_after(&policy, &c, &none, &decided, asked).map(|d| d.as_secs()))
            .collect();
        assert_eq!(waits, vec![Some(2), Some(4), Some(8), None]);
        // Associated with a pull request that is not the change set's (a fork, another
        // branch): GitHub has answered; a refusal, asked once.
        let fork = vec![pull(4, "cs/00042-sync", "mallory/widgets", MERGE)];
        let decided = select_merged_pull(&c, &fork);
        assert!(decided.is_err());
        assert_eq!(reask_after(&policy, &c, &fork, &decided, 1), None);
        // Any other decision is final.
        let mine = vec![pull(9, "cs/00042-sync", "acme/widgets", MERGE)];
        let decided = select_merged_pull(&c, &mine);
        assert!(decided.is_ok());
        assert_eq!(reask_after(&policy, &c, &mine, &decided, 1), None);
    }
}
