//! Token usage read from a model's answer, as the proxy forwards it
//! (issue 34: metering where the agent cannot tamper with it).
//!
//! Pure: [`ModelApi::from_path`] says whether a request is a model call and
//! in which dialect, [`read_usage`] reads the usage the upstream reported in
//! the answer's bytes — OpenAI chat completions and responses, Anthropic
//! messages, each streamed (server-sent events) or not. The bytes are only
//! read, never changed. An answer that reports no usage is
//! [`Metered::Absent`]: counted as such, never estimated.
//!
//! Normalized counts ([`TokenCounts`]): `input` is input read fresh (neither
//! from nor into the prompt cache), `cache_read` and `cache_write` the cached
//! parts, `output` every generated token (reasoning included) and
//! `reasoning` the part of `output` the API reports as reasoning. OpenAI
//! reports cached tokens inside its input count; Anthropic reports them
//! beside it; both are brought to the same shape here.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The dialect of a model call, from its request path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelApi {
    /// OpenAI-style `…/chat/completions`.
    OpenAiChat,
    /// OpenAI-style `…/responses`.
    OpenAiResponses,
    /// Anthropic `…/messages`.
    AnthropicMessages,
}

impl ModelApi {
    /// The dialect of a request to `path` (query excluded), or `None` when
    /// the path is not a model call the proxy meters.
    pub fn from_path(path: &str) -> Option<ModelApi> {
        let path = path.trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            Some(ModelApi::OpenAiChat)
        } else if path.ends_with("/responses") {
            Some(ModelApi::OpenAiResponses)
        } else if path.ends_with("/messages") {
            Some(ModelApi::AnthropicMessages)
        } else {
            None
        }
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelApi::OpenAiChat => "openai-chat",
            ModelApi::OpenAiResponses => "openai-responses",
            ModelApi::AnthropicMessages => "anthropic-messages",
        }
    }

    /// `gen_ai.system` of a call in this dialect (OpenTelemetry GenAI conventions).
    pub fn gen_ai_system(self) -> &'static str {
        match self {
            ModelApi::OpenAiChat | ModelApi::OpenAiResponses => "openai",
            ModelApi::AnthropicMessages => "anthropic",
        }
    }

    /// `gen_ai.operation.name` of a call in this dialect: every metered dialect is a chat.
    pub fn gen_ai_operation(self) -> &'static str {
        "chat"
    }
}

/// The `model` a request body names, for the call's `gen_ai.request.model`: only that field
/// is read, and only a plain model name (letters, digits, `.`, `_`, `:`, `/`, `-`; at most
/// 128 bytes) is returned, so no other text of the request can reach a span.
pub fn requested_model(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        model: Option<String>,
    }
    let model = serde_json::from_slice::<Named>(body).ok()?.model?;
    plain_model_name(&model).then_some(model)
}

/// Whether `model` is a plain model name a span may carry (see [`requested_model`]).
pub fn plain_model_name(model: &str) -> bool {
    !model.is_empty()
        && model.len() <= 128
        && model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".:_/-".contains(&b))
}

pub use protobot_usage::tokens::{TokenCounts, TokenKind};

/// What one model answer reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Metered {
    /// The answer carried usage.
    Reported {
        /// The model the answer names, if it names one.
        model: Option<String>,
        /// The tokens it reported.
        tokens: TokenCounts,
    },
    /// The answer carried no usage the proxy can read (counted, not guessed).
    Absent {
        /// The model the answer names, if it names one.
        model: Option<String>,
    },
}

/// Reads the usage of one successful answer of `api`, streamed or not.
/// Never fails and never panics: anything unreadable is [`Metered::Absent`].
pub fn read_usage(api: ModelApi, content_type: Option<&str>, body: &[u8]) -> Metered {
    let streamed = content_type.is_some_and(|t| {
        t.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"))
    }) || looks_like_events(body);
    if streamed {
        read_stream(api, body)
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(answer) => read_answer(api, &answer),
            Err(_) => Metered::Absent { model: None },
        }
    }
}

/// Whether a body without a content type is a stream of events.
fn looks_like_events(body: &[u8]) -> bool {
    let start = body.trim_ascii_start();
    start.starts_with(b"data:") || start.starts_with(b"event:")
}

/// A non-streamed answer.
fn read_answer(api: ModelApi, answer: &Value) -> Metered {
    let model = model_of(answer);
    match answer.get("usage").and_then(|u| counts(api, u)) {
        Some(tokens) => Metered::Reported { model, tokens },
        None => Metered::Absent { model },
    }
}

