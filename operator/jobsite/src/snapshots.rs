//! What the Materializer reads from the spec store at a commit, decoded once and shared
//! (issue 35).
//!
//! A commit's tree never changes, so everything decoded from it — the spec store snapshot,
//! its validation, an index of its requirements for impact analysis, its test catalog — is a
//! pure function of the commit id and stays valid for ever. [`SnapshotAt`] holds them for one
//! commit (validation and the requirement index computed on first use); [`SnapshotCache`]
//! keeps the most recently used few, bounded in count and in the bytes read from the store,
//! so the N materializations of a flood of change sets merged together decode and validate
//! the store once instead of N times.
//!
//! The cache is a plain value held by its caller (an `Arc` shared by every materialization
//! of a process: the ChangeSet controller, a Job Site's contract source) and passed to
//! [`crate::materializer::read_facts_with`]; there is no global state. The caller reads a
//! commit on a miss; concurrent misses on one commit wait for a single read, and a failed
//! read is not kept. No answer depends on whether a commit was cached: every value served is
//! the one a fresh read of that commit would give.

use std::{
    collections::{BTreeSet, HashMap, VecDeque},
    sync::{
        Arc, Mutex, MutexGuard, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
};

use protobot_repo::catalog::CatalogEntry;
use protobot_spec::{
    diag::Diagnostic,
    impact,
    model::{ChangeSet, Requirement},
    snapshot::Snapshot,
    validate::{Scope, validate},
    vfs::{DirState, FileState, Vfs},
};

/// The spec store and test catalog of one commit, decoded, with what is derived from them
/// computed on first use.
#[derive(Debug)]
pub struct SnapshotAt {
    snapshot: Snapshot,
    /// Test-catalog entries (`None`: no catalog, or one that does not parse).
    catalog: Option<Vec<CatalogEntry>>,
    /// Bytes read from the commit (store files and catalog): the cache's weight.
    bytes: usize,
    diagnostics: OnceLock<Vec<Diagnostic>>,
    requirements: OnceLock<RequirementIndex>,
    verified_by: OnceLock<HashMap<String, Vec<usize>>>,
}

impl SnapshotAt {
    /// The decoded `snapshot` of a commit and the text of its test catalog, if any.
    pub fn new(snapshot: Snapshot, catalog_text: Option<&str>) -> SnapshotAt {
        let bytes = vfs_bytes(&snapshot.vfs) + catalog_text.map_or(0, str::len);
        SnapshotAt {
            snapshot,
            catalog: catalog_text.and_then(|t| protobot_repo::catalog::parse_catalog(t).ok()),
            bytes,
            diagnostics: OnceLock::new(),
            requirements: OnceLock::new(),
            verified_by: OnceLock::new(),
        }
    }

    /// The decoded spec store.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Bytes read from the commit to decode it (what the cache's byte bound counts).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// `validate(snapshot, Scope::default())`, computed once.
    pub fn diagnostics(&self) -> &[Diagnostic] {
        self.diagnostics
            .get_or_init(|| validate(&self.snapshot, &Scope::default()))
    }

    /// `impact::status(cs, every requirement of the snapshot)`, reading only the
    /// requirements that can bear on `cs` (its own, the ones its assessment names, and those
    /// sharing a scope, an interface or a relationship with it): the same answer at a cost
    /// independent of the store's size.
    pub fn impact_status(&self, cs: &ChangeSet) -> impact::Status {
        let index = self
            .requirements
            .get_or_init(|| RequirementIndex::of(&self.snapshot.requirements));
        let relevant = index.relevant(cs, &self.snapshot.requirements);
        impact::status(
            cs,
            relevant
                .iter()
                .filter_map(|i| self.snapshot.requirements.get(*i))
                .map(|r| &r.record),
        )
    }

    /// Files of the test-catalog entries that verify any of `requirements` (sorted, no
    /// duplicates; none without a catalog): what a build of them is expected to touch.
    pub fn touched_paths(&self, requirements: &[String]) -> Vec<String> {
        let Some(entries) = &self.catalog else {
            return Vec::new();
        };
        let verified_by = self.verified_by.get_or_init(|| {
            let mut by: HashMap<String, Vec<usize>> = HashMap::new();
            for (i, e) in entries.iter().enumerate() {
                for v in &e.verifies {
                    let at = by.entry(v.clone()).or_default();
                    if at.last() != Some(&i) {
                        at.push(i);
                    }
                }
            }
            by
        });
        let chosen: BTreeSet<usize> = requirements
            .iter()
            .filter_map(|r| verified_by.get(r))
            .flatten()
            .copied()
            .collect();
        let mut paths: Vec<String> = chosen
            .into_iter()
            .filter_map(|i| entries.get(i))
            .flat_map(|e| e.paths.iter().cloned())
            .collect();
        paths.sort();
        paths.dedup();
        paths
    }
}

/// Bytes of every file a [`Vfs`] holds.
fn vfs_bytes(vfs: &Vfs) -> usize {
    let file = |f: &FileState| f.bytes().map_or(0, <[u8]>::len);
    let stores: usize = vfs
        .stores
        .values()
        .map(|d| match d {
            DirState::Listing(entries) => entries.iter().map(|(n, f)| n.len() + file(f)).sum(),
            _ => 0,
        })
        .sum();
    file(&vfs.project_yaml)
        + file(&vfs.projection_yaml)
        + stores
        + vfs.artifacts.values().map(file).sum::<usize>()
}

/// Positions of a snapshot's requirement records by what impact analysis matches on.
#[derive(Debug, Default)]
struct RequirementIndex {
    by_id: HashMap<String, Vec<usize>>,
    by_scope: HashMap<String, Vec<usize>>,
    by_interface: HashMap<String, Vec<usize>>,
    /// Records with a relationship to the key.
    by_target: HashMap<String, Vec<usize>>,
}

impl RequirementIndex {
    fn of(records: &[protobot_spec::snapshot::Rec<Requirement>]) -> RequirementIndex {
        let mut index = RequirementIndex::default();
        let put = |map: &mut HashMap<String, Vec<usize>>, key: &str, i: usize| {
            let at = map.entry(key.to_owned()).or_default();
            if at.last() != Some(&i) {
                at.push(i);
            }
        };
        for (i, r) in records.iter().enumerate() {
            let r = &r.record;
            put(&mut index.by_id, &r.id, i);
            for s in r.scopes() {
                put(&mut index.by_scope, s, i);
            }
            for f in r.interfaces() {
                put(&mut index.by_interface, f, i);
            }
            for rel in &r.relationships {
                put(&mut index.by_target, &rel.target, i);
            }
        }
        index
    }

    /// Positions (in store order) of every record `impact::status(cs, …)` reads or can
    /// match: a superset of the candidates, every record of each ID it looks up by ID, so
    /// the status over them equals the status over the whole store.
    fn relevant(
        &self,
        cs: &ChangeSet,
        records: &[protobot_spec::snapshot::Rec<Requirement>],
    ) -> Vec<usize> {
        let mut out = BTreeSet::new();
        let mut add = |map: &HashMap<String, Vec<usize>>, key: &str| {
            if let Some(at) = map.get(key) {
                out.extend(at.iter().copied());
            }
        };
        let changed = impact::changed_ids(cs);
        let mut project_boundary = false;
        for id in &changed {
            add(&self.by_id, id);
            add(&self.by_target, id);
            for i in self.by_id.get(id).into_iter().flatten() {
                let Some(r) = records.get(*i) else { continue };
                project_boundary |= r.record.scopes().iter().any(|s| s == "project");
                for rel in &r.record.relationships {
                    add(&self.by_id, &rel.target);
                }
            }
        }
        for a in &cs.impact_assessment {
            add(&self.by_id, &a.requirement_id);
        }
        for f in cs.affected_interfaces() {
            add(&self.by_interface, f);
        }
        for s in &cs.affected_scopes {
            add(&self.by_scope, s);
        }
        if project_boundary {
            add(&self.by_scope, "project");
        }
        out.into_iter().collect()
    }
}

/// Counters of a [`SnapshotCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Lookups served from the cache.
    pub hits: u64,
    /// Lookups that read the commit.
    pub misses: u64,
    /// Commits held now.
    pub entries: usize,
    /// Bytes read from the commits held now.
    pub bytes: usize,
}

