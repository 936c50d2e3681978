//! The job store in Redis: job records, conversation items, event logs,
//! submission idempotency and the fenced lease of the runner of each job.
//!
//! Layout (names in `toolfleet_proto::names::RedisKeys`), one hash tag per job:
//! - `tf:{<job>}:job`: a hash: `spec` (JSON), `status`, `rounds`, `epoch`,
//!   `turns`, `events` (count), `output_text`, `error_code`, `error_message`,
//!   `created_at_ms`, `finished_at_ms`, `cancel_requested`, `call_secret`
//!   (what its calls' wire ids are made from, [`WireIds`]), `traceparent`
//!   and `tracestate` (its trace, [`JobTrace`]);
//! - `tf:{<job>}:items`: a list of conversation items (JSON), appended to;
//! - `tf:{<job>}:events`: a stream whose entry ids are `0-<n>`, so event offset
//!   `k` is id `0-<k+1>` and a watcher can start at any offset;
//! - `tf:{<job>}:attempts`: a hash wire call id -> the attempt last dispatched,
//!   and `settled:<wire call id>` -> attempts made, once the call's result
//!   is recorded ([`was_settled`]);
//! - `tf:{<job>}:tools`: a hash tool name -> the manifest the model was
//!   offered (a call to it waits for its workers rather than being unknown);
//! - `tf:{<job>}:lease`: `<owner>:<epoch>` of the runner, with a TTL.
//!
//! Finished jobs expire after the retention.
//!
//! The store speaks in verbs of the job's life: taking the lease starts a
//! run ([`JobStore::acquire_and_load`]); [`JobStore::record_turn`],
//! [`JobStore::record_dispatch`], [`JobStore::record_call_results`] and
//! [`JobStore::finish`] are each one Lua commit fenced by the lease. Only
//! this module spells a hash field.

mod scripts;
mod wake_ups;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use redis::AsyncCommands;
use toolfleet_proto::Envelope;
use toolfleet_proto::envelope::excerpt;
use toolfleet_proto::names::{self, RedisKeys};
use toolfleet_service::connect::{RedisConnection, append_ignored};
use tracing::warn;
use wake_ups::Written;
pub use wake_ups::{WakeUps, Woken};

use crate::job::{
    Ending, Item, JobError, JobErrorCode, JobEvent, JobId, JobRecord, JobSpec, JobStatus, JobTrace,
    Lease, ProviderKind, ToolManifest, TurnCheckpoint, WireIds, new_job_id, now_ms,
};

/// A failed store operation.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Redis is unreachable or refused the command; the operation may be
    /// retried.
    #[error("redis unavailable")]
    Redis(#[from] redis::RedisError),
    /// Another runner took the job over: stop working on it at once.
    #[error("lease lost for job {0}")]
    LeaseLost(String),
    /// The idempotency key was used for a different request within its
    /// time to live. Tell the client to use a new key; never name the job.
    #[error("idempotency key {0:?} was used for a different request")]
    IdempotencyConflict(String),
    /// A result that came with a worker's reply is not the one stored for
    /// its call (a forged reply): nothing was written. Read the stored
    /// result instead.
    #[error("a reply's result for job {0} is not the stored one")]
    ResultMismatch(String),
    /// Stored data does not parse: a bug or a foreign writer. Fail the job.
    #[error("corrupt record for job {job_id}: {detail}")]
    Corrupt {
        /// The job.
        job_id: String,
        /// What did not parse.
        detail: String,
    },
}

/// The longest a job may run (`api.max_deadline` cannot exceed it): the
/// job index keeps entries this long plus the retention.
const LONGEST_JOB: Duration = Duration::from_secs(24 * 3600);

/// Where a page of [`JobStore::list`] ended: the last job it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor {
    /// When that job was submitted (Unix ms).
    pub submitted_ms: u64,
    /// Its id.
    pub job_id: String,
}

impl ListCursor {
    /// Whether the entry (`job_id`, submitted at `ms`) comes after the
    /// cursor in newest-first order (ties ordered by id, descending).
    fn is_after(&self, job_id: &str, ms: u64) -> bool {
        ms < self.submitted_ms || (ms == self.submitted_ms && job_id < self.job_id.as_str())
    }

    /// The page token a client sends back: `<ms>.<job id>`.
    pub fn to_token(&self) -> String {
        format!("{}.{}", self.submitted_ms, self.job_id)
    }

    /// A page token read back; `None` when it is not one this server made.
    pub fn from_token(token: &str) -> Option<Self> {
        let (ms, job_id) = token.split_once('.')?;
        let valid_id = JobId::parse(job_id).is_some();
        Some(Self {
            submitted_ms: ms.parse().ok()?,
            job_id: valid_id.then(|| job_id.to_owned())?,
        })
    }
}

/// A submission's idempotency key and the fingerprint of its request: the
/// key answers with the first job only for the same request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idempotency<'a> {
    /// The client's key.
    pub key: &'a str,
    /// A hash of everything the client asked for (hex, no spaces).
    pub fingerprint: &'a str,
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

