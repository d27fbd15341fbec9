//! Pull dispatch: which ready work items a Job Site claims next.
//!
//! Human business priority is authoritative. Within a priority, items whose
//! declared scopes and touched paths do not overlap running work (or items
//! already picked) come first, then older items, then the id for a total order.
//! The WIP limit caps running plus picked items. There is no push scheduler:
//! every Job Site replica runs this over what it reads and claims with CAS, so
//! two replicas picking the same item is harmless (one gets `DUPLICATE_CLAIM`).

use std::collections::BTreeSet;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Human business priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Lowest.
    Low,
    /// Default.
    Normal,
    /// High.
    High,
    /// Highest.
    Urgent,
}

impl Priority {
    /// Parses the WMS snapshot; anything unknown or empty is `normal`.
    pub fn from_snapshot(s: &str) -> Priority {
        match s {
            "low" => Priority::Low,
            "high" => Priority::High,
            "urgent" => Priority::Urgent,
            _ => Priority::Normal,
        }
    }
}

/// What dispatch knows of one work item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// Work-item id.
    pub id: String,
    /// Business priority.
    pub priority: Priority,
    /// When it became ready.
    pub ready_since: Timestamp,
    /// Declared scopes (interfaces, components).
    pub scopes: BTreeSet<String>,
    /// Paths it is expected to touch (prefixes).
    pub paths: BTreeSet<String>,
}

impl Footprint {
    /// Whether two items may conflict: a shared scope, or one path a prefix of another.
    pub fn overlaps(&self, other: &Footprint) -> bool {
        if !self.scopes.is_disjoint(&other.scopes) {
            return true;
        }
        self.paths.iter().any(|a| {
            other
                .paths
                .iter()
                .any(|b| is_prefix_path(a, b) || is_prefix_path(b, a))
        })
    }
}

fn is_prefix_path(prefix: &str, path: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// Picks up to `wip_limit - running.len()` items to claim, in claim order.
pub fn plan(ready: &[Footprint], running: &[Footprint], wip_limit: usize) -> Vec<String> {
    let slots = wip_limit.saturating_sub(running.len());
    let mut pool: Vec<&Footprint> = ready.iter().collect();
    let mut picked: Vec<&Footprint> = Vec::new();
    while picked.len() < slots && !pool.is_empty() {
        let busy: Vec<&Footprint> = running.iter().chain(picked.iter().copied()).collect();
        let conflicts = |f: &Footprint| busy.iter().any(|b| b.overlaps(f));
        // Highest priority first; then conflict-free; then oldest; then id.
        pool.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(conflicts(a).cmp(&conflicts(b)))
                .then(a.ready_since.cmp(&b.ready_since))
                .then(a.id.cmp(&b.id))
        });
        picked.push(pool.remove(0));
    }
    picked.into_iter().map(|f| f.id.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(id: &str, priority: Priority, minute: i64, paths: &[&str]) -> Footprint {
        Footprint {
            id: id.into(),
            priority,
            ready_since: Timestamp::from_second(minute * 60).unwrap(),
            scopes: BTreeSet::new(),
            paths: paths.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn priority_beats_age() {
        let ready = [
            item("old-normal", Priority::Normal, 1, &[]),
            item("new-urgent", Priority::Urgent, 9, &[]),
        ];
        assert_eq!(plan(&ready, &[], 1), ["new-urgent"]);
    }

    #[test]
    fn age_orders_equal_priorities() {
        let ready = [
            item("b", Priority::High, 5, &[]),
            item("a", Priority::High, 2, &[]),
            item("c", Priority::High, 2, &[]),
        ];
        assert_eq!(plan(&ready, &[], 3), ["a", "c", "b"]);
    }

    #[test]
    fn wip_limit_counts_running_items() {
        let ready = [
            item("a", Priority::Normal, 1, &[]),
            item("b", Priority::Normal, 2, &[]),
        ];
        let running = [item("r", Priority::Normal, 0, &[])];
        assert_eq!(plan(&ready, &running, 2), ["a"]);
        assert!(plan(&ready, &running, 1).is_empty());
    }

    #[test]
    fn disjoint_paths_are_preferred_within_a_priority() {
        let running = [item("r", Priority::Normal, 0, &["src/sync"])];
        let ready = [
            item("overlapping", Priority::Normal, 1, &["src/sync/engine.py"]),
            item("disjoint", Priority::Normal, 2, &["src/report"]),
        ];
        assert_eq!(plan(&ready, &running, 2), ["disjoint"]);
        assert_eq!(plan(&ready, &running, 3), ["disjoint", "overlapping"]);
    }

    #[test]
    fn conflicts_never_outrank_priority() {
        let running = [item("r", Priority::Normal, 0, &["src"])];
        let ready = [
            item("urgent-overlap", Priority::Urgent, 5, &["src/a"]),
            item("low-free", Priority::Low, 1, &["docs"]),
        ];
        assert_eq!(plan(&ready, &running, 2), ["urgent-overlap"]);
    }

    #[test]
    fn path_prefixes_respect_segment_boundaries() {
        let a = item("a", Priority::Normal, 0, &["src/sync"]);
        let b = item("b", Priority::Normal, 0, &["src/synchronize"]);
        assert!(!a.overlaps(&b));
        let mut c = item("c", Priority::Normal, 0, &[]);
        c.scopes.insert("cli".into());
        let mut d = item("d", Priority::Normal, 0, &[]);
        d.scopes.insert("cli".into());
        assert!(c.overlaps(&d));
        assert_eq!(Priority::from_snapshot(""), Priority::Normal);
    }
}
