//! Every error code and exit status the CLI can reach, each provoked through
//! the real binary (contract §16, §25). Codes that only arise from direct
//! edits of records are provoked by editing files and then running `check`;
//! `core_codes.rs` covers the rest on in-memory projects, `faults.rs` the
//! injected I/O failures (`storage.write_failed`, `storage.write_unknown`,
//! `storage.post_write_failed`, `git.write_unknown`), and the unit tests of
//! `cli/mod.rs` the status-70 `internal.failure` envelope.
//!
//! §25 names with no test, and why:
//! - `change_set.no_base`: EM-04/05 only; EM-07 create reports
//!   `project.default_branch_unresolved` instead.
//! - `change_set.branch_exists`: the new number is one above every number
//!   in use, branch names included, so the name can only exist after a race.
//! - `requirement.duplicate_id` / `interface.duplicate_id` /
//!   `change_set.duplicate_id` as *diagnostics*: two files of one store
//!   cannot carry the same ID without one failing the filename rule first
//!   (`record.filename_mismatch`, tested). The error forms are tested.
//! - `artifact.read_failed`: `artifact get` validates the whole project
//!   first, so a missing or irregular file is already `artifact.path_*`.
//! - `project.load_failed`: our loader always reports diagnostics.
//! - `requirement.read_failed`, `interface.read_failed`,
//!   `change_set.read_failed`, `artifact.write_not_allowed`: contract names
//!   the code never emits (§25).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use support::{Repo, assert_fails, initialized, json, req_add, reseal, run, with_change_set};

// === status 0 and 2 ===

#[test]
fn help_and_version_succeed_without_a_project() {
    let dir = tempfile::tempdir().unwrap();
    let out = json(dir.path(), &["--version"]);
    assert_eq!(out.status, 0);
    assert_eq!(out.json_value()["command"], "version");
    let out = json(dir.path(), &["--help"]);
    assert_eq!(out.status, 0);
    assert!(
        out.json_value()["data"]["text"]
            .as_str()
            .unwrap()
            .contains("change-set create")
    );
    // A subcommand's help lists its own options, the required ones marked.
    let out = json(dir.path(), &["requirement", "add", "--help"]);
    assert_eq!(out.status, 0);
    let text = out.json_value()["data"]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(text.contains("requirement add [options]"), "{text}");
    assert!(text.contains("--provenance VALUE"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains("--change-set VALUE") && l.ends_with("required")),
        "{text}"
    );
    assert!(
        text.contains("--created VALUE") && text.contains("default: now"),
        "{text}"
    );
    assert!(!text.contains("change-set create"), "{text}");
}

#[test]
fn usage_errors_exit_2() {
    let repo = with_change_set();
    let root = repo.root();
    assert_fails(
        &json(&root, &["nonsense"]),
        2,
        "usage.invalid_request",
        None,
    );
    assert_fails(
        &json(&root, &["requirement", "show"]),
        2,
        "usage.invalid_request",
        None,
    );
    assert_fails(
        &json(&root, &["requirement", "show", "--id", "--x"]),
        2,
        "usage.invalid_request",
        None,
    );
    assert_fails(
        &json(&root, &["requirement", "show", "--id", "   "]),
        2,
        "usage.invalid_request",
        None,
    );
    assert_fails(
        &json(&root, &["requirement", "show", "stray"]),
        2,
        "usage.invalid_request",
        None,
    );
    assert_fails(
        &json(&root, &["change-set", "update", "--change-set", "CS-00001"]),
        2,
        "usage.invalid_request",
        None,
    );
    assert_fails(
        &json(
            &root,
            &[
                "change-set",
                "create",
                "--intent",
                "x",
                "--implementation-required",
                "maybe",
                "--created",
                "2026-09-15T12:00:00Z",
            ],
        ),
        2,
        "usage.invalid_request",
        None,
    );
    assert_fails(
        &json(
            &root,
            &[
                "change-set",
                "create",
                "--intent",
                "x",
                "--implementation-required",
                "false",
                "--created",
                "2026-09-15T12:00:00Z",
            ],
        ),
        2,
        "usage.invalid_request",
        None,
    );
    assert_fails(
        &req_add(
            &repo,
            "REQ-CLI-00001",
            "The CLI shall x.",
            &["--relationship", "depends-on="],
        ),
        2,
        "usage.invalid_request",
        None,
    );
    // A bad --output is reported in human form on stderr.
    let out = run(&root, &["--output", "yaml", "check"], None);
    assert_eq!(out.status, 2);
    assert!(
        out.stdout.is_empty() && out.stderr.starts_with("error[usage.invalid_request]"),
        "{}",
        out.stderr
    );
}

#[test]
fn human_mode_prints_summary_or_error_block() {
    let repo = with_change_set();
    let out = run(&repo.root(), &["check"], None);
    assert_eq!(out.status, 0);
    assert!(out.stdout.starts_with("check: ok\n"), "{}", out.stdout);
    let out = run(
        &repo.root(),
        &["requirement", "show", "--id", "REQ-CLI-00009"],
        None,
    );
    assert_eq!(out.status, 4);
    assert!(out.stdout.is_empty());
    assert!(
        out.stderr.contains("error[requirement.not_found]")
            && out.stderr.contains("retry: revise-request"),
        "{}",
        out.stderr
    );
}

// === status 3 ===

#[test]
fn project_selection_failures_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    assert_fails(
        &json(dir.path(), &["check"]),
        3,
        "project.not_git_root",
        None,
    );
    let repo = Repo::new();
    assert_fails(
        &json(&repo.root(), &["check"]),
        3,
        "project.not_initialized",
        None,
    );
    // init with an unborn HEAD
    assert_fails(
        &json(
            &repo.root(),
            &[
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
            ],
        ),
        3,
        "project.invalid_configuration",
        None,
    );
}

#[test]
fn nested_project_on_init_is_not_git_root() {
    let repo = Repo::new();
    repo.write("docs/architecture.md", b"# A\n");
    repo.write("docs/vision.md", b"# V\n");
    repo.write("sub/.protobot/project.yaml", b"x: 1\n");
    repo.commit_all("base");
    let out = json(
        &repo.root().join("sub"),
        &[
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
        ],
    );
    assert_fails(
        &out,
        3,
        "project.not_git_root",
        Some("project.not_git_root"),
    );
}

fn edit_project(repo: &Repo, from: &str, to: &str) {
    let text = String::from_utf8(repo.read(".protobot/project.yaml")).unwrap();
    assert!(text.contains(from), "{from} not in project.yaml:\n{text}");
    repo.write(
        ".protobot/project.yaml",
        text.replacen(from, to, 1).as_bytes(),
    );
}

