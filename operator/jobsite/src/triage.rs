//! Triage: when the integration run fails, decide whether the tests, the
//! implementation or both are at fault, and which requirement IDs each Worker
//! must revisit. Runs only in the private integration environment; every
//! Worker-directed decision then passes the feedback sanitizer.
//!
//! [`Triage`] is the seam an agent triage plugs into; [`HeuristicTriage`] is the
//! deterministic default:
//! 1. a build error in a test artifact is a test fault, in an implementation
//!    artifact an implementation fault (both kinds: both);
//! 2. otherwise, for each failing requirement: if the opaque baseline suite
//!    (valid tests of unchanged requirements) fails for it, the implementation
//!    regressed; a new test that errors (setup, fixture, harness) is a test fault;
//!    a new test whose assertion fails is an implementation fault;
//! 3. faults on both sides across requirements make `both`.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The two Workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Side {
    /// Worker A: writes tests, never sees implementation.
    #[serde(rename = "worker-a")]
    Tests,
    /// Worker B: writes implementation, never sees tests.
    #[serde(rename = "worker-b")]
    Implementation,
}

/// Fault classification.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// The tests are wrong.
    Test,
    /// The implementation is wrong.
    Implementation,
    /// Both are.
    Both,
}

/// How one test ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Passed.
    Pass,
    /// An assertion failed.
    Fail,
    /// The test could not run (setup, fixture, harness, crash before asserting).
    Error,
}

/// One test of the active catalog, mapped to requirements.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestResult {
    /// Stable test id.
    pub test_id: String,
    /// Requirements it verifies.
    pub requirement_ids: Vec<String>,
    /// Outcome.
    pub status: Status,
    /// True for the opaque baseline suite (valid tests of unchanged requirements).
    pub baseline: bool,
}

/// A build error attributed to the side that owns the artifact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildError {
    /// Owner of the failing artifact.
    pub owner: Side,
    /// Artifact path (integration-side only; never forwarded to the other side).
    pub artifact: String,
    /// Compiler or syntax diagnostic.
    pub message: String,
}

/// Everything triage may look at.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TriageInput {
    /// Build errors.
    pub build_errors: Vec<BuildError>,
    /// Test results.
    pub results: Vec<TestResult>,
}

/// Work routed to one Worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Recipient.
    pub side: Side,
    /// Requirements to revisit.
    pub requirement_ids: BTreeSet<String>,
    /// Contract-level reason (still goes through the sanitizer).
    pub reason: String,
}

/// The decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Everything passed.
    Pass,
    /// Rework.
    Rework {
        /// Overall fault.
        fault: Fault,
        /// Per-Worker assignments (one or two).
        assignments: Vec<Assignment>,
    },
}

/// A triage mechanism (heuristic, agent or hybrid).
pub trait Triage: Send + Sync {
    /// Decides fault for one integration run.
    fn decide(&self, input: &TriageInput) -> Decision;
}

/// The deterministic default (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct HeuristicTriage;

