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
//!   verbatim, so a test can send malformed JSON). The strings of an object
//!   may quote tool outputs as a message does (below); a string that is one
//!   reference and nothing else becomes the value it names, a number stays
//!   a number: `{"ref": "{{call_0_0.data.ref}}", "offset":
//!   "{{call_1_0.data.next_offset}}"}`.
//! - Call ids are `call_<turn>_<index>` unless the call gives an `id`.
//! - A `message` may quote tool outputs: `{{<call_id>}}` is replaced by that
//!   call's whole envelope JSON, `{{<call_id>.<path>}}` by the value at a
//!   dot-separated path into the envelope (`data.temperature`,
//!   `error.code`); strings are inserted without quotes. A reference that
//!   names nothing (no such call before this turn, or no such path in its
//!   answer, as `data` of a call that failed) fails the job with
//!   `SCRIPT_ERROR` saying what the call answered: a scripted answer never
//!   carries a placeholder. `{{` without `}}` is plain text.
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
    /// `ModelError::Script` naming what is wrong: not JSON, not an array,
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
        let limit = self.max_answer_bytes;
        let in_turn =
            |what| move |problem: QuoteProblem| problem.in_turn(request.turn, what, limit);
        if let Some(message) = &turn.message {
            let text = quote_outputs(message, request.items, limit).map_err(in_turn("message"))?;
            items.push(Item::Assistant { text, raw: None });
        }
        for (index, call) in turn.tool_calls.iter().enumerate() {
            let arguments = match &call.arguments {
                Value::String(text) => text.clone(),
                other => quote_arguments(other, request.items, limit)
                    .map_err(in_turn("arguments"))?
                    .to_string(),
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
        Ok(Turn {
            items,
            ..Turn::default()
        })
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

/// Why a message could not be quoted.
#[derive(Debug, PartialEq)]
enum QuoteProblem {
    /// The message would exceed its byte limit.
    TooLong,
    /// `{{reference}}` names nothing, for `why`.
    NamesNothing { reference: String, why: String },
}

impl QuoteProblem {
    /// The job's error for a problem of turn `turn`'s `what` (its message,
    /// or a call's arguments).
    fn in_turn(self, turn: u32, what: &str, limit: usize) -> ModelError {
        ModelError::Script(match self {
            Self::TooLong => format!(
                "turn {turn}'s {what} is over {limit} bytes once tool outputs are quoted \
                 (api.max_scripted_answer_bytes)"
            ),
            Self::NamesNothing { reference, why } => {
                format!(
                    "turn {turn}'s {what} quotes {{{{{reference}}}}}, which names nothing: {why}"
                )
            }
        })
    }
}

/// Longest excerpt of a call's answer in a [`QuoteProblem`].
const ANSWER_EXCERPT: usize = 200;

/// Replaces `{{call_id}}` and `{{call_id.path}}` with tool outputs, within
/// `limit` bytes.
fn quote_outputs(message: &str, items: &[Item], limit: usize) -> Result<String, QuoteProblem> {
    let mut out = String::with_capacity(message.len().min(limit));
    let mut rest = message;
    let push = |out: &mut String, text: &str| {
        if out.len() + text.len() > limit {
            return Err(QuoteProblem::TooLong);
        }
        out.push_str(text);
        Ok(())
    };
    while let Some(start) = rest.find("{{") {
        push(&mut out, &rest[..start])?;
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            push(&mut out, &rest[start..])?;
            return Ok(out);
        };
        let reference = after[..end].trim();
        let quoted = resolve(reference, items).map_err(|why| QuoteProblem::NamesNothing {
            reference: toolfleet_proto::envelope::excerpt(reference, 80),
            why,
        })?;
        push(&mut out, &quoted)?;
        rest = &after[end + 2..];
    }
    push(&mut out, rest)?;
    Ok(out)
}

/// `arguments` with every string in it quoted as a message is, within
/// `limit` bytes each; a string that is one `{{reference}}` alone becomes
/// the value it names.
fn quote_arguments(arguments: &Value, items: &[Item], limit: usize) -> Result<Value, QuoteProblem> {
    Ok(match arguments {
        Value::String(text) => {
            let alone = text
                .strip_prefix("{{")
                .and_then(|rest| rest.strip_suffix("}}"))
                .filter(|reference| !reference.contains("{{") && !reference.contains("}}"));
            match alone {
                Some(reference) => {
                    let reference = reference.trim();
                    resolve_value(reference, items).map_err(|why| QuoteProblem::NamesNothing {
                        reference: toolfleet_proto::envelope::excerpt(reference, 80),
                        why,
                    })?
                }
                None => Value::String(quote_outputs(text, items, limit)?),
            }
        }
        Value::Array(values) => Value::Array(
            values
                .iter()
                .map(|value| quote_arguments(value, items, limit))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(key, value)| Ok((key.clone(), quote_arguments(value, items, limit)?)))
                .collect::<Result<_, QuoteProblem>>()?,
        ),
        other => other.clone(),
    })
}

