//! Fixture builders shared by the integration tests.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use git2::{Oid, Repository, Signature, Time, build::TreeUpdateBuilder};
use protobot_repo::{
    catalog::ChangeScope,
    export::{ExportReport, ExportRequest, ProjectionRecord, export_projection},
    role::Role,
};
use sha2::{Digest, Sha256};
use tempfile::TempDir;

pub const FILE: i32 = 0o100644;
pub const LINK: i32 = 0o120000;

/// The projection manifest of the canonical fixture.
pub const MANIFEST: &str = "version: 1
paths:
  - path: docs/
    class: shared
  - path: Cargo.toml
    class: shared
  - path: src/
    class: implementation
  - path: tests/
    class: test
  - path: tests/fixtures/impl_helper.rs
    class: implementation
  - path: ci/
    class: integration-only
  - path: .protobot/projection.yaml
    class: shared
";

/// Catalog: one valid test, one on a revised requirement, one legacy.
pub const CATALOG: &str = concat!(
    "{\"test_id\":\"T-VALID\",\"paths\":[\"tests/valid.rs\"],\"verifies\":[\"REQ-CLI-00001\"]}\n",
    "{\"test_id\":\"T-STALE\",\"paths\":[\"tests/stale.rs\"],\"verifies\":[\"REQ-CLI-00001\",\"REQ-CLI-00002\"]}\n",
    "{\"test_id\":\"T-LEGACY\",\"paths\":[\"tests/legacy.rs\"]}\n",
);

/// Implementation content whose blob must never reach Worker A.
pub const SECRET_IMPL: &[u8] = b"pub fn secret_implementation() -> u32 { 42 }\n";

pub fn scope() -> ChangeScope {
    ChangeScope {
        revised: ["REQ-CLI-00002".to_string()].into(),
        ..ChangeScope::default()
    }
}

/// Files of the canonical fixture: (path, content, mode).
pub fn canonical_files() -> Vec<(&'static str, Vec<u8>, i32)> {
    vec![
        (
            ".protobot/projection.yaml",
            MANIFEST.as_bytes().to_vec(),
            FILE,
        ),
        (
            ".protobot/test-catalog.jsonl",
            CATALOG.as_bytes().to_vec(),
            FILE,
        ),
        (
            ".protobot/attestations/WI-00001/findings.jsonl",
            b"{}\n".to_vec(),
            FILE,
        ),
        (
            "Cargo.toml",
            b"[package]\nname = \"fixture\"\n".to_vec(),
            FILE,
        ),
        ("README.md", b"unclassified readme\n".to_vec(), FILE),
        ("docs/vision.md", b"# Vision\n".to_vec(), FILE),
        ("docs/impl-link", b"../src/lib.rs".to_vec(), LINK),
        ("src/lib.rs", SECRET_IMPL.to_vec(), FILE),
        (
            "src/tests/mod.rs",
            b"// implementation module named tests\n".to_vec(),
            FILE,
        ),
        (
            "src/test_helpers.rs",
            b"// implementation with test in its name\n".to_vec(),
            FILE,
        ),
        (
            "Src/shadow.rs",
            b"// unclassified: classification is case-sensitive\n".to_vec(),
            FILE,
        ),
        ("tests/valid.rs", b"#[test] fn valid() {}\n".to_vec(), FILE),
        ("tests/stale.rs", b"#[test] fn stale() {}\n".to_vec(), FILE),
        (
            "tests/legacy.rs",
            b"#[test] fn legacy() {}\n".to_vec(),
            FILE,
        ),
        (
            "tests/fixtures/impl_helper.rs",
            b"// implementation inside tests/\n".to_vec(),
            FILE,
        ),
        ("ci/run.sh", b"#!/bin/sh\ncargo test\n".to_vec(), 0o100755),
    ]
}

pub struct Canonical {
    pub dir: TempDir,
    pub repo: Repository,
    pub head: Oid,
}