#[test]
fn project_class_diagnostics_win_with_status_3() {
    let repo = initialized();
    edit_project(&repo, "review_mode: single-player", "review_mode: solo");
    assert_fails(
        &json(&repo.root(), &["check"]),
        3,
        "project.invalid_configuration",
        Some("project.invalid_configuration"),
    );

    let repo = initialized();
    edit_project(&repo, "  name: Demo\n", "");
    assert_fails(
        &json(&repo.root(), &["check"]),
        3,
        "project.invalid_configuration",
        Some("project.missing_field"),
    );

    let repo = initialized();
    edit_project(
        &repo,
        "requirements: \".protobot/requirements\"",
        "requirements: \".protobot/policy.yaml\"",
    );
    assert_fails(
        &json(&repo.root(), &["check"]),
        3,
        "project.invalid_configuration",
        Some("project.invalid_path"),
    );

    let repo = initialized();
    edit_project(&repo, "project: 1", "project: 2");
    assert_fails(
        &json(&repo.root(), &["check"]),
        3,
        "project.invalid_configuration",
        Some("schema.unsupported_version"),
    );
}

#[test]
fn unresolvable_default_branch_exits_3() {
    let repo = with_change_set();
    edit_project(&repo, "default_branch: main", "default_branch: trunk");
    assert_fails(
        &json(&repo.root(), &["change-set", "list"]),
        3,
        "project.default_branch_unresolved",
        None,
    );
}

// === status 4 ===

#[test]
fn init_request_errors_exit_4_or_5() {
    let repo = initialized();
    assert_fails(
        &json(
            &repo.root(),
            &[
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
            ],
        ),
        5,
        "project.already_initialized",
        Some("project.already_initialized"),
    );
    let fresh = || {
        let r = Repo::new();
        r.write("docs/architecture.md", b"# A\n");
        r.write("docs/vision.md", b"# V\n");
        r.commit_all("base");
        r
    };
    let init = |r: &Repo, remote: &str, extra: &[&str]| {
        let mut a = vec![
            "project",
            "init",
            "--id",
            "x",
            "--name",
            "x",
            "--canonical-remote",
            remote,
            "--review-mode",
            "single-player",
        ];
        a.extend_from_slice(extra);
        json(&r.root(), &a)
    };
    let r = fresh();
    assert_fails(
        &init(&r, "https://user:secret@h/x", &[]),
        4,
        "project.remote_credentials",
        None,
    );
    let out = init(&r, "deploy@host:repo", &[]);
    assert_fails(&out, 4, "project.remote_credentials", None);
    assert!(
        !out.stdout.contains("deploy@host"),
        "diagnostics never echo the remote"
    );
    assert_fails(
        &init(&r, "http://h/x", &[]),
        4,
        "project.invalid_configuration",
        None,
    );
    assert_fails(
        &init(&r, "https://h/x", &["--branch-prefix", "wi/"]),
        4,
        "project.invalid_configuration",
        None,
    );
    assert_fails(
        &init(&r, "https://h/x", &["--vision", "docs/missing.md"]),
        4,
        "project.invalid_path",
        Some("project.invalid_path"),
    );
    assert_fails(
        &init(&r, "https://h/x", &["--vision", "docs/CLAUDE.md"]),
        4,
        "project.invalid_path",
        None,
    );
    r.write("docs/vision.md", b"# V changed\n");
    assert_fails(
        &init(&r, "https://h/x", &[]),
        4,
        "project.invalid_path",
        None,
    );
    let r = fresh();
    r.write("docs/vision.md", b"\xEF\xBB\xBF# V\n");
    r.commit_all("bom");
    assert_fails(
        &init(&r, "https://h/x", &[]),
        4,
        "project.invalid_configuration",
        Some("artifact.invalid_content"),
    );
    let r = fresh();
    assert_fails(
        &init(&r, "https://h/x", &["--default-branch", "trunk"]),
        3,
        "project.invalid_configuration",
        None,
    );
    assert!(
        !r.root().join(".protobot").exists(),
        "failed init writes nothing"
    );
}

#[test]
fn requirement_add_validation_codes() {
    let repo = with_change_set();
    let t = "The CLI shall work.";
    assert_fails(
        &req_add(&repo, "REQ-cli-1", t, &[]),
        4,
        "requirement.invalid_id",
        None,
    );
    assert_fails(
        &req_add(&repo, "REQ-CLI-00001", t, &["--type", "bogus"]),
        4,
        "validation.failed",
        Some("requirement.invalid_type"),
    );
    assert_fails(
        &req_add(&repo, "REQ-CLI-00001", "It works.", &[]),
        4,
        "validation.failed",
        Some("requirement.ears_pattern_mismatch"),
    );
    assert_fails(
        &req_add(&repo, "REQ-CLI-00001", t, &["--interface", "nope"]),
        4,
        "validation.failed",
        Some("reference.not_found"),
    );
    assert_fails(
        &req_add(
            &repo,
            "REQ-CLI-00001",
            t,
            &["--scope", "cli", "--scope", "cli"],
        ),
        4,
        "validation.failed",
        Some("requirement.duplicate_selector"),
    );
    assert_fails(
        &req_add(&repo, "REQ-CLI-00001", t, &["--verification-mode", "vibes"]),
        4,
        "validation.failed",
        Some("requirement.invalid_verification"),
    );
    assert_fails(
        &req_add(
            &repo,
            "REQ-CLI-00001",
            t,
            &["--verification-mode", "implementation-aware"],
        ),
        4,
        "validation.failed",
        Some("requirement.missing_field"),
    );
    assert_fails(
        &req_add(&repo, "REQ-CLI-00001", t, &["--provenance", "dreamt"]),
        4,
        "validation.failed",
        Some("requirement.invalid_provenance"),
    );
    assert_fails(
        &req_add(
            &repo,
            "REQ-CLI-00001",
            t,
            &["--created", "2026-02-30T00:00:00Z"],
        ),
        4,
        "validation.failed",
        Some("record.invalid_timestamp"),
    );
    assert_fails(
        &req_add(&repo, "REQ-CLI-00001", t, &["--interface", "Bad_Id"]),
        4,
        "validation.failed",
        Some("requirement.invalid_applicability"),
    );
    let before = repo.snapshot();
    assert_fails(
        &req_add(
            &repo,
            "REQ-CLI-00001",
            t,
            &["--relationship", "depends-on=REQ-CLI-00001"],
        ),
        4,
        "validation.failed",
        Some("relationship.cycle"),
    );
    assert_fails(
        &req_add(
            &repo,
            "REQ-CLI-00001",
            t,
            &["--relationship", "likes=REQ-CLI-00001"],
        ),
        4,
        "validation.failed",
        Some("relationship.invalid_type"),
    );
    assert_fails(
        &req_add(
            &repo,
            "REQ-CLI-00001",
            t,
            &["--relationship", "depends-on=nope"],
        ),
        4,
        "validation.failed",
        Some("relationship.invalid_target"),
    );
    assert_fails(
        &req_add(
            &repo,
            "REQ-CLI-00001",
            t,
            &[
                "--relationship",
                "related-to=REQ-CLI-00009",
                "--relationship",
                "related-to=REQ-CLI-00009",
            ],
        ),
        4,
        "validation.failed",
        Some("relationship.duplicate"),
    );
    assert_eq!(
        before,
        repo.snapshot(),
        "failed writes leave the tree unchanged"
    );
    assert_eq!(req_add(&repo, "REQ-CLI-00001", t, &[]).status, 0);
    assert_fails(
        &req_add(
            &repo,
            "REQ-CLI-00002",
            t,
            &["--relationship", "supersedes=REQ-CLI-00001"],
        ),
        4,
        "validation.failed",
        Some("relationship.superseded_requirement_active"),
    );
}

