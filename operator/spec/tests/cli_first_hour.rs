//! What a new user meets first (issue #15): `--created` defaults to now,
//! every missing required option is named at once, `project init` names its
//! missing prerequisites.
//!
//! Test index:
//! - `created_defaults_to_now`;
//! - `several_missing_required_options_are_named_together`;
//! - `project_init_names_a_missing_vision_and_architecture`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::{Repo, assert_fails, initialized, json, with_change_set};

#[test]
fn created_defaults_to_now() {
    let repo = initialized();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let out = json(
        &repo.root(),
        &[
            "change-set",
            "create",
            "--intent",
            "Try things",
            "--implementation-required",
            "true",
        ],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    let out = json(
        &repo.root(),
        &[
            "requirement",
            "add",
            "--change-set",
            "CS-00001",
            "--id",
            "REQ-CLI-00001",
            "--type",
            "ubiquitous",
            "--text",
            "The CLI shall help.",
            "--verification-mode",
            "isolated-interface",
            "--provenance",
            "user-authored",
            "--scope",
            "cli",
        ],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    let created = out.json_value()["data"]["requirement"]["created"]
        .as_str()
        .unwrap()
        .to_owned();
    // RFC 3339, UTC, whole seconds, not before the test started.
    assert_eq!(created.len(), 20, "{created}");
    assert!(created.ends_with('Z'), "{created}");
    let year: u64 = created[..4].parse().unwrap();
    assert!(year >= 1970 + before / 31_622_400, "{created}");
    // An explicit value still wins.
    let out = json(
        &repo.root(),
        &[
            "requirement",
            "add",
            "--change-set",
            "CS-00001",
            "--id",
            "REQ-CLI-00002",
            "--type",
            "ubiquitous",
            "--text",
            "The CLI shall report.",
            "--verification-mode",
            "isolated-interface",
            "--provenance",
            "user-authored",
            "--scope",
            "cli",
            "--created",
            "2026-09-15T12:03:00Z",
        ],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    assert_eq!(
        out.json_value()["data"]["requirement"]["created"],
        "2026-09-15T12:03:00Z"
    );
}

#[test]
fn several_missing_required_options_are_named_together() {
    let repo = with_change_set();
    let out = json(
        &repo.root(),
        &[
            "requirement",
            "add",
            "--change-set",
            "CS-00001",
            "--id",
            "REQ-CLI-00001",
        ],
    );
    assert_fails(&out, 2, "usage.invalid_request", None);
    let message = out.json_value()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    for option in ["--type", "--text", "--verification-mode", "--provenance"] {
        assert!(message.contains(option), "{message}");
    }
    assert!(
        !message.contains("--created"),
        "--created has a default: {message}"
    );
    assert!(message.contains("requirement add --help"), "{message}");
    // A single missing option keeps its own message.
    let out = json(&repo.root(), &["requirement", "show"]);
    assert_fails(&out, 2, "usage.invalid_request", None);
    assert_eq!(
        out.json_value()["error"]["message"],
        "Option --id is required."
    );
}

#[test]
fn project_init_names_a_missing_vision_and_architecture() {
    let repo = Repo::new();
    repo.write("README.md", b"# demo\n");
    repo.commit_all("base");
    let init = [
        "project",
        "init",
        "--id",
        "demo",
        "--name",
        "Demo",
        "--canonical-remote",
        "https://example.invalid/demo.git",
        "--review-mode",
        "single-player",
    ];
    let out = json(&repo.root(), &init);
    assert_fails(&out, 4, "project.invalid_path", None);
    let text = out.stdout.clone();
    assert!(text.contains("docs/vision.md does not exist"), "{text}");
    repo.write("docs/vision.md", b"# Vision\n");
    repo.commit_all("vision");
    let out = json(&repo.root(), &init);
    assert!(
        out.stdout.contains("docs/architecture.md does not exist"),
        "{}",
        out.stdout
    );
    repo.write("docs/architecture.md", b"# Architecture\n");
    let out = json(&repo.root(), &init);
    assert!(
        out.stdout
            .contains("docs/architecture.md must be committed"),
        "{}",
        out.stdout
    );
    repo.commit_all("architecture");
    let out = json(&repo.root(), &init);
    assert_eq!(out.status, 0, "{}", out.stdout);
}
