//! A streamed Messages answer, read event by event into the message the
//! API would have answered without a stream, so that the turn is read by
//! the same code either way; the text and the calls' names go to the
//! job's deltas as they come.
//!
//! The events (orchestrator/tests/fixtures/anthropic/README.md):
//! `message_start`, then per content block `content_block_start`, its
//! `content_block_delta`s and `content_block_stop`, then `message_delta`
//! (the stop reason and the usage so far) and `message_stop`; `ping` may
//! come anywhere, and an `error` event may end a stream that began with a
//! 200.

use serde_json::{Map, Value, json};

use crate::model::http::{StreamError, StreamReader, quote};
use crate::model::{Delta, DeltaOut, ModelError};

/// Error types of an `error` event that another attempt may cure.
const TRANSIENT_ERRORS: &[&str] = &[
    "overloaded_error",
    "api_error",
    "rate_limit_error",
    "timeout_error",
];

/// Reads one streamed answer.
#[derive(Default)]
pub(super) struct Reader {
    /// The message as `message_start` began it.
    message: Map<String, Value>,
    /// Its content blocks so far.
    blocks: Vec<Value>,
    /// The `partial_json` of each tool call's input so far, by block.
    inputs: Vec<Option<String>>,
    /// Calls named so far.
    calls: usize,
}

impl Reader {
    /// `content_block_start`: a block is added at its index.
    fn start(&mut self, event: &Value, deltas: &mut DeltaOut<'_>) -> Result<(), StreamError> {
        let block = event["content_block"].clone();
        if event["index"].as_u64() != Some(self.blocks.len() as u64) || !block.is_object() {
            return Err(malformed("a content block started out of order"));
        }
        match block["type"].as_str() {
            Some("tool_use") => {
                let name = block["name"].as_str().unwrap_or_default().to_owned();
                let index = self.calls;
                self.calls += 1;
                deltas.send(Delta::ToolCall { index, name });
                self.inputs.push(Some(String::new()));
            }
            Some("text") => {
                let text = block["text"].as_str().unwrap_or_default().to_owned();
                if !text.is_empty() {
                    deltas.send(Delta::Text(text));
                }
                self.inputs.push(None);
            }
            _ => self.inputs.push(None),
        }
        self.blocks.push(block);
        Ok(())
    }

    /// `content_block_delta`: more of a block.
    fn delta(&mut self, event: &Value, deltas: &mut DeltaOut<'_>) -> Result<(), StreamError> {
        let index = self.index(event)?;
        let delta = &event["delta"];
        let piece = |name: &str| delta[name].as_str().unwrap_or_default().to_owned();
        match delta["type"].as_str() {
            Some("text_delta") => {
                let text = piece("text");
                append(&mut self.blocks[index], "text", &text);
                if !text.is_empty() {
                    deltas.send(Delta::Text(text));
                }
            }
            Some("input_json_delta") => match &mut self.inputs[index] {
                Some(input) => input.push_str(&piece("partial_json")),
                None => return Err(malformed("arguments for a block that is no tool call")),
            },
            Some("thinking_delta") => {
                append(&mut self.blocks[index], "thinking", &piece("thinking"))
            }
            Some("signature_delta") => {
                self.blocks[index]["signature"] = json!(piece("signature"));
            }
            // Citations and what a later version adds are not ours to read.
            _ => {}
        }
        Ok(())
    }

    /// `content_block_stop`: a tool call's arguments are whole.
    fn stop(&mut self, event: &Value) -> Result<(), StreamError> {
        let index = self.index(event)?;
        if let Some(input) = self.inputs[index].take() {
            let input = if input.trim().is_empty() {
                Value::Object(Map::new())
            } else {
                serde_json::from_str(&input).map_err(|_| {
                    malformed(&format!(
                        "a tool call's arguments are not JSON: {}",
                        quote(&input)
                    ))
                })?
            };
            self.blocks[index]["input"] = input;
        }
        Ok(())
    }

    /// The block an event names, which must have started.
    fn index(&self, event: &Value) -> Result<usize, StreamError> {
        event["index"]
            .as_u64()
            .and_then(|index| usize::try_from(index).ok())
            .filter(|index| *index < self.blocks.len())
            .ok_or_else(|| malformed("an event for a block that never started"))
    }

    /// `message_stop`: the message, whole, as a non-streamed answer.
    fn finish(&mut self) -> Result<Value, StreamError> {
        if self.inputs.iter().any(Option::is_some) {
            return Err(malformed("the stream ended inside a tool call's arguments"));
        }
        let mut message = std::mem::take(&mut self.message);
        message.insert(
            "content".into(),
            Value::Array(std::mem::take(&mut self.blocks)),
        );
        Ok(Value::Object(message))
    }
}

impl StreamReader for Reader {
    fn restart(&mut self) {
        self.message.clear();
        self.blocks.clear();
        self.inputs.clear();
        self.calls = 0;
    }

    fn event(
        &mut self,
        name: &str,
        data: &str,
        deltas: &mut DeltaOut<'_>,
    ) -> Result<Option<Value>, StreamError> {
        let event: Value = serde_json::from_str(data)
            .map_err(|_| malformed(&format!("an event that is not JSON: {}", quote(data))))?;
        // The SSE name and the data's `type` are the same; the data wins.
        let kind = event["type"].as_str().unwrap_or(name);
        match kind {
            "message_start" => {
                self.message = event["message"].as_object().cloned().unwrap_or_default();
            }
            "content_block_start" => self.start(&event, deltas)?,
            "content_block_delta" => self.delta(&event, deltas)?,
            "content_block_stop" => self.stop(&event)?,
            "message_delta" => {
                for field in ["stop_reason", "stop_sequence"] {
                    if let Some(value) = event["delta"].get(field) {
                        self.message.insert(field.into(), value.clone());
                    }
                }
                // Counts here are running totals: they replace.
                if let Some(usage) = event["usage"].as_object() {
                    let total = self.message.entry("usage").or_insert_with(|| json!({}));
                    for (name, count) in usage {
                        total[name] = count.clone();
                    }
                }
            }
            "message_stop" => return self.finish().map(Some),
            "error" => return Err(stream_error(&event["error"])),
            // `ping`, and events a later version adds.
            _ => {}
        }
        Ok(None)
    }
}

fn append(block: &mut Value, field: &str, piece: &str) {
    let text = format!("{}{piece}", block[field].as_str().unwrap_or_default());
    block[field] = json!(text);
}

fn malformed(what: &str) -> StreamError {
    StreamError::Transient(format!("malformed stream: {what}"))
}

/// An `error` event: transient when the API is busy, final otherwise.
fn stream_error(error: &Value) -> StreamError {
    let kind = error["type"].as_str().unwrap_or("error");
    let message = quote(error["message"].as_str().unwrap_or("no error message"));
    if TRANSIENT_ERRORS.contains(&kind) {
        StreamError::Transient(format!("{kind} during the stream: {message}"))
    } else {
        StreamError::Fatal(ModelError::Rejected {
            status: 200,
            code: Some(kind.to_owned()),
            message,
        })
    }
}