/// What `reference` (`call_id` or `call_id.path`) quotes, or why nothing.
fn resolve(reference: &str, items: &[Item]) -> Result<String, String> {
    Ok(match resolve_value(reference, items)? {
        Value::String(text) => text,
        other => other.to_string(),
    })
}

/// The value `reference` (`call_id` or `call_id.path`) names: the call's
/// whole envelope JSON as a string, or the value at the path, or why
/// nothing.
fn resolve_value(reference: &str, items: &[Item]) -> Result<Value, String> {
    let (call_id, path) = match reference.split_once('.') {
        Some((id, path)) => (id, Some(path)),
        None => (reference, None),
    };
    let output = items
        .iter()
        .rev()
        .find_map(|item| match item {
            Item::ToolResult {
                call_id: id,
                output,
                ..
            } if id == call_id => Some(output),
            _ => None,
        })
        .ok_or_else(|| "no call of that id answered before this turn".to_owned())?;
    let Some(path) = path else {
        return Ok(Value::String(output.clone()));
    };
    let missing = || {
        let answer = toolfleet_proto::envelope::excerpt(output, ANSWER_EXCERPT);
        format!("the call's answer has no {path}; it answered {answer}")
    };
    let mut value: Value = serde_json::from_str(output).map_err(|_| missing())?;
    for key in path.split('.') {
        value = match value {
            Value::Object(mut map) => map.remove(key),
            Value::Array(mut list) => key
                .parse::<usize>()
                .ok()
                .filter(|index| *index < list.len())
                .map(|index| list.swap_remove(index)),
            _ => None,
        }
        .ok_or_else(missing)?;
    }
    Ok(value)
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
            max_tokens: None,
            deltas: None,
        }
    }

    #[tokio::test]
    async fn plays_calls_then_a_message_that_quotes_outputs() {
        let script = Scripted::parse(
            r#"[{"tool_calls":[{"name":"calculate","arguments":{"expression":"2+2"}},
                               {"name":"x","arguments":"not json","id":"mine"}]},
                {"message":"2+2={{call_0_0.data.result}}, {{mine.error.code}}, {{call_0_0}}, {{ unclosed"},
                {"message":"{{mine.data.result}}"},
                {"message":"{{nope}}"}]"#,
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
            format!("2+2=4, UNKNOWN_TOOL, {ok}, {{{{ unclosed")
        );
        assert_eq!(second.tool_calls().count(), 0);
        // A reference that names nothing fails the job, saying why.
        let err = script.turn(request(&history, 2)).await.unwrap_err();
        assert_eq!(err.code().as_str(), "SCRIPT_ERROR");
        let message = err.to_string();
        assert!(
            message.contains("{{mine.data.result}}, which names nothing")
                && message.contains("UNKNOWN_TOOL"),
            "{message}"
        );
        let err = script.turn(request(&history, 3)).await.unwrap_err();
        assert!(
            err.to_string().contains("no call of that id answered"),
            "{err}"
        );
        let err = script.turn(request(&history, 4)).await.unwrap_err();
        assert_eq!(err.code().as_str(), "SCRIPT_ERROR");
    }

    #[tokio::test]
    async fn arguments_quote_outputs_and_a_lone_reference_keeps_its_type() {
        let script = Scripted::parse(
            r#"[{"tool_calls":[{"name":"read_result","arguments":{
                    "ref":"{{c.data.ref}}", "offset":"{{ c.data.next }}",
                    "note":"at {{c.data.next}} of {{c.data.ref}}", "list":["{{c.data.flag}}"],
                    "raw":"{{ unclosed", "n":7}}]},
                {"tool_calls":[{"name":"x","arguments":{"a":"{{c.data.nope}}"}}]}]"#,
        )
        .unwrap();
        let history = [Item::ToolResult {
            call_id: "c".into(),
            name: "echo".into(),
            output: r#"{"ok":true,"data":{"ref":"j/c","next":42,"flag":true}}"#.into(),
            attempts: 1,
        }];
        let turn = script.turn(request(&history, 0)).await.unwrap();
        let Item::ToolCall { arguments, .. } = &turn.items[0] else {
            panic!("a call: {:?}", turn.items)
        };
        let arguments: Value = serde_json::from_str(arguments).unwrap();
        assert_eq!(
            arguments,
            serde_json::json!({"ref": "j/c", "offset": 42, "note": "at 42 of j/c",
                               "list": [true], "raw": "{{ unclosed", "n": 7})
        );
        let err = script.turn(request(&history, 1)).await.unwrap_err();
        assert!(
            err.to_string()
                .contains("turn 1's arguments quotes {{c.data.nope}}, which names nothing"),
            "{err}"
        );
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
