//! The fuzz loop of the workspace's property-based fuzz targets, one file included by path
//! (`#[path = "../../../tests/support/fuzz.rs"] mod fuzz_support;`) by each crate's
//! `tests/fuzz.rs`, so the crates need no shared dev-dependency for it.

/// The fuzz loop every crate's `fuzz_*` targets share (issue #16): values of `strategy`
/// fed to `check` until `PROTOBOT_FUZZ_SECONDS` pass (a random seed per run; `make fuzz`),
/// else `PROTOBOT_FUZZ_CASES` cases (default 256) from a fixed seed (CI). A panic reports the
/// input; the execution count is printed either way.
pub fn fuzz<S>(name: &str, strategy: S, mut check: impl FnMut(S::Value))
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