/// A streamed answer: the events' `data:` payloads, in order.
fn read_stream(api: ModelApi, body: &[u8]) -> Metered {
    let mut model: Option<String> = None;
    let mut tokens: Option<TokenCounts> = None;
    for data in event_payloads(body) {
        if data.trim() == "[DONE]" {
            continue;
        }
        let Ok(event) = serde_json::from_str::<Value>(&data) else {
            continue;
        };
        match api {
            ModelApi::OpenAiChat => {
                if model.is_none() {
                    model = model_of(&event);
                }
                // The final chunk carries the whole call's usage.
                if let Some(found) = event.get("usage").and_then(|u| counts(api, u)) {
                    tokens = Some(found);
                }
            }
            ModelApi::OpenAiResponses => {
                let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
                if let Some(response) = event.get("response") {
                    if let Some(m) = model_of(response) {
                        model = Some(m);
                    }
                    let done = matches!(
                        kind,
                        "response.completed" | "response.incomplete" | "response.failed"
                    );
                    if done && let Some(found) = response.get("usage").and_then(|u| counts(api, u))
                    {
                        tokens = Some(found);
                    }
                }
            }
            ModelApi::AnthropicMessages => {
                let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "message_start" => {
                        if let Some(message) = event.get("message") {
                            if let Some(m) = model_of(message) {
                                model = Some(m);
                            }
                            if let Some(found) = message.get("usage").and_then(|u| counts(api, u)) {
                                tokens = Some(found);
                            }
                        }
                    }
                    // Cumulative: each delta's counts replace what came before;
                    // fields it does not carry keep message_start's value.
                    "message_delta" => {
                        if let Some(usage) = event.get("usage").filter(|u| u.is_object()) {
                            let mut merged = tokens.unwrap_or_default();
                            let field = |name: &str| usage.get(name).and_then(Value::as_u64);
                            if let Some(n) = field("output_tokens") {
                                merged.output = n;
                            }
                            if let Some(n) = field("input_tokens") {
                                merged.input = n;
                            }
                            if let Some(n) = field("cache_read_input_tokens") {
                                merged.cache_read = n;
                            }
                            if let Some(n) = field("cache_creation_input_tokens") {
                                merged.cache_write = n;
                            }
                            tokens = Some(merged);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    match tokens {
        Some(tokens) => Metered::Reported { model, tokens },
        None => Metered::Absent { model },
    }
}

/// The `data:` payload of each event (multi-line data joined with `\n`), per
/// the server-sent events format; lines end in `\n`, `\r\n` or `\r`.
fn event_payloads(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    let mut events = Vec::new();
    let mut data: Option<String> = None;
    for line in text.split(['\n', '\r']) {
        if line.is_empty() {
            if let Some(done) = data.take() {
                events.push(done);
            }
            continue;
        }
        let Some(rest) = line.strip_prefix("data:") else {
            continue;
        };
        let rest = rest.strip_prefix(' ').unwrap_or(rest);
        match &mut data {
            Some(d) => {
                d.push('\n');
                d.push_str(rest);
            }
            None => data = Some(rest.to_owned()),
        }
    }
    if let Some(done) = data {
        events.push(done);
    }
    events
}

fn model_of(value: &Value) -> Option<String> {
    value
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map(|m| m.chars().take(200).collect())
}

/// The normalized counts of one `usage` object, or `None` when it is not one
/// (null, or none of the dialect's fields).
fn counts(api: ModelApi, usage: &Value) -> Option<TokenCounts> {
    if !usage.is_object() {
        return None;
    }
    let n = |path: &[&str]| {
        let mut v = usage;
        for key in path {
            v = v.get(*key)?;
        }
        v.as_u64()
    };
    match api {
        // OpenAI reports cached tokens inside its input count; the two dialects differ only
        // in their field names.
        ModelApi::OpenAiChat => openai(
            &n,
            ["prompt_tokens", "prompt_tokens_details"],
            ["completion_tokens", "completion_tokens_details"],
        ),
        ModelApi::OpenAiResponses => openai(
            &n,
            ["input_tokens", "input_tokens_details"],
            ["output_tokens", "output_tokens_details"],
        ),
        ModelApi::AnthropicMessages => {
            let input = n(&["input_tokens"]);
            let output = n(&["output_tokens"]);
            if input.is_none() && output.is_none() {
                return None;
            }
            Some(TokenCounts {
                input: input.unwrap_or(0),
                output: output.unwrap_or(0),
                cache_read: n(&["cache_read_input_tokens"]).unwrap_or(0),
                cache_write: n(&["cache_creation_input_tokens"]).unwrap_or(0),
                reasoning: 0,
            })
        }
    }
}

/// An OpenAI-style usage object: `[input count, its details]` and `[output count, its
/// details]` name the fields; the details hold `cached_tokens` and `reasoning_tokens`.
fn openai(
    n: &dyn Fn(&[&str]) -> Option<u64>,
    [input, input_details]: [&str; 2],
    [output, output_details]: [&str; 2],
) -> Option<TokenCounts> {
    let (input_count, output_count) = (n(&[input]), n(&[output]));
    if input_count.is_none() && output_count.is_none() {
        return None;
    }
    let cached = n(&[input_details, "cached_tokens"]).unwrap_or(0);
    let input_count = input_count.unwrap_or(0);
    Some(TokenCounts {
        input: input_count.saturating_sub(cached),
        output: output_count.unwrap_or(0),
        cache_read: cached.min(input_count),
        cache_write: 0,
        reasoning: n(&[output_details, "reasoning_tokens"]).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reported(model: &str, tokens: TokenCounts) -> Metered {
        Metered::Reported {
            model: Some(model.to_owned()),
            tokens,
        }
    }

    #[test]
    fn a_model_call_span_carries_only_a_plain_model_name() {
        assert_eq!(
            requested_model(br#"{"model":"claude-sonnet-4.5","messages":[{"role":"user","content":"secret prompt"}]}"#),
            Some("claude-sonnet-4.5".to_owned())
        );
        assert_eq!(
            requested_model(br#"{"messages":[],"model":"openai/gpt-5:latest"}"#),
            Some("openai/gpt-5:latest".to_owned())
        );
        // Text smuggled into the model field, a missing field, or no JSON: nothing.
        assert_eq!(
            requested_model(br#"{"model":"ignore previous instructions"}"#),
            None
        );
        assert_eq!(requested_model(br#"{"messages":[]}"#), None);
        assert_eq!(requested_model(b"data: {}"), None);
        assert!(!plain_model_name(&"m".repeat(129)));
        assert_eq!(ModelApi::OpenAiResponses.gen_ai_system(), "openai");
        assert_eq!(ModelApi::AnthropicMessages.gen_ai_system(), "anthropic");
        assert_eq!(ModelApi::OpenAiChat.gen_ai_operation(), "chat");
    }

    #[test]
    fn paths_name_their_dialect() {
        assert_eq!(
            ModelApi::from_path("/v1/chat/completions"),
            Some(ModelApi::OpenAiChat)
        );
        assert_eq!(
            ModelApi::from_path("/openai/v1/responses/"),
            Some(ModelApi::OpenAiResponses)
        );
        assert_eq!(
            ModelApi::from_path("/v1/messages"),
            Some(ModelApi::AnthropicMessages)
        );
        assert_eq!(ModelApi::from_path("/v1/models"), None);
        assert_eq!(ModelApi::from_path("/v1/messages/count_tokens"), None);
    }

    #[test]
    fn openai_chat_not_streamed_moves_cached_tokens_out_of_input() {
        let body = br#"{"id":"x","model":"gpt-4o-2024-08-06","choices":[],
            "usage":{"prompt_tokens":1200,"completion_tokens":300,"total_tokens":1500,
            "prompt_tokens_details":{"cached_tokens":1000},
            "completion_tokens_details":{"reasoning_tokens":120}}}"#;
        assert_eq!(
            read_usage(ModelApi::OpenAiChat, Some("application/json"), body),
            reported(
                "gpt-4o-2024-08-06",
                TokenCounts {
                    input: 200,
                    output: 300,
                    cache_read: 1000,
                    cache_write: 0,
                    reasoning: 120
                }
            )
        );
    }

    #[test]
    fn openai_chat_streamed_takes_the_final_chunk() {
        let body = b"data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
data: {\"model\":\"m1\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":7,\"total_tokens\":17}}\n\n\
data: [DONE]\n\n";
        assert_eq!(
            read_usage(ModelApi::OpenAiChat, Some("text/event-stream"), body),
            reported(
                "m1",
                TokenCounts {
                    input: 10,
                    output: 7,
                    ..TokenCounts::default()
                }
            )
        );
    }

    #[test]
    fn a_stream_without_usage_is_absent_not_guessed() {
        let body = b"data: {\"model\":\"m1\",\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(
            read_usage(ModelApi::OpenAiChat, Some("text/event-stream"), body),
            Metered::Absent {
                model: Some("m1".into())
            }
        );
        assert_eq!(
            read_usage(
                ModelApi::OpenAiChat,
                None,
                br#"{"model":"m2","choices":[]}"#
            ),
            Metered::Absent {
                model: Some("m2".into())
            }
        );
    }

    #[test]
    fn openai_responses_both_ways() {
        let answer = br#"{"object":"response","model":"o4-mini","usage":{"input_tokens":50,
            "input_tokens_details":{"cached_tokens":20},"output_tokens":40,
            "output_tokens_details":{"reasoning_tokens":30},"total_tokens":90}}"#;
        let expected = reported(
            "o4-mini",
            TokenCounts {
                input: 30,
                output: 40,
                cache_read: 20,
                cache_write: 0,
                reasoning: 30,
            },
        );
        assert_eq!(
            read_usage(ModelApi::OpenAiResponses, Some("application/json"), answer),
            expected
        );
        let stream = format!(
            "event: response.created\ndata: {{\"type\":\"response.created\",\"response\":{{\"model\":\"o4-mini\",\"usage\":null}}}}\n\n\
event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"delta\":\"x\"}}\n\n\
event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{}}}\n\n",
            std::str::from_utf8(answer).unwrap().replace('\n', " ")
        );
        assert_eq!(
            read_usage(ModelApi::OpenAiResponses, None, stream.as_bytes()),
            expected
        );
    }

    #[test]
    fn anthropic_not_streamed_keeps_cache_beside_input() {
        let body = br#"{"type":"message","model":"claude-sonnet-4-5","content":[],
            "usage":{"input_tokens":12,"output_tokens":34,"cache_creation_input_tokens":500,
            "cache_read_input_tokens":4000}}"#;
        assert_eq!(
            read_usage(ModelApi::AnthropicMessages, Some("application/json"), body),
            reported(
                "claude-sonnet-4-5",
                TokenCounts {
                    input: 12,
                    output: 34,
                    cache_read: 4000,
                    cache_write: 500,
                    reasoning: 0
                }
            )
        );
    }

    #[test]
    fn anthropic_streamed_adds_the_cumulative_delta_to_message_start() {
        let body = b"event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"claude-haiku\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1,\"cache_read_input_tokens\":100}}}\r\n\r\n\
event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"a\"}}\r\n\r\n\
event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":9}}\r\n\r\n\
event: message_delta\r\ndata: {\"type\":\"message_delta\",\"delta\":{},\"usage\":{\"output_tokens\":15}}\r\n\r\n\
event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";
        assert_eq!(
            read_usage(
                ModelApi::AnthropicMessages,
                Some("text/event-stream; charset=utf-8"),
                body
            ),
            reported(
                "claude-haiku",
                TokenCounts {
                    input: 25,
                    output: 15,
                    cache_read: 100,
                    cache_write: 0,
                    reasoning: 0
                }
            )
        );
    }

    #[test]
    fn hostile_counts_do_not_wrap() {
        let body = br#"{"usage":{"prompt_tokens":5,"completion_tokens":18446744073709551615,
            "prompt_tokens_details":{"cached_tokens":99}}}"#;
        let Metered::Reported { tokens, model } = read_usage(ModelApi::OpenAiChat, None, body)
        else {
            panic!("usage expected")
        };
        assert_eq!(model, None);
        assert_eq!((tokens.input, tokens.cache_read), (0, 5));
        let mut sum = tokens;
        sum.add(&tokens);
        assert_eq!(sum.output, u64::MAX);
        assert_eq!(sum.total(), u64::MAX);
    }

    #[test]
    fn garbage_is_absent() {
        for body in [
            &b""[..],
            b"not json",
            b"data: {",
            b"{\"usage\": 7}",
            b"{\"usage\": {\"prompt_tokens\": -1}}",
            b"[1,2,3]",
        ] {
            for api in [
                ModelApi::OpenAiChat,
                ModelApi::OpenAiResponses,
                ModelApi::AnthropicMessages,
            ] {
                assert!(
                    matches!(read_usage(api, None, body), Metered::Absent { .. }),
                    "{api:?} {body:?}"
                );
            }
        }
    }
}
