//! Step 2: the checks of a claimed call against the tool that runs it (that
//! the call is this tool's was checked before the claim, in [`super::own`]).
//! Pure: no NATS, no Redis, and the clock comes in as `now`, so a table test
//! covers every answer.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use toolfleet_proto::{Envelope, ErrorCode, ToolCall, check_arguments};

use super::LoadedTool;

/// A call that passed every check, ready to run.
pub(super) struct Checked<'a> {
    pub(super) tool: &'a LoadedTool,
    /// The arguments, parsed and valid against the tool's schema.
    pub(super) args: Value,
    /// When the call's result stops being useful, if it has a deadline.
    pub(super) deadline: Option<SystemTime>,
    /// The tool's timeout, shortened to what is left before the deadline.
    pub(super) timeout: Duration,
}

/// Checks `call` against `tool`, the tool that runs it, at `now`. `Err` is
/// the terminal envelope that answers the call instead of running it.
pub(super) fn check<'a>(
    tool: &'a LoadedTool,
    call: &ToolCall,
    max_argument_bytes: usize,
    now: SystemTime,
) -> Result<Checked<'a>, Envelope> {
    let deadline = call
        .deadline_ms
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
    if deadline.is_some_and(|d| d <= now) {
        return Err(Envelope::terminal(
            ErrorCode::DEADLINE_EXCEEDED,
            "the call's deadline passed before it could start",
        ));
    }
    if call.arguments.len() > max_argument_bytes {
        return Err(Envelope::terminal(
            ErrorCode::PAYLOAD_TOO_LARGE,
            format!(
                "arguments are {} bytes; the limit is {max_argument_bytes}",
                call.arguments.len(),
            ),
        ));
    }
    let args = check_arguments(&tool.manifest.name, &tool.validator, &call.arguments)?;
    let timeout = match deadline.and_then(|d| d.duration_since(now).ok()) {
        Some(left) => tool.timeout.min(left),
        None => tool.timeout,
    };
    Ok(Checked {
        tool,
        args,
        deadline,
        timeout,
    })
}

// With the test pack's `sleep` as the tool under check.
#[cfg(all(test, feature = "test-tools"))]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::tools::testing::Sleep;

    /// The test tool `sleep`: `{"ms": integer 0..=600000}`, 30 s timeout.
    fn sleep() -> LoadedTool {
        LoadedTool::load(Arc::new(Sleep), &|manifest| manifest).expect("the sleep schema compiles")
    }

    fn call(tool: &str, arguments: &str, deadline_ms: Option<u64>) -> ToolCall {
        ToolCall {
            job_id: "job_1".into(),
            call_id: "call_1".into(),
            attempt: 1,
            tool: tool.into(),
            arguments: arguments.into(),
            deadline_ms,
            idempotency_key: "job_1:call_1".into(),
            reply_to: None,
        }
    }

    #[test]
    fn every_check_answers_or_passes_the_call() {
        const NOW_MS: u64 = 1_000_000;
        let now = UNIX_EPOCH + Duration::from_millis(NOW_MS);
        let tool = sleep();
        let ok = r#"{"ms": 5}"#;
        let big = format!(r#"{{"ms": 5, "pad": "{}"}}"#, "x".repeat(100));
        // (what, call, Ok(timeout) or Err(code))
        let cases: Vec<(&str, ToolCall, Result<Duration, &str>)> = vec![
            (
                "valid, no deadline",
                call("sleep", ok, None),
                Ok(Duration::from_secs(30)),
            ),
            (
                "deadline sooner than the timeout",
                call("sleep", ok, Some(NOW_MS + 2_000)),
                Ok(Duration::from_secs(2)),
            ),
            (
                "deadline later than the timeout",
                call("sleep", ok, Some(NOW_MS + 60_000)),
                Ok(Duration::from_secs(30)),
            ),
            (
                "deadline passed",
                call("sleep", ok, Some(NOW_MS - 1)),
                Err("DEADLINE_EXCEEDED"),
            ),
            (
                "deadline is now",
                call("sleep", ok, Some(NOW_MS)),
                Err("DEADLINE_EXCEEDED"),
            ),
            (
                "arguments too large",
                call("sleep", &big, None),
                Err("PAYLOAD_TOO_LARGE"),
            ),
            (
                "not JSON",
                call("sleep", "{ms: 5", None),
                Err("INVALID_TOOL_ARGUMENTS"),
            ),
            (
                "against the schema",
                call("sleep", r#"{"ms": -1}"#, None),
                Err("INVALID_TOOL_ARGUMENTS"),
            ),
        ];
        for (what, call, expected) in cases {
            match (check(&tool, &call, 64, now), expected) {
                (Ok(checked), Ok(timeout)) => {
                    assert_eq!(checked.timeout, timeout, "{what}");
                    assert_eq!(checked.args, json!({"ms": 5}), "{what}");
                    assert_eq!(checked.tool.manifest.name, "sleep", "{what}");
                    assert_eq!(
                        checked.deadline,
                        call.deadline_ms
                            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
                        "{what}"
                    );
                }
                (Err(envelope), Err(code)) => {
                    let error = envelope.error().expect("an error envelope");
                    assert_eq!(error.code.as_str(), code, "{what}");
                    assert!(!error.retryable, "{what}: every check failure is terminal");
                }
                (got, expected) => panic!(
                    "{what}: expected {expected:?}, got {:?}",
                    got.map(|c| c.timeout)
                ),
            }
        }
    }
}
