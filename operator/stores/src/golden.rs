//! The upstream drafting-table WMS golden fixture
//! (`tests/fixtures/upstream/drafting-table-wms-golden.jsonl`): its digest
//! check, the seeds the replay procedure needs (contracts/lifecycle.md §19),
//! each operation line as an envelope and the comparison of an answer with the
//! line's expected result. Shared by the library replay
//! (`operator/stores/tests/golden_wms.rs`) and the binary replays
//! (`protobot wms`), so every replay seeds and compares alike.
//!
//! Pure: parsing and comparison only; [`Fixture::seed`] writes through the
//! [`WorkStore`] port. Nothing here panics on a malformed fixture: every
//! failure names the line and the field.
//!
//! Seeds the fixture does not carry but the upstream test assumes: `wi-001`'s
//! block reason `undefined-behavior` and change set `CS-00001` (`proposed`, no
//! build item). One documented upgrade: the fixture predates change-set binding
//! of approvals (§19 "known staleness", §20.1); resolve-block approvals for
//! kinds that name a change set are bound to the only seeded change set,
//! `CS-00001`, exactly as the procedure fills the missing `project_id`.

use std::collections::BTreeMap;

use jiff::Timestamp;
use protobot_lifecycle::{
    ApprovalRecord, AuthorizationContext, Dependency, OperationEnvelope, Readiness, State,
    WorkItemRecord,
};
use serde_json::Value;

use crate::{AdapterConfig, ChangeSetRecord, Import, StoreError, WorkStore};

/// The fixture's file name in `tests/fixtures/upstream/`.
pub const FIXTURE: &str = "drafting-table-wms-golden.jsonl";

/// The only change set the replay seeds.
pub const CHANGE_SET: &str = "CS-00001";

/// Why the fixture cannot be replayed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GoldenError {
    /// `SOURCES` does not list the file.
    #[error("tests/fixtures/upstream/SOURCES lists no digest for {0}; add its provenance line")]
    NotListed(String),
    /// The bytes differ from the recorded upstream bytes.
    #[error(
        "{file} differs from the upstream bytes SOURCES records (sha256 {actual}, listed {listed}): restore it from the listed commit"
    )]
    Digest {
        /// The file.
        file: String,
        /// The digest of the bytes at hand.
        actual: String,
        /// The digest `SOURCES` records.
        listed: String,
    },
    /// A line is not what the replay procedure expects.
    #[error("fixture line {line}: {reason}")]
    Malformed {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

/// The SHA-256 `SOURCES` lists for `file` (`file | repository | commit | path | sha256`).
pub fn listed_sha256(sources: &str, file: &str) -> Option<String> {
    sources
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| l.split(" | ").map(str::trim).collect::<Vec<_>>())
        .find(|f| f.len() == 5 && f[0] == file)
        .map(|f| f[4].to_owned())
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// Checks `bytes` of `file` against the digest `sources` (the text of `SOURCES`) records.
pub fn verify_digest(sources: &str, file: &str, bytes: &[u8]) -> Result<(), GoldenError> {
    let listed = listed_sha256(sources, file).ok_or_else(|| GoldenError::NotListed(file.into()))?;
    let actual = sha256_hex(bytes);
    if actual == listed {
        Ok(())
    } else {
        Err(GoldenError::Digest {
            file: file.into(),
            actual,
            listed,
        })
    }
}

/// One operation record of the fixture (line 5 onwards).
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// 1-based line number.
    pub line: usize,
    /// The line's `step` name.
    pub step: String,
    /// The envelope to send (`None` for a session-local step or a line without a result).
    pub envelope: Option<OperationEnvelope>,
    /// The expected result subset (`None`: nothing to compare).
    pub expected: Option<Value>,
    /// The line as written.
    pub raw: Value,
}

/// The parsed fixture.
#[derive(Clone, Debug)]
pub struct Fixture {
    /// The project (`fixture-project`).
    pub project_id: String,
    /// The fixed evaluation time of line 2.
    pub now: Timestamp,
    /// The fake Gate's trusted contexts by actor reference, `project_id` filled in.
    pub contexts: BTreeMap<String, AuthorizationContext>,
    /// Every line, parsed.
    pub lines: Vec<Value>,
}

