//! The feedback sanitizer: the single Worker-facing boundary for baseline,
//! triage and finding-router feedback.
//!
//! A Worker receives only the decided allowlist: outcome, fault class, retry
//! budget, affected requirement IDs, a reason stated in terms of the approved
//! requirement or interface contract, diagnostics for artifacts the recipient
//! owns, and a request to revise its own artifact. Everything else — peer
//! paths, diffs, commits, object IDs, assertions, expected or actual values,
//! stack traces, raw logs, mutation details, raw findings — is removed. A reason
//! that cannot be shown to be safe is replaced by a generic regeneration
//! request. Every redaction is recorded (with a digest of what was removed, not
//! the content), and the raw input, the sanitized output and the redactions are
//! returned together for the evaluation record; only `sanitized` crosses the
//! Worker boundary.

use std::{collections::BTreeSet, sync::LazyLock};

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::triage::{Fault, Side};

/// The generic request used when no safe reason exists.
pub const GENERIC_REQUEST: &str =
    "Revise your artifact so that it satisfies the listed requirements.";

/// Longest reason that may cross the boundary.
pub const MAX_REASON_CHARS: usize = 300;

/// Outcome reported to a Worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FeedbackOutcome {
    /// The cycle passed.
    Pass,
    /// Rework needed.
    Fail,
    /// The item is blocked on a specification decision.
    Blocked,
}

/// Where a diagnostic came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// Building or parsing the artifact (compiler, syntax checker).
    Build,
    /// Running tests: assertions, outputs, traces (never forwarded).
    TestRun,
    /// Mutation campaigns (never forwarded).
    Mutation,
    /// Inspector findings (never forwarded raw).
    Inspection,
}

/// A diagnostic as the integration environment produced it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawDiagnostic {
    /// The artifact it is about.
    pub artifact: String,
    /// Producer.
    pub origin: Origin,
    /// Text.
    pub message: String,
}

/// Everything triage wants to say to one recipient, before sanitization.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawFeedback {
    /// Recipient.
    pub recipient: Side,
    /// Outcome.
    pub outcome: FeedbackOutcome,
    /// Fault classification.
    pub fault: Option<Fault>,
    /// Cycles left.
    pub retry_budget: u32,
    /// Requirement IDs triage mapped the failure to.
    pub requirement_ids: Vec<String>,
    /// Triage's reason.
    pub reason: String,
    /// Diagnostics.
    pub diagnostics: Vec<RawDiagnostic>,
}

/// A diagnostic the recipient may see.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// The recipient's own artifact.
    pub artifact: String,
    /// Text, with foreign paths and object ids removed.
    pub message: String,
}

/// The allowlisted message a Worker receives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SanitizedFeedback {
    /// Recipient.
    pub recipient: Side,
    /// Outcome.
    pub outcome: FeedbackOutcome,
    /// Fault classification.
    pub fault: Option<Fault>,
    /// Cycles left.
    pub retry_budget: u32,
    /// Approved requirement IDs only.
    pub requirement_ids: Vec<String>,
    /// Contract-level reason or the generic request.
    pub reason: String,
    /// Diagnostics on the recipient's own artifacts.
    pub diagnostics: Vec<Diagnostic>,
    /// What the recipient is asked to do.
    pub request: String,
}

/// One recorded redaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redaction {
    /// The field affected.
    pub field: String,
    /// The rule that fired.
    pub rule: String,
    /// SHA-256 of the removed text (for the evaluation record).
    pub removed_digest: String,
}

/// Raw input, sanitized output and every redaction decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SanitizerRecord {
    /// What triage produced.
    pub raw: RawFeedback,
    /// What crosses the boundary.
    pub sanitized: SanitizedFeedback,
    /// Why anything was removed.
    pub redactions: Vec<Redaction>,
}

// Patterns are ASCII-only (`(?-u)`): Worker-facing text is checked byte-wise,
// and the regex crate is built without its Unicode tables.
macro_rules! pattern {
    ($name:ident, $re:literal) => {
        static $name: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new($re).ok());
    };
}

pattern!(
    PATH,
    r"(?-u)[A-Za-z0-9_.\-]*/[A-Za-z0-9_./\-]+|[A-Za-z0-9_\-]+\.(py|rs|go|js|ts|java|c|h|cc|cpp|sh|rb|toml|ya?ml|json|txt|lock)\b"
);
pattern!(OBJECT_ID, r"(?-u)\b[0-9a-fA-F]{7,64}\b");
pattern!(
    ORACLE,
    r"(?i-u)\b(assert\w*|expected|actual|got|returned|returns|traceback|panicked|exception|stack|stdout|stderr|line\s+\d+|diff|commit|mutant|survived)\b"
);
pattern!(CODE, r"`|==|!=|=>|::|->|[{};<>\[\]]");
pattern!(DIGIT, r"[0-9]");