/// Redis-backed job store.
#[derive(Clone)]
pub struct JobStore {
    redis: RedisConnection,
    nats: async_nats::Client,
    /// The watchers in this process, woken without NATS.
    watchers: std::sync::Arc<wake_ups::LocalWatchers>,
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

impl JobStore {
    /// A store on `redis` that wakes event watchers through `nats`.
    pub fn new(
        redis: RedisConnection,
        nats: async_nats::Client,
        keys: RedisKeys,
        retention: Duration,
        submission_ttl: Duration,
    ) -> Self {
        Self {
            redis,
            nats,
            watchers: std::sync::Arc::default(),
            keys,
            retention,
            submission_ttl,
        }
    }

    fn conn(&self) -> RedisConnection {
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
        idempotency: Option<Idempotency<'_>>,
        trace: Option<&JobTrace>,
    ) -> Result<(String, bool), Error> {
        let mut job_id = new_job_id(&spec.tenant);
        let mut duplicate = false;
        let fresh = idempotency.is_none();
        if let Some(Idempotency { key, fingerprint }) = idempotency {
            let record = self.keys.submission(&spec.tenant, key);
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
            if let Some(existing) = set {
                // Records written before fingerprints hold only a job id.
                let (existing_job, existing_print) = match existing.split_once(' ') {
                    Some((job, print)) => (job.to_owned(), Some(print)),
                    None => (existing.clone(), None),
                };
                if existing_print.is_some_and(|print| print != fingerprint) {
                    return Err(Error::IdempotencyConflict(key.to_owned()));
                }
                job_id = existing_job;
                duplicate = true;
            }
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
        let mut create = scripts::CREATE.prepare_invoke();
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
            .arg(tracestate);
        if fresh && !self.redis.is_cluster() {
            // A new random id cannot exist yet: the job and its index
            // entries go in one round trip, in this order.
            let mut pipe = redis::pipe();
            pipe.invoke_script(&create);
            append_ignored(&mut pipe, &self.index_new_job(spec, &job_id, now, false));
            let (_created,): ((i64, u64, i64),) =
                self.query_invoking(&pipe, &scripts::CREATE).await?;
        } else {
            // On a cluster the job and each index are in slots of their
            // own: the job first, so that no index names a job not yet
            // there (ListJobs would drop it as expired). A duplicate
            // indexes its job again, at its first time: the submission it
            // repeats may have died between the job and its indexes.
            let (_created, created_ms, ended): (i64, u64, i64) =
                create.invoke_async(&mut self.conn()).await?;
            let groups = self.index_new_job(spec, &job_id, created_ms, ended == 1);
            self.conn().run_in_order(groups).await?;
        }
        self.notify(&job_id, Written::counted(None)).await;
        Ok((job_id, duplicate))
    }

    /// Runs `pipe`, which invokes `script`. A Redis that lost its script
    /// cache (a restart) answers `NOSCRIPT`: the script is loaded and the
    /// pipeline run again, so its other commands must bear running twice.
    async fn query_invoking<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
        script: &redis::Script,
    ) -> redis::RedisResult<T> {
        match pipe.query_async(&mut self.conn()).await {
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                script.load_async(&mut self.conn()).await?;
                pipe.query_async(&mut self.conn()).await
            }
            other => other,
        }
    }

