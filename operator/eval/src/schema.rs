//! The result record of the evaluation corpus (`result.schema.json`, `$id
//! protobot://eval/corpus/schema/result/v1`), field for field. Every struct
//! refuses unknown fields, so reading the upstream example results with these
//! types is a check that they describe the schema (see the tests).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The only `schema_version` this crate writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

/// One result record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultRecord {
    /// Always [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// Identifier (`^[a-z][a-z0-9]*(-[a-z0-9]+)*$`).
    pub result_id: String,
    /// The fixture evaluated.
    pub fixture_id: String,
    /// The corpus revision of that fixture.
    pub corpus_revision: String,
    /// The run the record belongs to.
    pub run_id: String,
    /// `YYYY-MM-DDTHH:MM:SSZ`.
    pub recorded_at: String,
    /// Which corpus stage the record scores.
    pub stage: Stage,
    /// Inputs and environment.
    pub reproducibility: Reproducibility,
    /// Stage-attributed scores.
    pub scores: Scores,
    /// Every failure observed (recovered ones included).
    pub failures: Vec<Failure>,
    /// Failures that decide the outcome: any of them forbids `pass: true`.
    pub critical_failures: Vec<Failure>,
    /// Where the run's traces are.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub traces: Vec<Trace>,
}

/// The corpus stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Requirements quality (elicitation).
    Requirements,
    /// Job Site conformance.
    JobSite,
    /// The whole pipeline.
    EndToEnd,
}

/// `reproducibility`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reproducibility {
    /// What was run on.
    pub inputs: Inputs,
    /// Where and with what.
    pub environment: Environment,
}

/// `reproducibility.inputs`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inputs {
    /// The fixture.
    pub fixture_id: String,
    /// Its corpus revision.
    pub corpus_revision: String,
    /// `sha256:` and the hex digest of the fixture file's bytes.
    pub fixture_digest: String,
    /// Which projection of the fixture the stage received.
    pub projection: Projection,
}

/// The fixture projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Projection {
    /// The description only (requirements stage).
    ElicitationInput,
    /// The golden Schematic (Job Site stage).
    JobSiteInput,
    /// End to end.
    EndToEnd,
}

/// `reproducibility.environment`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Environment {
    /// `local` or `hosted`.
    pub mode: Mode,
    /// Whether a hosted cluster was used.
    pub hosted_cluster: bool,
    /// Whether external service credentials were used.
    pub external_service_credentials: bool,
    /// The models per role.
    pub models: Vec<Model>,
    /// The components and their revisions (at least one).
    pub components: Vec<Component>,
}

/// `environment.mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// On one machine.
    Local,
    /// Hosted.
    Hosted,
}

/// A model and the role it played.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// The role.
    pub role: ModelRole,
    /// The model's name.
    pub name: String,
    /// Scalar settings.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, Setting>,
}

/// A scalar setting value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Setting {
    /// A string.
    Text(String),
    /// A flag.
    Flag(bool),
    /// A whole number (kept whole, as written).
    Integer(i64),
    /// A number.
    Number(f64),
    /// `null`.
    Null,
}

/// The model roles of the schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelRole {
    /// Elicitation.
    Elicitation,
    /// Worker A (tests).
    WorkerA,
    /// Worker B (implementation).
    WorkerB,
    /// An Inspector.
    Inspector,
    /// A judge.
    Judge,
}

/// A component and its revision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Component {
    /// Which.
    pub name: ComponentName,
    /// Its revision.
    pub revision: String,
    /// Its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// The component names of the schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ComponentName {
    /// Drafting Table.
    DraftingTable,
    /// Specification Toolkit.
    SpecificationToolkit,
    /// Kits.
    Kits,
    /// ears-manager.
    EarsManager,
    /// The WMS adapter.
    WmsAdapter,
    /// The source-control manager.
    SourceControlManager,
    /// The validation rules.
    ValidationRules,
    /// The Job Site.
    JobSite,
    /// The evaluation runner.
    EvalRunner,
}

/// `scores`: only the stage's own part (the schema gates them by stage).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scores {
    /// Requirements quality.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requirements: Option<RequirementsScores>,
    /// Job Site conformance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_site: Option<JobSiteScores>,
    /// End to end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_to_end: Option<EndToEndScores>,
}

/// `scores.requirements` (read from the examples; this crate never writes it:
/// the Job Site starts from the golden requirements).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequirementsScores {
    /// Pass.
    pub pass: bool,
    /// Summary.
    pub summary: String,
    /// Metrics in [0, 1].
    pub metrics: RequirementsMetrics,
    /// Per requirement.
    pub per_requirement: Vec<PerRequirement>,
}