#[test]
fn requirement_lifecycle_codes() {
    let repo = with_change_set();
    let root = repo.root();
    assert_eq!(
        req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]).status,
        0
    );
    assert_fails(
        &req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]),
        5,
        "requirement.duplicate_id",
        None,
    );
    assert_fails(
        &json(&root, &["requirement", "show", "--id", "REQ-CLI-00009"]),
        4,
        "requirement.not_found",
        None,
    );
    assert_fails(
        &json(
            &root,
            &[
                "requirement",
                "update",
                "--change-set",
                "CS-00001",
                "--id",
                "REQ-CLI-00001",
                "--status",
                "retired",
            ],
        ),
        4,
        "requirement.use_retire",
        None,
    );
    let out = json(
        &root,
        &[
            "requirement",
            "retire",
            "--change-set",
            "CS-00001",
            "--id",
            "REQ-CLI-00001",
        ],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    assert_eq!(out.json_value()["data"]["operation"]["action"], "retire");
    assert_fails(
        &json(
            &root,
            &[
                "requirement",
                "retire",
                "--change-set",
                "CS-00001",
                "--id",
                "REQ-CLI-00001",
            ],
        ),
        5,
        "requirement.already_retired",
        None,
    );
    assert_fails(
        &json(
            &root,
            &[
                "requirement",
                "update",
                "--change-set",
                "CS-00001",
                "--id",
                "REQ-CLI-00001",
                "--status",
                "active",
            ],
        ),
        5,
        "requirement.already_retired",
        None,
    );
    // retire then revise in the same change set cannot merge
    assert_fails(
        &json(
            &root,
            &[
                "requirement",
                "update",
                "--change-set",
                "CS-00001",
                "--id",
                "REQ-CLI-00001",
                "--text",
                "The CLI shall rest.",
            ],
        ),
        5,
        "change_set.duplicate_operation",
        None,
    );
    assert_fails(
        &json(&root, &["requirement", "list", "--status", "zombie"]),
        4,
        "requirement.invalid_status",
        None,
    );
    assert_fails(
        &json(&root, &["requirement", "list", "--type", "zombie"]),
        4,
        "requirement.invalid_type",
        None,
    );
    assert_fails(
        &json(&root, &["requirement", "list", "--relationship", "zombie"]),
        4,
        "relationship.invalid_type",
        None,
    );
    assert_fails(
        &json(&root, &["requirement", "list", "--interface", "Zombie"]),
        4,
        "interface.invalid_id",
        None,
    );
}

fn iface_add(repo: &Repo, id: &str, kind: &str) -> support::Out {
    json(
        &repo.root(),
        &[
            "interface",
            "add",
            "--change-set",
            "CS-00001",
            "--id",
            id,
            "--name",
            "N",
            "--type",
            kind,
            "--created",
            "2026-09-15T12:02:00Z",
        ],
    )
}

#[test]
fn interface_codes() {
    let repo = with_change_set();
    let root = repo.root();
    assert_fails(
        &iface_add(&repo, "Bad", "cli"),
        4,
        "interface.invalid_id",
        None,
    );
    assert_fails(
        &iface_add(&repo, "cli-main", "gui"),
        4,
        "validation.failed",
        Some("interface.invalid_type"),
    );
    assert_eq!(iface_add(&repo, "cli-main", "cli").status, 0);
    assert_fails(
        &iface_add(&repo, "cli-main", "cli"),
        5,
        "interface.duplicate_id",
        None,
    );
    assert_fails(
        &json(&root, &["interface", "show", "--id", "nope"]),
        4,
        "interface.not_found",
        None,
    );
    assert_fails(
        &json(&root, &["interface", "list", "--type", "gui"]),
        4,
        "interface.invalid_type",
        None,
    );
    assert_fails(
        &json(&root, &["interface", "list", "--status", "gone"]),
        4,
        "interface.invalid_status",
        None,
    );
    let out = json(&root, &["interface", "list", "--type", "cli"]);
    assert_eq!(out.json_value()["data"]["interfaces"][0]["id"], "cli-main");
    // an interface with an operation already in the set, removed from disk
    std::fs::remove_file(root.join(".protobot/interfaces/cli-main.yaml")).unwrap();
    reseal(&repo);
    assert_fails(
        &iface_add(&repo, "cli-main", "cli"),
        5,
        "change_set.duplicate_operation",
        None,
    );
}

fn put(
    repo: &Repo,
    id: &str,
    kind: &str,
    path: &str,
    owner: &str,
    extra: &[&str],
    stdin: &str,
) -> support::Out {
    let mut a = vec![
        "--output",
        "json",
        "artifact",
        "put",
        "--change-set",
        "CS-00001",
        "--id",
        id,
        "--kind",
        kind,
        "--path",
        path,
        "--owner",
        owner,
        "--content-stdin",
    ];
    a.extend_from_slice(extra);
    run(&repo.root(), &a, Some(stdin))
}