    /// The writes that put a job created at `created_ms` into the sets that
    /// find it again, one pipeline per hash slot: the unfinished jobs (the
    /// sweeper's), then its tenant's job index (`ListJobs`) and, under an
    /// active-jobs quota, its tenant's active jobs; an `ended` job only
    /// into its tenant's index. Each may run twice
    /// ([`query_invoking`](Self::query_invoking), a repeated submission).
    fn index_new_job(
        &self,
        spec: &JobSpec,
        job_id: &str,
        created_ms: u64,
        ended: bool,
    ) -> Vec<redis::Pipeline> {
        let now = now_ms();
        let index = self.keys.tenant_jobs(&spec.tenant);
        // The index forgets what has surely expired: jobs live at most
        // their deadline (24h at most) plus the retention.
        let horizon = now.saturating_sub(millis(self.retention + LONGEST_JOB));
        // Plain pipelines, not MULTI: the keys are in different hash slots
        // (Redis Cluster), and each write stands on its own.
        let mut pipe = redis::pipe();
        pipe.cmd("ZADD")
            .arg(&index)
            .arg(created_ms)
            .arg(job_id)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&index)
            .arg("-inf")
            .arg(format!("({horizon}"))
            .ignore();
        if ended {
            return vec![pipe];
        }
        let mut unfinished = redis::pipe();
        unfinished
            .cmd("ZADD")
            .arg(self.keys.unfinished_jobs(job_id))
            .arg(created_ms)
            .arg(job_id)
            .ignore();
        // Counted only under an active-jobs quota, whose check prunes
        // the set: without one, nothing would.
        if spec.limits.max_active_jobs.is_some() {
            pipe.cmd("SADD")
                .arg(self.keys.tenant_active_jobs(&spec.tenant))
                .arg(job_id)
                .ignore();
        }
        vec![unfinished, pipe]
    }

    /// A page of `tenant`'s jobs, newest first: those submitted before
    /// `before` (a cursor from an earlier page; `None` starts at the newest)
    /// that `keep` accepts, at most `limit`, reading at most `scan` index
    /// entries. Returns the jobs and the cursor of the next page, `None` at
    /// the end. Entries whose job has expired are dropped from the index.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn list(
        &self,
        tenant: &str,
        before: Option<ListCursor>,
        limit: usize,
        scan: usize,
        keep: impl Fn(&JobRecord) -> bool,
    ) -> Result<(Vec<JobRecord>, Option<ListCursor>), Error> {
        let index = self.keys.tenant_jobs(tenant);
        let mut jobs = Vec::new();
        let mut cursor = before;
        let mut scanned = 0;
        while jobs.len() < limit && scanned < scan {
            let batch = (scan - scanned).min(100);
            let max = cursor
                .as_ref()
                .map_or_else(|| "+inf".to_owned(), |c| format!("({}", c.submitted_ms + 1));
            // Entries of the cursor's own millisecond are read again and
            // skipped by id below, so jobs submitted in one ms are not lost.
            let entries: Vec<(String, u64)> = read_with_retry(|| async {
                redis::cmd("ZREVRANGEBYSCORE")
                    .arg(&index)
                    .arg(&max)
                    .arg("-inf")
                    .arg("WITHSCORES")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(batch + 64)
                    .query_async(&mut self.conn())
                    .await
            })
            .await?;
            let fresh: Vec<(String, u64)> = entries
                .into_iter()
                .filter(|(id, ms)| cursor.as_ref().is_none_or(|c| c.is_after(id, *ms)))
                .take(batch)
                .collect();
            if fresh.is_empty() {
                return Ok((jobs, None));
            }
            for (job_id, submitted_ms) in fresh {
                scanned += 1;
                cursor = Some(ListCursor {
                    submitted_ms,
                    job_id: job_id.clone(),
                });
                match self.get(&job_id).await? {
                    Some(record) if keep(&record) => {
                        jobs.push(record);
                        if jobs.len() == limit {
                            break;
                        }
                    }
                    Some(_) => {}
                    None => {
                        let _: i64 = self.conn().zrem(&index, &job_id).await?;
                    }
                }
            }
        }
        Ok((jobs, cursor))
    }

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

    /// The job record, or `None` for an unknown (or expired) job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] when the record does not parse.
    pub async fn get(&self, job_id: &str) -> Result<Option<JobRecord>, Error> {
        let key = self.keys.job(job_id);
        let fields: HashMap<String, String> =
            read_with_retry(|| async { self.conn().hgetall(&key).await }).await?;
        parse_record(job_id, &fields)
    }

    /// What a run starts from, read in one round trip: the job record (`None`
    /// for an unknown or expired job), the manifests its model was offered
    /// and its conversation
    /// ([`items`](Self::items)).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] for a record, manifest or item
    /// that does not parse.
    pub async fn load_run(&self, job_id: &str) -> Result<Option<RunStart>, Error> {
        let mut pipe = redis::pipe();
        self.load_run_commands(&mut pipe, job_id);
        let (fields, offered, items): (Fields, Fields, Vec<String>) =
            read_with_retry(|| async { pipe.query_async(&mut self.conn()).await }).await?;
        parse_run_start(job_id, &fields, &offered, &items)
    }

    /// The reads of [`load_run`](Self::load_run): the job, its offered
    /// tools, its items.
    fn load_run_commands(&self, pipe: &mut redis::Pipeline, job_id: &str) {
        pipe.hgetall(self.keys.job(job_id))
            .hgetall(self.keys.job_tools(job_id))
            .lrange(self.keys.job_items(job_id), 0, -1);
    }
}

/// A Redis hash, read whole.
type Fields = HashMap<String, String>;

/// What [`JobStore::load_run`] read, parsed; `None` for a job with no record.
fn parse_run_start(
    job_id: &str,
    fields: &Fields,
    offered: &Fields,
    items: &[String],
) -> Result<Option<RunStart>, Error> {
    let Some(record) = parse_record(job_id, fields)? else {
        return Ok(None);
    };
    Ok(Some(RunStart {
        record,
        offered: parse_manifests(job_id, offered)?,
        items: parse_items(job_id, items)?,
    }))
}

/// What a watch starts from ([`JobStore::watch_start`]).
#[derive(Debug)]
pub struct WatchStart {
    /// Who submitted the job: only they may watch it.
    pub tenant: String,
    /// The job's trace, when it is traced.
    pub trace: Option<JobTrace>,
    /// The first events from the watch's offset on.
    pub events: Vec<Event>,
}

