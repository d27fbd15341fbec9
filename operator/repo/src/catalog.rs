//! The test catalog `.protobot/test-catalog.jsonl` and canonical test selection.
//!
//! Pure. One JSON object per line:
//! `{"test_id", "paths": [...], "verifies": ["REQ-…"], "spec_commit", "mode", "control_surfaces"}`
//! where `mode` is `black-box` (default) or `implementation-aware`. Selection rules (seed,
//! "Canonical test selection"):
//! - mapped only to unchanged active requirements → **valid**;
//! - mapped to a revised or retired requirement → **quarantined**, as a unit when it also
//!   spans unchanged ones (the still-active requirements it referenced must be preserved by
//!   replacement coverage);
//! - implementation-aware and one of its declared control surfaces changed → **quarantined**;
//! - unmapped (no `verifies`) → **legacy**: integration-only, needs an Inspector disposition.
//!
//! What Worker A sees of its own area ([`TestSelection::withheld_files`]): every `test`-class
//! file, catalogued or not, except a file that a quarantined or legacy entry lists. A file no
//! entry lists is a test the Workers wrote in an earlier build (or one the project added by
//! hand): it needs no line, Worker A sees it and may rewrite it. A quarantined test stays out
//! of sight (it checks a requirement as it was), but Worker A may write its replacement at the
//! same path; a legacy test is integration-only and stays both hidden and read-only. Files the
//! current build changed are always Worker A's own ([`ChangeScope::build_base`], applied by
//! the projector).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Repository path of the test catalog.
pub const CATALOG_PATH: &str = ".protobot/test-catalog.jsonl";

/// How a test observes the product.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerificationMode {
    /// Through public interfaces only.
    #[default]
    BlackBox,
    /// Through declared internal control surfaces.
    ImplementationAware,
}

/// One catalog line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogEntry {
    /// Stable test ID.
    pub test_id: String,
    /// Files that make up the test.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Requirement IDs the test verifies.
    #[serde(default)]
    pub verifies: Vec<String>,
    /// Specification commit the test was generated against.
    #[serde(default)]
    pub spec_commit: Option<String>,
    /// Verification mode.
    #[serde(default)]
    pub mode: VerificationMode,
    /// Internal control surfaces an implementation-aware test uses.
    #[serde(default)]
    pub control_surfaces: Vec<String>,
}

/// A catalog that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    /// A line is not a valid entry.
    #[error("failed to parse test-catalog line {line}: {reason}; fix the catalog entry")]
    Line {
        /// 1-based line number.
        line: usize,
        /// Parser message.
        reason: String,
    },
    /// Two lines share a test ID.
    #[error("failed to load the test catalog: test id `{test_id}` appears twice (line {line})")]
    DuplicateId {
        /// The repeated ID.
        test_id: String,
        /// 1-based line of the second occurrence.
        line: usize,
    },
}

/// Parses the JSONL catalog; blank lines are ignored.
pub fn parse_catalog(text: &str) -> Result<Vec<CatalogEntry>, CatalogError> {
    let mut seen = BTreeSet::new();
    let mut entries = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let entry: CatalogEntry = serde_json::from_str(line).map_err(|e| CatalogError::Line {
            line: index + 1,
            reason: e.to_string(),
        })?;
        if !seen.insert(entry.test_id.clone()) {
            return Err(CatalogError::DuplicateId {
                test_id: entry.test_id,
                line: index + 1,
            });
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// What the work item changes, at its specification commit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeScope {
    /// Requirements whose text or applicability the work item revises.
    pub revised: BTreeSet<String>,
    /// Requirements the work item retires.
    pub retired: BTreeSet<String>,
    /// Internal control surfaces the work item changes.
    pub changed_control_surfaces: BTreeSet<String>,
    /// The commit the work item's branch was cut from, when projecting for a build: test
    /// files that differ from it were written by this build, so Worker A always sees them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_base: Option<String>,
}

/// Why a test is quarantined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum QuarantineReason {
    /// Verifies revised requirements.
    RevisedRequirement {
        /// The revised IDs it verifies.
        requirement_ids: Vec<String>,
    },
    /// Verifies retired requirements.
    RetiredRequirement {
        /// The retired IDs it verifies.
        requirement_ids: Vec<String>,
    },
    /// Uses a control surface the work item changes.
    ControlSurfaceChanged {
        /// The changed surfaces it uses.
        control_surfaces: Vec<String>,
    },
}

/// Why the catalog keeps a test file from Worker A.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TestWithholding {
    /// A quarantined entry lists it: hidden, but Worker A may write its replacement.
    Quarantined,
    /// A legacy (unmapped) entry lists it: integration-only, neither shown nor writable.
    Legacy,
}

