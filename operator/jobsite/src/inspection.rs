//! One Inspection Run over a candidate, as a pure function of what the producers
//! reported: the finding-ledger events it appends and the verdict it reaches.
//!
//! Producers are Inspectors (`/out/findings.jsonl`, one finding per line) and
//! mutation campaigns (`/out/campaign.json`; every surviving mutant becomes a
//! `test-gap` finding). The first producer to report a subject creates the
//! finding and proposes its disposition; a later producer reporting the same
//! subject votes, so a dismissal is confirmed only by an independent producer
//! (the ledger refuses a producer voting on its own proposal). A prior finding
//! that was routed to a Worker and is no longer reported for the new candidate is
//! resolved for it. The run seals only when every producer completed and every
//! finding is terminal; otherwise the verdict says what must happen next.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ledger::{Change, Disposition, FindingState, Ledger, LedgerError, NewFinding};

/// What kind of producer ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProducerKind {
    /// An Inspector: `/out/findings.jsonl`.
    Inspector,
    /// A mutation campaign: `/out/campaign.json`.
    Mutation,
}

/// One finding as a producer reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportedFinding {
    /// Stable subject fingerprint (what the finding is about).
    pub subject: String,
    /// Category, e.g. `conformance`, `mutation-survivor`.
    pub category: String,
    /// Severity, e.g. `major`.
    pub severity: String,
    /// Requirements it concerns.
    #[serde(default)]
    pub requirement_ids: Vec<String>,
    /// The producer's proposed disposition.
    pub disposition: Disposition,
    /// Project paths the finding points at (filtered by the sanitizer before a
    /// Worker sees them).
    #[serde(default)]
    pub paths: Vec<String>,
    /// Free text for the private evaluation record (never forwarded raw).
    #[serde(default)]
    pub summary: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Campaign {
    #[serde(default)]
    survivors: Vec<Survivor>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Survivor {
    mutant_id: String,
    #[serde(default)]
    path: String,
    #[serde(default)]
    requirement_ids: Vec<String>,
    #[serde(default)]
    description: String,
}

/// Why a producer's output is unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{producer} output line {line}: {reason}")]
pub struct ReportError {
    /// Producer.
    pub producer: String,
    /// 1-based line (0 for a whole-document error).
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

/// Parses a producer's output (`findings.jsonl` or `campaign.json` bytes).
pub fn parse_report(
    producer: &str,
    kind: ProducerKind,
    bytes: &[u8],
) -> Result<Vec<ReportedFinding>, ReportError> {
    let err = |line, reason: String| ReportError {
        producer: producer.to_string(),
        line,
        reason,
    };
    let text = std::str::from_utf8(bytes).map_err(|e| err(0, e.to_string()))?;
    match kind {
        ProducerKind::Inspector => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| serde_json::from_str(l).map_err(|e| err(i + 1, e.to_string())))
            .collect(),
        ProducerKind::Mutation => {
            if text.trim().is_empty() {
                return Ok(Vec::new());
            }
            let campaign: Campaign =
                serde_json::from_str(text).map_err(|e| err(0, e.to_string()))?;
            Ok(campaign
                .survivors
                .into_iter()
                .map(|s| ReportedFinding {
                    subject: format!("mutant:{}", s.mutant_id),
                    category: "mutation-survivor".into(),
                    severity: "major".into(),
                    requirement_ids: s.requirement_ids,
                    disposition: Disposition::TestGap,
                    paths: if s.path.is_empty() {
                        Vec::new()
                    } else {
                        vec![s.path]
                    },
                    summary: s.description,
                })
                .collect())
        }
    }
}

/// A finding that sends the candidate back to the Workers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutedFinding {
    /// Ledger id.
    pub finding_id: String,
    /// The agreed disposition (who fixes it).
    pub disposition: Disposition,
    /// Requirements it concerns.
    pub requirement_ids: Vec<String>,
    /// Paths it points at.
    pub paths: Vec<String>,
    /// Category.
    pub category: String,
}

/// How the run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    /// Sealed at this ledger high-watermark: the candidate may merge.
    Sealed {
        /// High-watermark sequence.
        watermark: u64,
    },
    /// Worker-actionable findings: rework.
    Rework {
        /// What to fix.
        routed: Vec<RoutedFinding>,
    },
    /// Needs a person: a spec gap, an omitted requirement or an unconfirmed dismissal.
    Blocked {
        /// Why (structured enough for blocked-work).
        reason: String,
    },
}

