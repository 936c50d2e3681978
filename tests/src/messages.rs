//! A fake of Anthropic's Messages API (`POST /v1/messages`) that checks
//! every request as strictly as the real API does, then answers from a
//! script: the stand-in for Claude in the tests of the
//! `anthropic-messages` provider.
//!
//! What it refuses, with the real API's error shape (`400
//! invalid_request_error`), is what that API refuses (Anthropic's
//! documentation; orchestrator/tests/fixtures/anthropic/README.md): a
//! request without `max_tokens` or `model`; a text block that is empty
//! or only white space; two messages of one role in a row (the API's
//! reference says it merges them, Anthropic's skills that it refuses them:
//! the fake takes the stricter word); a
//! `tool_result` that answers no `tool_use` of the message before it; a
//! `tool_use` left without its `tool_result` in the next message; results
//! after other content, or out of their calls' order; a malformed tool or
//! `tool_choice`. A missing or wrong `x-api-key` is a 401, a missing
//! `anthropic-version` a 400.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// One scripted answer of the server.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A `200` with this message (its `content`, `stop_reason` and
    /// `usage`; `id`, `type`, `role` and `model` are filled in).
    Message(Value),
    /// A `200` streaming these server-sent events (a request must ask for
    /// a stream), sent once the test releases it
    /// ([`MessagesServer::release_stream`]). Each `: pause` comment line
    /// (with its blank line) holds the rest until the next release.
    Stream(String),
    /// An error status with Anthropic's error body of this `type` and
    /// `message`, and a `retry-after` header (seconds) when given.
    Error {
        status: u16,
        kind: &'static str,
        message: String,
        retry_after: Option<u32>,
    },
}

impl Reply {
    /// A message of `content` blocks that ended with `stop_reason`, with a
    /// usage of 10 input and 5 output tokens.
    pub fn message(content: Value, stop_reason: &str) -> Self {
        Self::Message(json!({
            "content": content,
            "stop_reason": stop_reason,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }))
    }
}

#[derive(Default)]
struct Script {
    /// The `x-api-key` requests must carry.
    key: String,
    replies: VecDeque<Reply>,
    /// Every request body received, valid or not, in order.
    requests: Vec<Value>,
    /// Why each refused request was refused.
    refusals: Vec<String>,
}

#[derive(Clone)]
struct Shared {
    script: Arc<Mutex<Script>>,
    /// Streams wait for a permit each.
    streams: Arc<tokio::sync::Semaphore>,
}

/// The fake, serving on a free loopback port until dropped.
pub struct MessagesServer {
    address: SocketAddr,
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MessagesServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MessagesServer {
    /// Starts the fake; requests must carry `x-api-key: <key>`.
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub async fn start(key: &str) -> anyhow::Result<Self> {
        let shared = Shared {
            script: Arc::new(Mutex::new(Script {
                key: key.to_owned(),
                ..Script::default()
            })),
            streams: Arc::new(tokio::sync::Semaphore::new(0)),
        };
        let app = axum::Router::new()
            .route("/v1/messages", axum::routing::post(answer))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            address,
            shared,
            task,
        })
    }

    /// The base URL to configure (`anthropic.base_url`), `/v1` included.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.address)
    }

    /// Queues the next answer.
    pub fn push(&self, reply: Reply) {
        self.lock().replies.push_back(reply);
    }

    /// From now on requests must carry `x-api-key: <key>` (the old key
    /// was revoked).
    pub fn set_key(&self, key: &str) {
        key.clone_into(&mut self.lock().key);
    }

    /// Lets the next held stream go.
    pub fn release_stream(&self) {
        self.shared.streams.add_permits(1);
    }

    /// Every request body received so far, in order.
    pub fn requests(&self) -> Vec<Value> {
        self.lock().requests.clone()
    }

    /// Why each refused request was refused, in order.
    pub fn refusals(&self) -> Vec<String> {
        self.lock().refusals.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        self.shared
            .script
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The documentation's streamed answer "Hello!" (a fixture of
/// orchestrator/tests/fixtures/anthropic), as the fake's SSE script.
///
/// # Errors
///
/// When the fixture cannot be read.
pub fn hello_stream() -> std::io::Result<String> {
    std::fs::read_to_string(
        crate::repo_root().join("orchestrator/tests/fixtures/anthropic/stream-text.sse"),
    )
}

/// A job of the `anthropic-messages` provider (model `claude-test`) that
/// streams its turns, asking `input`.
pub fn streamed_job(input: &str) -> toolfleet_proto::v1::SubmitJobRequest {
    toolfleet_proto::v1::SubmitJobRequest {
        input: input.into(),
        model: Some(toolfleet_proto::v1::ModelSpec {
            provider: "anthropic-messages".into(),
            name: "claude-test".into(),
            ..Default::default()
        }),
        stream: Some(true),
        ..Default::default()
    }
}

/// Where a scripted stream waits for the test's next release.
pub const PAUSE: &str = ": pause\n\n";

/// Anthropic's error response.
fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = json!({
        "type": "error",
        "error": {"type": kind, "message": message},
        "request_id": "req_fake",
    });
    json_response(status, &body)
}

