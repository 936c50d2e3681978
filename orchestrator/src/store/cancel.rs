//! Ending a job from outside its run: a client's cancel, and a job whose
//! state vanished from Redis.

use std::collections::BTreeMap;

use super::wake_ups::Written;

use crate::job::{Ending, JobErrorCode, JobEvent, JobSpec, JobStatus, ProviderKind, now_ms};

use super::*;

impl JobStore {
    /// Cancels a queued job at once, or asks its runner to stop. Returns the
    /// status after the request, `None` for an unknown job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn cancel(&self, job_id: &str) -> Result<Option<JobStatus>, Error> {
        let cancelled = Ending::Cancelled.event();
        let status: String = scripts::CANCEL
            .key(self.keys.job(job_id))
            .key(self.keys.job_events(job_id))
            .key(self.keys.job_items(job_id))
            .key(self.keys.job_lease(job_id))
            .arg(now_ms())
            .arg(millis(self.retention))
            .arg(cancelled.kind())
            .arg(cancelled.data_json())
            .arg(JobErrorCode::Cancelled.as_str())
            .arg("the job was cancelled before it started")
            .invoke_async(&mut self.conn())
            .await?;
        self.notify(job_id, Written::counted(None)).await;
        let status = status.parse::<JobStatus>().ok();
        if status.is_some_and(JobStatus::is_final) {
            self.forget_unfinished(job_id).await;
        }
        Ok(status)
    }

    /// Marks a job whose state vanished from Redis as failed with
    /// `JOB_STATE_LOST`, unless it exists again.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn record_lost(&self, job_id: &str, tenant: &str) -> Result<(), Error> {
        // The record must parse like any other: an empty spec stands in for
        // the one that was lost.
        let placeholder = JobSpec {
            input: String::new(),
            instructions: String::new(),
            provider: ProviderKind::Scripted,
            model: String::new(),
            script: None,
            tools: Vec::new(),
            max_tool_rounds: 0,
            parallel_tool_calls: true,
            deadline_ms: 0,
            metadata: BTreeMap::new(),
            tenant: tenant.to_owned(),
            limits: Default::default(),
        };
        // The event carries no message, as it always did.
        let lost = JobEvent::JobFailed {
            code: JobErrorCode::JobStateLost,
            message: None,
        };
        let _: i64 = scripts::LOST
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
        self.forget_unfinished(job_id).await;
        Ok(())
    }
}
