//! protobot's operator side: the Job Site health surface today (metrics,
//! liveness, readiness), the ChangeSet and BugReport controllers (GitOps
//! registration of change sets and true bugs), the Project controller
//! (repository, configuration and sandbox status), the InspectionRun
//! controller (its `ProducersComplete` and `Sealed` conditions) and the
//! in-cluster Job Site (claims, builds, inspections, merges) and the WMS
//! Adapter API over HTTP (`wms_api`), and GitHub as a Project's forge
//! (`forge`: approvals at registration, landing through pull requests).

pub mod admin;
pub mod api_errors;
pub mod bugreport;
pub mod build_items;
pub mod capacity;
pub mod changeset;
pub mod drive;
pub mod events;
pub mod forge;
pub mod inspectionrun;
pub mod jobsite;
pub mod metrics;
pub mod operator;
pub mod project;
pub mod proxy_usage;
pub mod registration;
pub mod repo_cache;
pub mod wms_api;