/// `body` as a JSON response (axum's `Json` needs a feature the workspace
/// does not build).
fn json_response(status: StatusCode, body: &Value) -> Response {
    let headers = [(axum::http::header::CONTENT_TYPE, "application/json")];
    (status, headers, body.to_string()).into_response()
}

async fn answer(State(shared): State<Shared>, headers: HeaderMap, body: String) -> Response {
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let reply = match admit(&shared, &headers, &body) {
        Ok(reply) => reply,
        Err(refused) => return refused,
    };
    match reply {
        None => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            "the fake's script has no answer left",
        ),
        Some(Reply::Stream(_)) if body["stream"] != true => error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the fake's script streams this answer, and the request did not ask for a stream",
        ),
        Some(Reply::Stream(events)) => {
            let parts: Vec<String> = events.split(PAUSE).map(str::to_owned).collect();
            let gate = shared.streams.clone();
            // Each part waits for its release.
            let body = futures::stream::unfold(parts.into_iter(), move |mut parts| {
                let gate = gate.clone();
                async move {
                    let part = parts.next()?;
                    if let Ok(permit) = gate.acquire().await {
                        permit.forget();
                    }
                    Some((Ok::<_, std::convert::Infallible>(part), parts))
                }
            });
            let headers = [(axum::http::header::CONTENT_TYPE, "text/event-stream")];
            (StatusCode::OK, headers, axum::body::Body::from_stream(body)).into_response()
        }
        Some(Reply::Message(mut message)) => {
            message["id"] = json!("msg_fake");
            message["type"] = json!("message");
            message["role"] = json!("assistant");
            message["model"] = body["model"].clone();
            if message.get("stop_sequence").is_none() {
                message["stop_sequence"] = Value::Null;
            }
            json_response(StatusCode::OK, &message)
        }
        Some(Reply::Error {
            status,
            kind,
            message,
            retry_after,
        }) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = error(status, kind, &message);
            if let Some(seconds) = retry_after {
                response
                    .headers_mut()
                    .insert("retry-after", seconds.to_string().parse().expect("digits"));
            }
            response
        }
    }
}

/// Records a request and checks it: its scripted answer, or the API's
/// refusal.
#[allow(clippy::result_large_err)]
fn admit(shared: &Shared, headers: &HeaderMap, body: &Value) -> Result<Option<Reply>, Response> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let mut script = shared.script.lock().unwrap_or_else(PoisonError::into_inner);
    script.requests.push(body.clone());
    if header("x-api-key") != Some(script.key.as_str()) {
        script.refusals.push("x-api-key".to_owned());
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid x-api-key",
        ));
    }
    if header("anthropic-version").is_none() {
        script.refusals.push("anthropic-version".to_owned());
        return Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "anthropic-version: header is required",
        ));
    }
    if let Err(problem) = check(body) {
        script.refusals.push(problem.clone());
        return Err(error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &problem,
        ));
    }
    Ok(script.replies.pop_front())
}