/// One commit's place in the cache: filled once, by the first lookup that reads it.
#[derive(Debug, Default)]
struct Slot {
    fill: Mutex<()>,
    value: OnceLock<Arc<SnapshotAt>>,
}

#[derive(Debug, Default)]
struct Entries {
    /// Most recently used first.
    slots: VecDeque<(git2::Oid, Arc<Slot>)>,
}

impl Entries {
    fn bytes(&self) -> usize {
        self.slots
            .iter()
            .filter_map(|(_, s)| s.value.get())
            .map(|v| v.bytes)
            .sum()
    }

    fn remove(&mut self, slot: &Arc<Slot>) {
        self.slots.retain(|(_, s)| !Arc::ptr_eq(s, slot));
    }
}

/// The decoded spec stores of the most recently used commits, shared by every
/// materialization that holds the same cache (see the module documentation).
#[derive(Debug)]
pub struct SnapshotCache {
    capacity: usize,
    max_bytes: usize,
    entries: Mutex<Entries>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl Default for SnapshotCache {
    /// [`SnapshotCache::DEFAULT_COMMITS`] commits, [`SnapshotCache::DEFAULT_BYTES`] bytes.
    fn default() -> SnapshotCache {
        SnapshotCache::new(SnapshotCache::DEFAULT_COMMITS, SnapshotCache::DEFAULT_BYTES)
    }
}

impl SnapshotCache {
    /// Commits a default cache holds: a registration burst reads two (the default
    /// branch's head and the merge commit, often the same), and a few bursts may overlap.
    pub const DEFAULT_COMMITS: usize = 4;
    /// Store bytes a default cache holds (its decoded records take a small multiple of it).
    pub const DEFAULT_BYTES: usize = 32 << 20;

