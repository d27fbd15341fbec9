//! Issue #16: worker output under attack. One corpus per class of hostile input; every member
//! of a class is refused (or, for text, handled without a panic).

use std::time::{Duration, Instant};

use git2::{Repository, Signature, Time};
use protobot_repo::{
    bundle::{BundleCommit, BundleError, Change, ChangeOp, PatchBundle, collect_bundle},
    integrate::{CycleInfo, WorkItemRef, apply_bundle},
    role::Role,
    trailers,
    validate::{Limits, ViolationCode, accept_bundle, check_bundle},
};

use crate::util::{FILE, SECRET_IMPL, canonical, project, worker_commit};

fn codes(
    bundle: &PatchBundle,
    record: &protobot_repo::export::ProjectionRecord,
) -> Vec<ViolationCode> {
    let report = check_bundle(bundle, record, &Limits::default());
    let mut codes: Vec<ViolationCode> = report.violations.iter().map(|v| v.code).collect();
    codes.dedup();
    codes
}

fn add(path: &str, content: &[u8]) -> Change {
    Change {
        path: path.to_owned(),
        op: ChangeOp::Add,
        mode: "100644".into(),
        content_hex: Some(hex::encode(content)),
    }
}

fn delete(path: &str) -> Change {
    Change {
        path: path.to_owned(),
        op: ChangeOp::Delete,
        mode: "100644".into(),
        content_hex: None,
    }
}

/// A linear chain of hand-made commits on `base` (IDs are well-formed and distinct).
fn chain(role: Role, base: &str, commits: Vec<Vec<Change>>) -> PatchBundle {
    let mut parent = base.to_owned();
    let mut out = Vec::new();
    for (i, changes) in commits.into_iter().enumerate() {
        let id = format!("{:040x}", i + 1);
        out.push(BundleCommit {
            id: id.clone(),
            parents: vec![parent.clone()],
            message: format!("commit {i}"),
            changes,
        });
        parent = id;
    }
    PatchBundle::new(role, base.to_owned(), out)
}

#[test]
fn look_alike_paths_of_another_class_are_refused() {
    let c = canonical();
    let p = project(c.path(), Role::WorkerA);
    // `tests/` is Worker A's, but `tests/fixtures/impl_helper.rs` is implementation: every
    // spelling that a case-insensitive, normalizing or NTFS checkout resolves to it (or to
    // its directory) is another class's path.
    let corpus = [
        "tests/fixtures/Impl_Helper.rs",
        "tests/FIXTURES/impl_helper.rs",
        "tests/fixtures/impl_helper.rs.",
        "tests/fixtures/impl_helper.rs ",
        "tests/fixtures/impl_helper.rs. .",
        "tests/fixtures./impl_helper.rs",
        "tests/fixtures /impl_helper.rs",
        "tests/fixtures/impl\u{200c}_helper.rs",
        "tests/fixtures/impl_helper\u{feff}.rs",
        "tests/fi\u{200d}xtures/impl_helper.rs",
        "tests/fixtures/IMPL_HELPER.RS",
    ];
    for path in corpus {
        let bundle = chain(
            Role::WorkerA,
            &p.record.root_commit,
            vec![vec![add(path, b"x")]],
        );
        let found = codes(&bundle, &p.record);
        assert!(
            found.contains(&ViolationCode::LookAlikePath),
            "{path:?}: expected look-alike-path, got {found:?}"
        );
        assert!(
            accept_bundle(bundle, &p.record, &Limits::default()).is_err(),
            "{path:?}"
        );
    }
    // A directory that exists in another spelling is one directory on a case-insensitive
    // checkout: adding a file under the other spelling is a collision.
    let pb = project(c.path(), Role::WorkerB);
    for path in [
        "src/Tests/new.rs",
        "src/tests./new.rs",
        "src/te\u{200c}sts/new.rs",
    ] {
        let bundle = chain(
            Role::WorkerB,
            &pb.record.root_commit,
            vec![vec![add(path, b"x")]],
        );
        let found = codes(&bundle, &pb.record);
        assert!(
            found.contains(&ViolationCode::CaseFoldCollision),
            "{path:?}: expected case-fold-collision, got {found:?}"
        );
    }
    // A folded file against an existing file, through trailing dots and ignorables.
    for path in [
        "tests/valid.rs.",
        "tests/valid.rs ",
        "tests/va\u{200c}lid.rs",
    ] {
        let bundle = chain(
            Role::WorkerA,
            &p.record.root_commit,
            vec![vec![add(path, b"x")]],
        );
        let found = codes(&bundle, &p.record);
        assert!(
            found.contains(&ViolationCode::CaseFoldCollision),
            "{path:?}: expected case-fold-collision, got {found:?}"
        );
    }
    // Plain new names in the Worker's own directories still pass.
    let fine = chain(
        Role::WorkerA,
        &p.record.root_commit,
        vec![vec![
            add("tests/fixtures/new_fixture.rs", b"x"),
            add("tests/new.rs", b"y"),
        ]],
    );
    let report = check_bundle(&fine, &p.record, &Limits::default());
    assert!(report.accepted, "{:?}", report.violations);
}

