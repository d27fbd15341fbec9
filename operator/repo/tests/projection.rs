//! Role projections contain exactly their allowlist, and nothing of the canonical repository.

use std::{collections::BTreeSet, fs};

use git2::{Oid, Repository};
use protobot_repo::{
    catalog::ChangeScope,
    export::{ExportError, ExportRequest, export_projection},
    manifest::PathClass,
    role::Role,
};

use crate::util::{
    FILE, Projection, SECRET_IMPL, canonical, commit_files, project, scope, worktree_files,
};

fn paths(files: &std::collections::BTreeMap<String, Vec<u8>>) -> BTreeSet<&str> {
    files.keys().map(String::as_str).collect()
}

#[test]
fn worker_a_sees_shared_and_valid_tests_only_even_with_tricky_paths() {
    let canonical = canonical();
    let p = project(canonical.path(), Role::WorkerA);
    let files = worktree_files(&p.path);
    assert_eq!(
        paths(&files),
        BTreeSet::from([
            ".protobot/projection.yaml",
            "Cargo.toml",
            "docs/vision.md",
            "tests/valid.rs"
        ]),
        "implementation inside tests/, src/tests/, stale, legacy, unclassified, symlinks and \
         integration-only paths must all be withheld"
    );
    assert!(files.values().all(|c| c.as_slice() != SECRET_IMPL));
    assert_eq!(
        p.report.exported_by_class.get(&PathClass::Implementation),
        None
    );
    assert_eq!(
        p.report.withheld.by_reason.get("quarantined-test"),
        Some(&1)
    );
    assert_eq!(p.report.withheld.by_reason.get("legacy-test"), Some(&1));
    assert_eq!(
        p.report.withheld.by_reason.get("unsupported-mode"),
        Some(&1)
    );
}

/// Exports Worker A's projection of `at` with the fixture's scope and `build_base`.
fn project_a_at(
    source: &std::path::Path,
    at: &str,
    build_base: Option<String>,
) -> BTreeSet<String> {
    let dir = tempfile::TempDir::new().unwrap();
    let dest = dir.path().join("a");
    let mut scope = scope();
    scope.build_base = build_base;
    export_projection(&ExportRequest {
        source_repo: source.to_owned(),
        at: at.into(),
        role: Role::WorkerA,
        dest: dest.clone(),
        scope,
    })
    .unwrap();
    worktree_files(&dest).into_keys().collect()
}

#[test]
fn worker_a_sees_uncatalogued_tests_and_every_test_its_own_build_wrote() {
    let canonical = canonical();
    let base = canonical.head;
    // An earlier build's test, never catalogued, is on main; this build rewrites the
    // quarantined test and adds one of its own.
    commit_files(
        &canonical.repo,
        "refs/heads/main",
        &[(
            "tests/earlier_build.rs",
            Some(b"#[test] fn earlier() {}\n".to_vec()),
            FILE,
        )],
        "an earlier build",
        3,
    );
    let on_main = project_a_at(canonical.path(), "refs/heads/main", None);
    assert!(on_main.contains("tests/earlier_build.rs"), "{on_main:?}");
    assert!(!on_main.contains("tests/stale.rs") && !on_main.contains("tests/legacy.rs"));
    let build_base = canonical.repo.refname_to_id("refs/heads/main").unwrap();
    canonical
        .repo
        .reference("refs/heads/wi", build_base, true, "cut the build branch")
        .unwrap();
    commit_files(
        &canonical.repo,
        "refs/heads/wi",
        &[
            (
                "tests/stale.rs",
                Some(b"#[test] fn replaced() {}\n".to_vec()),
                FILE,
            ),
            (
                "tests/new.rs",
                Some(b"#[test] fn new() {}\n".to_vec()),
                FILE,
            ),
        ],
        "cycle 1 of this build",
        5,
    );
    let cycle_two = project_a_at(
        canonical.path(),
        "refs/heads/wi",
        Some(build_base.to_string()),
    );
    for own in ["tests/stale.rs", "tests/new.rs", "tests/earlier_build.rs"] {
        assert!(cycle_two.contains(own), "{own}: {cycle_two:?}");
    }
    assert!(
        !cycle_two.contains("tests/legacy.rs"),
        "legacy stays hidden"
    );
    // Without the build base the replaced test is quarantined again: the base decides.
    let without = project_a_at(canonical.path(), "refs/heads/wi", None);
    assert!(!without.contains("tests/stale.rs"));
    // The original base commit of the fixture predates the earlier build: its test is
    // then the build's own as well.
    let from_fixture = project_a_at(canonical.path(), "refs/heads/wi", Some(base.to_string()));
    assert!(from_fixture.contains("tests/earlier_build.rs"));
    let bad = export_projection(&ExportRequest {
        source_repo: canonical.path().to_owned(),
        at: "refs/heads/wi".into(),
        role: Role::WorkerA,
        dest: tempfile::TempDir::new().unwrap().path().join("x"),
        scope: ChangeScope {
            build_base: Some("no-such-commit".into()),
            ..ChangeScope::default()
        },
    });
    assert!(
        matches!(bad, Err(ExportError::ResolveCommit { .. })),
        "{bad:?}"
    );
}

