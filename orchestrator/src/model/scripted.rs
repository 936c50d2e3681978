//! The scripted model: plays a script from the job spec, so the whole system
//! runs (demos, tests, benchmarks) without an API key.
//!
//! A script is a JSON array of turns. Turn `n` of the job plays entry `n`:
//!
//! ```json
//! [
//!   {"tool_calls": [
//!      {"name": "get_current_weather", "arguments": {"location": "Boston, MA", "unit": "celsius"}},
//!      {"name": "calculate", "arguments": "{\"expression\": \"2+2\"}", "id": "call_math"}]},
//!   {"delay_ms": 200, "message": "It is {{call_0_0.data.temperature}} degrees; 2+2={{call_math.data.result}}."}
//! ]
//! ```
//!
//! - `arguments` is an object (sent as its JSON text) or a string (sent
//!   verbatim, so a test can send malformed JSON).
//! - Call ids are `call_<turn>_<index>` unless the call gives an `id`.
//! - A `message` may quote tool outputs: `{{<call_id>}}` is replaced by that
//!   call's whole envelope JSON, `{{<call_id>.<path>}}` by the value at a
//!   dot-separated path into the envelope (`data.temperature`,
//!   `error.code`); strings are inserted without quotes. An unknown call id or
//!   path is left as it is.
//! - `delay_ms` makes the turn take that long (a slow model).
//! - A job that needs more turns than the script has fails with `SCRIPT_ERROR`.

use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::Value;

use super::{ModelError, Provider, Turn, TurnRequest};
use crate::job::Item;

