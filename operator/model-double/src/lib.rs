//! A deterministic model endpoint for tests (issue 21): it speaks the
//! OpenAI chat-completions API (`POST …/chat/completions` with `tools`,
//! answers with `tool_calls` or text, as one JSON object or as server-sent
//! events when the request says `"stream": true`) and the Anthropic Messages
//! API (`POST …/v1/messages`, answering with `tool_use` blocks; see
//! [`anthropic`]), and records every request
//! it receives, headers included, so a test can assert which credential
//! reached the endpoint.
//!
//! What it answers comes from a [`Script`]: scenarios keyed by a marker that
//! must appear in a user message (a harness puts the work item's marker in
//! its prompt), each a list of steps. The step is chosen by how many
//! assistant turns the conversation already holds, so an agent that sends
//! the whole history with every request walks the steps in order; after the
//! last step the answer is the text `done`. A request without tools (an
//! agent's title or summary request) gets a short text answer and never
//! consumes a step.
//!
//! A scenario may also script an outage: its `failures` are HTTP statuses
//! (429, 503, …) answered, one per request, to its first tool-offering
//! requests before any step, with the API's error body and a `retry-after-ms`
//! of 10 so an agent's own retries come quickly ([`Outages`]).
//! [`ModelDouble::end_outage`] drops the failures not yet answered.
//!
//! Pure: [`ChatRequest`], [`reply`], [`render_json`], [`render_sse`],
//! [`Outages`], [`error_json`]. Edge:
//! [`ModelDouble::start`] (hyper, HTTP/1.1 on a bound listener) and the
//! `protobot-model-double` binary.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Request, Response, StatusCode, body::Incoming, header, service::service_fn};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;

pub mod anthropic;

/// Largest request body read (bigger ones get 413).
pub const MAX_BODY: usize = 16 << 20;
/// The text of a request that has no tools to call.
pub const UNTOOLED_REPLY: &str = "protobot scripted session";
/// The text after a scenario's last step.
pub const DONE_REPLY: &str = "done";

/// Scripted answers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// Scenarios, tried in order; the first whose marker appears wins.
    pub scenarios: Vec<Scenario>,
}

/// The answers for one task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// A string that must appear in a user message of the conversation.
    pub marker: String,
    /// One answer per assistant turn.
    pub steps: Vec<Step>,
    /// HTTP statuses (400–599) answered, in order, to the scenario's first
    /// tool-offering requests, before any step (a scripted outage: 429, 503…).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<u16>,
}

/// One assistant turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Step {
    /// Call tools.
    ToolCalls {
        /// The calls, in order.
        calls: Vec<ToolCall>,
    },
    /// Answer with text (ends the agent's turn).
    Text {
        /// The text.
        text: String,
    },
}

/// One tool call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The tool's name, as the request's `tools` list offers it.
    pub name: String,
    /// Its arguments (sent as a JSON string, as the API does).
    pub arguments: Value,
}

/// Why a script could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    /// Reading failed.
    #[error("failed to read the model script {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not a script.
    #[error(
        "failed to parse the model script {path}: {source}; expected {{\"scenarios\": [{{\"marker\", \"steps\": [{{\"kind\": \"tool-calls\"|\"text\", …}}]}}]}}"
    )]
    Parse {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A scenario with an empty marker would match everything.
    #[error(
        "scenario {index} of the model script has an empty marker; give every scenario a marker"
    )]
    EmptyMarker {
        /// Its index.
        index: usize,
    },
    /// A scripted failure that is not an HTTP error status.
    #[error(
        "scenario {index} of the model script fails with status {status}; a scripted failure is an HTTP error status from 400 to 599"
    )]
    FailureStatus {
        /// The scenario's index.
        index: usize,
        /// The status.
        status: u16,
    },
}

