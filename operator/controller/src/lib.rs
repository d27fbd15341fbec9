//! protobot's operator side: the Job Site health surface today (metrics,
//! liveness, readiness), the ChangeSet controller (GitOps registration) and the
//! in-cluster Job Site (claims, builds, inspections, merges).

pub mod admin;
pub mod changeset;
pub mod jobsite;
pub mod metrics;
pub mod operator;
pub mod repo_cache;