    /// A cache of at most `commits` commits whose store files add up to at most `max_bytes`
    /// (a commit larger than that alone is read every time, never kept).
    pub fn new(commits: usize, max_bytes: usize) -> SnapshotCache {
        SnapshotCache {
            capacity: commits,
            max_bytes,
            entries: Mutex::new(Entries::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// A cache that keeps nothing: every lookup reads its commit.
    pub fn disabled() -> SnapshotCache {
        SnapshotCache::new(0, 0)
    }

    fn entries(&self) -> MutexGuard<'_, Entries> {
        // The entries stay consistent under a panic (every change is one call), so a
        // poisoned lock is taken over.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The decoded store at `commit`: from the cache, or `read` on a miss (then kept, within
    /// the bounds, unless `read` fails). Concurrent lookups of one commit read it once.
    pub fn get_or_read<E>(
        &self,
        commit: git2::Oid,
        read: impl FnOnce() -> Result<SnapshotAt, E>,
    ) -> Result<Arc<SnapshotAt>, E> {
        if self.capacity == 0 {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return read().map(Arc::new);
        }
        let slot = {
            let mut entries = self.entries();
            let slot = match entries.slots.iter().position(|(c, _)| *c == commit) {
                Some(at) => entries.slots.remove(at).map(|(_, s)| s),
                None => None,
            }
            .unwrap_or_default();
            entries.slots.push_front((commit, Arc::clone(&slot)));
            entries.slots.truncate(self.capacity);
            slot
        };
        if let Some(hit) = slot.value.get() {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Arc::clone(hit));
        }
        let _filling = slot.fill.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = slot.value.get() {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Arc::clone(hit));
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let value = match read() {
            Ok(v) => Arc::new(v),
            Err(e) => {
                self.entries().remove(&slot);
                return Err(e);
            }
        };
        let kept = Arc::clone(slot.value.get_or_init(|| Arc::clone(&value)));
        let mut entries = self.entries();
        if value.bytes > self.max_bytes {
            entries.remove(&slot);
        }
        // Least recently used out until the bytes fit (the one just read is first).
        while entries.bytes() > self.max_bytes && entries.slots.len() > 1 {
            entries.slots.pop_back();
        }
        Ok(kept)
    }

    /// Whether `commit` is held now (decoded or being read).
    pub fn contains(&self, commit: git2::Oid) -> bool {
        self.entries().slots.iter().any(|(c, _)| *c == commit)
    }

    /// Hits, misses and what is held now.
    pub fn stats(&self) -> CacheStats {
        let entries = self.entries();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: entries.slots.len(),
            bytes: entries.bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oid(n: u8) -> git2::Oid {
        git2::Oid::from_bytes(&[n; 20]).unwrap_or(git2::Oid::ZERO_SHA1)
    }

    /// A snapshot of a project whose one store holds a file of `size` bytes (decode
    /// problems are diagnostics: the snapshot opens all the same).
    /// A store holding only the requirement files of `listing`, decoded.
    fn requirements_at(listing: std::collections::BTreeMap<String, FileState>) -> SnapshotAt {
        let mut stores = std::collections::BTreeMap::new();
        stores.insert(
            ".protobot/requirements".to_owned(),
            DirState::Listing(listing),
        );
        let vfs = Vfs {
            protobot_is_dir: true,
            project_yaml: FileState::Bytes(
                b"schema_versions:\n  project: 1\n  specification: 1\n".to_vec(),
            ),
            projection_yaml: FileState::Absent,
            stores,
            artifacts: Default::default(),
        };
        match protobot_spec::snapshot::open(vfs) {
            Ok(s) => SnapshotAt::new(s, None),
            Err(f) => panic!("{}", f.message),
        }
    }

    fn sized(size: usize) -> SnapshotAt {
        let mut listing = std::collections::BTreeMap::new();
        listing.insert("x.yaml".to_owned(), FileState::Bytes(vec![b'#'; size]));
        requirements_at(listing)
    }

    #[test]
    fn a_commit_is_read_once_and_then_served() {
        let cache = SnapshotCache::new(2, usize::MAX);
        let first = cache.get_or_read(oid(1), || Ok::<_, ()>(sized(10)));
        let again = cache.get_or_read(oid(1), || Err(()));
        assert!(matches!((&first, &again), (Ok(a), Ok(b)) if Arc::ptr_eq(a, b)));
        assert_eq!((cache.stats().hits, cache.stats().misses), (1, 1));
    }

    #[test]
    fn another_commit_is_never_served_from_the_cache() {
        let cache = SnapshotCache::new(4, usize::MAX);
        let a = cache.get_or_read(oid(1), || Ok::<_, ()>(sized(10)));
        let mut read = false;
        let b = cache.get_or_read(oid(2), || {
            read = true;
            Ok::<_, ()>(sized(20))
        });
        assert!(read, "commit 2 was read, not served from commit 1");
        assert!(matches!((&a, &b), (Ok(a), Ok(b)) if !Arc::ptr_eq(a, b) && a.bytes() != b.bytes()));
    }

    #[test]
    fn a_failed_read_is_not_kept() {
        let cache = SnapshotCache::new(4, usize::MAX);
        assert!(
            cache
                .get_or_read(oid(1), || Err::<SnapshotAt, _>("io"))
                .is_err()
        );
        assert!(!cache.contains(oid(1)));
        assert!(cache.get_or_read(oid(1), || Ok::<_, ()>(sized(1))).is_ok());
        assert!(cache.contains(oid(1)));
        assert_eq!(cache.stats().misses, 2);
    }

    #[test]
    fn the_bounds_hold_least_recently_used_out() {
        let cache = SnapshotCache::new(3, usize::MAX);
        for n in 1..=10 {
            assert!(cache.get_or_read(oid(n), || Ok::<_, ()>(sized(10))).is_ok());
            // Commit 1 stays in use.
            assert!(cache.get_or_read(oid(1), || Ok::<_, ()>(sized(10))).is_ok());
            assert!(cache.stats().entries <= 3);
        }
        // Held: commit 1 (used every time) and the two read last.
        assert!(cache.contains(oid(1)) && cache.contains(oid(10)) && cache.contains(oid(9)));
        assert!(!cache.contains(oid(8)));
        // Bytes: three commits of ~1 KiB fit in 2.5 KiB only two at a time.
        let one = sized(1000).bytes();
        let cache = SnapshotCache::new(8, one * 5 / 2);
        for n in 1..=5 {
            assert!(
                cache
                    .get_or_read(oid(n), || Ok::<_, ()>(sized(1000)))
                    .is_ok()
            );
            assert!(cache.stats().bytes <= one * 5 / 2, "{:?}", cache.stats());
        }
        assert_eq!(cache.stats().entries, 2);
        assert!(cache.contains(oid(5)) && cache.contains(oid(4)));
        // A commit larger than the whole bound is served but not kept.
        let small = SnapshotCache::new(8, 100);
        assert!(
            small
                .get_or_read(oid(1), || Ok::<_, ()>(sized(1000)))
                .is_ok()
        );
        assert_eq!(small.stats().entries, 0);
        // A disabled cache keeps nothing.
        let off = SnapshotCache::disabled();
        assert!(off.get_or_read(oid(1), || Ok::<_, ()>(sized(1))).is_ok());
        assert!(off.get_or_read(oid(1), || Ok::<_, ()>(sized(1))).is_ok());
        assert_eq!(
            (off.stats().entries, off.stats().misses, off.stats().hits),
            (0, 2, 0)
        );
    }

    /// A store of requirements sharing scopes, interfaces and relationships, one retired,
    /// one project-wide, one without `applies_to`.
    fn related() -> SnapshotAt {
        let req = |id: &str,
                   scopes: &[&str],
                   interfaces: &[&str],
                   rels: &[(&str, &str)],
                   status: &str| {
            let mut y = format!("id: {id}\ntype: ubiquitous\ntext: The CLI shall work.\n");
            if !scopes.is_empty() || !interfaces.is_empty() {
                y += &format!(
                    "applies_to:\n  scopes: [{}]\n  interfaces: [{}]\n",
                    scopes.join(", "),
                    interfaces.join(", ")
                );
            }
            if !rels.is_empty() {
                y += "relationships:\n";
                for (kind, target) in rels {
                    y += &format!("  - type: {kind}\n    target: {target}\n");
                }
            }
            y += &format!("status: {status}\n");
            (format!("{id}.yaml"), FileState::Bytes(y.into_bytes()))
        };
        let listing = [
            req(
                "REQ-CLI-00001",
                &["a"],
                &["x"],
                &[("depends-on", "REQ-CLI-00002")],
                "active",
            ),
            req("REQ-CLI-00002", &["b"], &[], &[], "active"),
            req("REQ-CLI-00003", &["project"], &[], &[], "active"),
            req("REQ-CLI-00004", &["a", "project"], &[], &[], "retired"),
            req(
                "REQ-CLI-00005",
                &[],
                &["y"],
                &[("related-to", "REQ-CLI-00001")],
                "active",
            ),
            req("REQ-CLI-00006", &[], &[], &[], "active"),
            req(
                "REQ-CLI-00007",
                &["c"],
                &["x", "y"],
                &[("conflicts-with", "REQ-CLI-00003")],
                "active",
            ),
        ]
        .into_iter()
        .collect();
        requirements_at(listing)
    }

    #[test]
    fn impact_over_the_relevant_requirements_equals_impact_over_the_store() {
        use protobot_spec::model::{Assessment, RequirementOp};
        let at = related();
        assert_eq!(
            at.snapshot().requirements.len(),
            7,
            "{:?}",
            at.snapshot().load_diags
        );
        let all: Vec<&Requirement> = at
            .snapshot()
            .requirements
            .iter()
            .map(|r| &r.record)
            .collect();
        let ids = [
            "REQ-CLI-00001",
            "REQ-CLI-00002",
            "REQ-CLI-00003",
            "REQ-CLI-00005",
            "REQ-CLI-00009",
        ];
        let scopes = [&[][..], &["a"], &["b", "project"], &["z"]];
        let interfaces = [&[][..], &["x"], &["y"]];
        let (mut checked, mut matched) = (0, 0);
        for changed in 0..(1 << ids.len()) {
            for (s, scope) in scopes.iter().enumerate() {
                for (f, interface) in interfaces.iter().enumerate() {
                    for assessed in 0..3 {
                        let ops: Vec<RequirementOp> = ids
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| changed & (1 << i) != 0)
                            .map(|(i, id)| RequirementOp {
                                action: ["add", "revise", "retire"][i % 3].into(),
                                requirement_id: (*id).into(),
                                rationale: String::new(),
                            })
                            .collect();
                        let assessment = |id: &str, origin: &str| Assessment {
                            requirement_id: id.into(),
                            disposition: "applicable".into(),
                            rationale: "because".into(),
                            origin: origin.into(),
                        };
                        let cs = ChangeSet {
                            operations: Some(ops),
                            affected_scopes: scope.iter().map(|x| (*x).to_owned()).collect(),
                            affected_interfaces: Some(
                                interface.iter().map(|x| (*x).to_owned()).collect(),
                            ),
                            base_commit: "b".into(),
                            impact_assessment_base_commit: "b".into(),
                            impact_assessment: match assessed {
                                0 => vec![],
                                1 => vec![assessment("REQ-CLI-00001", "mechanical")],
                                _ => vec![
                                    assessment("REQ-CLI-00006", "semantic"),
                                    assessment("REQ-CLI-00007", "mechanical"),
                                    assessment("REQ-CLI-00008", "semantic"),
                                ],
                            },
                            ..ChangeSet::default()
                        };
                        let index = RequirementIndex::of(&at.snapshot().requirements);
                        let relevant: Vec<&Requirement> = index
                            .relevant(&cs, &at.snapshot().requirements)
                            .into_iter()
                            .filter_map(|i| at.snapshot().requirements.get(i))
                            .map(|r| &r.record)
                            .collect();
                        let whole = impact::candidates(&cs, all.iter().copied());
                        assert_eq!(
                            impact::candidates(&cs, relevant.iter().copied()),
                            whole,
                            "{s} {f} {changed:b} {assessed}"
                        );
                        assert_eq!(
                            at.impact_status(&cs),
                            impact::status(&cs, all.iter().copied()),
                            "{s} {f} {changed:b} {assessed}"
                        );
                        checked += 1;
                        matched += usize::from(!whole.is_empty());
                    }
                }
            }
        }
        assert!(
            checked > 1000 && matched > checked / 4,
            "{matched}/{checked}"
        );
    }

    #[test]
    fn concurrent_lookups_of_one_commit_read_it_once() {
        let cache = Arc::new(SnapshotCache::default());
        let reads = Arc::new(AtomicU64::new(0));
        // The four start together; whichever reads, the others wait for it or hit.
        let start = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (cache, reads, start) =
                    (Arc::clone(&cache), Arc::clone(&reads), Arc::clone(&start));
                std::thread::spawn(move || {
                    start.wait();
                    cache
                        .get_or_read(oid(7), || {
                            reads.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, ()>(related())
                        })
                        .is_ok()
                })
            })
            .collect();
        for t in threads {
            assert!(t.join().unwrap_or(false));
        }
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }
}