#[test]
fn over_long_names_and_paths_are_refused_at_validation() {
    let c = canonical();
    let p = project(c.path(), Role::WorkerA);
    let long_name = format!("tests/{}.rs", "n".repeat(300));
    let deep = format!("tests/{}x.rs", "d/".repeat(2046));
    let long_path = format!("tests/{}/x.rs", vec!["a".repeat(200); 6].join("/"));
    for path in [long_name, deep, long_path] {
        let bundle = chain(
            Role::WorkerA,
            &p.record.root_commit,
            vec![vec![add(&path, b"x")]],
        );
        let found = codes(&bundle, &p.record);
        assert!(
            found.contains(&ViolationCode::PathTooLong),
            "{} bytes: expected path-too-long, got {found:?}",
            path.len()
        );
    }
    let ok = format!("tests/{}.rs", "n".repeat(200));
    let bundle = chain(
        Role::WorkerA,
        &p.record.root_commit,
        vec![vec![add(&ok, b"x")]],
    );
    assert!(check_bundle(&bundle, &p.record, &Limits::default()).accepted);
}

#[test]
fn conflicts_inside_any_commit_of_the_history_are_refused() {
    let c = canonical();
    let p = project(c.path(), Role::WorkerA);
    let root = p.record.root_commit.clone();
    let corpus = vec![
        // A file, then a file below it, then the first deleted: the final tree is fine.
        vec![
            vec![add("tests/a", b"1")],
            vec![add("tests/a/b", b"2")],
            vec![delete("tests/a")],
        ],
        // The same in the other order: a directory, then a file of its name.
        vec![
            vec![add("tests/d/x", b"1")],
            vec![add("tests/d", b"2")],
            vec![delete("tests/d/x")],
        ],
        // Two spellings alive together in a middle commit only.
        vec![
            vec![add("tests/Same.rs", b"1")],
            vec![add("tests/same.rs", b"2")],
            vec![delete("tests/Same.rs")],
        ],
    ];
    for commits in corpus {
        let bundle = chain(Role::WorkerA, &root, commits.clone());
        let report = check_bundle(&bundle, &p.record, &Limits::default());
        assert!(
            !report.accepted,
            "accepted a history whose middle commit conflicts: {commits:?}"
        );
    }
}