/// What a run starts from ([`JobStore::load_run`]).
#[derive(Debug)]
pub struct RunStart {
    /// The job record.
    pub record: JobRecord,
    /// The manifests the job's model was offered so far.
    pub offered: Vec<ToolManifest>,
    /// The conversation.
    pub items: Vec<Item>,
}

/// A job record from its hash's `fields`; `None` when there are none.
fn parse_record(
    job_id: &str,
    fields: &HashMap<String, String>,
) -> Result<Option<JobRecord>, Error> {
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
    let status: JobStatus = field("status").parse().map_err(|_| corrupt("status"))?;
    let error = match fields.get("error_code") {
        Some(code) => Some(JobError {
            code: code.parse().map_err(|_| corrupt("error_code"))?,
            message: field("error_message").to_owned(),
        }),
        None => None,
    };
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
        wire_ids: WireIds::from_secret(field("call_secret")),
        trace: JobTrace::from_fields(field("traceparent"), field("tracestate")),
    }))
}

/// Offered manifests from the job's tools hash.
fn parse_manifests(
    job_id: &str,
    stored: &HashMap<String, String>,
) -> Result<Vec<ToolManifest>, Error> {
    stored
        .values()
        .map(|text| {
            serde_json::from_str(text).map_err(|e| Error::Corrupt {
                job_id: job_id.to_owned(),
                detail: format!("offered tool: {e}"),
            })
        })
        .collect()
}

