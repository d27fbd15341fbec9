//! Issue #16 fuzz target: the spec store's YAML reader. Any text gets a value or an error in
//! bounded time, never a panic or a stack overflow (`make fuzz` for long runs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use protobot_spec::{model::Requirement, yaml};

/// The fuzz loop shared by this crate's `fuzz_*` targets (issue #16): values of `strategy`
/// fed to `check` until `PROTOBOT_FUZZ_SECONDS` pass (a random seed per run; `make fuzz`),
/// else `PROTOBOT_FUZZ_CASES` cases (default 256) from a fixed seed (CI). A panic reports the
/// input; the execution count is printed either way.
fn fuzz<S>(name: &str, strategy: S, mut check: impl FnMut(S::Value))
where
    S: proptest::strategy::Strategy,
    S::Value: std::fmt::Debug + Clone,
{
    use proptest::{strategy::ValueTree, test_runner::TestRunner};
    let seconds: Option<f64> = std::env::var("PROTOBOT_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok());
    let cases: u64 = std::env::var("PROTOBOT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let mut runner = if seconds.is_some() {
        TestRunner::default()
    } else {
        TestRunner::deterministic()
    };
    let started = std::time::Instant::now();
    let mut executions: u64 = 0;
    loop {
        match seconds {
            Some(s) if started.elapsed().as_secs_f64() >= s => break,
            None if executions >= cases => break,
            _ => {}
        }
        let value = strategy
            .new_tree(&mut runner)
            .expect("the strategy generates values")
            .current();
        let input = value.clone();
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(value))).is_err() {
            panic!("fuzz {name}: panicked after {executions} executions on input {input:?}");
        }
        executions += 1;
    }
    eprintln!(
        "fuzz {name}: {executions} executions in {:.1} s, no panic",
        started.elapsed().as_secs_f64()
    );
}

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
