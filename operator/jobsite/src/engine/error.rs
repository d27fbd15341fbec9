//! Why a build stopped abnormally ([`EngineError`]).

use protobot_lifecycle::State;

use protobot_repo::{
    digest::DigestError, export::ExportError, integrate::IntegrateError, land::LandError,
};

use crate::{landing::ForgeRefusal, repo_folder::FolderError};

/// Why a build stopped abnormally (a rejected command is a lost claim).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The lease is gone: stop touching the item.
    #[error(transparent)]
    LeaseLost(#[from] crate::lease::LeaseLost),
    /// A lifecycle command was rejected.
    #[error("{command} on {work_item_id} was rejected: {code}")]
    Rejected {
        /// Item.
        work_item_id: String,
        /// Command.
        command: String,
        /// Code.
        code: String,
    },
    /// The store failed.
    #[error("work store failed: {0}")]
    Store(#[from] protobot_stores::StoreError),
    /// Git failed.
    #[error("failed to {operation}: {source}")]
    Git {
        /// What.
        operation: &'static str,
        /// Why: the repository layer's typed error (boxed: it is large).
        #[source]
        source: Box<GitError>,
    },
    /// The sandbox failed (not the command in it).
    #[error(transparent)]
    Executor(#[from] crate::executor::ExecutorError),
    /// An exported projection holds a path its role must never see.
    #[error("the {role} projection holds {path}, which that role must never see; the build stops")]
    ProjectionLeak {
        /// Role.
        role: &'static str,
        /// The offending path.
        path: String,
    },
    /// The task document of a sandboxed run could not be written.
    #[error("failed to write the task document of run {run_id}")]
    Task {
        /// The run.
        run_id: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A role's output is malformed.
    #[error("the {role} output is unusable: {reason}")]
    Output {
        /// Role.
        role: &'static str,
        /// Why.
        reason: String,
    },
    /// A Worker stopped because its model request failed, as its harness reported
    /// (`escalation::MODEL_FAILURE_FILE`). Transient failures (timeout, 408, 429, 5xx,
    /// connection) are retried on the same tier with backoff until their class's budget is
    /// spent; any other status stops the build: it is neither transient nor the agent's fault.
    #[error("{}", model_failure_message(role, failure))]
    Model {
        /// Role.
        role: &'static str,
        /// How the model request failed.
        failure: crate::escalation::ModelFailure,
    },
    /// The work item is in a state this engine does not drive.
    #[error(
        "work item {work_item_id} is {state}; the Job Site drives only building, inspecting and merging items"
    )]
    NotDrivable {
        /// Item.
        work_item_id: String,
        /// Its state.
        state: State,
    },
    /// A Worker's patch was refused for a gap in the projection policy (a path
    /// no entry classifies): another cycle cannot help, so the item blocks with
    /// this reason (`crate::triage::policy_gap`).
    #[error("{reason}")]
    PolicyGap {
        /// The block reason: the paths, their class and the fix.
        reason: String,
    },
    /// Fault injection stopped the engine at a boundary (tests only).
    #[error("interrupted at effect boundary {boundary}")]
    Interrupted {
        /// The boundary.
        boundary: String,
    },
    /// The merge was pushed but the default branch, fetched back, does not contain it: it
    /// is never recorded; the item stays `merging` until the reconciler finds it not
    /// applied.
    #[error("failed to verify the merge on the default branch: {reason}")]
    MergeNotVerified {
        /// What the verification saw.
        reason: String,
    },
    /// The forge refused to merge the pull request for a reason a person must resolve (a
    /// failing required check, branch protection) or because it rejected the request: the
    /// build stops, the item stays `merging` with its merge envelope, and (for a person's
    /// decision) the forge's escalation issue says what to decide.
    #[error("the merge of {work_item_id} was refused: {refusal}")]
    MergeRefused {
        /// Item.
        work_item_id: String,
        /// The forge's typed reason.
        refusal: ForgeRefusal,
    },
    /// The process is shutting down: the engine stopped at an effect boundary. The lease
    /// lapses (or another Job Site recovers it) and the item resumes from its record.
    #[error(
        "stopped at effect boundary {boundary}: this Job Site is shutting down; another one resumes the item once its lease lapses"
    )]
    ShuttingDown {
        /// The boundary.
        boundary: String,
    },
}

pub(super) fn git_err<E: Into<GitError>>(operation: &'static str) -> impl Fn(E) -> EngineError {
    move |e| EngineError::Git {
        operation,
        source: Box::new(e.into()),
    }
}

/// What failed in the engine's git work: the repository layer's typed error, kept whole
/// (its `category()` and its own source chain), never flattened into text.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    /// A libgit2 call (a ref, a commit, a tree).
    #[error(transparent)]
    Git(#[from] git2::Error),
    /// The work-item branch: created, imported into, or refreshed from the default branch.
    #[error(transparent)]
    Integrate(#[from] IntegrateError),
    /// Landing: fetches, pushes, the attestation commit, verification on the remote.
    #[error(transparent)]
    Land(#[from] LandError),
    /// A projection export, its record or the projection manifest.
    #[error(transparent)]
    Export(#[from] ExportError),
    /// The product-tree digest.
    #[error(transparent)]
    Digest(#[from] DigestError),
    /// Reading an exported projection from disk.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The git work could not run: the repository did not open, or its blocking task stopped.
    #[error(transparent)]
    Folder(#[from] FolderError),
    /// The remote has no such branch.
    #[error("{remote} has no {reference}")]
    NoRemoteBranch {
        /// The remote.
        remote: String,
        /// The branch's ref.
        reference: String,
    },
}

fn model_failure_message(role: &str, failure: &crate::escalation::ModelFailure) -> String {
    match failure.outcome() {
        Some(outcome) => format!(
            "the {role}'s model request {failure} ({outcome:?}): transient, retried on the same tier with backoff; its retries are spent, so the build stops. Check the model provider's status and limits, then run `protobot retry`"
        ),
        None => format!(
            "the {role}'s model request {failure}: not transient and not the agent's failure, so the build stops without escalating. Check the worker class's model id (its tiers) and the credential the egress proxy injects for the model host"
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_git_failure_keeps_the_repository_layer_error_as_its_typed_source() {
        let failed = git_err("land the work item")(LandError::RefMoved {
            reference: "refs/heads/main".into(),
            expected: "abc".into(),
        });
        assert_eq!(
            failed.to_string(),
            "failed to land the work item: unable to update refs/heads/main: it is no longer at abc; reread and retry"
        );
        let source = failed.source().unwrap();
        let typed = source.downcast_ref::<Box<GitError>>().unwrap();
        assert!(
            matches!(**typed, GitError::Land(LandError::RefMoved { .. })),
            "{typed:?}"
        );
        let conflict = git_err("merge the default branch in")(IntegrateError::MergeConflict {
            from: "main".into(),
            into: "wi/1-build".into(),
            paths: vec!["src/a.sh".into()],
        });
        let EngineError::Git { source, .. } = conflict else {
            panic!("not a git error: {conflict:?}");
        };
        assert!(matches!(
            *source,
            GitError::Integrate(IntegrateError::MergeConflict { .. })
        ));
    }
}
