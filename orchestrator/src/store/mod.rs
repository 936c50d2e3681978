//! The job store in Redis: job records, conversation items, event logs,
//! submission idempotency and the fenced lease of the runner of each job.
//!
//! Layout (names in `toolfleet_proto::names::RedisKeys`), one hash tag per job:
//! - `tf:{<job>}:job`: a hash: `spec` (JSON), `status`, `rounds`, `epoch`,
//!   `turns`, `events` (count), `output_text`, `error_code`, `error_message`,
//!   `created_at_ms`, `finished_at_ms`, `cancel_requested`;
//! - `tf:{<job>}:items`: a list of conversation items (JSON), appended to;
//! - `tf:{<job>}:events`: a stream whose entry ids are `0-<n>`, so event offset
//!   `k` is id `0-<k+1>` and a watcher can start at any offset;
//! - `tf:{<job>}:attempts`: a hash call id -> the attempt last dispatched;
//! - `tf:{<job>}:lease`: `<owner>:<epoch>` of the runner, with a TTL.
//!
//! Finished jobs expire after the retention.

mod scripts;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolfleet_proto::names::{self, RedisKeys};

use crate::model::Item;

/// A failed store operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Redis is unreachable or refused the command; the operation may be
    /// retried.
    #[error("redis unavailable")]
    Redis(#[from] redis::RedisError),
    /// Another runner took the job over: stop working on it at once.
    #[error("lease lost for job {0}")]
    LeaseLost(String),
    /// Stored data does not parse: a bug or a foreign writer. Fail the job.
    #[error("corrupt record for job {job_id}: {detail}")]
    Corrupt {
        /// The job.
        job_id: String,
        /// What did not parse.
        detail: String,
    },
}

/// Which model runs a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    /// The deterministic scripted model.
    Scripted,
    /// OpenAI Responses API.
    OpenaiResponses,
    /// OpenAI Chat Completions and compatible servers.
    OpenaiChat,
}

impl ProviderKind {
    /// Parses the provider name of the API.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "scripted" => Some(Self::Scripted),
            "openai-responses" => Some(Self::OpenaiResponses),
            "openai-chat" => Some(Self::OpenaiChat),
            _ => None,
        }
    }
}

/// A job as submitted, after defaults were applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The user message.
    pub input: String,
    /// Instructions for the model.
    pub instructions: String,
    /// The provider.
    pub provider: ProviderKind,
    /// The provider's model name.
    pub model: String,
    /// The script, for the scripted provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// Allow-list of tools; empty means every live tool.
    pub tools: Vec<String>,
    /// Most model turns with tool calls.
    pub max_tool_rounds: u32,
    /// Whether one turn's calls run concurrently.
    pub parallel_tool_calls: bool,
    /// Unix epoch ms after which the job fails with `DEADLINE_EXCEEDED`.
    pub deadline_ms: u64,
    /// Client labels.
    pub metadata: BTreeMap<String, String>,
    /// Who submitted it.
    pub tenant: String,
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobStatus {
    /// Waiting for a runner.
    Queued,
    /// A runner works on it.
    Running,
    /// Finished with a final answer.
    Succeeded,
    /// Finished with an error.
    Failed,
    /// Stopped on request.
    Cancelled,
}

impl JobStatus {
    fn parse(text: &str) -> Option<Self> {
        match text {
            "queued" => Some(Self::Queued),
            "running" => Some(Self::Running),
            "succeeded" => Some(Self::Succeeded),
            "failed" => Some(Self::Failed),
            "cancelled" => Some(Self::Cancelled),
            _ => None,
        }
    }

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Whether the job has ended.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// A job's error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    /// Stable UPPER_SNAKE code.
    pub code: String,
    /// Human-readable detail.
    pub message: String,
}

