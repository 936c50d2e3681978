//! What an MCP server's answer to `tools/call` becomes (docs/tools/mcp.md,
//! "Results and errors"): the `data` of a success, or the error the model
//! sees. A server's bytes are as hostile as any backend's: sizes are
//! bounded, and only the text of an `isError` result, which MCP meant for
//! the model, reaches a message.

use rmcp::ServiceError;
use rmcp::model::{CallToolResult, ErrorCode as RpcCode};
use serde_json::{Map, Value, json};
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::{Effects, ErrorCode};

use super::defect::Defect;
use crate::tool::ToolError;

/// The code of a result the server marked `isError`: the tool ran and
/// failed, and says why, for the model to act on.
pub const TOOL_ERROR: ErrorCode = ErrorCode::from_static("TOOL_ERROR");
/// The code of a server that asked for more input (`input_required`,
/// protocol 2026-07-28), which a call through the fleet cannot give.
pub const INPUT_REQUIRED: ErrorCode = ErrorCode::from_static("INPUT_REQUIRED");

/// Longest message taken from an `isError` result, in characters.
const ERROR_CHARS: usize = 2_000;
/// Largest base64 payload of one image, audio or blob block kept in
/// `data`; a larger one is replaced by its size.
pub(super) const MAX_BINARY_CHARS: usize = 256 * 1024;

/// The `data` of a successful result, or the error of one marked
/// `isError`.
///
/// # Errors
///
/// [`TOOL_ERROR`], terminal, with the text blocks of the result.
pub(super) fn outcome(result: CallToolResult) -> Result<Value, ToolError> {
    if result.is_error == Some(true) {
        let text = texts(&result);
        let message = if text.is_empty() {
            "the tool reported an error without saying why".to_owned()
        } else {
            excerpt(&text, ERROR_CHARS)
        };
        return Err(ToolError::terminal(TOOL_ERROR, message));
    }
    Ok(data(result))
}

/// `structuredContent` when the server gave it (the typed result); else
/// `{"content": [...]}`, the content blocks in MCP's own shape, binary
/// payloads over [`MAX_BINARY_CHARS`] replaced by their size.
fn data(result: CallToolResult) -> Value {
    if let Some(structured) = result.structured_content {
        return structured;
    }
    let mut blocks = serde_json::to_value(&result.content).unwrap_or(Value::Array(Vec::new()));
    if let Value::Array(blocks) = &mut blocks {
        for block in blocks.iter_mut() {
            bound_binary(block);
        }
    }
    json!({ "content": blocks })
}

/// Replaces a block's base64 `data` (image, audio) or its resource's
/// `blob` by `omitted_chars` when over the bound.
fn bound_binary(block: &mut Value) {
    let Some(fields) = block.as_object_mut() else {
        return;
    };
    shrink(fields, "data");
    if let Some(Value::Object(resource)) = fields.get_mut("resource") {
        shrink(resource, "blob");
    }
}

fn shrink(fields: &mut Map<String, Value>, key: &str) {
    let too_big = fields
        .get(key)
        .and_then(Value::as_str)
        .is_some_and(|payload| payload.len() > MAX_BINARY_CHARS);
    if too_big && let Some(Value::String(payload)) = fields.remove(key) {
        fields.insert("omitted_chars".into(), json!(payload.len()));
    }
}