impl Canonical {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A canonical repository whose `main` holds [`canonical_files`], plus a history commit
/// with an implementation file that was later deleted and a dangling implementation blob.
pub fn canonical() -> Canonical {
    let dir = TempDir::new().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let first = commit_files(
        &repo,
        "refs/heads/main",
        &[(
            "src/old_secret.rs",
            Some(b"// historical implementation\n".to_vec()),
            FILE,
        )],
        "history",
        1,
    );
    let _ = first;
    let mut changes: Vec<(&str, Option<Vec<u8>>, i32)> = canonical_files()
        .into_iter()
        .map(|(p, c, m)| (p, Some(c), m))
        .collect();
    changes.push(("src/old_secret.rs", None, FILE));
    let head = commit_files(&repo, "refs/heads/main", &changes, "fixture", 2);
    repo.set_head("refs/heads/main").unwrap();
    // An unreachable implementation object in the canonical object database.
    repo.blob(b"// dangling implementation object\n").unwrap();
    Canonical { dir, repo, head }
}

/// Applies `changes` (None = delete) on top of `refname` (or an empty tree) and moves it.
pub fn commit_files(
    repo: &Repository,
    refname: &str,
    changes: &[(&str, Option<Vec<u8>>, i32)],
    message: &str,
    when: i64,
) -> Oid {
    let parent = repo
        .find_reference(refname)
        .ok()
        .and_then(|r| r.peel_to_commit().ok());
    let base = match &parent {
        Some(c) => c.tree().unwrap(),
        None => repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap(),
    };
    let mut update = TreeUpdateBuilder::new();
    for (path, content, mode) in changes {
        match content {
            Some(bytes) => {
                let blob = repo.blob(bytes).unwrap();
                let file_mode = match *mode {
                    0o100755 => git2::FileMode::BlobExecutable,
                    0o120000 => git2::FileMode::Link,
                    0o160000 => git2::FileMode::Commit,
                    _ => git2::FileMode::Blob,
                };
                update.upsert(*path, blob, file_mode);
            }
            None => {
                update.remove(*path);
            }
        }
    }
    let tree = repo
        .find_tree(update.create_updated(repo, &base).unwrap())
        .unwrap();
    let sig = Signature::new("Fixture", "fixture@example.invalid", &Time::new(when, 0)).unwrap();
    let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
    repo.commit(Some(refname), &sig, &sig, message, &tree, &parents)
        .unwrap()
}

/// Writes a two-parent merge commit onto `refname`.
pub fn merge_onto(repo: &Repository, refname: &str, theirs: Oid, message: &str, when: i64) -> Oid {
    let ours = repo
        .find_reference(refname)
        .unwrap()
        .peel_to_commit()
        .unwrap();
    let theirs = repo.find_commit(theirs).unwrap();
    let mut index = repo.merge_commits(&ours, &theirs, None).unwrap();
    assert!(!index.has_conflicts());
    let tree = repo.find_tree(index.write_tree_to(repo).unwrap()).unwrap();
    let sig = Signature::new("Fixture", "fixture@example.invalid", &Time::new(when, 0)).unwrap();
    repo.commit(Some(refname), &sig, &sig, message, &tree, &[&ours, &theirs])
        .unwrap()
}

pub struct Projection {
    pub _dir: TempDir,
    pub path: PathBuf,
    pub report: ExportReport,
    pub record: ProjectionRecord,
}

pub fn project(source: &Path, role: Role) -> Projection {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("workspace");
    let report = export_projection(&ExportRequest {
        source_repo: source.to_owned(),
        at: "refs/heads/main".into(),
        role,
        dest: path.clone(),
        scope: scope(),
    })
    .unwrap();
    let record = report.record.clone();
    assert_eq!(ProjectionRecord::read(&report.record_path).unwrap(), record);
    Projection {
        _dir: dir,
        path,
        report,
        record,
    }
}

/// Working-tree files of a directory, `.git` excluded, relative paths.
pub fn worktree_files(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            if path.file_name().is_some_and(|n| n == ".git") {
                continue;
            }
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if entry.file_type().unwrap().is_dir() {
                walk(root, &path, out);
            } else {
                out.insert(rel, fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// SHA-256 over every file (path and bytes) under `dir`, to prove nothing changed.
pub fn dir_fingerprint(dir: &Path) -> String {
    fn walk(root: &Path, dir: &Path, h: &mut Sha256) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            h.update(
                path.strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .as_bytes(),
            );
            if path.is_dir() {
                walk(root, &path, h);
            } else {
                h.update(fs::read(&path).unwrap());
            }
        }
    }
    let mut h = Sha256::new();
    walk(dir, dir, &mut h);
    hex::encode(h.finalize())
}

/// Commits the worker's changes inside a projection, as a Worker would.
pub fn worker_commit(
    projection: &Path,
    changes: &[(&str, Option<Vec<u8>>, i32)],
    message: &str,
) -> Oid {
    let repo = Repository::open(projection).unwrap();
    commit_files(&repo, "refs/heads/main", changes, message, 100)
}
