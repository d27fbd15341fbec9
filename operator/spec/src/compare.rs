//! `change-set compare` (§21): what the change set touches and which
//! duplicates, conflicts, supersessions and cycles involve it. Pure; findings
//! are data, not failures.

use std::collections::{BTreeMap, BTreeSet};

use crate::{graph, impact, model::ChangeSet, model::Requirement, node::Node};

/// Compare result as JSON data.
pub fn compare(cs: &ChangeSet, reqs: &[&Requirement]) -> Node {
    let mut cs = cs.clone();
    cs.canonicalize();
    let changed = impact::changed_ids(&cs);
    let sorted = |mut v: Vec<(String, String)>| {
        v.sort();
        v
    };
    let mut changed_items = Vec::new();
    for (action, id) in sorted(
        cs.artifact_operations
            .iter()
            .map(|o| (o.action.clone(), o.artifact_id.clone()))
            .collect(),
    ) {
        changed_items.push(
            Node::map()
                .with("action", Node::s(action))
                .with("artifact_id", Node::s(id)),
        );
    }
    for (action, id) in sorted(
        cs.interface_operations
            .iter()
            .map(|o| (o.action.clone(), o.interface_id.clone()))
            .collect(),
    ) {
        changed_items.push(
            Node::map()
                .with("action", Node::s(action))
                .with("interface_id", Node::s(id)),
        );
    }
    for (action, id) in sorted(
        cs.ops()
            .iter()
            .map(|o| (o.action.clone(), o.requirement_id.clone()))
            .collect(),
    ) {
        changed_items.push(
            Node::map()
                .with("action", Node::s(action))
                .with("requirement_id", Node::s(id)),
        );
    }

    let mut by_text: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in reqs.iter().filter(|r| r.status() == "active") {
        by_text
            .entry(r.text.as_str())
            .or_default()
            .insert(r.id.as_str());
    }
    let mut dups: Vec<(Vec<String>, String)> = by_text
        .into_iter()
        .filter(|(_, ids)| ids.len() >= 2 && ids.iter().any(|i| changed.contains(*i)))
        .map(|(text, ids)| {
            (
                ids.into_iter().map(str::to_owned).collect(),
                text.to_owned(),
            )
        })
        .collect();
    dups.sort();

    let mut conflicts: BTreeSet<(String, String)> = BTreeSet::new();
    let mut supersession: BTreeSet<(String, String)> = BTreeSet::new();
    let mut graphs: BTreeMap<&str, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for r in reqs {
        for rel in &r.relationships {
            let touches = changed.contains(&r.id) || changed.contains(&rel.target);
            match rel.kind.as_str() {
                "conflicts-with" if touches => {
                    let (a, b) = if r.id <= rel.target {
                        (r.id.clone(), rel.target.clone())
                    } else {
                        (rel.target.clone(), r.id.clone())
                    };
                    conflicts.insert((a, b));
                }
                "supersedes" if touches => {
                    supersession.insert((r.id.clone(), rel.target.clone()));
                }
                _ => {}
            }
            if rel.kind == "depends-on" || rel.kind == "supersedes" {
                let g = graphs
                    .entry(if rel.kind == "depends-on" {
                        "depends-on"
                    } else {
                        "supersedes"
                    })
                    .or_default();
                g.entry(r.id.clone())
                    .or_default()
                    .insert(rel.target.clone());
            }
        }
    }
    let mut cycles: Vec<(String, String, Vec<String>)> = Vec::new();
    for (kind, g) in &graphs {
        for cycle in graph::elementary_cycles(g) {
            if cycle.iter().any(|v| changed.contains(v)) {
                cycles.push(((*kind).to_owned(), cycle.join("->"), cycle));
            }
        }
    }
    cycles.sort();

    Node::map()
        .with("change_set_id", Node::s(&cs.id))
        .with(
            "against_commit",
            Node::s(cs.base_commit.to_ascii_lowercase()),
        )
        .with("changed", Node::List(changed_items))
        .with(
            "exact_duplicates",
            Node::List(
                dups.into_iter()
                    .map(|(ids, text)| {
                        Node::map()
                            .with("requirement_ids", Node::strs(ids))
                            .with("text", Node::s(text))
                    })
                    .collect(),
            ),
        )
        .with(
            "declared_conflicts",
            Node::List(
                conflicts
                    .into_iter()
                    .map(|(a, b)| Node::map().with("requirement_ids", Node::strs([a, b])))
                    .collect(),
            ),
        )
        .with(
            "supersession",
            Node::List(
                supersession
                    .into_iter()
                    .map(|(a, b)| {
                        Node::map()
                            .with("requirement_id", Node::s(a))
                            .with("supersedes", Node::s(b))
                    })
                    .collect(),
            ),
        )
        .with(
            "dependency_cycles",
            Node::List(
                cycles
                    .into_iter()
                    .map(|(k, _, c)| {
                        Node::map()
                            .with("relationship", Node::s(k))
                            .with("cycle", Node::strs(c))
                    })
                    .collect(),
            ),
        )
        .with(
            "implementation_required",
            Node::Bool(cs.implementation_required.unwrap_or(false)),
        )
}