/// Automatic prompt caching's top-level `cache_control`: `ephemeral`, with
/// a `ttl` of `5m` or `1h` if any.
fn check_cache_control(cache_control: Option<&Value>) -> Result<(), String> {
    let Some(cache_control) = cache_control else {
        return Ok(());
    };
    if cache_control["type"] != "ephemeral" {
        return Err("cache_control.type: Input should be 'ephemeral'".to_owned());
    }
    match cache_control.get("ttl") {
        None => {}
        Some(ttl) if ttl == "5m" || ttl == "1h" => {}
        Some(_) => return Err("cache_control.ttl: Input should be '5m' or '1h'".to_owned()),
    }
    let known = ["type", "ttl"];
    match cache_control.as_object() {
        Some(fields) if fields.keys().all(|k| known.contains(&k.as_str())) => Ok(()),
        _ => Err("cache_control: Extra inputs are not permitted".to_owned()),
    }
}

/// Checks a request as the real API does; the error is the API's message.
///
/// # Errors
///
/// What the API would answer with a 400.
pub fn check(body: &Value) -> Result<(), String> {
    if !body.is_object() {
        return Err("the body is not a JSON object".to_owned());
    }
    if body["model"].as_str().is_none_or(str::is_empty) {
        return Err("model: Field required".to_owned());
    }
    match body.get("max_tokens") {
        None => return Err("max_tokens: Field required".to_owned()),
        Some(n) if n.as_u64().is_none_or(|n| n < 1) => {
            return Err("max_tokens: Input should be greater than or equal to 1".to_owned());
        }
        Some(_) => {}
    }
    check_system(&body["system"])?;
    check_cache_control(body.get("cache_control"))?;
    check_tools(body)?;
    let messages = body["messages"]
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or("messages: at least one message is required")?;
    let mut calls_before: Vec<String> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        if index > 0 && message["role"] == messages[index - 1]["role"] {
            return Err(format!(
                "messages.{index}: roles must alternate between \"user\" and \"assistant\""
            ));
        }
        if index == 0 && message["role"] != "user" {
            return Err("messages.0.role: the first message must use the \"user\" role".to_owned());
        }
        let blocks = content_blocks(message, index)?;
        match message["role"].as_str() {
            Some("user") => check_answers(&blocks, &calls_before, index)?,
            Some("assistant") => {
                if !calls_before.is_empty() {
                    return Err(unanswered(&calls_before));
                }
            }
            _ => return Err(format!("messages.{index}.role: must be user or assistant")),
        }
        calls_before = if message["role"] == "assistant" {
            check_assistant_blocks(&blocks, index)?
        } else {
            Vec::new()
        };
    }
    if !calls_before.is_empty() {
        return Err(unanswered(&calls_before));
    }
    Ok(())
}

fn unanswered(calls: &[String]) -> String {
    format!(
        "messages: `tool_use` ids were found without `tool_result` blocks immediately after: {}. \
         Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
        calls.join(", ")
    )
}

fn check_system(system: &Value) -> Result<(), String> {
    match system {
        Value::Null => Ok(()),
        Value::String(text) if !text.is_empty() => Ok(()),
        Value::Array(blocks) if blocks.iter().all(|b| b["type"] == "text") => {
            blocks.iter().try_for_each(|b| non_empty_text(b, "system"))
        }
        _ => Err("system: must be a non-empty string or text blocks".to_owned()),
    }
}