/// A job record (without its items).
#[derive(Debug, Clone)]
pub struct JobRecord {
    /// The job id.
    pub job_id: String,
    /// The spec.
    pub spec: JobSpec,
    /// The status.
    pub status: JobStatus,
    /// Final answer of a succeeded job.
    pub output_text: String,
    /// Error of a failed or cancelled job.
    pub error: Option<JobError>,
    /// Model turns with tool calls so far.
    pub rounds: u32,
    /// Model turns so far (checkpointed: a turn counted here is never played again).
    pub turns: u32,
    /// Unix epoch ms.
    pub created_at_ms: u64,
    /// Unix epoch ms; 0 while running.
    pub finished_at_ms: u64,
    /// A client asked to cancel.
    pub cancel_requested: bool,
}

/// One entry of a job's event log.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Position in the log, from 0.
    pub offset: u64,
    /// `job_queued`, `model_turn`, ...
    pub kind: String,
    /// Details (JSON text).
    pub data: String,
    /// Unix epoch ms.
    pub timestamp_ms: u64,
    /// The job's last event.
    pub is_final: bool,
}

/// An event to append.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// Kind.
    pub kind: &'static str,
    /// Details.
    pub data: Value,
    /// Whether it ends the job.
    pub is_final: bool,
}

impl NewEvent {
    /// A non-final event.
    pub fn new(kind: &'static str, data: Value) -> Self {
        Self {
            kind,
            data,
            is_final: false,
        }
    }
}

/// A runner's hold on a job. Writes made with it fail once another runner
/// took the job over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The job.
    pub job_id: String,
    /// `<owner>:<epoch>`.
    pub token: String,
    /// Incremented by every takeover.
    pub epoch: u64,
}

/// A set of writes committed atomically under a lease.
#[derive(Debug, Default)]
pub struct Commit<'a> {
    /// Conversation items to append.
    pub items: &'a [Item],
    /// Events to append.
    pub events: Vec<NewEvent>,
    /// Job hash fields to set.
    pub fields: Vec<(&'static str, String)>,
    /// Dispatched attempts to record: call id, attempt.
    pub attempts: Vec<(String, u32)>,
    /// The job ended: expire all its keys after the retention.
    pub finished: bool,
}

/// Redis-backed job store.
#[derive(Clone)]
pub struct JobStore {
    redis: ConnectionManager,
    nats: async_nats::Client,
    keys: RedisKeys,
    retention: Duration,
    submission_ttl: Duration,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A new job id: time-ordered, 28 hex digits, safe in subjects and keys.
pub fn new_job_id() -> String {
    format!("{:012x}{:016x}", now_ms(), rand::random::<u64>())
}

impl JobStore {
    /// A store on `redis` that wakes event watchers through `nats`.
    pub fn new(
        redis: ConnectionManager,
        nats: async_nats::Client,
        keys: RedisKeys,
        retention: Duration,
        submission_ttl: Duration,
    ) -> Self {
        Self {
            redis,
            nats,
            keys,
            retention,
            submission_ttl,
        }
    }

    fn conn(&self) -> ConnectionManager {
        self.redis.clone()
    }

    /// Creates a job, or with an idempotency key returns the job an earlier
    /// submission created. Returns the job id and whether it was a duplicate.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`] when Redis is unreachable.
    pub async fn submit(
        &self,
        spec: &JobSpec,
        idempotency_key: Option<&str>,
    ) -> Result<(String, bool), Error> {
        let mut job_id = new_job_id();
        let mut duplicate = false;
        if let Some(key) = idempotency_key {
            let record = self.keys.submission(&spec.tenant, key);
            let set: Option<String> = redis::cmd("SET")
                .arg(&record)
                .arg(&job_id)
                .arg("NX")
                .arg("PX")
                .arg(millis(self.submission_ttl))
                .arg("GET")
                .query_async(&mut self.conn())
                .await?;
            if let Some(existing) = set {
                job_id = existing;
                duplicate = true;
            }
        }
        // Also for a duplicate: if the first submission died between its
        // idempotency record and the job, this creates the job it promised.
        let spec_json = serde_json::to_string(spec).expect("a spec serializes");
        let user = serde_json::to_string(&Item::User {
            text: spec.input.clone(),
        })
        .expect("an item serializes");
        let data = serde_json::json!({"metadata": spec.metadata}).to_string();
        let created: i64 = scripts::CREATE
            .key(self.keys.job(&job_id))
            .key(self.keys.job_items(&job_id))
            .key(self.keys.job_events(&job_id))
            .arg(spec_json)
            .arg(now_ms())
            .arg(user)
            .arg(data)
            .invoke_async(&mut self.conn())
            .await?;
        if created == 1 {
            let _: i64 = redis::cmd("ZADD")
                .arg(self.keys.unfinished_jobs())
                .arg(now_ms())
                .arg(&job_id)
                .query_async(&mut self.conn())
                .await?;
        }
        self.notify(&job_id).await;
        Ok((job_id, duplicate))
    }

