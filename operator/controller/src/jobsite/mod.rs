//! The Job Site in the cluster: the same engine and loop as on one machine
//! ([`protobot_jobsite::site::JobSite`]), over the Kubernetes work store and a
//! cluster Executor.
//!
//! Every replica runs one controller of Projects ([`run`]): each reconcile is one dispatch
//! of a project — reconcile expired leases, resume the items its identity still leases,
//! claim ready items within the project's WIP limit and the replica's build slots, and
//! start their builds. The BuildWorkItem controller ([`crate::build_items`]) wakes a
//! project's dispatch when one of its items becomes claimable. Claims are compare-and-swap
//! on the item's status, so any number of replicas run this without leader election. Each
//! replica keeps its own integration clone per project under its work directory;
//! everything it needs to resume lives in the store and on the remote.
//!
//! The modules, in the order a dispatch meets them:
//! - `settings`: one replica's settings ([`Settings`]);
//! - `dispatcher`: the controller ([`run`]) and each project's backoff ([`ProjectSchedule`]);
//! - `dispatch`: one project's dispatch (read → prepare → decide and apply → publish);
//! - `worker_classes` and `project_site`: what a project's Job Site is built from, and when
//!   it is kept ([`reuse_project_site`]);
//! - `publish`, `events`, `queue` and `checks_waits`: what a dispatch makes visible
//!   (`InspectionRun` objects, Events, `status.queue`, `AwaitingChecks`);
//! - `error`: why a project cannot be driven ([`ProjectError`]).

mod checks_waits;
mod dispatch;
mod dispatcher;
mod error;
mod events;
mod project_site;
mod publish;
mod queue;
mod settings;
mod worker_classes;

pub use dispatcher::{ProjectSchedule, run};
pub use error::ProjectError;
pub use events::event_for;
pub use project_site::{
    ProjectFingerprint, REFETCH_EVERY, item_budget, recorded_bug_intakes, reuse_project_site,
};
pub use publish::inspection_runs;
pub use settings::{ClaimSweeps, DEFAULT_MAX_CONCURRENT_BUILDS, Settings};
pub use worker_classes::{WorkerClasses, worker_classes};

/// Field manager of the Job Site's server-side applies.
pub const FIELD_MANAGER: &str = "protobot/jobsite";

/// Finalizer on every unfinished BuildWorkItem: an item cannot disappear while work (or a
/// merge) may still land for it. The BuildWorkItem controller keeps it on every unfinished
/// item and removes it from finished ones ([`crate::build_items`]).
pub const FINALIZER: &str = "protobot.dev/unfinished-work";

/// The tag of a project's builds in [`protobot_jobsite::builds::Builds`]: `namespace/name` (a namespace holds no
/// `/`).
pub fn project_tag(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}
