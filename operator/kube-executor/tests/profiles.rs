#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Every document in `sandbox-profiles/` parses and validates, and the
//! default profile is among them.

use std::path::Path;

use protobot_kube_executor::{SandboxProfile, profile::DEFAULT_PROFILE};

fn profiles_dir() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../sandbox-profiles"
    ))
}

#[test]
fn every_profile_in_sandbox_profiles_parses() {
    let mut yaml_files = 0;
    for entry in std::fs::read_dir(profiles_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            yaml_files += 1;
            let profile = SandboxProfile::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                Some(profile.name()),
                path.file_stem().and_then(|s| s.to_str()),
                "{}: metadata.name must equal the file name",
                path.display()
            );
        }
    }
    let all = SandboxProfile::load_dir(profiles_dir()).unwrap();
    assert_eq!(all.len(), yaml_files);
    assert!(all.len() >= 2, "kata and gvisor at least");
    let kata = all.iter().find(|p| p.name() == DEFAULT_PROFILE).unwrap();
    assert_eq!(kata.spec().runtime_class_name, "kata");
}