/// Conversation items from their stored JSON texts.
fn parse_items(job_id: &str, texts: &[String]) -> Result<Vec<Item>, Error> {
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

impl JobStore {
    /// The job's status alone, or `None` for an unknown (or expired) job:
    /// what a watcher needs, without reading and parsing the whole record.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] for a status that does not
    /// parse.
    pub async fn status(&self, job_id: &str) -> Result<Option<JobStatus>, Error> {
        let key = self.keys.job(job_id);
        let status: Option<String> =
            read_with_retry(|| async { self.conn().hget(&key, "status").await }).await?;
        status
            .map(|status| {
                status.parse().map_err(|_| Error::Corrupt {
                    job_id: job_id.to_owned(),
                    detail: "status".to_owned(),
                })
            })
            .transpose()
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
        parse_items(job_id, &texts)
    }

    /// The last attempt dispatched for each call of the job.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn attempts(&self, job_id: &str) -> Result<HashMap<String, u32>, Error> {
        Ok(self.conn().hgetall(self.keys.job_attempts(job_id)).await?)
    }

    /// The envelope a worker stored for one attempt of a call to `tool`.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn call_result(
        &self,
        job_id: &str,
        tool: &str,
        call_id: &str,
        attempt: u32,
    ) -> Result<Option<String>, Error> {
        Ok(self
            .conn()
            .get(self.keys.call_result(job_id, tool, call_id, attempt))
            .await?)
    }

    /// What a watch of `job_id` from `offset` starts from, read in one
    /// round trip: who owns the job, its trace, and its first `count`
    /// events from `offset` on. `None` for an unknown or expired job. Reads
    /// of the job's spec only its tenant: the rest is not a watch's.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`], or [`Error::Corrupt`] for a spec without a tenant.
    pub async fn watch_start(
        &self,
        job_id: &str,
        offset: u64,
        count: usize,
    ) -> Result<Option<WatchStart>, Error> {
        /// The one field of a spec a watch needs; serde skips the others.
        #[derive(serde::Deserialize)]
        struct Owner {
            tenant: String,
        }
        let mut pipe = redis::pipe();
        pipe.hmget(
            self.keys.job(job_id),
            &["spec", "traceparent", "tracestate"],
        )
        .xrange_count(
            self.keys.job_events(job_id),
            events_start(offset),
            "+",
            count,
        );
        /// The spec, `traceparent` and `tracestate` fields of the job.
        type JobFields = (Option<String>, Option<String>, Option<String>);
        let ((spec, traceparent, tracestate), events): (
            JobFields,
            redis::streams::StreamRangeReply,
        ) = read_with_retry(|| async { pipe.query_async(&mut self.conn()).await }).await?;
        let Some(spec) = spec else {
            return Ok(None);
        };
        let owner: Owner = serde_json::from_str(&spec).map_err(|_| Error::Corrupt {
            job_id: job_id.to_owned(),
            detail: "spec".to_owned(),
        })?;
        Ok(Some(WatchStart {
            tenant: owner.tenant,
            trace: JobTrace::from_fields(
                traceparent.as_deref().unwrap_or_default(),
                tracestate.as_deref().unwrap_or_default(),
            ),
            events: events.ids.iter().filter_map(parse_event).collect(),
        }))
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
        let start = events_start(offset);
        let reply: redis::streams::StreamRangeReply =
            read_with_retry(|| async { self.conn().xrange_count(&key, &start, "+", count).await })
                .await?;
        Ok(reply.ids.iter().filter_map(parse_event).collect())
    }

    /// The last event of `job_id`'s log, if it has any: for a finished job,
    /// its final event.
    ///
    /// # Errors
    ///
    /// Redis is unreachable.
    pub async fn last_event(&self, job_id: &str) -> Result<Option<Event>, Error> {
        let key = self.keys.job_events(job_id);
        let reply: redis::streams::StreamRangeReply =
            read_with_retry(|| async { self.conn().xrevrange_count(&key, "+", "-", 1).await })
                .await?;
        Ok(reply.ids.iter().find_map(parse_event))
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
    ) -> Result<WakeUps, async_nats::SubscribeError> {
        WakeUps::subscribe(&self.nats, self.watchers.clone(), job_id).await
    }

    /// Wakes the watchers of `job_id`, in this process and, through NATS,
    /// in every other. Best effort: a watcher that misses it reads Redis on
    /// its next poll. `written.events`, when known, is how many events the
    /// job has now: a watcher that has read that many skips the read.
    async fn notify(&self, job_id: &str, written: Written) {
        let events = written.events;
        self.watchers.wake(job_id, written);
        let payload = events.map_or_else(bytes::Bytes::new, |n| n.to_string().into());
        let _ = self
            .nats
            .publish(names::events_subject(job_id), payload)
            .await;
    }

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

    /// Unfinished jobs submitted before `before_ms` (at most `limit`), oldest
    /// first: the sweeper's candidates, from every shard of the index.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn unfinished_before(
        &self,
        before_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, Error> {
        let mut oldest: Vec<(String, u64)> = Vec::new();
        // One shard at a time: a sweep runs every 30 s, and each shard may
        // live on another node of a cluster.
        for shard in self.keys.unfinished_shards() {
            let found: Vec<(String, u64)> = redis::cmd("ZRANGEBYSCORE")
                .arg(shard)
                .arg(0)
                .arg(before_ms)
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(0)
                .arg(limit)
                .query_async(&mut self.conn())
                .await?;
            oldest.extend(found);
        }
        oldest.sort_by_key(|(_, submitted)| *submitted);
        oldest.truncate(limit);
        Ok(oldest.into_iter().map(|(job_id, _)| job_id).collect())
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
            .arg(self.keys.unfinished_jobs(job_id))
            .arg(job_id)
            .query_async(&mut self.conn())
            .await;
        if let Err(err) = removed {
            tracing::debug!(job_id, error = %err, "could not drop a job from the unfinished index");
        }
    }

    /// Takes the job's lease for `owner` for `ttl`, with the next epoch (see
    /// [`Acquired`] for a lease held elsewhere, a job that already ended and
    /// one whose state is gone), and starts the run: the job is running, with
    /// its `job_started` event (`job_resumed` when it ran before, as
    /// [`Lease::resumed`] says). With the lease comes what the run starts
    /// from ([`load_run`](Self::load_run)), all in one round trip: the reads
    /// follow the lease in one pipeline, so they see the job as its new
    /// holder does. The start is `None` without a lease, and when the job's
    /// state does not parse (the run's own read then says why).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn acquire_and_load(
        &self,
        job_id: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<(Acquired, Option<RunStart>), Error> {
        let start = StartEvent::new(owner);
        let now = now_ms();
        let mut acquisition = scripts::ACQUIRE.prepare_invoke();
        acquisition
            .key(self.keys.job(job_id))
            .key(self.keys.job_lease(job_id))
            .key(self.keys.job_events(job_id))
            .arg(owner)
            .arg(millis(ttl))
            .arg(now)
            .arg(start.started)
            .arg(start.resumed)
            .arg(&start.before_epoch)
            .arg(&start.after_epoch);
        let mut pipe = redis::pipe();
        pipe.invoke_script(&acquisition);
        self.load_run_commands(&mut pipe, job_id);
        let ((epoch, events, resumed), fields, offered, items): (
            (i64, u64, u8),
            Fields,
            Fields,
            Vec<String>,
        ) = self.query_invoking(&pipe, &scripts::ACQUIRE).await?;
        let acquired = acquired(job_id, owner, epoch, resumed == 1);
        let start = match &acquired {
            Acquired::Lease(lease) => {
                let stored = start.stored(lease, events, now);
                self.notify(job_id, stored).await;
                parse_run_start(job_id, &fields, &offered, &items)
                    .ok()
                    .flatten()
            }
            _ => None,
        };
        Ok((acquired, start))
    }
}

/// The event that starts a run, as the lease script writes it: its kind
/// for a first run and for a resumed one, and its data (the same for both)
/// around the epoch, which only the script knows.
struct StartEvent {
    started: &'static str,
    resumed: &'static str,
    before_epoch: String,
    after_epoch: String,
}