#[test]
fn artifact_codes() {
    let repo = with_change_set();
    let root = repo.root();
    assert_fails(
        &put(&repo, "Bad", "vision", "docs/v.md", "user", &[], "x\n"),
        4,
        "artifact.invalid_id",
        None,
    );
    assert_fails(
        &json(
            &root,
            &[
                "artifact",
                "put",
                "--change-set",
                "CS-00001",
                "--id",
                "a",
                "--kind",
                "vision",
                "--path",
                "a.md",
                "--owner",
                "user",
                "--content-file",
                "missing.md",
            ],
        ),
        4,
        "input.invalid_source",
        None,
    );
    assert_fails(
        &put(&repo, "a", "vision", "/abs.md", "user", &[], "x\n"),
        4,
        "artifact.invalid_path",
        None,
    );
    assert_fails(
        &put(&repo, "a", "vision", "a.md", "user", &[], "\u{feff}x\n"),
        4,
        "artifact.invalid_content",
        None,
    );
    assert_fails(
        &put(
            &repo,
            "vision",
            "vision",
            "docs/vision.md",
            "ears-manager",
            &[],
            "x\n",
        ),
        5,
        "artifact.owner_immutable",
        None,
    );
    assert_fails(
        &put(&repo, "a", "roadmap", "a.md", "user", &[], "x\n"),
        4,
        "validation.failed",
        Some("artifact.unknown_kind"),
    );
    assert_fails(
        &put(&repo, "a", "vision", "docs/CLAUDE.md", "user", &[], "x\n"),
        4,
        "validation.failed",
        Some("artifact.invalid_path"),
    );
    assert_fails(
        &put(&repo, "a", "vision", "a.md", "kit", &[], "x\n"),
        4,
        "validation.failed",
        Some("artifact.invalid_owner"),
    );
    assert_fails(
        &put(
            &repo,
            "a",
            "vision",
            "a.md",
            "user",
            &["--validator", "eslint"],
            "x\n",
        ),
        4,
        "validation.failed",
        Some("artifact.validator_not_allowed"),
    );
    assert_fails(
        &put(
            &repo,
            "a",
            "vision",
            "a.md",
            "user",
            &["--validator", "protoc"],
            "x\n",
        ),
        4,
        "validation.failed",
        Some("artifact.validator_incompatible"),
    );
    assert_fails(
        &put(&repo, "a", "vision", "docs/Vision.md", "user", &[], "x\n"),
        4,
        "validation.failed",
        Some("artifact.duplicate_path"),
    );
    std::fs::create_dir_all(root.join("adir")).unwrap();
    assert_fails(
        &put(&repo, "a", "vision", "adir", "user", &[], "x\n"),
        4,
        "storage.write_not_allowed",
        Some("storage.write_not_allowed"),
    );
    // a new path gets a shared projection entry in the same transaction
    let out = put(
        &repo,
        "prose",
        "interface-prose",
        "docs/prose.md",
        "user",
        &["--validator", "markdownlint"],
        "a\r\nb\n",
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    let paths: Vec<String> = out.json_value()["mutation"]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        paths,
        [
            "docs/prose.md",
            ".protobot/change-sets/cs-00001.yaml",
            ".protobot/project.yaml",
            ".protobot/projection.yaml"
        ]
    );
    assert_eq!(
        repo.read("docs/prose.md"),
        b"a\nb\n",
        "CRLF is stored as LF"
    );
    assert_eq!(
        put(
            &repo,
            "prose2",
            "interface-prose",
            "docs/prose2.md",
            "user",
            &[],
            "c\n"
        )
        .status,
        0
    );
    assert_fails(
        &json(&root, &["artifact", "get", "--kind", "interface-prose"]),
        5,
        "artifact.ambiguous",
        None,
    );
    assert_fails(
        &json(&root, &["artifact", "get", "--kind", "roadmap"]),
        4,
        "artifact.unknown_kind",
        None,
    );
    assert_fails(
        &json(&root, &["artifact", "get", "--id", "Bad"]),
        4,
        "artifact.invalid_id",
        None,
    );
    assert_fails(
        &json(&root, &["artifact", "get", "--id", "nope"]),
        4,
        "artifact.not_found",
        None,
    );
    let out = json(&root, &["artifact", "get", "--id", "prose"]);
    assert_eq!(out.json_value()["data"]["content"], "a\nb\n");
    assert_fails(
        &json(&root, &["artifact", "get"]),
        2,
        "usage.invalid_request",
        None,
    );
}

#[test]
fn direct_edits_are_caught_by_check() {
    let repo = with_change_set();
    let root = repo.root();
    repo.write("docs/vision.md", b"# edited\n");
    assert_fails(
        &json(&root, &["check"]),
        4,
        "validation.failed",
        Some("artifact.digest_mismatch"),
    );
    std::fs::remove_file(root.join("docs/vision.md")).unwrap();
    assert_fails(
        &json(&root, &["check"]),
        4,
        "validation.failed",
        Some("artifact.path_not_found"),
    );

    let repo = with_change_set();
    let root = repo.root();
    assert_eq!(
        req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]).status,
        0
    );
    let rec = repo.read(".protobot/requirements/REQ-CLI-00001.yaml");
    repo.write(
        ".protobot/requirements/REQ-CLI-00001.yaml",
        &[rec.clone(), b"# trailing\n".to_vec()].concat(),
    );
    assert_fails(
        &json(&root, &["check"]),
        4,
        "validation.failed",
        Some("project.store_digest_mismatch"),
    );
    // digest failures block every read and write
    assert_fails(
        &json(&root, &["requirement", "list"]),
        4,
        "validation.failed",
        Some("project.store_digest_mismatch"),
    );
    repo.write(".protobot/requirements/REQ-CLI-00001.yaml", &rec);
    std::fs::create_dir_all(root.join(".protobot/requirements/sub")).unwrap();
    assert_fails(
        &json(&root, &["check"]),
        4,
        "validation.failed",
        Some("project.store_digest_unreadable"),
    );
    std::fs::remove_dir(root.join(".protobot/requirements/sub")).unwrap();
    std::fs::rename(
        root.join(".protobot/requirements/REQ-CLI-00001.yaml"),
        root.join(".protobot/requirements/REQ-CLI-00007.yaml"),
    )
    .unwrap();
    reseal(&repo);
    assert_fails(
        &json(&root, &["check"]),
        4,
        "validation.failed",
        Some("record.filename_mismatch"),
    );
    repo.write(
        ".protobot/requirements/REQ-CLI-00007.yaml",
        b"id: [unclosed\n",
    );
    reseal(&repo);
    assert_fails(
        &json(&root, &["check"]),
        4,
        "validation.failed",
        Some("storage.decode_failed"),
    );
    std::fs::remove_file(root.join(".protobot/requirements/REQ-CLI-00007.yaml")).unwrap();
    reseal(&repo);
    edit_project(&repo, "requirements: sha256:", "requirements: sha1:");
    assert_fails(
        &json(&root, &["check"]),
        4,
        "validation.failed",
        Some("project.invalid_digest"),
    );
    let text = String::from_utf8(repo.read(".protobot/project.yaml")).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("requirements: sha1:"))
        .unwrap()
        .to_owned();
    repo.write(
        ".protobot/project.yaml",
        text.replace(&format!("{line}\n"), "").as_bytes(),
    );
    let out = json(&root, &["check"]);
    assert_fails(&out, 4, "validation.failed", Some("project.missing_field"));

    let repo = with_change_set();
    let root = repo.root();
    edit_project(
        &repo,
        "canonical_remote: https://example.invalid/demo.git",
        "canonical_remote: https://u:p@example.invalid/demo.git",
    );
    let out = json(&root, &["check"]);
    assert_fails(
        &out,
        4,
        "validation.failed",
        Some("project.remote_credentials"),
    );
    assert!(!out.stdout.contains("u:p@"), "credentials are never echoed");
}

