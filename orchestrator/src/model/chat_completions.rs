//! OpenAI Chat Completions: `POST {base_url}/chat/completions`.
//!
//! The lingua franca of vLLM, Ollama, llama.cpp server and most gateways, so
//! parsing is lenient where those servers are known to deviate (arguments as
//! an object, missing call ids or types, content as parts), while requests
//! stay strictly in OpenAI's shape, which they all accept.
//!
//! Chat Completions has no reasoning item to hand back: [`Item::Reasoning`]
//! entries are left out of the request.

use std::fmt;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use tracing::Instrument;

use super::{
    Answered, BuildError, ModelError, OpenAiOptions, Provider, ToolSpec, Turn, TurnRequest, http,
};
use crate::job::Item;

mod stream;

/// A model behind an OpenAI-compatible Chat Completions endpoint.
pub(crate) struct ChatCompletions {
    wire: http::Wire,
    base_url: String,
}

impl ChatCompletions {
    /// A provider with its own connection pool and the options' timeout and
    /// retry policy.
    ///
    /// # Errors
    ///
    /// When the key file cannot be read or the HTTP client cannot be
    /// built (the TLS backend failed to load).
    pub(crate) fn new(options: &OpenAiOptions) -> Result<Self, BuildError> {
        Ok(Self {
            wire: options.wire(&[])?,
            base_url: options.base_url.clone(),
        })
    }
}

// By hand, so the API key never reaches a log line.
impl fmt::Debug for ChatCompletions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatCompletions")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl Provider for ChatCompletions {
    fn turn<'a>(&'a self, request: TurnRequest<'a>) -> BoxFuture<'a, Result<Turn, ModelError>> {
        let span = tracing::debug_span!(
            "model_turn",
            api = "chat_completions",
            model = request.model,
            turn = request.turn
        );
        async move {
            let url = http::endpoint(&self.base_url, "chat/completions");
            let mut body = request_body(&request);
            let response = match request.deltas {
                Some(deltas) => {
                    body["stream"] = json!(true);
                    // Without it OpenAI sends no usage in a stream.
                    body["stream_options"] = json!({"include_usage": true});
                    let mut reader = stream::Reader::default();
                    http::post_sse(&self.wire, &url, &body, &mut reader, deltas).await?
                }
                None => http::post_json(&self.wire, &url, &body).await?,
            };
            parse_response(&response, request.turn)
        }
        .instrument(span)
        .boxed()
    }
}

fn request_body(request: &TurnRequest<'_>) -> Value {
    let mut body = json!({"model": request.model, "messages": messages(request)});
    // `parallel_tool_calls` without tools is rejected by OpenAI.
    if !request.tools.is_empty() {
        body["tools"] = request.tools.iter().map(function_tool).collect();
        body["parallel_tool_calls"] = json!(request.parallel_tool_calls);
    }
    // OpenAI's current name; vLLM and llama.cpp server read it too.
    if let Some(max_tokens) = request.max_tokens {
        body["max_completion_tokens"] = json!(max_tokens);
    }
    body
}

/// `strict` is always sent: Chat Completions defaults to non-strict.
fn function_tool(tool: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "strict": tool.strict,
        },
    })
}

fn messages(request: &TurnRequest<'_>) -> Vec<Value> {
    let mut messages = Vec::with_capacity(request.items.len() + 1);
    if !request.instructions.is_empty() {
        messages.push(json!({"role": "system", "content": request.instructions}));
    }
    // One assistant message carries a turn's text and its calls, so text is
    // held back until we know whether calls follow.
    let mut assistant: Option<AssistantMessage<'_>> = None;
    for item in request.items {
        let message = match item {
            Item::ToolCall {
                call_id,
                name,
                arguments,
                ..
            } => {
                assistant
                    .get_or_insert_with(AssistantMessage::default)
                    .tool_calls
                    .push(json!({
                        "id": call_id,
                        // llama.cpp answers a history call without a type with 500.
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }));
                continue;
            }
            // Nothing to send, and skipping it keeps a message's text
            // grouped with the calls that follow.
            Item::Reasoning { .. } => continue,
            Item::Assistant { text, .. } => {
                messages.extend(assistant.take().and_then(AssistantMessage::into_message));
                assistant = Some(AssistantMessage {
                    content: Some(text.as_str()).filter(|text| !text.is_empty()),
                    tool_calls: Vec::new(),
                });
                continue;
            }
            Item::User { text } => json!({"role": "user", "content": text}),
            Item::ToolResult {
                call_id, output, ..
            } => json!({"role": "tool", "tool_call_id": call_id, "content": output}),
        };
        messages.extend(assistant.take().and_then(AssistantMessage::into_message));
        messages.push(message);
    }
    messages.extend(assistant.and_then(AssistantMessage::into_message));
    messages
}

