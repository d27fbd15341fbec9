#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The Materializer against a real project repository: a change set authored
//! with ears-manager (run in-process), merged to `main` with a merge commit,
//! read back at its merge commit and turned into a ready build contract.

use std::{path::Path, process::Command};

use protobot_jobsite::{
    contract::{Action, AssessmentStatus, Intake, build},
    materializer::{MaterializeError, Registration, read_facts},
};
use protobot_spec::cli::{Env, run};

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "Test")
        .env("GIT_AUTHOR_EMAIL", "test@example.invalid")
        .env("GIT_COMMITTER_NAME", "Test")
        .env("GIT_COMMITTER_EMAIL", "test@example.invalid")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn ears(dir: &Path, args: &[&str]) -> serde_json::Value {
    let mut argv = vec!["--output".to_string(), "json".to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let mut stdin = std::io::empty();
    let mut env = Env {
        cwd: dir,
        stdin: &mut stdin,
        faults: Default::default(),
    };
    let ran = run(&argv, &mut env);
    assert_eq!(
        ran.status, 0,
        "ears-manager {args:?}: {} {}",
        ran.stdout, ran.stderr
    );
    serde_json::from_str(&ran.stdout).unwrap()
}

/// A project with one approved change set (CS-00001) and one still proposed (CS-00002).
fn project() -> (tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README.md"), "# cli-sync\n").unwrap();
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::write(dir.join("docs/vision.md"), "# Vision\n").unwrap();
    std::fs::write(dir.join("docs/architecture.md"), "# Architecture\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "initial"]);
    ears(
        dir,
        &[
            "project",
            "init",
            "--id",
            "cli-sync",
            "--name",
            "CLI sync",
            "--canonical-remote",
            "https://example.invalid/cli-sync.git",
            "--review-mode",
            "single-player",
        ],
    );
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "project init"]);
    ears(
        dir,
        &[
            "change-set",
            "create",
            "--intent",
            "Sync command",
            "--affected-scope",
            "cli",
            "--implementation-required",
            "true",
            "--created",
            "2026-09-15T12:01:00Z",
        ],
    );
    ears(
        dir,
        &[
            "interface",
            "add",
            "--change-set",
            "CS-00001",
            "--id",
            "cli-main",
            "--name",
            "Sync CLI",
            "--type",
            "cli",
            "--spec-approach",
            "prose",
            "--created",
            "2026-09-15T12:02:00Z",
        ],
    );
    ears(
        dir,
        &[
            "change-set",
            "update",
            "--change-set",
            "CS-00001",
            "--affected-interface",
            "cli-main",
        ],
    );
    ears(
        dir,
        &[
            "requirement",
            "add",
            "--change-set",
            "CS-00001",
            "--id",
            "REQ-CLI-00001",
            "--type",
            "event-driven",
            "--text",
            "When the user runs sync, the CLI shall copy changed files.",
            "--interface",
            "cli-main",
            "--scope",
            "cli",
            "--verification-mode",
            "isolated-interface",
            "--provenance",
            "user-authored",
            "--created",
            "2026-09-15T12:03:00Z",
        ],
    );
    let branch = git(dir, &["branch", "--show-current"]);
    assert!(
        branch.starts_with("cs/"),
        "change-set create checked out {branch}"
    );
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "CS-00001: sync command"]);
    git(dir, &["checkout", "-q", "main"]);
    git(
        dir,
        &["merge", "-q", "--no-ff", "-m", "Merge CS-00001", &branch],
    );
    let merge = git(dir, &["rev-parse", "HEAD"]);
    // A second change set that is never merged.
    ears(
        dir,
        &[
            "change-set",
            "create",
            "--intent",
            "Dry run",
            "--affected-scope",
            "cli",
            "--implementation-required",
            "true",
            "--created",
            "2026-09-15T13:00:00Z",
        ],
    );
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "CS-00002: dry run"]);
    git(dir, &["checkout", "-q", "main"]);
    (tmp, merge)
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
    let err = read_facts(tmp.path(), &registration("CS-00002", None)).unwrap_err();
    assert!(matches!(err, MaterializeError::NotApproved { .. }), "{err}");
    let err = read_facts(&tmp.path().join("missing"), &registration("CS-00001", None)).unwrap_err();
    assert!(matches!(err, MaterializeError::Repository { .. }), "{err}");
}