fn check_tools(body: &Value) -> Result<(), String> {
    let tools = match &body["tools"] {
        Value::Null => &Vec::new(),
        Value::Array(tools) => tools,
        _ => return Err("tools: must be a list".to_owned()),
    };
    let name = regex_free_name;
    for (i, tool) in tools.iter().enumerate() {
        if !tool["name"].as_str().is_some_and(name) {
            return Err(format!(
                "tools.{i}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
            ));
        }
        if tool["input_schema"]["type"] != "object" {
            return Err(format!(
                "tools.{i}.input_schema.type: Input should be 'object'"
            ));
        }
    }
    match &body["tool_choice"] {
        Value::Null => Ok(()),
        _ if tools.is_empty() => {
            Err("tool_choice: may only be specified while providing tools".to_owned())
        }
        choice => match choice["type"].as_str() {
            Some("auto" | "any" | "none") => Ok(()),
            Some("tool") if choice["name"].is_string() => Ok(()),
            _ => Err("tool_choice: Input tag does not match any of the expected tags".to_owned()),
        },
    }
}

/// `^[a-zA-Z0-9_-]{1,128}$`, without a regex.
fn regex_free_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

fn non_empty_text(block: &Value, at: &str) -> Result<(), String> {
    match block["text"].as_str() {
        Some(text) if !text.trim().is_empty() => Ok(()),
        Some(text) if !text.is_empty() => Err(format!(
            "{at}: text content blocks must contain non-whitespace text"
        )),
        _ => Err(format!("{at}: text content blocks must be non-empty")),
    }
}

/// A message's content as blocks (a string is one text block).
fn content_blocks(message: &Value, index: usize) -> Result<Vec<Value>, String> {
    let at = format!("messages.{index}");
    let blocks = match &message["content"] {
        Value::String(text) => vec![json!({"type": "text", "text": text})],
        Value::Array(blocks) if !blocks.is_empty() => blocks.clone(),
        _ => return Err(format!("{at}: all messages must have non-empty content")),
    };
    for block in &blocks {
        if block["type"] == "text" {
            non_empty_text(block, &format!("{at}.content"))?;
        }
    }
    Ok(blocks)
}

/// An assistant message's blocks; returns the ids of its calls.
fn check_assistant_blocks(blocks: &[Value], index: usize) -> Result<Vec<String>, String> {
    let mut calls = Vec::new();
    for block in blocks {
        match block["type"].as_str() {
            Some("text") => {}
            Some("thinking") if block["signature"].is_string() => {}
            Some("redacted_thinking") if block["data"].is_string() => {}
            Some("tool_use") => {
                let id = block["id"].as_str().filter(|id| regex_free_name(id));
                let (Some(id), true, true) =
                    (id, block["name"].is_string(), block["input"].is_object())
                else {
                    return Err(format!(
                        "messages.{index}.content: a tool_use block needs an id, a name and an input object"
                    ));
                };
                calls.push(id.to_owned());
            }
            other => {
                return Err(format!(
                    "messages.{index}.content: a block of type {other:?} has no place in an assistant message"
                ));
            }
        }
    }
    Ok(calls)
}

