//! The bundled `cli-sync` example (derived from the evaluation corpus): three
//! EARS requirements for a small file-sync CLI, authored with ears-manager into
//! a local canonical repository with a bare `origin`, its change set approved
//! the way a person approves one (a merge commit on `main`), and the scripted
//! Worker/integration harnesses that build it. Used by `protobot demo`, the
//! operator's end-to-end scenarios and the benchmarks.

use std::path::{Path, PathBuf};

use crate::authoring::{AuthoringError, ears, git};

/// Worker A's scripted harness (tests).
pub const WORKER_A: &str = include_str!("../../../examples/cli-sync/workers/worker-a.sh");
/// Worker B's scripted harness (implementation; its first attempt is wrong).
pub const WORKER_B: &str = include_str!("../../../examples/cli-sync/workers/worker-b.sh");
/// The integration runner's scripted harness.
pub const INTEGRATION: &str = include_str!("../../../examples/cli-sync/workers/integration.sh");
/// The scripted Inspector's harness.
pub const INSPECTOR: &str = include_str!("../../../examples/cli-sync/workers/inspector.sh");
/// The example's project id (also the evaluation-corpus fixture it is derived from).
pub const PROJECT: &str = "cli-sync";
/// Its approved requirements: (id, EARS type, text), as the fixture states them.
pub const REQUIREMENTS: [(&str, &str, &str); 3] = [
    (
        "REQ-CLI-00001",
        "event-driven",
        "When an operator invokes sync --dry-run with a valid source directory and a destination inside the project, the command-line tool shall report the files that would change and shall not modify the project.",
    ),
    (
        "REQ-CLI-00002",
        "event-driven",
        "When an operator invokes sync without --dry-run with a valid source directory and a destination inside the project, the command-line tool shall copy the planned files into the destination.",
    ),
    (
        "REQ-CLI-00003",
        "unwanted-behavior",
        "If the destination is missing or is not a directory, then the command-line tool shall refuse the run and shall not modify the project.",
    ),
];
/// The fixture's worker-visible checks made executable (id, `sh` script run in the merged
/// product's root; exit 0 = passed, the last line is the evidence). Evaluator-side only:
/// never part of a Worker's projection.
pub const VISIBLE_CHECKS: [(&str, &str); 1] = [(
    "VIS-CLI-00001",
    include_str!("../../../examples/cli-sync/checks/VIS-CLI-00001.sh"),
)];

