//! A fleet for tests: the fleet crate's [`ProcessFleet`] (servers,
//! orchestrator and worker processes) started from a [`FleetBuilder`], plus
//! the client-side helpers to publish calls and read their results.

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream;
use futures::StreamExt;
use toolfleet_proto::envelope::StoredResult;
use toolfleet_proto::job::JobId;
use toolfleet_proto::names::{self, RedisKeys};
use toolfleet_proto::{Envelope, ToolCall};

use toolfleet_proto::v1;

pub use toolfleet_fleet::processes::{ApiClient, ProcessFleet};
pub use toolfleet_fleet::servers::{Nats, Redis, RedisClusterShape};
pub use toolfleet_fleet::{FleetBuilder, Serving};

/// What the services of a test log: debug lines of their own crates too,
/// which the tests wait for.
const SERVICE_LOG: &str = "info,toolfleet_orchestrator=debug,toolfleet_worker=debug";

/// A test's fleet: `workers` workers with the test tools and no
/// orchestrator (each test starts its own, configured as it needs), the
/// services logging at debug level. Add to it with the builder's setters.
pub fn test_fleet(workers: usize) -> FleetBuilder {
    FleetBuilder::new()
        .workers(workers)
        .orchestrators(0)
        .serving(Serving::TestTools)
        .env(&[("RUST_LOG", SERVICE_LOG)])
}

/// `builder` on clusters: a NATS cluster of 3 nodes where every service
/// keeps 3 copies of each stream, and a Redis Cluster of 3 primaries with
/// `replicas` replicas each; as docs/deploy.md asks of a cluster, a write
/// counts once a replica holds it too (`redis.wait_replicas = 1`).
pub fn on_clusters(builder: FleetBuilder, replicas: usize) -> FleetBuilder {
    builder
        .nats_cluster(Some(3))
        .redis_cluster(Some(RedisClusterShape {
            primaries: 3,
            replicas,
        }))
        .env(&[("TOOLFLEET_REDIS__WAIT_REPLICAS", "1")])
}

/// A fleet of processes ([`ProcessFleet`], which it derefs to) with a NATS
/// client of the test's, and helpers to publish calls and read their
/// results.
pub struct Fleet {
    fleet: ProcessFleet,
    /// A client connected to the fleet's NATS.
    pub client: async_nats::Client,
}

impl std::ops::Deref for Fleet {
    type Target = ProcessFleet;

    fn deref(&self) -> &ProcessFleet {
        &self.fleet
    }
}

impl std::ops::DerefMut for Fleet {
    fn deref_mut(&mut self) -> &mut ProcessFleet {
        &mut self.fleet
    }
}

impl Fleet {
    /// Starts the fleet `builder` describes ([`test_fleet`]), and connects
    /// to its NATS.
    ///
    /// # Errors
    ///
    /// A server or service did not start; the error names which.
    pub async fn start(builder: FleetBuilder) -> anyhow::Result<Self> {
        let fleet = builder.start_processes().await?;
        let client = fleet.nats.client().await?;
        Ok(Self { fleet, client })
    }

    /// Starts the fleet `builder` describes on a NATS the test configured
    /// itself (authentication, TLS, permissions; [`FleetBuilder::on_nats`]):
    /// `client` is the test's own connection to it.
    ///
    /// # Errors
    ///
    /// A server or service did not start; the error names which.
    pub async fn start_as(
        builder: FleetBuilder,
        client: async_nats::Client,
    ) -> anyhow::Result<Self> {
        let fleet = builder.start_processes().await?;
        Ok(Self { fleet, client })
    }

