//! The pinned `check-jsonschema` (`make tools-check-jsonschema`) run on result records
//! against the evaluation corpus's `result.schema.json`. Missing, it skips with the reason,
//! unless PROTOBOT_REQUIRE_CHECK_JSONSCHEMA is set: then it fails.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The upstream result schema.
pub fn schema() -> PathBuf {
    repo().join("tests/fixtures/upstream/eval-corpus/schema/result.schema.json")
}

/// Validates `files` (all must be valid).
pub fn validate(files: &[PathBuf]) {
    let tool = std::env::var_os("PROTOBOT_CHECK_JSONSCHEMA")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".tools/check-jsonschema/bin/check-jsonschema"));
    if !tool.exists() {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_CHECK_JSONSCHEMA").is_none(),
            "PROTOBOT_REQUIRE_CHECK_JSONSCHEMA is set but {} is missing; run make tools-check-jsonschema",
            tool.display()
        );
        eprintln!(
            "skipping the schema validation: {} is missing (make tools-check-jsonschema)",
            tool.display()
        );
        return;
    }
    assert!(!files.is_empty(), "no result records to validate");
    let out = Command::new(&tool)
        .arg("--schemafile")
        .arg(schema())
        .args(files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "check-jsonschema refused {files:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The records a run wrote in `dir` (every `*.json` but `trace.json`).
pub fn records_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json") && !p.ends_with("trace.json"))
        .collect();
    v.sort();
    v
}
