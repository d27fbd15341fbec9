//! protobot custom resource types (`protobot.dev/v1alpha1`) and CRD generation.
//!
//! This crate is the API of the operator and nothing else: the five namespaced kinds
//! ([`Project`], [`ChangeSet`], [`BugReport`], [`BuildWorkItem`], [`InspectionRun`]), the shared
//! Kubernetes-style [`Condition`](conditions::Condition) with its pure merge function, the
//! work-item [`Lease`](lease::Lease) and its `Leased` condition, and [`crdgen`], which renders
//! the CRD YAML committed under `crds/`. It knows nothing of Kubernetes clients
//! (ARCHITECTURE.md §3): every function here is pure and takes the time as a parameter.
//!
//! | Kind | Short name | Category |
//! | --- | --- | --- |
//! | `Project` | `pbproj` | `protobot` |
//! | `ChangeSet` | `pbcs` | `protobot` |
//! | `BugReport` | `pbbug` | `protobot` |
//! | `BuildWorkItem` | `bwi` | `protobot` |
//! | `InspectionRun` | `pbir` | `protobot` |

pub mod bug_report;
pub mod build_work_item;
pub mod change_set;
pub mod common;
pub mod conditions;
pub mod crdgen;
pub mod inspection_run;
pub mod lease;
pub mod project;

pub use bug_report::{BugReport, BugReportSpec, BugReportStatus};
pub use build_work_item::{BuildWorkItem, BuildWorkItemSpec, BuildWorkItemStatus};
pub use change_set::{ChangeSet, ChangeSetSpec, ChangeSetStatus};
pub use common::{BusinessPriority, ChangeType, LifecycleState, LocalRef};
pub use conditions::{Condition, ConditionStatus, ConditionUpdate};
pub use inspection_run::{InspectionRun, InspectionRunSpec, InspectionRunStatus};
pub use lease::Lease;
pub use project::{Project, ProjectQueue, ProjectSpec, ProjectStatus, QueueReason};

/// The API group of every protobot custom resource.
pub const GROUP: &str = "protobot.dev";

/// The one served and stored API version of every protobot custom resource.
pub const VERSION: &str = "v1alpha1";

/// The `kubectl get <category>` name that lists every protobot kind at once.
pub const CATEGORY: &str = "protobot";
