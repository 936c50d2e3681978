//! The Lua scripts of the job store. Every script touches only keys of one job
//! (one hash tag), so each is atomic, also on Redis Cluster.
//!
//! Fencing: a runner writes with its lease token `<owner>:<epoch>`. Every
//! runner write first checks that the lease key still holds that token; a
//! zombie replica whose lease expired and was taken over gets `LEASE_LOST`
//! and stops instead of corrupting the job.
//!
//! Each script is hashed once; redis-rs runs it by hash (EVALSHA) and loads
//! it on a cache miss.
//!
//! The scripts spell no event kind, error code or status of their own: event
//! kinds, their data and codes come in as arguments, and statuses are filled
//! in from [`JobStatus`] when a script is built (`$QUEUED`, `$RUNNING`,
//! `$CANCELLED`, `$FAILED`, and `$ENDED` for "the job has ended").

use std::sync::LazyLock;

use redis::Script;

use crate::job::JobStatus;

/// What [`COMMIT`] returns when the lease is not held (or the job ended).
pub(super) const LEASE_LOST: i64 = -1;

/// What [`COMMIT`] returns when a stored result it was asked to check is
/// not the text given.
pub(super) const RESULT_MISMATCH: i64 = -2;

/// A script with the status placeholders filled in.
fn script(template: &str) -> Script {
    let ended = JobStatus::ALL
        .into_iter()
        .filter(|s| s.is_final())
        .map(|s| format!("status == '{s}'"))
        .collect::<Vec<_>>()
        .join(" or ");
    Script::new(
        &template
            .replace("$ENDED", &ended)
            .replace("$QUEUED", JobStatus::Queued.as_str())
            .replace("$RUNNING", JobStatus::Running.as_str())
            .replace("$FAILED", JobStatus::Failed.as_str())
            .replace("$CANCELLED", JobStatus::Cancelled.as_str()),
    )
}

/// KEYS: job, items, events. ARGV: spec, now_ms, user item, event kind,
/// event data, call secret, traceparent, tracestate (both may be empty).
/// Creates the job unless it exists. Returns `{created, created_at_ms,
/// ended}`: 1 and the given time when created; 0, the existing job's
/// creation time and 1 if it has ended, when it existed.
pub(super) static CREATE: LazyLock<Script> = LazyLock::new(|| {
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
redis.call('RPUSH', KEYS[2], ARGV[3])
redis.call('XADD', KEYS[3], '0-1', 'kind', ARGV[4], 'data', ARGV[5], 'ts', ARGV[2], 'final', '0')
return {1, tonumber(ARGV[2]), 0}
",
    )
});

/// KEYS: job, lease, events. ARGV: owner, ttl_ms, now_ms, the kinds of the
/// events of a first run and of a resumed one, and the event's data before
/// and after its epoch.
/// Takes the lease if it is free and the job is not finished, and starts
/// the run in the same step: the job is running, with a `job_started` event
/// (`job_resumed` when it ran before). Returns `{epoch, events, resumed}`:
/// the new epoch (0 if another runner holds the lease, -1 if the job is
/// finished, -2 if it is missing; nothing is written then), the number of
/// events the job has, and 1 when the run resumes.
pub(super) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {-2, 0, 0} end
if $ENDED then return {-1, 0, 0} end
if redis.call('EXISTS', KEYS[2]) == 1 then return {0, 0, 0} end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('SET', KEYS[2], ARGV[1] .. ':' .. epoch, 'PX', ARGV[2])
local resumed = 0
local kind = ARGV[4]
if status ~= '$QUEUED' then resumed = 1; kind = ARGV[5] end
redis.call('HSET', KEYS[1], 'status', '$RUNNING')
local events = redis.call('HINCRBY', KEYS[1], 'events', 1)
redis.call('XADD', KEYS[3], '0-' .. events, 'kind', kind, 'data', ARGV[6] .. epoch .. ARGV[7],
           'ts', ARGV[3], 'final', '0')
return {epoch, events, resumed}
",
    )
});

/// KEYS: lease. ARGV: token, ttl_ms. Returns 1 if renewed, 0 if lost.
pub(super) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
",
    )
});

/// KEYS: lease. ARGV: token. Drops the lease if still ours.
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
",
    )
});