#[test]
fn worker_b_sees_shared_and_implementation_but_no_test_source() {
    let canonical = canonical();
    let p = project(canonical.path(), Role::WorkerB);
    let files = worktree_files(&p.path);
    assert_eq!(
        paths(&files),
        BTreeSet::from([
            ".protobot/projection.yaml",
            "Cargo.toml",
            "docs/vision.md",
            "src/lib.rs",
            "src/test_helpers.rs",
            "src/tests/mod.rs",
            "tests/fixtures/impl_helper.rs",
        ])
    );
}

#[test]
fn inspector_sees_the_candidate_minus_integration_only_and_unclassified() {
    let canonical = canonical();
    let p = project(canonical.path(), Role::Inspector);
    let files = worktree_files(&p.path);
    let seen = paths(&files);
    assert!(seen.contains("tests/stale.rs") && seen.contains("src/lib.rs"));
    assert!(seen.contains(".protobot/attestations/WI-00001/findings.jsonl"));
    assert!(!seen.contains("ci/run.sh"));
    assert!(!seen.contains("README.md") && !seen.contains("Src/shadow.rs"));
}

#[test]
fn projection_is_isolated_from_the_canonical_repository() {
    let canonical = canonical();
    let p = project(canonical.path(), Role::WorkerA);
    let repo = Repository::open(&p.path).unwrap();

    // Synthetic parentless root, the only ref.
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    assert_eq!(head.parent_count(), 0);
    assert_eq!(head.id().to_string(), p.record.root_commit);
    let refs: Vec<String> = repo
        .references()
        .unwrap()
        .map(|r| r.unwrap().name().unwrap().to_owned())
        .collect();
    assert_eq!(refs, vec!["refs/heads/main".to_string()]);

    // No remote, alternates, reflog, hooks or packed refs.
    assert!(repo.remotes().unwrap().is_empty());
    let git_dir = p.path.join(".git");
    assert!(!git_dir.join("objects/info/alternates").exists());
    assert!(!git_dir.join("logs").exists());
    assert!(!git_dir.join("hooks").exists());
    assert!(!git_dir.join("packed-refs").exists());
    // The object database is the one pack the projector wrote: no loose objects, no other
    // pack (nothing copied from the canonical repository's packs).
    let mut objects: Vec<String> = fs::read_dir(git_dir.join("objects"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    objects.sort();
    assert!(
        objects.iter().all(|name| name == "info" || name == "pack"),
        "{objects:?}"
    );
    let mut packs: Vec<String> = fs::read_dir(git_dir.join("objects/pack"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    packs.sort();
    assert_eq!(packs.len(), 2, "{packs:?}");
    let stem = packs[0].strip_suffix(".idx").unwrap();
    assert_eq!(packs[1], format!("{stem}.pack"));

    // Forbidden current, historical, unreachable objects and the canonical commit are absent.
    let canon = &canonical.repo;
    let main_tree = canon.find_commit(canonical.head).unwrap().tree().unwrap();
    let secret = main_tree.get_path("src/lib.rs".as_ref()).unwrap().id();
    let stale = main_tree.get_path("tests/stale.rs".as_ref()).unwrap().id();
    let history = canon
        .find_commit(canonical.head)
        .unwrap()
        .parent(0)
        .unwrap();
    let old = history
        .tree()
        .unwrap()
        .get_path("src/old_secret.rs".as_ref())
        .unwrap()
        .id();
    let dangling = Oid::hash_object(
        git2::ObjectType::Blob,
        b"// dangling implementation object\n",
    )
    .unwrap();
    let odb = repo.odb().unwrap();
    for forbidden in [
        secret,
        stale,
        old,
        dangling,
        canonical.head,
        history.id(),
        main_tree.id(),
    ] {
        assert!(
            !odb.exists(forbidden),
            "object {forbidden} leaked into the projection"
        );
    }
    // Every object in the projection is reachable from the root commit.
    let mut count = 0;
    odb.foreach(|_| {
        count += 1;
        true
    })
    .unwrap();
    let reachable = 1 + count_tree_objects(&repo, &head.tree().unwrap());
    assert_eq!(count, reachable);
}

fn count_tree_objects(repo: &Repository, tree: &git2::Tree<'_>) -> usize {
    let mut ids = BTreeSet::new();
    ids.insert(tree.id());
    tree.walk(git2::TreeWalkMode::PreOrder, |_, e| {
        ids.insert(e.id());
        git2::TreeWalkResult::Ok
    })
    .unwrap();
    let _ = repo;
    ids.len()
}

#[test]
fn same_input_gives_the_same_synthetic_root_from_any_clone() {
    let canonical = canonical();
    let first = project(canonical.path(), Role::WorkerB);
    let second = project(canonical.path(), Role::WorkerB);
    assert_eq!(first.record.root_commit, second.record.root_commit);

    let clone_dir = tempfile::TempDir::new().unwrap();
    Repository::clone(canonical.path().to_str().unwrap(), clone_dir.path()).unwrap();
    let from_clone = project(clone_dir.path(), Role::WorkerB);
    assert_eq!(first.record.root_commit, from_clone.record.root_commit);

    let a = project(canonical.path(), Role::WorkerA);
    assert_ne!(a.record.root_commit, first.record.root_commit);
}

#[test]
fn export_refuses_a_non_empty_destination_and_an_unknown_commit() {
    let canonical = canonical();
    let dest = tempfile::TempDir::new().unwrap();
    fs::write(dest.path().join("keep"), b"x").unwrap();
    let request = ExportRequest {
        source_repo: canonical.path().to_owned(),
        at: "refs/heads/main".into(),
        role: Role::WorkerA,
        dest: dest.path().to_owned(),
        scope: scope(),
    };
    assert!(matches!(
        export_projection(&request),
        Err(ExportError::DestinationNotEmpty { .. })
    ));
    let request = ExportRequest {
        at: "no-such-ref".into(),
        dest: dest.path().join("new"),
        ..request
    };
    assert!(matches!(
        export_projection(&request),
        Err(ExportError::ResolveCommit { .. })
    ));
}

#[test]
fn an_invalid_manifest_stops_the_export() {
    let canonical = canonical();
    crate::util::commit_files(
        &canonical.repo,
        "refs/heads/main",
        &[(
            ".protobot/projection.yaml",
            Some(b"version: 2\n".to_vec()),
            crate::util::FILE,
        )],
        "break manifest",
        3,
    );
    let dest = tempfile::TempDir::new().unwrap();
    let err = export_projection(&ExportRequest {
        source_repo: canonical.path().to_owned(),
        at: "main".into(),
        role: Role::WorkerB,
        dest: dest.path().join("p"),
        scope: scope(),
    })
    .unwrap_err();
    assert!(err.to_string().contains("projection.invalid"), "{err}");
}

/// Runs the real `git` CLI inside the projection with a neutral environment.
fn git_in(dir: &std::path::Path, args: &[&str]) -> Option<std::process::Output> {
    let home = tempfile::TempDir::new().unwrap();
    std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", home.path())
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .ok()
}

#[test]
fn git_cli_inside_a_projection_cannot_reach_canonical_objects_refs_or_remotes() {
    let canonical = canonical();
    let p = project(canonical.path(), Role::WorkerA);
    let Some(version) = git_in(&p.path, &["--version"]) else {
        eprintln!("git CLI not installed; the git2-level isolation test still covers this");
        return;
    };
    assert!(version.status.success());

    let tree = canonical
        .repo
        .find_commit(canonical.head)
        .unwrap()
        .tree()
        .unwrap();
    let secret = tree
        .get_path("src/lib.rs".as_ref())
        .unwrap()
        .id()
        .to_string();
    let history = canonical
        .repo
        .find_commit(canonical.head)
        .unwrap()
        .parent_id(0)
        .unwrap()
        .to_string();
    let head = canonical.head.to_string();
    for object in [&secret, &history, &head] {
        let out = git_in(&p.path, &["cat-file", "-e", object]).unwrap();
        assert!(
            !out.status.success(),
            "git cat-file found {object} inside the projection"
        );
    }
    let refs = git_in(&p.path, &["for-each-ref", "--format=%(refname)"]).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&refs.stdout).trim(),
        "refs/heads/main"
    );
    let remotes = git_in(&p.path, &["remote", "-v"]).unwrap();
    assert!(remotes.stdout.is_empty());
    let all = git_in(
        &p.path,
        &[
            "cat-file",
            "--batch-all-objects",
            "--batch-check=%(objectname)",
        ],
    )
    .unwrap();
    let listed = String::from_utf8_lossy(&all.stdout);
    assert!(!listed.contains(&secret) && !listed.contains(&head));
    let log = git_in(&p.path, &["log", "--all", "--reflog", "--format=%H"]).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&log.stdout).trim(),
        p.record.root_commit
    );
    let config = fs::read_to_string(p.path.join(".git/config"))
        .unwrap()
        .to_lowercase();
    for forbidden in [
        "[remote",
        "[credential",
        "url",
        "insteadof",
        "alternates",
        "hookspath",
    ] {
        assert!(
            !config.contains(forbidden),
            "projection config mentions {forbidden}"
        );
    }
    let fsck = git_in(&p.path, &["fsck", "--strict", "--no-dangling"]).unwrap();
    assert!(
        fsck.status.success(),
        "{}",
        String::from_utf8_lossy(&fsck.stderr)
    );
    let status = git_in(&p.path, &["status", "--porcelain"]).unwrap();
    assert!(status.stdout.is_empty(), "checkout matches the root commit");
}

