//! Why a project cannot be driven ([`ProjectError`]): reported on the pass, counted under
//! a stable category, retried with the project's backoff.

/// Why a project cannot be driven (reported, retried on the next pass).
#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    /// The project names no worker classes, or they are malformed.
    #[error(
        "project {project}: {reason}; create the ConfigMap named by spec.workerClassesRef with worker-a, worker-b and integration"
    )]
    WorkerClasses {
        /// Project.
        project: String,
        /// Why.
        reason: String,
    },
    /// The repository cannot be cloned or fetched.
    #[error("project {project}: repository {url}: {reason}")]
    Repository {
        /// Project.
        project: String,
        /// URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The Project's forge cannot be used: nothing is built (an item of a Project with a
    /// forge never lands around it).
    #[error("project {project}: {source}")]
    Forge {
        /// Project.
        project: String,
        /// Why.
        #[source]
        source: Box<crate::forge::ForgeSetupError>,
    },
    /// `spec.budget` is not an amount of dollars (the CRD's pattern refuses this; a Project
    /// written around the schema is refused here: nothing is built).
    #[error("project {project}: spec.budget.perItem: {source}")]
    Budget {
        /// Project.
        project: String,
        /// Why.
        #[source]
        source: protobot_usage::DollarsError,
    },
    /// The API failed.
    #[error("project {project}: {source}")]
    Api {
        /// Project.
        project: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The pass failed outside any one build.
    #[error("project {project}: {reason}")]
    Pass {
        /// Project.
        project: String,
        /// Why.
        reason: String,
    },
}

impl ProjectError {
    /// Stable label for `protobot_reconcile_errors_total{category}`.
    pub fn category(&self) -> &'static str {
        match self {
            ProjectError::WorkerClasses { .. } => "worker-classes",
            ProjectError::Repository { .. } => "repository",
            ProjectError::Forge { source, .. } => source.category(),
            ProjectError::Budget { .. } => "budget",
            ProjectError::Api { .. } => "api",
            ProjectError::Pass { .. } => "pass",
        }
    }
}
