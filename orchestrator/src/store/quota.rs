//! Tenants' quotas as Redis keeps them, shared by every replica: the
//! submissions' token bucket, the active jobs, and the calls in flight.

use std::sync::LazyLock;
use std::time::Duration;

use redis::AsyncCommands;
use redis::Script;

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
    pub(crate) async fn take_submission(
        &self,
        tenant: &str,
        rate: f64,
    ) -> Result<Option<Duration>, Error> {
        let wait_ms: u64 = TAKE_SUBMISSION
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
    pub(crate) async fn take_call_slot(
        &self,
        tenant: &str,
        call: &str,
        limit: u32,
        expires_ms: u64,
    ) -> Result<bool, Error> {
        let taken: i64 = TAKE_CALL_SLOT
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
    pub(crate) async fn release_call_slot(&self, tenant: &str, call: &str) -> Result<(), Error> {
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
    pub(crate) async fn calls_in_flight(&self, tenant: &str) -> Result<u32, Error> {
        Ok(COUNT_CALLS
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
    pub(crate) async fn active_jobs(&self, tenant: &str, limit: u32) -> Result<u32, Error> {
        let key = self.keys.tenant_active_jobs(tenant);
        let rough: u32 = self.conn().scard(&key).await?;
        if rough < limit {
            return Ok(rough);
        }
        let mut members = Vec::new();
        // Dropped from the set: a member that is not a job id (not written
        // here), and below, every job that ended or expired.
        let mut ended = Vec::new();
        for member in self.conn().smembers::<_, Vec<String>>(&key).await? {
            match JobId::parse(&member) {
                Some(job_id) => members.push(job_id),
                None => ended.push(member),
            }
        }
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
        for (job_id, status) in members.into_iter().zip(statuses) {
            match status.and_then(|s| s.parse::<JobStatus>().ok()) {
                Some(status) if !status.is_final() => active += 1,
                _ => ended.push(job_id.into()),
            }
        }
        if !ended.is_empty() {
            let _: i64 = self.conn().srem(&key, ended).await?;
        }
        Ok(active)
    }
}

/// Takes a slot for a tool call in a tenant's calls in flight (KEYS[1], a
/// sorted set scored by expiry): ARGV[1] the call, ARGV[2] the quota,
/// ARGV[3] when the entry expires (Unix ms; the job's deadline, so that the
/// slot of a runner that died comes back). Expired entries are dropped
/// first. Returns 1 when the call holds a slot (already held counts: a
/// resumed round), 0 when the tenant is at its quota.
static TAKE_CALL_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expires = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1])
   and redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], expires, ARGV[1])
if redis.call('PTTL', KEYS[1]) < expires - now then
  redis.call('PEXPIRE', KEYS[1], math.max(1, expires - now))
end
return 1
",
    )
});

/// Counts a tenant's calls in flight (KEYS[1], as [`TAKE_CALL_SLOT`]),
/// dropping the expired entries first.
static COUNT_CALLS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
",
    )
});

/// Takes one submission from a tenant's token bucket (KEYS[1], a hash of
/// `tokens` and `at_ms`), refilled at ARGV[1] per second up to ARGV[2].
/// Returns 0 when a token was taken, else the milliseconds until one is
/// there. Redis's own clock, so every replica shares one bucket.
static TAKE_SUBMISSION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local bucket = redis.call('HMGET', KEYS[1], 'tokens', 'at_ms')
local tokens = tonumber(bucket[1]) or burst
local at = tonumber(bucket[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at_ms', now)
redis.call('PEXPIRE', KEYS[1], math.ceil(burst * 1000 / rate) + 1000)
return wait
",
    )
});

#[cfg(test)]
mod tests {
    use super::super::scripts::tests::assert_filled;
    use super::*;

    /// The quota scripts are built without `script()`: they must spell no
    /// placeholder, which would reach Redis as Lua text.
    #[test]
    fn the_quota_scripts_hold_no_placeholder() {
        assert_filled("TAKE_CALL_SLOT", &TAKE_CALL_SLOT);
        assert_filled("COUNT_CALLS", &COUNT_CALLS);
        assert_filled("TAKE_SUBMISSION", &TAKE_SUBMISSION);
    }
}
