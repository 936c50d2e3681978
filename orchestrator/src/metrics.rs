//! The orchestrator's Prometheus metrics. Every name is documented in
//! `orchestrator/README.md`.

/// Jobs finished, by `outcome` (`job_succeeded`, `job_failed`, `job_cancelled`).
pub const JOBS_FINISHED_TOTAL: &str = "toolfleet_jobs_finished_total";
/// Jobs submitted.
pub const JOBS_SUBMITTED_TOTAL: &str = "toolfleet_jobs_submitted_total";

pub(crate) fn job_finished(outcome: &'static str) {
    metrics::counter!(JOBS_FINISHED_TOTAL, "outcome" => outcome).increment(1);
}

pub(crate) fn job_submitted() {
    metrics::counter!(JOBS_SUBMITTED_TOTAL).increment(1);
}

/// Tool call round trip (publish to result) in seconds, by `tool`, as the
/// runner sees it.
pub const TOOL_CALL_ROUND_TRIP: &str = "toolfleet_tool_call_round_trip_seconds";
/// Retries of tool calls after retryable envelopes, by `tool`.
pub const TOOL_CALL_RETRIES_TOTAL: &str = "toolfleet_tool_call_retries_total";

pub(crate) fn tool_call_round_trip(tool: &str, elapsed: std::time::Duration) {
    metrics::histogram!(TOOL_CALL_ROUND_TRIP, "tool" => tool.to_owned())
        .record(elapsed.as_secs_f64());
}

/// Tool calls that waited for a slot because their tenant was at its
/// `max_calls_in_flight` quota, by `tool`.
pub const TOOL_CALLS_THROTTLED_TOTAL: &str = "toolfleet_tool_calls_throttled_total";

pub(crate) fn tool_call_throttled(tool: &str) {
    metrics::counter!(TOOL_CALLS_THROTTLED_TOTAL, "tool" => tool.to_owned()).increment(1);
}

pub(crate) fn tool_call_retried(tool: &str) {
    metrics::counter!(TOOL_CALL_RETRIES_TOTAL, "tool" => tool.to_owned()).increment(1);
}
