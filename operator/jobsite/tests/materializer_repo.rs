#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Materializer against a real project repository: a change set authored
//! with ears-manager (run in-process), merged to `main` with a merge commit,
//! read back at its merge commit and turned into a ready build contract.

use protobot_jobsite::{
    contract::{Action, AssessmentStatus, Intake, build},
    materializer::{MaterializeError, Registration, read_facts},
    testing::spec_repo,
};

fn project() -> (tempfile::TempDir, String) {
    spec_repo("cli-sync")
}

fn registration(cs: &str, merge: Option<String>) -> Registration {
    Registration {
        project_id: "cli-sync".into(),
        change_set_id: cs.into(),
        merge_commit: merge,
        default_branch: "main".into(),
        depends_on: vec![],
        priority: "normal".into(),
    }
}

#[test]
fn an_approved_change_set_reads_back_as_a_ready_contract() {
    let (tmp, merge) = project();
    let facts = read_facts(tmp.path(), &registration("CS-00001", Some(merge.clone()))).unwrap();
    assert_eq!(facts.merge_commit, merge);
    assert_eq!(
        facts.operations,
        vec![(Action::Add, "REQ-CLI-00001".to_string())]
    );
    assert_eq!(facts.affected_interfaces, ["cli-main"]);
    assert_eq!(facts.assessment_status, AssessmentStatus::Complete);
    assert!(facts.check_errors.is_empty(), "{:?}", facts.check_errors);
    let contract = build(&Intake::ChangeSet(facts)).unwrap();
    assert_eq!(contract.change_type, "undefined");
    assert_eq!(contract.applicable_requirement_ids, ["REQ-CLI-00001"]);
    assert!(
        contract.readiness.contract_failure().is_none() && contract.readiness.blocker().is_none(),
        "{:?}",
        contract.readiness
    );
    // Without a registered merge commit, the default branch decides.
    let found = read_facts(tmp.path(), &registration("CS-00001", None)).unwrap();
    assert_eq!(found.merge_commit, merge);
}

#[test]
fn a_wrong_merge_commit_and_an_unmerged_change_set_are_refused() {
    let (tmp, merge) = project();
    let wrong = "f".repeat(40);
    let err = read_facts(tmp.path(), &registration("CS-00001", Some(wrong.clone()))).unwrap_err();
    assert!(
        matches!(&err, MaterializeError::MergeMismatch { registered, actual, .. } if *registered == wrong && *actual == merge),
        "{err}"
    );
    // A change set on a branch of its own is not approved yet, and says where it is.
    let err = read_facts(tmp.path(), &registration("CS-00002", None)).unwrap_err();
    assert!(matches!(err, MaterializeError::NotApproved { .. }), "{err}");
    assert!(err.to_string().contains("it is on cs/00002-"), "{err}");
    // An ID no branch holds is named as such, not as "not approved".
    let err = read_facts(tmp.path(), &registration("CS-00042", None)).unwrap_err();
    assert!(matches!(err, MaterializeError::NotFound { .. }), "{err}");
    assert!(
        err.to_string().contains("ears-manager change-set list"),
        "{err}"
    );
    let err = read_facts(&tmp.path().join("missing"), &registration("CS-00001", None)).unwrap_err();
    assert!(matches!(err, MaterializeError::Repository { .. }), "{err}");
}

#[test]
fn a_restarted_job_site_rebuilds_the_same_contract_from_the_materialization_key() {
    use protobot_jobsite::site::{ContractSource, RegisteredContracts, parse_materialization_key};
    use protobot_lifecycle::{State, WorkItemRecord};
    let (tmp, merge) = project();
    let facts = read_facts(tmp.path(), &registration("CS-00001", Some(merge.clone()))).unwrap();
    let contract = build(&Intake::ChangeSet(facts)).unwrap();
    let mut record = WorkItemRecord::new(&contract.work_item_id, "cli-sync", State::Building, 3);
    record.materialization_key = contract.materialization_key.clone();
    record.priority = "normal".into();
    let source = RegisteredContracts::new(tmp.path().to_path_buf(), "main");
    assert_eq!(source.contract(&record).unwrap(), contract);
    // Dispatch reads the declared scopes: the changed requirements at least.
    assert!(
        contract
            .scopes
            .iter()
            .any(|s| s.starts_with("requirement:REQ-")),
        "{:?}",
        contract.scopes
    );
    // ... and the test files verifying them, from the catalog at the merge commit.
    let expected = (contract.scopes.clone(), contract.paths.clone());
    assert_eq!(source.footprint(&record).unwrap(), expected);
    assert_eq!(
        source.footprint(&record).unwrap(),
        expected,
        "served from the cache"
    );
    assert_eq!(
        parse_materialization_key(&contract.materialization_key),
        Some(("cli-sync", "CS-00001", merge.to_lowercase().as_str()))
    );
    // A key that names no registration, or a record whose id does not match, is refused.
    for key in [
        "",
        "cli-sync",
        "cli-sync/bug:7@abc",
        "cli-sync/CS-00001@short",
    ] {
        record.materialization_key = key.into();
        assert!(source.contract(&record).is_err(), "{key:?}");
    }
    record.materialization_key = contract.materialization_key.clone();
    record.id = "wi-someone-else".into();
    let err = source.contract(&record).unwrap_err();
    assert!(err.contains("rebuilds as"), "{err}");
}

#[test]
fn touched_paths_come_from_the_test_catalog_and_bugs_must_name_active_requirements() {
    use protobot_jobsite::materializer::{BugIntake, read_bug_facts};
    let tmp = tempfile::tempdir().unwrap();
    let (work, origin) = (tmp.path().join("work"), tmp.path().join("origin.git"));
    let merge = protobot_demo::example::author(&work, &origin).unwrap();
    let facts = read_facts(&work, &registration("CS-00001", Some(merge))).unwrap();
    assert_eq!(
        facts.touched_paths,
        [
            "tests/test_apply.sh",
            "tests/test_dry_run.sh",
            "tests/test_refuse.sh"
        ]
    );
    let contract = build(&Intake::ChangeSet(facts)).unwrap();
    assert_eq!(contract.paths.len(), 3);
    let bug = |violates: &str| BugIntake {
        project_id: "cli-sync".into(),
        bug_id: "GH-1".into(),
        violated_requirement_ids: vec![violates.into()],
        scopes: vec![],
        default_branch: "main".into(),
        priority: "high".into(),
    };
    let facts = read_bug_facts(&work, &bug("REQ-CLI-00001")).unwrap();
    assert_eq!(facts.touched_paths, ["tests/test_dry_run.sh"]);
    assert!(
        facts
            .impact
            .iter()
            .all(|e| e.disposition == protobot_jobsite::contract::Disposition::Applicable)
    );
    let contract = build(&Intake::Bug(facts)).unwrap();
    assert_eq!(contract.change_type, "contradicts");
    assert_eq!(contract.paths, ["tests/test_dry_run.sh"]);
    let err = read_bug_facts(&work, &bug("REQ-CLI-09999")).unwrap_err();
    assert!(
        matches!(err, MaterializeError::UnknownRequirement { .. }),
        "{err}"
    );
}
