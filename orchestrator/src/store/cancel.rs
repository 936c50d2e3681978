//! Ending a job from outside its run: a client's cancel, and a job whose
//! state vanished from Redis.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use redis::Script;

use crate::job::{Ending, JobErrorCode, JobEvent, JobSpec, JobStatus, ProviderKind, now_ms};

use super::scripts::script;
use super::*;
use crate::live::Written;

impl JobStore {
    /// Cancels a queued or parked job at once (its end counted), or asks its
    /// runner to stop. Returns the status after the request, `None` for an
    /// unknown job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn cancel(&self, job_id: &JobId) -> Result<Option<JobStatus>, Error> {
        let cancelled = Ending::Cancelled.event(None);
        let (status, spec): (String, String) = CANCEL
            .key(self.keys.job(job_id))
            .key(self.keys.job_events(job_id))
            .key(self.keys.job_items(job_id))
            .key(self.keys.job_lease(job_id))
            .key(self.keys.job_attempts(job_id))
            .key(self.keys.job_tools(job_id))
            .key(self.keys.job_approvals(job_id))
            .key(self.keys.job_shaped(job_id))
            .arg(now_ms())
            .arg(millis(self.retention))
            .arg(cancelled.kind())
            .arg(cancelled.data_json())
            .arg(JobErrorCode::Cancelled.as_str())
            .arg("the job was cancelled before it started")
            .arg("the job was cancelled while it waited for approval")
            .invoke_async(&mut self.conn())
            .await?;
        self.notify(job_id, Written::counted(None)).await;
        let status = status.parse::<JobStatus>().ok();
        if status.is_some_and(JobStatus::is_final) {
            if spec.is_empty() {
                // It had ended before: its end was counted then.
                self.forget_place(job_id).await;
            } else {
                // A spec that does not parse names no submitter: the job
                // is counted for its tenant alone.
                let submitter = serde_json::from_str::<JobSpec>(&spec)
                    .ok()
                    .and_then(|spec| spec.submitter);
                self.count_end(job_id, submitter.as_deref(), JobStatus::Cancelled)
                    .await;
            }
            self.forget_held(job_id).await;
        }
        Ok(status)
    }

    /// Marks a job whose state vanished from Redis as failed with
    /// `JOB_STATE_LOST`, unless it exists again.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn record_lost(&self, job_id: &JobId, tenant: &str) -> Result<(), Error> {
        // The record must parse like any other: an empty spec stands in for
        // the one that was lost.
        let placeholder = JobSpec {
            input: String::new(),
            instructions: String::new(),
            provider: ProviderKind::Scripted,
            model: String::new(),
            script: None,
            max_tokens: None,
            stream: false,
            no_result_cache: false,
            call: None,
            tools: Vec::new(),
            max_tool_rounds: 0,
            parallel_tool_calls: true,
            deadline_ms: 0,
            metadata: BTreeMap::new(),
            tenant: tenant.to_owned(),
            submitter: None,
            approval: Default::default(),
            limits: Default::default(),
            budget: Default::default(),
        };
        // The event carries no message, as it always did.
        let lost = JobEvent::JobFailed {
            spent: None,
            code: JobErrorCode::JobStateLost,
            message: None,
        };
        let recorded: i64 = LOST
            .key(self.keys.job(job_id))
            .key(self.keys.job_events(job_id))
            .arg(serde_json::to_string(&placeholder).expect("a spec serializes"))
            .arg(now_ms())
            .arg(millis(self.retention))
            .arg(JobErrorCode::JobStateLost.as_str())
            .arg("the job's state was lost from Redis (flushed or failed over without its data)")
            .arg(lost.kind())
            .arg(lost.data_json())
            .invoke_async(&mut self.conn())
            .await?;
        self.notify(job_id, Written::counted(None)).await;
        if recorded == 1 {
            // Its submitter was lost with it: the failure counts for its
            // tenant alone, as it lists.
            self.count_end(job_id, None, JobStatus::Failed).await;
        } else {
            self.forget_place(job_id).await;
        }
        Ok(())
    }
}

/// KEYS: job, events, items, lease, attempts, tools, approvals, shaped. ARGV:
/// now_ms, retention_ms, event kind, event data, error code, the error
/// message of a queued job, and of a parked one.
/// Cancels a job nobody runs (queued, or parked waiting for approval) at
/// once, every key of it set to expire; asks a running one to stop. Returns
/// `{status, spec}`: the status after the request ('' if the job is
/// missing), and the job's spec if this request ended it ('' otherwise),
/// whose submitter its end is counted for.
static CANCEL: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {'', ''} end
-- A queued (or parked) job a runner already leased is as good as running:
-- only ask.
local unheld = redis.call('EXISTS', KEYS[4]) == 0
if (status == '$QUEUED' or status == '$WAITING') and unheld then
  local message = ARGV[6]
  if status == '$WAITING' then message = ARGV[7] end
  redis.call('HSET', KEYS[1], 'status', '$CANCELLED', 'finished_at_ms', ARGV[1],
             'error_code', ARGV[5], 'error_message', message)
  local seq = redis.call('HINCRBY', KEYS[1], 'events', 1)
  redis.call('XADD', KEYS[2], '0-' .. seq, 'kind', ARGV[3], 'data', ARGV[4], 'ts', ARGV[1], 'final', '1')
  for k = 1, 8 do
    if k ~= 4 then redis.call('PEXPIRE', KEYS[k], ARGV[2]) end
  end
  return {'$CANCELLED', redis.call('HGET', KEYS[1], 'spec') or ''}
end
if status == '$RUNNING' or status == '$QUEUED' or status == '$WAITING' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
end
return {status, ''}
",
    )
});

/// KEYS: job, events. ARGV: placeholder spec, now_ms, retention_ms, error
/// code, error message, event kind, event data.
/// Records that a job's state vanished from Redis (flushed, or a failover
/// that lost writes), so clients see a failed job instead of none.
static LOST: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'spec', ARGV[1], 'status', '$FAILED', 'created_at_ms', ARGV[2],
           'finished_at_ms', ARGV[2], 'rounds', 0, 'turns', 0, 'epoch', 0, 'events', 1,
           'error_code', ARGV[4], 'error_message', ARGV[5])
redis.call('DEL', KEYS[2])
redis.call('XADD', KEYS[2], '0-1', 'kind', ARGV[6], 'data', ARGV[7],
           'ts', ARGV[2], 'final', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
",
    )
});

#[cfg(test)]
mod tests {
    use super::super::scripts::tests::assert_filled;
    use super::*;

    /// `cancel` parses what `CANCEL` answers as a status: the one it
    /// spells itself is the cancelled status's spelling.
    #[test]
    fn the_cancel_scripts_are_filled_and_answer_statuses() {
        let cancel = assert_filled("CANCEL", &CANCEL);
        assert!(cancel.contains(&format!("return {{'{}'", JobStatus::Cancelled)));
        let lost = assert_filled("LOST", &LOST);
        assert!(lost.contains(&format!("'status', '{}'", JobStatus::Failed)));
    }
}
