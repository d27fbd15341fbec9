//! Replays the `approved_merge` results of the upstream Source Control Manager golden fixture
//! (`fixtures/source-control-manager-golden.jsonl`, upstream
//! `docs/architecture/fixtures/source-control-manager-golden.jsonl` @ca6f584a, sha256
//! e029d586…0b) against a real repository with the fixture's commit graph.
//!
//! The fixture's host, Gate and MCP checks are not this crate's; what applies here is the
//! commit graph (merge commits with the recorded parents) and the `approved_merge` answer
//! (`change_set_id`, `merge_commit`, `default_head`) at each recorded state.

use std::collections::BTreeMap;

use git2::Oid;
use protobot_repo::land::{CHANGE_SET_STORE, approved_merge};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::util::{FILE, commit_files, merge_onto};

const GOLDEN: &str = include_str!("fixtures/source-control-manager-golden.jsonl");

fn text(s: &str) -> Option<Vec<u8>> {
    Some(s.as_bytes().to_vec())
}

/// Builds the fixture's graph; returns the repository and the `<sha:NAME>` bindings.
fn fixture_graph() -> (tempfile::TempDir, git2::Repository, BTreeMap<String, Oid>) {
    let dir = tempfile::TempDir::new().unwrap();
    let repo = git2::Repository::init(dir.path()).unwrap();
    let mut sha = BTreeMap::new();
    let main = "refs/heads/main";
    let cs1 = "refs/heads/cs/00001-project-init";
    let cs2 = "refs/heads/cs/00002-add-the-initial-sketch";
    let m0 = commit_files(
        &repo,
        main,
        &[
            ("README.md", text("# Fixture\n"), FILE),
            ("docs/architecture.md", text(""), FILE),
            ("docs/vision.md", text(""), FILE),
        ],
        "initial",
        1,
    );
    repo.reference(cs1, m0, false, "branch_init").unwrap();
    let c1 = commit_files(
        &repo,
        cs1,
        &[
            (
                ".protobot/change-sets/cs-00001.yaml",
                text("id: CS-00001\n"),
                FILE,
            ),
            (".protobot/project.yaml", text("id: fixture\n"), FILE),
            (".protobot/projection.yaml", text("version: 1\n"), FILE),
        ],
        "spec(CS-00001): Initialize the fixture project\n\nChange-Set: CS-00001\n",
        2,
    );
    let m1 = merge_onto(&repo, main, c1, "Merge pull request #1", 3);
    repo.reference("refs/replay/after-2", m1, false, "snapshot")
        .unwrap();
    repo.reference(cs2, m1, false, "change-set create").unwrap();
    let c2 = commit_files(
        &repo,
        cs2,
        &[
            (
                ".protobot/change-sets/cs-00002.yaml",
                text("id: CS-00002\n"),
                FILE,
            ),
            ("docs/vision.md", text("# Fixture Vision\n"), FILE),
            (
                "docs/architecture.md",
                text("# Fixture Architecture\n"),
                FILE,
            ),
        ],
        "spec(CS-00002): Add the initial Sketch\n\nChange-Set: CS-00002\n",
        4,
    );
    let m2 = commit_files(
        &repo,
        main,
        &[("NOTES.md", text("unrelated\n"), FILE)],
        "unrelated",
        5,
    );
    let r1 = merge_onto(
        &repo,
        cs2,
        m2,
        "Merge origin/main into cs/00002-add-the-initial-sketch\n\nChange-Set: CS-00002",
        6,
    );
    let c3 = commit_files(
        &repo,
        cs2,
        &[(
            ".protobot/change-sets/cs-00002.yaml",
            text("id: CS-00002\nbase_commit: m2\n"),
            FILE,
        )],
        "spec(CS-00002): Add the initial Sketch\n\nChange-Set: CS-00002\n",
        7,
    );
    let m3 = merge_onto(&repo, main, c3, "Merge pull request #2", 8);
    repo.reference("refs/replay/after-8", m3, false, "snapshot")
        .unwrap();
    for (name, id) in [
        ("m0", m0),
        ("c1", c1),
        ("m1", m1),
        ("c2", c2),
        ("m2", m2),
        ("r1", r1),
        ("c3", c3),
        ("m3", m3),
    ] {
        sha.insert(name.to_owned(), id);
    }
    (dir, repo, sha)
}