#[test]
fn a_git_file_or_commondir_cannot_redirect_collection() {
    let c = canonical();
    let p = project(c.path(), Role::WorkerA);
    // The Worker moves its repository elsewhere, gives it alternates onto the canonical
    // objects, and leaves a `.git` file pointing there.
    let elsewhere = tempfile::TempDir::new().unwrap();
    let moved = elsewhere.path().join("evil.git");
    std::fs::rename(p.path.join(".git"), &moved).unwrap();
    std::fs::write(
        moved.join("objects/info/alternates"),
        format!("{}\n", c.path().join(".git/objects").display()),
    )
    .unwrap();
    {
        let repo = Repository::open(&moved).unwrap();
        let secret = repo.blob(SECRET_IMPL).unwrap(); // already in the canonical store
        let head = repo.head().unwrap().peel_to_commit().unwrap();
        let base_tree = head.tree().unwrap();
        let mut tests = repo
            .treebuilder(Some(
                &repo
                    .find_tree(base_tree.get_name("tests").unwrap().id())
                    .unwrap(),
            ))
            .unwrap();
        tests.insert("leak.rs", secret, 0o100644).unwrap();
        let tests_id = tests.write().unwrap();
        let mut top = repo.treebuilder(Some(&base_tree)).unwrap();
        top.insert("tests", tests_id, 0o040000).unwrap();
        let tree = repo.find_tree(top.write().unwrap()).unwrap();
        let sig = Signature::new("w", "w@x", &Time::new(9, 0)).unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "leak", &tree, &[&head])
            .unwrap();
    }
    std::fs::write(
        p.path.join(".git"),
        format!("gitdir: {}\n", moved.display()),
    )
    .unwrap();
    let result = collect_bundle(&p.path, &p.record, &Limits::default());
    match result {
        Err(e) => assert_eq!(e.category(), "indirection", "{e}"),
        Ok(bundle) => panic!(
            "collected through a .git file: {} commits",
            bundle.commits.len()
        ),
    }

    // A `commondir` and alternates hidden anywhere under `.git` are refused too.
    for (file, text) in [
        ("commondir", "/tmp\n".to_owned()),
        (
            "objects/info/alternates",
            format!("{}\n", c.path().join(".git/objects").display()),
        ),
        ("objects/info/http-alternates", "http://x/\n".to_owned()),
        ("worktrees/w/commondir", "../..\n".to_owned()),
    ] {
        let p = project(c.path(), Role::WorkerA);
        let target = p.path.join(".git").join(file);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(&target, text).unwrap();
        let err = collect_bundle(&p.path, &p.record, &Limits::default()).unwrap_err();
        assert!(
            matches!(err.category(), "indirection" | "alternates"),
            "{file}: {err}"
        );
    }
}

#[test]
fn a_commit_naming_an_object_the_worker_was_not_given_is_refused() {
    let c = canonical();
    let p = project(c.path(), Role::WorkerA);
    // Alternates are added for the commit, then removed: the commit names the secret blob,
    // which the Worker's own store does not hold.
    let alternates = p.path.join(".git/objects/info/alternates");
    std::fs::write(
        &alternates,
        format!("{}\n", c.path().join(".git/objects").display()),
    )
    .unwrap();
    {
        let repo = Repository::open(&p.path).unwrap();
        let secret = git2::Oid::hash_object(git2::ObjectType::Blob, SECRET_IMPL).unwrap();
        assert!(
            repo.find_blob(secret).is_ok(),
            "the alternate serves the secret"
        );
        let head = repo.head().unwrap().peel_to_commit().unwrap();
        let base_tree = head.tree().unwrap();
        let mut top = repo.treebuilder(Some(&base_tree)).unwrap();
        let mut tests = repo
            .treebuilder(Some(
                &repo
                    .find_tree(base_tree.get_name("tests").unwrap().id())
                    .unwrap(),
            ))
            .unwrap();
        tests.insert("leak.rs", secret, 0o100644).unwrap();
        top.insert("tests", tests.write().unwrap(), 0o040000)
            .unwrap();
        let tree = repo.find_tree(top.write().unwrap()).unwrap();
        let sig = Signature::new("w", "w@x", &Time::new(9, 0)).unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "leak", &tree, &[&head])
            .unwrap();
    }
    std::fs::remove_file(&alternates).unwrap();
    let err = collect_bundle(&p.path, &p.record, &Limits::default()).unwrap_err();
    assert_eq!(err.category(), "missing-object", "{err}");
}

