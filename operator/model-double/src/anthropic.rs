//! The Anthropic Messages API side of the double (`POST …/v1/messages`, as
//! Claude Code and the Anthropic SDKs send it): the same [`Script`] answers
//! with `tool_use` content blocks or text, as one `message` object or as the
//! API's server-sent events (`message_start`, `content_block_start`,
//! `content_block_delta` with `text_delta` / `input_json_delta`,
//! `content_block_stop`, `message_delta`, `message_stop`).
//!
//! Turns are counted differently than for chat completions: an agent may
//! merge its consecutive assistant turns into one assistant message (Claude
//! Code does: the second request of a run holds one assistant message with
//! both turns' `tool_use` blocks). The double names every `tool_use` it sends
//! `toolu_<step>_<index>`, so the number of steps already answered is the
//! number of distinct steps among the conversation's `tool_use` ids, or the
//! number of assistant messages when that is larger.
//!
//! Pure: [`MessagesRequest`], [`reply_messages`], [`render_message_json`],
//! [`render_message_sse`], [`count_tokens`].

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::{Reply, Script, ToolCall, scripted_reply};

/// The parts of a Messages API request the double reads.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct MessagesRequest {
    /// The model asked for.
    #[serde(default)]
    pub model: String,
    /// The conversation (`user` and `assistant` messages).
    #[serde(default)]
    pub messages: Vec<TurnMessage>,
    /// Tools offered (only whether there are any matters).
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// Whether to answer with server-sent events.
    #[serde(default)]
    pub stream: bool,
}

/// One message of a Messages API conversation.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct TurnMessage {
    /// `user` or `assistant`.
    #[serde(default)]
    pub role: String,
    /// A string or a list of content blocks.
    #[serde(default)]
    pub content: Value,
}

impl TurnMessage {
    /// The message's text: the string, or the `text` of its `text` blocks
    /// (tool results are not the user's words).
    pub fn text(&self) -> String {
        match &self.content {
            Value::String(s) => s.clone(),
            Value::Array(blocks) => blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        }
    }

    /// The ids of its `tool_use` blocks.
    fn tool_use_ids(&self) -> impl Iterator<Item = &str> {
        self.content
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
            .filter_map(|b| b.get("id").and_then(Value::as_str))
    }
}

impl MessagesRequest {
    /// The text of every user message.
    pub fn user_text(&self) -> Vec<String> {
        self.messages
            .iter()
            .filter(|m| m.role == "user")
            .map(TurnMessage::text)
            .collect()
    }

    /// Whether the request offers tools.
    pub fn tooled(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| !t.is_empty())
    }

    /// How many of the double's steps the conversation already holds.
    pub fn turns(&self) -> usize {
        let assistants: Vec<&TurnMessage> = self
            .messages
            .iter()
            .filter(|m| m.role == "assistant")
            .collect();
        let steps: BTreeSet<&str> = assistants
            .iter()
            .flat_map(|m| m.tool_use_ids())
            .filter_map(|id| id.strip_prefix("toolu_")?.split('_').next())
            .collect();
        steps.len().max(assistants.len())
    }
}

/// The answer to `request` under `script` (pure).
pub fn reply_messages(script: &Script, request: &MessagesRequest) -> Reply {
    scripted_reply(
        script,
        request.tooled(),
        &request.user_text(),
        request.turns(),
    )
}

/// The content blocks of an answer.
fn blocks(reply: &Reply) -> (Vec<Value>, &'static str) {
    match reply {
        Reply::ToolCalls { step, calls } => (
            calls
                .iter()
                .enumerate()
                .map(|(i, c): (usize, &ToolCall)| {
                    json!({
                        "type": "tool_use",
                        "id": format!("toolu_{step}_{i}"),
                        "name": c.name,
                        "input": c.arguments,
                    })
                })
                .collect(),
            "tool_use",
        ),
        Reply::Text(text) => (vec![json!({"type": "text", "text": text})], "end_turn"),
    }
}

fn usage(output_tokens: u64) -> Value {
    json!({"input_tokens": crate::ANSWER_INPUT_TOKENS, "output_tokens": output_tokens})
}

/// The answer as one `message` object.
pub fn render_message_json(reply: &Reply, model: &str) -> Value {
    let (content, stop) = blocks(reply);
    json!({
        "id": "msg_double",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage(crate::ANSWER_OUTPUT_TOKENS),
    })
}

