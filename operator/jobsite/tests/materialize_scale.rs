#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Materialization at scale (issue 35): a flood of change sets merged together into one
//! project repository, read back one registration after another through a
//! [`SnapshotCache`]. The cache never changes an answer (the same facts and refusals with
//! and without it), never serves one commit's store for another, and holds its bounds.
//!
//! `profile_a_flood` (ignored; run it with `--run-ignored only --no-capture`, and
//! `PROTOBOT_PROFILE_ITEMS` for another count than 200) prints where a materialization's time
//! goes: opening the repository, reading the store at a commit (`commit_vfs`), decoding it
//! (`snapshot::open`), finding the merge (`approved_merge`), impact status, validation, and
//! whole `read_facts` calls.

use std::{path::Path, time::Instant};

use protobot_jobsite::{
    materializer::{
        BugIntake, Registration, read_bug_facts, read_bug_facts_with, read_facts, read_facts_with,
        snapshot_at_commit,
    },
    snapshots::SnapshotCache,
    testing::{flood_repo, git},
};
use protobot_spec::{
    git::Git,
    impact, snapshot,
    validate::{Scope, validate},
};

fn registration(i: usize, merge: &str) -> Registration {
    Registration {
        project_id: "flood".into(),
        change_set_id: format!("CS-{i:05}"),
        merge_commit: Some(merge.into()),
        default_branch: "main".into(),
        depends_on: vec![],
        priority: "normal".into(),
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

#[test]
#[ignore = "a profile, not a check: prints where a flood's materializations spend their time"]
fn profile_a_flood() {
    let n: usize = std::env::var("PROTOBOT_PROFILE_ITEMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let sample: usize = std::env::var("PROTOBOT_PROFILE_SAMPLE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(n)
        .min(n);
    let tmp = tempfile::tempdir().unwrap();
    let t = Instant::now();
    let merge = flood_repo(tmp.path(), n);
    eprintln!("profile: authored {n} change sets in {:.0} ms", ms(t));
    // One materialization's phases, as `read_facts` runs them.
    let t = Instant::now();
    let repo = git2::Repository::open(tmp.path()).unwrap();
    let g = Git::discover(tmp.path()).unwrap();
    let open_repo = ms(t);
    let oid = git2::Oid::from_str(&merge).unwrap();
    let t = Instant::now();
    let vfs = g.commit_vfs(oid).unwrap();
    let read_vfs = ms(t);
    let t = Instant::now();
    let snap = snapshot::open(vfs).unwrap();
    let decode = ms(t);
    let t = Instant::now();
    let store_dir = snap
        .project
        .store_dir(protobot_spec::model::StoreKind::ChangeSets);
    protobot_repo::land::approved_merge(&repo, "refs/heads/main", "CS-00001", &store_dir).unwrap();
    let walk = ms(t);
    // One step of `approved_merge`'s first-parent walk: the manifest looked up in a commit's
    // tree (a change set merged k commits before the head costs k of them).
    let t = Instant::now();
    let manifest = format!("{store_dir}/cs-00001.yaml");
    for _ in 0..1000 {
        let commit = repo.find_commit(oid).unwrap();
        commit
            .tree()
            .unwrap()
            .get_path(Path::new(&manifest))
            .unwrap();
    }
    let step = ms(t) / 1000.0;
    let t = Instant::now();
    let cs = snap.change_set("CS-00001").unwrap().record.clone();
    let status = impact::status(&cs, snap.requirements.iter().map(|r| &r.record));
    let impact_ms = ms(t);
    let t = Instant::now();
    let diags = validate(&snap, &Scope::default());
    let validate_ms = ms(t);
    eprintln!(
        "profile: N={n}: open repository {open_repo:.1} ms, commit_vfs {read_vfs:.1} ms, snapshot::open {decode:.1} ms, approved_merge {walk:.1} ms (one step of its walk {step:.3} ms), impact::status {impact_ms:.2} ms ({status:?}), validate {validate_ms:.1} ms ({} diagnostics)",
        diags.len()
    );
    // Whole materializations, one after another (`PROTOBOT_PROFILE_SAMPLE` of them without a
    // cache, when asked; all of them with one): without a
    // cache (the store read and decoded at the head and at the merge, and validated, for
    // every change set: what `read_facts` did before issue 35), then through one shared cache.
    for (mode, cache, sample) in [
        ("without a cache", SnapshotCache::disabled(), sample),
        ("one shared cache", SnapshotCache::default(), n),
    ] {
        let t = Instant::now();
        for i in 1..=sample {
            let facts = read_facts_with(tmp.path(), &registration(i, &merge), &cache).unwrap();
            assert!(facts.check_errors.is_empty(), "{:?}", facts.check_errors);
        }
        let total = t.elapsed().as_secs_f64();
        eprintln!(
            "profile: N={n}: read_facts_with x{sample}, {mode}: {total:.2} s, {:.2} ms per item, {:.1} items/s ({:?})",
            total * 1000.0 / sample as f64,
            sample as f64 / total,
            cache.stats()
        );
    }
}

/// Merges change sets `ids` onto `main` in a merge commit of their own; returns it.
fn merge_more(dir: &Path, ids: std::ops::RangeInclusive<usize>) -> String {
    let base = git(dir, &["rev-parse", "HEAD"]);
    let branch = format!("cs/more-{}", ids.start());
    git(dir, &["checkout", "-q", "-b", &branch]);
    protobot_jobsite::testing::write_change_sets(dir, &base, ids);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "more change sets"]);
    git(dir, &["checkout", "-q", "main"]);
    git(
        dir,
        &["merge", "-q", "--no-ff", "-m", "Merge more", &branch],
    );
    git(dir, &["rev-parse", "HEAD"])
}

fn oid(hex: &str) -> git2::Oid {
    git2::Oid::from_str(hex).unwrap()
}

#[test]
fn the_cache_never_changes_the_facts() {
    let tmp = tempfile::tempdir().unwrap();
    let merge = flood_repo(tmp.path(), 5);
    let cache = SnapshotCache::default();
    for round in 0..2 {
        for i in 1..=5 {
            let reg = registration(i, &merge);
            let fresh = read_facts_with(tmp.path(), &reg, &SnapshotCache::disabled()).unwrap();
            assert_eq!(read_facts(tmp.path(), &reg).unwrap(), fresh);
            assert_eq!(
                read_facts_with(tmp.path(), &reg, &cache).unwrap(),
                fresh,
                "CS-{i:05}, round {round}"
            );
        }
    }
    // The head is the merge: one read for all ten registrations (two lookups each).
    assert_eq!((cache.stats().misses, cache.stats().hits), (1, 19));
    // Refusals are the same too.
    let refused = |cache: &SnapshotCache| {
        let mut wrong = registration(1, &"f".repeat(40));
        let mismatch = read_facts_with(tmp.path(), &wrong, cache)
            .unwrap_err()
            .to_string();
        wrong.change_set_id = "CS-00042".into();
        let missing = read_facts_with(tmp.path(), &wrong, cache)
            .unwrap_err()
            .to_string();
        (mismatch, missing)
    };
    assert_eq!(refused(&cache), refused(&SnapshotCache::disabled()));
    // A repository with a test catalog (touched paths) and impact candidates, and bug facts.
    let demo = tempfile::tempdir().unwrap();
    let (work, origin) = (demo.path().join("work"), demo.path().join("origin.git"));
    let merge = protobot_demo::example::author(&work, &origin).unwrap();
    let cache = SnapshotCache::default();
    let reg = Registration {
        project_id: "cli-sync".into(),
        ..registration(1, &merge)
    };
    let fresh = read_facts(&work, &reg).unwrap();
    assert!(!fresh.touched_paths.is_empty());
    for _ in 0..2 {
        assert_eq!(read_facts_with(&work, &reg, &cache).unwrap(), fresh);
    }
    let bug = BugIntake {
        project_id: "cli-sync".into(),
        bug_id: "GH-1".into(),
        violated_requirement_ids: vec!["REQ-CLI-00001".into()],
        scopes: vec![],
        default_branch: "main".into(),
        priority: "high".into(),
    };
    let fresh = read_bug_facts(&work, &bug).unwrap();
    for _ in 0..2 {
        assert_eq!(read_bug_facts_with(&work, &bug, &cache).unwrap(), fresh);
    }
}

#[test]
fn a_snapshot_at_another_commit_is_not_served_from_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let first = flood_repo(tmp.path(), 3);
    let cache = SnapshotCache::default();
    for i in 1..=3 {
        read_facts_with(tmp.path(), &registration(i, &first), &cache).unwrap();
    }
    assert!(cache.contains(oid(&first)));
    // main moves on: CS-00004 and CS-00005 merged in a commit of their own. The snapshot
    // cached at the first merge lacks them; the second merge is read.
    let second = merge_more(tmp.path(), 4..=5);
    let facts = read_facts_with(tmp.path(), &registration(4, &second), &cache).unwrap();
    assert_eq!(facts.merge_commit, second);
    assert_eq!(
        facts,
        read_facts(tmp.path(), &registration(4, &second)).unwrap()
    );
    assert!(cache.contains(oid(&first)) && cache.contains(oid(&second)));
    assert_eq!(cache.stats().misses, 2);
    // CS-00001 is still read at its own merge, not at the head.
    let facts = read_facts_with(tmp.path(), &registration(1, &first), &cache).unwrap();
    assert_eq!(
        facts,
        read_facts(tmp.path(), &registration(1, &first)).unwrap()
    );
    // The commit's snapshots differ where the stores do.
    let at = |c: &str| snapshot_at_commit(tmp.path(), oid(c), &cache).unwrap();
    assert!(at(&first).snapshot().change_set("CS-00004").is_none());
    assert!(at(&second).snapshot().change_set("CS-00004").is_some());
}

#[test]
fn the_cache_holds_at_most_its_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let mut merges = vec![flood_repo(tmp.path(), 1)];
    for i in 2..=5 {
        merges.push(merge_more(tmp.path(), i..=i));
    }
    let cache = SnapshotCache::new(2, usize::MAX);
    for (i, merge) in merges.iter().enumerate() {
        let reg = registration(i + 1, merge);
        let facts = read_facts_with(tmp.path(), &reg, &cache).unwrap();
        assert_eq!(facts, read_facts(tmp.path(), &reg).unwrap());
        assert!(cache.stats().entries <= 2, "{:?}", cache.stats());
    }
    // Held: the head (read by every registration) and the last merge (the head itself).
    assert!(cache.contains(oid(&merges[4])));
    assert!(!cache.contains(oid(&merges[0])));
    // A byte bound below one commit's store keeps none.
    let tiny = SnapshotCache::new(8, 16);
    read_facts_with(tmp.path(), &registration(1, &merges[0]), &tiny).unwrap();
    assert_eq!(tiny.stats().entries, 0);
    assert_eq!(tiny.stats().bytes, 0);
}