#[test]
fn worker_text_with_multi_byte_characters_never_panics() {
    let corpus = [
        "Work-Ite\u{20ac}: x",
        "Work-It\u{e9}: x",
        "\u{1F600}\u{1F600}\u{1F600}\u{1F600}",
        "  Cycl\u{e9}\u{e9}\u{e9}: 3",
        "Patch-Digest\u{301}: x",
        "Projection-Commi\u{10FFFF}: y",
        "Work-Item\u{e9}: z",
    ];
    for text in corpus {
        let out = trailers::neutralise(text);
        assert!(out.contains(text.trim_start()), "{text:?} -> {out:?}");
    }
    assert_eq!(trailers::neutralise("work-item: WI-1"), "> work-item: WI-1");

    // And through the whole apply path.
    let c = canonical();
    let p = project(c.path(), Role::WorkerA);
    let mut bundle = chain(
        Role::WorkerA,
        &p.record.root_commit,
        vec![vec![add("tests/new.rs", b"x")]],
    );
    bundle.commits[0].message = "Work-Ite\u{20ac}: s\u{e9}\n\nWork-It\u{e9}\u{e9}: x\n".into();
    let bundle = PatchBundle::new(bundle.role, bundle.base.clone(), bundle.commits.clone());
    let accepted = accept_bundle(bundle, &p.record, &Limits::default()).unwrap();
    let wi = WorkItemRef {
        id: "WI-00016".into(),
        slug: "hostile".into(),
    };
    let info = CycleInfo {
        cycle: 1,
        triage_decision: "initial".into(),
        when: 1_000,
    };
    apply_bundle(&c.repo, &accepted, &wi, &info).unwrap();
}

/// A tree of `width`^`levels` paths that costs a few objects: every level shares one subtree.
fn wide_tree(repo: &Repository, width: usize, levels: usize) -> git2::Oid {
    let blob = repo.blob(b"x").unwrap();
    let mut id = blob;
    let mut kind = 0o100644;
    for _ in 0..levels {
        let mut b = repo.treebuilder(None).unwrap();
        for i in 0..width {
            b.insert(format!("e{i}"), id, kind).unwrap();
        }
        id = b.write().unwrap();
        kind = 0o040000;
    }
    id
}

fn commit_tests_subtree(p: &std::path::Path, subtree: git2::Oid) {
    let repo = Repository::open(p).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let mut top = repo.treebuilder(Some(&head.tree().unwrap())).unwrap();
    let mut tests = repo
        .treebuilder(Some(
            &repo
                .find_tree(head.tree().unwrap().get_name("tests").unwrap().id())
                .unwrap(),
        ))
        .unwrap();
    tests.insert("bomb", subtree, 0o040000).unwrap();
    top.insert("tests", tests.write().unwrap(), 0o040000)
        .unwrap();
    let tree = repo.find_tree(top.write().unwrap()).unwrap();
    let sig = Signature::new("w", "w@x", &Time::new(9, 0)).unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "bomb", &tree, &[&head])
        .unwrap();
}

#[test]
fn collection_bounds_entries_and_depth_while_walking() {
    let c = canonical();
    // A million paths in a few kilobytes of objects.
    let p = project(c.path(), Role::WorkerA);
    let bomb = {
        let repo = Repository::open(&p.path).unwrap();
        wide_tree(&repo, 100, 3)
    };
    commit_tests_subtree(&p.path, bomb);
    let started = Instant::now();
    let err = collect_bundle(&p.path, &p.record, &Limits::default()).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, BundleError::TooManyEntries { .. }), "{err}");

    // A chain of 5,000 nested directories.
    let p = project(c.path(), Role::WorkerA);
    let deep = {
        let repo = Repository::open(&p.path).unwrap();
        let mut id = repo.blob(b"x").unwrap();
        let mut kind = 0o100644;
        for _ in 0..5_000 {
            let mut b = repo.treebuilder(None).unwrap();
            b.insert("d", id, kind).unwrap();
            id = b.write().unwrap();
            kind = 0o040000;
        }
        id
    };
    commit_tests_subtree(&p.path, deep);
    let err = collect_bundle(&p.path, &p.record, &Limits::default()).unwrap_err();
    assert!(matches!(err, BundleError::TooDeep { .. }), "{err}");
}

#[test]
fn unknown_bundle_fields_are_refused() {
    let c = canonical();
    let p = project(c.path(), Role::WorkerA);
    worker_commit(
        &p.path,
        &[("tests/new.rs", Some(b"x".to_vec()), FILE)],
        "add",
    );
    let bundle = collect_bundle(&p.path, &p.record, &Limits::default()).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&bundle.to_json().unwrap()).unwrap();
    let with = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v = json.clone();
        edit(&mut v);
        serde_json::to_vec(&v).unwrap()
    };
    let corpus = [
        with(&|v| v["extra"] = serde_json::json!("not covered by the digest")),
        with(&|v| v["commits"][0]["author"] = serde_json::json!("x")),
        with(&|v| v["commits"][0]["changes"][0]["executable"] = serde_json::json!(true)),
    ];
    for bytes in corpus {
        assert!(PatchBundle::from_json(&bytes).is_err());
    }
    // Duplicate keys too: the second `path` would win silently.
    let text = String::from_utf8(bundle.to_json().unwrap()).unwrap();
    let dup = text.replacen("\"path\":", "\"path\":\"tests/other.rs\",\"path\":", 1);
    assert!(PatchBundle::from_json(dup.as_bytes()).is_err());
    assert!(PatchBundle::from_json(text.as_bytes()).is_ok());
}

