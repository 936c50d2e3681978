//! A server's task (the MCP Tasks extension, SEP-2663): a `tools/call` the
//! server answers at once with a task, whose result is fetched later with
//! `tasks/get`. The worker saves the task's id in the call's checkpoint
//! before it waits, so that a worker taking over the call follows the same
//! task and the tool is never called a second time (decision 0044). This
//! module holds what is decided without I/O: what is saved, and what each
//! answer to `tasks/get` means for the call.

use std::time::Duration;

use rmcp::ServiceError;
use rmcp::model::{CallToolResult, ErrorCode as RpcCode, ErrorData, GetTaskResult, TaskPayload};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolfleet_proto::{Effects, ErrorCode};

use super::results;
use crate::tool::ToolError;

/// The shortest pause between two polls, whatever the server asks: a
/// server that says 0 must not be asked in a loop.
pub(super) const MIN_POLL: Duration = Duration::from_millis(100);
/// The longest: a server that asks for an hour is asked more often, so
/// that a result is not left waiting for long.
pub(super) const MAX_POLL: Duration = Duration::from_secs(10);
/// The pause when the server gives none.
const DEFAULT_POLL: Duration = Duration::from_secs(1);

/// The checkpoint of a call that follows a server's task:
/// `{"mcp_task": {"server": ..., "id": ...}}`.
#[derive(Serialize, Deserialize)]
struct Saved {
    mcp_task: SavedTask,
}

#[derive(Serialize, Deserialize)]
struct SavedTask {
    server: String,
    id: String,
}

/// What a call saves once `server` made the task `id`.
pub(super) fn checkpoint(server: &str, id: &str) -> Value {
    json!(Saved {
        mcp_task: SavedTask {
            server: server.to_owned(),
            id: id.to_owned(),
        },
    })
}

/// What an earlier execution saved, for a call to `server`.
#[derive(Debug, PartialEq)]
pub(super) enum Resume {
    /// Follow this task of the server.
    Task(String),
    /// A checkpoint this tool did not write (another server's, or not a
    /// task's): the call cannot be resumed from it.
    Foreign,
}

/// What `saved` says a call to `server` resumes.
pub(super) fn resume(saved: &Value, server: &str) -> Resume {
    match serde_json::from_value::<Saved>(saved.clone()) {
        Ok(Saved { mcp_task }) if mcp_task.server == server => Resume::Task(mcp_task.id),
        _ => Resume::Foreign,
    }
}

/// The pause before the next poll: the server's, within bounds.
pub(super) fn poll_interval(server_ms: Option<u64>) -> Duration {
    server_ms
        .map_or(DEFAULT_POLL, Duration::from_millis)
        .clamp(MIN_POLL, MAX_POLL)
}

/// What becomes of a call after one `tasks/get`.
#[derive(Debug)]
pub(super) enum Step {
    /// Still working: ask again after this pause.
    Wait(Duration),
    /// The connection failed: the server is down; ask again once it is
    /// back (the task lives on the server, not on the connection).
    Gone,
    /// The server failed the request in a way that may pass: ask again
    /// after the pause, logging why.
    Retry(String),
    /// The task ended: the call's answer.
    Answer(Result<Value, ToolError>),
    /// The server does not know the task (its `ttl` ran out, it restarted).
    Forgotten,
    /// The task waits for input a call through the fleet cannot give: the
    /// task is cancelled, and the call answered with this.
    GiveUp(ToolError),
}

/// What the answer `got` to `tasks/get` means for a call of a tool with
/// `effects` to `server`; `connection_failed` tells a dead connection
/// from an error the server answered.
pub(super) fn after_get(
    got: Result<GetTaskResult, ServiceError>,
    server: &str,
    effects: Effects,
    connection_failed: impl Fn(&ServiceError) -> bool,
) -> Step {
    let task = match got {
        Ok(got) => got.task,
        Err(err) if connection_failed(&err) => return Step::Gone,
        Err(ServiceError::McpError(data)) if data.code == RpcCode::INVALID_PARAMS => {
            return Step::Forgotten;
        }
        Err(err) => return Step::Retry(format!("tasks/get failed: {err}")),
    };
    let pause = poll_interval(task.task.poll_interval_ms);
    match task.payload {
        TaskPayload::Working => Step::Wait(pause),
        TaskPayload::Completed { result } => Step::Answer(
            match serde_json::from_value::<CallToolResult>(Value::Object(result)) {
                Ok(result) => results::outcome(result),
                Err(_) => Err(results::lost(server, effects)),
            },
        ),
        TaskPayload::Failed { error } => {
            let error = serde_json::from_value::<ErrorData>(Value::Object(error))
                .unwrap_or_else(|_| ErrorData::internal_error("", None));
            Step::Answer(Err(results::failure(
                server,
                &ServiceError::McpError(error),
                effects,
            )))
        }
        TaskPayload::Cancelled => Step::Answer(Err(cancelled(server, effects))),
        TaskPayload::InputRequired { .. } => Step::GiveUp(ToolError::terminal(
            results::INPUT_REQUIRED,
            "the tool's task asked for more input, which a call through the fleet cannot \
             give; the task was cancelled. Call it with everything it needs in its arguments",
        )),
        // A status this worker does not know yet: keep asking, as for one
        // still working; the call's timeout bounds it.
        _ => Step::Wait(pause),
    }
}

/// The answer to a call whose task the server forgot: it may have run, so
/// a side effect's outcome is unknown; a call whose second run is harmless
/// is run again (see [`McpServer::call`](super::McpServer::call)).
pub(super) fn forgotten(server: &str) -> ToolError {
    ToolError::terminal(
        ErrorCode::OUTCOME_UNKNOWN,
        format!(
            "the MCP server {server} no longer knows the call's task (its time to live ran \
             out, or the server restarted); whether the tool's effect happened is unknown, \
             so it was not run again"
        ),
    )
}

