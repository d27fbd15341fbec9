//! Directed-graph helpers over requirement IDs: back-edge cycle reports for
//! validation (§13) and all elementary cycles for compare (§21). Pure and
//! deterministic: vertices and successors are visited in sorted order.

use std::{
    borrow::Borrow,
    collections::{BTreeMap, BTreeSet},
};

/// For each back edge found by a DFS in sorted order: the vertex where it
/// was found, and the cycle it closes (`A, B, …, A`, in DFS path order).
/// Targets that are not keys are ignored.
pub fn back_edge_cycles<K>(edges: &BTreeMap<K, Vec<K>>) -> Vec<(String, Vec<String>)>
where
    K: Borrow<str> + Ord,
{
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Active,
        Done,
    }
    // Vertices by index in sorted order (the map's order), successors as
    // sorted, deduplicated indices: the DFS itself then neither hashes nor
    // allocates per step.
    let keys: Vec<&str> = edges.keys().map(Borrow::borrow).collect();
    let succ: Vec<Vec<usize>> = edges
        .values()
        .map(|targets| {
            let mut s: Vec<usize> = targets
                .iter()
                .filter_map(|t| keys.binary_search(&t.borrow()).ok())
                .collect();
            s.sort_unstable();
            s.dedup();
            s
        })
        .collect();
    let mut marks = vec![Mark::New; keys.len()];
    let mut out = Vec::new();
    // Iterative DFS with an explicit path stack of (vertex, next successor).
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for start in 0..keys.len() {
        if marks[start] != Mark::New {
            continue;
        }
        marks[start] = Mark::Active;
        stack.push((start, 0));
        while let Some((v, idx)) = stack.last_mut() {
            let v = *v;
            let Some(&w) = succ[v].get(*idx) else {
                marks[v] = Mark::Done;
                stack.pop();
                continue;
            };
            *idx += 1;
            match marks[w] {
                Mark::New => {
                    marks[w] = Mark::Active;
                    stack.push((w, 0));
                }
                Mark::Active => {
                    let pos = stack.iter().position(|(x, _)| *x == w).unwrap_or(0);
                    let mut cycle: Vec<String> = stack[pos..]
                        .iter()
                        .map(|(x, _)| keys[*x].to_owned())
                        .collect();
                    cycle.push(keys[w].to_owned());
                    out.push((keys[v].to_owned(), cycle));
                }
                Mark::Done => {}
            }
        }
    }
    out
}

/// All elementary cycles, each rotated to start at its smallest vertex and
/// closed by repeating it; sorted and unique. Dangling targets are vertices.
pub fn elementary_cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut vertices: BTreeSet<&str> = edges.keys().map(String::as_str).collect();
    for ts in edges.values() {
        vertices.extend(ts.iter().map(String::as_str));
    }
    let order: Vec<&str> = vertices.into_iter().collect();
    let mut out: BTreeSet<Vec<String>> = BTreeSet::new();
    // A simple search rooted at each vertex s, only through vertices > s:
    // every elementary cycle is found exactly once, from its smallest vertex.
    for (si, s) in order.iter().enumerate() {
        let allowed: BTreeSet<&str> = order[si..].iter().copied().collect();
        let mut path = vec![*s];
        let mut on_path: BTreeSet<&str> = BTreeSet::from([*s]);
        search(edges, s, &allowed, &mut path, &mut on_path, &mut out);
    }
    out.into_iter().collect()
}

fn search<'a>(
    edges: &'a BTreeMap<String, BTreeSet<String>>,
    start: &str,
    allowed: &BTreeSet<&str>,
    path: &mut Vec<&'a str>,
    on_path: &mut BTreeSet<&'a str>,
    out: &mut BTreeSet<Vec<String>>,
) {
    let Some(v) = path.last().copied() else {
        return;
    };
    let Some(next) = edges.get(v) else { return };
    for w in next {
        let w = w.as_str();
        if w == start {
            let mut cycle: Vec<String> = path.iter().map(|x| (*x).to_owned()).collect();
            cycle.push(start.to_owned());
            out.insert(cycle);
        } else if allowed.contains(w) && !on_path.contains(w) {
            path.push(w);
            on_path.insert(w);
            search(edges, start, allowed, path, on_path, out);
            on_path.remove(w);
            path.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(pairs: &[(&str, &str)]) -> BTreeMap<String, Vec<String>> {
        let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (a, b) in pairs {
            m.entry((*a).into()).or_default().push((*b).into());
            m.entry((*b).into()).or_default();
        }
        m
    }

    #[test]
    fn back_edges_report_cycles_and_self_loops() {
        assert_eq!(
            back_edge_cycles(&g(&[("A", "A")])),
            vec![("A".to_owned(), vec!["A".to_owned(), "A".to_owned()])]
        );
        let c = back_edge_cycles(&g(&[("A", "B"), ("B", "C"), ("C", "A")]));
        assert_eq!(
            c,
            vec![(
                "C".to_owned(),
                vec!["A", "B", "C", "A"]
                    .into_iter()
                    .map(String::from)
                    .collect::<Vec<_>>()
            )]
        );
        assert!(back_edge_cycles(&g(&[("A", "B"), ("A", "C"), ("B", "C")])).is_empty());
        // Targets that are not vertices are ignored; duplicates count once.
        let mut m: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        m.insert("A", vec!["Z", "B", "B"]);
        m.insert("B", vec!["A"]);
        m.insert("C", vec!["C", "A"]);
        assert_eq!(
            back_edge_cycles(&m),
            vec![
                (
                    "B".to_owned(),
                    vec!["A".to_owned(), "B".to_owned(), "A".to_owned()]
                ),
                ("C".to_owned(), vec!["C".to_owned(), "C".to_owned()]),
            ]
        );
    }

    #[test]
    fn elementary_cycles_are_rotated_and_closed() {
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in [("B", "C"), ("C", "B"), ("C", "A"), ("A", "B")] {
            m.entry(a.into()).or_default().insert(b.into());
        }
        let cycles = elementary_cycles(&m);
        assert_eq!(
            cycles,
            vec![
                vec!["A", "B", "C", "A"]
                    .into_iter()
                    .map(String::from)
                    .collect::<Vec<_>>(),
                vec!["B", "C", "B"]
                    .into_iter()
                    .map(String::from)
                    .collect::<Vec<_>>(),
            ]
        );
    }
}
