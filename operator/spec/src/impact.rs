//! Deterministic impact analysis and assessment status (§20). Pure.

use std::collections::{BTreeMap, BTreeSet};

use crate::{
    ids,
    model::{ChangeSet, Requirement},
    node::Node,
};

/// A mechanical impact candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The possibly affected requirement.
    pub requirement_id: String,
    /// Sorted, unique match reasons.
    pub matched_by: Vec<String>,
    /// Disposition of the first recorded entry for this ID.
    pub recorded_disposition: Option<String>,
    /// Rationale of that entry.
    pub rationale: Option<String>,
}

/// Assessment status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Recorded against another base, or no longer matching the candidates.
    Stale,
    /// Entries are missing or malformed.
    Incomplete,
    /// Every candidate has a well-formed final entry.
    Complete,
}

impl Status {
    /// JSON spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Stale => "stale",
            Status::Incomplete => "incomplete",
            Status::Complete => "complete",
        }
    }
}

/// IDs of requirements the change set operates on.
pub fn changed_ids(cs: &ChangeSet) -> BTreeSet<String> {
    cs.ops().iter().map(|o| o.requirement_id.clone()).collect()
}

/// Mechanical candidates for a change set, sorted by ID.
pub fn candidates<'a>(
    cs: &ChangeSet,
    reqs: impl IntoIterator<Item = &'a Requirement> + Clone,
) -> Vec<Candidate> {
    let changed = changed_ids(cs);
    let by_id: BTreeMap<&str, &Requirement> = reqs
        .clone()
        .into_iter()
        .map(|r| (r.id.as_str(), r))
        .collect();
    let project_boundary = cs.affected_scopes.iter().any(|s| s == "project")
        || changed.iter().any(|id| {
            by_id
                .get(id.as_str())
                .is_some_and(|r| r.scopes().iter().any(|s| s == "project"))
        });
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in reqs {
        if r.id.is_empty()
            || !ids::is_requirement_id(&r.id)
            || changed.contains(&r.id)
            || r.status() != "active"
        {
            continue;
        }
        let mut reasons = BTreeSet::new();
        for i in r.interfaces() {
            if cs.affected_interfaces().contains(i) {
                reasons.insert(format!("interface:{i}"));
            }
        }
        for s in r.scopes() {
            if cs.affected_scopes.contains(s) {
                reasons.insert(format!("scope:{s}"));
            }
        }
        if project_boundary && r.scopes().iter().any(|s| s == "project") {
            reasons.insert("scope:project".to_owned());
        }
        for rel in &r.relationships {
            if changed.contains(&rel.target) {
                reasons.insert(format!("relationship:{}:{}", rel.kind, rel.target));
            }
        }
        for c in &changed {
            if let Some(cr) = by_id.get(c.as_str()) {
                for rel in &cr.relationships {
                    if rel.target == r.id {
                        reasons.insert(format!("relationship:{}:{c}", rel.kind));
                    }
                }
            }
        }
        if !reasons.is_empty() {
            out.insert(r.id.clone(), reasons);
        }
    }
    out.into_iter()
        .map(|(id, reasons)| {
            let entry = cs.impact_assessment.iter().find(|a| a.requirement_id == id);
            Candidate {
                recorded_disposition: entry.map(|a| a.disposition.clone()),
                rationale: entry.map(|a| a.rationale.clone()),
                requirement_id: id,
                matched_by: reasons.into_iter().collect(),
            }
        })
        .collect()
}

/// Assessment status (stale before incomplete before complete).
pub fn status<'a>(
    cs: &ChangeSet,
    reqs: impl IntoIterator<Item = &'a Requirement> + Clone,
) -> Status {
    let cands: BTreeSet<String> = candidates(cs, reqs.clone())
        .into_iter()
        .map(|c| c.requirement_id)
        .collect();
    let changed = changed_ids(cs);
    let by_id: BTreeMap<&str, &Requirement> =
        reqs.into_iter().map(|r| (r.id.as_str(), r)).collect();
    let base_ok = !cs.impact_assessment_base_commit.is_empty()
        && cs
            .impact_assessment_base_commit
            .eq_ignore_ascii_case(&cs.base_commit);
    let stale = !base_ok
        || cs
            .impact_assessment
            .iter()
            .any(|a| match a.origin.as_str() {
                "mechanical" => !cands.contains(&a.requirement_id),
                "semantic" => {
                    cands.contains(&a.requirement_id)
                        || changed.contains(&a.requirement_id)
                        || by_id
                            .get(a.requirement_id.as_str())
                            .is_none_or(|r| r.status() != "active")
                }
                _ => false,
            });
    if stale {
        return Status::Stale;
    }
    let mut seen = BTreeSet::new();
    let incomplete = cs.impact_assessment.iter().any(|a| {
        !seen.insert(a.requirement_id.clone())
            || !matches!(a.disposition.as_str(), "applicable" | "not-applicable")
            || a.rationale.trim().is_empty()
            || !matches!(a.origin.as_str(), "mechanical" | "semantic")
    }) || cands.iter().any(|c| !seen.contains(c));
    if incomplete {
        Status::Incomplete
    } else {
        Status::Complete
    }
}