fn malformed(line: usize, reason: impl Into<String>) -> GoldenError {
    GoldenError::Malformed {
        line,
        reason: reason.into(),
    }
}

fn str_field<'a>(v: &'a Value, line: usize, field: &str) -> Result<&'a str, GoldenError> {
    v.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| malformed(line, format!("`{field}` is not a string")))
}

fn object<'a>(
    v: &'a Value,
    line: usize,
    field: &str,
) -> Result<&'a serde_json::Map<String, Value>, GoldenError> {
    v.get(field)
        .and_then(Value::as_object)
        .ok_or_else(|| malformed(line, format!("`{field}` is not an object")))
}

impl Fixture {
    /// Parses the fixture's bytes (one JSON value per non-empty line).
    pub fn parse(bytes: &[u8]) -> Result<Fixture, GoldenError> {
        let text = std::str::from_utf8(bytes).map_err(|e| malformed(0, e.to_string()))?;
        let lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| serde_json::from_str(l).map_err(|e| malformed(i + 1, e.to_string())))
            .collect::<Result<Vec<Value>, _>>()?;
        let base = lines.first().ok_or_else(|| malformed(1, "no base state"))?;
        let approvals = lines
            .get(1)
            .ok_or_else(|| malformed(2, "no approval-validation state"))?;
        if base.get("step") != Some(&Value::from("base-state")) {
            return Err(malformed(1, "the first line is not `base-state`"));
        }
        if approvals.get("step") != Some(&Value::from("approval-validation-state")) {
            return Err(malformed(
                2,
                "the second line is not `approval-validation-state`",
            ));
        }
        let project_id = str_field(base, 1, "project_id")?.to_string();
        let now: Timestamp = str_field(approvals, 2, "evaluation_time")?
            .parse()
            .map_err(|e: jiff::Error| malformed(2, format!("`evaluation_time`: {e}")))?;
        let mut contexts = BTreeMap::new();
        for (actor, c) in object(base, 1, "fake_gate_contexts")? {
            let mut ctx: AuthorizationContext = serde_json::from_value(c.clone())
                .map_err(|e| malformed(1, format!("context {actor}: {e}")))?;
            ctx.project_id = project_id.clone();
            contexts.insert(actor.clone(), ctx);
        }
        Ok(Fixture {
            project_id,
            now,
            contexts,
            lines,
        })
    }

    /// The adapter settings of the replay: the Materializer is the subject of
    /// the `materializer` context; leases last 15 minutes.
    pub fn adapter_config(&self) -> AdapterConfig {
        AdapterConfig {
            materializer_subject: self
                .contexts
                .get("materializer")
                .map(|c| c.subject.clone())
                .unwrap_or_else(|| "materializer".into()),
            lease_seconds: 900,
        }
    }

    /// The trusted imports of §19 step 2, in order: approvals of line 2, work
    /// items of line 1 (dependency states from the seeded items, `wi-001`
    /// blocked on `undefined-behavior`), change set `CS-00001`.
    pub fn imports(&self) -> Result<Vec<Import>, GoldenError> {
        let base = self
            .lines
            .first()
            .ok_or_else(|| malformed(1, "no base state"))?;
        let approvals_line = self
            .lines
            .get(1)
            .ok_or_else(|| malformed(2, "no approval-validation state"))?;
        let project = self.project_id.as_str();
        let mut out = Vec::new();
        for (id, a) in object(approvals_line, 2, "approval_records")? {
            let mut approval: ApprovalRecord = serde_json::from_value(a.clone())
                .map_err(|e| malformed(2, format!("approval {id}: {e}")))?;
            approval.id = id.clone();
            approval
                .project_id
                .get_or_insert_with(|| project.to_string());
            let names_change_set = matches!(
                approval.resolution_kind.as_deref(),
                Some("add-requirement" | "impact-amendment")
            );
            if approval.action == "resolve-block"
                && names_change_set
                && approval.change_set_id.is_none()
            {
                approval.change_set_id = Some(CHANGE_SET.to_string());
            }
            out.push(Import::Approval(approval));
        }
        let items = base
            .get("work_items")
            .and_then(Value::as_array)
            .ok_or_else(|| malformed(1, "`work_items` is not an array"))?;
        let mut seeded: BTreeMap<String, State> = BTreeMap::new();
        for w in items {
            let id = str_field(w, 1, "id")?;
            let state = State::parse(str_field(w, 1, "state")?)
                .ok_or_else(|| malformed(1, format!("work item {id}: unknown state")))?;
            seeded.insert(id.to_string(), state);
        }
        for w in items {
            let id = str_field(w, 1, "id")?;
            let version = w
                .get("contract_version")
                .and_then(Value::as_u64)
                .ok_or_else(|| malformed(1, format!("work item {id}: no contract_version")))?;
            let state = seeded.get(id).copied().unwrap_or(State::Waiting);
            let mut record = WorkItemRecord::new(id, project, state, version);
            record.readiness = Readiness::default();
            let deps = w
                .get("dependencies")
                .and_then(Value::as_array)
                .ok_or_else(|| malformed(1, format!("work item {id}: no dependencies")))?;
            for d in deps {
                let d = d.as_str().ok_or_else(|| {
                    malformed(1, format!("work item {id}: a dependency is not a string"))
                })?;
                record.dependencies.push(Dependency {
                    state: seeded.get(d).copied().unwrap_or(State::Waiting),
                    id: d.to_string(),
                });
            }
            if id == "wi-001" {
                record.block_reason = "undefined-behavior".to_string();
            }
            out.push(Import::Record(record));
        }
        out.push(Import::ChangeSet(ChangeSetRecord {
            id: CHANGE_SET.into(),
            revision: "proposed".into(),
            ..ChangeSetRecord::default()
        }));
        Ok(out)
    }

    /// Seeds `store` with [`Fixture::imports`].
    pub async fn seed<S: WorkStore>(&self, store: &S) -> Result<(), SeedError> {
        for import in self.imports()? {
            store.import(import).await?;
        }
        Ok(())
    }

    /// The operation records (line 5 onwards) with the envelope each sends:
    /// exactly the fields the procedure lists, nothing else.
    pub fn steps(&self) -> Result<Vec<Step>, GoldenError> {
        let mut out = Vec::new();
        for (i, line) in self.lines.iter().enumerate().skip(4) {
            let n = i + 1;
            let step = str_field(line, n, "step")?.to_string();
            let session_local = line.get("adapter_call") == Some(&Value::Bool(false));
            if session_local && !line["operation"].is_null() {
                return Err(malformed(n, "a session-local step names an operation"));
            }
            let expected = if session_local {
                None
            } else {
                line.get("result").cloned()
            };
            let envelope = expected.as_ref().map(|_| envelope_of(line));
            out.push(Step {
                line: n,
                step,
                envelope,
                expected,
                raw: line.clone(),
            });
        }
        Ok(out)
    }
}

