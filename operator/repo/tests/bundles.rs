//! The Patch/Ownership Validator rejects hostile bundles, each with a specific code, and the
//! integration repository is byte-identical afterwards.

use protobot_repo::{
    bundle::{Change, ChangeOp, PatchBundle, collect_bundle},
    role::Role,
    validate::{Limits, ViolationCode, accept_bundle, check_bundle},
};

use crate::util::{FILE, LINK, Projection, canonical, dir_fingerprint, project, worker_commit};

fn codes(bundle: &PatchBundle, p: &Projection, limits: &Limits) -> Vec<ViolationCode> {
    let report = check_bundle(bundle, &p.record, limits);
    let mut codes: Vec<ViolationCode> = report.violations.iter().map(|v| v.code).collect();
    codes.dedup();
    codes
}

/// A clean Worker A bundle adding one test, collected from a real worker commit.
fn clean_worker_a() -> (crate::util::Canonical, Projection, PatchBundle) {
    let canonical = canonical();
    let p = project(canonical.path(), Role::WorkerA);
    worker_commit(
        &p.path,
        &[(
            "tests/new_test.rs",
            Some(b"#[test] fn t() {}\n".to_vec()),
            FILE,
        )],
        "add test",
    );
    let bundle = collect_bundle(&p.path, &p.record, &Limits::default()).unwrap();
    (canonical, p, bundle)
}

/// Replaces the first change of the first commit and reseals the bundle.
fn hostile(bundle: &PatchBundle, edit: impl FnOnce(&mut Change)) -> PatchBundle {
    let mut commits = bundle.commits.clone();
    edit(&mut commits[0].changes[0]);
    PatchBundle::new(bundle.role, bundle.base.clone(), commits)
}

/// `tests/café.rs` precomposed (NFC) and decomposed (NFD): different bytes, one name on
/// APFS and HFS+.
const NFC_CAFE: &str = "tests/caf\u{e9}.rs";
const NFD_CAFE: &str = "tests/cafe\u{301}.rs";

/// The clean bundle's first change written at `first` and again at `second`, resealed.
fn both(bundle: &PatchBundle, first: &str, second: &str) -> PatchBundle {
    let mut commits = bundle.commits.clone();
    let mut a = commits[0].changes[0].clone();
    a.path = first.to_owned();
    let mut b = a.clone();
    b.path = second.to_owned();
    commits[0].changes = vec![a, b];
    PatchBundle::new(bundle.role, bundle.base.clone(), commits)
}

#[test]
fn a_clean_worker_a_bundle_is_accepted() {
    let (_c, p, bundle) = clean_worker_a();
    assert_eq!(bundle.commits.len(), 1);
    assert_eq!(
        bundle.commits[0].parents,
        vec![p.record.root_commit.clone()]
    );
    let report = check_bundle(&bundle, &p.record, &Limits::default());
    assert!(report.accepted, "{:?}", report.violations);
    assert!(accept_bundle(bundle, &p.record, &Limits::default()).is_ok());
}

#[test]
fn worker_a_may_replace_a_quarantined_test_it_cannot_see_but_not_a_legacy_one() {
    let canonical = canonical();
    let p = project(canonical.path(), Role::WorkerA);
    assert!(
        !p.path.join("tests/stale.rs").exists(),
        "quarantined: hidden"
    );
    assert!(p.record.replaceable.contains("tests/stale.rs"));
    assert!(!p.record.replaceable.contains("tests/legacy.rs"));
    worker_commit(
        &p.path,
        &[(
            "tests/stale.rs",
            Some(b"#[test] fn stale_rewritten() {}\n".to_vec()),
            FILE,
        )],
        "replace the quarantined test",
    );
    let bundle = collect_bundle(&p.path, &p.record, &Limits::default()).unwrap();
    let report = check_bundle(&bundle, &p.record, &Limits::default());
    assert!(report.accepted, "{:?}", report.violations);
    // The same write over the legacy test is refused.
    let legacy = hostile(&bundle, |c| c.path = "tests/legacy.rs".into());
    assert_eq!(
        codes(&legacy, &p, &Limits::default()),
        vec![ViolationCode::WithheldPath]
    );
}