impl Script {
    /// Parses and checks a script (JSON).
    pub fn from_json(text: &str, origin: &str) -> Result<Script, ScriptError> {
        let script: Script = serde_json::from_str(text).map_err(|source| ScriptError::Parse {
            path: origin.to_owned(),
            source,
        })?;
        if let Some(index) = script.scenarios.iter().position(|s| s.marker.is_empty()) {
            return Err(ScriptError::EmptyMarker { index });
        }
        for (index, scenario) in script.scenarios.iter().enumerate() {
            if let Some(&status) = scenario.failures.iter().find(|s| !(400..=599).contains(*s)) {
                return Err(ScriptError::FailureStatus { index, status });
            }
        }
        Ok(script)
    }

    /// Reads a script file.
    pub fn load(path: &Path) -> Result<Script, ScriptError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Script::from_json(&text, &path.display().to_string())
    }
}

/// The parts of a chat-completions request the double reads.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ChatRequest {
    /// The model asked for.
    #[serde(default)]
    pub model: String,
    /// The conversation.
    #[serde(default)]
    pub messages: Vec<Message>,
    /// Tools offered (only whether there are any matters).
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// Whether to answer with server-sent events.
    #[serde(default)]
    pub stream: bool,
}

/// One message of the conversation.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`.
    #[serde(default)]
    pub role: String,
    /// A string or a list of parts.
    #[serde(default)]
    pub content: Value,
}

impl Message {
    /// The message's text: the string, or the `text` of every part.
    pub fn text(&self) -> String {
        match &self.content {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        }
    }
}

/// What the double answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Tool calls, with the step they belong to (their ids derive from it).
    ToolCalls {
        /// The step index.
        step: usize,
        /// The calls.
        calls: Vec<ToolCall>,
    },
    /// Text.
    Text(String),
}

impl ChatRequest {
    /// The text of every user message.
    pub fn user_text(&self) -> Vec<String> {
        self.messages
            .iter()
            .filter(|m| m.role == "user")
            .map(Message::text)
            .collect()
    }

    /// Whether the request offers tools (an agent's working turn, not a
    /// title or summary request).
    pub fn tooled(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| !t.is_empty())
    }
}

/// The answer to `request` under `script` (pure).
pub fn reply(script: &Script, request: &ChatRequest) -> Reply {
    let step = request
        .messages
        .iter()
        .filter(|m| m.role == "assistant")
        .count();
    scripted_reply(script, request.tooled(), &request.user_text(), step)
}

/// The index of the first scenario whose marker is in `user_text`.
pub fn scenario_for(script: &Script, user_text: &[String]) -> Option<usize> {
    script
        .scenarios
        .iter()
        .position(|s| user_text.iter().any(|t| t.contains(&s.marker)))
}

/// The answer of either API (pure): text when no tools are offered, else the
/// `step`-th step of the first scenario whose marker is in `user_text`.
pub fn scripted_reply(script: &Script, tooled: bool, user_text: &[String], step: usize) -> Reply {
    if !tooled {
        return Reply::Text(UNTOOLED_REPLY.to_owned());
    }
    let Some(scenario) = scenario_for(script, user_text).and_then(|i| script.scenarios.get(i))
    else {
        return Reply::Text("no scripted scenario matches this conversation".to_owned());
    };
    match scenario.steps.get(step) {
        Some(Step::ToolCalls { calls }) => Reply::ToolCalls {
            step,
            calls: calls.clone(),
        },
        Some(Step::Text { text }) => Reply::Text(text.clone()),
        None => Reply::Text(DONE_REPLY.to_owned()),
    }
}

fn tool_calls_json(step: usize, calls: &[ToolCall], with_index: bool) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({
                "id": format!("call_{step}_{i}"),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments.to_string()},
            });
            if with_index {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

/// Input tokens every answer reports (each rendering: chat JSON and stream, messages JSON and
/// stream). Agents read them; the egress proxy meters them, and [`ModelDouble::served`] counts
/// them so a test can check the meter against the double's own count.
pub const ANSWER_INPUT_TOKENS: u64 = 10;
/// Output tokens every answer reports ([`ANSWER_INPUT_TOKENS`]).
pub const ANSWER_OUTPUT_TOKENS: u64 = 10;

/// Token counts the double reports.
fn usage() -> Value {
    json!({
        "prompt_tokens": ANSWER_INPUT_TOKENS,
        "completion_tokens": ANSWER_OUTPUT_TOKENS,
        "total_tokens": ANSWER_INPUT_TOKENS + ANSWER_OUTPUT_TOKENS,
    })
}

/// What the double answered with usage, by its own count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Served {
    /// Answers that reported usage (every successful chat or messages answer).
    pub answers: u64,
    /// Input tokens they reported.
    pub input_tokens: u64,
    /// Output tokens they reported.
    pub output_tokens: u64,
}

