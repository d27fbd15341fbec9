//! Accepted bundles are replayed onto integration branches cut from the source commit and
//! merged into `wi/<id>-<slug>` with trailers.

use git2::Oid;
use protobot_repo::{
    bundle::collect_bundle,
    integrate::{
        CycleInfo, WorkItemRef, apply_bundle, ensure_work_item_branch, merge_into_work_item,
    },
    role::Role,
    trailers,
    validate::{Limits, accept_bundle},
};

use crate::util::{FILE, canonical, project, worker_commit};

pub fn work_item() -> WorkItemRef {
    WorkItemRef {
        id: "WI-00042".into(),
        slug: "sync-retries".into(),
    }
}

#[test]
fn both_workers_patches_merge_into_the_work_item_branch_with_trailers() {
    let canonical = canonical();
    let repo = &canonical.repo;
    let wi = work_item();
    ensure_work_item_branch(repo, &wi, canonical.head).unwrap();
    let cycle = CycleInfo {
        cycle: 1,
        triage_decision: "initial".into(),
        when: 1_000,
    };

    let a = project(canonical.path(), Role::WorkerA);
    worker_commit(
        &a.path,
        &[(
            "tests/retry.rs",
            Some(b"#[test] fn retry() {}\n".to_vec()),
            FILE,
        )],
        "Add retry test\n\nWork-Item: WI-99999",
    );
    let a_bundle = accept_bundle(
        collect_bundle(&a.path, &a.record, &Limits::default()).unwrap(),
        &a.record,
        &Limits::default(),
    )
    .unwrap();

    let b = project(canonical.path(), Role::WorkerB);
    worker_commit(
        &b.path,
        &[("src/retry.rs", Some(b"pub fn retry() {}\n".to_vec()), FILE)],
        "Implement retry",
    );
    worker_commit(
        &b.path,
        &[("src/lib.rs", Some(b"pub mod retry;\n".to_vec()), FILE)],
        "Wire retry",
    );
    let b_bundle = accept_bundle(
        collect_bundle(&b.path, &b.record, &Limits::default()).unwrap(),
        &b.record,
        &Limits::default(),
    )
    .unwrap();

    let applied_a = apply_bundle(repo, &a_bundle, &wi, &cycle).unwrap();
    assert_eq!(applied_a.branch, "refs/heads/int/WI-00042/c1/worker-a");
    let applied_b = apply_bundle(repo, &b_bundle, &wi, &cycle).unwrap();
    assert_eq!(applied_b.commits.len(), 2);

    // The integration branch starts at the recorded source commit and keeps withheld files.
    let b_head = repo
        .find_commit(Oid::from_str(&applied_b.head).unwrap())
        .unwrap();
    let b_first = b_head.parent(0).unwrap();
    assert_eq!(b_first.parent_id(0).unwrap(), canonical.head);
    assert!(
        b_head
            .tree()
            .unwrap()
            .get_path("tests/stale.rs".as_ref())
            .is_ok()
    );
    assert!(
        b_head
            .tree()
            .unwrap()
            .get_path("ci/run.sh".as_ref())
            .is_ok()
    );

    let merge_a = merge_into_work_item(repo, &wi, &applied_a, &a_bundle, &cycle).unwrap();
    let merge_b = merge_into_work_item(repo, &wi, &applied_b, &b_bundle, &cycle).unwrap();
    let merge = repo
        .find_commit(Oid::from_str(&merge_b.merge_commit).unwrap())
        .unwrap();
    assert_eq!(merge.parent_count(), 2);
    assert_eq!(
        merge.parent_id(0).unwrap().to_string(),
        merge_a.merge_commit
    );
    assert_eq!(merge.parent_id(1).unwrap().to_string(), applied_b.head);
    let found = trailers::parse(merge.message().unwrap());
    assert_eq!(
        trailers::value(&found, trailers::WORK_ITEM),
        Some("WI-00042")
    );
    assert_eq!(trailers::value(&found, trailers::CYCLE), Some("1"));
    assert_eq!(
        trailers::value(&found, trailers::PROJECTION_ROLE),
        Some("worker-b")
    );
    assert_eq!(
        trailers::value(&found, trailers::PROJECTION_ROOT),
        Some(b.record.root_commit.as_str())
    );
    assert_eq!(
        trailers::value(&found, trailers::PROJECTION_COMMIT),
        Some(b_bundle.bundle().commits[1].id.as_str())
    );
    assert_eq!(
        trailers::value(&found, trailers::PATCH_DIGEST),
        Some(b_bundle.bundle().digest.as_str())
    );
    assert_eq!(
        trailers::value(&found, trailers::TRIAGE_DECISION),
        Some("initial")
    );

    let tree = merge.tree().unwrap();
    for path in [
        "tests/retry.rs",
        "src/retry.rs",
        "src/lib.rs",
        "tests/stale.rs",
    ] {
        assert!(
            tree.get_path(path.as_ref()).is_ok(),
            "{path} missing from wi/"
        );
    }
    let wi_head = repo
        .find_reference(&wi.branch_ref())
        .unwrap()
        .target()
        .unwrap();
    assert_eq!(wi_head.to_string(), merge_b.merge_commit);

    // A forged trailer in a Worker message is neutralised on the replayed commit.
    let replayed = repo
        .find_commit(Oid::from_str(&applied_a.head).unwrap())
        .unwrap();
    let replayed_trailers = trailers::parse(replayed.message().unwrap());
    assert_eq!(
        trailers::value(&replayed_trailers, trailers::WORK_ITEM),
        Some("WI-00042")
    );
    assert!(
        replayed
            .message()
            .unwrap()
            .contains("> Work-Item: WI-99999")
    );

    // Applying the same bundle again is a no-op.
    let again = apply_bundle(repo, &a_bundle, &wi, &cycle).unwrap();
    assert!(again.unchanged);
    assert_eq!(again.head, applied_a.head);
}

#[test]
fn refreshing_from_main_is_a_merge_commit_and_idempotent() {
    let canonical = canonical();
    let repo = &canonical.repo;
    let wi = work_item();
    ensure_work_item_branch(repo, &wi, canonical.head).unwrap();
    crate::util::commit_files(
        repo,
        &wi.branch_ref(),
        &[("src/wi.rs", Some(b"wi".to_vec()), FILE)],
        "wi work",
        10,
    );
    let main = crate::util::commit_files(
        repo,
        "refs/heads/main",
        &[("docs/new.md", Some(b"n".to_vec()), FILE)],
        "main moved",
        11,
    );

    let refreshed = protobot_repo::integrate::refresh_work_item(repo, &wi, main, 12).unwrap();
    let merge = repo
        .find_commit(Oid::from_str(refreshed.merge_commit.as_deref().unwrap()).unwrap())
        .unwrap();
    assert_eq!(merge.parent_count(), 2);
    assert_eq!(merge.parent_id(1).unwrap(), main);
    let found = trailers::parse(merge.message().unwrap());
    assert_eq!(
        trailers::value(&found, trailers::SOURCE_COMMIT),
        Some(main.to_string().as_str())
    );

    let again = protobot_repo::integrate::refresh_work_item(repo, &wi, main, 13).unwrap();
    assert_eq!(again.merge_commit, None);
    assert_eq!(again.head, refreshed.head);
}