/// A user message's blocks, answering `calls`, the ids of the previous
/// message's `tool_use` blocks: every call answered, results first and in
/// the calls' order, none for another call.
fn check_answers(blocks: &[Value], calls: &[String], index: usize) -> Result<(), String> {
    let mut answered = Vec::new();
    let mut other_seen = false;
    for block in blocks {
        match block["type"].as_str() {
            Some("tool_result") => {
                if other_seen {
                    return Err(format!(
                        "messages.{index}: tool_result blocks must come FIRST in the content array, before any other content"
                    ));
                }
                let id = block["tool_use_id"].as_str().unwrap_or_default();
                if !calls.iter().any(|call| call == id) {
                    return Err(format!(
                        "messages.{index}.content: unexpected `tool_use_id` found in `tool_result` blocks: {id}. \
                         Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                    ));
                }
                match &block["content"] {
                    Value::String(text) if text.is_empty() => {
                        return Err(format!(
                            "messages.{index}.content: text content blocks must be non-empty"
                        ));
                    }
                    Value::String(_) | Value::Array(_) | Value::Null => {}
                    _ => {
                        return Err(format!(
                            "messages.{index}.content: a tool_result's content must be text or blocks"
                        ));
                    }
                }
                answered.push(id.to_owned());
            }
            Some("text" | "image" | "document") => other_seen = true,
            other => {
                return Err(format!(
                    "messages.{index}.content: a block of type {other:?} has no place in a user message"
                ));
            }
        }
    }
    let missing: Vec<String> = calls
        .iter()
        .filter(|call| !answered.contains(call))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(unanswered(&missing));
    }
    if answered != calls {
        return Err(format!(
            "messages.{index}: tool_result blocks must be in the order of their tool_use blocks"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(messages: Value) -> Value {
        json!({"model": "claude-test", "max_tokens": 100, "messages": messages})
    }

    fn calls(ids: &[&str]) -> Value {
        let blocks: Vec<Value> = ids
            .iter()
            .map(|id| json!({"type": "tool_use", "id": id, "name": "calculate", "input": {}}))
            .collect();
        json!({"role": "assistant", "content": blocks})
    }

    fn results(ids: &[&str]) -> Value {
        let blocks: Vec<Value> = ids
            .iter()
            .map(|id| json!({"type": "tool_result", "tool_use_id": id, "content": "4"}))
            .collect();
        json!({"role": "user", "content": blocks})
    }

    /// The requests of Anthropic's documentation
    /// (orchestrator/tests/fixtures/anthropic) pass: the fake is not
    /// stricter than the API where the API is documented.
    #[test]
    fn it_accepts_the_documentations_requests() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../orchestrator/tests/fixtures/anthropic");
        for name in ["request-tools.json", "request-thinking-tool-result.json"] {
            let text = std::fs::read_to_string(dir.join(name)).expect("the fixture");
            let body: Value = serde_json::from_str(&text).expect("JSON");
            assert_eq!(check(&body), Ok(()), "{name}");
        }
    }

    #[test]
    fn it_accepts_a_whole_tool_loop() {
        let ok = request(json!([
            {"role": "user", "content": "2+2 and 3+3?"},
            calls(&["a", "b"]),
            results(&["a", "b"]),
        ]));
        assert_eq!(check(&ok), Ok(()));
    }

    #[test]
    fn it_refuses_what_the_real_api_refuses() {
        let user = json!({"role": "user", "content": "hi"});
        let mut no_max = request(json!([user]));
        no_max.as_object_mut().unwrap().remove("max_tokens");
        assert!(check(&no_max).unwrap_err().contains("max_tokens"));
        let empty = request(json!([{"role": "user", "content": [{"type": "text", "text": ""}]}]));
        assert!(check(&empty).unwrap_err().contains("non-empty"));
        let blank =
            request(json!([{"role": "user", "content": [{"type": "text", "text": " \n"}]}]));
        assert!(check(&blank).unwrap_err().contains("non-whitespace"));
        let twice = request(json!([user, user]));
        assert!(check(&twice).unwrap_err().contains("alternate"));
        let orphan = request(json!([user, calls(&["a"]), results(&["b"])]));
        assert!(
            check(&orphan)
                .unwrap_err()
                .contains("unexpected `tool_use_id`")
        );
        let unanswered = request(json!([user, calls(&["a", "b"]), results(&["a"])]));
        assert!(
            check(&unanswered)
                .unwrap_err()
                .contains("without `tool_result`")
        );
        let reversed = request(json!([user, calls(&["a", "b"]), results(&["b", "a"])]));
        assert!(check(&reversed).unwrap_err().contains("order"));
        let mut text_first = results(&["a"]);
        text_first["content"]
            .as_array_mut()
            .unwrap()
            .insert(0, json!({"type": "text", "text": "here"}));
        let late = request(json!([user, calls(&["a"]), text_first]));
        assert!(check(&late).unwrap_err().contains("FIRST"));
        let mut choice = request(json!([user]));
        choice["tool_choice"] = json!({"type": "auto"});
        assert!(check(&choice).unwrap_err().contains("tool_choice"));
    }
}
