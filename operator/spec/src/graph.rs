//! Directed-graph helpers over requirement IDs: back-edge cycle reports for
//! validation (§13) and all elementary cycles for compare (§21). Pure and
//! deterministic: vertices and successors are visited in sorted order.

use std::{
    borrow::Borrow,
    collections::{BTreeMap, BTreeSet, HashMap},
};

/// For each back edge found by a DFS in sorted order: the vertex where it
/// was found, and the cycle it closes (`A, B, …, A`, in DFS path order).
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
    // Only looked up, never iterated: a hash map keeps the order-free part
    // cheap on large stores.
    let mut marks: HashMap<&str, Mark> = edges.keys().map(|k| (k.borrow(), Mark::New)).collect();
    let mut out = Vec::new();
    for start in edges.keys() {
        let start: &str = start.borrow();
        if marks.get(start) != Some(&Mark::New) {
            continue;
        }
        // Iterative DFS with an explicit path stack.
        let mut stack: Vec<(&str, Vec<&str>, usize)> = Vec::new();
        let succ = |v: &str| -> Vec<&str> {
            let mut s: Vec<&str> = edges
                .get(v)
                .map(|t| t.iter().map(Borrow::borrow).collect())
                .unwrap_or_default();
            s.sort_unstable();
            s.dedup();
            s
        };
        marks.insert(start, Mark::Active);
        stack.push((start, succ(start), 0));
        while let Some((v, next, idx)) = stack.last_mut() {
            if *idx >= next.len() {
                marks.insert(v, Mark::Done);
                stack.pop();
                continue;
            }
            let w = next[*idx];
            *idx += 1;
            let v = *v;
            match marks.get(w).copied().unwrap_or(Mark::Done) {
                Mark::New => {
                    marks.insert(w, Mark::Active);
                    let s = succ(w);
                    stack.push((w, s, 0));
                }
                Mark::Active => {
                    let pos = stack.iter().position(|(x, _, _)| *x == w).unwrap_or(0);
                    let mut cycle: Vec<String> = stack[pos..]
                        .iter()
                        .map(|(x, _, _)| (*x).to_owned())
                        .collect();
                    cycle.push(w.to_owned());
                    out.push((v.to_owned(), cycle));
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