impl StartEvent {
    fn new(owner: &str) -> Self {
        // The data of an event with an epoch no lease reaches, cut where that
        // epoch is: its first digits in the text, since `epoch` is the data's
        // first field (serde_json orders fields by name).
        const PLACEHOLDER: u64 = u64::MAX;
        let started = JobEvent::run_started(PLACEHOLDER, owner.to_owned(), false);
        let data = started.data_json();
        let (before_epoch, after_epoch) = data
            .split_once(&PLACEHOLDER.to_string())
            .expect("the event's data holds its epoch");
        Self {
            started: started.kind(),
            resumed: JobEvent::run_started(PLACEHOLDER, String::new(), true).kind(),
            before_epoch: before_epoch.to_owned(),
            after_epoch: after_epoch.to_owned(),
        }
    }

    /// What the lease script wrote for `lease`, with the job's event count
    /// after it (`events`) and its time (`now`), as its watchers get it.
    fn stored(&self, lease: &Lease, events: u64, now: u64) -> Written {
        let event = Event {
            offset: 0,
            kind: (if lease.resumed {
                self.resumed
            } else {
                self.started
            })
            .to_owned(),
            data: format!("{}{}{}", self.before_epoch, lease.epoch, self.after_epoch),
            timestamp_ms: now,
            is_final: false,
        };
        Written::numbered(vec![event], Some(events))
    }
}

/// What the lease script of [`JobStore::acquire_and_load`] answered, as an
/// [`Acquired`].
fn acquired(job_id: &str, owner: &str, epoch: i64, resumed: bool) -> Acquired {
    match epoch {
        -2 => Acquired::Missing,
        -1 => Acquired::Finished,
        0 => Acquired::Held,
        epoch => {
            let epoch = u64::try_from(epoch).unwrap_or_default();
            Acquired::Lease(Lease {
                job_id: job_id.to_owned(),
                token: format!("{owner}:{epoch}"),
                epoch,
                resumed,
            })
        }
    }
}

impl JobStore {
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

