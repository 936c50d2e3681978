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