    /// The job record, or `None` for an unknown (or expired) job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] when the record does not parse.
    pub async fn get(&self, job_id: &str) -> Result<Option<JobRecord>, Error> {
        let key = self.keys.job(job_id);
        let fields: HashMap<String, String> =
            read_with_retry(|| async { self.conn().hgetall(&key).await }).await?;
        if fields.is_empty() {
            return Ok(None);
        }
        let corrupt = |detail: &str| Error::Corrupt {
            job_id: job_id.to_owned(),
            detail: detail.to_owned(),
        };
        let field = |name: &str| fields.get(name).map(String::as_str).unwrap_or_default();
        let number = |name: &str| field(name).parse::<u64>().unwrap_or_default();
        let spec: JobSpec = serde_json::from_str(field("spec")).map_err(|_| corrupt("spec"))?;
        let status = JobStatus::parse(field("status")).ok_or_else(|| corrupt("status"))?;
        let error = fields.get("error_code").map(|code| JobError {
            code: code.clone(),
            message: field("error_message").to_owned(),
        });
        Ok(Some(JobRecord {
            job_id: job_id.to_owned(),
            spec,
            status,
            output_text: field("output_text").to_owned(),
            error,
            rounds: u32::try_from(number("rounds")).unwrap_or(u32::MAX),
            turns: u32::try_from(number("turns")).unwrap_or(u32::MAX),
            created_at_ms: number("created_at_ms"),
            finished_at_ms: number("finished_at_ms"),
            cancel_requested: field("cancel_requested") == "1",
        }))
    }

    /// Whether a client asked to cancel the job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn cancel_requested(&self, job_id: &str) -> Result<bool, Error> {
        let flag: Option<String> = self
            .conn()
            .hget(self.keys.job(job_id), "cancel_requested")
            .await?;
        Ok(flag.as_deref() == Some("1"))
    }

    /// The conversation items from index `from` on.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] for an item that does not parse.
    pub async fn items(&self, job_id: &str, from: usize) -> Result<Vec<Item>, Error> {
        let start = isize::try_from(from).unwrap_or(isize::MAX);
        let key = self.keys.job_items(job_id);
        let texts: Vec<String> =
            read_with_retry(|| async { self.conn().lrange(&key, start, -1).await }).await?;
        texts
            .iter()
            .map(|t| {
                serde_json::from_str(t).map_err(|e| Error::Corrupt {
                    job_id: job_id.to_owned(),
                    detail: format!("item: {e}"),
                })
            })
            .collect()
    }