#[test]
fn hostile_corpus_is_rejected_with_a_specific_code_each() {
    let (canonical, p, clean) = clean_worker_a();
    let before = dir_fingerprint(&canonical.path().join(".git"));
    let limits = Limits::default();
    let set = |path: &'static str| move |c: &mut Change| c.path = path.to_owned();
    let cases: Vec<(&str, PatchBundle, ViolationCode)> = vec![
        (
            "path traversal",
            hostile(&clean, set("tests/../src/lib.rs")),
            ViolationCode::PathTraversal,
        ),
        (
            "absolute path",
            hostile(&clean, set("/etc/passwd")),
            ViolationCode::AbsolutePath,
        ),
        (
            ".git write",
            hostile(&clean, set(".git/hooks/pre-commit")),
            ViolationCode::GitPath,
        ),
        (
            "case-folded .git",
            hostile(&clean, set("tests/.GIT/config")),
            ViolationCode::GitPath,
        ),
        (
            ".git with an HFS+-ignorable code point",
            hostile(&clean, set("tests/.g\u{200c}it/config")),
            ViolationCode::GitPath,
        ),
        (
            ".protobot with an HFS+-ignorable code point",
            hostile(&clean, set("\u{feff}.protobot/policy.yaml")),
            ViolationCode::ProtobotPath,
        ),
        (
            ".protobot write",
            hostile(&clean, set(".protobot/policy.yaml")),
            ViolationCode::ProtobotPath,
        ),
        (
            ".protobot write, NTFS spelling",
            hostile(&clean, set(".PROTOBOT. /attestations/x.jsonl")),
            ViolationCode::ProtobotPath,
        ),
        (
            "worker A touches implementation",
            hostile(&clean, set("src/lib.rs")),
            ViolationCode::NotWritableByRole,
        ),
        (
            "shared is read-only",
            hostile(&clean, set("docs/vision.md")),
            ViolationCode::NotWritableByRole,
        ),
        (
            "unclassified",
            hostile(&clean, set("build.rs")),
            ViolationCode::UnclassifiedPath,
        ),
        (
            "withheld legacy test",
            hostile(&clean, set("tests/legacy.rs")),
            ViolationCode::WithheldPath,
        ),
        (
            "case-fold collision",
            hostile(&clean, set("tests/Valid.rs")),
            ViolationCode::CaseFoldCollision,
        ),
        (
            "NFC/NFD collision",
            both(&clean, NFC_CAFE, NFD_CAFE),
            ViolationCode::NormalizationCollision,
        ),
        (
            "symlink",
            hostile(&clean, |c| c.mode = "120000".into()),
            ViolationCode::Symlink,
        ),
        (
            "submodule",
            hostile(&clean, |c| {
                c.mode = "160000".into();
                c.content_hex = None;
            }),
            ViolationCode::Submodule,
        ),
        (
            "mode trick",
            hostile(&clean, |c| c.mode = "100600".into()),
            ViolationCode::ModeNotAllowed,
        ),
        (
            "not hex",
            hostile(&clean, |c| c.content_hex = Some("zz".into())),
            ViolationCode::InvalidChange,
        ),
        (
            "modify a missing path",
            hostile(&clean, |c| c.op = ChangeOp::Modify),
            ViolationCode::InvalidChange,
        ),
        (
            "file under a file",
            hostile(&clean, set("tests/valid.rs/inner.rs")),
            ViolationCode::PathConflict,
        ),
        (
            "oversized blob",
            hostile(&clean, |c| {
                c.content_hex = Some("00".repeat(4 * 1024 * 1024 + 1))
            }),
            ViolationCode::FileTooLarge,
        ),
        (
            "digest mismatch",
            {
                let mut b = clean.clone();
                b.commits[0].changes[0].content_hex = Some(hex::encode(b"tampered"));
                b
            },
            ViolationCode::DigestMismatch,
        ),
        (
            "wrong base",
            PatchBundle::new(Role::WorkerA, "0".repeat(40), clean.commits.clone()),
            ViolationCode::BaseMismatch,
        ),
        (
            "role mismatch",
            PatchBundle::new(Role::WorkerB, clean.base.clone(), clean.commits.clone()),
            ViolationCode::RoleMismatch,
        ),
        (
            "broken history",
            {
                let mut commits = clean.commits.clone();
                commits[0].parents = vec!["1".repeat(40)];
                PatchBundle::new(Role::WorkerA, clean.base.clone(), commits)
            },
            ViolationCode::BrokenHistory,
        ),
    ];
    for (name, bundle, expected) in cases {
        let found = codes(&bundle, &p, &limits);
        assert!(
            found.contains(&expected),
            "{name}: expected {expected:?}, got {found:?}"
        );
        assert!(
            accept_bundle(bundle, &p.record, &limits).is_err(),
            "{name} was accepted"
        );
    }
    assert_eq!(
        before,
        dir_fingerprint(&canonical.path().join(".git")),
        "integration repo changed"
    );
}

