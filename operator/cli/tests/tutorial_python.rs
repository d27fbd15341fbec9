//! `docs/tutorial-python.md`, followed literally (the fenced `sh` blocks, in
//! order, in one bash session; `support/guide.rs`): a Python package whose
//! tests run with a venv'd pytest, two change sets (the second revising the
//! first one's requirement), a planted Worker B bug that triage sends back, a
//! block that names the failing test and the trace, and `protobot retry`.
//!
//! Test index:
//! - `the_tutorial_has_the_blocks_this_test_follows`: the blocks are there;
//! - `the_python_tutorial_runs_as_written`: the whole tutorial, checking what
//!   the text promises at each step.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/guide.rs"]
mod guide;

use guide::{Session, merges_on_main, sh_blocks, skip_without_bwrap};

const TUTORIAL: &str = include_str!("../../../docs/tutorial-python.md");

/// The blocks up to (not including) the first that contains `marker`, that
/// block, and the rest.
fn split_at(blocks: &[String], marker: &str) -> (String, String, Vec<String>) {
    let at = blocks
        .iter()
        .position(|b| b.contains(marker))
        .unwrap_or_else(|| panic!("the tutorial runs {marker}"));
    (
        blocks[..at].concat(),
        blocks[at].clone(),
        blocks[at + 1..].to_vec(),
    )
}

#[test]
fn the_tutorial_has_the_blocks_this_test_follows() {
    let all = sh_blocks(TUTORIAL).concat();
    for command in [
        "/usr/bin/python3 -m venv",
        "pip install -q pytest",
        "--change-set CS-00001 --harness",
        "requirement update --change-set CS-00002",
        "protobot retry --repo . --change-set CS-00002",
    ] {
        assert!(all.contains(command), "the tutorial runs {command}");
    }
}

fn python_venv_available() -> bool {
    std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import venv, ensurepip"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn the_python_tutorial_runs_as_written() {
    if skip_without_bwrap() {
        return;
    }
    if !python_venv_available() {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_PYTHON").is_none(),
            "PROTOBOT_REQUIRE_PYTHON is set but python3 has no venv/ensurepip"
        );
        eprintln!("skipping: python3 -m venv is not usable here (apt-get install python3-venv)");
        return;
    }
    let s = Session::new("tally");
    let blocks = sh_blocks(TUTORIAL);
    let (setup, first_run, rest) = split_at(&blocks, "--change-set CS-00001 --harness");
    let printed = s.ok(&s.work(), &setup);
    assert!(
        printed.contains("requires "),
        "the sandbox file was shown: {printed}"
    );
    // The first change set: cycle 1 fails on the planted bug, cycle 2 passes.
    let built = s.bash(&s.work(), &format!("cd tally\n{first_run}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&built.stdout).into_owned(),
        String::from_utf8_lossy(&built.stderr).into_owned(),
    );
    assert!(built.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("is completed"), "{stdout}");
    assert!(
        stdout.lines().any(|l| l.trim() == "9"),
        "the merged tally adds: {stdout}"
    );
    assert!(
        stderr.contains(
            "failing tests: tests/test_tally.py::test_req_cli_00001_prints_the_sum (fail)"
        ),
        "cycle 1 names the failing test: {stderr}"
    );
    assert!(stderr.contains("cycle 2"), "{stderr}");
    let origin = s.work().join("tally-origin.git");
    assert_eq!(merges_on_main(&origin), 1);
    // The second change set: authored, then built until it blocks.
    let (author, blocked_run, after) = split_at(&rest, "--change-set CS-00002 --harness");
    s.ok(&s.repo(), &author);
    let blocked = s.ok(&s.repo(), &blocked_run);
    for promise in [
        "is blocked",
        "no passing candidate after 3 cycles",
        "failing tests: tests/test_tally.py::test_req_cli_00001_prints_the_sum (fail)",
        "integration output ends:",
        "trace: ",
        ".jsonl",
        "protobot retry --repo . --change-set CS-00002",
    ] {
        assert!(
            blocked.contains(promise),
            "the block says {promise}: {blocked}"
        );
    }
    assert!(!blocked.contains("withheld-path"), "{blocked}");
    assert_eq!(merges_on_main(&origin), 1, "a blocked item is not merged");
    // The fix and the retry.
    let fixed = s.ok(&s.repo(), &after.concat());
    assert!(fixed.contains("is completed"), "{fixed}");
    assert!(
        fixed.lines().any(|l| l.trim() == "total: 9"),
        "the revised requirement is built: {fixed}"
    );
    assert_eq!(merges_on_main(&origin), 2);
    let catalog = s.ok(&s.repo(), "cat .protobot/test-catalog.jsonl");
    assert_eq!(catalog.trim(), "", "nobody wrote a catalog line");
    let test = s.ok(&s.repo(), "cat tests/test_tally.py");
    assert!(
        test.contains("total: 5"),
        "Worker A rewrote its own test: {test}"
    );
}