/// Records one run: `reports` in producer order, `prior` the findings of the
/// previous run that still need a recheck (non-terminal ones). Idempotent: a
/// rerun with the same inputs appends nothing new.
pub fn record_run(
    ledger: &mut Ledger,
    run_id: &str,
    candidate: &str,
    reports: &[(String, Vec<ReportedFinding>)],
    prior: &[String],
) -> Result<Verdict, LedgerError> {
    let producers: Vec<&str> = reports.iter().map(|(p, _)| p.as_str()).collect();
    let recheck: Vec<&str> = prior.iter().map(String::as_str).collect();
    ledger.start_run(run_id, candidate, &producers, &recheck);
    let mut by_subject: BTreeMap<String, String> = BTreeMap::new();
    for (producer, findings) in reports {
        for reported in findings {
            let key = format!("{run_id}/{producer}/{}", reported.subject);
            if let Some(id) = by_subject.get(&reported.subject).cloned() {
                // A second producer on the same subject: an independent vote, when
                // the first proposal awaits one.
                let Some(f) = ledger.findings.get(&id) else {
                    continue;
                };
                if matches!(
                    f.state,
                    FindingState::ConfirmationPending | FindingState::Disputed
                ) && !f.votes.iter().any(|(who, _)| who == producer)
                {
                    let version = f.version;
                    ledger.append(
                        &format!("{key}/vote"),
                        run_id,
                        &id,
                        version,
                        producer,
                        Change::Vote {
                            disposition: reported.disposition,
                        },
                    )?;
                }
                continue;
            }
            let created = ledger.create(NewFinding {
                producer_key: key.clone(),
                producer: producer.clone(),
                producer_version: "1".into(),
                run_id: run_id.into(),
                category: reported.category.clone(),
                severity: reported.severity.clone(),
                subject: reported.subject.clone(),
                requirement_ids: reported.requirement_ids.clone(),
                spec_gap_scope: reported
                    .requirement_ids
                    .is_empty()
                    .then(|| format!("unmapped: {}", reported.subject)),
                evidence: reported.paths.clone(),
            })?;
            let (id, state, version) = (created.id.clone(), created.state, created.version);
            by_subject.insert(reported.subject.clone(), id.clone());
            if state == FindingState::Open {
                ledger.append(
                    &format!("{key}/propose"),
                    run_id,
                    &id,
                    version,
                    producer,
                    Change::Propose {
                        disposition: reported.disposition,
                    },
                )?;
            }
        }
        ledger.producer_completed(run_id, producer)?;
    }
    // Prior findings no producer reports any more are fixed for this candidate.
    let reported: BTreeSet<&String> = reports
        .iter()
        .flat_map(|(_, f)| f.iter().map(|r| &r.subject))
        .collect();
    for id in prior {
        let Some(f) = ledger.findings.get(id) else {
            continue;
        };
        let (state, version, subject) = (f.state, f.version, f.fields.subject.clone());
        let key = format!("{run_id}/job-site/{id}");
        if reported.contains(&subject) {
            continue;
        }
        if matches!(state, FindingState::Routed | FindingState::Blocked) {
            ledger.append(
                &format!("{key}/resolve"),
                run_id,
                id,
                version,
                "job-site",
                Change::Resolve,
            )?;
        } else if state.is_terminal() {
            ledger.append(
                &format!("{key}/recheck"),
                run_id,
                id,
                version,
                "job-site",
                Change::RecheckPassed,
            )?;
        }
    }
    match ledger.seal(run_id) {
        Ok(watermark) => return Ok(Verdict::Sealed { watermark }),
        Err(LedgerError::NotSealable { .. }) => {}
        Err(other) => return Err(other),
    }
    let current = ledger.current_findings(run_id);
    if let Some(f) = current.iter().find(|f| f.state == FindingState::Blocked) {
        return Ok(Verdict::Blocked {
            reason: format!(
                "finding {} ({}) needs specification work: {}",
                f.id, f.fields.category, f.fields.subject
            ),
        });
    }
    let routed: Vec<RoutedFinding> = current
        .iter()
        .filter(|f| f.state == FindingState::Routed)
        .map(|f| RoutedFinding {
            finding_id: f.id.clone(),
            disposition: agreed(&f.votes).unwrap_or(Disposition::ImplementationDefect),
            requirement_ids: f.fields.requirement_ids.clone(),
            paths: f.fields.evidence.clone(),
            category: f.fields.category.clone(),
        })
        .collect();
    if !routed.is_empty() {
        return Ok(Verdict::Rework { routed });
    }
    let pending: Vec<String> = current
        .iter()
        .filter(|f| !f.state.is_terminal())
        .map(|f| format!("{} is {:?}", f.id, f.state))
        .collect();
    Ok(Verdict::Blocked {
        reason: format!(
            "inspection cannot seal without an independent confirmation: {}",
            pending.join(", ")
        ),
    })
}

fn agreed(votes: &[(String, Disposition)]) -> Option<Disposition> {
    votes
        .iter()
        .map(|(_, d)| *d)
        .find(|d| votes.iter().filter(|(_, e)| e == d).count() >= 2)
        .or_else(|| votes.first().map(|(_, d)| *d))
}

