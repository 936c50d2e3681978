//! Anthropic's Messages API: `POST {base_url}/messages`.
//!
//! Stateless like the OpenAI providers: every turn sends the whole
//! conversation. The job's items become alternating `user` and `assistant`
//! messages of content blocks: the model's `thinking` blocks, text and
//! `tool_use` blocks go back as it wrote them, and the envelopes answering
//! a turn's calls are `tool_result` blocks, first in the next user message
//! and in the order of their calls, with `is_error` set from the envelope.
//! A turn the API pauses (`pause_turn`) is continued in the same turn.

use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::de::MapAccess;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value, json};
use tracing::Instrument;

use super::options::{Api, HttpOptions, Section, read_section};
use super::{Answered, BuildError, ModelError, Provider, ToolSpec, Turn, TurnRequest, Usage, http};
use crate::job::Item;

mod stream;

/// The API version sent as `anthropic-version` by default: the one every
/// Messages feature used here is documented for.
pub(crate) const DEFAULT_VERSION: &str = "2023-06-01";

/// Continuations of one turn the API paused (`pause_turn`) before the turn
/// is given up as an invalid response.
const MAX_PAUSES: usize = 4;

/// Anthropic's Messages API: the `anthropic` section's defaults and key.
#[derive(Debug, Clone, Copy)]
pub struct Anthropic;

impl Api for Anthropic {
    const SECTION: &'static str = "anthropic";
    const BASE_URL: &'static str = "https://api.anthropic.com/v1";
    const BASE_URL_VAR: &'static str = "ANTHROPIC_BASE_URL";
    const API_KEY_VAR: &'static str = "ANTHROPIC_API_KEY";
    const KEY_HEADER: &'static str = "x-api-key";
    const BEARER: bool = false;
    /// The time Anthropic's SDKs allow a request that is not streamed.
    const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
}

/// Settings of the `anthropic-messages` provider (the `anthropic`
/// section): the keys every HTTP provider has, and its own.
#[derive(Debug, Clone, Serialize)]
pub struct AnthropicOptions {
    /// Where the API is, the key (sent as `x-api-key`), and how requests
    /// are bounded and retried; its keys are the section's own
    /// (`anthropic.base_url`).
    #[serde(flatten)]
    pub http: HttpOptions<Anthropic>,
    /// The `anthropic-version` header. Default: `2023-06-01`.
    pub version: String,
    /// The most tokens the model may write in one turn, when the job does
    /// not say (`model.max_tokens`); the API requires a number. Default:
    /// 4096.
    pub max_tokens: u32,
    /// How long the API keeps the conversation so far for the next turn
    /// (automatic prompt caching). Default: `5m`.
    pub prompt_cache: PromptCache,
}

impl Default for AnthropicOptions {
    fn default() -> Self {
        Self {
            http: HttpOptions::default(),
            version: DEFAULT_VERSION.to_owned(),
            max_tokens: 4096,
            prompt_cache: PromptCache::FiveMinutes,
        }
    }
}

impl Section for AnthropicOptions {
    fn keys() -> &'static [&'static str] {
        static KEYS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
            let own = ["version", "max_tokens", "prompt_cache"];
            [HttpOptions::<Anthropic>::keys(), &own].concat()
        });
        &KEYS
    }

    fn read<'de, M: MapAccess<'de>>(&mut self, key: &str, map: &mut M) -> Result<bool, M::Error> {
        match key {
            "version" => self.version = map.next_value()?,
            "max_tokens" => self.max_tokens = map.next_value()?,
            "prompt_cache" => self.prompt_cache = map.next_value()?,
            _ => return self.http.read(key, map),
        }
        Ok(true)
    }
}

impl<'de> Deserialize<'de> for AnthropicOptions {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        read_section(deserializer)
    }
}

/// Automatic prompt caching (`anthropic.prompt_cache`): each request asks
/// the API to cache its prefix up to the last block it can, so that the
/// next turn of the job, which sends the same conversation and more, reads
/// it back at a tenth of the input price instead of paying for it again.
/// Writing it costs more (1.25 times the input price for five minutes,
/// twice for an hour), which a job of two turns or more repays; a prompt
/// shorter than the model's minimum is not cached and costs nothing more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PromptCache {
    /// No `cache_control`: for a server that speaks Messages but refuses
    /// the field.
    #[serde(rename = "off")]
    Off,
    /// Kept five minutes after its last use (the API's default).
    #[serde(rename = "5m")]
    FiveMinutes,
    /// Kept an hour: for jobs whose tools take minutes between turns.
    #[serde(rename = "1h")]
    OneHour,
}