#[test]
fn a_failed_export_leaves_no_half_written_projection() {
    let canonical = canonical();
    let tree = canonical
        .repo
        .find_commit(canonical.head)
        .unwrap()
        .tree()
        .unwrap();
    let id = tree
        .get_path("docs/vision.md".as_ref())
        .unwrap()
        .id()
        .to_string();
    let object = canonical
        .path()
        .join(".git/objects")
        .join(&id[..2])
        .join(&id[2..]);
    fs::remove_file(object).unwrap();
    let work = tempfile::TempDir::new().unwrap();
    let dest = work.path().join("p");
    let err = export_projection(&ExportRequest {
        source_repo: canonical.path().to_owned(),
        at: "main".into(),
        role: Role::WorkerB,
        dest: dest.clone(),
        scope: scope(),
    })
    .unwrap_err();
    assert_eq!(err.category(), "git", "{err}");
    assert!(!dest.exists());
    assert!(!protobot_repo::export::record_path_for(&dest).exists());
}

#[test]
fn repeated_content_identical_directories_large_and_executable_files_make_one_valid_pack() {
    let dir = tempfile::TempDir::new().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let manifest = b"version: 1\npaths:\n  - path: src/\n    class: shared\n  - path: .protobot/projection.yaml\n    class: shared\n";
    // Larger than one stored deflate block and than the pack's size nibble.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 13 % 251) as u8).collect();
    let files: Vec<(&str, Vec<u8>, i32)> = vec![
        (".protobot/projection.yaml", manifest.to_vec(), FILE),
        ("src/a/same.txt", b"same\n".to_vec(), FILE),
        ("src/b/same.txt", b"same\n".to_vec(), FILE),
        ("src/empty", Vec::new(), FILE),
        ("src/big.bin", big, FILE),
        ("src/run.sh", b"#!/bin/sh\necho hi\n".to_vec(), 0o100755),
    ];
    let changes: Vec<(&str, Option<Vec<u8>>, i32)> = files
        .iter()
        .map(|(path, content, mode)| (*path, Some(content.clone()), *mode))
        .collect();
    commit_files(&repo, "refs/heads/main", &changes, "fixture", 1);
    repo.set_head("refs/heads/main").unwrap();

    let p = project(dir.path(), Role::WorkerB);
    let written = worktree_files(&p.path);
    assert_eq!(written.len(), files.len());
    for (path, content, _) in &files {
        assert_eq!(written.get(*path), Some(content), "{path}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &str| {
            fs::metadata(p.path.join(path))
                .unwrap()
                .permissions()
                .mode()
        };
        assert_eq!(mode("src/run.sh") & 0o111, 0o111);
        assert_eq!(mode("src/empty") & 0o111, 0);
    }

    // Five distinct blobs, four distinct trees (root, .protobot, src, a = b) and the commit,
    // each once.
    let projection = Repository::open(&p.path).unwrap();
    let mut count = 0;
    projection
        .odb()
        .unwrap()
        .foreach(|_| {
            count += 1;
            true
        })
        .unwrap();
    assert_eq!(count, 5 + 4 + 1);
    let head = projection.head().unwrap().peel_to_commit().unwrap();
    assert_eq!(head.id().to_string(), p.record.root_commit);
    let tree = head.tree().unwrap();
    assert_eq!(
        tree.get_path("src/a".as_ref()).unwrap().id(),
        tree.get_path("src/b".as_ref()).unwrap().id()
    );

    if let Some(version) = git_in(&p.path, &["--version"]) {
        assert!(version.status.success());
        let fsck = git_in(&p.path, &["fsck", "--strict", "--no-dangling", "--full"]).unwrap();
        assert!(
            fsck.status.success(),
            "{}",
            String::from_utf8_lossy(&fsck.stderr)
        );
        let packs: Vec<_> = fs::read_dir(p.path.join(".git/objects/pack"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|path| path.extension().is_some_and(|e| e == "idx"))
            .collect();
        assert_eq!(packs.len(), 1);
        let verify = git_in(&p.path, &["verify-pack", "-v", packs[0].to_str().unwrap()]).unwrap();
        assert!(
            verify.status.success(),
            "{}",
            String::from_utf8_lossy(&verify.stderr)
        );
        let status = git_in(&p.path, &["status", "--porcelain"]).unwrap();
        assert!(status.stdout.is_empty(), "checkout matches the root commit");
    }
}

#[test]
fn the_same_projection_twice_gives_the_same_pack_bytes_and_name() {
    // Enough files of uneven sizes that the export threads finish out of order.
    let dir = tempfile::TempDir::new().unwrap();
    let repo = Repository::init(dir.path()).unwrap();
    let manifest = b"version: 1\npaths:\n  - path: src/\n    class: shared\n  - path: .protobot/projection.yaml\n    class: shared\n";
    let mut changes: Vec<(String, Option<Vec<u8>>, i32)> = vec![(
        ".protobot/projection.yaml".into(),
        Some(manifest.to_vec()),
        FILE,
    )];
    for n in 0..400u32 {
        let size = if n % 37 == 0 {
            200_000
        } else {
            (n as usize * 97) % 3_000
        };
        let content: Vec<u8> = (0..size).map(|i| ((i as u32 ^ n) % 251) as u8).collect();
        changes.push((format!("src/d{}/f{n}.bin", n % 9), Some(content), FILE));
    }
    let changes: Vec<(&str, Option<Vec<u8>>, i32)> = changes
        .iter()
        .map(|(p, c, m)| (p.as_str(), c.clone(), *m))
        .collect();
    commit_files(&repo, "refs/heads/main", &changes, "fixture", 1);
    repo.set_head("refs/heads/main").unwrap();
    let pack_of = |p: &Projection| -> (String, Vec<u8>) {
        let pack = fs::read_dir(p.path.join(".git/objects/pack"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|path| path.extension().is_some_and(|e| e == "pack"))
            .unwrap();
        (
            pack.file_name().unwrap().to_string_lossy().into_owned(),
            fs::read(&pack).unwrap(),
        )
    };
    let first = pack_of(&project(dir.path(), Role::WorkerB));
    for _ in 0..3 {
        let again = pack_of(&project(dir.path(), Role::WorkerB));
        assert_eq!(again.0, first.0, "pack name");
        assert!(again.1 == first.1, "pack bytes differ");
    }
    // Loose objects and packed ones (whole or deltas) are read by different
    // code: a packed source projects to the same bytes.
    let gc = std::process::Command::new("git")
        // --prune=now: an unreachable object the fixture left (older git versions keep it
        // loose for two weeks by default) must not stay behind as a loose object.
        .args(["gc", "--quiet", "--prune=now"])
        .current_dir(dir.path())
        .status()
        .unwrap();
    assert!(gc.success());
    let loose_left = fs::read_dir(dir.path().join(".git/objects"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().len() == 2)
        .count();
    assert_eq!(loose_left, 0, "the source is packed now");
    let packed = pack_of(&project(dir.path(), Role::WorkerB));
    assert_eq!(packed.0, first.0, "pack name from a packed source");
    assert!(
        packed.1 == first.1,
        "pack bytes from a packed source differ"
    );
    // Objects in an alternate store are left to libgit2: a `clone --shared`
    // holds none of its own and still projects to the same bytes.
    let shared = tempfile::TempDir::new().unwrap();
    let clone = std::process::Command::new("git")
        .args(["clone", "--quiet", "--shared"])
        .arg(dir.path())
        .arg(shared.path())
        .status()
        .unwrap();
    assert!(clone.success());
    assert!(shared.path().join(".git/objects/info/alternates").exists());
    let borrowed = pack_of(&project(shared.path(), Role::WorkerB));
    assert_eq!(borrowed.0, first.0, "pack name from a shared clone");
    assert!(
        borrowed.1 == first.1,
        "pack bytes from a shared clone differ"
    );
}
