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

#[cfg(test)]
mod tests {
    use super::*;

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
}
