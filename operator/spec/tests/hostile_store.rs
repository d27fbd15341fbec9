//! Issue #16, the spec store under attack: concurrent writers, hand edits re-sealed by an
//! unrelated write, hostile YAML and arguments. Each class runs through the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use support::{assert_fails, json, req_add, run, with_change_set};

/// Two `requirement add` at once, 60 rounds: the store is valid after every round, and each
/// add that reported success is there while each that failed is not.
#[test]
fn concurrent_requirement_adds_leave_a_valid_store_every_round() {
    let rounds: usize = std::env::var("PROTOBOT_CONCURRENT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut both = 0;
    for round in 0..rounds {
        let repo = with_change_set();
        let ids = ["REQ-CLI-00001", "REQ-CLI-00002"];
        let outs: Vec<support::Out> = std::thread::scope(|s| {
            let handles: Vec<_> = ids
                .iter()
                .map(|id| {
                    let repo = &repo;
                    s.spawn(move || req_add(repo, id, "The CLI shall work.", &[]))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let check = json(&repo.root(), &["check"]);
        assert_eq!(
            check.status,
            0,
            "round {round}: the store is corrupt after two concurrent adds: {}\nadds: {:?}",
            check.stdout,
            outs.iter()
                .map(|o| (o.status, o.code()))
                .collect::<Vec<_>>()
        );
        let mut applied = 0;
        for (id, out) in ids.iter().zip(&outs) {
            let show = json(&repo.root(), &["requirement", "show", "--id", id]);
            if out.status == 0 {
                applied += 1;
                assert_eq!(
                    show.status, 0,
                    "round {round}: {id} reported added but is gone"
                );
            } else {
                assert_eq!(
                    out.code(),
                    "change_set.concurrent_update",
                    "round {round}: {}",
                    out.stdout
                );
                assert_ne!(
                    show.status, 0,
                    "round {round}: {id} reported failed but is there"
                );
            }
        }
        assert!(applied >= 1, "round {round}: neither add applied");
        if applied == 2 {
            both += 1;
        }
    }
    eprintln!("{both} of {rounds} rounds applied both adds, the rest exactly one");
}

/// A direct edit of a record is not re-sealed by the next unrelated write.
#[test]
fn an_unrelated_write_refuses_to_reseal_a_hand_edited_store() {
    let repo = with_change_set();
    let root = repo.root();
    assert_eq!(
        req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]).status,
        0
    );
    let path = ".protobot/requirements/REQ-CLI-00001.yaml";
    let rec = repo.read(path);
    let edited = String::from_utf8(rec.clone())
        .unwrap()
        .replace("The CLI shall work.", "The CLI shall obey the author.");
    assert_ne!(edited.as_bytes(), rec.as_slice());
    repo.write(path, edited.as_bytes());
    let project_before = repo.read(".protobot/project.yaml");
    let out = req_add(&repo, "REQ-CLI-00002", "The CLI shall also work.", &[]);
    assert_fails(
        &out,
        4,
        "validation.failed",
        Some("project.store_digest_mismatch"),
    );
    assert_eq!(
        repo.read(".protobot/project.yaml"),
        project_before,
        "nothing was written"
    );
    assert_fails(
        &json(&root, &["check"]),
        4,
        "validation.failed",
        Some("project.store_digest_mismatch"),
    );
    // Undoing the edit unblocks writes.
    repo.write(path, &rec);
    assert_eq!(
        req_add(&repo, "REQ-CLI-00002", "The CLI shall also work.", &[]).status,
        0
    );
}

/// A write that finds the lock held waits for it, then proceeds (bounded wait).
#[test]
fn a_write_waits_for_a_held_lock() {
    let repo = with_change_set();
    let lock =
        protobot_spec::fsio::StoreLock::acquire(&repo.root(), Duration::from_secs(1)).unwrap();
    let started = Instant::now();
    let out = std::thread::scope(|s| {
        let h = s.spawn(|| req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]));
        // Hold the lock a while (a condition that never comes, waited on with a timeout).
        let (_never, pause) = std::sync::mpsc::channel::<()>();
        let _ = pause.recv_timeout(Duration::from_millis(500));
        drop(lock);
        h.join().unwrap()
    });
    assert_eq!(out.status, 0, "{}", out.stdout);
    assert!(started.elapsed() >= Duration::from_millis(400));
}

/// Deeply nested YAML in a record: a clean envelope in bounded time, no stack overflow.
#[test]
fn deeply_nested_yaml_gets_an_envelope_in_bounded_time() {
    let repo = with_change_set();
    let root = repo.root();
    for (name, text) in [
        ("block", {
            let mut t = String::new();
            for i in 0..10_000 {
                t.push_str(&" ".repeat(i));
                t.push_str("a:\n");
            }
            t
        }),
        (
            "flow sequence",
            format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)),
        ),
        (
            "flow mapping",
            format!("{}{}", "{a: ".repeat(10_000), "}".repeat(10_000)),
        ),
        (
            "deep flow 200k",
            format!("{}{}", "[".repeat(200_000), "]".repeat(200_000)),
        ),
    ] {
        repo.write(".protobot/requirements/REQ-CLI-00009.yaml", text.as_bytes());
        let started = Instant::now();
        let out = json(&root, &["check"]);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{name}: took {:?}",
            started.elapsed()
        );
        assert_eq!(
            out.status, 4,
            "{name}: status {} {}",
            out.status, out.stderr
        );
        assert_eq!(out.json_value()["ok"], false, "{name}");
    }
}

