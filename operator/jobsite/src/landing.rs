//! How a tested work item lands on the default branch: the seam between the engine's
//! `merging` stage and a forge.
//!
//! - [`Landing::DirectPush`] (the default, for forges without an API and local remotes): the
//!   engine writes the merge commit and pushes it with an expected-head guard
//!   (`protobot_repo::land`).
//! - [`Landing::PullRequest`]: the engine pushes `wi/…`, and a [`PullRequestForge`] opens or
//!   reuses the pull request and merges it through the host's API with the tested head as the
//!   guard, so branch protection and required checks apply. The engine then verifies, by
//!   fetching, that the default branch contains a merge of the tested head: the forge's
//!   "merged" is never trusted on its own.
//!
//! A refusal is a typed [`ForgeRefusal`] the engine turns into a lifecycle outcome
//! (revalidation, the merge-conflict path, or a stop with the reason and an escalation),
//! never a retry loop.

use std::{fmt, sync::Arc};

use futures::future::BoxFuture;

/// How `merging` lands the work item.
#[derive(Clone, Default)]
pub enum Landing {
    /// Merge commit pushed with an expected-head guard.
    #[default]
    DirectPush,
    /// Through a pull request on the forge.
    PullRequest(Arc<dyn PullRequestForge>),
}

impl fmt::Debug for Landing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Landing::DirectPush => f.write_str("DirectPush"),
            Landing::PullRequest(forge) => write!(f, "PullRequest({})", forge.describe()),
        }
    }
}

/// What the pull request says about the tested candidate (the forge renders and sanitizes
/// it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LandingSummary {
    /// The change set the work item implements, when it has one.
    pub change_set_id: Option<String>,
    /// The attested product-tree digest.
    pub product_tree_digest: String,
    /// The sealed Inspection Run.
    pub inspection_run_id: String,
    /// Findings recorded by the runs of this process.
    pub findings: usize,
    /// Build cycles recorded for the item.
    pub cycles: usize,
    /// Evidence files in the repository at the tested head (attestation paths).
    pub evidence: Vec<(String, String)>,
}

/// A request to land through a pull request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullRequestMerge {
    /// The work item.
    pub work_item_id: String,
    /// The pushed work-item branch (`wi/…`, without `refs/heads/`).
    pub head_branch: String,
    /// The default branch.
    pub base_branch: String,
    /// The tested head: the pull request is merged only while its head is this commit.
    pub tested_head: String,
    /// The merge commit's message, ending with the `Work-Item:` trailer (so the reconciler
    /// finds the merge by trailer, as for a direct push).
    pub merge_message: String,
    /// The body's content.
    pub summary: LandingSummary,
}

/// The forge merged the pull request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForgeMerged {
    /// The pull request.
    pub pull_request: u64,
    /// The merge commit the forge reports (still to be verified by fetching).
    pub merge_commit: String,
}

/// Why the forge did not merge.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ForgeRefusal {
    /// The pull request's head or the default branch moved past the tested candidate:
    /// revalidate (back to building) and land again.
    #[error("the head moved before the merge: {reason}")]
    HeadMoved {
        /// The forge's reason.
        reason: String,
    },
    /// The candidate does not merge cleanly: the merge-conflict path.
    #[error("the merge conflicts: {reason}")]
    Conflict {
        /// The forge's reason.
        reason: String,
    },
    /// A person must act (a failing required check, branch protection): the build stops
    /// with this reason and the forge's escalation issue asks for the decision.
    #[error("{reason}")]
    Blocked {
        /// The reason, naming the check or rule and the fix.
        reason: String,
    },
    /// The forge rejected the request itself or its answer was unusable (configuration, a
    /// defect): the build stops with this reason.
    #[error("the forge rejected the merge: {reason}")]
    Failed {
        /// What happened.
        reason: String,
    },
    /// The forge is unreachable or rate-limited beyond its policy: the build stops and the
    /// item is resumed later (nothing was merged).
    #[error("the forge is unavailable: {reason}")]
    Unavailable {
        /// What happened.
        reason: String,
    },
}

impl ForgeRefusal {
    /// A stable label (traces, metrics).
    pub fn category(&self) -> &'static str {
        match self {
            ForgeRefusal::HeadMoved { .. } => "head-moved",
            ForgeRefusal::Conflict { .. } => "conflict",
            ForgeRefusal::Blocked { .. } => "blocked",
            ForgeRefusal::Failed { .. } => "failed",
            ForgeRefusal::Unavailable { .. } => "unavailable",
        }
    }
}

/// A person's decision is needed (sent to the forge's escalation issue).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EscalationRequest {
    /// The work item.
    pub work_item_id: String,
    /// Why it stopped.
    pub reason: String,
    /// What a person must decide.
    pub decision: String,
}

/// A forge that lands work items through pull requests.
pub trait PullRequestForge: Send + Sync {
    /// Opens or reuses the pull request `head_branch` → `base_branch` and merges it with a
    /// merge commit while its head is `tested_head`. Idempotent: a pull request that already
    /// merged is reported as merged.
    fn merge<'a>(
        &'a self,
        request: &'a PullRequestMerge,
    ) -> BoxFuture<'a, Result<ForgeMerged, ForgeRefusal>>;

    /// Opens or updates the one escalation issue of the work item.
    fn escalate<'a>(&'a self, request: &'a EscalationRequest) -> BoxFuture<'a, Result<(), String>>;

    /// A short description for logs (`github acme/widgets`).
    fn describe(&self) -> String;
}
