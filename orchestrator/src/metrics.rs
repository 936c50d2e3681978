//! The orchestrator's Prometheus metrics. Every name is documented in
//! `orchestrator/README.md`.

/// Retries of JetStream publishes, by `what` (`job`, `call`): what a stream
/// leader's election (or an outage) cost (see the `publish` module).
pub(crate) const PUBLISH_RETRIES_TOTAL: &str = "toolfleet_publish_retries_total";
/// How long a publish that needed retries waited, from its first failure
/// to its acknowledgement (or to giving up), by `what`.
pub(crate) const PUBLISH_PAUSE: &str = "toolfleet_publish_pause_seconds";
/// Jobs finished, by `outcome` (`job_succeeded`, `job_failed`, `job_cancelled`).
pub(crate) const JOBS_FINISHED_TOTAL: &str = "toolfleet_jobs_finished_total";
/// Jobs submitted.
pub(crate) const JOBS_SUBMITTED_TOTAL: &str = "toolfleet_jobs_submitted_total";
/// Submission to end of a job, in seconds, by `outcome`.
pub(crate) const JOB_DURATION: &str = "toolfleet_job_duration_seconds";
/// Runs that resumed a job another runner had started (a takeover after a
/// crash or a lost lease, or a hand-back at shutdown).
pub(crate) const JOBS_RESUMED_TOTAL: &str = "toolfleet_jobs_resumed_total";

pub(crate) fn job_finished(outcome: &'static str, took: Option<std::time::Duration>) {
    metrics::counter!(JOBS_FINISHED_TOTAL, "outcome" => outcome).increment(1);
    if let Some(took) = took {
        metrics::histogram!(JOB_DURATION, "outcome" => outcome).record(took.as_secs_f64());
    }
}

/// Messages on the job queue terminated without running: not a job id, so
/// not one an orchestrator queued.
pub(crate) const JOB_MESSAGES_REJECTED_TOTAL: &str = "toolfleet_job_messages_rejected_total";

pub(crate) fn publish_paused(what: &'static str, retries: u64, pause: std::time::Duration) {
    metrics::counter!(PUBLISH_RETRIES_TOTAL, "what" => what).increment(retries);
    metrics::histogram!(PUBLISH_PAUSE, "what" => what).record(pause.as_secs_f64());
}

pub(crate) fn job_message_rejected() {
    metrics::counter!(JOB_MESSAGES_REJECTED_TOTAL).increment(1);
}

pub(crate) fn job_resumed() {
    metrics::counter!(JOBS_RESUMED_TOTAL).increment(1);
}

/// Model turns, by `provider` and `outcome` (`ok` or the job error code).
pub(crate) const MODEL_TURN_DURATION: &str = "toolfleet_model_turn_duration_seconds";
/// Tokens the model used, by `provider` and `kind` (`input`, `output`,
/// and of the input `cache_read` and `cache_write`).
pub(crate) const MODEL_TOKENS_TOTAL: &str = "toolfleet_model_tokens_total";

pub(crate) fn model_turn(provider: &'static str, outcome: String, took: std::time::Duration) {
    metrics::histogram!(MODEL_TURN_DURATION, "provider" => provider, "outcome" => outcome)
        .record(took.as_secs_f64());
}

pub(crate) fn model_tokens(provider: &'static str, usage: &crate::model::Usage) {
    let kinds = [
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
        ("cache_read", usage.cache_read_tokens),
        ("cache_write", usage.cache_write_tokens),
    ];
    for (kind, tokens) in kinds {
        metrics::counter!(MODEL_TOKENS_TOTAL, "provider" => provider, "kind" => kind)
            .increment(tokens);
    }
}

/// Tool calls settled, by `tool` and `outcome` (`ok` or the error code of
/// the final envelope: terminal errors, and retryable ones out of attempts).
pub(crate) const TOOL_CALLS_TOTAL: &str = "toolfleet_tool_calls_total";