#[test]
fn projection_export_never_writes_its_record_through_a_link() {
    let c = canonical();
    let out = tempfile::TempDir::new().unwrap();
    let dest = out.path().join("dest");
    let victim = out.path().join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    std::os::unix::fs::symlink(&victim, out.path().join("dest.projection.json")).unwrap();
    let err = protobot_repo::seams::projection_export(
        c.path(),
        "refs/heads/main",
        Role::WorkerB,
        &dest,
        crate::util::scope(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    // A dangling link is refused the same way (it would create the target).
    let dangling = out.path().join("other.projection.json");
    std::os::unix::fs::symlink(out.path().join("created-by-export"), &dangling).unwrap();
    assert!(
        protobot_repo::seams::projection_export(
            c.path(),
            "refs/heads/main",
            Role::WorkerB,
            &out.path().join("other"),
            crate::util::scope(),
        )
        .is_err()
    );
    assert!(!out.path().join("created-by-export").exists());
}

#[test]
fn patch_check_refuses_unknown_fields_newlines_in_paths_and_oversized_files() {
    let c = canonical();
    let p = project(c.path(), Role::WorkerA);
    let dir = tempfile::TempDir::new().unwrap();
    let file = dir.path().join("patch.bundle");
    let check = |bytes: &[u8]| {
        std::fs::write(&file, bytes).unwrap();
        protobot_repo::seams::patch_check(&file, &p.path, Role::WorkerA, &Limits::default())
    };
    let bundle = chain(
        Role::WorkerA,
        &p.record.root_commit,
        vec![vec![add("tests/new.rs", b"x")]],
    );
    assert!(check(&bundle.to_json().unwrap()).unwrap().accepted);

    let mut v: serde_json::Value = serde_json::from_slice(&bundle.to_json().unwrap()).unwrap();
    v["signature"] = serde_json::json!("ignored today");
    assert!(check(&serde_json::to_vec(&v).unwrap()).is_err());

    for path in ["tests/new\n.rs", "tests/a\r.rs", "tests/\u{1b}[31m.rs"] {
        let b = chain(
            Role::WorkerA,
            &p.record.root_commit,
            vec![vec![add(path, b"x")]],
        );
        let report = check(&b.to_json().unwrap()).unwrap();
        assert!(
            report
                .violations
                .iter()
                .any(|v| v.code == ViolationCode::InvalidPath),
            "{path:?}: {:?}",
            report.violations
        );
    }

    // A file larger than any bundle within the limits is refused before it is read whole.
    let limits = Limits {
        max_total_bytes: 1024,
        ..Limits::default()
    };
    let big = vec![b' '; (protobot_repo::seams::max_bundle_file_bytes(&limits) + 10) as usize];
    std::fs::write(&file, &big).unwrap();
    let err =
        protobot_repo::seams::patch_check(&file, &p.path, Role::WorkerA, &limits).unwrap_err();
    assert!(err.to_string().contains("shrink"), "{err}");
}

#[test]
fn a_gitattributes_file_written_by_a_worker_is_refused() {
    let c = canonical();
    let p = project(c.path(), Role::WorkerA);
    for path in [
        "tests/.gitattributes",
        ".gitattributes",
        "tests/fixtures/.GITATTRIBUTES",
        "tests/.gitattributes.",
    ] {
        let b = chain(
            Role::WorkerA,
            &p.record.root_commit,
            vec![vec![add(path, b"* -diff linguist-generated\n")]],
        );
        let found = codes(&b, &p.record);
        assert!(
            found.contains(&ViolationCode::AttributesFile),
            "{path:?}: {found:?}"
        );
    }
}