#[test]
fn projection_codes() {
    let repo = with_change_set();
    let root = repo.root();
    repo.write(".protobot/projection.yaml", b"version: 2\n");
    assert_fails(
        &json(&root, &["check"]),
        4,
        "validation.failed",
        Some("projection.invalid"),
    );
    assert_fails(
        &put(&repo, "a", "vision", "a.md", "user", &[], "x\n"),
        4,
        "validation.failed",
        Some("projection.invalid"),
    );
    repo.write(
        ".protobot/projection.yaml",
        b"version: 1\npaths:\n  - path: docs/\n    class: test\n",
    );
    let out = json(&root, &["check"]);
    assert_fails(
        &out,
        4,
        "validation.failed",
        Some("projection.unclassified"),
    );
}

#[test]
fn change_set_codes() {
    let repo = with_change_set();
    let root = repo.root();
    assert_fails(
        &json(&root, &["change-set", "show", "--change-set", "CS-00042"]),
        4,
        "change_set.not_found",
        None,
    );
    assert_fails(
        &json(
            &root,
            &["change-set", "compare", "--change-set", "CS-00042"],
        ),
        4,
        "change_set.not_found",
        None,
    );
    assert_fails(
        &json(&root, &["impact", "--change-set", "CS-00042"]),
        4,
        "change_set.not_found",
        None,
    );
    assert_fails(
        &json(&root, &["check", "--change-set", "CS-00042"]),
        4,
        "change_set.not_found",
        None,
    );
    assert_fails(
        &json(
            &root,
            &[
                "change-set",
                "compare",
                "--change-set",
                "CS-00001",
                "--against",
                "HEAD",
            ],
        ),
        4,
        "change_set.invalid_base",
        None,
    );
    assert_fails(
        &json(&root, &["change-set", "list", "--status", "merged"]),
        4,
        "change_set.invalid_status",
        None,
    );
    assert_fails(
        &req_add(
            &repo,
            "REQ-CLI-00001",
            "The CLI shall work.",
            &["--change-set", "CS-00042"],
        ),
        4,
        "change_set.not_proposed",
        None,
    );
    let upd = |base: &str| {
        json(
            &root,
            &[
                "change-set",
                "update",
                "--change-set",
                "CS-00001",
                "--base-commit",
                base,
            ],
        )
    };
    assert_fails(&upd("abc"), 4, "change_set.invalid_base", None);
    assert_fails(&upd(&"d".repeat(40)), 4, "change_set.invalid_base", None);
    // a commit that is not an ancestor of HEAD
    let other = {
        let g = repo.git();
        let sig = g.signature().unwrap();
        let tree = g.head().unwrap().peel_to_tree().unwrap();
        g.commit(None, &sig, &sig, "orphan", &tree, &[])
            .unwrap()
            .to_string()
    };
    assert_fails(&upd(&other), 5, "change_set.base_mismatch", None);
    assert_fails(
        &json(
            &root,
            &[
                "change-set",
                "update",
                "--change-set",
                "CS-00001",
                "--impact-file",
                "missing.json",
            ],
        ),
        4,
        "input.invalid_source",
        None,
    );
    repo.write("impact.json", b"{\"not\": \"an array\"}");
    assert_fails(
        &json(
            &root,
            &[
                "change-set",
                "update",
                "--change-set",
                "CS-00001",
                "--impact-file",
                "impact.json",
            ],
        ),
        4,
        "change_set.invalid_impact",
        None,
    );
    let show = json(&root, &["change-set", "show", "--change-set", "CS-00001"]);
    assert_eq!(show.status, 0);
    assert_eq!(show.json_value()["data"]["status"], "proposed");
}

#[test]
fn second_change_set_takes_the_next_number_and_checks_clean() {
    let repo = with_change_set();
    let root = repo.root();
    // an existing requirement in scope cli makes a mechanical candidate
    assert_eq!(
        req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]).status,
        0
    );
    repo.commit_all("req");
    let out = json(
        &root,
        &[
            "change-set",
            "create",
            "--intent",
            "Second",
            "--affected-scope",
            "cli",
            "--implementation-required",
            "true",
            "--created",
            "2026-09-15T12:00:00Z",
        ],
    );
    // CS-00001 is not on main, but its branch name holds number 1, so the
    // next set is CS-00002, cut from main and checked out.
    assert_eq!(out.status, 0, "{}", out.stdout);
    assert_eq!(out.json_value()["data"]["change_set"]["id"], "CS-00002");
    assert_eq!(repo.head_branch(), "cs/00002-second");
    let check = json(&root, &["check", "--change-set", "CS-00002"]);
    assert_eq!(check.status, 0, "{}", check.stdout);
}

