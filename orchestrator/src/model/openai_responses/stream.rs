//! A streamed Responses answer: its last event (`response.completed`,
//! `response.incomplete` or `response.failed`) carries the whole response,
//! which is read as a plain answer is; the text and the calls' names go to
//! the job's deltas as they come (`response.output_text.delta`,
//! `response.output_item.added`). An `error` event may end the stream.

use serde_json::Value;

use crate::model::http::{StreamError, StreamReader, quote};
use crate::model::{Delta, DeltaOut};

/// Reads one streamed answer.
#[derive(Default)]
pub(super) struct Reader {
    /// Calls named so far.
    calls: usize,
}

impl StreamReader for Reader {
    fn restart(&mut self) {
        self.calls = 0;
    }

    fn event(
        &mut self,
        name: &str,
        data: &str,
        deltas: &mut DeltaOut<'_>,
    ) -> Result<Option<Value>, StreamError> {
        let event: Value = serde_json::from_str(data).map_err(|_| {
            StreamError::Transient(format!(
                "malformed stream: an event that is not JSON: {}",
                quote(data)
            ))
        })?;
        let kind = event["type"].as_str().unwrap_or(name);
        match kind {
            "response.output_text.delta" => {
                let text = event["delta"].as_str().unwrap_or_default();
                if !text.is_empty() {
                    deltas.send(Delta::Text(text.to_owned()));
                }
            }
            "response.output_item.added" if event["item"]["type"] == "function_call" => {
                let name = event["item"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                let index = self.calls;
                self.calls += 1;
                deltas.send(Delta::ToolCall { index, name });
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                let response = event["response"].clone();
                if !response.is_object() {
                    return Err(StreamError::Transient(
                        "malformed stream: its last event has no response".to_owned(),
                    ));
                }
                return Ok(Some(response));
            }
            "error" => {
                return Err(StreamError::in_band(&event));
            }
            // Everything else repeats what the last event carries.
            _ => {}
        }
        Ok(None)
    }
}
