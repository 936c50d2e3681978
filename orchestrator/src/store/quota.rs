//! Tenants' quotas as Redis keeps them, shared by every replica: the
//! submissions' token bucket, the active jobs, and the calls in flight.

use std::time::Duration;

use redis::AsyncCommands;

use crate::job::JobStatus;

use super::*;

impl JobStore {
    /// Takes one submission from `tenant`'s bucket of `rate` per second
    /// (holding one second's worth, at least one). `None` when taken, else
    /// how long until the next one is there.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn take_submission(
        &self,
        tenant: &str,
        rate: f64,
    ) -> Result<Option<Duration>, Error> {
        let wait_ms: u64 = scripts::TAKE_SUBMISSION
            .key(self.keys.tenant_submissions(tenant))
            .arg(rate)
            .arg(rate.max(1.0))
            .invoke_async(&mut self.conn())
            .await?;
        Ok((wait_ms > 0).then(|| Duration::from_millis(wait_ms)))
    }

    /// Takes a slot in `tenant`'s calls in flight for `call` (a job's call,
    /// `<job>/<wire id>`) until `expires_ms` at the latest. `false` when the
    /// tenant already has `limit` calls in flight. Taking a slot the call
    /// holds already succeeds (a resumed round).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn take_call_slot(
        &self,
        tenant: &str,
        call: &str,
        limit: u32,
        expires_ms: u64,
    ) -> Result<bool, Error> {
        let taken: i64 = scripts::TAKE_CALL_SLOT
            .key(self.keys.tenant_calls(tenant))
            .arg(call)
            .arg(limit)
            .arg(expires_ms)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(taken == 1)
    }

    /// Frees the slot `call` holds in `tenant`'s calls in flight.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn release_call_slot(&self, tenant: &str, call: &str) -> Result<(), Error> {
        let _: i64 = self
            .conn()
            .zrem(self.keys.tenant_calls(tenant), call)
            .await?;
        Ok(())
    }

    /// How many tool calls `tenant` has in flight.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn calls_in_flight(&self, tenant: &str) -> Result<u32, Error> {
        Ok(scripts::COUNT_CALLS
            .key(self.keys.tenant_calls(tenant))
            .invoke_async(&mut self.conn())
            .await?)
    }

    /// How many of `tenant`'s jobs are queued or running, counted exactly
    /// only when the rough count reaches `limit`: the finished and expired
    /// jobs the set still names are then dropped from it.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn active_jobs(&self, tenant: &str, limit: u32) -> Result<u32, Error> {
        let key = self.keys.tenant_active_jobs(tenant);
        let rough: u32 = self.conn().scard(&key).await?;
        if rough < limit {
            return Ok(rough);
        }
        let members: Vec<String> = self.conn().smembers(&key).await?;
        let statuses: Vec<Option<String>> = if self.redis.is_cluster() {
            // Each job in its own slot: one read each, all at once.
            let reads = members.iter().map(|job_id| async move {
                self.conn().hget(self.keys.job(job_id), "status").await
            });
            futures::future::try_join_all(reads).await?
        } else {
            let mut pipe = redis::pipe();
            for job_id in &members {
                pipe.hget(self.keys.job(job_id), "status");
            }
            pipe.query_async(&mut self.conn()).await?
        };
        let mut active = 0;
        let mut ended = Vec::new();
        for (job_id, status) in members.iter().zip(statuses) {
            match status.and_then(|s| s.parse::<JobStatus>().ok()) {
                Some(status) if !status.is_final() => active += 1,
                _ => ended.push(job_id),
            }
        }
        if !ended.is_empty() {
            let _: i64 = self.conn().srem(&key, ended).await?;
        }
        Ok(active)
    }
}