#[test]
fn incomplete_and_stale_assessments_exit_5() {
    let repo = initialized();
    let root = repo.root();
    // seed an active requirement on main so the new set has a candidate
    let req = "# managed by ears-manager; do not edit by hand\nid: REQ-CLI-00002\ntype: ubiquitous\ntext: The CLI shall help.\napplies_to:\n  scopes:\n    - cli\nverification:\n  mode: isolated-interface\nprovenance: user-authored\ncreated: \"2026-09-14T12:00:00Z\"\nstatus: active\n";
    repo.write(".protobot/requirements/REQ-CLI-00002.yaml", req.as_bytes());
    reseal(&repo);
    repo.commit_all("seed");
    let out = json(
        &root,
        &[
            "change-set",
            "create",
            "--intent",
            "X",
            "--affected-scope",
            "cli",
            "--implementation-required",
            "true",
            "--created",
            "2026-09-15T12:00:00Z",
        ],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    assert_fails(
        &json(&root, &["check"]),
        5,
        "change_set.assessment_incomplete",
        Some("change_set.incomplete_impact"),
    );
    // reads allow drafts
    assert_eq!(json(&root, &["requirement", "list"]).status, 0);
    repo.write("impact.json", br#"[{"requirement_id":"REQ-CLI-00002","disposition":"applicable","rationale":"r","origin":"semantic"}]"#);
    let out = json(
        &root,
        &[
            "change-set",
            "update",
            "--change-set",
            "CS-00001",
            "--impact-file",
            "impact.json",
        ],
    );
    assert_fails(
        &out,
        4,
        "validation.failed",
        Some("change_set.invalid_impact"),
    );
    repo.write("impact.json", br#"[{"requirement_id":"REQ-CLI-00002","disposition":"applicable","rationale":"r","origin":"mechanical"}]"#);
    let out = json(
        &root,
        &[
            "change-set",
            "update",
            "--change-set",
            "CS-00001",
            "--impact-file",
            "impact.json",
        ],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    assert_eq!(out.json_value()["data"]["assessment_status"], "complete");
    assert_eq!(json(&root, &["check"]).status, 0);
    // move the base forward: the assessment becomes stale
    repo.commit_all("more work");
    let head = repo
        .git()
        .head()
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .id()
        .to_string();
    let out = json(
        &root,
        &[
            "change-set",
            "update",
            "--change-set",
            "CS-00001",
            "--base-commit",
            &head,
        ],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    assert_eq!(out.json_value()["data"]["assessment_status"], "stale");
    assert_fails(
        &json(&root, &["check"]),
        5,
        "change_set.assessment_incomplete",
        Some("change_set.stale_impact"),
    );
    let impact = json(&root, &["impact", "--change-set", "CS-00001"]);
    assert_eq!(impact.json_value()["data"]["assessment_status"], "stale");
    // an empty impact file with a candidate is incomplete → 5
    repo.write("impact.json", b"[]");
    let out = json(
        &root,
        &[
            "change-set",
            "update",
            "--change-set",
            "CS-00001",
            "--impact-file",
            "impact.json",
        ],
    );
    assert_fails(
        &out,
        5,
        "change_set.assessment_incomplete",
        Some("change_set.missing_field"),
    );
}

#[test]
fn approved_change_sets_refuse_writes_and_show_at_reads_history() {
    let repo = with_change_set();
    let root = repo.root();
    assert_eq!(
        req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]).status,
        0
    );
    let commit = repo.commit_all("spec(CS-00001): try");
    // "merge": fast-forward main to the change-set branch
    let g = repo.git();
    g.reference("refs/heads/main", commit, true, "ff").unwrap();
    assert_fails(
        &req_add(&repo, "REQ-CLI-00002", "The CLI shall rest.", &[]),
        5,
        "change_set.not_proposed",
        None,
    );
    let list = json(&root, &["change-set", "list", "--status", "approved"]);
    assert_eq!(
        list.json_value()["data"]["change_sets"][0]["id"],
        "CS-00001"
    );
    let hex = commit.to_string();
    let show = json(
        &root,
        &[
            "change-set",
            "show",
            "--change-set",
            "CS-00001",
            "--at",
            &hex,
        ],
    );
    assert_eq!(show.status, 0, "{}", show.stdout);
    let data = &show.json_value()["data"];
    assert_eq!(data["status"], "approved");
    assert_eq!(data["changed_count"], 1);
    assert_fails(
        &json(
            &root,
            &[
                "change-set",
                "show",
                "--change-set",
                "CS-00001",
                "--at",
                "abc",
            ],
        ),
        4,
        "revision.invalid",
        None,
    );
    assert_fails(
        &json(
            &root,
            &[
                "change-set",
                "show",
                "--change-set",
                "CS-00001",
                "--at",
                &"e".repeat(40),
            ],
        ),
        4,
        "revision.not_found",
        None,
    );
    let first = g.revparse_single("main~1").unwrap().id().to_string();
    assert_fails(
        &json(
            &root,
            &[
                "change-set",
                "show",
                "--change-set",
                "CS-00001",
                "--at",
                &first,
            ],
        ),
        4,
        "change_set.not_found",
        None,
    );
}

#[test]
fn change_set_create_branch_rules() {
    let repo = initialized();
    let root = repo.root();
    let create = || {
        json(
            &root,
            &[
                "change-set",
                "create",
                "--intent",
                "Define the CLI contract",
                "--implementation-required",
                "true",
                "--created",
                "2026-09-15T12:00:00Z",
            ],
        )
    };
    repo.write("docs/vision.md", b"# dirty\n");
    assert_fails(&create(), 5, "change_set.uncommitted_changes", None);
    repo.write("docs/vision.md", b"# Vision\n");
    let g = repo.git();
    let head = g.head().unwrap().peel_to_commit().unwrap();
    g.set_head_detached(head.id()).unwrap();
    assert_fails(&create(), 5, "change_set.unexpected_branch", None);
    g.set_head("refs/heads/main").unwrap();
    g.branch("cs/99999-full", &head, false).unwrap();
    assert_fails(&create(), 5, "change_set.sequence_exhausted", None);
    g.find_branch("cs/99999-full", git2::BranchType::Local)
        .unwrap()
        .delete()
        .unwrap();
    g.branch("cs/00041-other", &head, false).unwrap();
    let out = create();
    assert_eq!(out.status, 0, "{}", out.stdout);
    assert_eq!(
        out.json_value()["data"]["change_set"]["branch"],
        "cs/00042-define-the-cli-contract"
    );
    assert_eq!(repo.head_branch(), "cs/00042-define-the-cli-contract");
}

#[test]
fn initialization_branch_yields_cs_00001_on_that_branch() {
    let repo = Repo::new();
    repo.write("docs/architecture.md", b"# A\n");
    repo.write("docs/vision.md", b"# V\n");
    repo.commit_all("base");
    let g = repo.git();
    let head = g.head().unwrap().peel_to_commit().unwrap();
    g.branch("cs/00001-project-init", &head, false).unwrap();
    g.set_head("refs/heads/cs/00001-project-init").unwrap();
    let root = repo.root();
    let out = json(
        &root,
        &[
            "project",
            "init",
            "--id",
            "x",
            "--name",
            "x",
            "--canonical-remote",
            "https://h/x",
            "--review-mode",
            "multi-player",
        ],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    let out = json(
        &root,
        &[
            "change-set",
            "create",
            "--intent",
            "Init",
            "--implementation-required",
            "false",
            "--implementation-rationale",
            "spec only",
            "--created",
            "2026-09-15T12:00:00Z",
        ],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    let d = &out.json_value()["data"]["change_set"];
    assert_eq!(d["id"], "CS-00001");
    assert_eq!(d["branch"], "cs/00001-project-init");
    assert_eq!(d["base_commit"], head.id().to_string());
    assert_eq!(json(&root, &["check"]).status, 0);
}

#[test]
fn configuration_unreadable_exits_6() {
    let repo = Repo::new();
    repo.write(".protobot", b"not a directory");
    assert_fails(
        &json(&repo.root(), &["check"]),
        6,
        "project.configuration_unreadable",
        None,
    );
}

#[test]
fn artifact_list_and_interface_update() {
    let repo = with_change_set();
    let root = repo.root();
    let out = json(&root, &["artifact", "list", "--kind", "vision"]);
    assert_eq!(out.status, 0, "{}", out.stdout);
    let items = out.json_value()["data"]["artifacts"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["id"], "vision");
    assert!(items[0].get("content").is_none());
    assert_fails(
        &json(&root, &["artifact", "list", "--owner", "kit"]),
        4,
        "artifact.invalid_owner",
        None,
    );
    assert_eq!(iface_add(&repo, "cli-main", "cli").status, 0);
    let upd = |extra: &[&str]| {
        let mut a = vec!["interface", "update", "--change-set", "CS-00001", "--id"];
        a.extend_from_slice(extra);
        json(&root, &a)
    };
    assert_fails(
        &upd(&["nope", "--name", "X"]),
        4,
        "interface.not_found",
        None,
    );
    assert_fails(
        &upd(&["cli-main", "--created", "2026-01-01T00:00:00Z"]),
        4,
        "interface.immutable_field",
        None,
    );
    assert_fails(&upd(&["cli-main"]), 2, "usage.invalid_request", None);
    let out = upd(&["cli-main", "--status", "retired"]);
    assert_eq!(out.status, 0, "{}", out.stdout);
    let data = out.json_value()["data"].clone();
    assert_eq!(data["before"]["status"], "active");
    assert_eq!(data["after"]["status"], "retired");
    assert_eq!(
        data["operation"]["action"], "add",
        "an add in the same set stays add"
    );
}

#[test]
fn symmetric_links_write_the_inverse_and_compare_reports_findings() {
    let repo = with_change_set();
    let root = repo.root();
    assert_eq!(
        req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]).status,
        0
    );
    let out = req_add(
        &repo,
        "REQ-CLI-00002",
        "The CLI shall work.",
        &["--relationship", "conflicts-with=REQ-CLI-00001"],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    let paths: Vec<String> = out.json_value()["mutation"]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        paths,
        [
            ".protobot/requirements/REQ-CLI-00002.yaml",
            ".protobot/requirements/REQ-CLI-00001.yaml",
            ".protobot/change-sets/cs-00001.yaml",
            ".protobot/project.yaml"
        ]
    );
    let inverse =
        String::from_utf8(repo.read(".protobot/requirements/REQ-CLI-00001.yaml")).unwrap();
    assert!(
        inverse.contains("conflicts-with") && inverse.contains("REQ-CLI-00002"),
        "{inverse}"
    );
    assert_eq!(json(&root, &["check"]).status, 0);
    let cmp = json(
        &root,
        &["change-set", "compare", "--change-set", "CS-00001"],
    )
    .json_value();
    let data = &cmp["data"];
    assert_eq!(
        data["declared_conflicts"][0]["requirement_ids"],
        serde_json::json!(["REQ-CLI-00001", "REQ-CLI-00002"])
    );
    assert_eq!(
        data["exact_duplicates"][0]["requirement_ids"],
        serde_json::json!(["REQ-CLI-00001", "REQ-CLI-00002"])
    );
    assert_eq!(data["changed"].as_array().unwrap().len(), 2, "{data}");
    assert_eq!(
        data["changed"][0]["action"], "add",
        "the inverse revise merges into the add"
    );
    // removing the link removes the inverse too
    let out = json(
        &root,
        &[
            "requirement",
            "update",
            "--change-set",
            "CS-00001",
            "--id",
            "REQ-CLI-00002",
            "--text",
            "The CLI shall differ.",
        ],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    assert_eq!(json(&root, &["check"]).status, 0);
}

#[test]
fn compare_reports_dependency_cycles_introduced_by_direct_edits() {
    let repo = with_change_set();
    let root = repo.root();
    assert_eq!(
        req_add(&repo, "REQ-CLI-00001", "The CLI shall a.", &[]).status,
        0
    );
    assert_eq!(
        req_add(
            &repo,
            "REQ-CLI-00002",
            "The CLI shall b.",
            &["--relationship", "depends-on=REQ-CLI-00001"]
        )
        .status,
        0
    );
    // direct edit: close the cycle
    let path = ".protobot/requirements/REQ-CLI-00001.yaml";
    let text = String::from_utf8(repo.read(path)).unwrap();
    let edited = text.replace(
        "status: active\n",
        "relationships:\n  - type: depends-on\n    target: REQ-CLI-00002\nstatus: active\n",
    );
    repo.write(path, edited.as_bytes());
    reseal(&repo);
    assert_fails(
        &json(&root, &["check"]),
        4,
        "validation.failed",
        Some("relationship.cycle"),
    );
    let cmp = json(
        &root,
        &["change-set", "compare", "--change-set", "CS-00001"],
    );
    assert_eq!(cmp.status, 0, "compare only loads structurally");
    assert_eq!(
        cmp.json_value()["data"]["dependency_cycles"],
        serde_json::json!([{"relationship": "depends-on", "cycle": ["REQ-CLI-00001", "REQ-CLI-00002", "REQ-CLI-00001"]}])
    );
}

#[test]
fn approval_counts_only_remotes_whose_url_is_the_canonical_remote() {
    let repo = with_change_set();
    let root = repo.root();
    let commit = repo.commit_all("spec(CS-00001): try");
    let g = repo.git();
    g.remote("fork", "https://example.invalid/someone-else.git")
        .unwrap();
    g.reference("refs/remotes/fork/main", commit, true, "fetched")
        .unwrap();
    let status = |r: &Repo| {
        json(
            &r.root(),
            &["change-set", "show", "--change-set", "CS-00001"],
        )
        .json_value()["data"]["status"]
            .clone()
    };
    assert_eq!(status(&repo), "proposed", "a fork remote never approves");
    // userinfo is stripped before the exact-text comparison
    g.remote("upstream", "https://token@example.invalid/demo.git")
        .unwrap();
    g.reference("refs/remotes/upstream/main", commit, true, "fetched")
        .unwrap();
    assert_eq!(status(&repo), "approved");
    assert_fails(
        &req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]),
        5,
        "change_set.not_proposed",
        None,
    );
    let _ = root;
}

#[test]
fn shallow_clone_without_proof_is_git_read_failed() {
    let repo = with_change_set();
    let root = repo.root();
    let head = repo
        .git()
        .head()
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .id()
        .to_string();
    // Mark the repository shallow: a missing base can no longer be told
    // apart from one cut off by the clone depth.
    repo.write(".git/shallow", format!("{head}\n").as_bytes());
    let out = json(
        &root,
        &[
            "change-set",
            "update",
            "--change-set",
            "CS-00001",
            "--base-commit",
            &"a".repeat(40),
        ],
    );
    assert_fails(&out, 6, "git.read_failed", None);
    assert_eq!(out.json_value()["error"]["retry"], "reconcile-before-retry");
}

#[test]
fn library_reads_worktree_and_commits_without_checkout() {
    use protobot_spec::store;
    let repo = with_change_set();
    assert_eq!(
        req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]).status,
        0
    );
    let snap = store::open_worktree(&repo.root().join("docs")).unwrap();
    assert_eq!(snap.requirements.len(), 1);
    let before = repo
        .git()
        .head()
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .id()
        .to_string();
    let at = store::open_commit(&repo.root(), &before).unwrap();
    assert_eq!(
        at.requirements.len(),
        0,
        "the commit predates the requirement"
    );
    assert_eq!(at.change_sets.len(), 0);
    assert_eq!(
        store::open_commit(&repo.root(), "abc").unwrap_err().code,
        "revision.invalid"
    );
    assert_eq!(
        store::open_commit(&repo.root(), &"f".repeat(40))
            .unwrap_err()
            .code,
        "revision.not_found"
    );
    repo.write("docs/vision.md", b"# tampered\n");
    let err = store::open_worktree(&repo.root()).unwrap_err();
    assert_eq!(err.code, "validation.failed");
}