impl Triage for HeuristicTriage {
    fn decide(&self, input: &TriageInput) -> Decision {
        let mut tests: BTreeSet<String> = BTreeSet::new();
        let mut implementation: BTreeSet<String> = BTreeSet::new();
        let mut test_build = false;
        let mut impl_build = false;
        for e in &input.build_errors {
            match e.owner {
                Side::Tests => test_build = true,
                Side::Implementation => impl_build = true,
            }
        }
        if !test_build && !impl_build {
            let baseline_failing: BTreeSet<&String> = input
                .results
                .iter()
                .filter(|r| r.baseline && r.status != Status::Pass)
                .flat_map(|r| &r.requirement_ids)
                .collect();
            for r in input.results.iter().filter(|r| r.status != Status::Pass) {
                for req in &r.requirement_ids {
                    let regression = baseline_failing.contains(req);
                    if r.baseline || regression || r.status == Status::Fail {
                        implementation.insert(req.clone());
                    } else {
                        tests.insert(req.clone());
                    }
                }
            }
        } else {
            // A build failure hides test outcomes; route every failing requirement
            // to the side(s) whose artifacts do not build.
            let failing: BTreeSet<String> = input
                .results
                .iter()
                .filter(|r| r.status != Status::Pass)
                .flat_map(|r| r.requirement_ids.iter().cloned())
                .collect();
            if test_build {
                tests.extend(failing.iter().cloned());
            }
            if impl_build {
                implementation.extend(failing);
            }
        }
        let mut assignments = Vec::new();
        if test_build || !tests.is_empty() {
            let reason = if test_build {
                "your test artifacts do not build"
            } else {
                "your tests could not run for these requirements"
            };
            assignments.push(Assignment {
                side: Side::Tests,
                requirement_ids: tests,
                reason: reason.into(),
            });
        }
        if impl_build || !implementation.is_empty() {
            let reason = if impl_build {
                "your implementation does not build"
            } else {
                "the implementation does not yet satisfy these requirements"
            };
            assignments.push(Assignment {
                side: Side::Implementation,
                requirement_ids: implementation,
                reason: reason.into(),
            });
        }
        match assignments.len() {
            0 => Decision::Pass,
            1 => {
                let fault = if assignments[0].side == Side::Tests {
                    Fault::Test
                } else {
                    Fault::Implementation
                };
                Decision::Rework { fault, assignments }
            }
            _ => Decision::Rework {
                fault: Fault::Both,
                assignments,
            },
        }
    }
}

/// Failing tests named in a cause (the trace keeps them all).
const TESTS_SHOWN: usize = 5;

/// Why a gate did not pass, in one sentence for people, from the harness's own output:
/// the failing test ids with their status, the build errors, the refused paths and the
/// end of the integration run's stderr. `None` when every test passed and nothing was
/// refused. Never forwarded to a Worker (the sanitizer decides what they see).
pub fn describe_gate_failure(
    input: &TriageInput,
    refusals: &[String],
    integration_stderr: &str,
) -> Option<String> {
    let failing: Vec<String> = input
        .results
        .iter()
        .filter(|r| r.status != Status::Pass)
        .map(|r| {
            format!(
                "{} ({})",
                r.test_id,
                if r.status == Status::Fail {
                    "fail"
                } else {
                    "error"
                }
            )
        })
        .collect();
    let mut parts = Vec::new();
    if !input.build_errors.is_empty() {
        let shown: Vec<String> = input
            .build_errors
            .iter()
            .take(TESTS_SHOWN)
            .map(|e| format!("{}: {}", e.artifact, sanitized_stderr_tail(&e.message)))
            .collect();
        parts.push(format!("build errors: {}", shown.join("; ")));
    }
    if !failing.is_empty() {
        let more = failing.len().saturating_sub(TESTS_SHOWN);
        let mut shown = failing[..failing.len().min(TESTS_SHOWN)].join(", ");
        if more > 0 {
            shown.push_str(&format!(" and {more} more"));
        }
        parts.push(format!("failing tests: {shown}"));
    }
    if input.results.is_empty() && input.build_errors.is_empty() {
        parts.push("the integration run reported no test results".into());
    }
    parts.extend(refusals.iter().cloned());
    if parts.is_empty() {
        return None;
    }
    let tail = sanitized_stderr_tail(integration_stderr);
    if !tail.is_empty() && (!failing.is_empty() || input.results.is_empty()) {
        parts.push(format!("integration output ends: {tail}"));
    }
    Some(parts.join("; "))
}

/// Why a Worker's output did not enter this cycle's candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The output could not be collected, applied or merged.
    NotImported,
    /// The ownership validator refused paths of the patch.
    Paths,
}

