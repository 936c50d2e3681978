//! The OpenAI Responses API: `POST {base_url}/responses`.
//!
//! Stateless on purpose: every turn sends the whole conversation, and the
//! model's own output items (reasoning, function calls, messages) go back
//! verbatim and in order. That needs no `previous_response_id`, works with
//! `store: false` accounts, and lets a job resume on any orchestrator from the
//! items in Redis.

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

/// A model behind the OpenAI Responses API (or a server that speaks it).
pub(crate) struct OpenAiResponses {
    wire: http::Wire,
    base_url: String,
}

impl OpenAiResponses {
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
impl fmt::Debug for OpenAiResponses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiResponses")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl Provider for OpenAiResponses {
    fn turn<'a>(&'a self, request: TurnRequest<'a>) -> BoxFuture<'a, Result<Turn, ModelError>> {
        let span = tracing::debug_span!(
            "model_turn",
            api = "responses",
            model = request.model,
            turn = request.turn
        );
        async move {
            let url = http::endpoint(&self.base_url, "responses");
            let mut body = request_body(&request);
            let response = match request.deltas {
                Some(deltas) => {
                    body["stream"] = json!(true);
                    let mut reader = stream::Reader::default();
                    http::post_sse(&self.wire, &url, &body, &mut reader, deltas).await?
                }
                None => http::post_json(&self.wire, &url, &body).await?,
            };
            parse_response(&response)
        }
        .instrument(span)
        .boxed()
    }
}

fn request_body(request: &TurnRequest<'_>) -> Value {
    let input: Vec<Value> = request.items.iter().map(input_item).collect();
    let mut body = json!({"model": request.model, "input": input});
    // Instructions are not carried over between responses: resend each turn.
    if !request.instructions.is_empty() {
        body["instructions"] = json!(request.instructions);
    }
    // `parallel_tool_calls` means nothing without tools, and some compatible
    // servers reject it there.
    if !request.tools.is_empty() {
        body["tools"] = request.tools.iter().map(function_tool).collect();
        body["parallel_tool_calls"] = json!(request.parallel_tool_calls);
    }
    if let Some(max_tokens) = request.max_tokens {
        body["max_output_tokens"] = json!(max_tokens);
    }
    body
}

/// The flat Responses form; `strict` and `parameters` are required by the
/// spec, and `strict` is never left to the (auto-normalising) default.
fn function_tool(tool: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": tool.strict,
    })
}

fn input_item(item: &Item) -> Value {
    match item {
        Item::User { text } => json!({"type": "message", "role": "user", "content": text}),
        // The model's own items go back untouched: reasoning items must stay
        // next to the calls they produced, and ids must match.
        Item::Assistant { raw: Some(raw), .. }
        | Item::ToolCall { raw: Some(raw), .. }
        | Item::Reasoning { raw } => raw.clone(),
        // Items from another provider (or a script) have no raw form.
        Item::Assistant { text, raw: None } => {
            json!({"type": "message", "role": "assistant", "content": text})
        }
        Item::ToolCall {
            call_id,
            name,
            arguments,
            raw: None,
        } => json!({
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
        }),
        Item::ToolResult {
            call_id, output, ..
        } => json!({"type": "function_call_output", "call_id": call_id, "output": output}),
    }
}

pub(crate) fn parse_response(response: &Value) -> Result<Turn, ModelError> {
    if let Some(error) = response.get("error").filter(|error| !error.is_null()) {
        return Err(http::in_band_error(error));
    }
    let status = response.get("status").and_then(Value::as_str);
    match status {
        // Compatible servers may leave `status` out of a finished response.
        None | Some("completed" | "incomplete") => {}
        Some("failed") => {
            return Err(ModelError::InvalidResponse(
                "response failed without an error".into(),
            ));
        }
        // queued / in_progress / cancelled: we never ask for background runs.
        Some(other) => {
            return Err(ModelError::InvalidResponse(format!(
                "unexpected response status {other:?}"
            )));
        }
    }
    let output = response
        .get("output")
        .and_then(Value::as_array)
        .ok_or_else(|| ModelError::InvalidResponse("response has no output array".into()))?;

    let mut items = Vec::with_capacity(output.len());
    for item in output {
        match item.get("type").and_then(Value::as_str) {
            Some("reasoning") => items.push(Item::Reasoning { raw: item.clone() }),
            Some("function_call") => items.push(function_call(item)?),
            Some("message") => items.push(Item::Assistant {
                text: message_text(item),
                raw: Some(item.clone()),
            }),
            other => tracing::debug!(item_type = other, "ignoring output item"),
        }
    }
    let turn = Turn {
        items,
        usage: super::openai_usage(response),
        // Responses have no finish reason: why one is incomplete, else
        // its status.
        answered: Answered::read(response, &["/incomplete_details/reason", "/status"]),
    };

    if status == Some("incomplete") {
        let reason = response
            .pointer("/incomplete_details/reason")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        // A call cut off by the token limit may look whole but mean
        // something else: never dispatch it.
        if turn.tool_calls().next().is_some() {
            return Err(ModelError::InvalidResponse(format!(
                "response incomplete ({reason}) with tool calls that may be truncated"
            )));
        }
        if turn.text().is_empty() {
            return Err(ModelError::InvalidResponse(format!(
                "response incomplete ({reason}) with no output"
            )));
        }
        tracing::warn!(reason, "response incomplete, using the partial text");
    }
    Ok(turn)
}