#[test]
fn count_and_size_limits_are_enforced() {
    let (_c, p, clean) = clean_worker_a();
    let tight = Limits {
        max_file_bytes: 4,
        max_total_bytes: 4,
        max_files: 0,
        max_commits: 0,
    };
    let found = codes(&clean, &p, &tight);
    for code in [
        ViolationCode::FileTooLarge,
        ViolationCode::BundleTooLarge,
        ViolationCode::TooManyFiles,
        ViolationCode::TooManyCommits,
    ] {
        assert!(found.contains(&code), "missing {code:?} in {found:?}");
    }
}

#[test]
fn every_violation_is_reported_not_just_the_first() {
    let (_c, p, clean) = clean_worker_a();
    let mut commits = clean.commits.clone();
    let template = commits[0].changes[0].clone();
    commits[0].changes = vec![
        Change {
            path: "../escape".into(),
            ..template.clone()
        },
        Change {
            path: "src/lib.rs".into(),
            op: ChangeOp::Modify,
            ..template.clone()
        },
        Change {
            path: "tests/link".into(),
            mode: "120000".into(),
            ..template
        },
    ];
    let bundle = PatchBundle::new(Role::WorkerA, clean.base.clone(), commits);
    let report = check_bundle(&bundle, &p.record, &Limits::default());
    let found: Vec<ViolationCode> = report.violations.iter().map(|v| v.code).collect();
    for code in [
        ViolationCode::PathTraversal,
        ViolationCode::NotWritableByRole,
        ViolationCode::Symlink,
    ] {
        assert!(found.contains(&code), "missing {code:?} in {found:?}");
    }
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["accepted"], false);
    assert!(json["violations"][0]["code"].is_string());
}

#[test]
fn worker_b_bundle_touching_a_test_file_is_rejected() {
    let canonical = canonical();
    let p = project(canonical.path(), Role::WorkerB);
    worker_commit(
        &p.path,
        &[
            ("src/lib.rs", Some(b"pub fn f() {}\n".to_vec()), FILE),
            (
                "tests/sneaky.rs",
                Some(b"#[test] fn t() {}\n".to_vec()),
                FILE,
            ),
        ],
        "implementation plus a test",
    );
    let bundle = collect_bundle(&p.path, &p.record, &Limits::default()).unwrap();
    let report = check_bundle(&bundle, &p.record, &Limits::default());
    assert!(!report.accepted);
    assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
    assert_eq!(report.violations[0].code, ViolationCode::NotWritableByRole);
    assert_eq!(
        report.violations[0].path.as_deref(),
        Some("tests/sneaky.rs")
    );
}

#[test]
fn a_symlink_committed_by_a_worker_is_rejected() {
    let canonical = canonical();
    let p = project(canonical.path(), Role::WorkerA);
    worker_commit(
        &p.path,
        &[("tests/out", Some(b"../../../../etc/passwd".to_vec()), LINK)],
        "link",
    );
    let bundle = collect_bundle(&p.path, &p.record, &Limits::default()).unwrap();
    let report = check_bundle(&bundle, &p.record, &Limits::default());
    assert_eq!(
        report.violations.iter().map(|v| v.code).collect::<Vec<_>>(),
        vec![ViolationCode::Symlink]
    );
}

#[test]
fn bundles_round_trip_through_json_with_the_same_digest() {
    let (_c, _p, clean) = clean_worker_a();
    let decoded = PatchBundle::from_json(&clean.to_json().unwrap()).unwrap();
    assert_eq!(decoded, clean);
    assert_eq!(decoded.compute_digest(), clean.digest);
}