fn hits(re: &LazyLock<Option<Regex>>, text: &str) -> bool {
    // A pattern that failed to compile fails closed: treat the text as unsafe.
    re.as_ref().is_none_or(|r| r.is_match(text))
}

fn digest(text: &str) -> String {
    protobot_lifecycle::fingerprint::digest_value(&serde_json::Value::String(text.to_string()))
}

/// Why a reason is unsafe, or `None` when it is contract-level.
fn unsafe_reason(reason: &str, allowed_ids: &BTreeSet<String>) -> Option<&'static str> {
    if reason.chars().count() > MAX_REASON_CHARS || reason.contains('\n') {
        return Some("reason-too-long-or-multiline");
    }
    if hits(&PATH, reason) {
        return Some("path");
    }
    if hits(&OBJECT_ID, reason) {
        return Some("object-id");
    }
    if hits(&ORACLE, reason) {
        return Some("oracle-or-trace");
    }
    if hits(&CODE, reason) {
        return Some("code");
    }
    // Numbers may be expected or actual values; only requirement IDs may carry digits.
    let mut rest = reason.to_string();
    for id in allowed_ids {
        rest = rest.replace(id.as_str(), "");
    }
    if hits(&DIGIT, &rest) {
        return Some("value");
    }
    None
}

/// Builds one recipient's message from the allowlist.
///
/// `approved_ids` are the requirement IDs of the work item's contract;
/// `owned` says whether an artifact path belongs to the recipient's role.
pub fn sanitize(
    raw: &RawFeedback,
    approved_ids: &BTreeSet<String>,
    owned: &dyn Fn(&str) -> bool,
) -> SanitizerRecord {
    let mut redactions = Vec::new();
    let mut redact = |field: &str, rule: &str, removed: &str| {
        redactions.push(Redaction {
            field: field.into(),
            rule: rule.into(),
            removed_digest: digest(removed),
        });
    };
    let mut ids: Vec<String> = Vec::new();
    for id in &raw.requirement_ids {
        if approved_ids.contains(id) {
            if !ids.contains(id) {
                ids.push(id.clone());
            }
        } else {
            redact("requirement_ids", "not-an-approved-requirement", id);
        }
    }
    ids.sort();
    let reason = match unsafe_reason(&raw.reason, approved_ids) {
        None if !raw.reason.trim().is_empty() => raw.reason.trim().to_string(),
        None => GENERIC_REQUEST.to_string(),
        Some(rule) => {
            redact("reason", rule, &raw.reason);
            GENERIC_REQUEST.to_string()
        }
    };
    let mut diagnostics = Vec::new();
    for d in &raw.diagnostics {
        if d.origin != Origin::Build {
            redact("diagnostics", "not-a-build-diagnostic", &d.message);
            continue;
        }
        if !owned(&d.artifact) {
            redact("diagnostics", "peer-artifact", &d.artifact);
            continue;
        }
        // Own build diagnostics may quote the recipient's own files, nothing else.
        let mut kept = Vec::new();
        for line in d.message.lines() {
            let foreign_path = PATH
                .as_ref()
                .is_none_or(|re| re.find_iter(line).any(|m| !owned(m.as_str())));
            if foreign_path || hits(&OBJECT_ID, line) {
                redact(
                    "diagnostics.message",
                    if foreign_path {
                        "foreign-path"
                    } else {
                        "object-id"
                    },
                    line,
                );
            } else {
                kept.push(line);
            }
        }
        if !kept.is_empty() {
            diagnostics.push(Diagnostic {
                artifact: d.artifact.clone(),
                message: kept.join("\n"),
            });
        }
    }
    let request = match raw.outcome {
        FeedbackOutcome::Pass => "No change needed.".to_string(),
        FeedbackOutcome::Blocked => {
            "Stop: the work item is waiting on a specification decision.".to_string()
        }
        FeedbackOutcome::Fail => match raw.recipient {
            Side::Tests => "Revise your tests for the listed requirements.".to_string(),
            Side::Implementation => {
                "Revise your implementation for the listed requirements.".to_string()
            }
        },
    };
    let sanitized = SanitizedFeedback {
        recipient: raw.recipient,
        outcome: raw.outcome,
        fault: raw.fault,
        retry_budget: raw.retry_budget,
        requirement_ids: ids,
        reason,
        diagnostics,
        request,
    };
    SanitizerRecord {
        raw: raw.clone(),
        sanitized,
        redactions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approved() -> BTreeSet<String> {
        ["REQ-SYNC-001", "REQ-SYNC-002"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn raw(recipient: Side, reason: &str, diagnostics: Vec<RawDiagnostic>) -> RawFeedback {
        RawFeedback {
            recipient,
            outcome: FeedbackOutcome::Fail,
            fault: Some(Fault::Implementation),
            retry_budget: 2,
            requirement_ids: vec![
                "REQ-SYNC-002".into(),
                "REQ-SYNC-001".into(),
                "REQ-SECRET-9".into(),
            ],
            reason: reason.into(),
            diagnostics,
        }
    }

    fn impl_owned(path: &str) -> bool {
        path.starts_with("src/")
    }

    #[test]
    fn every_pattern_compiles() {
        for p in [&PATH, &OBJECT_ID, &ORACLE, &CODE, &DIGIT] {
            assert!(
                p.is_some(),
                "a sanitizer pattern failed to compile (it would fail closed)"
            );
        }
    }

    #[test]
    fn a_contract_level_reason_passes_unchanged() {
        let r = sanitize(
            &raw(
                Side::Implementation,
                "The sync command must skip unchanged files per REQ-SYNC-001.",
                vec![],
            ),
            &approved(),
            &impl_owned,
        );
        assert_eq!(
            r.sanitized.reason,
            "The sync command must skip unchanged files per REQ-SYNC-001."
        );
        assert_eq!(
            r.sanitized.requirement_ids,
            ["REQ-SYNC-001", "REQ-SYNC-002"]
        );
        assert_eq!(r.redactions.len(), 1, "only the unapproved id");
        assert_eq!(r.redactions[0].rule, "not-an-approved-requirement");
    }

    #[test]
    fn oracle_details_paths_hashes_and_values_are_replaced_by_the_generic_request() {
        for (reason, rule) in [
            (
                "assertion failed: expected 3 files, got 2",
                "oracle-or-trace",
            ),
            ("see tests/test_sync.py for details", "path"),
            (
                "introduced in 9fceb02d0ae598e95dc970b74767f19372d61af8",
                "object-id",
            ),
            ("the function returns the wrong count", "oracle-or-trace"),
            ("copy must equal `dst`", "code"),
            ("must copy 42 files", "value"),
        ] {
            let r = sanitize(
                &raw(Side::Implementation, reason, vec![]),
                &approved(),
                &impl_owned,
            );
            assert_eq!(r.sanitized.reason, GENERIC_REQUEST, "{reason}");
            assert!(
                r.redactions
                    .iter()
                    .any(|x| x.field == "reason" && x.rule == rule),
                "{reason}: {:?}",
                r.redactions
            );
            let serialized = serde_json::to_string(&r.sanitized).unwrap();
            assert!(!serialized.contains(reason), "the raw reason never crosses");
        }
    }

    #[test]
    fn only_own_build_diagnostics_cross_and_foreign_paths_are_cut() {
        let diags = vec![
            RawDiagnostic {
                artifact: "src/sync.py".into(),
                origin: Origin::Build,
                message:
                    "src/sync.py:3: SyntaxError: invalid syntax\nimported from tests/test_sync.py"
                        .into(),
            },
            RawDiagnostic {
                artifact: "tests/test_sync.py".into(),
                origin: Origin::Build,
                message: "NameError in test".into(),
            },
            RawDiagnostic {
                artifact: "src/sync.py".into(),
                origin: Origin::TestRun,
                message: "AssertionError: 2 != 3".into(),
            },
        ];
        let r = sanitize(
            &raw(Side::Implementation, "", diags),
            &approved(),
            &impl_owned,
        );
        assert_eq!(
            r.sanitized.diagnostics,
            vec![Diagnostic {
                artifact: "src/sync.py".into(),
                message: "src/sync.py:3: SyntaxError: invalid syntax".into()
            }]
        );
        let rules: Vec<&str> = r.redactions.iter().map(|x| x.rule.as_str()).collect();
        assert!(
            rules.contains(&"foreign-path")
                && rules.contains(&"peer-artifact")
                && rules.contains(&"not-a-build-diagnostic"),
            "{rules:?}"
        );
        let serialized = serde_json::to_string(&r.sanitized).unwrap();
        assert!(!serialized.contains("tests/") && !serialized.contains("AssertionError"));
    }

    #[test]
    fn redactions_record_digests_not_content() {
        let secret = "expected 'hunter2' in output";
        let r = sanitize(
            &raw(Side::Tests, secret, vec![]),
            &approved(),
            &|p: &str| p.starts_with("tests/"),
        );
        let record = serde_json::to_string(&r.redactions).unwrap();
        assert!(!record.contains("hunter2"));
        assert!(
            r.redactions
                .iter()
                .all(|x| x.removed_digest.starts_with("sha256:"))
        );
        assert_eq!(
            r.raw.reason, secret,
            "the raw input is kept for the evaluation record"
        );
        assert_eq!(
            r.sanitized.request,
            "Revise your tests for the listed requirements."
        );
    }
}
