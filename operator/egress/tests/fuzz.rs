//! Issue #16 fuzz target: the egress proxy's request parser. Any method and request target
//! is read into a form and decided, never a panic (`make fuzz` for long runs).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use hyper::{Method, Uri};
use proptest::prelude::*;
use protobot_egress::{EgressPolicy, EgressRequest, decide, form::parse_target};

#[path = "../../../tests/support/fuzz.rs"]
mod fuzz_support;
use fuzz_support::fuzz;

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
