//! The worker's Prometheus metrics. Every name is documented in
//! `worker/README.md`.

use std::time::Duration;

use toolfleet_proto::Envelope;

/// Calls finished, by `tool` and `outcome` (`ok` or the error code).
pub const CALLS_TOTAL: &str = "toolfleet_worker_calls_total";
/// Execution time of calls in seconds, by `tool`.
pub const CALL_DURATION: &str = "toolfleet_worker_call_duration_seconds";
/// Deliveries answered from the stored result instead of executing, by `tool`.
pub const DEDUP_HITS_TOTAL: &str = "toolfleet_worker_dedup_hits_total";
/// Calls executing right now.
pub const IN_FLIGHT: &str = "toolfleet_worker_in_flight";
/// Call messages terminated without running or answering, by `reason`:
/// `undecodable` (not JSON of a call), `misrouted` (a call that is not this
/// worker's: its tool not served, or not the tool of the subject and queue
/// it came from), `stored_result` (the ledger's result is another call's),
/// or the name of a field that is not one the orchestrator sends.
pub const CALLS_REJECTED_TOTAL: &str = "toolfleet_worker_calls_rejected_total";

/// Call messages handed back unclaimed, to be delivered again later, by
/// `tool` and `reason`: `other_version` (the call is pinned to a version of
/// its tool this worker does not run; decision 0058), `newer_format` (a
/// call message in a format this release does not read; decision 0059).
pub const CALLS_HANDED_BACK_TOTAL: &str = "toolfleet_worker_calls_handed_back_total";

pub(crate) fn call_handed_back(tool: &str, reason: &'static str) {
    metrics::counter!(CALLS_HANDED_BACK_TOTAL, "tool" => tool.to_owned(), "reason" => reason)
        .increment(1);
}

pub(crate) fn call_rejected(reason: &'static str) {
    metrics::counter!(CALLS_REJECTED_TOTAL, "reason" => reason).increment(1);
}

pub(crate) fn call_finished(tool: &str, envelope: &Envelope, elapsed: Duration) {
    let outcome = match envelope.error() {
        None => "ok".to_owned(),
        Some(error) => error.code.to_string(),
    };
    metrics::counter!(CALLS_TOTAL, "tool" => tool.to_owned(), "outcome" => outcome).increment(1);
    metrics::histogram!(CALL_DURATION, "tool" => tool.to_owned()).record(elapsed.as_secs_f64());
}

pub(crate) fn dedup_hit(tool: &str) {
    metrics::counter!(DEDUP_HITS_TOTAL, "tool" => tool.to_owned()).increment(1);
}

pub(crate) fn in_flight(delta: f64) {
    metrics::gauge!(IN_FLIGHT).increment(delta);
}

/// The deliveries this worker handles at once (`runtime.max_in_flight`):
/// `in_flight / max_in_flight` is its saturation.
pub const MAX_IN_FLIGHT: &str = "toolfleet_worker_max_in_flight";
/// Deliveries of a call after its first (JetStream redelivered it: a worker
/// died or handed it back, or its ack was lost), by `tool`.
pub const REDELIVERIES_TOTAL: &str = "toolfleet_worker_redeliveries_total";

pub(crate) fn max_in_flight(slots: usize) {
    metrics::gauge!(MAX_IN_FLIGHT).set(slots as f64);
    // The gauge of calls in flight exists from the start, at 0.
    metrics::gauge!(IN_FLIGHT).increment(0.0);
}

/// Makes a served tool's counters of rare events exist from the start, at
/// 0, so that a rate over them is 0 rather than empty before the first.
pub(crate) fn register_tool(tool: &str) {
    metrics::counter!(REDELIVERIES_TOTAL, "tool" => tool.to_owned()).increment(0);
    metrics::counter!(DEDUP_HITS_TOTAL, "tool" => tool.to_owned()).increment(0);
}

pub(crate) fn redelivered(tool: &str) {
    metrics::counter!(REDELIVERIES_TOTAL, "tool" => tool.to_owned()).increment(1);
}