impl PromptCache {
    /// The request's top-level `cache_control`, if any.
    fn cache_control(self) -> Option<Value> {
        match self {
            Self::Off => None,
            Self::FiveMinutes => Some(json!({"type": "ephemeral"})),
            Self::OneHour => Some(json!({"type": "ephemeral", "ttl": "1h"})),
        }
    }
}

impl AnthropicOptions {
    /// Whether a key is configured (in the options or a file).
    pub fn has_api_key(&self) -> bool {
        self.http.has_api_key()
    }

    /// The checks of these keys at start: the key file is readable, and
    /// `max_tokens` is not 0.
    ///
    /// # Errors
    ///
    /// What is wrong, naming the key.
    pub fn check(&self) -> Result<(), String> {
        self.http.check()?;
        if self.max_tokens == 0 {
            return Err("anthropic.max_tokens is 0; the API needs at least 1".to_owned());
        }
        Ok(())
    }

    fn wire(&self) -> Result<http::Wire, BuildError> {
        self.http
            .wire(&[("anthropic-version", self.version.clone())])
    }
}

/// A model behind Anthropic's Messages API (or a server that speaks it).
pub(crate) struct AnthropicMessages {
    wire: http::Wire,
    base_url: String,
    max_tokens: u32,
    prompt_cache: PromptCache,
}

impl AnthropicMessages {
    /// A provider with its own connection pool and the options' key,
    /// version, timeout and retry policy.
    ///
    /// # Errors
    ///
    /// When the key file cannot be read or the HTTP client cannot be built.
    pub(crate) fn new(options: &AnthropicOptions) -> Result<Self, BuildError> {
        Ok(Self {
            wire: options.wire()?,
            base_url: options.http.base_url.clone(),
            max_tokens: options.max_tokens,
            prompt_cache: options.prompt_cache,
        })
    }
}

// By hand, so the API key never reaches a log line.
impl fmt::Debug for AnthropicMessages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicMessages")
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

impl Provider for AnthropicMessages {
    fn turn<'a>(&'a self, request: TurnRequest<'a>) -> BoxFuture<'a, Result<Turn, ModelError>> {
        let span = tracing::debug_span!(
            "model_turn",
            api = "anthropic_messages",
            model = request.model,
            turn = request.turn
        );
        async move {
            let url = http::endpoint(&self.base_url, "messages");
            let mut body = request_body(&request, self.max_tokens);
            if let Some(cache_control) = self.prompt_cache.cache_control() {
                body["cache_control"] = cache_control;
            }
            let mut turn = Turn::default();
            if request.deltas.is_some() {
                body["stream"] = json!(true);
            }
            for _ in 0..=MAX_PAUSES {
                let response = match request.deltas {
                    Some(deltas) => {
                        let mut reader = stream::Reader::default();
                        http::post_sse(&self.wire, &url, &body, &mut reader, deltas).await?
                    }
                    None => http::post_json(&self.wire, &url, &body).await?,
                };
                let answer = parse_response(&response)?;
                // A paused turn's last response says how it ended.
                turn.answered = Answered::read(&response, &["/stop_reason"]);
                turn.usage = Usage::sum(turn.usage, answer.usage);
                turn.items.extend(answer.items);
                if answer.stop != Stop::Paused {
                    return finish(turn, answer.stop);
                }
                // "Provide the response back as-is": the model goes on
                // from its own paused content.
                if let Some(messages) = body["messages"].as_array_mut() {
                    messages.push(json!({"role": "assistant", "content": response["content"]}));
                }
            }
            Err(ModelError::InvalidResponse(format!(
                "the turn was paused (pause_turn) more than {MAX_PAUSES} times"
            )))
        }
        .instrument(span)
        .boxed()
    }
}

/// The request of one turn.
fn request_body(request: &TurnRequest<'_>, default_max_tokens: u32) -> Value {
    let mut body = json!({
        "model": request.model,
        "max_tokens": request.max_tokens.unwrap_or(default_max_tokens),
        "messages": messages(request.items),
    });
    if !request.instructions.is_empty() {
        body["system"] = json!(request.instructions);
    }
    // `tool_choice` without tools is rejected.
    if !request.tools.is_empty() {
        body["tools"] = request.tools.iter().map(tool).collect();
        body["tool_choice"] = json!({
            "type": "auto",
            "disable_parallel_tool_use": !request.parallel_tool_calls,
        });
    }
    body
}

/// A tool as Messages declares one. `strict` is not sent: the runner checks
/// every call's arguments against the schema whatever the model did.
fn tool(tool: &ToolSpec) -> Value {
    json!({
        "name": tool.name,
        "description": tool.description,
        "input_schema": tool.parameters,
    })
}

/// One message being built: its role and its content blocks.
struct Message {
    role: &'static str,
    content: Vec<Value>,
}