    /// Publishes `call` to its tool's subject through JetStream, with the
    /// attempt's `Nats-Msg-Id` (so the stream dedups a re-publish).
    ///
    /// # Errors
    ///
    /// JetStream did not acknowledge the message.
    pub async fn publish_call(&self, call: &ToolCall) -> anyhow::Result<()> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(names::headers::MSG_ID, call.msg_id().as_str());
        self.publish(call, headers).await
    }

    /// Publishes `call` without a message id: a second publish is a second
    /// delivery of the same attempt, as a redelivery would be.
    ///
    /// # Errors
    ///
    /// JetStream did not acknowledge the message.
    pub async fn publish_duplicate(&self, call: &ToolCall) -> anyhow::Result<()> {
        self.publish(call, async_nats::HeaderMap::new()).await
    }

    async fn publish(&self, call: &ToolCall, headers: async_nats::HeaderMap) -> anyhow::Result<()> {
        let js = jetstream::new(self.client.clone());
        let payload = serde_json::to_vec(call)?;
        js.publish_with_headers(names::call_subject(&call.tool), headers, payload.into())
            .await?
            .await
            .context("JetStream did not store the call")?;
        Ok(())
    }

    /// Waits until no worker has a pull request open on `tool`'s queue
    /// (its consumer's `num_waiting` is 0): a call published then waits
    /// in the queue rather than going to a worker that pulled while the
    /// tool was up (a pull request takes calls until it expires).
    ///
    /// # Errors
    ///
    /// The consumer cannot be read, or pull requests stay open for `within`.
    pub async fn wait_no_pull_requests(&self, tool: &str, within: Duration) -> anyhow::Result<()> {
        let js = jetstream::new(self.client.clone());
        let what = format!("the pull requests on {tool}'s queue to expire");
        crate::wait_until(&what, within, || {
            let js = js.clone();
            async move {
                let mut consumer: jetstream::consumer::PullConsumer = js
                    .get_consumer_from_stream(names::call_consumer(tool), names::CALL_STREAM)
                    .await
                    .ok()?;
                let info = consumer.info().await.ok()?;
                (info.num_waiting == 0).then_some(())
            }
        })
        .await
    }

    /// Subscribes to the results of `job`'s calls (a job id or a name,
    /// [`job_id`]). Subscribe before publishing, or a fast result is missed.
    ///
    /// # Errors
    ///
    /// NATS refused the subscription.
    pub async fn results(&self, job: &str) -> anyhow::Result<Results> {
        let subscriber = self
            .client
            .subscribe(names::reply_subject(&job_id(job)))
            .await?;
        self.client.flush().await?;
        Ok(Results { subscriber })
    }

    /// The wire ids of the calls `job_id` has dispatched so far (the job's
    /// attempts record), sorted. A job's calls are named on the wire from
    /// its secret, so this is how a test finds them.
    ///
    /// # Errors
    ///
    /// Redis is unreachable.
    pub async fn dispatched_wire_ids(&self, job_id: &str) -> anyhow::Result<Vec<String>> {
        let mut redis = self.redis.connection().await?;
        let job_id = JobId::parse(job_id).context("not a job id")?;
        let mut ids: Vec<String> = redis::cmd("HKEYS")
            .arg(RedisKeys::default().job_attempts(&job_id))
            .query_async(&mut redis)
            .await?;
        ids.sort();
        Ok(ids)
    }

    /// The envelope stored in Redis for one attempt (by its ids; whichever
    /// call it answers), if any.
    ///
    /// # Errors
    ///
    /// Redis is unreachable or the stored text is not an envelope.
    pub async fn stored_result(&self, call: &ToolCall) -> anyhow::Result<Option<Envelope>> {
        let key =
            RedisKeys::default().call_result(&call.job_id, &call.tool, &call.call_id, call.attempt);
        let mut redis = self.redis.connection().await?;
        let text: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut redis).await?;
        text.map(|t| {
            serde_json::from_str::<StoredResult>(&t)
                .map(|record| record.envelope)
                .context("the stored result is not a ledger record")
        })
        .transpose()
    }

    /// Respawns every worker that died (a poison call aborted it), as a
    /// supervisor would, forever: race it with what the test waits for.
    pub async fn restart_dead_workers(&self) {
        loop {
            for worker in self.workers() {
                if !worker.is_running() {
                    let _ = worker.respawn();
                    let _ = worker
                        .wait_for_log("worker ready", std::time::Duration::from_secs(30))
                        .await;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// A Redis integer (a test counter), 0 if unset.
    ///
    /// # Errors
    ///
    /// Redis is unreachable.
    pub async fn counter(&self, key: &str) -> anyhow::Result<i64> {
        let mut redis = self.redis.connection().await?;
        let value: Option<i64> = redis::cmd("GET").arg(key).query_async(&mut redis).await?;
        Ok(value.unwrap_or(0))
    }
}

/// Worker settings that make redeliveries happen within a second (the
/// claim lease stays below AckWait, as in production), and give a call
/// that kills its worker up after two deaths.
pub const FAST_REDELIVERY: &[(&str, &str)] = &[
    ("TOOLFLEET_RUNTIME__ACK_WAIT", "1s"),
    ("TOOLFLEET_RUNTIME__CLAIM_LEASE", "500ms"),
    ("TOOLFLEET_RUNTIME__MAX_DELIVERIES", "2"),
];

/// The results of one job's calls, as workers publish them.
pub struct Results {
    subscriber: async_nats::Subscriber,
}

/// One result message.
#[derive(Debug, Clone)]
pub struct Received {
    /// The call id header.
    pub call_id: String,
    /// Whether the worker answered from the stored result.
    pub dedup_hit: bool,
    /// The envelope of the published record, as JSON.
    pub body: String,
    /// The parsed envelope.
    pub envelope: Envelope,
}

impl Results {
    /// The next result, waiting at most `timeout`.
    ///
    /// # Errors
    ///
    /// No result within `timeout`, or one that is not an envelope.
    pub async fn next(&mut self, timeout: Duration) -> anyhow::Result<Received> {
        let message = tokio::time::timeout(timeout, self.subscriber.next())
            .await
            .with_context(|| format!("no result within {timeout:?}"))?
            .context("result subscription closed")?;
        let headers = message.headers.clone().unwrap_or_default();
        let call_id = headers
            .get(names::headers::CALL_ID)
            .map(|v| v.as_str().to_owned())
            .context("result without a call id header")?;
        let dedup_hit = headers
            .get(names::headers::DEDUP_HIT)
            .is_some_and(|v| v.as_str() == "true");
        // The stored record, as the worker's ledger holds it.
        let stored = String::from_utf8(message.payload.to_vec())?;
        let envelope = serde_json::from_str::<StoredResult>(&stored)
            .with_context(|| format!("result is not a stored record: {stored}"))?
            .envelope;
        let body = envelope.to_json();
        Ok(Received {
            call_id,
            dedup_hit,
            body,
            envelope,
        })
    }
}

/// The job id a test means by `job`: `job` itself when it is a job id,
/// else a job id made from it as a name (`job-calc` becomes
/// `job-calc-<28 hex digits>`, the same every time), since workers run only
/// calls whose job id is one the orchestrator makes.
pub fn job_id(job: &str) -> JobId {
    if let Some(job_id) = JobId::parse(job) {
        return job_id;
    }
    // FNV-1a: a stable digest of the name, no dependency.
    let digest = job.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    JobId::new(job, 0, digest)
}

/// A first-attempt call of `tool` with `arguments` (a JSON text, possibly
/// malformed on purpose), answering on the job's reply subject. `job` is a
/// job id or a name ([`job_id`]).
pub fn call(job: &str, call_id: &str, tool: &str, arguments: &str) -> ToolCall {
    let job_id = &job_id(job);
    ToolCall {
        job_id: job_id.to_string(),
        call_id: call_id.to_owned(),
        attempt: 1,
        tool: tool.to_owned(),
        arguments: arguments.to_owned(),
        deadline_ms: None,
        idempotency_key: ToolCall::default_idempotency_key(job_id, call_id),
        reply_to: Some(names::reply_subject(job_id)),
    }
}

/// `message` with `token` as its bearer token: a request of the tenant
/// the tokens file gives it.
///
/// # Panics
///
/// If `token` is not ASCII.
pub fn as_tenant<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value = format!("Bearer {token}").parse().expect("ascii");
    request.metadata_mut().insert("authorization", value);
    request
}

/// The approval of the held call `call_id` of the job `job_id`.
pub fn approval(job_id: &str, call_id: &str) -> v1::DecideCallRequest {
    v1::DecideCallRequest {
        job_id: job_id.to_owned(),
        call_id: call_id.to_owned(),
        decision: v1::Decision::Approve.into(),
        ..Default::default()
    }
}

/// The first page of the calls held for an approval that `api`'s caller
/// may decide.
///
/// # Errors
///
/// The API refused the listing.
pub async fn pending_approvals(api: &ApiClient) -> anyhow::Result<Vec<v1::PendingApproval>> {
    let listed = api
        .clone()
        .list_pending_approvals(v1::ListPendingApprovalsRequest::default())
        .await?;
    Ok(listed.into_inner().approvals)
}

/// A job request for the scripted model playing `script`.
pub fn scripted_job(input: &str, script: &serde_json::Value) -> v1::SubmitJobRequest {
    v1::SubmitJobRequest {
        input: input.into(),
        model: Some(v1::ModelSpec {
            provider: "scripted".into(),
            script: script.to_string(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Each call's envelope in a finished job, by call id (from its result
/// items).
///
/// # Panics
///
/// A result item whose output is not JSON: the store wrote it.
pub fn call_results(job: &v1::Job) -> std::collections::HashMap<String, serde_json::Value> {
    job.items
        .iter()
        .filter_map(|item| match &item.kind {
            Some(v1::item::Kind::ToolResult(r)) => Some((
                r.call_id.clone(),
                serde_json::from_str(&r.output).expect("an envelope"),
            )),
            _ => None,
        })
        .collect()
}

/// Submits a job of the scripted model playing `script`, and waits until
/// it has finished.
///
/// # Errors
///
/// The API refused it, or it did not finish in time.
pub async fn run_scripted(
    api: &ApiClient,
    input: &str,
    script: &serde_json::Value,
) -> anyhow::Result<v1::Job> {
    let job_id = api
        .clone()
        .submit_job(scripted_job(input, script))
        .await?
        .into_inner()
        .job_id;
    wait_finished(api, &job_id).await
}

/// A watch of `job_id` from its first event.
///
/// # Errors
///
/// The API refused the watch.
pub async fn watch(
    api: &ApiClient,
    job_id: &str,
) -> anyhow::Result<tonic::Streaming<v1::JobEvent>> {
    let request = v1::WatchJobRequest {
        job_id: job_id.to_owned(),
        from_offset: 0,
    };
    Ok(api.clone().watch_job(request).await?.into_inner())
}

/// Every event of the job so far, as `(kind, data)`: the stream of a
/// finished job is read to its final event, an unfinished one's followed
/// until nothing new comes for a moment.
///
/// # Errors
///
/// The API refused the stream, or an event's data is not JSON.
pub async fn events(
    api: &ApiClient,
    job_id: &str,
) -> anyhow::Result<Vec<(String, serde_json::Value)>> {
    let mut stream = watch(api, job_id).await?;
    let mut events = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_millis(300), stream.message()).await;
        // Nothing new for a moment: the job waits.
        let Ok(next) = next else { break };
        let Some(event) = next? else { break };
        events.push((event.kind.clone(), serde_json::from_str(&event.data)?));
        if event.r#final {
            break;
        }
    }
    Ok(events)
}

/// Submits a job whose model would think for a minute, cancels it, and
/// returns its id once it has ended cancelled.
///
/// # Errors
///
/// The orchestrator refused a call, or the job did not end in time.
pub async fn cancelled_job(api: &ApiClient) -> anyhow::Result<String> {
    let mut api = api.clone();
    let script = serde_json::json!([{"delay_ms": 60000, "message": "never"}]);
    let job_id = api
        .submit_job(scripted_job("x", &script))
        .await?
        .into_inner()
        .job_id;
    api.cancel_job(v1::CancelJobRequest {
        job_id: job_id.clone(),
    })
    .await?;
    wait_finished(&api, &job_id).await?;
    Ok(job_id)
}

/// Submits `request` and returns the job once it has finished
/// ([`wait_finished`]).
///
/// # Errors
///
/// The submission was refused, or the job did not finish in time.
pub async fn run_job(api: &ApiClient, request: v1::SubmitJobRequest) -> anyhow::Result<v1::Job> {
    let job_id = api.clone().submit_job(request).await?.into_inner().job_id;
    wait_finished(api, &job_id).await
}

/// Follows a job's events to its final one (at most two minutes), then
/// returns the finished job. As docs/api.md asks of a client, an
/// `UNAVAILABLE` answer (the job store failing over) is retried, and a
/// broken event stream resumes after the last event read.
///
/// # Errors
///
/// The job did not finish in time, or the API failed otherwise.
pub async fn wait_finished(api: &ApiClient, job_id: &str) -> anyhow::Result<v1::Job> {
    let mut api = api.clone();
    tokio::time::timeout(Duration::from_secs(120), async {
        let mut from_offset = 0;
        'watch: loop {
            let watch = api
                .watch_job(v1::WatchJobRequest {
                    job_id: job_id.into(),
                    from_offset,
                })
                .await;
            let mut events = match watch {
                Ok(events) => events.into_inner(),
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    tokio::time::sleep(UNAVAILABLE_PAUSE).await;
                    continue;
                }
                Err(status) => return Err(status.into()),
            };
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    Err(status) if status.code() == tonic::Code::Unavailable => break,
                    Err(status) => return Err(status.into()),
                };
                from_offset = event.offset + 1;
                if event.r#final {
                    // Read the stream's end rather than reset it by
                    // dropping it (docs/api.md).
                    let _ = events.next().await;
                    break 'watch;
                }
            }
            tokio::time::sleep(UNAVAILABLE_PAUSE).await;
        }
        loop {
            let request = v1::GetJobRequest {
                job_id: job_id.into(),
            };
            match api.get_job(request).await {
                Ok(job) => return Ok(job.into_inner()),
                Err(status) if status.code() == tonic::Code::Unavailable => {
                    tokio::time::sleep(UNAVAILABLE_PAUSE).await;
                }
                Err(status) => return Err(status.into()),
            }
        }
    })
    .await
    .with_context(|| format!("job {job_id} did not finish within 2 minutes"))?
}

/// How long [`wait_finished`] waits before it asks again after
/// `UNAVAILABLE`.
const UNAVAILABLE_PAUSE: Duration = Duration::from_millis(200);
