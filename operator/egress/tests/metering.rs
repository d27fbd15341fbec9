//! Metering through the real proxy (issue 34): a sandbox calls a model upstream through the
//! broker over real sockets; the meter records exactly the usage the upstream reported, per
//! run, the admin port serves the record, the metrics carry it, and every answer reaches the
//! sandbox byte for byte as the upstream sent it.
//!
//! Fixture upstream (plain HTTP, `models.example.invalid` via
//! `Upstream::plaintext_for_tests`): it answers each model path with the body the test put
//! in its table for that path, with the content type given there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode, body::Incoming};
use hyper_util::rt::TokioIo;
use prometheus::{Encoder, Registry};
use protobot_egress::{
    Broker, Credential, CredentialStore, EgressMetrics, EgressPolicy, Limits, PriceTable, RunUsage,
    Session, SessionRegistry, SessionSecret, Upstream, UsageMeter, UsageMetrics,
    issue_session_token, server::serve,
};
use tokio::net::TcpListener;

const HOST: &str = "models.example.invalid";
const CREDENTIAL: &str = "sk-PROTOBOT-METERING-TEST";

/// Path → (content type, body) the fixture answers with.
type Answers = Arc<Mutex<HashMap<String, (&'static str, Vec<u8>)>>>;

const POLICY: &str = r#"
rules:
  - role: worker-b
    destination: models.example.invalid
    method: POST
    path: /v1/chat/completions
    credential: model
  - role: worker-b
    destination: models.example.invalid
    method: POST
    path: /v1/messages
    credential: model
  - role: worker-b
    destination: models.example.invalid
    method: POST
    path: /v1/responses
    credential: model
  - role: worker-b
    destination: models.example.invalid
    method: GET
    path: /v1/models
    credential: model
"#;

const PRICES: &str = r#"
gpt-test: {input: "2", output: "8", cacheRead: "0.5"}
claude-test: {input: "3", output: "15", cacheRead: "0.3", cacheWrite: "3.75"}
"#;

struct Harness {
    proxy: SocketAddr,
    admin: SocketAddr,
    secret: SessionSecret,
    answers: Answers,
    registry: Registry,
}

async fn start() -> Harness {
    let answers: Answers = Arc::default();
    let fixture = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fixture_addr = fixture.local_addr().unwrap();
    let table = answers.clone();
    tokio::spawn(serve(
        fixture,
        move |req: Request<Incoming>| {
            let table = table.clone();
            async move {
                let found = table.lock().unwrap().get(req.uri().path()).cloned();
                match found {
                    Some((content_type, body)) => Response::builder()
                        .status(StatusCode::OK)
                        .header("content-type", content_type)
                        .body(Full::new(Bytes::from(body)))
                        .unwrap(),
                    None => Response::builder()
                        .status(StatusCode::NOT_FOUND)
                        .body(Full::new(Bytes::from_static(
                            b"{\"error\":\"no such model\"}",
                        )))
                        .unwrap(),
                }
            }
        },
        std::future::pending(),
    ));
    let secret = SessionSecret::new(vec![9u8; 32]);
    let registry = Registry::new();
    let meter = UsageMeter::new(
        serde_yaml_ng::from_str::<PriceTable>(PRICES).unwrap(),
        Some(UsageMetrics::register(&registry).unwrap()),
    );
    let broker = Broker::new(
        EgressPolicy::from_yaml(POLICY, "<test>").unwrap(),
        CredentialStore::from_pairs([("model", Credential::new(CREDENTIAL))]),
        SessionRegistry::new(secret.clone()),
        Upstream::plaintext_for_tests(HashMap::from([(HOST.to_owned(), fixture_addr)])),
        EgressMetrics::register(&registry).unwrap(),
        Limits::default(),
    )
    .with_meter(meter.clone());
    let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_addr = proxy.local_addr().unwrap();
    tokio::spawn(serve(
        proxy,
        move |req| {
            let broker = broker.clone();
            async move { broker.handle(req).await }
        },
        std::future::pending(),
    ));
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin_addr = admin.local_addr().unwrap();
    let admin_registry = registry.clone();
    tokio::spawn(serve(
        admin,
        move |req| {
            let (registry, meter) = (admin_registry.clone(), meter.clone());
            async move { protobot_egress::admin::respond(&registry, Some(&meter), &req) }
        },
        std::future::pending(),
    ));
    Harness {
        proxy: proxy_addr,
        admin: admin_addr,
        secret,
        answers,
        registry,
    }
}

fn session(run: &str) -> Session {
    Session {
        work_item: "wi-meter-1".into(),
        role: "worker-b".into(),
        trace_id: run.into(),
        source_commit: "0123abcd".into(),
        project: "shop".into(),
        stage: "worker-b".into(),
        cycle: 2,
        tier: "standard".into(),
    }
}

impl Harness {
    fn answer(&self, path: &str, content_type: &'static str, body: &[u8]) {
        self.answers
            .lock()
            .unwrap()
            .insert(path.to_owned(), (content_type, body.to_vec()));
    }

    /// One call as the sandbox of run `run` makes it; the status and the body's bytes.
    async fn call(&self, run: &str, method: &str, path: &str) -> (StatusCode, Bytes) {
        let token = issue_session_token(&self.secret, &session(run), i64::MAX / 2);
        let request = Request::builder()
            .method(method)
            .uri(format!("https://{HOST}{path}"))
            .header("host", "proxy")
            .header("x-sandbox-session-token", token)
            .body(Full::new(Bytes::from_static(b"{\"model\":\"x\"}")))
            .unwrap();
        send(self.proxy, request).await
    }

    async fn usage(&self, run: &str) -> (StatusCode, Option<RunUsage>) {
        let request = Request::builder()
            .uri(format!("/usage/{run}"))
            .header("host", "admin")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (status, body) = send(self.admin, request).await;
        (status, serde_json::from_slice(&body).ok())
    }

    fn metrics(&self) -> String {
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .unwrap();
        String::from_utf8(out).unwrap()
    }
}

async fn send(addr: SocketAddr, request: Request<Full<Bytes>>) -> (StatusCode, Bytes) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

const CHAT_STREAM: &[u8] = b"data: {\"model\":\"gpt-test\",\"choices\":[{\"delta\":{\"content\":\"he\"}}],\"usage\":null}\n\n\
data: {\"model\":\"gpt-test\",\"choices\":[],\"usage\":{\"prompt_tokens\":1500,\"completion_tokens\":220,\"prompt_tokens_details\":{\"cached_tokens\":1000},\"completion_tokens_details\":{\"reasoning_tokens\":20}}}\n\n\
data: [DONE]\n\n";

const CHAT: &[u8] = br#"{"id":"c1","model":"gpt-test","choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":100,"completion_tokens":10,"total_tokens":110}}"#;

const ANTHROPIC_STREAM: &[u8] = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-test\",\"usage\":{\"input_tokens\":40,\"output_tokens\":1,\"cache_creation_input_tokens\":2000,\"cache_read_input_tokens\":6000}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"done\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":300}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

const RESPONSES_NO_USAGE: &[u8] = br#"{"object":"response","model":"gpt-test","output":[]}"#;

#[tokio::test]
async fn the_meter_records_exactly_what_the_upstream_reported_per_run() {
    let h = start().await;
    h.answer("/v1/chat/completions", "text/event-stream", CHAT_STREAM);
    h.answer("/v1/messages", "text/event-stream", ANTHROPIC_STREAM);
    h.answer("/v1/responses", "application/json", RESPONSES_NO_USAGE);
    h.answer("/v1/models", "application/json", CHAT);

    for (path, sent) in [
        ("/v1/chat/completions", CHAT_STREAM),
        ("/v1/messages", ANTHROPIC_STREAM),
        ("/v1/responses", RESPONSES_NO_USAGE),
    ] {
        let (status, body) = h.call("run-a", "POST", path).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        assert_eq!(
            body.as_ref(),
            sent,
            "{path}: the sandbox gets the upstream's bytes"
        );
    }
    // Not a model call: forwarded, never metered, even though its body looks like one.
    let (status, _) = h.call("run-a", "GET", "/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    // Another run's call stays out of run-a's record.
    h.answer("/v1/chat/completions", "application/json", CHAT);
    h.call("run-b", "POST", "/v1/chat/completions").await;
    // A model call the upstream refuses is not a metered answer.
    h.answers.lock().unwrap().remove("/v1/messages");
    let (status, _) = h.call("run-a", "POST", "/v1/messages").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, usage) = h.usage("run-a").await;
    assert_eq!(status, StatusCode::OK);
    let usage = usage.unwrap();
    let gpt = &usage.models["gpt-test"];
    assert_eq!((gpt.calls, gpt.calls_without_usage), (1, 1), "{usage:?}");
    assert_eq!(
        (
            gpt.tokens.input,
            gpt.tokens.cache_read,
            gpt.tokens.output,
            gpt.tokens.reasoning
        ),
        (500, 1000, 220, 20)
    );
    // 500×2 + 1000×0.5 + 220×8 = 3260 micro-dollars.
    assert_eq!(gpt.cost_microdollars, Some(3260));
    let claude = &usage.models["claude-test"];
    assert_eq!(
        (
            claude.tokens.input,
            claude.tokens.cache_write,
            claude.tokens.cache_read,
            claude.tokens.output
        ),
        (40, 2000, 6000, 300)
    );
    // 40×3 + 2000×3.75 + 6000×0.3 + 300×15 = 120 + 7500 + 1800 + 4500.
    assert_eq!(claude.cost_microdollars, Some(13_920));
    assert_eq!(usage.cost().map(|c| c.0), Some(17_180));

    let (_, other) = h.usage("run-b").await;
    assert_eq!(other.unwrap().models["gpt-test"].tokens.input, 100);
    let (status, none) = h.usage("run-never").await;
    assert_eq!((status, none), (StatusCode::NOT_FOUND, None));

    let text = h.metrics();
    // run-a: 17180 micro-dollars; run-b: 100×2 + 10×8 = 280.
    for line in [
        "protobot_model_tokens_total{kind=\"cache-write\",project=\"shop\",role=\"worker-b\",tier=\"standard\"} 2000",
        "protobot_model_tokens_total{kind=\"input\",project=\"shop\",role=\"worker-b\",tier=\"standard\"} 640",
        "protobot_model_cost_microdollars_total{project=\"shop\",role=\"worker-b\",tier=\"standard\"} 17460",
        "protobot_model_calls_total{api=\"openai-responses\",project=\"shop\",role=\"worker-b\",tier=\"standard\",usage=\"absent\"} 1",
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(
        !text.contains("run-a") && !text.contains("wi-meter-1"),
        "no run or item ids as labels"
    );
}

/// Whatever bytes a model upstream sends (short of a credential, which is scrubbed), the
/// sandbox receives exactly those bytes: the meter only reads.
#[tokio::test]
async fn a_metered_answer_is_forwarded_byte_identical() {
    use proptest::{
        strategy::{Strategy, ValueTree},
        test_runner::TestRunner,
    };
    let h = start().await;
    let mut runner = TestRunner::deterministic();
    let bodies = proptest::collection::vec(
        proptest::prop_oneof![
            proptest::sample::select(vec![
                &b"data: "[..],
                b"\n\n",
                b"\r\n",
                b"{\"usage\":{\"prompt_tokens\":",
                b"7}}",
                b"[DONE]",
                b"event: message_delta\n",
                b"\xff\xfe",
                b"\0",
            ])
            .prop_map(<[u8]>::to_vec),
            proptest::collection::vec(proptest::num::u8::ANY, 0..64),
        ],
        0..24,
    )
    .prop_map(|p| p.concat());
    for i in 0..48 {
        let body = bodies.new_tree(&mut runner).unwrap().current();
        let content_type = if i % 2 == 0 {
            "text/event-stream"
        } else {
            "application/json"
        };
        h.answer("/v1/chat/completions", content_type, &body);
        let (status, received) = h.call("run-bytes", "POST", "/v1/chat/completions").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(received.as_ref(), body.as_slice(), "body #{i}");
    }
}