/// The conversation as alternating messages: consecutive items of one role
/// share a message, as the API requires of a turn's blocks.
fn messages(items: &[Item]) -> Vec<Value> {
    let mut messages: Vec<Message> = Vec::new();
    for item in items {
        let Some((role, block)) = block(item) else {
            continue;
        };
        match messages.last_mut() {
            Some(last) if last.role == role => last.content.push(block),
            _ => messages.push(Message {
                role,
                content: vec![block],
            }),
        }
    }
    // The ids of the calls of the last assistant message, which the next
    // user message answers.
    let mut calls: Vec<String> = Vec::new();
    messages
        .into_iter()
        .map(|mut message| {
            if message.role == "assistant" {
                calls = message
                    .content
                    .iter()
                    .filter(|block| block["type"] == "tool_use")
                    .filter_map(|block| block["id"].as_str().map(str::to_owned))
                    .collect();
            } else {
                order_results(&mut message.content, &calls);
            }
            json!({"role": message.role, "content": message.content})
        })
        .collect()
}

/// Puts a user message's `tool_result` blocks first, in the order of the
/// calls of the assistant message before it (`calls`), then its other
/// blocks: the API wants results before any text, and answers matched to
/// their calls.
fn order_results(content: &mut [Value], calls: &[String]) {
    let rank = |block: &Value| {
        if block["type"] != "tool_result" {
            return usize::MAX;
        }
        let id = block["tool_use_id"].as_str().unwrap_or_default();
        calls
            .iter()
            .position(|call| *call == id)
            .unwrap_or(usize::MAX - 1)
    };
    // Stable: blocks of the same rank keep their order.
    content.sort_by_key(rank);
}

/// An item as a content block, with the role of the message it belongs to;
/// `None` for what Messages has no place for (a text of nothing but white
/// space, which the API refuses; another provider's reasoning).
fn block(item: &Item) -> Option<(&'static str, Value)> {
    match item {
        Item::User { text } if !text.trim().is_empty() => {
            Some(("user", json!({"type": "text", "text": text})))
        }
        Item::Assistant { text, .. } if !text.trim().is_empty() => {
            Some(("assistant", json!({"type": "text", "text": text})))
        }
        Item::User { .. } | Item::Assistant { .. } => None,
        // The model's thinking goes back unchanged (its signature checks
        // it), before the calls it led to.
        Item::Reasoning { raw } => {
            matches!(raw["type"].as_str(), Some("thinking" | "redacted_thinking"))
                .then(|| ("assistant", raw.clone()))
        }
        Item::ToolCall {
            call_id,
            name,
            arguments,
            ..
        } => Some((
            "assistant",
            json!({"type": "tool_use", "id": call_id, "name": name, "input": input(arguments)}),
        )),
        Item::ToolResult {
            call_id, output, ..
        } => Some((
            "user",
            json!({
                "type": "tool_result",
                "tool_use_id": call_id,
                // An empty text is refused; an envelope is never empty.
                "content": if output.is_empty() { "(no output)" } else { output },
                "is_error": is_error(output),
            }),
        )),
    }
}

/// A call's arguments as the `input` object Messages wants. The model wrote
/// an object (Messages has no other shape); anything else (a history from
/// another provider) becomes an empty one.
fn input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(object)) => Value::Object(object),
        _ => Value::Object(Map::new()),
    }
}

/// Whether an envelope reports an error (`{"ok": false, ...}`).
fn is_error(output: &str) -> bool {
    serde_json::from_str::<Value>(output).is_ok_and(|envelope| envelope["ok"] == false)
}

/// Why a response ended.
#[derive(Debug, Clone, PartialEq)]
enum Stop {
    /// `end_turn`, `stop_sequence`, `tool_use`: a whole answer.
    Done,
    /// `max_tokens` or `model_context_window_exceeded`: cut off.
    Cut(String),
    /// `pause_turn`: to be continued.
    Paused,
    /// `refusal`: the model declined.
    Refused,
}

/// One response, read.
struct Answer {
    items: Vec<Item>,
    usage: Option<Usage>,
    stop: Stop,
}