pub(crate) fn tool_call_settled(tool: &str, envelope: &toolfleet_proto::Envelope) {
    let outcome = envelope
        .error()
        .map_or_else(|| "ok".to_owned(), |e| e.code.to_string());
    metrics::counter!(TOOL_CALLS_TOTAL, "tool" => tool.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// Results shown to the model as a view because their `data` was over
/// their tool's limit, by `tool` (docs/protection.md); a round resumed
/// after a crash shapes its results again, and counts them again.
pub(crate) const RESULTS_SHAPED_TOTAL: &str = "toolfleet_results_shaped_total";

pub(crate) fn result_shaped(tool: &str) {
    metrics::counter!(RESULTS_SHAPED_TOTAL, "tool" => tool.to_owned()).increment(1);
}

/// Calls of tools whose results may be cached, by `tool` and `outcome`:
/// `hit` (answered from the tenant's result cache), `miss` (run), `stored`
/// (a result cached for later calls; docs/protection.md).
pub(crate) const RESULT_CACHE_TOTAL: &str = "toolfleet_result_cache_total";

pub(crate) fn result_cache(tool: &str, outcome: &'static str) {
    metrics::counter!(RESULT_CACHE_TOTAL, "tool" => tool.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// What jobs spent against their budgets, by `tenant` and `kind`
/// (`tokens`, `cost_units`, `tool_calls`; docs/protection.md, "Budgets"),
/// as runs take it: counted for every job, with a budget or not.
pub(crate) const BUDGET_SPENT_TOTAL: &str = "toolfleet_budget_spent_total";
/// Jobs ended `BUDGET_EXCEEDED`, by `tenant` and `budget` (the field:
/// `max_tokens`, `max_cost_units`, `max_tool_calls`).
pub(crate) const BUDGET_EXCEEDED_TOTAL: &str = "toolfleet_budget_exceeded_total";

pub(crate) fn budget_spent(tenant: &str, kind: &'static str, amount: u64) {
    if amount > 0 {
        metrics::counter!(BUDGET_SPENT_TOTAL, "tenant" => tenant.to_owned(), "kind" => kind)
            .increment(amount);
    }
}

pub(crate) fn budget_exceeded(tenant: &str, budget: &'static str) {
    metrics::counter!(BUDGET_EXCEEDED_TOTAL, "tenant" => tenant.to_owned(), "budget" => budget)
        .increment(1);
}
/// 1 while a tool's circuit breaker refuses its calls (open, or half-open
/// with its probe out), else 0, by `tool`, as this replica last read or
/// moved it (docs/protection.md).
pub(crate) const TOOL_BREAKER_OPEN: &str = "toolfleet_tool_breaker_open";
/// Moves of a tool's circuit breaker made by this replica, by `tool` and
/// `to` (`open`, `half_open`, `closed`).
pub(crate) const TOOL_BREAKER_TRANSITIONS_TOTAL: &str = "toolfleet_tool_breaker_transitions_total";

pub(crate) fn tool_breaker(tool: &str, open: bool) {
    metrics::gauge!(TOOL_BREAKER_OPEN, "tool" => tool.to_owned()).set(f64::from(u8::from(open)));
}

pub(crate) fn tool_breaker_moved(tool: &str, to: &'static str) {
    metrics::counter!(TOOL_BREAKER_TRANSITIONS_TOTAL, "tool" => tool.to_owned(), "to" => to)
        .increment(1);
}

/// Live workers that announce a version of a tool and can run it, by
/// `tool` and `version` (the first 12 hex digits of its contract hash;
/// decision 0058); 0 once the version is no longer live. The fleet's, the
/// same on every replica.
pub(crate) const TOOL_VERSION_WORKERS: &str = "toolfleet_tool_version_workers";

/// A tool version's label in the metrics: the first 12 hex digits of its
/// contract hash (as a short git commit id), which `ListTools` gives whole.
pub(crate) fn version_label(contract: &str) -> &str {
    contract.get(..12).unwrap_or(contract)
}

pub(crate) fn tool_version_workers(tool: &str, version: &str, workers: usize) {
    metrics::gauge!(TOOL_VERSION_WORKERS, "tool" => tool.to_owned(), "version" => version.to_owned())
        .set(workers as f64);
}

/// Calls retired because the version of their tool they were pinned to
/// had no live worker for `dispatch.version_gone_after`, by `tool`
/// (answered `TOOL_VERSION_GONE`; decision 0058).
pub(crate) const TOOL_CALLS_VERSION_GONE_TOTAL: &str = "toolfleet_tool_calls_version_gone_total";

pub(crate) fn tool_version_gone(tool: &str) {
    metrics::counter!(TOOL_CALLS_VERSION_GONE_TOTAL, "tool" => tool.to_owned()).increment(1);
}

/// Workers with a fresh heartbeat, by `tool` (the fleet's, the same on
/// every replica).
pub(crate) const TOOL_WORKERS: &str = "toolfleet_tool_workers";
/// Calls waiting for a worker in the tool's JetStream consumer, by `tool`
/// (the fleet's, the same on every replica).
pub(crate) const TOOL_CALLS_WAITING: &str = "toolfleet_tool_calls_waiting";

pub(crate) fn tool_workers(tool: &str, workers: usize) {
    metrics::gauge!(TOOL_WORKERS, "tool" => tool.to_owned()).set(workers as f64);
}

pub(crate) fn tool_calls_waiting(tool: &str, waiting: u64) {
    metrics::gauge!(TOOL_CALLS_WAITING, "tool" => tool.to_owned()).set(waiting as f64);
}

/// Calls waiting for a person's decision, by `tenant` and `tool` (the
/// fleet's, read from Redis, the same on every replica).
pub(crate) const APPROVALS_PENDING: &str = "toolfleet_approvals_pending";
/// How long the oldest of those calls has waited, in seconds, by `tenant`
/// and `tool` (0 when none waits).
pub(crate) const APPROVALS_OLDEST_PENDING: &str = "toolfleet_approvals_oldest_pending_seconds";

pub(crate) fn approvals_pending(tenant: &str, tool: &str, calls: u64, oldest: std::time::Duration) {
    let labels = [("tenant", tenant.to_owned()), ("tool", tool.to_owned())];
    metrics::gauge!(APPROVALS_PENDING, &labels).set(calls as f64);
    metrics::gauge!(APPROVALS_OLDEST_PENDING, &labels).set(oldest.as_secs_f64());
}

/// Calls held for a person's approval, by `tool` and `rule` (`manifest`,
/// `tenant` or `job`; `on_unknown_outcome` for an attempt held for an
/// operator's verdict).
pub(crate) const APPROVALS_REQUESTED_TOTAL: &str = "toolfleet_approvals_requested_total";
/// Held calls decided, by `tool` and `decision` (`approved`, `rejected`,
/// `applied`, `not_applied`, `failed`, or `expired` when nobody decided in
/// time).
pub(crate) const APPROVAL_DECISIONS_TOTAL: &str = "toolfleet_approval_decisions_total";
/// Time from a call held to a person's decision, in seconds, by `tool`
/// (buckets from a second to a day).
pub(crate) const APPROVAL_WAIT: &str = "toolfleet_approval_wait_seconds";

pub(crate) fn approval_requested(tool: &str, rule: &'static str) {
    metrics::counter!(APPROVALS_REQUESTED_TOTAL, "tool" => tool.to_owned(), "rule" => rule)
        .increment(1);
}

/// A held call of `tool` decided (`decision`), after `waited` when a person
/// decided it.
pub(crate) fn approval_decided(
    tool: &str,
    decision: &'static str,
    waited: Option<std::time::Duration>,
) {
    metrics::counter!(APPROVAL_DECISIONS_TOTAL, "tool" => tool.to_owned(), "decision" => decision)
        .increment(1);
    if let Some(waited) = waited {
        metrics::histogram!(APPROVAL_WAIT, "tool" => tool.to_owned()).record(waited.as_secs_f64());
    }
}

/// Makes the unlabelled series exist from the start, at 0, so that a rate
/// over them is 0 rather than empty before the first event.
pub(crate) fn register() {
    metrics::counter!(JOBS_SUBMITTED_TOTAL).increment(0);
    metrics::counter!(JOBS_RESUMED_TOTAL).increment(0);
    metrics::counter!(JOB_MESSAGES_REJECTED_TOTAL).increment(0);
    for what in ["job", "call"] {
        metrics::counter!(PUBLISH_RETRIES_TOTAL, "what" => what).increment(0);
    }
    for provider in crate::job::ProviderKind::ALL {
        model_tokens(provider.as_str(), &crate::model::Usage::default());
    }
}

pub(crate) fn job_submitted() {
    metrics::counter!(JOBS_SUBMITTED_TOTAL).increment(1);
}

/// Tool call round trip (publish to result) in seconds, by `tool`, as the
/// runner sees it.
pub(crate) const TOOL_CALL_ROUND_TRIP: &str = "toolfleet_tool_call_round_trip_seconds";
/// Retries of tool calls after retryable envelopes, by `tool` and `code`
/// (the retried envelope's).
pub(crate) const TOOL_CALL_RETRIES_TOTAL: &str = "toolfleet_tool_call_retries_total";

pub(crate) fn tool_call_round_trip(tool: &str, elapsed: std::time::Duration) {
    metrics::histogram!(TOOL_CALL_ROUND_TRIP, "tool" => tool.to_owned())
        .record(elapsed.as_secs_f64());
}

/// Tool calls that waited for a slot because their tenant was at its
/// `max_calls_in_flight` quota, by `tool`.
pub(crate) const TOOL_CALLS_THROTTLED_TOTAL: &str = "toolfleet_tool_calls_throttled_total";

pub(crate) fn tool_call_throttled(tool: &str) {
    metrics::counter!(TOOL_CALLS_THROTTLED_TOTAL, "tool" => tool.to_owned()).increment(1);
}

pub(crate) fn tool_call_retried(tool: &str, code: String) {
    metrics::counter!(TOOL_CALL_RETRIES_TOTAL, "tool" => tool.to_owned(), "code" => code)
        .increment(1);
}