#[derive(Default)]
struct AssistantMessage<'a> {
    content: Option<&'a str>,
    tool_calls: Vec<Value>,
}

impl AssistantMessage<'_> {
    /// `None` when there is nothing to say: OpenAI rejects an assistant
    /// message with neither content nor calls.
    fn into_message(self) -> Option<Value> {
        match (self.content, self.tool_calls.is_empty()) {
            (None, true) => None,
            (content, true) => Some(json!({"role": "assistant", "content": content})),
            (content, false) => Some(json!({
                "role": "assistant",
                "content": content,
                "tool_calls": self.tool_calls,
            })),
        }
    }
}

/// Reads `choices[0].message`. `finish_reason` decides nothing: OpenAI says
/// `stop` for a forced call, and SGLang for every call.
pub(crate) fn parse_response(response: &Value, turn: u32) -> Result<Turn, ModelError> {
    let Some(choice) = response
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|choices| choices.first())
    else {
        // Gateways report upstream failures as a 200 with an error body.
        if let Some(error) = response.get("error").filter(|error| !error.is_null()) {
            return Err(http::in_band_error(error));
        }
        return Err(ModelError::InvalidResponse(
            "response has no choices".into(),
        ));
    };
    let message = choice
        .get("message")
        .filter(|message| message.is_object())
        .ok_or_else(|| ModelError::InvalidResponse("choice has no message".into()))?;
    if choice.get("finish_reason").and_then(Value::as_str) == Some("length") {
        // Calls are still returned: the runner validates their arguments.
        tracing::warn!("model output truncated at the token limit");
    }

    let mut items = Vec::new();
    let text = match content_text(message.get("content")) {
        text if text.is_empty() => message
            .get("refusal")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        text => text,
    };
    if !text.is_empty() {
        items.push(Item::Assistant { text, raw: None });
    }
    match message.get("tool_calls") {
        Some(Value::Array(calls)) => {
            for (index, call) in calls.iter().enumerate() {
                if let Some(item) = tool_call(call, turn, index)? {
                    items.push(item);
                }
            }
        }
        None | Some(Value::Null) => {
            // The deprecated single `function_call` of older servers.
            if let Some(function) = message.get("function_call").filter(|f| f.is_object()) {
                items.push(function_item(function, synthetic_id(turn, 0))?);
            }
        }
        Some(_) => {
            return Err(ModelError::InvalidResponse(
                "tool_calls is not an array".into(),
            ));
        }
    }
    Ok(Turn {
        items,
        usage: super::openai_usage(response),
        answered: Answered::read(response, &["/choices/0/finish_reason"]),
    })
}

/// A string, or (some servers) an array of parts whose text is joined.
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|part| {
                part.get("type")
                    .and_then(Value::as_str)
                    .is_none_or(|kind| kind == "text" || kind == "output_text")
            })
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