/// Why the example could not be authored.
#[derive(Debug, thiserror::Error)]
pub enum ExampleError {
    /// A git or ears-manager step failed.
    #[error(transparent)]
    Authoring(#[from] AuthoringError),
    /// A file could not be written.
    #[error("failed to prepare {path}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

fn write(root: &Path, rel: &str, content: &str) -> Result<(), ExampleError> {
    let path = root.join(rel);
    let io = |source| ExampleError::Io {
        path: path.clone(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(&path, content).map_err(io)
}

/// Authors the example project and approves CS-00001; returns the merge commit.
pub fn author(work: &Path, origin: &Path) -> Result<String, ExampleError> {
    std::fs::create_dir_all(work).map_err(|source| ExampleError::Io {
        path: work.to_path_buf(),
        source,
    })?;
    git(
        work.parent().unwrap_or(work),
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            &origin.display().to_string(),
        ],
    )?;
    git(work, &["init", "-q", "-b", "main"])?;
    write(
        work,
        "README.md",
        "# cli-sync\n\nA local project-sync command-line tool.\n",
    )?;
    write(
        work,
        "docs/vision.md",
        "# Vision\n\nGive an operator a local tool that copies project files into a destination, with a preview that does not write.\n",
    )?;
    write(
        work,
        "docs/architecture.md",
        "# Architecture\n\nOne POSIX sh script, `src/sync.sh`, invoked as `sync [--dry-run] SRC DST`.\n",
    )?;
    git(work, &["add", "-A"])?;
    git(
        work,
        &["commit", "-q", "-m", "cli-sync: vision and architecture"],
    )?;
    ears(
        work,
        &[
            "project",
            "init",
            "--id",
            PROJECT,
            "--name",
            "Project-sync CLI",
            "--canonical-remote",
            "https://example.invalid/cli-sync.git",
            "--review-mode",
            "single-player",
        ],
    )?;
    // Reviewed projection policy: what each role may see and write.
    let projection = work.join(".protobot/projection.yaml");
    let mut manifest = std::fs::read_to_string(&projection).map_err(|source| ExampleError::Io {
        path: projection.clone(),
        source,
    })?;
    manifest.push_str("  - path: src/\n    class: implementation\n  - path: tests/\n    class: test\n  - path: .protobot/test-catalog.jsonl\n    class: shared\n");
    std::fs::write(&projection, manifest).map_err(|source| ExampleError::Io {
        path: projection.clone(),
        source,
    })?;
    write(
        work,
        ".protobot/test-catalog.jsonl",
        concat!(
            "{\"test_id\":\"test_dry_run\",\"paths\":[\"tests/test_dry_run.sh\"],\"verifies\":[\"REQ-CLI-00001\"]}\n",
            "{\"test_id\":\"test_apply\",\"paths\":[\"tests/test_apply.sh\"],\"verifies\":[\"REQ-CLI-00002\"]}\n",
            "{\"test_id\":\"test_refuse\",\"paths\":[\"tests/test_refuse.sh\"],\"verifies\":[\"REQ-CLI-00003\"]}\n",
        ),
    )?;
    git(work, &["add", "-A"])?;
    git(
        work,
        &[
            "commit",
            "-q",
            "-m",
            "cli-sync: project init and projection policy",
        ],
    )?;
    git(
        work,
        &["remote", "add", "origin", &origin.display().to_string()],
    )?;
    git(work, &["push", "-q", "origin", "main"])?;
    ears(
        work,
        &[
            "change-set",
            "create",
            "--intent",
            "Sync files with a dry-run preview",
            "--affected-scope",
            "cli",
            "--implementation-required",
            "true",
            "--created",
            "2026-09-29T00:00:00Z",
        ],
    )?;
    ears(
        work,
        &[
            "interface",
            "add",
            "--change-set",
            "CS-00001",
            "--id",
            "cli-sync",
            "--name",
            "Project-sync CLI",
            "--type",
            "cli",
            "--spec-approach",
            "prose",
            "--created",
            "2026-09-29T00:00:00Z",
        ],
    )?;
    ears(
        work,
        &[
            "change-set",
            "update",
            "--change-set",
            "CS-00001",
            "--affected-interface",
            "cli-sync",
        ],
    )?;
    let requirements = REQUIREMENTS;
    for (id, kind, text) in requirements {
        ears(
            work,
            &[
                "requirement",
                "add",
                "--change-set",
                "CS-00001",
                "--id",
                id,
                "--type",
                kind,
                "--text",
                text,
                "--interface",
                "cli-sync",
                "--scope",
                "cli",
                "--verification-mode",
                "isolated-interface",
                "--provenance",
                "user-authored",
                "--created",
                "2026-09-29T00:00:00Z",
            ],
        )?;
    }
    ears(work, &["check", "--change-set", "CS-00001"])?;
    let branch = git(work, &["branch", "--show-current"])?;
    git(work, &["add", "-A"])?;
    git(
        work,
        &[
            "commit",
            "-q",
            "-m",
            "CS-00001: sync with a dry-run preview",
        ],
    )?;
    // Approval: a person merges the change-set pull request with a merge commit.
    git(work, &["checkout", "-q", "main"])?;
    git(
        work,
        &[
            "merge",
            "-q",
            "--no-ff",
            "-m",
            "Merge CS-00001: sync with a dry-run preview",
            &branch,
        ],
    )?;
    git(work, &["push", "-q", "origin", "main"])?;
    Ok(git(work, &["rev-parse", "HEAD"])?)
}