/// KEYS: job, items, events, lease, attempts, tools. ARGV: token, now_ms,
/// retention_ms (0: keep), then six counted lists: n, (result key, the text
/// it must hold)...; n, items...; n, (kind, data, final)...; n, (field,
/// value)...; n, (call_id, attempt)...; n, (tool, manifest)...
/// Appends items and events and updates fields, only while the lease holds
/// and each result to check holds its text (else [`RESULT_MISMATCH`], and
/// nothing is written).
///
/// The result keys to check are arguments, not KEYS (decision 0028): Redis
/// checks every key given to `EVALSHA` as read-write, and the orchestrator
/// may only read a call's result; the script's `GET` of it is checked as a
/// read. A call's result key has its job's hash tag, so it is in the slot of
/// the declared keys, which is what Redis Cluster requires of a key a
/// script reaches; a key that is not there (a slot being migrated) reads as
/// missing, a mismatch, which the round answers by reading Redis.
/// With retention_ms > 0 (the job finished) every key of the job expires.
/// Returns the number of events the job has after the commit (0 for a
/// commit without events), or [`LEASE_LOST`] (also when the job already
/// finished: nothing is written after the end).
///
/// One command per list, not per element: the commands a script runs cost
/// Redis CPU like any other (`INFO commandstats` counts them), so the items
/// are one `RPUSH`, the fields of each hash one `HSET`, and the events take
/// their sequence numbers with one `HINCRBY` (older replicas, which add one
/// at a time, still agree with it during a rolling upgrade). `unpack` has a
/// limit on how many values it returns, so very long lists go in chunks.
pub(super) static COMMIT: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
if redis.call('GET', KEYS[4]) ~= ARGV[1] then return -1 end
local status = redis.call('HGET', KEYS[1], 'status')
if $ENDED then return -1 end
local CHUNK = 512
-- Runs `command key ARGV[first .. first + count - 1]`, CHUNK values a time
-- (an even number, so that field-value pairs stay together).
local function each_chunk(command, key, first, count)
  local last = first + count - 1
  for from = first, last, CHUNK do
    redis.call(command, key, unpack(ARGV, from, math.min(from + CHUNK - 1, last)))
  end
end
local i = 4
local n = tonumber(ARGV[i]); i = i + 1
for k = 1, n do
  if redis.call('GET', ARGV[i]) ~= ARGV[i + 1] then return -2 end
  i = i + 2
end
n = tonumber(ARGV[i]); i = i + 1
each_chunk('RPUSH', KEYS[2], i, n); i = i + n
n = tonumber(ARGV[i]); i = i + 1
local events = 0
if n > 0 then
  events = redis.call('HINCRBY', KEYS[1], 'events', n)
  for seq = events - n + 1, events do
    redis.call('XADD', KEYS[3], '0-' .. seq, 'kind', ARGV[i], 'data', ARGV[i + 1], 'ts', ARGV[2], 'final', ARGV[i + 2])
    i = i + 3
  end
end
for k = 1, 3 do
  n = tonumber(ARGV[i]); i = i + 1
  local hash = ({KEYS[1], KEYS[5], KEYS[6]})[k]
  each_chunk('HSET', hash, i, 2 * n); i = i + 2 * n
end
local retention = tonumber(ARGV[3])
if retention > 0 then
  for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], retention) end
  redis.call('PEXPIRE', KEYS[5], retention)
  redis.call('PEXPIRE', KEYS[6], retention)
  redis.call('DEL', KEYS[4])
end
return events
",
    )
});

/// KEYS: job, events, items, lease. ARGV: now_ms, retention_ms, event kind,
/// event data, error code, error message.
/// Cancels a job nobody runs yet; asks a running one to stop. Returns the
/// status after the request ('' if the job is missing).
pub(super) static CANCEL: LazyLock<Script> = LazyLock::new(|| {
    script(
        r"
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return '' end
-- A queued job a runner already leased is as good as running: only ask.
if status == '$QUEUED' and redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('HSET', KEYS[1], 'status', '$CANCELLED', 'finished_at_ms', ARGV[1],
             'error_code', ARGV[5], 'error_message', ARGV[6])
  local seq = redis.call('HINCRBY', KEYS[1], 'events', 1)
  redis.call('XADD', KEYS[2], '0-' .. seq, 'kind', ARGV[3], 'data', ARGV[4], 'ts', ARGV[1], 'final', '1')
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return '$CANCELLED'
end
if status == '$RUNNING' or status == '$QUEUED' then
  redis.call('HSET', KEYS[1], 'cancel_requested', '1')
end
return status
",
    )
});

/// KEYS: job, events. ARGV: placeholder spec, now_ms, retention_ms, error
/// code, error message, event kind, event data.
/// Records that a job's state vanished from Redis (flushed, or a failover
/// that lost writes), so clients see a failed job instead of none.
pub(super) static LOST: LazyLock<Script> = LazyLock::new(|| {
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

/// Takes a slot for a tool call in a tenant's calls in flight (KEYS[1], a
/// sorted set scored by expiry): ARGV[1] the call, ARGV[2] the quota,
/// ARGV[3] when the entry expires (Unix ms; the job's deadline, so that the
/// slot of a runner that died comes back). Expired entries are dropped
/// first. Returns 1 when the call holds a slot (already held counts: a
/// resumed round), 0 when the tenant is at its quota.
pub(super) static TAKE_CALL_SLOT: LazyLock<Script> = LazyLock::new(|| {
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
pub(super) static COUNT_CALLS: LazyLock<Script> = LazyLock::new(|| {
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
pub(super) static TAKE_SUBMISSION: LazyLock<Script> = LazyLock::new(|| {
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
