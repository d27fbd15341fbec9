//! The `protobot crd` commands as a user runs them: the real binary, its stdout, stderr and
//! exit status (0 on success; 1 with a one-line `protobot: failed to …` message on failure).

// Helpers outside `#[test]` functions are test code too; a panic there is a failed assertion.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn protobot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn crd_print_writes_every_crd_to_stdout() {
    let output = protobot(&["crd", "print"]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let kinds: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("    kind: "))
        .collect();
    assert_eq!(
        kinds,
        ["Project", "ChangeSet", "BuildWorkItem", "InspectionRun"]
    );
    assert_eq!(stdout.matches("kind: CustomResourceDefinition").count(), 4);
    assert!(output.stderr.is_empty());
}

#[test]
fn crd_write_prints_the_written_paths() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("crds");
    let output = protobot(&["crd", "write", target.to_str().unwrap()]);
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let printed: Vec<&str> = stdout.lines().collect();
    assert_eq!(printed.len(), 4);
    for path in printed {
        assert!(path.starts_with(target.to_str().unwrap()), "{path}");
        assert!(std::path::Path::new(path).is_file(), "{path}");
    }
}

#[test]
fn crd_write_failure_exits_1_with_one_line_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, "x").unwrap();
    let output = protobot(&["crd", "write", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("protobot: failed to write the CRDs into "),
        "{stderr}"
    );
    assert!(stderr.contains(file.to_str().unwrap()), "{stderr}");
}
