//! The job store in Redis: job records, conversation items, event logs,
//! submission idempotency and the fenced lease of the runner of each job.
//!
//! Layout (names in `toolfleet_proto::names::RedisKeys`), one hash tag per job:
//! - `tf:{<job>}:job`: a hash: `format` (the format of every record of the
//!   job, `toolfleet_proto::format`; absent: format 1), `spec` (JSON), `status`, `rounds`, `epoch`,
//!   `turns`, `events` (count), `output_text`, `error_code`, `error_message`,
//!   `created_at_ms`, `finished_at_ms`, `cancel_requested`, `moves` and
//!   `requeued` (its place in the sweeper's indexes: `place`, `park`), `call_secret`
//!   (what its calls' wire ids are made from, [`WireIds`](crate::job::WireIds)), `traceparent`
//!   and `tracestate` (its trace, [`JobTrace`](crate::job::JobTrace)),
//!   `spent_tokens`, `spent_cost_units`, `spent_tool_calls` and
//!   `budget_exceeded` (what it spent of its budget, [`crate::budget`]);
//! - `tf:{<job>}:items`: a list of conversation items (JSON), appended to;
//! - `tf:{<job>}:events`: a stream whose entry ids are `0-<n>`, so event offset
//!   `k` is id `0-<k+1>` and a watcher can start at any offset;
//! - `tf:{<job>}:attempts`: a hash wire call id -> the attempt last dispatched,
//!   and `settled:<wire call id>` -> attempts made, once the call's result
//!   is recorded (read as [`Attempts`], `attempts`);
//! - `tf:{<job>}:tools`: a hash tool name -> the manifest the model was
//!   offered (a call to it waits for its workers rather than being unknown);
//! - `tf:{<job>}:approvals`: its held calls and their decisions
//!   (`approvals`, decision 0036);
//! - `tf:{<job>}:lease`: `<owner>:<epoch>` of the runner, with a TTL.
//!
//! Finished jobs expire after the retention. A tenant's indexes and counts
//! are under its own hash tag (`index`, `counts`).
//!
//! The store speaks in verbs of the job's life, one module each:
//! - `submit`: a new job, its idempotency key and its indexes;
//! - `lease`: taking the lease starts a run and loads the job
//!   ([`JobStore::acquire_and_load`]); renewing and releasing it;
//! - `commit`: [`JobStore::record_turn`], [`JobStore::record_dispatch`],
//!   [`JobStore::record_call_results`] and [`JobStore::finish`], each one
//!   Lua commit fenced by the lease;
//! - `read`: the record, the conversation, attempts, stored results, events;
//! - `cancel`: ending a job from outside its run (a cancel, a lost job);
//! - `index`: a tenant's jobs newest first, and the unfinished jobs;
//! - `counts`: how many of a tenant's jobs (and a submitter's) are in each
//!   status, a stamped step after each change of status;
//! - `quota`: the tenants' submission rate, active jobs, calls in flight;
//! - `catalog`: the manifests of tools once offered;
//! - `cache`: the tenants' result caches, an entry per cached call;
//! - `budget`: the tenants' period budgets, counters per minute and hour;
//! - `breaker`: each tool's circuit breaker, shared by every replica;
//! - `approvals`: held calls and people's decisions, as stored;
//! - `decide`: a person's decision, written once, and its job queued again;
//! - `park`: parking a job, and waking it when its first held call expires;
//! - `place`: where the sweeper finds an unfinished job (the unfinished or
//!   the parked index), moved in fenced steps ([`Steps`]);
//! - `pending`: the tenants' indexes of calls waiting for a decision;
//!
//! Each verb's module holds the Lua scripts it runs; `scripts` builds them.
//! A write with events tells the job's watchers ([`Live`]), which are
//! not the store's: it only says what it wrote.
//!
//! Only this module spells a hash field.

mod approvals;
mod attempts;
mod breaker;
mod budget;
mod cache;
mod cancel;
mod catalog;
mod commit;
mod counts;
mod decide;
mod index;
mod lease;
mod park;
mod pending;
mod place;
mod quota;
mod read;
mod scripts;
mod submit;

use crate::budget::{Limit, Spend};
use crate::job::{Event, JobId};
use crate::live::{Live, Written};
use std::collections::HashMap;
use std::time::Duration;

use toolfleet_proto::names::RedisKeys;
use toolfleet_service::connect::RedisConnection;