    /// Checkpoints a model turn: the results before it, its items, its
    /// `model_turn` event and the job's counters, and the first attempt of
    /// each of its calls about to be published (`dispatched`, as
    /// [`record_dispatch`](Self::record_dispatch) records one), in one
    /// commit. Once it lands the turn is never played again.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job; [`Error::Redis`].
    pub async fn record_turn(
        &self,
        lease: &Lease,
        turn: TurnCheckpoint<'_>,
        dispatched: &[DispatchedCall<'_>],
    ) -> Result<(), Error> {
        let mut commit = Commit::of_turn(turn);
        commit.dispatched(dispatched, 1);
        self.commit(lease, commit).await
    }

    /// Keeps `manifest` in the tool catalog (the newest one a worker
    /// announced), for when no worker of the tool is live.
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn remember_tool(&self, manifest: &ToolManifest) -> Result<(), Error> {
        // A manifest is plain data; serializing it cannot fail.
        let text = serde_json::to_string(manifest).expect("a manifest serializes");
        let () = self
            .conn()
            .hset(self.keys.tool_catalog(), &manifest.name, text)
            .await?;
        Ok(())
    }

    /// Every manifest of the tool catalog that parses and passes
    /// [`ToolManifest::check`] (one that does not is logged and left out: the
    /// catalog is only a cache of announcements).
    ///
    /// # Errors
    ///
    /// [`Error::Redis`].
    pub async fn tool_catalog(&self) -> Result<Vec<ToolManifest>, Error> {
        let key = self.keys.tool_catalog();
        let stored: HashMap<String, String> =
            read_with_retry(|| async { self.conn().hgetall(&key).await }).await?;
        Ok(stored
            .into_iter()
            .filter_map(|(tool, text)| {
                let checked = serde_json::from_str::<ToolManifest>(&text)
                    .map_err(|err| err.to_string())
                    .and_then(|manifest| manifest.check(&tool).map(|()| manifest));
                checked
                    .inspect_err(|why| {
                        warn!(tool = excerpt(&tool, 64), error = %why, "ignoring a catalog entry");
                    })
                    .ok()
            })
            .collect())
    }

    /// Records that `attempt` of each call is about to be published: a
    /// `tool_call_dispatched` event each, and the attempt a resumed runner
    /// looks up first.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job; [`Error::Redis`].
    pub async fn record_dispatch(
        &self,
        lease: &Lease,
        calls: &[DispatchedCall<'_>],
        attempt: u32,
    ) -> Result<(), Error> {
        if calls.is_empty() {
            return Ok(());
        }
        let mut commit = Commit::default();
        commit.dispatched(calls, attempt);
        self.commit(lease, commit).await
    }

    /// Records calls' final envelopes, one `tool_call_result` event each in
    /// the order given, in one commit (the result items themselves join the
    /// conversation with the round's others in the next commit of the run,
    /// [`record_turn`](Self::record_turn) or [`finish`](Self::finish)).
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job; [`Error::Redis`].
    pub async fn record_call_results(
        &self,
        lease: &Lease,
        settled: &[SettledCall<'_>],
    ) -> Result<(), Error> {
        let events = settled
            .iter()
            .map(|settled| JobEvent::ToolCallResult {
                attempts: settled.attempts,
                call_id: settled.call_id.to_owned(),
                code: settled.envelope.error().map(|e| e.code.to_string()),
                name: settled.name.to_owned(),
                ok: settled.envelope.is_ok(),
                round_trip_us: settled.round_trip.map(micros),
                worked_us: settled.worked.map(micros),
            })
            .collect();
        let attempts = settled
            .iter()
            .map(|settled| (settled_field(settled.wire_id), settled.attempts))
            .collect();
        let job_id = &lease.job_id;
        let checks = settled
            .iter()
            .filter_map(|settled| {
                let text = settled.unchecked?;
                let key =
                    self.keys
                        .call_result(job_id, settled.name, settled.wire_id, settled.attempts);
                Some((key, text))
            })
            .collect();
        self.commit(
            lease,
            Commit {
                events,
                attempts,
                checks,
                ..Commit::default()
            },
        )
        .await
    }

    /// Ends the job: its final status, answer or error, final event, and the
    /// expiry of all its keys after the retention, with what the run had not
    /// stored yet (`unstored`) before them, in one commit. Nothing is written
    /// after.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when another runner took the job (or it had
    /// already ended); [`Error::Redis`].
    pub async fn finish(
        &self,
        lease: &Lease,
        ending: &Ending,
        unstored: Unstored<'_>,
    ) -> Result<(), Error> {
        let mut commit = match unstored {
            Unstored::Nothing => Commit::default(),
            Unstored::Results(results) => Commit {
                results,
                ..Commit::default()
            },
            Unstored::Turn(turn) => Commit::of_turn(turn),
        };
        commit.events.push(ending.event());
        commit.status = Some(ending.status());
        commit.ending = Some(ending);
        self.commit(lease, commit).await
    }

    /// Writes `commit` atomically, if `lease` still holds and the job has not
    /// ended.
    async fn commit(&self, lease: &Lease, commit: Commit<'_>) -> Result<(), Error> {
        let job_id = &lease.job_id;
        let finished = commit.ending.is_some();
        let fields = commit.fields();
        let now = now_ms();
        // The events as the script stores them, and as this process's
        // watchers get them; their offsets are known once it answers.
        let events: Vec<Event> = commit
            .events
            .iter()
            .map(|event| Event {
                offset: 0,
                kind: event.kind().to_owned(),
                data: event.data_json(),
                timestamp_ms: now,
                is_final: event.is_final(),
            })
            .collect();
        let mut invocation = scripts::COMMIT.prepare_invoke();
        invocation
            .key(self.keys.job(job_id))
            .key(self.keys.job_items(job_id))
            .key(self.keys.job_events(job_id))
            .key(self.keys.job_lease(job_id))
            .key(self.keys.job_attempts(job_id))
            .key(self.keys.job_tools(job_id))
            .arg(&lease.token)
            .arg(now)
            .arg(if finished { millis(self.retention) } else { 0 });
        invocation.arg(commit.checks.len());
        for (key, text) in &commit.checks {
            invocation.arg(key).arg(*text);
        }
        invocation.arg(commit.results.len() + commit.items.len());
        for item in commit.results.iter().chain(commit.items) {
            invocation.arg(item.stored_json());
        }
        invocation.arg(events.len());
        for event in &events {
            invocation
                .arg(&event.kind)
                .arg(&event.data)
                .arg(if event.is_final { "1" } else { "0" });
        }
        invocation.arg(fields.len());
        for (field, value) in &fields {
            invocation.arg(*field).arg(value);
        }
        invocation.arg(commit.attempts.len());
        for (call_id, attempt) in &commit.attempts {
            invocation.arg(call_id).arg(*attempt);
        }
        invocation.arg(commit.offers.len());
        for manifest in commit.offers {
            let json = serde_json::to_string(manifest).expect("a manifest serializes");
            invocation.arg(&manifest.name).arg(json);
        }
        let answer: i64 = invocation.invoke_async(&mut self.conn()).await?;
        if answer == scripts::LEASE_LOST {
            return Err(Error::LeaseLost(job_id.clone()));
        }
        if answer == scripts::RESULT_MISMATCH {
            return Err(Error::ResultMismatch(job_id.clone()));
        }
        if !events.is_empty() {
            self.notify(
                job_id,
                Written::numbered(events, u64::try_from(answer).ok()),
            )
            .await;
        }
        if finished {
            self.forget_unfinished(job_id).await;
        }
        Ok(())
    }
}

/// A call with its final envelope, for [`JobStore::record_call_results`].
#[derive(Debug, Clone, Copy)]
pub struct SettledCall<'a> {
    /// The id the job's events show the call by.
    pub call_id: &'a str,
    /// The id its attempts are recorded under.
    pub wire_id: &'a str,
    /// The tool name.
    pub name: &'a str,
    /// Attempts made (0: answered by the orchestrator's own checks).
    pub attempts: u32,
    /// Publish to result of the last attempt, as the runner saw it.
    pub round_trip: Option<Duration>,
    /// How long the worker worked on the last attempt, by its own clock.
    pub worked: Option<Duration>,
    /// The final envelope.
    pub envelope: &'a Envelope,
    /// The stored result's text as the worker's reply carried it, when it
    /// was not read from Redis: the commit checks it against what Redis
    /// holds and writes nothing if it differs ([`Error::ResultMismatch`]).
    pub unchecked: Option<&'a str>,
}

/// Whether the result of call `wire_id` was recorded
/// ([`JobStore::record_call_results`]), by the [`JobStore::attempts`] of its
/// job: a resumed round answers it again from the stored envelope, but
/// records neither its event nor its spans a second time.
pub fn was_settled(attempts: &HashMap<String, u32>, wire_id: &str) -> bool {
    attempts.contains_key(&settled_field(wire_id))
}

/// The attempts-hash field that marks a call settled. A wire id never holds
/// a colon ([`is_valid_wire_id`](toolfleet_proto::call::is_valid_wire_id)),
/// so no call's own field can be mistaken for it.
fn settled_field(wire_id: &str) -> String {
    format!("settled:{wire_id}")
}

/// What a run did but has not stored when it ends the job: stored by
/// [`JobStore::finish`] in the commit that ends it.
#[derive(Debug, Clone, Copy)]
pub enum Unstored<'a> {
    /// Everything is stored.
    Nothing,
    /// The results of the run's last round (no turn followed them).
    Results(&'a [Item]),
    /// The turn that ended the job, with the results before it.
    Turn(TurnCheckpoint<'a>),
}

/// A call about to be published, for [`JobStore::record_dispatch`].
#[derive(Debug, Clone, Copy)]
pub struct DispatchedCall<'a> {
    /// The id the job's events show the call by.
    pub event_id: &'a str,
    /// The id its attempts are recorded under.
    pub wire_id: &'a str,
    /// The tool.
    pub name: &'a str,
}

/// The writes of one verb, committed atomically under a lease. Private: a
/// caller says what happened, and only [`Commit::fields`] names hash fields.
#[derive(Debug, Default)]
struct Commit<'a> {
    /// Results of a round, appended to the conversation before `items`.
    results: &'a [Item],
    items: &'a [Item],
    events: Vec<JobEvent>,
    status: Option<JobStatus>,
    /// Turns and rounds after a checkpointed turn.
    counters: Option<(u32, u32)>,
    /// The job ended: its outcome is stored and every key expires.
    ending: Option<&'a Ending>,
    /// Dispatched attempts: call id, attempt.
    attempts: Vec<(String, u32)>,
    /// Tool manifests offered to the model, to remember.
    offers: &'a [ToolManifest],
    /// Stored results (key, text) that must be in Redis as given, or the
    /// commit writes nothing.
    checks: Vec<(String, &'a str)>,
}

impl<'a> Commit<'a> {
    /// A checkpointed turn: the results before it, its items, its
    /// `model_turn` event, the job's counters and the tools it offered.
    fn of_turn(turn: TurnCheckpoint<'a>) -> Self {
        Commit {
            results: turn.results,
            items: turn.items,
            events: vec![turn.event()],
            counters: Some((turn.turns, turn.rounds)),
            offers: turn.offered,
            ..Commit::default()
        }
    }

    /// Records that `attempt` of each of `calls` is about to be published.
    fn dispatched(&mut self, calls: &[DispatchedCall<'_>], attempt: u32) {
        for call in calls {
            self.events.push(JobEvent::ToolCallDispatched {
                attempt,
                call_id: call.event_id.to_owned(),
                name: call.name.to_owned(),
            });
            self.attempts.push((call.wire_id.to_owned(), attempt));
        }
    }

    /// The job hash fields this commit sets.
    fn fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = Vec::new();
        if let Some(status) = self.status {
            fields.push(("status", status.as_str().to_owned()));
        }
        if let Some((turns, rounds)) = self.counters {
            fields.push(("turns", turns.to_string()));
            fields.push(("rounds", rounds.to_string()));
        }
        match self.ending {
            Some(Ending::Succeeded(text)) => fields.push(("output_text", text.clone())),
            Some(Ending::Failed(error)) => {
                fields.push(("error_code", error.code.as_str().to_owned()));
                fields.push(("error_message", error.message.clone()));
            }
            Some(Ending::Cancelled) => {
                fields.push(("error_code", JobErrorCode::Cancelled.as_str().to_owned()));
                fields.push(("error_message", "the job was cancelled".to_owned()));
            }
            None => {}
        }
        if self.ending.is_some() {
            fields.push(("finished_at_ms", now_ms().to_string()));
        }
        fields
    }
}

/// Result of [`JobStore::acquire_and_load`].
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

/// The stream id of event `offset`, the first an `XRANGE` from it reads.
/// Saturating: `from_offset = u64::MAX` reads nothing, never wraps to 0.
fn events_start(offset: u64) -> String {
    format!("0-{}", offset.saturating_add(1))
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