/// Non-UTF-8 arguments get the usage envelope, not a panic.
#[test]
fn non_utf8_arguments_get_an_envelope() {
    use std::os::unix::ffi::OsStrExt;
    let repo = with_change_set();
    let bad = std::ffi::OsStr::from_bytes(b"REQ-\xff\xfe");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ears-manager"))
        .args([
            std::ffi::OsStr::new("--output"),
            "json".as_ref(),
            "requirement".as_ref(),
            "show".as_ref(),
            "--id".as_ref(),
            bad,
        ])
        .current_dir(repo.root())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["ok"], false);
    let _ = run;
}

fn edit_project(repo: &support::Repo, from: &str, to: &str) {
    let text = String::from_utf8(repo.read(".protobot/project.yaml")).unwrap();
    assert!(text.contains(from), "{from} not in project.yaml:\n{text}");
    repo.write(
        ".protobot/project.yaml",
        text.replacen(from, to, 1).as_bytes(),
    );
}

/// `check` with an invalid `default_branch` names the field, alongside the other findings.
#[test]
fn an_invalid_default_branch_is_a_diagnostic_alongside_the_others() {
    for bad in [
        "bad..name",
        "has space",
        "end.lock",
        "main~1",
        "a//b",
        "@",
        ".hidden",
    ] {
        let repo = with_change_set();
        assert_eq!(
            req_add(&repo, "REQ-CLI-00001", "The CLI shall work.", &[]).status,
            0
        );
        // A second, unrelated finding: a record edited by hand.
        let path = ".protobot/requirements/REQ-CLI-00001.yaml";
        let rec = String::from_utf8(repo.read(path)).unwrap();
        repo.write(
            path,
            rec.replace("status: active", "status: bogus").as_bytes(),
        );
        support::reseal(&repo);
        edit_project(
            &repo,
            "default_branch: main",
            &format!("default_branch: \"{bad}\""),
        );
        let out = json(&repo.root(), &["check"]);
        assert_ne!(out.status, 0, "{bad}: {}", out.stdout);
        let v = out.json_value();
        let diags = v["error"]["diagnostics"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            diags
                .iter()
                .any(|d| d["field"] == "repository.default_branch"),
            "{bad}: no diagnostic names the field: {}",
            out.stdout
        );
        assert!(
            diags
                .iter()
                .any(|d| d["code"] == "requirement.invalid_status"),
            "{bad}: the other findings are missing: {}",
            out.stdout
        );
    }
}

/// Relationship targets that do not exist are `reference.not_found`, also when the entry is
/// reported for something else.
#[test]
fn missing_relationship_targets_are_reference_not_found() {
    let repo = with_change_set();
    let out = req_add(
        &repo,
        "REQ-CLI-00001",
        "The CLI shall work.",
        &[
            "--relationship",
            "related-to=REQ-CLI-00009",
            "--relationship",
            "related-to=REQ-CLI-00009",
        ],
    );
    assert_fails(&out, 4, "validation.failed", Some("relationship.duplicate"));
    assert!(
        out.diag_codes().iter().any(|c| c == "reference.not_found"),
        "{}",
        out.stdout
    );
    // Through `requirement update` as well as `add`.
    assert_eq!(
        req_add(&repo, "REQ-CLI-00002", "The CLI shall work.", &[]).status,
        0
    );
    for kind in ["depends-on", "conflicts-with", "related-to", "supersedes"] {
        let out = json(
            &repo.root(),
            &[
                "requirement",
                "update",
                "--change-set",
                "CS-00001",
                "--id",
                "REQ-CLI-00002",
                "--relationship",
                &format!("{kind}=REQ-CLI-00009"),
            ],
        );
        assert_ne!(out.status, 0, "update {kind}");
        assert!(
            out.diag_codes().iter().any(|c| c == "reference.not_found"),
            "update {kind}: {}",
            out.stdout
        );
    }
    for kind in ["depends-on", "conflicts-with", "related-to", "supersedes"] {
        let out = req_add(
            &repo,
            "REQ-CLI-00001",
            "The CLI shall work.",
            &["--relationship", &format!("{kind}=REQ-CLI-00009")],
        );
        assert_ne!(out.status, 0, "{kind}");
        assert!(
            out.diag_codes().iter().any(|c| c == "reference.not_found"),
            "{kind}: {}",
            out.stdout
        );
    }
}

/// `change-set compare --against` is deferred upstream: always `change_set.invalid_base`.
#[test]
fn compare_against_is_invalid_base() {
    let repo = with_change_set();
    let head = String::from_utf8(
        std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(repo.root())
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    for against in [head.trim(), "0123", "not-a-commit"] {
        assert_fails(
            &json(
                &repo.root(),
                &[
                    "change-set",
                    "compare",
                    "--change-set",
                    "CS-00001",
                    "--against",
                    against,
                ],
            ),
            4,
            "change_set.invalid_base",
            None,
        );
    }
}