/// The answer as one `chat.completion` object.
pub fn render_json(reply: &Reply, model: &str) -> Value {
    let (message, finish) = match reply {
        Reply::ToolCalls { step, calls } => (
            json!({"role": "assistant", "content": null, "tool_calls": tool_calls_json(*step, calls, false)}),
            "tool_calls",
        ),
        Reply::Text(text) => (json!({"role": "assistant", "content": text}), "stop"),
    };
    json!({
        "id": "chatcmpl-double",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage(),
    })
}

/// The answer as server-sent events: the whole delta in one chunk, then the
/// finish reason with usage, then `[DONE]`.
pub fn render_sse(reply: &Reply, model: &str) -> String {
    let chunk = |delta: Value, finish: Value, usage: Option<Value>| {
        let mut c = json!({
            "id": "chatcmpl-double",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        if let Some(u) = usage {
            c["usage"] = u;
        }
        format!("data: {c}\n\n")
    };
    let (delta, finish) = match reply {
        Reply::ToolCalls { step, calls } => (
            json!({"role": "assistant", "tool_calls": tool_calls_json(*step, calls, true)}),
            "tool_calls",
        ),
        Reply::Text(text) => (json!({"role": "assistant", "content": text}), "stop"),
    };
    let mut out = chunk(delta, Value::Null, None);
    out.push_str(&chunk(json!({}), json!(finish), Some(usage())));
    out.push_str("data: [DONE]\n\n");
    out
}

/// The scripted outages' progress: how many failures each scenario has
/// answered (deterministic; the server holds one behind a lock).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outages {
    answered: BTreeMap<usize, usize>,
    ended: bool,
}

impl Outages {
    /// The status to fail a request with, if its scenario's outage is not
    /// over; counts it as answered. Only tool-offering requests fail (an
    /// agent's title request is not its working turn).
    pub fn next_failure(
        &mut self,
        script: &Script,
        tooled: bool,
        user_text: &[String],
    ) -> Option<StatusCode> {
        if self.ended || !tooled {
            return None;
        }
        let index = scenario_for(script, user_text)?;
        let failures = &script.scenarios.get(index)?.failures;
        let answered = self.answered.entry(index).or_default();
        let status = *failures.get(*answered)?;
        *answered += 1;
        StatusCode::from_u16(status).ok()
    }

    /// Ends every outage: later requests are answered from the steps.
    pub fn end(&mut self) {
        self.ended = true;
    }

    /// How many failures have been answered, over all scenarios.
    pub fn answered(&self) -> usize {
        self.answered.values().sum()
    }
}

/// The OpenAI-style error body of a scripted failure.
pub fn error_json(status: StatusCode) -> Value {
    let kind = match status.as_u16() {
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    };
    json!({"error": {"message": format!("scripted outage: HTTP {}", status.as_u16()), "type": kind}})
}

/// One request the double received.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Recorded {
    /// The method.
    pub method: String,
    /// The path and query.
    pub path: String,
    /// Headers, names lower-case (repeated headers joined with `, `).
    pub headers: BTreeMap<String, String>,
    /// The body as JSON (`null` when it was not JSON).
    pub body: Value,
}

impl Recorded {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }
}