#[test]
fn immutable_requirement_fields() {
    let repo = with_change_set();
    assert_eq!(
        req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]).status,
        0
    );
    let out = json(
        &repo.root(),
        &[
            "requirement",
            "update",
            "--change-set",
            "CS-00001",
            "--id",
            "REQ-CLI-00001",
            "--created",
            "2020-01-01T00:00:00Z",
        ],
    );
    assert_fails(&out, 4, "requirement.immutable_field", None);
}

#[test]
fn unreadable_store_entry_is_storage_read_failed() {
    use std::os::unix::ffi::OsStrExt;
    let repo = with_change_set();
    let name = std::ffi::OsStr::from_bytes(b"\xff.yaml");
    std::fs::create_dir_all(repo.root().join(".protobot/requirements")).unwrap();
    std::fs::write(repo.root().join(".protobot/requirements").join(name), b"x").unwrap();
    assert_fails(
        &json(&repo.root(), &["check"]),
        6,
        "storage.read_failed",
        None,
    );
}

#[test]
fn failed_branch_cut_is_git_write_failed_and_changes_nothing() {
    let repo = initialized();
    // A stale ref lock makes libgit2 refuse to create the branch.
    repo.write(".git/refs/heads/cs/00001-define-the-cli-contract.lock", b"");
    let before = repo.snapshot();
    let out = json(
        &repo.root(),
        &[
            "change-set",
            "create",
            "--intent",
            "Define the CLI contract",
            "--implementation-required",
            "true",
            "--created",
            "2026-09-15T12:00:00Z",
        ],
    );
    assert_fails(&out, 6, "git.write_failed", None);
    assert_eq!(out.json_value()["error"]["mutation"], "none");
    assert_eq!(repo.head_branch(), "main");
    assert_eq!(repo.branches(), ["main"]);
    assert_eq!(repo.snapshot(), before);
}