fn bind(value: &Value, sha: &BTreeMap<String, Oid>) -> Value {
    match value {
        Value::String(s) => match s.strip_prefix("<sha:").and_then(|r| r.strip_suffix('>')) {
            Some(name) => Value::String(sha[name].to_string()),
            None => value.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(|v| bind(v, sha)).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), bind(v, sha))).collect())
        }
        other => other.clone(),
    }
}

fn lines() -> Vec<Value> {
    GOLDEN
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn fixture_copy_is_byte_identical_to_upstream() {
    assert_eq!(
        hex::encode(Sha256::digest(GOLDEN.as_bytes())),
        "e029d586a7a112bf952a869a6534933a5a66e48716fa80403ab2a97fdde77f0b"
    );
    assert_eq!(lines().len(), 149);
}

#[test]
fn commit_graph_matches_the_recorded_merge_parents() {
    let (_dir, repo, sha) = fixture_graph();
    let mut checked = 0;
    for line in lines() {
        let parents = line
            .pointer("/after/parents")
            .or_else(|| line.pointer("/assert/parents"));
        let Some(Value::Object(parents)) = parents else {
            continue;
        };
        for (commit, expected) in parents {
            let commit = bind(&Value::String(commit.clone()), &sha);
            let id = Oid::from_str(commit.as_str().unwrap()).unwrap();
            let actual: Vec<Value> = repo
                .find_commit(id)
                .unwrap()
                .parent_ids()
                .map(|p| Value::String(p.to_string()))
                .collect();
            assert_eq!(
                Value::Array(actual),
                bind(expected, &sha),
                "step {}",
                line["step"]
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 3, "2-host-merge, 7-assert and 8-host-merge");
}

#[test]
fn approved_merge_answers_match_every_successful_golden_read() {
    let (_dir, repo, sha) = fixture_graph();
    let mut replayed = Vec::new();
    for line in lines() {
        let Some(result) = line.pointer("/scm_read/result") else {
            continue;
        };
        if result["ok"] != Value::Bool(true) {
            continue; // HOST_UNAVAILABLE needs the host; not this crate's.
        }
        let step = line["step"].as_str().unwrap().to_owned();
        let state = if step.starts_with("2-") {
            "refs/replay/after-2"
        } else {
            "refs/replay/after-8"
        };
        let id = result
            .pointer("/object/change_set_id")
            .and_then(Value::as_str)
            .unwrap();
        let ours = approved_merge(&repo, state, id, CHANGE_SET_STORE).unwrap();
        assert_eq!(
            serde_json::to_value(&ours).unwrap(),
            bind(&result["data"], &sha),
            "step {step}"
        );
        replayed.push(step);
    }
    assert_eq!(
        replayed,
        ["2-register", "8-register", "n34-7-second-merge-commit"]
    );
}

#[test]
fn approved_merge_refuses_direct_commits_unknown_and_malformed_change_sets() {
    let (_dir, repo, _sha) = fixture_graph();
    commit_files(
        &repo,
        "refs/heads/main",
        &[(
            ".protobot/change-sets/cs-00003.yaml",
            text("id: CS-00003\n"),
            FILE,
        )],
        "direct push",
        9,
    );
    let code = |id: &str| {
        approved_merge(&repo, "refs/heads/main", id, CHANGE_SET_STORE)
            .unwrap_err()
            .code()
    };
    assert_eq!(code("CS-00003"), "NOT_A_MERGE_COMMIT");
    assert_eq!(code("CS-00009"), "NOT_APPROVED");
    assert_eq!(code("CS-1"), "INVALID_REQUEST");
    let missing =
        approved_merge(&repo, "refs/heads/nope", "CS-00001", CHANGE_SET_STORE).unwrap_err();
    assert_eq!(missing.code(), "NOT_APPROVED");
    // A later direct commit does not change the answer for an earlier merge.
    let still = approved_merge(&repo, "refs/heads/main", "CS-00002", CHANGE_SET_STORE).unwrap();
    assert_eq!(still.merge_commit, _sha["m3"].to_string());
}