pub use approvals::{ApprovalRequest, Approvals, HeldCall};
pub use attempts::Attempts;
pub use commit::{DispatchedCall, SettledCall, Unstored};
pub use counts::{Change, JobCounts};
pub use decide::{Decide, DecideStep, Decided, Seen};
pub(crate) use index::{CreatedWindow, MAX_SUBMITTED_MS, Page};
pub use index::{JobIndex, ListCursor};
pub use lease::Acquired;
pub use park::{ParkWrite, Parked, Wake};
pub use pending::{HealPosition, Pending, PendingCursor, PendingTally};
pub use place::{Place, Stamp, Steps};
pub use read::{RunStart, WatchStart};
pub use submit::Idempotency;

/// The job hash's fields of what it spent ([`crate::budget`]), which the
/// commits that record a turn or an attempt add to.
const SPENT_TOKENS: &str = "spent_tokens";
const SPENT_COST_UNITS: &str = "spent_cost_units";
const SPENT_TOOL_CALLS: &str = "spent_tool_calls";
/// The job hash's field naming the budget a run refused a call for.
const BUDGET_EXCEEDED: &str = "budget_exceeded";

/// A failed store operation.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Redis is unreachable or refused the command; the operation may be
    /// retried. Its message says which when Redis refused it for the
    /// user's ACL, which no retry mends: the log must name the fix.
    #[error("{}", redis_failure(.0))]
    Redis(#[from] redis::RedisError),
    /// Another runner took the job over: stop working on it at once.
    #[error("lease lost for job {0}")]
    LeaseLost(JobId),
    /// The idempotency key was used for a different request within its
    /// time to live. Tell the client to use a new key; never name the job.
    #[error("idempotency key {0:?} was used for a different request")]
    IdempotencyConflict(String),
    /// A result that came with a worker's reply is not the one stored for
    /// its call (a forged reply): nothing was written. Read the stored
    /// result instead.
    #[error("a reply's result for job {0} is not the stored one")]
    ResultMismatch(JobId),
    /// The job is stored in a format this release does not read: a newer
    /// release wrote it (decision 0059). Nothing was read as if it were
    /// one this release knows; leave the job to a newer orchestrator, never
    /// fail it.
    #[error("job {job_id}: {unreadable}")]
    Unreadable {
        /// The job.
        job_id: JobId,
        /// The format found.
        unreadable: toolfleet_proto::format::Unreadable,
    },
    /// Stored data does not parse: a bug or a foreign writer. Fail the job.
    #[error("corrupt record for job {job_id}: {detail}")]
    Corrupt {
        /// The job.
        job_id: JobId,
        /// What did not parse.
        detail: String,
    },
}

/// What a Redis failure is, in words for the log: a refusal by the user's
/// ACL (`NOPERM`: a key pattern or a command missing from its line), or
/// anything else (unreachable, failing over), which a retry may mend. The
/// Redis error itself is the source.
fn redis_failure(err: &redis::RedisError) -> &'static str {
    if err.code() == Some("NOPERM") {
        "redis refused the command for this user's ACL (NOPERM): a key pattern or command \
         is missing from its line (deploy/redis/toolfleet-users.conf has the shipped ones)"
    } else {
        "redis unavailable"
    }
}

/// Redis-backed job store.
#[derive(Clone)]
pub struct JobStore {
    redis: RedisConnection,
    /// Whom its writes' news is told to.
    live: Live,
    keys: RedisKeys,
    retention: Duration,
    submission_ttl: Duration,
}

/// A duration in whole microseconds, as events carry them.
fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn millis(d: Duration) -> u64 {
    toolfleet_service::clock::millis(d).max(1)
}

/// Runs an idempotent read, retrying twice when the connection dropped (a
/// Redis restart): the connection manager reconnects on the next command, so
/// the first command after a restart fails even though Redis is back.
async fn read_with_retry<T, F, Fut>(mut read: F) -> redis::RedisResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    let mut tries = 0;
    loop {
        match read().await {
            Err(err) if tries < 2 && (err.is_connection_dropped() || err.is_io_error()) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            result => return result,
        }
    }
}

/// A Redis hash, read whole.
type Fields = HashMap<String, String>;

impl JobStore {
    /// A store on `redis` that tells `live` what each write stored.
    pub fn new(
        redis: RedisConnection,
        live: Live,
        keys: RedisKeys,
        retention: Duration,
        submission_ttl: Duration,
    ) -> Self {
        Self {
            redis,
            live,
            keys,
            retention,
            submission_ttl,
        }
    }

