//! Test support (feature `test-support`): a real project repository with
//! change sets authored by ears-manager (run in-process) and merged the way a
//! person merges a change-set pull request. Used by this crate's tests and by
//! the controller tests; never part of a production build.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::authoring;

/// `authoring::git`, panicking on failure (tests).
pub fn git(dir: &std::path::Path, args: &[&str]) -> String {
    authoring::git(dir, args).unwrap_or_else(|e| panic!("{e}"))
}

/// `authoring::ears`, panicking on failure (tests).
pub fn ears(dir: &std::path::Path, args: &[&str]) -> serde_json::Value {
    authoring::ears(dir, args).unwrap_or_else(|e| panic!("{e}"))
}

/// A spec repository in a temp dir: change set `CS-00001` (one event-driven
/// requirement on interface `cli-main`) merged into `main` with a merge commit,
/// and `CS-00002` proposed but never merged. Returns the dir and the merge commit.
pub fn spec_repo(project_id: &str) -> (tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    git(dir, &["init", "-q", "-b", "main"]);
    std::fs::write(dir.join("README.md"), format!("# {project_id}\n")).unwrap();
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::write(dir.join("docs/vision.md"), "# Vision\n").unwrap();
    std::fs::write(dir.join("docs/architecture.md"), "# Architecture\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "initial"]);
    let remote = format!("https://example.invalid/{project_id}.git");
    ears(
        dir,
        &[
            "project",
            "init",
            "--id",
            project_id,
            "--name",
            project_id,
            "--canonical-remote",
            &remote,
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