/// A running double.
#[derive(Debug)]
pub struct ModelDouble {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    served: Arc<Mutex<Served>>,
    outages: Arc<Mutex<Outages>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ModelDouble {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ModelDouble {
    /// Serves `script` on `listener` until dropped.
    pub fn start(listener: TcpListener, script: Script) -> std::io::Result<ModelDouble> {
        ModelDouble::start_recording(listener, script, None)
    }

    /// [`Self::start`], also appending each request as one JSON line to
    /// `record` (the binary's `--record`).
    pub fn start_recording(
        listener: TcpListener,
        script: Script,
        record: Option<std::fs::File>,
    ) -> std::io::Result<ModelDouble> {
        let addr = listener.local_addr()?;
        let requests: Arc<Mutex<Vec<Recorded>>> = Arc::default();
        let outages: Arc<Mutex<Outages>> = Arc::default();
        let served: Arc<Mutex<Served>> = Arc::default();
        let state = Arc::new(State {
            script,
            requests: requests.clone(),
            served: served.clone(),
            outages: outages.clone(),
            record: Mutex::new(record),
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // A failed accept (a reset, too many open files) must not
                    // spin the loop.
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(state.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(ModelDouble {
            addr,
            requests,
            served,
            outages,
            task,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What it answered with usage so far, by its own count.
    pub fn served(&self) -> Served {
        *self.served.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Ends the scripted outages: the failures not yet answered are dropped.
    pub fn end_outage(&self) {
        self.outages.lock().unwrap_or_else(|e| e.into_inner()).end();
    }

    /// How many scripted failures have been answered.
    pub fn failures_answered(&self) -> usize {
        self.outages
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .answered()
    }
}

struct State {
    script: Script,
    requests: Arc<Mutex<Vec<Recorded>>>,
    served: Arc<Mutex<Served>>,
    outages: Arc<Mutex<Outages>>,
    record: Mutex<Option<std::fs::File>>,
}

fn respond(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

/// A scripted failure's answer: the API's error body and a `retry-after-ms`
/// of 10 (and `retry-after: 0`), so an agent's own retries come quickly.
fn failure(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    let mut r = respond(status, "application/json", body.to_string());
    r.headers_mut().insert(
        header::HeaderName::from_static("retry-after-ms"),
        header::HeaderValue::from_static("10"),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("0"));
    r
}

fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    respond(
        status,
        "application/json",
        json!({"error": {"message": message, "type": "invalid_request_error"}}).to_string(),
    )
}

impl State {
    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let mut headers: BTreeMap<String, String> = BTreeMap::new();
        for (name, value) in &parts.headers {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            headers
                .entry(name.as_str().to_owned())
                .and_modify(|v| {
                    v.push_str(", ");
                    v.push_str(&value);
                })
                .or_insert(value);
        }
        let path = parts
            .uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
        let bytes = match Limited::new(body, MAX_BODY).collect().await {
            Ok(c) => c.to_bytes(),
            Err(_) => {
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "the request body could not be read or is too large",
                );
            }
        };
        let json_body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        self.record(Recorded {
            method: parts.method.as_str().to_owned(),
            path: path.clone(),
            headers,
            body: json_body.clone(),
        });
        let route = parts.uri.path();
        if parts.method == hyper::Method::POST && route.ends_with("/messages/count_tokens") {
            return respond(
                StatusCode::OK,
                "application/json",
                anthropic::count_tokens().to_string(),
            );
        }
        if parts.method == hyper::Method::POST && route.ends_with("/messages") {
            return self.answer_messages(json_body);
        }
        if parts.method == hyper::Method::GET && route.ends_with("/models") {
            return respond(
                StatusCode::OK,
                "application/json",
                json!({"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "protobot"}]})
                    .to_string(),
            );
        }
        if parts.method != hyper::Method::POST || !route.ends_with("/chat/completions") {
            return error(
                StatusCode::NOT_FOUND,
                "only POST …/chat/completions, POST …/messages, POST …/messages/count_tokens and GET …/models are served",
            );
        }
        let request: ChatRequest = match serde_json::from_value(json_body) {
            Ok(r) => r,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    &format!("not a chat-completions request: {e}"),
                );
            }
        };
        if let Some(status) = self.failure_for(request.tooled(), &request.user_text()) {
            return failure(status, error_json(status));
        }
        let answer = reply(&self.script, &request);
        self.count_answer();
        if request.stream {
            respond(
                StatusCode::OK,
                "text/event-stream",
                render_sse(&answer, &request.model),
            )
        } else {
            respond(
                StatusCode::OK,
                "application/json",
                render_json(&answer, &request.model).to_string(),
            )
        }
    }

    /// `POST …/v1/messages` (the Anthropic Messages API).
    fn answer_messages(&self, body: Value) -> Response<Full<Bytes>> {
        let request: anthropic::MessagesRequest = match serde_json::from_value(body) {
            Ok(r) => r,
            Err(e) => {
                return respond(
                    StatusCode::BAD_REQUEST,
                    "application/json",
                    anthropic::error_body(
                        "invalid_request_error",
                        &format!("not a Messages API request: {e}"),
                    )
                    .to_string(),
                );
            }
        };
        if let Some(status) = self.failure_for(request.tooled(), &request.user_text()) {
            return failure(status, anthropic::failure_body(status));
        }
        let answer = anthropic::reply_messages(&self.script, &request);
        self.count_answer();
        if request.stream {
            respond(
                StatusCode::OK,
                "text/event-stream",
                anthropic::render_message_sse(&answer, &request.model),
            )
        } else {
            respond(
                StatusCode::OK,
                "application/json",
                anthropic::render_message_json(&answer, &request.model).to_string(),
            )
        }
    }

    /// Counts one answer with [`ANSWER_INPUT_TOKENS`] and [`ANSWER_OUTPUT_TOKENS`].
    fn count_answer(&self) {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        served.answers += 1;
        served.input_tokens += ANSWER_INPUT_TOKENS;
        served.output_tokens += ANSWER_OUTPUT_TOKENS;
    }

    fn failure_for(&self, tooled: bool, user_text: &[String]) -> Option<StatusCode> {
        self.outages
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .next_failure(&self.script, tooled, user_text)
    }

    fn record(&self, recorded: Recorded) {
        if let Some(file) = self
            .record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            use std::io::Write;
            let line = serde_json::to_string(&recorded).unwrap_or_default();
            if let Err(e) = writeln!(file, "{line}") {
                tracing::warn!("failed to append a request to the record file: {e}");
            }
        }
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(recorded);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script() -> Script {
        Script::from_json(
            r#"{"scenarios": [
                {"marker": "WI-ALPHA", "steps": [
                    {"kind": "tool-calls", "calls": [{"name": "write", "arguments": {"filePath": "/workspace/a", "content": "x"}}]},
                    {"kind": "text", "text": "wrote a"}
                ]},
                {"marker": "WI-BETA", "steps": []}
            ]}"#,
            "<test>",
        )
        .unwrap()
    }

    fn request(user: &str, assistants: usize, tools: bool) -> ChatRequest {
        let mut messages = vec![
            Message {
                role: "system".into(),
                content: json!("WI-BETA appears only in the system prompt"),
            },
            Message {
                role: "user".into(),
                content: json!([{"type": "text", "text": user}]),
            },
        ];
        for _ in 0..assistants {
            messages.push(Message {
                role: "assistant".into(),
                content: Value::Null,
            });
            messages.push(Message {
                role: "tool".into(),
                content: json!("ok"),
            });
        }
        ChatRequest {
            model: "scripted".into(),
            messages,
            tools: tools.then(|| vec![json!({"type": "function"})]),
            stream: false,
        }
    }

    #[test]
    fn steps_follow_the_assistant_turns_of_the_matching_scenario() {
        let s = script();
        let first = reply(&s, &request("do WI-ALPHA now", 0, true));
        assert_eq!(
            first,
            Reply::ToolCalls {
                step: 0,
                calls: vec![ToolCall {
                    name: "write".into(),
                    arguments: json!({"filePath": "/workspace/a", "content": "x"}),
                }],
            }
        );
        assert_eq!(
            reply(&s, &request("do WI-ALPHA now", 1, true)),
            Reply::Text("wrote a".into())
        );
        assert_eq!(
            reply(&s, &request("do WI-ALPHA now", 2, true)),
            Reply::Text(DONE_REPLY.into())
        );
    }

    #[test]
    fn requests_without_tools_or_marker_consume_no_step() {
        let s = script();
        assert_eq!(
            reply(&s, &request("do WI-ALPHA now", 0, false)),
            Reply::Text(UNTOOLED_REPLY.into())
        );
        // The marker must be in a user message: the system prompt's does not count.
        let none = reply(&s, &request("something else", 0, true));
        assert!(matches!(none, Reply::Text(t) if t.contains("no scripted scenario")));
    }

    #[test]
    fn empty_markers_and_unknown_fields_are_refused() {
        let err = Script::from_json(r#"{"scenarios": [{"marker": "", "steps": []}]}"#, "s.json")
            .unwrap_err();
        assert!(err.to_string().contains("empty marker"), "{err}");
        let err = Script::from_json(r#"{"scenarios": [], "extra": 1}"#, "s.json").unwrap_err();
        assert!(err.to_string().contains("s.json"), "{err}");
    }

    #[test]
    fn outages_fail_only_their_scenarios_tooled_requests_in_order() {
        let mut s = script();
        s.scenarios[0].failures = vec![429, 502];
        let mut o = Outages::default();
        let alpha = vec!["do WI-ALPHA now".to_owned()];
        let beta = vec!["do WI-BETA now".to_owned()];
        assert_eq!(o.next_failure(&s, false, &alpha), None, "untooled");
        assert_eq!(o.next_failure(&s, true, &beta), None, "another scenario");
        assert_eq!(
            o.next_failure(&s, true, &alpha),
            Some(StatusCode::TOO_MANY_REQUESTS)
        );
        assert_eq!(
            o.next_failure(&s, true, &alpha),
            Some(StatusCode::BAD_GATEWAY)
        );
        assert_eq!(o.next_failure(&s, true, &alpha), None, "the outage is over");
        assert_eq!(o.answered(), 2);

        let mut ended = Outages::default();
        ended.end();
        assert_eq!(ended.next_failure(&s, true, &alpha), None);
    }

    #[test]
    fn a_failure_that_is_not_an_error_status_is_refused() {
        for bad in ["200", "302", "600", "0"] {
            let text = format!(
                r#"{{"scenarios": [{{"marker": "m", "failures": [429, {bad}], "steps": []}}]}}"#
            );
            let err = Script::from_json(&text, "s.json").unwrap_err();
            assert!(
                matches!(err, ScriptError::FailureStatus { index: 0, .. }),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains("400 to 599"), "{err}");
        }
        let ok = Script::from_json(
            r#"{"scenarios": [{"marker": "m", "failures": [400, 599], "steps": []}]}"#,
            "s.json",
        )
        .unwrap();
        assert_eq!(ok.scenarios[0].failures, [400, 599]);
    }

    #[test]
    fn tool_calls_render_as_the_api_sends_them() {
        let r = Reply::ToolCalls {
            step: 3,
            calls: vec![ToolCall {
                name: "bash".into(),
                arguments: json!({"command": "ls"}),
            }],
        };
        let v = render_json(&r, "m");
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        let call = &v["choices"][0]["message"]["tool_calls"][0];
        assert_eq!(call["id"], "call_3_0");
        assert_eq!(call["function"]["name"], "bash");
        assert_eq!(
            serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap(),
            json!({"command": "ls"})
        );
        let sse = render_sse(&r, "m");
        let events: Vec<&str> = sse
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap())
            .collect();
        assert_eq!(events.len(), 3);
        assert_eq!(events[2], "[DONE]");
        let first: Value = serde_json::from_str(events[0]).unwrap();
        assert_eq!(first["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
        let last: Value = serde_json::from_str(events[1]).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
        assert!(last["usage"].is_object());
    }
}
