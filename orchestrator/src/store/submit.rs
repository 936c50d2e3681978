//! Submitting a job: its record, first event and conversation in one
//! script, the idempotency key mapped to it, and the tenant's indexes (its
//! jobs, and its submitter's).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use toolfleet_service::connect::append_ignored;

use crate::job::{Item, JobEvent, JobSpec, JobStatus, JobTrace, WireIds, new_job_id, now_ms};

use super::counts::{COUNT, Change};
use super::scripts::script;
use super::*;
use crate::live::Written;

impl JobStore {
    /// Creates a job, or with an idempotency key returns the job an earlier
    /// submission created. Returns the job id and whether it was a duplicate.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when Redis is unreachable.
    pub async fn submit(
        &self,
        spec: &JobSpec,
        idempotency: Option<Idempotency<'_>>,
        trace: Option<&JobTrace>,
    ) -> Result<(JobId, bool), Error> {
        let mut job_id = new_job_id(&spec.tenant);
        let fresh = idempotency.is_none();
        let mut duplicate = false;
        if let Some(idempotency) = idempotency
            && let Some(first) = self.bind_key(&spec.tenant, idempotency, &job_id).await?
        {
            job_id = first;
            duplicate = true;
        }
        // Also for a duplicate: if the first submission died between its
        // idempotency record and the job, this creates the job it promised.
        let spec_json = serde_json::to_string(spec).expect("a spec serializes");
        let user = Item::User {
            text: spec.input.clone(),
        }
        .stored_json();
        let (traceparent, tracestate) = trace.map(JobTrace::to_fields).unwrap_or_default();
        let queued = JobEvent::JobQueued {
            metadata: spec.metadata.clone(),
        };
        let now = now_ms();
        let mut create = CREATE.prepare_invoke();
        create
            .key(self.keys.job(&job_id))
            .key(self.keys.job_items(&job_id))
            .key(self.keys.job_events(&job_id))
            .arg(spec_json)
            .arg(now)
            .arg(user)
            .arg(queued.kind())
            .arg(queued.data_json())
            .arg(WireIds::new_secret())
            .arg(traceparent)
            .arg(tracestate)
            .arg(toolfleet_proto::format::written().unwrap_or_default());
        if fresh && !self.redis.is_cluster() {
            self.store_in_one_trip(&create, spec, &job_id, now).await?;
        } else {
            self.store_in_order(&create, spec, &job_id).await?;
        }
        self.notify(&job_id, Written::counted(None)).await;
        Ok((job_id, duplicate))
    }

    /// Stores a new job (`create`) with its index entries and its count, in
    /// this order, in one round trip: a new random id cannot exist yet.
    async fn store_in_one_trip(
        &self,
        create: &redis::ScriptInvocation<'_>,
        spec: &JobSpec,
        job_id: &JobId,
        now: u64,
    ) -> Result<(), Error> {
        let mut pipe = redis::pipe();
        pipe.invoke_script(create);
        let groups = self.index_new_job(spec, spec.submitter.as_deref(), job_id, now, false);
        append_ignored(&mut pipe, &groups);
        if let Some(count) = self.counting(job_id, spec.submitter.as_deref(), QUEUED) {
            pipe.invoke_script(&count).ignore();
        }
        let (_created,): ((i64, u64, i64),) =
            self.query_invoking(&pipe, &[&CREATE, &COUNT]).await?;
        Ok(())
    }

    /// Stores a job (`create`, unless it exists: a duplicate), then its
    /// index entries, then its count. On a cluster the job and each index
    /// are in slots of their own: the job first, so that no index names a
    /// job not yet there (ListJobs would drop it as expired). A duplicate
    /// indexes its job again, at its first time: the submission it repeats
    /// may have died between the job and its indexes. It is indexed under
    /// the submitter its record names, which another credential repeating
    /// the key is not.
    async fn store_in_order(
        &self,
        create: &redis::ScriptInvocation<'_>,
        spec: &JobSpec,
        job_id: &JobId,
    ) -> Result<(), Error> {
        let (created, created_ms, ended): (i64, u64, i64) =
            create.invoke_async(&mut self.conn()).await?;
        let submitter = match created {
            1 => spec.submitter.clone(),
            _ => self.recorded_submitter(job_id).await?,
        };
        let groups = self.index_new_job(spec, submitter.as_deref(), job_id, created_ms, ended == 1);
        self.conn().run_in_order(groups).await?;
        // A duplicate's count of its first status changes nothing once a
        // later one was counted.
        if ended == 0
            && let Err(err) = self.count(job_id, submitter.as_deref(), QUEUED).await
        {
            // Its next change counts it, or the sweeper does.
            tracing::warn!(%job_id, error = %err, "could not count a submitted job");
        }
        Ok(())
    }

    /// Binds an idempotency key to the new job `job_id`, unless it is bound
    /// already: then the job it was first used for (`Some`), when the
    /// request is the same.
    async fn bind_key(
        &self,
        tenant: &str,
        Idempotency { key, fingerprint }: Idempotency<'_>,
        job_id: &JobId,
    ) -> Result<Option<JobId>, Error> {
        let record = self.keys.submission(tenant, key);
        // The record binds the key to the request it was first used for.
        let set: Option<String> = redis::cmd("SET")
            .arg(&record)
            .arg(format!("{job_id} {fingerprint}"))
            .arg("NX")
            .arg("PX")
            .arg(millis(self.submission_ttl))
            .arg("GET")
            .query_async(&mut self.conn())
            .await?;
        let Some(existing) = set else {
            return Ok(None);
        };
        // Records written before fingerprints hold only a job id.
        let (existing_job, existing_print) = match existing.split_once(' ') {
            Some((job, print)) => (job, Some(print)),
            None => (existing.as_str(), None),
        };
        if existing_print.is_some_and(|print| print != fingerprint) {
            return Err(Error::IdempotencyConflict(key.to_owned()));
        }
        // A record that names no job was not written here: the key cannot
        // be used again, as if taken by another request.
        JobId::parse(existing_job)
            .map(Some)
            .ok_or_else(|| Error::IdempotencyConflict(key.to_owned()))
    }