fn tool_call(call: &Value, turn: u32, index: usize) -> Result<Option<Item>, ModelError> {
    // A missing type means function (Ollama, llama.cpp); a custom tool call
    // answers no tool we declared.
    match call.get("type").and_then(Value::as_str) {
        None | Some("function") => {}
        Some(other) => {
            tracing::debug!(call_type = other, "ignoring non-function tool call");
            return Ok(None);
        }
    }
    let function = call
        .get("function")
        .ok_or_else(|| ModelError::InvalidResponse("tool call without function".into()))?;
    // Ollama's native calls carry no id; the synthetic one is deterministic,
    // so a replayed turn names its calls the same way.
    let call_id = call
        .get("id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map_or_else(|| synthetic_id(turn, index), str::to_owned);
    function_item(function, call_id).map(Some)
}

/// `call_<turn>_<index>`, as the scripted model names its calls.
fn synthetic_id(turn: u32, index: usize) -> String {
    format!("call_{turn}_{index}")
}

fn function_item(function: &Value, call_id: String) -> Result<Item, ModelError> {
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .filter(|name| !name.is_empty())
        .ok_or_else(|| ModelError::InvalidResponse("tool call without a name".into()))?
        .to_owned();
    let arguments = match function.get("arguments") {
        Some(Value::String(arguments)) => arguments.clone(),
        // llama.cpp and Ollama builds have sent an object; OpenAI and vLLM
        // want a string back in the history.
        None | Some(Value::Null) => "{}".to_owned(),
        Some(value) => value.to_string(),
    };
    Ok(Item::ToolCall {
        call_id,
        name,
        arguments,
        raw: None,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use super::*;
    use crate::model::Delta;
    use crate::model::http::testing::{
        RequestKind, assert_valid_request, check_error_policy, options, request_bodies,
    };

    fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: format!("Does {name}."),
            parameters: json!({
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": false,
            }),
            strict: true,
        }
    }

    fn completion(message: Value, finish_reason: &str) -> Value {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1_760_000_000,
            "model": "gpt-test",
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": null}],
        })
    }

    /// A turn of the tool-loop test.
    fn request<'a>(items: &'a [Item], tools: &'a [ToolSpec], turn: u32) -> TurnRequest<'a> {
        TurnRequest {
            model: "gpt-test",
            instructions: "Answer briefly.",
            items,
            tools,
            parallel_tool_calls: true,
            turn,
            max_tokens: None,
            deltas: None,
        }
    }

    /// Mounts a llama.cpp/Ollama-style tool turn on `server`, then a final
    /// answer in two text parts.
    async fn mount_a_deviant_tool_turn_then_an_answer(server: &MockServer) {
        // A llama.cpp/Ollama-style answer: content null, the second call with
        // no id, no type and object arguments.
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .and(header("authorization", "Bearer sk-test"))
            .respond_with(ResponseTemplate::new(200).set_body_json(completion(
                json!({
                    "role": "assistant", "content": null, "refusal": null,
                    "tool_calls": [
                        {"id": "call_abc", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                        {"function": {"name": "get_time", "arguments": {"city": "Paris"}}},
                    ],
                }),
                // Forced calls report `stop`; it must not matter.
                "stop",
            )))
            .up_to_n_times(1)
            .expect(1)
            .mount(server)
            .await;
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .respond_with(ResponseTemplate::new(200).set_body_json(completion(
                json!({"role": "assistant", "content": [
                    {"type": "text", "text": "21°C in Paris, "},
                    {"type": "text", "text": "at 14:00."},
                ]}),
                "stop",
            )))
            .expect(1)
            .mount(server)
            .await;
    }

    /// The workers' answers to the two calls of the first turn.
    fn answer_the_calls(items: &mut Vec<Item>) {
        for (call_id, name, output) in [
            (
                "call_abc",
                "get_weather",
                r#"{"ok":true,"data":{"temp_c":21}}"#,
            ),
            ("call_3_1", "get_time", r#"{"ok":true,"data":"14:00"}"#),
        ] {
            items.push(Item::ToolResult {
                call_id: call_id.into(),
                name: name.into(),
                output: output.into(),
                attempts: 1,
            });
        }
    }

    /// The second request carried the calls back as the wire wants them
    /// (ids, string arguments, one tool message per result), and every
    /// request the model, the tools and `parallel_tool_calls`.
    fn assert_the_calls_went_back(bodies: &[Value]) {
        let system = json!({"role": "system", "content": "Answer briefly."});
        let user = json!({"role": "user", "content": "Weather and time in Paris?"});
        assert_eq!(bodies[0]["messages"], json!([system, user]));
        assert_eq!(
            bodies[1]["messages"],
            json!([
                system,
                user,
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_abc", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "call_3_1", "type": "function",
                     "function": {"name": "get_time", "arguments": "{\"city\":\"Paris\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_abc", "content": r#"{"ok":true,"data":{"temp_c":21}}"#},
                {"role": "tool", "tool_call_id": "call_3_1", "content": r#"{"ok":true,"data":"14:00"}"#},
            ])
        );
        for body in bodies {
            assert_eq!(body["model"], "gpt-test");
            assert_eq!(body["tools"][0]["function"]["name"], "get_weather");
            assert_eq!(body["tools"][1]["function"]["strict"], true);
            assert_eq!(body["parallel_tool_calls"], true);
        }
    }

    /// A tool turn with null content, a call without id or type and object
    /// arguments, finished by `stop`, reads as two calls (the missing id from
    /// turn and index); the answer in text parts reads as one text; the calls
    /// and results go back in the wire format.
    #[tokio::test]
    async fn tool_loop_tolerates_server_deviations_and_sends_calls_back() {
        let server = MockServer::start().await;
        mount_a_deviant_tool_turn_then_an_answer(&server).await;
        let provider = ChatCompletions::new(&options(&server)).unwrap();
        let tools = [tool("get_weather"), tool("get_time")];
        let mut items = vec![Item::User {
            text: "Weather and time in Paris?".into(),
        }];

        let first = provider.turn(request(&items, &tools, 3)).await.unwrap();
        assert_eq!(
            first.items,
            [
                Item::ToolCall {
                    call_id: "call_abc".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into(),
                    raw: None,
                },
                Item::ToolCall {
                    call_id: "call_3_1".into(),
                    name: "get_time".into(),
                    arguments: r#"{"city":"Paris"}"#.into(),
                    raw: None,
                },
            ],
            "no text item for null content; the missing id comes from turn and index"
        );
        items.extend(first.items);
        answer_the_calls(&mut items);

        let second = provider.turn(request(&items, &tools, 4)).await.unwrap();
        assert_eq!(second.text(), "21°C in Paris, at 14:00.");
        assert_eq!(second.tool_calls().count(), 0);

        let bodies = request_bodies(&server, RequestKind::ChatCompletions).await;
        assert_eq!(bodies.len(), 2);
        assert_the_calls_went_back(&bodies);
    }

    #[tokio::test]
    async fn retries_transient_failures_and_rejects_final_ones() {
        let items = [Item::User { text: "Hi".into() }];
        let request = TurnRequest {
            model: "gpt-test",
            instructions: "Be kind.",
            items: &items,
            tools: &[],
            parallel_tool_calls: true,
            turn: 0,
            max_tokens: None,
            deltas: None,
        };
        check_error_policy(
            |options| ChatCompletions::new(&options).unwrap(),
            "/v1/chat/completions",
            RequestKind::ChatCompletions,
            request,
            completion(json!({"role": "assistant", "content": "Hello."}), "stop"),
        )
        .await;
    }

    #[test]
    fn history_groups_text_with_its_calls_and_skips_reasoning() {
        let call = |id: &str| Item::ToolCall {
            call_id: id.into(),
            name: "get_weather".into(),
            arguments: "{}".into(),
            raw: Some(json!({"type": "function_call"})),
        };
        let result = |id: &str| Item::ToolResult {
            call_id: id.into(),
            name: "get_weather".into(),
            output: "ok".into(),
            attempts: 1,
        };
        let items = [
            Item::User { text: "Go".into() },
            Item::Reasoning {
                raw: json!({"type": "reasoning"}),
            },
            Item::Assistant {
                text: "Checking.".into(),
                raw: None,
            },
            Item::Reasoning {
                raw: json!({"type": "reasoning"}),
            },
            call("c1"),
            call("c2"),
            result("c1"),
            result("c2"),
            call("c3"),
            result("c3"),
            // Empty text alone says nothing and is dropped.
            Item::Assistant {
                text: String::new(),
                raw: None,
            },
            Item::Assistant {
                text: "Done.".into(),
                raw: None,
            },
        ];
        let body = request_body(&TurnRequest {
            model: "m",
            instructions: "",
            items: &items,
            tools: &[],
            parallel_tool_calls: false,
            turn: 2,
            max_tokens: None,
            deltas: None,
        });
        assert_valid_request(RequestKind::ChatCompletions, &body);
        let wire_call = |id: &str| json!({"id": id, "type": "function", "function": {"name": "get_weather", "arguments": "{}"}});
        let wire_result = |id: &str| json!({"role": "tool", "tool_call_id": id, "content": "ok"});
        assert_eq!(
            body,
            json!({"model": "m", "messages": [
                {"role": "user", "content": "Go"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [wire_call("c1"), wire_call("c2")]},
                wire_result("c1"),
                wire_result("c2"),
                {"role": "assistant", "content": null, "tool_calls": [wire_call("c3")]},
                wire_result("c3"),
                {"role": "assistant", "content": "Done."},
            ]}),
            "no system message, tools or parallel_tool_calls when empty"
        );
    }

    #[test]
    fn parsing_handles_legacy_calls_refusals_and_errors() {
        let legacy = parse_response(
            &completion(
                json!({"role": "assistant", "content": "Sure.",
                       "function_call": {"name": "get_weather", "arguments": "{}"}}),
                "function_call",
            ),
            7,
        )
        .unwrap();
        assert_eq!(legacy.text(), "Sure.");
        assert!(matches!(
            legacy.tool_calls().next(),
            Some(Item::ToolCall { call_id, .. }) if call_id == "call_7_0"
        ));

        let refusal = parse_response(
            &completion(
                json!({"role": "assistant", "content": null, "refusal": "I can't help with that."}),
                "stop",
            ),
            0,
        )
        .unwrap();
        assert_eq!(refusal.text(), "I can't help with that.");

        let custom = parse_response(
            &completion(
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c", "type": "custom", "custom": {"name": "x", "input": "y"}}]}),
                "tool_calls",
            ),
            0,
        )
        .unwrap();
        assert!(custom.items.is_empty(), "{custom:?}");

        let gateway = parse_response(
            &json!({"error": {"message": "upstream timed out", "code": 504}}),
            0,
        );
        assert!(
            matches!(gateway, Err(ModelError::Unavailable(_))),
            "{gateway:?}"
        );
        for broken in [
            json!({"choices": []}),
            json!({"choices": [{"index": 0}]}),
            completion(
                json!({"tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]}),
                "stop",
            ),
            completion(json!({"tool_calls": {"id": "c"}}), "stop"),
        ] {
            let err = parse_response(&broken, 0).unwrap_err();
            assert!(matches!(err, ModelError::InvalidResponse(_)), "{err:?}");
        }
    }

    #[tokio::test]
    async fn a_streamed_completion_is_put_together_from_its_chunks() {
        let chunk = |delta: Value, finish: Value| {
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let chunks = [
            chunk(json!({"role": "assistant", "content": "Let "}), Value::Null),
            chunk(json!({"content": "me see."}), Value::Null),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                "function": {"name": "get_weather", "arguments": ""}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":"}}]}),
                Value::Null,
            ),
            // Interleaved, and the name repeated as vLLM has done.
            chunk(
                json!({"tool_calls": [{"index": 0,
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 1, "function": {"arguments": "\"Rome\"}"}}]}),
                Value::Null,
            ),
            chunk(json!({}), json!("tool_calls")),
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}),
        ];
        let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
        body.push_str("data: [DONE]\n\n");
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/chat/completions"))
            .respond_with(
                ResponseTemplate::new(200)
                    .insert_header("content-type", "text/event-stream")
                    .set_body_string(body),
            )
            .mount(&server)
            .await;
        let provider = ChatCompletions::new(&options(&server)).unwrap();
        let items = [Item::User {
            text: "weather?".into(),
        }];
        let tools = [tool("get_weather")];
        let seen = std::sync::Mutex::new(Vec::new());
        let sink = |delta: Delta| seen.lock().unwrap().push(delta);
        let mut turn_request = request(&items, &tools, 0);
        turn_request.deltas = Some(&sink);
        let turn = provider.turn(turn_request).await.unwrap();
        assert_eq!(turn.text(), "Let me see.");
        let calls: Vec<(String, String)> = turn
            .tool_calls()
            .map(|item| match item {
                Item::ToolCall {
                    call_id, arguments, ..
                } => (call_id.clone(), arguments.clone()),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            calls,
            [
                ("call_a".into(), r#"{"city":"Oslo"}"#.into()),
                ("call_b".into(), r#"{"city":"Rome"}"#.into())
            ]
        );
        assert_eq!(turn.usage.map(|u| u.output_tokens), Some(4));
        // What the turn's span says of it, as of a plain answer.
        assert_eq!(
            turn.answered,
            Answered {
                model: Some("m".into()),
                id: Some("c".into()),
                finish_reason: Some("tool_calls".into()),
            }
        );
        let deltas = seen.into_inner().unwrap();
        let named: Vec<&Delta> = deltas
            .iter()
            .filter(|d| matches!(d, Delta::ToolCall { .. }))
            .collect();
        assert_eq!(named.len(), 2, "each call named once: {deltas:?}");
        let sent = request_bodies(&server, RequestKind::ChatCompletions).await;
        assert_eq!(sent[0]["stream"], true);
        assert_eq!(sent[0]["stream_options"]["include_usage"], true);
    }

    #[tokio::test]
    async fn a_key_the_server_echoes_never_comes_back() {
        use crate::model::http::testing::{
            KeyAnswers, check_the_key_never_comes_back, echoed_key_options,
        };
        fn stream(pieces: &[&str]) -> String {
            let chunk = |delta: Value, finish: Value| {
                json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            };
            let mut chunks: Vec<Value> = pieces
                .iter()
                .map(|piece| chunk(json!({"content": piece}), Value::Null))
                .collect();
            chunks.push(chunk(json!({}), json!("stop")));
            let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
            body.push_str("data: [DONE]\n\n");
            body
        }
        let answers = KeyAnswers {
            path: "/v1/chat/completions",
            text: |text| completion(json!({"role": "assistant", "content": text}), "stop"),
            in_band_error: |message| json!({"error": {"message": message, "code": "invalid_api_key"}}),
            stream,
            stream_error: |message| {
                let chunk = json!({"error": {"message": message, "code": "bad_request"}});
                format!("data: {chunk}\n\n")
            },
        };
        let items = [Item::User { text: "hi".into() }];
        check_the_key_never_comes_back(
            |uri| ChatCompletions::new(&echoed_key_options(&uri)).unwrap(),
            &answers,
            request(&items, &[], 0),
        )
        .await;
    }
}