/// The answer as the API's server-sent events: `message_start`, per block a
/// start, one delta (the text, or the whole input as `partial_json`) and a
/// stop, then `message_delta` with the stop reason and `message_stop`.
pub fn render_message_sse(reply: &Reply, model: &str) -> String {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let (content, stop) = blocks(reply);
    let mut out = event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_double",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": usage(1),
        }}),
    );
    for (index, block) in content.iter().enumerate() {
        let (start, delta) = if block["type"] == "tool_use" {
            (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
            )
        } else {
            (
                json!({"type": "text", "text": ""}),
                json!({"type": "text_delta", "text": block["text"]}),
            )
        };
        out.push_str(&event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        out.push_str(&event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
        out.push_str(&event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    out.push_str(&event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": crate::ANSWER_OUTPUT_TOKENS}}),
    ));
    out.push_str(&event("message_stop", json!({"type": "message_stop"})));
    out
}

/// The answer to `POST …/v1/messages/count_tokens` (agents read the count;
/// its value does not matter).
pub fn count_tokens() -> Value {
    json!({"input_tokens": 10})
}

/// An error in the API's shape.
pub fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// The error body of a scripted failure (`overloaded_error` for 529, as the
/// API answers).
pub fn failure_body(status: hyper::StatusCode) -> Value {
    let kind = match status.as_u16() {
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500..=599 => "api_error",
        _ => "invalid_request_error",
    };
    error_body(kind, &format!("scripted outage: HTTP {}", status.as_u16()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DONE_REPLY, Scenario, Step, UNTOOLED_REPLY};

    fn script() -> Script {
        Script {
            scenarios: vec![Scenario {
                marker: "WI-ALPHA".into(),
                failures: Vec::new(),
                steps: vec![
                    Step::ToolCalls {
                        calls: vec![ToolCall {
                            name: "Write".into(),
                            arguments: json!({"file_path": "/workspace/a", "content": "x"}),
                        }],
                    },
                    Step::ToolCalls {
                        calls: vec![
                            ToolCall {
                                name: "Bash".into(),
                                arguments: json!({"command": "ls"}),
                            },
                            ToolCall {
                                name: "Read".into(),
                                arguments: json!({"file_path": "/workspace/a"}),
                            },
                        ],
                    },
                    Step::Text {
                        text: "wrote a".into(),
                    },
                ],
            }],
        }
    }

    fn request(messages: Value, tools: bool) -> MessagesRequest {
        serde_json::from_value(json!({
            "model": "m",
            "messages": messages,
            "tools": if tools { json!([{"name": "Bash", "input_schema": {}}]) } else { Value::Null },
            "stream": true,
        }))
        .unwrap()
    }

    fn tool_use(id: &str) -> Value {
        json!({"type": "tool_use", "id": id, "name": "Bash", "input": {}})
    }

    fn tool_result(id: &str) -> Value {
        json!({"type": "tool_result", "tool_use_id": id, "content": "WI-OTHER ok"})
    }

    #[test]
    fn merged_assistant_turns_are_counted_by_their_tool_use_steps() {
        let s = script();
        let first = request(json!([{"role": "user", "content": "do WI-ALPHA"}]), true);
        assert!(matches!(
            reply_messages(&s, &first),
            Reply::ToolCalls { step: 0, .. }
        ));
        // One assistant message holding step 0 and both calls of step 1, as
        // Claude Code sends its history: two steps answered, the text is next.
        let merged = request(
            json!([
                {"role": "user", "content": [{"type": "text", "text": "do WI-ALPHA"}]},
                {"role": "assistant", "content": [tool_use("toolu_0_0"), tool_use("toolu_1_0"), tool_use("toolu_1_1")]},
                {"role": "user", "content": [tool_result("toolu_0_0"), tool_result("toolu_1_0"), tool_result("toolu_1_1")]},
            ]),
            true,
        );
        assert_eq!(merged.turns(), 2);
        assert_eq!(reply_messages(&s, &merged), Reply::Text("wrote a".into()));
        // Separate assistant messages count as they stand.
        let separate = request(
            json!([
                {"role": "user", "content": "do WI-ALPHA"},
                {"role": "assistant", "content": [tool_use("toolu_0_0")]},
                {"role": "user", "content": [tool_result("toolu_0_0")]},
                {"role": "assistant", "content": [tool_use("toolu_1_0")]},
                {"role": "user", "content": [tool_result("toolu_1_0")]},
                {"role": "assistant", "content": "wrote a"},
                {"role": "user", "content": "and?"},
            ]),
            true,
        );
        assert_eq!(separate.turns(), 3);
        assert_eq!(
            reply_messages(&s, &separate),
            Reply::Text(DONE_REPLY.into())
        );
    }

    #[test]
    fn tool_results_and_untooled_requests_do_not_select_or_consume() {
        let s = script();
        // The marker only inside a tool result is not the user's words.
        let hidden = request(
            json!([{"role": "user", "content": [tool_result("x"), {"type": "text", "text": "WI-OTHER"}]}]),
            true,
        );
        assert!(
            matches!(reply_messages(&s, &hidden), Reply::Text(t) if t.contains("no scripted scenario"))
        );
        let untooled = request(json!([{"role": "user", "content": "do WI-ALPHA"}]), false);
        assert_eq!(
            reply_messages(&s, &untooled),
            Reply::Text(UNTOOLED_REPLY.into())
        );
    }

    #[test]
    fn tool_use_renders_as_a_message_and_as_its_event_stream() {
        let r = Reply::ToolCalls {
            step: 1,
            calls: vec![ToolCall {
                name: "Bash".into(),
                arguments: json!({"command": "ls -l", "description": "list"}),
            }],
        };
        let m = render_message_json(&r, "m");
        assert_eq!(m["stop_reason"], "tool_use");
        assert_eq!(m["content"][0]["id"], "toolu_1_0");
        assert_eq!(m["content"][0]["input"]["command"], "ls -l");

        let sse = render_message_sse(&r, "m");
        let events: Vec<(String, Value)> = sse
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                (
                    name.strip_prefix("event: ").unwrap().to_owned(),
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap(),
                )
            })
            .collect();
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        for (name, data) in &events {
            assert_eq!(data["type"], name.as_str(), "the data names its event");
        }
        assert_eq!(events[1].1["content_block"]["input"], json!({}));
        let partial = events[2].1["delta"]["partial_json"].as_str().unwrap();
        assert_eq!(events[2].1["delta"]["type"], "input_json_delta");
        assert_eq!(
            serde_json::from_str::<Value>(partial).unwrap(),
            json!({"command": "ls -l", "description": "list"})
        );
        assert_eq!(events[4].1["delta"]["stop_reason"], "tool_use");

        let text = render_message_sse(&Reply::Text("hi".into()), "m");
        let delta_line = text
            .lines()
            .skip_while(|l| *l != "event: content_block_delta")
            .nth(1)
            .unwrap();
        let delta: Value =
            serde_json::from_str(delta_line.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(delta["delta"], json!({"type": "text_delta", "text": "hi"}));
        assert!(text.contains(r#""stop_reason":"end_turn""#), "{text}");
    }
}