/// One turn of a script.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptTurn {
    #[serde(default)]
    tool_calls: Vec<ScriptCall>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    delay_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptCall {
    name: String,
    #[serde(default = "empty_object")]
    arguments: Value,
    #[serde(default)]
    id: Option<String>,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// A parsed, validated script.
#[derive(Debug, Clone)]
pub struct Scripted {
    turns: Vec<ScriptTurn>,
    /// Largest message once outputs are quoted: a few quotes of a large
    /// output in a long script would otherwise multiply into gigabytes.
    max_answer_bytes: usize,
}

/// The answer limit of a script parsed without one.
const DEFAULT_MAX_ANSWER_BYTES: usize = 1024 * 1024;

impl Scripted {
    /// Parses a script.
    ///
    /// # Errors
    ///
    /// [`ModelError::Script`] naming what is wrong: not JSON, not an array,
    /// a turn with neither `tool_calls` nor `message`, or an empty array.
    pub fn parse(script: &str) -> Result<Self, ModelError> {
        let turns: Vec<ScriptTurn> = serde_json::from_str(script).map_err(|e| {
            ModelError::Script(format!(
                "the script is not a valid JSON array of turns: {e}"
            ))
        })?;
        if turns.is_empty() {
            return Err(ModelError::Script("the script has no turns".into()));
        }
        for (n, turn) in turns.iter().enumerate() {
            if turn.tool_calls.is_empty() && turn.message.is_none() {
                return Err(ModelError::Script(format!(
                    "turn {n} has neither tool_calls nor a message"
                )));
            }
        }
        Ok(Self {
            turns,
            max_answer_bytes: DEFAULT_MAX_ANSWER_BYTES,
        })
    }

    /// The same script, whose messages may not exceed `bytes` once tool
    /// outputs are quoted into them.
    #[must_use]
    pub fn with_answer_limit(mut self, bytes: u64) -> Self {
        self.max_answer_bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        self
    }

    /// The id of call `index` of turn `turn` when the script gives none.
    pub fn call_id(turn: u32, index: usize) -> String {
        format!("call_{turn}_{index}")
    }

    pub(crate) fn play(&self, request: &TurnRequest<'_>) -> Result<Turn, ModelError> {
        let turn = self.turns.get(request.turn as usize).ok_or_else(|| {
            ModelError::Script(format!(
                "the job needs turn {} but the script has only {}",
                request.turn,
                self.turns.len()
            ))
        })?;
        let mut items = Vec::new();
        if let Some(message) = &turn.message {
            let text =
                quote_outputs(message, request.items, self.max_answer_bytes).ok_or_else(|| {
                    ModelError::Script(format!(
                        "turn {}'s message is over {} bytes once tool outputs are quoted \
                         (api.max_scripted_answer_bytes)",
                        request.turn, self.max_answer_bytes
                    ))
                })?;
            items.push(Item::Assistant { text, raw: None });
        }
        for (index, call) in turn.tool_calls.iter().enumerate() {
            let arguments = match &call.arguments {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            items.push(Item::ToolCall {
                call_id: call
                    .id
                    .clone()
                    .unwrap_or_else(|| Self::call_id(request.turn, index)),
                name: call.name.clone(),
                arguments,
                raw: None,
            });
        }
        Ok(Turn { items, usage: None })
    }
}

impl Provider for Scripted {
    fn turn<'a>(&'a self, request: TurnRequest<'a>) -> BoxFuture<'a, Result<Turn, ModelError>> {
        async move {
            let delay = self
                .turns
                .get(request.turn as usize)
                .map_or(0, |t| t.delay_ms);
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let turn = self.play(&request)?;
            // The fault tests count these lines (their orchestrators log at
            // debug): a turn must never be played twice. At info they would
            // be half of a bench job's log lines, which a real provider's
            // jobs do not write.
            tracing::debug!(turn = request.turn, "scripted turn played");
            Ok(turn)
        }
        .boxed()
    }
}

/// Replaces `{{call_id}}` and `{{call_id.path}}` with tool outputs; `None`
/// as soon as the result would exceed `limit` bytes.
fn quote_outputs(message: &str, items: &[Item], limit: usize) -> Option<String> {
    let mut out = String::with_capacity(message.len().min(limit));
    let mut rest = message;
    let push = |out: &mut String, text: &str| {
        (out.len() + text.len() <= limit).then(|| out.push_str(text))
    };
    while let Some(start) = rest.find("{{") {
        push(&mut out, &rest[..start])?;
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            push(&mut out, &rest[start..])?;
            return Some(out);
        };
        let reference = after[..end].trim();
        match resolve(reference, items) {
            Some(text) => push(&mut out, &text)?,
            None => push(&mut out, &rest[start..start + 2 + end + 2])?,
        }
        rest = &after[end + 2..];
    }
    push(&mut out, rest)?;
    Some(out)
}

fn resolve(reference: &str, items: &[Item]) -> Option<String> {
    let (call_id, path) = match reference.split_once('.') {
        Some((id, path)) => (id, Some(path)),
        None => (reference, None),
    };
    let output = items.iter().rev().find_map(|item| match item {
        Item::ToolResult {
            call_id: id,
            output,
            ..
        } if id == call_id => Some(output),
        _ => None,
    })?;
    let Some(path) = path else {
        return Some(output.clone());
    };
    let mut value: Value = serde_json::from_str(output).ok()?;
    for key in path.split('.') {
        value = match value {
            Value::Object(mut map) => map.remove(key)?,
            Value::Array(mut list) => {
                let index: usize = key.parse().ok()?;
                (index < list.len()).then(|| list.swap_remove(index))?
            }
            _ => return None,
        };
    }
    Some(match value {
        Value::String(text) => text,
        other => other.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request<'a>(items: &'a [Item], turn: u32) -> TurnRequest<'a> {
        TurnRequest {
            model: "",
            instructions: "",
            items,
            tools: &[],
            parallel_tool_calls: true,
            turn,
        }
    }

    #[tokio::test]
    async fn plays_calls_then_a_message_that_quotes_outputs() {
        let script = Scripted::parse(
            r#"[{"tool_calls":[{"name":"calculate","arguments":{"expression":"2+2"}},
                               {"name":"x","arguments":"not json","id":"mine"}]},
                {"message":"2+2={{call_0_0.data.result}}, {{mine.error.code}}, {{nope}}, {{call_0_0}}"}]"#,
        )
        .unwrap();
        let first = script.turn(request(&[], 0)).await.unwrap();
        assert_eq!(
            first.items,
            vec![
                Item::ToolCall {
                    call_id: "call_0_0".into(),
                    name: "calculate".into(),
                    arguments: r#"{"expression":"2+2"}"#.into(),
                    raw: None
                },
                Item::ToolCall {
                    call_id: "mine".into(),
                    name: "x".into(),
                    arguments: "not json".into(),
                    raw: None
                },
            ]
        );
        let ok = r#"{"ok":true,"data":{"result":4}}"#;
        let history = vec![
            Item::ToolResult {
                call_id: "call_0_0".into(),
                name: "calculate".into(),
                output: ok.into(),
                attempts: 1,
            },
            Item::ToolResult {
                call_id: "mine".into(),
                name: "x".into(),
                output:
                    r#"{"ok":false,"error":{"code":"UNKNOWN_TOOL","message":"","retryable":false}}"#
                        .into(),
                attempts: 0,
            },
        ];
        let second = script.turn(request(&history, 1)).await.unwrap();
        assert_eq!(
            second.text(),
            format!("2+2=4, UNKNOWN_TOOL, {{{{nope}}}}, {ok}")
        );
        assert_eq!(second.tool_calls().count(), 0);
        let err = script.turn(request(&history, 2)).await.unwrap_err();
        assert_eq!(err.code().as_str(), "SCRIPT_ERROR");
    }

    #[test]
    fn bad_scripts_are_rejected_with_a_reason() {
        for (script, reason) in [
            ("not json", "not a valid JSON array"),
            ("{}", "not a valid JSON array"),
            ("[]", "no turns"),
            ("[{}]", "neither tool_calls nor a message"),
            (r#"[{"tool_calls":[{"arguments":{}}]}]"#, "name"),
            (r#"[{"message":"hi","shell":"rm"}]"#, "shell"),
        ] {
            let err = Scripted::parse(script).unwrap_err().to_string();
            assert!(err.contains(reason), "{script}: {err}");
        }
    }
}
