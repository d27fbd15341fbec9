//! What the two registration controllers (ChangeSet, BugReport) share: their
//! reconcile errors and their context. Both read a Project, read its
//! repository through the operator's cache and materialize through the
//! Kubernetes work store.

use std::path::PathBuf;

use kube::Client;

/// Errors of one registration reconcile (all transient: they requeue).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object has no namespace (the CRDs are namespaced; this is a bug).
    #[error("{kind} {name} has no namespace")]
    MissingNamespace {
        /// `ChangeSet` or `BugReport`.
        kind: &'static str,
        /// Object name.
        name: String,
    },
    /// Reading the Project failed for another reason than absence.
    #[error("failed to read Project {name}: {source}")]
    ReadProject {
        /// Project.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The work store failed.
    #[error("failed to materialize {what}: {source}")]
    Store {
        /// What was being materialized (`change set CS-00001`, `bug GH-17`).
        what: String,
        /// Cause.
        #[source]
        source: protobot_stores::StoreError,
    },
    /// Adding or removing a finalizer failed.
    #[error(
        "failed to update the finalizers of {kind} {name}: {source}; check the operator's RBAC for patching {kind} objects"
    )]
    Finalizer {
        /// `ChangeSet` or `BugReport`.
        kind: &'static str,
        /// Object name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Reading the registered work item failed for another reason than absence.
    #[error("failed to read BuildWorkItem {name}: {source}")]
    ReadWorkItem {
        /// Object name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// Writing the status failed.
    #[error("failed to write the status of {kind} {name}: {source}")]
    WriteStatus {
        /// `ChangeSet` or `BugReport`.
        kind: &'static str,
        /// Object name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// Stable category for metrics and Events.
    pub fn category(&self) -> &'static str {
        match self {
            Error::MissingNamespace { .. } => "missing-namespace",
            Error::ReadProject { .. } => "read-project",
            Error::Store { .. } => "work-store",
            Error::WriteStatus { .. } => "write-status",
            Error::Finalizer { .. } => "finalizer",
            Error::ReadWorkItem { .. } => "read-work-item",
        }
    }
}

/// Shared state of a registration controller.
pub struct Context {
    /// The client.
    pub client: Client,
    /// The repository cache.
    pub workdir: PathBuf,
    /// Which repository locations Projects may name (`--allow-local-repositories`).
    pub repositories: crate::project::decide::RepositoryPolicy,
    /// The forge clients of Projects with `spec.forge` (approvals are checked there).
    pub forges: std::sync::Arc<crate::forge::ForgeClients>,
}