/// The answer to a call whose task someone else cancelled on the server.
fn cancelled(server: &str, effects: Effects) -> ToolError {
    let message = format!("the MCP server {server} cancelled the call's task");
    if effects.repeats_harm() {
        ToolError::terminal(
            ErrorCode::OUTCOME_UNKNOWN,
            format!("{message}; whether the tool's effect happened is unknown"),
        )
    } else {
        ToolError::retryable(ErrorCode::TOOL_EXECUTION_FAILED, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(wire: Value) -> Result<GetTaskResult, ServiceError> {
        Ok(serde_json::from_value(wire).expect("a tasks/get answer"))
    }

    fn base(status: &str) -> Value {
        json!({"resultType": "complete", "taskId": "t1", "status": status,
               "createdAt": "2026-12-06T00:00:00Z", "lastUpdatedAt": "2026-12-06T00:00:00Z",
               "ttlMs": 60000, "pollIntervalMs": 250})
    }

    fn with(status: &str, key: &str, value: Value) -> Value {
        let mut wire = base(status);
        wire[key] = value;
        wire
    }

    /// A short name for a step, for the table.
    fn name(step: &Step) -> String {
        match step {
            Step::Wait(pause) => format!("wait {}ms", pause.as_millis()),
            Step::Gone => "gone".into(),
            Step::Retry(_) => "retry".into(),
            Step::Answer(Ok(data)) => format!("ok {data}"),
            Step::Answer(Err(err)) => format!(
                "{} {}",
                if err.is_retryable() {
                    "retryable"
                } else {
                    "terminal"
                },
                err.to_string().split(':').next().unwrap_or_default()
            ),
            Step::Forgotten => "forgotten".into(),
            Step::GiveUp(err) => format!(
                "give up {}",
                err.to_string().split(':').next().unwrap_or_default()
            ),
        }
    }

    #[test]
    fn each_answer_to_tasks_get_says_what_becomes_of_the_call() {
        let text = json!({"content": [{"type": "text", "text": "done"}]});
        let error = json!({"content": [{"type": "text", "text": "no"}], "isError": true});
        let rpc = json!({"code": -32603, "message": "Traceback /srv/secret.py"});
        let closed = || Err(ServiceError::TransportClosed);
        let unknown = || {
            Err(ServiceError::McpError(ErrorData::invalid_params(
                "Task t1 not found",
                None,
            )))
        };
        let internal = || {
            Err(ServiceError::McpError(ErrorData::internal_error(
                "busy", None,
            )))
        };
        // (answer, effects, step)
        let cases: Vec<(Result<GetTaskResult, ServiceError>, Effects, &str)> = vec![
            (task(base("working")), Effects::NotIdempotent, "wait 250ms"),
            (
                task(with("completed", "result", text.clone())),
                Effects::NotIdempotent,
                r#"ok {"content":[{"text":"done","type":"text"}]}"#,
            ),
            (
                task(with("completed", "result", error)),
                Effects::ReadOnly,
                "terminal TOOL_ERROR",
            ),
            (
                task(with("completed", "result", json!({"content": 5}))),
                Effects::NotIdempotent,
                "terminal OUTCOME_UNKNOWN",
            ),
            (
                task(with("failed", "error", rpc.clone())),
                Effects::NotIdempotent,
                "terminal TOOL_EXECUTION_FAILED",
            ),
            (
                task(with("failed", "error", rpc)),
                Effects::ReadOnly,
                "retryable TOOL_EXECUTION_FAILED",
            ),
            (
                task(base("cancelled")),
                Effects::NotIdempotent,
                "terminal OUTCOME_UNKNOWN",
            ),
            (
                task(base("cancelled")),
                Effects::Idempotent,
                "retryable TOOL_EXECUTION_FAILED",
            ),
            (
                task(with("input_required", "inputRequests", json!({}))),
                Effects::ReadOnly,
                "give up INPUT_REQUIRED",
            ),
            (closed(), Effects::NotIdempotent, "gone"),
            (unknown(), Effects::NotIdempotent, "forgotten"),
            (internal(), Effects::NotIdempotent, "retry"),
        ];
        let connection_failed = |err: &ServiceError| matches!(err, ServiceError::TransportClosed);
        for (got, effects, expected) in cases {
            let what = format!("{got:?} {effects:?}");
            let step = after_get(got, "crm", effects, connection_failed);
            assert_eq!(name(&step), expected, "{what}");
            if let Step::Answer(Err(err)) = &step {
                assert!(!err.to_string().contains("secret"), "{err}");
            }
        }
    }

    #[test]
    fn the_servers_poll_interval_is_kept_within_bounds() {
        assert_eq!(poll_interval(None), DEFAULT_POLL);
        assert_eq!(poll_interval(Some(0)), MIN_POLL);
        assert_eq!(poll_interval(Some(250)), Duration::from_millis(250));
        assert_eq!(poll_interval(Some(3_600_000)), MAX_POLL);
    }

    #[test]
    fn a_call_resumes_only_its_own_servers_task() {
        let saved = checkpoint("crm", "t-42");
        assert_eq!(resume(&saved, "crm"), Resume::Task("t-42".into()));
        assert_eq!(resume(&saved, "billing"), Resume::Foreign);
        assert_eq!(resume(&json!({"offset": 3}), "crm"), Resume::Foreign);
        assert_eq!(resume(&json!("t-42"), "crm"), Resume::Foreign);
    }
}