/// The gate's decision from the tests' verdict and the refusals of this cycle. A candidate
/// whose tests all pass stands: a refused extra or redundant file changes nothing in it (the
/// refusal is reported in the trace and the progress, not turned into rework). Otherwise a
/// refused output is rework for its author, whatever the tests say.
pub fn gate_decision(
    tested: Decision,
    refused: &[(Side, Refusal)],
    requirement_ids: &BTreeSet<String>,
) -> Decision {
    if refused.is_empty() || tested == Decision::Pass {
        return tested;
    }
    let sides: BTreeSet<Side> = refused.iter().map(|(side, _)| *side).collect();
    let fault = match (
        sides.contains(&Side::Tests),
        sides.contains(&Side::Implementation),
    ) {
        (true, true) => Fault::Both,
        (true, false) => Fault::Test,
        _ => Fault::Implementation,
    };
    Decision::Rework {
        fault,
        assignments: sides
            .iter()
            .map(|side| Assignment {
                side: *side,
                requirement_ids: requirement_ids.clone(),
                reason: if refused
                    .iter()
                    .any(|(s, r)| s == side && *r == Refusal::NotImported)
                {
                    "your output could not be imported: return a plain repository whose commits build linearly on the projection root and only reference objects you were given or wrote".into()
                } else {
                    "your patch touched paths your role does not own".into()
                },
            })
            .collect(),
    }
}

/// One path of a Worker patch the ownership policy refused, with the class the
/// work item's `.protobot/projection.yaml` gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedPath {
    /// The path the patch wrote.
    pub path: String,
    /// Its projection class (`shared`, `test`, …); `None`: no entry covers it.
    pub class: Option<&'static str>,
    /// The validator's code (`unclassified-path`, `not-writable-by-role`, …).
    pub code: String,
}

/// The projection class a Worker may write.
pub fn writable_class(side: Side) -> &'static str {
    match side {
        Side::Tests => "test",
        Side::Implementation => "implementation",
    }
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::Tests => "worker-a",
        Side::Implementation => "worker-b",
    }
}

/// Paths shown in one message (the trace keeps them all).
const PATHS_SHOWN: usize = 5;

