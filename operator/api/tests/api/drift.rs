//! The committed `crds/` must equal what `make crds` generates from the Rust types.

use std::{fs, path::PathBuf};

use protobot_api::crdgen;

fn committed_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../crds")
}

#[test]
fn committed_crds_equal_the_generated_output() {
    let dir = committed_dir();
    let mut stale = Vec::new();
    for rendered in crdgen::render_all().unwrap() {
        let path = dir.join(&rendered.file_name);
        match fs::read_to_string(&path) {
            Ok(committed) if committed == rendered.yaml => {}
            Ok(_) => stale.push(format!("{} differs", path.display())),
            Err(error) => stale.push(format!("{} is unreadable: {error}", path.display())),
        }
    }
    assert!(
        stale.is_empty(),
        "crds/ is stale: run `make crds` and commit the result\n  {}",
        stale.join("\n  ")
    );
}

#[test]
fn crds_dir_holds_no_file_that_no_kind_generates() {
    let expected: Vec<String> = crdgen::render_all()
        .unwrap()
        .into_iter()
        .map(|r| r.file_name)
        .collect();
    let extra: Vec<String> = fs::read_dir(committed_dir())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(crdgen::FILE_SUFFIX) && !expected.contains(name))
        .collect();
    assert!(
        extra.is_empty(),
        "crds/ has files no kind generates: {extra:?}; run `make crds` and commit the result"
    );
}
