//! Issue #16 fuzz target: the spec store's YAML reader. Any text gets a value or an error in
//! bounded time, never a panic or a stack overflow (`make fuzz` for long runs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use protobot_spec::{model::Requirement, yaml};

#[path = "../../../tests/support/fuzz.rs"]
mod fuzz_support;
use fuzz_support::fuzz;

/// YAML-ish text: tokens the parser treats specially, nested and repeated.
fn yamlish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        8 => prop::sample::select(vec![
            "- ", ": ", "[", "]", "{", "}", ", ", "\n", "  ", "'", "\"", "# c", "&a ", "*a",
            "!!str ", "? ", "|", ">", "---\n", "...\n", "id", "REQ-CLI-00001", "text", "1",
            "null", "~", "true", "\\", "\t", "\u{feff}", "<<: ", "\u{e9}", "  - ",
        ])
        .prop_map(str::to_owned),
        1 => ".{0,6}",
        1 => (1usize..300, prop::sample::select(vec!["[", "{a: ", "- ", " ", "a:\n "]))
            .prop_map(|(n, t)| t.repeat(n)),
    ];
    prop::collection::vec(token, 0..40).prop_map(|t| t.concat())
}

#[test]
fn fuzz_spec_store_yaml_reader() {
    fuzz("spec_store_yaml_reader", yamlish(), |text| {
        let started = std::time::Instant::now();
        let parsed = yaml::parse(text.as_bytes());
        let _ = yaml::decode::<Requirement>(text.as_bytes());
        let _ = yaml::check_depth(&text);
        if let Ok(value) = parsed {
            // Whatever is read can be written and read back.
            let _ = serde_yaml_ng::to_string(&value);
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
    });
}
