//! Deciding which files of a source tree enter a role projection.
//!
//! Pure: takes the flattened source tree, the manifest, the role and (for Worker A) what the
//! test catalog withholds and which test files the build wrote itself, and returns what to
//! export and what to withhold, with a reason for every withheld path. Deny by default: a path is exported only when it is a canonical project
//! path, a regular or executable file, and visible to the role.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::{
    catalog::TestWithholding,
    manifest::{PathClass, ProjectionManifest},
    path::{PathProblem, check_project_path},
    role::{Role, Visibility},
    tree::mode,
};

/// A source entry as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceEntry {
    /// UTF-8 path, or `None` when the name is not UTF-8.
    pub path: Option<String>,
    /// Raw Git mode.
    pub mode: i32,
}

/// Why a path is not exported.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum WithheldReason {
    /// No manifest entry covers it.
    Unclassified,
    /// Its class is not visible to the role.
    HiddenClass {
        /// The class.
        class: PathClass,
    },
    /// A `test` path a quarantined catalog entry lists: it verifies a requirement this work
    /// item revises or retires (or uses a control surface it changes). Worker A may write its
    /// replacement at the same path.
    QuarantinedTest,
    /// A `test` path a legacy (unmapped) catalog entry lists: integration-only.
    LegacyTest,
    /// Not a canonical project path.
    UnsafePath {
        /// What is wrong with it.
        problem: PathProblem,
    },
    /// The name is not UTF-8.
    NonUtf8Path,
    /// A symlink, submodule or other non-file mode; never exported.
    UnsupportedMode {
        /// Octal mode.
        mode: String,
    },
}

/// What Worker A may see of its own (`test`) area.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TestVisibility {
    /// Files the test catalog withholds, and why.
    pub withheld: BTreeMap<String, TestWithholding>,
    /// Files the current build wrote: shown whatever the catalog says.
    pub own: BTreeSet<String>,
}

impl TestVisibility {
    /// Why `path` is kept from Worker A, if it is.
    fn withholds(&self, path: &str) -> Option<WithheldReason> {
        if self.own.contains(path) {
            return None;
        }
        self.withheld.get(path).map(|reason| match reason {
            TestWithholding::Quarantined => WithheldReason::QuarantinedTest,
            TestWithholding::Legacy => WithheldReason::LegacyTest,
        })
    }
}

/// An exported file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedFile {
    /// Project path.
    pub path: String,
    /// Its class.
    pub class: PathClass,
}

/// The export plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectionPlan {
    /// Indexes into the source entries that are exported, with their classes.
    pub include: Vec<(usize, PlannedFile)>,
    /// Withheld entries: (UTF-8 path or lossy rendering, reason).
    pub withheld: Vec<(String, WithheldReason)>,
}

/// Plans the projection of `entries` for `role`.
pub fn plan_projection(
    entries: &[SourceEntry],
    lossy_paths: &[String],
    manifest: &ProjectionManifest,
    role: Role,
    tests: &TestVisibility,
) -> ProjectionPlan {
    let mut plan = ProjectionPlan::default();
    for (index, entry) in entries.iter().enumerate() {
        let shown = lossy_paths.get(index).cloned().unwrap_or_default();
        let Some(path) = entry.path.as_deref() else {
            plan.withheld.push((shown, WithheldReason::NonUtf8Path));
            continue;
        };
        match decide(path, entry.mode, manifest, role, tests) {
            Ok(class) => plan.include.push((
                index,
                PlannedFile {
                    path: path.to_owned(),
                    class,
                },
            )),
            Err(reason) => plan.withheld.push((path.to_owned(), reason)),
        }
    }
    plan
}

fn decide(
    path: &str,
    entry_mode: i32,
    manifest: &ProjectionManifest,
    role: Role,
    tests: &TestVisibility,
) -> Result<PathClass, WithheldReason> {
    check_project_path(path).map_err(|problem| WithheldReason::UnsafePath { problem })?;
    let class = manifest
        .classify(path)
        .ok_or(WithheldReason::Unclassified)?;
    match role.visibility(Some(class)) {
        Visibility::Hidden => return Err(WithheldReason::HiddenClass { class }),
        Visibility::IfValidTest => {
            if let Some(reason) = tests.withholds(path) {
                return Err(reason);
            }
        }
        Visibility::Visible => {}
    }
    if entry_mode != mode::FILE && entry_mode != mode::EXECUTABLE {
        return Err(WithheldReason::UnsupportedMode {
            mode: format!("{entry_mode:06o}"),
        });
    }
    Ok(class)
}