fn listed(paths: &[&str]) -> String {
    let mut out = paths
        .iter()
        .take(PATHS_SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > PATHS_SHOWN {
        out.push_str(&format!(" and {} more", paths.len() - PATHS_SHOWN));
    }
    out
}

/// A one-line account of a refused patch for people (the stage line and the
/// trace; never a Worker): each path with its class or `unclassified`.
pub fn describe_refusal(side: Side, refused: &[RefusedPath]) -> String {
    let mut seen = BTreeSet::new();
    let parts: Vec<String> = refused
        .iter()
        .filter(|r| !r.path.is_empty() && seen.insert(r.path.as_str()))
        .map(|r| match r.class {
            Some(class) => format!("{} (class {class}, {})", r.path, r.code),
            None => format!("{} (unclassified)", r.path),
        })
        .collect();
    let shown: Vec<&str> = parts.iter().map(String::as_str).collect();
    format!(
        "{}'s patch was refused: {}; {} may write only `{}` paths",
        side_name(side),
        if shown.is_empty() {
            "the bundle itself is invalid".to_owned()
        } else {
            listed(&shown)
        },
        side_name(side),
        writable_class(side)
    )
}

/// The top-level entry that would classify `path`: its first directory
/// (`src/`), or the file itself at the root.
fn suggested_entry(path: &str) -> String {
    match path.split_once('/') {
        Some((dir, _)) if !dir.is_empty() => format!("{dir}/"),
        _ => path.to_owned(),
    }
}

/// When a refused patch is a gap in the projection policy rather than a Worker
/// mistake, the block reason: the unclassified paths, the class the Worker may
/// write, and the fix. Another cycle cannot help (the Worker that owns the
/// implementation must write it somewhere), so the build stops at once instead
/// of spending its cycles and blaming the requirements. `None` when every
/// refused path is classified (a Worker wrote another role's files: rework).
pub fn policy_gap(side: Side, refused: &[RefusedPath]) -> Option<String> {
    let mut seen = BTreeSet::new();
    let gaps: Vec<&str> = refused
        .iter()
        .filter(|r| r.class.is_none() && !r.path.is_empty() && seen.insert(r.path.as_str()))
        .map(|r| r.path.as_str())
        .collect();
    let first = gaps.first()?;
    Some(format!(
        "{side}'s patch was refused by the projection policy: {paths} {verb} not classified in .protobot/projection.yaml, and {side} may write only `{class}` paths. Fix: add an entry such as `- path: {entry}` with `class: {class}` to .protobot/projection.yaml on the default branch, then run `protobot retry` (or `protobot abandon` to drop this work item)",
        side = side_name(side),
        paths = listed(&gaps),
        verb = if gaps.len() == 1 { "is" } else { "are" },
        class = writable_class(side),
        entry = suggested_entry(first),
    ))
}

/// Characters of a harness's stderr kept in an error message.
pub const STDERR_TAIL_CHARS: usize = 800;

/// The last [`STDERR_TAIL_CHARS`] characters of a harness's stderr, made safe
/// for a one-line error and a trace: control characters (terminal escapes
/// included) removed, line breaks shown as ` | `, surrounding blank space
/// trimmed. For people only; never forwarded to a Worker.
pub fn sanitized_stderr_tail(stderr: &str) -> String {
    let lines: Vec<String> = stderr
        .lines()
        .map(|l| {
            l.chars()
                .filter(|c| !c.is_control() || *c == '\t')
                .collect::<String>()
                .replace('\t', " ")
                .trim_end()
                .to_owned()
        })
        .filter(|l| !l.trim().is_empty())
        .collect();
    let joined = lines.join(" | ");
    let count = joined.chars().count();
    if count <= STDERR_TAIL_CHARS {
        return joined;
    }
    let tail: String = joined.chars().skip(count - STDERR_TAIL_CHARS).collect();
    format!("…{tail}")
}

/// Why a Worker's run failed when its harness did not exit 0, or `None` when
/// it did. A non-zero exit is a failed run even when the harness committed:
/// its commits are never imported.
pub fn harness_failure(termination: &crate::executor::Termination, stderr: &str) -> Option<String> {
    use crate::executor::Termination;
    let how = match termination {
        Termination::Exited { code: 0 } => return None,
        Termination::Exited { code } => format!("exited with code {code}"),
        Termination::Signaled { signal } => format!("was killed by signal {signal}"),
        Termination::LimitExceeded { limit } => format!("exceeded its {limit} limit"),
        Termination::Cancelled => "was cancelled".to_owned(),
    };
    let tail = sanitized_stderr_tail(stderr);
    Some(if tail.is_empty() {
        format!("the harness {how} (no stderr); its output was not imported")
    } else {
        format!("the harness {how}; its output was not imported; stderr ends: {tail}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_failure_is_described_from_the_harness_output_and_a_pass_is_not() {
        let result = |id: &str, status| TestResult {
            test_id: id.into(),
            requirement_ids: vec!["REQ-CLI-00001".into()],
            status,
            baseline: false,
        };
        let failing = TriageInput {
            build_errors: vec![],
            results: vec![
                result("test_ok", Status::Pass),
                result("test_greet", Status::Fail),
                result("test_setup", Status::Error),
            ],
        };
        let cause = describe_gate_failure(
            &failing,
            &[],
            "E   ModuleNotFoundError: No module named pytest\n",
        )
        .unwrap();
        assert!(
            cause.contains("failing tests: test_greet (fail), test_setup (error)"),
            "{cause}"
        );
        assert!(!cause.contains("test_ok"), "{cause}");
        assert!(cause.contains("No module named pytest"), "{cause}");
        let passing = TriageInput {
            build_errors: vec![],
            results: vec![result("test_ok", Status::Pass)],
        };
        assert_eq!(describe_gate_failure(&passing, &[], "noise"), None);
        let built = TriageInput {
            build_errors: vec![BuildError {
                owner: Side::Implementation,
                artifact: "src/greet.sh".into(),
                message: "syntax error near `fi'".into(),
            }],
            results: vec![],
        };
        let cause =
            describe_gate_failure(&built, &["worker-a's patch was refused: x".into()], "").unwrap();
        assert!(
            cause.contains("build errors: src/greet.sh: syntax error"),
            "{cause}"
        );
        assert!(cause.contains("worker-a's patch was refused"), "{cause}");
        let silent =
            describe_gate_failure(&TriageInput::default(), &[], "python3: not found").unwrap();
        assert!(
            silent.contains("no test results") && silent.contains("python3: not found"),
            "{silent}"
        );
    }

    #[test]
    fn a_passing_candidate_stands_whatever_was_refused_and_a_failing_one_is_rework_for_the_refused()
    {
        let ids: BTreeSet<String> = ["REQ-CLI-00001".to_string()].into();
        let refused = [(Side::Tests, Refusal::Paths)];
        assert_eq!(
            gate_decision(Decision::Pass, &refused, &ids),
            Decision::Pass
        );
        let failing = Decision::Rework {
            fault: Fault::Implementation,
            assignments: vec![],
        };
        let Decision::Rework { fault, assignments } =
            gate_decision(failing.clone(), &refused, &ids)
        else {
            panic!("a failing gate with a refusal is rework");
        };
        assert_eq!(fault, Fault::Test);
        assert_eq!(assignments.len(), 1);
        assert!(
            assignments[0]
                .reason
                .contains("paths your role does not own")
        );
        assert_eq!(assignments[0].requirement_ids, ids);
        let both = [
            (Side::Implementation, Refusal::NotImported),
            (Side::Tests, Refusal::Paths),
        ];
        let Decision::Rework { fault, assignments } = gate_decision(failing.clone(), &both, &ids)
        else {
            panic!("rework");
        };
        assert_eq!(fault, Fault::Both);
        assert!(assignments[1].reason.contains("could not be imported"));
        assert_eq!(gate_decision(failing.clone(), &[], &ids), failing);
    }

    fn result(id: &str, req: &str, status: Status, baseline: bool) -> TestResult {
        TestResult {
            test_id: id.into(),
            requirement_ids: vec![req.into()],
            status,
            baseline,
        }
    }

    fn fault(d: &Decision) -> Option<Fault> {
        match d {
            Decision::Pass => None,
            Decision::Rework { fault, .. } => Some(*fault),
        }
    }

    #[test]
    fn all_passing_is_a_pass() {
        let input = TriageInput {
            build_errors: vec![],
            results: vec![result("t1", "REQ-1", Status::Pass, false)],
        };
        assert_eq!(HeuristicTriage.decide(&input), Decision::Pass);
    }

    #[test]
    fn an_assertion_failure_of_a_new_test_is_an_implementation_fault() {
        let input = TriageInput {
            build_errors: vec![],
            results: vec![result("t1", "REQ-2", Status::Fail, false)],
        };
        let d = HeuristicTriage.decide(&input);
        assert_eq!(fault(&d), Some(Fault::Implementation));
        let Decision::Rework { assignments, .. } = d else {
            unreachable!()
        };
        assert_eq!(
            assignments[0].requirement_ids,
            BTreeSet::from(["REQ-2".to_string()])
        );
    }

    #[test]
    fn an_erroring_new_test_is_a_test_fault() {
        let input = TriageInput {
            build_errors: vec![],
            results: vec![result("t1", "REQ-3", Status::Error, false)],
        };
        assert_eq!(fault(&HeuristicTriage.decide(&input)), Some(Fault::Test));
    }

    #[test]
    fn a_failing_baseline_is_an_implementation_regression() {
        let input = TriageInput {
            build_errors: vec![],
            results: vec![
                result("base", "REQ-1", Status::Fail, true),
                result("new", "REQ-1", Status::Error, false),
            ],
        };
        assert_eq!(
            fault(&HeuristicTriage.decide(&input)),
            Some(Fault::Implementation)
        );
    }

    #[test]
    fn faults_on_both_sides_make_both() {
        let input = TriageInput {
            build_errors: vec![],
            results: vec![
                result("a", "REQ-1", Status::Fail, false),
                result("b", "REQ-2", Status::Error, false),
            ],
        };
        let d = HeuristicTriage.decide(&input);
        assert_eq!(fault(&d), Some(Fault::Both));
        let Decision::Rework { assignments, .. } = d else {
            unreachable!()
        };
        assert_eq!(assignments.len(), 2);
    }

    #[test]
    fn build_errors_are_attributed_to_the_owner() {
        let err = |owner| BuildError {
            owner,
            artifact: "x".into(),
            message: "syntax error".into(),
        };
        let only_tests = TriageInput {
            build_errors: vec![err(Side::Tests)],
            results: vec![],
        };
        assert_eq!(
            fault(&HeuristicTriage.decide(&only_tests)),
            Some(Fault::Test)
        );
        let only_impl = TriageInput {
            build_errors: vec![err(Side::Implementation)],
            results: vec![result("t", "REQ-1", Status::Error, false)],
        };
        let d = HeuristicTriage.decide(&only_impl);
        assert_eq!(fault(&d), Some(Fault::Implementation));
        let both = TriageInput {
            build_errors: vec![err(Side::Tests), err(Side::Implementation)],
            results: vec![],
        };
        assert_eq!(fault(&HeuristicTriage.decide(&both)), Some(Fault::Both));
    }

    fn refused(path: &str, class: Option<&'static str>, code: &str) -> RefusedPath {
        RefusedPath {
            path: path.into(),
            class,
            code: code.into(),
        }
    }

    #[test]
    fn an_unclassified_path_is_a_policy_gap_that_names_the_path_and_the_fix() {
        let reason = policy_gap(
            Side::Implementation,
            &[
                refused("src/sync.sh", None, "unclassified-path"),
                refused("src/sync.sh", None, "unclassified-path"),
            ],
        )
        .unwrap_or_default();
        assert!(reason.contains("worker-b"), "{reason}");
        assert!(reason.contains("src/sync.sh is not classified"), "{reason}");
        assert!(
            reason.contains("`- path: src/` with `class: implementation`"),
            "{reason}"
        );
        assert!(reason.contains("protobot retry"), "{reason}");
        assert!(!reason.contains("contradictory"), "{reason}");
        assert_eq!(
            reason.matches("src/sync.sh").count(),
            1,
            "listed once: {reason}"
        );
        let root = policy_gap(
            Side::Tests,
            &[refused("check.sh", None, "unclassified-path")],
        )
        .unwrap_or_default();
        assert!(
            root.contains("`- path: check.sh` with `class: test`"),
            "{root}"
        );
    }

    #[test]
    fn a_classified_path_of_another_role_is_rework_not_a_policy_gap() {
        let paths = [refused("tests/t.sh", Some("test"), "not-writable-by-role")];
        assert_eq!(policy_gap(Side::Implementation, &paths), None);
        let told = describe_refusal(Side::Implementation, &paths);
        assert!(
            told.contains("tests/t.sh (class test, not-writable-by-role)"),
            "{told}"
        );
        assert!(told.contains("`implementation`"), "{told}");
    }

    #[test]
    fn long_refusals_are_cut_with_a_count() {
        let many: Vec<RefusedPath> = (0..8)
            .map(|i| refused(&format!("lib/f{i}.rs"), None, "unclassified-path"))
            .collect();
        let reason = policy_gap(Side::Implementation, &many).unwrap_or_default();
        assert!(reason.contains("and 3 more are not classified"), "{reason}");
        assert!(reason.contains("`- path: lib/`"), "{reason}");
    }

    #[test]
    fn a_nonzero_exit_is_a_failure_naming_the_code_and_the_stderr_tail() {
        use crate::executor::Termination;
        assert_eq!(
            harness_failure(&Termination::Exited { code: 0 }, "noise"),
            None
        );
        let failed = harness_failure(
            &Termination::Exited { code: 3 },
            "starting\n\u{1b}[31mmodel quota exceeded\u{1b}[0m\n\n",
        )
        .unwrap_or_default();
        assert!(failed.contains("exited with code 3"), "{failed}");
        assert!(
            failed.contains("starting | [31mmodel quota exceeded[0m"),
            "{failed}"
        );
        assert!(!failed.contains('\u{1b}'), "{failed}");
        let silent = harness_failure(&Termination::Signaled { signal: 9 }, "").unwrap_or_default();
        assert!(
            silent.contains("killed by signal 9 (no stderr)"),
            "{silent}"
        );
    }

    #[test]
    fn the_stderr_tail_keeps_the_end() {
        let long = format!("{}END", "x".repeat(5000));
        let tail = sanitized_stderr_tail(&long);
        assert!(tail.ends_with("END"));
        assert!(tail.starts_with('…'));
        assert_eq!(tail.chars().count(), STDERR_TAIL_CHARS + 1);
    }
}
