//! The span of one model call (docs/tracing.md), in a test binary of its own for the reason
//! `decision_events.rs` gives (tracing caches a callsite's interest process-wide): a sandbox
//! calls a model upstream through the broker over real sockets, and the closed `gen_ai.call`
//! span carries the GenAI attributes, the usage the upstream reported and the session's run,
//! and nothing of the prompt, the completion or the credential.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    io::Write,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode, body::Incoming};
use hyper_util::rt::TokioIo;
use prometheus::Registry;
use protobot_egress::{
    Broker, Credential, CredentialStore, EgressMetrics, EgressPolicy, Limits, Session,
    SessionRegistry, SessionSecret, Upstream, issue_session_token, server::serve,
};
use serde_json::Value;
use tokio::net::TcpListener;

const HOST: &str = "models.example.invalid";
const CREDENTIAL: &str = "sk-PROTOBOT-SPAN-TEST";
const PROMPT: &str = "PROMPT-TEXT-never-in-a-span";
const COMPLETION: &str = "COMPLETION-TEXT-never-in-a-span";

const POLICY: &str = r#"
rules:
  - role: worker-b
    destination: models.example.invalid
    method: POST
    path: /v1/chat/completions
    credential: model
"#;

/// A `MakeWriter` collecting formatted events.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Capture {
    type Writer = Capture;

    fn make_writer(&'a self) -> Capture {
        self.clone()
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

#[tokio::test(flavor = "current_thread")]
async fn a_model_call_is_one_span_with_genai_attributes_and_no_text() {
    let capture = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(capture.clone())
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_max_level(tracing::Level::TRACE)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    // The model upstream: a chat completion with usage and a completion text.
    let fixture = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fixture_addr = fixture.local_addr().unwrap();
    tokio::spawn(serve(
        fixture,
        move |_req: Request<Incoming>| async move {
            let body = format!(
                r#"{{"model":"gpt-test-2","choices":[{{"message":{{"content":"{COMPLETION}"}}}}],"usage":{{"prompt_tokens":1500,"completion_tokens":220,"prompt_tokens_details":{{"cached_tokens":1000}}}}}}"#
            );
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap()
        },
        std::future::pending(),
    ));
    let secret = SessionSecret::new(vec![7u8; 32]);
    let registry = Registry::new();
    let broker = Broker::new(
        EgressPolicy::from_yaml(POLICY, "<test>").unwrap(),
        CredentialStore::from_pairs([("model", Credential::new(CREDENTIAL))]),
        SessionRegistry::new(secret.clone()),
        Upstream::plaintext_for_tests(HashMap::from([(HOST.to_owned(), fixture_addr)])),
        EgressMetrics::register(&registry).unwrap(),
        Limits::default(),
    );
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

    let session = Session {
        work_item: "wi-span-1".into(),
        role: "worker-b".into(),
        trace_id: "wi-span-1-c2-b".into(),
        source_commit: "0123abcd".into(),
        project: "shop".into(),
        stage: "worker-b".into(),
        cycle: 2,
        tier: "standard".into(),
    };
    let token = issue_session_token(&secret, &session, i64::MAX / 2);
    let request = Request::builder()
        .method("POST")
        .uri(format!("https://{HOST}/v1/chat/completions"))
        .header("host", "proxy")
        .header("x-sandbox-session-token", token.clone())
        .body(Full::new(Bytes::from(format!(
            r#"{{"model":"gpt-test","messages":[{{"role":"user","content":"{PROMPT}"}}]}}"#
        ))))
        .unwrap();
    let (status, body) = send(proxy_addr, request).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));

    let text = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    let closed: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["fields"]["message"] == "close" && e["span"]["name"] == "gen_ai.call")
        .collect();
    assert_eq!(closed.len(), 1, "one span per model call:\n{text}");
    let span = &closed[0]["span"];
    for (key, want) in [
        ("gen_ai.system", "openai"),
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.request.model", "gpt-test"),
        ("gen_ai.response.model", "gpt-test-2"),
        ("protobot.run_id", "wi-span-1-c2-b"),
        ("work_item", "wi-span-1"),
        ("role", "worker-b"),
        ("otel.name", "chat gpt-test"),
    ] {
        assert_eq!(span[key], want, "{key} in {span}");
    }
    // The conventions' input is the whole prompt (the cached part included).
    assert_eq!(span["gen_ai.usage.input_tokens"], 1500, "{span}");
    assert_eq!(span["gen_ai.usage.output_tokens"], 220, "{span}");
    assert_eq!(span["http.response.status_code"], 200, "{span}");
    // Neither the prompt, the completion, the credential nor the session token is recorded.
    for secret in [PROMPT, COMPLETION, CREDENTIAL, token.as_str()] {
        assert!(
            !text.contains(secret),
            "{secret} reached the trace:\n{text}"
        );
    }
}
