//! A corpus fixture (`fixture.schema.json` v1), the parts a Job Site
//! evaluation reads: identity, requirements, interface runtimes, the
//! worker-visible reference checks and the holdout assets it lists. Parsed
//! from the file's bytes, whose sha256 is the records' `fixture_digest`.
//!
//! [`plan`] decides whether this Job Site can run a fixture end to end: only
//! a fixture whose requirements are exactly those of a bundled example
//! project (today `cli-sync`), because the Job Site needs a project, a
//! specification store and Worker harnesses for it; anything else gets a
//! structured refusal that names why.

use serde::Deserialize;

use crate::schema::{is_identifier, sha256_digest};

/// The fixture, as read.
#[derive(Clone, Debug, PartialEq)]
pub struct Fixture {
    /// `fixture_id`.
    pub id: String,
    /// `corpus_revision`.
    pub corpus_revision: String,
    /// `archetype` (`cli`, `network-service`, `web-gui`).
    pub archetype: String,
    /// `sha256:<hex>` of the file's bytes.
    pub digest: String,
    /// The golden requirements.
    pub requirements: Vec<Requirement>,
    /// How each interface runs.
    pub interface_runtime: Vec<InterfaceRuntime>,
    /// Worker-visible reference behaviour checks.
    pub visible_checks: Vec<VisibleCheck>,
    /// Holdout assets the fixture lists (their files are evaluator-only and
    /// not part of the shared corpus).
    pub holdout_assets: Vec<HoldoutAsset>,
}

/// One requirement.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Requirement {
    /// `REQ-…`.
    pub id: String,
    /// EARS type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its text.
    pub text: String,
}

/// One interface runtime.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct InterfaceRuntime {
    /// The interface.
    pub interface_id: String,
    /// `local-process`, `local-http`, `local-web`.
    pub runtime: String,
    /// The entry point, when given.
    #[serde(default)]
    pub entry: Option<String>,
}

/// One worker-visible check.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct VisibleCheck {
    /// `VIS-…`.
    pub id: String,
    /// The requirements it checks.
    pub requirement_ids: Vec<String>,
    /// What it checks.
    pub description: String,
}

/// One holdout asset.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct HoldoutAsset {
    /// `HO-…`.
    pub id: String,
    /// Its path under the fixture's folder.
    pub path: String,
}

#[derive(Deserialize)]
struct Raw {
    schema_version: u32,
    fixture_id: String,
    corpus_revision: String,
    archetype: String,
    visible: RawVisible,
    #[serde(default)]
    holdout: Option<RawHoldout>,
}

#[derive(Deserialize)]
struct RawVisible {
    requirements: Vec<Requirement>,
    interface_runtime: Vec<InterfaceRuntime>,
    #[serde(default)]
    reference_behavior_checks: Vec<VisibleCheck>,
}

#[derive(Deserialize)]
struct RawHoldout {
    #[serde(default)]
    assets: Vec<HoldoutAsset>,
}

/// Why a fixture could not be read or run.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    /// Not a fixture document.
    #[error(
        "failed to read the fixture {origin}: {source}; expected a fixture.yaml of the evaluation corpus (fixture.schema.json v1)"
    )]
    Parse {
        /// Where it came from.
        origin: String,
        /// Why.
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// A newer schema.
    #[error("the fixture {origin} has schema_version {found}; this protobot reads version 1 only")]
    SchemaVersion {
        /// Where it came from.
        origin: String,
        /// What it says.
        found: u32,
    },
    /// An id outside the pattern.
    #[error(
        "the fixture {origin} has fixture_id {id:?}, which is not an identifier (^[a-z][a-z0-9]*(-[a-z0-9]+)*$)"
    )]
    Identifier {
        /// Where it came from.
        origin: String,
        /// The id.
        id: String,
    },
}

impl FixtureError {
    /// A stable label for the kind of error.
    pub fn category(&self) -> &'static str {
        match self {
            FixtureError::Parse { .. } => "fixture-unreadable",
            FixtureError::SchemaVersion { .. } => "fixture-schema-version",
            FixtureError::Identifier { .. } => "fixture-id",
        }
    }
}

impl Fixture {
    /// Parses `bytes` (YAML) read from `origin`.
    pub fn parse(bytes: &[u8], origin: &str) -> Result<Fixture, FixtureError> {
        let raw: Raw = serde_yaml_ng::from_slice(bytes).map_err(|source| FixtureError::Parse {
            origin: origin.to_owned(),
            source,
        })?;
        if raw.schema_version != 1 {
            return Err(FixtureError::SchemaVersion {
                origin: origin.to_owned(),
                found: raw.schema_version,
            });
        }
        if !is_identifier(&raw.fixture_id) {
            return Err(FixtureError::Identifier {
                origin: origin.to_owned(),
                id: raw.fixture_id,
            });
        }
        Ok(Fixture {
            id: raw.fixture_id,
            corpus_revision: raw.corpus_revision,
            archetype: raw.archetype,
            digest: sha256_digest(bytes),
            requirements: raw.visible.requirements,
            interface_runtime: raw.visible.interface_runtime,
            visible_checks: raw.visible.reference_behavior_checks,
            holdout_assets: raw.holdout.map(|h| h.assets).unwrap_or_default(),
        })
    }
}