/// Why seeding failed.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// The fixture is malformed.
    #[error(transparent)]
    Fixture(#[from] GoldenError),
    /// The store refused an import.
    #[error("failed to seed the work store: {0}")]
    Store(#[from] StoreError),
}

/// The envelope of one operation line.
fn envelope_of(line: &Value) -> OperationEnvelope {
    let text = |key: &str| {
        line.get(key)
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_default()
    };
    OperationEnvelope {
        operation: text("operation"),
        actor_context_ref: text("actor_context_ref"),
        request_id: text("request_id"),
        work_item_id: text("work_item_id"),
        human_approval_id: text("human_approval_id"),
        idempotency_key: text("idempotency_key"),
        expected_request_revision: line
            .get("expected_request_revision")
            .and_then(Value::as_u64),
        expected_state: line
            .get("expected_state")
            .and_then(Value::as_str)
            .map(str::to_string),
        expected_contract_version: line
            .get("expected_contract_version")
            .and_then(Value::as_u64),
        payload: line.get("payload").cloned(),
        ..OperationEnvelope::default()
    }
}

/// Compares an answer (`actual`, the result envelope as JSON) with a line's
/// expected subset (§19 step 4): `ok`, `outcome`, `mutation`, `error.code`,
/// the nested preflight decision, every non-empty expected field and `items`.
/// Returns every difference, each naming the step and the field.
pub fn compare(step: &str, expected: &Value, actual: &Value) -> Result<(), Vec<String>> {
    const FIELDS: [&str; 15] = [
        "request_id",
        "request_revision",
        "approval_status",
        "audit_event",
        "linked_change_set_priority",
        "linked_work_item_priority",
        "submission",
        "resolution_submission_id",
        "resolution_submission_revision",
        "prior_resolution_submission_id",
        "prior_submission_status",
        "prior_approval_status",
        "work_item_state",
        "contract_version",
        "planned_dependency",
    ];
    let mut diffs = Vec::new();
    let mut same = |what: &str, want: &Value, got: &Value| {
        if want != got {
            diffs.push(format!("{step}: {what}: expected {want}, got {got}"));
        }
    };
    for key in ["ok", "outcome", "mutation"] {
        same(key, &expected[key], &actual[key]);
    }
    same(
        "error.code",
        &expected["error"]["code"],
        &actual["error"]["code"],
    );
    if let Some(d) = expected.get("decision") {
        for key in ["outcome", "authority", "operation", "rule_version"] {
            same(
                &format!("decision.{key}"),
                &d[key],
                &actual["decision"][key],
            );
        }
        same(
            "decision.rejection.code",
            &d["rejection"]["code"],
            &actual["decision"]["rejection"]["code"],
        );
    }
    for f in FIELDS {
        let want = &expected[f];
        let empty = want.is_null() || want == "" || want == 0;
        if !empty {
            same(f, want, &actual[f]);
        }
    }
    if let Some(link) = expected.get("link") {
        same("link", link, &actual["link"]);
    }
    if let Some(items) = expected.get("items").and_then(Value::as_array) {
        match actual["items"].as_array() {
            None => diffs.push(format!("{step}: no items in {actual}")),
            Some(got) => {
                if got.len() != items.len() {
                    diffs.push(format!(
                        "{step}: item count: expected {}, got {}",
                        items.len(),
                        got.len()
                    ));
                }
                for (w, g) in items.iter().zip(got) {
                    for key in [
                        "id",
                        "state",
                        "contract_version",
                        "dependencies",
                        "reason_kind",
                        "resolution_options",
                    ] {
                        if let Some(v) = w.get(key)
                            && &g[key] != v
                        {
                            diffs
                                .push(format!("{step}: items.{key}: expected {v}, got {}", g[key]));
                        }
                    }
                }
            }
        }
    }
    if diffs.is_empty() { Ok(()) } else { Err(diffs) }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_digest_mismatch_and_an_unlisted_file_are_refused() {
        let sources = format!("x.jsonl | r | c | p | {}\n", sha256_hex(b"abc"));
        assert_eq!(verify_digest(&sources, "x.jsonl", b"abc"), Ok(()));
        assert!(matches!(
            verify_digest(&sources, "x.jsonl", b"abd"),
            Err(GoldenError::Digest { .. })
        ));
        assert!(matches!(
            verify_digest(&sources, "y.jsonl", b"abc"),
            Err(GoldenError::NotListed(_))
        ));
    }

    #[test]
    fn a_malformed_fixture_names_its_line_instead_of_panicking() {
        assert!(matches!(
            Fixture::parse(b"{\"step\":\"base-state\"}\nnot json\n"),
            Err(GoldenError::Malformed { line: 2, .. })
        ));
        assert!(matches!(
            Fixture::parse(b""),
            Err(GoldenError::Malformed { .. })
        ));
    }

    #[test]
    fn compare_reports_each_differing_field() {
        let expected = serde_json::json!({"ok": true, "outcome": "applied", "mutation": "applied", "request_revision": 2});
        let actual = serde_json::json!({"ok": true, "outcome": "applied", "mutation": "applied", "request_revision": 3});
        let diffs = compare("s", &expected, &actual).unwrap_err();
        assert_eq!(diffs.len(), 1);
        assert!(diffs[0].contains("request_revision"), "{diffs:?}");
        let same = serde_json::json!({"ok": true, "outcome": "applied", "mutation": "applied", "request_revision": 2});
        assert_eq!(compare("s", &expected, &same), Ok(()));
    }
}