    /// The last attempt dispatched for each call of the job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn attempts(&self, job_id: &str) -> Result<HashMap<String, u32>, Error> {
        Ok(self.conn().hgetall(self.keys.job_attempts(job_id)).await?)
    }

    /// The envelope a worker stored for one call attempt.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn call_result(
        &self,
        job_id: &str,
        call_id: &str,
        attempt: u32,
    ) -> Result<Option<String>, Error> {
        Ok(self
            .conn()
            .get(self.keys.call_result(job_id, call_id, attempt))
            .await?)
    }

    /// Events from `offset` on, at most `count`.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn events(
        &self,
        job_id: &str,
        offset: u64,
        count: usize,
    ) -> Result<Vec<Event>, Error> {
        let key = self.keys.job_events(job_id);
        let start = format!("0-{}", offset + 1);
        let reply: redis::streams::StreamRangeReply =
            read_with_retry(|| async { self.conn().xrange_count(&key, &start, "+", count).await })
                .await?;
        Ok(reply.ids.iter().filter_map(parse_event).collect())
    }

    /// Subscribes to the wake-ups sent whenever `job_id` gets new events.
    /// Redis stays the source of truth: a wake-up only says "read again".
    ///
    /// # Errors
    ///
    /// NATS refused the subscription.
    pub async fn subscribe_events(
        &self,
        job_id: &str,
    ) -> Result<async_nats::Subscriber, async_nats::SubscribeError> {
        self.nats.subscribe(names::events_subject(job_id)).await
    }

    /// Wakes the watchers of `job_id`. Best effort: a watcher that misses it
    /// reads Redis on its next poll.
    async fn notify(&self, job_id: &str) {
        let _ = self
            .nats
            .publish(names::events_subject(job_id), bytes::Bytes::new())
            .await;
    }

    /// Cancels a queued job at once, or asks its runner to stop. Returns the
    /// status after the request, `None` for an unknown job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn cancel(&self, job_id: &str) -> Result<Option<JobStatus>, Error> {
        let status: String = scripts::CANCEL
            .key(self.keys.job(job_id))
            .key(self.keys.job_events(job_id))
            .key(self.keys.job_items(job_id))
            .key(self.keys.job_lease(job_id))
            .arg(now_ms())
            .arg(millis(self.retention))
            .arg(serde_json::json!({"code": "CANCELLED"}).to_string())
            .invoke_async(&mut self.conn())
            .await?;
        self.notify(job_id).await;
        let status = JobStatus::parse(&status);
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
    pub async fn record_lost(&self, job_id: &str) -> Result<(), Error> {
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
            tenant: String::new(),
        };
        let _: i64 = scripts::LOST
            .key(self.keys.job(job_id))
            .key(self.keys.job_events(job_id))
            .arg(serde_json::to_string(&placeholder).expect("a spec serializes"))
            .arg(now_ms())
            .arg(millis(self.retention))
            .arg("the job's state was lost from Redis (flushed or failed over without its data)")
            .arg(serde_json::json!({"code": "JOB_STATE_LOST"}).to_string())
            .invoke_async(&mut self.conn())
            .await?;
        self.notify(job_id).await;
        self.forget_unfinished(job_id).await;
        Ok(())
    }

    /// Unfinished jobs submitted before `before_ms` (at most `limit`), oldest
    /// first: the sweeper's candidates.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn unfinished_before(
        &self,
        before_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, Error> {
        Ok(redis::cmd("ZRANGEBYSCORE")
            .arg(self.keys.unfinished_jobs())
            .arg(0)
            .arg(before_ms)
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut self.conn())
            .await?)
    }

    /// Whether a runner holds the job's lease right now.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn lease_held(&self, job_id: &str) -> Result<bool, Error> {
        Ok(self.conn().exists(self.keys.job_lease(job_id)).await?)
    }

    /// Drops a job from the unfinished index. Best effort: a job left there
    /// by a failure is dropped by the sweeper once it sees it finished.
    pub async fn forget_unfinished(&self, job_id: &str) {
        let removed: redis::RedisResult<i64> = redis::cmd("ZREM")
            .arg(self.keys.unfinished_jobs())
            .arg(job_id)
            .query_async(&mut self.conn())
            .await;
        if let Err(err) = removed {
            tracing::debug!(job_id, error = %err, "could not drop a job from the unfinished index");
        }
    }

    /// Takes the job's lease for `owner`. `Ok(None)`: another runner holds it;
    /// `Err(..)`/`Ok(Some)` as usual. A missing or finished job gives `None` too,
    /// with `finished` telling which.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn acquire(
        &self,
        job_id: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<Acquired, Error> {
        let epoch: i64 = scripts::ACQUIRE
            .key(self.keys.job(job_id))
            .key(self.keys.job_lease(job_id))
            .arg(owner)
            .arg(millis(ttl))
            .invoke_async(&mut self.conn())
            .await?;
        Ok(match epoch {
            -2 => Acquired::Missing,
            -1 => Acquired::Finished,
            0 => Acquired::Held,
            epoch => {
                let epoch = u64::try_from(epoch).unwrap_or_default();
                Acquired::Lease(Lease {
                    job_id: job_id.to_owned(),
                    token: format!("{owner}:{epoch}"),
                    epoch,
                })
            }
        })
    }

    /// Extends the lease by `ttl`.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner has the job; [`Error::Redis`].
    pub async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<(), Error> {
        let renewed: i64 = scripts::RENEW
            .key(self.keys.job_lease(&lease.job_id))
            .arg(&lease.token)
            .arg(millis(ttl))
            .invoke_async(&mut self.conn())
            .await?;
        if renewed == 1 {
            Ok(())
        } else {
            Err(Error::LeaseLost(lease.job_id.clone()))
        }
    }

    /// Gives the lease up (shutdown), so another replica can take over at once.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn release(&self, lease: &Lease) -> Result<(), Error> {
        let _: i64 = scripts::RELEASE
            .key(self.keys.job_lease(&lease.job_id))
            .arg(&lease.token)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(())
    }

    /// Writes `commit` atomically, if `lease` still holds.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job; [`Error::Redis`].
    pub async fn commit(&self, lease: &Lease, commit: Commit<'_>) -> Result<(), Error> {
        let job_id = &lease.job_id;
        let mut invocation = scripts::COMMIT.prepare_invoke();
        invocation
            .key(self.keys.job(job_id))
            .key(self.keys.job_items(job_id))
            .key(self.keys.job_events(job_id))
            .key(self.keys.job_lease(job_id))
            .key(self.keys.job_attempts(job_id))
            .arg(&lease.token)
            .arg(now_ms())
            .arg(if commit.finished {
                millis(self.retention)
            } else {
                0
            });
        invocation.arg(commit.items.len());
        for item in commit.items {
            invocation.arg(serde_json::to_string(item).expect("an item serializes"));
        }
        invocation.arg(commit.events.len());
        for event in &commit.events {
            invocation
                .arg(event.kind)
                .arg(event.data.to_string())
                .arg(if event.is_final { "1" } else { "0" });
        }
        invocation.arg(commit.fields.len());
        for (field, value) in &commit.fields {
            invocation.arg(*field).arg(value);
        }
        invocation.arg(commit.attempts.len());
        for (call_id, attempt) in &commit.attempts {
            invocation.arg(call_id).arg(*attempt);
        }
        let result: Result<i64, redis::RedisError> =
            invocation.invoke_async(&mut self.conn()).await;
        match result {
            Ok(_) => {
                if !commit.events.is_empty() {
                    self.notify(job_id).await;
                }
                if commit.finished {
                    self.forget_unfinished(job_id).await;
                }
                Ok(())
            }
            Err(err) if err.to_string().contains("LEASE_LOST") => {
                Err(Error::LeaseLost(job_id.clone()))
            }
            Err(err) => Err(err.into()),
        }
    }
}

/// Result of [`JobStore::acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is ours.
    Lease(Lease),
    /// Another runner holds the job.
    Held,
    /// The job already finished.
    Finished,
    /// The job has a queue message but no record: its state was lost.
    Missing,
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

fn parse_event(entry: &redis::streams::StreamId) -> Option<Event> {
    let seq: u64 = entry.id.strip_prefix("0-")?.parse().ok()?;
    let text = |name: &str| -> Option<String> { entry.get(name) };
    Some(Event {
        offset: seq.checked_sub(1)?,
        kind: text("kind")?,
        data: text("data").unwrap_or_default(),
        timestamp_ms: text("ts").and_then(|t| t.parse().ok()).unwrap_or_default(),
        is_final: text("final").is_some_and(|f| f == "1"),
    })
}