/// The text blocks of a result, joined by newlines.
fn texts(result: &CallToolResult) -> String {
    let blocks = serde_json::to_value(&result.content).unwrap_or_default();
    blocks
        .as_array()
        .into_iter()
        .flatten()
        .filter(|block| block["type"] == "text")
        .filter_map(|block| block["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The error of a call the server answered with a JSON-RPC error, or
/// could not answer, for a tool with `effects`. The server's own message
/// stays in the log: it may hold internals.
pub(super) fn failure(server: &str, error: &ServiceError, effects: Effects) -> ToolError {
    match error {
        ServiceError::McpError(data) if data.code == RpcCode::INVALID_PARAMS => {
            ToolError::terminal(
                ErrorCode::INVALID_TOOL_ARGUMENTS,
                format!("the MCP server {server} refused the arguments (JSON-RPC error -32602)"),
            )
        }
        ServiceError::McpError(data) if data.code == RpcCode::METHOD_NOT_FOUND => {
            ToolError::terminal(
                ErrorCode::UNKNOWN_TOOL,
                format!("the MCP server {server} no longer offers this tool"),
            )
        }
        ServiceError::McpError(data) => answered_error(server, data.code.0, effects),
        // Sent, and no answer: the call may have run.
        _ => lost(server, effects),
    }
}

/// A JSON-RPC error other than the two above: the server took the call
/// and failed. A tool that is not idempotent may have applied its effect
/// first, so it is not retried blindly.
fn answered_error(server: &str, code: i32, effects: Effects) -> ToolError {
    let message = format!("the MCP server {server} answered JSON-RPC error {code}");
    if effects.repeats_harm() {
        ToolError::terminal(ErrorCode::TOOL_EXECUTION_FAILED, message)
    } else {
        ToolError::retryable(ErrorCode::TOOL_EXECUTION_FAILED, message)
    }
}

/// A call whose answer the server's connection found wrong ([`Defect`]):
/// one too large is `PAYLOAD_TOO_LARGE`, terminal (it would be as large
/// again); one the server may have garbled is as a call the server went
/// away from, by the tool's `effects`.
pub(super) fn defect(server: &str, defect: &Defect, effects: Effects) -> ToolError {
    match defect {
        Defect::TooLarge(bound) => ToolError::terminal(
            ErrorCode::PAYLOAD_TOO_LARGE,
            format!(
                "the MCP server {server}'s answer is over {bound} bytes \
                 (runtime.max_output_bytes and a margin); it was not read"
            ),
        ),
        Defect::Malformed(what) => {
            let wrote =
                format!("the MCP server {server} wrote {what} while the call was in flight");
            if effects.repeats_harm() {
                ToolError::terminal(
                    ErrorCode::OUTCOME_UNKNOWN,
                    format!(
                        "{wrote}; its answer may be lost, so whether the tool's effect \
                         happened is unknown, and it was not run again"
                    ),
                )
            } else {
                ToolError::retryable(
                    ErrorCode::TOOL_EXECUTION_FAILED,
                    format!("{wrote}; its answer may be lost"),
                )
            }
        }
    }
}

/// A call sent to a server that went away before answering: retryable for
/// a tool whose second run is harmless, else `OUTCOME_UNKNOWN`.
pub(super) fn lost(server: &str, effects: Effects) -> ToolError {
    if effects.repeats_harm() {
        ToolError::terminal(
            ErrorCode::OUTCOME_UNKNOWN,
            format!(
                "the MCP server {server} went away during the call; whether the tool's \
                 effect happened is unknown, so it was not run again"
            ),
        )
    } else {
        ToolError::retryable(
            ErrorCode::TOOL_EXECUTION_FAILED,
            format!("the MCP server {server} went away during the call"),
        )
    }
}

/// A call never sent: the server is not running. Safe to retry whatever
/// the tool does.
pub(super) fn not_running(server: &str) -> ToolError {
    ToolError::retryable(
        ErrorCode::TOOL_EXECUTION_FAILED,
        format!("the MCP server {server} is not running; the call was not sent"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{ContentBlock, ErrorData};

    fn result(json: Value) -> CallToolResult {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn results_map_to_data_in_mcps_own_shape() {
        let structured = result(json!({"content": [{"type": "text", "text": "5"}],
                                       "structuredContent": {"result": 5}}));
        assert_eq!(outcome(structured).unwrap(), json!({"result": 5}));
        let big = "A".repeat(MAX_BINARY_CHARS + 1);
        let blocks = result(json!({"content": [
            {"type": "text", "text": "hello"},
            {"type": "image", "data": "iVBO", "mimeType": "image/png"},
            {"type": "image", "data": big, "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "note://a", "text": "hi"}},
        ]}));
        let data = outcome(blocks).unwrap();
        let content = data["content"].as_array().unwrap();
        assert_eq!(content[0], json!({"type": "text", "text": "hello"}));
        assert_eq!(content[1]["data"], "iVBO");
        assert_eq!(content[1]["mimeType"], "image/png");
        assert_eq!(content[2]["omitted_chars"], MAX_BINARY_CHARS + 1);
        assert!(content[2].get("data").is_none());
        assert_eq!(content[3]["resource"]["uri"], "note://a");
    }

    #[test]
    fn an_error_result_is_the_tools_words_and_protocol_errors_are_ours() {
        let failed = CallToolResult::error(vec![ContentBlock::text("no such city")]);
        let err = outcome(failed).unwrap_err();
        assert!(!err.is_retryable());
        assert_eq!(err.to_string(), "TOOL_ERROR: no such city");

        let internal = ServiceError::McpError(ErrorData::internal_error(
            "Traceback: /srv/secret.py line 3",
            None,
        ));
        let read_only = failure("crm", &internal, Effects::ReadOnly);
        assert!(read_only.is_retryable());
        assert!(!read_only.to_string().contains("secret"), "{read_only}");
        assert!(!failure("crm", &internal, Effects::NotIdempotent).is_retryable());

        let closed = ServiceError::TransportClosed;
        assert!(failure("crm", &closed, Effects::Idempotent).is_retryable());
        let unknown = failure("crm", &closed, Effects::NotIdempotent);
        assert!(
            unknown.to_string().starts_with("OUTCOME_UNKNOWN"),
            "{unknown}"
        );
        let params = ServiceError::McpError(ErrorData::invalid_params("x", None));
        assert!(
            failure("crm", &params, Effects::ReadOnly)
                .to_string()
                .starts_with("INVALID_TOOL_ARGUMENTS")
        );
    }
}
