//! Fault injection (§23): a multi-file write interrupted at every step —
//! before each file, and in the post-write check — leaves the working tree
//! and the branches exactly as they were, reports `mutation: none`, and a
//! rollback that cannot be confirmed reports `storage.write_unknown`.
//! Runs the CLI in-process so faults can be injected.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use protobot_spec::{
    cli::{self, Env},
    fsio::Faults,
};
use support::{Repo, initialized, with_change_set};

fn run_with(repo: &Repo, args: &[&str], faults: Faults) -> (i32, serde_json::Value) {
    let mut full: Vec<String> = vec!["--output".into(), "json".into()];
    full.extend(args.iter().map(|s| (*s).to_owned()));
    let root = repo.root();
    let mut stdin: &[u8] = b"# New vision\n";
    let mut env = Env {
        cwd: &root,
        stdin: &mut stdin,
        faults,
    };
    let ran = cli::run(&full, &mut env);
    (ran.status, serde_json::from_str(&ran.stdout).unwrap())
}

fn fault_at(step: usize) -> Faults {
    Faults {
        fail_before_step: Some(step),
        ..Faults::default()
    }
}

const REQ_ADD: &[&str] = &[
    "requirement",
    "add",
    "--change-set",
    "CS-00001",
    "--id",
    "REQ-CLI-00001",
    "--type",
    "ubiquitous",
    "--text",
    "The CLI shall work.",
    "--scope",
    "cli",
    "--verification-mode",
    "isolated-interface",
    "--provenance",
    "user-authored",
    "--created",
    "2026-09-15T12:03:00Z",
];

#[test]
fn requirement_add_interrupted_at_every_step_changes_nothing() {
    let repo = with_change_set();
    let before = repo.snapshot();
    let branches = repo.branches();
    // record, manifest, project.yaml, then the post-write check
    for step in 0..=3 {
        let (status, out) = run_with(&repo, REQ_ADD, fault_at(step));
        assert_eq!(status, 6, "step {step}: {out}");
        let expected = if step == 3 {
            "storage.post_write_failed"
        } else {
            "storage.write_failed"
        };
        assert_eq!(out["error"]["code"], expected, "step {step}");
        assert_eq!(out["error"]["mutation"], "none");
        assert_eq!(repo.snapshot(), before, "step {step} left a trace");
        assert_eq!(repo.branches(), branches);
    }
    let (status, out) = run_with(&repo, REQ_ADD, Faults::default());
    assert_eq!(status, 0, "{out}");
    assert_ne!(repo.snapshot(), before, "the unfaulted write lands");
}

#[test]
fn artifact_put_with_new_path_and_projection_entry_is_atomic() {
    let repo = with_change_set();
    let before = repo.snapshot();
    let args = [
        "artifact",
        "put",
        "--change-set",
        "CS-00001",
        "--id",
        "idl",
        "--kind",
        "interface-idl",
        "--path",
        "api/new/spec.yaml",
        "--owner",
        "user",
        "--content-stdin",
    ];
    // content, manifest, project.yaml, projection.yaml, post-write check
    for step in 0..=4 {
        let (status, out) = run_with(&repo, &args, fault_at(step));
        assert_eq!(status, 6, "step {step}: {out}");
        assert_eq!(
            repo.snapshot(),
            before,
            "step {step}: created directories and files are removed"
        );
    }
    let (status, out) = run_with(&repo, &args, Faults::default());
    assert_eq!(status, 0, "{out}");
    assert_eq!(out["mutation"]["paths"].as_array().unwrap().len(), 4);
}

#[test]
fn change_set_create_interrupted_restores_the_branch() {
    let repo = initialized();
    let before = repo.snapshot();
    let branches = repo.branches();
    let args = [
        "change-set",
        "create",
        "--intent",
        "Cut",
        "--implementation-required",
        "true",
        "--created",
        "2026-09-15T12:00:00Z",
    ];
    // manifest, project.yaml, post-write check
    for step in 0..=2 {
        let (status, out) = run_with(&repo, &args, fault_at(step));
        assert_eq!(status, 6, "step {step}: {out}");
        assert_eq!(out["error"]["mutation"], "none");
        assert_eq!(
            repo.head_branch(),
            "main",
            "step {step}: original branch restored"
        );
        assert_eq!(
            repo.branches(),
            branches,
            "step {step}: the cut branch is deleted"
        );
        assert_eq!(repo.snapshot(), before, "step {step}");
    }
    let (status, _) = run_with(&repo, &args, Faults::default());
    assert_eq!(status, 0);
    assert_eq!(repo.head_branch(), "cs/00001-cut");
}

#[test]
fn unconfirmed_rollback_is_write_unknown() {
    let repo = with_change_set();
    let (status, out) = run_with(
        &repo,
        REQ_ADD,
        Faults {
            fail_before_step: Some(2),
            fail_rollback: true,
            ..Faults::default()
        },
    );
    assert_eq!(status, 6);
    assert_eq!(out["error"]["code"], "storage.write_unknown");
    assert_eq!(out["error"]["mutation"], "unknown");
    assert_eq!(out["error"]["retry"], "reconcile-before-retry");
}

#[test]
fn project_init_interrupted_writes_nothing() {
    let repo = Repo::new();
    repo.write("docs/architecture.md", b"# A\n");
    repo.write("docs/vision.md", b"# V\n");
    repo.commit_all("base");
    let before = repo.snapshot();
    let args = [
        "project",
        "init",
        "--id",
        "x",
        "--name",
        "x",
        "--canonical-remote",
        "https://h/x",
        "--review-mode",
        "single-player",
    ];
    for step in 0..=1 {
        let (status, _) = run_with(&repo, &args, fault_at(step));
        assert_eq!(status, 6);
        assert_eq!(
            repo.snapshot(),
            before,
            "step {step}: .protobot/ is removed again"
        );
    }
}

#[test]
fn unconfirmed_branch_restore_is_git_write_unknown() {
    let repo = initialized();
    let args = [
        "change-set",
        "create",
        "--intent",
        "Cut",
        "--implementation-required",
        "true",
        "--created",
        "2026-09-15T12:00:00Z",
    ];
    let (status, out) = run_with(
        &repo,
        &args,
        Faults {
            fail_before_step: Some(0),
            fail_branch_restore: true,
            ..Faults::default()
        },
    );
    assert_eq!(status, 6, "{out}");
    assert_eq!(out["error"]["code"], "git.write_unknown");
    assert_eq!(out["error"]["mutation"], "unknown");
}