/// Candidate as JSON data.
pub fn candidate_node(c: &Candidate) -> Node {
    let opt = |v: &Option<String>| v.as_ref().map_or(Node::Null, Node::s);
    Node::map()
        .with("requirement_id", Node::s(&c.requirement_id))
        .with("origin", Node::s("mechanical"))
        .with("matched_by", Node::strs(c.matched_by.iter().cloned()))
        .with("recommended_disposition", Node::s("applicable"))
        .with("recorded_disposition", opt(&c.recorded_disposition))
        .with("rationale", opt(&c.rationale))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AppliesTo, Assessment, Relationship, RequirementOp};

    fn req(id: &str, scopes: &[&str], ifaces: &[&str], rels: &[(&str, &str)]) -> Requirement {
        Requirement {
            id: id.into(),
            applies_to: Some(AppliesTo {
                interfaces: ifaces.iter().map(|s| (*s).into()).collect(),
                scopes: scopes.iter().map(|s| (*s).into()).collect(),
            }),
            relationships: rels
                .iter()
                .map(|(k, t)| Relationship {
                    kind: (*k).into(),
                    target: (*t).into(),
                })
                .collect(),
            ..Requirement::default()
        }
    }

    fn cs(ops: &[&str], ifaces: &[&str], scopes: &[&str]) -> ChangeSet {
        ChangeSet {
            base_commit: "a".repeat(40),
            impact_assessment_base_commit: "A".repeat(40),
            operations: Some(
                ops.iter()
                    .map(|id| RequirementOp {
                        action: "revise".into(),
                        requirement_id: (*id).into(),
                        rationale: String::new(),
                    })
                    .collect(),
            ),
            affected_interfaces: Some(ifaces.iter().map(|s| (*s).into()).collect()),
            affected_scopes: scopes.iter().map(|s| (*s).into()).collect(),
            ..ChangeSet::default()
        }
    }

    #[test]
    fn candidates_collect_every_reason_and_skip_changed_and_retired() {
        let reqs = [
            req(
                "REQ-A-00001",
                &["cli"],
                &["ui"],
                &[("depends-on", "REQ-A-00009")],
            ),
            req("REQ-A-00002", &["project"], &[], &[]),
            req(
                "REQ-A-00009",
                &["project"],
                &[],
                &[("related-to", "REQ-A-00003")],
            ),
            req("REQ-A-00003", &["other"], &[], &[]),
            Requirement {
                status: "retired".into(),
                ..req("REQ-A-00004", &["cli"], &[], &[])
            },
        ];
        let c = cs(&["REQ-A-00009"], &["ui"], &["cli"]);
        let got = candidates(&c, reqs.iter());
        let ids: Vec<&str> = got.iter().map(|c| c.requirement_id.as_str()).collect();
        assert_eq!(ids, ["REQ-A-00001", "REQ-A-00002", "REQ-A-00003"]);
        assert_eq!(
            got[0].matched_by,
            [
                "interface:ui",
                "relationship:depends-on:REQ-A-00009",
                "scope:cli"
            ]
        );
        assert_eq!(
            got[1].matched_by,
            ["scope:project"],
            "a changed project-scoped requirement sets the boundary"
        );
        assert_eq!(got[2].matched_by, ["relationship:related-to:REQ-A-00009"]);
    }

    #[test]
    fn status_precedence_is_stale_then_incomplete_then_complete() {
        let reqs = [
            req("REQ-A-00001", &["cli"], &[], &[]),
            req("REQ-A-00002", &["x"], &[], &[]),
        ];
        let mut c = cs(&[], &[], &["cli"]);
        assert_eq!(
            status(&c, reqs.iter()),
            Status::Incomplete,
            "base compared case-insensitively"
        );
        c.impact_assessment = vec![Assessment {
            requirement_id: "REQ-A-00001".into(),
            disposition: "applicable".into(),
            rationale: "r".into(),
            origin: "mechanical".into(),
        }];
        assert_eq!(status(&c, reqs.iter()), Status::Complete);
        c.impact_assessment.push(Assessment {
            requirement_id: "REQ-A-00002".into(),
            disposition: "bogus".into(),
            rationale: "r".into(),
            origin: "semantic".into(),
        });
        assert_eq!(status(&c, reqs.iter()), Status::Incomplete);
        c.impact_assessment_base_commit = "b".repeat(40);
        assert_eq!(status(&c, reqs.iter()), Status::Stale);
        let mut c = cs(&[], &[], &[]);
        c.impact_assessment = vec![Assessment {
            requirement_id: "REQ-A-00001".into(),
            disposition: "applicable".into(),
            rationale: "r".into(),
            origin: "mechanical".into(),
        }];
        assert_eq!(
            status(&c, reqs.iter()),
            Status::Stale,
            "a mechanical entry that is no longer a candidate"
        );
    }
}
