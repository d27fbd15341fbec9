//! The double over a real socket: what an agent sends, what it gets back,
//! and what the test can read from the record afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use protobot_model_double::{ModelDouble, Script};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

async fn double() -> ModelDouble {
    let script = Script::from_json(
        r#"{"scenarios": [{"marker": "WI-9", "steps": [
            {"kind": "tool-calls", "calls": [{"name": "bash", "arguments": {"command": "true"}}]}
        ]}]}"#,
        "<test>",
    )
    .unwrap();
    ModelDouble::start(TcpListener::bind("127.0.0.1:0").await.unwrap(), script).unwrap()
}

/// Sends one HTTP/1.1 request and returns (status, headers, body).
async fn send(
    double: &ModelDouble,
    method: &str,
    path: &str,
    extra: &str,
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(double.addr()).await.unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: model.example.invalid\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_owned())
}

fn chat(stream: bool) -> String {
    json!({
        "model": "scripted",
        "stream": stream,
        "messages": [{"role": "user", "content": "work on WI-9"}],
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
    })
    .to_string()
}

#[tokio::test]
async fn a_streamed_request_gets_its_tool_call_as_events_and_is_recorded_with_its_headers() {
    let d = double().await;
    let (status, head, body) = send(
        &d,
        "POST",
        "/v1/chat/completions",
        "authorization: Bearer sk-1\r\n",
        &chat(true),
    )
    .await;
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    let first: Value =
        serde_json::from_str(body.lines().next().unwrap().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(
        first["choices"][0]["delta"]["tool_calls"][0]["function"]["name"],
        "bash"
    );
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");

    let (status, _, body) = send(&d, "POST", "/v1/chat/completions", "", &chat(false)).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");

    let seen = d.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].header("Authorization"), Some("Bearer sk-1"));
    assert_eq!(seen[1].header("authorization"), None);
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(seen[0].body["model"], "scripted");
}

#[tokio::test]
async fn other_routes_and_malformed_bodies_are_refused_but_still_recorded() {
    let d = double().await;
    let (status, _, _) = send(&d, "POST", "/v1/embeddings", "", "{}").await;
    assert_eq!(status, 404);
    let (status, _, body) = send(&d, "POST", "/v1/chat/completions", "", "{\"messages\": 7}").await;
    assert_eq!(status, 400, "{body}");
    let (status, _, body) = send(&d, "GET", "/v1/models", "", "").await;
    assert_eq!(status, 200);
    assert!(body.contains("scripted"));
    let seen = d.requests();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[1].body, json!({"messages": 7}));
}

#[tokio::test]
async fn a_scripted_outage_answers_its_statuses_in_the_apis_shapes_then_the_steps() {
    let script = Script::from_json(
        r#"{"scenarios": [{"marker": "WI-9", "failures": [429, 503, 529], "steps": [
            {"kind": "tool-calls", "calls": [{"name": "bash", "arguments": {"command": "true"}}]}
        ]}]}"#,
        "<test>",
    )
    .unwrap();
    let d = ModelDouble::start(TcpListener::bind("127.0.0.1:0").await.unwrap(), script).unwrap();

    // A title request (no tools) is never failed and consumes nothing.
    let untooled =
        json!({"model": "scripted", "messages": [{"role": "user", "content": "work on WI-9"}]})
            .to_string();
    let (status, _, _) = send(&d, "POST", "/v1/chat/completions", "", &untooled).await;
    assert_eq!(status, 200);

    let (status, head, body) = send(&d, "POST", "/v1/chat/completions", "", &chat(false)).await;
    assert_eq!(status, 429);
    assert!(head.contains("retry-after-ms: 10"), "{head}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
    let (status, _, body) = send(&d, "POST", "/v1/chat/completions", "", &chat(true)).await;
    assert_eq!(status, 503, "a streamed request fails the same way");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "server_error");

    // The Messages API fails with its own error shape.
    let messages = json!({
        "model": "scripted",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "work on WI-9"}],
        "tools": [{"name": "Bash", "input_schema": {}}],
    })
    .to_string();
    let (status, _, body) = send(&d, "POST", "/v1/messages", "", &messages).await;
    assert_eq!(status, 529);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "overloaded_error");
    assert_eq!(d.failures_answered(), 3);

    // After the outage, the steps are answered from the first.
    let (status, _, body) = send(&d, "POST", "/v1/chat/completions", "", &chat(false)).await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(d.failures_answered(), 3);
}

#[tokio::test]
async fn ending_an_outage_drops_the_failures_not_yet_answered() {
    let script = Script::from_json(
        r#"{"scenarios": [{"marker": "WI-9", "failures": [503, 503, 503, 503], "steps": [
            {"kind": "tool-calls", "calls": [{"name": "bash", "arguments": {"command": "true"}}]}
        ]}]}"#,
        "<test>",
    )
    .unwrap();
    let d = ModelDouble::start(TcpListener::bind("127.0.0.1:0").await.unwrap(), script).unwrap();
    let (status, _, _) = send(&d, "POST", "/v1/chat/completions", "", &chat(false)).await;
    assert_eq!(status, 503);
    d.end_outage();
    let (status, _, _) = send(&d, "POST", "/v1/chat/completions", "", &chat(false)).await;
    assert_eq!(status, 200);
    assert_eq!(d.failures_answered(), 1);
}
