//! product_tree_digest, attestation snapshot, merge into main, push guard and crash-rerun.

use git2::{Oid, Repository};
use protobot_repo::{
    digest::product_tree_digest,
    integrate::ensure_work_item_branch,
    land::{
        AttestationFile, LandError, commit_attestation, find_merge_by_trailer, land_work_item,
        merge_into_main, push_with_guard, remote_head,
    },
    trailers,
};
use tempfile::TempDir;

use crate::{
    integration::work_item,
    util::{FILE, canonical, commit_files},
};

struct Landing {
    _origin_dir: TempDir,
    origin: Repository,
    canonical: crate::util::Canonical,
}

/// A bare origin holding the canonical main, and a work-item branch with one new commit.
fn landing() -> Landing {
    let canonical = canonical();
    let origin_dir = TempDir::new().unwrap();
    let origin = Repository::init_bare(origin_dir.path()).unwrap();
    canonical
        .repo
        .remote("origin", origin_dir.path().to_str().unwrap())
        .unwrap();
    push_with_guard(
        &canonical.repo,
        "origin",
        "refs/heads/main",
        "refs/heads/main",
        None,
    )
    .unwrap();
    let wi = work_item();
    ensure_work_item_branch(&canonical.repo, &wi, canonical.head).unwrap();
    commit_files(
        &canonical.repo,
        &wi.branch_ref(),
        &[("src/retry.rs", Some(b"pub fn retry() {}\n".to_vec()), FILE)],
        "work",
        50,
    );
    Landing {
        _origin_dir: origin_dir,
        origin,
        canonical,
    }
}

fn origin_main(l: &Landing) -> Oid {
    l.origin
        .find_reference("refs/heads/main")
        .unwrap()
        .target()
        .unwrap()
}

fn merges_for(repo: &Repository, tip: Oid, id: &str) -> usize {
    let mut n = 0;
    let mut c = Some(repo.find_commit(tip).unwrap());
    while let Some(commit) = c {
        if commit.parent_count() == 2
            && trailers::value(
                &trailers::parse(commit.message().unwrap()),
                trailers::WORK_ITEM,
            ) == Some(id)
        {
            n += 1;
        }
        c = commit.parent(0).ok();
    }
    n
}

#[test]
fn digest_is_stable_across_clones_and_ignores_attestation_paths() {
    let l = landing();
    let a = TempDir::new().unwrap();
    let b = TempDir::new().unwrap();
    let url = l._origin_dir.path().to_str().unwrap();
    let clone_a = Repository::clone(url, a.path()).unwrap();
    let clone_b = Repository::clone(url, b.path()).unwrap();
    let head = origin_main(&l);
    let da = product_tree_digest(&clone_a, head).unwrap();
    let db = product_tree_digest(&clone_b, head).unwrap();
    assert_eq!(da, db);
    assert_eq!(da, product_tree_digest(&l.canonical.repo, head).unwrap());

    let repo = &l.canonical.repo;
    let attested = commit_files(
        repo,
        "refs/heads/main",
        &[(
            ".protobot/attestations/WI-00002/report.md",
            Some(b"# ok\n".to_vec()),
            FILE,
        )],
        "attest",
        60,
    );
    assert_eq!(product_tree_digest(repo, attested).unwrap(), da);
    let integration_only = commit_files(
        repo,
        "refs/heads/main",
        &[("ci/run.sh", Some(b"#!/bin/sh\n".to_vec()), FILE)],
        "ci",
        61,
    );
    assert_ne!(
        product_tree_digest(repo, integration_only).unwrap(),
        da,
        "mode and content of ci/ count"
    );
}

#[test]
fn attestation_snapshot_keeps_the_digest_or_is_refused() {
    let l = landing();
    let repo = &l.canonical.repo;
    let wi = work_item();
    let candidate = repo
        .find_reference(&wi.branch_ref())
        .unwrap()
        .target()
        .unwrap();
    let sealed = product_tree_digest(repo, candidate).unwrap();
    let files = vec![
        AttestationFile {
            path: ".protobot/attestations/WI-00042/findings.jsonl".into(),
            content: b"{\"seq\":1}\n".to_vec(),
        },
        AttestationFile {
            path: ".protobot/attestations/WI-00042/report.md".into(),
            content: b"# Report\n".to_vec(),
        },
    ];

    let wrong = commit_attestation(repo, &wi, &files, "sha256:00", 70).unwrap_err();
    assert!(matches!(wrong, LandError::DigestChanged { .. }), "{wrong}");
    assert_eq!(
        repo.find_reference(&wi.branch_ref())
            .unwrap()
            .target()
            .unwrap(),
        candidate
    );

    let outside = vec![AttestationFile {
        path: "src/report.md".into(),
        content: b"x".to_vec(),
    }];
    assert!(matches!(
        commit_attestation(repo, &wi, &outside, &sealed, 70),
        Err(LandError::AttestationPath { .. })
    ));

    let done = commit_attestation(repo, &wi, &files, &sealed, 70).unwrap();
    assert_eq!(done.parent, candidate.to_string());
    assert_eq!(done.product_tree_digest, sealed);
}