#[test]
fn unreadable_commit_tree_is_revision_read_failed() {
    let repo = with_change_set();
    let commit = repo.commit_all("spec(CS-00001): try");
    let tree = repo
        .git()
        .find_commit(commit)
        .unwrap()
        .tree_id()
        .to_string();
    // Remove the loose tree object: the commit resolves, its tree does not.
    std::fs::remove_file(
        repo.root()
            .join(format!(".git/objects/{}/{}", &tree[..2], &tree[2..])),
    )
    .unwrap();
    let out = json(
        &repo.root(),
        &[
            "change-set",
            "show",
            "--change-set",
            "CS-00001",
            "--at",
            &commit.to_string(),
        ],
    );
    assert_fails(&out, 6, "revision.read_failed", None);
}

#[test]
fn reads_at_a_commit_ignore_the_working_tree() {
    let repo = with_change_set();
    let root = repo.root();
    let before = repo
        .git()
        .head()
        .unwrap()
        .peel_to_commit()
        .unwrap()
        .id()
        .to_string();
    assert_eq!(
        req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]).status,
        0
    );
    let out = put(
        &repo,
        "vision",
        "vision",
        "docs/vision.md",
        "user",
        &[],
        "# New\n",
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    let at = |args: &[&str]| {
        let mut a = args.to_vec();
        a.extend_from_slice(&["--at", &before]);
        json(&root, &a)
    };
    assert_eq!(
        at(&["requirement", "list"]).json_value()["data"]["requirements"],
        serde_json::json!([])
    );
    assert_fails(
        &at(&["requirement", "show", "--id", "REQ-CLI-00001"]),
        4,
        "requirement.not_found",
        None,
    );
    assert_eq!(
        at(&["artifact", "get", "--id", "vision"]).json_value()["data"]["content"],
        "# Vision\n"
    );
    assert_eq!(
        json(&root, &["artifact", "get", "--id", "vision"]).json_value()["data"]["content"],
        "# New\n"
    );
    assert_eq!(at(&["interface", "list"]).status, 0);
    assert_fails(
        &json(&root, &["requirement", "list", "--at", "HEAD"]),
        4,
        "revision.invalid",
        None,
    );
}

/// Issue 32: a refused write carries every diagnostic in one pass, with the
/// field paths of the relationship entry. Each case: the extra arguments of a
/// `requirement add`, whether the store was edited directly first, and the
/// (code, field) pairs the refusal must hold.
#[test]
fn a_refused_write_reports_every_diagnostic_with_the_entrys_field_path() {
    type Case = (
        &'static str,
        &'static [&'static str],
        bool,
        &'static [(&'static str, &'static str)],
    );
    let cases: &[Case] = &[
        (
            "a target that is not a requirement id is not in the store either",
            &["--relationship", "depends-on=nope"],
            false,
            &[
                ("relationship.invalid_target", "relationships[0]"),
                ("reference.not_found", "relationships[0].target"),
            ],
        ),
        (
            "a well-formed target that does not exist",
            &["--relationship", "depends-on=REQ-CLI-00042"],
            false,
            &[("reference.not_found", "relationships[0].target")],
        ),
        (
            "a direct edit of the store together with another error",
            &["--type", "bogus"],
            true,
            &[
                (
                    "project.store_digest_mismatch",
                    "store_digests.requirements",
                ),
                ("requirement.invalid_type", "type"),
            ],
        ),
        (
            "a direct edit together with a bad relationship target",
            &["--relationship", "related-to=nope"],
            true,
            &[
                (
                    "project.store_digest_mismatch",
                    "store_digests.requirements",
                ),
                ("relationship.invalid_target", "relationships[0]"),
                ("reference.not_found", "relationships[0].target"),
            ],
        ),
    ];
    for (name, extra, direct_edit, expected) in cases {
        let repo = with_change_set();
        assert_eq!(
            req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]).status,
            0,
            "{name}: setup"
        );
        let path = ".protobot/requirements/REQ-CLI-00001.yaml";
        if *direct_edit {
            let rec = repo.read(path);
            repo.write(path, &[rec, b"# edited by hand\n".to_vec()].concat());
        }
        let before = repo.snapshot();
        let out = req_add(&repo, "REQ-CLI-00002", "The CLI shall log.", extra);
        assert_ne!(out.status, 0, "{name}: {}", out.stdout);
        let diags = out.json_value()["error"]["diagnostics"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let got: Vec<(String, String)> = diags
            .iter()
            .map(|d| {
                (
                    d["code"].as_str().unwrap_or_default().to_owned(),
                    d["field"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        for (code, field) in *expected {
            assert!(
                got.iter().any(|(c, f)| c == code && f == field),
                "{name}: missing ({code}, {field}) in {got:?}"
            );
        }
        assert_eq!(
            repo.snapshot(),
            before,
            "{name}: a refused write changes nothing"
        );
    }
}