/// Unresolved findings of `run_id` that the next run must recheck.
pub fn carried_over(ledger: &Ledger, run_id: &str) -> Vec<String> {
    ledger
        .current_findings(run_id)
        .into_iter()
        .filter(|f| !f.state.is_terminal())
        .map(|f| f.id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn finding(subject: &str, disposition: Disposition) -> ReportedFinding {
        ReportedFinding {
            subject: subject.into(),
            category: "conformance".into(),
            severity: "major".into(),
            requirement_ids: vec!["REQ-1".into()],
            disposition,
            paths: vec!["src/a.sh".into()],
            summary: "expected 1 got 2".into(),
        }
    }

    #[test]
    fn a_clean_run_seals() {
        let mut l = Ledger::default();
        let v = record_run(&mut l, "r1", "c1", &[("insp".into(), vec![])], &[]).unwrap();
        assert!(matches!(v, Verdict::Sealed { .. }));
    }

    #[test]
    fn a_defect_routes_and_is_resolved_when_the_next_candidate_no_longer_has_it() {
        let mut l = Ledger::default();
        let v = record_run(
            &mut l,
            "r1",
            "c1",
            &[(
                "insp".into(),
                vec![finding("s1", Disposition::ImplementationDefect)],
            )],
            &[],
        )
        .unwrap();
        let Verdict::Rework { routed } = v else {
            panic!("expected rework, got {v:?}")
        };
        assert_eq!(routed[0].disposition, Disposition::ImplementationDefect);
        let prior = carried_over(&l, "r1");
        assert_eq!(prior.len(), 1);
        // Still reported → still rework.
        let again = record_run(
            &mut l,
            "r2",
            "c2",
            &[(
                "insp".into(),
                vec![finding("s1", Disposition::ImplementationDefect)],
            )],
            &prior,
        )
        .unwrap();
        assert!(matches!(again, Verdict::Rework { .. }));
        let prior = carried_over(&l, "r2");
        let fixed = record_run(&mut l, "r3", "c3", &[("insp".into(), vec![])], &prior).unwrap();
        assert!(matches!(fixed, Verdict::Sealed { .. }), "{fixed:?}");
        // Idempotent: replaying a sealed run's inputs changes nothing but cannot reseal.
        let seq = l.sequence;
        assert!(record_run(&mut l, "r3", "c3", &[("insp".into(), vec![])], &prior).is_err());
        assert_eq!(l.sequence, seq);
    }

    #[test]
    fn a_dismissal_needs_an_independent_producer() {
        let mut l = Ledger::default();
        let alone = record_run(
            &mut l,
            "r1",
            "c1",
            &[("a".into(), vec![finding("s", Disposition::NotADefect)])],
            &[],
        )
        .unwrap();
        assert!(matches!(alone, Verdict::Blocked { .. }), "{alone:?}");
        let mut l = Ledger::default();
        let confirmed = record_run(
            &mut l,
            "r1",
            "c1",
            &[
                ("a".into(), vec![finding("s", Disposition::NotADefect)]),
                ("b".into(), vec![finding("s", Disposition::NotADefect)]),
            ],
            &[],
        )
        .unwrap();
        assert!(matches!(confirmed, Verdict::Sealed { .. }), "{confirmed:?}");
    }

    #[test]
    fn a_spec_gap_blocks() {
        let mut l = Ledger::default();
        let mut f = finding("gap", Disposition::SpecGap);
        f.requirement_ids.clear();
        let v = record_run(&mut l, "r1", "c1", &[("a".into(), vec![f])], &[]).unwrap();
        assert!(matches!(v, Verdict::Blocked { .. }), "{v:?}");
    }

    #[test]
    fn reports_parse_and_bad_lines_name_their_line() {
        let ok = br#"{"subject":"s","category":"c","severity":"minor","requirement_ids":["R"],"disposition":"test-defect"}"#;
        assert_eq!(
            parse_report("i", ProducerKind::Inspector, ok)
                .unwrap()
                .len(),
            1
        );
        let bad = b"\n{\"subject\": 1}\n";
        let e = parse_report("i", ProducerKind::Inspector, bad).unwrap_err();
        assert_eq!(e.line, 2);
        let campaign =
            br#"{"survivors":[{"mutant_id":"m1","path":"src/a.sh","requirement_ids":["R"]}]}"#;
        let s = parse_report("m", ProducerKind::Mutation, campaign).unwrap();
        assert_eq!(s[0].disposition, Disposition::TestGap);
        assert_eq!(s[0].subject, "mutant:m1");
        assert!(parse_report("m", ProducerKind::Mutation, b"{oops").is_err());
        assert!(parse_report("i", ProducerKind::Inspector, &[0xff, 0xfe]).is_err());
    }
}