fn function_call(item: &Value) -> Result<Item, ModelError> {
    let field = |name: &str| {
        item.get(name)
            .and_then(Value::as_str)
            .filter(|value| !value.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| ModelError::InvalidResponse(format!("function_call without {name}")))
    };
    let call_id = field("call_id")?;
    let name = field("name")?;
    let (arguments, raw) = match item.get("arguments") {
        Some(Value::String(arguments)) => (arguments.clone(), item.clone()),
        // Some compatible servers send the arguments as an object (or not at
        // all). OpenAI and vLLM only accept a string back, so the raw item is
        // fixed up too.
        other => {
            let arguments = match other {
                None | Some(Value::Null) => "{}".to_owned(),
                Some(value) => value.to_string(),
            };
            let mut raw = item.clone();
            raw["arguments"] = json!(arguments);
            (arguments, raw)
        }
    };
    Ok(Item::ToolCall {
        call_id,
        name,
        arguments,
        raw: Some(raw),
    })
}

/// The `output_text` parts joined, as the SDKs' `output_text` does; a refusal
/// part contributes its text so the user learns why nothing happened.
fn message_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| match part.get("type").and_then(Value::as_str) {
                Some("output_text") => part.get("text").and_then(Value::as_str),
                Some("refusal") => part.get("refusal").and_then(Value::as_str),
                _ => None,
            })
            .collect(),
        _ => String::new(),
    }
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

    fn weather_tool() -> ToolSpec {
        ToolSpec {
            name: "get_weather".into(),
            description: "Current weather for a city.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": false,
            }),
            strict: true,
        }
    }

    fn response(output: Value) -> Value {
        json!({
            "id": "resp_1", "object": "response", "created_at": 1_760_000_000,
            "status": "completed", "error": null, "incomplete_details": null,
            "model": "gpt-test", "output": output,
        })
    }

    fn final_message(text: &str) -> Value {
        json!({
            "type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        })
    }

    /// A turn of the tool-loop test.
    fn request<'a>(items: &'a [Item], tools: &'a [ToolSpec], turn: u32) -> TurnRequest<'a> {
        TurnRequest {
            model: "gpt-test",
            instructions: "Answer briefly.",
            items,
            tools,
            parallel_tool_calls: false,
            turn,
            max_tokens: None,
            deltas: None,
        }
    }

    #[tokio::test]
    async fn tool_loop_passes_reasoning_and_calls_back_verbatim() {
        let reasoning = json!({
            "type": "reasoning", "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Need the weather."}],
            "encrypted_content": "gAAAAABopaque==",
        });
        let call = json!({
            "type": "function_call", "id": "fc_1", "call_id": "call_abc",
            "name": "get_weather", "arguments": "{\"city\":\"Paris\"}", "status": "completed",
        });
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/responses"))
            .and(header("authorization", "Bearer sk-test"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(response(json!([reasoning.clone(), call.clone()]))),
            )
            .up_to_n_times(1)
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/v1/responses"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_body_json(response(json!([final_message("It is 21°C in Paris.")]))),
            )
            .expect(1)
            .mount(&server)
            .await;
        let provider = OpenAiResponses::new(&options(&server)).unwrap();
        let tools = [weather_tool()];
        let mut items = vec![Item::User {
            text: "Weather in Paris?".into(),
        }];

        let first = provider.turn(request(&items, &tools, 0)).await.unwrap();
        assert_eq!(
            first.items,
            [
                Item::Reasoning {
                    raw: reasoning.clone()
                },
                Item::ToolCall {
                    call_id: "call_abc".into(),
                    name: "get_weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into(),
                    raw: Some(call.clone()),
                },
            ]
        );
        items.extend(first.items);
        let output = r#"{"ok":true,"data":{"temp_c":21}}"#;
        items.push(Item::ToolResult {
            call_id: "call_abc".into(),
            name: "get_weather".into(),
            output: output.into(),
            attempts: 1,
        });

        let second = provider.turn(request(&items, &tools, 1)).await.unwrap();
        assert_eq!(second.text(), "It is 21°C in Paris.");
        assert_eq!(second.tool_calls().count(), 0);

        let bodies = request_bodies(&server, RequestKind::Responses).await;
        assert_eq!(bodies.len(), 2);
        let user = json!({"type": "message", "role": "user", "content": "Weather in Paris?"});
        assert_eq!(bodies[0]["input"], json!([user]));
        assert_eq!(
            bodies[1]["input"],
            json!([
                user,
                reasoning,
                call,
                {"type": "function_call_output", "call_id": "call_abc", "output": output},
            ]),
            "reasoning and call go back unchanged, in order, before the output"
        );
        for body in &bodies {
            assert_eq!(body["model"], "gpt-test");
            assert_eq!(body["instructions"], "Answer briefly.");
            assert_eq!(
                body["tools"],
                json!([{
                    "type": "function", "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters": weather_tool().parameters, "strict": true,
                }])
            );
            assert_eq!(body["parallel_tool_calls"], false);
            assert!(body.get("store").is_none() && body.get("previous_response_id").is_none());
        }
    }

    #[tokio::test]
    async fn retries_transient_failures_and_rejects_final_ones() {
        let items = [Item::User { text: "Hi".into() }];
        let request = TurnRequest {
            model: "gpt-test",
            instructions: "",
            items: &items,
            tools: &[],
            parallel_tool_calls: true,
            turn: 0,
            max_tokens: None,
            deltas: None,
        };
        check_error_policy(
            |options| OpenAiResponses::new(&options).unwrap(),
            "/v1/responses",
            RequestKind::Responses,
            request,
            response(json!([final_message("Hello.")])),
        )
        .await;
    }

    #[test]
    fn request_without_tools_or_instructions_leaves_them_out() {
        let items = [
            Item::User { text: "Hi".into() },
            // History from another provider: no raw items to echo.
            Item::Assistant {
                text: "Let me look.".into(),
                raw: None,
            },
            Item::ToolCall {
                call_id: "call_0_0".into(),
                name: "get_weather".into(),
                arguments: "{}".into(),
                raw: None,
            },
            Item::ToolResult {
                call_id: "call_0_0".into(),
                name: "get_weather".into(),
                output: "{\"ok\":true}".into(),
                attempts: 0,
            },
        ];
        let body = request_body(&TurnRequest {
            model: "gpt-test",
            instructions: "",
            items: &items,
            tools: &[],
            parallel_tool_calls: true,
            turn: 1,
            max_tokens: None,
            deltas: None,
        });
        assert_valid_request(RequestKind::Responses, &body);
        assert_eq!(
            body,
            json!({
                "model": "gpt-test",
                "input": [
                    {"type": "message", "role": "user", "content": "Hi"},
                    {"type": "message", "role": "assistant", "content": "Let me look."},
                    {"type": "function_call", "call_id": "call_0_0", "name": "get_weather", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "call_0_0", "output": "{\"ok\":true}"},
                ],
            })
        );
    }

    #[test]
    fn parsing_tolerates_deviations_and_refuses_unusable_output() {
        // Object arguments (compatible servers), a refusal, an unknown item.
        let turn = parse_response(&json!({
            "output": [
                {"type": "web_search_call", "id": "ws_1"},
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": {"a": 1}},
                {"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": "Partly ", "annotations": [], "logprobs": []},
                    {"type": "refusal", "refusal": "no."},
                ]},
            ],
        }))
        .unwrap();
        let [call, message] = turn.items.as_slice() else {
            panic!("two items expected: {turn:?}")
        };
        let Item::ToolCall {
            arguments,
            raw: Some(raw),
            ..
        } = call
        else {
            panic!("{call:?}")
        };
        assert_eq!(arguments, r#"{"a":1}"#);
        assert_eq!(raw["arguments"], r#"{"a":1}"#, "echoed back as a string");
        assert!(matches!(message, Item::Assistant { text, .. } if text == "Partly no."));

        let incomplete = |output: Value| {
            parse_response(&json!({
                "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
                "output": output,
            }))
        };
        let partial = incomplete(json!([final_message("The answer is")])).unwrap();
        assert_eq!(partial.text(), "The answer is");
        for unusable in [
            json!([{"type": "reasoning", "id": "rs_1", "summary": []}]),
            json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{\"a\":"}]),
        ] {
            let err = incomplete(unusable).unwrap_err();
            assert!(
                matches!(&err, ModelError::InvalidResponse(m) if m.contains("max_output_tokens")),
                "{err:?}"
            );
        }

        let failed = parse_response(&json!({
            "status": "failed",
            "error": {"code": "invalid_prompt", "message": "flagged"},
            "output": [],
        }));
        assert!(
            matches!(&failed, Err(ModelError::Rejected { code: Some(c), .. }) if c == "invalid_prompt"),
            "{failed:?}"
        );
        let failed = parse_response(&json!({"status": "failed", "error": null, "output": []}));
        assert!(
            matches!(failed, Err(ModelError::InvalidResponse(_))),
            "{failed:?}"
        );
        let no_call_id = parse_response(&json!({
            "output": [{"type": "function_call", "name": "f", "arguments": "{}"}],
        }));
        assert!(
            matches!(no_call_id, Err(ModelError::InvalidResponse(_))),
            "{no_call_id:?}"
        );
        assert!(parse_response(&json!({"status": "completed"})).is_err());
    }

    /// `events` as server-sent events, each named by its `type`.
    fn sse(events: &[Value]) -> ResponseTemplate {
        let body: String = events
            .iter()
            .map(|event| {
                format!(
                    "event: {}\ndata: {event}\n\n",
                    event["type"].as_str().unwrap()
                )
            })
            .collect();
        ResponseTemplate::new(200)
            .insert_header("content-type", "text/event-stream")
            .set_body_string(body)
    }

    #[tokio::test]
    async fn a_streamed_response_is_read_from_its_last_event_and_its_deltas_spell_it() {
        let call = json!({
            "type": "function_call", "id": "fc_1", "call_id": "call_abc",
            "name": "get_weather", "arguments": "{\"city\":\"Paris\"}", "status": "completed",
        });
        let whole = response(json!([final_message("Hello"), call.clone()]));
        let events = [
            json!({"type": "response.created", "response": response(json!([]))}),
            json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}}),
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "Hel"}),
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "lo"}),
            json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "function_call", "id": "fc_1", "call_id": "call_abc", "name": "get_weather", "arguments": ""}}),
            json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 1, "delta": "{\"city\":"}),
            json!({"type": "response.completed", "response": whole}),
        ];
        let overloaded =
            json!({"type": "error", "code": "server_error", "message": "try again", "param": null});
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/responses"))
            .respond_with(sse(&[events[0].clone(), events[2].clone(), overloaded]))
            .up_to_n_times(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/v1/responses"))
            .respond_with(sse(&events))
            .mount(&server)
            .await;
        let provider = OpenAiResponses::new(&options(&server)).unwrap();
        let items = [Item::User { text: "hi".into() }];
        let seen = std::sync::Mutex::new(Vec::new());
        let sink = |delta: Delta| seen.lock().unwrap().push(delta);
        let mut turn_request = request(&items, &[], 0);
        turn_request.deltas = Some(&sink);
        let turn = provider.turn(turn_request).await.unwrap();
        assert_eq!(turn.text(), "Hello");
        assert_eq!(turn.tool_calls().count(), 1);
        // A response has no finish reason: its status stands for one.
        assert_eq!(
            turn.answered,
            Answered {
                model: Some("gpt-test".into()),
                id: Some("resp_1".into()),
                finish_reason: Some("completed".into()),
            }
        );
        let deltas = seen.into_inner().unwrap();
        assert_eq!(
            deltas,
            [
                Delta::Text("Hel".into()),
                Delta::Restart,
                Delta::Text("Hel".into()),
                Delta::Text("lo".into()),
                Delta::ToolCall {
                    index: 0,
                    name: "get_weather".into()
                },
            ],
            "the server_error broke the first attempt"
        );
        let bodies = request_bodies(&server, RequestKind::Responses).await;
        assert_eq!(bodies.len(), 2);
        assert_eq!(bodies[1]["stream"], true);
    }

    #[tokio::test]
    async fn a_key_the_server_echoes_never_comes_back() {
        use crate::model::http::testing::{
            KeyAnswers, check_the_key_never_comes_back, echoed_key_options,
        };
        fn stream(pieces: &[&str]) -> String {
            let mut events: Vec<Value> = pieces
                .iter()
                .map(|piece| {
                    json!({"type": "response.output_text.delta", "item_id": "msg_1",
                    "output_index": 0, "content_index": 0, "delta": piece})
                })
                .collect();
            let whole = response(json!([final_message(&pieces.concat())]));
            events.push(json!({"type": "response.completed", "response": whole}));
            events
                .iter()
                .map(|event| format!("data: {event}\n\n"))
                .collect()
        }
        let answers = KeyAnswers {
            path: "/v1/responses",
            text: |text| response(json!([final_message(text)])),
            in_band_error: |message| {
                let mut failed = response(json!([]));
                failed["status"] = json!("failed");
                failed["error"] = json!({"code": "invalid_api_key", "message": message});
                failed
            },
            stream,
            stream_error: |message| {
                let event = json!({"type": "error", "code": "invalid_prompt",
                    "message": message, "param": null});
                format!("data: {event}\n\n")
            },
        };
        let items = [Item::User { text: "hi".into() }];
        check_the_key_never_comes_back(
            |uri| OpenAiResponses::new(&echoed_key_options(&uri)).unwrap(),
            &answers,
            request(&items, &[], 0),
        )
        .await;
    }
}