/// The selection decision for one test.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "validity", rename_all = "kebab-case")]
pub enum Validity {
    /// Part of the active catalog; visible to Worker A.
    Valid,
    /// Excluded from discovery and gates for this specification commit.
    Quarantined {
        /// Every reason that applies.
        reasons: Vec<QuarantineReason>,
        /// Still-active requirements the replacement coverage must preserve.
        preserve: Vec<String>,
        /// True when it spans changed and unchanged requirements (quarantined as a unit).
        spans_unchanged: bool,
    },
    /// Unmapped: integration-only, needs an Inspector disposition.
    Legacy,
}

/// The decision for one catalog entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestDecision {
    /// Stable test ID.
    pub test_id: String,
    /// The files of the test.
    pub paths: Vec<String>,
    /// The decision.
    #[serde(flatten)]
    pub validity: Validity,
}

/// The selection over the whole catalog.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestSelection {
    /// One decision per catalog entry, in catalog order.
    pub tests: Vec<TestDecision>,
}

impl TestSelection {
    /// Files the catalog keeps from Worker A, with the reason: every file a quarantined or
    /// legacy entry lists (legacy wins when both do, since a legacy file is read-only too).
    /// Files listed only by valid entries, and files no entry lists, are not here: Worker A
    /// sees them.
    pub fn withheld_files(&self) -> BTreeMap<String, TestWithholding> {
        let mut withheld: BTreeMap<String, TestWithholding> = BTreeMap::new();
        for test in &self.tests {
            let reason = match test.validity {
                Validity::Valid => continue,
                Validity::Quarantined { .. } => TestWithholding::Quarantined,
                Validity::Legacy => TestWithholding::Legacy,
            };
            for path in &test.paths {
                let slot = withheld.entry(path.clone()).or_insert(reason);
                *slot = (*slot).max(reason);
            }
        }
        withheld
    }

    /// The active catalog: IDs of valid tests.
    pub fn active_test_ids(&self) -> Vec<String> {
        self.tests
            .iter()
            .filter(|t| t.validity == Validity::Valid)
            .map(|t| t.test_id.clone())
            .collect()
    }
}

/// Classifies one entry.
pub fn classify_test(entry: &CatalogEntry, scope: &ChangeScope) -> Validity {
    if entry.verifies.is_empty() {
        return Validity::Legacy;
    }
    let pick = |set: &BTreeSet<String>| -> Vec<String> {
        let mut ids: Vec<String> = entry
            .verifies
            .iter()
            .filter(|r| set.contains(*r))
            .cloned()
            .collect();
        ids.sort();
        ids.dedup();
        ids
    };
    let revised = pick(&scope.revised);
    let retired = pick(&scope.retired);
    let mut surfaces: Vec<String> = match entry.mode {
        VerificationMode::ImplementationAware => entry
            .control_surfaces
            .iter()
            .filter(|s| scope.changed_control_surfaces.contains(*s))
            .cloned()
            .collect(),
        VerificationMode::BlackBox => Vec::new(),
    };
    surfaces.sort();
    surfaces.dedup();
    let mut reasons = Vec::new();
    if !revised.is_empty() {
        reasons.push(QuarantineReason::RevisedRequirement {
            requirement_ids: revised.clone(),
        });
    }
    if !retired.is_empty() {
        reasons.push(QuarantineReason::RetiredRequirement {
            requirement_ids: retired.clone(),
        });
    }
    if !surfaces.is_empty() {
        reasons.push(QuarantineReason::ControlSurfaceChanged {
            control_surfaces: surfaces,
        });
    }
    if reasons.is_empty() {
        return Validity::Valid;
    }
    let mut preserve: Vec<String> = entry
        .verifies
        .iter()
        .filter(|r| !scope.retired.contains(*r))
        .cloned()
        .collect();
    preserve.sort();
    preserve.dedup();
    let spans_unchanged = entry
        .verifies
        .iter()
        .any(|r| !scope.revised.contains(r) && !scope.retired.contains(r));
    Validity::Quarantined {
        reasons,
        preserve,
        spans_unchanged,
    }
}