#[test]
fn collect_refuses_a_merge_and_a_foreign_root() {
    let canonical = canonical();
    let p = project(canonical.path(), Role::WorkerA);
    let repo = git2::Repository::open(&p.path).unwrap();
    let sig = git2::Signature::new("w", "w@x", &git2::Time::new(5, 0)).unwrap();
    let tree = repo.head().unwrap().peel_to_tree().unwrap();
    let orphan = repo.commit(None, &sig, &sig, "orphan", &tree, &[]).unwrap();
    repo.reference("refs/heads/main", orphan, true, "worker rewrites history")
        .unwrap();
    let err = collect_bundle(&p.path, &p.record, &Limits::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("root other than the projection root"),
        "{err}"
    );
}

#[test]
fn collection_stops_at_an_oversized_blob_before_loading_it() {
    let canonical = canonical();
    let p = project(canonical.path(), Role::WorkerA);
    worker_commit(
        &p.path,
        &[("tests/huge.bin", Some(vec![0u8; 64 * 1024]), FILE)],
        "huge",
    );
    let limits = Limits {
        max_file_bytes: 1024,
        ..Limits::default()
    };
    let err = collect_bundle(&p.path, &p.record, &limits).unwrap_err();
    assert!(
        matches!(
            err,
            protobot_repo::bundle::BundleError::Oversized {
                size: 65536,
                limit: 1024,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn inspectors_are_read_only_every_change_is_rejected() {
    let canonical = canonical();
    let p = project(canonical.path(), Role::Inspector);
    worker_commit(
        &p.path,
        &[("tests/valid.rs", Some(b"// weakened\n".to_vec()), FILE)],
        "tamper",
    );
    let bundle = collect_bundle(&p.path, &p.record, &Limits::default()).unwrap();
    let report = check_bundle(&bundle, &p.record, &Limits::default());
    assert_eq!(
        report.violations.iter().map(|v| v.code).collect::<Vec<_>>(),
        vec![ViolationCode::NotWritableByRole]
    );
}

#[test]
fn paths_equal_under_unicode_normalization_are_rejected_with_their_own_code() {
    let canonical = canonical();
    let p = project(canonical.path(), Role::WorkerA);
    let before = dir_fingerprint(&canonical.path().join(".git"));
    let limits = Limits::default();
    // A real Worker commit that adds both spellings.
    let test = b"#[test] fn t() {}\n".to_vec();
    worker_commit(
        &p.path,
        &[
            (NFC_CAFE, Some(test.clone()), FILE),
            (NFD_CAFE, Some(test.clone()), FILE),
        ],
        "add caf\u{e9} twice",
    );
    let bundle = collect_bundle(&p.path, &p.record, &limits).unwrap();
    let report = check_bundle(&bundle, &p.record, &limits);
    let found: Vec<(ViolationCode, Option<&str>)> = report
        .violations
        .iter()
        .map(|v| (v.code, v.path.as_deref()))
        .collect();
    assert_eq!(
        found,
        vec![
            (ViolationCode::NormalizationCollision, Some(NFD_CAFE)),
            (ViolationCode::NormalizationCollision, Some(NFC_CAFE)),
        ],
        "a pure normalization variant is not also a case-fold collision"
    );
    assert!(
        report.violations[1].detail.contains("cafe\\u{301}.rs"),
        "the detail shows the decomposed spelling: {}",
        report.violations[1].detail
    );
    assert!(accept_bundle(bundle, &p.record, &limits).is_err());

    // Case and normalization together (`Café` NFC against `café` NFD) fold to one name on a
    // case-insensitive, normalization-insensitive filesystem: a case-fold collision.
    let (_c, p2, clean) = clean_worker_a();
    let mixed = both(&clean, "tests/Caf\u{e9}.rs", NFD_CAFE);
    let codes_found = codes(&mixed, &p2, &limits);
    assert_eq!(codes_found, vec![ViolationCode::CaseFoldCollision]);

    // One spelling alone is a fine name.
    let single = hostile(&clean, |c| c.path = NFD_CAFE.to_owned());
    assert!(check_bundle(&single, &p2.record, &limits).accepted);

    assert_eq!(
        before,
        dir_fingerprint(&canonical.path().join(".git")),
        "integration repo changed"
    );
}
