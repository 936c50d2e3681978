//! A streamed Chat Completions answer: chunks of `choices[0].delta`, whose
//! text and calls (by `index`, a call's name first, then fragments of its
//! arguments) are put together into the completion a plain answer would
//! have been, read by the same code; `data: [DONE]` ends it. The text and
//! each call's name go to the job's deltas as they come.
//!
//! Compatible servers have repeated a call's name in later chunks (vLLM):
//! a name is taken once, never concatenated.

use serde_json::{Value, json};

use crate::model::http::{StreamError, StreamReader, quote};
use crate::model::{Delta, DeltaOut};

/// A call being put together.
#[derive(Default)]
struct Call {
    id: Option<String>,
    name: Option<String>,
    arguments: String,
}

/// Reads one streamed answer.
#[derive(Default)]
pub(super) struct Reader {
    content: String,
    refusal: String,
    calls: Vec<Call>,
    finish_reason: Value,
    usage: Value,
    /// The completion's id and model, as its chunks say them.
    id: Value,
    model: Value,
}

impl Reader {
    /// One chunk's `choices[0]`.
    fn choice(&mut self, choice: &Value, deltas: &mut DeltaOut<'_>) -> Result<(), StreamError> {
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str().filter(|text| !text.is_empty()) {
            self.content.push_str(text);
            deltas.send(Delta::Text(text.to_owned()));
        }
        if let Some(refusal) = delta["refusal"].as_str() {
            self.refusal.push_str(refusal);
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            for call in calls {
                self.call(call, deltas)?;
            }
        }
        if !choice["finish_reason"].is_null() {
            self.finish_reason = choice["finish_reason"].clone();
        }
        Ok(())
    }

    /// A fragment of the call at its `index`.
    fn call(&mut self, fragment: &Value, deltas: &mut DeltaOut<'_>) -> Result<(), StreamError> {
        // Calls come in order; an index further on than the next one is
        // not a call this stream started.
        let index = fragment["index"]
            .as_u64()
            .and_then(|index| usize::try_from(index).ok())
            .filter(|index| *index <= self.calls.len())
            .ok_or_else(|| malformed("a tool call fragment out of order"))?;
        if index == self.calls.len() {
            self.calls.push(Call::default());
        }
        let function = &fragment["function"];
        let call = &mut self.calls[index];
        if let Some(id) = fragment["id"].as_str().filter(|id| !id.is_empty()) {
            call.id.get_or_insert_with(|| id.to_owned());
        }
        call.arguments
            .push_str(function["arguments"].as_str().unwrap_or_default());
        let named = match function["name"].as_str().filter(|name| !name.is_empty()) {
            Some(name) if call.name.is_none() => {
                call.name = Some(name.to_owned());
                Some(name.to_owned())
            }
            _ => None,
        };
        if let Some(name) = named {
            deltas.send(Delta::ToolCall { index, name });
        }
        Ok(())
    }

    /// The completion a plain answer would have been.
    fn completion(&mut self) -> Value {
        let calls: Vec<Value> = self
            .calls
            .drain(..)
            .map(|call| {
                json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                })
            })
            .collect();
        let mut message = json!({"role": "assistant", "content": self.content});
        if !self.refusal.is_empty() {
            message["refusal"] = json!(self.refusal);
        }
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        json!({
            "id": self.id,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
            "usage": self.usage,
        })
    }
}

impl StreamReader for Reader {
    fn restart(&mut self) {
        self.content.clear();
        self.refusal.clear();
        self.calls.clear();
        self.finish_reason = Value::Null;
        self.usage = Value::Null;
        self.id = Value::Null;
        self.model = Value::Null;
    }

    fn event(
        &mut self,
        _name: &str,
        data: &str,
        deltas: &mut DeltaOut<'_>,
    ) -> Result<Option<Value>, StreamError> {
        if data.trim() == "[DONE]" {
            return Ok(Some(self.completion()));
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|_| malformed(&format!("a chunk that is not JSON: {}", quote(data))))?;
        // Gateways report an upstream failure as a chunk with an error.
        if let Some(error) = chunk.get("error").filter(|error| !error.is_null()) {
            return Err(StreamError::in_band(error));
        }
        if let Some(choice) = chunk["choices"]
            .as_array()
            .and_then(|choices| choices.first())
        {
            self.choice(choice, deltas)?;
        }
        // Every chunk repeats them; the first is kept.
        for (field, kept) in [("id", &mut self.id), ("model", &mut self.model)] {
            if kept.is_null() && chunk[field].is_string() {
                *kept = chunk[field].clone();
            }
        }
        // With `stream_options.include_usage`, the last chunk's.
        if chunk["usage"].is_object() {
            self.usage = chunk["usage"].clone();
        }
        Ok(None)
    }
}

fn malformed(what: &str) -> StreamError {
    StreamError::Transient(format!("malformed stream: {what}"))
}