/// Reads a Messages response.
fn parse_response(response: &Value) -> Result<Answer, ModelError> {
    // A gateway may answer an upstream failure with a 200 and an error.
    if response["type"] == "error" {
        return Err(http::in_band_error(&response["error"]));
    }
    let content = response["content"]
        .as_array()
        .ok_or_else(|| ModelError::InvalidResponse("the message has no content array".into()))?;
    let mut items = Vec::with_capacity(content.len());
    for block in content {
        match block["type"].as_str() {
            Some("text") => {
                let text = block["text"].as_str().unwrap_or_default();
                if !text.is_empty() {
                    items.push(Item::Assistant {
                        text: text.to_owned(),
                        raw: None,
                    });
                }
            }
            Some("tool_use") => items.push(tool_use(block)?),
            Some("thinking" | "redacted_thinking") => {
                items.push(Item::Reasoning { raw: block.clone() });
            }
            other => tracing::debug!(block_type = other, "ignoring content block"),
        }
    }
    let stop = match response["stop_reason"].as_str() {
        Some("max_tokens") => Stop::Cut("max_tokens".to_owned()),
        Some("model_context_window_exceeded") => {
            Stop::Cut("model_context_window_exceeded".to_owned())
        }
        Some("pause_turn") => Stop::Paused,
        Some("refusal") => Stop::Refused,
        Some("end_turn" | "stop_sequence" | "tool_use") | None => Stop::Done,
        Some(other) => {
            tracing::debug!(stop_reason = other, "unknown stop reason, taken as done");
            Stop::Done
        }
    };
    Ok(Answer {
        items,
        usage: super::anthropic_usage(response),
        stop,
    })
}

/// A `tool_use` block as a call. Its `input` is an object; the runner
/// checks it against the tool's schema.
fn tool_use(block: &Value) -> Result<Item, ModelError> {
    let field = |name: &str| {
        block[name]
            .as_str()
            .filter(|value| !value.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| ModelError::InvalidResponse(format!("a tool_use block without {name}")))
    };
    let input = &block["input"];
    if !input.is_object() {
        return Err(ModelError::InvalidResponse(
            "a tool_use block whose input is not an object".into(),
        ));
    }
    Ok(Item::ToolCall {
        call_id: field("id")?,
        name: field("name")?,
        arguments: input.to_string(),
        raw: None,
    })
}

