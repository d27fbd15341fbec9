//! The CLI seams: export writes the control-plane record beside the projection, and
//! `patch check` reads a bundle file and that record.

use std::fs;

use protobot_repo::{
    bundle::collect_bundle,
    catalog::ChangeScope,
    export::record_path_for,
    role::Role,
    seams::{PatchCheckError, patch_check, projection_export},
    validate::{Limits, ViolationCode},
};

use crate::util::{FILE, canonical, worker_commit};

#[test]
fn export_then_patch_check_reports_violations_from_files() {
    let canonical = canonical();
    let work = tempfile::TempDir::new().unwrap();
    let dest = work.path().join("b");
    let report = projection_export(
        canonical.path(),
        "main",
        Role::WorkerB,
        &dest,
        ChangeScope::default(),
    )
    .unwrap();
    assert_eq!(report.record_path, record_path_for(&dest));
    assert_eq!(report.record_path, work.path().join("b.projection.json"));
    assert!(
        !dest.join("b.projection.json").exists(),
        "record stays outside the projection"
    );
    let printed = serde_json::to_value(&report).unwrap();
    assert_eq!(printed["role"], "worker-b");
    assert!(
        printed.get("record").is_none(),
        "withheld names are not printed"
    );

    worker_commit(
        &dest,
        &[("tests/peek.rs", Some(b"x".to_vec()), FILE)],
        "peek",
    );
    let bundle = collect_bundle(&dest, &report.record, &Limits::default()).unwrap();
    let bundle_path = work.path().join("patch.bundle");
    fs::write(&bundle_path, bundle.to_json().unwrap()).unwrap();

    let checked = patch_check(&bundle_path, &dest, Role::WorkerB, &Limits::default()).unwrap();
    assert!(!checked.accepted);
    assert_eq!(checked.violations[0].code, ViolationCode::NotWritableByRole);

    let wrong_role = patch_check(&bundle_path, &dest, Role::WorkerA, &Limits::default());
    assert!(matches!(
        wrong_role,
        Err(PatchCheckError::RoleMismatch { .. })
    ));
    fs::write(&bundle_path, b"not json").unwrap();
    let garbage = patch_check(&bundle_path, &dest, Role::WorkerB, &Limits::default());
    assert!(matches!(garbage, Err(PatchCheckError::DecodeBundle { .. })));
}