    /// The writes that put a job created at `created_ms` into the sets that
    /// find it again, one pipeline per hash slot: the unfinished jobs (the
    /// sweeper's), then its tenant's job index and its `submitter`'s
    /// (`ListJobs`, decision 0049) and, under an active-jobs quota, its
    /// tenant's active jobs; an `ended` job only into the two job indexes.
    /// Each may run twice ([`query_invoking`](JobStore::query_invoking), a
    /// repeated submission).
    fn index_new_job(
        &self,
        spec: &JobSpec,
        submitter: Option<&str>,
        job_id: &JobId,
        created_ms: u64,
        ended: bool,
    ) -> Vec<redis::Pipeline> {
        let now = now_ms();
        let kept = millis(self.retention + LONGEST_JOB);
        let tenant_index = self.keys.tenant_jobs(&spec.tenant);
        // The submitter's index shares the tenant's hash tag: the same
        // pipeline writes both, one after the other.
        let submitter_index =
            submitter.map(|submitter| self.keys.submitter_jobs(&spec.tenant, submitter));
        // An index forgets what has surely expired: jobs live at most
        // their deadline (24h at most) plus the retention.
        let horizon = now.saturating_sub(kept);
        // Plain pipelines, not MULTI: the keys are in different hash slots
        // (Redis Cluster), and each write stands on its own.
        let mut pipe = redis::pipe();
        for index in std::iter::once(&tenant_index).chain(&submitter_index) {
            pipe.cmd("ZADD")
                .arg(index)
                .arg(created_ms)
                .arg(job_id.as_str())
                .ignore()
                .cmd("ZREMRANGEBYSCORE")
                .arg(index)
                .arg("-inf")
                .arg(format!("({horizon}"))
                .ignore();
        }
        if let Some(index) = &submitter_index {
            // A submitter that stops submitting trims its index no more:
            // the index goes when its newest entry would have been trimmed.
            pipe.cmd("PEXPIRE").arg(index).arg(kept).ignore();
        }
        if ended {
            return vec![pipe];
        }
        let mut unfinished = redis::pipe();
        unfinished
            .cmd("ZADD")
            .arg(self.keys.unfinished_jobs(job_id))
            .arg(created_ms)
            .arg(job_id.as_str())
            .ignore();
        // Counted only under an active-jobs quota, whose check prunes
        // the set: without one, nothing would.
        if spec.limits.max_active_jobs.is_some() {
            pipe.cmd("SADD")
                .arg(self.keys.tenant_active_jobs(&spec.tenant))
                .arg(job_id.as_str())
                .ignore();
        }
        vec![unfinished, pipe]
    }
}

/// A job's first status, as its count takes it: queued, with its first
/// event.
const QUEUED: Change = Change::Live {
    status: JobStatus::Queued,
    events: 1,
};

/// The longest a job may run (`api.max_deadline` cannot exceed it): the
/// job index keeps entries this long plus the retention.
const LONGEST_JOB: Duration = Duration::from_secs(24 * 3600);

/// A submission's idempotency key and the fingerprint of its request: the
/// key answers with the first job only for the same request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idempotency<'a> {
    /// The client's key.
    pub key: &'a str,
    /// A hash of everything the client asked for (hex, no spaces).
    pub fingerprint: &'a str,
}

/// KEYS: job, items, events. ARGV: spec, now_ms, user item, event kind,
/// event data, call secret, traceparent, tracestate (both may be empty),
/// the format the job's records are written in (empty: format 1, which is
/// not marked).
/// Creates the job unless it exists. Returns `{created, created_at_ms,
/// ended}`: 1 and the given time when created; 0, the existing job's
/// creation time and 1 if it has ended, when it existed.
static CREATE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local existing = redis.call('HMGET', KEYS[1], 'status', 'created_at_ms')
local status = existing[1]
if status then
  local ended = 0
  if $ENDED then ended = 1 end
  return {0, tonumber(existing[2]) or 0, ended}
end
redis.call('HSET', KEYS[1], 'spec', ARGV[1], 'status', '$QUEUED', 'created_at_ms', ARGV[2],
           'rounds', 0, 'epoch', 0, 'events', 1, 'call_secret', ARGV[6],
           'traceparent', ARGV[7], 'tracestate', ARGV[8])
if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'format', ARGV[9]) end
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('XADD', KEYS[3], '0-1', 'kind', ARGV[4], 'data', ARGV[5], 'ts', ARGV[2], 'final', '0')
return {1, tonumber(ARGV[2]), 0}
",
    )
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ApiOptions;

    #[test]
    fn the_create_script_is_filled_and_reports_an_ended_job() {
        use super::super::scripts::tests::{assert_ended_reads_status, assert_filled};
        let shown = assert_filled("CREATE", &CREATE);
        assert_ended_reads_status("CREATE", &shown);
        assert!(shown.contains("'status', 'queued'"), "a new job is queued");
    }

    /// The job index forgets entries older than the longest job plus the
    /// retention: a job that may run longer would leave its tenant's list
    /// while it still runs.
    #[test]
    fn the_job_index_outlives_the_longest_deadline_the_api_accepts() {
        assert!(ApiOptions::default().max_deadline <= LONGEST_JOB);
    }
}