    fn conn(&self) -> RedisConnection {
        self.redis.clone()
    }

    /// Tells the watchers of `job_id` what a write stored (best effort).
    async fn notify(&self, job_id: &JobId, written: Written) {
        self.live.wrote(job_id, written).await;
    }

    /// Runs `pipe`, which invokes `scripts`. A Redis that lost its script
    /// cache (a restart) answers `NOSCRIPT`: the scripts are loaded and the
    /// pipeline run again, so its other commands must bear running twice.
    pub(super) async fn query_invoking<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
        scripts: &[&redis::Script],
    ) -> redis::RedisResult<T> {
        match pipe.query_async(&mut self.conn()).await {
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                for script in scripts {
                    script.load_async(&mut self.conn()).await?;
                }
                pipe.query_async(&mut self.conn()).await
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn durations_go_to_redis_in_whole_units_that_never_wrap_or_vanish() {
        assert_eq!(micros(Duration::from_nanos(1_500_999)), 1_500);
        assert_eq!(micros(Duration::MAX), u64::MAX, "saturates");
        assert_eq!(millis(Duration::from_micros(2_999)), 2);
        assert_eq!(millis(Duration::MAX), u64::MAX, "saturates");
        // `PX 0` is an error and `PEXPIRE 0` deletes the key at once: a
        // TTL or a retention under a millisecond is one.
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(999)), 1);
    }

    fn dropped() -> redis::RedisError {
        std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset").into()
    }

    /// Runs `read_with_retry` on answers given in turn (the last one
    /// repeats), returning what it returned and how many reads it made.
    async fn read_through(
        answers: &[fn() -> redis::RedisResult<u32>],
    ) -> (redis::RedisResult<u32>, u32) {
        let reads = AtomicU32::new(0);
        let result = read_with_retry(|| {
            let n = reads.fetch_add(1, Ordering::SeqCst) as usize;
            let answer = answers[n.min(answers.len() - 1)];
            async move { answer() }
        })
        .await;
        (result, reads.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_is_retried_twice_after_a_dropped_connection_and_no_more() {
        let (result, reads) = read_through(&[|| Err(dropped()), || Ok(7)]).await;
        assert_eq!((result.ok(), reads), (Some(7), 2), "the reconnected read");
        let (result, reads) = read_through(&[|| Err(dropped())]).await;
        assert!(result.unwrap_err().is_connection_dropped());
        assert_eq!(reads, 3, "Redis still down: the error after three reads");
        let (result, reads) = read_through(&[|| Ok(1)]).await;
        assert_eq!((result.ok(), reads), (Some(1), 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_redis_refused_is_not_retried() {
        let (result, reads) =
            read_through(&[|| Err((redis::ErrorKind::UnexpectedReturnType, "not a hash").into())])
                .await;
        assert_eq!(reads, 1);
        assert_eq!(
            result.unwrap_err().kind(),
            redis::ErrorKind::UnexpectedReturnType
        );
    }

    #[test]
    fn errors_name_the_job_or_key_and_what_went_wrong() {
        let job_id = JobId::new("acme", 1, 2);
        let corrupt = Error::Corrupt {
            job_id: job_id.clone(),
            detail: "status".into(),
        };
        assert_eq!(
            corrupt.to_string(),
            format!("corrupt record for job {job_id}: status")
        );
        assert_eq!(
            Error::LeaseLost(job_id.clone()).to_string(),
            format!("lease lost for job {job_id}")
        );
        assert_eq!(
            Error::ResultMismatch(job_id.clone()).to_string(),
            format!("a reply's result for job {job_id} is not the stored one")
        );
        // The key, never the job it was first used for.
        let conflict = Error::IdempotencyConflict("key-1".into()).to_string();
        assert_eq!(
            conflict,
            "idempotency key \"key-1\" was used for a different request"
        );
        // The Redis error is the source, not part of the message.
        let redis = Error::from(dropped());
        assert_eq!(redis.to_string(), "redis unavailable");
        assert!(std::error::Error::source(&redis).is_some());
        // A refusal by the ACL says so: no retry mends it.
        let refused = redis::parse_redis_value(b"-NOPERM No permissions to access a key\r\n")
            .and_then(redis::Value::extract_error)
            .expect_err("an error reply");
        let refused = Error::from(refused).to_string();
        assert!(refused.contains("ACL (NOPERM)"), "{refused}");
    }
}