#[test]
fn landing_creates_one_merge_commit_with_a_work_item_trailer() {
    let l = landing();
    let repo = &l.canonical.repo;
    let before = origin_main(&l);
    let outcome = land_work_item(repo, &work_item(), "origin", "main", 80).unwrap();
    assert!(outcome.pushed && !outcome.already_merged);
    let merge_id = Oid::from_str(&outcome.merge_commit).unwrap();
    assert_eq!(origin_main(&l), merge_id);
    let merge = l.origin.find_commit(merge_id).unwrap();
    assert_eq!(
        merge.parent_count(),
        2,
        "main is an ancestor of wi/, still no fast-forward"
    );
    assert_eq!(merge.parent_id(0).unwrap(), before);
    let found = trailers::parse(merge.message().unwrap());
    assert_eq!(
        trailers::value(&found, trailers::WORK_ITEM),
        Some("WI-00042")
    );
    assert_eq!(
        find_merge_by_trailer(&l.origin, merge_id, "WI-00042").unwrap(),
        Some(merge_id)
    );
    assert_eq!(
        find_merge_by_trailer(&l.origin, merge_id, "WI-00043").unwrap(),
        None
    );
}

#[test]
fn a_crash_between_push_and_verification_reruns_into_exactly_one_merge() {
    let l = landing();
    let repo = &l.canonical.repo;
    let wi = work_item();
    let remote_before = origin_main(&l);
    // First attempt: merge and push, then "crash" before verification and the WMS write.
    merge_into_main(repo, &wi, "refs/heads/main", 90).unwrap();
    push_with_guard(
        repo,
        "origin",
        "refs/heads/main",
        "refs/heads/main",
        Some(remote_before),
    )
    .unwrap();
    // Rerun from scratch.
    let outcome = land_work_item(repo, &wi, "origin", "main", 91).unwrap();
    assert!(outcome.already_merged && !outcome.pushed);
    assert_eq!(merges_for(&l.origin, origin_main(&l), "WI-00042"), 1);
    // And once more, for good measure.
    land_work_item(repo, &wi, "origin", "main", 92).unwrap();
    assert_eq!(merges_for(&l.origin, origin_main(&l), "WI-00042"), 1);
}

#[test]
fn the_push_guard_refuses_when_the_remote_moved_and_pushes_nothing() {
    let l = landing();
    let repo = &l.canonical.repo;
    let guard = remote_head(repo, "origin", "refs/heads/main").unwrap();
    // Someone else pushes to origin main after the guard was read.
    let other_dir = TempDir::new().unwrap();
    let other =
        Repository::clone(l._origin_dir.path().to_str().unwrap(), other_dir.path()).unwrap();
    let tracked = other
        .find_reference("refs/remotes/origin/main")
        .unwrap()
        .target()
        .unwrap();
    other
        .reference("refs/heads/main", tracked, true, "track origin main")
        .unwrap();
    commit_files(
        &other,
        "refs/heads/main",
        &[("docs/other.md", Some(b"other\n".to_vec()), FILE)],
        "other",
        95,
    );
    push_with_guard(
        &other,
        "origin",
        "refs/heads/main",
        "refs/heads/main",
        guard,
    )
    .unwrap();
    let moved = origin_main(&l);

    merge_into_main(repo, &work_item(), "refs/heads/main", 96).unwrap();
    let err =
        push_with_guard(repo, "origin", "refs/heads/main", "refs/heads/main", guard).unwrap_err();
    assert!(matches!(err, LandError::RemoteMoved { .. }), "{err}");
    assert_eq!(origin_main(&l), moved, "nothing was pushed");
    assert_eq!(merges_for(&l.origin, moved, "WI-00042"), 0);
}

#[test]
fn a_crash_before_the_push_reruns_into_exactly_one_merge() {
    let l = landing();
    let repo = &l.canonical.repo;
    let wi = work_item();
    // First attempt merged locally and crashed before pushing.
    merge_into_main(repo, &wi, "refs/heads/main", 100).unwrap();
    let outcome = land_work_item(repo, &wi, "origin", "main", 101).unwrap();
    assert!(outcome.pushed && !outcome.already_merged);
    assert_eq!(merges_for(&l.origin, origin_main(&l), "WI-00042"), 1);
    assert!(
        repo.find_reference("refs/protobot/landing/WI-00042")
            .is_err()
    );
}

#[test]
fn landing_after_the_remote_moved_merges_onto_the_new_head() {
    let l = landing();
    let repo = &l.canonical.repo;
    let other_dir = TempDir::new().unwrap();
    let other =
        Repository::clone(l._origin_dir.path().to_str().unwrap(), other_dir.path()).unwrap();
    let tracked = other
        .find_reference("refs/remotes/origin/main")
        .unwrap()
        .target()
        .unwrap();
    other
        .reference("refs/heads/main", tracked, true, "track")
        .unwrap();
    let theirs = commit_files(
        &other,
        "refs/heads/main",
        &[("docs/other.md", Some(b"x".to_vec()), FILE)],
        "other",
        110,
    );
    push_with_guard(
        &other,
        "origin",
        "refs/heads/main",
        "refs/heads/main",
        Some(tracked),
    )
    .unwrap();

    let outcome = land_work_item(repo, &work_item(), "origin", "main", 111).unwrap();
    let merge = l
        .origin
        .find_commit(Oid::from_str(&outcome.merge_commit).unwrap())
        .unwrap();
    assert_eq!(
        merge.parent_id(0).unwrap(),
        theirs,
        "first parent is the moved remote head"
    );
    assert_eq!(origin_main(&l), merge.id());
}
