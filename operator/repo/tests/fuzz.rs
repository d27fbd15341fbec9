//! Issue #16 fuzz targets (proptest strategies, no nightly needed): bundle validation (and
//! that every bundle the validator accepts integrates), path folding and trailer
//! neutralisation. Short runs in CI (`PROTOBOT_FUZZ_CASES`), long runs with
//! `make fuzz` (`PROTOBOT_FUZZ_SECONDS`).

use proptest::prelude::*;
use protobot_repo::{
    bundle::{BundleCommit, Change, ChangeOp, PatchBundle},
    integrate::{CycleInfo, WorkItemRef, apply_bundle},
    path::{check_path_length, check_project_path, fold_key, names_the_same},
    role::Role,
    trailers,
    validate::{Limits, accept_bundle, check_bundle},
};

use crate::util::{canonical, project};

#[path = "../../../tests/support/fuzz.rs"]
mod fuzz_support;
use fuzz_support::fuzz;

/// Path components mixing real names, look-alikes (case, trailing dots and spaces,
/// ignorable code points, NFC/NFD) and hostile bytes.
fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "tests", "Tests", "TESTS", "tests.", "tests ", "te\u{200c}sts", "fixtures",
            "Fixtures", "impl_helper.rs", "Impl_Helper.rs", "impl_helper.rs.", "valid.rs",
            "Valid.rs", "src", "Src", "lib.rs", ".git", ".GIT", "git~1", ".protobot",
            ".gitattributes", "caf\u{e9}.rs", "cafe\u{301}.rs", "a", "b", "..", ".", "",
            "docs", "ci", "new.rs",
        ])
        .prop_map(str::to_owned),
        1 => "[a-zA-Z0-9._ \u{200c}\u{feff}\u{e9}\u{301}:\\\\\n-]{0,12}",
        1 => (1usize..400).prop_map(|n| "n".repeat(n)),
    ]
}

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(component(), 1..5).prop_map(|c| c.join("/"))
}

fn change() -> impl Strategy<Value = Change> {
    (
        path(),
        prop::sample::select(vec![ChangeOp::Add, ChangeOp::Modify, ChangeOp::Delete]),
        prop::sample::select(vec![
            "100644", "100755", "120000", "160000", "100600", "40000",
        ]),
        prop::option::of(prop_oneof!["[0-9a-f]{0,16}", "[0-9a-zA-Z]{0,8}",]),
    )
        .prop_map(|(path, op, mode, content_hex)| Change {
            path,
            op,
            mode: mode.to_owned(),
            content_hex,
        })
}

fn commits() -> impl Strategy<Value = Vec<Vec<Change>>> {
    prop::collection::vec(prop::collection::vec(change(), 0..5), 1..4)
}

fn chain(role: Role, base: &str, commits: Vec<Vec<Change>>, message: &str) -> PatchBundle {
    let mut parent = base.to_owned();
    let mut out = Vec::new();
    for (i, changes) in commits.into_iter().enumerate() {
        let id = format!("{:040x}", i + 1);
        out.push(BundleCommit {
            id: id.clone(),
            parents: vec![parent.clone()],
            message: message.to_owned(),
            changes,
        });
        parent = id;
    }
    PatchBundle::new(role, base.to_owned(), out)
}

#[test]
fn fuzz_bundle_validation() {
    let c = canonical();
    let p = project(c.path(), Role::WorkerA);
    let mut cycle = 0u32;
    fuzz(
        "bundle_validation",
        (commits(), ".{0,40}"),
        |(commits, message)| {
            let bundle = chain(Role::WorkerA, &p.record.root_commit, commits, &message);
            let report = check_bundle(&bundle, &p.record, &Limits::default());
            // The JSON form decodes to the same bundle, and a mutated one never panics.
            let json = bundle.to_json().expect("encodes");
            let back = PatchBundle::from_json(&json).expect("decodes");
            assert_eq!(back, bundle);
            let mut cut = json.clone();
            cut.truncate(json.len() / 2);
            let _ = PatchBundle::from_json(&cut);
            if report.accepted {
                // Whatever the validator accepts integrates: no wedged item.
                cycle += 1;
                let accepted =
                    accept_bundle(bundle, &p.record, &Limits::default()).expect("accepted");
                let info = CycleInfo {
                    cycle,
                    triage_decision: "initial".into(),
                    when: 1_000,
                };
                let wi = WorkItemRef {
                    id: "WI-FUZZ".into(),
                    slug: "fuzz".into(),
                };
                if let Err(e) = apply_bundle(&c.repo, &accepted, &wi, &info) {
                    panic!("an accepted bundle failed to integrate: {e}");
                }
            }
        },
    );
}

#[test]
fn fuzz_path_folding() {
    fuzz("path_folding", (path(), ".{0,24}"), |(p, raw)| {
        for text in [p.as_str(), raw.as_str()] {
            let key = fold_key(text);
            assert_eq!(fold_key(&key), key, "folding is idempotent for {text:?}");
            let _ = check_project_path(text);
            let _ = check_path_length(text);
            let _ = names_the_same(text, ".git");
            if let Ok(()) = check_project_path(text) {
                for component in text.split('/') {
                    assert!(!names_the_same(component, ".git"), "{text:?}");
                }
            }
        }
    });
}

fn untrusted_text() -> impl Strategy<Value = String> {
    let line = prop_oneof![
        prop::sample::select(vec![
            "Work-Item: WI-9",
            "work-item:x",
            "  Cycle: 3",
            "Patch-Digest: sha256:1",
            "Work-Ite\u{20ac}: x",
            "Projection-Commit\u{e9}: y",
            "Source-Commit:",
            "> x",
            "Signed-off-by: a",
            "",
            "\r",
            "\u{1F600}",
        ])
        .prop_map(str::to_owned),
        ".{0,20}",
    ];
    prop::collection::vec(line, 0..6).prop_map(|l| l.join("\n"))
}

#[test]
fn fuzz_trailer_neutralisation() {
    fuzz("trailer_neutralisation", untrusted_text(), |text| {
        let safe = trailers::neutralise(&text);
        let message = trailers::compose("subject", Some(&safe), &[]);
        let parsed = trailers::parse(&message);
        for key in [
            trailers::WORK_ITEM,
            trailers::CYCLE,
            trailers::PROJECTION_ROLE,
            trailers::PROJECTION_ROOT,
            trailers::PROJECTION_COMMIT,
            trailers::PATCH_DIGEST,
            trailers::TRIAGE_DECISION,
            trailers::PRODUCT_TREE_DIGEST,
            trailers::SOURCE_COMMIT,
        ] {
            assert!(
                trailers::value(&parsed, key).is_none(),
                "{text:?} forged {key} through {message:?}"
            );
        }
    });
}
