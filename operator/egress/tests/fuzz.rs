//! Issue #16 fuzz target: the egress proxy's request parser. Any method and request target
//! is read into a form and decided, never a panic (`make fuzz` for long runs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hyper::{Method, Uri};
use proptest::prelude::*;
use protobot_egress::{EgressPolicy, EgressRequest, decide, form::parse_target};

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

const POLICY: &str = r#"
rules:
  - executableDigest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    role: worker-b
    destination: registry.example.invalid
    method: GET
    path: /v2/allowed
    credential: registry
"#;

struct AllPresent;

impl protobot_egress::decide::CredentialPresence for AllPresent {
    fn has(&self, _name: &str) -> bool {
        true
    }
}

fn target() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => prop::sample::select(vec![
            "/", "registry.example.invalid", "https://", "http://", "dns://", ":443", ":80",
            ":0", "/v2/allowed", "?", "#", "%2e%2e", "..", "@", "[::1]", "127.0.0.1", "0x7f.1",
            "%00", "\u{e9}", "*", "//", ";", "user:pass@", ":99999999999",
        ])
        .prop_map(str::to_owned),
        1 => "[ -~]{0,10}",
    ];
    prop::collection::vec(piece, 0..8).prop_map(|p| p.concat())
}

#[test]
fn fuzz_proxy_request_parser() {
    let policy = EgressPolicy::from_yaml(POLICY, "<fuzz>").unwrap();
    let methods = prop::sample::select(vec![
        "GET", "POST", "CONNECT", "TRACE", "OPTIONS", "PUT", "get", "X-CUSTOM",
    ]);
    fuzz(
        "proxy_request_parser",
        (methods, target()),
        |(method, target)| {
            let Ok(method) = Method::from_bytes(method.as_bytes()) else {
                return;
            };
            let Ok(uri) = target.parse::<Uri>() else {
                return;
            };
            let Ok(form) = parse_target(&method, &uri) else {
                return;
            };
            let request = EgressRequest {
                role: "worker-b".into(),
                executable_digest: Some(
                    "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                        .into(),
                ),
                protocol: form.protocol.clone(),
                method: method.as_str().to_owned(),
                destination: form.destination.clone(),
                path: form.path.clone(),
            };
            let _ = decide(&policy, &request, &AllPresent);
        },
    );
}