/// Classifies every entry of the catalog.
pub fn select_tests(entries: &[CatalogEntry], scope: &ChangeScope) -> TestSelection {
    TestSelection {
        tests: entries
            .iter()
            .map(|e| TestDecision {
                test_id: e.test_id.clone(),
                paths: e.paths.clone(),
                validity: classify_test(e, scope),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: &str, paths: &[&str], verifies: &[&str]) -> CatalogEntry {
        CatalogEntry {
            test_id: id.into(),
            paths: paths.iter().map(|s| s.to_string()).collect(),
            verifies: verifies.iter().map(|s| s.to_string()).collect(),
            spec_commit: None,
            mode: VerificationMode::BlackBox,
            control_surfaces: vec![],
        }
    }

    fn scope() -> ChangeScope {
        ChangeScope {
            revised: ["REQ-CLI-00002".to_string()].into(),
            retired: ["REQ-CLI-00003".to_string()].into(),
            changed_control_surfaces: ["sync::queue".to_string()].into(),
            build_base: None,
        }
    }

    #[test]
    fn selection_follows_the_seed_rules() {
        let unchanged = entry("T-1", &["tests/one.rs"], &["REQ-CLI-00001"]);
        let revised = entry("T-2", &["tests/two.rs"], &["REQ-CLI-00002"]);
        let mixed = entry(
            "T-3",
            &["tests/three.rs"],
            &["REQ-CLI-00001", "REQ-CLI-00003"],
        );
        let legacy = entry("T-4", &["tests/old.rs"], &[]);
        let mut aware = entry("T-5", &["tests/aware.rs"], &["REQ-CLI-00001"]);
        aware.mode = VerificationMode::ImplementationAware;
        aware.control_surfaces = vec!["sync::queue".into()];

        let s = scope();
        assert_eq!(classify_test(&unchanged, &s), Validity::Valid);
        assert_eq!(classify_test(&legacy, &s), Validity::Legacy);
        assert!(matches!(
            classify_test(&revised, &s),
            Validity::Quarantined {
                spans_unchanged: false,
                ..
            }
        ));
        let Validity::Quarantined {
            preserve,
            spans_unchanged,
            reasons,
        } = classify_test(&mixed, &s)
        else {
            panic!("mixed test must be quarantined");
        };
        assert!(spans_unchanged);
        assert_eq!(preserve, vec!["REQ-CLI-00001".to_string()]);
        assert_eq!(
            reasons,
            vec![QuarantineReason::RetiredRequirement {
                requirement_ids: vec!["REQ-CLI-00003".into()]
            }]
        );
        assert!(matches!(
            classify_test(&aware, &s),
            Validity::Quarantined { .. }
        ));
        let mut blind = aware.clone();
        blind.mode = VerificationMode::BlackBox;
        assert_eq!(
            classify_test(&blind, &s),
            Validity::Valid,
            "black-box tests ignore surfaces"
        );
    }

    #[test]
    fn a_file_shared_by_a_valid_and_a_quarantined_test_is_not_valid() {
        let a = entry(
            "T-1",
            &["tests/common.rs", "tests/one.rs"],
            &["REQ-CLI-00001"],
        );
        let b = entry("T-2", &["tests/common.rs"], &["REQ-CLI-00002"]);
        let selection = select_tests(&[a, b], &scope());
        assert_eq!(
            selection.withheld_files(),
            [("tests/common.rs".to_string(), TestWithholding::Quarantined)].into()
        );
        assert_eq!(selection.active_test_ids(), vec!["T-1".to_string()]);
    }

    #[test]
    fn a_file_a_legacy_entry_lists_is_read_only_even_if_a_quarantined_one_lists_it_too() {
        let quarantined = entry("T-1", &["tests/both.rs", "tests/q.rs"], &["REQ-CLI-00002"]);
        let legacy = entry("T-2", &["tests/both.rs"], &[]);
        let valid = entry("T-3", &["tests/ok.rs"], &["REQ-CLI-00001"]);
        let withheld = select_tests(&[legacy, quarantined, valid], &scope()).withheld_files();
        assert_eq!(
            withheld,
            [
                ("tests/both.rs".to_string(), TestWithholding::Legacy),
                ("tests/q.rs".to_string(), TestWithholding::Quarantined),
            ]
            .into()
        );
    }

    #[test]
    fn catalog_parse_reports_line_numbers_and_duplicates() {
        let text =
            "{\"test_id\":\"T-1\",\"verifies\":[\"REQ-A-00001\"]}\n\n{\"test_id\":\"T-1\"}\n";
        assert!(matches!(
            parse_catalog(text),
            Err(CatalogError::DuplicateId { line: 3, .. })
        ));
        assert!(matches!(
            parse_catalog("{\"nope\":1}\n"),
            Err(CatalogError::Line { line: 1, .. })
        ));
        assert_eq!(parse_catalog("{\"test_id\":\"T-1\"}\n").unwrap().len(), 1);
    }
}
