//! The fleet's calls as MCP tasks (the `io.modelcontextprotocol/tasks`
//! extension, SEP-2663): a call that has not ended by `--task-after` is
//! answered with a task, and the task is the call job. What a job is as a
//! task is decided here, without I/O; the gateway asks the API (GetJob,
//! CancelJob) for each `tasks/*` request, so any replica answers any of
//! them, and only for the tenant whose token made the job.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rmcp::model::{CallToolResult, CreateTaskResult, DetailedTask, JsonObject, Task, TaskPayload};
use serde_json::Value;
use toolfleet_proto::names::job_metadata;
use toolfleet_proto::v1;

/// The metadata pair that marks a call job the gateway made: `tasks/get`
/// answers about no other job of the tenant.
pub(super) const MARK: (&str, &str) = (job_metadata::MCP, "tools/call");

/// How often a client is asked to poll a task.
const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// How the gateway serves tasks (`toolfleet mcp-serve` flags).
#[derive(Debug, Clone, Copy)]
pub struct TaskOptions {
    /// How long a call of a client that declared the tasks extension is
    /// waited for before it is answered with a task instead.
    pub after: Duration,
    /// How long a task stays readable after it was made: the orchestrators'
    /// `store.job_retention`, which the gateway cannot read.
    pub ttl: Duration,
}

impl Default for TaskOptions {
    fn default() -> Self {
        Self {
            after: Duration::from_secs(1),
            ttl: Duration::from_secs(24 * 3600),
        }
    }
}

/// Whether `job` is a call job the gateway made, which a task may name.
pub(super) fn is_ours(job: &v1::Job) -> bool {
    job.metadata.get(MARK.0).map(String::as_str) == Some(MARK.1)
}

/// The task of a call job just queued as `job_id`, at `now`.
pub(super) fn created(job_id: &str, now: SystemTime, options: &TaskOptions) -> CreateTaskResult {
    let at = timestamp(now);
    CreateTaskResult::new(
        Task::new(job_id, rmcp::model::TaskStatus::Working, at.clone(), at)
            .with_ttl_ms(millis(options.ttl))
            .with_poll_interval_ms(millis(POLL_INTERVAL)),
    )
}

/// What the call job `job` is as a task, at `now`; its result, once it
/// ended, is `result`'s (the gateway's answer to a `tools/call`). A call
/// held for a person stays `working`, its status message naming what it
/// waits for: `input_required` would ask the client for input that only an
/// approver or an operator gives.
pub(super) fn detailed(
    job: &v1::Job,
    now: SystemTime,
    options: &TaskOptions,
    result: impl FnOnce(&v1::Job) -> CallToolResult,
) -> DetailedTask {
    let created = UNIX_EPOCH + Duration::from_millis(job.created_at_ms);
    let updated = match job.finished_at_ms {
        0 => now,
        ms => UNIX_EPOCH + Duration::from_millis(ms),
    };
    let mut task = Task::new(
        job.job_id.clone(),
        rmcp::model::TaskStatus::Working,
        timestamp(created),
        timestamp(updated),
    )
    .with_ttl_ms(millis(options.ttl))
    .with_poll_interval_ms(millis(POLL_INTERVAL));
    let payload = match job.status() {
        v1::JobStatus::Succeeded | v1::JobStatus::Failed => TaskPayload::Completed {
            result: as_object(&result(job)),
        },
        v1::JobStatus::Cancelled => TaskPayload::Cancelled,
        v1::JobStatus::WaitingForApproval => {
            task = task.with_status_message(waiting_for(job));
            TaskPayload::Working
        }
        _ => TaskPayload::Working,
    };
    DetailedTask::new(task, payload)
}

/// What a held call waits for, in words for the client's user.
fn waiting_for(job: &v1::Job) -> String {
    let outcome = job.held_calls.iter().any(|held| held.kind == "outcome");
    if outcome {
        "waiting for an operator's verdict on whether the call's effect happened".to_owned()
    } else {
        "waiting for a person to approve the call".to_owned()
    }
}

/// `result` as the JSON object a completed task carries.
fn as_object(result: &CallToolResult) -> JsonObject {
    match serde_json::to_value(result) {
        Ok(Value::Object(object)) => object,
        _ => JsonObject::new(),
    }
}

/// `at` in RFC 3339 (ISO 8601), to the millisecond, in UTC.
fn timestamp(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{ContentBlock, TaskStatus};

    fn job(status: v1::JobStatus, held: &[&str]) -> v1::Job {
        let mut job = v1::Job {
            job_id: "job-1".into(),
            created_at_ms: 1_000,
            held_calls: held
                .iter()
                .map(|kind| v1::HeldCall {
                    kind: (*kind).to_owned(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        job.set_status(status);
        if matches!(
            status,
            v1::JobStatus::Succeeded | v1::JobStatus::Failed | v1::JobStatus::Cancelled
        ) {
            job.finished_at_ms = 2_000;
        }
        job
    }

    #[test]
    fn a_call_job_is_the_task_its_status_says() {
        let now = UNIX_EPOCH + Duration::from_secs(3);
        let options = TaskOptions::default();
        let answer = |_: &v1::Job| CallToolResult::success(vec![ContentBlock::text("42")]);
        // (status, held calls, task status, status message)
        let cases = [
            (v1::JobStatus::Queued, vec![], TaskStatus::Working, None),
            (v1::JobStatus::Running, vec![], TaskStatus::Working, None),
            (
                v1::JobStatus::WaitingForApproval,
                vec!["approval"],
                TaskStatus::Working,
                Some("waiting for a person to approve the call"),
            ),
            (
                v1::JobStatus::WaitingForApproval,
                vec!["outcome"],
                TaskStatus::Working,
                Some("waiting for an operator's verdict on whether the call's effect happened"),
            ),
            (
                v1::JobStatus::Succeeded,
                vec![],
                TaskStatus::Completed,
                None,
            ),
            (v1::JobStatus::Failed, vec![], TaskStatus::Completed, None),
            (
                v1::JobStatus::Cancelled,
                vec![],
                TaskStatus::Cancelled,
                None,
            ),
        ];
        for (status, held, expected, message) in cases {
            let task = detailed(&job(status, &held), now, &options, answer);
            assert_eq!(task.status(), expected, "{status:?}");
            assert_eq!(task.task.status_message.as_deref(), message, "{status:?}");
            assert_eq!(task.task.task_id, "job-1");
            assert_eq!(task.task.created_at, "1970-01-01T00:00:01.000Z");
            let updated = if expected == TaskStatus::Working {
                "03"
            } else {
                "02"
            };
            assert_eq!(
                task.task.last_updated_at,
                format!("1970-01-01T00:00:{updated}.000Z")
            );
            assert_eq!(task.task.ttl_ms, Some(24 * 3600 * 1000));
            if let TaskPayload::Completed { result } = &task.payload {
                assert_eq!(result["content"][0]["text"], "42", "{status:?}");
            }
        }
    }

    #[test]
    fn only_the_gateways_call_jobs_are_tasks() {
        let mut ours = job(v1::JobStatus::Running, &[]);
        assert!(!is_ours(&ours));
        ours.metadata.insert(MARK.0.into(), MARK.1.into());
        assert!(is_ours(&ours));
        ours.metadata.insert(MARK.0.into(), "something else".into());
        assert!(!is_ours(&ours));
    }
}