/// A requirement of a bundled example project: what the Job Site can build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExampleRequirement<'a> {
    /// Id.
    pub id: &'a str,
    /// EARS type.
    pub kind: &'a str,
    /// Text.
    pub text: &'a str,
}

/// Why this Job Site cannot run a fixture end to end.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unrunnable {
    /// No bundled example project for the fixture.
    #[error(
        "protobot eval can run fixture {fixture} only with a bundled example project for it, and it has one for {known} only: the Job Site needs the fixture's project, its approved change set and Worker harnesses that can build a {archetype} ({runtime}) interface"
    )]
    NoExample {
        /// The fixture.
        fixture: String,
        /// Its archetype.
        archetype: String,
        /// Its runtimes.
        runtime: String,
        /// The fixtures that can run.
        known: String,
    },
    /// The example exists but its requirements differ from the fixture's.
    #[error(
        "fixture {fixture} does not match the bundled example of the same id: {difference}; the example builds the requirements it was authored with, so results would not describe this fixture"
    )]
    Mismatch {
        /// The fixture.
        fixture: String,
        /// What differs.
        difference: String,
    },
}

impl Unrunnable {
    /// A stable label.
    pub fn category(&self) -> &'static str {
        match self {
            Unrunnable::NoExample { .. } => "no-example-project",
            Unrunnable::Mismatch { .. } => "example-mismatch",
        }
    }
}

/// Whether `fixture` can run end to end with the bundled example `example_id`
/// whose requirements are `example`: same id, same requirements (id, type and
/// text, whitespace folded as YAML's `>-` folds it).
pub fn plan(
    fixture: &Fixture,
    example_id: &str,
    example: &[ExampleRequirement<'_>],
) -> Result<(), Unrunnable> {
    if fixture.id != example_id {
        return Err(Unrunnable::NoExample {
            fixture: fixture.id.clone(),
            archetype: fixture.archetype.clone(),
            runtime: fixture
                .interface_runtime
                .iter()
                .map(|r| r.runtime.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            known: example_id.to_owned(),
        });
    }
    let fold = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mismatch = |difference: String| Unrunnable::Mismatch {
        fixture: fixture.id.clone(),
        difference,
    };
    if fixture.requirements.len() != example.len() {
        return Err(mismatch(format!(
            "{} requirements in the fixture, {} in the example",
            fixture.requirements.len(),
            example.len()
        )));
    }
    for (f, e) in fixture.requirements.iter().zip(example) {
        if f.id != e.id {
            return Err(mismatch(format!(
                "requirement {} where the example has {}",
                f.id, e.id
            )));
        }
        if f.kind != e.kind {
            return Err(mismatch(format!(
                "{} is {} in the fixture, {} in the example",
                f.id, f.kind, e.kind
            )));
        }
        if fold(&f.text) != fold(e.text) {
            return Err(mismatch(format!("the text of {} differs", f.id)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = "schema_version: 1\nfixture_id: tiny\ncorpus_revision: v1\narchetype: cli\ntitle: t\nvisible:\n  requirements:\n    - id: REQ-T-00001\n      type: ubiquitous\n      text: >-\n        The tool shall\n        work.\n  interface_runtime:\n    - interface_id: t\n      type: cli\n      runtime: local-process\n  reference_behavior_checks: []\nholdout:\n  assets: []\n";

    #[test]
    fn a_fixture_parses_with_its_digest() {
        let f = Fixture::parse(FIXTURE.as_bytes(), "tiny.yaml").unwrap();
        assert_eq!(f.id, "tiny");
        assert_eq!(f.requirements[0].text, "The tool shall work.");
        assert_eq!(f.digest, sha256_digest(FIXTURE.as_bytes()));
        let example = [ExampleRequirement {
            id: "REQ-T-00001",
            kind: "ubiquitous",
            text: "The tool  shall work.",
        }];
        assert_eq!(plan(&f, "tiny", &example), Ok(()));
        let other = [ExampleRequirement {
            text: "The tool shall fail.",
            ..example[0]
        }];
        assert_eq!(
            plan(&f, "tiny", &other).unwrap_err().category(),
            "example-mismatch"
        );
        let refused = plan(&f, "cli-sync", &example).unwrap_err();
        assert_eq!(refused.category(), "no-example-project");
        assert!(refused.to_string().contains("cli-sync"), "{refused}");
    }

    #[test]
    fn bad_fixtures_are_refused_with_what_is_wrong() {
        let e = Fixture::parse(b"fixture_id: [", "x.yaml").unwrap_err();
        assert_eq!(e.category(), "fixture-unreadable");
        let v2 = FIXTURE.replace("schema_version: 1", "schema_version: 2");
        assert_eq!(
            Fixture::parse(v2.as_bytes(), "x").unwrap_err().category(),
            "fixture-schema-version"
        );
        let id = FIXTURE.replace("fixture_id: tiny", "fixture_id: Tiny_1");
        assert_eq!(
            Fixture::parse(id.as_bytes(), "x").unwrap_err().category(),
            "fixture-id"
        );
    }
}