/// The turn, unless the way it ended makes it unusable.
fn finish(turn: Turn, stop: Stop) -> Result<Turn, ModelError> {
    match stop {
        Stop::Done | Stop::Paused => Ok(turn),
        Stop::Refused => Err(ModelError::Rejected {
            status: 200,
            code: Some("refusal".to_owned()),
            message: "the model declined to answer (stop_reason refusal)".to_owned(),
        }),
        // A call cut off may look whole but mean something else: never
        // dispatch it. Cut text is still an answer, said in the log.
        Stop::Cut(reason) if turn.tool_calls().next().is_some() => {
            Err(ModelError::InvalidResponse(format!(
                "the turn stopped at {reason} with a tool call that may be cut off; \
                 raise max_tokens"
            )))
        }
        Stop::Cut(reason) if turn.text().is_empty() => Err(ModelError::InvalidResponse(format!(
            "the turn stopped at {reason} with no output; raise max_tokens"
        ))),
        Stop::Cut(reason) => {
            tracing::warn!(
                reason,
                "the model's answer was cut off, using the partial text"
            );
            Ok(turn)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;
    use wiremock::matchers::{header, method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    use super::*;
    use crate::model::Delta;

    fn options(server: &MockServer) -> AnthropicOptions {
        options_at(&server.uri())
    }

    fn options_at(uri: &str) -> AnthropicOptions {
        let mut http = HttpOptions::for_tests(format!("{uri}/v1"), "sk-ant-test");
        http.max_backoff = Duration::from_millis(100);
        AnthropicOptions {
            http,
            version: DEFAULT_VERSION.into(),
            max_tokens: 1024,
            prompt_cache: PromptCache::FiveMinutes,
        }
    }

    fn message(content: Value, stop_reason: &str) -> Value {
        json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
            "content": content, "stop_reason": stop_reason, "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 4},
        })
    }

    fn request(items: &[Item]) -> TurnRequest<'_> {
        TurnRequest {
            model: "claude-test",
            instructions: "",
            items,
            tools: &[],
            parallel_tool_calls: true,
            turn: 0,
            max_tokens: None,
            deltas: None,
        }
    }

    async fn answering(responses: Vec<ResponseTemplate>) -> MockServer {
        let server = MockServer::start().await;
        for response in responses {
            Mock::given(method("POST"))
                .and(path("/v1/messages"))
                .and(header("x-api-key", "sk-ant-test"))
                .and(header("anthropic-version", DEFAULT_VERSION))
                .respond_with(response)
                .up_to_n_times(1)
                .mount(&server)
                .await;
        }
        server
    }

    async fn bodies(server: &MockServer) -> Vec<Value> {
        let requests = server.received_requests().await.expect("recording is on");
        requests
            .iter()
            .map(|r| r.body_json().expect("JSON"))
            .collect()
    }

    /// Every request asks the API to cache the conversation so far (the
    /// top-level `cache_control` of automatic caching), for the time
    /// configured; `off` sends no such field.
    #[tokio::test]
    async fn each_request_asks_for_the_configured_prompt_cache() {
        let answer = || {
            ResponseTemplate::new(200)
                .set_body_json(message(json!([{"type": "text", "text": "ok"}]), "end_turn"))
        };
        let server = answering(vec![answer(), answer(), answer()]).await;
        let items = [Item::User { text: "hi".into() }];
        for cache in [
            PromptCache::FiveMinutes,
            PromptCache::OneHour,
            PromptCache::Off,
        ] {
            let options = AnthropicOptions {
                prompt_cache: cache,
                ..options(&server)
            };
            let provider = AnthropicMessages::new(&options).unwrap();
            provider.turn(request(&items)).await.unwrap();
        }
        let sent: Vec<Option<Value>> = bodies(&server)
            .await
            .into_iter()
            .map(|body| body.get("cache_control").cloned())
            .collect();
        assert_eq!(
            sent,
            [
                Some(json!({"type": "ephemeral"})),
                Some(json!({"type": "ephemeral", "ttl": "1h"})),
                None,
            ]
        );
        let spelled: Vec<PromptCache> = ["\"5m\"", "\"1h\"", "\"off\""]
            .iter()
            .map(|value| serde_json::from_str(value).unwrap())
            .collect();
        assert_eq!(
            spelled,
            [
                PromptCache::FiveMinutes,
                PromptCache::OneHour,
                PromptCache::Off
            ]
        );
        assert!(serde_json::from_str::<PromptCache>("\"2h\"").is_err());
    }

    /// A fixture of orchestrator/tests/fixtures/anthropic (taken from
    /// Anthropic's documentation; its README says where from).
    fn fixture(name: &str) -> Value {
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/anthropic")
            .join(name);
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|err| panic!("cannot read {}: {err}", file.display()));
        serde_json::from_str(&text).expect("fixtures are JSON")
    }

    #[test]
    fn the_docs_responses_are_read_and_their_turn_goes_back_as_the_docs_send_it() {
        let parallel = parse_response(&fixture("response-tool-use.json")).unwrap();
        assert_eq!(parallel.stop, Stop::Done);
        let names: Vec<&str> = parallel
            .items
            .iter()
            .filter_map(|item| match item {
                Item::ToolCall { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(names, ["get_weather", "get_time"]);
        assert_eq!(parallel.usage.map(|u| u.input_tokens), Some(472));
        let answer = parse_response(&fixture("response-end-turn.json")).unwrap();
        assert_eq!(answer.stop, Stop::Done);
        assert!(!answer.items.is_empty());

        // Extended thinking with a call: the thinking block is kept, and
        // the next request carries the turn exactly as the docs' does.
        let thinking = parse_response(&fixture("response-thinking-tool-use.json")).unwrap();
        let expected = fixture("request-thinking-tool-result.json");
        let mut items = vec![Item::User {
            text: expected["messages"][0]["content"].as_str().unwrap().into(),
        }];
        items.extend(thinking.items);
        items.push(Item::ToolResult {
            call_id: "toolu_01CswdEQBMshySk6Y9DFKrfq".into(),
            name: "get_weather".into(),
            output: "Current temperature: 88°F".into(),
            attempts: 1,
        });
        let body = request_body(&request(&items), 16_000);
        assert_eq!(body["messages"][1], expected["messages"][1]);
        let result = &body["messages"][2]["content"][0];
        let documented = &expected["messages"][2]["content"][0];
        assert_eq!(result["tool_use_id"], documented["tool_use_id"]);
        assert_eq!(result["content"], documented["content"]);
    }

    #[test]
    fn white_space_is_no_text_block() {
        let items = [
            Item::User { text: "hi".into() },
            Item::Assistant {
                text: "\n\n".into(),
                raw: None,
            },
            Item::ToolCall {
                call_id: "t".into(),
                name: "calculate".into(),
                arguments: "{}".into(),
                raw: None,
            },
        ];
        let body = request_body(&request(&items), 10);
        let blocks = body["messages"][1]["content"].as_array().unwrap();
        assert_eq!(blocks.len(), 1);
        assert_eq!(blocks[0]["type"], "tool_use");
    }

    #[test]
    fn history_becomes_alternating_messages_with_results_first_and_in_call_order() {
        let call = |id: &str| Item::ToolCall {
            call_id: id.into(),
            name: "calculate".into(),
            arguments: r#"{"expression":"1+1"}"#.into(),
            raw: None,
        };
        let result = |id: &str, output: &str| Item::ToolResult {
            call_id: id.into(),
            name: "calculate".into(),
            output: output.into(),
            attempts: 1,
        };
        let thinking = json!({"type": "thinking", "thinking": "hmm", "signature": "sig"});
        let items = vec![
            Item::User { text: "hi".into() },
            Item::Reasoning {
                raw: thinking.clone(),
            },
            Item::Assistant {
                text: String::new(),
                raw: None,
            },
            call("a"),
            call("b"),
            // Settled in the other order.
            result("b", r#"{"ok":false,"error":{"code":"NOPE"}}"#),
            result("a", r#"{"ok":true,"data":2}"#),
            // Another provider's reasoning has no place here.
            Item::Reasoning {
                raw: json!({"type": "reasoning", "id": "rs_1"}),
            },
        ];
        let body = request_body(&request(&items), 777);
        assert_eq!(body["max_tokens"], 777);
        assert!(body.get("system").is_none());
        assert!(body.get("tool_choice").is_none(), "no tools, no choice");
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[1]["role"], "assistant");
        assert_eq!(messages[1]["content"][0], thinking);
        assert_eq!(
            messages[1]["content"][1]["input"],
            json!({"expression": "1+1"})
        );
        let results = &messages[2]["content"];
        assert_eq!(results[0]["tool_use_id"], "a");
        assert_eq!(results[0]["is_error"], false);
        assert_eq!(results[1]["tool_use_id"], "b");
        assert_eq!(results[1]["is_error"], true);
    }

    #[tokio::test]
    async fn every_stop_reason_has_its_outcome() {
        let text = json!([{"type": "text", "text": "partial"}]);
        let cut_call = json!([{"type": "tool_use", "id": "t", "name": "calculate", "input": {}}]);
        let cases = [
            (text.clone(), "end_turn", Ok("partial")),
            (text.clone(), "stop_sequence", Ok("partial")),
            (text.clone(), "max_tokens", Ok("partial")),
            (text.clone(), "model_context_window_exceeded", Ok("partial")),
            (cut_call, "max_tokens", Err("MODEL_INVALID_RESPONSE")),
            (json!([]), "max_tokens", Err("MODEL_INVALID_RESPONSE")),
            (text, "refusal", Err("MODEL_REJECTED")),
        ];
        let items = [Item::User { text: "hi".into() }];
        for (content, stop, expected) in cases {
            let server = answering(vec![
                ResponseTemplate::new(200).set_body_json(message(content, stop)),
            ])
            .await;
            let provider = AnthropicMessages::new(&options(&server)).unwrap();
            let turn = provider.turn(request(&items)).await;
            match (turn, expected) {
                (Ok(turn), Ok(text)) => assert_eq!(turn.text(), text, "{stop}"),
                (Err(err), Err(code)) => assert_eq!(err.code().as_str(), code, "{stop}: {err}"),
                (other, expected) => panic!("{stop}: {other:?}, expected {expected:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_paused_turn_is_continued_from_its_own_content() {
        let paused = message(
            json!([{"type": "text", "text": "Searching. "}]),
            "pause_turn",
        );
        let done = message(json!([{"type": "text", "text": "Found it."}]), "end_turn");
        let server = answering(vec![
            ResponseTemplate::new(200).set_body_json(paused),
            ResponseTemplate::new(200).set_body_json(done),
        ])
        .await;
        let provider = AnthropicMessages::new(&options(&server)).unwrap();
        let items = [Item::User {
            text: "find".into(),
        }];
        let turn = provider.turn(request(&items)).await.unwrap();
        assert_eq!(turn.text(), "Searching. Found it.");
        assert_eq!(
            turn.usage.map(|u| u.output_tokens),
            Some(8),
            "both responses counted"
        );
        let sent = bodies(&server).await;
        assert_eq!(sent.len(), 2);
        let continued = sent[1]["messages"].as_array().unwrap();
        assert_eq!(continued[1]["role"], "assistant");
        assert_eq!(continued[1]["content"][0]["text"], "Searching. ");
    }

    #[tokio::test]
    async fn overloaded_and_rate_limited_answers_are_retried_and_a_bad_request_is_not() {
        let server = answering(vec![
            ResponseTemplate::new(529).set_body_json(fixture("error-overloaded.json")),
            ResponseTemplate::new(429)
                .insert_header("retry-after", "1")
                .set_body_json(fixture("error-rate-limit.json")),
            ResponseTemplate::new(200)
                .set_body_json(message(json!([{"type": "text", "text": "ok"}]), "end_turn")),
        ])
        .await;
        let provider = AnthropicMessages::new(&options(&server)).unwrap();
        let items = [Item::User { text: "hi".into() }];
        let turn = provider.turn(request(&items)).await.unwrap();
        assert_eq!(turn.text(), "ok");
        assert_eq!(bodies(&server).await.len(), 3);

        let mut invalid = fixture("error-invalid-request.json");
        let documented = invalid["error"]["message"].as_str().unwrap().to_owned();
        invalid["error"]["message"] = json!(format!("{documented} (key sk-ant-test)"));
        let server = answering(vec![ResponseTemplate::new(400).set_body_json(invalid)]).await;
        let provider = AnthropicMessages::new(&options(&server)).unwrap();
        let err = provider.turn(request(&items)).await.unwrap_err();
        match &err {
            ModelError::Rejected {
                status: 400,
                code,
                message,
            } => {
                assert_eq!(code.as_deref(), Some("invalid_request_error"));
                assert!(message.starts_with(&documented), "{message}");
                assert!(
                    !message.contains("sk-ant-test"),
                    "the key is redacted: {message}"
                );
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
        assert_eq!(bodies(&server).await.len(), 1, "a 400 is not retried");
    }

    /// A fixture's text (the `.sse` streams).
    fn fixture_text(name: &str) -> String {
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/anthropic")
            .join(name);
        std::fs::read_to_string(&file)
            .unwrap_or_else(|err| panic!("cannot read {}: {err}", file.display()))
    }

    fn sse(body: &str) -> ResponseTemplate {
        ResponseTemplate::new(200)
            .insert_header("content-type", "text/event-stream")
            .set_body_string(body.to_owned())
    }

    /// Runs one streamed turn; returns it and the deltas sent.
    async fn streamed(server: &MockServer) -> (Result<Turn, ModelError>, Vec<Delta>) {
        let provider = AnthropicMessages::new(&options(server)).unwrap();
        let items = [Item::User { text: "hi".into() }];
        let seen = std::sync::Mutex::new(Vec::new());
        let sink = |delta: Delta| seen.lock().unwrap().push(delta);
        let mut turn_request = request(&items);
        turn_request.deltas = Some(&sink);
        let turn = provider.turn(turn_request).await;
        (turn, seen.into_inner().unwrap())
    }

    fn streamed_text(deltas: &[Delta]) -> String {
        deltas
            .iter()
            .filter_map(|delta| match delta {
                Delta::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn the_docs_streams_make_the_same_turn_and_their_deltas_spell_it() {
        let server = answering(vec![sse(&fixture_text("stream-tool-use.sse"))]).await;
        let (turn, deltas) = streamed(&server).await;
        let turn = turn.unwrap();
        assert_eq!(streamed_text(&deltas), turn.text());
        assert!(!turn.text().is_empty());
        let calls: Vec<&Item> = turn.tool_calls().collect();
        let [
            Item::ToolCall {
                name, arguments, ..
            },
        ] = calls.as_slice()
        else {
            panic!("one call: {calls:?}")
        };
        assert_eq!(name, "get_weather");
        let arguments: Value = serde_json::from_str(arguments).unwrap();
        assert_eq!(
            arguments,
            json!({"location": "San Francisco, CA", "unit": "fahrenheit"})
        );
        assert!(deltas.contains(&Delta::ToolCall {
            index: 0,
            name: "get_weather".into()
        }));
        assert_eq!(turn.usage.map(|u| u.output_tokens), Some(89));
        assert_eq!(
            turn.answered,
            Answered {
                model: Some("claude-opus-4-6".into()),
                id: Some("msg_014p7gG3wDgGV9EUtLvnow3U".into()),
                finish_reason: Some("tool_use".into()),
            }
        );
        let sent = bodies(&server).await;
        assert_eq!(sent[0]["stream"], true);

        let server = answering(vec![sse(&fixture_text("stream-text.sse"))]).await;
        let (turn, deltas) = streamed(&server).await;
        let turn = turn.unwrap();
        assert_eq!(streamed_text(&deltas), turn.text());
        assert!(turn.tool_calls().next().is_none());
    }

    #[tokio::test]
    async fn a_stream_that_breaks_is_asked_again_and_its_deltas_restart() {
        let whole = fixture_text("stream-text.sse");
        // Cut before `message_stop`.
        let cut = &whole[..whole.find("event: message_stop").unwrap()];
        let server = answering(vec![
            sse(&fixture_text("stream-error-overloaded.sse")),
            sse(cut),
            sse(&whole),
        ])
        .await;
        let (turn, deltas) = streamed(&server).await;
        let turn = turn.unwrap();
        assert_eq!(bodies(&server).await.len(), 3);
        let last_restart = deltas.iter().rposition(|d| *d == Delta::Restart).unwrap();
        assert_eq!(deltas.iter().filter(|d| **d == Delta::Restart).count(), 2);
        assert_eq!(streamed_text(&deltas[last_restart..]), turn.text());

        // Malformed data and arguments that never close, every attempt:
        // retryable, then unavailable, the provider's text excerpted.
        let garbage = "event: message_start\ndata: {not json\n\n";
        let server = answering(vec![sse(garbage), sse(garbage), sse(garbage)]).await;
        let err = streamed(&server).await.0.unwrap_err();
        assert!(
            matches!(&err, ModelError::Unavailable(m) if m.contains("not JSON") && m.contains("{not json")),
            "{err:?}"
        );
        let tool = fixture_text("stream-tool-use.sse");
        let open = &tool[..tool
            .find(
                "event: content_block_stop\ndata: {\"type\": \"content_block_stop\", \"index\": 1",
            )
            .unwrap_or(tool.len() / 2)];
        let server = answering(vec![sse(open), sse(open), sse(open)]).await;
        let err = streamed(&server).await.0.unwrap_err();
        assert_eq!(err.code().as_str(), "MODEL_UNAVAILABLE", "{err:?}");

        // A line that never ends costs at most max_response_bytes (64 KiB
        // here), and is not asked for again.
        let endless = format!("data: {}", "x".repeat(100 * 1024));
        let server = answering(vec![sse(&endless)]).await;
        let err = streamed(&server).await.0.unwrap_err();
        assert!(
            matches!(&err, ModelError::InvalidResponse(m) if m.contains("anthropic.max_response_bytes")),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_stream_that_stalls_is_given_up_after_its_idle_timeout() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Headers and the first event, then silence.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let first = "event: ping\ndata: {\"type\": \"ping\"}\n\n";
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut socket, _)) = listener.accept().await {
                // The whole request first: headers, then its body.
                let mut read = Vec::new();
                let mut buffer = [0u8; 4096];
                let whole = |read: &[u8]| {
                    let text = String::from_utf8_lossy(read);
                    let Some(end) = text.find("\r\n\r\n") else {
                        return false;
                    };
                    let length = text[..end]
                        .lines()
                        .find_map(|line| {
                            line.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|n| n.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    read.len() >= end + 4 + length
                };
                while !whole(&read) {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => read.extend_from_slice(&buffer[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: 100000\r\n\r\n{first}"
                );
                let _ = socket.write_all(head.as_bytes()).await;
                held.push(socket);
            }
        });
        let mut options = options(&MockServer::start().await);
        options.http.base_url = format!("http://{address}/v1");
        options.http.max_retries = 1;
        options.http.stream_idle_timeout = Duration::from_millis(200);
        let provider = AnthropicMessages::new(&options).unwrap();
        let items = [Item::User { text: "hi".into() }];
        let sink = |_: Delta| {};
        let mut turn_request = request(&items);
        turn_request.deltas = Some(&sink);
        let started = std::time::Instant::now();
        let err = provider.turn(turn_request).await.unwrap_err();
        assert!(
            matches!(&err, ModelError::Unavailable(m) if m.contains("silent") && m.contains("2 attempts")),
            "{err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(4), "bounded");
    }

    #[tokio::test]
    async fn a_key_the_server_echoes_never_comes_back() {
        use crate::model::http::testing::{ECHOED_KEY, KeyAnswers, check_the_key_never_comes_back};
        fn event(data: &Value) -> String {
            format!(
                "event: {}\ndata: {data}\n\n",
                data["type"].as_str().unwrap_or_default()
            )
        }
        fn stream(pieces: &[&str]) -> String {
            let mut start = message(json!([]), "end_turn");
            start["stop_reason"] = Value::Null;
            let mut events = vec![
                json!({"type": "message_start", "message": start}),
                json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "text", "text": ""}}),
            ];
            events.extend(pieces.iter().map(|piece| {
                json!({"type": "content_block_delta", "index": 0,
                       "delta": {"type": "text_delta", "text": piece}})
            }));
            events.extend([
                json!({"type": "content_block_stop", "index": 0}),
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                       "usage": {"output_tokens": 4}}),
                json!({"type": "message_stop"}),
            ]);
            events.iter().map(event).collect()
        }
        let answers = KeyAnswers {
            path: "/v1/messages",
            text: |text| message(json!([{"type": "text", "text": text}]), "end_turn"),
            in_band_error: |message| {
                json!({"type": "error",
                       "error": {"type": "authentication_error", "message": message}})
            },
            stream,
            stream_error: |message| {
                event(&json!({"type": "error",
                              "error": {"type": "invalid_request_error", "message": message}}))
            },
        };
        let items = [Item::User { text: "hi".into() }];
        check_the_key_never_comes_back(
            |uri| {
                let mut options = options_at(&uri);
                options.http.api_key = Some(ECHOED_KEY.into());
                AnthropicMessages::new(&options).unwrap()
            },
            &answers,
            request(&items),
        )
        .await;
    }
}
