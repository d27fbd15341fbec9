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

/// Issue 34: the meter reads model answers the sandbox's upstream sent, which nobody
/// vouches for. Any body, streamed or not, of any dialect: a reading, never a panic, and
/// the reading is the same however often it is taken.
#[test]
fn fuzz_model_usage_reader() {
    use protobot_egress::usage::{ModelApi, read_usage};
    let piece = prop_oneof![
        3 => prop::sample::select(vec![
            "data: ", "event: message_delta\n", "\n\n", "\r\n", "\r", "[DONE]", "{", "}", "[",
            "]", ",", ":", "\"usage\"", "\"prompt_tokens\"", "\"completion_tokens\"",
            "\"input_tokens\"", "\"output_tokens\"", "\"cache_read_input_tokens\"",
            "\"prompt_tokens_details\"", "\"cached_tokens\"", "\"type\"", "\"message_start\"",
            "\"message_delta\"", "\"response.completed\"", "\"response\"", "\"message\"",
            "\"model\"", "18446744073709551615", "-1", "1e99", "0", "null", "\u{feff}", "\u{e9}",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..12),
    ];
    let body = prop::collection::vec(piece, 0..40).prop_map(|p| p.concat());
    let api = prop::sample::select(vec![
        ModelApi::OpenAiChat,
        ModelApi::OpenAiResponses,
        ModelApi::AnthropicMessages,
    ]);
    let content_type = prop::sample::select(vec![
        None,
        Some("text/event-stream"),
        Some("application/json"),
        Some("TEXT/EVENT-STREAM; charset=utf-8"),
    ]);
    fuzz(
        "model_usage_reader",
        (api, content_type, body),
        |(api, content_type, body)| {
            let first = read_usage(api, content_type, &body);
            assert_eq!(first, read_usage(api, content_type, &body));
        },
    );
}
