//! The Anthropic Messages API of the double over a real socket: streamed and
//! whole answers with `tool_use` blocks, the request's headers recorded (the
//! `x-api-key` and `authorization` a test asserts on), errors in the API's
//! shape.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use protobot_model_double::{ModelDouble, Script};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

async fn double() -> ModelDouble {
    let script = Script::from_json(
        r#"{"scenarios": [{"marker": "WI-7", "steps": [
            {"kind": "tool-calls", "calls": [{"name": "Write", "arguments": {"file_path": "/workspace/a", "content": "x\n"}}]},
            {"kind": "text", "text": "wrote a"}
        ]}]}"#,
        "<test>",
    )
    .unwrap();
    ModelDouble::start(TcpListener::bind("127.0.0.1:0").await.unwrap(), script).unwrap()
}

/// Sends one HTTP/1.1 request and returns (status, lower-cased head, body).
async fn send(double: &ModelDouble, path: &str, extra: &str, body: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(double.addr()).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: model.example.invalid\r\n{extra}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_owned())
}

fn messages(stream: bool, history: Value) -> String {
    json!({
        "model": "claude-scripted",
        "max_tokens": 1024,
        "stream": stream,
        "system": [{"type": "text", "text": "WI-7 in the system prompt does not count"}],
        "messages": history,
        "tools": [{"name": "Write", "input_schema": {"type": "object"}}],
    })
    .to_string()
}

/// The `data` of every event named `name` in an SSE body.
fn events(body: &str, name: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|e| {
            let (event, data) = e.split_once('\n')?;
            (event == format!("event: {name}"))
                .then(|| serde_json::from_str(data.strip_prefix("data: ")?).ok())
                .flatten()
        })
        .collect()
}

#[tokio::test]
async fn a_streamed_messages_request_gets_its_tool_use_as_events_and_is_recorded_with_its_headers()
{
    let d = double().await;
    let first = json!([{"role": "user", "content": [{"type": "text", "text": "work on WI-7"}]}]);
    let (status, head, body) = send(
        &d,
        "/v1/messages?beta=true",
        "x-api-key: placeholder\r\nauthorization: Bearer sk-real\r\nanthropic-version: 2023-06-01\r\n",
        &messages(true, first.clone()),
    )
    .await;
    assert_eq!(status, 200);
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    let start = events(&body, "content_block_start");
    assert_eq!(start.len(), 1, "{body}");
    assert_eq!(start[0]["content_block"]["type"], "tool_use");
    assert_eq!(start[0]["content_block"]["name"], "Write");
    let id = start[0]["content_block"]["id"].as_str().unwrap().to_owned();
    let delta = &events(&body, "content_block_delta")[0]["delta"];
    assert_eq!(delta["type"], "input_json_delta");
    let input: Value = serde_json::from_str(delta["partial_json"].as_str().unwrap()).unwrap();
    assert_eq!(
        input,
        json!({"file_path": "/workspace/a", "content": "x\n"})
    );
    assert_eq!(
        events(&body, "message_delta")[0]["delta"]["stop_reason"],
        "tool_use"
    );
    assert_eq!(events(&body, "message_stop").len(), 1);

    // The tool's result comes back (not streamed this time): the next step.
    let mut second = first.as_array().unwrap().clone();
    second.push(json!({"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "Write", "input": input}]}));
    second.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "ok"}]}));
    let (status, head, body) = send(&d, "/v1/messages", "", &messages(false, json!(second))).await;
    assert_eq!(status, 200, "{body}");
    assert!(head.contains("content-type: application/json"), "{head}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["content"], json!([{"type": "text", "text": "wrote a"}]));
    assert_eq!(v["model"], "claude-scripted");

    let seen = d.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].path, "/v1/messages?beta=true");
    assert_eq!(seen[0].header("X-Api-Key"), Some("placeholder"));
    assert_eq!(seen[0].header("authorization"), Some("Bearer sk-real"));
    assert_eq!(seen[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(seen[1].header("x-api-key"), None);
    assert_eq!(seen[1].body["messages"][1]["role"], "assistant");
}

#[tokio::test]
async fn malformed_messages_requests_get_the_apis_error_shape_and_token_counts_are_served() {
    let d = double().await;
    let (status, _, body) = send(&d, "/v1/messages", "", r#"{"messages": "no"}"#).await;
    assert_eq!(status, 400, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let (status, _, body) = send(&d, "/v1/messages/count_tokens", "", "{}").await;
    assert_eq!(status, 200);
    assert!(serde_json::from_str::<Value>(&body).unwrap()["input_tokens"].is_u64());
    // A conversation no scenario matches ends with text, never a tool call.
    let other = json!([{"role": "user", "content": "something else"}]);
    let (_, _, body) = send(&d, "/v1/messages", "", &messages(false, other)).await;
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(d.requests().len(), 3);
}