/// Requirements metrics.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequirementsMetrics {
    /// Coverage.
    pub coverage: f64,
    /// Applicability.
    pub applicability: f64,
    /// Implementability.
    pub implementability: f64,
}

/// One requirement's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PerRequirement {
    /// Requirement id.
    pub id: String,
    /// `covered`, `missing`, …
    pub outcome: String,
    /// Evidence.
    pub evidence: String,
}

/// `scores.job_site`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSiteScores {
    /// Pass.
    pub pass: bool,
    /// What was scored, in words.
    pub summary: String,
    /// Worker-visible checks.
    pub visible_checks: CheckCounts,
    /// Evaluator-only (holdout) checks.
    pub holdout_checks: CheckCounts,
}

/// Check counts (`passed + failed == total`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckCounts {
    /// Passed.
    pub passed: u32,
    /// Failed.
    pub failed: u32,
    /// Run.
    pub total: u32,
}

impl CheckCounts {
    /// Counts of `outcomes` (`true` = passed).
    pub fn of(outcomes: impl IntoIterator<Item = bool>) -> CheckCounts {
        let mut c = CheckCounts::default();
        for passed in outcomes {
            if passed {
                c.passed += 1;
            } else {
                c.failed += 1;
            }
            c.total += 1;
        }
        c
    }
}

/// `scores.end_to_end` (read from the examples only).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndToEndScores {
    /// Pass.
    pub pass: bool,
    /// Summary.
    pub summary: String,
    /// Restates the stage passes.
    pub attribution: Attribution,
}

/// `end_to_end.attribution`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attribution {
    /// The requirements stage passed.
    pub requirements: bool,
    /// The Job Site stage passed.
    pub job_site: bool,
}

/// One failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failure {
    /// The category.
    pub category: FailureCategory,
    /// The corpus stage it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
    /// What failed (names the Job Site stage: `worker-b: …`).
    pub detail: String,
    /// Where the evidence is.
    pub evidence: String,
}

/// The failure categories of the schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureCategory {
    /// Requirements missing.
    MissingRequirements,
    /// Requirements added without support.
    UnsupportedAdditions,
    /// Declared ready while it is not.
    FalseReadiness,
    /// Implementation details leaked into requirements.
    ImplementationLeakage,
    /// A worker-visible check failed.
    VisibleCheckFailure,
    /// A holdout check failed.
    HoldoutCheckFailure,
    /// The run itself failed.
    ExecutionFailure,
}

/// A trace reference.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trace {
    /// `elicitation`, `job-site`, `end-to-end`, `judge`.
    pub kind: TraceKind,
    /// Where it is (relative to the record's folder for the ones this crate writes).
    pub uri: String,
    /// `sha256:` and the hex digest of its bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// Trace kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceKind {
    /// Elicitation.
    Elicitation,
    /// Job Site.
    JobSite,
    /// End to end.
    EndToEnd,
    /// Judge.
    Judge,
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Whether `id` matches the schema's identifier pattern
/// `^[a-z][a-z0-9]*(-[a-z0-9]+)*$`.
pub fn is_identifier(id: &str) -> bool {
    let mut parts = id.split('-');
    let Some(first) = parts.next() else {
        return false;
    };
    let lower_alnum = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    first.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && lower_alnum(first)
        && parts.all(lower_alnum)
}

/// `s` folded into the identifier alphabet: lower-case, every run of other
/// characters one `-`, no leading or trailing `-`, a leading `r` when it would
/// start with a digit; `x` when nothing is left.
pub fn identifier_part(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() {
        return "x".into();
    }
    if out.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
        out.insert(0, 'r');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_follow_the_schema_pattern() {
        for ok in ["cli-sync", "a", "job-site-cli-sync-local", "a1-2b"] {
            assert!(is_identifier(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "a--b", "A", "1a", "a_b", "cli-Sync"] {
            assert!(!is_identifier(bad), "{bad}");
        }
        for raw in [
            "WI-CS-00001",
            "demo 2026-12-02T10:00:00Z",
            "--",
            "9lives",
            "é",
        ] {
            let id = identifier_part(raw);
            assert!(is_identifier(&id), "{raw} -> {id}");
        }
        assert_eq!(identifier_part("WI-CS-00001"), "wi-cs-00001");
    }

    #[test]
    fn counts_add_up() {
        let c = CheckCounts::of([true, false, true]);
        assert_eq!((c.passed, c.failed, c.total), (2, 1, 3));
        assert_eq!(CheckCounts::of([]), CheckCounts::default());
    }
}
